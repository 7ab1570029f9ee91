"""Where validate's prediction error comes from: communication accuracy over the strategies grouped by the
link class that carries most of their measured communication, and each collective's measured over predicted
step time per link class. Pure pandas over validate's strategies and steps tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from analysis import ranking
from analysis.colossal import ROOTED
from analysis.redistribute import COLLECTIVES
from calib.result import Speeds
from microbench.stats import SPEED_GAP

KEY = ["layer", "strategy"]


def _collective_steps(steps: pd.DataFrame) -> pd.DataFrame:
    return steps[steps["op"].isin(COLLECTIVES + ROOTED)]


def dominant_link(steps: pd.DataFrame) -> pd.Series:
    """Per (layer, strategy) with collective steps: the link class whose collectives took the largest part of
    its measured time (the first in name order on a tie)."""
    per_link = _collective_steps(steps).groupby(KEY + ["link"])["measured_s"].sum().reset_index()
    per_link = per_link.sort_values(KEY + ["measured_s", "link"], ascending=[True, True, False, True])
    return per_link.drop_duplicates(KEY).set_index(KEY)["link"].rename("comm_link")


def link_accuracy(frame: pd.DataFrame, steps: pd.DataFrame, resamples: int, seed: int) -> dict:
    """{link: {"strategies": n, "comm_mean_accuracy": {"value", "ci95"}}} over the communicating strategies of
    validate's table `frame`, grouped by dominant_link; the CI bootstraps each layer's strategies."""
    rows = frame[frame["comm_steps"] > 0].join(dominant_link(steps), on=KEY).dropna(subset=["comm_link"])
    out = {}
    for link, group in rows.groupby("comm_link"):
        layers = [(g["predicted_comm_s"].to_numpy(), g["measured_comm_s"].to_numpy())
                  for _, g in group.groupby("layer", sort=False)]
        acc = ranking.score(layers, 1, resamples, seed)["mean_accuracy"]
        out[str(link)] = {"strategies": len(group), "comm_mean_accuracy": acc.to_json()}
    return out


OFF_PRICE = 0.05
"""How far from their price (median measured / predicted time, minus 1) a collective's steps may run and still count as
priced: the 5% of the accuracy target (comm mean accuracy >= 0.95)."""

VERDICTS = {
    "priced": f"within {OFF_PRICE:.0%} of the price",
    "slow_speed": "at a slow speed the calibration records",
    "slower": "slower than priced, at no speed the calibration records",
    "faster": "faster than priced",
}
"""What a collective's steps say of its price (verdict), and how validate words it."""


def verdict(median: float, slow_ratio: float | None) -> str:
    """The VERDICTS key of a collective's median step ratio: "slow_speed" where the calibration priced it at the fast
    one of several speeds and the steps ran from SPEED_GAP over the price (the least a slow speed lies above a fast
    one) up to the slowest speed it records (`slow_ratio`), each bound widened by OFF_PRICE for the price's own error;
    a launch that drew a recorded slow speed is not a pricing error, a step off its price otherwise is."""
    if abs(median - 1) <= OFF_PRICE:
        return "priced"
    if median < 1:
        return "faster"
    if slow_ratio is not None and (1 + SPEED_GAP) / (1 + OFF_PRICE) <= median <= slow_ratio * (1 + OFF_PRICE):
        return "slow_speed"
    return "slower"


def slow_launch(ratios: list[dict]) -> bool:
    """Every collective of a validate ran more than OFF_PRICE slower than priced (step_ratios' verdicts slower or
    slow_speed): the launch ran slow throughout (a slow mode for the whole launch, other load), or the calibration
    prices everything too fast; a second launch tells which. A recorded slow speed does not clear it: a model's slowest
    recorded speed may come from another size (a latency-bound point's scheduling outlier, hundreds of times its
    price), and one launch drawing slow speeds in every collective at once is the launch's draw, not the prices'."""
    return bool(ratios) and all(r["verdict"] in ("slower", "slow_speed") for r in ratios)


def step_ratios(steps: pd.DataFrame, speeds: Mapping[tuple[str, str], Sequence[Speeds]] | None = None) -> list[dict]:
    """Per (collective, link) with a positive price: how many steps, the median and quartiles of their measured over
    predicted time, and its verdict; where the calibration's model of it was priced at the fast one of several speeds
    at the sweep sizes around the sizes its steps were priced at (steps' priced_bytes, size_bytes in tables from
    before it; `speeds`: (op, link) -> its models' speeds; Speeds.ratio_at), also
    `sweep_slow_ratio`, the largest slow-over-price ratio there, and `slow_steps`, the steps that ran more than
    SPEED_GAP over their price: at a slow speed, as its sweep's calls did."""
    rows = _collective_steps(steps)
    rows = rows[rows["predicted_s"] > 0]
    if rows.empty:                   # no collective steps (a pipeline-only run)
        return []
    ratio = (rows["measured_s"] / rows["predicted_s"]).groupby([rows["op"], rows["link"]])
    q = ratio.quantile([0.25, 0.5, 0.75]).unstack()
    slow = ratio.apply(lambda r: int((r > 1 + SPEED_GAP).sum())) if speeds else None
    read_at = "priced_bytes" if "priced_bytes" in rows else "size_bytes"
    sizes = rows.groupby(["op", "link"])[read_at].agg(["min", "max"])
    out = []
    for (op, link), r in q.iterrows():
        seen = [s.ratio_at(*sizes.loc[(op, link)]) for s in (speeds or {}).get((op, link), ())]
        recorded = max((x for x in seen if x is not None), default=None)
        row = {"op": op, "link": link, "steps": int(ratio.size()[(op, link)]), "median": float(r[0.5]),
               "quartiles": [float(r[0.25]), float(r[0.75])], "verdict": verdict(float(r[0.5]), recorded)}
        if recorded is not None:
            row.update(sweep_slow_ratio=float(recorded), slow_steps=int(slow[(op, link)]))
        out.append(row)
    return out


def describe(by_link: dict, ratios: list[dict]) -> str:
    """link_accuracy and step_ratios as indented lines for a terminal (empty without any communication)."""
    if not by_link and not ratios:
        return ""
    lines = ["  comm_mean_accuracy by the link class carrying most of a strategy's communication:"]
    for link, v in by_link.items():
        lines.append(f"    {link:<8} {ranking.text(v['comm_mean_accuracy'])}  ({v['strategies']} strategies)")
    lines.append("  collective steps, measured / predicted time: median [quartiles] (steps)")
    for r in ratios:
        notes = ([f"{r['slow_steps']} over {1 + SPEED_GAP:.2f}x, priced at the fast one of the speeds its sweep's "
                  f"calls ran at (up to {r['sweep_slow_ratio']:.2f}x)"] if r.get("slow_steps") else [])
        notes += [VERDICTS[r["verdict"]]] if r.get("verdict") in VERDICTS and r["verdict"] != "priced" else []
        lines.append(f"    {r['op'] + '/' + r['link']:<22} {r['median']:.3f} [{r['quartiles'][0]:.3f}, "
                     f"{r['quartiles'][1]:.3f}] ({r['steps']})" + "".join(f"; {n}" for n in notes))
    return "\n".join(lines)
