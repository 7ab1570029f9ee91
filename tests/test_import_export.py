"""commcal import (peer logs into run directories) and export (calibrations into planners' formats), on the real
OSU and IMB logs and the synthetic nccl-tests logs of tests/data/peers (see its README)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from calib.calibration import load_calibration
from calib.export import busbw
from conftest import run_main
from microbench.records import load_samples, load_summary, read_run_json

PEERS = Path(__file__).parent / "data" / "peers"
OSU, OSU2, IMB = PEERS / "osu-7.5", PEERS / "osu-7.5-2nodes", PEERS / "imb-2021.11"
NCCL = PEERS / "nccl-tests-synthetic"
PAYLOAD_BPS = 300e6 / 8 * 1448 / 1514
"""The 2-node fixtures' link: tc tbf at 300 Mbit/s, of which TCP over a 1500-byte MTU carries 1448 of 1514 bytes."""


def imported(capsys, tmp_path: Path, name: str, logs: list[Path], *flags: str) -> Path:
    out = tmp_path / name
    code, stdout, err = run_main(capsys, ["import", *map(str, logs), "--out", str(out), *flags])
    assert code == 0, err
    return out


def test_two_imports_within_a_second_are_two_runs(capsys, tmp_path):
    """The same log imported twice at once: two run ids, so a fit of both keeps two runs in its provenance."""
    logs = [OSU / "osu_latency.txt"]
    first, second = (imported(capsys, tmp_path, name, logs, "--link", "intra", "--procs", "2") for name in "ab")
    ids = [json.loads((run / "run.json").read_text())["run_id"] for run in (first, second)]
    assert ids[0] != ids[1] and all(i.startswith("import-osu-") for i in ids), ids


def fitted(capsys, tmp_path: Path, run: Path, *flags: str) -> dict:
    cal = tmp_path / f"{run.name}.json"
    code, _, err = run_main(capsys, ["fit", str(run), "--out", str(cal), "--quiet", *flags])
    assert code == 0, err
    return json.loads(cal.read_text())


def rows(path: Path) -> np.ndarray:
    """A log's numeric rows, read here without the importer."""
    return np.array([[float(x) for x in line.split()] for line in path.read_text().splitlines()
                     if line.strip() and line.strip()[0].isdigit()])


def test_osu_pingpong_fit_matches_the_logs_large_rows(capsys, tmp_path):
    """The fitted bandwidth equals the one computed directly from the log's rows of 512 KiB and more (the fit's
    last segment), by least squares in relative error as the fit weighs."""
    run = imported(capsys, tmp_path, "osu", [OSU / "osu_latency.txt"], "--link", "intra")
    cal = fitted(capsys, tmp_path, run)
    table = rows(OSU / "osu_latency.txt")
    n, t = table[table[:, 0] >= 512 * 1024].T
    t = t * 1e-6
    (a, b), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(n), n]) / t[:, None], np.ones_like(t), rcond=None)
    direct = 1.0 / b
    got = cal["p2p"]["pingpong"]["intra"]["bandwidth_bytes_per_s"]
    assert got == pytest.approx(direct, rel=0.05)
    run_json = read_run_json(run)
    assert run_json["origin"]["peer"] == "osu" and run_json["origin"]["version"] == "7.5"
    assert run_json["options"]["cache"] == "warm"
    assert cal["provenance"]["runs"][0]["origin"]["method"] == "osu"


