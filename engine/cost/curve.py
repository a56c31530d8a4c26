"""What a forward costs on this machine, by its rows: the curve c(n) the length policy and the round's budget
read, in units of a one-row forward.

The engine times forwards of 1 to 16 rows at start (`engine/cost/calibrate.py`); `CostModel` holds that curve
(smoothed, never decreasing in n), and `RoundCost` adds what a round costs besides its forward (drafting,
verification, events) as a fit of fixed + factor * the curve's step.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class CostModel:
    """c(n): a forward of n rows in forwards of one row, from the calibration at start, then from the forwards the
    engine runs.

    The calibration times one sequence on an idle engine, 5 timings a size, and on a shared 2-core machine two
    calibrations put 8 rows at the cost of 4 and well above it: a budget that believes the first adds rows that
    cost every slot of the forward. Forwards in service have the slots' real contexts, several sequences'
    attention and the tree mask. So every forward the engine runs is observed (`observe`): a size seen at least
    `min_seen` times takes its decaying average; another size n takes the calibrated curve's step from the
    largest such size m below it (the smallest above where none is below), t(m) * cal(n) / cal(m), so the rows
    beyond what was seen cost what the calibration says they add; the result is made non-decreasing."""

    sizes: list[int] = field(default_factory=lambda: [1])  # rows in a forward, ascending (calibrated)
    seconds: list[float] = field(default_factory=lambda: [1.0])  # measured time of such a forward
    decay: float = 0.9  # weight of the old average of a size at each new forward of that size
    min_seen: int = 8  # forwards of a size before its average replaces the calibrated time
    seen: dict[int, tuple[float, int]] = field(default_factory=dict)  # rows -> (average seconds, forwards)
    _table: list[float] | None = field(default=None, repr=False)  # t(n) for n = 0 .. the last calibrated size
    # a row's attention reads every cell it sees: seconds per row and cell seen (0: unknown), and the cells each
    # calibrated row saw. Slots with shorter contexts than the calibration's add cheaper rows (for_cells)
    cell_seconds: float = 0.0
    calibrated_cells: int = 0
    # what one more sequence's row costs beyond one more row of a sequence already in the forward: the calibration
    # times k sequences of one row against one sequence of k rows (0: unknown). A slot that leaves the batch
    # takes that with it, as well as its row (RoundCost.seq_share)
    seq_seconds: float = 0.0
    # what draft rows cost in service against what this curve said they would. Each round that verified drafts
    # gives x, the seconds the curve gave its draft rows, and y, the seconds the round took beyond a plain round
    # of its base rows (its forward's extra rows, and its work after the forward beyond a plain round's:
    # building rows, the walk, dropping the branches, the drafters' catch-up). y = fixed + factor * x by least
    # squares over decayed sums, from a prior of one round that met the curve exactly. Four copying slots on a
    # 2-core Xeon verified rows in rounds far dearer than the curve said (it times one sequence's chain at its
    # fastest of 7, and a round does more than its forward); one open slot's drafted rounds spent more than its
    # plain ones after the forward (docs/history.md#what-the-budgets-rules-answer). RoundCost.c adds both to every
    # round's rows
    step_sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # decayed n, sum x, sum y, sum xx, sum xy
    step_prior: tuple[float, float] = (0.5e-3, 3e-3)  # x of the prior's two rounds (y = x), seconds
    step_decay: float = 0.97  # per observed round, the weight left to the rounds before it
    # per slot, the seconds a round spends after its forward when it verified no draft (decaying average): what a
    # drafted round's work after the forward is measured against
    after_plain: float = 0.0
    n_after_plain: int = 0

    def step_fit(self) -> tuple[float, float]:
        """(fixed seconds of a round that verifies drafts, factor on the curve's seconds for its rows); the factor
        within [0.5, 4], the fixed part at least 0."""
        n, sx, sy, sxx, sxy = self.step_sums
        w = 0.5  # each of the prior's rounds: one round in all, so a few observed ones outweigh it
        for x in self.step_prior:
            n, sx, sy, sxx, sxy = n + w, sx + w * x, sy + w * x, sxx + w * x * x, sxy + w * x * x
        var = n * sxx - sx * sx
        factor = (n * sxy - sx * sy) / var if var > 0 else 1.0
        factor = min(4.0, max(0.5, factor))
        return max(0.0, (sy - factor * sx) / n), factor

    def observe_step(self, predicted: float, actual: float) -> None:
        """A round that verified draft rows: the seconds the curve gave them, the seconds they took."""
        d = self.step_decay
        sums = [1.0, predicted, actual, predicted * predicted, predicted * actual]
        self.step_sums = [d * old + new for old, new in zip(self.step_sums, sums)]

    def after_plain_seconds(self) -> float | None:
        """A slot's work after a plain forward, once 3 plain rounds timed it; None before."""
        return self.after_plain if self.n_after_plain >= 3 else None

    def observe_after_plain(self, seconds_per_slot: float) -> None:
        weight = max(1 - self.decay, 1 / (self.n_after_plain + 1))
        self.after_plain = (1 - weight) * self.after_plain + weight * seconds_per_slot
        self.n_after_plain += 1

    def base_seconds(self, n_rows: int) -> float:
        """A forward of n_rows as the engine has timed it in service (3 forwards suffice: the curve's fastest-of-7
        timings would make every row beyond look dearer), else as the curve says."""
        avg, n_seen = self.seen.get(n_rows, (0.0, 0))
        return avg if n_seen >= 3 and avg > 0 else self._t(n_rows)

    def observe(self, n_rows: int, seconds: float) -> None:
        """A forward of n_rows ran in `seconds`."""
        avg, n = self.seen.get(n_rows, (seconds, 0))
        weight = max(1 - self.decay, 1 / (n + 1))  # the mean of the first forwards, then a decaying average
        self.seen[n_rows] = ((1 - weight) * avg + weight * seconds, n + 1)
        if n + 1 >= self.min_seen:
            self._table = None

    def quiet(self, n_rows: int) -> float:
        """Seconds of a forward of n_rows as the calibration timed it (its fastest, on the machine at start)."""
        return self._at(n_rows)

    def c(self, n_rows: int) -> float:
        """Cost of a forward of n_rows relative to one row (linear interpolation; past the last size the last
        segment's slope goes on: rows are never free just because nobody timed that many)."""
        base = self._t(1)
        return self._t(n_rows) / base if base > 0 else 1.0

    def for_cells(self, n_base: int, cells: float) -> "RoundCost":
        """This curve for a forward of n_base rows plus draft rows that each see `cells` cells on average."""
        base = self._t(1)
        saved = self.cell_seconds * max(0.0, self.calibrated_cells - cells) / base if base > 0 else 0.0
        fixed, factor = self.step_fit()
        return RoundCost(self, n_base, saved, fixed / base if base > 0 else 0.0, factor)

    def _t(self, n: int) -> float:
        if self._table is None:
            self._table = self._build()
        if n < len(self._table):
            return self._table[n]
        return self._table[-1] * self._at(n) / self._at(len(self._table) - 1)

    def _build(self) -> list[float]:
        trusted = {n: avg for n, (avg, k) in self.seen.items() if k >= self.min_seen and n <= self.sizes[-1]}
        cal = [self._at(n) for n in range(self.sizes[-1] + 1)]
        table, anchor = [], min(trusted, default=None)
        for n in range(len(cal)):
            anchor = n if n in trusted else anchor
            table.append(cal[n] if anchor is None else trusted[anchor] * cal[n] / cal[anchor])
        for n in range(1, len(table)):
            table[n] = max(table[n], table[n - 1])
        return table

    def _at(self, n: int) -> float:
        s, t = self.sizes, self.seconds
        if n <= s[0]:
            return t[0]
        if n >= s[-1]:
            slope = (t[-1] - t[-2]) / (s[-1] - s[-2]) if len(s) > 1 else 0.0
            return t[-1] + max(slope, 0.0) * (n - s[-1])
        j = bisect.bisect_left(s, n)
        if s[j] == n:
            return t[j]
        w = (n - s[j - 1]) / (s[j] - s[j - 1])
        return t[j - 1] * (1 - w) + t[j] * w


@dataclass
class RoundCost:
    """c(n) for one round: rows beyond the round's base rows cost the curve's step less the attention they do not do
    (at most half the step), where the slots' contexts are shorter than the calibration's prefix, times what draft
    rows were measured to cost in service against that, plus a drafted round's fixed cost (CostModel.step_fit). A
    forward of 4 slots with short contexts timed its 5th to 8th rows well below what the curve of one sequence after
    256 cells said (docs/history.md#the-calibration): the budget refused rows that paid. Only the step is corrected:
    the base rows' cost is what the forwards in service measured."""

    curve: CostModel
    n_base: int  # rows the forward has anyway
    saved: float  # per row beyond them: the attention not done, in forwards of one row
    fixed: float = 0.0  # a drafted round's fixed cost, in forwards of one row (CostModel.step_fit)
    factor: float = 1.0  # draft rows' cost in service over the curve's step (CostModel.step_fit)

    def quiet(self, n_rows: int) -> float:
        """Seconds of a forward of n_rows as the calibration timed it (its fastest, on the machine at start)."""
        return self._at(n_rows)

    def c(self, n_rows: int) -> float:
        if n_rows <= self.n_base:
            return self.curve.c(n_rows)
        return self.curve.c(self.n_base) + self.factor * self.step(n_rows) + self.fixed

    def step(self, n_rows: int) -> float:
        """What the rows beyond the base rows add by the curve, in forwards of one row (no step factor)."""
        base = self.curve.c(self.n_base)
        step = self.curve.c(n_rows) - base
        # at most half the step: the attention saved is timed as the difference of two timings, which moved
        # several-fold from one calibration to the next on a shared machine
        return max(0.0, step - min((n_rows - self.n_base) * self.saved, 0.5 * step))

    def step_seconds(self, n_rows: int) -> float:
        return self.step(n_rows) * self.curve._t(1)

    def seq_share(self) -> float:
        """The share of a forward of the base rows that one of its sequences costs: its row, and what a sequence
        costs beyond a row (CostModel.seq_seconds). A slot that finishes early saves the slots still generating
        that much of every forward it would have been in."""
        if self.n_base < 2:
            return 0.0
        t = self.curve._t(self.n_base)
        if t <= 0:
            return 0.0
        return min(1.0, (t - self.curve._t(self.n_base - 1) + self.curve.seq_seconds) / t)


def smooth_small(sizes: list[int], seconds: list[float], upto: int = 16) -> list[float]:
    """The timings of sizes up to `upto` replaced by the least-squares quadratic a + b n + c n^2 through them.

    A few rows cost nearly what one does, so the ratios that decide a draft (c(8) / c(4) beside four slots) are
    small differences between timings that each move more than that on a shared machine: calibrations of the fastest
    timings alone scattered c(8) / c(4) from no step at all to a large one, and a budget that believes no step gives
    every slot rows that slow them all. The fit pools every size's timing into three numbers, which held c(8) / c(4)
    within a narrow range over repeated calibrations, near what a forward of 4 slots with 1 draft row each timed
    (docs/history.md#the-calibration). Larger sizes keep their own timing: there the rows cost enough to be
    measured."""
    import torch

    small = [i for i, n in enumerate(sizes) if n <= upto]
    if len(small) < 4:
        return list(seconds)
    x = torch.tensor([[1.0, sizes[i], sizes[i] ** 2] for i in small], dtype=torch.float64, device="cpu")
    y = torch.tensor([[seconds[i]] for i in small], dtype=torch.float64, device="cpu")
    coef = torch.linalg.lstsq(x, y).solution.flatten()
    out = list(seconds)
    for row, i in enumerate(small):
        out[i] = max(float(x[row] @ coef), 0.5 * seconds[i])
    return out


def non_decreasing(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators): each run that goes down
    is replaced by its mean."""
    blocks: list[list[float]] = []  # [sum, count] of pooled runs
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(count)]
