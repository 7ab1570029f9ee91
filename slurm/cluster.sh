#!/usr/bin/env bash
# A local cluster on one Linux machine: N "nodes" made of network namespaces joined by a bridge,
# each with its own hostname, optionally rate-limited with a token bucket (tc tbf), running real
# Slurm (munged, slurmctld, one slurmd per node) and reachable by plain mpirun. Needs root.
#
#   slurm/cluster.sh up [--nodes N] [--rate RATE] [--cpus C] [--no-slurm] [--racks R [--rack-rate RATE]]
#                      [--tcp-keep-cwnd]
#                                  bring it up (default 2 nodes, no rate limit, 2 CPUs per node); --racks:
#                                  the nodes in R racks (consecutive nodes per rack), each rack's nodes on
#                                  its own bridge, racks joined through a router namespace whose link into
#                                  each rack is rate-limited at --rack-rate; writes a Slurm topology.conf;
#                                  --tcp-keep-cwnd: TCP keeps its congestion window over idle time
#                                  (tcp_slow_start_after_idle=0, a tuning; default: the kernel's setting)
#   slurm/cluster.sh down          stop everything it started and delete it (safe to run twice)
#   slurm/cluster.sh status        namespaces, daemons, sinfo
#   slurm/cluster.sh rate NODE RATE|none   change one running node's token bucket (e.g. rate node3 150mbit:
#                                  that node alone slower, as `commcal scan` should then find)
#   slurm/cluster.sh exec NODE CMD...   run CMD on a node (node1..nodeN, or ctl: the login node)
#   slurm/cluster.sh sbatch|srun|squeue|sinfo|scontrol|scancel ARGS...
#                                  Slurm client commands, run on the login node
#   slurm/cluster.sh wait JOBID [TIMEOUT_S]   wait for a job to end (polls every 0.2 s);
#                                  exit 0 if it COMPLETED, 1 otherwise (state printed)
#   slurm/cluster.sh mpirun ARGS...   plain-MPI mode: mpirun on the login node, launching its
#                                  daemons on node1..nodeN through slurm/localcluster/nsagent;
#                                  ranks unbound unless ARGS has --bind-to (core: a node's k-th rank
#                                  on core k)
#   slurm/cluster.sh env           print `export` lines: PATH with wrappers for sbatch, srun, ...
#
# Environment: COMMCAL_CLUSTER_DIR (state: config, spool, logs, munge key; default
# /tmp/commcal-cluster), COMMCAL_CLUSTER_NODES, COMMCAL_CLUSTER_RATE (e.g. 400mbit),
# COMMCAL_CLUSTER_CPUS: defaults for `up`; MPIRUN: the mpirun that `mpirun` runs (default: the
# one on PATH).
#
# Shape: a "ctl" namespace holds the bridge (10.77.0.254/24), slurmctld and the login side;
# nodeK holds eth0 = 10.77.0.K/24. With --racks R, rack r's nodes hold eth0 = 10.77.r.K/24 on bridge
# brr (in ctl, layer 2 only) and route through a "router" namespace (10.77.r.254 on each rack, 10.77.0.253
# on br0, IP forwarding), whose egress into each rack is tbf-limited at --rack-rate: in-rack traffic
# meets a node's --rate, cross-rack traffic also the router's --rack-rate (docs/slurm.md, "Racks").
# Each namespace has a small anchor process (sleep) that owns
# its UTS (hostname) and mount namespace (private /etc/hosts); daemons and commands enter all
# three namespaces with nsenter. A local unreachable route for 10.77.0.0/24 in the root
# namespace makes anything started in the wrong namespace fail at once.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
D=${COMMCAL_CLUSTER_DIR:-/tmp/commcal-cluster}
NSPREFIX=commcal-
SUBNET=10.77.0
CTL_IP=$SUBNET.254
RACKS_NET=10.77.0.0/16   # --racks: rack r is 10.77.r.0/24
OWNER=/run/commcal-cluster.dir   # which state directory the running cluster belongs to

