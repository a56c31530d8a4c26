"""Compiled grammars kept for the requests that bring them again (a message and its plain comparison, a class
given one schema): each is compiled once, on a thread of its own that the requesting caller waits on (never the
engine's thread); the engine thread then only copies the starting matcher.

Compilations are bounded: at most `compiles_max` run at once, abandoned ones included (llguidance cannot be
interrupted, so a caller that stops waiting leaves its compilation running to its end). Requests that bring a
grammar being compiled wait on that compilation instead of starting another, and a compilation whose caller
gave up still files its result here when it finishes, for the next request with the same grammar.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from engine.grammar import COMPILE_TIMEOUT_S, GrammarSpec

GRAMMARS_KEPT = 16  # compiled grammars kept, the latest used last
COMPILES_MAX = 4  # compilations running at once (abandoned ones included): past it a new grammar is refused


@dataclass
class Compilation:
    """One grammar being compiled on its own thread, for whoever brings it meanwhile."""

    spec: GrammarSpec  # the cache's own copy: compiled by the worker, shared with every waiter when done
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None


class GrammarCache:
    def __init__(self, tokenizer: Callable[[], object], kept: int = GRAMMARS_KEPT, compiles_max: int = COMPILES_MAX):
        self.tokenizer = tokenizer  # the target's grammar tokenizer, built on first need (Engine.grammar_tokenizer)
        self.kept = kept
        self.compiles_max = compiles_max
        self.compiled: OrderedDict[tuple[str, str], GrammarSpec] = OrderedDict()  # (kind, text) -> compiled spec
        self.running: dict[tuple[str, str], Compilation] = {}  # compilations whose thread is alive
        self.lock = threading.Lock()  # callers and compile threads meet here

    def prepare(self, spec: GrammarSpec, timeout_s: float = COMPILE_TIMEOUT_S) -> None:
        """Give `spec` its compiled grammar: one compiled earlier, the one being compiled, or a new compilation,
        waiting at most timeout_s. Raises ValueError with the reason (invalid, too slow, the compiler busy)."""
        key = (spec.kind, spec.text)
        with self.lock:
            known = self.compiled.get(key)
            if known is not None:
                self.compiled.move_to_end(key)
            else:
                job = self.running.get(key) or self._start(key, spec)
        if known is not None:
            spec.share_from(known)
            return
        if not job.done.wait(timeout_s):
            raise ValueError(f"the {spec.label} took over {timeout_s:.0f} s to compile: simplify it")
        if isinstance(job.error, ValueError):
            raise ValueError(str(job.error)) from None  # a copy: several waiters may raise it at once
        if job.error is not None:
            raise RuntimeError(f"compiling the {spec.label} failed: {type(job.error).__name__}: {job.error}")
        spec.share_from(job.spec)

    def _start(self, key: tuple[str, str], spec: GrammarSpec) -> Compilation:
        """A new compilation on its own thread; called under the lock."""
        if len(self.running) >= self.compiles_max:
            raise ValueError(f"the grammar compiler is busy: {len(self.running)} grammars are compiling (at most "
                             f"{self.compiles_max} at once); try again in a minute")
        job = Compilation(GrammarSpec(spec.kind, spec.text))
        self.running[key] = job
        try:
            threading.Thread(target=self._compile, args=(key, job), name="grammar-compile", daemon=True).start()
        except RuntimeError:  # no thread could start: nothing runs under this key
            del self.running[key]
            raise
        return job

    def _compile(self, key: tuple[str, str], job: Compilation) -> None:
        try:
            job.spec.validate(self.tokenizer())
        except Exception as e:  # any type: handed to every waiter
            job.error = e
        with self.lock:
            del self.running[key]
            if job.error is None:
                self.compiled[key] = job.spec
                while len(self.compiled) > self.kept:
                    self.compiled.popitem(last=False)
        job.done.set()


def grammar_tokenizer_of(tokenizer, eos: list[int]):
    """llguidance's view of a tokenizer, its end of sequence the engine's; ValueError where it cannot read it."""
    from llguidance.hf import from_tokenizer

    try:
        return from_tokenizer(tokenizer, eos_token=eos or None)
    except Exception as e:  # any type: llguidance raises what the tokenizer's decoder raises
        raise ValueError(f"grammars need a fast tokenizer with a known decoder; this model's: {e}") from None
