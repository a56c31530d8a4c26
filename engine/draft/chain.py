"""The priority chain of drafters: llama.cpp's common_speculative_draft / _accept relay.

Drafters are tried in priority order (n-gram first, model drafters last). The first one that fills a
sequence's request takes the `drafting` baton from it, is remembered as its record's `impl_last`, and hears
the verdict when it comes back; every other drafter hears about it with `is_other=True` so its own
bookkeeping stays in step with the target. In tree mode every drafter's proposal is merged into one tree.

What the relay does not decide itself it reads from the request's allowance (engine/draft/allowance.py),
filled by the draft budget before drafting: whether a drafter drafts, how far, how a chain's nodes score. It
writes on the request what each drafter cost and offered (its `report`), which the budget reads after
drafting. Without an allowance every drafter drafts what it can, up to n_max.
"""

from __future__ import annotations

import time

from engine.batch import Batch
from engine.draft.allowance import Allowance, DraftReport
from engine.draft.base import Drafter, DraftRequest
from engine.draft.record import SeqRecords, offer
from engine.draft.stats import DrafterStats, timed

class DrafterChain:
    """Relay over a shared pool of drafters; each sequence has its own ordered list of drafter types."""

    def __init__(self, pool: dict[str, Drafter]):
        self.pool = pool  # name -> drafter instance, shared by all sequences (each keeps per-seq state)
        self.records = SeqRecords()  # seq -> what the relay keeps about it (engine/draft/record.py)
        self.stats: dict[str, DrafterStats] = {}  # name -> counters over all sequences
        # seq -> name -> counters, one user's view: read after the sequence's final event (it may be released
        # by then), replaced when it begins again
        self.seq_stats: dict[int, dict[str, DrafterStats]] = {}

    def add(self, name: str, drafter: Drafter) -> None:
        """A drafter type built for this engine: from now on sequences may draft with it."""
        self.pool[name] = drafter

    def _both(self, seq: int, name: str) -> tuple[DrafterStats, DrafterStats]:
        per = self.seq_stats.setdefault(seq, {})
        return self.stats.setdefault(name, DrafterStats(name)), per.setdefault(name, DrafterStats(name))

    def begin(self, seq: int, prompt: list[int], types: list[str]) -> None:
        unknown = [t for t in types if t not in self.pool]
        if unknown:
            raise ValueError(f"drafter(s) not loaded: {', '.join(unknown)}")
        record = self.records.of(seq)
        record.types, record.impl_last = list(types), None
        self.seq_stats[seq] = {}
        for name in types:
            s, s_seq = self._both(seq, name)
            with timed("t_begin_us", s, s_seq):
                self.pool[name].begin(seq, prompt)
            s.n_call_begin += 1
            s_seq.n_call_begin += 1

    def process(self, batch: Batch, result=None) -> None:
        for impl in self.pool.values():
            impl.process(batch, result)

    def draft(self, requests: list[DraftRequest]) -> dict[int, str | None]:
        """Fill the requests, each sequence's drafters in its relay order; return seq -> the drafter whose draft
        is verified (None if nobody)."""
        winner: dict[int, str | None] = {r.seq: None for r in requests}
        allowed = {r.seq: self._new_round(r) for r in requests}
        n_stages = max((len(self.records.of(r.seq).types) for r in requests), default=0)
        for stage in range(n_stages):
            for name, active in self._turn(requests, allowed, stage).items():
                self._ask(name, active)
                for r in active:
                    k = self._merge(r, name, allowed[r.seq]) if r.tree_max > 0 else self._cut(r, allowed[r.seq])
                    if k > 0:
                        self._won(r, name, k, winner)
        return winner

    def _new_round(self, r: DraftRequest) -> Allowance:
        """Clear what an earlier pass left on the request (a pass that raised is run again, request by
        request); draft where allowed. Returns the request's allowance."""
        self.records.of(r.seq).impl_last = None
        r.drafting, r.turn, r.report, r.tree = r.n_max > 0, None, DraftReport(), None
        r.result, r.result_q, r.result_p, r.result_tree, r.result_alts, r.result_share = [], None, None, None, [], 1.0
        return r.allowed(self.records.of(r.seq).types)

    def _turn(self, requests: list[DraftRequest], allowed: dict[int, Allowance], stage: int) -> dict:
        """drafter -> the requests it drafts for at this stage of the relay: those still drafting whose allowance
        lets it. A network in tree mode is weighed by how well the drafters before it guessed the next token."""
        by_name: dict[str, list[DraftRequest]] = {}
        for r in requests:
            types = self.records.of(r.seq).types
            if not r.drafting or stage >= len(types):
                continue
            name, p_covered = types[stage], 0.0
            if self.pool[name].needs_model and r.tree_max > 0:
                p_covered = sum(s for s, parent in zip(r.tree.scores, r.tree.parents) if parent < 0) if r.tree else 0.0
                r.report.p_covered[name] = p_covered
            if allowed[r.seq].drafts(name, p_covered):
                by_name.setdefault(name, []).append(r)
        return by_name

    def _ask(self, name: str, active: list[DraftRequest]) -> None:
        """One call of `name` drafts for every request in `active`, each charged an equal share of its time."""
        s = self._both(active[0].seq, name)[0]
        per_seq = [self._both(r.seq, name)[1] for r in active]
        for r in active:
            r.turn = name
        t0 = time.perf_counter()
        with timed("t_draft_us", s, *per_seq, share=1 / len(active)):
            self.pool[name].draft(active)
        share = (time.perf_counter() - t0) / len(active)
        s.n_call_draft += 1
        for r, s_seq in zip(active, per_seq):
            s_seq.n_call_draft += 1
            r.report.asked.append(name)
            r.report.seconds[name] = share
            self._keep_extras(r, name)

    def _won(self, r: DraftRequest, name: str, k: int, winner: dict[int, str | None]) -> None:
        """`name` proposed k tokens: in a chain it wins the request; in a tree the first to propose is named."""
        record = self.records.of(r.seq)
        if r.tree_max > 0:
            if winner[r.seq] is None:  # counted in accept_tree, for the nodes verified
                winner[r.seq] = record.impl_last = name
            return
        r.drafting = False
        record.impl_last = name
        winner[r.seq] = name
        s, s_seq = self._both(r.seq, name)
        s.on_draft(k)
        s_seq.on_draft(k)

    def _keep_extras(self, r: DraftRequest, name: str) -> None:
        """What the chain keeps of a result besides its tokens. q only from a drafter whose q is over the target's
        vocabulary: rejection sampling needs exactly that, and a request without q is verified by sample-and-match
        (engine/round/chain_verify.py, judge), which is exact too. And a drafter of another vocabulary's two
        tokenisations of its draft, for the round's event."""
        impl = self.pool[name]
        offer(self.records.of(r.seq), name, r, impl.needs_model)  # the relay as the event tells it, before any cut
        if not impl.gives_q:
            r.result_q = None
        retokenized = impl.retokenized(r.seq)
        if retokenized is not None and r.result:
            r.report.retokenized = retokenized

    def _merge(self, r: DraftRequest, name: str, allowance: Allowance) -> int:
        """Tree mode: move the fresh result (a chain, or a drafter's own tree) into the request's tree, shared
        prefixes once, at most tree_max nodes; the request keeps drafting for the next drafter. No length
        policy cut here: the round's budget chooses among all nodes (engine/budget/tree_budget.py). Returns the depth of
        what fitted."""
        from engine.draft.tree import DraftTree, SampledChain

        if r.tree is None:
            r.tree = DraftTree()
        deepest = 0
        if r.result_tree is not None:
            nodes = r.tree.add_tree(r.result_tree, name, limit=r.tree_max)
            deepest = max((r.tree.depth(n) for n in nodes), default=0)
        else:
            if r.result_q is not None and r.result:  # drawn from q: tested whole, whatever fits as nodes
                n = min(len(r.result), r.draft_max, len(r.result_q))
                r.tree.sampled.append(SampledChain(name, list(r.result[:n]), list(r.result_q[:n])))
            for tokens, share in [(r.result, r.result_share)] + r.result_alts:
                chain = tokens[:r.draft_max]
                if len(chain) >= max(r.n_min, 1):
                    r.report.scored[name] = max(r.report.scored.get(name, 0), len(chain))
                    scores = [share * a for a in allowance.of(name).path_scores(len(chain))]
                    # a chain under the root: its i-th node is at depth i + 1
                    deepest = max(deepest, len(r.tree.add_chain(chain, name, limit=r.tree_max, scores=scores)))
        r.result, r.result_q, r.result_p, r.result_tree = [], None, None, None
        r.result_alts, r.result_share = [], 1.0
        return deepest

    def _cut(self, r: DraftRequest, allowance: Allowance) -> int:
        """Apply the grammar, the drafter's length, n_min and the length policy's cut (the allowance's) to a fresh
        result; return the kept length."""
        k = min(len(r.result), r.draft_max)
        if r.grammar is not None and k > 0:
            # a token the grammar forbids can never be kept, nor anything after it: the draft ends before it,
            # here rather than after the chain so the counters and the length policy see the draft that is
            # verified, and a draft cut to nothing leaves the request to the next drafter
            k = min(k, r.grammar.valid_prefix(r.result[:k]))
        if k < max(r.n_min, 1):
            k = 0
        if k > 0:
            r.report.offered[r.turn] = k
            k = allowance.of(r.turn).cut(k)
            if k < r.n_min:
                k = 0
        del r.result[k:]
        if r.result_q is not None:
            del r.result_q[k:]
        if r.result_p is not None:
            del r.result_p[k:]
        if k == 0:
            r.result_q = None
            r.result_p = None
        return k

    def accept(self, seq: int, n_accepted: int) -> None:
        record = self.records.of(seq)
        name = record.impl_last
        if name is None:
            assert n_accepted == 0, "accepted tokens without a draft"
            return
        impl = self.pool[name]
        s, s_seq = self._both(seq, name)
        with timed("t_accept_us", s, s_seq):
            s.on_accept(n_accepted)
            s_seq.on_accept(n_accepted)
            impl.accept(seq, n_accepted, False)
        for other in record.types:
            if other != name:
                self.pool[other].accept(seq, n_accepted, True)
        record.impl_last = None

    def accept_tree(self, seq: int, tree, path: list[int]) -> None:
        """Tree mode: each drafter is credited with how much of its own proposal the kept path holds, so its
        #acc rate/pos and #mean acc len keep llama.cpp's meaning; the others hear the kept length."""
        record = self.records.of(seq)
        credit = tree.credit(path)
        for name, (k, m) in credit.items():
            s, s_seq = self._both(seq, name)
            s.on_draft(k)
            s_seq.on_draft(k)
            with timed("t_accept_us", s, s_seq):
                s.on_accept(m)
                s_seq.on_accept(m)
                self.pool[name].accept(seq, m, False)
        for other in record.types:
            if other not in credit:
                self.pool[other].accept(seq, len(path), True)
        record.impl_last = None

    def seq_cp(self, src: int, dst: int, n: int) -> None:
        for impl in self.pool.values():  # every drafter: dst may pick its drafters only after this
            impl.seq_cp(src, dst, n)

    def seq_rm(self, seq: int) -> None:
        """The sequence holds another text: its drafters' caches and what the relay kept of it are void (its
        counters stay until it begins again)."""
        record = self.records.get(seq)
        if record is None:
            return
        for name in record.types:
            self.pool[name].seq_rm(seq)
        record.forget_drafting()
