"""draft-eagle3: a published EAGLE-3 head (the EAGLE authors' or vllm-project/speculators' layout) as a drafter.

The checkpoint is read by engine/load/eagle3.py and becomes a DraftHead (engine/draft/head/eagle3_net.py), so it
drafts exactly as draft-head does: it reads the target hidden states the checkpoint names (`hidden_layers`),
keeps its own KV cache rolled back with the target, drafts chains, and grows dynamic trees in tree mode
(tree.py). One difference in the cache, after the reference (SafeAILab/EAGLE eagle/model/cnets.py,
topK_genrate, which feeds input_ids[:, 1:] beside the hidden states): the head has no entry for a sequence's
first token, which no target hidden state precedes, where our own head keeps one made from a zero feature.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.draft.head.drafter import DraftHeadDrafter, DraftHeadParams
from engine.draft.head.eagle3_net import eagle3_head
from engine.draft.lin_path import check_path
from engine.load.eagle3 import read_eagle3


@dataclass
class Eagle3Params(DraftHeadParams):
    # the checkpoint's directory: config.json beside model.safetensors or pytorch_model.bin (--draft DIR)
    weights: Path | None = None
    # stop drafting below this top probability when the request leaves it to the drafter: draft-head's value,
    # not measured for published heads (whose own drafting runs a fixed depth, with no such stop)
    p_min: float = 0.3
    # the head's linears' arithmetic (engine/draft/lin_path.py): "auto" times the target's paths here at load
    dtype: str = "auto"


class Eagle3Drafter(DraftHeadDrafter):
    name = "draft-eagle3"
    first_entry = 1  # no entry for the first token (module docstring)

    def __init__(self, target=None, params: Eagle3Params | None = None):
        if target is None:
            raise ValueError("draft-eagle3 needs the target model (its hidden states)")
        params = params or Eagle3Params()
        if params.weights is None:
            raise ValueError("draft-eagle3 needs an EAGLE-3 checkpoint directory (--draft DIR)")
        check_path(params.dtype, self.name)
        head = eagle3_head(read_eagle3(Path(params.weights)), target)
        head.lin_request = params.dtype
        super().__init__(target=target, params=params, head=head)
        self.lin_path = head.lin_path
