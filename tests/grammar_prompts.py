"""JSON-schema prompts for the grammar tests and scripts/grammar_speed.py, and a checker for the schema subset
they use (jsonschema is not a dependency of this project)."""

from __future__ import annotations

import json

NAME = {"type": "string", "maxLength": 24}  # bounded strings keep answers short on a small model


def record(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": required or list(props),
            "additionalProperties": False}


# (paragraph, instruction, schema): records extracted from a paragraph and lists of objects
CASES = [
    ("Maria Lopez is a 34 year old engineer living in Lisbon.", "Extract the person",
     record({"name": NAME, "age": {"type": "integer"}, "city": NAME})),
    ("The Blue Lantern cafe on Main Street opens at 8 and has 4.5 stars.", "Extract the business",
     record({"name": NAME, "street": NAME, "rating": {"type": "number"}})),
    ("Order 1182: two lamps and one desk, shipped to Oslo, paid by card.", "Extract the order",
     record({"order_id": {"type": "integer"}, "city": NAME, "paid": {"type": "boolean"}})),
    ("Tom is 12, Ana is 9 and Lea is 15.", "List the children with their ages",
     record({"children": {"type": "array", "maxItems": 3,
                          "items": record({"name": NAME, "age": {"type": "integer"}})}})),
    ("The meeting with Sara Kim is on Friday at 10 in room B2.", "Extract the meeting",
     record({"person": NAME, "day": {"enum": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]},
             "room": NAME})),
    ("Apples cost 3 dollars, pears cost 4 dollars and plums cost 2 dollars.", "List the fruits with prices",
     record({"items": {"type": "array", "maxItems": 3,
                       "items": record({"fruit": NAME, "price": {"type": "integer"}})}})),
    ("The novel Silent River by James Hart was published in 1998.", "Extract the book",
     record({"title": NAME, "author": NAME, "year": {"type": "integer"}})),
    ("Paris is the capital of France and has about 2 million people.", "Extract the city",
     record({"city": NAME, "country": NAME, "is_capital": {"type": "boolean"}})),
]


def messages(case) -> list[dict]:
    paragraph, instruction, schema = case
    keys = ", ".join(schema["properties"])
    return [{"role": "user", "content": f"{instruction} as JSON with the keys {keys}.\n\n{paragraph}"}]


def check(value, schema: dict, where: str = "$") -> None:
    """Raise AssertionError where `value` breaks `schema` (the subset CASES use)."""
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"
        return
    kind = schema["type"]
    if kind == "object":
        assert isinstance(value, dict), f"{where}: not an object"
        for key in schema.get("required", []):
            assert key in value, f"{where}: missing {key!r}"
        if schema.get("additionalProperties") is False:
            extra = set(value) - set(schema["properties"])
            assert not extra, f"{where}: unexpected keys {extra}"
        for key, sub in schema["properties"].items():
            if key in value:
                check(value[key], sub, f"{where}.{key}")
    elif kind == "array":
        assert isinstance(value, list), f"{where}: not an array"
        assert len(value) <= schema.get("maxItems", len(value)), f"{where}: too many items"
        for i, item in enumerate(value):
            check(item, schema["items"], f"{where}[{i}]")
    elif kind == "string":
        assert isinstance(value, str) and len(value) <= schema.get("maxLength", len(value)), f"{where}: string"
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: not an integer"
    elif kind == "number":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: not a number"
    elif kind == "boolean":
        assert isinstance(value, bool), f"{where}: not a boolean"
    else:
        raise AssertionError(f"{where}: schema type {kind} not covered by this checker")


def schema_text(case) -> str:
    return json.dumps(case[2])
