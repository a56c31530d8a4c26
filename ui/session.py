"""What a browser session does with the engine: submit, read events round by round, stop, step, compare.

No Gradio here: the functions change a SessionState and the caller (ui.app) renders views from it, so the
flow is testable without a browser. Bad input raises UserError with the message to show.
"""

from __future__ import annotations

import copy
import queue
import time
from typing import Iterator

from engine.events import ErrorEvent
from ui.render import compare_html, user_bubble
from ui.run import RunRecord
from ui.settings import Settings
from ui.state import Active, AppState, SessionState

POLL_S = 0.5  # how long a reader waits for an event before checking that its scheduler still runs
REFRESH_S = 0.3  # the page is updated at most this often while an answer streams
COMPARE_REFRESH_S = 0.5  # progress refresh while the plain run of the comparison runs


class UserError(Exception):
    """A message for the user; `level` is 'warn' (bad input) or 'error' (the engine refused)."""

    def __init__(self, message: str, level: str = "warn"):
        super().__init__(message)
        self.level = level


def messages_for(session: SessionState, text: str) -> list[dict]:
    return session.history + [{"role": "user", "content": text}]


def submit(app: AppState, session: SessionState, text: str, settings: Settings, manual: bool = False,
           speculative: bool = True, prompt_ids: list[int] | None = None) -> Active:
    """Start a generation for this session in a free slot of the shared scheduler."""
    runtime = app.runtime
    if runtime is None:
        raise UserError("No model is loaded: load a target model first.", "error")
    try:
        params = settings.gen_params(speculative=speculative)
    except ValueError as e:
        raise UserError(f"Invalid settings: {e}") from e
    ids = prompt_ids if prompt_ids is not None else runtime.target.encode_chat(messages_for(session, text))
    try:
        seq, events = runtime.scheduler.submit(ids, params, manual=manual)
    except RuntimeError as e:  # every slot is taken by other sessions
        raise UserError(f"The engine is busy: {e}. Other sessions are generating.", "error") from e
    except ValueError as e:  # the engine refused the request (prompt too long, drafter needs a draft model...)
        raise UserError(f"Cannot start: {e}", "error") from e
    run = RunRecord(vocab=runtime.vocab, prompt_ids=list(ids), manual=manual)
    return Active(scheduler=runtime.scheduler, seq=seq, queue=events, run=run, manual=manual)


def start_turn(app: AppState, session: SessionState, text: str, settings: Settings, manual: bool) -> Active:
    """Validate the message and submit the speculative run of a new turn."""
    text = (text or "").strip()
    if not text:
        raise UserError("Type a message first (the message box is empty).")
    if session.busy:
        raise UserError("This session is still generating: press Stop (or finish the steps) first.")
    active = submit(app, session, text, settings, manual=manual)
    session.active, session.run, session.plain = active, active.run, None
    session.pending_user, session.compare_html, session.seq_stats = text, "", {}
    session.notice = ("", "info")
    return active


def read_events(active: Active, timeout: float) -> list:
    """Events that arrived: wait up to `timeout` for the first, then take whatever else is queued, so a slow
    page merges rounds instead of falling behind the engine."""
    out = []
    try:
        out.append(active.queue.get(timeout=timeout) if timeout > 0 else active.queue.get_nowait())
        while not out[-1].done:
            out.append(active.queue.get_nowait())
    except queue.Empty:
        pass
    return out


def take(session: SessionState, active: Active, events: list) -> None:
    """Apply events to the run; at the last one snapshot the engine's counters and free the slot."""
    now = time.perf_counter()
    for ev in events:
        if isinstance(ev, ErrorEvent):  # the engine failed this generation and already released it
            active.run.fail(ev.message)
            session.notice = (ev.message, "error")
        else:
            active.run.add(ev, now)
        if ev.done:
            close_active(session, active)


def close_active(session: SessionState, active: Active) -> None:
    if active.finished:
        return
    if active.run is session.run:  # the counters of the shown run; the slot is ours until finish()
        stats = active.scheduler.engine.chain.seq_stats.get(active.seq, {})
        session.seq_stats = copy.deepcopy(stats)
    active.scheduler.finish(active.seq)
    active.finished = True


def scheduler_gone(active: Active) -> bool:
    return bool(getattr(active.scheduler, "closed", False))


