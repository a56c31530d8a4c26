"""draft-uni: a draft model with another vocabulary, drafting through text ("universal assisted decoding").

The idea is llama.cpp's (common_speculative_gen_draft in common/speculative.cpp, for a draft context whose
vocabulary differs) and transformers' (AssistedCandidateGeneratorDifferentTokenizers, and
UniversalSpeculativeDecodingGenerator, in transformers/generation/candidate_generator.py): the draft model works
in its own tokens on the same text. Each round the confirmed target tokens are brought into the draft's
vocabulary (engine/draft/text_bridge.py: only a tail is decoded and encoded again), the draft model continues
that text as draft-simple would (its cache keeps the prefix that still agrees), and its tokens become text and
then target tokens, of which only the whole ones the drafted text supports are proposed.

The draft has no distribution over the target's vocabulary, so it gives no q: its drafts are verified by
sample-and-match at any temperature, which keeps the output token-identical to plain decoding with the same
seed. It drafts greedily, its most likely continuation being the one most likely to match.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.draft.base import Drafter, DraftRequest
from engine.draft.draft_model import DraftModelDrafter, DraftModelParams
from engine.draft.text_bridge import BridgeParams, BridgeState, TextBridge, decode, encode


@dataclass
class DraftUniParams:
    # the draft model's cache and its stopping rule (p_min, top_k)
    model: DraftModelParams = field(default_factory=DraftModelParams)
    bridge: BridgeParams = field(default_factory=BridgeParams)  # how far back each round re-reads the text
    # draft tokens asked beyond n_max target tokens' worth (n_max times the draft's tokens per target token on this
    # text): the last target token of a drafted text is dropped (it may be a piece of a longer one), and the
    # vocabularies cut the text at other places
    extra: int = 2
    max_ratio: float = 4.0  # draft tokens per target token at most, however finely the draft cuts this text


@dataclass
class Retokenized:
    """What the last draft of a sequence was in both vocabularies, for the page."""
    draft_pieces: list[str]  # the draft model's own tokens, as text
    target_pieces: list[str]  # the target tokens they became, as text


def specials_before_text(tokenizer) -> list[int]:
    """The ids a tokenizer puts before any text it encodes (a BOS), [] where none."""
    bare = encode(tokenizer, "a")
    full = [int(t) for t in tokenizer("a", add_special_tokens=True)["input_ids"]]
    for i in range(len(full) - len(bare) + 1):
        if full[i:i + len(bare)] == bare:
            return full[:i]
    return []


@dataclass
class Lead:
    """The specials that open a sequence (a BOS), where the two vocabularies do not spell them alike: the target's
    are left out of the shared text and the draft's own go before its tokens. A model reads a text without its BOS
    poorly (Gemma 3 markedly), and another vocabulary's BOS spelled as text is no better."""
    target: list[int]  # the target's opening ids, left out of the text where a sequence starts with them
    draft: list[int]  # the draft's opening ids, put before its tokens of the text

    @classmethod
    def of(cls, target_tokenizer, draft_tokenizer) -> "Lead":
        target, draft = specials_before_text(target_tokenizer), specials_before_text(draft_tokenizer)
        if encode(draft_tokenizer, decode(target_tokenizer, target)) == draft:
            return cls([], [])  # spelled alike: kept as text, the draft reads them as its own
        return cls(target, draft)

    def text_tokens(self, confirmed: list[int]) -> list[int]:
        """The confirmed target tokens that make the shared text."""
        n = len(self.target)
        return confirmed[n:] if n and confirmed[:n] == self.target else confirmed


class DraftUniDrafter(Drafter):
    name = "draft-uni"
    needs_model = True

    def __init__(self, model=None, draft_tokenizer=None, target_tokenizer=None, params: DraftUniParams | None = None):
        if model is None or draft_tokenizer is None or target_tokenizer is None:
            raise ValueError("draft-uni needs a draft model (--draft) with its tokenizer, and the target's tokenizer")
        self.params = params or DraftUniParams()
        self.inner = DraftModelDrafter(model, self.params.model)  # drafts in the draft's own tokens
        self.bridge = TextBridge(target_tokenizer, draft_tokenizer, self.params.bridge)
        self.td, self.tt = draft_tokenizer, target_tokenizer
        self.states: dict[int, BridgeState] = {}  # seq -> its confirmed text in both vocabularies
        self.last: dict[int, Retokenized] = {}  # seq -> its last draft in both vocabularies
        self.n_pos_max = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.lead = Lead.of(target_tokenizer, draft_tokenizer)

    def begin(self, seq: int, prompt: list[int]) -> None:
        self.inner.begin(seq, prompt)
        self.states[seq] = BridgeState()
        self.last.pop(seq, None)

    def seq_rm(self, seq: int) -> None:
        self.inner.seq_rm(seq)
        self.states.pop(seq, None)
        self.last.pop(seq, None)

    def retokenized(self, seq: int) -> Retokenized | None:
        return self.last.get(seq)

    def _room(self, n_tokens: int) -> int:
        """Draft tokens the draft's cache and positions still hold after n_tokens."""
        limit = self.params.model.n_ctx if self.n_pos_max is None else min(self.params.model.n_ctx, self.n_pos_max)
        return limit - n_tokens

    def _n_draft(self, st: BridgeState, n_max: int) -> int:
        """Draft tokens that cover about n_max target tokens of this sequence's text."""
        ratio = len(st.draft.tokens) / max(1, len(st.target.tokens))
        return math.ceil(n_max * min(max(ratio, 1.0), self.params.max_ratio)) + self.params.extra

    def draft(self, requests: list[DraftRequest]) -> None:
        shadows: dict[int, DraftRequest] = {}  # seq -> the same job in the draft's vocabulary
        for r in requests:
            self.last.pop(r.seq, None)
            r.result, r.result_q, r.result_p = [], None, None
            st = self.states.setdefault(r.seq, BridgeState())
            self.bridge.sync(st, self.lead.text_tokens(r.prompt + [r.id_last]))
            own = self.lead.draft + st.draft.tokens
            n_max = min(self._n_draft(st, r.draft_max), self._room(len(own)))
            if own and n_max > 0:
                shadows[r.seq] = DraftRequest(seq=r.seq, prompt=own[:-1], id_last=own[-1], n_max=n_max, n_min=0,
                                              p_min=r.p_min)
        if shadows:
            self.inner.draft(list(shadows.values()))
        for r in requests:
            shadow = shadows.get(r.seq)
            if shadow is None or not shadow.result:
                continue
            st = self.states[r.seq]
            r.result = self.bridge.to_target(st, self.bridge.draft_text(st, shadow.result))[:r.draft_max]
            self.last[r.seq] = Retokenized(draft_pieces=[decode(self.td, [t]) for t in shadow.result],
                                           target_pieces=[decode(self.tt, [t]) for t in r.result])
