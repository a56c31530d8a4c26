"""What a benchmark's command line and prompts file say beyond plain numbers: the draft head's tree shape
(--head-tree), and the output format of the run (--json-schema, --regex, --grammar) or of one prompt (its own
"json_schema" or "regex" field)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.grammar import GrammarSpec


def parse_head_tree(text: str | None) -> tuple[int, int, float] | None:
    """--head-tree "BRANCH,WIDTH,MIN_SCORE" -> (4, 4, 0.2); None when not given; ValueError when malformed."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        branch, width, min_score = int(parts[0]), int(parts[1]), float(parts[2])
    except (ValueError, IndexError):
        raise ValueError(f"--head-tree takes BRANCH,WIDTH,MIN_SCORE, e.g. 4,4,0.2; got {text!r}") from None
    if len(parts) != 3 or branch < 1 or width < 1 or not 0 <= min_score < 1:
        raise ValueError(f"--head-tree: branch and width >= 1, 0 <= min_score < 1; got {text!r}")
    return branch, width, min_score


def _read(path: str, flag: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{flag}: file not found: {path}")
    return p.read_text()


def grammar_from_args(a) -> GrammarSpec | None:
    """The run's output format from --json-schema FILE, --regex R or --grammar FILE (Lark); None without one."""
    if getattr(a, "json_schema", None):
        return GrammarSpec("json_schema", _read(a.json_schema, "--json-schema"))
    if getattr(a, "regex", None):
        return GrammarSpec("regex", a.regex)
    if getattr(a, "grammar", None):
        # llama.cpp's grammars are .gbnf files; anything else is read as Lark
        kind = "gbnf" if str(a.grammar).endswith(".gbnf") else "lark"
        return GrammarSpec(kind, _read(a.grammar, "--grammar"))
    return None


def prompt_grammar(prompt: dict) -> GrammarSpec | None:
    """A prompts-file line's own output format: "json_schema" (an object, or its JSON text) or "regex"."""
    if "json_schema" in prompt:
        schema = prompt["json_schema"]
        return GrammarSpec("json_schema", schema if isinstance(schema, str) else json.dumps(schema))
    if "regex" in prompt:
        return GrammarSpec("regex", str(prompt["regex"]))
    return None
