"""Topology levels, pure: Slurm's topology.conf and `scontrol show topology` read as switch levels, the groups the
sweep forms to cross exactly one level, a calibration recording the levels (version 14; older files still read),
and pricing that places a mesh on them (each axis of a 3-level mesh on its own level; a missing level falls back,
said on stderr and in JSON)."""

from __future__ import annotations

import json

import numpy as np

import pytest

from analysis.mesh import Mesh
from analysis.pricing import Fallback, Pricer
from calib.calibration import calibration_from_dict, load_calibration
from calib.fit import fit_result
from calib.points import load_runs
from calib.synthetic import synthetic_calibration, write_synthetic_run
from conftest import run_cli
from microbench.errors import UsageError
from microbench.limits import MAX_RANKS
from microbench.links import fallback, level_link, link_level, links_for
from microbench.switches import Topology, expand_hostlist, infer_levels, parse_switches, read_topology, tree
from microbench.topology import group_for, parse_links, tiles

CONF = """# topology.conf: two racks of two nodes under a spine
SwitchName=rack1 Nodes=node[1-2]
SwitchName=rack2 Nodes=node[3-4]   # the second rack
SwitchName=spine Switches=rack[1-2]
"""
SCONTROL = """SwitchName=rack1 Level=0 LinkSpeed=1 Nodes=node[1-2]
SwitchName=rack2 Level=0 LinkSpeed=1 Nodes=node[3-4]
SwitchName=spine Level=1 LinkSpeed=1 Nodes=node[1-4] Switches=rack[1-2]
"""
RACKS = ((("node1", "node2"), ("node3", "node4")), (("node1", "node2", "node3", "node4"),))
HOSTS = [f"node{n}" for n in (1, 1, 2, 2, 3, 3, 4, 4)]    # 2 ranks per node, as mpirun fills the hostfile


def test_hostlists_expand_as_slurm_writes_them():
    assert expand_hostlist("node[1-3,7]") == ["node1", "node2", "node3", "node7"]
    assert expand_hostlist("gpu[08-10]a,login") == ["gpu08a", "gpu09a", "gpu10a", "login"]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    with pytest.raises(UsageError, match="bad host range"):
        expand_hostlist("node[3-1]")
    with pytest.raises(UsageError, match="unbalanced brackets in host list 'n\\[1-3'"):
        expand_hostlist("n[1-3")
    # the cap is per list: exactly MAX_RANKS names expand, one more is refused before any is made
    assert len(expand_hostlist(f"n[1-{MAX_RANKS}]")) == MAX_RANKS
    with pytest.raises(UsageError, match=f"names more than {MAX_RANKS}"):
        expand_hostlist(f"n[1-{MAX_RANKS + 1}]")


def test_topology_conf_and_scontrol_output_give_the_same_levels(tmp_path):
    assert tree(parse_switches(CONF, "conf"), "conf").levels == RACKS
    assert tree(parse_switches(SCONTROL, "scontrol"), "slurm").levels == RACKS
    (tmp_path / "t.conf").write_text(CONF)
    topo = read_topology(str(tmp_path / "t.conf"))
    assert topo.height == 2 and topo.source == str(tmp_path / "t.conf")
    assert Topology.from_json(topo.to_json()) == topo
    assert [lv["link"] for lv in topo.to_json()["levels"]] == ["inter", "inter2"]
    # three levels: leaves under two pods under a core
    leaves = "\n".join(f"SwitchName=l{i} Nodes=n[{2 * i - 1}-{2 * i}]" for i in range(1, 5))
    three = tree(parse_switches(leaves + "\nSwitchName=p1 Switches=l[1-2]\nSwitchName=p2 Switches=l[3-4]\n"
                                "SwitchName=core Switches=p[1-2]\n", "x"), "x")
    assert three.height == 3 and [len(lv) for lv in three.levels] == [4, 2, 1]


@pytest.mark.parametrize("text, why", [
    ("SwitchName=a Nodes=n1\nSwitchName=top Switches=a,b\n", "unknown switch 'b'"),
    ("SwitchName=a Switches=b\nSwitchName=b Switches=a\n", "cycle"),
    ("SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n2\n", "node 'n2' is under both"),
    ("SwitchName=a Nodes=n1\nSwitchName=a Nodes=n2\n", "named twice"),
])
def test_bad_trees_are_one_clear_error(text, why):
    with pytest.raises(UsageError, match=why):
        tree(parse_switches(text, "t"), "t")


