"""What a browser session does with the engine: submit, read events round by round, stop, step, compare.

No Gradio here: the functions change a SessionState and the caller (ui.app) renders views from it, so the
flow is testable without a browser. Bad input raises UserError with the message to show.
"""

from __future__ import annotations

import queue
import time
from dataclasses import replace
from typing import Iterator

from engine import ErrorEvent, WaitEvent
from ui.formatcheck import format_html
from ui.advisor import advice_html, advise
from ui.compare import verdict_html
from ui.lesson import explain
from ui.render import user_bubble
from ui.run import RunRecord
from ui.conversation import dropped_note, fit_conversation, forget_turns, wait_text
from ui.settings import Settings
from ui.state import Active, AppState, SessionState
from ui.turns import UserError, check_length, close_turn, give_share, open_turn

POLL_S = 0.5  # how long a reader waits for an event before checking that its scheduler still runs
STOP_WAIT_S = 5.0  # how long Stop waits for the engine thread to deliver a step-mode answer's last event
REFRESH_S = 0.3  # the page is updated at most this often while an answer streams
WAIT_REFRESH_S = 1.0  # and this often while it waits in line (its place moves)
COMPARE_REFRESH_S = 1.0  # progress refresh while a run of the comparison runs
# while a comparison run is timed the web thread takes the rounds that came at most this often: each wake takes
# the GIL from the engine thread (docs/history.md#the-pages-speedup-against-the-benchs)
COMPARE_GATHER_S = 0.1
# a pause before each timed run of the comparison, so the browser's drawing on the same cores stays out of it
# (docs/history.md#the-pages-speedup-against-the-benchs)
COMPARE_SETTLE_S = 0.5


def submit(app: AppState, session: SessionState, text: str, settings: Settings, manual: bool = False,
           speculative: bool = True, prompt_ids: list[int] | None = None, shown: bool = True,
           purpose: str = "chat") -> Active:
    """Start a generation for this session in a free slot of the shared scheduler; a comparison's runs are
    submitted with purpose "compare", counted apart from the answers (engine/serve/metrics.py)."""
    runtime = app.runtime
    if runtime is None:
        raise UserError("No model is loaded: load a target model first.", "error")
    try:
        params = settings.gen_params(speculative=speculative, explain=shown)
    except ValueError as e:
        raise UserError(f"Invalid settings: {e}") from e
    from engine import QueueFull

    # this tab reuses its own earlier turns' cells, never another visitor's (unless the host shares them)
    params.cache_salt = None if app.options.share_prefix_cache else session.salt()
    params.client = session.visitor or None  # its grammars compile and are kept in this visitor's partition

    if prompt_ids is None:
        limit = getattr(runtime.engine, "prompt_limit", None)
        ids, dropped = fit_conversation(runtime.target.encode_chat, session, text, settings.max_new_tokens, limit)
        session.dropped_turns = dropped
        forget_turns(session, dropped)
    else:
        ids = prompt_ids
    try:
        gen = runtime.scheduler.submit(ids, params, manual=manual, purpose=purpose)
    except ValueError as e:  # the engine refused the request (prompt too long, drafter needs a draft model...)
        raise UserError(f"Cannot start: {e}", "error") from e
    except QueueFull as e:  # every slot busy and the queue full, or the engine thread did not answer in time
        raise UserError(f"The engine is busy: {e}", "error") from e
    except RuntimeError as e:  # the engine is being replaced, or the request broke something it checks
        raise UserError(f"Cannot start: {e}", "error") from e
    run = RunRecord(vocab=runtime.vocab, prompt_ids=list(ids), manual=manual, shown=shown)
    return Active(scheduler=runtime.scheduler, gen=gen, run=run, manual=manual)


def start_turn(app: AppState, session: SessionState, text: str, settings: Settings, manual: bool) -> Active:
    """Validate the message and submit the speculative run of a new turn."""
    text = (text or "").strip()
    if not text:
        raise UserError("Type a message first (the message box is empty).")
    check_length(app, text)
    open_turn(app, session)
    try:
        active = submit(app, session, text, settings, manual=manual)
    except BaseException:
        close_turn(app, session)
        raise
    session.turn_open = not manual  # a step-mode turn is its generation: busy while that runs
    session.active, session.run, session.plain = active, active.run, None
    session.pending_user, session.compare_html, session.seq_stats = text, "", {}
    session.format_html, session.format_spec = "", settings.grammar()
    session.notice = (dropped_note(session), "warn") if session.dropped_turns else ("", "info")
    return active


def read_events(active: Active, timeout: float, gather_s: float = 0.0) -> list:
    """Events that arrived: wait up to `timeout` for the first, then take whatever else is queued, so a slow
    page merges rounds instead of falling behind the engine. A place in line ends the batch: it is shown alone.
    gather_s: after the first, wait this long for more rounds before taking them (one wake-up for several)."""
    out = []
    events = active.gen.events
    try:
        out.append(events.get(timeout=timeout) if timeout > 0 else events.get_nowait())
        if gather_s > 0 and not out[-1].done and not isinstance(out[-1], WaitEvent):
            time.sleep(gather_s)
        while not out[-1].done and not isinstance(out[-1], WaitEvent):
            out.append(events.get_nowait())
    except queue.Empty:
        pass
    return out