def follow(session: SessionState, active: Active) -> Iterator[None]:
    """Yield after each batch of events until the generation ends (its done event, or its scheduler closed).

    Updates are sent at most every REFRESH_S: the browser shares the CPU with the engine, and re-rendering the
    page on every round would slow the very decoding it shows. Every round still appears, a few at a time."""
    due = 0.0
    while not active.finished:
        events = read_events(active, POLL_S)
        if events:
            take(session, active, events)
            if active.finished or active.manual or time.perf_counter() >= due:
                due = time.perf_counter() + REFRESH_S
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


def compare(app: AppState, session: SessionState, settings: Settings) -> Iterator[None]:
    """Plain decoding of the same prompt with the same seed: speedup and the lossless check."""
    run = session.run
    try:
        active = submit(app, session, "", settings, speculative=False, prompt_ids=run.prompt_ids)
    except UserError as e:
        session.compare_html = ""
        session.notice = (f"Comparison skipped: {e}", "warn")
        return
    session.active, session.plain = active, active.run
    session.compare_html = '<div class="compare muted">running plain decoding for the comparison…</div>'
    due = 0.0
    for _ in follow(session, active):
        if time.perf_counter() >= due or active.finished:
            due = time.perf_counter() + COMPARE_REFRESH_S
            n = len(active.run.ids)
            session.compare_html = (f'<div class="compare muted">running plain decoding for the comparison… '
                                    f'{n}/{len(run.ids)} tokens</div>')
            yield
    plain = active.run
    if plain.stop_reason != "stopped" and plain.error is None:
        sampled = settings.temp > 0 and run.used_rejection()
        session.compare_html = compare_html(run.ids, plain.ids, run.tps, plain.tps, run.vocab, sampled=sampled)
    else:
        session.compare_html = '<div class="compare muted">comparison stopped</div>'
    yield


def stop(session: SessionState) -> None:
    """Ask the engine to stop this session's generation; its next event is done with stop_reason 'stopped'."""
    active = session.active
    if active is None or active.finished:
        return
    active.scheduler.stop(active.seq)  # lock-free: sets the slot's flag, the next round delivers the stop
    if active.manual:  # nobody else advances a step-mode generation: run the round that delivers the stop
        active.scheduler.step_once(active.seq)
        take(session, active, read_events(active, 0))


def step(session: SessionState) -> None:
    """Step mode: one round for this session's generation."""
    active = session.active
    if active is None or active.finished or not active.manual:
        raise UserError("Step mode: tick 'Step mode' and send a message first; each Step runs one round.")
    active.scheduler.step_once(active.seq)
    take(session, active, read_events(active, 0))


def release(session: SessionState) -> None:
    """Free the slot of an abandoned generation (closed tab, cancelled stream): the scheduler stops it and
    frees the slot once it has stopped, with nobody needing to read to the end."""
    active = session.active
    if active is None or active.finished:
        return
    active.scheduler.cancel(active.seq)
    active.finished = True


def converse(app: AppState, session: SessionState, text: str, settings: Settings, manual: bool) -> Iterator[None]:
    """A chat turn: the speculative answer round by round, then (optionally) the plain run to compare.
    Yields whenever the views should be refreshed. In step mode it only submits; Step does the rounds."""
    active = start_turn(app, session, text, settings, manual)
    if manual:
        session.notice = ("Step mode: press Step to run one round at a time (Stop ends the answer).", "info")
        yield
        return
    try:
        yield
        for _ in follow(session, active):
            yield
        end_turn(session)
        yield
        run = session.run
        if settings.compare and settings.types and run.error is None and run.stop_reason != "stopped":
            yield from compare(app, session, settings)
    finally:  # the page went away mid-answer: do not leave the slot busy
        release(session)


def step_turn(app: AppState, session: SessionState) -> None:
    """One Step click: a round, and the turn's end when it was the last."""
    step(session)
    if session.active is not None and session.active.finished:
        end_turn(session)


def stop_turn(app: AppState, session: SessionState) -> None:
    """The Stop button: a streaming answer ends through its reader; a step-mode answer ends here."""
    stop(session)
    if session.active is not None and session.active.manual and session.active.finished:
        end_turn(session)


def counters(session: SessionState) -> dict:
    """The engine's counters for the shown run: a live copy while it generates, the final snapshot after.

    Read without the scheduler lock so the UI never holds up a round; a copy that races a round (a drafter
    added to the dict mid-copy) is skipped and the last good one stays on screen."""
    active = session.active
    if active is not None and not active.finished and active.run is session.run:
        try:
            live = dict(active.scheduler.engine.chain.seq_stats.get(active.seq, {}))
            session.seq_stats = copy.deepcopy(live)
        except RuntimeError:
            pass
    return session.seq_stats