def test_osu_two_nodes_inter_fit_recovers_the_payload_rate(capsys, tmp_path):
    """osu_latency across the rate-limited link (one rank per node, link class from the host list) and osu_bw's
    windowed rate both recover 300 Mbit/s of payload within 5%; the two methods do not fit together unasked."""
    lat = imported(capsys, tmp_path, "lat", [OSU2 / "osu_latency-2nodes.txt"], "--hosts", "n1:1,n2:1")
    bw = imported(capsys, tmp_path, "bw", [OSU2 / "osu_bw-2nodes.txt"], "--hosts", "n1,n2")
    assert set(load_summary(lat)["link"]) == {"inter"}
    for run in (lat, bw):
        got = fitted(capsys, tmp_path, run)["p2p"]["pingpong"]["inter"]["bandwidth_bytes_per_s"]
        assert got == pytest.approx(PAYLOAD_BPS, rel=0.05)
    code, _, err = run_main(capsys, ["fit", str(lat), str(bw), "--out", str(tmp_path / "mix.json")])
    assert code == 2 and "mix timing methods osu and osu-window" in err and "--mix-methods" in err
    code, _, err = run_main(capsys, ["fit", str(lat), str(bw), "--out", str(tmp_path / "mix.json"), "--mix-methods"])
    assert code == 0, err


def test_imb_blocks_become_points_with_their_process_counts(capsys, tmp_path):
    """Every #processes block is a set of points at that count; a 2-process block ran on node 1 (intra), a
    4-process one across both nodes (spread); per-rank sizes become totals; IMB's time-outs are left out, said."""
    log = IMB / "imb-2nodes-4ranks.txt"
    out = tmp_path / "imb"
    code, stdout, err = run_main(capsys, ["import", str(log), "--out", str(out), "--hosts", "n1:2,n2:2"])
    assert code == 0, err
    assert stdout.count("IMB time-out") == 2
    s = load_summary(out)
    shapes = {op: sorted(set(zip(g["procs"], g["link"]))) for op, g in s.groupby("op")}
    assert shapes == {"pingpong": [(2, "intra")], "allreduce": [(2, "intra"), (4, "spread")],
                      "allgather": [(2, "intra"), (4, "spread")], "alltoall": [(2, "intra"), (4, "spread")]}
    nonzero = sum(1 for line in log.read_text().splitlines() if re.match(r"\s+[1-9]\d*\s+\d+\s+\d", line))
    assert len(s) == nonzero == 138
    g4 = s[(s["op"] == "allgather") & (s["procs"] == 4)]
    assert g4["size_bytes"].min() == 4 * 8 and g4.loc[g4["size_bytes"] == 4 * 2097152, "median_s"].iloc[0] == \
        pytest.approx(215750.64e-6)


