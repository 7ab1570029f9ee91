#!/usr/bin/env bash
#SBATCH --job-name=commcal-scan
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:30:00
#SBATCH --output=commcal-scan-%j.out
#
# commcal on a Slurm cluster: scan every node pair's latency and bandwidth and every node's copy and
# GEMM rate, name the nodes and pairs slower than their peers, and write the scan's report.
#
#   sbatch -N 16 slurm/scan.sh                      16 nodes, one task each
#   COMMCAL_SCAN_ARGS="--sizes 8,16M" sbatch -N 64 -t 2:00:00 slurm/scan.sh
#   commcal scan --dry-run --nodes 512 --time-limit 1:00:00     how long it takes, before you submit
#
# One task per node: the scan refuses two ranks on one node. Knobs (environment variables):
#   COMMCAL_OUT_DIR     results directory (default: commcal-out in the job's working directory)
#   COMMCAL_SCAN_NAME   scan directory under it (default: scan-CLUSTER-NODES-JOBID)
#   COMMCAL_SCAN_ARGS   more `commcal scan` arguments, verbatim (--sizes, --point-budget, tolerances, ...)
#   COMMCAL_LAUNCHER    srun (default: srun --mpi=$COMMCAL_SRUN_MPI, pmix unless set) | mpirun
#   COMMCAL_REPORT      auto (default: build the report) | 0 (skip)
#   COMMCAL             the commcal command (default: `commcal` on PATH, else $SLURM_SUBMIT_DIR/.venv/bin/commcal)
# Exit status: 0 when the scan (and its report) was written, slow nodes or not: the job log's line
# "commcal scan: flagged nodes: ..." names them. Non-zero, with a line starting "commcal-scan: FAILED",
# when a step fails.
set -euo pipefail

say() { printf 'commcal-scan: %s\n' "$*"; }
fail() { printf 'commcal-scan: FAILED: %s\n' "$1" >&2; exit "${2:-1}"; }

trap 'fail "terminated by a signal (time limit, scancel or node failure); a scan does not resume: resubmit with a longer time limit (commcal scan --dry-run estimates it)" 143' TERM INT
[ -n "${SLURM_JOB_ID:-}" ] || fail "not inside a Slurm job: submit with sbatch slurm/scan.sh" 2

# The commcal command: $COMMCAL, else `commcal` on PATH, else the submit directory's virtual environment.
read -r -a COMMCAL_CMD <<<"${COMMCAL:-$(command -v commcal || echo "$SLURM_SUBMIT_DIR/.venv/bin/commcal")}"
command -v "${COMMCAL_CMD[0]}" >/dev/null \
  || fail "no commcal command: activate the virtual environment before sbatch, or set COMMCAL" 2

cluster=${SLURM_CLUSTER_NAME:-$(hostname -s)}
nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
[ "$nodes" -ge 2 ] || fail "a scan needs two nodes or more (sbatch -N 2 or more)" 2
out_dir=${COMMCAL_OUT_DIR:-$PWD/commcal-out}
scan_dir=$out_dir/${COMMCAL_SCAN_NAME:-scan-$cluster-$nodes-$SLURM_JOB_ID}
mkdir -p "$out_dir"
scan_args=(scan --out "$scan_dir")
if [ -n "${COMMCAL_SCAN_ARGS:-}" ]; then read -r -a extra <<<"$COMMCAL_SCAN_ARGS"; scan_args+=("${extra[@]}"); fi

export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
export PRTE_MCA_hwloc_default_binding_policy=${PRTE_MCA_hwloc_default_binding_policy:-none}
export PYTHONUNBUFFERED=1
launcher=${COMMCAL_LAUNCHER:-srun}
case $launcher in
  srun) launch=(srun --mpi="${COMMCAL_SRUN_MPI:-pmix}" --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1
                --kill-on-bad-exit=1) ;;
  mpirun) launch=(mpirun -n "$nodes" --map-by ppr:1:node --bind-to none); scan_args+=(--expect-world "$nodes")
          [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ;;
  *) fail "COMMCAL_LAUNCHER must be srun or mpirun, not '$launcher'" 2 ;;
esac

say "job $SLURM_JOB_ID on $cluster: $nodes nodes (${SLURM_JOB_NODELIST:-?}), one task each"
say "step 1/2: ${launch[*]} ${COMMCAL_CMD[*]} ${scan_args[*]}"
set +e
"${launch[@]}" "${COMMCAL_CMD[@]}" "${scan_args[@]}"
rc=$?
set -e
[ $rc -eq 0 ] || fail "step 1 (scan) exited $rc; the error is above" "$rc"
[ -f "$scan_dir/scan.json" ] || fail "the scan wrote no $scan_dir/scan.json"

if [ "${COMMCAL_REPORT:-auto}" != 0 ]; then
  say "step 2/2: ${COMMCAL_CMD[*]} report --scan $scan_dir --out $scan_dir/report"
  "${COMMCAL_CMD[@]}" report --scan "$scan_dir" --out "$scan_dir/report" || fail "commcal report exited $?"
else
  say "step 2/2: skipped (COMMCAL_REPORT=0)"
fi
say "done: scan $scan_dir"
