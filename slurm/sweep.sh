#!/usr/bin/env bash
#SBATCH --job-name=commcal-sweep
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=01:00:00
#SBATCH --output=commcal-sweep-%j.out
#
# commcal on a Slurm cluster: measure the collectives across the allocation, fit the alpha-beta
# models, and write this machine's calibration file.
#
#   sbatch slurm/sweep.sh                                  2 nodes x 2 tasks, 1 hour, every operation
#   sbatch -N 4 --ntasks-per-node=8 -t 2:00:00 slurm/sweep.sh
#   COMMCAL_PRESET=quick sbatch slurm/sweep.sh             a first look in a few minutes
#   sbatch slurm/sweep.sh   (again, same settings)        resumes the run if it was cut short, else
#                                                          measures a new one (RUN-2, RUN-3, ...)
#
# The #SBATCH lines above are defaults; options on the sbatch command line override them.
# Knobs (environment variables, exported to the job by sbatch):
#   COMMCAL_OUT_DIR     results directory (default: commcal-out in the job's working directory:
#                       the submit directory, or sbatch --chdir=DIR)
#   COMMCAL_RUN_NAME    run directory under it (default: sweep-CLUSTER-NODESxTASKS_PER_NODE-BACKEND-PRESET,
#                       or its first -K suffix whose run no job finished: a finished run is never measured
#                       into again, so a job next week calibrates from next week's measurements); a named run
#                       is always resumed (refitted, when it was finished)
#   COMMCAL_CALIBRATION calibration file (default: $COMMCAL_OUT_DIR/CLUSTER-YYYY-MM-DD.json, or its first
#                       free -K suffix: an earlier job's calibration is never overwritten)
#   COMMCAL_PRESET      quick | full (default full: the sweep's own defaults, sizes 8 B-64 MiB)
#   COMMCAL_OPS         operations, e.g. allreduce,allgather,pingpong (default: all)
#   COMMCAL_SIZES       message sizes, e.g. 8:16M or 8,1K,1M,4M (default: the preset's)
#   COMMCAL_PROCS       process counts, e.g. 2,4 (default: powers of two up to the job, and the job)
#   COMMCAL_LINKS       link classes: intra,inter,inter2..,spread (default: all the allocation can form;
#                       switch levels from `scontrol show topology`, or --topology FILE in COMMCAL_SWEEP_ARGS)
#   COMMCAL_BACKEND     mpi | mpi-cuda | nccl (default mpi)
#   COMMCAL_TARGET_CI, COMMCAL_POINT_BUDGET   the sweep's stopping rule (--target-ci, --point-budget)
#   COMMCAL_SWEEP_ARGS  more `commcal sweep` arguments, verbatim
#   COMMCAL_ROUNDS      visits of every point (default 3, the sweep's own default)
#   COMMCAL_LAUNCHES    MPI launches the rounds are split over (default 2): an MPI library may pick another
#                       mode (protocol, placement) in each launch, and the fit sees and records how far points
#                       move between launches only when they were measured in more than one; 1: one launch
#   COMMCAL_AFTER_GEMM  N: sweep a second time with an N x N GEMM before each call (run
#                       directory RUN-after-gemmN) and fit it as the after-compute models, which price the
#                       collectives that follow a computation in a training step (default 384); 0: one sweep,
#                       in about half the time, and validate prices those collectives as back-to-back calls
#   COMMCAL_LAUNCHER    srun (default: srun --mpi=$COMMCAL_SRUN_MPI, pmix unless set) | mpirun
#                       (mpirun inside the allocation, unbound)
#   COMMCAL_REPORT      auto (default: build the report when `commcal report` exists) | 0 (skip)
#   COMMCAL             the commcal command (default: `commcal` on PATH, else
#                       $SLURM_SUBMIT_DIR/.venv/bin/commcal)
# Exit status: 0 when the calibration was written; non-zero, with a line starting "commcal-sweep:
# FAILED" in the job output, when the MPI world is not the task count, when a step fails, or when
# a result was wrong. Finished points are kept on disk, so a job killed at its time limit loses
# only the point in flight: resubmit to finish.
set -euo pipefail

say() { printf 'commcal-sweep: %s\n' "$*"; }
fail() { printf 'commcal-sweep: FAILED: %s\n' "$1" >&2; exit "${2:-1}"; }

