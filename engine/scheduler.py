"""A background loop that runs engine rounds for every submitted generation (llama-server's update_slots).

Many callers (browser sessions, benchmark clients) submit generations; one thread owns the engine and runs
`step()` while any slot is generating, so concurrent users share each forward instead of queueing. Each
generation gets its own queue of RoundEvents. A generation in manual mode (the UI's step mode) is advanced
only by `step_once(seq)`. An exception in a round ends the affected generations with an error event and the
loop goes on serving the others.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

from engine.events import RoundEvent
from engine.params import GenParams
from engine.slots import Engine


@dataclass
class ErrorEvent:
    seq: int
    message: str  # one line for the user
    done: bool = True


class Scheduler:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.lock = threading.RLock()  # held while the engine is touched
        self.queues: dict[int, queue.Queue] = {}  # seq -> events for its caller
        self.manual: set[int] = set()  # seqs advanced only by step_once
        self.wake = threading.Event()
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name="engine-rounds", daemon=True)
        self.thread.start()

    def submit(self, prompt: list[int], params: GenParams, manual: bool = False) -> tuple[int, queue.Queue]:
        """Start a generation in a free slot. Raises ValueError / RuntimeError with a user-facing message."""
        with self.lock:
            seq = self._free_seq()
            self.engine.start(prompt, params, seq=seq)
            q: queue.Queue = queue.Queue()
            self.queues[seq] = q
            if manual:
                self.manual.add(seq)
            else:
                self.manual.discard(seq)
        self.wake.set()
        return seq, q

    def _free_seq(self) -> int:
        for seq in range(self.engine.ctx.n_seq_max):
            slot = self.engine.slots.get(seq)
            if seq not in self.queues and (slot is None or slot.state == "done"):
                return seq
        raise RuntimeError(f"all {self.engine.ctx.n_seq_max} slots are busy; try again in a moment")

    def stop(self, seq: int) -> None:
        with self.lock:
            self.engine.stop(seq)
        self.wake.set()

    def finish(self, seq: int) -> None:
        """The caller is done reading: the slot becomes free (its cells stay for prefix reuse)."""
        with self.lock:
            self.queues.pop(seq, None)
            self.manual.discard(seq)

    def step_once(self, seq: int) -> list[RoundEvent]:
        """Advance one manual generation by one round (step mode)."""
        with self.lock:
            events = self._run({seq})
        return events

    def _run(self, only: set[int] | None) -> list[RoundEvent]:
        try:
            events = self.engine.step(only)
        except (RuntimeError, ValueError, IndexError) as e:
            return self._fail(only, e)
        for ev in events:
            q = self.queues.get(ev.seq)
            if q is not None:
                q.put(ev)
        return events

    def _fail(self, only: set[int] | None, error: Exception) -> list:
        out = []
        for slot in self.engine.active(only):
            self.engine.release(slot.seq)
            ev = ErrorEvent(seq=slot.seq, message=f"generation failed: {error}")
            q = self.queues.get(slot.seq)
            if q is not None:
                q.put(ev)
            out.append(ev)
        return out

    def _loop(self) -> None:
        while not self.closed:
            with self.lock:
                auto = {s.seq for s in self.engine.active() if s.seq not in self.manual and s.seq in self.queues}
                if auto:
                    self._run(auto)
            if not auto:
                self.wake.wait(timeout=0.5)
                self.wake.clear()

    def close(self) -> None:
        self.closed = True
        self.wake.set()
        self.thread.join(timeout=5)
