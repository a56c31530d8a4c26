"""The measurement guide's trend test (engine/bench/trend.py): the p-value of Student's t as scipy's linregress gives
it, the fit over rows at high concurrency that passed the lossless check, and plots that leave failed rows out."""

from __future__ import annotations

import math

import pytest

from engine.bench.plot import lossless_rows
from engine.bench.trend import betainc, describe, linregress, trends


@pytest.mark.parametrize("t, df, p", [(2.0, 10, 0.073388), (1.0, 1, 0.5), (12.0, 3, 0.0012450), (0.5, 30, 0.620719)])
def test_the_two_sided_p_value_is_students(t, df, p):
    """Values of 2 * (1 - T_df(|t|)) from tables of Student's t."""
    assert betainc(df / 2, 0.5, df / (df + t * t)) == pytest.approx(p, rel=1e-4)


def test_a_line_through_points_and_its_degenerate_cases():
    xs = [4, 4, 8, 8, 16, 16]
    slope, p = linregress(xs, [2.0 - 0.05 * x + e for x, e in zip(xs, [0.01, -0.01, 0.02, -0.02, 0.01, -0.01])])
    assert slope == pytest.approx(-0.05, abs=2e-3) and p < 1e-4
    flat, p_flat = linregress(xs, [1.0, 1.2, 1.2, 1.0, 1.0, 1.2])
    assert flat == pytest.approx(0.0, abs=1e-12) and p_flat == pytest.approx(1.0)
    assert all(math.isnan(v) for v in linregress([4, 4, 4], [1.0, 2.0, 3.0]))  # one concurrency: no line
    assert all(math.isnan(v) for v in linregress([4, 8], [1.0, 2.0]))  # two points: no degrees of freedom


def _row(n: int, speedup: float, ok="True", types="ngram-simple") -> dict:
    return {"spec_decode": "on", "spec_types": types, "concurrency": n, "speedup_decode": speedup,
            "lossless_ok": ok, "synthetic_accept": ""}


def test_the_trend_fits_rows_at_the_high_end_that_passed_the_check():
    rows = [_row(1, 3.0), _row(2, 2.5)]  # below the high end: not fitted
    rows += [_row(n, 1.5 - 0.04 * n + d) for n in (4, 8, 16) for d in (-0.01, 0.01)]
    rows += [_row(16, 9.0, ok="False"), _row(8, 9.0, ok="n/a")]  # neither passed the check
    (trend,) = trends(rows)
    assert trend.n == 6 and trend.slope == pytest.approx(-0.04, abs=1e-6) and trend.p_value < 1e-3
    assert "concurrency eats the gain" in describe(trend)
    assert [r["lossless_ok"] for r in lossless_rows(rows)].count("False") == 0
    assert len(lossless_rows(rows)) == len(rows) - 1  # "n/a" rows stay: synthetic and rejection rows are drawn
