"""Every reader of the other files commcal writes survives what their writers can leave and what a user can hand it:
copies of a real `commcal validate` directory (through report, and the readers a validation directory can be handed
to by mistake), of a real `commcal profile` file (through validate's loader, search and predict), of the
topology.conf `commcal scan` writes (through sweep's dry run, which reads it as a sweep does) and of the shipped
hardware spec
(through `calibration from-spec`), each broken one listed way. A reader answers exit 0, or exit 2 with one line on
stderr, never a traceback; a report that left something out says so in its page. test_readers_fuzz.py does the same
for run directories and calibrations, test_scan.py for scan directories."""

from __future__ import annotations

import json
import math
import shutil
import socket
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calib.synthetic import synthetic_calibration
from conftest import run_cli, run_mpi
from microbench.links import MAX_LEVEL
from microbench.switches import Inferred, Topology
from test_readers_fuzz import Outcome, commcal, empty, problems, put, set_in, validate_loader, without

SPEC = Path(__file__).parent.parent / "calib" / "selene.spec.json"
LAYER = "linear:m=8,k=8,n=16"
FAST = ["--budget", "0.005", "--min-samples", "2", "--target-ci", "0.5", "--bootstrap", "50"]
Change = Callable[[Path, np.random.Generator], None]
"""A change to a copy of a base file or directory, in place; `rng` (seeded by the case's id) picks where it cuts."""


@dataclass(frozen=True)
class Case:
    id: str
    change: Change
    page: tuple[str, ...] | None = None   # the report draws (exit 0) and its page says each of these
    says: str | None = None               # every reader refuses it (exit 2) with a line holding this; "": accepts it

    def unmet(self, outcomes: dict[str, Outcome]) -> list[str]:
        """The readers that did not do what `says` expects of them, beyond answering in one line."""
        if self.says is None:
            return []
        if self.says == "":
            return [f"{name} refused what it should read: {o.stderr}" for name, o in outcomes.items() if o.code]
        return [f"{name} did not refuse it with {self.says!r}: exit {o.code}, {o.stderr!r}"
                for name, o in outcomes.items() if o.code != 2 or self.says not in o.stderr]


SHORT = 300
"""A refusal's line, the input's path taken out, is shorter than this: a line a user reads, not the input echoed."""


def long_refusals(outcomes: dict[str, Outcome], path: Path) -> list[str]:
    """The readers whose refusal of `path` runs past SHORT characters with the path taken out (it echoed the input)."""
    return [f"{name} refused it in {len(o.stderr.replace(str(path), ''))} characters: {o.stderr[:200]!r}..."
            for name, o in outcomes.items() if o.code == 2 and len(o.stderr.replace(str(path), "")) >= SHORT]


def damaged(base: Path, case: Case, where: Path) -> Path:
    """A copy of `base` (a file or a directory) changed as `case` says."""
    path = where / (case.id + base.suffix)
    (shutil.copytree if base.is_dir() else shutil.copyfile)(base, path)
    case.change(path, np.random.default_rng(zlib.crc32(case.id.encode())))
    return path


# -------------------------------------------------------------------------------------------------- changes

def at(name: str, change: Change) -> Change:
    """`change` applied to the file `name` of a directory."""
    return lambda d, rng: change(d / name, rng)


def cut(path: Path, rng) -> None:
    """The file cut at a seeded offset in its middle half, as a full disk or a copy killed midway leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[:int(rng.integers(len(data) // 4, 3 * len(data) // 4))])


def text(content: bytes | str) -> Change:
    return lambda path, rng: path.write_bytes(content if isinstance(content, bytes) else content.encode())


def edit_json(change: Callable[[dict], object]) -> Change:
    """The JSON file rewritten as change(its object), NaN and infinities as Python's json writes them."""
    def mutate(path: Path, rng) -> None:
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return mutate


def a_directory(path: Path, rng) -> None:
    path.unlink()
    path.mkdir()


