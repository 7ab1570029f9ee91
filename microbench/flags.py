"""Flags that more than one subcommand takes, defined once: the stopping rule's (--target-ci, --min-samples,
--rounds), --quick with its presets, and --backend. They sit here, at the bottom of the house, so that sweep
(microbench), fit (calib) and validate (analysis) can all import them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from microbench.backends import BACKENDS
from microbench.errors import UsageError
from microbench.limits import MAX_ROUNDS, MAX_SAMPLES, MAX_SECONDS


@dataclass(frozen=True)
class Presets:
    """A subcommand's defaults and its --quick preset (which may leave some flags at their defaults). A flag given
    on the command line wins, then the preset with --quick, then the default."""

    defaults: dict[str, Any]
    quick: dict[str, Any]

    def pick(self, args: argparse.Namespace, name: str) -> Any:
        value = getattr(args, name)
        if value is not None:
            return value
        return (self.quick if args.quick else self.defaults).get(name, self.defaults[name])

    def say(self, name: str) -> str:
        """'default X; quick Y' for a flag's help ('default X' where the preset keeps the default)."""
        default, quick = self.defaults[name], self.quick.get(name, self.defaults[name])
        return f"default {default}" + (f"; quick {quick}" if quick != default else "")


def add_quick_argument(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--quick", action="store_true", help=help)


def add_stop_arguments(p: argparse.ArgumentParser, presets: Presets, unit: str, rounds_help: str) -> None:
    """--target-ci and --min-samples of the stopping rule for each `unit` timed, and --rounds: `rounds_help` says
    what a round is and why; the defaults come from `presets`."""
    p.add_argument("--target-ci", type=float,
                   help=f"stop when the median's 95%% CI is within +-this ({presets.say('target_ci')})")
    p.add_argument("--min-samples", type=int,
                   help=f"timed iterations before the CI may stop {unit} ({presets.say('min_samples')})")
    p.add_argument("--rounds", type=int, help=f"{rounds_help} ({presets.say('rounds')})")


def check_stop_bounds(min_samples: int, budget_s: float, rounds: int, retries: int = 0, budget: str = "--point-budget"):
    """One UsageError line for a stopping rule or pass count past what any run means (limits.py): a plan of a
    billion rounds would fill memory, a budget of 1e308 s overflow the estimate's clock."""
    bad = [f"{name} at most {most:g}" for name, value, most in (
        ("--min-samples", min_samples, MAX_SAMPLES), (budget, budget_s, MAX_SECONDS), ("--rounds", rounds, MAX_ROUNDS),
        ("--retries", retries, MAX_ROUNDS)) if value > most]
    if bad:
        raise UsageError(f"give {' and '.join(bad)}")


BACKEND_HELP = "mpi: host (numpy) buffers; mpi-cuda: cupy buffers to a CUDA-aware MPI; nccl: cupy NCCL"


def add_backend_argument(p: argparse.ArgumentParser, help: str = BACKEND_HELP, default: str | None = "mpi") -> None:
    p.add_argument("--backend", choices=tuple(BACKENDS), default=default, help=help)