die() { printf 'cluster: error: %s\n' "$*" >&2; exit 1; }
log() { printf 'cluster: %s\n' "$*" >&2; }

need_root() { [ "$(id -u)" = 0 ] || die "needs root (network namespaces, tc, Slurm daemons)"; }

load_state() {
  [ -f "$D/state.env" ] || die "no cluster in $D (run: slurm/cluster.sh up)"
  # shellcheck disable=SC1091
  . "$D/state.env"
}

anchor_pid() {  # anchor_pid NAME -> pid of the process holding that node's namespaces
  local f="$D/pids/anchor-$1.pid" pid
  [ -f "$f" ] || die "unknown node '$1' (nodes: ctl $(node_names))"
  pid=$(cat "$f")
  kill -0 "$pid" 2>/dev/null || die "node '$1' is not running (anchor pid $pid gone); run down then up"
  echo "$pid"
}

node_names() { local i; for ((i = 1; i <= ${NODES:-0}; i++)); do printf 'node%d ' "$i"; done; }

in_node() {  # in_node NAME CMD... : run CMD in that node's net/uts/mount namespaces, same cwd
  local name=$1; shift
  local pid; pid=$(anchor_pid "$name")
  # Entering a mount namespace resets the working directory: go back to the caller's.
  exec nsenter -t "$pid" --net --uts --mount -- /bin/sh -c 'cd "$0" 2>/dev/null || cd /; exec "$@"' "$PWD" "$@"
}

slurm_env() {
  export SLURM_CONF="$D/slurm.conf"
  mpi_defaults
}

mpi_defaults() {
  # Open MPI on this cluster: TCP between nodes, shared memory within; naming the transports
  # skips seconds of probing for fabrics that are not there. Jobs inherit these (sbatch exports
  # the environment); set them yourself to override.
  export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,sm,tcp}
  export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
  # Open MPI's own TCP eager limit (64 KiB), as a user's cluster has it. Above it a send waits for
  # the receiver's rendezvous ACK, queued on the pair's one socket behind the other direction's
  # data, so exchanges both ways may take 1x-2x the wire time, the mode changing between launches;
  # the sweep measures every point in two launches to see that (docs/troubleshooting.md). Export
  # OMPI_MCA_btl_tcp_eager_limit yourself to choose another limit (an option, not the default).
  # Vector memcpy, not REP MOVSB: on some x86 hosts REP MOVSB copies several times slower when the destination
  # starts a few bytes past its source modulo 4 KiB, as numpy's back-to-back arrays do (`python -m
  # microbench.memcopy` shows it; docs/troubleshooting.md), so intra-node collectives would time by where
  # buffers happened to lie.
  export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.cpu.x86_rep_movsb_threshold=4294967295}
  export PRTE_MCA_hwloc_default_binding_policy=${PRTE_MCA_hwloc_default_binding_policy:-none}
}