def removed(*names: str) -> Change:
    return lambda d, rng: [(d / n).unlink() for n in names]


def table(name: str, change: Callable[[pd.DataFrame], pd.DataFrame]) -> Change:
    """A table rewritten in both its forms (name.parquet and name.csv) as change(table)."""
    def mutate(d: Path, rng) -> None:
        frame = change(pd.read_parquet(d / f"{name}.parquet"))
        frame.to_parquet(d / f"{name}.parquet", index=False)
        frame.to_csv(d / f"{name}.csv", index=False)
    return mutate


def then(*steps: Change) -> Change:
    def mutate(path: Path, rng) -> None:
        for step in steps:
            step(path, rng)
    return mutate


# -------------------------------------------------------------------------------------------- validation dirs

def metric(name: str, **values) -> Callable[[dict], dict]:
    """summary.json with these values in one end-to-end metric."""
    return set_in(lambda s: s["metrics"][name], **values)


def ratios(**values) -> Callable[[dict], dict]:
    """summary.json with these values in every step ratio."""
    def change(s: dict) -> dict:
        for r in s["step_ratios"]:
            r.update(values)
        return s
    return change


SUMMARY, STRATEGIES = "summary.json", "strategies.parquet"
VALIDATION_CASES = [
    Case("as_written", lambda d, rng: None, ()),
    Case("summary_truncated", at(SUMMARY, cut)),
    Case("summary_empty", at(SUMMARY, text(""))),
    Case("summary_not_object", at(SUMMARY, text("[1, 2]"))),
    Case("summary_not_utf8", at(SUMMARY, text(b'{"metrics": {"\xff": 1}}'))),
    Case("summary_huge_integer", at(SUMMARY, text('{"metrics": {}, "x": 1' + "0" * 400 + "}"))),
    Case("summary_deeply_nested", at(SUMMARY, text("[" * 100000 + "]" * 100000))),
    Case("summary_no_metrics", at(SUMMARY, edit_json(without("metrics")))),
    Case("summary_metrics_a_list", at(SUMMARY, edit_json(put(metrics=[1])))),
    Case("summary_metric_wrong_types", at(SUMMARY, edit_json(metric("kendall_tau", value="high", ci95="wide")))),
    Case("summary_metric_nan_interval", at(SUMMARY, edit_json(metric("kendall_tau", ci95=[math.nan, 1.0])))),
    Case("summary_metric_infinite", at(SUMMARY, edit_json(metric("regret", value=math.inf)))),
    Case("summary_metric_beyond_any_axis", at(SUMMARY, edit_json(metric("regret", value=1e308, ci95=[0, 1e308]))),
         says="of magnitude"),
    Case("summary_layers_wrong_types", at(SUMMARY, edit_json(put(layers={"a": [1], "b": {"x": 2}})))),
    Case("summary_by_link_wrong_types", at(SUMMARY, edit_json(put(by_link={"intra": {"strategies": -1,
                                                                                      "comm_mean_accuracy": 5}})))),
    Case("summary_ratios_beyond_any_axis", at(SUMMARY, edit_json(ratios(median=1e308, quartiles=[-1e308, 1e308]))),
         says="of magnitude"),
    Case("summary_ratios_wrong_types", at(SUMMARY, edit_json(ratios(op=None, steps=2.5, quartiles="x")))),
    Case("summary_ratios_bad_verdict", at(SUMMARY, edit_json(ratios(verdict=3, slow_steps=-1)))),
    Case("summary_ratios_not_list", at(SUMMARY, edit_json(put(step_ratios={"a": 1})))),
    Case("summary_notes_not_list", at(SUMMARY, edit_json(put(notes="one")))),
    Case("odd_summary_and_provenance", then(
        at(SUMMARY, edit_json(metric("kendall_tau", value=7.0, ci95=[9.0, -3.0]))),
        at(SUMMARY, edit_json(metric("top1", value=None, ci95=None))),
        at(SUMMARY, edit_json(put(notes=[1, {"a": None}, "\x00\x1b[31m"], mesh=None, date=1e300, machine="a\x00b",
                                  version=99, world_size=-1))),
        at(SUMMARY, edit_json(ratios(median=0.0, quartiles=[-2.0, 0.0], steps=0))),
        at("run.json", edit_json(put(hosts=5, argv="x", cpu_steal={"vm": math.nan}, mesh=None, environment=[1],
                                     date=math.inf, version=99))),
        removed("steps.parquet", "steps.csv")), ()),
    Case("drawn_in_part", then(
        at(SUMMARY, edit_json(ratios(median=5.0, quartiles=[2.0, 1.0]))),
        table("strategies", lambda f: f.drop(columns=["predicted_comm_s", "measured_ci_low_s"])
              .assign(measured_s=np.where(np.arange(len(f)) == 0, 0.0, f["measured_s"])))),
         ("drawn without quartile bars", "no predicted_low_s, predicted_high_s, measured_ci_low_s, predicted_comm_s",
          "a time of 0")),
    Case("odd_strategies", then(
        table("strategies", lambda f: pd.concat([f, f.iloc[:2]]).assign(
            layer=1, strategy=np.arange(len(f) + 2), predicted_s=1e-3,
            measured_ci_low_s=lambda g: g["measured_s"] * 2, measured_ci_high_s=lambda g: g["measured_s"] / 2)),
        at(STRATEGIES, a_directory)), ()),
    Case("strategies_truncated", at(STRATEGIES, cut)),
    Case("strategies_csv_only_truncated", then(removed(STRATEGIES), at("strategies.csv", cut))),
    Case("strategies_csv_only_empty", then(removed(STRATEGIES), at("strategies.csv", text("")))),
    Case("strategies_no_rows", table("strategies", lambda f: f.iloc[:0])),
    Case("strategies_without_measured", table("strategies", lambda f: f.drop(columns=["measured_s"]))),
    Case("strategies_nan_measured", table("strategies", lambda f: f.assign(measured_s=np.where(
        np.arange(len(f)) % 2, np.nan, f["measured_s"])))),
    Case("strategies_negative_times", table("strategies", lambda f: f.assign(measured_s=-f["measured_s"]))),
    Case("strategies_infinite_times", table("strategies", lambda f: f.assign(predicted_s=np.inf))),
    Case("strategies_times_beyond_any", table("strategies", lambda f: f.assign(predicted_s=1e300))),
    Case("strategies_times_as_text", table("strategies", lambda f: f.assign(measured_s=f["measured_s"].astype(str)))),
    Case("strategies_comm_negative", table("strategies", lambda f: f.assign(measured_comm_s=-f["measured_s"]))),
    Case("strategies_nameless", table("strategies", lambda f: f.assign(layer=None))),
    Case("strategies_refined_not_bool", table("strategies", lambda f: f.assign(
        refined=np.where(np.arange(len(f)) % 2, "yes", None))), says="refined must hold true or false"),
    Case("run_json_truncated", at("run.json", cut)),
    Case("run_json_not_object", at("run.json", text("[1, 2, 3]"))),
    Case("killed_after_the_strategies", removed("strategies.csv", "steps.parquet", "steps.csv", SUMMARY, "run.json"),
         ("no ranking metrics",)),
    Case("strategies_missing", removed(STRATEGIES, "strategies.csv"), ("no strategies table",)),
    Case("empty_dir", empty),
]
"""A validate killed midway leaves the files it writes in order (strategies.parquet, .csv, steps, summary.json,
run.json), each whole; the others are what a disk, a copy or a hand can do. Cases that draw the report (a page) fold
several changes into one: a figure costs seconds."""


