"""Does a finished answer keep its output format? json.loads, then a check against the JSON schema.

The grammar makes a complete answer parse by construction; an answer cut by the token limit or by Stop does not,
and saying so on the page is what tells the reader the difference. The schema check covers the subset the page's
examples use (type, properties, required, items, enum, additionalProperties: false): `jsonschema` is not a
dependency of this project, and the grammar already enforced the rest.
"""

from __future__ import annotations

import html
import json
import re

TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def type_ok(value, kind: str) -> bool:
    """JSON type test: bool is no number in JSON, although it is an int in Python."""
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, TYPES.get(kind, object))


def schema_violations(value, schema, where: str = "$") -> list[str]:
    """Where `value` breaks `schema` (the subset above), one line each; [] when it follows it."""
    if schema is True or not isinstance(schema, dict):
        return []
    out = []
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r} is not one of {schema['enum']}")
    kinds = schema.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if not any(type_ok(value, k) for k in kinds):
            return out + [f"{where}: expected {' or '.join(kinds)}, got {type(value).__name__}"]
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{where}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        if schema.get("additionalProperties") is False:
            out += [f"{where}: unexpected key {key!r}" for key in value if key not in props]
        for key, sub in props.items():
            if key in value:
                out += schema_violations(value[key], sub, f"{where}.{key}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += schema_violations(item, schema["items"], f"{where}[{i}]")
    return out


def check_answer(text: str, kind: str, format_text: str) -> tuple[bool, str]:
    """(ok, what to say) for an answer under an output format of `kind` (a GrammarSpec kind)."""
    if kind == "regex":
        try:
            ok = re.fullmatch(format_text, text) is not None
        except re.error:  # llguidance's regex dialect is not Python's: nothing to say rather than a wrong verdict
            return True, "regex: not checked here (Python cannot read this regex)"
        return ok, "matches the regex" if ok else "does not match the regex"
    if kind in ("lark", "gbnf"):
        return True, f"grammar ({'Lark' if kind == 'lark' else 'GBNF'}): the grammar constrained every token"
    try:
        value = json.loads(text)
    except ValueError as e:
        return False, f"not valid JSON ({e.msg} at char {e.pos})"
    if kind != "json_schema":
        return True, "valid JSON"
    try:
        schema = json.loads(format_text)
    except ValueError:
        return False, "valid JSON; the schema itself is not JSON"
    errors = schema_violations(value, schema)
    if errors:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        return False, f"valid JSON, but breaks the schema: {errors[0]}{more}"
    return True, "valid JSON, follows the schema"


def format_html(text: str, kind: str, format_text: str, stop_reason: str | None) -> str:
    """The line under the answer: whether it parses and follows its format, and why not when it was cut."""
    ok, what = check_answer(text, kind, format_text)
    was_cut = not ok and stop_reason in ("length", "context", "stopped")
    cut = f" (the answer was cut: stop {stop_reason})" if was_cut else ""
    cls = "format-ok" if ok else "format-bad"
    mark = "&#10003;" if ok else "&#10007;"
    return (f'<div class="format-check"><span class="badge {cls}">output format {mark}</span> '
            f'<span class="cmp-detail">{html.escape(what + cut)}</span></div>')