def test_fixtures_import_fit_and_report_without_warnings_about_the_import(capsys, tmp_path, laid_out_only):
    """The OSU and IMB fixtures go through import, fit and report with no Python warning and no fit note about
    the runs themselves (points left out, unusable samples); the report names the peer."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        latency_logs = sorted(p for p in OSU.glob("osu_*.txt") if p.name != "osu_bw.txt")
        osu = imported(capsys, tmp_path, "osu1", latency_logs, "--link", "intra", "--procs", "2")
        imb = imported(capsys, tmp_path, "imb1", [IMB / "imb-mpi1-2ranks.txt"], "--link", "intra")
        for run in (osu, imb):
            cal = fitted(capsys, tmp_path, run)
            assert not [w for w in cal["warnings"] if str(run) in w]
            report = tmp_path / f"r-{run.name}"
            code, _, err = run_main(capsys, ["report", "--run", str(run), "--calibration",
                                             str(tmp_path / f"{run.name}.json"), "--out", str(report)])
            assert code == 0 and err == ""
            assert "origin.peer" in (report / "report.md").read_text()
    assert set(load_summary(osu)["op"]) == {"pingpong", "allreduce", "allgather", "alltoall", "bcast",
                                             "reduce", "reduce_scatter"}
    ag = load_summary(osu).query("op == 'allgather'")
    assert ag["size_bytes"].min() == 2 * 8         # OSU's per-rank size, counted whole


def test_nccl_tests_text_and_json(capsys, tmp_path):
    """Text logs: ranks and link class from the '#  Rank' lines, sizes as printed, the fit recovers the lines the
    synthetic logs were written from; -J JSON with -I: each iteration is a sample; --in-place reads the other half."""
    ar = imported(capsys, tmp_path, "ar", [NCCL / "all_reduce_perf-1node-2ranks.txt"])
    s = load_summary(ar)
    assert set(s["link"]) == {"intra"} and set(s["procs"]) == {2} and set(s["backend"]) == {"nccl"}
    model = fitted(capsys, tmp_path, ar)["models"]["allreduce"]["intra"]
    assert 1 / model["beta_s_per_byte"] == pytest.approx(10e9, rel=0.02)   # ring: busbw = 1/beta
    a2a = load_summary(imported(capsys, tmp_path, "a2a", [NCCL / "alltoall_perf-2nodes-4ranks.txt"]))
    assert set(a2a["link"]) == {"spread"} and set(a2a["procs"]) == {4} and a2a["size_bytes"].max() == 64 << 20
    sr = imported(capsys, tmp_path, "sr", [NCCL / "sendrecv_perf-2nodes-I.json"])
    samples = load_samples(sr)
    assert samples.groupby("point_id", observed=True).size().eq(20).all()
    assert read_run_json(sr)["origin"]["logs"][0]["statistic"].startswith("median over iterations")
    assert set(load_summary(sr)["link"]) == {"inter"}
    inplace = load_summary(imported(capsys, tmp_path, "ip", [NCCL / "all_reduce_perf-1node-2ranks.txt"],
                                    "--in-place"))
    big = lambda df: df.loc[df["size_bytes"] == 64 << 20, "median_s"].iloc[0]  # noqa: E731
    assert big(inplace) == pytest.approx(1.01 * big(s), rel=1e-3) and inplace["in_place"].all()


@pytest.mark.parametrize("content, flags, where, says", [
    ("hello\nworld\n", ["--link", "intra"], ":1:", "not a log commcal can import"),
    ("# OSU MPI Latency Test v7.5\n# Size       Avg Latency(us)\n8   0.32\n16  0.31  9\n", ["--link", "intra"],
     ":4:", "expected 2 columns"),
    ("# OSU MPI Allreduce Latency Test v7.5\n# Size       Avg Latency(us)\n8   0.32\n", ["--link", "intra"],
     ":1:", "give --procs or --hosts"),
    ("# OSU MPI Allreduce Latency Test v7.5\n# Size       Avg Latency(us)\n8   0.32\n",
     ["--link", "intra", "--procs", "1"], ":1:", "a collective of 1 process communicates with nobody"),
    ("# OSU MPI Latency Test v7.5\n# Size       Avg Latency(us)\n8   0.32\n", [], ":3:", "give --hosts"),
    ("# OSU MPI Latency Test v7.5\n# Size       Avg Latency(us)\n8   abc\n", ["--link", "intra"], ":3:",
     "'abc' is not a number"),
    ('{"version": 3, "args": ["all_reduce_perf"], "results": [', [], ":1:", "truncated or corrupt nccl-tests JSON"),
    ("# OSU MPI Latency Test v7.5\n# Size       Avg Latency(us)\n8   0.00\n", ["--link", "intra"], ":3:",
     "'0.00' is not a finite number > 0"),
    ("# OSU MPI Latency Test v7.5\n# Size       Avg Latency(us)\n" + "9" * 30 + "   0.32\n", ["--link", "intra"],
     ":3:", "is too large"),
    ("# OSU MPI Latency Test v7.5\n# Size       Avg Latency(us)\n\u00b2   0.32\n", ["--link", "intra"], ":3:",
     "is not a whole number"),
    ('{"version": 3, "args": ["all_reduce_perf"], "config": {"devices": "gpu0"}, "results": []}', [], ":1:",
     "config.devices is not a list of objects"),
    ('{"version": 3, "args": ["all_reduce_perf"], "config": {"devices": [{"rank": 0, "hostname": "a"}]}, '
     '"results": [{"size": 8, "type": "float", "out_of_place": {"time": 1.0}, '
     '"out_of_place_per_iter": {"times_us": ["a"]}}]}', [], ":1:", "times_us is not a list of times above 0"),
    ('{"version": 3, "args": ["all_reduce_perf"], "config": {"devices": [{"rank": 0, "hostname": "a"}]}, '
     '"results": [{"size": -5, "type": "float", "out_of_place": {"time": 1.0}}]}', [], ":1:", "not what a run holds"),
    ("# OSU MPI Latency Test v7.5\n# Size       Avg Latency(us)\n8   1e308\n", ["--link", "intra"], ":3:",
     "a time outside"),
    ('{"nccl_version": 1, "results": ' + '[' * 100000 + ']' * 100000 + '}', [], ":", "truncated or corrupt "
     "nccl-tests JSON"),
])
def test_unreadable_logs_are_one_line_naming_file_and_line(capsys, tmp_path, content, flags, where, says):
    log = tmp_path / "peer.log"
    log.write_text(content)
    code, stdout, err = run_main(capsys, ["import", str(log), "--out", str(tmp_path / "out"), *flags])
    assert code == 2 and stdout == ""
    assert err.count("\n") == 1 and f"{log}{where}" in err and says in err, err
    assert not (tmp_path / "out" / "run.json").exists()


@pytest.mark.parametrize("flags, out, says", [
    (["--hosts", "a:99999999999"], "new", "--hosts: more than"),
    (["--link", "intra", "--procs", "9" * 20], "new", "--procs 99999999999999999999 must be 1 to"),
    (["--link", "intra"], "a file", "exists and is not a directory"),
    (["--procs", "8", "--log", "nccl"], "new", "the log ran 2 ranks, not the 8"),
    (["--link", "intra", "--procs", "3"], "new", "osu_latency.txt: the log ran 2 ranks, not the 3 of --procs/--hosts"),
    (["--link", "intra"], "/proc/commcal", "cannot create the run directory"),
])
def test_import_refuses_what_no_run_holds_in_one_line(capsys, tmp_path, flags, out, says):
    """Counts no run holds and an --out that cannot be a run directory: one line, exit 2, no run written."""
    path = Path(out) if out.startswith("/") else tmp_path / "out"
    if out == "a file":
        path.write_text("a file")
    log = NCCL / "all_reduce_perf-1node-2ranks.txt" if "--log" in flags else OSU / "osu_latency.txt"
    flags = flags[:flags.index("--log")] if "--log" in flags else flags
    code, stdout, err = run_main(capsys, ["import", str(log), "--out", str(path), *flags])
    assert code == 2 and stdout == "" and err.count("\n") == 1 and says in err, err
    assert not (path / "run.json").exists()


GIB = 1 << 30
"""ASTRA-sim's and SimAI's GB (astra-network-analytical common/NetworkFunction.cpp: bw_GBps_to_Bpns multiplies by
2^30; SimAI system/Common.hh: GBps is 1 / 2^30)."""
ASTRA_HOPS = {"Ring": 1, "FullyConnected": 1, "Switch": 2}
"""Hops between two neighbours of an ASTRA-sim dimension (congestion_unaware/basic-topology: Switch 2, the others 1)."""


def calculon_seconds(tier: dict, op: str, nbytes: float, procs: int) -> float:
    """Calculon's network time (calculon/network.py): latency + size * scalar * (1 + offset / p) / (bw * eff)."""
    scalar, offset = tier["ops"][op]
    rate = tier["bandwidth"] * 1e9 * tier["efficiency"]
    return tier["latency"] + nbytes * scalar * (1 + (offset or 0) / procs) / rate


