"""The kernel registry (engine/forward/kernels/registry.py): every library builds here or says why not and what runs
instead, every function it declares is in the built library with the declared signature and matches its C
prototype, nobody else writes a ctypes signature, and no C file includes another C file."""

from __future__ import annotations

import ast
import ctypes
import re
from pathlib import Path

import pytest

from engine.forward.kernels import registry

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "engine" / "forward" / "kernels"
C_TYPES = {"int64_t": ctypes.c_int64, "int": ctypes.c_int, "float": ctypes.c_float, "void": None}


def _c_text() -> str:
    """Every .c and .h of the kernels, comments taken out."""
    text = "\n".join(p.read_text() for p in sorted([*KERNELS.glob("*.c"), *KERNELS.glob("*.h")]))
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


def _param_type(param: str):
    """The ctypes type a C parameter is passed as: any pointer as c_void_p, else its scalar type."""
    if "*" in param:
        return ctypes.c_void_p
    words = param.replace("const", " ").split()
    return C_TYPES[words[0]]


def _prototypes(name: str) -> set[tuple]:
    """(result, parameters) of every declaration or definition of C function `name`, as ctypes types."""
    found = set()
    for result, params in re.findall(rf"\b(void|int|float|int64_t)\s+{name}\s*\(([^)]*)\)\s*[;{{]", _c_text()):
        params = [p.strip() for p in params.split(",")]
        args = () if params == ["void"] else tuple(_param_type(p) for p in params)
        found.add((C_TYPES[result], args))
    return found


LIBRARIES = sorted(registry.LIBRARIES)


@pytest.mark.parametrize("name", LIBRARIES)
def test_each_library_builds_here_or_says_which_flags_it_lacks(name):
    lib, where = registry.load(name)
    missing = registry.missing_flags(name)
    if missing:
        assert lib is None and all(f.upper() in where for f in missing), where
        return
    assert lib is not None, where
    for fn in registry.LIBRARIES[name].functions:
        c_fn = getattr(lib, fn.name)  # AttributeError where the library does not export it
        assert tuple(c_fn.argtypes) == fn.args and c_fn.restype is fn.returns, fn.name


@pytest.mark.parametrize("name", LIBRARIES)
def test_each_declared_signature_is_its_c_prototype(name):
    entry = registry.LIBRARIES[name]
    assert entry.sources and all((KERNELS / s).is_file() for s in entry.sources)
    for fn in entry.functions:
        protos = _prototypes(fn.name)
        assert protos == {(fn.returns, fn.args)}, (fn.name, protos)


def test_a_cpu_without_the_flags_gets_the_fallbacks_and_says_so(monkeypatch):
    monkeypatch.setattr("engine.forward.kernels.build.cpu_flags", lambda: {"sse2"})
    for name, entry in registry.LIBRARIES.items():
        lib, why = registry.load(name)
        line = registry.describe_one(name)
        if entry.cpu_flags:
            assert lib is None and entry.cpu_flags[0].upper() in why
            assert "not built" in line and entry.fallback in line, line
        else:  # the attention kernel has plain C loops where the CPU has no vectors for it
            assert lib is not None, why
            assert "built" in line and entry.runs in line


def test_describe_has_one_line_per_library():
    lines = registry.describe().splitlines()
    assert [line.split(":")[0] for line in lines] == list(registry.LIBRARIES)
    assert all(" built" in line and "fallback" in line for line in lines)


def test_a_linear_is_named_by_the_function_it_calls():
    lib, where = registry.load("small_gemm_f32")
    if lib is None:
        pytest.skip(where)
    assert registry.linear_path(lib.small_gemm_f32) == "our float32 kernel"
    assert registry.linear_path(None) == "oneDNN"
    labels = [fn.label for entry in registry.LIBRARIES.values() for fn in entry.functions if fn.label]
    assert len(labels) == len(set(labels))  # one name per path in the status line


def _signature_writes(path: Path) -> list[int]:
    """Lines of `path` that assign a ctypes function's argtypes or restype."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            if any(isinstance(t, ast.Attribute) and t.attr in ("argtypes", "restype") for t in names):
                lines.append(node.lineno)
    return lines


def test_only_the_registry_writes_ctypes_signatures():
    packages = ("engine", "ui", "training", "scripts")
    files = [ROOT / "app.py", *(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))]
    writers = {str(p.relative_to(ROOT)) for p in files if _signature_writes(p)}
    assert writers == {"engine/forward/kernels/registry.py"}
    assert _signature_writes(KERNELS / "registry.py")  # the scan does see an assignment where there is one


def test_no_c_file_includes_another_c_file():
    includes = {p.name: re.findall(r'^\s*#\s*include\s+"([^"]+)"', p.read_text(), flags=re.M)
                for p in [*KERNELS.glob("*.c"), *KERNELS.glob("*.h")]}
    assert {f: [i for i in inc if not i.endswith(".h")] for f, inc in includes.items()} == \
        {f: [] for f in includes}
    assert all((KERNELS / i).is_file() for inc in includes.values() for i in inc)


def test_every_c_file_is_in_some_library():
    used = {s for entry in registry.LIBRARIES.values() for s in entry.sources}
    assert used == {p.name for p in KERNELS.glob("*.c")}
