"""The integer path around engine/forward/kernels/small_gemm_qdot.c: whether it runs on this CPU, how fast one layer's
linears run in it against the float32 arithmetic on the same blocks (engine/load/dtype.py chooses by that), and a float
linear quantised to Q8_0 groups for it (the draft head's, beside a target that runs it).

A GGUF's own blocks go through engine/forward/quant.py's `attach(dot=True)`; the layout both share is `quant.pack_dot`.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from engine.forward.gemm import SmallGemm
from engine.forward.quant import GROUP, QuantWeight, load_kernels, pack, pack_dot

def dot_reason() -> str:
    """"" where the integer kernels run on this CPU (VNNI's byte dot products, or AVX2's byte pairs), else why
    not."""
    fns, _, why = load_kernels()
    return why or ("" if "q4_1_dot" in fns else "the kernel was built without AVX2")


def time_kernels(layer: list[tuple[int, int]], rows: tuple[int, ...] = (1, 4, 16), reps: int = 5) -> dict[str, float]:
    """ms of one decoder layer's linears, (outputs, inputs) each, as Q4_1 blocks at each of `rows`, summed, by
    kernel ("q4_1": float32 arithmetic, "q4_1_dot": integers): the fastest of 2 * `reps` timings taken in turn,
    the weights random, since a kernel takes as long on any values."""
    fns, nb, _ = load_kernels()
    rng = np.random.default_rng(0)
    shapes = [(o, i) for o, i in layer if o % nb == 0 and i % GROUP == 0]
    weights = []
    for o, i in shapes:
        q = rng.integers(0, 16, (o, i), dtype=np.uint8)
        d = np.full((o, i // GROUP), 1e-3, np.float32)
        weights.append(QuantWeight("q4_1", q, d, -8 * d))
    kinds = [kind for kind in ("q4_1", "q4_1_dot") if kind in fns]
    packed = {kind: [(pack_dot if kind.endswith("_dot") else pack)(w, nb) for w in weights] for kind in kinds}
    inputs = {(r, i): torch.randn(r, i) for r in rows for _, i in shapes}
    outputs = {(r, o): torch.empty(r, o, device="cpu") for r in rows for o, _ in shapes}
    best = {kind: float("inf") for kind in kinds}
    # the kinds in turn within every repetition (the first warms up): a busy second on another process's part
    # slows a timing of each, not all timings of one
    for rep in range(2 * reps + 1):
        for kind in (kinds if rep % 2 == 0 else kinds[::-1]):
            t0 = time.perf_counter()
            for r in rows:
                for (o, i), w in zip(shapes, packed[kind]):
                    fns[kind](inputs[r, i].data_ptr(), w.data_ptr(), outputs[r, o].data_ptr(), None, r, i, o, 0)
            if rep > 0:
                best[kind] = min(best[kind], time.perf_counter() - t0)
    return {kind: seconds * 1000 for kind, seconds in best.items()}


def quantize_q8_0(weight: np.ndarray) -> QuantWeight:
    """[N, K] float32 -> Q8_0 groups of 32 as ggml's quantize_row_q8_0 makes them: d = max |w| / 127, q = w / d
    rounded (d kept in float32 here)."""
    n, k = weight.shape
    g = weight.reshape(n, k // GROUP, GROUP)
    d = (np.abs(g).max(-1) / np.float32(127)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.clip(np.rint(g * inv[..., None]), -127, 127).astype(np.int8)
    return QuantWeight("q8_0", q.reshape(n, k), d, None)


def pack_linear_q8_0(module: nn.Linear) -> bool:
    """Give a bias-free float linear a Q8_0 copy of its weight through the integer kernel (a drafter's, whose
    numbers only decide what it proposes); False where the kernel does not run here or the shape does not fit."""
    fns, nb, _ = load_kernels()
    n, k = module.weight.shape
    if "q8_0_dot" not in fns or module.bias is not None or n % nb or k % GROUP:
        return False
    from engine.forward.prepack import install

    w = quantize_q8_0(module.weight.detach().float().numpy())
    install(module, SmallGemm(fns["q8_0_dot"], pack_dot(w, nb), k, n, torch.float32, torch.float32,
                              kind="q8_0_dot"), drop_weight=True)
    return True
