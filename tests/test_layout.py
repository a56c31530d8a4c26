"""The layout's rules, read from the source: dependencies point one way (ui -> engine, training -> engine), and no
group of modules imports itself in a loop, lazily inside a function or not."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "ui", "training")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    found = {"app": ROOT / "app.py"}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found[module_name(path)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that `name` imports anywhere in its file (a `from pkg import sub` counts as pkg.sub)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    out.add(f"{base}.{alias.name}")
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = project_modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_known_edges():
    graph = import_graph()
    assert "engine.round.round" in graph["engine.serve.engine"]
    assert "engine.round.slot" in graph["engine.round.round"]
    assert graph["ui.session"] & {"engine", "engine.events"} == {"engine"}  # through the face


def test_no_modules_import_each_other():
    assert cycles(import_graph()) == []


def test_a_cycle_is_found_where_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_dependencies_point_one_way():
    wrong = [(a, b) for a, deps in import_graph().items() for b in deps
             if a.startswith("engine") and b.split(".")[0] in ("ui", "training", "app")
             or a.startswith("training") and b.split(".")[0] in ("ui", "app")]
    assert wrong == []


# the engine's layers, lowest first: a module imports from its own layer and the ones before it only
LAYERS = ("engine", "engine.forward", "engine.memory", "engine.load", "engine.cost", "engine.draft", "engine.budget",
          "engine.round", "engine.serve", "engine.remote", "engine.bench")


def layer_of(module: str) -> int:
    parts = module.split(".")
    name = ".".join(parts[:2]) if len(parts) > 2 or (len(parts) == 2 and ".".join(parts) in LAYERS) else "engine"
    return LAYERS.index(name)


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return [(a, b) for a, deps in graph.items() if a.startswith("engine") for b in deps
            if b.startswith("engine") and layer_of(b) > layer_of(a)]


def test_the_engine_layers_import_downwards_only():
    assert upward(import_graph()) == []
    assert upward({"engine.memory.cells": {"engine.batch"}, "engine.forward.lean": {"engine.serve.engine"}}) == [
        ("engine.forward.lean", "engine.serve.engine")]


def test_the_engine_root_holds_only_its_vocabulary():
    """Every concern of the engine lives in a folder named after it; its root keeps the few modules that every
    layer speaks (parameters, events, the batch, sampling, grammars, prefixes) and the package's face."""
    root = sorted(p.name for p in (ROOT / "engine").glob("*.py"))
    assert len(root) <= 8, root
    assert all((ROOT / "engine" / layer.split(".")[1]).is_dir() for layer in LAYERS[1:])


def engine_imports(path: Path) -> list[str]:
    """How a file reaches into the engine: 'engine' for `from engine import name`, else the module named."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "engine"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "engine":
            out.append(node.module)
    return out


def test_the_page_uses_the_engine_through_its_face_only():
    """ui/ and app.py import `engine` (its names, PEP 562) and never a module behind it, and every name they
    take is one the face lists, so moving a module inside the engine never reaches the page."""
    import engine

    files = [ROOT / "app.py", *sorted((ROOT / "ui").rglob("*.py"))]
    behind = [(p.name, m) for p in files for m in engine_imports(p) if m != "engine"]
    assert behind == []
    names = {a.name for p in files for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ImportFrom)
             and node.module == "engine" for a in node.names}
    assert names and names <= set(engine.__all__), names - set(engine.__all__)
    assert all(getattr(engine, name) is not None for name in names)