trap 'fail "terminated by a signal (time limit, scancel or node failure); finished points are kept in ${run_dir:-the run directory}: resubmit the same command to resume" 143' TERM INT
[ -n "${SLURM_JOB_ID:-}" ] || fail "not inside a Slurm job: submit with sbatch slurm/sweep.sh" 2
# The job runs where Slurm put it: the submit directory, or sbatch --chdir=DIR.
work_dir=$PWD

# --- the commcal command -----------------------------------------------------------------------
if [ -n "${COMMCAL:-}" ]; then
  read -r -a COMMCAL_CMD <<<"$COMMCAL"
elif command -v commcal >/dev/null 2>&1; then
  COMMCAL_CMD=(commcal)
elif [ -x "$SLURM_SUBMIT_DIR/.venv/bin/commcal" ]; then
  COMMCAL_CMD=("$SLURM_SUBMIT_DIR/.venv/bin/commcal")
  export PATH="$SLURM_SUBMIT_DIR/.venv/bin:$PATH"
else
  fail "no commcal command: activate the virtual environment before sbatch, or set COMMCAL" 2
fi

# --- the allocation ------------------------------------------------------------------------------
cluster=${SLURM_CLUSTER_NAME:-$(hostname -s)}
nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
ntasks=${SLURM_NTASKS:-}
[ -n "$ntasks" ] || fail "SLURM_NTASKS is not set: give the job a task count (-n or --ntasks-per-node)" 2
per_node=${SLURM_NTASKS_PER_NODE:-$(( ntasks / nodes ))}
preset=${COMMCAL_PRESET:-full}
backend=${COMMCAL_BACKEND:-mpi}
case $preset in quick | full) ;; *) fail "COMMCAL_PRESET must be quick or full, not '$preset'" 2 ;; esac

out_dir=${COMMCAL_OUT_DIR:-$work_dir/commcal-out}
run_name=${COMMCAL_RUN_NAME:-sweep-$cluster-${nodes}x${per_node}-$backend-$preset}
run_dir=$out_dir/$run_name
finished=.sweep-sh-finished   # written into a run directory once its calibration is fitted
k=1
while [ -z "${COMMCAL_RUN_NAME:-}" ] && [ -e "$run_dir/$finished" ]; do k=$((k + 1)); run_dir=$out_dir/$run_name-$k; done
day=$(date +%Y-%m-%d)
calibration=${COMMCAL_CALIBRATION:-$out_dir/$cluster-$day.json}
k=1
while [ -z "${COMMCAL_CALIBRATION:-}" ] && [ -e "$calibration" ]; do k=$((k + 1)); calibration=$out_dir/$cluster-$day-$k.json; done
mkdir -p "$out_dir" "$(dirname "$calibration")"

sweep_args=(sweep --out "$run_dir" --resume --backend "$backend")
[ "$preset" = quick ] && sweep_args+=(--quick)
[ -n "${COMMCAL_OPS:-}" ] && sweep_args+=(--ops "$COMMCAL_OPS")
[ -n "${COMMCAL_SIZES:-}" ] && sweep_args+=(--sizes "$COMMCAL_SIZES")
[ -n "${COMMCAL_PROCS:-}" ] && sweep_args+=(--procs "$COMMCAL_PROCS")
[ -n "${COMMCAL_LINKS:-}" ] && sweep_args+=(--links "$COMMCAL_LINKS")
[ -n "${COMMCAL_TARGET_CI:-}" ] && sweep_args+=(--target-ci "$COMMCAL_TARGET_CI")
[ -n "${COMMCAL_POINT_BUDGET:-}" ] && sweep_args+=(--point-budget "$COMMCAL_POINT_BUDGET")
if [ -n "${COMMCAL_SWEEP_ARGS:-}" ]; then read -r -a extra <<<"$COMMCAL_SWEEP_ARGS"; sweep_args+=("${extra[@]}"); fi
after_gemm=${COMMCAL_AFTER_GEMM:-384}
case $after_gemm in '' | *[!0-9]*) fail "COMMCAL_AFTER_GEMM must be a whole number, not '$after_gemm'" 2 ;; esac
after_dir=$run_dir-after-gemm$after_gemm
rounds=${COMMCAL_ROUNDS:-3}
launches=${COMMCAL_LAUNCHES:-2}
case $rounds in '' | *[!0-9]* | 0) fail "COMMCAL_ROUNDS must be a whole number >= 1, not '$rounds'" 2 ;; esac
case $launches in '' | *[!0-9]* | 0) fail "COMMCAL_LAUNCHES must be a whole number >= 1, not '$launches'" 2 ;; esac
[ "$launches" -le "$rounds" ] || launches=$rounds

