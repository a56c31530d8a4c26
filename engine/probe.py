"""What rollback a model's memory supports, found by trying it (llama.cpp's common_context_can_seq_rm).

RS   : bounded removal of the last positions is reserved up front (not used by this engine yet).
PART : any range [p0, p1) of a sequence can be removed: a rejected draft is cut with seq_rm.
FULL : only whole sequences can be removed: checkpoint before drafting, restore + replay on rejection.
NO   : the model cannot run on this memory, or a multi-token forward on a non-empty memory does not reproduce
       a plain forward: speculation is refused (it would be lossy), plain decoding still works if possible.

The probe runs real forwards on a scratch sequence: 2 tokens, remove position 1 onward, then re-add two
tokens in one forward and compare their logits with a plain forward of the same 3 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.batch import Batch
from engine.context import ModelContext

RS, PART, FULL, NO = "RS", "PART", "FULL", "NO"
PROBE_TOLERANCE = 1e-3  # max |logit difference| allowed between cached and plain forwards


@dataclass
class ProbeResult:
    kind: str  # RS | PART | FULL | NO
    reason: str  # one line for the user

    @property
    def can_speculate(self) -> bool:
        return self.kind != NO


def probe_context(ctx: ModelContext, seq: int = 0) -> ProbeResult:
    tokens = [1, 2, 3]
    vocab = ctx.n_vocab
    tokens = [t % vocab for t in tokens]
    try:
        batch = Batch()
        batch.add(tokens[0], 0, seq, False)
        batch.add(tokens[1], 1, seq, True)
        ctx.decode(batch)
        if not ctx.seq_rm(seq, 1, -1):
            ctx.seq_rm(seq, -1, -1)
            return ProbeResult(FULL, "the memory cannot remove a tail: checkpoints with replay")
        batch = Batch()
        batch.add(tokens[1], 1, seq, True)
        batch.add(tokens[2], 2, seq, True)
        cached = ctx.decode(batch).logits
        with torch.inference_mode():
            ids = torch.tensor([tokens], device=ctx.device)
            plain = ctx.model(input_ids=ids).logits[0, 1:].float()
    except (RuntimeError, ValueError, TypeError, IndexError, AttributeError) as e:
        ctx.seq_rm(seq, -1, -1)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return ProbeResult(NO, f"the model does not run on the cell cache ({type(e).__name__}: {first})")
    ctx.seq_rm(seq, -1, -1)
    err = float((cached - plain).abs().max())
    if err > PROBE_TOLERANCE:
        return ProbeResult(NO, f"a 2-token forward on a non-empty cache differs from a plain forward by {err:.3g}")
    return ProbeResult(PART, f"range removal works (cached vs plain forward: max error {err:.1e})")
