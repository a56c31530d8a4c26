"""One slot: a chat's sequence in the shared memory, with its sampler, its tokens and what it has given out.

A slot is llama-server's server_slot: the engine (serve/engine.py) starts and frees it, the round
(round/round.py) advances it, and both hand its new tokens to the user through `emit`, which cuts them at
end-of-sequence or the token limit and keeps the text free of half-decoded characters.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.memory import checkpoint
from engine.grammar import Grammar
from engine.params import GenParams
from engine.round.event_builder import Decision, Emission, SlotRound
from engine.sampling import Sampler


WINDOW = 16  # tokens a detokenising window grows to before a new one starts
WINDOW_CONTEXT = 4  # tokens of the old window a new one starts with
# characters after a space that a decoder's clean-up may still rewrite when more tokens arrive: transformers'
# clean_up_tokenization turns "a ." into "a.", "do n't" into "don't" and "it ' s" into "it's"
REWRITE_CHARS = 4


def held_tail(text: str) -> str:
    """The end of a decoding that the next tokens may still change: a half-decoded character (U+FFFD), and
    everything from the first whitespace among the last REWRITE_CHARS characters (TextStreamer holds back
    from the last space for the same reason)."""
    whole = text.rstrip("\ufffd")
    cut = len(whole)
    for i in range(max(0, len(whole) - REWRITE_CHARS), len(whole)):
        if whole[i].isspace():
            cut = i
            break
    return text[cut:]


def realign(given: str, now: str) -> str:
    """What of `now` follows `given` when the decoder changed given text: after their common prefix, the new
    text less its longest start that the given text already ends with ("it '" then "it's" gives "s")."""
    c = 0
    while c < min(len(given), len(now)) and given[c] == now[c]:
        c += 1
    old, new = given[c:], now[c:]
    for k in range(min(len(old), len(new)), 0, -1):
        if old.endswith(new[:k]):
            return new[k:]
    return new


@dataclass
class Slot:
    seq: int  # sequence id in the shared cache
    params: GenParams
    sampler: Sampler  # the target's sampler, with its own stream
    prompt: list[int]  # prompt tokens
    tokens: list[int] = field(default_factory=list)  # tokens in the target cache, in position order
    generated: list[int] = field(default_factory=list)  # tokens emitted to the user
    id_last: int = -1  # sampled last round, not yet in the cache
    state: str = "prefill"  # "prefill" | "generating" | "done"
    round: int = 0  # rounds run (prefill is round 0)
    text: str = ""  # detokenised text given out so far
    # the text is decoded over a window of the last generated tokens, not all of them each round (decoding the
    # whole answer each round grows with its length; a short window does not): the window's first token, and
    # the window's text already given out
    dec_from: int = 0
    dec_done: str = ""
    stop_reason: str | None = None
    stop_requested: bool = False
    replay: checkpoint.Replay | None = None  # decided tokens to re-run after a checkpoint restore
    coins: torch.Generator | None = None  # synthetic acceptance's own stream (None unless it is on)
    n_max_effective: int = 0  # the longest draft this slot can verify: n_max within the engine's capacity
    notes: list[str] = field(default_factory=list)  # one line each, for the user: settings the engine adjusted
    refill: list[int] = field(default_factory=list)  # confirmed tokens a resumed slot must forward again
    grammar: Grammar | None = None  # the output's grammar state, through every emitted token (None: unconstrained)
    prefill_rows: int = 0  # prompt tokens forwarded so far by the prefill, over its chunks
    prefill_ms: float = 0.0  # time its chunks took
    t_start: float = field(default_factory=time.monotonic)  # an idle sequence started longest ago is taken first

    @property
    def n_remaining(self) -> int:
        return self.params.max_new_tokens - len(self.generated)

    def trees_off(self, supports_trees: bool) -> str | None:
        """Why this generation drafts chains though it asks for trees (None: trees are on, or not asked): a
        memory with no tree mask, a grammar, whose masks follow one path, or synthetic acceptance, which tosses
        its coins along one chain. supports_trees: whether the target's memory keeps branches."""
        spec = self.params.spec
        if spec.tree_nodes <= 0 or not spec.types:
            return None
        if not supports_trees:
            return "this model's memory keeps one state per sequence, with no room for branches"
        if self.grammar is not None:
            return "a grammar masks one path"
        if spec.synthetic_accept is not None:
            return "synthetic acceptance tosses its coins along one chain"
        return None

    def finish(self, reason: str, out: Emission) -> Emission:
        """The generation ends: the emission says why, and whether a grammar's output is whole."""
        self.state = "done"
        self.stop_reason = reason
        out.done = True
        out.stop_reason = reason
        if self.grammar is not None:
            out.format_complete = self.grammar.complete_after(len(self.generated))
        return out

    def end(self, reason: str) -> SlotRound:
        """End without running a batch this round (a stop, a full context): a bare, final round."""
        verdict = Decision(seq=self.seq, round=self.round, kind="plain", drafter=None, pos_sampled=len(self.tokens),
                          p0=len(self.tokens) + 1)
        return SlotRound(verdict, self.finish(reason, Emission()))

    def _text_delta(self, detokenize: Callable[[list[int]], str], final: bool) -> str:
        """The text the new tokens add: the window's decoding minus what was already given out of it. Until the
        answer ends, a tail that later tokens may still rewrite is held back (held_tail). Once the window holds
        WINDOW tokens, a new one starts WINDOW_CONTEXT tokens back: those give the next tokens their context (a
        tokenizer may decode a word differently at the start of a text), and each delta is the difference of
        two decodings from the same first token."""
        window = detokenize(self.generated[self.dec_from:])
        stable = window if final else window[:len(window) - len(held_tail(window))]
        if stable.startswith(self.dec_done):
            delta = stable[len(self.dec_done):]
        elif self.dec_done.startswith(stable):  # the decoding got shorter: nothing new until it passes the given
            delta, stable = "", self.dec_done
        else:  # the decoder rewrote text beyond the held tail: given text stays given, the rest still goes out
            delta = realign(self.dec_done, stable)
        self.dec_done = stable
        self.text += delta
        if len(self.generated) - self.dec_from >= WINDOW and window.startswith(stable):
            self._move_window(detokenize, window[len(stable):])
        return delta

    def _move_window(self, detokenize: Callable[[list[int]], str], held: str) -> None:
        """Start the window WINDOW_CONTEXT tokens back, if its decoding ends with the same held tail (otherwise
        the given text's end has no place in the new window's text yet: try again next round)."""
        start = len(self.generated) - WINDOW_CONTEXT
        text = detokenize(self.generated[start:])
        if text.endswith(held):
            self.dec_from = start
            self.dec_done = text[:len(text) - len(held)]

    def emit(self, tokens: list[int], eos: set[int], detokenize: Callable[[list[int]], str]) -> Emission:
        """Give tokens to the user, cut at end-of-sequence or the token limit."""
        out = []
        reason = None
        for tok in tokens:
            out.append(tok)
            if tok in eos and not self.params.ignore_eos:
                reason = "eos"
                break
            if len(self.generated) + len(out) >= self.params.max_new_tokens:
                reason = "length"
                break
        self.generated.extend(out)
        given = Emission(emitted=out, text_delta=self._text_delta(detokenize, final=reason is not None))
        return self.finish(reason, given) if reason is not None else given