def validation_readers(d: Path, work: Path) -> dict[str, Outcome]:
    """report of the validation (the directory's only reader: diff, fit and the others refuse it by name, as
    test_each_output_handed_to_the_others_readers_is_one_line checks)."""
    return {"report": commcal("report", "--validation", d, "--out", work / "report")}


# ------------------------------------------------------------------------------------------------- profiles

def kernel(**values) -> Callable[[dict], dict]:
    """The profile with these values in its first kernel."""
    return set_in(lambda p: p["kernels"][0], **values)


def json_file_cases(unchanged: str, key: str) -> list[Case]:
    """A JSON file's own damage, whatever it holds: read as written (`unchanged`), cut short, empty, not an object,
    not UTF-8 (in the value of `key`), a directory in its place, nesting too deep to parse."""
    return [Case(unchanged, lambda p, rng: None, says=""), Case("truncated", cut), Case("empty", text("")),
            Case("not_object", text("[1]")), Case("not_utf8", text(b'{"' + key.encode() + b'": "\xff"}')),
            Case("a_directory", a_directory), Case("deeply_nested", text("[" * 100000 + "]" * 100000))]


PROFILE_CASES = [
    *json_file_cases("as_written", "format"),
    Case("nan", text('{"format": "commcal-profile", "version": 1, "ranks": NaN}')),
    Case("huge_integer", text('{"format": "commcal-profile", "version": 1, "ranks": 1' + "0" * 400 + "}")),
    Case("a_calibration", edit_json(put(format="commcal.calibration"))),
    Case("newer_version", edit_json(put(version=2))),
    Case("version_true", edit_json(put(version=True)), says="profile version True"),
    Case("missing_keys", edit_json(without("hosts", "created", "cpu_steal"))),
    Case("older_without_cpu_steal", edit_json(without("cpu_steal")), says=""),
    Case("ranks_beyond_any_job", edit_json(put(ranks=10 ** 30, ranks_per_node=10 ** 30)),
         says="ranks must be an integer from 1 to"),
    Case("no_kernels", edit_json(put(kernels=[]))),
    Case("kernel_beyond_any_time", edit_json(kernel(median_s=1e300)), says="median_s must be a positive number"),
    Case("every_kernel_beyond_any_time", edit_json(lambda p: p | {"kernels": [
        k | {"median_s": 1e308} for k in p["kernels"]]}), says="median_s must be a positive number"),
    Case("kernel_infinite", lambda p, rng: p.write_text(p.read_text().replace('"median_s": ', '"median_s": 1e999, '
                                                                                 '"x": ', 1)),
         says="median_s must be a positive number"),
    Case("kernel_tiny", edit_json(kernel(median_s=5e-324)), says=""),
    Case("kernel_shape_beyond_any", edit_json(kernel(operands=[[2 ** 62, 2 ** 62]], out=[2 ** 62]))),
    Case("kernel_unknown_dtype", edit_json(kernel(dtype="int4", expr=""))),
    Case("kernels_twice", edit_json(lambda p: p | {"kernels": p["kernels"] * 2})),
]
"""test_kernel_profile.py checks each of a profile's values alone; these are a real profile's file damaged, and values
that pass those checks but no writer of ours produces."""


