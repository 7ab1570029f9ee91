"""Pipeline schedules as numbers: how long the bubble is, how many micro-batches' activations a stage holds at
its peak, how many point-to-point messages cross the critical path, and what a schedule needs of p and m. Pure.

GPipe runs every forward, then every backward: the bubble is p-1 micro-batch slots and the first stage holds all
m micro-batches. 1F1B (PipeDream-flush) keeps the same bubble but holds at most p. Interleaved 1F1B gives each
device v chunks of layers, cutting the bubble to (p-1)/v slots for v times the messages, and holds
p (1 + (p-1)/(p v)) micro-batches' worth of a stage (Narayanan et al. 2021; Korthikanti et al. 2022, sec. 4.2.3)."""

from __future__ import annotations

from dataclasses import dataclass

from microbench.errors import UsageError

SCHEDULES = ("gpipe", "1f1b", "interleaved")


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

    def problem(self, p: int, m: int, layers: int) -> str | None:
        """Why the schedule cannot run p stages of `layers` layers with m micro-batches, or None."""
        if layers % p:
            return f"{layers} layers do not split into {p} equal pipeline stages"
        if self.name == "interleaved":
            if p == 1:
                return "the interleaved schedule needs pipeline parallelism (p > 1)"
            if self.v < 2:
                return "the interleaved schedule needs v >= 2 virtual stages"
            if (layers // p) % self.v:
                return f"{layers // p} layers per stage do not split into v={self.v} chunks"
            if m % p:
                return f"the interleaved schedule needs the micro-batch count ({m}) to be a multiple of p={p}"
        return None


def parse_schedule(text: str, v: int = 1) -> Schedule:
    """'gpipe', '1f1b', 'interleaved' (with v), or 'interleaved/vN'."""
    name, _, rest = text.strip().lower().partition("/v")
    if rest:
        if not rest.isdigit():
            raise UsageError(f"bad schedule {text!r}; write e.g. 1f1b or interleaved/v2")
        v = int(rest)
    return Schedule(name, v if name == "interleaved" else 1)