def yaml_lists(text: str) -> dict:
    """ASTRA-sim's flow lists back: 'key: [ a, b ]  # unit' -> {key: [a, b]}."""
    return {k: [v.strip() for v in body.split(",")] for k, body in re.findall(r"^(\w+): \[(.*)\]", text, re.M)}


def simai_groups(text: str) -> dict[str, dict[str, str]]:
    """busbw.yaml read as SimAI's UserParam::parseYaml does: the first line a name, `X:` a section, each key cut at
    its first comma."""
    groups: dict[str, dict[str, str]] = {}
    for line in text.splitlines()[1:]:
        key, _, value = line.partition(":")
        if not value.strip():
            groups[key] = section = {}
        else:
            section[key.split(",")[0]] = value.strip()
    return groups


def test_export_round_trips(capsys, tmp_path):
    """Calculon: each collective's size term read back prices as the calibration does (the latency is the link's
    alpha only, a loss docs/import-export.md names); ASTRA-sim: a message between two neighbours of a dimension,
    as its analytical backend prices it (hops x latency + n / bandwidth in 2^30 B/s), is the pingpong line;
    SimAI: busbw per group in its GB/s of 2^30 B, null where the calibration has no model; unsuppliable fields
    named; a missing --topology refused."""
    run = imported(capsys, tmp_path, "imb", [IMB / "imb-mpi1-2ranks.txt"], "--link", "intra")
    fitted(capsys, tmp_path, run)
    cal_path = tmp_path / "imb.json"
    cal = load_calibration(cal_path)
    out = tmp_path / "system.json"
    code, stdout, err = run_main(capsys, ["export", str(cal_path), "--format", "calculon", "--out", str(out)])
    assert code == 0, err
    assert "networks[intra].processor_usage" in stdout and "mem1" in stdout
    tier = json.loads(out.read_text())["networks"][0]
    assert tier["size"] == 2 and tier["ops"]["p2p"] == [1.0, None]
    big, bigger = 2 << 20, 4 << 20
    for name, op in (("all_reduce", "allreduce"), ("all_gather", "allgather"), ("reduce_scatter", "reduce_scatter")):
        slope = (calculon_seconds(tier, name, bigger, 2) - calculon_seconds(tier, name, big, 2)) / (bigger - big)
        want = np.diff(cal.predict_seconds(op, "intra", 2, np.array([big, bigger])))[0] / (bigger - big)
        assert slope == pytest.approx(want, rel=1e-9)
    p2p = cal.data["p2p"]["pingpong"]["intra"]
    assert tier["latency"] == pytest.approx(p2p["alpha_s"]) and \
        tier["bandwidth"] * 1e9 == pytest.approx(p2p["bandwidth_bytes_per_s"])

    code, _, err = run_main(capsys, ["export", str(cal_path), "--format", "astra-sim", "--out",
                                     str(tmp_path / "n.yml")])
    assert code == 2 and "--topology" in err
    for topology in ("Switch", "Ring"):
        code, _, err = run_main(capsys, ["export", str(cal_path), "--format", "astra-sim", "--topology", topology,
                                         "--out", str(tmp_path / "n.yml")])
        assert code == 0, err
        net = yaml_lists((tmp_path / "n.yml").read_text())
        assert net["topology"] == [topology] and net["npus_count"] == ["2"]
        rate, hop = float(net["bandwidth"][0]) * GIB, float(net["latency"][0]) * 1e-9
        for n in (1024, 4 << 20):
            assert ASTRA_HOPS[topology] * hop + n / rate == pytest.approx(p2p["alpha_s"] + n * p2p["beta_s_per_byte"],
                                                                          rel=1e-3)

    code, stdout, err = run_main(capsys, ["export", str(cal_path), "--format", "simai", "--out",
                                          str(tmp_path / "b.yaml")])
    assert code == 0, err
    groups = simai_groups((tmp_path / "b.yaml").read_text())
    assert float(groups["TP"]["allreduce"]) * GIB == pytest.approx(busbw(cal, "allreduce", "intra"), rel=1e-5)
    assert groups["PP"]["busbw"] == "null" and "PP.busbw" in stdout and "DP.allreduce" in stdout
    assert "null" not in groups["TP"].values()


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Path:
    """A calibration of the OSU fixtures' two machines' worth: intra (2 ranks on one node: latency and collectives),
    inter (one rank on each of 2 nodes: latency only) and spread (2 x 2 ranks: collectives only)."""
    tmp = tmp_path_factory.mktemp("two")
    runs = []
    for name, logs, flags in (
            ("intra", sorted(OSU.glob("osu_*.txt")), ["--link", "intra", "--procs", "2"]),
            ("inter", [OSU2 / "osu_latency-2nodes.txt"], ["--hosts", "n1:1,n2:1"]),
            ("spread", sorted(OSU2.glob("osu_*-4ranks.txt")), ["--hosts", "n1:2,n2:2"])):
        for log in logs:
            if log.name == "osu_bw.txt":
                continue
            out = tmp / f"{name}-{log.stem}"
            assert main_quiet(["import", str(log), "--out", str(out), *flags]) == 0
            runs.append(str(out))
    cal = tmp / "two.json"
    assert main_quiet(["fit", *runs, "--out", str(cal), "--quiet"]) == 0
    return cal


