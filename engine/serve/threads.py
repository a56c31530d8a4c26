"""How many threads a forward runs on: all the cores, unless another process has taken some of them.

A forward's parallel loops (torch's and our kernels', one OpenMP pool) end at a barrier: every thread waits for the
slowest. When another busy process holds one of two cores, the thread that shares that core runs half the time and
every loop waits for it, so two threads decode far below their quiet speed, below what one thread alone keeps
(docs/measured.md#epyc-vnni-long-prompts-load-and-a-busy-core). llama.cpp slows the same way; its answer is
`--threads`.

`ThreadGovernor` watches each decode forward against the calibrated cost curve (seconds / the quiet machine's
seconds for that many rows). When the mean of two windows of forwards in a row runs `slow_factor` over the
quiet time, it tries one thread fewer for a window and keeps whichever count ran faster, measured the same way;
while it runs fewer threads it tries all of them again every `reprobe_s`, so the cores come back when the other
process leaves. The mean, not the median: a contended forward is mostly a little slow and now and then very
slow (the stalled thread waits a whole time slice), and the stalls are what the answer's speed pays. A fixed
count (`--threads N`) turns it off.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class ThreadGovernor:
    n_max: int  # the threads a quiet machine runs (torch's count at start: the cores)
    n_threads: int = 0  # the count forwards run on now (0: n_max)
    fixed: bool = False  # a count the user chose: never changed
    window: int = 8  # forwards per measurement of one count
    slow_factor: float = 1.4  # the mean ratio to the quiet time that starts a trial of fewer threads
    gain: float = 1.05  # a trial count is kept when it runs this much faster than the one it would replace
    reprobe_s: float = 15.0  # while on fewer threads: how often all of them are tried again
    backoff_s: float = 10.0  # after a trial that lost: how long until the next one may start
    ratios: list[float] = field(default_factory=list)  # this count's latest forwards, seconds / quiet seconds
    trial_of: int = 0  # the count a trial would replace (0: no trial running)
    before: float = 0.0  # the mean of that count's window, for the trial to beat
    next_trial: float = 0.0  # time.monotonic() before which no trial starts
    confirmed: bool = False  # a slow window was seen: the next, all of it slow too, starts the trial
    switches: list[tuple[float, int, str]] = field(default_factory=list)  # (when, new count, why), for the status

    def __post_init__(self) -> None:
        self.n_threads = self.n_threads or self.n_max

    def observe(self, seconds: float, quiet_seconds: float, now: float) -> int | None:
        """A decode forward took `seconds` where the calibration's quiet machine took `quiet_seconds`: the
        thread count to switch to, or None to keep the current one."""
        if self.fixed or self.n_max < 2 or quiet_seconds <= 0 or seconds <= 0:
            return None
        self.ratios = (self.ratios + [seconds / quiet_seconds])[-self.window:]
        if len(self.ratios) < self.window:
            return None
        mean = statistics.fmean(self.ratios)
        if self.trial_of:
            return self._end_trial(mean, now)
        if now < self.next_trial:
            return None
        if self.n_threads == self.n_max and mean > self.slow_factor:
            if not self.confirmed:  # a window that began before the slowdown would flatter the count in use
                self.confirmed, self.ratios = True, []
                return None
            self.confirmed = False
            return self._start_trial(self.n_max - 1, mean, now, f"forwards at {mean:.2f}x their quiet time")
        self.confirmed = False
        if self.n_threads < self.n_max:
            return self._start_trial(self.n_max, mean, now, "trying every core again")
        return None

    def _start_trial(self, count: int, mean: float, now: float, why: str) -> int:
        self.trial_of, self.before = self.n_threads, mean
        return self._switch(count, now, why)

    def _end_trial(self, mean: float, now: float) -> int | None:
        replaced, before = self.trial_of, self.before
        self.trial_of = 0
        if mean * self.gain < before:  # the trial's count is faster: it stays
            self.next_trial = now + (self.reprobe_s if self.n_threads < self.n_max else 0.0)
            self.switches.append((now, self.n_threads, f"{mean:.2f}x against {before:.2f}x: kept"))
            return None
        self.next_trial = now + (self.backoff_s if replaced == self.n_max else self.reprobe_s)
        return self._switch(replaced, now, f"{mean:.2f}x against {before:.2f}x: back")

    def _switch(self, count: int, now: float, why: str) -> int:
        self.n_threads = count
        self.ratios = []
        self.switches = (self.switches + [(now, count, why)])[-20:]
        return count

    def describe(self) -> str:
        if self.fixed:
            return f"{self.n_threads} threads (fixed)"
        last = f"; last change: {self.switches[-1][2]}" if self.switches else ""
        return f"{self.n_threads} of {self.n_max} threads{last}"
