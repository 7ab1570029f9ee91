"""Regime changes the size grid cannot see: in the alpha-beta model a call of n bytes costs alpha + n beta (alpha,
beta >= 0), so on one line t(n2) / t(n1) <= n2 / n1 for n1 < n2. Where the time between two adjacent measured sizes
grows faster than the size, beyond both points' confidence intervals and by more than MATERIAL, no such line passes
through both: the line changes inside the interval (a protocol or algorithm switch), and the fit prices every size
there by extrapolation. The sweep measures the middle of each such interval (--bisect), and one element under its upper
end where that is a power of two; the fit warns of those left with a size inside."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from microbench.ops import LOCAL_OPS, OPS, itemsize


MATERIAL = 0.05
"""How much faster than the size the median time must grow, besides beyond the CIs, to count: less misprices the sizes
inside by less than the fit's held-out target (5% for sizes >= 4 KiB), while a rate-limited link's slight curvature
(a token bucket's burst, TCP's window) passes the CI test over interval after interval."""


@dataclass(frozen=True)
class HiddenChange:
    """An interval of adjacent measured sizes of one (op, link, procs) whose time grew faster than its size beyond
    the CIs and by more than MATERIAL; `suggest`: the sizes to measure inside it (_inside; none where no size the
    operation can measure lies between, and the change is located)."""

    op: str
    link: str
    procs: int
    low_bytes: int
    high_bytes: int
    time_ratio: float
    size_ratio: float
    suggest: tuple[int, ...]


def _per_size(df: pd.DataFrame) -> pd.DataFrame:
    """Per measured size, over the rows (runs) whose CI is a positive interval around their median: the median of
    the medians, the lowest CI low and the highest CI high (a change then has to hold in every run)."""
    lo, hi, t = (pd.to_numeric(df[c], errors="coerce") for c in ("ci_low_s", "ci_high_s", "seconds"))
    ok = (lo > 0) & (lo <= t) & (t <= hi) & np.isfinite(hi)
    rows = df.assign(lo=lo, hi=hi)[ok]
    return rows.groupby("size_bytes").agg(seconds=("seconds", "median"), lo=("lo", "min"), hi=("hi", "max"))


def _inside(low: int, high: int, step: int) -> tuple[int, ...]:
    """The sizes to measure inside (low, high), in whole steps (ops.Op.granule): its geometric middle, kept strictly
    inside, and one step under `high` where that is a power of two: MPI libraries switch protocols and algorithms at
    powers of two, often right at one, and a size just under it then shows whether the change lies there (a middle
    alone never reaches it) or farther down. () where no whole step lies between: the change is located."""
    if high - low <= step:
        return ()
    whole = int(round(math.sqrt(low * high) / step)) * step
    middle = min(max(whole, low + step), high - step)
    return tuple(sorted({middle, high - step if high & (high - 1) == 0 else middle}))


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
        step = OPS[op].granule(int(procs), element) if op in OPS else element
        rows = list(sizes.itertuples())
        for a, b in zip(rows, rows[1:]):
            n1, n2 = int(a.Index), int(b.Index)
            if b.lo > n2 / n1 * a.hi and b.seconds / a.seconds > n2 / n1 * (1 + MATERIAL):
                out.append(HiddenChange(str(op), str(link), int(procs), n1, n2, float(b.seconds / a.seconds),
                                        n2 / n1, _inside(n1, n2, step)))
    return out


def middles(summary: pd.DataFrame, held_out: frozenset[int] = frozenset()) -> dict[tuple[str, str, int], list[int]]:
    """The sizes to bisect a sweep's flagged intervals at, per (op, link, procs), from its point summaries
    (records.SUMMARY_COLUMNS), leaving out the points at `held_out` requested sizes: those are measured to check a
    fit at sizes it never saw, so they must not steer what it sees."""
    rows = summary[~summary["requested_bytes"].isin(held_out)].rename(columns={"median_s": "seconds"})
    out: dict[tuple[str, str, int], list[int]] = {}
    for c in hidden_changes(rows):
        if c.suggest:
            out.setdefault((c.op, c.link, c.procs), []).extend(c.suggest)
    return out
