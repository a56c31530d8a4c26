"""Every C library of the engine in one table: what it is built from, which CPU it needs, what Python calls in it
with which ctypes signature, and what runs instead where it cannot be had.

A library is built for this host on first use (build.py: -march=native, into a private cache) and loaded with
`load(name)`, which sets every declared function's argtypes and restype once: a caller never writes a signature
itself, so the one place a C prototype and its Python side can disagree is this table (the tests check every
declared function against the built library). The Python callers still check each call's shapes before it
reaches C: a signature says how to pass a pointer, not how far the kernel will read.

Headers (`*.h`) hold what the files of a library share: declarations, and the vector helpers that must stay
inline in the hot loops. A library of several files links them into one .so.

`describe()` is the table as this host sees it: one line per library, built or not, and what runs instead.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from engine.forward.kernels import build as builder

_P, _I, _C, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
# a few-row linear: x, packed weight, y, the epilogue's operand (or NULL), M, K, N, post (engine/forward/gemm.py)
_LINEAR = (_P, _P, _P, _P, _I, _I, _I, _C)
_PACK = (_P, _P, _I, _I)  # w [N, K] -> its packed layout: w, out, K, N
_ONEDNN = "oneDNN"  # engine/forward/prepack.py's reordered weight: a linear's path where ours does not run


@dataclass(frozen=True)
class Function:
    """One C function that Python calls, as the library's source declares it."""

    name: str  # the exported symbol
    args: tuple[type, ...]  # ctypes types of its parameters in order; buffers are c_void_p (torch's data_ptr())
    returns: type | None = None  # ctypes type of its result; None for void
    label: str = ""  # "our <label> kernel" in the status line for a linear through it; "" for any other function


@dataclass(frozen=True)
class Library:
    """One shared library built from engine/forward/kernels/."""

    name: str  # what callers load it by, and the stem of its cached .so
    sources: tuple[str, ...]  # .c files compiled and linked together; the headers they include follow them
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo flags its intrinsics need: without one it is not even compiled
    functions: tuple[Function, ...]  # what Python calls in it, each with its signature
    runs: str  # what the status line calls it where it is built
    fallback: str  # what runs in its place where it is not built (no such CPU, no compiler, a failed build)
    defines: tuple[str, ...] = ()  # -D options every build of it has; a caller may add others (BLOCK8, ...)


_Q_KINDS = ("q4_1", "q8_0")  # read as float32 (Q4_0 and Q5_0 go as Q4_1 and Q8_0: engine/forward/quant.py)
_QDOT_KINDS = ("q4_1", "q8_0", "q4_0", "q5_0", "q6_k")  # times 8-bit inputs

