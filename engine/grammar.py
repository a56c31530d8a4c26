"""The grammar state of one generation: a compiled grammar that constrains the target's sampler.

A grammar (a JSON schema, any JSON object, a regex or a Lark grammar) is compiled by llguidance into a matcher
over the target's tokenizer. The matcher follows the tokens the slot emits; before each sampling step it gives
the set of tokens that keep the output inside the grammar, and every other id is set to -inf in the target's
logits. The sampler's softmax then renormalises over the allowed ids, so constrained sampling is the target's
distribution conditioned on the grammar.

Speculation keeps this exact: verification masks row i of the target's logits with the matcher advanced through
the draft tokens before row i, and rolls the matcher back by the tokens it does not keep (engine/round/verify.py,
engine/round/round.py). The tokens the grammar forces (one tokenisation of the only bytes that may come next) are
offered as free drafts by the `grammar` drafter (engine/draft/grammar.py) through a read-only `GrammarView`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.sampling import argmax_rows

KINDS = ("json_schema", "json", "regex", "lark", "gbnf")


def _one_line(msg: str) -> str:
    """llguidance's messages carry a caret picture of the source over several lines: keep the words only."""
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    words = [ln for ln in lines if not set(ln) <= {"^", " "} and "|" not in ln[:6]]
    return " ".join(words[:1] + [ln for ln in words[1:] if ln.startswith("error:")]) or msg.strip()


MAX_GRAMMAR_CHARS = 200_000  # a grammar's text at most: compiling takes time in proportion to a JSON schema's size
MAX_SCHEMA_DEPTH = 64  # objects and arrays nested in a JSON schema at most: llguidance crashes far past its own limit
COMPILE_TIMEOUT_S = 20.0  # a request gives up waiting for its compilation after this long (engine/serve/grammars.py)


