"""`commcal <subcommand>`: the front door, a thin dispatcher on the top floor of the house (microbench, then
calib, analysis and reports above it), so that it may name every package's subcommand while no package below
imports it. Each subcommand lives in the package that owns it and is imported only when chosen, so MPI ranks
never pay for matplotlib or statsmodels."""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import time

from microbench.errors import UsageError

# name -> (module with add_arguments(parser) and run(args) -> int, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "sweep": ("microbench.sweep_cmd", "measure collectives across sizes, process counts and links (run under mpirun/srun)"),
    "scan": ("microbench.scan_cmd", "measure every node pair's latency and bandwidth and every node's copy and GEMM "
                                    "rate, and flag the slow ones (run under srun/mpirun, one rank per node)"),
    "fit": ("calib.fit_cmd", "fit alpha/beta models from sweep runs and write a calibration JSON"),
    "predict": ("analysis.predict_cmd", "predict a collective's time, or a layer strategy's plan and cost, from a calibration"),
    "table": ("calib.table_cmd", "print a calibration's alpha/beta tables"),
    "import": ("calib.import_cmd", "turn nccl-tests, OSU or IMB logs into a run directory that fit reads"),
    "calibration": ("calib.spec_cmd", "write a calibration from a hardware spec, refined by measured runs where given "
                                      "(calibration from-spec SPEC [--refine RUN_DIR ...] --out CAL)"),
    "export": ("calib.export_cmd", "write a planner's machine description (Calculon, ASTRA-sim, SimAI) from a calibration"),
    "search": ("analysis.search_cmd", "search SBP sharding strategies for a model on a device mesh"),
    "validate": ("analysis.validate_cmd", "run real SBP strategies and score predicted vs measured ranking (under mpirun/srun)"),
    "profile": ("analysis.profile_cmd", "time the local kernels of networks' and layers' strategies into a compute profile "
                                        "that search, predict and validate price compute by (under mpirun/srun)"),
    "report": ("reports.report_cmd", "build an HTML/Markdown report with figures"),
    "diff": ("reports.diff_cmd", "compare two calibrations of a machine"),
}


RANK_SUBCOMMANDS = {"sweep", "scan", "validate", "profile"}
"""Run by every rank of an MPI job: each rank gets one BLAS thread (unless the user chose), so the GEMM
rate the sweep measures is the rate each rank has when all ranks compute at once, as in validate."""
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
FAIL_GRACE_S = 3.0


def launcher_rank() -> int:
    """This process's rank as the launcher told it (0 outside MPI); read from the environment so that
    usage errors print once without initialising MPI."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "")
        if value.isascii() and value.isdigit():
            return int(value)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit 2, once per job."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sub = self.prog.removeprefix("commcal").strip()
        raise UsageError(f"{sub}: {message}" if sub else message)   # _fail adds "commcal: "


def _fail(message: str, name: str | None, own: bool = False) -> int:
    """The one line and exit 2. Of a subcommand every rank of an MPI job runs (RANK_SUBCOMMANDS), rank 0 prints it
    (any rank, naming itself, where the error may be its `own`, met by no other rank) and every rank waits for the
    others before exiting, since a launcher ends the whole job at the first non-zero exit and rank 0 may not have
    printed yet; any other subcommand is one process, which prints it whatever rank a launcher's variables (inherited
    from a job step) name."""
    rank = launcher_rank()
    if name not in RANK_SUBCOMMANDS:
        print(f"commcal: error: {message}", file=sys.stderr, flush=True)
        return 2
    if rank == 0 or own:
        print(f"commcal: error: {f'rank {rank}: ' if rank else ''}{message}", file=sys.stderr, flush=True)
    _wait_for_the_job()
    return 2


def _wait_for_the_job() -> None:
    """Hold this rank until every rank has reached its error (rank 0 having printed), at most FAIL_GRACE_S: through
    a polled MPI Ibarrier where the subcommand has initialised MPI (all ranks failing alike leave at once; where some
    never arrive, the job is aborted with code 2), else, on ranks other than 0, a plain wait. Never initialises MPI
    itself."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1:
        request = mpi.COMM_WORLD.Ibarrier()
        deadline = time.monotonic() + FAIL_GRACE_S
        while not request.Test() and time.monotonic() < deadline:
            time.sleep(0.005)
        if not request.Test():
            # a rank that met no error waits in a collective for this one: finalising would hang the job
            mpi.COMM_WORLD.Abort(2)
    elif launcher_rank() != 0:
        time.sleep(FAIL_GRACE_S)


def _finite_numbers(args) -> None:
    """Every number option is finite: argparse's float reads 'inf' and 'nan', which no option means."""
    for name, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"--{name.replace('_', '-')} {value}: not a finite number")


DASH_VALUES = ("--strategy",)
"""Options whose values may begin with '-' (a strategy id such as -.k/ws, - for an axis left replicated), which
argparse would take for an option."""


def _dash_values(argv: list[str]) -> list[str]:
    """argv with `OPTION VALUE` joined into `OPTION=VALUE` where OPTION is one of DASH_VALUES and VALUE begins with
    '-' but not '--' (no option of ours has a one-dash form but -h)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in DASH_VALUES and i + 1 < len(argv) and argv[i + 1].startswith("-") \
                and not argv[i + 1].startswith("--") and argv[i + 1] != "-h":
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def build_parser(name: str | None) -> tuple[_Parser, object | None]:
    parser = _Parser(prog="commcal", description="Calibrate cluster communication for parallelization planners.")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=_Parser)
    module = None
    for cmd, (modname, helptext) in SUBCOMMANDS.items():
        sp = sub.add_parser(cmd, help=helptext, description=helptext)
        if cmd == name:
            module = importlib.import_module(modname)
            module.add_arguments(sp)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name = next((a for a in argv if not a.startswith("-")), None)
    try:
        if name is not None and name not in SUBCOMMANDS:
            raise UsageError(f"unknown subcommand {name!r}; choose from {', '.join(SUBCOMMANDS)}")
        if name in RANK_SUBCOMMANDS:
            for var in BLAS_THREAD_VARIABLES:   # before numpy loads
                os.environ.setdefault(var, "1")
        parser, module = build_parser(name)
        args = parser.parse_args(_dash_values(argv))
        _finite_numbers(args)
        if module is None:
            parser.print_help(sys.stderr)
            return 2
        return int(module.run(args) or 0)
    except UsageError as exc:
        return _fail(str(exc), name)
    except KeyboardInterrupt:
        return _fail("interrupted", name)
    except OSError as exc:      # what no reader or writer foresaw (a name too long for the file system): one line
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}", name, own=True)


if __name__ == "__main__":
    sys.exit(main())