# Open MPI: never bind every "node"'s rank to the same core; yield when idle (shared cores).
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
export PRTE_MCA_hwloc_default_binding_policy=${PRTE_MCA_hwloc_default_binding_policy:-none}
export PYTHONUNBUFFERED=1

launcher=${COMMCAL_LAUNCHER:-srun}
case $launcher in
  srun) launch=(srun --mpi="${COMMCAL_SRUN_MPI:-pmix}" --ntasks="$ntasks" --kill-on-bad-exit=1) ;;
  # Under srun the sweep checks its MPI world against Slurm's task count itself; under mpirun,
  # which hides the step's task count, --expect-world does.
  mpirun) launch=(mpirun -n "$ntasks" --bind-to none); sweep_args+=(--expect-world "$ntasks")
          [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ;;
  *) fail "COMMCAL_LAUNCHER must be srun or mpirun, not '$launcher'" 2 ;;
esac

say "job $SLURM_JOB_ID on $cluster: $nodes node(s) (${SLURM_JOB_NODELIST:-?}), $ntasks tasks, preset $preset, backend $backend"
say "run directory $run_dir"
say "calibration   $calibration"

# --- 1. sweep (and the after-compute sweep) ---------------------------------------------------------
run_sweep() {  # run_sweep DIR [more arguments]: one sweep into DIR over $launches launches, failing the job loudly
  local dir=$1 k rc; shift
  for ((k = 1; k <= launches; k++)); do
    # Launch k measures the visits up to round ceil(k * rounds / launches); retries wait for the last launch.
    local upto=(--rounds $(( (k * rounds + launches - 1) / launches )))
    [ "$k" -lt "$launches" ] && upto+=(--retries 0)
    say "step 1/3 (launch $k/$launches): ${launch[*]} ${COMMCAL_CMD[*]} ${sweep_args[*]} $* ${upto[*]}"
    set +e
    "${launch[@]}" "${COMMCAL_CMD[@]}" "${sweep_args[@]}" "$@" "${upto[@]}"
    rc=$?
    set -e
    if [ $rc -ne 0 ]; then
      fail "step 1 (sweep) exited $rc; the error is above: a usage error, an MPI world that is not the $ntasks Slurm tasks, wrong results, a crash or the time limit. Finished points are kept in $dir: resubmit to resume" "$rc"
    fi
  done
  [ -f "$dir/summary.csv" ] || fail "sweep wrote no $dir/summary.csv"
}
run_sweep "$run_dir"
fit_args=(fit "$run_dir" --out "$calibration")
if [ "$after_gemm" -gt 0 ]; then
  run_sweep "$after_dir" --out "$after_dir" --after-gemm "$after_gemm"
  fit_args+=(--after-compute "$after_dir")
fi

# --- 2. fit ------------------------------------------------------------------------------------------
say "step 2/3: ${COMMCAL_CMD[*]} ${fit_args[*]}"
"${COMMCAL_CMD[@]}" "${fit_args[@]}" || fail "commcal fit exited $?"
[ -s "$calibration" ] || fail "commcal fit wrote no $calibration"
printf 'job %s fitted %s\n' "$SLURM_JOB_ID" "$calibration" >"$run_dir/$finished.tmp"
mv -f "$run_dir/$finished.tmp" "$run_dir/$finished"

# --- 3. report (when the installed commcal has one) ------------------------------------------------
report_dir=${calibration%.json}-report
if [ "${COMMCAL_REPORT:-auto}" != 0 ] && "${COMMCAL_CMD[@]}" report --help >/dev/null 2>&1; then
  say "step 3/3: ${COMMCAL_CMD[*]} report --run $run_dir --calibration $calibration --out $report_dir"
  "${COMMCAL_CMD[@]}" report --run "$run_dir" --calibration "$calibration" --out "$report_dir" \
    || fail "commcal report exited $?"
else
  say "step 3/3: skipped (no 'commcal report' here, or COMMCAL_REPORT=0)"
fi
say "done: calibration $calibration"
