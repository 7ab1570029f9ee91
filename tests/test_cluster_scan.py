"""`sbatch slurm/scan.sh` on a 3-node local cluster whose node3 alone has a slower link: the scan must name node3
and no other node, flag exactly node3's pairs, and measure every pair within 5% of the payload share of its tbf
rates. Needs what tests/test_cluster.py needs (root, iproute2, Slurm); its own cluster, brought down at the end.

Three nodes, not four: the scan runs disjoint pairs at once, and with four nodes two pairs' four ranks (each
polling while it waits) would share the host's cores where it has as few as the CI machine, which no real cluster's
nodes do; beside a second pair, healthy pairs then read up to a few percent under their rate (docs/results.md, "The
scan beside other pairs"). Concurrent rounds are exercised by tests/test_cluster_racks.py's scan of four nodes in
two racks."""

from __future__ import annotations

import time
from itertools import combinations

import pytest

from conftest import REPO, run_cli
from microbench.provenance import STEAL_WARN
from microbench.scanfile import read_scan
from test_cluster import EXPECTED_BPS, RATE_MBIT, brought_up, stolen_share

pytestmark = pytest.mark.cluster

NODES = ("node1", "node2", "node3")
SLOW, SLOW_MBIT = "node3", 150
SLOW_BPS = EXPECTED_BPS * SLOW_MBIT / RATE_MBIT
PAIR_WITH_SLOW_BPS = 2 / (1 / SLOW_BPS + 1 / EXPECTED_BPS)
"""A ping-pong's message crosses node3's link one way and its partner's the other: half the round trip moves the
message at the harmonic mean of the two rates."""
SCAN_ARGS = "--node-tolerance 0.9 --latency-tolerance 1.0"
"""The local cluster's nodes share the host's cores and its memory with each other and with other jobs: their
copy and GEMM rates vary with its scheduling (one node's copy at a fifth of the others' was seen), and so do 8-byte
latencies over veth (9 to 460 us between healthy nodes; once a healthy node's score at 1.5x the reference), which
the scan would rightly call slow (its recheck measures a flagged figure once more and keeps the faster, which clears
a passing disturbance, not one that lasts the scan). The test judges the network's bandwidth: a node check flags
only below a tenth of the reference, a latency only above twice it."""


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory):
    with brought_up(tmp_path_factory, "cluster3", "--nodes", str(len(NODES)), "--rate", f"{RATE_MBIT}mbit",
                       "--cpus", "1") as c:
        yield c


def scan_job(cluster, out, name: str) -> str:
    """`sbatch slurm/scan.sh` on every node into out/name; the job's log."""
    job = cluster.sbatch("-N", str(len(NODES)), "--ntasks-per-node=1", "-o", "scan-%j.out",
                         str(REPO / "slurm" / "scan.sh"),
                         env={"COMMCAL_OUT_DIR": str(out), "COMMCAL_SCAN_NAME": name, "COMMCAL_SCAN_ARGS": SCAN_ARGS})
    ok, text = cluster.wait(job, 300)
    log = (cluster.work / f"scan-{job}.out").read_text()
    assert ok, f"{text}\n{log}\n{cluster.logs()}"
    print("\n".join(line for line in log.splitlines() if line.startswith(("pingpong", "copy", "gemm", "commcal scan:"))))
    return log


