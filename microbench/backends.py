"""Where buffers live and which library moves them: one class per `--backend`.

mpi: host numpy buffers handed to MPI. mpi-cuda: cupy device buffers handed to a CUDA-aware MPI.
nccl: cupy buffers moved by NCCL (cupy.cuda.nccl); the unique id travels over the MPI
sub-communicator, one GPU per rank chosen by node-local rank, each iteration timed with CUDA
events on the stream and combined by max over ranks like every other point."""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np

from microbench.errors import UsageError
from microbench.ops import numpy_dtype


class MpiBackend:
    """Host numpy buffers handed to MPI (the default)."""

    name = "mpi"
    xp = np
    in_place_ops: frozenset[str] = frozenset()

    def __init__(self, world, hosts: list[str]) -> None:
        self.world = world

    def sync(self) -> None:
        """Wait for queued device work (nothing to wait for on the host)."""

    def invoke(self, op, comm, send, recv) -> None:
        op.invoke(comm, send, recv)

    def make_timer(self, world, choice: str):
        from microbench.driver import make_timer

        return make_timer(world, choice)

    def versions(self) -> dict[str, str]:
        return {}

    def devices(self, world) -> list[dict]:
        return []

    def dtypes(self, op) -> tuple[str, ...]:
        """The element types `op` (a local operation of the op table) is measured in with these buffers."""
        return op.dtypes


def _import_cupy(backend: str):
    try:
        import cupy
    except ImportError:
        raise UsageError(f"--backend {backend} needs cupy: pip install 'commcal[gpu]' (cupy-cuda13x)") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise UsageError(f"--backend {backend}: no usable CUDA device ({exc})") from None
    if count < 1:
        raise UsageError(f"--backend {backend}: no CUDA device on {os.uname().nodename}")
    return cupy


def local_rank(hosts: list[str], rank: int) -> int:
    """This rank's index among the ranks on its node."""
    return hosts[:rank].count(hosts[rank])


def mpi_cuda_support() -> bool | None:
    """Whether the loaded MPI library handles CUDA buffers (Open MPI's or MPICH's query), None if it cannot tell."""
    for path in _loaded_mpi_libraries():
        lib = ctypes.CDLL(path)
        if hasattr(lib, "MPIX_Query_cuda_support"):
            return bool(lib.MPIX_Query_cuda_support())
        if hasattr(lib, "MPIX_GPU_query_support"):
            supported = ctypes.c_int(0)
            lib.MPIX_GPU_query_support(0, ctypes.byref(supported))   # 0: MPIX_GPU_SUPPORT_CUDA
            return bool(supported.value)
    return None


def _loaded_mpi_libraries() -> list[str]:
    try:
        maps = open("/proc/self/maps").read().split("\n")
    except OSError:
        return []
    paths = {line.split()[-1] for line in maps if "/libmpi" in line and line.split()[-1].startswith("/")}
    return sorted(paths)


class CudaMpiBackend(MpiBackend):
    """cupy device buffers handed to a CUDA-aware MPI; refuses an MPI without CUDA support."""

    name = "mpi-cuda"

    def __init__(self, world, hosts: list[str]) -> None:
        super().__init__(world, hosts)
        self.cupy = _import_cupy(self.name)
        self.xp = self.cupy
        count = self.cupy.cuda.runtime.getDeviceCount()
        self.device = local_rank(hosts, world.rank) % count
        self.cupy.cuda.Device(self.device).use()
        self.check_mpi()

    def check_mpi(self) -> None:
        aware = mpi_cuda_support()
        if aware is not True and os.environ.get("COMMCAL_ASSUME_CUDA_AWARE") != "1":
            why = "reports no CUDA support" if aware is False else "cannot say whether it supports CUDA"
            raise UsageError(f"--backend mpi-cuda: the MPI library {why}; use a CUDA-aware MPI, --backend nccl, "
                             f"or set COMMCAL_ASSUME_CUDA_AWARE=1 if you know it is")

    def sync(self) -> None:
        self.cupy.cuda.Device().synchronize()

    def invoke(self, op, comm, send, recv) -> None:
        self.sync()
        op.invoke(comm, send, recv)

    def versions(self) -> dict[str, str]:
        rt = self.cupy.cuda.runtime
        out = {"cupy": self.cupy.__version__, "cuda_runtime": str(rt.runtimeGetVersion()),
               "cuda_driver": str(rt.driverGetVersion())}
        try:
            out["nccl"] = str(self.cupy.cuda.nccl.get_version())
        except Exception:  # cupy built without NCCL
            out["nccl"] = "unavailable"
        return out

    def dtypes(self, op) -> tuple[str, ...]:
        """The op's device element types (its host ones where it names none), each where cupy can multiply it on
        this device."""
        usable = []
        for dtype in op.device_dtypes or op.dtypes:
            try:
                a = self.cupy.ones((2, 2), dtype=numpy_dtype(dtype))
                (a @ a).get()
                usable.append(dtype)
            except Exception:  # cupy raises several types for dtypes it cannot multiply
                continue
        return tuple(usable)

    def devices(self, world) -> list[dict]:
        props = self.cupy.cuda.runtime.getDeviceProperties(self.device)
        mine = {"rank": world.rank, "device": self.device, "name": props["name"].decode(),
                "memory_bytes": int(props["totalGlobalMem"]), "pci_bus_id": self.cupy.cuda.Device(self.device).pci_bus_id}
        return world.gather(mine, root=0) or []


