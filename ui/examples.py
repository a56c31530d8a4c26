"""Example prompts from assets/examples.json: where speculation pays (the answer copies the prompt) and where
it does not (open writing)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

EXAMPLES_PATH = Path(__file__).resolve().parent.parent / "assets" / "examples.json"


@dataclass
class Example:
    title: str
    prompt: str
    pays: bool  # True: the answer repeats text of the prompt, so n-gram drafts get accepted
    why: str = ""  # why it pays or not, for whoever edits the list
    format: str = ""  # the output format the example sets (a GrammarSpec kind); "" leaves the user's format
    format_text: str = ""  # that format's schema (JSON text), regex or grammar


def load_examples(path: Path = EXAMPLES_PATH) -> list[Example]:
    """The examples, or none if the file is missing or malformed (the app works without them)."""
    try:
        items = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [Example(title=str(x["title"]), prompt=str(x["prompt"]), pays=bool(x.get("pays", True)),
                    why=str(x.get("why", "")), format=str(x.get("format", "")), format_text=format_text(x))
            for x in items if isinstance(x, dict) and "prompt" in x and "title" in x]


def format_text(item: dict) -> str:
    """The example's schema as the format box shows it (indented JSON), or its regex or grammar as written."""
    if "schema" in item:
        return json.dumps(item["schema"], indent=2)
    return str(item.get("format_text", ""))
