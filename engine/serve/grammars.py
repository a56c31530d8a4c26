"""Compiled grammars kept for the requests that bring them again (a message and its plain comparison, a class
given one schema), each client's apart: each is compiled once, on a thread of its own that the requesting
callers wait on (never the engine's thread); the engine thread then only copies the starting matcher.

A compilation first runs llguidance's compile in a child process (engine/serve/compiler.py) with a deadline of
half the first caller's wait, and only a grammar that compiled there in time is compiled again here, into its
matcher (about the same time again, which cannot be interrupted). The child is killed at its deadline, so a
compilation ends about when its first caller stops waiting, and a grammar nobody waits for burns no CPU; a
caller that waits longer for the same grammar takes the same verdict.

Compilations are bounded: at most `compiles_max` at once in all, and at most `client_max` of one client (None,
the operator and the tests, has no bound of its own); past either a new grammar is refused with "busy".

Compiled grammars and running compilations are keyed by the client's partition as well as the grammar: one
client never gets another's compiled grammar, so how fast a grammar comes back tells nobody whether someone
else sent it (a timing oracle). `shared=True` (the operator's choice) puts every client in one partition.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from engine.grammar import COMPILE_TIMEOUT_S, GrammarSpec
from engine.serve.compiler import ChildCompile

GRAMMARS_KEPT = 16  # compiled grammars kept, all partitions together, the latest used last
COMPILES_MAX = 4  # compilations running at once, all clients together: past it a new grammar is refused
CLIENT_COMPILES_MAX = 2  # compilations one client may have running at once
# of the first caller's wait, the child's share: the matcher built here after it takes about as long again
CHILD_SHARE = 0.5

Key = tuple  # (partition, kind, text): the partition is the client's, or None when shared


@dataclass
class Compilation:
    """One grammar being compiled, for whoever of its partition brings it meanwhile."""

    spec: GrammarSpec  # the cache's own copy: compiled by the worker, shared with every waiter when done
    client: str | None  # who started it: counted against that client's bound
    child_s: float  # how long its child may take: killed then
    done: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None


class GrammarCache:
    def __init__(self, tokenizer: Callable[[], object], kept: int = GRAMMARS_KEPT, compiles_max: int = COMPILES_MAX,
                 client_max: int = CLIENT_COMPILES_MAX, shared: bool = False):
        self.tokenizer = tokenizer  # the target's grammar tokenizer, built on first need (Engine.grammar_tokenizer)
        self.kept = kept
        self.compiles_max = compiles_max
        self.client_max = client_max
        self.shared = shared  # every client in one partition: the operator trusts them all with each other
        self.compiled: OrderedDict[Key, GrammarSpec] = OrderedDict()  # (partition, kind, text) -> compiled spec
        self.running: dict[Key, Compilation] = {}  # compilations whose thread is alive
        self.lock = threading.Lock()  # callers and compile threads meet here

    def key(self, spec: GrammarSpec, client: str | None) -> Key:
        return (None if self.shared else client, spec.kind, spec.text)

    def prepare(self, spec: GrammarSpec, timeout_s: float = COMPILE_TIMEOUT_S, client: str | None = None) -> None:
        """Give `spec` its compiled grammar: one compiled earlier in the client's partition, the one being
        compiled there, or a new compilation, waiting at most timeout_s. Raises ValueError with the reason
        (invalid, too slow, the compiler busy)."""
        key = self.key(spec, client)
        with self.lock:
            known = self.compiled.get(key)
            if known is not None:
                self.compiled.move_to_end(key)
            else:
                job = self.running.get(key) or self._start(key, spec, client, timeout_s)
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

    def _start(self, key: Key, spec: GrammarSpec, client: str | None, timeout_s: float) -> Compilation:
        """A new compilation on its own thread; called under the lock."""
        if len(self.running) >= self.compiles_max:
            raise ValueError(f"the grammar compiler is busy: {len(self.running)} grammars are compiling (at most "
                             f"{self.compiles_max} at once); try again in a minute")
        mine = sum(job.client == client for job in self.running.values())
        if client is not None and mine >= self.client_max:
            raise ValueError(f"the grammar compiler is busy with your grammars: {mine} are compiling (at most "
                             f"{self.client_max} at once each); try again when they are done")
        job = Compilation(GrammarSpec(spec.kind, spec.text), client, timeout_s * CHILD_SHARE)
        self.running[key] = job
        try:
            threading.Thread(target=self._compile, args=(key, job), name="grammar-compile", daemon=True).start()
        except RuntimeError:  # no thread could start: nothing runs under this key
            del self.running[key]
            raise
        return job

    def _compile(self, key: Key, job: Compilation) -> None:
        try:
            self._compile_in_child(job)
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

    def _compile_in_child(self, job: Compilation) -> None:
        """llguidance's compile of the grammar in a child process, killed at its deadline. Raises ValueError
        where the grammar did not compile there in time."""
        started = time.monotonic()
        child = ChildCompile(job.spec.compile())  # the text's own checks (size, nesting, JSON) come first, here
        verdict = child.verdict(job.child_s - (time.monotonic() - started))
        if verdict is not None:
            job.spec.refuse(verdict)
        elif child.timed_out:
            raise ValueError(f"the {job.spec.label} took over {job.child_s:.0f} s to compile: simplify it")
        else:
            raise ValueError(f"the grammar compiler stopped on this {job.spec.label} (exit status "
                             f"{child.returncode}): simplify it")


def grammar_tokenizer_of(tokenizer, eos: list[int]):
    """llguidance's view of a tokenizer, its end of sequence the engine's; ValueError where it cannot read it."""
    from llguidance.hf import from_tokenizer

    try:
        return from_tokenizer(tokenizer, eos_token=eos or None)
    except Exception as e:  # any type: llguidance raises what the tokenizer's decoder raises
        raise ValueError(f"grammars need a fast tokenizer with a known decoder; this model's: {e}") from None
