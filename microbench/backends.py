"""Where buffers live and how a rank's device is described: one class per `--backend`."""

from __future__ import annotations

import numpy as np


class MpiBackend:
    """Host numpy buffers handed to MPI (the default)."""

    name = "mpi"
    xp = np

    def __init__(self, world) -> None:
        self.world = world

    def sync(self) -> None:
        """Wait for queued device work (nothing to wait for on the host)."""

    def versions(self) -> dict[str, str]:
        return {}

    def devices(self, world) -> list[dict]:
        return []


BACKENDS = {"mpi": MpiBackend}