def main_quiet(argv: list[str]) -> int:
    from reports.cli import main
    return main(argv)


def test_export_spans_the_machine_and_prices_the_outer_level_by_the_other_outer_class(capsys, tmp_path, two_nodes):
    """Levels span the calibration's machine (intra 2 ranks per node, the outer level 2 nodes x 2 ranks), not the
    process counts measured, so ASTRA-sim's npus_count is 2 x 2 and Calculon's tiers hold 2 and 4; an outer level
    whose own class has no collective model (inter: latency only) is priced by the other's (spread) and says so, in
    Calculon's tiers and SimAI's DP and EP lines alike; --tier-sizes sets the machine; sizes that do not nest are
    one line and exit 2."""
    cal = load_calibration(two_nodes)
    code, stdout, err = run_main(capsys, ["export", str(two_nodes), "--format", "calculon", "--out",
                                          str(tmp_path / "s.json")])
    assert code == 0, err
    tiers = json.loads((tmp_path / "s.json").read_text())["networks"]
    assert [t["size"] for t in tiers] == [2, 4]
    assert set(tiers[1]["ops"]) == {"p2p", "all_reduce", "all_gather", "reduce_scatter"}
    assert "networks[inter].ops.all_reduce: spread's allreduce model" in stdout
    big, bigger = 2 << 20, 4 << 20
    slope = (calculon_seconds(tiers[1], "all_reduce", bigger, 4) - calculon_seconds(tiers[1], "all_reduce", big, 4))
    want = np.diff(cal.predict_seconds("allreduce", "spread", 4, np.array([big, bigger])))[0]
    assert slope == pytest.approx(want, rel=1e-9)

    code, _, err = run_main(capsys, ["export", str(two_nodes), "--format", "astra-sim", "--topology", "Ring,Switch",
                                     "--out", str(tmp_path / "n.yml")])
    assert code == 0, err
    assert yaml_lists((tmp_path / "n.yml").read_text())["npus_count"] == ["2", "2"]
    code, _, err = run_main(capsys, ["export", str(two_nodes), "--format", "astra-sim", "--topology", "Ring,Switch",
                                     "--tier-sizes", "8,4480", "--out", str(tmp_path / "n.yml")])
    assert code == 0, err
    assert yaml_lists((tmp_path / "n.yml").read_text())["npus_count"] == ["8", "560"]

    code, stdout, err = run_main(capsys, ["export", str(two_nodes), "--format", "simai", "--out",
                                          str(tmp_path / "b.yaml")])
    assert code == 0, err
    groups = simai_groups((tmp_path / "b.yaml").read_text())
    for group in ("DP", "EP"):
        assert float(groups[group]["allreduce"]) * GIB == pytest.approx(busbw(cal, "allreduce", "spread"), rel=1e-5)
    assert "DP.allreduce: spread's allreduce model" in stdout and "not exported" not in stdout

    for sizes, says in (("8,12", "whole number"), ("4", "1 size(s) for 2 level(s)"), ("4,2", "more than the level inside"),
                        ("1,4", "at least 2"), ("8,x", "whole device counts"), ("0,8", "1 to")):
        code, out, err = run_main(capsys, ["export", str(two_nodes), "--format", "astra-sim", "--topology",
                                           "Ring,Switch", "--tier-sizes", sizes, "--out", str(tmp_path / "bad.yml")])
        assert code == 2 and err.count("\n") == 1 and says in err and not (tmp_path / "bad.yml").exists(), (sizes, err)


