"""Parameters of a generation: sampling, speculation, limits. Validated before anything runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.grammar import GrammarSpec
from engine.sampling import SamplerParams


@dataclass
class SpecParams:
    types: list[str] = field(default_factory=list)  # drafter types in relay order; [] = plain decoding
    n_max: int = 16  # at most this many draft tokens per round
    n_min: int = 0  # a shorter draft is dropped (not worth a verification)
    # model drafters stop when their top probability falls below this; None = each drafter's own default (a
    # draft model 0.75 as llama.cpp, the draft head the value measured best for it: DraftHeadParams.p_min)
    p_min: float | None = None
    adaptive: bool = True  # let the cost/acceptance policy shorten drafts that do not pay
    rollback: str = "auto"  # "auto": seq_rm where the cache can; "checkpoint": always restore + replay
    # llama.cpp's synthetic acceptance, for measuring speed against acceptance: each draft token is kept with
    # this probability whatever it is (the output is then NOT the target's); a tuple gives one probability per
    # draft position, the last for every position past it (llama.cpp's synthetic rates); None = real verification
    synthetic_accept: float | tuple[float, ...] | None = None
    # trees of drafts (engine/draft/tree.py): every drafter proposes and the target checks all proposals in one forward,
    # at most this many nodes per round; 0: one chain, from the first drafter that has one (llama.cpp's relay)
    tree_nodes: int = 0
    # a tree at temperature > 0: "rejection" lets model drafters draw their chains from q and verifies by rejection
    # sampling over the siblings (engine/round/tree_rejection.py: the target's distribution, more drafts kept);
    # "walk" has them choose their most likely tokens and the target walk the tree with plain sampling's draws
    # (the same text as plain decoding for the same seed)
    tree_verify: str = "rejection"
    # the whole token sequence (prompt and answer) a measurement expects, for the oracle drafter to propose from
    # (engine/draft/oracle.py); None everywhere else
    reference: list[int] | None = None

    def validate(self) -> None:
        if self.n_max < 0 or self.n_min < 0:
            raise ValueError(f"n_max and n_min must be >= 0 (got n_max={self.n_max}, n_min={self.n_min})")
        if self.tree_nodes < 0:
            raise ValueError(f"tree_nodes must be >= 0 (0 = chains), got {self.tree_nodes}")
        if self.n_min > self.n_max:
            raise ValueError(f"n_min ({self.n_min}) must not exceed n_max ({self.n_max})")
        if self.p_min is not None and not 0.0 <= self.p_min <= 1.0:
            raise ValueError(f"p_min must be in [0, 1], got {self.p_min}")
        rates = self.synthetic_accept if isinstance(self.synthetic_accept, tuple) else (self.synthetic_accept,)
        if self.synthetic_accept is not None and not (rates and all(0.0 <= p <= 1.0 for p in rates)):
            raise ValueError(f"synthetic_accept must be in [0, 1] (one, or one per position), got {self.synthetic_accept}")
        if self.tree_verify not in ("rejection", "walk"):
            raise ValueError(f"tree_verify must be 'rejection' or 'walk', got {self.tree_verify!r}")
        if self.rollback not in ("auto", "checkpoint"):
            raise ValueError(f"rollback must be 'auto' or 'checkpoint', got {self.rollback!r}")


@dataclass
class GenParams:
    max_new_tokens: int = 256  # stop after this many generated tokens
    sampling: SamplerParams = field(default_factory=SamplerParams)  # the target's sampler
    spec: SpecParams = field(default_factory=SpecParams)  # speculation settings
    ignore_eos: bool = False  # keep going past end-of-sequence (benchmarks of fixed length)
    # constrains the target's sampler (and so the whole output, speculative or not); None = unconstrained
    grammar: GrammarSpec | None = None
    # who may reuse this generation's cached prefix and whose it may reuse (vLLM's cache_salt): cells pass only
    # between generations of equal salt, so one client's prompt cannot be probed through another's cache_n
    cache_salt: str | None = None
    # who asked: the partition of per-client caches and limits (compiled grammars, compilations running at
    # once: engine/serve/grammars.py); None: the operator / tests
    client: str | None = None
    # each event carries its emitted tokens' target entropy and a rejection's residual (RoundEvent.entropy,
    # residual_top: the page's hover and step view): a softmax and a top-k a benchmark need not pay for
    explain: bool = False

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self.sampling.validate()
        self.spec.validate()
        if self.grammar is not None:
            if self.ignore_eos:
                # a grammar ends the answer with end-of-sequence once it is complete; past it nothing is allowed
                raise ValueError("a grammar and ignore_eos do not go together: the grammar ends the answer")
            self.grammar.validate()