def test_topology_file_errors_are_one_line(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        read_topology(str(tmp_path / "missing.conf"))
    (tmp_path / "empty.conf").write_text("# nothing\n")
    with pytest.raises(UsageError, match="no SwitchName"):
        read_topology(str(tmp_path / "empty.conf"))
    with pytest.raises(UsageError, match="does not name node 'node9'"):
        Topology("t", RACKS).restrict(["node1", "node9"])


def test_a_dry_run_plans_the_levels_of_its_topology_file(tmp_path):
    conf = tmp_path / "topology.conf"
    conf.write_text(CONF)
    args = ["sweep", "--dry-run", "--quick", "--ops", "allreduce", "--links", "inter,inter2"]
    racked = run_cli([*args, "--nodes", "4", "--topology", str(conf)], timeout=60)
    flat = run_cli([*args[:-1], "inter", "--nodes", "4"], timeout=60)
    assert racked.returncode == 0 == flat.returncode, racked.stderr + flat.stderr
    unformed = run_cli([*args, "--nodes", "4"], timeout=60)   # a flat machine has no inter2: said, not dropped
    assert unformed.returncode == 2 and unformed.stderr.count("\n") == 1 and "inter2" in unformed.stderr
    points = lambda out: int(out.split(" points (")[0].rsplit(", ", 1)[1])     # noqa: E731
    assert points(flat.stdout) > 0 and points(racked.stdout) > points(flat.stdout)   # inter2 only across racks
    assert "links inter,inter2" in racked.stdout
    short = run_cli([*args, "--nodes", "5", "--topology", str(conf)], timeout=60)
    assert short.returncode == 2 and short.stderr.count("\n") == 1 and "names only 4 nodes" in short.stderr


def test_each_level_is_measured_by_a_group_that_crosses_exactly_it():
    topo = Topology("t", RACKS).restrict(HOSTS)
    assert parse_links(None, topo.height) == ["intra", "inter", "inter2", "spread"]
    assert group_for("intra", 2, HOSTS, topo).ranks == (0, 1)
    assert group_for("inter", 2, HOSTS, topo).ranks == (0, 2)           # node1, node2: one rack
    assert group_for("inter", 3, HOSTS, topo) is None                    # a rack holds two nodes
    assert group_for("inter2", 2, HOSTS, topo).ranks == (0, 4)          # node1, node3: across racks
    assert group_for("inter2", 4, HOSTS, topo).ranks == (0, 2, 4, 6)    # the racks contiguous
    assert group_for("inter2", 3, HOSTS, topo).ranks == (0, 2, 4)
    assert group_for("inter3", 2, HOSTS, topo) is None
    assert [g.ranks for g in tiles("inter2", 2, HOSTS, topo)] == [(0, 4), (1, 5)]
    # flat (no topology): inter is any nodes, today's groups
    assert group_for("inter", 4, HOSTS).ranks == (0, 2, 4, 6) and group_for("inter2", 2, HOSTS) is None
    # hosts whose rack order differs from rank order: rank 0's rack first
    swapped = ["node3", "node1", "node4", "node2"]
    assert group_for("inter2", 2, swapped, Topology("t", RACKS).restrict(swapped)).ranks == (0, 1)
    assert group_for("inter", 2, swapped, Topology("t", RACKS).restrict(swapped)).ranks == (0, 2)


def test_link_names_and_fallback_keep_the_old_classes():
    assert [level_link(k) for k in range(4)] == ["intra", "inter", "inter2", "inter3"]
    assert [link_level(x) for x in ("intra", "inter", "inter2", "spread")] == [0, 1, 2, None]
    assert links_for(1) == ("intra", "inter", "spread")
    old = ("intra", "inter", "spread")
    assert [lk for lk in fallback("intra") if lk in old] == ["intra", "spread", "inter"]
    assert [lk for lk in fallback("inter") if lk in old] == ["inter", "spread", "intra"]
    assert [lk for lk in fallback("spread") if lk in old] == ["spread", "inter", "intra"]
    assert fallback("inter2")[:3] == ("inter2", "inter", "inter3")
    with pytest.raises(UsageError, match="unknown link class"):
        parse_links("inter10")
    with pytest.raises(UsageError, match="inter3: the topology has 2 switch level"):
        parse_links("intra,inter3", 2)
    with pytest.raises(UsageError, match="inter2: the topology has 1 switch level.*flat"):
        parse_links("inter2", 1)


def test_a_mesh_is_placed_on_the_levels():
    placed = Mesh((2, 2, 2), 2).placed((2, 4))
    assert [(a.link, a.level) for a in placed.axes] == [("inter2", 2), ("inter", 1), ("intra", 0)]
    assert [a.link for a in Mesh((2, 2, 2), 2).axes] == ["inter", "inter", "intra"]    # flat: today's classes
    assert [a.link for a in Mesh((4, 2), 2).placed((2, 4)).axes] == ["inter2", "intra"]
    assert [a.link for a in Mesh((2, 4), 1).placed((2, 4)).axes] == ["inter2", "inter2"]
    assert [a.link for a in Mesh((2, 2), 2).placed((2, 4)).axes] == ["inter", "intra"]
    # more nodes than the tree holds: the top level
    assert [a.link for a in Mesh((4, 2), 1).placed((2, 4)).axes] == ["inter2", "inter"]


def test_each_axis_sums_up_its_groups_by_hand():
    """An axis's widest group (nodes, ranks per node), the groups sharing a node and the level crossed, counted by
    hand, also where groups of one axis differ in width (3 x 2 on nodes of 3 ranks: {0,1}, {2,3}, {4,5})."""
    from analysis.mesh import AxisGroup
    assert Mesh((2, 4), 2).axes == (AxisGroup(0, 2, 2, 1, 2, 1), AxisGroup(1, 4, 2, 2, 1, 1))
    assert Mesh((3, 2), 3).axes == (AxisGroup(0, 3, 2, 2, 2, 1), AxisGroup(1, 2, 2, 1, 2, 1))
    # 2 x 3 on nodes of 2 ranks: groups {0,1,2} and {3,4,5}; node 1 holds a rank of each, nodes 0 and 2 of one
    assert Mesh((2, 3), 2).axes == (AxisGroup(0, 2, 2, 1, 2, 1), AxisGroup(1, 3, 2, 2, 2, 1))
    assert Mesh((2, 4), 4).axes == (AxisGroup(0, 2, 2, 1, 4, 1), AxisGroup(1, 4, 1, 4, 1, 0))
    assert Mesh((4, 2), 1).placed((2, 4)).axes == (AxisGroup(0, 4, 4, 1, 1, 2), AxisGroup(1, 2, 2, 1, 1, 1))
    assert Mesh((8, 2), 1).placed((2, 4)).axes[0] == AxisGroup(0, 8, 8, 1, 1, 2)    # past the tree: the top level


OPS = ("allreduce", "allgather", "reduce_scatter", "alltoall")
LEVELS = {"intra": (5e-6, 20e9), "inter": (30e-6, 50e6), "inter2": (60e-6, 25e6)}


def three_levels(drop: str | None = None) -> dict:
    models = {(op, link): (a, 1 / bw) for op in (*OPS, "pingpong") for link, (a, bw) in LEVELS.items()
              if link != drop}
    return synthetic_calibration(models, gemm={"float32": 1e10}, topology=Topology("t", RACKS).to_json())


def test_each_axis_of_a_3_level_mesh_is_priced_on_its_level():
    cal = calibration_from_dict(three_levels())
    assert cal.data["version"] == 20 and cal.switch_spans() == (2, 4)
    pricer = Pricer(cal, Mesh((2, 2, 2), 2))
    n = 1 << 20
    for axis, link in enumerate(("inter2", "inter", "intra")):
        assert pricer.link("allgather", axis) == link
        # the 2 ranks of a node each have a group on axes 0 and 1: both share the node's link (pricing.sharing)
        shared = 2 if link != "intra" else 1
        assert pricer.seconds("allgather", axis, [n])[0] == pytest.approx(
            cal.predict("allgather", link, 2, shared * n).seconds, rel=1e-12)
    assert pricer.seconds("allgather", 0, [n])[0] > 1.9 * pricer.seconds("allgather", 1, [n])[0]
    assert pricer.fallbacks() == []
    # a calibration without the cross-rack level prices that axis by the in-rack one, and says so
    short = Pricer(calibration_from_dict(three_levels(drop="inter2")), Mesh((2, 2, 2), 2))
    short.seconds("allgather", 0, [n])
    assert short.fallbacks() == [Fallback("allgather", 0, "inter2", "inter")]


def test_search_on_a_3_level_mesh_names_each_axis_level(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(three_levels()))
    proc = run_cli(["search", str(path), "--model", "mlp:batch=64,d_in=256,d_hidden=512", "--mesh", "2x2x2", "--json"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [(a["axis"], a["link"], a["level"]) for a in out["axes"]] == [(0, "inter2", 2), (1, "inter", 1),
                                                                         (2, "intra", 0)]
    assert out["fallbacks"] == [] and "warning" not in proc.stderr
    path.write_text(json.dumps(three_levels(drop="inter2")))
    proc = run_cli(["search", str(path), "--model", "mlp:batch=64,d_in=256,d_hidden=512", "--mesh", "2x2x2", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert "no 'inter2' model" in proc.stderr and "priced by its 'inter' models" in proc.stderr
    assert {(f["wanted"], f["used"]) for f in json.loads(proc.stdout)["fallbacks"]} == {("inter2", "inter")}


def test_older_calibrations_still_read_and_bad_levels_are_refused(tmp_path):
    flat = synthetic_calibration({("allreduce", "inter"): (2e-5, 1e-8)}, gemm={"float32": 1e10})
    old = dict(flat, version=13)
    cal = calibration_from_dict(old)
    assert cal.switch_spans() == () and cal.result.topology is None
    assert [a.link for a in Pricer(cal, Mesh((2, 2, 2), 2)).mesh.axes] == ["inter", "inter", "intra"]
    bad = three_levels()
    bad["models"]["allreduce"]["inter10"] = bad["models"]["allreduce"]["inter"]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(UsageError, match="inter10"):
        load_calibration(tmp_path / "bad.json")
    bad = three_levels()
    del bad["topology"]["levels"][0]["groups"]
    with pytest.raises(UsageError, match="missing key 'topology.levels.0.groups'"):
        calibration_from_dict(bad)


def test_fit_records_the_levels_of_the_runs(tmp_path):
    truth = {("pingpong", link): (a, 1 / bw) for link, (a, bw) in LEVELS.items()}
    run = write_synthetic_run(tmp_path / "run", truth, {link: [2] for link in LEVELS}, sizes=tuple(4 ** k for k in
                                                                                                   range(2, 12)))
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(meta | {"topology": Topology("slurm", RACKS).to_json()}))
    result = fit_result(load_runs([str(run)]))
    data = calibration_from_dict(result.to_json()).data
    assert data["topology"]["source"] == "slurm"
    assert data["topology"]["levels"][1] == {"link": "inter2", "level": 2, "groups": [["node1", "node2", "node3",
                                                                                       "node4"]]}
    for link, (_, bw) in LEVELS.items():
        assert data["p2p"]["pingpong"][link]["bandwidth_bytes_per_s"] == pytest.approx(bw, rel=0.05)
    other = tmp_path / "other"
    write_synthetic_run(other, truth, {link: [2] for link in LEVELS}, sizes=(64, 4096, 65536, 1 << 20), run_id="o")
    meta = json.loads((other / "run.json").read_text())
    flipped = Topology("slurm", ((("node1", "node3"), ("node2", "node4")), RACKS[1])).to_json()
    (other / "run.json").write_text(json.dumps(meta | {"topology": flipped}))
    with pytest.raises(UsageError, match="different switch trees"):
        load_runs([str(run), str(other)])


def _pairs(nodes, rate):
    return {(a, b): rate(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:]}


@pytest.mark.parametrize("racks", [(2, 2), (3, 3, 2), (4, 4, 4, 4)])
def test_a_scan_of_racks_infers_their_levels_and_writes_a_tree_the_sweep_reads(tmp_path, racks):
    """Pairs within a rack at 47.8 MB/s, across at 24 (each within 3% noise): two levels, the racks the leaves; the
    topology.conf written reads back as the same tree."""
    rack = {f"n{i}": r for r, size in enumerate(racks) for i in range(sum(racks[:r]), sum(racks[:r]) + size)}
    nodes = list(rack)
    noise = iter(np.random.default_rng(1).uniform(0.97, 1.03, 10_000))
    found = infer_levels(_pairs(nodes, lambda a, b: (47.8 if rack[a] == rack[b] else 24.0) * next(noise)), nodes)
    assert found.why == ""
    assert [sorted(map(sorted, lvl)) for lvl in found.topology.levels] == \
        [sorted(sorted(n for n in nodes if rack[n] == r) for r in set(rack.values())), [sorted(nodes)]]
    (tmp_path / "topology.conf").write_text(found.conf())
    assert read_topology(str(tmp_path / "topology.conf")).levels == found.topology.levels


@pytest.mark.parametrize("rate,why", [
    (lambda a, b: 26.0 if "n3" in (a, b) else 47.8, "node n3 is slower"),        # one slow node, not a rack
    (lambda a, b: 47.8, "one switch level"),                                   # flat
])
def test_a_slow_node_or_a_flat_network_infers_no_levels(rate, why):
    nodes = [f"n{i}" for i in range(1, 6)]
    found = infer_levels(_pairs(nodes, rate), nodes)
    assert why in found.why and found.topology.levels == () and found.conf() == ""