@pytest.mark.parametrize("template, says", [
    ("calibration", "a commcal calibration file (schema 'commcal.calibration'), not a Calculon system file"),
    ({"x": 1}, "not a Calculon system file (a JSON object holding some of matrix, vector, mem1, mem2, networks, "
               "processing_mode)"),
    ([1], "not a Calculon system file")])
def test_calculon_export_refuses_a_template_that_is_no_calculon_system(capsys, tmp_path, template, says):
    spec = tmp_path / "spec.json"
    assert main_quiet(["calibration", "from-spec", "selene", "--out", str(spec)]) == 0
    capsys.readouterr()
    path = spec if template == "calibration" else tmp_path / "t.json"
    if path != spec:
        path.write_text(json.dumps(template))
    code, stdout, err = run_main(capsys, ["export", str(spec), "--format", "calculon", "--template", str(path),
                                          "--out", str(tmp_path / "s.json")])
    assert code == 2 and stdout == "" and err.count("\n") == 1 and f"{path}: {says}" in err, err
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("key, value, says", [
    ("processing_mode", "fast", "processing_mode: is neither"),
    ("networks", [{"must_be_filled": "yes"}], "networks[0].must_be_filled: is not true or false"),
    ("networks", [{"processor_usage": 1.0}], "networks[0].processor_usage: is not a number in [0, 1)"),
    ("networks", {"must_be_filled": True}, "networks: is not a list"),
    ("mem1", {"GiB": 80, "GBps": "fast", "MB_efficiency": [[0, 1]]}, "mem1: lacks GiB >= 0 or GBps above 0"),
    ("mem2", {"GiB": 80, "GBps": 50, "MB_efficiency": [[1, 0.5], [10, 0.9], [0, 0.1]]}, "do not fall to 0"),
    ("mem2", {"GiB": 80, "GBps": 50, "MB_efficiency": [[10, 0.5]]}, "mem2.MB_efficiency: has thresholds"),
    ("vector", {"float16": {"tflops": 78, "gflops_efficiency": [[0, 1.5]]}}, "an efficiency outside (0, 1]"),
    ("vector", {"float16": {"tflops": True, "gflops_efficiency": [[0, 1]]}}, "vector.float16: has no tflops"),
    ("matrix", {"float8": {"tflops": 2.0, "gflops_efficiency": [0, 0.5]}}, "is not a list of [threshold"),
    ("matrix", [1, 2], "matrix: is not an object"),
])
def test_a_template_field_calculon_would_refuse_is_one_line(key, value, says, capsys, tmp_path):
    """A template field export would copy into the system, of a type or range Calculon's reader asserts against
    (calculon/system.py, network.py, processor.py, memory.py), is refused by name; nothing is written."""
    spec = tmp_path / "spec.json"
    assert main_quiet(["calibration", "from-spec", "selene", "--out", str(spec)]) == 0
    (tmp_path / "t.json").write_text(json.dumps({**TEMPLATE, key: value}))
    code, _, err = run_main(capsys, ["export", str(spec), "--format", "calculon", "--template",
                                     str(tmp_path / "t.json"), "--out", str(tmp_path / "s.json")])
    assert code == 2 and err.count("\n") == 1 and says in err and "t.json" in err, err
    assert not (tmp_path / "s.json").exists()


