"""Which models a visitor may load from the page: the packaged ones, those in the operator's model folders
(`--model-dir`), and hub ids where the operator allows them (`--allow-hub-models`).

A visitor's name never reaches the loader as a path of its own choosing: a name is looked up in the folders,
resolved (symbolic links followed) and kept only when it stays inside one. Every refusal says the same thing
whether or not the name exists on disk, so the page cannot be used to probe the machine's files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HUB_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
LISTED_MAX = 200  # models of the folders offered in the page's list at most


@dataclass(frozen=True)
class Catalog:
    packaged: tuple[str, ...] = ()  # engine.packaged_names(): always offered
    model_dirs: tuple[str, ...] = ()  # folders whose models visitors may name (--model-dir)
    hub: bool = False  # hub ids allowed (--allow-hub-models): they download into the cache

    def resolve(self, name: str) -> str:
        """What the loader is given for a visitor's `name`. Raises ValueError with the same message for a name
        outside the catalog whether or not it exists."""
        name = (name or "").strip()
        if name in self.packaged:
            return name
        for folder in self.model_dirs:
            found = inside(Path(folder), name)
            if found is not None:
                return str(found)
        if self.hub and is_hub_id(name):
            return name
        raise ValueError(f"{name[:80]!r} is not among the models this playground offers: " + self.offer())

    def offer(self) -> str:
        kinds = ["the packaged models (" + ", ".join(self.packaged) + ")"]
        if self.model_dirs:
            kinds.append("a model of the host's model folder by its name")
        if self.hub:
            kinds.append("a hub id (owner/name)")
        return " or ".join(kinds) + ("" if self.model_dirs else "; the host adds folders with --model-dir")

    def listed(self) -> list[str]:
        """Names for the page's list: the packaged models, then the folders' models by their name there."""
        names = list(self.packaged)
        for folder in self.model_dirs:
            root = Path(folder)
            try:
                entries = sorted(root.iterdir())
            except OSError:
                continue
            for entry in entries:
                if len(names) >= LISTED_MAX:
                    return names
                if inside(root, entry.name) is not None:  # a link leading out of the folder is no model of it
                    names.append(entry.name)
        return names


def inside(folder: Path, name: str) -> Path | None:
    """`name` (relative to `folder`, or a path) resolved, when it lies inside `folder` and is a model there."""
    try:
        root = folder.expanduser().resolve(strict=True)
        found = (root / name).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, a loop of links, a NUL in the name
        return None
    if not found.is_relative_to(root) or found == root:
        return None
    if (found.suffix == ".gguf" and found.is_file()) or (found / "config.json").is_file():
        return found
    return None


def is_hub_id(name: str) -> bool:
    """owner/name of letters, digits, '-', '_' and '.', neither part starting with '.'."""
    parts = name.split("/")
    return (len(parts) == 2 and all(p and not p.startswith(".") and set(p) <= HUB_ID_CHARS for p in parts)
            and len(name) <= 96)
