"""The real app under load: python app.py on a tiny target with 2 slots, driven by many sessions at once.

Eight sessions share the 2 slots (temperature 0 and 0.7 answers), one cancels its answer, one closes its tab
mid-answer, one steps, one presses Stop, and refused requests come from their own sessions meanwhile. Checked:
requests queue instead of bouncing, none hangs, every temperature-0 answer is lossless, bad input gets a clear
message and starts nothing, nobody else suffers, and a fresh session afterwards is served.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from functools import partial

import pytest

from loadclient import (connect, free_port, has_tokens, lossless, run_bad, run_cancel, run_close_tab, run_regular,
                        run_step, run_stop, serving, started_nothing, stop_reason)
from tiny import save_tiny

SLOTS = 2
MAX_NEW = 24
N_CTX = 2048  # room for a long answer that a slow Stop lets run on, beside the others' short ones
LONG = 1000  # answers that are still streaming when they are cancelled, closed or stopped
START_TIMEOUT_S = 180  # imports and calibration on a busy 2-core machine
ANSWER_TIMEOUT_S = 90  # one session, queue wait included: past it the session counts as hung
PHASE_TIMEOUT_S = 150  # every session of the load phase
TOO_LONG = " ".join(["w7"] * 2100)  # more tokens than the cache's cells and the tiny model's 1024 positions
REGULAR = [("w10 w11 w12 w13 w10 w11 w12 w13 w10 w11", 0.0), ("w20 w21 w22 w20 w21 w22 w20", 0.7),
           ("w30 w31 w32 w33 w34 w30 w31 w32", 0.0), ("w40 w41 w40 w41 w40 w41 w40", 0.7)]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("load")
    target = save_tiny(root / "target", seed=0)
    port = free_port()
    log = root / "app.log"
    args = ["--target", str(target), "--port", str(port), "--parallel", str(SLOTS), "--n-ctx", str(N_CTX),
            "--exempt-loopback"]  # the sessions play the operator's own tabs, many at once
    yield from serving(args, log, START_TIMEOUT_S)


def load_phase(api) -> tuple[list, dict]:
    """Every session at once (they meet at a barrier, then submit together); returns (outcomes, bad ones by label)."""
    bad = {
        "empty": dict(text="   "),
        "n_min > n_max": dict(text="w1 w2 w3", n_max=2, n_min=4),
        "too long": dict(text=TOO_LONG),
        "unknown drafter": dict(text="w1 w2 w3", types=["ngram-simple", "no-such-drafter"]),
        "slider out of range": dict(text="w1 w2 w3", max_new_tokens=5000),
    }
    jobs = [(run_regular, (api, p, t, MAX_NEW, ANSWER_TIMEOUT_S)) for p, t in REGULAR]
    jobs += [(run_cancel, (api, "w50 w51 w52 w50 w51 w52", 0.0, LONG, ANSWER_TIMEOUT_S)),
             (run_close_tab, (api, "w53 w54 w55 w53 w54 w55", 0.7, LONG, ANSWER_TIMEOUT_S)),
             # plain decoding, a token a round, so the answer still streams when Stop arrives (drafting 6
             # tokens a round on this copy prompt, the tiny model can end all 1000 before it)
             (partial(run_stop, types=[]), (api, "w56 w57 w58 w56 w57 w58", LONG, ANSWER_TIMEOUT_S)),
             (run_step, (api, "w60 w61 w62 w60 w61 w62", 3, ANSWER_TIMEOUT_S))]
    start = threading.Barrier(len(jobs) + len(bad), timeout=120)
    with ThreadPoolExecutor(len(jobs) + len(bad)) as pool:
        futures = [pool.submit(fn, *args, start=start) for fn, args in jobs]
        bad_futures = {label: pool.submit(run_bad, api, label, kw.pop("text"), ANSWER_TIMEOUT_S, start=start, **kw)
                       for label, kw in bad.items()}
        done, pending = wait(futures + list(bad_futures.values()), timeout=PHASE_TIMEOUT_S)
        assert not pending, f"{len(pending)} sessions still running after {PHASE_TIMEOUT_S} s"
    outcomes = []
    for f in futures:
        result = f.result()
        outcomes += result if isinstance(result, list) else [result]
    return outcomes, {label: f.result() for label, f in bad_futures.items()}


def describe(o) -> str:
    return (f"{o.role} t={o.temp} finished={o.finished} hung={o.hung} error={o.error!r} queued={o.waited} "
            f"stop={stop_reason(o.summary)!r} notice={o.notice[:160]!r} summary={o.summary[-300:]!r}")


def test_many_sessions_queue_and_stay_lossless(app):
    url, proc, log = app
    api = connect(url)
    t0 = time.monotonic()
    outcomes, bad = load_phase(api)
    by_role = {}
    for o in outcomes:
        by_role.setdefault(o.role, []).append(o)
    report = "\n".join(describe(o) for o in outcomes)

    assert not [o for o in outcomes if o.hung], f"hung sessions:\n{report}"
    for o in by_role["regular"] + by_role["follow-up"]:
        assert o.answered, f"no full answer with its comparison:\n{describe(o)}"
        if o.temp == 0:
            assert lossless(o.summary), f"temperature 0 must be lossless:\n{describe(o)}"
    # more sessions than slots and every one served: they waited in line instead of being turned away
    assert not [o for o in outcomes if "busy" in o.notice], f"a request was turned away:\n{report}"

    cancel, = by_role["cancel"]
    assert cancel.finished and cancel.ttft is not None, describe(cancel)
    tab, = by_role["close-tab"]
    assert tab.finished and not tab.error, describe(tab)
    stop, = by_role["stop"]
    assert stop.finished and stop_reason(stop.summary) == "stopped", describe(stop)
    assert stop.tokens < LONG and "compare" not in stop.summary, describe(stop)
    step, = by_role["step"]
    assert step.finished and has_tokens(step.chat) and "step mode" in step.summary, describe(step)

    expected = {"empty": ("notice-warn", "Type a message first"),
                "n_min > n_max": ("notice-warn", "n_min (4) must not exceed n_max (2)"),
                # refused by its length before it is tokenized (ui/turns.py check_length): bad input, a warning
                "too long": ("notice-warn", "more than the model&#x27;s context can hold")}
    for label, (level, text) in expected.items():
        o = bad[label]
        assert o.finished and not o.error and level in o.notice and text in o.notice, f"{label}: {describe(o)}"
        assert started_nothing(o.chat, o.summary), f"{label} started a generation: {describe(o)}"
    # the sidebar offers only known drafters and a bounded slider: Gradio refuses other values with an error
    assert "not in the list of choices" in bad["unknown drafter"].error, describe(bad["unknown drafter"])
    assert "greater than maximum value 1024" in bad["slider out of range"].error, describe(bad["slider out of range"])

    assert proc.poll() is None, f"the app exited:\n{log.read_text()[-3000:]}"
    # as many fresh sessions as slots, at once: none waits, so no slot was left held by the load
    start = threading.Barrier(SLOTS, timeout=60)
    with ThreadPoolExecutor(SLOTS) as pool:
        fresh = list(pool.map(lambda p: run_regular(api, p, 0.0, MAX_NEW, ANSWER_TIMEOUT_S, start, role="fresh"),
                              ["w1 w2 w3 w4 w1 w2 w3 w4", "w5 w6 w7 w5 w6 w7 w5"]))
    for o in fresh:
        assert o.answered and lossless(o.summary) and not o.waited, describe(o)
    waited = sum(o.waited for o in outcomes)
    print(f"\nload phase: {len(outcomes)} turns on {SLOTS} slots, {waited} queued for a slot, "
          f"{time.monotonic() - t0:.1f} s\n{report}")