def test_a_spec_whose_network_spans_two_nodes_exports(capsys, tmp_path):
    """The smallest two-tier spec calibration.from-spec takes (the network two nodes) is one export takes."""
    spec = json.loads((Path(__file__).parent.parent / "calib" / "selene.spec.json").read_text())
    spec["tiers"][1]["devices"] = 2 * spec["tiers"][0]["devices"]
    (tmp_path / "two.spec.json").write_text(json.dumps(spec))
    assert main_quiet(["calibration", "from-spec", str(tmp_path / "two.spec.json"), "--out", str(tmp_path / "c.json")]) == 0
    assert main_quiet(["export", str(tmp_path / "c.json"), "--format", "calculon", "--out", str(tmp_path / "s.json")]) == 0
    assert [t["size"] for t in json.loads((tmp_path / "s.json").read_text())["networks"]] == [8, 16]


TEMPLATE = {"matrix": {"float16": {"tflops": 1.0, "gflops_efficiency": [[0, 0.5]]},
                       "float8": {"tflops": 2.0, "gflops_efficiency": [[0, 0.5]]}},
            "vector": {"float16": {"tflops": 1.0, "gflops_efficiency": [[16, 0.9], [0, 0.2]]}},
            "mem1": {"GiB": 80, "GBps": 2000, "MB_efficiency": [[0, 1.0]]},
            "mem2": {"GiB": 512, "GBps": 50, "MB_efficiency": [[0, 1.0]]},
            "processing_mode": "no_overlap",
            "networks": [{"must_be_filled": True, "processor_usage": 0.15, "bandwidth": 1.0},
                         {"must_be_filled": False, "processor_usage": 0.0}]}
