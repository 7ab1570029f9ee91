#!/usr/bin/env bash
#SBATCH --job-name=commcal-validate
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=00:30:00
#SBATCH --output=commcal-validate-%j.out
#
# commcal's strategy-ranking validation on a Slurm cluster: run real SBP-sharded strategies across
# the allocation and score how well this machine's calibration ranks them.
#
#   sbatch slurm/validate.sh                      uses the newest calibration slurm/sweep.sh wrote
#   COMMCAL_CALIBRATION=cal.json sbatch slurm/validate.sh
#
# The #SBATCH lines above are defaults; options on the sbatch command line override them.
# Knobs (environment variables):
#   COMMCAL_OUT_DIR       results directory (default: commcal-out in the job's working directory:
#                       the submit directory, or sbatch --chdir=DIR)
#   COMMCAL_CALIBRATION   calibration file (default: the newest $COMMCAL_OUT_DIR/CLUSTER-*.json)
#   COMMCAL_VALIDATE_OUT  validation output (default: $COMMCAL_OUT_DIR/validate-CLUSTER-YYYY-MM-DD, or its
#                         first free -K suffix: an earlier job's validation is never replaced)
#   COMMCAL_PRESET        quick (default: small layers, loose target) | full (give --layer specs in
#                         COMMCAL_VALIDATE_ARGS)
#   COMMCAL_VALIDATE_ARGS more `commcal validate` arguments, verbatim (e.g. --mesh 2x2 --layer mlp:...)
#   COMMCAL_BACKEND       mpi | mpi-cuda | nccl (default mpi): the backend the calibration was swept with
#   COMMCAL_LAUNCHER      srun (default; --mpi=$COMMCAL_SRUN_MPI, pmix unless set) | mpirun
#   COMMCAL               the commcal command (default: `commcal` on PATH, else
#                         $SLURM_SUBMIT_DIR/.venv/bin/commcal)
# Exit status: non-zero, with a line starting "commcal-validate: FAILED", when a step fails.
# Self-contained like slurm/sweep.sh (sbatch copies a script before running it, so a sibling file
# cannot be sourced reliably): the command and launcher lookup below repeat it on purpose.
set -euo pipefail

say() { printf 'commcal-validate: %s\n' "$*"; }
fail() { printf 'commcal-validate: FAILED: %s\n' "$1" >&2; exit "${2:-1}"; }

[ -n "${SLURM_JOB_ID:-}" ] || fail "not inside a Slurm job: submit with sbatch slurm/validate.sh" 2
# The job runs where Slurm put it: the submit directory, or sbatch --chdir=DIR.
work_dir=$PWD

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
"${COMMCAL_CMD[@]}" validate --help >/dev/null 2>&1 \
  || fail "this commcal has no working 'validate' subcommand yet" 2

cluster=${SLURM_CLUSTER_NAME:-$(hostname -s)}
ntasks=${SLURM_NTASKS:-}
[ -n "$ntasks" ] || fail "SLURM_NTASKS is not set: give the job a task count (-n or --ntasks-per-node)" 2
out_dir=${COMMCAL_OUT_DIR:-$work_dir/commcal-out}
calibration=${COMMCAL_CALIBRATION:-}
if [ -z "$calibration" ]; then
  calibration=$(ls -1t "$out_dir/$cluster"-*.json 2>/dev/null | head -n 1 || true)
  [ -n "$calibration" ] || fail "no calibration in $out_dir for $cluster: run slurm/sweep.sh first or set COMMCAL_CALIBRATION" 2
fi
[ -f "$calibration" ] || fail "calibration $calibration does not exist" 2
day=$(date +%Y-%m-%d)
vout=${COMMCAL_VALIDATE_OUT:-$out_dir/validate-$cluster-$day}
k=1   # an earlier job's validation is never replaced: the first free -K suffix
while [ -z "${COMMCAL_VALIDATE_OUT:-}" ] && [ -e "$vout" ]; do k=$((k + 1)); vout=$out_dir/validate-$cluster-$day-$k; done

export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
export PRTE_MCA_hwloc_default_binding_policy=${PRTE_MCA_hwloc_default_binding_policy:-none}
export PYTHONUNBUFFERED=1
case ${COMMCAL_LAUNCHER:-srun} in
  srun) launch=(srun --mpi="${COMMCAL_SRUN_MPI:-pmix}" --ntasks="$ntasks" --kill-on-bad-exit=1) ;;
  mpirun) launch=(mpirun -n "$ntasks" --bind-to none)
          [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ;;
  *) fail "COMMCAL_LAUNCHER must be srun or mpirun, not '${COMMCAL_LAUNCHER}'" 2 ;;
esac
extra=()
case ${COMMCAL_PRESET:-quick} in
  quick) extra+=(--quick) ;;
  full) ;;
  *) fail "COMMCAL_PRESET must be quick or full, not '${COMMCAL_PRESET}'" 2 ;;
esac
case ${COMMCAL_BACKEND:-mpi} in
  mpi|mpi-cuda|nccl) extra+=(--backend "${COMMCAL_BACKEND:-mpi}") ;;
  *) fail "COMMCAL_BACKEND must be mpi, mpi-cuda or nccl, not '${COMMCAL_BACKEND}'" 2 ;;
esac
if [ -n "${COMMCAL_VALIDATE_ARGS:-}" ]; then read -r -a more <<<"$COMMCAL_VALIDATE_ARGS"; extra+=("${more[@]}"); fi

mkdir -p "$vout"
say "job $SLURM_JOB_ID on $cluster: ${SLURM_JOB_NUM_NODES:-?} node(s), $ntasks tasks; calibration $calibration"
say "${launch[*]} ${COMMCAL_CMD[*]} validate $calibration --out $vout ${extra[*]}"
set +e
"${launch[@]}" "${COMMCAL_CMD[@]}" validate "$calibration" --out "$vout" "${extra[@]}"
rc=$?
set -e
[ $rc -eq 0 ] || fail "commcal validate exited $rc; the error is above" "$rc"
say "done: $vout"
