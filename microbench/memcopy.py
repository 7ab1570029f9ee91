"""Host memcpy's speed by where the destination starts relative to the source, modulo 4 KiB.

Every host-side copy of a collective (shared-memory transport, a rank's own block) and every layout copy goes
through the C library's memcpy. Where it uses REP MOVSB (glibc 2.36 does on some x86 hosts for copies of 2 KiB
to about 1 MiB), a destination that starts a few bytes past its source modulo 4 KiB makes the copy many times
slower (4K aliasing; the figures: docs/results.md, "memcpy placement"). numpy places arrays allocated one
after another 16 bytes apart modulo 4 KiB, so a program's collectives pay it by chance of buffer placement,
not by size: timings then depend on where the allocator put things. glibc's x86_rep_movsb_threshold tunable
(TUNABLE) moves such copies to vector loops. sweep and validate record the slowdown and warn where it is large.

Run `python -m microbench.memcopy` for the table; compare with `GLIBC_TUNABLES=... python -m microbench.memcopy`.
`--drift SECONDS [--procs N]` prints how the host's copy speed moves over time instead: on a shared VM it drifts
with other tenants' memory traffic, which no CPU steal counter shows, and intra-node timings drift with it."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time

import numpy as np

PAGE = 4096
PROBE_BYTES = 128 << 10
ALIASED, APART = 16, 2048
"""Destination offsets past the source modulo 4 KiB: the slow case (numpy's back-to-back arrays) and a safe one."""
WARN_SLOWDOWN = 2.0
TUNABLE = "glibc.cpu.x86_rep_movsb_threshold=4294967295"


def _pair(nbytes: int, distance: int) -> tuple[np.ndarray, np.ndarray]:
    """(source, destination) of `nbytes` in one freshly written buffer, the destination starting `distance` bytes
    past the source modulo 4 KiB (negative: before it), the source on a page boundary."""
    gap = 8 * PAGE + distance % PAGE
    mem = np.ones(2 * nbytes + gap + 2 * PAGE, dtype=np.uint8)
    start = -mem.ctypes.data % PAGE
    return mem[start:start + nbytes], mem[start + nbytes + gap:start + 2 * nbytes + gap]


def copy_seconds(nbytes: int, distances, repeats: int = 41) -> list[float]:
    """Median seconds of one memcpy (numpy copyto) of `nbytes` at each destination offset, the offsets timed in
    turn within every repeat, so that a noisy host disturbs them alike."""
    pairs = [_pair(nbytes, d) for d in distances]
    times = np.empty((repeats, len(pairs)))
    for src, dst in pairs:
        np.copyto(dst, src)
    for i in range(repeats):
        for j, (src, dst) in enumerate(pairs):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            times[i, j] = time.perf_counter() - t0
    return [float(t) for t in np.median(times, axis=0)]


def alias_slowdown(nbytes: int = PROBE_BYTES) -> float:
    """How many times longer a copy takes with the destination 16 B past the source (mod 4 KiB) than 2 KiB past."""
    aliased, apart = copy_seconds(nbytes, (ALIASED, APART))
    return aliased / apart


def advice(slowdown: float) -> str | None:
    """A warning line where the slowdown makes timings depend on buffer placement; None where it does not."""
    if slowdown < WARN_SLOWDOWN:
        return None
    return (f"host memcpy of {PROBE_BYTES >> 10} KiB runs {slowdown:.1f}x slower when the destination starts "
            f"{ALIASED} B past the source modulo 4 KiB, as numpy's back-to-back arrays do: collectives and copies "
            f"will time by where buffers happen to lie. Launch every rank with GLIBC_TUNABLES={TUNABLE} "
            f"(sweep and validate alike) to avoid it")


DRIFT_BYTES, DRIFT_SPAN, WINDOW_S = 4 << 20, 64 << 20, 10


def drift_rates(seconds: float, cpu: int | None = None) -> list[float]:
    """GB/s of a DRIFT_BYTES copy, the median of each second for `seconds`; buffers rotate through DRIFT_SPAN so
    copies read and write memory, not cache. `cpu`: pin to that core first."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    slots = DRIFT_SPAN // DRIFT_BYTES
    src, dst = np.ones((slots, DRIFT_BYTES), np.uint8), np.ones((slots, DRIFT_BYTES), np.uint8)
    out, i, end = [], 0, time.monotonic() + seconds
    while time.monotonic() < end:
        times, tick = [], time.monotonic() + 1.0
        while time.monotonic() < tick:
            t0 = time.perf_counter()
            np.copyto(dst[i % slots], src[i % slots])
            times.append(time.perf_counter() - t0)
            i += 1
        out.append(DRIFT_BYTES / float(np.median(times)) / 1e9)
    return out


def drift(seconds: float, procs: int) -> None:
    """Copy speed over time in `procs` processes at once, one per core: per process the median, 5th and 95th
    percentiles of the per-second rates, and the median of each WINDOW_S window; dips that every process shows in
    the same windows come from outside them (the host), not from their own scheduling."""
    cpus = sorted(os.sched_getaffinity(0))
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        series = pool.starmap(drift_rates, [(seconds, cpus[k % len(cpus)]) for k in range(procs)])
    print(f"copy of {DRIFT_BYTES >> 20} MiB (buffers rotating through {DRIFT_SPAN >> 20} MiB), GB/s; "
          f"{procs} process(es), one per core; {WINDOW_S} s windows")
    for k, rates in enumerate(series):
        r = np.array(rates)
        windows = [float(np.median(r[j:j + WINDOW_S])) for j in range(0, len(r), WINDOW_S)]
        spread = (max(windows) - min(windows)) / 2 / float(np.median(r))
        print(f"process {k}: median {np.median(r):.2f}  p5 {np.percentile(r, 5):.2f}  p95 {np.percentile(r, 95):.2f}"
              f"  windows {' '.join(f'{w:.2f}' for w in windows)}  (half-range {100 * spread:.0f}% of the median)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m microbench.memcopy", description=__doc__.splitlines()[0])
    p.add_argument("--drift", type=float, metavar="SECONDS", help="print copy speed over this many seconds instead")
    p.add_argument("--procs", type=int, default=1, help="with --drift: processes at once, one per core (default 1)")
    args = p.parse_args(argv)
    if args.drift is not None:
        if not 0 < args.drift < float("inf") or args.procs < 1:
            print("memcopy: --drift needs a positive number of seconds and --procs at least 1", file=sys.stderr)
            return 2
        drift(args.drift, args.procs)
        return 0
    distances = (0, ALIASED, 64, 256, APART, -32)
    print(f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')}")
    print(f"{'size':>8}  " + "  ".join(f"{f'{d:+d} B':>8}" for d in distances) + "   GB/s by destination offset "
          "past the source (mod 4 KiB)")
    for nbytes in (4 << 10, 32 << 10, 128 << 10, 512 << 10, 2 << 20):
        rates = [nbytes / copy_seconds(nbytes, (d, APART))[0] / 1e9 for d in distances]   # each beside the reference
        print(f"{nbytes >> 10:>6}Ki  " + "  ".join(f"{r:8.1f}" for r in rates))
    slowdown = alias_slowdown()
    print(f"slowdown at {PROBE_BYTES >> 10} KiB, {ALIASED} B against {APART} B: {slowdown:.2f}x")
    print(advice(slowdown) or "no placement penalty worth a warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