"""A Calculon system file's fields a template completes an export with, of the types Calculon's readers take."""


def test_calculon_export_completed_by_a_template_loads_as_calculon_reads_it(capsys, tmp_path):
    """A spec calibration exported with a template: every key Calculon's System, Network and Processor readers
    require is there (calculon/system.py, network.py, processor.py: exact network keys, all four ops, matrix
    {dtype: {tflops, gflops_efficiency: [[gflops, eff], ...] by falling gflops, the last 0}}); the template's
    unmeasured fields are kept and named, its measured ones replaced; each dtype's curve prices a GEMM of its
    thresholds' sizes as the calibration's rate and latency do."""
    spec = tmp_path / "spec.json"
    assert main_quiet(["calibration", "from-spec", "selene", "--out", str(spec)]) == 0
    template = TEMPLATE
    (tmp_path / "t.json").write_text(json.dumps(template))
    code, stdout, err = run_main(capsys, ["export", str(spec), "--format", "calculon", "--template",
                                          str(tmp_path / "t.json"), "--out", str(tmp_path / "s.json")])
    assert code == 0, err
    assert "not exported" not in stdout and "matrix.float8: the template's" in stdout
    doc = json.loads((tmp_path / "s.json").read_text())
    assert {k: doc[k] for k in ("vector", "mem1", "mem2", "processing_mode")} == \
        {k: template[k] for k in ("vector", "mem1", "mem2", "processing_mode")}
    for tier, theirs, size in zip(doc["networks"], template["networks"], (8, 4480)):
        assert set(tier) == {"bandwidth", "efficiency", "size", "latency", "ops", "must_be_filled", "processor_usage"}
        assert set(tier["ops"]) == {"p2p", "all_reduce", "all_gather", "reduce_scatter"}
        assert tier["size"] == size and tier["processor_usage"] == theirs["processor_usage"]
        assert tier["bandwidth"] != 1.0
    cal = load_calibration(spec)
    assert set(doc["matrix"]) == {"float8", "float16", "bfloat16", "float32"} and doc["matrix"]["float8"]["tflops"] == 2
    for dtype in ("float16", "bfloat16", "float32"):
        entry, gemm = doc["matrix"][dtype], cal.result.gemm[dtype]
        assert entry["tflops"] * 1e12 == pytest.approx(gemm.peak_flops_per_s)
        thresholds = [g for g, _ in entry["gflops_efficiency"]]
        assert thresholds == sorted(thresholds, reverse=True) and thresholds[-1] == 0 and len(thresholds) > 3
        for gflops, efficiency in entry["gflops_efficiency"][:-1]:
            seconds = gemm.latency_s + gflops * 1e9 / gemm.flops_per_s
            assert 0 < efficiency <= 1 and efficiency == pytest.approx(gflops * 1e9 / seconds / gemm.peak_flops_per_s,
                                                                       abs=1e-6)
