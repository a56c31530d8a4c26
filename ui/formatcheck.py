"""Does a finished answer keep its output format? The grammar's own verdict, then, for JSON, what breaks it.

The grammar makes a complete answer parse by construction; an answer cut by the token limit or by Stop does not,
and saying so on the page is what tells the reader the difference. Whether the answer is a whole output of the
grammar comes from the engine: the slot's llguidance matcher says it on the answer's last event
(RoundEvent.format_complete). A visitor's regex or grammar never runs through Python's `re` here: a pattern
like `([a-z]+ ?)+\.` backtracks for hours on a cut answer, holding the interpreter. For JSON the page adds where
the text stops parsing and which part of the schema it breaks: json.loads, then a check of the subset the page's
examples use (type, properties, required, items, enum, additionalProperties: false), iterative, since a
visitor's schema or answer may nest deeper than Python's recursion.
"""

from __future__ import annotations

import html
import json

TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def type_ok(value, kind: str) -> bool:
    """JSON type test: bool is no number in JSON, although it is an int in Python."""
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, TYPES.get(kind, object))


def schema_violations(value, schema, where: str = "$", limit: int = 100) -> list[str]:
    """Where `value` breaks `schema` (the subset above), one line each and at most `limit`; [] when it follows
    it. Walks an explicit stack, so no nesting depth raises."""
    out: list[str] = []
    todo = [(value, schema, where)]
    while todo and len(out) < limit:
        value, schema, where = todo.pop()
        if schema is True or not isinstance(schema, dict):
            continue
        enum = schema.get("enum")
        if isinstance(enum, list) and value not in enum:
            out.append(f"{where}: {value!r} is not one of {enum}")
        kinds = schema.get("type")
        if kinds is not None:
            kinds = [str(k) for k in (kinds if isinstance(kinds, list) else [kinds])]
            if not any(type_ok(value, k) for k in kinds):
                out.append(f"{where}: expected {' or '.join(kinds)}, got {type(value).__name__}")
                continue
        if isinstance(value, dict):
            props = schema.get("properties", {})
            props = props if isinstance(props, dict) else {}
            required = schema.get("required", [])
            out += [f"{where}: missing {key!r}" for key in (required if isinstance(required, list) else [])
                    if key not in value]
            if schema.get("additionalProperties") is False:
                out += [f"{where}: unexpected key {key!r}" for key in value if key not in props]
            todo += [(value[key], sub, f"{where}.{key}") for key, sub in reversed(list(props.items()))
                     if key in value]
        if isinstance(value, list) and isinstance(schema.get("items"), dict):
            todo += [(item, schema["items"], f"{where}[{i}]") for i, item in reversed(list(enumerate(value)))]
    return out[:limit]


def check_answer(text: str, kind: str, format_text: str, complete: bool | None = None) -> tuple[bool, str]:
    """(ok, what to say) for an answer under an output format of `kind` (a GrammarSpec kind); `complete` is the
    grammar's verdict on it (None where the engine gave none)."""
    if kind in ("regex", "lark", "gbnf"):
        label = {"regex": "the regex", "lark": "the Lark grammar", "gbnf": "the GBNF grammar"}[kind]
        if complete is None:
            return True, f"{label}: constrained every token (no verdict on the whole answer)"
        return complete, f"matches {label}" if complete else f"does not (yet) match {label}"
    try:
        value = json.loads(text)
    except ValueError as e:
        return False, f"not valid JSON ({e.msg} at char {e.pos})"
    except RecursionError:
        return complete is not False, "JSON nested too deep to check here"
    if kind != "json_schema":
        return True, "valid JSON"
    try:
        schema = json.loads(format_text)
    except ValueError:
        return False, "valid JSON; the schema itself is not JSON"
    except RecursionError:
        return complete is not False, "valid JSON; the schema is nested too deep to check here"
    errors = schema_violations(value, schema)
    if errors:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        return False, f"valid JSON, but breaks the schema: {errors[0]}{more}"
    return True, "valid JSON, follows the schema"


def format_html(text: str, kind: str, format_text: str, stop_reason: str | None,
                complete: bool | None = None) -> str:
    """The line under the answer: whether it parses and follows its format, and why not when it was cut."""
    ok, what = check_answer(text, kind, format_text, complete)
    was_cut = not ok and stop_reason in ("length", "context", "stopped")
    cut = f" (the answer was cut: stop {stop_reason})" if was_cut else ""
    cls = "format-ok" if ok else "format-bad"
    mark = "&#10003;" if ok else "&#10007;"
    return (f'<div class="format-check"><span class="badge {cls}">output format {mark}</span> '
            f'<span class="cmp-detail">{html.escape(what + cut)}</span></div>')