LIBRARIES = {lib.name: lib for lib in (
    Library("small_gemm", ("small_gemm.c",), ("avx512_bf16",),
            (Function("small_gemm", _LINEAR, label="bfloat16"), Function("small_gemm_pack", _PACK)),
            "our bfloat16 kernel", _ONEDNN),
    Library("small_gemm_f32", ("small_gemm_f32.c",), ("avx2", "fma"),
            (Function("small_gemm_f32", _LINEAR, label="float32"), Function("small_gemm_f32_pack", _PACK),
             Function("small_gemm_f32_block", (), _C)),
            "our float32 kernel", _ONEDNN),
    # float16 weights, float32 inputs and sums: a drafter stored in float16 (the draft head) reads half the bytes
    Library("small_gemm_f16w", ("small_gemm_f32.c",), ("avx2", "fma", "f16c"),
            (Function("small_gemm_f16w", _LINEAR, label="float16"), Function("small_gemm_f16w_pack", _PACK),
             Function("small_gemm_f16w_block", (), _C)),
            "our float16 kernel", f"the float32 weights (our float32 kernel or {_ONEDNN})", ("WEIGHT_F16",)),
    # a GGUF's blocks: read as float32 (small_gemm_q.c) or times 8-bit inputs (small_gemm_qdot.c, where
    # small_gemm_qdot_ok() says the build has byte dot products); the float32 kernel's block width sizes both
    Library("small_gemm_q", ("small_gemm_q.c", "small_gemm_qdot.c", "small_gemm_f32.c"), ("avx2", "fma"),
            (*(Function(f"small_gemm_{k}", _LINEAR, label=k) for k in _Q_KINDS),
             *(Function(f"small_gemm_{k}_dot", _LINEAR, _C, label=f"{k}_dot") for k in _QDOT_KINDS),
             Function("small_gemm_qdot_ok", (), _C), Function("small_gemm_f32_block", (), _C)),
            "our Q4_1 / Q4_0 / Q5_0 / Q8_0 / Q6_K kernels", f"the GGUF's weights as float32 (our float32 kernel or {_ONEDNN})"),
    Library("cell_attention", ("cell_attention.c",), (),
            (Function("cell_attention", (_P, _P, _P, _I, _P, _P, _P, _I, _C, _C, _C, _F), _C),),
            "C kernel per row", "torch per row"),
    Library("lean_layers",
            ("lean_layers.c", "cell_attention.c", "small_gemm_f32.c", "small_gemm_q.c", "small_gemm_qdot.c"),
            ("avx2", "fma"),
            (Function("lean_layers", (_P, _I, _I, _C, _P, _P, _P, _P, _P, _C, _P, _P, _I, _P, _P, _P, _P, _P, _P, _P,
                                      _C, _C, _C, _C, _I, _F, _F, _P, _P, _C), _C),),
            "layers in one C call", "torch layers"),
    # the draft head's dense pieces; each one's last argument: 1 for Q8_0 groups (the integer kernel), 0 for float16
    Library("head_step", ("head_step.c", "small_gemm_f32.c", "small_gemm_qdot.c"), ("avx2", "fma", "f16c"),
            (Function("head_fuse", (_P, _I, _I, _P, _P, _P, _I, _P, _C), _C),
             Function("head_qkv", (_P, _P, _I, _I, _P, _P, _F, _P, _I, _C, _C, _P, _P, _P, _C), _C),
             Function("head_finish", (_P, _P, _I, _I, _I, _I, _P, _P, _P, _P, _F, _P, _C), _C),
             Function("head_logits", (_P, _I, _I, _P, _F, _P, _I, _P, _C), _C)),
            "the head's pieces in C", "the head's torch pieces", ("WEIGHT_F16",)),
)}


def missing_flags(name: str) -> list[str]:
    """The CPU flags library `name` needs that this CPU lacks."""
    have = builder.cpu_flags()
    return [f for f in LIBRARIES[name].cpu_flags if f not in have]


def load(name: str, defines: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str]:
    """(library `name` with every declared function's signature set, where it was loaded from), or (None, why
    not): a CPU without its flags, no C compiler, a failed build. defines: -D options added to its own
    (("BLOCK8",): the 8-wide float32 layout on an AVX512 CPU)."""
    lib = LIBRARIES[name]
    missing = missing_flags(name)
    if missing:
        return None, f"the CPU has no {', '.join(f.upper() for f in missing)}"
    cdll, where = builder.build(lib.name, lib.defines + tuple(defines), lib.sources)
    if cdll is None:
        return None, where
    for fn in lib.functions:
        c_fn = getattr(cdll, fn.name)  # ctypes keeps this object on the library: later lookups get it, typed
        c_fn.argtypes, c_fn.restype = list(fn.args), fn.returns
    return cdll, where


def function(name: str) -> Function | None:
    """The entry of the C function `name` (the same in every library that declares it), None if none does."""
    return next((fn for lib in LIBRARIES.values() for fn in lib.functions if fn.name == name), None)


def linear_path(fn) -> str:
    """The status line's name for the path of a packed linear: `fn` the C function it calls (from `load`), or
    None for a weight that none of ours multiplies (oneDNN's)."""
    name = getattr(fn, "__name__", None)
    if name is None:
        return _ONEDNN
    entry = function(name)
    return f"our {entry.label if entry is not None and entry.label else name} kernel"


def describe_one(name: str) -> str:
    """One line for library `name`: built, for which flags, and what it runs; or not, why, and what runs
    instead. It builds the library (once per host: later calls load the cached one)."""
    lib = LIBRARIES[name]
    cdll, where = load(name)
    needs = ", ".join(f.upper() for f in lib.cpu_flags) or "any CPU"
    if cdll is None:
        return f"{name}: not built ({where}); fallback in use: {lib.fallback}"
    return f"{name}: built for {needs}: {lib.runs}; fallback unused: {lib.fallback}"


def describe() -> str:
    """The table as this host sees it, one line per library."""
    return "\n".join(describe_one(name) for name in LIBRARIES)


if __name__ == "__main__":
    print(describe())
