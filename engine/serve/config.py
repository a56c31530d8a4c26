"""An engine's settings: the sizes of its memory and slots, its drafting limits, how it times and shares its
forwards, and what drafters are built with. One frozen record, checked before anything is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

MIN_CELLS_PER_SLOT = 64  # a cache smaller than this per slot could not hold a useful chat in every slot


@dataclass(frozen=True)
class EngineConfig:
    n_ctx: int = 4096  # cells in the target's cache, for all slots together
    n_seq_max: int = 4  # slots (sequences) that generate at once, llama-server's n_parallel
    # the most cells one sequence may hold (llama-server's n_ctx / n_parallel), so one long request cannot take
    # the cells the others' answers grow into; None: the whole cache
    n_ctx_seq: int | None = None
    n_draft: int = 16  # logits rows a slot's draft may take in a forward, beside its sampled token
    n_rs: int = 0  # on a recurrent model, the tail (in tokens) that reversible state undoes without a checkpoint
    calibrate: bool = True  # time the forwards by rows at start (the cost curve the length policy reads)
    # the draft budget's rule for several slots' draft rows: no answer slower than plain decoding gives it;
    # False: the batch's goodput alone chooses (engine/budget/tree_budget.py)
    fair: bool = True
    # forwards on this many threads always; None: all of torch's, fewer while another process holds cores
    # (engine/serve/threads.py; only with a calibrated cost curve to measure against)
    threads: int | None = None
    # drafter type -> its params dataclass, over our defaults (engine/draft/registry.py, default_params)
    drafter_params: Mapping = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "drafter_params", MappingProxyType(dict(self.drafter_params or {})))

    def check(self) -> None:
        """ValueError naming the setting where the cache, the slots, a slot's share or the threads cannot work."""
        n_ctx, n_seq_max, n_ctx_seq = self.n_ctx, self.n_seq_max, self.n_ctx_seq
        if n_seq_max < 1:
            raise ValueError(f"need at least one slot, got {n_seq_max}")
        if n_ctx < n_seq_max * MIN_CELLS_PER_SLOT:
            raise ValueError(f"a cache of {n_ctx} cells cannot hold {n_seq_max} slots (at least "
                             f"{MIN_CELLS_PER_SLOT} cells each): raise n_ctx to {n_seq_max * MIN_CELLS_PER_SLOT} "
                             f"or use fewer slots")
        if n_ctx_seq is not None and not MIN_CELLS_PER_SLOT <= n_ctx_seq <= n_ctx:
            raise ValueError(f"a slot's share of the cache must be in [{MIN_CELLS_PER_SLOT}, {n_ctx}] cells, "
                             f"got {n_ctx_seq}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