def profile_readers(profile: Path, cal: Path, work: Path) -> dict[str, Outcome]:
    """validate's loader, search and predict of a layer, each pricing compute by the profile."""
    return {"validate": validate_loader(cal, work, "--layer", LAYER, "--profile", profile),
            "search": commcal("search", cal, "--model", LAYER, "--mesh", "2", "--profile", profile),
            "predict": commcal("predict", cal, "--layer", LAYER, "--strategy", "m", "--mesh", "2",
                               "--profile", profile)}


# ------------------------------------------------------------------------------------------------- topology

MORE = "names more than"
"""What a topology file naming more nodes than any machine has is refused with."""
DEEP = f"more than {MAX_LEVEL} switch levels"
"""What a switch chain deeper than commcal names is refused with, whichever order its lines list it in."""
TOPOLOGY_CASES = [
    Case("as_written", lambda p, rng: None, says=""),
    Case("truncated", cut),
    Case("empty", text("")),
    Case("not_utf8", text(b"SwitchName=s1 Nodes=\xff\xfe\n"), says="not UTF-8"),
    Case("binary", text(bytes(range(256)) * 4), says="not UTF-8"),
    Case("a_directory", a_directory, says="a directory, not a topology file"),
    Case("cycle", text("SwitchName=a Switches=b\nSwitchName=b Switches=a\n")),
    Case("unknown_switch", text("SwitchName=a Switches=zz\n")),
    Case("named_twice", text("SwitchName=a Nodes=n1\nSwitchName=a Nodes=n2\n")),
    Case("node_under_two_leaves", text("SwitchName=a Nodes=n1\nSwitchName=b Nodes=n1\n")),
    Case("switch_under_two", text("SwitchName=l Nodes=n1\nSwitchName=a Switches=l\nSwitchName=b Switches=l\n")),
    Case("bad_range", text("SwitchName=a Nodes=n[3-1]\n")),
    Case("range_not_numbers", text("SwitchName=a Nodes=n[a-b]\n")),
    Case("range_beyond_any_machine", text("SwitchName=a Nodes=n[1-99999999999]\n"), says=MORE),
    Case("range_end_beyond_any_integer", text("SwitchName=a Nodes=n[1-" + "9" * 5000 + "]\n"), says="bad host range"),
    Case("range_start_beyond_any_integer", text("SwitchName=a Nodes=n[" + "9" * 5000 + "-1]\n"),
         says="bad host range"),
    Case("ranges_multiplying_beyond_any_machine", text("SwitchName=a Nodes=r[1-2000]n[1-2000]\n"), says=MORE),
    Case("lines_adding_up_beyond_any_machine", text("SwitchName=a Nodes=n[1-600000]\n"
                                                    "SwitchName=b Nodes=m[1-600000]\n"), says=MORE),
    Case("unclosed_bracket", text("SwitchName=a Nodes=n[1-3\n"), says="unbalanced brackets in host list"),
    Case("too_deep", text("".join(f"SwitchName=s{i} Switches=s{i + 1}\n" for i in range(40))
                          + "SwitchName=s40 Nodes=n1\n"), says=DEEP),
    Case("very_deep", text("".join(f"SwitchName=s{i} Switches=s{i + 1}\n" for i in range(5000))
                           + "SwitchName=s5000 Nodes=n1\n"), says=DEEP),
    Case("very_deep_listed_bottom_up", text("SwitchName=s5000 Nodes=n1\n" + "".join(
        f"SwitchName=s{i} Switches=s{i + 1}\n" for i in reversed(range(5000)))), says=DEEP),
    Case("switch_without_nodes", text("SwitchName=a\nSwitchName=b Nodes=n1,n2\n")),
    Case("empty_names", text("SwitchName= Nodes=\nSwitchName=b Nodes=,,\n")),
    Case("control_characters", text("SwitchName=a\x00 Nodes=n\x1b1,n2\n")),
]


