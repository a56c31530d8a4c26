"""The background round loop: sessions share forwards, stop answers at once, an abandoned slot is freed."""

import time

import pytest

from engine.params import GenParams, SpecParams
from engine.events import ErrorEvent
from engine.scheduler import Scheduler
from engine.slots import Engine


@pytest.fixture()
def scheduler(tiny_target):
    s = Scheduler(Engine(tiny_target, n_ctx=512, n_seq_max=2, calibrate=False))
    yield s
    s.close()


def drain(q, timeout=60):
    out = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        ev = q.get(timeout=timeout)
        out.append(ev)
        if ev.done:
            return out
    raise AssertionError("no final event")


def test_two_sessions_each_get_their_own_text(scheduler):
    p = GenParams(max_new_tokens=30, ignore_eos=True, spec=SpecParams(types=["ngram-simple"]))
    a, qa = scheduler.submit([1, 5, 6, 7, 5, 6], p)
    b, qb = scheduler.submit([1, 9, 10, 11], GenParams(max_new_tokens=20, ignore_eos=True))
    ea, eb = drain(qa), drain(qb)
    assert a != b and {e.seq for e in ea} == {a} and {e.seq for e in eb} == {b}
    assert sum(len(e.emitted) for e in ea) == 30 and sum(len(e.emitted) for e in eb) == 20
    scheduler.finish(a)
    scheduler.finish(b)


def test_stop_and_submit_do_not_wait_for_a_long_answer(scheduler):
    seq, q = scheduler.submit([1, 5, 6, 7], GenParams(max_new_tokens=400, ignore_eos=True))
    q.get(timeout=30)
    t0 = time.time()
    other, q2 = scheduler.submit([1, 8, 9], GenParams(max_new_tokens=5, ignore_eos=True))
    assert time.time() - t0 < 2.0
    scheduler.stop(seq)
    events = drain(q)
    assert events[-1].stop_reason == "stopped" and sum(len(e.emitted) for e in events) < 400
    assert sum(len(e.emitted) for e in drain(q2)) == 5
    scheduler.finish(seq)
    scheduler.finish(other)


def test_cancelled_generation_frees_its_slot(scheduler):
    seqs = [scheduler.submit([1, 5, 6], GenParams(max_new_tokens=300, ignore_eos=True))[0] for _ in range(2)]
    with pytest.raises(RuntimeError, match="busy"):
        scheduler.submit([1, 5], GenParams(max_new_tokens=3))
    scheduler.cancel(seqs[0])
    deadline = time.time() + 30
    while seqs[0] in scheduler.queues and time.time() < deadline:
        time.sleep(0.05)
    seq, q = scheduler.submit([1, 7], GenParams(max_new_tokens=3, ignore_eos=True))
    assert seq == seqs[0] and drain(q)[-1].done
    scheduler.cancel(seqs[1])


def test_a_failing_round_reports_an_error_and_the_loop_goes_on(scheduler, monkeypatch):
    seq, q = scheduler.submit([1, 5, 6], GenParams(max_new_tokens=5, ignore_eos=True))
    original = scheduler.engine.step

    def broken(only=None):
        raise RuntimeError("KV cache full")

    monkeypatch.setattr(scheduler.engine, "step", broken)
    ev = q.get(timeout=30)
    assert isinstance(ev, ErrorEvent) and "KV cache full" in ev.message
    monkeypatch.setattr(scheduler.engine, "step", original)
    scheduler.finish(seq)
    seq2, q2 = scheduler.submit([1, 5, 6], GenParams(max_new_tokens=5, ignore_eos=True))
    assert drain(q2)[-1].done
