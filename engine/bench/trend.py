"""The trend test of the measurement guide: does speculation's speedup fall as concurrency rises?

Over the rows at the high end (concurrency >= `low`, 4 by default), the least-squares line
speedup = a + b * concurrency, and the two-sided p-value of b = 0 from Student's t with n - 2 degrees of freedom:

    b = sum((x - mean x)(y - mean y)) / sum((x - mean x)^2)
    se(b) = sqrt(sum(residual^2) / (n - 2) / sum((x - mean x)^2)),  t = b / se(b)
    p = I_{df / (df + t^2)}(df / 2, 1 / 2)   (the regularized incomplete beta function)

which is what scipy.stats.linregress reports; a negative b with a small p says concurrency eats the gain. The
guide fits the rows that passed the lossless check, one point per row (a prompt at a concurrency); the decode
speedup (prefill excluded) is the y here, as on the page's curves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.bench.stats import is_chain, num, speedup_of


@dataclass(frozen=True)
class Trend:
    drafters: str  # the rows' spec_types
    n: int  # rows fitted
    slope: float  # speedup per one more concurrent sequence
    p_value: float  # two-sided, of slope = 0 (nan with fewer than 3 rows or one concurrency)


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz), converging for x < (a+1)/(a+b+2)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def linregress(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(slope, two-sided p-value of slope = 0) of the least-squares line through the points."""
    n = len(xs)
    if n != len(ys) or n < 3:
        return (float("nan"), float("nan"))
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return (float("nan"), float("nan"))
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    sse = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys))
    df = n - 2
    if sse == 0:
        return (slope, 0.0 if slope != 0 else 1.0)
    t = slope / math.sqrt(sse / df / sxx)
    return (slope, betainc(df / 2.0, 0.5, df / (df + t * t)))


def trends(rows: list[dict], low: int = 4) -> list[Trend]:
    """Per drafter set, the fit over its chain rows at concurrency >= low that passed the lossless check."""
    by: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if is_chain(r) and str(r.get("lossless_ok")) == "True" and num(r.get("concurrency")) >= low:
            by.setdefault(r["spec_types"], []).append((num(r["concurrency"]), speedup_of(r)))
    out = []
    for name, pts in sorted(by.items()):
        slope, p = linregress([x for x, _ in pts], [y for _, y in pts])
        out.append(Trend(name, len(pts), slope, p))
    return out


def describe(t: Trend, low: int = 4) -> str:
    if math.isnan(t.slope):
        return f"trend of {t.drafters} at concurrency >= {low}: {t.n} rows, too few or one concurrency to fit"
    verdict = "concurrency eats the gain" if t.slope < 0 and t.p_value < 0.05 else "no significant fall"
    return (f"trend of {t.drafters} at concurrency >= {low}: slope {t.slope:+.4f} speedup per sequence, "
            f"p = {t.p_value:.3g} over {t.n} rows ({verdict})")