def _depth(value) -> int:
    """How deep a parsed JSON value nests, walked with an explicit stack."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            todo += [(x, d + 1) for x in (v.values() if isinstance(v, dict) else v)]
    return deepest


@dataclass
class GrammarSpec:
    kind: str  # "json_schema" | "json" (any JSON object, `text` unused) | "regex" | "lark" | "gbnf" (llama.cpp's)
    text: str = ""  # the JSON schema as JSON text, the regex, or the Lark grammar
    # what compiling gave, kept so that a message compiles once whoever asks (the engine, its comparison run):
    # llguidance's grammar string, and a matcher at the start for the tokenizer of `tokenizer_id`
    compiled: str | None = field(default=None, repr=False, compare=False)
    template: object = field(default=None, repr=False, compare=False)
    tokenizer_id: int = field(default=0, repr=False, compare=False)

    def compile(self) -> str:
        """The llguidance grammar string. Raises ValueError for an unknown kind, a grammar over the size or
        nesting limits, or a schema that is not JSON."""
        if self.compiled is None:
            self.compiled = self._compile()
        return self.compiled

    def _compile(self) -> str:
        from llguidance import LLMatcher

        if self.kind not in KINDS:
            raise ValueError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if len(self.text) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"the {self.label} is {len(self.text):,} characters; at most {MAX_GRAMMAR_CHARS:,} "
                             "are compiled here")
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
            except RecursionError:
                raise ValueError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"a JSON schema is an object or a boolean, got {type(schema).__name__}")
            if _depth(schema) > MAX_SCHEMA_DEPTH:
                raise ValueError(f"the JSON schema nests {_depth(schema)} levels deep; at most {MAX_SCHEMA_DEPTH} "
                                 "are compiled here")
            return LLMatcher.grammar_from_json_schema(schema, defaults=options)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.text)
        if self.kind == "gbnf":  # llama.cpp's grammar format, through llguidance's own converter
            from llguidance.gbnf_to_lark import gbnf_to_lark

            try:
                return LLMatcher.grammar_from_lark(gbnf_to_lark(self.text))
            except RecursionError:
                raise ValueError("invalid GBNF grammar: nested too deeply") from None
            except Exception as e:  # the converter raises its own parse errors, of no common type
                raise ValueError(f"invalid GBNF grammar: {_one_line(str(e)) or type(e).__name__}") from None
        return LLMatcher.grammar_from_lark(self.text)

    @property
    def label(self) -> str:
        return {"json_schema": "JSON schema", "json": "JSON grammar", "regex": "regex",
                "lark": "Lark grammar", "gbnf": "GBNF grammar"}.get(self.kind, "grammar")

    def validate(self, tokenizer=None) -> None:
        """Check the grammar's text (kind, size, nesting, JSON); with the target's LLTokenizer also compile it
        into its starting matcher (kept) and check some token can start it. Raises ValueError with a one-line
        message. llguidance's compile takes time without bound, so it runs only with a tokenizer: a server
        has it run first in a child process it can kill (engine/serve/grammars.py)."""
        from llguidance import LLMatcher

        if self.template is not None and (tokenizer is None or self.tokenizer_id == id(tokenizer)):
            return  # prepared: compiled, matched against a tokenizer (this one) and checked once already
        grammar = self.compile()
        if tokenizer is None:
            return
        matcher = LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            self.refuse(matcher.get_error())
        g = Grammar(matcher.deep_copy(), tokenizer.vocab_size, frozenset(int(t) for t in tokenizer.eos_tokens))
        try:
            g.allowed(tokenizer.vocab_size)  # the matcher finds a grammar that matches nothing only here
        except RuntimeError:
            raise ValueError(f"invalid {self.label}: no token of this model can start it (it matches nothing)") \
                from None
        self.template, self.tokenizer_id = matcher, id(tokenizer)

    def refuse(self, verdict: str) -> None:
        """Raise the one-line ValueError for llguidance's verdict on this grammar where it is an error (not
        empty, not a warning): LLMatcher.validate_grammar's message or a matcher's error."""
        if verdict and not verdict.startswith("WARNING"):
            raise ValueError(f"invalid {self.label}: {_one_line(verdict)}")

    def share_from(self, other: "GrammarSpec") -> None:
        """Take what `other`, the same grammar, compiled (its template is only ever copied, never advanced)."""
        self.compiled, self.template, self.tokenizer_id = other.compiled, other.template, other.tokenizer_id


class Grammar:
    """The matcher of one slot: it has consumed every token the slot emitted (so the last sampled token too)."""

    def __init__(self, matcher, n_vocab: int, eos: frozenset[int], ended: bool = False):
        self.matcher = matcher  # llguidance.LLMatcher, advanced through the emitted tokens
        self.n_vocab = n_vocab  # the tokenizer's vocabulary; logits ids past it are never allowed
        # end-of-sequence tokens stay out of the matcher: llguidance keeps no history entry for them, so a
        # rollback over a rejected end would undo the token before it instead (and leave the end forbidden)
        self.eos = eos
        self.ended = ended  # an end was taken: nothing after it is ever given out
        self.n_consumed = 0  # tokens taken (the end included) and not rolled back: the slot's emitted ones and more

    @classmethod
    def start(cls, spec: GrammarSpec, tokenizer) -> "Grammar":
        """A matcher at the grammar's start: a copy of the spec's template (built once, by validate)."""
        spec.validate(tokenizer)
        return cls(spec.template.deep_copy(), tokenizer.vocab_size, frozenset(int(t) for t in tokenizer.eos_tokens))

    def _check(self) -> None:
        if self.matcher.is_error():
            raise RuntimeError(f"the grammar matcher failed: {_one_line(self.matcher.get_error())}")

    def allowed(self, width: int) -> torch.Tensor:
        """Bool [width] on the CPU, where the matcher writes it: the ids the grammar allows next (EOS once the
        grammar accepts). Callers move it to the logits' device, once for all the rows they mask."""
        if self.ended:  # a row after the end (the bonus row of a draft that ends): never given out
            return torch.ones(width, dtype=torch.bool, device="cpu")
        self._check()
        # one bit per id, in 32-bit words; unpacked into a fresh array that the tensor then shares (no copy):
        # this was most of a constrained round's own time when done element by element
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        self._check()  # a dead end (nothing can follow, not even the end) shows only once the mask is computed
        n = min(width, self.n_vocab, bits.shape[0])
        bits[n:] = 0  # ids past the tokenizer's vocabulary (the model's padding rows) are never allowed
        out = torch.from_numpy(bits.view(np.bool_))
        if out.shape[0] != width:
            out = torch.cat([out, torch.zeros(max(0, width - out.shape[0]), dtype=torch.bool, device="cpu")])[:width]
        if not bool(out.any()):
            raise RuntimeError("the grammar allows no next token")
        return out

    def allows(self, tok: int) -> bool:
        """Whether the grammar takes `tok` next (one token checked, not the whole vocabulary)."""
        if self.ended:
            return True  # as allowed(): a row after the end is never given out
        if tok in self.eos:
            return bool(self.matcher.is_accepting())
        return 0 <= tok < self.n_vocab and int(self.matcher.validate_tokens([int(tok)])) == 1

    def greedy_along(self, draft: list[int], logits: torch.Tensor, top: list[int]) -> list[int]:
        """Each row's most likely allowed token, row i after draft[:i] (logits [k+1, V], top: each row's own
        argmax). Where the row's argmax is allowed it is the masked argmax too (masking only removes ids), so
        the mask over the vocabulary is computed only where it is not: llama.cpp's grammar check of the
        sampled token before the whole grammar (common/sampling.cpp, common_sampler_sample). Leaves the matcher
        advanced through all k draft tokens, as masks_along does."""
        best = []
        for i in range(len(draft) + 1):
            tok = int(top[i])
            if not self.allows(tok):
                row = logits[i].masked_fill(~self.allowed(logits.shape[-1]).to(logits.device), float("-inf"))
                tok = argmax_rows(row)[0]
            best.append(tok)
            if i < len(draft):
                self.consume(draft[i])
        return best

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [..., V] with every id the grammar forbids at -inf (a new tensor)."""
        return logits.masked_fill(~self.allowed(logits.shape[-1]).to(logits.device), float("-inf"))

    def masks_along(self, draft: list[int], width: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Bool [k+1, width] on `device` (the logits'), moved there in one copy: row i is the mask after
        draft[:i]. Leaves the matcher advanced through all k draft tokens: the caller rolls back what
        verification does not keep."""
        rows = [self.allowed(width)]
        for tok in draft:
            self.consume(tok)
            rows.append(self.allowed(width))
        return torch.stack(rows).to(device)

    def consume(self, tok: int) -> None:
        if self.ended:
            return
        if int(tok) in self.eos:
            if not self.matcher.is_accepting():
                raise RuntimeError("the grammar refused the end of sequence: the output is not complete")
            self.ended = True
            self.n_consumed += 1
            return
        if not self.matcher.consume_token(int(tok)):
            raise RuntimeError(f"the grammar refused token {tok}: {_one_line(self.matcher.get_error())}")
        self.n_consumed += 1

    def consume_all(self, tokens: list[int]) -> None:
        for tok in tokens:
            self.consume(tok)

    def rollback(self, n: int) -> None:
        """Forget the last n consumed tokens (a rejected draft tail)."""
        self.n_consumed -= max(n, 0)
        if n > 0 and self.ended:
            self.ended, n = False, n - 1
        if n > 0 and not self.matcher.rollback(n):
            raise RuntimeError(f"the grammar could not roll back {n} tokens: {self.matcher.get_error()}")

    def complete_after(self, n_emitted: int) -> bool:
        """Whether the first `n_emitted` tokens this grammar took form a whole output of it: the verdict on an
        answer cut at the token limit (which may stop inside tokens the grammar took already), from
        llguidance's own matcher, so a user's pattern never runs through another regex engine."""
        probe = self.clone()
        if probe.n_consumed > n_emitted:
            probe.rollback(probe.n_consumed - n_emitted)
        return probe.is_accepting()

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
        twin = Grammar(self.matcher.deep_copy(), self.n_vocab, self.eos, self.ended)
        twin.n_consumed = self.n_consumed
        return twin

    def copy_from(self, other: "Grammar") -> None:
        """Restore this grammar to `other`'s state (checkpoint restore); `other` stays usable."""
        self.matcher, self.ended, self.n_consumed = other.matcher.deep_copy(), other.ended, other.n_consumed

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