def topology_readers(path: Path, work: Path) -> dict[str, Outcome]:
    """sweep's dry run on the topology's first two nodes (a real sweep reads the file with the same function)."""
    return {"dry_run": commcal("sweep", "--dry-run", "--nodes", "2", "--topology", path)}


# --------------------------------------------------------------------------------------------------- specs

def tier(i: int, **values) -> Callable[[dict], dict]:
    return set_in(lambda s: s["tiers"][i], **values)


def device(**values) -> Callable[[dict], dict]:
    return set_in(lambda s: s["device"], **values)


SPEC_CASES = [
    *json_file_cases("as_shipped", "machine"),
    Case("nan", lambda p, rng: p.write_text(p.read_text().replace('"efficiency": 0.65', '"efficiency": NaN'))),
    Case("huge_integer", lambda p, rng: p.write_text(p.read_text().replace('"devices": 8',
                                                                           '"devices": 1' + "0" * 400))),
    Case("missing_key", edit_json(without("device"))),
    Case("unknown_key", edit_json(put(colour="red"))),
    Case("newer_version", edit_json(put(version=2))),
    Case("a_calibration", edit_json(put(schema="commcal.calibration"))),
    Case("no_tiers", edit_json(put(tiers=[]))),
    Case("three_tiers", edit_json(lambda s: s | {"tiers": s["tiers"] * 2})),
    Case("tiers_an_object", edit_json(put(tiers={"a": 1}))),
    Case("tier_not_object", edit_json(put(tiers=[5]))),
    Case("tier_devices_text", edit_json(tier(0, devices="8"))),
    Case("tier_devices_fraction", edit_json(tier(0, devices=2.5))),
    Case("tier_devices_true", edit_json(tier(0, devices=True))),
    Case("tier_devices_beyond_any", edit_json(tier(1, devices=10 ** 30))),
    Case("network_not_a_multiple", edit_json(tier(1, devices=12))),
    Case("tier_zero_bandwidth", edit_json(tier(0, bandwidth_GBps=0))),
    Case("tier_negative_latency", edit_json(tier(0, latency_us=-1))),
    Case("device_not_object", edit_json(put(device=[1]))),
    Case("peaks_empty", edit_json(device(peak_tflops={}))),
    Case("peaks_a_list", edit_json(device(peak_tflops=[312]))),
    Case("peak_unknown_dtype", edit_json(device(peak_tflops={"int4": 1000}))),
    Case("peak_text", edit_json(device(peak_tflops={"float16": "312"}))),
    Case("memory_zero", edit_json(device(memory_GiB=0, memory_GBps=0))),
    Case("tile_wrong", edit_json(device(gemm_tile=[256], sms=0))),
    Case("tile_without_sms", edit_json(lambda s: s | {"device": without("sms")(s["device"])})),
    Case("backend_a_list", edit_json(put(backend=["nccl"]))),
    Case("machine_odd", edit_json(put(machine="a/b\x00c" * 100))),
    Case("sources_not_strings", edit_json(put(sources=[1, None]))),
]
"""A user's spec (test_bad_input.py has the few an audit found): the shipped one damaged."""


