"""Where a prompt's tokens go in the cell cache: the longest prefix the cache already holds is kept, the
sequence's own (its previous turn) or one another slot holds (a shared system prompt, stored once with
`seq_cp`, as llama-server's `cache_prompt` reuses a slot's prefix), and the rest must fit the free cells.

Cells pass only between generations of the same `GenParams.cache_salt` (vLLM's cache salt): a prefix held for
one client is never reused for another, so neither `timings.cache_n` nor the prefill's time tells a client what
another one asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from engine.prefix import common_prefix
from engine.round.slot import Slot


@dataclass
class Placement:
    ctx: object  # the target's context: its cell cache and seq_rm
    chain: object  # the DrafterChain: its drafters' per-sequence state follows the cells
    # seq -> the slot whose tokens its cells hold (a generating, finished or parked one; None: no one's): the
    # engine's, read here, never written
    holder: Callable[[int], Slot | None]
    slots: Callable[[], list[Slot]]  # the engine's slots in their sequences now (not the parked ones)

    def cells(self, tokens: list[int], seq: int, n_keep_max: int, salt: str | None = None
              ) -> tuple[int, int, int, int, int]:
        """What placing `tokens` in `seq` takes, keeping at most n_keep_max of them from the cache and only
        from generations salted `salt`: (n_own, src, n_shared, cells needed, cells free for it)."""
        old = self.holder(seq)
        n_own = common_prefix(old.tokens, tokens, limit=n_keep_max) if old is not None and \
            old.params.cache_salt == salt else 0
        src, n_shared = self.shared_prefix(seq, tokens, n_keep_max, salt) if self.ctx.cache.can_share else (-1, 0)
        n_owned = self.ctx.cache.seq_cells(seq).numel()
        n_need = len(tokens) + 1 - max(n_own, n_shared)
        n_free = self.ctx.n_ctx - self.ctx.cache.n_used() + n_owned
        return n_own, src, n_shared, n_need, n_free

    def affinity(self, tokens: list[int], seq: int, salt: str | None) -> tuple[int, int, float]:
        """Sort key of `seq` for a new generation salted `salt` (smallest first): the sequence holding the longest
        prefix of `tokens` of its own, then one its salt held before, then an empty one, then another salt's,
        the one started longest ago first: one client's requests do not take the cells another's next turn
        would reuse while others are idle longer."""
        old = self.holder(seq)
        if old is None:
            return 0, 1, 0.0
        if old.params.cache_salt != salt:
            return 0, 2, old.t_start
        return -common_prefix(old.tokens, tokens, limit=len(tokens) - 1), 0, old.t_start

    def fits(self, tokens: list[int], seq: int, salt: str | None = None) -> bool:
        """Whether the cache has room to place `tokens` (a prompt, or a parked slot's) in `seq` now."""
        _, _, _, n_need, n_free = self.cells(tokens, seq, len(tokens) - 1, salt)
        return n_need <= n_free

    def place(self, tokens: list[int], seq: int, n_keep_max: int, salt: str | None = None) -> int:
        """Make `seq` hold the longest prefix of `tokens` the cache can give (its own cells, or a prefix another
        slot of the same salt holds, shared with seq_cp); return its length. Raises ValueError when the rest
        cannot fit."""
        n_own, src, n_shared, n_need, n_free = self.cells(tokens, seq, n_keep_max, salt)
        if n_need > n_free:
            raise ValueError(f"the cache is full: this prompt needs {n_need} more cells, {n_free} are free "
                             f"(other slots hold the rest); wait for a slot to finish or raise n_ctx")
        if n_shared > n_own:
            # a prefix another slot already holds (a shared system prompt): store it once, for both sequences
            self.ctx.seq_rm(seq, -1, -1)
            self.ctx.cache.seq_cp(src, seq, 0, n_shared)
            kept = n_shared
        elif self.ctx.seq_rm(seq, n_own, -1):
            kept = n_own
        else:  # a recurrent memory cannot go back to the shared prefix: start the sequence over
            self.ctx.seq_rm(seq, -1, -1)
            kept = 0
        self.chain.seq_rm(seq)
        if n_shared > n_own:
            self.chain.seq_cp(src, seq, n_shared)
        return kept

    def shared_prefix(self, seq: int, tokens: list[int], n_keep_max: int, salt: str | None) -> tuple[int, int]:
        """The other slot of this salt whose cached tokens share the longest prefix with `tokens`: (its seq, the
        length)."""
        best = (-1, 0)
        for other in self.slots():
            if other.seq != seq and other.replay is None and other.params.cache_salt == salt:
                n = common_prefix(other.tokens, tokens, limit=n_keep_max)
                if n > best[1]:
                    best = (other.seq, n)
        return best

    def make_room(self, generating: list[Slot], per_seq: int, idle: list[int], release) -> None:
        """Free the cells that finished or parked slots (`idle`, in order) keep for prefix reuse, each by
        `release`, until the round of the `generating` slots has room: an answer must not stop for 'context'
        while idle slots fill the cache. per_seq: the logits rows a sequence may use in a forward."""
        want = sum(1 + (min(s.params.spec.n_max, per_seq - 1) if s.params.spec.types else 0) for s in generating)
        for seq in idle:
            if self.ctx.n_ctx - self.ctx.cache.n_used() >= want:
                return
            release(seq)


def seats(engine, head, free: list[int]) -> list[int]:
    """The free sequences in the order the waiting request `head` takes them: a step-mode slot coming back its
    own (its cells are still there), a lone request the one holding most of its prompt (engine.affinity)."""
    free = list(free)
    if head.group is None and head.parked is None:
        free.sort(key=lambda s: engine.affinity(head.prompt, s, head.params.cache_salt))
    home = head.parked.seq if head.parked is not None else None
    if home in free:
        free.remove(home)
        free.insert(0, home)
    return free
