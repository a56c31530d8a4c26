"""A CPU drafter's dense linears in the arithmetic the target runs, where that is faster here: chosen by timing.

A drafter's step multiplies one or a few rows by every weight of its linears, so it costs what reading them costs
plus what each call spends around that, as the target's forward does (engine/load/dtype.py). The paths:
- "torch": the modules as loaded, torch's own matmul (MKL / its generic kernel), in the drafter's dtype;
- "float32": prepacked float32 (engine/forward/prepack.py: our AVX2 kernel, else oneDNN's blocked layout);
- "bfloat16": prepacked bfloat16, inputs rounded to it and outputs widened back (beside a bfloat16 target);
- "int8": the weights quantised to Q8_0 groups times 8-bit inputs (engine/forward/quant_dot.py), beside a
  target whose linears run so (--dtype int8).
"auto" times one linear of each distinct shape, weighted by how many the drafter has, at the rows its step
multiplies, in each path this CPU and the target offer, interleaved; another path is kept only where it takes
under MARGIN of "torch"'s time. The drafts may change with the path (proposals); the target's verification,
and so the text, does not.
"""

from __future__ import annotations

import time
import types
from dataclasses import dataclass, field

import torch
from torch import nn

PATHS = ("auto", "torch", "float32", "bfloat16", "int8")
MARGIN = 0.95  # another path is kept where it takes under this fraction of torch's time
REPS = 5  # timings of each path behind an `auto` choice (the fastest counts: other work only adds time)


@dataclass
class LinPath:
    path: str  # one of PATHS but "auto"
    reason: str  # one line: what was asked, and the times that chose it
    ms: dict[str, float] = field(default_factory=dict)  # measured time by path


def check_path(name: str, where: str) -> None:
    if name not in PATHS:
        raise ValueError(f"{where}: dtype must be one of {', '.join(PATHS)}, not {name!r}")


def offered(target_dtype: str) -> list[str]:
    """The paths "auto" weighs beside a target loaded in `target_dtype`: torch, packed float32, and the target's
    own bfloat16 or integer arithmetic where it runs one and this CPU has the kernel."""
    from engine.forward import prepack
    from engine.forward.quant_dot import dot_reason

    out = ["torch"]
    if prepack.available():
        out.append("float32")
        if target_dtype == "bfloat16":
            out.append("bfloat16")
    if target_dtype == "int8" and not dot_reason():
        out.append("int8")
    return out


def _cast_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    from engine.forward import prepack

    return prepack.linear(self, x.to(self._compute_dtype)).to(x.dtype)


def _gemm_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # our kernels take any number of rows as they come (prepack.linear's two-row form is oneDNN's need), and a
    # drafter's calls are small enough that the checks around them would cost what the multiply does
    return self._packed_weight(x).to(x.dtype)


def convert(module: nn.Linear, path: str) -> bool:
    """`module` computes in `path` from now on, taking and giving its callers' dtype; False where that path
    cannot take it (the module is left as it was)."""
    from engine.forward import prepack

    if path == "torch":
        return True
    if path == "int8":
        from engine.forward.quant_dot import pack_linear_q8_0

        if not pack_linear_q8_0(module):
            return False
        compute = torch.float32
    else:
        compute = torch.bfloat16 if path == "bfloat16" else torch.float32
        if not prepack.available():
            return False
        loaded = module.weight.dtype
        module.to(compute)
        try:
            packed = prepack.prepack_linears(module) == 1
        except RuntimeError:  # oneDNN packs bfloat16 only on CPUs with AVX512BW/VL/DQ or AVX-NE-CONVERT
            packed = False
        if not packed:
            module.to(loaded)
            return False
    from engine.forward.gemm import SmallGemm

    module._compute_dtype = compute
    direct = isinstance(module._packed_weight, SmallGemm)
    module.forward = types.MethodType(_gemm_forward if direct else _cast_forward, module)
    return True


def runs_here(path: str) -> bool:
    """Whether `path` takes a linear of a common shape on this CPU."""
    with torch.no_grad():
        return convert(nn.Linear(64, 32, bias=False, device="cpu"), path)


