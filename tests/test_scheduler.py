"""The engine's one owner: a command queue, a FIFO of waiting requests, stop and cancel by generation id, and
failures that end only the generation at fault (drafting, the forward, verification), proven by injecting them."""

import threading
import time

import pytest

from engine.round import verify
from engine.events import ErrorEvent, RoundEvent, WaitEvent
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.scheduler import QueueFull, Scheduler
from engine.serve.engine import Engine
from test_engine import SMALL_NGRAMS

PROMPTS = [[1, 5, 6, 7, 5, 6, 7, 5], [1, 9, 10, 11, 9, 10], [1, 12, 13, 14, 12, 13], [1, 8, 9, 8, 9, 8]]


def params(n=24, types=("ngram-simple",), temp=0.0, seed=0, n_max=4):
    return GenParams(max_new_tokens=n, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                     spec=SpecParams(types=list(types), n_max=n_max))


def make(tiny_target, slots=2, queue_max=64):
    return Scheduler(Engine(tiny_target, n_ctx=512, n_seq_max=slots, calibrate=False,
                            drafter_params=SMALL_NGRAMS), queue_max=queue_max)


@pytest.fixture()
def scheduler(tiny_target):
    s = make(tiny_target)
    yield s
    s.close()


@pytest.fixture()
def one_slot(tiny_target):
    """A scheduler with one slot: every second request waits in line."""
    s = make(tiny_target, slots=1)
    yield s
    s.close()


@pytest.fixture(scope="module")
def reference(tiny_target):
    """Plain decoding of each prompt on an engine of its own: what every generation must emit."""
    engine = Engine(tiny_target, n_ctx=512, n_seq_max=1, calibrate=False)

    def plain(prompt, n=24, temp=0.0, seed=0):
        events = list(engine.generate(prompt, params(n, types=(), temp=temp, seed=seed), seq=0))
        engine.release(0)
        return [t for e in events for t in e.emitted]
    return plain


def drain(gen, timeout=60):
    out = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        ev = gen.events.get(timeout=timeout)
        out.append(ev)
        if ev.done:
            return out
    raise AssertionError("no final event")


def emitted(events):
    return [t for e in events if isinstance(e, RoundEvent) for t in e.emitted]


def test_two_sessions_each_get_their_own_text(scheduler, reference):
    a = scheduler.submit(PROMPTS[0], params(30))
    b = scheduler.submit(PROMPTS[1], params(20, types=()))
    ea, eb = drain(a), drain(b)
    assert a.id != b.id and {e.seq for e in ea} == {a.seq} and {e.seq for e in eb} == {b.seq}
    assert emitted(ea) == reference(PROMPTS[0], 30) and emitted(eb) == reference(PROMPTS[1], 20)


def test_bad_input_is_refused_at_submit_and_queues_nothing(scheduler):
    with pytest.raises(ValueError, match="empty prompt"):
        scheduler.submit([], params())
    with pytest.raises(ValueError, match="n_min"):
        scheduler.submit(PROMPTS[0], GenParams(spec=SpecParams(types=["ngram-simple"], n_min=5, n_max=2)))
    with pytest.raises(ValueError, match="unknown drafter"):
        scheduler.submit(PROMPTS[0], params(types=("ngram-nonsense",)))
    with pytest.raises(ValueError, match="does not fit"):
        scheduler.submit([1] * 600, params())
    assert not scheduler.waiting and not scheduler.running
    assert drain(scheduler.submit(PROMPTS[0], params(5)))[-1].done


def test_requests_past_the_slots_wait_in_line_and_all_finish(scheduler, reference):
    gens = [scheduler.submit(PROMPTS[i % 4], params(24)) for i in range(6)]
    outs = [drain(g) for g in gens]
    places = [[e.position for e in out if isinstance(e, WaitEvent)] for out in outs]
    assert places[:2] == [[], []], "the first two get a slot at once"
    assert places[2][0] == 1 and places[5][0] == 4, "the others hear their place in line"
    assert all(p == sorted(p, reverse=True) for p in places), "a place only moves forward"
    for i, out in enumerate(outs):
        assert not any(isinstance(e, ErrorEvent) for e in out)
        assert emitted(out) == reference(PROMPTS[i % 4], 24)


