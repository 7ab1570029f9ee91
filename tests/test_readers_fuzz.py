"""Every reader of a run or a calibration survives what a sweep can write and what a user can hand it: copies of a
real sweep's run directory, and of the calibration `commcal fit` makes of it, each broken one listed way, go
through report, fit, diff, table, predict and validate's calibration loader. A reader answers exit 0, or exit 2
with one line on stderr, never a traceback; a report that left something out says so in its page.

Readers run in this process (through the same dispatcher as the console) with figures laid out but not encoded,
which is most of a figure's cost; test_console_entry_points runs a representative few as real processes."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import sys
import traceback
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis import validate_cmd, validate_plan
from analysis.mesh import parse_mesh
from conftest import run_cli, run_mpi
from reports.cli import build_parser, main
from microbench.errors import UsageError
from microbench.records import load_summary
from microbench.store import CONSOLIDATED, RunStore

pytestmark = pytest.mark.mpi   # the base run is a real sweep

PREDICT = ["--op", "allreduce", "--link", "intra", "--procs", "2", "--bytes", "1K"]


@dataclass(frozen=True)
class Outcome:
    """What one reader did with one input."""

    code: int
    stderr: str

    def problems(self) -> list[str]:
        lines = self.stderr.strip().splitlines()
        return [why for why, bad in (
            (f"exit {self.code}", self.code not in (0, 2)), ("a traceback", "Traceback" in self.stderr),
            ("a numpy warning", "RuntimeWarning" in self.stderr),
            (f"{len(lines)} lines on stderr with exit 2", self.code == 2 and len(lines) != 1)) if bad]


def capture(call: Callable[[], int]) -> Outcome:
    """Run a reader here: its exit code and stderr; an exception that escapes is the traceback a user would see, and
    a RuntimeWarning (which pytest would otherwise keep from stderr) the line a user would see."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        try:
            code = call()
        except Exception:   # noqa: BLE001 - any escape is the failure under test
            code = 1
            err.write(traceback.format_exc())
    err.writelines(f"{w.filename}:{w.lineno}: RuntimeWarning: {w.message}\n" for w in caught
                   if issubclass(w.category, RuntimeWarning))
    return Outcome(code, err.getvalue())


def commcal(*argv) -> Outcome:
    return capture(lambda: main([str(a) for a in argv]))


def validate_loader(cal: Path, work: Path, *argv) -> Outcome:
    """What `commcal validate CAL ARGV` (default --quick) does before MPI starts the harness, on a one-node mesh of
    two ranks; a UsageError is its one line and exit 2, as the dispatcher makes it."""
    def load() -> int:
        parser, _ = build_parser("validate")
        args = parser.parse_args(["validate", str(cal), "--out", str(work / "validation"),
                                  *(map(str, argv) if argv else ["--quick"])])
        try:
            cfg, layers, calibration = validate_cmd.prepare(args)
            validate_plan.plan(args, cfg, layers, calibration, parse_mesh("2", 2, 2))
        except UsageError as exc:
            print(f"commcal: error: {exc}", file=sys.stderr)
            return 2
        return 0
    return capture(load)


def problems(outcomes: dict[str, Outcome]) -> list[str]:
    return [f"{reader}: {why}:\n{o.stderr}" for reader, o in outcomes.items() for why in o.problems()]


# ---------------------------------------------------------------------------------------------- run mutations
# A mutation changes a copy of the base run in place; `rng` (seeded by the case's id) picks the points it hits.

Mutation = Callable[[Path, np.random.Generator], None]
Pick = Callable[[list, np.random.Generator], list[int]]


def some(k: int) -> Pick:
    """k points (indices into the records), chosen by the case's seed."""
    return lambda rows, rng: sorted(rng.choice(len(rows), size=min(k, len(rows)), replace=False).tolist())


def every(rows, rng) -> list[int]:
    return list(range(len(rows)))


def records(d: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted((d / "points").glob("*.json"))]