def spec_readers(path: Path, work: Path) -> dict[str, Outcome]:
    return {"from-spec": commcal("calibration", "from-spec", path, "--out", work / "spec-cal.json")}


# ------------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def out_cal(tmp_path_factory) -> Path:
    """A synthetic calibration pricing every collective validate runs on one node, and GEMMs."""
    path = tmp_path_factory.mktemp("outputs") / "cal.json"
    models = {(op, "intra"): (5e-6, 1e-9) for op in ("allreduce", "allgather", "reduce_scatter", "alltoall")}
    path.write_text(json.dumps(synthetic_calibration(models, links={"intra": [2, 4]},
                                                     gemm={"float32": 1e10, "float64": 5e9})))
    return path


@pytest.fixture(scope="session")
def base_validation(out_cal, tmp_path_factory) -> Path:
    """A real `commcal validate` of two ranks: one small layer's strategies, a short budget each."""
    out = tmp_path_factory.mktemp("outputs-v") / "validation"
    run_mpi(2, ["validate", str(out_cal), "--mesh", "2", "--out", str(out), "--layer", LAYER, *FAST], timeout=180,
            check=True)
    return out


@pytest.fixture(scope="session")
def base_profile(tmp_path_factory) -> Path:
    """A real `commcal profile` of two ranks of the layer the readers price."""
    out = tmp_path_factory.mktemp("outputs-p") / "profile.json"
    run_mpi(2, ["profile", "--mesh", "2", "--layer", LAYER, "--samples", "3", "--out", str(out)], timeout=120,
            check=True)
    return out


@pytest.fixture(scope="session")
def base_topology(tmp_path_factory) -> Path:
    """The topology.conf `commcal scan` writes for a two-level tree whose first node is this host."""
    out = tmp_path_factory.mktemp("outputs-t") / "topology.conf"
    here = socket.gethostname()
    out.write_text(Inferred(Topology("scan", (((here, "n1"), ("n2", "n3")), ((here, "n1", "n2", "n3"),)))).conf())
    return out