def test_the_wait_queue_is_bounded(tiny_target):
    s = make(tiny_target, slots=1, queue_max=1)
    try:
        running = s.submit(PROMPTS[0], params(400))
        waiting = s.submit(PROMPTS[1], params(5))
        with pytest.raises(QueueFull, match="queue holds 1"):
            s.submit(PROMPTS[2], params(5))
        s.stop(running.id)
        assert drain(running)[-1].stop_reason == "stopped"
        assert len(emitted(drain(waiting))) == 5
    finally:
        s.close()


def test_stop_while_waiting_leaves_the_queue(one_slot):
    running = one_slot.submit(PROMPTS[0], params(300))
    first, second = one_slot.submit(PROMPTS[1], params(5)), one_slot.submit(PROMPTS[2], params(5))
    one_slot.stop(first.id)
    out = drain(first)
    assert out[-1].stop_reason == "stopped" and emitted(out) == []
    assert drain_until_place(second, 1)[-1].position == 1, "the second moved up"
    one_slot.stop(running.id)
    assert len(emitted(drain(second))) == 5


def drain_until_place(gen, place, timeout=30):
    out = []
    while True:
        ev = gen.events.get(timeout=timeout)
        if isinstance(ev, WaitEvent):
            out.append(ev)
            if ev.position == place:
                return out


def test_stop_names_a_generation_not_a_slot(one_slot, reference):
    old = one_slot.submit(PROMPTS[0], params(4))
    drain(old)
    new = one_slot.submit(PROMPTS[1], params(40))
    assert new.seq == old.seq, "the slot was given to someone else"
    one_slot.stop(old.id)  # a late click from the page that had the slot before
    assert emitted(drain(new)) == reference(PROMPTS[1], 40)


def test_cancel_frees_the_slot_for_the_next_in_line(one_slot):
    leaving = one_slot.submit(PROMPTS[0], params(400))
    waiting = one_slot.submit(PROMPTS[1], params(5))
    one_slot.cancel(leaving.id)
    assert len(emitted(drain(waiting, timeout=30))) == 5
    assert not one_slot.running and not one_slot.waiting


def test_step_mode_runs_only_on_step_and_stops_at_once(scheduler):
    gen = scheduler.submit(PROMPTS[0], params(50), manual=True)
    time.sleep(0.3)
    assert gen.events.empty(), "nothing runs a step-mode generation but step()"
    assert scheduler.step(gen.id) == 1 and gen.events.get_nowait().kind == "prefill"
    assert scheduler.step(gen.id) == 1 and gen.events.get_nowait().kind in ("spec", "plain")
    scheduler.stop(gen.id)
    assert drain(gen, timeout=10)[-1].stop_reason == "stopped"
    with pytest.raises(ValueError, match="has ended"):
        scheduler.step(gen.id)


def test_call_runs_on_the_engine_thread_after_ending_every_generation(scheduler):
    running = scheduler.submit(PROMPTS[0], params(400))
    running.events.get(timeout=30)
    seen = scheduler.call(lambda engine: (threading.current_thread().name, engine.active()))
    assert seen == ("engine", [])
    out = drain(running)
    assert isinstance(out[-1], ErrorEvent) and "being replaced" in out[-1].message


# ---- failures stay with the generation at fault --------------------------------------------------------


def two_generations(scheduler):
    """A generation on slot 0 (the one a fault will hit) and one on slot 1, started in the same round."""
    return scheduler.submit_group([(PROMPTS[0], params(40)), (PROMPTS[1], params(40))])


def test_a_drafter_that_raises_on_one_sequence_ends_only_that_generation(scheduler, reference):
    drafter = scheduler.engine.drafter("ngram-simple")
    real = drafter.draft

    def draft(requests):
        if any(r.seq == 0 for r in requests):
            raise AssertionError("drafter bug on sequence 0")
        real(requests)

    drafter.draft = draft
    victim, other = two_generations(scheduler)
    assert_other_finishes_after(scheduler, victim, other, reference, "drafting",
                                restore=lambda: setattr(drafter, "draft", real))