def apply(linears: list[nn.Linear], path: str) -> int:
    """Convert every one of `linears` to `path`; how many took it (the others stay as they were)."""
    with torch.no_grad():
        return sum(convert(m, path) for m in linears)


def _shapes(linears: list[nn.Linear]) -> dict[tuple[int, int, torch.dtype], int]:
    counts: dict[tuple[int, int, torch.dtype], int] = {}
    for m in linears:
        key = (m.out_features, m.in_features, m.weight.dtype)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _timer(path: str, shapes: dict, rows: tuple[int, ...], gen: torch.Generator):
    """A function giving the fastest of `reps` timings, in ms, of one zero-weight linear per shape in `path`
    (a dense kernel takes as long on any values) at each of `rows`, weighted by the shape's count."""
    mods = []
    for (n_out, n_in, dtype), count in shapes.items():
        module = nn.Linear(n_in, n_out, bias=False, dtype=dtype, device="cpu")
        with torch.no_grad():
            module.weight.zero_()
        if convert(module, path):
            mods.append((module, count, [torch.randn(r, n_in, generator=gen).to(dtype) for r in rows]))

    def run(reps: int = REPS) -> float:
        best = float("inf")
        with torch.inference_mode():
            for rep in range(reps + 1):  # the first pass warms the kernels' caches
                t0 = time.perf_counter()
                for module, count, xs in mods:
                    for x in xs:
                        for _ in range(count):
                            module(x)
                if rep:
                    best = min(best, time.perf_counter() - t0)
        return best * 1000

    return run if len(mods) == len(shapes) else None


def time_paths(linears: list[nn.Linear], paths: list[str], rows: tuple[int, ...]) -> dict[str, float]:
    """ms of `linears`' calls at `rows` by path, the paths timed in turn (A B, B A, ...) so that another
    process's busy second slows some timings of each rather than all of one; a path that cannot take every
    shape is left out."""
    shapes = _shapes(linears)
    gen = torch.Generator(device="cpu").manual_seed(0)
    timers = {p: t for p in paths if (t := _timer(p, shapes, rows, gen)) is not None}
    best = {p: float("inf") for p in timers}
    names = list(timers)
    for r in range(3):
        for p in (names if r % 2 == 0 else names[::-1]):
            best[p] = min(best[p], timers[p]())
    return best


def choose(requested: str, linears: list[nn.Linear], target_dtype: str, rows: tuple[int, ...],
           where: str) -> LinPath:
    """Resolve a drafter's dtype: as asked, or "auto" by timing the paths `offered` beside the target."""
    check_path(requested, where)
    if requested != "auto":
        return LinPath(requested, f"{requested} as asked")
    paths = offered(target_dtype)
    if len(paths) == 1 or not linears:
        return LinPath("torch", "auto: torch (no other path here)")
    ms = time_paths(linears, paths, rows)
    timing = ", ".join(f"{p} {t:.3f}" for p, t in sorted(ms.items(), key=lambda kv: kv[1]))
    fastest = min((p for p in ms if p != "torch"), key=ms.get, default="torch")
    if fastest != "torch" and ms[fastest] < MARGIN * ms.get("torch", float("inf")):
        return LinPath(fastest, f"auto: {fastest} (ms of its linears at {rows} rows: {timing})", ms)
    return LinPath("torch", f"auto: torch (no path faster here; ms at {rows} rows: {timing})", ms)


def resolve(requested: str, linears: list[nn.Linear], target_dtype: str, rows: tuple[int, ...],
            where: str) -> LinPath:
    """choose, then apply: the linears run in the chosen path; a path some of them cannot take says so."""
    choice = choose(requested, linears, target_dtype, rows, where)
    taken = apply(linears, choice.path)
    if choice.path != "torch" and taken < len(linears):
        choice.reason += f" ({len(linears) - taken} of {len(linears)} linears kept as loaded: shapes it cannot take)"
    return choice
