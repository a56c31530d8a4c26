"""The check a model passes at load: the engine's forward against transformers' own on the same tokens.

Speculation is proven lossless against the engine's own plain decoding, which is only as right as the engine's
forward: a mask that gives a global layer a window, or a lean forward that misses a family's arithmetic, makes
plain and speculative decoding wrong alike. So at load a sequence longer than the smallest window runs through
the engine, a part first and the rest on the cached part (as decoding runs it), and its logits are compared with
transformers' forward of the whole sequence, which builds its own masks. On a model without windows the probe's
cached forward (engine/memory/probe.py) already is that comparison, and no forward is added.

A lean forward that disagrees gives way to transformers' forward, checked again; a model that still disagrees
is refused. The verdict (`SelfCheck`) is what the status line shows and what the page's "lossless" badge reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.batch import Batch
from engine.memory.probe import NO, PROBE_TOLERANCE, PROBE_TOLERANCE_16BIT, _rounds_activations

# the longest window checked past at load: a forward of window + CHECK_PAST tokens; a longer window would cost
# seconds of a large model's forward at every load, and the verdict then says it was not checked that far
MAX_CHECKED_WINDOW = 1024
CHECK_PAST = 8  # tokens past the window
# logits rows compared per forward (the last ones, those past the window among them): all 520 rows of a 262k
# vocabulary would be 0.55 GB on each side, the load's peak; 16 are 17 MB
CHECK_ROWS = 16


@dataclass
class SelfCheck:
    passed: bool | None  # True: agrees past every window; False: disagrees; None: not checked that far
    detail: str  # one line for the status line

    @property
    def lossless_shown(self) -> bool:
        """Whether the page may call a run identical to plain decoding "lossless"."""
        return self.passed is True


def check_tokens(n: int, n_vocab: int) -> list[int]:
    """n distinct ids spread over the middle of the vocabulary (ordinary text pieces: see probe_tokens)."""
    return [(n_vocab * (3 * i + 1)) // (3 * n + 2) for i in range(n)]


def _engine_logits(ctx, tokens: list[int], split: int, seq: int) -> tuple[torch.Tensor, list[int]]:
    """Logits of the engine's two forwards (the second over the first's cells) and their positions: the last
    rows of each, up to CHECK_ROWS and as many as the context returns (those past the window among them)."""
    out, positions = [], []
    for p0, p1 in ((0, split), (split, len(tokens))):
        first_out = p1 - min(p1 - p0, ctx.n_outputs_max or p1 - p0, CHECK_ROWS)
        batch = Batch()
        for p in range(p0, p1):
            batch.add(tokens[p], p, seq, p >= first_out)
        out.append(ctx.decode(batch).logits)
        positions += range(first_out, p1)
    return torch.cat(out), positions


def _error(ctx, logits: torch.Tensor, plain: torch.Tensor) -> tuple[bool, str]:
    """(disagrees, how much), by the probe's tolerance for the model's arithmetic."""
    if _rounds_activations(ctx.model):
        err = float((logits - plain).norm() / plain.norm().clamp_min(1e-6))
        return err > PROBE_TOLERANCE_16BIT, f"relative L2 error {err:.1e}"
    err = float((logits - plain).abs().max())
    return err > PROBE_TOLERANCE * max(1.0, float(plain.abs().max())), f"max error {err:.1e}"


def _compare(ctx, window: int, n: int, seq: int) -> tuple[bool, str]:
    tokens = check_tokens(n, ctx.n_vocab)
    try:
        logits, positions = _engine_logits(ctx, tokens, window // 2, seq)
    finally:
        ctx.seq_rm(seq, -1, -1)
    ids = torch.tensor([tokens], device=ctx.device)
    with torch.inference_mode():
        try:  # the head over the compared rows only
            plain = ctx.model(input_ids=ids, logits_to_keep=torch.tensor(positions, device=ctx.device)).logits[0]
        except TypeError:  # a model whose forward has no logits_to_keep
            plain = ctx.model(input_ids=ids).logits[0][positions]
    plain = plain.float()
    return _error(ctx, logits, plain)


def self_check(ctx, probe, seq: int = 0) -> SelfCheck:
    """Check `ctx` (a ModelContext) against transformers' forward past its smallest window; may switch `ctx` off
    its lean forward. Raises ValueError naming the measure where even transformers' forward on the cells
    disagrees: the model is refused."""
    kinds = getattr(ctx.cache, "kinds", None)
    window = kinds.smallest_window if kinds is not None else None
    n = min(window + CHECK_PAST, ctx.n_ctx) if window is not None else 0
    if window is not None and n <= window:  # no position of this context is past the window: it never cuts
        window = None
    if window is None:
        if probe.kind == NO:
            return SelfCheck(None, f"not checked: {probe.reason}")
        return SelfCheck(True, "engine = transformers' forward (the probe's cached forward)")
    if window > MAX_CHECKED_WINDOW:
        return SelfCheck(None, f"not checked past the {window}-position window (a forward that long at every "
                               f"load): checked on the probe's {probe.kind} forward only")
    wrong, measure = _compare(ctx, window, n, seq)
    if wrong and getattr(ctx, "lean", None) is not None:
        ctx.lean, ctx.lean_reason = None, f"the lean forward disagreed with transformers' ({measure})"
        wrong, measure = _compare(ctx, window, n, seq)
    if wrong:
        raise ValueError(f"the engine's forward of {n} tokens (window {window}) differs from transformers' "
                         f"by {measure}: refused, its answers would be wrong")
    return SelfCheck(True, f"engine = transformers' forward over {n} tokens, past the {window}-position window "
                           f"({measure})")
