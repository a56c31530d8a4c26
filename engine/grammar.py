"""The grammar state of one generation: a compiled grammar that constrains the target's sampler.

A grammar (a JSON schema, any JSON object, a regex or a Lark grammar) is compiled by llguidance into a matcher
over the target's tokenizer. The matcher follows the tokens the slot emits; before each sampling step it gives
the set of tokens that keep the output inside the grammar, and every other id is set to -inf in the target's
logits. The sampler's softmax then renormalises over the allowed ids, so constrained sampling is the target's
distribution conditioned on the grammar.

Speculation keeps this exact: verification masks row i of the target's logits with the matcher advanced through
the draft tokens before row i, and rolls the matcher back by the tokens it does not keep (engine/verify.py,
engine/rounds.py). The tokens the grammar forces (one tokenisation of the only bytes that may come next) are
offered as free drafts by the `grammar` drafter (engine/drafters/grammar.py) through a read-only `GrammarView`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

KINDS = ("json_schema", "json", "regex", "lark", "gbnf")


def _one_line(msg: str) -> str:
    """llguidance's messages carry a caret picture of the source over several lines: keep the words only."""
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    words = [ln for ln in lines if not set(ln) <= {"^", " "} and "|" not in ln[:6]]
    return " ".join(words[:1] + [ln for ln in words[1:] if ln.startswith("error:")]) or msg.strip()


@dataclass
class GrammarSpec:
    kind: str  # "json_schema" | "json" (any JSON object, `text` unused) | "regex" | "lark" | "gbnf" (llama.cpp's)
    text: str = ""  # the JSON schema as JSON text, the regex, or the Lark grammar

    def compile(self) -> str:
        """The llguidance grammar string. Raises ValueError for an unknown kind or a schema that is not JSON."""
        from llguidance import LLMatcher

        if self.kind not in KINDS:
            raise ValueError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        # compact JSON (no free whitespace): with free whitespace nothing is forced after '{' or ',' (a space
        # could come first), so the grammar drafter would have nothing to offer, and small models are known to
        # loop on newlines inside a JSON object
        options = {"whitespace_flexible": False}
        if self.kind == "json":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=options)
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.text)
            except json.JSONDecodeError as e:
                raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"a JSON schema is an object or a boolean, got {type(schema).__name__}")
            return LLMatcher.grammar_from_json_schema(schema, defaults=options)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.text)
        if self.kind == "gbnf":  # llama.cpp's grammar format, through llguidance's own converter
            from llguidance.gbnf_to_lark import gbnf_to_lark

            try:
                return LLMatcher.grammar_from_lark(gbnf_to_lark(self.text))
            except Exception as e:  # the converter raises its own parse errors, of no common type
                raise ValueError(f"invalid GBNF grammar: {_one_line(str(e)) or type(e).__name__}") from None
        return LLMatcher.grammar_from_lark(self.text)

    def validate(self, tokenizer=None) -> None:
        """Compile the grammar; with the target's LLTokenizer also check some token can start it. Raises
        ValueError with a one-line message."""
        from llguidance import LLMatcher

        label = {"json_schema": "JSON schema", "json": "JSON grammar", "regex": "regex",
                 "lark": "Lark grammar", "gbnf": "GBNF grammar"}.get(self.kind, "grammar")
        grammar = self.compile()
        msg = LLMatcher.validate_grammar(grammar, tokenizer)
        if msg and not msg.startswith("WARNING"):
            raise ValueError(f"invalid {label}: {_one_line(msg)}")
        if tokenizer is None:
            return
        g = Grammar.start(self, tokenizer)
        try:
            g.allowed(tokenizer.vocab_size)  # the matcher finds a grammar that matches nothing only here
        except RuntimeError:
            raise ValueError(f"invalid {label}: no token of this model can start it (it matches nothing)") from None


