"""Compilations (engine/serve/grammars.py): shared by the requests of one client's partition, bounded in all
and per client, and stopped at their deadline: llguidance's compile runs in a child process that is killed."""

import json
import os
import signal
import threading
import time

import pytest

from engine.grammar import GrammarSpec
from engine.serve import grammars
from engine.serve.compiler import ChildCompile
from engine.serve.grammars import GrammarCache


def slow_schema(n: int = 1500) -> str:
    """patternProperties with additionalProperties false: llguidance's compile of 200 takes seconds whatever
    its limits, of 1,500 minutes (docs/engine.md#a-grammars-compile-time)."""
    patterns = {f"^p{i}[a-z]{{1,{i % 30 + 2}}}$": {"type": "integer"} for i in range(n)}
    return json.dumps({"type": "object", "patternProperties": patterns, "additionalProperties": False})


def wait_until(ready, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class HeldCompiler:
    """GrammarSpec.validate replaced: each call (the matcher built here, after the child's real compile) records
    its grammar and waits for `release`, then gives the spec a template of its own (what a real compilation
    leaves)."""

    def __init__(self, monkeypatch):
        self.calls, self.release = [], threading.Event()
        held = self

        def validate(spec, tokenizer=None):
            held.calls.append(spec.text)
            assert held.release.wait(30)
            if spec.text.startswith("bad"):
                raise ValueError(f"invalid regex: {spec.text}")
            spec.template = object()

        monkeypatch.setattr(GrammarSpec, "validate", validate)


def prepare_in_threads(cache, specs, timeout_s=30.0, client=None):
    """cache.prepare(spec) for every spec at once; each one's exception or None, in order."""
    out = [None] * len(specs)

    def one(i):
        try:
            cache.prepare(specs[i], timeout_s=timeout_s, client=client)
        except Exception as e:  # recorded and checked by the caller
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(specs))]
    for t in threads:
        t.start()
    return threads, out


def test_a_grammar_past_its_deadline_is_refused_and_its_compile_killed(monkeypatch):
    children = []

    class Recorded(ChildCompile):
        def __init__(self, grammar):
            super().__init__(grammar)
            children.append(self)

    monkeypatch.setattr(grammars, "ChildCompile", Recorded)
    cache = GrammarCache(lambda: None, compiles_max=1)
    started = time.monotonic()
    with pytest.raises(ValueError, match="JSON schema took over 1 s to compile"):
        cache.prepare(GrammarSpec("json_schema", slow_schema()), timeout_s=2.0)
    assert time.monotonic() - started < 1.9, "refused at the child's deadline (half the wait), not the caller's"
    (child,) = children
    assert child.returncode == -signal.SIGKILL  # killed and reaped: it burns no CPU from here
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)
    wait_until(lambda: not cache.running, 2.0)
    cache.prepare(GrammarSpec("regex", "(red|blue)"), timeout_s=20)  # the compiler (1 at once) is free again


def test_a_grammar_llguidance_refuses_gets_its_message_from_the_child():
    with pytest.raises(ValueError, match='invalid regex: .*unclosed group') as e:
        GrammarCache(lambda: None).prepare(GrammarSpec("regex", "a(b"))
    assert "\n" not in str(e.value)


def test_identical_grammars_arriving_together_are_compiled_once(monkeypatch):
    held = HeldCompiler(monkeypatch)
    cache = GrammarCache(lambda: None)
    specs = [GrammarSpec("regex", "(red|blue)") for _ in range(5)]
    threads, out = prepare_in_threads(cache, specs)
    wait_until(lambda: held.calls)
    time.sleep(0.2)  # the others have arrived and wait on the same compilation
    held.release.set()
    for t in threads:
        t.join(30)
    assert out == [None] * 5 and held.calls == ["(red|blue)"]
    assert len({id(s.template) for s in specs}) == 1 and specs[0].template is not None
    bad = [GrammarSpec("regex", "bad+") for _ in range(2)]
    threads, out = prepare_in_threads(cache, bad)
    for t in threads:
        t.join(30)
    assert all(isinstance(e, ValueError) and "invalid regex: bad+" in str(e) for e in out)


