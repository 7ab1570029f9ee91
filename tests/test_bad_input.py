"""Arguments and files no writer of ours produces and no option means: one line on stderr and exit 2 from every
front door, never a traceback, a hang or a file half written (the cases an audit of the CLI found)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calib.synthetic import synthetic_calibration
from conftest import run_main
from microbench.jsonfile import strict_json

SPEC = Path(__file__).parent.parent / "calib" / "selene.spec.json"
RUN = Path(__file__).parent / "data" / "runs" / "racks-pingpong-tbf"
OSU = Path(__file__).parent / "data" / "peers" / "osu-7.5"


@pytest.fixture(scope="module")
def cal(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bad") / "cal.json"
    path.write_text(json.dumps(synthetic_calibration({(op, "intra"): (5e-6, 1e-10) for op in ("allreduce", "pingpong")},
                                                     gemm={"float32": 1e12})))
    return path


def spec_with(tmp_path: Path, change) -> Path:
    spec = json.loads(SPEC.read_text())
    change(spec)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def tier(**values):
    return lambda spec: spec["tiers"][-1].update(values)


CASES = {
    "export_into_a_directory": (["export", "{cal}", "--format", "calculon", "--out", "{tmp}"], "is a directory"),
    "export_where_no_file_can_be": (["export", "{cal}", "--format", "calculon", "--out", "/proc/self/x.json"],
                                    "cannot write"),
    "predict_bytes_beyond_any_size": (["predict", "{cal}", "--op", "allreduce", "--link", "intra", "--procs", "2",
                                       "--bytes", "9" * 60], "at most"),
    "dry_run_infinite_latency": (["sweep", "--dry-run", "--nodes", "2", "--assume-latency-us", "inf"],
                                 "not a finite number"),
    "dry_run_nan_bandwidth": (["sweep", "--dry-run", "--nodes", "2", "--assume-bandwidth", "nan"],
                              "not a finite number"),
    "dry_run_of_a_billion_ranks": (["sweep", "--dry-run", "--nodes", "1000000000"], "plans up to"),
    "search_a_hundred_million_restarts": (["search", "{cal}", "--model", "linear:m=64,k=64,n=64", "--mesh", "2",
                                           "--restarts", "100000000"], "--restarts 0 to"),
    "search_a_million_blocks": (["search", "{cal}", "--model", "transformer:layers=1000000", "--mesh", "2"],
                                "blocks"),
    "spec_link_faster_than_any": (["calibration", "from-spec", "{spec:bw}", "--out", "{tmp}/c.json"], "bandwidth_GBps"),
    "spec_sources_not_a_list": (["calibration", "from-spec", "{spec:sources}", "--out", "{tmp}/c.json"], "sources"),
    "spec_efficiency_below_any": (["calibration", "from-spec", "{spec:eff}", "--out", "{tmp}/c.json"], "efficiency"),
    "spec_version_true": (["calibration", "from-spec", "{spec:version}", "--out", "{tmp}/c.json"], "schema/version"),
    "spec_machine_not_a_name": (["calibration", "from-spec", "{spec:machine}", "--out", "{tmp}/c.json"], "'machine'"),
    "spec_written_over_itself": (["calibration", "from-spec", "{spec:sources}", "--out", "{tmp}/spec.json"],
                                 "would overwrite the input"),
    "export_topology_of_another_format": (["export", "{cal}", "--format", "calculon", "--topology", "Ring",
                                           "--out", "{tmp}/x.json"], "--topology is astra-sim's"),
    "predict_a_local_operation": (["predict", "{cal}", "--op", "gemm", "--link", "intra", "--procs", "2",
                                   "--bytes", "1M"], "gemm is a local operation"),
    "diff_of_a_run_directory": (["diff", str(RUN), "{cal}"], "a sweep run directory, not a calibration"),
    "fit_of_a_calibration_file": (["fit", "{cal}", "--out", "{tmp}/c.json"], "not a commcal run directory"),
    "export_over_its_calibration": (["export", "{cal}", "--format", "calculon", "--out", "{cal}"],
                                    "would overwrite the input"),
    "fit_over_its_run": (["fit", str(RUN), "--out", str(RUN / "run.json")], "would overwrite the input"),
    "fit_into_its_points": (["fit", str(RUN), "--out", str(RUN / "points" / "cal.json")], "or write into it"),
    "fit_the_same_run_twice": (["fit", str(RUN), str(RUN), "--out", "{tmp}/c.json"], "hold the same run"),
    "no_ranks_per_node": (["search", "{cal}", "--model", "linear:m=64,k=64,n=64", "--mesh", "2x2",
                           "--ranks-per-node", "0"], "--ranks-per-node must be 1 or more"),
    "strategy_option_unknown": (["predict", "{cal}", "--layer", "linear:m=64,k=64,n=64", "--strategy", "m.n/xx",
                                 "--mesh", "2x2"], "the only option after '/' is ws"),
    "negative_head_dim": (["search", "{cal}", "--model", "transformer:head_dim=-1", "--mesh", "2"], "head_dim"),
    "transformer_density_nan": (["search", "{cal}", "--model", "transformer:vocab=10,density=nan", "--mesh", "2"],
                                "density"),
    "report_two_calibrations": (["report", "--calibration", "{cal}", "--calibration", "{cal}", "--out", "{tmp}/r"],
                                "give --calibration CAL once"),
    "search_prices_overflowing": (["search", "{cal:inf_gemm}", "--model", "linear:m=64,k=64,n=64", "--mesh", "2x2"],
                                  "prices at infinity"),
    "search_devices_no_split_divides": (["search", "{cal}", "--model", "gpt3-175b", "--devices", "4480",
                                         "--gpus-per-node", "8"], "no split t x p x d"),
    "report_two_scans": (["report", "--scan", "{tmp}", "--scan", "{tmp}", "--out", "{tmp}/r"], "give --scan DIR once"),
    "import_osu_in_place": (["import", str(OSU / "osu_allreduce.txt"), "--out", "{tmp}/imp", "--procs", "2", "--link",
                             "intra", "--in-place"], "in-place half of nccl-tests rows"),
    "gemm_of_an_unknown_dtype": (["search", "{cal:int4}", "--model", "linear:m=64,k=64,n=64", "--mesh", "2"],
                                 "'compute.gemm.int4' names no element type"),
    "export_template_of_another_format": (["export", "{cal}", "--format", "astra-sim", "--topology", "Ring",
                                           "--template", "{cal}", "--out", "{tmp}/x.yml"], "--template is calculon's"),
    "export_template_a_run_directory": (["export", "{cal}", "--format", "calculon", "--template", str(RUN),
                                         "--out", "{tmp}/x.json"], "a sweep run directory, not a Calculon system"),
    "export_over_its_template": (["export", "{cal}", "--format", "calculon", "--template", str(RUN / "run.json"),
                                  "--out", str(RUN / "run.json")], "would overwrite the input"),
    "export_tier_sizes_of_simai": (["export", "{cal}", "--format", "simai", "--tier-sizes", "2", "--out",
                                    "{tmp}/b.yaml"], "--tier-sizes is for calculon and astra-sim"),
    "export_a_tier_of_one_device": (["export", "{cal}", "--format", "calculon", "--tier-sizes", "1", "--out",
                                     "{tmp}/x.json"], "at least 2 devices"),
    "link_class_of_no_process_count": (["export", "{cal:no_procs}", "--format", "calculon", "--out", "{tmp}/x.json"],
                                       "link_classes"),
}
CALS = {"inf_gemm": lambda d: d["compute"]["gemm"]["float32"].update(latency_s=1e308),   # every GEMM price overflows
        "int4": lambda d: d["compute"]["gemm"].update(int4=d["compute"]["gemm"].pop("float32")),
        "no_procs": lambda d: d["link_classes"]["intra"].update(procs=[], shapes=[])}
"""Calibrations no writer of ours produces: schema-valid, or valid until the loader learned to refuse them."""
SPECS = {"bw": tier(bandwidth_GBps=1e308), "sources": lambda spec: spec.update(sources=5),
         "eff": tier(efficiency=1e-320), "version": lambda spec: spec.update(version=True),
         "machine": lambda spec: spec.update(machine=5)}


@pytest.mark.parametrize("name", CASES)
def test_one_line_and_exit_2(name, cal, tmp_path, capsys):
    argv, says = CASES[name]
    fill = {"{cal}": str(cal), "{tmp}": str(tmp_path)}
    fill |= {f"{{spec:{k}}}": str(spec_with(tmp_path, change)) for k, change in SPECS.items()
             if f"{{spec:{k}}}" in argv}
    for key, change in CALS.items():
        if f"{{cal:{key}}}" in argv:
            data = json.loads(cal.read_text())
            change(data)
            fill[f"{{cal:{key}}}"] = str(tmp_path / f"{key}.json")
            (tmp_path / f"{key}.json").write_text(json.dumps(data))
    args = [fill.get(a, a.replace("{tmp}", str(tmp_path))) for a in argv]
    code, out, err = run_main(capsys, args)
    assert code == 2 and err.count("\n") == 1 and says in err, (code, err)
    assert not list(tmp_path.glob(".*.tmp")), "a temporary file was left behind"


def test_the_fit_looks_for_segments_only_where_sizes_are(tmp_path, capsys):
    """--max-segments far beyond the sizes a run holds fits as fast as the default (no loop over the count asked)."""
    code, _, err = run_main(capsys, ["fit", str(RUN), "--out", str(tmp_path / "c.json"), "--max-segments",
                                     "1000000000", "--quiet"])
    assert code == 0, err


def test_json_output_is_json_where_a_price_leaves_the_floats():
    """A price beyond the floats' range prints null, which every JSON parser reads, not Infinity."""
    text = strict_json({"seconds": float("inf"), "low_s": float("nan"), "steps": [1.0, float("-inf")]})
    assert json.loads(text) == {"seconds": None, "low_s": None, "steps": [1.0, None]}
