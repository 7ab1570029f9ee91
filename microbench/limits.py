"""The bounds every reader and argument check shares: far beyond a real machine, and within what floats, int64 and
memory hold, so that input past them is one line, never an overflow (docs/troubleshooting.md)."""

from __future__ import annotations

MAX_BYTES = 2 ** 53
"""The largest message or operand size in bytes (8 PiB; above it floats lose whole bytes)."""
MAX_COUNT = 2 ** 62
"""The largest count (ranks, groups, rounds) a reader takes from a file; beyond it no int64 holds the arithmetic."""
MAX_RANKS = 1 << 20
"""The most ranks a run, a host list, a dry run or a mesh may have (each rank's place is held in memory)."""
MAX_SAMPLES = 1_000_000
"""The most timed calls one point (or strategy) takes, whatever its CI: the stopping rule's cap, and so the bound
of --min-samples."""
MAX_ROUNDS = 1000
"""The most rounds, or retries, a run makes: each is a pass over every point, which a dry run plans one by one."""
MAX_GEMM = 8192
"""The largest N of the N x N GEMM a sweep runs before each call (--after-gemm): 512 MiB for each float64 operand."""
MAX_SECONDS = 1e6
"""The longest time one call or step may take (11.6 days)."""
MAX_FILE_BYTES = 256 << 20
"""The largest JSON file or peer log a reader takes (a calibration is kilobytes; /dev/zero is endless)."""
