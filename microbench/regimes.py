"""Regime changes the size grid cannot see: in the alpha-beta model a call of n bytes costs alpha + n beta (alpha,
beta >= 0), so on one line t(n2) / t(n1) <= n2 / n1 for n1 < n2. Where the time between two adjacent measured sizes
grows faster than the size, beyond both points' confidence intervals and by more than MATERIAL, no such line passes
through both: the line changes inside the interval (a protocol or algorithm switch), and the fit prices every size
there by extrapolation. The sweep measures the middle of each such interval (--bisect); the fit warns of those left."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from microbench.ops import LOCAL_OPS, itemsize


MATERIAL = 0.05
"""How much faster than the size the median time must grow, besides beyond the CIs, to count: less misprices the sizes
inside by less than the fit's held-out target (5% for sizes >= 4 KiB), while a rate-limited link's slight curvature
(a token bucket's burst, TCP's window) passes the CI test over interval after interval."""


@dataclass(frozen=True)
class HiddenChange:
    """An interval of adjacent measured sizes of one (op, link, procs) whose time grew faster than its size beyond
    the CIs and by more than MATERIAL; `suggest_bytes`: the geometric middle in whole elements (None where no whole element lies between)."""

    op: str
    link: str
    procs: int
    low_bytes: int
    high_bytes: int
    time_ratio: float
    size_ratio: float
    suggest_bytes: int | None


def _per_size(df: pd.DataFrame) -> pd.DataFrame:
    """Per measured size, over the rows (runs) whose CI is a positive interval around their median: the median of
    the medians, the lowest CI low and the highest CI high (a change then has to hold in every run)."""
    lo, hi, t = (pd.to_numeric(df[c], errors="coerce") for c in ("ci_low_s", "ci_high_s", "seconds"))
    ok = (lo > 0) & (lo <= t) & (t <= hi) & np.isfinite(hi)
    rows = df.assign(lo=lo, hi=hi)[ok]
    return rows.groupby("size_bytes").agg(seconds=("seconds", "median"), lo=("lo", "min"), hi=("hi", "max"))


def _middle(low: int, high: int, element: int) -> int | None:
    """The geometric middle of (low, high) rounded to whole elements, kept strictly inside; None if none fits."""
    if high - low <= element:
        return None
    whole = int(round(math.sqrt(low * high) / element)) * element
    return min(max(whole, low + element), high - element)


def hidden_changes(points: pd.DataFrame) -> list[HiddenChange]:
    """Every interval between adjacent sizes of each (op, link, procs) of the communication points (the fit's:
    op, link, procs, size_bytes, dtype, seconds, ci_low_s, ci_high_s) where ci_low(n2) > n2 / n1 x ci_high(n1) and the
    median grew by more than n2 / n1 x (1 + MATERIAL).
    Points without a valid CI are skipped: they never meet a target, and no claim rests on them."""
    comm = points[~points["op"].isin(LOCAL_OPS)]
    out = []
    for (op, link, procs), df in comm.groupby(["op", "link", "procs"], sort=True):
        sizes = _per_size(df)
        element = itemsize(str(df["dtype"].iloc[0]))
        rows = list(sizes.itertuples())
        for a, b in zip(rows, rows[1:]):
            n1, n2 = int(a.Index), int(b.Index)
            if b.lo > n2 / n1 * a.hi and b.seconds / a.seconds > n2 / n1 * (1 + MATERIAL):
                out.append(HiddenChange(str(op), str(link), int(procs), n1, n2, float(b.seconds / a.seconds),
                                        n2 / n1, _middle(n1, n2, element)))
    return out


def middles(summary: pd.DataFrame, held_out: frozenset[int] = frozenset()) -> dict[tuple[str, str, int], list[int]]:
    """The sizes to bisect a sweep's flagged intervals at, per (op, link, procs), from its point summaries
    (records.SUMMARY_COLUMNS), leaving out the points at `held_out` requested sizes: those are measured to check a
    fit at sizes it never saw, so they must not steer what it sees."""
    rows = summary[~summary["requested_bytes"].isin(held_out)].rename(columns={"median_s": "seconds"})
    out: dict[tuple[str, str, int], list[int]] = {}
    for c in hidden_changes(rows):
        if c.suggest_bytes is not None:
            out.setdefault((c.op, c.link, c.procs), []).append(c.suggest_bytes)
    return out