def assert_other_finishes_after(scheduler, victim, other, reference, stage, restore):
    out_v, out_o = drain(victim), drain(other)
    if restore is not None:
        restore()
    assert isinstance(out_v[-1], ErrorEvent) and stage in out_v[-1].message, out_v[-1]
    assert emitted(out_o) == reference(PROMPTS[1], 40)
    assert scheduler.thread.is_alive() and not scheduler.running
    assert emitted(drain(scheduler.submit(PROMPTS[2], params(10)))) == reference(PROMPTS[2], 10)


def test_a_forward_that_raises_once_is_run_again_and_nobody_notices(scheduler, reference):
    ctx = scheduler.engine.ctx
    real, calls = ctx.decode, {"n": 0}

    def decode(batch):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("out of memory (injected)")
        return real(batch)

    ctx.decode = decode
    try:
        a, b = two_generations(scheduler)
        assert emitted(drain(a)) == reference(PROMPTS[0], 40)
        assert emitted(drain(b)) == reference(PROMPTS[1], 40)
    finally:
        ctx.decode = real
    assert calls["n"] > 4 and scheduler.thread.is_alive()


def test_an_assertion_inside_verification_ends_only_its_generation(scheduler, reference, monkeypatch):
    real = verify.sample_and_match
    hits = {"n": 0}

    def broken(sampler, *args, **kwargs):
        victim_slot = scheduler.engine.slots.get(0)
        if victim_slot is not None and sampler is victim_slot.sampler:
            hits["n"] += 1
            assert hits["n"] < 3, "verification invariant broken (injected)"
        return real(sampler, *args, **kwargs)

    monkeypatch.setattr(verify, "sample_and_match", broken)
    victim, other = two_generations(scheduler)
    assert_other_finishes_after(scheduler, victim, other, reference, "verification",
                                restore=lambda: monkeypatch.setattr(verify, "sample_and_match", real))


def test_the_engine_thread_survives_any_exception_type(scheduler, reference, monkeypatch):
    gen = scheduler.submit(PROMPTS[0], params(5))
    real = scheduler.engine.step
    monkeypatch.setattr(scheduler.engine, "step", lambda only=None: {}["no such key"])
    out = drain(gen)
    assert isinstance(out[-1], ErrorEvent) and "KeyError" in out[-1].message
    monkeypatch.setattr(scheduler.engine, "step", real)
    assert scheduler.thread.is_alive()
    assert emitted(drain(scheduler.submit(PROMPTS[1], params(10)))) == reference(PROMPTS[1], 10)


# ---- step mode lends its slot while idle ----------------------------------------------------------------


def step_to_end(scheduler, gen, limit=200):
    out = []
    for _ in range(limit):
        scheduler.step(gen.id)
        while not gen.events.empty():
            out.append(gen.events.get_nowait())
        if out and out[-1].done:
            return out
    raise AssertionError("the step-mode answer did not end")


def take_all(gen) -> list:
    out = []
    while not gen.events.empty():
        out.append(gen.events.get_nowait())
    return out


@pytest.mark.parametrize("other_prompt", [PROMPTS[1], PROMPTS[0][:5]])
def test_an_idle_step_session_lends_its_slot_and_resumes_where_it_stopped(tiny_target, reference, other_prompt):
    """With one slot: a step-mode answer goes idle, a waiting request takes the slot (its cells overwritten, or
    kept where the two prompts agree), and the next steps resume the answer, token-identical to plain."""
    s = Scheduler(Engine(tiny_target, n_ctx=512, n_seq_max=1, calibrate=False, drafter_params=SMALL_NGRAMS),
                  step_idle_s=0.2)
    try:
        manual = s.submit(PROMPTS[0], params(30), manual=True)
        for _ in range(3):
            s.step(manual.id)
        waiting = s.submit(other_prompt, params(12))
        assert emitted(drain(waiting, timeout=30)) == reference(other_prompt, 12), "the waiting one was served"
        seen = take_all(manual)
        lent = [e for e in seen if isinstance(e, WaitEvent)]
        assert lent and lent[-1].position == 0, "the step-mode page was told its slot went to someone else"
        out = seen + step_to_end(s, manual)
        assert emitted(out) == reference(PROMPTS[0], 30)
        assert not any(isinstance(e, ErrorEvent) for e in out)
    finally:
        s.close()