def rewrite(d: Path, change: Callable[[list[dict]], list[dict]],
            samples: Callable[[str, np.ndarray], np.ndarray] = lambda pid, t: t) -> None:
    """Replace the point records by change(records) (the samples of points it drops go too; `samples` maps a kept
    point's times to new ones) and consolidate again, as a sweep ending now would."""
    rows = change(records(d))
    keep = {r["point_id"] for r in rows}
    for f in (d / "points").iterdir():
        if f.stem not in keep:
            f.unlink()
    for r in rows:
        (d / "points" / f"{r['point_id']}.json").write_text(json.dumps(r))
        path = d / "points" / f"{r['point_id']}.parquet"
        table = pq.read_table(path)
        times = samples(r["point_id"], table.column("time_s").to_numpy())
        column = table.schema.get_field_index("time_s")
        pq.write_table(table.slice(0, len(times)).set_column(column, "time_s", pa.array(times)), path)
    RunStore(d).consolidate()


def edit_rows(which: Pick, **values: Callable[[dict], object]) -> Mutation:
    """Set, in the records `which` picks, each named field to values[field](record)."""
    def mutate(d: Path, rng) -> None:
        def change(rows):
            for i in which(rows, rng):
                rows[i].update({k: f(rows[i]) for k, f in values.items()})
            return rows
        rewrite(d, change)
    return mutate


TIMES = ("median_s", "ci_low_s", "ci_high_s", "min_s", "p95_s", "mean_s")


def scale_times(which: Pick, factor: Callable[[dict], float]) -> Mutation:
    """Multiply the times of the points `which` picks (record and samples) by factor(record)."""
    def mutate(d: Path, rng) -> None:
        rows = records(d)
        factors = {rows[i]["point_id"]: factor(rows[i]) for i in which(rows, rng)}

        def change(rows):
            for r in rows:
                r.update({k: r[k] * factors[r["point_id"]] for k in TIMES} if r["point_id"] in factors else {})
            return rows
        rewrite(d, change, lambda pid, t: t * factors.get(pid, 1.0))
    return mutate


def one_sample(d: Path, rng) -> None:
    """One point holds a single sample, as a point of a sweep cut off in its first batch would."""
    rows = records(d)
    (i,) = some(1)(rows, rng)
    target = rows[i]["point_id"]
    t0 = pq.read_table(d / "points" / f"{target}.parquet").column("time_s")[0].as_py()
    rows[i].update(samples=1, median_s=t0, min_s=t0, p95_s=t0, mean_s=t0, ci_low_s=math.nan, ci_high_s=math.nan,
                   target_met=False, rounds=1, round_spread=0.0)
    rewrite(d, lambda _: rows, lambda pid, t: t[:1] if pid == target else t)


def keep_rows(pick: Callable[[list[dict]], list[dict]]) -> Mutation:
    return lambda d, rng: rewrite(d, pick)


def first_size_of_each_curve(rows: list[dict]) -> list[dict]:
    smallest = {}
    for r in rows:
        key = (r["op"], r["link"], r["procs"], r["dtype"])
        if key not in smallest or r["requested_bytes"] < smallest[key]["requested_bytes"]:
            smallest[key] = r
    return list(smallest.values())


def edit_summary(change: Callable[[pd.DataFrame], pd.DataFrame], csv_only: bool = False) -> Mutation:
    """Change the consolidated summary (summary.parquet and summary.csv alike, or the CSV only)."""
    def mutate(d: Path, rng) -> None:
        frame = change(pd.read_parquet(d / "summary.parquet"))
        if not csv_only:
            frame.to_parquet(d / "summary.parquet", index=False)
        frame.to_csv(d / "summary.csv", index=False)
    return mutate


def edit_samples(change: Callable[[pd.DataFrame], pd.DataFrame]) -> Mutation:
    def mutate(d: Path, rng) -> None:
        change(pd.read_parquet(d / "samples.parquet")).to_parquet(d / "samples.parquet", index=False)
    return mutate


