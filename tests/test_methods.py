"""Reference modes (microbench.methods) and the thread level (microbench.threads), without MPI: each peer's size
convention, element type, loop and rank statistic, and who chooses the thread level."""

import numpy as np
import pytest

from calib.peers.model import mpi_total_bytes
from calib.points import method as run_method
from microbench import methods, threads
from microbench.errors import UsageError
from microbench.methods import METHODS, combine_ranks, method_for
from microbench.ops import OPS, itemsize
from microbench.records import timing_method


@pytest.mark.parametrize("name", ["osu", "imb"])
def test_osu_and_imb_sizes_of_allgather_and_alltoall_are_per_rank(name):
    m = METHODS[name]
    assert m.commcal_bytes("allgather", 1024, 4) == 4096 and m.commcal_bytes("alltoall", 8, 2) == 16
    for op in ("allreduce", "bcast", "reduce", "pingpong"):
        assert m.commcal_bytes(op, 1024, 4) == 1024
    # IMB 2021's Reduce_scatter gives every rank `size` bytes; OSU's splits `size` over the ranks
    assert m.commcal_bytes("reduce_scatter", 1024, 4) == (4096 if name == "imb" else 1024)
    # the layout a per-rank size gives: one 8 B block per rank, the whole buffer p blocks
    lay = OPS["allgather"].layout(m.commcal_bytes("allgather", 8, 2), 2, itemsize(m.dtype("allgather")))
    assert lay.block * lay.itemsize == 8 and lay.size_bytes == 16


def test_nccl_tests_and_commcal_sizes_are_the_whole_buffer():
    for name in ("commcal", "nccl-tests"):
        assert METHODS[name].commcal_bytes("allgather", 1024, 4) == 1024
        assert METHODS[name].dtype("allreduce") == "float32"


def test_import_uses_the_reference_modes_size_rule():
    assert mpi_total_bytes("alltoall", 64, 8) == 512 and mpi_total_bytes("allreduce", 64, 8) == 64
    assert mpi_total_bytes("reduce_scatter", 64, 8) == 64 and mpi_total_bytes("reduce_scatter", 64, 8, "imb") == 512


def test_peer_datatypes():
    assert {METHODS["osu"].dtype(op) for op in ("bcast", "allgather", "pingpong")} == {"int8"}
    assert {METHODS["osu"].dtype(op) for op in ("allreduce", "reduce", "reduce_scatter")} == {"int32"}
    assert METHODS["imb"].dtype("allreduce") == "float32" and METHODS["imb"].dtype("allgather") == "uint8"


def test_peer_loops_follow_the_peers_defaults():
    osu = METHODS["osu"]
    assert osu.loop("pingpong", 8) == (10000, 100) and osu.loop("pingpong", 16384) == (1000, 10)
    assert osu.loop("allreduce", 8192) == (1000, 100) and osu.loop("allreduce", 8193) == (100, 10)
    assert METHODS["osu-window"].loop("pingpong", 8) == (100, 10)
    assert METHODS["imb"].loop("allreduce", 8)[0] == 1000 and METHODS["imb"].loop("allreduce", 4 << 20)[0] == 10
    assert METHODS["nccl-tests"].loop("allreduce", 8) == (20, 5)


def test_loop_is_shortened_to_fit_the_budget_but_not_below_the_floor():
    osu = METHODS["osu"]
    assert osu.loop_length("pingpong", 8, 1e-6, 1.0, 10) == 10000          # 10 loops of 10 ms fit 1 s
    assert osu.loop_length("pingpong", 4 << 20, 1e-3, 1.0, 10) == 100      # 1000 calls of 1 ms do not
    assert osu.loop_length("pingpong", 4 << 20, 1.0, 1.0, 10) == methods.MIN_LOOP


def test_styles_and_codes():
    osu, imb = METHODS["osu"], METHODS["imb"]
    assert osu.style("pingpong") == methods.STYLE_EACH and osu.style("allreduce") == methods.STYLE_EACH_BARRIER
    assert imb.style("allreduce") == methods.STYLE_EACH_BARRIER and imb.style("pingpong") == methods.STYLE_LOOP
    assert METHODS["nccl-tests"].style("bcast") == methods.STYLE_LOOP
    assert osu.c_code("reduce_scatter", 2) == imb.c_code("reduce_scatter", 2) == methods.CODE_REDUCE_SCATTER
    assert METHODS["nccl-tests"].c_code("reduce_scatter", 2) == 2
    assert METHODS["osu-window"].c_code("pingpong", 6) == methods.CODE_WINDOW


def test_rank_statistics():
    per_rank = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 9.0]])      # 2 ranks x 3 loops
    assert combine_ranks(per_rank, "mean").tolist() == [2.0, 2.0, 6.0]    # OSU's avg
    assert combine_ranks(per_rank, "max").tolist() == [3.0, 2.0, 9.0]     # commcal's (per call), IMB's t_max
    assert combine_ranks(per_rank, "rank0").tolist() == [1.0, 2.0, 3.0]   # osu_latency's rank 0
    assert METHODS["osu"].rank_combine("pingpong") == "rank0" and METHODS["osu"].rank_combine("bcast") == "mean"
    assert METHODS["imb"].rank_combine("allreduce") == "max"


def test_unknown_method_and_window_on_collectives_are_refused():
    with pytest.raises(UsageError, match="unknown method"):
        method_for("mpptest")
    with pytest.raises(UsageError, match="only pingpong"):
        method_for("osu-window", ["allreduce"])
    assert not method_for(None).reference and method_for("osu", ["allreduce"]).reference


def test_a_runs_method_reads_sweeps_imports_and_old_runs():
    assert timing_method({"options": {"method": "osu"}}) == "osu"
    assert timing_method({"options": {}, "origin": {"method": "osu-window"}}) == "osu-window"
    assert timing_method({"options": {"cache": "cold"}}) == "commcal" == timing_method({})
    assert run_method({"method": "imb"}) == "imb" and run_method({"origin": {"method": "osu"}}) == "osu"
    assert run_method({}) == "commcal"


def test_thread_level_resolution():
    assert threads.resolve(None, "mpi", {}) == ("single", "commcal (one thread calls MPI)")
    assert threads.resolve(None, "nccl", {})[0] == "funneled"
    assert threads.resolve(None, "mpi", {threads.ENV: "Multiple"}) == ("multiple", threads.ENV)
    assert threads.resolve("serialized", "mpi", {threads.ENV: "multiple"}) == ("serialized", "--thread-level")
    with pytest.raises(UsageError, match="not a thread level"):
        threads.resolve(None, "mpi", {threads.ENV: "many"})
    assert [threads.provided_name(v) for v in range(4)] == list(threads.LEVELS)
