"""A page turn's claims on the shared engine: the session's one turn at a time, its visitor's share of the
slots and line (page tabs and API requests together, ui/visitors.py), and the bound on a text's length before it
is tokenized. A turn claims them when it opens and gives them back, once, when its answer (and comparison)
ends or its tab goes away.
"""

from __future__ import annotations

from ui.limits import text_bound
from ui.state import AppState, SessionState
from ui.visitors import ShareExceeded


class UserError(Exception):
    """A message for the user; `level` is 'warn' (bad input) or 'error' (the engine refused)."""

    def __init__(self, message: str, level: str = "warn"):
        super().__init__(message)
        self.level = level


def check_length(app: AppState, text: str, what: str = "The message") -> None:
    """Refuse a text longer than the context's tokens could hold, before it is tokenized (ui/limits.py)."""
    bound = text_bound(app.runtime)
    if bound is not None and len(text) > bound:
        raise UserError(f"{what} holds {len(text)} characters: more than the model's context can hold "
                        f"(at most {bound}).")


def open_turn(app: AppState, session: SessionState) -> None:
    """Claim the session's one turn and a place in its visitor's share (page tabs and API requests together);
    UserError when the session is busy or the visitor holds its share already."""
    with app.turn_lock:  # two requests of one session (an example click, two API calls) race for one turn
        if session.busy:
            raise UserError("This session is still generating: press Stop (or finish the steps) first.")
        give_share(app, session)  # a step-mode answer that ended unseen (abandoned) held it
        try:
            app.limits.take(session.visitor)
        except ShareExceeded as e:
            raise UserError(f"Please wait: {e}.", "warn") from None
        session.held_by, session.turn_open = session.visitor, True


def give_share(app: AppState, session: SessionState) -> None:
    """The session's turn no longer counts against its visitor (its answer and comparison ended)."""
    if session.held_by:
        app.limits.give(session.held_by)
        session.held_by = ""


def close_turn(app: AppState, session: SessionState) -> None:
    release(session)
    session.turn_open = False
    give_share(app, session)


def release(session: SessionState) -> None:
    """Free the slot of an abandoned generation (closed tab, cancelled stream), or its place in the queue."""
    active = session.active
    if active is None or active.finished:
        return
    active.scheduler.cancel(active.gen.id)
    active.finished = True
