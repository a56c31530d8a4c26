"""The house's sizes: a module holds one concept (at most 350 lines) and a function does one thing (at most 60
lines), so that a reader finds a room by its name and reads it whole."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES = 350
FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted([*ROOT.joinpath("engine").rglob("*.py"), *ROOT.joinpath("ui").rglob("*.py"), ROOT / "app.py"])


def test_no_module_is_over_350_lines():
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert not long, f"modules over {MODULE_LINES} lines: {long}"


def test_no_function_is_over_60_lines():
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = n
    assert not long, f"functions over {FUNCTION_LINES} lines: {long}"


def test_the_scan_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    tree = ast.parse(f"def f():\n{body}\n")
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert node.end_lineno - node.lineno + 1 > FUNCTION_LINES
