"""The drafter interface, in the shape of llama.cpp's common_speculative_impl.

Lifecycle per sequence: `begin(seq, prompt)` once when a prompt arrives; every forward of the target is mirrored
with `process(batch)`; each round `draft(requests)` fills the requests still `drafting`; after verification
`accept(seq, n_accepted, is_other)` tells every drafter how many draft tokens were kept (`is_other=True` for the
drafters that did not win the round). The chain (`chain.py`) owns the counters and timings; implementations
only keep their own state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from engine.batch import Batch
from engine.draft.allowance import Allowance, DraftReport, unlimited


@dataclass
class DraftRequest:
    """One sequence's drafting job for one round (llama.cpp's common_speculative_draft_params).

    Who writes what: the round makes it with the fields up to `allowance` (the ask, never written again); the
    relay (chain.py) writes `drafting`, `turn`, `report` and `tree`, and clears the answer at each pass; the
    drafter whose turn it is writes the `result*` fields, which the relay then cuts to what is verified. The
    tree the forward holds is the budget's choice among the relay's nodes, kept by the round (RoundPlan.trees)."""

    seq: int  # sequence id
    prompt: list[int]  # confirmed tokens of the sequence in cache order (prompt + generated), without id_last
    id_last: int  # token sampled last round; not in the cache yet; the draft continues after it
    n_max: int  # propose at most this many tokens
    n_min: int  # a draft shorter than this is not worth a verification: return none
    p_min: float | None  # model drafters stop when the top draft probability falls below this (None: their own)
    # read-only view of the slot's grammar, after id_last (None: unconstrained). Drafters read the forced
    # continuation from it (the grammar drafter), and the chain cuts every draft at its first forbidden token
    grammar: Any = None
    want_q: bool = False  # fill result_q (draft distributions) so the target can use rejection sampling
    # tree mode (engine/draft/tree.py): every drafter of the sequence drafts and the chain merges their proposals into
    # `tree`, at most this many nodes; 0: the relay of chains, the first drafter with a draft wins
    tree_max: int = 0
    # tree mode: nodes scored below this would not get a row of the forward (the last round's budget
    # threshold, engine/budget/tree_budget.py): a drafter that grows a tree need not expand them
    tree_min_score: float = 0.0
    # tree mode: at most this many nodes from a model drafter (0: tree_max). Beside other slots each depth of the
    # head's tree is a step the whole batch waits for, so a slot is offered one node more than the budget last
    # kept of its model drafters' nodes (engine/budget/tree_budget.py, SlotLedger.model_nodes)
    model_tree_max: int = 0
    # tree mode: the batch's time per emitted token over recent rounds (0: not known yet): a drafter that grows a
    # tree weighs the time of each further step against the tokens it may add (engine/draft/head/tree.py)
    token_seconds: float = 0.0
    # tree mode: the slot rests (its drafts were refused round after round, engine/budget/tree_budget.py) and drafts
    # this round to probe: the n-gram drafters look, a model drafter does not spend its time on it
    probe: bool = False
    # what the budget allows this request (engine/draft/allowance.py; None: every drafter drafts up to n_max)
    allowance: Allowance | None = None
    # the fields below are the relay's and the drafters' answer, reset by the relay at each drafting pass
    turn: str | None = None  # the drafter whose turn it is (the relay's): its length is `draft_max`
    report: DraftReport = field(default_factory=DraftReport)  # what each drafter cost and offered (the relay's)
    tree: Any = None  # the merged DraftTree, in tree mode
    result_tree: Any = None  # a drafter's own DraftTree, in tree mode (the draft head's), instead of `result`
    # tree mode: other continuations besides `result`, each with the share of the evidence behind it (ngram-map-k4v:
    # its other values' counts); `result` then carries its own share in result_share
    result_alts: list[tuple[list[int], float]] = field(default_factory=list)
    result_share: float = 1.0
    drafting: bool = True  # relay baton: True until a drafter fills `result`
    result: list[int] = field(default_factory=list)  # the drafted token ids
    result_q: list[torch.Tensor] | None = None  # per drafted token, the draft distribution q over the vocab
    result_p: list[float] | None = None  # per drafted token, the draft's probability of it (for display)

    @property
    def draft_max(self) -> int:
        """How many tokens the drafter whose turn it is may propose: n_max, or its allowance's cut of it."""
        part = self.allowance.of(self.turn) if self.allowance is not None and self.turn is not None else None
        return self.n_max if part is None else min(self.n_max, part.n_max)

    def allowed(self, types: list[str]) -> Allowance:
        """The allowance, or (drafted without a budget) one that lets every drafter draft up to n_max."""
        return self.allowance if self.allowance is not None else unlimited(types, self.n_max)

    def p_min_or(self, own: float) -> float:
        """The request's p_min, or the drafter's own when the request leaves it (None)."""
        return own if self.p_min is None else self.p_min

    def take(self, tok: int, p_tok: float, q: torch.Tensor) -> None:
        """Append one drafted token with the draft's probability of it, and its distribution q where wanted."""
        self.result.append(tok)
        self.result_p.append(p_tok)
        if self.want_q:
            self.result_q.append(q)


DRAFT_SEED_MIX = 0x85EBCA6B  # a draft's stream is seeded seed ^ this, so it differs from the target's