# ---------------------------------------------------------------------------------------------
cmd_up() {
  need_root
  local nodes=${COMMCAL_CLUSTER_NODES:-2} rate=${COMMCAL_CLUSTER_RATE:-} cpus=${COMMCAL_CLUSTER_CPUS:-2} slurm=1
  local racks=0 rack_rate= keep_cwnd=0
  while [ $# -gt 0 ]; do
    case $1 in
      --racks) racks=$2; shift 2 ;;
      --rack-rate) rack_rate=$2; shift 2 ;;
      --nodes) nodes=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --cpus) cpus=$2; shift 2 ;;
      --no-slurm) slurm=0; shift ;;
      --tcp-keep-cwnd) keep_cwnd=1; shift ;;
      *) die "up: unknown option '$1' (--nodes N --rate RATE --cpus C --no-slurm --racks R --rack-rate RATE --tcp-keep-cwnd)" ;;
    esac
  done
  [[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 200 ] || die "--nodes must be 1..200"
  [[ $cpus =~ ^[0-9]+$ ]] && [ "$cpus" -ge 1 ] || die "--cpus must be a positive integer"
  [ -z "$rate" ] || [[ $rate =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] || die "--rate like 400mbit (tc units)"
  [[ $racks =~ ^[0-9]+$ ]] && [ "$racks" -le 200 ] && [ $((racks ? nodes % racks : 0)) = 0 ] \
    || die "--racks must divide --nodes (each rack the same number of consecutive nodes)"
  [ -z "$rack_rate" ] || [ "$racks" -gt 0 ] || die "--rack-rate needs --racks"
  [ -z "$rack_rate" ] || [[ $rack_rate =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] || die "--rack-rate like 200mbit (tc units)"
  for b in ip tc nsenter unshare; do command -v $b >/dev/null || die "missing '$b' (apt-get install iproute2 util-linux)"; done
  if [ $slurm = 1 ]; then
    for b in munged mungekey slurmctld slurmd sbatch; do
      command -v $b >/dev/null || die "missing '$b' (apt-get install munge slurmctld slurmd slurm-client libpmix2 libpmix-dev), or use --no-slurm"
    done
  fi
  if [ -f "$D/state.env" ] || ip netns list | grep -q "^${NSPREFIX}ctl\b"; then
    die "a cluster is already up (state in $(cat "$OWNER" 2>/dev/null || echo "$D")); run: slurm/cluster.sh down"
  fi
  if ip route show "$SUBNET.0/24" | grep -qv '^unreachable'; then
    die "the root namespace already routes $SUBNET.0/24; refusing to shadow it"
  fi
  if [ "$racks" -gt 0 ] && ip route show "$RACKS_NET" | grep -qv '^unreachable'; then
    die "the root namespace already routes $RACKS_NET; refusing to shadow it"
  fi
  NODES_UP=$nodes CPUS_UP=$cpus RACKS=$racks KEEP_CWND=$keep_cwnd
  # From here on, any failure (or interruption) tears down what was started.
  UP_DONE=0
  trap 'if [ "$UP_DONE" = 0 ]; then log "up failed; tearing down"; cmd_down >/dev/null 2>&1 || true; fi' EXIT
  trap 'exit 130' INT TERM
  mkdir -p "$D"/{pids,log,run,spool,tmp,bin,munge}
  echo "$D" >"$OWNER"
  chmod 755 "$D"
  cat >"$D/state.env" <<EOF
NODES=$nodes
RATE=$rate
CPUS=$cpus
SLURM=$slurm
RACKS=$racks
RACK_RATE=$rack_rate
ROUTE_ADDED=0
RACK_ROUTE_ADDED=0
EOF
  # --- network -------------------------------------------------------------------------------
  if ! ip route show "$SUBNET.0/24" | grep -q '^unreachable'; then
    ip route add unreachable "$SUBNET.0/24"
    sed -i 's/^ROUTE_ADDED=0/ROUTE_ADDED=1/' "$D/state.env"
  fi
  if [ "$racks" -gt 0 ] && ! ip route show "$RACKS_NET" | grep -q '^unreachable'; then
    ip route add unreachable "$RACKS_NET"
    sed -i 's/^RACK_ROUTE_ADDED=0/RACK_ROUTE_ADDED=1/' "$D/state.env"
  fi
  local ctl=${NSPREFIX}ctl i ns
  ip netns add "$ctl"
  ip -n "$ctl" link set lo up
  ip -n "$ctl" link add br0 type bridge
  ip -n "$ctl" addr add "$CTL_IP/24" dev br0
  ip -n "$ctl" link set br0 up
  for ((i = 1; i <= racks; i++)); do
    ip -n "$ctl" link add "br$i" type bridge
    ip -n "$ctl" link set "br$i" up
  done
  {
    echo "127.0.0.1 localhost"
    echo "$CTL_IP ctl"
    for ((i = 1; i <= nodes; i++)); do echo "$(node_addr $i) node$i"; done
  } >"$D/hosts"
  : >"$D/hostfile"
  for ((i = 1; i <= nodes; i++)); do
    ns=${NSPREFIX}node$i
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add eth0 type veth peer name "veth-n$i" netns "$ctl"
    ip -n "$ns" addr add "$(node_addr $i)/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ctl" link set "veth-n$i" master "$(node_bridge $i)"
    ip -n "$ctl" link set "veth-n$i" up
    if [ -n "$rate" ]; then
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 50ms
    fi
    tune_ns "$ns" eth0
    tune_ns "$ctl" "veth-n$i"
    echo "node$i slots=$cpus" >>"$D/hostfile"
  done
  [ "$racks" = 0 ] || start_router "$rack_rate"
  # --- anchors: one process per node owning its hostname and private /etc/hosts -------------
  start_anchor ctl "$ctl"
  for ((i = 1; i <= nodes; i++)); do start_anchor "node$i" "${NSPREFIX}node$i"; done
  write_wrappers
  # --- Slurm ---------------------------------------------------------------------------------
  if [ $slurm = 1 ]; then
    start_slurm
  fi
  UP_DONE=1
  log "up: $nodes nodes (node1..node$nodes), ${rate:-no} rate limit, $cpus CPUs each, slurm=$slurm, state in $D"
  [ "$racks" = 0 ] || log "racks: $racks of $((nodes / racks)) nodes, ${rack_rate:-no} rate limit between racks; switch tree in $D/topology.conf"
  log "try: slurm/cluster.sh sbatch --wrap hostname   or   eval \"\$(slurm/cluster.sh env)\"; sinfo"
}

cmd_rate() {  # rate NODE RATE|none: replace (or remove) the token bucket on one running node's eth0
  need_root
  [ $# = 2 ] || die "rate NODE RATE|none"
  load_state
  [[ $1 == node* ]] || die "rate applies to a node (node1..node$NODES)"
  [[ $2 == none || $2 =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] || die "rate like 150mbit (tc units), or none"
  anchor_pid "$1" >/dev/null
  if [ "$2" = none ]; then
    ip netns exec "$NSPREFIX$1" tc qdisc del dev eth0 root 2>/dev/null || true
  else
    ip netns exec "$NSPREFIX$1" tc qdisc replace dev eth0 root tbf rate "$2" burst 64kb latency 50ms
  fi
  log "rate: $1 now ${2/none/unlimited}"
}

rack_of() { echo $(( ($1 - 1) / (NODES_UP / RACKS) + 1 )); }   # rack_of I: node I's rack (--racks)

node_addr() {  # node_addr I: node I's address (10.77.0.I; with --racks, 10.77.RACK.I)
  if [ "${RACKS:-0}" -gt 0 ]; then echo "10.77.$(rack_of "$1").$1"; else echo "$SUBNET.$1"; fi
}

node_bridge() {  # node_bridge I: the bridge node I is on (br0; with --racks, its rack's)
  if [ "${RACKS:-0}" -gt 0 ]; then echo "br$(rack_of "$1")"; else echo br0; fi
}

start_router() {  # start_router RACK_RATE: the namespace joining the racks, and every node's route through it
  local router=${NSPREFIX}router ctl=${NSPREFIX}ctl r i
  ip netns add "$router"
  ip -n "$router" link set lo up
  ip netns exec "$router" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
  ip -n "$router" link add r-ctl type veth peer name up-ctl netns "$ctl"
  ip -n "$router" addr add "$SUBNET.253/24" dev r-ctl
  ip -n "$router" link set r-ctl up
  ip -n "$ctl" link set up-ctl master br0
  ip -n "$ctl" link set up-ctl up
  ip -n "$ctl" route add "$RACKS_NET" via "$SUBNET.253"
  for ((r = 1; r <= RACKS; r++)); do
    ip -n "$router" link add "r-rack$r" type veth peer name "up-r$r" netns "$ctl"
    ip -n "$router" addr add "10.77.$r.254/24" dev "r-rack$r"
    ip -n "$router" link set "r-rack$r" up
    ip -n "$ctl" link set "up-r$r" master "br$r"
    ip -n "$ctl" link set "up-r$r" up
    # the router's egress into rack r: every packet from another rack (or ctl) into rack r passes here
    if [ -n "$1" ]; then
      ip netns exec "$router" tc qdisc add dev "r-rack$r" root tbf rate "$1" burst 64kb latency 50ms
    fi
    tune_ns "$router" "r-rack$r"
    tune_ns "$ctl" "up-r$r"
  done
  for ((i = 1; i <= NODES_UP; i++)); do
    ip -n "${NSPREFIX}node$i" route add default via "10.77.$(rack_of "$i").254"
  done
  write_topology_conf
}

write_topology_conf() {  # Slurm's tree topology (topology.conf beside slurm.conf): a leaf switch per rack
  local r per=$((NODES_UP / RACKS))
  {
    echo "# generated by commcal slurm/cluster.sh --racks: one leaf switch per rack, a spine above them"
    for ((r = 1; r <= RACKS; r++)); do
      echo "SwitchName=rack$r Nodes=node[$(((r - 1) * per + 1))-$((r * per))]"
    done
    echo "SwitchName=spine Switches=rack[1-$RACKS]"
  } >"$D/topology.conf"
}

tune_ns() {  # tune_ns NETNS DEV: steadier TCP on a shared, busy machine (best effort)
  # veth delivers on the sending CPU's backlog; when the sender migrates between CPUs, packets
  # arrive out of order and TCP backs off. RPS hashes each flow to one CPU: in-order delivery.
  local mask; mask=$(printf '%x' $(( (1 << ($(nproc) < 31 ? $(nproc) : 31)) - 1 )))
  ip netns exec "$1" sh -c "echo $mask > /sys/class/net/$2/queues/rx-0/rps_cpus" 2>/dev/null || true
  # --tcp-keep-cwnd: no slow start after idle time (a site tuning; the kernel's default restarts it).
  [ "$KEEP_CWND" = 0 ] || ip netns exec "$1" sh -c 'echo 0 > /proc/sys/net/ipv4/tcp_slow_start_after_idle' 2>/dev/null || true
}

start_anchor() {  # start_anchor NAME NETNS
  local name=$1 ns=$2 ready="$D/run/anchor-$1.ready"
  rm -f "$ready"
  # nsenter and unshare exec (no fork): $! ends up being the sleep in the new namespaces.
  setsid nsenter --net="/run/netns/$ns" -- unshare --uts --mount --propagation private -- \
    /bin/sh -c 'hostname "$1" && mount --bind "$2" /etc/hosts && : >"$3" && exec sleep infinity' \
    anchor "$name" "$D/hosts" "$ready" </dev/null >>"$D/log/anchor-$name.log" 2>&1 &
  echo $! >"$D/pids/anchor-$name.pid"
  local t
  for ((t = 0; t < 100; t++)); do [ -f "$ready" ] && return 0; sleep 0.05; done
  die "node $name did not start (see $D/log/anchor-$name.log)"
}

daemon() {  # daemon NAME NODE CMD... : start a long-running process in NODE, pid into pids/NAME.pid
  local name=$1 node=$2; shift 2
  local pid; pid=$(anchor_pid "$node")
  setsid nsenter -t "$pid" --net --uts --mount -- "$@" </dev/null >>"$D/log/$name.out" 2>&1 &
  echo $! >"$D/pids/$name.pid"
}

start_slurm() {
  local i
  # munge: a private munged with its own key and socket (a system munged, if any, is untouched)
  chmod 700 "$D/munge"
  mungekey --create --keyfile="$D/munge/munge.key" --force >/dev/null 2>&1 \
    || { dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none; chmod 400 "$D/munge/munge.key"; }
  setsid munged --foreground --force --socket="$D/munge/munge.socket.2" --key-file="$D/munge/munge.key" \
    --pid-file="$D/munge/munged.pid" --log-file="$D/log/munged.log" --seed-file="$D/munge/munged.seed" \
    </dev/null >>"$D/log/munged.out" 2>&1 &
  echo $! >"$D/pids/munged.pid"
  for ((i = 0; i < 100; i++)); do [ -S "$D/munge/munge.socket.2" ] && break; sleep 0.05; done
  [ -S "$D/munge/munge.socket.2" ] || die "munged did not start (see $D/log/munged.log)"
  chmod 755 "$D/munge"   # clients (slurm daemons run as root anyway) must reach the socket
  mkdir -p "$D/spool/ctld"
  for ((i = 1; i <= NODES_UP; i++)); do mkdir -p "$D/spool/slurmd-node$i" "$D/tmp/node$i"; done
  write_slurm_conf
  link_etc_slurm
  export PMIX_MCA_psec=native PMIX_MCA_gds=hash
  daemon slurmctld ctl slurmctld -D -c -i -f "$D/slurm.conf"
  for ((i = 1; i <= NODES_UP; i++)); do daemon "slurmd-node$i" "node$i" slurmd -D -f "$D/slurm.conf"; done
  # Wait until every node is idle.
  local t out
  for ((t = 0; t < 150; t++)); do
    out=$(SLURM_CONF="$D/slurm.conf" nsenter -t "$(anchor_pid ctl)" --net --uts --mount -- sinfo -h -N -o '%T' 2>/dev/null || true)
    if [ -n "$out" ] && [ "$(grep -c '^idle$' <<<"$out")" = "$NODES_UP" ]; then return 0; fi
    for p in "$D"/pids/slurm*.pid; do kill -0 "$(cat "$p")" 2>/dev/null || die "$(basename "$p" .pid) died (see $D/log/)"; done
    sleep 0.2
  done
  die "Slurm nodes not idle after 30 s: $(tr '\n' ' ' <<<"$out") (see $D/log/)"
}

write_slurm_conf() {
  cat >"$D/slurm.conf" <<EOF
# generated by commcal slurm/cluster.sh: a local test cluster; deleted by 'cluster.sh down'
ClusterName=localcluster
SlurmctldHost=ctl($CTL_IP)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.socket.2
StateSaveLocation=$D/spool/ctld
SlurmdSpoolDir=$D/spool/slurmd-%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
TmpFS=$D/tmp/%n
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=pmix
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
InactiveLimit=0
KillWait=5
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=DEFAULT CPUs=$CPUS_UP Sockets=1 CoresPerSocket=$CPUS_UP ThreadsPerCore=1 State=UNKNOWN
EOF
  local i
  for ((i = 1; i <= NODES_UP; i++)); do
    echo "NodeName=node$i NodeAddr=$(node_addr $i) NodeHostname=node$i" >>"$D/slurm.conf"
  done
  echo "PartitionName=local Nodes=node[1-$NODES_UP] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >>"$D/slurm.conf"
  if [ "${RACKS:-0}" -gt 0 ]; then echo "TopologyPlugin=topology/tree" >>"$D/slurm.conf"; fi
}

link_etc_slurm() {
  # sbatch/srun look in /etc/slurm/slurm.conf unless SLURM_CONF is set. Link it only where no
  # real configuration exists; the wrappers and jobs use SLURM_CONF either way.
  local etc=/etc/slurm/slurm.conf
  mkdir -p /etc/slurm
  if [ -L $etc ] && [[ $(readlink $etc) == */commcal*/slurm.conf || $(readlink $etc) == "$D/slurm.conf" ]]; then
    ln -sfn "$D/slurm.conf" $etc
  elif [ ! -e $etc ] && [ ! -L $etc ]; then
    ln -s "$D/slurm.conf" $etc
  else
    log "note: $etc exists and is not ours; left alone (use SLURM_CONF=$D/slurm.conf or the wrappers)"
    return 0
  fi
  echo "$etc" >"$D/etc-link"
}

write_wrappers() {
  local c
  for c in sbatch srun squeue sinfo scontrol scancel salloc sacct; do
    cat >"$D/bin/$c" <<EOF
#!/bin/sh
# generated by commcal slurm/cluster.sh: run $c on the local cluster's login node (ctl)
exec "$HERE/cluster.sh" $c "\$@"
EOF
    chmod +x "$D/bin/$c"
  done
  cp "$HERE/localcluster/nsagent" "$D/bin/nsagent"
  chmod +x "$D/bin/nsagent"
}

# ---------------------------------------------------------------------------------------------
cmd_down() {
  need_root
  local nodes=0 f pid ns i any=0 owner
  owner=$(cat "$OWNER" 2>/dev/null || true)
  if [ -n "$owner" ] && [ "$owner" != "$D" ] && [ -f "$owner/state.env" ]; then
    die "the cluster that is up belongs to $owner, not $D: run COMMCAL_CLUSTER_DIR=$owner $0 down"
  fi
  if [ -f "$D/state.env" ]; then
    # shellcheck disable=SC1091
    . "$D/state.env"; nodes=$NODES
  fi
  # Nodes known from the state file, and any of our namespaces left by a broken run.
  local names=()
  while read -r ns _; do [[ $ns == ${NSPREFIX}* ]] && names+=("$ns"); done < <(ip netns list 2>/dev/null)
  # 1. daemons we started, by pid (TERM, then KILL)
  local pids=()
  for f in "$D"/pids/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f"); [[ $pid =~ ^[0-9]+$ ]] && pids+=("$pid")
  done
  # 2. every process living in our namespaces (job steps, mpirun daemons, ranks)
  for ns in "${names[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do pids+=("$pid"); done
  done
  if [ ${#pids[@]} -gt 0 ]; then
    any=1
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do
      local alive=0
      for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      [ $alive = 0 ] && break
      sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
    for ns in "${names[@]}"; do
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    done
  fi
  # 3. namespaces, route, /etc/slurm link
  for ns in "${names[@]}"; do ip netns delete "$ns" 2>/dev/null && any=1 || true; done
  if [ "${ROUTE_ADDED:-0}" = 1 ] && ip route show "$SUBNET.0/24" | grep -q '^unreachable'; then
    ip route del unreachable "$SUBNET.0/24" 2>/dev/null || true
  fi
  if [ "${RACK_ROUTE_ADDED:-0}" = 1 ] && ip route show "$RACKS_NET" | grep -q '^unreachable'; then
    ip route del unreachable "$RACKS_NET" 2>/dev/null || true
  fi
  if [ -f "$D/etc-link" ]; then
    f=$(cat "$D/etc-link")
    [ -L "$f" ] && [ "$(readlink "$f")" = "$D/slurm.conf" ] && rm -f "$f"
  fi
  # 4. leftovers named after the node hostnames (Open MPI/PRRTE session dirs, shm segments)
  local hn
  for hn in ctl $(NODES=$nodes node_names); do
    rm -rf /dev/shm/*."$hn".* /dev/shm/*"-$hn-"* /tmp/prte."$hn".* /tmp/ompi."$hn".* 2>/dev/null || true
  done
  # 5. the state directory (only if it is ours: it has our state file or pid dir)
  if [ -f "$D/state.env" ] || [ -d "$D/pids" ]; then
    rm -rf "$D"; any=1
  fi
  rm -f "$OWNER"
  if [ $any = 1 ]; then log "down: stopped and removed"; else log "down: nothing to do"; fi
}

cmd_status() {
  if [ ! -f "$D/state.env" ]; then echo "no cluster (state dir $D)"; return 3; fi
  load_state
  echo "state: $D  nodes: $NODES  rate: ${RATE:-none}  cpus: $CPUS  slurm: $SLURM"
  if [ "${RACKS:-0}" -gt 0 ]; then echo "racks: $RACKS  rack rate: ${RACK_RATE:-none}  topology: $D/topology.conf"; fi
  local f name rc=0
  for f in "$D"/pids/*.pid; do
    name=$(basename "$f" .pid)
    if kill -0 "$(cat "$f")" 2>/dev/null; then echo "  $name: running (pid $(cat "$f"))"; else echo "  $name: DEAD"; rc=1; fi
  done
  if [ "$SLURM" = 1 ]; then slurm_cmd sinfo -N || rc=1; fi
  return $rc
}

slurm_cmd() {  # slurm_cmd CMD ARGS... on the login node
  load_state
  [ "$SLURM" = 1 ] || die "this cluster was started with --no-slurm"
  slurm_env
  local pid; pid=$(anchor_pid ctl)
  nsenter -t "$pid" --net --uts --mount -- /bin/sh -c 'cd "$0" 2>/dev/null || cd /; exec "$@"' "$PWD" "$@"
}

cmd_wait() {
  local job=${1:-} timeout=${2:-3600}
  [[ $job =~ ^[0-9]+$ ]] || die "wait JOBID [TIMEOUT_S]"
  local start=$SECONDS line state
  while :; do
    line=$(slurm_cmd scontrol -o show job "$job" 2>&1) || die "wait: $line"
    state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$line")
    case $state in
      PENDING | RUNNING | CONFIGURING | COMPLETING | SUSPENDED | REQUEUED | RESIZING | SIGNALING | STAGE_OUT) ;;
      COMPLETED) echo "job $job COMPLETED $(grep -o 'ExitCode=[0-9:]*' <<<"$line")"; return 0 ;;
      *) echo "job $job ${state:-UNKNOWN} $(grep -o 'ExitCode=[0-9:]*' <<<"$line") $(grep -o 'Reason=[^ ]*' <<<"$line")"; return 1 ;;
    esac
    if (( SECONDS - start >= timeout )); then echo "job $job still $state after ${timeout}s"; return 124; fi
    sleep 0.2
  done
}

cmd_mpirun() {
  load_state
  local pid; pid=$(anchor_pid ctl)
  local mpirun=${MPIRUN:-$(command -v mpirun || true)}
  [ -n "$mpirun" ] || die "no mpirun on PATH (activate the venv)"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 COMMCAL_CLUSTER_DIR=$D
  mpi_defaults
  # Unbound unless the caller binds: every node sees the same cores, so default binding would put
  # each node's first rank on core 0. `--bind-to core` puts a node's k-th rank on core k, so a job
  # with as many ranks per node as cores keeps a node's ranks on different cores.
  local bind=(--bind-to none) a
  for a in "$@"; do [[ $a == --bind-to || $a == --bind-to=* ]] && bind=(); done
  # The daemons and ranks start through nsagent, which enters the node's namespaces; they
  # inherit this environment, so PATH and the venv carry over. Keep MPI off the bridge to ctl.
  nsenter -t "$pid" --net --uts --mount -- /bin/sh -c 'cd "$0" 2>/dev/null || cd /; exec "$@"' "$PWD" \
    "$mpirun" --prtemca plm_ssh_agent "$D/bin/nsagent" --hostfile "$D/hostfile" "${bind[@]}" "$@"
}

cmd_env() {
  load_state
  echo "export SLURM_CONF=$D/slurm.conf"
  echo "export PATH=$D/bin:\$PATH"
  echo "export COMMCAL_CLUSTER_DIR=$D"
}

main() {
  # The wrappers in $D/bin call this script: the real commands must not resolve to them again.
  PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$D/bin" | paste -sd: -)
  export PATH
  local cmd=${1:-}; [ $# -gt 0 ] && shift
  case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down ;;
    status) cmd_status ;;
    exec) [ $# -ge 2 ] || die "exec NODE CMD..."; load_state; in_node "$@" ;;
    sbatch | srun | squeue | sinfo | scontrol | scancel | salloc | sacct) slurm_cmd "$cmd" "$@" ;;
    wait) cmd_wait "$@" ;;
    rate) cmd_rate "$@" ;;
    mpirun) cmd_mpirun "$@" ;;
    env) cmd_env ;;
    -h | --help | help | "") sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
    *) die "unknown command '$cmd' (up, down, status, rate, exec, sbatch, srun, squeue, sinfo, scontrol, scancel, wait, mpirun, env)" ;;
  esac
}

main "$@"