class Grammar:
    """The matcher of one slot: it has consumed every token the slot emitted (so the last sampled token too)."""

    def __init__(self, matcher, n_vocab: int, eos: frozenset[int], ended: bool = False):
        self.matcher = matcher  # llguidance.LLMatcher, advanced through the emitted tokens
        self.n_vocab = n_vocab  # the tokenizer's vocabulary; logits ids past it are never allowed
        # end-of-sequence tokens stay out of the matcher: llguidance keeps no history entry for them, so a
        # rollback over a rejected end would undo the token before it instead (and leave the end forbidden)
        self.eos = eos
        self.ended = ended  # an end was taken: nothing after it is ever given out

    @classmethod
    def start(cls, spec: GrammarSpec, tokenizer) -> "Grammar":
        from llguidance import LLMatcher

        matcher = LLMatcher(tokenizer, spec.compile(), log_level=0)
        if matcher.is_error():
            raise ValueError(f"invalid grammar: {_one_line(matcher.get_error())}")
        return cls(matcher, tokenizer.vocab_size, frozenset(int(t) for t in tokenizer.eos_tokens))

    def _check(self) -> None:
        if self.matcher.is_error():
            raise RuntimeError(f"the grammar matcher failed: {_one_line(self.matcher.get_error())}")

    def allowed(self, width: int) -> torch.Tensor:
        """Bool [width]: the ids the grammar allows next (EOS once the grammar accepts)."""
        if self.ended:  # a row after the end (the bonus row of a draft that ends): never given out
            return torch.ones(width, dtype=torch.bool)
        self._check()
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        self._check()  # a dead end (nothing can follow, not even the end) shows only once the mask is computed
        out = torch.zeros(width, dtype=torch.bool)
        n = min(width, self.n_vocab, bits.shape[0])
        out[:n] = torch.from_numpy(bits[:n].astype(bool))
        if not bool(out.any()):
            raise RuntimeError("the grammar allows no next token")
        return out

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [..., V] with every id the grammar forbids at -inf (a new tensor)."""
        return logits.masked_fill(~self.allowed(logits.shape[-1]), float("-inf"))

    def masks_along(self, draft: list[int], width: int) -> torch.Tensor:
        """Bool [k+1, width]: row i is the mask after draft[:i]. Leaves the matcher advanced through all k
        draft tokens: the caller rolls back what verification does not keep."""
        rows = [self.allowed(width)]
        for tok in draft:
            self.consume(tok)
            rows.append(self.allowed(width))
        return torch.stack(rows)

    def consume(self, tok: int) -> None:
        if self.ended:
            return
        if int(tok) in self.eos:
            if not self.matcher.is_accepting():
                raise RuntimeError("the grammar refused the end of sequence: the output is not complete")
            self.ended = True
            return
        if not self.matcher.consume_token(int(tok)):
            raise RuntimeError(f"the grammar refused token {tok}: {_one_line(self.matcher.get_error())}")

    def consume_all(self, tokens: list[int]) -> None:
        for tok in tokens:
            self.consume(tok)

    def rollback(self, n: int) -> None:
        """Forget the last n consumed tokens (a rejected draft tail)."""
        if n > 0 and self.ended:
            self.ended, n = False, n - 1
        if n > 0 and not self.matcher.rollback(n):
            raise RuntimeError(f"the grammar could not roll back {n} tokens: {self.matcher.get_error()}")

    def forced(self) -> list[int]:
        """The tokens the grammar forces next, whatever the model says (may be empty)."""
        if self.ended:
            return []
        self._check()
        return [int(t) for t in self.matcher.compute_ff_tokens()]

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens` the grammar accepts in a row from here; the state does not change."""
        if self.ended:
            return 0
        n = next((i for i, t in enumerate(tokens) if not 0 <= t < self.n_vocab or t in self.eos), len(tokens))
        ok = int(self.matcher.validate_tokens([int(t) for t in tokens[:n]])) if n else 0
        if ok == n < len(tokens) and tokens[n] in self.eos:  # the end is allowed where the grammar is complete
            probe = self.matcher.deep_copy()
            if probe.consume_tokens([int(t) for t in tokens[:n]]) and probe.is_accepting():
                ok += 1
        return ok

    def is_accepting(self) -> bool:
        return self.ended or bool(self.matcher.is_accepting())

    def clone(self) -> "Grammar":
        return Grammar(self.matcher.deep_copy(), self.n_vocab, self.eos, self.ended)

    def copy_from(self, other: "Grammar") -> None:
        """Restore this grammar to `other`'s state (checkpoint restore); `other` stays usable."""
        self.matcher, self.ended = other.matcher.deep_copy(), other.ended

    def view(self) -> "GrammarView":
        return GrammarView(self)


class GrammarView:
    """What a drafter may see of a slot's grammar: questions that leave its state as it is. Drafters run before
    verification, and a drafter that consumed tokens would move the state the target's masks are read from."""

    def __init__(self, grammar: Grammar):
        self._grammar = grammar

    def forced(self) -> list[int]:
        return self._grammar.forced()

    def valid_prefix(self, tokens: list[int]) -> int:
        return self._grammar.valid_prefix(tokens)