def take(session: SessionState, active: Active, events: list) -> None:
    """Apply events to the run; at the last one keep the engine's counters of it."""
    now = time.perf_counter()
    for ev in events:
        if isinstance(ev, WaitEvent):
            session.notice = (wait_text(ev.position, active.manual, active.run is not session.run), "info")
            continue
        if isinstance(ev, ErrorEvent):  # the engine ended this generation and already released its slot
            active.run.fail(ev.message)
            session.notice = (ev.message, "error")
        else:
            if ev.kind == "prefill":
                shown = active.run is session.run  # the comparison's run adds its notes, if any, and no more
                notes = [n for n in [*ev.notes, dropped_note(session) if shown else ""] if n]
                if notes or shown:
                    session.notice = (" ".join(notes), "warn") if notes else ("", "info")
            active.run.add(ev, now)
        if ev.done:
            close_active(session, active)


def close_active(session: SessionState, active: Active) -> None:
    if active.finished:
        return
    if active.run is session.run:  # the counters of the shown run, as the engine thread last copied them
        session.seq_stats = active.gen.stats
    active.finished = True


def scheduler_gone(active: Active) -> bool:
    return bool(getattr(active.scheduler, "closed", False))


def follow(session: SessionState, active: Active, gather_s: float = 0.0) -> Iterator[None]:
    """Yield after each batch of events until the generation ends (its done event, or its scheduler closed).

    Updates are sent at most every REFRESH_S: the browser shares the CPU with the engine, and re-rendering the
    page on every round would slow the very decoding it shows. Every round still appears, a few at a time."""
    due, unshown, placed = 0.0, False, False
    while not active.finished:
        events = read_events(active, POLL_S, gather_s)
        if events:
            take(session, active, events)
            waiting = isinstance(events[-1], WaitEvent)
            unshown = True
            # the first place in line at once; later moves of the line at most every WAIT_REFRESH_S, since
            # forty sessions in line each hear every move and their updates share the cores with the answers
            urgent = active.finished or active.manual or (waiting and not placed)
            placed = waiting
            if urgent or time.perf_counter() >= due:
                due = time.perf_counter() + (WAIT_REFRESH_S if waiting else REFRESH_S)
                unshown = False
                yield
        elif unshown and time.perf_counter() >= due:  # the last update of a quiet spell is not held back
            unshown = False
            yield
        elif scheduler_gone(active):
            active.run.fail("the model was replaced while this answer was generating")
            active.finished = True
            yield


def end_turn(session: SessionState) -> None:
    """Move the finished turn into the history (the partial text too, if it was stopped)."""
    run = session.run
    if run is None or not session.pending_user:
        return
    text = run.vocab.tokenizer.decode(run.ids, skip_special_tokens=True)  # the model that wrote it, even if replaced
    session.history += [{"role": "user", "content": session.pending_user}, {"role": "assistant", "content": text}]
    session.turns_html += [user_bubble(session.pending_user), run.answer_html(live=False)]
    session.pending_user = ""


def check_format(session: SessionState) -> None:
    """Under an output format, say whether the finished answer parses and follows it (before the comparison,
    which takes as long again)."""
    run, spec = session.run, session.format_spec
    if run is None or spec is None or run.error is not None:
        return
    text = run.vocab.tokenizer.decode(run.ids, skip_special_tokens=True)
    session.format_html = format_html(text, spec.kind, spec.text, run.stop_reason, run.format_complete)


def compare(app: AppState, session: SessionState, settings: Settings) -> Iterator[None]:
    """Plain decoding of the same prompt with the same seed, then the speculative run once more: the speedup
    and the lossless check. The answer streamed to a page that drew every round, and the browser took the same
    cores; the two runs of the ratio both run with the page showing a progress line only, so the ratio is the
    prompt's, not the page's."""
    run = session.run
    plain = yield from measure(app, session, settings, speculative=False, what="plain decoding")
    if plain is None or plain.stop_reason == "stopped" or plain.error is not None:
        session.compare_html = '<div class="compare muted">comparison stopped</div>' if plain is not None else ""
        yield
        return
    quiet = yield from measure(app, session, settings, speculative=True, what="the speculative run, unseen")
    timed = quiet if quiet is not None and quiet.done and quiet.error is None and quiet.ids == run.ids else None
    session.advice = advise(timed or run, plain, app.runtime.roofline if app.runtime is not None else None)
    session.explained = explain(timed or run, plain)  # the formula tab's point (ui/formula_play.py)
    checked = app.runtime is not None and app.runtime.lossless_checked()
    session.compare_base = verdict_html(run, timed, plain, sampled=settings.temp > 0 and run.used_rejection(),
                                        checked=checked)
    session.compare_html = session.compare_base + advice_html(session.advice)
    yield