def test_a_queue_of_none_still_serves_whoever_finds_a_slot_free(tiny_target, reference):
    s = make(tiny_target, slots=1, queue_max=0)
    try:
        first = s.submit(PROMPTS[0], params(200))
        with pytest.raises(QueueFull, match="queue holds 0"):
            s.submit(PROMPTS[1], params(5))  # the one slot is taken and nobody may wait
        s.stop(first.id)
        drain(first)
        assert emitted(drain(s.submit(PROMPTS[1], params(8)))) == reference(PROMPTS[1], 8)
    finally:
        s.close()


def test_a_waiting_group_is_admitted_whole(tiny_target, reference):
    """Two requests submitted together that wait behind a running one start in the same round, not one as
    soon as a single slot frees."""
    s = make(tiny_target, slots=2)
    try:
        blocker = s.submit(PROMPTS[0], params(40))
        pair = s.submit_group([(PROMPTS[1], params(12)), (PROMPTS[2], params(12))])
        outs = [drain(g) for g in pair]
        drain(blocker)
        firsts = [next(e for e in out if isinstance(e, RoundEvent)) for out in outs]
        assert firsts[0].t_end == firsts[1].t_end, "both prefilled in the same engine step"
        assert [emitted(o) for o in outs] == [reference(PROMPTS[1], 12), reference(PROMPTS[2], 12)]
    finally:
        s.close()


def test_a_parked_slot_resumed_elsewhere_frees_the_cells_it_left(tiny_target, reference):
    """Resumed in another sequence, a parked step-mode slot copies what it can from its old cells and then
    frees them: nobody's cells would otherwise stay in the cache until a later start there."""
    engine = Engine(tiny_target, n_ctx=512, n_seq_max=2, calibrate=False, drafter_params=SMALL_NGRAMS)
    slot = engine.start(PROMPTS[0], params(30), seq=0)
    for _ in range(4):
        engine.step({0})
    parked = engine.park(0)
    engine.resume(parked, 1)
    assert engine.ctx.cache.seq_cells(0).numel() == 0 and 0 not in engine.parked
    while slot.state != "done":
        engine.step({1})
    assert slot.generated == reference(PROMPTS[0], 30)


def test_a_step_session_nobody_steps_is_ended_and_frees_its_slot(tiny_target):
    s = Scheduler(Engine(tiny_target, n_ctx=512, n_seq_max=1, calibrate=False), abandon_s=0.3)
    try:
        manual = s.submit(PROMPTS[0], params(30), manual=True)
        s.step(manual.id)
        deadline = time.time() + 10
        while s.running and time.time() < deadline:
            time.sleep(0.1)
        assert not s.running and not s.parked
        events = take_all(manual)
        assert events[-1].done and events[-1].stop_reason == "stopped"
        assert len(emitted(drain(s.submit(PROMPTS[1], params(5))))) == 5, "the slot went to the next one"
    finally:
        s.close()


def test_a_submit_the_engine_does_not_answer_in_time_is_cancelled(tiny_target, monkeypatch):
    """The caller gives up on a submit the engine thread has not taken yet: when the thread takes it later,
    the generation is cancelled at once instead of running with nobody to read or stop it."""
    import engine.serve.scheduler as sched

    s = make(tiny_target, slots=1)
    try:
        hold = threading.Event()
        s.commands.put(sched.Command("call", lambda _engine: hold.wait(10)))  # the thread is busy
        monkeypatch.setattr(sched, "REPLY_TIMEOUT_S", 0.2)
        with pytest.raises(QueueFull, match="did not take the request"):
            s.submit(PROMPTS[0], params(300))
        hold.set()
        deadline = time.time() + 10
        while time.time() < deadline and (s.running or s.waiting or not s.commands.empty()):
            time.sleep(0.05)
        assert not s.running and not s.waiting
        assert len(emitted(drain(s.submit(PROMPTS[1], params(5))))) == 5
    finally:
        s.close()