# --------------------------------------------------------------------------------------------------- tests

def ids(case: Case) -> str:
    return case.id


@pytest.mark.mpi
@pytest.mark.parametrize("case", VALIDATION_CASES, ids=ids)
def test_every_reader_survives_a_damaged_validation(case, base_validation, tmp_path, laid_out_only):
    path = damaged(base_validation, case, tmp_path)
    outcomes = validation_readers(path, tmp_path)
    assert not problems(outcomes) + case.unmet(outcomes)
    assert not long_refusals(outcomes, path)
    if case.page is not None:
        assert outcomes["report"].code == 0, outcomes["report"].stderr
        page = (tmp_path / "report" / "report.html").read_text()
        assert [says for says in case.page if says not in page] == []


@pytest.mark.mpi
@pytest.mark.parametrize("case", PROFILE_CASES, ids=ids)
def test_every_reader_survives_a_damaged_profile(case, base_profile, out_cal, tmp_path):
    path = damaged(base_profile, case, tmp_path)
    outcomes = profile_readers(path, out_cal, tmp_path)
    assert not problems(outcomes) + case.unmet(outcomes)
    assert not long_refusals(outcomes, path)


@pytest.mark.parametrize("case", TOPOLOGY_CASES, ids=ids)
def test_every_reader_survives_a_damaged_topology(case, base_topology, tmp_path):
    path = damaged(base_topology, case, tmp_path)
    outcomes = topology_readers(path, tmp_path)
    assert not problems(outcomes) + case.unmet(outcomes)
    assert not long_refusals(outcomes, path)


@pytest.mark.parametrize("case", SPEC_CASES, ids=ids)
def test_every_reader_survives_a_damaged_spec(case, tmp_path):
    path = damaged(SPEC, case, tmp_path)
    outcomes = spec_readers(path, tmp_path)
    assert not problems(outcomes) + case.unmet(outcomes)
    assert not long_refusals(outcomes, path)


@pytest.mark.mpi
def test_each_output_handed_to_the_others_readers_is_one_line(base_validation, base_profile, base_topology, out_cal,
                                                              tmp_path):
    """A validation directory, a profile, a topology file, a spec and a calibration, each given where another of
    them (or a run directory) belongs: exit 2 and one line, every time."""
    outputs = {"validation": base_validation, "profile": base_profile, "topology": base_topology, "spec": SPEC,
               "calibration": out_cal}
    readers = {"validation": lambda p: validation_readers(p, tmp_path),
               "profile": lambda p: {"predict": profile_readers(p, out_cal, tmp_path)["predict"]},
               "topology": lambda p: topology_readers(p, tmp_path), "spec": lambda p: spec_readers(p, tmp_path),
               "calibration": lambda p: {"table": commcal("table", p)},
               "run": lambda p: {"fit": commcal("fit", p, "--out", tmp_path / "c.json")}}
    outcomes = {f"{reader} of the {kind}: {name}": o for kind, path in outputs.items()
                for reader, read in readers.items() if reader != kind for name, o in read(path).items()}
    assert not problems(outcomes)
    assert {name for name, o in outcomes.items() if o.code != 2} == set()


def test_console_entry_point(base_topology, tmp_path):
    """A reader as the console runs it: one line and exit 2 (the same dispatcher as the cases above, whose reports
    of a validation print nothing on stderr as processes either)."""
    bad = damaged(base_topology, next(c for c in TOPOLOGY_CASES if c.id == "not_utf8"), tmp_path)
    done = run_cli(["sweep", "--dry-run", "--nodes", "2", "--topology", str(bad)], timeout=120)
    assert not problems({"sweep --dry-run": Outcome(done.returncode, done.stderr)}) and done.returncode == 2