def test_compilations_are_bounded_and_one_given_up_while_built_is_kept(monkeypatch):
    """Past its child the matcher is built here and cannot be stopped (it takes about what the child took, within
    the caller's wait): a caller that gives up meanwhile leaves it to end, and its grammar is kept."""
    held = HeldCompiler(monkeypatch)
    cache = GrammarCache(lambda: None, compiles_max=2)
    threads, out = prepare_in_threads(cache, [GrammarSpec("regex", t) for t in ("a+", "b+")], timeout_s=3.0)
    wait_until(lambda: len(held.calls) == 2)  # both through their child, both matchers being built
    for t in threads:
        t.join(30)
    assert all("took over 3 s to compile" in str(e) for e in out), out
    with pytest.raises(ValueError, match="grammar compiler is busy: 2 grammars are compiling"):
        cache.prepare(GrammarSpec("regex", "c+"), timeout_s=5)
    again = GrammarSpec("regex", "a+")  # the given-up grammar again: it waits on the running compilation
    threads, out = prepare_in_threads(cache, [again])
    time.sleep(0.2)
    assert sorted(held.calls) == ["a+", "b+"], "a second compilation started for a grammar already compiling"
    held.release.set()
    threads[0].join(30)
    assert out == [None] and again.template is not None
    wait_until(lambda: not cache.running)
    assert set(cache.compiled) == {(None, "regex", "a+"), (None, "regex", "b+")}  # the given-up one was filed
    late = GrammarSpec("regex", "b+")
    cache.prepare(late, timeout_s=5)
    cache.prepare(GrammarSpec("regex", "c+"), timeout_s=5)  # the compiler has room again
    assert sorted(held.calls[:2]) == ["a+", "b+"] and held.calls[2:] == ["c+"]
    assert late.template is cache.compiled[(None, "regex", "b+")].template


def test_one_clients_compilations_do_not_block_anothers(monkeypatch):
    held = HeldCompiler(monkeypatch)
    cache = GrammarCache(lambda: None, compiles_max=4, client_max=2)
    threads, out = prepare_in_threads(cache, [GrammarSpec("regex", t) for t in ("a+", "b+")], client="A")
    wait_until(lambda: len(held.calls) == 2)
    with pytest.raises(ValueError, match="busy with your grammars: 2 are compiling"):
        cache.prepare(GrammarSpec("regex", "c+"), timeout_s=5, client="A")
    # B brings the grammar A is compiling: a compilation of its own (partitions share nothing), not refused
    more, out_b = prepare_in_threads(cache, [GrammarSpec("regex", "a+")], client="B")
    wait_until(lambda: len(held.calls) == 3)
    assert sorted(held.calls) == ["a+", "a+", "b+"] and len(cache.running) == 3
    held.release.set()
    for t in threads + more:
        t.join(30)
    assert out == [None, None] and out_b == [None]


def test_compiled_grammars_are_kept_apart_by_client_unless_shared(monkeypatch):
    held = HeldCompiler(monkeypatch)
    held.release.set()
    cache = GrammarCache(lambda: None)
    a1, a2, b = (GrammarSpec("regex", "(red|blue)") for _ in range(3))
    cache.prepare(a1, client="A")
    cache.prepare(a2, client="A")
    assert held.calls == ["(red|blue)"] and a2.template is a1.template  # the same client: compiled once
    cache.prepare(b, client="B")
    assert held.calls == ["(red|blue)"] * 2 and b.template is not a1.template  # another: compiled again
    assert set(cache.compiled) == {("A", "regex", "(red|blue)"), ("B", "regex", "(red|blue)")}
    shared = GrammarCache(lambda: None, shared=True)
    a, b = GrammarSpec("regex", "(red|blue)"), GrammarSpec("regex", "(red|blue)")
    shared.prepare(a, client="A")
    shared.prepare(b, client="B")
    assert len(held.calls) == 3 and b.template is a.template and set(shared.compiled) == {(None, "regex", "(red|blue)")}


def test_the_child_compiles_at_a_lower_priority():
    """A visitor's compile yields the cores to the engine's rounds: the child runs at nice + CHILD_NICE."""
    from engine.serve.compiler import CHILD_NICE

    child = ChildCompile(GrammarSpec("json_schema", slow_schema()).compile())
    try:
        wait_until(lambda: os.getpriority(os.PRIO_PROCESS, child.pid) >= os.nice(0) + CHILD_NICE, 10.0)
    finally:
        child.kill()
