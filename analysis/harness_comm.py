"""The MPI side of the validation harness: the job's device mesh (ranks per node from the hosts, as the
sweep finds them) and the Collectives adapter, one sub-communicator per mesh axis. A GPU run gives
Collectives' backend (--backend mpi-cuda or nccl) with cupy buffers."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from analysis.mesh import Mesh, parse_mesh
from microbench.backends import MpiBackend
from microbench.errors import UsageError
from microbench.ops import OPS
from microbench.topology import nodes_of


def job_mesh(world: MPI.Comm, text: str | None) -> tuple[Mesh, tuple[int, ...], list[str]]:
    """(mesh, this rank's coordinate, every rank's host). Mesh devices fill nodes in order, so axis link
    classes are the real ones; the mesh must have exactly the world's size (default: nodes x ranks per node)."""
    hosts = world.allgather(MPI.Get_processor_name())
    nodes = nodes_of(hosts)
    if len({len(n) for n in nodes}) != 1:
        raise UsageError(f"uneven ranks per node ({', '.join(str(len(n)) for n in nodes)}): the mesh needs "
                         f"the same number on every node")
    if text is None:
        text = f"{len(nodes)}x{len(nodes[0])}" if len(nodes) > 1 else str(world.size)
    mesh = parse_mesh(text, len(nodes[0]), world.size)
    device = [r for node in nodes for r in node].index(world.rank)
    return mesh, mesh.coord(device), hosts


class Collectives:
    """allreduce / allgather / reduce_scatter / alltoall of contiguous buffers on mesh-axis groups, bcast /
    reduce from or to any member, and the halo exchange's shift; allgather returns the members' buffers stacked in a
    leading axis, reduce_scatter and alltoall take one. The sweep's backend moves the data (microbench.backends: host
    MPI, CUDA-aware MPI or NCCL), so the harness runs each collective through the same library calls the calibration
    measured; a rooted call runs on a copy of the axis's communicator renumbered so that its root is member 0,
    as the sweep measured it. `sent` counts the bytes of every buffer this rank handed to a collective."""

    def __init__(self, world: MPI.Comm, mesh: Mesh, coord: tuple[int, ...], backend=None):
        self.world = world
        self.backend = backend or MpiBackend(world, [])
        self.xp = self.backend.xp
        self.coord = coord
        self.colors = [sum(c * mesh.stride(a) for a, c in enumerate(coord) if a != axis) for axis in range(len(coord))]
        self.axes = [world.Split(color, coord[axis]) for axis, color in enumerate(self.colors)]
        self.rooted: dict[tuple[int, int], MPI.Comm] = {}
        self.sent = 0

    def _run(self, name: str, send, out, axis: int, comm=None):
        self.sent += send.nbytes
        self.backend.invoke(OPS[name], comm or self.axes[axis], send, out)
        return out

    def _root_comm(self, axis: int, root: int):
        """The axis's communicator with member `root` first (made on first use: every rank runs the same
        schedule, so all reach each Split together)."""
        if root == 0:
            return self.axes[axis]
        if (axis, root) not in self.rooted:
            size = self.axes[axis].size
            self.rooted[(axis, root)] = self.world.Split(self.colors[axis], (self.coord[axis] - root) % size)
        return self.rooted[(axis, root)]

    def bcast(self, buf, axis: int, root: int):
        """The root's buffer on every member (in place: the others' buffers are overwritten)."""
        return self._run("bcast", buf, buf, axis, self._root_comm(axis, root))

    def reduce(self, buf, axis: int, root: int):
        """The members' sum, meaningful on the root only."""
        return self._run("reduce", buf, self.xp.empty_like(buf), axis, self._root_comm(axis, root))

    def allreduce(self, buf, axis: int):
        return self._run("allreduce", buf, self.xp.empty_like(buf), axis)

    def allgather(self, buf, axis: int):
        out = self.xp.empty((self.axes[axis].size,) + buf.shape, dtype=buf.dtype)
        return self._run("allgather", buf, out, axis)

    def reduce_scatter(self, blocks, axis: int):
        return self._run("reduce_scatter", blocks, self.xp.empty(blocks.shape[1:], dtype=blocks.dtype), axis)

    def alltoall(self, blocks, axis: int):
        return self._run("alltoall", blocks, self.xp.empty_like(blocks), axis)

    def shift(self, buf, axis: int, direction: int):
        """Every member of the axis's group sends `buf` to the member `direction` away and receives the buffer of
        the member as far the other way (zeros where there is none): one Sendrecv each, the halo exchange of
        analysis.halo. Host MPI or CUDA-aware MPI buffers only."""
        comm = self.axes[axis]
        to, frm = comm.rank + direction, comm.rank - direction
        out = self.xp.zeros_like(buf)
        self.sent += buf.nbytes
        self.backend.sync()
        comm.Sendrecv(buf, dest=to if 0 <= to < comm.size else MPI.PROC_NULL, sendtag=11, recvbuf=out,
                      source=frm if 0 <= frm < comm.size else MPI.PROC_NULL, recvtag=11)
        return out

    def isend(self, buf, axis: int, dest: int, tag: int):
        """Start sending a host buffer to member `dest` of this rank's group on `axis`; the request to wait on."""
        return self.axes[axis].Isend(buf, dest, tag)

    def iallreduce(self, buf, axis: int):
        """Start summing a host buffer over the group on `axis`: (the request to wait on, the result's buffer)."""
        out = np.empty_like(buf)
        return self.axes[axis].Iallreduce(buf, out, op=MPI.SUM), out

    def recv(self, buf, axis: int, source: int, tag: int) -> None:
        self.axes[axis].Recv(buf, source, tag)

    @staticmethod
    def wait(requests) -> None:
        MPI.Request.Waitall(requests)

    def barrier(self) -> None:
        self.world.Barrier()

    def sync(self) -> None:
        """Wait for queued device work before a clock is read."""
        self.backend.sync()

    def world_max(self, values: np.ndarray) -> np.ndarray:
        out = np.empty_like(values)
        self.world.Allreduce(values, out, op=MPI.MAX)
        return out

    def world_gather(self, obj) -> list:
        return self.world.allgather(obj)

    def free(self) -> None:
        for comm in [*self.axes, *self.rooted.values()]:
            comm.Free()
