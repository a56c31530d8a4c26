"""Checkpoints for the FULL rollback path: save before verifying, restore + replay on a partial acceptance.

llama.cpp's common_prompt_checkpoint keeps what cannot be rebuilt by re-running tokens: the target's partial
state (sliding-window K/V, recurrent state; empty for plain attention), the draft's, the drafters' private
state (`data_spec`) and a clone of the sampler (and of the slot's grammar state, which moves with it). On
partial acceptance the slot restores the target's part and the sampler, removes the whole verification batch
from the cache, and runs a *replay* round next: the accepted tokens go through the target again in one forward
while the sampler re-draws exactly what the verification drew (and the grammar consumes them again), so the
replay decides nothing new and the text is the same as on the range-removal path, only slower.

The drafters are not rolled back. They hear the verdict on the draft they made before the restore, and what
they keep is checked against the confirmed tokens at every draft (n-gram indexes, a draft model's cache), so
nothing of the rejected tail reaches the next draft. Putting back their state from before the draft would
undo what accept() learnt (ngram-map-k's accepted length per key, ngram-mod's low-acceptance streak) and
rewind a model drafter's random stream to draws that the rejected round, and so the text, already depended on.

The target's part comes from its memory: nothing on the cell cache, where every range can be removed (this path
then runs only when forced, `rollback="checkpoint"`, for a learner to compare the two paths on the same
prompt); recurrent/conv states and sliding K/V on a stateful model's own cache (engine/memory/stateful.py), where it
is the only way back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from engine.grammar import Grammar
from engine.sampling import Sampler


@dataclass
class Checkpoint:
    n_tokens: int  # tokens of the slot in the target cache when it was taken
    pos_max: int  # last position of the slot in the target cache (-1 if empty)
    sampler: Sampler  # clone of the target sampler before verification
    grammar: Grammar | None = None  # clone of the slot's grammar state: it follows the sampler back
    data_tgt: Any = None  # partial target state that a replay cannot rebuild (none for the cell cache)
    seconds: float = 0.0  # time to take it


@dataclass
class Replay:
    tokens: list[int]  # [sampled, d1..dm, t]: what the rolled-back round decided, to run through the target
    n_draws: int  # uniforms the verification took from the sampler stream
    cost_ms: float  # checkpoint + restore time, reported with the replay round


def take(slot, cache) -> Checkpoint:
    t0 = time.perf_counter()
    ckpt = Checkpoint(
        n_tokens=len(slot.tokens),
        pos_max=cache.seq_pos_max(slot.seq),
        sampler=slot.sampler.clone(),
        grammar=slot.grammar.clone() if slot.grammar is not None else None,
        data_tgt=cache.state_save(slot.seq),
    )
    ckpt.seconds = time.perf_counter() - t0
    return ckpt


def restore(slot, cache, ckpt: Checkpoint) -> float:
    """Put the slot back where the checkpoint was taken; return the seconds it took."""
    t0 = time.perf_counter()
    cache.state_restore(slot.seq, ckpt.data_tgt, ckpt.pos_max + 1)
    del slot.tokens[ckpt.n_tokens:]
    slot.sampler.copy_from(ckpt.sampler)
    if ckpt.grammar is not None:
        slot.grammar.copy_from(ckpt.grammar)
    return time.perf_counter() - t0
