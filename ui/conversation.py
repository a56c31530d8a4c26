"""What a session tells its user in words: the conversation a turn sends (its oldest turns dropped where it
does not fit the context, and the note that says so) and the place in line of an answer waiting for a slot."""

from __future__ import annotations

from ui.state import SessionState


def fit_conversation(encode, session: SessionState, text: str, room: int, limit: int | None) -> tuple[list[int], int]:
    """(the prompt's token ids, turns left out): the conversation with its oldest turns dropped, a user message
    and its answer at a time, until the prompt and `room` answer tokens fit `limit` (llama-server drops the
    oldest tokens of a slot's context the same way). The new message itself is always kept."""
    history = list(session.history)
    ids = encode(history + [{"role": "user", "content": text}])
    dropped = 0
    while limit is not None and history and len(ids) + room > limit:
        history = history[2:]
        dropped += 1
        ids = encode(history + [{"role": "user", "content": text}])
    return ids, dropped


def dropped_note(session: SessionState) -> str:
    n = session.dropped_turns
    if not n:
        return ""
    return (f"The conversation is longer than the context: its {n} oldest turn{'s' if n > 1 else ''} "
            f"{'are' if n > 1 else 'is'} left out of this prompt.")


def wait_text(position: int, manual: bool, comparing: bool = False) -> str:
    if position == 0:
        return ("Step mode was idle while others waited, so this answer gave its slot to them; the next Step "
                "takes a slot again and goes on where it stopped.")
    then = ("the runs of the speedup comparison start" if comparing else
            "the next round runs" if manual else "the answer starts")
    return f"Waiting for a slot: {ordinal(position)} in line. Other sessions are generating; {then} when one frees."


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
