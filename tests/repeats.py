"""Two validates of one calibration scored against each other: the tests' measure of how well a calibration ranks
and prices strategies, beside what a second measurement of the same machine gives."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analysis import ranking
from benchmarks import validate as bench_validate

# How much worse than a second validate the calibration may rank a validate's strategies (comm Kendall tau): the
# noise of one validate against another, plus that of the sweep, one more launch.
RANK_MARGIN = 0.15

# How much worse than a second validate the calibration may price a validate's communication (comm mean accuracy)
# before a miss of the target is the calibration's: the calibration comes from one more launch than the repeat, and
# over 26 stored control validates of 2026-11-27/28 it scored 0.005-0.022 below the repeat (median 0.011).
ACCURACY_MARGIN = 0.03


@dataclass(frozen=True)
class Validates:
    """Two validates of one calibration (slurm/validate.sh or bench_validate): each run's metrics and strategies."""

    metrics: list[dict]
    tables: list[pd.DataFrame]

    def against_repeat(self, name: str, margin: float) -> list[str]:
        """Per validate, the calibration's `name` beside the other validate's as its prediction; lines that end
        in MISSED where the calibration does worse by more than `margin` (higher is better but for the metrics
        bench_validate.TARGETS bounds from above)."""
        lower = any(n == name and op == "<=" for n, op, _ in bench_validate.TARGETS)
        lines = []
        for a, b in ((0, 1), (1, 0)):
            repeat = ranking.flat(ranking.frame_scores(ranking.repeat_frame(self.tables[b], self.tables[a]), 3, 0, 0))
            cal, rep = self.metrics[a][name]["value"], repeat[name]["value"]
            worse = rep - cal if lower else cal - rep
            lines.append(f"validate {a + 1}: {name} calibration {cal:.4f}, validate {b + 1} {rep:.4f}, "
                         f"margin {margin}" + ("" if worse >= -margin else "  MISSED"))
        print("\n".join(lines))
        return lines
