"""The priority chain of drafters: llama.cpp's common_speculative_draft / _accept relay.

Drafters are tried in priority order (n-gram first, model drafters last). The first one that fills a
sequence's request takes the `drafting` baton from it, is remembered as its record's `impl_last`, and is
credited when the verdict comes back; every other drafter hears about it with `is_other=True` so its own
bookkeeping stays in step with the target. In tree mode every drafter's proposal is merged into one tree.

What the relay does not decide itself it asks the engine's draft budget (engine/budget/draft_budget.py):
whether a drafter drafts for a slot, how far, how a chain's nodes score; it credits the budget with each
verdict. Without a budget every drafter drafts what it can, up to n_max.
"""

from __future__ import annotations

import time

from engine.batch import Batch
from engine.draft.base import Drafter, DraftRequest
from engine.draft.record import SeqRecords, offer
from engine.draft.registry import NGRAMS, is_ngram
from engine.draft.stats import DrafterStats, timed

class DrafterChain:
    """Relay over a shared pool of drafters; each sequence has its own ordered list of drafter types."""

    def __init__(self, pool: dict[str, Drafter], budget=None):
        self.pool = pool  # name -> drafter instance, shared by all sequences (each keeps per-seq state)
        # the engine's DraftBudget (engine/budget/draft_budget.py), which the relay asks and credits; None: verify
        # whatever the drafter offers (up to n_max), for every sequence
        self.budget = budget
        # seq -> what the relay and the budget keep about it (engine/draft/record.py): the budget's
        self.records: SeqRecords = budget.records if budget is not None else SeqRecords()
        self.stats: dict[str, DrafterStats] = {}  # name -> counters over all sequences
        # seq -> name -> counters, one user's view: read after the sequence's final event (it may be released
        # by then), replaced when it begins again
        self.seq_stats: dict[int, dict[str, DrafterStats]] = {}

    def _both(self, seq: int, name: str) -> tuple[DrafterStats, DrafterStats]:
        per = self.seq_stats.setdefault(seq, {})
        return self.stats.setdefault(name, DrafterStats(name)), per.setdefault(name, DrafterStats(name))

    def begin(self, seq: int, prompt: list[int], types: list[str], adaptive: bool = True) -> None:
        unknown = [t for t in types if t not in self.pool]
        if unknown:
            raise ValueError(f"drafter(s) not loaded: {', '.join(unknown)}")
        record = self.records.of(seq)
        record.types, record.adaptive, record.impl_last = list(types), adaptive, None
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
        """Fill the requests; return seq -> name of the drafter that drafted for it (None if nobody)."""
        winner: dict[int, str | None] = {r.seq: None for r in requests}
        self._new_round(requests)
        n_stages = max((len(self.records.of(r.seq).types) for r in requests), default=0)
        ngrams_gated = {r.seq for r in requests if r.drafting and not self._ngrams_draft(r)}
        ngram_seconds: dict[int, float] = {}  # seq -> its share of the n-gram drafters' time this round
        for stage in range(n_stages):
            by_name: dict[str, list[DraftRequest]] = {}
            for r in requests:
                types = self.records.of(r.seq).types
                if r.drafting and stage < len(types) and not (r.seq in ngrams_gated and is_ngram(types[stage])):
                    by_name.setdefault(types[stage], []).append(r)
            for name, active in by_name.items():
                s = self._both(active[0].seq, name)[0]
                if self.pool[name].needs_model:
                    active = [r for r in active if self._model_drafts(r, name)]
                    if not active:
                        continue
                    for r in active:  # a network drafts token by token: do not draft what the policy would cut
                        if self._budgeted(r.seq) and r.tree_max == 0:  # a tree is cut by the budget
                            r.n_max = max(1, self.budget.best_k(r.seq, name, r.n_max))
                # one call drafts for every sequence in `active`: each sequence is charged an equal share
                per_seq = [self._both(r.seq, name)[1] for r in active]
                t0 = time.perf_counter()
                with timed("t_draft_us", s, *per_seq, share=1 / len(active)):
                    self.pool[name].draft(active)
                share = (time.perf_counter() - t0) / len(active)
                for r in active:
                    if r.tree_max > 0 and self.pool[name].needs_model and self._budgeted(r.seq):
                        self.budget.charge(r.seq, name, share)
                    elif is_ngram(name):
                        ngram_seconds[r.seq] = ngram_seconds.get(r.seq, 0.0) + share
                s.n_call_draft += 1
                for r, s_seq in zip(active, per_seq):
                    s_seq.n_call_draft += 1
                    self._keep_extras(r, name)
                    if r.tree_max > 0:
                        k = self._merge(r, name)
                        if k == 0:
                            continue
                        if winner[r.seq] is None:  # counted in accept_tree, for the nodes verified
                            winner[r.seq] = self.records.of(r.seq).impl_last = name
                        continue
                    k = self._cut(r, name)
                    if k == 0:
                        continue
                    r.drafting = False
                    record = self.records.of(r.seq)
                    record.impl_last, record.k_last = name, k
                    winner[r.seq] = name
                    s.on_draft(k)
                    s_seq.on_draft(k)
        for r in requests:
            if r.seq in ngram_seconds and r.tree_max > 0 and self._budgeted(r.seq):
                self.budget.charge(r.seq, NGRAMS, ngram_seconds[r.seq])
        return winner

    def _new_round(self, requests: list[DraftRequest]) -> None:
        """Forget the last round's winner, skips and re-tokenisations of these sequences; draft where allowed."""
        for r in requests:
            record = self.records.of(r.seq)
            record.impl_last, record.skipped, record.retokenized = None, [], None
            r.drafting = r.n_max > 0

    def _ngrams_draft(self, r: DraftRequest) -> bool:
        """Whether the slot's n-gram drafters draft this round (the budget's gate, tree mode)."""
        return self.budget is None or self.budget.ngrams_draft(r)

    def _model_drafts(self, r: DraftRequest, name: str) -> bool:
        """Whether the model drafter `name` drafts for this request (the budget's gate, tree mode)."""
        return self.budget is None or self.budget.model_drafts(r, name)

    def _keep_extras(self, r: DraftRequest, name: str) -> None:
        """What the chain keeps of a result besides its tokens. q only from a drafter whose q is over the target's
        vocabulary: rejection sampling needs exactly that, and a request without q is verified by sample-and-match
        (engine/round/chain_verify.py, judge), which is exact too. And a drafter of another vocabulary's two
        tokenisations of its draft, for the round's event."""
        impl = self.pool[name]
        offer(self.records.of(r.seq), name, r, impl.needs_model)  # the relay as the event tells it, before any cut
        if not impl.gives_q:
            r.result_q = None
        record = impl.retokenized(r.seq)
        if record is not None and r.result:
            self.records.of(r.seq).retokenized = record

    def _merge(self, r: DraftRequest, name: str) -> int:
        """Tree mode: move the fresh result (a chain, or a drafter's own tree) into the request's tree, shared
        prefixes once, at most tree_max nodes; the request keeps drafting for the next drafter. No length
        policy cut here: the round's budget chooses among all nodes (engine/budget/tree_budget.py). Returns the depth of
        what fitted."""
        from engine.draft.tree import DraftTree

        if r.tree is None:
            r.tree = DraftTree()
        deepest = 0
        if r.result_tree is not None:
            nodes = r.tree.add_tree(r.result_tree, name, limit=r.tree_max)
            deepest = max((r.tree.depth(n) for n in nodes), default=0)
        else:
            for tokens, share in [(r.result, r.result_share)] + r.result_alts:
                chain = tokens[:r.n_max]
                if len(chain) >= max(r.n_min, 1):
                    scores = [share * a for a in self._path_scores(r.seq, name, len(chain))]
                    # a chain under the root: its i-th node is at depth i + 1
                    deepest = max(deepest, len(r.tree.add_chain(chain, name, limit=r.tree_max, scores=scores)))
        r.result, r.result_q, r.result_p, r.result_tree = [], None, None, None
        r.result_alts, r.result_share = [], 1.0
        return deepest

    def _path_scores(self, seq: int, name: str, k: int) -> list[float]:
        """The chance that each position of a k-token chain from this drafter is reached (the budget's length
        policy; without a budget, each is reached)."""
        if self.budget is None:
            return [1.0] * k
        return self.budget.path_scores(seq, name, k)

    def _cut(self, r: DraftRequest, name: str) -> int:
        """Apply the grammar, n_max, n_min and the length policy to a fresh result; return the kept length."""
        k = min(len(r.result), r.n_max)
        if r.grammar is not None and k > 0:
            # a token the grammar forbids can never be kept, nor anything after it: the draft ends before it,
            # here rather than after the chain so the counters and the length policy see the draft that is
            # verified, and a draft cut to nothing leaves the request to the next drafter
            k = min(k, r.grammar.valid_prefix(r.result[:k]))
        if k < max(r.n_min, 1):
            k = 0
        if k > 0 and self._budgeted(r.seq):
            k = self.budget.choose(r.seq, name, k)
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

    def _budgeted(self, seq: int) -> bool:
        """Whether the budget cuts this sequence's drafts (there is one, and the sequence is adaptive)."""
        return self.budget is not None and self.budget.budgeted(seq)

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
        if self.budget is not None:
            self.budget.credit(seq, name, n_accepted if record.k_last is None else record.k_last, n_accepted)
        for other in record.types:
            if other != name:
                self.pool[other].accept(seq, n_accepted, True)
        record.impl_last = None

    def accept_tree(self, seq: int, tree, path: list[int]) -> None:
        """Tree mode: each drafter is credited with how much of its own proposal the kept path holds, so its
        #acc rate/pos and #mean acc len keep llama.cpp's meaning; the others hear the kept length."""
        record = self.records.of(seq)
        credit = tree.credit(path)
        if self.budget is not None:
            models = [name for name in record.types if self.pool[name].needs_model]
            self.budget.credit_tree(seq, tree, len(path), credit, models)
        for name, (k, m) in credit.items():
            s, s_seq = self._both(seq, name)
            s.on_draft(k)
            s_seq.on_draft(k)
            with timed("t_accept_us", s, s_seq):
                s.on_accept(m)
                s_seq.on_accept(m)
                self.pool[name].accept(seq, m, False)
            if self.budget is not None:
                self.budget.credit(seq, name, k, m)
        for other in record.types:
            if other not in credit:
                self.pool[other].accept(seq, len(path), True)
        record.impl_last = None

    def seq_cp(self, src: int, dst: int, n: int) -> None:
        for impl in self.pool.values():  # every drafter: dst may pick its drafters only after this
            impl.seq_cp(src, dst, n)

    def seq_rm(self, seq: int) -> None:
        """The sequence holds another text: its drafters' caches and what the relay, the gate and the length
        policy learnt of it are void (its counters stay until it begins again)."""
        record = self.records.get(seq)
        if record is None:
            return
        for name in record.types:
            self.pool[name].seq_rm(seq)
        record.forget_drafting()