def truncate(name: str | None) -> Mutation:
    """Cut a file (`name`, or a point record the seed picks) at a seeded offset in its middle half."""
    def mutate(d: Path, rng) -> None:
        path = d / name if name else rng.choice(sorted((d / "points").glob("*.json")))
        data = path.read_bytes()
        path.write_bytes(data[:int(rng.integers(len(data) // 4, 3 * len(data) // 4))])
    return mutate


def remove(*names: str) -> Mutation:
    """Delete files; a directory is emptied."""
    def mutate(d: Path, rng) -> None:
        for name in names:
            if (d / name).is_dir():
                shutil.rmtree(d / name)
                (d / name).mkdir()
            else:
                (d / name).unlink()
    return mutate


cut_short = remove(*CONSOLIDATED)
"""What a sweep killed before it consolidated leaves: run.json and points/ only."""


def then(*steps: Mutation) -> Mutation:
    def mutate(d: Path, rng) -> None:
        for step in steps:
            step(d, rng)
    return mutate


def edit_points(*damage: Callable[[dict], object]) -> Mutation:
    """Cut the run short, then replace point records (the seed picks which) by damage[i](record): JSON that
    `commcal sweep` never writes but a hand or a broken disk can."""
    def mutate(d: Path, rng) -> None:
        cut_short(d, rng)
        files = sorted((d / "points").glob("*.json"))
        for f, change in zip(rng.permutation(files), damage):
            f.write_text(json.dumps(change(json.loads(f.read_text()))))
    return mutate


def without(*keys: str) -> Callable[[dict], dict]:
    return lambda r: {k: v for k, v in r.items() if k not in keys}


def put(**values) -> Callable[[dict], dict]:
    return lambda r: r | values


def run_json(change: Callable[[dict], object] | str) -> Mutation:
    """run.json rewritten as change(meta), or as the text given."""
    def mutate(d: Path, rng) -> None:
        path = d / "run.json"
        path.write_text(change if isinstance(change, str) else json.dumps(change(json.loads(path.read_text()))))
    return mutate


def point_file(content: bytes | None) -> Mutation:
    """Cut the run short, then overwrite one point record (the seed picks it) with `content`, or put a directory
    in its place (None)."""
    def mutate(d: Path, rng) -> None:
        cut_short(d, rng)
        path = rng.choice(sorted((d / "points").glob("*.json")))
        path.unlink()
        path.mkdir() if content is None else path.write_bytes(content)
    return mutate


def empty(d: Path, rng) -> None:
    shutil.rmtree(d)
    d.mkdir()


def nan(_r) -> float:
    return math.nan


@dataclass(frozen=True)
class Case:
    id: str
    mutate: Mutation
    page: str | None = None      # what report.html must say (the report must then draw the run)
    overlay: bool = False        # it changes measured values: report them under the calibration's model too


DROPPED = "point(s) left out, "
NO_BARS = "point(s) drawn without error bars, "
BAD_MEDIAN = f"{DROPPED}a median that is not a positive number of seconds"
UNDRAWN = f"{DROPPED}a median outside the times a figure draws"
NO_CI = f"{NO_BARS}no confidence interval"
BAD_CI = f"{NO_BARS}a confidence interval that is not a positive interval around the median"
RUN_CASES = [
    Case("as_swept", lambda d, rng: None),
    Case("negative_ci_low", edit_rows(some(3), ci_low_s=lambda r: -0.5 * r["median_s"]), f"3 {BAD_CI}", True),
    Case("nan_ci", edit_rows(some(2), ci_low_s=nan, ci_high_s=nan), f"2 {NO_CI}", True),
    Case("one_sided_ci", edit_rows(some(1), ci_high_s=nan), f"1 {BAD_CI}", True),
    Case("inf_ci", edit_rows(some(1), ci_low_s=lambda r: -math.inf, ci_high_s=lambda r: math.inf), f"1 {BAD_CI}",
         True),
    Case("ci_not_around_median", edit_rows(some(1), ci_low_s=lambda r: 2 * r["median_s"],
                                           ci_high_s=lambda r: r["median_s"] / 2), f"1 {BAD_CI}", True),
    Case("one_sample", one_sample, f"1 {NO_CI}", True),
    Case("one_size", keep_rows(first_size_of_each_curve), overlay=True),
    Case("one_op", keep_rows(lambda rows: [r for r in rows if r["op"] == "pingpong"]), overlay=True),
    Case("one_point", keep_rows(lambda rows: rows[:1]), overlay=True),
    Case("zero_times", scale_times(some(1), lambda r: 0.0), f"1 {BAD_MEDIAN}", True),
    Case("negative_times", scale_times(some(1), lambda r: -1.0), f"1 {BAD_MEDIAN}", True),
    Case("all_times_zero", scale_times(every, lambda r: 0.0), BAD_MEDIAN, True),
    Case("nan_median", edit_rows(some(1), median_s=nan), f"1 {BAD_MEDIAN}", True),
    Case("huge_times", scale_times(some(2), lambda r: 1e300 / r["median_s"]), f"2 {UNDRAWN}", True),
    Case("tiny_times", scale_times(some(2), lambda r: 1e-300 / r["median_s"]), f"2 {UNDRAWN}", True),
    Case("summary_missing_ci_columns", edit_summary(lambda s: s.drop(columns=["ci_low_s", "ci_high_s"])),
         "the summary has no ci_low_s or ci_high_s"),
    Case("summary_missing_median", edit_summary(lambda s: s.drop(columns=["median_s"]))),
    Case("summary_only_point_ids", edit_summary(lambda s: s[["point_id"]])),
    Case("summary_wrong_types", edit_summary(lambda s: s.astype({"procs": str, "median_s": str}).assign(
        median_s=lambda f: ["fast", *f["median_s"][1:]])), f"1 {BAD_MEDIAN}"),
    Case("summary_duplicate_row", edit_summary(lambda s: pd.concat([s, s.iloc[:1]], ignore_index=True))),
    Case("summary_empty", edit_summary(lambda s: s.iloc[:0])),
    Case("summary_truncated", truncate("summary.parquet")),
    Case("summary_csv_missing_columns", edit_summary(lambda s: s.drop(columns=["ci_low_s", "median_s"]),
                                                     csv_only=True)),
    Case("summary_csv_truncated", truncate("summary.csv")),
    Case("samples_truncated", truncate("samples.parquet")),
    Case("samples_without_round", edit_samples(lambda s: s.drop(columns=["round"]))),
    Case("samples_of_other_points", edit_samples(lambda s: s.assign(point_id=s["point_id"].astype(str) + "-x"))),
    Case("cut_short", cut_short),
    Case("cut_short_csv_truncated", then(truncate("summary.csv"), remove("summary.parquet", "samples.parquet"))),
    Case("cut_short_point_missing_keys", edit_points(
        without("ci_low_s", "ci_high_s"), without("wrong", "rounds", "target_met"), without("median_s"),
        without("op"), without("backend", "dtype")), f"1 {DROPPED}not a known operation"),
    Case("cut_short_point_extra_keys", edit_points(*[put(colour="red", nested={"a": [1]})] * 3)),
    Case("cut_short_point_wrong_types", edit_points(
        put(median_s="fast"), put(procs="two"), put(size_bytes=None), put(op=7), put(requested_bytes=[1, 2]),
        put(ci_low_s={"lo": 1}), put(wrong="none")), f"1 {DROPPED}a process count that is not a whole number"),
    Case("cut_short_point_not_object", edit_points(lambda r: [1, 2])),
    Case("cut_short_point_without_id", edit_points(without("point_id"), put(point_id=None))),
    Case("cut_short_stray_record", then(cut_short, lambda d, rng: (d / "points" / "zz.json").write_text(
        '{"median_s": 1.0}'))),
    Case("bisect_record_garbage", lambda d, rng: (d / "bisect.json").write_text('{"passes": "x", "points": 5}')),
    Case("cut_short_point_beyond_any_count", edit_points(
        put(size_bytes=1e300), put(groups=math.inf), put(procs=10 ** 30), put(dtype="weird"), put(launches=-math.inf)),
        f"1 {DROPPED}a size that is not a positive number of bytes"),
    Case("cut_short_point_not_utf8", point_file(b'{"op": "\xff\xfe"}')),
    Case("cut_short_point_deeply_nested", point_file(b"[" * 100000 + b"]" * 100000)),
    Case("cut_short_point_a_directory", point_file(None)),
    Case("samples_bad_rounds", edit_samples(lambda s: s.assign(
        round=np.where(np.arange(len(s)) % 3 == 0, np.nan, np.where(np.arange(len(s)) % 3 == 1, 1e30, 0.0))))),
    Case("cut_short_point_truncated", then(cut_short, truncate(None))),
    Case("cut_short_samples_missing", then(cut_short, lambda d, rng: rng.choice(
        sorted((d / "points").glob("*.parquet"))).unlink())),
    Case("empty_dir", empty),
    Case("no_points", then(cut_short, remove("points"))),
    Case("run_json_missing", remove("run.json")),
    Case("run_json_garbage", run_json("{not json")),
    Case("run_json_not_object", run_json("[1, 2, 3]")),
    Case("run_json_wrong_types", run_json(put(
        hosts=5, versions=[1], cpu_steal="high", mpi_library_version=7, start_time=None, ranks_per_node="x",
        run_id=12, backend=None, page_policy=3, environment="x", layout={"a": 1}, machine=["m"]))),
    Case("run_json_bad_options", run_json(put(options="fast"))),
    Case("run_json_options_out_of_range", run_json(put(options={"cache": "hot", "gap_ms": -5, "after_gemm": -1}))),
    Case("run_json_control_characters", run_json(put(mpi_library_version="Open MPI v5\x00\x07", machine="node\x00",
                                                     hosts=["a\x1b[31m"]))),
    Case("run_json_other_version", run_json(put(version=99))),
    Case("run_json_huge_integer", run_json('{"x": 1' + "0" * 400 + ', "schema": "commcal.run"}')),
]


# ------------------------------------------------------------------------------------- calibration mutations

def model(cal: dict) -> dict:
    """The calibration's first model."""
    return next(iter(next(iter(cal["models"].values())).values()))


def set_in(where: Callable[[dict], dict], **values) -> Callable[[dict], dict]:
    def change(cal: dict) -> dict:
        where(cal).update(values)
        return cal
    return change


def older(version: int) -> Callable[[dict], dict]:
    """The calibration as an older commcal wrote it: that version, without the keys added since (calibration.READS)."""
    def change(cal: dict) -> dict:
        cal["version"] = version
        for run in cal["provenance"]["runs"]:
            for key, since in (("page_policy", 8), ("after_gemm", 6), ("gap_ms", 5), ("cache", 4)):
                if version < since:
                    run.pop(key, None)
        for m in (m for by_link in cal["models"].values() for m in by_link.values()):
            if version < 8:
                m.pop("min_segment_sizes", None)
        if version < 3:
            cal["compute"].pop("copy", None)
            for g in cal["compute"]["gemm"].values():
                g.pop("latency_s", None)
                g.pop("groups_per_node", None)
        if version < 2:
            for lc in cal["link_classes"].values():
                lc.pop("groups_per_node", None)
        return cal
    return change


def every_model(alpha: float, beta: float) -> Callable[[dict], dict]:
    """Every model and segment given this alpha and beta (the schema allows any number)."""
    def change(cal: dict) -> dict:
        for m in (m for by_link in cal["models"].values() for m in by_link.values()):
            for part in (m, *m["segments"]):
                part.update(alpha_s=alpha, beta_s_per_byte=beta)
        return cal
    return change


def every_segment(cal: dict, **values) -> dict:
    """The calibration with these values in every segment of every model."""
    for seg in (s for by_link in cal["models"].values() for m in by_link.values() for s in m["segments"]):
        seg.update(values)
    return cal


def every_gemm(**values) -> Callable[[dict], dict]:
    def change(cal: dict) -> dict:
        for g in cal["compute"]["gemm"].values():
            g.update(values)
        return cal
    return change


@dataclass(frozen=True)
class CalCase:
    id: str
    change: Callable
    loads: bool                  # the loader accepts it: report, table and diff then exit 0, else every reader 2
    text: bool = False           # change maps the file's text, not its JSON


CAL_CASES = [
    CalCase("as_fitted", lambda cal: cal, True),
    CalCase("truncated", lambda text: text[: len(text) // 2], False, text=True),
    CalCase("empty_file", lambda text: "", False, text=True),
    CalCase("not_object", lambda cal: [cal], False),
    CalCase("nan_value", lambda text: text.replace('"alpha_s": ', '"alpha_s": NaN, "x": ', 1), False, text=True),
    CalCase("version_7", older(7), True),
    CalCase("version_1", older(1), True),
    CalCase("not_utf8", lambda text: text.encode()[:200] + b"\xff\xfe" + text.encode()[200:], False, text=True),
    CalCase("deeply_nested", lambda text: "[" * 100000 + "]" * 100000, False, text=True),
    CalCase("huge_integer", lambda text: text.replace('"alpha_s": ', '"alpha_s": 1' + "0" * 400 + ', "x": ', 1), False,
            text=True),
    CalCase("future_version", set_in(lambda c: c, version=99), False),
    CalCase("wrong_type", set_in(model, alpha_s="fast"), False),
    CalCase("models_a_list", set_in(lambda c: c, models=[]), False),
    CalCase("missing_key", lambda cal: {k: v for k, v in cal.items() if k != "fit"}, False),
    CalCase("unknown_key", set_in(lambda c: c, colour="red"), False),
    CalCase("no_models", set_in(lambda c: c, models={}, hockney=[], p2p={}), True),
    CalCase("no_segments", set_in(model, segments=[]), False),
    CalCase("unknown_algorithm", set_in(model, algorithm="telepathy"), False),
    CalCase("negative_parameters", every_model(-1e-3, -1e-9), True),
    CalCase("huge_parameters", every_model(1e300, 1e300), True),
    CalCase("tiny_parameters", every_model(1e-300, 1e-300), True),
    CalCase("zero_gemm_rate", every_gemm(flops_per_s=0.0, peak_flops_per_s=0.0), True),
    CalCase("no_gemm", set_in(lambda c: c["compute"], gemm={}), True),
    CalCase("huge_standard_errors", lambda cal: every_segment(cal, alpha_se_s=1e200, beta_se_s_per_byte=1e200), True),
    CalCase("segment_min_above_max", lambda cal: every_segment(cal, min_bytes=1e15), False),
    CalCase("model_on_a_missing_link", set_in(lambda c: c, link_classes={}), False),
]


# --------------------------------------------------------------------------------------------------- readers

def calibration_readers(cal: Path, base_cal: Path, work: Path, report: bool) -> dict[str, Outcome]:
    """predict, table, diff against the base calibration (with its page), validate's loader and, where asked, a
    report of the calibration alone."""
    out = {"report": commcal("report", "--calibration", cal, "--out", work / "cal-report")} if report else {}
    return out | {"diff": commcal("diff", base_cal, cal, "--out", work / "diff"), "table": commcal("table", cal),
                  "predict": commcal("predict", cal, *PREDICT), "loader": validate_loader(cal, work)}


def run_readers(run: Path, base_cal: Path, work: Path, overlay: bool) -> dict[str, Outcome]:
    """report (with the base calibration's model and residuals where asked) and fit of a run; then the readers of
    the calibration fit from it, where there is one."""
    model = ["--calibration", base_cal] if overlay else []
    out = {"report": commcal("report", "--run", run, *model, "--out", work / "report"),
           "fit": commcal("fit", run, "--out", work / "cal.json", "--quiet")}
    if out["fit"].code == 0:
        out |= calibration_readers(work / "cal.json", base_cal, work, report=False)
    return out


def mutated_run(base: Path, case: Case, where: Path) -> Path:
    run = where / case.id
    shutil.copytree(base, run)
    case.mutate(run, np.random.default_rng(zlib.crc32(case.id.encode())))
    return run


def mutated_calibration(base: Path, case: CalCase, where: Path) -> Path:
    path = where / f"{case.id}.json"
    text = base.read_text()
    changed = case.change(text) if case.text else json.dumps(case.change(json.loads(text)), indent=1)
    path.write_bytes(changed if isinstance(changed, bytes) else changed.encode())
    return path


@pytest.fixture(scope="session")
def base_run(tmp_path_factory) -> Path:
    """A real sweep of 2 ranks: three operations, three sizes, a short budget per point."""
    out = tmp_path_factory.mktemp("fuzz") / "run"
    run_mpi(2, ["sweep", "--quick", "--ops", "pingpong,allreduce,gemm", "--sizes", "8,1K,64K", "--point-budget", "0.1",
                "--out", str(out)], timeout=180, check=True)
    return out


@pytest.fixture(scope="session")
def base_cal(base_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fuzz-cal") / "cal.json"
    fitted = commcal("fit", base_run, "--out", out, "--quiet")
    assert fitted.code == 0, fitted.stderr
    return out


def test_a_real_sweep_writes_intervals_that_obey_the_rule_and_a_clean_mpi_banner(base_run):
    summary = pd.read_parquet(base_run / "summary.parquet")
    top = pd.read_parquet(base_run / "samples.parquet").groupby("point_id", observed=True)["time_s"].max()
    lo, hi, median = summary["ci_low_s"], summary["ci_high_s"], summary["median_s"]
    within = (summary["min_s"] <= lo) & (lo <= median) & (median <= hi) & (hi <= summary["point_id"].map(top))
    assert (within | (lo.isna() & hi.isna())).all(), summary[~within]
    banner = json.loads((base_run / "run.json").read_text())["mpi_library_version"]
    assert banner and banner == banner.strip() and "\x00" not in banner


def test_a_resumed_run_cut_short_reads_what_it_added(base_run, tmp_path):
    """A resumed sweep starts by removing the consolidated files: if it is killed, readers see the visits it added
    to points/, not the summary the earlier sweep ended with."""
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    store = RunStore(run)
    store.start(json.loads((run / "run.json").read_text()))
    assert not any((run / name).exists() for name in CONSOLIDATED)
    point = records(run)[0] | {"median_s": 1.0, "rounds": 9}
    (run / "points" / f"{point['point_id']}.json").write_text(json.dumps(point))   # as a resumed visit writes it
    assert load_summary(run).set_index("point_id").loc[point["point_id"], "rounds"] == 9


@pytest.mark.parametrize("case", RUN_CASES, ids=lambda c: c.id)
def test_every_reader_survives_a_damaged_run(case, base_run, base_cal, tmp_path, laid_out_only):
    outcomes = run_readers(mutated_run(base_run, case, tmp_path), base_cal, tmp_path, case.overlay)
    assert not problems(outcomes)
    if case.page:
        assert outcomes["report"].code == 0, outcomes["report"].stderr
        assert case.page in (tmp_path / "report" / "report.html").read_text()


@pytest.mark.parametrize("case", CAL_CASES, ids=lambda c: c.id)
def test_every_reader_survives_a_damaged_calibration(case, base_cal, tmp_path, laid_out_only):
    outcomes = calibration_readers(mutated_calibration(base_cal, case, tmp_path), base_cal, tmp_path, report=True)
    assert not problems(outcomes)
    codes = {reader: o.code for reader, o in outcomes.items()}
    if case.loads:
        assert codes["report"] == codes["table"] == codes["diff"] == 0, codes
    else:
        assert set(codes.values()) == {2}, codes


def test_console_entry_points(base_run, base_cal, tmp_path):
    """A few readers as the console runs them, figures encoded: exit 0, or one line and exit 2."""
    runs, cals = ({c.id: c for c in cases} for cases in (RUN_CASES, CAL_CASES))

    def run(case: str) -> Path:
        return mutated_run(base_run, runs[case], tmp_path)

    def cal(case: str) -> Path:
        return mutated_calibration(base_cal, cals[case], tmp_path)

    commands = {  # name: (argv, exit code)
        "report negative_ci_low": (["report", "--run", run("negative_ci_low"), "--calibration", base_cal,
                                    "--out", tmp_path / "report"], 0),
        "fit cut_short_point_wrong_types": (["fit", run("cut_short_point_wrong_types"), "--out", tmp_path / "c"], 0),
        "predict no_models": (["predict", cal("no_models"), *PREDICT], 2),
        "table version_1": (["table", cal("version_1")], 0),
        "diff negative_parameters": (["diff", base_cal, cal("negative_parameters"), "--out", tmp_path / "diff"], 0),
        "validate truncated": (["validate", cal("truncated"), "--quick", "--out", tmp_path / "validation"], 2)}
    done = {name: run_cli([str(a) for a in argv], timeout=120) for name, (argv, _) in commands.items()}
    assert not problems({name: Outcome(p.returncode, p.stderr) for name, p in done.items()})
    assert {name: p.returncode for name, p in done.items()} == {name: code for name, (_, code) in commands.items()}
    html = (tmp_path / "report" / "report.html").read_text()
    assert runs["negative_ci_low"].page in html and html.count("data:image/png;base64,") >= 3
    assert (tmp_path / "diff" / "figures" / "diff.png").stat().st_size > 0
