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
    why: str = ""


def load_examples(path: Path = EXAMPLES_PATH) -> list[Example]:
    """The examples, or none if the file is missing or malformed (the app works without them)."""
    try:
        items = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [Example(title=str(x["title"]), prompt=str(x["prompt"]), pays=bool(x.get("pays", True)),
                    why=str(x.get("why", ""))) for x in items if isinstance(x, dict) and "prompt" in x and "title" in x]
