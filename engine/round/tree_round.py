"""Verifying a tree of drafts inside a round (engine/round/round.py; a chain's verdict is chain_verify.py): the
target's walk, the cells of the branches it did not take, the kept path moved home, the drafters credited, and
the records of the slot's round (event_builder.py).

The branches leave the cache by cell (CellCache.rm_cells): siblings share positions with the path the target
took, so no position range names them. Under a checkpoint (rollback "checkpoint") the whole tree goes with the
restore and the kept path is replayed, as for a chain.
"""

from __future__ import annotations

import time
from collections import Counter

from engine.draft.base import DraftRequest
from engine.draft.record import take_relay
from engine.memory import checkpoint
from engine.round import verify
from engine.draft.tree import DraftTree
from engine.round.event_builder import Decision, SlotRound, TreeShown
from engine.sampling import argmax_rows, entropy_bits
from engine.round.chain_verify import Verifying
from engine.round.slot import Slot
from engine.round.tree_rejection import SiblingTry, tree_rejection


def verify_tree(v: Verifying, slot: Slot, r: DraftRequest, tree: DraftTree, logits, cells, ckpt,
                drafter: str | None) -> tuple[SlotRound, list[int]]:
    """The target walks the tree (verify.tree_match; by rejection sampling where drafts were drawn from q,
    tree_rejection.py) the budget put in the forward for request `r`; the
    branches it did not take leave the cache by cell, since they share positions with the path it took.
    Returns the slot's round and its kept rows."""
    t1 = time.perf_counter()
    top = argmax_rows(logits)  # the target's own choice per row, for the walk and the event
    tries: list[SiblingTry] = []
    if tree.sampled and not slot.sampler.greedy:  # drafts drawn from q: rejection sampling over the siblings
        verdict, path, tries = tree_rejection(slot.sampler, logits, tree)
    else:
        verdict, path = verify.tree_match(slot.sampler, logits, tree, top)
    t_verify = v.t_forward_ms + (time.perf_counter() - t1) * 1e3
    v.chain.accept_tree(slot.seq, tree, path)
    k, m = len(tree), len(path)
    t2 = time.perf_counter()
    p_sampled = len(slot.tokens)
    p0 = p_sampled + 1
    kept = [0] + [n + 1 for n in path]  # the root's row, then the path's
    path_tokens = [tree.tokens[n] for n in path]
    rollback, rm_range = "none", None
    if m < k and slot.params.spec.rollback != "checkpoint":
        v.ctx.cache.rm_cells(cells[[i for i in range(1 + k) if i not in set(kept)]])
        v.ctx.cache.settle(cells[kept].tolist())
        rollback, rm_range = "tree", (p0 + m, p0 + tree.max_depth())
    elif m < k and ckpt is not None:
        restore_s = checkpoint.restore(slot, v.ctx.cache, ckpt)
        slot.replay = checkpoint.Replay(tokens=[slot.id_last] + path_tokens + [verdict.tokens[-1]],
                                        n_draws=verdict.n_draws, cost_ms=(ckpt.seconds + restore_s) * 1e3)
        rollback, rm_range = "checkpoint", (p_sampled, p0 + tree.max_depth())
    elif m < k:
        raise RuntimeError(f"sequence {slot.seq}: a tree's branches cannot leave the cache without a checkpoint")
    t_rollback = (time.perf_counter() - t2) * 1e3
    if slot.replay is None:
        slot.tokens.append(slot.id_last)
        slot.tokens.extend(path_tokens)
        slot.id_last = verdict.tokens[-1]
    decided = Decision(
        seq=slot.seq, round=slot.round, kind="spec", drafter=drafter, pos_sampled=p_sampled, p0=p0,
        drafted=display_chain(tree, path), n_accepted=m, bonus=verdict.tokens[-1], p_target=verdict.p_target,
        entropy=entropy_bits(logits[kept]) if slot.params.explain else [],
        target_top=top, verify_mode="tree", rollback=rollback, rm_range=rm_range,
        rm_cells=0 if rollback == "none" else k - m if rollback == "tree" else 1 + k,
        rm_positions=freed_positions(tree, path, p0) if rollback == "tree" else [],
        relay=take_relay(v.chain.records.of(slot.seq), r, Counter(tree.drafters), tree=True),
        tree=TreeShown(tokens=list(tree.tokens), parents=list(tree.parents), drafters=list(tree.drafters),
                       path=list(path), tries=tries))
    slot.round += 1
    out = v.emit(slot, verdict.tokens)
    if slot.state == "done":
        slot.replay = None
    return SlotRound(decided, out, v.timing(t_verify, t_rollback)), kept


def freed_positions(tree, path: list[int], p0: int) -> list[int]:
    """The position of each node off the kept path, the cells rm_cells freed (siblings repeat a position)."""
    on_path = set(path)
    return sorted(p0 + tree.depth(n) - 1 for n in range(len(tree)) if n not in on_path)


def display_chain(tree, path: list[int]) -> list[int]:
    """A tree shown as a chain: the kept path, then the first child below it (what the target refused there)."""
    node = path[-1] if path else -1
    tokens = [tree.tokens[n] for n in path]
    kids = tree.children(node)
    while kids:
        tokens.append(tree.tokens[kids[0]])
        kids = tree.children(kids[0])
    return tokens