class NcclBackend(CudaMpiBackend):
    """cupy buffers moved by NCCL, one communicator per MPI sub-communicator."""

    name = "nccl"
    in_place_ops = frozenset({"allreduce", "allgather", "reduce_scatter"})

    def __init__(self, world, hosts: list[str]) -> None:
        super().__init__(world, hosts)
        try:
            from cupy.cuda import nccl
        except ImportError as exc:
            raise UsageError(f"--backend nccl: cupy cannot load NCCL ({exc})") from None
        if not getattr(nccl, "available", True):
            raise UsageError("--backend nccl: this cupy has no NCCL; install NCCL for its CUDA (the nvidia-nccl "
                             "wheel or a site module) or use --backend mpi-cuda")
        self.nccl = nccl
        self.stream = self.cupy.cuda.Stream(non_blocking=True)
        self._comms: dict[int, object] = {}
        self._nccl_types = {"float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
                            "float16": nccl.NCCL_FLOAT16, "int64": nccl.NCCL_INT64}

    def check_mpi(self) -> None:
        """NCCL moves the data; MPI only carries the unique id, so any MPI will do."""

    def communicator(self, comm):
        key = comm.py2f()
        if key not in self._comms:
            uid = self.nccl.get_unique_id() if comm.rank == 0 else None
            uid = comm.bcast(uid, root=0)
            self._comms[key] = self.nccl.NcclCommunicator(comm.size, uid, comm.rank)
        return self._comms[key]

    def launch(self, op, comm, send, recv) -> None:
        """Queue one call of `op` on the stream."""
        nc, nccl, s = self.communicator(comm), self.nccl, self.stream.ptr
        dt = self._nccl_types[str(send.dtype)]
        block = recv.size if op.name == "reduce_scatter" else send.size
        sp, rp = send.data.ptr, recv.data.ptr
        if op.name == "allreduce":
            nc.allReduce(sp, rp, send.size, dt, nccl.NCCL_SUM, s)
        elif op.name == "allgather":
            nc.allGather(sp, rp, block, dt, s)
        elif op.name == "reduce_scatter":
            nc.reduceScatter(sp, rp, block, dt, nccl.NCCL_SUM, s)
        elif op.name == "alltoall":
            block, step = send.size // comm.size, send.size // comm.size * send.itemsize
            nccl.groupStart()
            for peer in range(comm.size):
                nc.send(sp + peer * step, block, dt, peer, s)
                nc.recv(rp + peer * step, block, dt, peer, s)
            nccl.groupEnd()
        elif op.name == "bcast":
            nc.bcast(sp, send.size, dt, 0, s)
        elif op.name == "reduce":
            nc.reduce(sp, rp, send.size, dt, nccl.NCCL_SUM, 0, s)
        elif op.name == "pingpong":
            peer = 1 - comm.rank
            first, second = ((nc.send, sp), (nc.recv, rp)) if comm.rank == 0 else ((nc.recv, rp), (nc.send, sp))
            first[0](first[1], send.size, dt, peer, s)
            second[0](second[1], send.size, dt, peer, s)
        elif op.name == "sendrecv":
            peer = 1 - comm.rank
            nccl.groupStart()
            nc.send(sp, send.size, dt, peer, s)
            nc.recv(rp, send.size, dt, peer, s)
            nccl.groupEnd()
        else:
            raise UsageError(f"--backend nccl cannot run {op.name}")

    def invoke(self, op, comm, send, recv) -> None:
        self.sync()
        self.launch(op, comm, send, recv)
        self.stream.synchronize()

    def make_timer(self, world, choice: str):
        return NcclTimer(self), "CUDA events on the NCCL stream"


class NcclTimer:
    """Per-iteration CUDA-event timing: stream idle, MPI barrier (untimed), event, NCCL call, event."""

    path = "cuda-events"

    def __init__(self, backend: NcclBackend) -> None:
        self.b = backend

    def run(self, op, comm, slots, first: int, lay, dtype: str, iters: int, gap: float = 0.0,
            bar=None) -> np.ndarray:
        cupy, stream = self.b.cupy, self.b.stream
        pairs = []
        for i in range(iters):
            send, recv = slots.pair(first + i)
            stream.synchronize()
            if gap > 0:
                time.sleep(gap)
            (comm if bar is None else bar).Barrier()
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            self.b.launch(op, comm, send, recv)
            end.record(stream)
            pairs.append((start, end))
        stream.synchronize()
        return np.array([cupy.cuda.get_elapsed_time(s, e) * 1e-3 for s, e in pairs])

    def peer(self, op, code: int, comm, send, recv, lay, dtype: str, iters: int, style: int) -> float:
        """nccl-tests' loop: `iters` calls queued back to back on the stream after a barrier, timed by CUDA events
        around the whole loop (this rank's seconds; the other styles are MPI's and time the same here)."""
        cupy, stream = self.b.cupy, self.b.stream
        stream.synchronize()
        comm.Barrier()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(iters):
            self.b.launch(op, comm, send, recv)
        end.record(stream)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) * 1e-3


BACKENDS = {"mpi": MpiBackend, "mpi-cuda": CudaMpiBackend, "nccl": NcclBackend}


def backend_for(name: str, world, hosts: list[str]):
    """The backend every rank agrees on; a rank that cannot set it up fails the whole job with its reason."""
    try:
        backend, error = BACKENDS[name](world, hosts), None
    except UsageError as exc:
        backend, error = None, str(exc)
    errors = [e for e in world.allgather(error) if e]
    if errors:
        raise UsageError(errors[0])
    return backend
