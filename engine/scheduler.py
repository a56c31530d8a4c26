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
import time
from contextlib import contextmanager

from engine.events import ErrorEvent, RoundEvent
from engine.params import GenParams
from engine.slots import Engine


class Scheduler:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.lock = threading.RLock()  # held while the engine is touched
        self.n_waiting = 0  # callers waiting for the lock: the round loop steps aside for them
        self.count_lock = threading.Lock()  # guards n_waiting
        self.cancelled: set[int] = set()  # seqs whose caller left: freed once their slot stops
        self.queues: dict[int, queue.Queue] = {}  # seq -> events for its caller
        self.manual: set[int] = set()  # seqs advanced only by step_once
        self.wake = threading.Event()
        self.closed = False
        self.thread = threading.Thread(target=self._loop, name="engine-rounds", daemon=True)
        self.thread.start()

    @contextmanager
    def _engine(self):
        """The lock, for callers other than the round loop; the loop yields to them between rounds (a plain
        lock would let the loop take it back at once, and a caller could wait out a whole answer)."""
        with self.count_lock:
            self.n_waiting += 1
        with self.lock:
            with self.count_lock:
                self.n_waiting -= 1
            yield

    def submit(self, prompt: list[int], params: GenParams, manual: bool = False) -> tuple[int, queue.Queue]:
        """Start a generation in a free slot. Raises ValueError / RuntimeError with a user-facing message."""
        with self._engine():
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
        """Ask a generation to stop; lock-free (a flag the next round reads), so Stop answers at once."""
        self.engine.stop(seq)
        self.wake.set()

    def finish(self, seq: int) -> None:
        """The caller is done reading: the slot becomes free (its cells stay for prefix reuse)."""
        with self._engine():
            self.queues.pop(seq, None)
            self.manual.discard(seq)
            self.cancelled.discard(seq)

    def cancel(self, seq: int) -> None:
        """The caller left without reading to the end (a closed tab): stop it and free the slot when it stops."""
        self.engine.stop(seq)
        self.cancelled.add(seq)
        self.manual.discard(seq)
        self.wake.set()

    def step_once(self, seq: int) -> list[RoundEvent]:
        """Advance one manual generation by one round (step mode)."""
        with self._engine():
            events = self._run({seq})
        return events

    def _reap(self) -> None:
        for seq in list(self.cancelled):
            slot = self.engine.slots.get(seq)
            if slot is None or slot.state == "done":
                self.queues.pop(seq, None)
                self.cancelled.discard(seq)

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
                self._reap()
            while self.n_waiting > 0 and not self.closed:
                time.sleep(0.0005)  # let a waiting caller take the lock before the next round
            if not auto:
                self.wake.wait(timeout=0.5)
                self.wake.clear()

    def close(self) -> None:
        self.closed = True
        self.wake.set()
        self.thread.join(timeout=5)