# ---- the engine thread's end: nobody is left waiting ----------------------------------------------------


def test_commands_that_come_with_a_close_are_answered_with_an_error(tiny_target, monkeypatch):
    """A submit and a step taken in the same pass as a close: their callers hear that the engine shut down at
    once, instead of waiting for REPLY_TIMEOUT_S."""
    import engine.serve.scheduler as sched

    s = make(tiny_target, slots=1)
    monkeypatch.setattr(sched, "REPLY_TIMEOUT_S", 20.0)
    busy, hold, outcomes = threading.Event(), threading.Event(), {}
    s.commands.put(sched.Command("call", lambda _engine: (busy.set(), hold.wait(10))))  # the thread is busy
    assert busy.wait(10)

    def ask(name, fn):
        t0 = time.monotonic()
        try:
            fn()
            outcomes[name] = ("answered", 0.0)
        except Exception as e:  # whatever came back is recorded and checked below
            outcomes[name] = (f"{type(e).__name__}: {e}", time.monotonic() - t0)

    callers = [threading.Thread(target=ask, args=("submit", lambda: s.submit(PROMPTS[0], params(5)))),
               threading.Thread(target=ask, args=("step", lambda: s.step(12345)))]
    for t in callers:
        t.start()
    deadline = time.time() + 5
    while s.commands.qsize() < 2 and time.time() < deadline:
        time.sleep(0.01)
    s.commands.put(sched.Command("close"))  # queued behind them: one pass takes all three
    hold.set()
    for t in callers:
        t.join(timeout=30)
    s.thread.join(timeout=10)
    for name in ("submit", "step"):
        message, waited = outcomes[name]
        assert message == "RuntimeError: the engine shut down" and waited < 10, (name, message)
    assert s.closed and not s.thread.is_alive()
    with pytest.raises(RuntimeError, match="shut down"):
        s.submit(PROMPTS[0], params(5))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread re-raises
def test_a_shutdown_that_raises_still_closes_and_ends_every_generation(tiny_target, monkeypatch):
    """A fault outside any generation ends them all (Scheduler._shutdown); when releasing a slot raises too, the
    thread goes, but closed is set and every generation, running or waiting, hears its end."""
    s = make(tiny_target, slots=1)
    try:
        running = s.submit(PROMPTS[0], params(40), manual=True)  # holds the slot until stepped
        s.step(running.id)
        waiting = s.submit(PROMPTS[1], params(40))
        assert drain_until_place(waiting, 1)
        real_release = s.engine.release
        monkeypatch.setattr(s.engine, "release", lambda seq: {}["release failed"])
        monkeypatch.setattr(s, "_park_idle", lambda: {}["a fault outside any generation"])
        s.stop(999)  # any command wakes the thread for a pass
        s.thread.join(timeout=10)
        assert not s.thread.is_alive() and s.closed
        for gen in (running, waiting):
            last = take_all(gen)[-1]
            assert isinstance(last, ErrorEvent) and "KeyError" in last.message
        with pytest.raises(RuntimeError, match="shut down"):
            s.submit(PROMPTS[2], params(5))
        monkeypatch.setattr(s.engine, "release", real_release)
    finally:
        s.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread re-raises
def test_a_close_whose_release_raises_still_ends_everyone(tiny_target, monkeypatch):
    s = make(tiny_target, slots=1)
    running = s.submit(PROMPTS[0], params(40), manual=True)
    s.step(running.id)
    waiting = s.submit(PROMPTS[1], params(40))
    assert drain_until_place(waiting, 1)
    monkeypatch.setattr(s.engine, "release", lambda seq: {}["release failed"])
    s.close()
    assert s.closed and not s.thread.is_alive()
    for gen in (running, waiting):
        last = take_all(gen)[-1]
        assert isinstance(last, ErrorEvent) and "shut down" in last.message