class DraftStreams:
    """Per-sequence sampling of a model drafter: llama.cpp's spec_retune. The target's temperature shapes q, and
    the target's seed gives the draft its own stream (seed ^ DRAFT_SEED_MIX), one per device: torch draws on a
    device only from a generator of that device, and q lives where the draft model runs."""

    def __init__(self):
        self.tuning: dict[int, tuple[float, int]] = {}  # seq -> (target temperature, target seed)
        # seq -> device -> the draft's own random stream on that device
        self.generators: dict[int, dict[torch.device, torch.Generator]] = {}

    def retune(self, seq: int, temp: float, seed: int) -> None:
        if self.tuning.get(seq) == (temp, seed):
            return
        self.tuning[seq] = (temp, seed)
        self.generators.pop(seq, None)

    def temp(self, seq: int) -> float:
        return self.tuning.get(seq, (0.0, 0))[0]

    def generator(self, seq: int, device: torch.device | str = "cpu") -> torch.Generator:
        """The stream of `seq` on `device` (that of the tensor it draws from)."""
        device = torch.device(device)
        mine = self.generators.setdefault(seq, {})
        if device not in mine:
            g = torch.Generator(device=device)
            g.manual_seed(self.tuning.get(seq, (0.0, 0))[1] ^ DRAFT_SEED_MIX)
            mine[device] = g
        return mine[device]

    def restart(self, seq: int) -> None:
        """A new prompt: the stream starts again from its seed."""
        self.generators.pop(seq, None)

    def forget(self, seq: int) -> None:
        self.generators.pop(seq, None)
        self.tuning.pop(seq, None)


def top_k_q(logits: torch.Tensor, k: int, temp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A model drafter's q: the k most likely tokens, softmax at the target's temperature (at 1 when the target
    is greedy, so q still ranks candidates and gives p_min something to compare). Returns (probs [k], ids [k])."""
    top = torch.topk(logits.float(), min(k, logits.shape[-1]))
    return torch.softmax(top.values / (temp if temp > 0 else 1.0), dim=-1), top.indices


def choose_draft(r: DraftRequest, logits: torch.Tensor, top_k: int, streams: DraftStreams,
                 to_target: torch.Tensor | None = None, n_target: int | None = None):
    """A model drafter's token from one row's logits [n]: (target id, p of the top candidate, p of the token, q
    over the target's vocabulary or None). Greedy unless the request wants q; then drawn from the top k at the
    target's temperature on the sequence's stream. to_target: [n] the target id of each logit (a reduced draft
    vocabulary's d2t), n_target: the target's vocabulary size (with to_target)."""
    def as_target(i):
        return i if to_target is None else to_target[i]

    if r.want_q:
        q_small, ids = top_k_q(logits, top_k, streams.temp(r.seq))
        j = int(torch.multinomial(q_small, 1, generator=streams.generator(r.seq, q_small.device)))
        q = torch.zeros(n_target or logits.shape[-1], device=q_small.device)
        q[as_target(ids)] = q_small
        return int(as_target(ids[j])), float(q_small.max()), float(q_small[j]), q
    probs = torch.softmax(logits, dim=-1)
    j = int(probs.argmax())
    return int(as_target(j)), float(probs[j]), float(probs[j]), None


class Drafter:
    """Base class: a drafter that never drafts. Subclasses override what they need."""

    name = "none"
    needs_model = False  # True for drafters that run a network (ordered after the n-gram ones)
    # True for drafters whose result_q is a distribution over the target's vocabulary. Rejection sampling needs
    # one; the chain drops any q from the others, whose drafts are then verified by sample-and-match
    gives_q = False
    hidden_layers: tuple[int, ...] = ()  # target hidden states this drafter reads in process() (see context.py)

    def begin(self, seq: int, prompt: list[int]) -> None:
        """A new prompt for `seq`: index it, reset per-sequence state."""

    def process(self, batch: Batch, result: Any = None) -> None:
        """Mirror of a target forward (prefill, verification or replay batch), for drafters that keep model state.

        `result` is the forward's DecodeResult; its `hidden` holds the layers named in `hidden_layers` for every
        row (after a tree's verification, the kept rows only, without logits). Rows of a verification batch past
        the accepted prefix are rejected later (see `accept`), so state kept from here should be indexed by
        position and cut on acceptance."""

    def draft(self, requests: list[DraftRequest]) -> None:
        """Fill `result` of the given requests (all have drafting=True) where this drafter has a proposal."""

    def retune(self, seq: int, temp: float, seed: int) -> None:
        """The sequence's target sampling settings, for drafters that sample (see DraftStreams)."""

    def expect(self, seq: int, reference: list[int] | None) -> None:
        """The whole token sequence a measurement expects for `seq` (SpecParams.reference), or None: only the
        oracle drafter reads it."""

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        """`n_accepted` of the last draft for `seq` were kept; `is_other` if another drafter made that draft."""

    def seq_rm(self, seq: int) -> None:
        """The sequence left (slot freed): drop its state."""

    def retokenized(self, seq: int) -> Any:
        """A drafter of another vocabulary: its last draft for `seq` in its own tokens and in the target's, for
        the round's event (draft_uni.Retokenized); None for the others."""
        return None

    def seq_cp(self, src: int, dst: int, n: int) -> None:
        """The target's cache gave `dst` the first `n` positions of `src` (a shared prompt prefix, llama.cpp's
        seq_cp): drafters that keep per-position state of the target copy it, since dst never forwards them."""
