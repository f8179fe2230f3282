"""Small statistics for noisy measurements: medians, spreads, percentiles, paired ratios, a line fit.

Every figure in the report is a ratio against a baseline measured in the same run. Rounds are
paired: round r measures the configuration and its baseline back to back, so the ratio of round
r is taken first and the median is taken over rounds (a slow minute hurts both sides of a pair).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Summary:
    """Median and spread of a few runs."""

    median: float
    low: float
    high: float
    n: int

    @property
    def spread_pct(self) -> float:
        """(max - min) / median, in percent: how much the runs disagree."""
        return 100.0 * (self.high - self.low) / self.median if self.median else 0.0

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "spread_pct": round(self.spread_pct, 1)}


def summarize(values: Sequence[float]) -> Summary:
    clean = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not clean:
        return Summary(math.nan, math.nan, math.nan, 0)
    return Summary(statistics.median(clean), min(clean), max(clean), len(clean))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    below = math.floor(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (rank - below)


def by_round(runs: Sequence[dict[str, Any]], baselines: Sequence[dict[str, Any]]) -> list[tuple[dict, dict]]:
    """Each run with the baseline run of the same round (runs whose round has none are dropped)."""
    base = {r["round"]: r for r in baselines}
    return [(r, base[r["round"]]) for r in runs if r["round"] in base]


def paired_ratios(values: Sequence[float], baselines: Sequence[float]) -> list[float]:
    """Round-by-round ratios value/baseline (rounds where either is missing are dropped)."""
    ratios = []
    for value, base in zip(values, baselines, strict=False):
        if value is None or base is None or not base or math.isnan(value) or math.isnan(base):
            continue
        ratios.append(value / base)
    return ratios


def ratio_summary(values: Sequence[float], baselines: Sequence[float]) -> Summary:
    return summarize(paired_ratios(values, baselines))


def paired_ratio(runs: dict[str, list[dict[str, Any]]], config: str, base: str, key: str = "rps_wall") -> Summary:
    """`key` of `config`'s runs over `base`'s, round by round."""
    pairs = by_round(runs.get(config, []), runs.get(base, []))
    return ratio_summary([a.get(key) for a, _ in pairs], [b.get(key) for _, b in pairs])


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x; returns (a, b, r^2)."""
    n = len(xs)
    if n < 2:
        return math.nan, math.nan, math.nan
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, math.nan, math.nan
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    return a, b, (1 - ss_res / ss_tot) if ss_tot else 1.0


def balanced_orders(items: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Orders for rounds that run every item once (a Williams design): across the returned rounds
    each item runs equally often in every position, and right after every other item equally
    often. A rotation (a, b, c; b, c, a; ...) balances positions only: b always follows a, so
    whatever a leaves behind (a collection due in the shared JVM, a broker still writing a's
    transaction markers) always lands on b. n rounds for an even n, 2n for an odd n (the rows of
    the first square, then the same rows reversed)."""
    n = len(items)
    first = [0]
    low, high = 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...: every difference between neighbours once
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(i + shift) % n for i in first] for shift in range(n)]
    if n % 2 and n > 1:
        rows += [row[::-1] for row in rows]
    return [tuple(items[i] for i in row) for row in rows]


def verdict(ratio: float, target: float, higher_is_better: bool = True) -> str:
    if math.isnan(ratio):
        return "n/a"
    ok = ratio >= target if higher_is_better else ratio <= target
    return "met" if ok else "MISSED"
