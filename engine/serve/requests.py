"""What the scheduler's callers and its thread pass each other: a caller's handle on a generation, a request
waiting for a slot, a command for the engine thread, and what a request that cannot wait hears.
"""

from __future__ import annotations

import queue
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from engine.events import ErrorEvent, RoundEvent
from engine.memory.context import ModelContext
from engine.memory.stateful import StatefulContext, has_own_state
from engine.params import GenParams
from engine.round.event_builder import Decision, Emission, SlotRound, build
from engine.round.slot import Slot


def stopped_without_a_slot() -> RoundEvent:
    """The final event of a generation stopped while it had no slot (waiting in line, or parked)."""
    return build(SlotRound(Decision(seq=-1, round=0, kind="plain", drafter=None, pos_sampled=0, p0=0),
                           Emission(done=True, stop_reason="stopped")))


def end_generations(running: dict, parked: dict, waiting, message: str) -> None:
    """Tell every generation, running (seq -> Generation), parked (id -> (Generation, Slot)) or waiting (a deque
    of Requests), that it ended with `message`, and empty the three; touches no engine."""
    for seq, gen in list(running.items()):
        gen.events.put(ErrorEvent(seq=seq, message=message))
    running.clear()
    for gen, _ in list(parked.values()):
        gen.events.put(ErrorEvent(seq=-1, message=message))
    parked.clear()
    while waiting:
        waiting.popleft().gen.events.put(ErrorEvent(seq=-1, message=message))


def refuse(commands: list["Command"], message: str) -> None:
    """Answer the commands that will not run with an error (the engine thread has gone)."""
    for cmd in commands:
        if cmd.reply is not None and not cmd.reply.done():
            cmd.reply.set_exception(RuntimeError(message))


class QueueFull(RuntimeError):
    """Every slot is busy and the wait queue is full."""


@dataclass
class Generation:
    """A caller's handle on one generation: its id and the queue its events arrive on."""

    id: int  # never reused: stop and cancel address this, not a slot
    manual: bool  # step mode: advanced only by Scheduler.step
    purpose: str = "chat"  # what it is for, counted apart (engine/serve/metrics.py PURPOSES)
    events: queue.Queue = field(default_factory=queue.Queue)  # WaitEvent*, RoundEvent*, then done or ErrorEvent
    seq: int | None = None  # the slot, once admitted (None while waiting or parked)
    stats: dict = field(default_factory=dict)  # the slot's drafter counters, a copy refreshed after each round
    t_active: float = 0.0  # time.monotonic() of its admission or last step (step mode's idle clock)


@dataclass
class Request:
    gen: Generation
    prompt: list[int]
    params: GenParams
    place: int = 0  # the place in line last told to the caller (0: not told yet)
    parked: Slot | None = None  # a step-mode slot coming back: resumed, not started
    step_pending: bool = False  # step mode: the user asked for a round while it waited; run it on admission
    group: list["Request"] | None = None  # requests submitted together: admitted together or not at all


@dataclass
class Command:
    kind: str  # "submit" | "stop" | "cancel" | "step" | "call"
    args: Any = None
    reply: Future | None = None


MIN_CELLS_PER_SLOT = 64  # a cache smaller than this per slot could not hold a useful chat in every slot


def check_sizes(n_ctx: int, n_seq_max: int, n_ctx_seq: int | None, threads: int | None) -> None:
    """ValueError naming the setting where the cache, the slots, a slot's share or the threads cannot work."""
    if n_seq_max < 1:
        raise ValueError(f"need at least one slot, got {n_seq_max}")
    if n_ctx < n_seq_max * MIN_CELLS_PER_SLOT:
        raise ValueError(f"a cache of {n_ctx} cells cannot hold {n_seq_max} slots (at least "
                         f"{MIN_CELLS_PER_SLOT} cells each): raise n_ctx to {n_seq_max * MIN_CELLS_PER_SLOT} "
                         f"or use fewer slots")
    if n_ctx_seq is not None and not MIN_CELLS_PER_SLOT <= n_ctx_seq <= n_ctx:
        raise ValueError(f"a slot's share of the cache must be in [{MIN_CELLS_PER_SLOT}, {n_ctx}] cells, "
                         f"got {n_ctx_seq}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")


def check_prompt(prompt: list[int], n_vocab: int, limit: int) -> None:
    """ValueError with the reason where `prompt` is not token ids of this vocabulary that fit `limit` with an
    answer's first token."""
    if not prompt:
        raise ValueError("empty prompt")
    if isinstance(prompt, (str, bytes, dict)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                        for t in prompt):
        raise ValueError(f"a prompt is a list of token ids (int), got {type(prompt).__name__}"
                         + ("" if isinstance(prompt, (str, bytes, dict)) else
                            f" holding {type(next(t for t in prompt if not isinstance(t, int))).__name__}"))
    if min(prompt) < 0 or max(prompt) >= n_vocab:
        raise ValueError(f"prompt token ids must be in [0, {n_vocab}): got {min(prompt)}..{max(prompt)}")
    if len(prompt) + 1 > limit:
        raise ValueError(f"prompt of {len(prompt)} tokens does not fit the context of {limit} tokens")


def make_context(model, n_ctx: int, n_seq_max: int, n_outputs_max: int, n_rs: int = 0):
    """The cell cache for attention models; the model's own per-sequence cache where layers keep a state."""
    if has_own_state(model):
        return StatefulContext(model, n_ctx=n_ctx, n_seq_max=n_seq_max, n_outputs_max=n_outputs_max, n_rs=n_rs)
    return ModelContext(model, n_ctx=n_ctx, n_seq_max=n_seq_max, n_outputs_max=n_outputs_max)
