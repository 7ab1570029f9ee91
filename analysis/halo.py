"""Halo exchange: the point-to-point step of spatial parallelism (ParaDL's "spatial" strategy). A mesh axis cuts a
tensor dim into blocks in group order; a convolution of kernel k needs (k-1)/2 rows of each neighbouring block.
One `Halo` is one shift along the axis: every member sends a slab of `rows` rows to the member `direction` away and
receives one from the member as far the other way (the ends send or receive nothing), all at once: one MPI
Sendrecv per member, priced as the calibration's `sendrecv` of the slab on the axis's link (analysis.pricing, link
sharing included). A forward exchange is two shifts (the rows below to the next member, the rows above to the
previous one); the backward pass sends the gradients of the borrowed rows back to their owners, who add them in.

A Halo is priced and executed like a redistribute.Step: it has op, axis, link, group_size, size_bytes, copies,
is_comm and describe(); the harness runs it through `run`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

HALO_BUFFERS = {(False, 1): ("X", "Xtop"), (False, -1): ("X", "Xbot"),
                (True, 1): ("dXtop", "dX"), (True, -1): ("dXbot", "dX")}
"""(grad, direction) -> (the buffer sent from, the buffer received into); see Halo.run."""


@dataclass(frozen=True)
class Halo:
    axis: int
    dim: int
    rows: int
    direction: int               # +1: to the next member of the group; -1: to the previous one
    grad: bool                   # the backward (adjoint) exchange: borrowed rows' gradients go home and are added
    group_size: int
    link: str
    slab: tuple[int, ...]        # local shape of one message
    itemsize: int

    op: ClassVar[str] = "sendrecv"
    is_comm: ClassVar[bool] = True

    @property
    def bytes_per_rank(self) -> int:
        return math.prod(self.slab) * self.itemsize

    @property
    def size_bytes(self) -> int:
        """The calibration's sendrecv size: the message one member sends (and receives)."""
        return self.bytes_per_rank

    @property
    def copies(self) -> tuple[int, ...]:
        """The slab packed into a contiguous message (rows of dim 2 of an NCHW block are not), and on the way back
        also added into the owner's rows."""
        n = math.prod(self.slab)
        return (n, n) if self.grad else (n,)

    def describe(self) -> str:
        way = "next" if (self.direction > 0) != self.grad else "previous"     # gradients go the other way
        what = "gradient of borrowed rows back" if self.grad else "boundary rows"
        return (f"halo {what} to the {way} member on axis {self.axis} ({self.link}, {self.group_size} ranks): "
                f"{self.rows} row(s) of dim {self.dim}, {self.bytes_per_rank} B per rank")

    def run(self, env: dict, coll, xp) -> None:
        """Forward (+1): send X's last rows, receive Xtop (zeros at the first member); (-1): send X's first rows,
        receive Xbot. Backward (+1, the adjoint of forward +1): send dXtop to the previous member and add what the
        next one sends into dX's last rows; (-1): send dXbot to the next and add into dX's first rows."""
        src, dst = HALO_BUFFERS[(self.grad, self.direction)]
        lead = (slice(None),) * self.dim
        rows = slice(-self.rows, None) if self.direction > 0 else slice(0, self.rows)
        send = env[src] if self.grad else xp.ascontiguousarray(env[src][lead + (rows,)])
        if send.nbytes != self.bytes_per_rank:
            raise ValueError(f"{self.describe()}: the slab holds {send.nbytes} B")
        if self.grad:
            got = coll.shift(send, self.axis, -self.direction)
            env[dst][lead + (rows,)] += got
            return
        env[dst] = coll.shift(send, self.axis, self.direction)
