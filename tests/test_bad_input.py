"""Arguments and files no writer of ours produces and no option means: one line on stderr and exit 2 from every
front door, never a traceback, a hang or a file half written (the cases an audit of the CLI found)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from calib.synthetic import synthetic_calibration
from conftest import mpi_env, run_cli, run_main
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
    "search_nodes_wider_than_the_job": (["search", "{cal}", "--model", "gpt-1.2b", "--devices", "64",
                                         "--gpus-per-node", "128"], "--gpus-per-node 128 is more than --devices 64"),
    "predict_nodes_wider_than_the_job": (["predict", "{cal}", "--model", "gpt-1.2b", "--devices", "8",
                                          "--gpus-per-node", "16", "--config", "t=1,p=1,d=8,mb=1"],
                                         "--gpus-per-node 16 is more than --devices 8"),
    "search_devices_beyond_any_mesh": (["search", "{cal}", "--model", "gpt-1.2b", "--devices", "800000000",
                                        "--gpus-per-node", "8"], "1 to 1048576 devices"),
    "predict_devices_beyond_any_mesh": (["predict", "{cal}", "--model", "gpt-1.2b", "--devices", "800000000",
                                         "--gpus-per-node", "8", "--config", "t=8,p=8,d=1,mb=1"],
                                        "1 to 1048576 devices"),
    "predict_collective_with_a_profile": (["predict", "{cal}", "--op", "allreduce", "--link", "intra", "--procs", "2",
                                           "--bytes", "1M", "--profile", "{tmp}/none.json"],
                                          "--profile is for a layer strategy"),
    "predict_collective_with_other_forms_flags": (["predict", "{cal}", "--op", "allreduce", "--link", "intra",
                                                   "--procs", "2", "--bytes", "1M", "--mesh", "2x2", "--strategy",
                                                   "m.n", "--model", "gpt3-175b", "--dtype", "float16"],
                                                  "--strategy, --mesh, --dtype, --model are for"),
    "predict_layer_after_compute": (["predict", "{cal}", "--layer", "linear:m=64,k=64,n=64", "--strategy", "m",
                                     "--mesh", "2", "--after-compute"], "--after-compute is for a collective"),
    "search_mesh_and_a_training_step": (["search", "{cal}", "--model", "gpt-1.2b", "--devices", "64",
                                         "--gpus-per-node", "8", "--mesh", "8x8"],
                                        "--gpus-per-node is for a training step"),
    "search_mesh_with_gpus_per_node": (["search", "{cal}", "--model", "linear:m=64,k=64,n=64", "--mesh", "2x4",
                                        "--gpus-per-node", "3"], "not layer strategies (--mesh)"),
    "search_training_with_restarts": (["search", "{cal}", "--model", "gpt-1.2b", "--devices", "64",
                                       "--gpus-per-node", "8", "--restarts", "3"],
                                      "--restarts is for layer strategies"),
    "search_training_with_no_restarts": (["search", "{cal}", "--model", "gpt-1.2b", "--devices", "64",
                                          "--gpus-per-node", "8", "--restarts", "0"], "--restarts is for"),
    "search_mesh_with_max_micro_batch": (["search", "{cal}", "--model", "linear:m=64,k=64,n=64", "--mesh", "2",
                                          "--max-micro-batch", "3"], "--max-micro-batch is for a training step"),
    "predict_procs_beyond_any_job": (["predict", "{cal}", "--op", "allreduce", "--link", "intra", "--procs",
                                      "99999999999999999999", "--bytes", "1M"], "allreduce takes 1 to 1048576"),
    "predict_pingpong_of_one": (["predict", "{cal}", "--op", "pingpong", "--link", "intra", "--procs", "1",
                                 "--bytes", "1M"], "pingpong takes 2 to"),
    "embedding_of_no_vocabulary": (["predict", "{cal}", "--layer", "embedding:vocab=0", "--strategy", "r",
                                    "--mesh", "2"], "vocab must be 1 to"),
    "linear_beyond_any_size": (["predict", "{cal}", "--layer", f"linear:m={2 ** 70},k=64,n=64", "--strategy", "m",
                                "--mesh", "2"], "m must be 1 to"),
    "linear_operand_beyond_any_memory": (["predict", "{cal}", "--layer", f"linear:m={2 ** 40},k={2 ** 40},n=4",
                                          "--strategy", "m", "--mesh", "2"], "X of shape"),
    "dense_size_beyond_any": (["search", "{cal}", "--model", f"dense:dims=64-{2 ** 41}", "--mesh", "2"],
                              "sizes 1 to"),
    "spec_key_twice": (["predict", "{cal}", "--layer", "linear:m=64,m=128,k=64,n=64", "--strategy", "m",
                        "--mesh", "2"], "gives m more than once"),
    "validate_spec_key_twice": (["validate", "{cal}", "--out", "{tmp}/v", "--model", "mlp:batch=4,batch=8"],
                                "gives batch more than once"),
    "validate_training_key_twice": (["validate", "{cal}", "--out", "{tmp}/v", "--training", "transformer:d=64,d=32"],
                                    "gives d more than once"),
    "profile_spec_key_twice": (["profile", "--mesh", "2", "--out", "{tmp}/p", "--layer", "linear:m=4,m=8"],
                               "gives m more than once"),
    "spec_empty_item": (["search", "{cal}", "--model", "linear:m=64,,k=64", "--mesh", "2"], "empty item"),
    "config_key_twice": (["predict", "{cal}", "--model", "gpt-1.2b", "--devices", "64", "--gpus-per-node", "8",
                          "--config", "t=8,p=8,d=1,mb=1,t=4"], "gives t more than once"),
    "config_empty_item": (["predict", "{cal}", "--model", "gpt-1.2b", "--devices", "64", "--gpus-per-node", "8",
                           "--config", "t=8,,p=8,d=1,mb=1"], "'' is not one of"),
    "config_chunks_of_a_schedule_without_them": (["predict", "{cal}", "--model", "gpt-1.2b", "--devices", "64",
                                                   "--gpus-per-node", "8", "--config", "t=8,p=8,d=1,mb=1,v=3"],
                                                  "v=3 applies only to schedule=interleaved"),
    "config_chunks_given_twice": (["predict", "{cal}", "--model", "gpt-1.2b", "--devices", "64", "--gpus-per-node",
                                   "8", "--config", "t=8,p=8,d=1,mb=1,schedule=interleaved/v2,v=3"],
                                  "one would hide the other"),
    "predict_two_configurations": (["predict", "{cal}", "--model", "gpt-1.2b", "--devices", "64", "--gpus-per-node",
                                    "8", "--config", "t=8,p=8,d=1,mb=1", "--config", "t=4,p=8,d=2,mb=1"],
                                   "give --config once"),
    "predict_no_such_operation": (["predict", "{cal}", "--op", "foo", "--link", "intra", "--procs", "2", "--bytes",
                                   "1M"], "'foo' is not an operation; predict prices allreduce"),
    "predict_a_model_alone": (["predict", "{cal}", "--model", "gpt-1.2b"],
                              "predict needs --config, --devices, --gpus-per-node for a training step"),
    "predict_nothing_to_price": (["predict", "{cal}"], "or --model, --config, --devices, --gpus-per-node"),
    "search_no_memory": (["search", "{cal}", "--model", "linear:m=64,k=64,n=64", "--mesh", "2", "--memory-cap", "0"],
                         "--memory-cap: size '0' must be a positive"),
    "predict_negative_bytes": (["predict", "{cal}", "--op", "allreduce", "--link", "intra", "--procs", "2",
                                "--bytes", "-1"], "--bytes: size '-1' must be a positive"),
    "export_to_a_directory_not_there": (["export", "{cal}", "--format", "calculon", "--out", "{tmp}/new/"],
                                        "names a directory"),
    "export_of_an_empty_path": (["export", "", "--format", "calculon", "--out", "{tmp}/x.json"],
                                "an input path is empty"),
    "table_of_an_empty_path": (["table", ""], "an input path is empty"),
    "diff_of_an_empty_path": (["diff", "", "{cal}"], "an input path is empty"),
    "predict_of_an_empty_path": (["predict", "", "--layer", "linear:m=8,k=8,n=8", "--strategy", "m", "--mesh", "2"],
                                 "an input path is empty"),
    "table_of_a_name_too_long": (["table", "{tmp}/" + "a" * 300 + ".json"], "File name too long"),
    "fit_to_a_name_too_long": (["fit", str(RUN), "--out", "{tmp}/" + "a" * 300 + ".json", "--quiet"],
                               "File name too long"),
    "export_to_a_name_too_long": (["export", "{cal}", "--format", "calculon", "--out", "{tmp}/" + "a" * 300],
                                  "File name too long"),
    "report_into_a_name_too_long": (["report", "--calibration", "{cal}", "--out", "{tmp}/" + "a" * 300],
                                    "File name too long"),
    "dry_run_of_a_billion_rounds": (["sweep", "--dry-run", "--nodes", "2", "--rounds", "1000000000"],
                                    "--rounds at most"),
    "dry_run_of_a_billion_retries": (["sweep", "--dry-run", "--nodes", "2", "--retries", "1000000000"],
                                     "--retries at most"),
    "dry_run_budget_beyond_any_clock": (["sweep", "--dry-run", "--nodes", "2", "--point-budget", "1e308"],
                                        "--point-budget at most"),
    "dry_run_samples_beyond_the_cap": (["sweep", "--dry-run", "--nodes", "2", "--min-samples", "9" * 20],
                                       "--min-samples at most"),
    "scan_of_a_million_rounds": (["scan", "--dry-run", "--nodes", "2", "--rounds", "1000000"], "--rounds at most"),
    "validate_budget_beyond_any_clock": (["validate", "{cal}", "--out", "{tmp}/v", "--quick", "--budget", "1e300"],
                                         "--budget at most"),
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


@pytest.mark.parametrize("argv", [
    ["search", "{cal}", "--model", "linear:m=64,k=64,n=64", "--mesh", "2x2", "--devices", "4", "--ranks-per-node", "2"],
    ["predict", "{cal}", "--layer", "linear:m=64,k=64,n=64", "--strategy", "m.n", "--mesh", "2x2", "--devices", "4"],
    ["search", "{cal}", "--model", "mlp:batch=64,d_in=64,d_hidden=64", "--devices", "4", "--gpus-per-node", "2",
     "--max-micro-batch", "2"],
    ["predict", "{cal}", "--op", "allreduce", "--link", "intra", "--procs", "1", "--bytes", "1M"]])
def test_the_documented_combinations_still_price(argv, cal, capsys):
    """--devices with --mesh is the count the mesh must match (search and predict), not a training step's; a
    collective of one process is priced (it costs nothing)."""
    code, _, err = run_main(capsys, [str(cal) if a == "{cal}" else a for a in argv])
    assert code == 0, err


@pytest.mark.parametrize("argv,says", [
    (["report", "--run", "{run}", "--out", "{run}"], "would overwrite the input"),
    (["report", "--run", "{run}", "--out", "{run}/points"], "would overwrite the input"),
    (["report", "--run", "{run}", "--run", "{run}/", "--out", "{tmp}/r"], "the same run directory given twice"),
    (["report", "--run", "{run}", "--out", ""], "--out is empty"),
    (["diff", "{cal}", "{cal}", "--out", "{cal}"], "exists and is not a directory"),
    (["fit", "{val}", "--out", "{tmp}/c.json"], "not a commcal run directory: a validation directory"),
    (["diff", "{val}", "{cal}"], "a validation directory, not a calibration"),
])
def test_reports_write_beside_their_inputs_and_name_a_validation(argv, says, cal, tmp_path, capsys):
    """report and diff never write into what they read (a run's points/ is every reader's), and a validation's
    directory, which holds a run.json of its own, is named as what it is; one line, exit 2, the run untouched."""
    run, val = tmp_path / "run", tmp_path / "val"
    shutil.copytree(RUN, run)
    (run / "points").mkdir(exist_ok=True)
    val.mkdir()
    (val / "run.json").write_text(json.dumps({"command": "validate"}))
    (val / "strategies.parquet").write_bytes(b"")
    before = sorted(p.name for p in run.rglob("*"))
    fill = {"{run}": str(run), "{cal}": str(cal), "{val}": str(val), "{tmp}": str(tmp_path)}
    args = [next((a.replace(k, v) for k, v in fill.items() if k in a), a) for a in argv]
    code, _, err = run_main(capsys, args)
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert sorted(p.name for p in run.rglob("*")) == before


@pytest.mark.parametrize("command,name", [("report", "report.md"), ("diff", "diff.md"), ("report", "figures")])
def test_a_report_that_cannot_write_one_of_its_files_writes_none(command, name, cal, tmp_path, capsys):
    """--out whose report.md (or diff.md) is a directory, or whose figures/ is a file: refused before any figure or
    page is drawn, so nothing half of a report is left beside what was there."""
    out = tmp_path / "out"
    out.mkdir()
    (out / name).mkdir() if name.endswith(".md") else (out / name).write_text("")
    argv = ["report", "--calibration", str(cal)] if command == "report" else ["diff", str(cal), str(cal)]
    code, _, err = run_main(capsys, [*argv, "--out", str(out)])
    assert code == 2 and err.count("\n") == 1 and name in err, err
    assert sorted(p.name for p in out.iterdir()) == [name] and not list(out.rglob("*.png"))


def test_a_launchers_rank_variables_do_not_silence_a_command_of_one_process(cal, capsys, monkeypatch):
    """table, fit, predict ... run as one process: a shell inside a Slurm step (SLURM_PROCID=1) still gets their
    error line at once; only the subcommands every rank of a job runs leave it to rank 0."""
    monkeypatch.setenv("SLURM_PROCID", "1")
    code, _, err = run_main(capsys, ["table", str(cal.parent / "none.json")])
    assert code == 2 and err.count("\n") == 1 and "none.json" in err, err


@pytest.mark.parametrize("command", [["sweep", "--dry-run", "--quick", "--nodes", "2"],
                                     ["scan", "--dry-run", "--nodes", "4"]])
def test_a_bad_thread_level_in_the_environment_is_one_line_in_a_dry_run_too(command):
    """MPI4PY_RC_THREAD_LEVEL=garbage: a dry run gives the line the run would give (sweep's imports mpi4py without
    initialising MPI: no warning of mpi4py's own before the line)."""
    proc = run_cli(command, env={**mpi_env(), "MPI4PY_RC_THREAD_LEVEL": "garbage"}, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "MPI4PY_RC_THREAD_LEVEL 'garbage' is not a thread level" in proc.stderr, proc.stderr


@pytest.mark.parametrize("strategy", ["-.n", "-.n/ws", "-.-"])
def test_a_strategy_id_that_begins_with_a_dash_is_a_value(strategy, cal, capsys):
    """`--strategy -.n/ws` as docs/cli.md writes it (an axis left replicated first), not only `--strategy=-.n/ws`."""
    code, out, err = run_main(capsys, ["predict", str(cal), "--layer", "linear:m=64,k=64,n=64", "--mesh", "2x2",
                                       "--strategy", strategy])
    assert code == 0 and strategy in out, err



@pytest.mark.parametrize("change,says", [
    (lambda meta: meta["topology"]["levels"][0].update(groups=[]), "run.json: malformed topology"),
    (lambda meta: meta.update(origin={"peer": "bogus", "logs": 5}), "the calibration fitted from"),
    (lambda meta: meta["options"].update(after_gemm=10 ** 30), "run.json: key 'options' does not hold"),
    (lambda meta: meta["options"].update(method="telepathy"), "names the timing method 'telepathy'"),
    (lambda meta: meta["options"].update(method=["osu"]), "names the timing method \"['osu']\""),
])
def test_a_runs_file_no_schema_allows_is_named_not_the_output(change, says, tmp_path, capsys):
    """A value of a run's run.json that the calibration's schema refuses is the run's fault: the line names the run
    (or the calibration fitted from it), not the --out it never wrote."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    meta = json.loads((run / "run.json").read_text())
    change(meta)
    (run / "run.json").write_text(json.dumps(meta))
    out = tmp_path / "cal.json"
    code, _, err = run_main(capsys, ["fit", str(run), "--out", str(out), "--quiet"])
    assert code == 2 and err.count("\n") == 1 and says in err and str(out) not in err, err
    assert not out.exists()
