"""The engine's one owner: a thread that runs every generation, fed by a command queue (llama-server's task queue).

Callers (browser sessions, the Benchmark tab, a model load) never touch the engine. They post commands (submit,
stop, cancel, step, call) and read their generation's events from its own queue; a command that needs an answer
carries a Future that the engine thread completes. Between rounds the thread takes every waiting command, admits
queued requests into free slots in arrival order (llama-server's deferred tasks), and runs one `Engine.step()`
for all generating slots. Stop and cancel name a generation by its id, which is never reused, so a late click
cannot reach a slot that another user has been given since.

A request that finds every slot taken waits in a bounded FIFO and hears its place in line (`WaitEvent`). A
generation in step mode advances only on `step(id)`; when it has not stepped for `step_idle_s` and someone is
waiting, it gives its slot back (`Engine.park`) and takes one again at its next step, its cells reused when
nobody needed them meanwhile. An exception in a round ends the generations it touched
with an `ErrorEvent` (the engine's own isolation ends only the slot at fault, see engine/round/round.py) and the thread
goes on serving the others.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Any, Callable

from engine.events import ErrorEvent, RoundEvent, WaitEvent
from engine.params import GenParams
from engine.round.slot import Slot
from engine.serve.engine import Engine
from engine.serve.placement import seats
from engine.serve.requests import (Command, Generation, QueueFull, Request, end_generations, refuse,
                                   stopped_without_a_slot)
from engine.serve.grammars import GrammarCache
from engine.serve.metrics import CHAT, check_purpose

QUEUE_MAX = 64  # requests that may wait for a slot (llama-server has no bound; a class of 30 needs one)
IDLE_WAIT_S = 1.0  # how long the thread sleeps on an empty command queue when nothing generates
REPLY_TIMEOUT_S = 120.0  # a caller gives up on a command the engine thread has not answered by then
STEP_IDLE_S = 60.0  # a step-mode generation idle this long gives its slot to a waiting request
STEP_ABANDON_S = 900.0  # a step-mode generation unstepped this long is ended: its client left without a word


class Scheduler:
    def __init__(self, engine: Engine, queue_max: int = QUEUE_MAX, step_idle_s: float = STEP_IDLE_S,
                 abandon_s: float = STEP_ABANDON_S,
                 on_event: Callable[[RoundEvent, bool, str], None] | None = None):
        self.engine = engine  # read by callers only for what never changes (its context sizes, its probe)
        # hears every round of every generation (ev, step mode?, purpose) on the engine thread, before its caller
        # does: counters that must see the page's answers and the API's alike (engine/serve/metrics.py)
        self.on_event = on_event
        self.queue_max = queue_max
        self.step_idle_s = step_idle_s
        self.abandon_s = abandon_s
        self.commands: queue.Queue[Command] = queue.Queue()
        self.ids = itertools.count(1)
        self.waiting: deque[Request] = deque()  # FIFO of requests without a slot (engine thread only)
        self.running: dict[int, Generation] = {}  # seq -> its generation (engine thread only)
        self.parked: dict[int, tuple[Generation, Slot]] = {}  # id -> an idle step-mode generation without a slot
        self.closed = False  # set by the engine thread's end (or close() giving up on it), never cleared
        # closed is set and the last commands taken under it, and a command is posted under it only while closed is
        # not set: none is left behind that nobody will answer
        self.post_lock = threading.Lock()
        self.grammars = GrammarCache(engine.grammar_tokenizer)  # compiled on the callers' threads, kept
        self.thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.thread.start()

    # ---- the callers' side: post a command, maybe wait for its answer --------------------------------------

    def _ask(self, kind: str, args: Any = None, timeout: float | None = None) -> Any:
        reply: Future = Future()
        with self.post_lock:
            if self.closed:
                raise RuntimeError("the engine has shut down (a new model was loaded)")
            self.commands.put(Command(kind, args, reply))
        return reply.result(timeout=REPLY_TIMEOUT_S if timeout is None else timeout)

    def submit(self, prompt: list[int], params: GenParams, manual: bool = False, purpose: str = CHAT) -> Generation:
        """Queue a generation. Raises ValueError (bad input, nothing queued) or QueueFull. purpose: what it is
        for (engine/serve/metrics.py PURPOSES): a run that only measures is counted apart from the answers."""
        return self.submit_group([(prompt, params)], manual=manual, purpose=purpose)[0]

    def submit_group(self, requests: list[tuple[list[int], GenParams]], manual: bool = False,
                     purpose: str = CHAT) -> list[Generation]:
        """Several generations admitted together or not at all (a benchmark's N slots start in one round)."""
        check_purpose(purpose)
        for _, params in requests:
            if params.grammar is not None:
                self.grammars.prepare(params.grammar, client=params.client)
        gens = [Generation(id=next(self.ids), manual=manual, purpose=purpose) for _ in requests]
        batch = [Request(g, list(p), params) for g, (p, params) in zip(gens, requests)]
        for r in batch:
            r.group = batch if len(batch) > 1 else None
        try:
            return self._ask("submit", batch)
        except FutureTimeout:
            # the engine thread may still take the submit later: nobody would read or stop that generation
            for g in gens:
                self.cancel(g.id)
            raise QueueFull(f"the engine did not take the request within {REPLY_TIMEOUT_S:.0f} s; try again "
                            "in a minute") from None

    def stop(self, gen_id: int) -> None:
        """End a generation at the next round boundary (its done event says 'stopped'); leaves the queue too."""
        self.commands.put(Command("stop", gen_id))

    def cancel(self, gen_id: int) -> None:
        """The caller left (a closed tab): stop it and send nothing more."""
        self.commands.put(Command("cancel", gen_id))

    def step(self, gen_id: int) -> int:
        """Step mode: one round of this generation; returns the events it produced (also on its queue)."""
        return self._ask("step", gen_id)

    def call(self, fn: Callable[[Engine], Any], timeout: float = 1800.0) -> Any:
        """Run fn(engine) on the engine thread with no generation running: every generation is ended first
        (a model load: `fn` builds the new engine on a quiet machine, so its cost calibration is not disturbed)."""
        return self._ask("call", fn, timeout=timeout)

    def close(self) -> None:
        self.commands.put(Command("close"))
        self.thread.join(timeout=10)
        with self.post_lock:
            self.closed = True

    # ---- the engine thread -----------------------------------------------------------------------------

    def _loop(self) -> None:
        """Serve until a close; however it ends, closed is set, every generation hears its end and every
        command's caller an error, so nobody waits on a thread that has gone."""
        message = "the engine shut down"
        try:
            self._serve()
        except BaseException as e:  # the thread's own end, whatever the type: report it, then end the rest
            message = f"the engine stopped: {type(e).__name__}: {e}"
            raise
        finally:
            with self.post_lock:
                self.closed = True
                late = list(self.commands.queue)
                self.commands.queue.clear()
            end_generations(self.running, self.parked, self.waiting, message)
            refuse(late, message)

    def _serve(self) -> None:
        while True:
            busy = any(not g.manual for g in self.running.values())
            todo = []
            try:  # with nothing to run, sleep on the command queue: no busy wait
                todo.append(self.commands.get_nowait() if busy else self.commands.get(timeout=IDLE_WAIT_S))
            except queue.Empty:
                pass
            while True:
                try:
                    todo.append(self.commands.get_nowait())
                except queue.Empty:
                    break
            if any(cmd.kind == "close" for cmd in todo):
                refuse(todo, "the engine shut down")  # the commands that came with the close
                self._shutdown("the engine shut down")
                return
            try:
                for cmd in todo:
                    self._run_command(cmd)
                self._park_idle()
                self._admit()
                auto = {seq for seq, g in self.running.items() if not g.manual}
                if auto:
                    self._step(auto)
            except Exception as e:  # a fault outside any one generation: end them all, keep serving
                self._shutdown(f"the engine failed and ended every answer: {type(e).__name__}: {e}")

    def _run_command(self, cmd: Command) -> None:
        handler = getattr(self, f"_on_{cmd.kind}")
        try:
            result = handler(cmd.args)
        except Exception as e:  # a bad command is its caller's error, never the thread's end
            if cmd.reply is not None:
                cmd.reply.set_exception(e)
            return
        if cmd.reply is not None:
            cmd.reply.set_result(result)

    def _on_submit(self, batch: list[Request]) -> list[Generation]:
        for r in batch:
            r.params = self.engine.check(r.prompt, r.params)  # once: admitted below or later, it is not checked again
        # the queue bounds those that would wait: with free slots and nobody ahead, a request starts at once
        # (so a queue of 0 still serves whoever finds a slot free)
        starts_now = not self.waiting and len(batch) <= len(self._free_seqs())
        if not starts_now and len(self.waiting) + len(batch) > self.queue_max:
            raise QueueFull(f"all {self.engine.ctx.n_seq_max} slots are busy and {len(self.waiting)} requests "
                            f"are waiting (the queue holds {self.queue_max}); try again in a minute")
        self.waiting.extend(batch)
        self._admit()
        return [r.gen for r in batch]

    def _find(self, gen_id: int) -> tuple[int | None, Request | None]:
        for seq, g in self.running.items():
            if g.id == gen_id:
                return seq, None
        for r in self.waiting:
            if r.gen.id == gen_id:
                return None, r
        return None, None

    def _on_stop(self, gen_id: int, silent: bool = False) -> None:
        seq, waiting = self._find(gen_id)
        if gen_id in self.parked:
            gen, _ = self.parked.pop(gen_id)
            if not silent:
                gen.events.put(stopped_without_a_slot())
        elif waiting is not None:
            self.waiting.remove(waiting)
            if not silent:
                waiting.gen.events.put(stopped_without_a_slot())
            self._tell_places()
        elif seq is not None:
            self.engine.stop(seq)
            if silent:
                self.running[seq].events = queue.Queue()  # nobody reads it any more
            if self.running[seq].manual:  # nobody else steps it: deliver the stop now
                self._step({seq})

    def _on_cancel(self, gen_id: int) -> None:
        self._on_stop(gen_id, silent=True)

    def _on_step(self, gen_id: int) -> int:
        if gen_id in self.parked:  # back in line for a slot, at the end: the ones waiting came first
            gen, slot = self.parked.pop(gen_id)
            self.waiting.append(Request(gen, list(slot.tokens), slot.params, parked=slot))
            self._admit()
        seq, waiting = self._find(gen_id)
        if waiting is not None:
            waiting.step_pending = True
            return 0  # still in line: its WaitEvents say where, and the round runs when it gets a slot
        if seq is None:
            raise ValueError(f"generation {gen_id} has ended")
        self.running[seq].t_active = time.monotonic()
        return len(self._step({seq}, whole_prefill=True))

    def _park_idle(self) -> None:
        """End step-mode generations idle for abandon_s; give the slot of one idle for step_idle_s to the head
        of the queue."""
        now = time.monotonic()
        idle = [g for g in self.running.values() if g.manual] + [g for g, _ in self.parked.values()]
        for gen in idle:
            if now - gen.t_active > self.abandon_s:
                self._on_stop(gen.id)  # its done event says "stopped", should anyone still read it
        if not self.waiting:
            return
        for seq, gen in list(self.running.items()):
            if gen.manual and now - gen.t_active > self.step_idle_s:
                slot = self.engine.park(seq)
                del self.running[seq]
                gen.seq = None
                self.parked[gen.id] = (gen, slot)
                gen.events.put(WaitEvent(position=0))

    def _on_call(self, fn: Callable[[Engine], Any]) -> Any:
        self._shutdown("the model is being replaced: this answer ends here")
        return fn(self.engine)

    def _shutdown(self, message: str) -> None:
        """End every generation, running or waiting, with `message`, and free their slots. Each one hears its
        end even when a release fails; the first such failure is raised after."""
        failure = None
        for seq in list(self.running):
            try:
                self.engine.release(seq)
            except Exception as e:  # any type: the others must still be ended and told
                failure = failure or e
        end_generations(self.running, self.parked, self.waiting, message)
        if failure is not None:
            raise failure

    def _free_seqs(self) -> list[int]:
        """Sequences without a running generation; those that still hold a parked slot's cells come last."""
        return sorted((s for s in range(self.engine.ctx.n_seq_max) if s not in self.running),
                      key=lambda s: s in self.engine.parked)

    def _admit(self) -> None:
        """Give free slots to waiting requests in arrival order; a group is admitted whole or waits whole."""
        while self.waiting:
            head = self.waiting[0]
            members = [r for r in head.group if r in self.waiting] if head.group is not None else [head]
            free = seats(self.engine, head, self._free_seqs())
            if len(members) > len(free) or not self._fits(members, free):
                break  # the running generations hold the cells it needs: it waits for them to end
            for r, seq in zip(members, free):
                self.waiting.remove(r)
                try:
                    if r.parked is not None:
                        self.engine.resume(r.parked, seq)
                    else:
                        self.engine.admit(r.prompt, r.params, seq=seq)
                except ValueError as e:
                    r.gen.events.put(ErrorEvent(seq=seq, message=f"cannot start: {e}"))
                    continue
                r.gen.seq = seq
                r.gen.t_active = time.monotonic()
                self.running[seq] = r.gen
                if r.step_pending:
                    self._step({seq}, whole_prefill=True)
        self._tell_places()

    def _fits(self, members: list[Request], free: list[int]) -> bool:
        """Whether the cache has room for these prompts now; cells that finished slots keep for prefix reuse
        are given up first (llama-server clears idle slots the same way)."""
        def fit() -> bool:
            return all(self.engine.fits(r.prompt, seq, r.params.cache_salt) for r, seq in zip(members, free))

        if fit():
            return True
        for seq in free:  # not running: what a free seq holds is a finished answer or a parked one
            self.engine.release(seq)
        return fit() or not self.running  # nothing to wait for: start() will say why it cannot

    def _tell_places(self) -> None:
        for place, r in enumerate(self.waiting, start=1):
            if r.place != place:
                r.place = place
                r.gen.events.put(WaitEvent(position=place))

    def _step(self, seqs: set[int], whole_prefill: bool = False) -> list:
        try:
            events = self.engine.step(seqs, whole_prefill=True) if whole_prefill else self.engine.step(seqs)
        except Exception as e:  # any type: the thread must outlive a broken round
            events = [ErrorEvent(seq=seq, message=f"generation failed: {type(e).__name__}: {e}") for seq in seqs]
            for seq in seqs:
                self.engine.release(seq)
        for ev in events:
            gen = self.running.get(ev.seq)
            if gen is None:
                continue
            stats = self.engine.drafter_stats(ev.seq)
            if stats is not None:
                gen.stats = stats
            if ev.done:  # the slot is free before its last event is read
                del self.running[ev.seq]
            if self.on_event is not None and isinstance(ev, RoundEvent):
                self.on_event(ev, gen.manual, gen.purpose)
            gen.events.put(ev)
        return events

    def load(self) -> tuple[int, int]:
        """(slots generating, requests waiting for one), read from any thread: the lengths of containers the
        engine thread changes, each read at once, so a figure for a gauge rather than a consistent pair."""
        return len(self.running), len(self.waiting)
