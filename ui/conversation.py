"""What a session tells its user in words: the conversation a turn sends (its oldest turns dropped where it
does not fit the context, and the note that says so) and the place in line of an answer waiting for a slot."""

from __future__ import annotations

from ui.state import SessionState


def fit_conversation(encode, session: SessionState, text: str, room: int, limit: int | None) -> tuple[list[int], int]:
    """(the prompt's token ids, turns left out): the conversation with the fewest of its oldest turns dropped, a
    user message and its answer at a time, for the prompt and `room` answer tokens to fit `limit` (llama-server
    drops the oldest tokens of a slot's context the same way). The new message itself is always kept. Fewer
    turns never make a longer prompt, so the number to drop is found by bisection: at most 2 + log2(turns)
    encodings of the conversation, not one per dropped turn."""
    history, message = session.history, [{"role": "user", "content": text}]
    n_turns = len(history) // 2
    prompts: dict[int, list[int]] = {}

    def fits(k: int) -> bool:
        prompts[k] = encode(history[2 * k:] + message)
        return len(prompts[k]) + room <= limit

    if limit is None or fits(0) or n_turns == 0:
        return prompts.get(0) or encode(history + message), 0
    lo, hi = 1, n_turns  # the answer lies in [lo, hi]; dropping every turn is kept even if it does not fit
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return prompts.get(lo) or encode(history[2 * lo:] + message), lo


def forget_turns(session: SessionState, dropped: int) -> None:
    """Remove the turns a prompt left out from the stored conversation and its page: a later prompt, as long
    or longer, could not take them back, and a long chat would otherwise keep every turn for good."""
    if dropped:
        del session.history[:2 * dropped]
        del session.turns_html[:2 * dropped]
        session.forgotten_turns += dropped


def dropped_note(session: SessionState) -> str:
    n = session.dropped_turns
    if not n:
        return ""
    return (f"The conversation is longer than the context: its {n} oldest turn{'s' if n > 1 else ''} "
            f"{'are' if n > 1 else 'is'} left out of this prompt and the ones after it.")


def forgotten_html(session: SessionState) -> str:
    """The chat's first line once turns were left out for good ("" before)."""
    n = session.forgotten_turns
    if not n:
        return ""
    return (f'<div class="chat-forgotten muted">{n} earlier turn{"s" if n > 1 else ""} no longer fit the '
            f'context: left out of the conversation the model sees.</div>')


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
