"""The MPI side of the validation harness: the job's device mesh (ranks per node from the hosts, as the
sweep finds them) and the Collectives adapter, one sub-communicator per mesh axis. A GPU backend replaces
Collectives with an object of the same methods."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from analysis.mesh import Mesh, parse_mesh
from microbench.errors import UsageError
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
    """allreduce / allgather / reduce_scatter / alltoall of contiguous numpy buffers on mesh-axis groups;
    allgather returns the members' buffers stacked in a leading axis, reduce_scatter and alltoall take one."""

    def __init__(self, world: MPI.Comm, mesh: Mesh, coord: tuple[int, ...]):
        self.world = world
        self.axes = []
        for axis in range(len(mesh.shape)):
            color = sum(c * mesh.stride(a) for a, c in enumerate(coord) if a != axis)
            self.axes.append(world.Split(color, coord[axis]))

    def allreduce(self, buf, axis: int):
        out = np.empty_like(buf)
        self.axes[axis].Allreduce(buf, out)
        return out

    def allgather(self, buf, axis: int):
        comm = self.axes[axis]
        out = np.empty((comm.size,) + buf.shape, dtype=buf.dtype)
        comm.Allgather(buf, out)
        return out

    def reduce_scatter(self, blocks, axis: int):
        out = np.empty(blocks.shape[1:], dtype=blocks.dtype)
        self.axes[axis].Reduce_scatter_block(blocks, out)
        return out

    def alltoall(self, blocks, axis: int):
        out = np.empty_like(blocks)
        self.axes[axis].Alltoall(blocks, out)
        return out

    def barrier(self) -> None:
        self.world.Barrier()

    def sync(self) -> None:
        """Wait for queued device work (nothing to wait for with numpy)."""

    def world_max(self, values: np.ndarray) -> np.ndarray:
        out = np.empty_like(values)
        self.world.Allreduce(values, out, op=MPI.MAX)
        return out

    def world_gather(self, obj) -> list:
        return self.world.allgather(obj)

    def free(self) -> None:
        for comm in self.axes:
            comm.Free()