def test_sbatch_scan_sh_names_the_slowed_node_and_no_other(cluster3):
    bad = cluster3.run("rate", "node9", "150mbit", check=False)
    assert bad.returncode != 0 and "unknown node" in bad.stderr, bad
    cluster3.run("rate", SLOW, f"{SLOW_MBIT}mbit")
    qdisc = cluster3.run("exec", SLOW, "tc", "qdisc", "show", "dev", "eth0").stdout
    assert f"{SLOW_MBIT}Mbit" in qdisc, qdisc
    out = cluster3.work / "scans"
    t0 = time.monotonic()
    log = scan_job(cluster3, out, "s")
    print(f"scan job: {time.monotonic() - t0:.1f} s")
    scan = read_scan(out / "s")
    assert scan.nodes == list(NODES)
    assert f"flagged nodes: {SLOW} (bandwidth" in log, log
    assert list(scan.flagged_nodes()) == [SLOW], scan.flagged_nodes()
    rechecked = {(r.node_a, r.node_b) for r in scan.rechecks if r.size_bytes == scan.bandwidth_size}
    assert rechecked >= {p for p in scan.pair_values(scan.bandwidth_size, "rate") if SLOW in p}, \
        "a flagged pair is measured twice before it is named"
    bandwidth = {v.metric: v for v in scan.verdicts()}["bandwidth"]
    assert sorted(bandwidth.slow_pairs) == [p for p in combinations(NODES, 2) if SLOW in p], bandwidth
    pairs = scan.pair_values(scan.bandwidth_size, "rate")
    assert sorted(pairs) == list(combinations(NODES, 2)), "every pair exactly once"
    misses = []
    for pair, bps in sorted(pairs.items()):
        truth = PAIR_WITH_SLOW_BPS if SLOW in pair else EXPECTED_BPS
        print(f"{pair[0]}-{pair[1]}: {bps / 1e6:.2f} MB/s, truth {truth / 1e6:.2f} MB/s ({bps / truth - 1:+.1%})")
        if abs(bps / truth - 1) > 0.05:
            misses.append(f"{pair[0]}-{pair[1]} {bps / truth - 1:+.1%}")
    excused = within_steal(scan.meta, misses)
    for op in ("copy", "gemm"):
        assert sorted(scan.node_values(op)) == list(NODES) and min(scan.node_values(op).values()) > 0
    assert (out / "s" / "report" / "report.html").is_file(), log
    html = (out / "s" / "report" / "report.html").read_text()
    assert f"Slow nodes: {SLOW} (bandwidth" in html
    # node3's link restored: a second scan finds every pair at the rate and node3 no longer slow
    cluster3.run("rate", SLOW, f"{RATE_MBIT}mbit")
    log = scan_job(cluster3, out, "h")
    healthy = read_scan(out / "h")
    assert {v.metric: v for v in healthy.verdicts()}["bandwidth"].slow_nodes == ()
    assert SLOW not in healthy.flagged_nodes(), log
    restored = healthy.pair_values(healthy.bandwidth_size, "rate")
    print("restored: " + ", ".join(f"{a}-{b} {bps / EXPECTED_BPS - 1:+.1%}" for (a, b), bps in sorted(restored.items())))
    excused += within_steal(healthy.meta, [f"restored {a}-{b} {bps / EXPECTED_BPS - 1:+.1%}" for (a, b), bps
                                           in sorted(restored.items()) if abs(bps / EXPECTED_BPS - 1) > 0.05])
    back = run_cli(["diff", str(out / "h"), str(out / "s"), "--check"])
    assert back.returncode == 1 and f"newly slow nodes: {SLOW}" in back.stdout, back.stdout + back.stderr
    fixed = run_cli(["diff", str(out / "s"), str(out / "h")])
    assert fixed.returncode == 0 and f"no longer slow: {SLOW}" in fixed.stdout, fixed.stdout + fixed.stderr
    if excused:
        pytest.skip("; ".join(excused))


def within_steal(meta: dict, misses: list[str]) -> list[str]:
    """The bandwidth misses of a scan, excused (as the skip's reason) where the hypervisor took more than STEAL_WARN
    of a node's CPU while it ran: a bandwidth measured under steal does not judge the link. Fails on any other miss;
    the caller checks the scan's remaining claims before it skips."""
    stolen = stolen_share(meta)
    assert not misses or stolen > STEAL_WARN, "pairs off their truth by more than 5%: " + ", ".join(misses)
    return [f"the hypervisor took {stolen:.0%} of a node's CPU while the scan ran (cpu_steal): {', '.join(misses)}"
            ] if misses else []
