"""How true "verifying K tokens costs about what generating one costs" is on this machine, measured at load.

Decoding one token reads every weight once; if that read is what a forward waits on, K rows cost what one row
costs, since the weights are read once for all of them. Two numbers say how far this holds here: the forward's
time against its rows (the engine's calibrated curve, engine/cost/calibrate.py), and the time the weights take
to stream from memory at the bandwidth a large copy reaches (`weight_bytes / bandwidth`, the memory-bound
floor). A one-row forward near that floor waits on memory, and extra rows are nearly free; far above it, the
forward waits on arithmetic, and each row adds its own share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

FLAT_TOLERANCE = 0.10  # a forward of K rows "costs about one" while it costs at most this much more
BANDWIDTH_BYTES = 256 << 20  # the copy timed for the bandwidth: far past any cache
BANDWIDTH_PASSES = 5


@dataclass(frozen=True)
class Roofline:
    rows: tuple[int, ...]  # forward sizes timed, ascending (the calibration's)
    seconds: tuple[float, ...]  # the fastest time of a forward of that many rows
    weight_bytes: int  # bytes of weights one forward reads (the input embedding's table is not read whole)
    bandwidth: float  # bytes per second a large copy reads and writes on this machine

    @property
    def t_floor(self) -> float:
        """Seconds the weights take to stream from memory once: no forward can be faster."""
        return self.weight_bytes / self.bandwidth if self.bandwidth > 0 else 0.0

    def ratio(self, n: int) -> float:
        """A forward of n rows in forwards of one (the nearest timed size at or below n)."""
        i = max((j for j, r in enumerate(self.rows) if r <= n), default=0)
        return self.seconds[i] / self.seconds[0] if self.seconds[0] > 0 else 1.0

    def flat_up_to(self, tolerance: float = FLAT_TOLERANCE) -> int:
        """The most rows whose forward costs at most 1 + tolerance forwards of one."""
        return max((r for r in self.rows if self.ratio(r) <= 1 + tolerance), default=1)

    def memory_share(self) -> float:
        """Of a one-row forward, the share the weights' read alone explains (1: purely memory-bound)."""
        return min(1.0, self.t_floor / self.seconds[0]) if self.seconds and self.seconds[0] > 0 else 0.0


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters and buffers a forward reads: every tensor once (tied ones once), except an input
    embedding table that is not also the output head, of which a forward reads only its tokens' rows."""
    seen, total = set(), 0
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skip = set()
    if embedding is not None and getattr(embedding, "weight", None) is not None:
        tied = head is not None and getattr(head, "weight", None) is embedding.weight
        if not tied:
            skip.add(id(embedding.weight))
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen or id(t) in skip or t.device.type == "meta":
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def measure_bandwidth(n_bytes: int = BANDWIDTH_BYTES, passes: int = BANDWIDTH_PASSES) -> float:
    """Bytes per second a copy of n_bytes reads plus writes, the fastest of `passes` (another process only
    slows a copy down)."""
    src = np.ones(n_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    fastest = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        fastest = min(fastest, time.perf_counter() - t0)
    return 2 * src.nbytes / fastest


def roofline(model: torch.nn.Module, sizes: list[int], seconds: list[float],
             bandwidth: float | None = None) -> Roofline:
    """The curve (sizes, seconds) of `model`'s forward beside its weights' floor; the bandwidth measured now
    unless given."""
    return Roofline(rows=tuple(sizes), seconds=tuple(seconds), weight_bytes=weight_bytes(model),
                    bandwidth=measure_bandwidth() if bandwidth is None else bandwidth)
