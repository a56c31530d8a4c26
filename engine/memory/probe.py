"""What rollback a model's memory supports, found by trying it (llama.cpp's common_context_can_seq_rm).

RS   : the tokens of the last forward can be given back (conv / sliding-window layers recording their past on
       the model's own cache, engine/memory/stateful.py): a rejected draft is cut directly, one round deep.
PART : any range [p0, p1) of a sequence can be removed (the cell cache): a rejected draft is cut with seq_rm.
FULL : only whole sequences can be removed (a recurrent state): checkpoint before drafting, restore + replay.
NO   : the model cannot run on this memory, or a multi-token forward on a non-empty memory does not reproduce
       a plain forward: speculation is refused (it would be lossy), plain decoding still works if possible.

The probe runs real forwards on a scratch sequence: a 2-token forward, then an attempt to remove position 1
onward; then, on whatever memory is left (the first token, or nothing after a whole-sequence removal), a
multi-token forward whose logits must match a plain forward of the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.batch import Batch

RS, PART, FULL, NO = "RS", "PART", "FULL", "NO"
# max |logit difference| between cached and plain forwards, relative to the largest |logit|: float32 kernels
# of other shapes differ by ~1e-4 of the scale on a real model; a wrong cache or scan is off by 1e-2 or more
PROBE_TOLERANCE = 1e-3
# 16-bit weights round every activation to 8 (bfloat16) or 11 bits, the integer kernels a linear's inputs to 8:
# a correct cache differs from transformers' forward of the same weights by 0.01 to 0.06 of the logits' L2 norm on
# a real model, a wrong one by 0.4 or more
PROBE_TOLERANCE_16BIT = 0.15


def probe_tokens(n_vocab: int) -> list[int]:
    """The scratch sequence: a prefix, then a multi-token forward. Ids spread over the middle of the vocabulary
    are ordinary text pieces; the first ids are control tokens (SmolLM2's <|im_start|>, <|im_end|>, ...) whose
    activations run to 2e4. On those, two correct bfloat16 forwards of the embedded model that sum in other orders
    (ours and transformers') differed by 0.45 of the logits' L2 norm on one CPU, more than a wrong cache; on these
    ids by 0.02."""
    return [(n_vocab * (i + 1)) // 11 for i in range(7)]


@dataclass
class ProbeResult:
    kind: str  # RS | PART | FULL | NO
    reason: str  # one line for the user

    @property
    def can_speculate(self) -> bool:
        return self.kind != NO


def _forward(ctx, tokens: list[int], p0: int, seq: int) -> torch.Tensor:
    batch = Batch()
    for i, t in enumerate(tokens):
        batch.add(t, p0 + i, seq, True)
    return ctx.decode(batch).logits


def _rounds_activations(model) -> bool:
    """16-bit weights, or linears that round their inputs to 8 bits (engine/forward/quant.py's integer kernels): two
    correct forwards that sum in other orders then differ by the rounding of a whole activation, not of a sum."""
    if next(model.parameters()).dtype in (torch.float16, torch.bfloat16):
        return True
    return any(getattr(getattr(m, "_packed_weight", None), "kind", "").endswith("_dot") for m in model.modules())


def probe_context(ctx, seq: int = 0) -> ProbeResult:
    """`ctx` is a ModelContext (cells) or a StatefulContext (the model's own cache)."""
    tokens = probe_tokens(ctx.n_vocab)
    rs_memory = hasattr(ctx.cache, "n_rs")
    try:
        _forward(ctx, tokens[:2], 0, seq)
        if ctx.seq_rm(seq, 1, -1):
            kind = RS if rs_memory else PART
            n_kept = 1
        else:
            ctx.seq_rm(seq, -1, -1)
            kind, n_kept = FULL, 0
        # grow the memory to a prefix of 4, then verify 3 tokens at once on it, as a draft would be verified
        _forward(ctx, tokens[n_kept:4], n_kept, seq)
        cached = _forward(ctx, tokens[4:], 4, seq)
        with torch.inference_mode():
            ids = torch.tensor([tokens], device=ctx.device)
            plain = ctx.model(input_ids=ids).logits[0, 4:].float()
    except (RuntimeError, ValueError, TypeError, IndexError, AttributeError, KeyError) as e:
        ctx.seq_rm(seq, -1, -1)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return ProbeResult(NO, f"the model does not run on this memory ({type(e).__name__}: {first})")
    ctx.seq_rm(seq, -1, -1)
    err = float((cached - plain).abs().max())
    measure = "max error"
    if _rounds_activations(ctx.model):
        err = float((cached - plain).norm() / plain.norm().clamp_min(1e-6))  # relative L2, see the tolerance
        wrong, measure = err > PROBE_TOLERANCE_16BIT, "relative L2 error"
    else:
        wrong = err > PROBE_TOLERANCE * max(1.0, float(plain.abs().max()))
    if wrong:
        return ProbeResult(NO, f"a 3-token forward on a non-empty memory differs from a plain forward by {err:.3g}: "
                               "a draft cannot be verified in one forward, speculation is off")
    where = f"cached vs plain forward: {measure} {err:.1e}"
    if kind == RS:
        return ProbeResult(RS, f"the model's own cache gives back the last forward's tokens ({where})")
    if kind == FULL:
        return ProbeResult(FULL, f"a recurrent state cannot drop a tail: checkpoint, restore and replay ({where})")
    return ProbeResult(PART, f"range removal works ({where})")
