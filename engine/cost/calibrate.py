"""The engine's cost curve: what a forward of n rows costs on this machine, timed at start.

The length policy and the round's budget (engine/cost/curve.py, engine/budget/tree_budget.py) decide by c(n), a
forward of n rows in forwards of one row. `calibrate` times one sequence after a chat turn's prefix at every size a forward
may hold, then what a row's attention costs per cell it sees, then what a sequence's row costs beyond a row of a
sequence already in the forward.
"""

from __future__ import annotations

from engine.batch import Batch, OutputLimits
from engine.cost.curve import CostModel, non_decreasing, smooth_small
from engine.memory.probe import PART, ProbeResult


def calibrate(ctx, limits: OutputLimits, probe: ProbeResult, passes: int = 7,
              sizes=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64), n_prefix: int = 256) -> CostModel:
    """Time forwards of n rows after a prefix of a chat turn's length: the c(n) of the length policy and
    the round's budget. Each row attends to the prefix, so a short prefix would make rows look cheaper
    than they are in a conversation; sizes go up to what one forward may hold (all slots' drafts).

    Another process can only slow a forward down, so each size keeps its fastest of `passes` timings, and
    the passes go over all sizes in turn so that a busy second hits one timing of many sizes rather than
    every timing of one. Sizes up to 16 are then smoothed by one quadratic through them all (curve.py,
    `smooth_small`), and the curve is made non-decreasing by pooling adjacent violators: a spike is
    averaged with its neighbours instead of lifting every size after it."""
    sizes = [n for n in sizes if n <= limits.total] or [1]
    seq = 0
    n_prefix = max(1, min(n_prefix, ctx.n_ctx - max(sizes) - 1))
    batch = Batch()
    for i in range(n_prefix):
        batch.add((i + 10) % ctx.n_vocab, i, seq, False)
    batch.output[-1] = True
    ctx.decode(batch)
    saved = ctx.cache.state_save(seq)
    fastest = [float("inf")] * len(sizes)
    for rep in range(passes + 1):  # the first pass warms the kernels up and is not kept
        for j, n in enumerate(sizes):
            b = Batch()
            for i in range(n):
                b.add((100 + i) % ctx.n_vocab, n_prefix + i, seq, True)
            seconds = ctx.decode(b).seconds
            ctx.cache.state_restore(seq, saved, n_prefix)
            if rep > 0:
                fastest[j] = min(fastest[j], seconds)
    cell_seconds, n_rows = _cell_seconds(ctx, seq, n_prefix, sizes, fastest, passes)
    ctx.seq_rm(seq, -1, -1)
    return CostModel(sizes=list(sizes), seconds=non_decreasing(smooth_small(sizes, fastest)),
                     cell_seconds=cell_seconds, calibrated_cells=n_prefix + n_rows // 2,
                     seq_seconds=_seq_seconds(ctx, limits, probe, passes))


def _cell_seconds(ctx, seq: int, n_prefix: int, sizes: list[int], fastest: list[float], passes: int,
                  n_short: int = 32) -> tuple[float, int]:
    """(seconds a row's attention takes per cell it sees, rows timed): the calibration's 8 rows (or the
    nearest size) timed again after n_short cells instead of n_prefix. 0 where the prefix is too short."""
    j = min(range(len(sizes)), key=lambda i: abs(sizes[i] - 8))
    n = sizes[j]
    if n_prefix - n_short < 64:
        return 0.0, n
    ctx.seq_rm(seq, -1, -1)  # a fresh short prefix: a recurrent memory cannot drop a tail
    batch = Batch()
    for i in range(n_short):
        batch.add((i + 10) % ctx.n_vocab, i, seq, i == n_short - 1)
    ctx.decode(batch)
    saved = ctx.cache.state_save(seq)
    short = float("inf")
    for rep in range(passes + 1):
        b = Batch()
        for i in range(n):
            b.add((100 + i) % ctx.n_vocab, n_short + i, seq, True)
        seconds = ctx.decode(b).seconds
        ctx.cache.state_restore(seq, saved, n_short)
        if rep > 0:
            short = min(short, seconds)
    return max(0.0, fastest[j] - short) / (n * (n_prefix - n_short)), n


def _seq_seconds(ctx, limits: OutputLimits, probe: ProbeResult, passes: int, n_short: int = 32) -> float:
    """What a sequence's row costs beyond a row of a sequence already in the forward: k sequences of one row each
    against one sequence of k rows, all after n_short cells (k up to 4 slots). On the AVX2 host a fourth sequence
    added more to a forward of three than a draft row did (docs/measured.md#epyc-avx2-the-forwards-cost-curve): a
    slot that leaves early saves the others more than a row. 0 with fewer than 2 sequences or a memory that cannot
    drop a tail."""
    k = min(4, ctx.n_seq_max, limits.total)
    if k < 2 or probe.kind != PART:
        return 0.0
    for seq in range(k):
        batch = Batch()
        for i in range(n_short):
            batch.add((i + 10 + seq) % ctx.n_vocab, i, seq, i == n_short - 1)
        ctx.decode(batch)
    spread, stacked = Batch(), Batch()
    for i in range(k):
        spread.add((100 + i) % ctx.n_vocab, n_short, i, True)
        stacked.add((100 + i) % ctx.n_vocab, n_short + i, 0, True)
    fastest = [float("inf"), float("inf")]  # spread, stacked
    for rep in range(passes + 1):  # the first pass warms up and is not kept
        for j, b in enumerate((spread, stacked)):
            seconds = ctx.decode(b).seconds
            for seq in range(k):
                ctx.seq_rm(seq, n_short, -1)
            if rep > 0:
                fastest[j] = min(fastest[j], seconds)
    for seq in range(k):
        ctx.seq_rm(seq, -1, -1)
    return max(0.0, fastest[0] - fastest[1]) / (k - 1)
