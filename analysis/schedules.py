"""Pipeline schedules as numbers: how long the bubble is, how many micro-batches' activations a stage holds at
its peak, how many point-to-point messages cross the critical path, and what a schedule needs of p and m. Pure.

GPipe runs every forward, then every backward: the bubble is p-1 micro-batch slots and the first stage holds all
m micro-batches. 1F1B (PipeDream-flush) keeps the same bubble but holds at most p. Interleaved 1F1B gives each
device v chunks of layers, cutting the bubble to (p-1)/v slots for v times the messages, and holds
p (1 + (p-1)/(p v)) micro-batches' worth of a stage (Narayanan et al. 2021; Korthikanti et al. 2022, sec. 4.2.3).

`Schedule.order` is each device's sequence of passes (Megatron-LM's orders), which the validation harness executes
(analysis.harness_pipeline); `timeline` plays those orders with given pass times, and the bubble it finds is the
closed form `bubble_slots` prices (tests/test_pipeline.py holds them equal)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from microbench.errors import UsageError

SCHEDULES = ("gpipe", "1f1b", "interleaved")


class Pass(NamedTuple):
    """One pass of a device's schedule: forward ("F") or backward ("B") of micro-batch `micro` through the device's
    chunk `chunk` of layers, which is virtual stage chunk * p + device of the p v."""

    kind: str
    micro: int
    chunk: int = 0


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: its name and v, the virtual stages (chunks of layers) per device (1 but interleaved)."""

    name: str
    v: int = 1

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise UsageError(f"unknown schedule {self.name!r}; choose from {', '.join(SCHEDULES)}")
        if self.v < 1 or (self.name != "interleaved" and self.v != 1):
            raise UsageError(f"schedule {self.name}: v={self.v}; only interleaved takes v > 1 virtual stages")

    def __str__(self) -> str:
        return f"interleaved/v{self.v}" if self.name == "interleaved" else self.name

    def bubble_slots(self, p: int) -> float:
        """The idle time of a step in units of one micro-batch's forward and backward on one stage."""
        return (p - 1) / self.v

    def in_flight(self, p: int, m: int) -> float:
        """Micro-batches whose whole stage's activations the first stage holds at its peak."""
        if self.name == "gpipe":
            return float(m)
        held = float(min(p, m))
        return held * (1 + (p - 1) / (p * self.v)) if self.name == "interleaved" else held

    def messages(self, p: int, m: int) -> float:
        """Point-to-point transfers on the critical path (forward activations and backward gradients): one each way
        per chunk boundary a micro-batch crosses in the steady state, plus the fill and drain."""
        return 0.0 if p == 1 else 2.0 * (self.v * m + p - 1)

    def order(self, p: int, m: int, device: int) -> tuple[Pass, ...]:
        """The passes device `device` of p runs for m micro-batches, in order. GPipe: every forward, then every
        backward. 1F1B: p - 1 - device warm-up forwards, then one forward and one backward alternately, then the
        remaining backwards. Interleaved: the same over the m v virtual micro-batches in groups of p, with
        2 (p - 1 - device) + (v - 1) p warm-up forwards and the chunks taken backward in reverse."""
        v, total = self.v, m * self.v
        if self.name == "gpipe":
            return tuple(Pass("F", k, 0) for k in range(m)) + tuple(Pass("B", k, 0) for k in range(m))

        def virtual(kind: str, k: int) -> Pass:
            chunk = k % (p * v) // p
            return Pass(kind, k // (p * v) * p + k % p, chunk if kind == "F" else v - 1 - chunk)

        warm = min(total, p - 1 - device if v == 1 else 2 * (p - 1 - device) + (v - 1) * p)
        out = [virtual("F", k) for k in range(warm)]
        for k in range(total - warm):
            out += [virtual("F", warm + k), virtual("B", k)]
        return tuple(out + [virtual("B", k) for k in range(total - warm, total)])

    def timeline(self, p: int, m: int, fwd: float = 1.0, bwd: float = 2.0) -> float:
        """Seconds from the first pass to the last when every device runs its `order` (play)."""
        return play([self.order(p, m, r) for r in range(p)], self.v, fwd, bwd)

    def problem(self, p: int, m: int, layers: int, equal: bool = True) -> str | None:
        """Why the schedule cannot run p stages of `layers` layers with m micro-batches, or None. equal: every stage
        (and chunk) the same number of layers, as a transformer's; else stages cut by time need a layer each."""
        if equal and layers % p:
            return f"{layers} layers do not split into {p} equal pipeline stages"
        if not equal and layers < p * self.v:
            return f"{layers} layers do not make {p * self.v} pipeline stages"
        if self.name == "interleaved":
            if p == 1:
                return "the interleaved schedule needs pipeline parallelism (p > 1)"
            if self.v < 2:
                return "the interleaved schedule needs v >= 2 virtual stages"
            if equal and (layers // p) % self.v:
                return f"{layers // p} layers per stage do not split into v={self.v} chunks"
            if m % p:
                return f"the interleaved schedule needs the micro-batch count ({m}) to be a multiple of p={p}"
        return None


def balanced_stages(times: list[float], p: int) -> tuple[int, ...]:
    """Layer counts of the p contiguous stages of a chain whose slowest is fastest (dynamic programming over the
    layers' seconds)."""
    n = len(times)
    prefix = [0.0]
    for x in times:
        prefix.append(prefix[-1] + x)
    best = {(0, 0): (0.0, ())}
    for k in range(1, p + 1):
        for j in range(k, n - (p - k) + 1):
            best[(k, j)] = min((max(best[(k - 1, i)][0], prefix[j] - prefix[i]), best[(k - 1, i)][1] + (j - i,))
                               for i in range(k - 1, j) if (k - 1, i) in best)
    return best[(p, n)][1]


def play(orders: list[tuple[Pass, ...]], v: int, fwd: float = 1.0, bwd: float = 2.0) -> float:
    """Seconds from the first pass to the last when device r runs orders[r] in turn, a pass starting as soon as its
    input is there (the previous virtual stage's forward, the next one's backward) and messages are free; a stage's
    forward takes `fwd`, its backward `bwd` (a chunk's 1/v of them). ValueError if the orders deadlock."""
    p = len(orders)
    stages, done = p * v, {}
    at, free = [0] * p, [0.0] * p
    while any(at[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while at[r] < len(orders[r]):
                kind, micro, chunk = orders[r][at[r]]
                stage = chunk * p + r
                need = (("F", micro, stage - 1) if stage else None) if kind == "F" else \
                    ("B", micro, stage + 1) if stage < stages - 1 else ("F", micro, stage)
                if need is not None and need not in done:
                    break
                start = max(free[r], done[need] if need else 0.0)
                free[r] = done[(kind, micro, stage)] = start + (fwd if kind == "F" else bwd) / v
                at[r] += 1
                moved = True
        if not moved:
            raise ValueError(f"the pipeline orders deadlock on p={p}, v={v}")
    return max(free)


def parse_schedule(text: str, v: int = 1) -> Schedule:
    """'gpipe', '1f1b', 'interleaved' (with v), or 'interleaved/vN'."""
    name, _, rest = text.strip().lower().partition("/v")
    if rest:
        if not rest.isdecimal():
            raise UsageError(f"bad schedule {text!r}; write e.g. 1f1b or interleaved/v2")
        v = int(rest)
    return Schedule(name, v if name == "interleaved" else 1)