def measure(app: AppState, session: SessionState, settings: Settings, speculative: bool,
            what: str) -> Iterator[None]:
    """One run of the comparison, the page showing its progress only; returns its record (None: not started).
    Each run starts COMPARE_SETTLE_S after the page was told what is being timed, so the browser's drawing of
    that (and, before the first, of the answer's final charts) does not land in a timed run: a copying answer's
    speculative run lasts a quarter of a second, and a redraw at its start read as a fifth of its speed."""
    run = session.run
    session.compare_html = f'<div class="compare muted">timing {what} for the comparison…</div>'
    yield
    time.sleep(COMPARE_SETTLE_S)
    try:
        active = submit(app, session, "", settings, speculative=speculative, prompt_ids=run.prompt_ids,
                        shown=False, purpose="compare")
    except UserError as e:
        session.compare_html = ""
        session.notice = (f"Comparison skipped: {e}", "warn")
        return None
    session.active = active
    if not speculative:
        session.plain = active.run
    due = time.perf_counter() + COMPARE_REFRESH_S  # the page was just told; the next word a second in
    for _ in follow(session, active, COMPARE_GATHER_S):
        if time.perf_counter() >= due or active.finished:
            due = time.perf_counter() + COMPARE_REFRESH_S
            session.compare_html = (f'<div class="compare muted">timing {what} for the comparison… '
                                    f'{len(active.run.ids)}/{len(run.ids)} tokens</div>')
            yield
    return active.run


def stop(session: SessionState) -> None:
    """Ask the engine to stop this session's generation; its next event is done with stop_reason 'stopped'."""
    active = session.active
    if active is None or active.finished:
        return
    active.scheduler.stop(active.gen.id)  # a command: the next round boundary delivers the stop
    if active.manual:  # the engine thread delivers a step-mode stop at once: show it
        deadline = time.perf_counter() + STOP_WAIT_S
        while not active.finished and time.perf_counter() < deadline:
            take(session, active, read_events(active, POLL_S))


def step(session: SessionState) -> None:
    """Step mode: one round for this session's generation."""
    active = session.active
    if active is None or active.finished or not active.manual:
        raise UserError("Step mode: tick 'Step mode' and send a message first; each Step runs one round.")
    try:
        active.scheduler.step(active.gen.id)
    except (ValueError, RuntimeError) as e:
        raise UserError(f"Step failed: {e}", "error") from e
    take(session, active, read_events(active, 0))


def converse(app: AppState, session: SessionState, text: str, settings: Settings, manual: bool) -> Iterator[None]:
    """A chat turn: the speculative answer round by round, then (optionally) the plain run to compare.
    Yields whenever the views should be refreshed. In step mode it only submits; Step does the rounds."""
    active = start_turn(app, session, text, settings, manual)
    if manual:
        session.notice = ("Step mode: press Step to run one round at a time (Stop ends the answer). Idle for a "
                          "minute while others wait, it lends its slot and takes one back at the next Step.", "info")
        yield
        return
    try:
        yield
        for _ in follow(session, active):
            yield
        end_turn(session)
        check_format(session)
        yield
        run = session.run
        if settings.compare and settings.types and run.error is None and run.stop_reason != "stopped":
            yield from compare(app, session, settings)
    finally:  # the page went away mid-answer: do not leave the slot busy
        close_turn(app, session)


def advice_turn(app: AppState, session: SessionState, settings: Settings) -> Iterator[None]:
    """The last answer's prompt once more with the advised chain (ui/advisor.py), unseen and timed as the
    comparison's runs are: its speedup over the same plain run, beside the prediction."""
    advice, plain = session.advice, session.plain
    if advice is None or advice.drafter is None or plain is None or not plain.tps:
        raise UserError("No advice to try: send a message with 'Compare with plain decoding' on first.")
    open_turn(app, session)
    try:
        tried = replace(settings, types=[advice.drafter], n_max=advice.n_max, n_min=0, tree_nodes=0,
                        adaptive=False, compare=False)
        run = yield from measure(app, session, tried, speculative=True, what="the advised setting")
        measured = run.tps / plain.tps if run is not None and run.done and run.tps else None
        session.compare_html = session.compare_base + advice_html(advice, measured)
        yield
    finally:
        close_turn(app, session)


def step_turn(app: AppState, session: SessionState) -> None:
    """One Step click: a round, and the turn's end when it was the last."""
    step(session)
    if session.active is not None and session.active.finished:
        end_turn(session)
        check_format(session)
        give_share(app, session)


def stop_turn(app: AppState, session: SessionState) -> None:
    """The Stop button: a streaming answer ends through its reader; a step-mode answer ends here."""
    stop(session)
    if session.active is not None and session.active.manual and session.active.finished:
        end_turn(session)
        check_format(session)
        give_share(app, session)
