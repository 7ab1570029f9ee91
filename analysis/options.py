"""What the analysis subcommands (search, predict, validate) share: the mesh flags, --strict and its warnings
about link classes priced by another's models, and how times and sizes print."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from analysis.pricing import Fallback
from microbench.errors import UsageError
from microbench.limits import MAX_BYTES
from microbench.ops import OPS
from microbench.provenance import STEAL_WARN
from microbench.sizes import parse_size


@dataclass(frozen=True)
class Form:
    """One form of a command (e.g. predict's collective): the flags it needs, the others it reads that some other form
    does not, and defaults for those of them argparse leaves None (so that giving one is seen). Flags are dests."""

    what: str
    needs: tuple[str, ...]
    reads: tuple[str, ...] = ()
    defaults: tuple[tuple[str, object], ...] = ()

    def label(self) -> str:
        return f"{self.what} ({_flags(self.needs)})"


def form_of(args: argparse.Namespace, command: str, forms: tuple[Form, ...]) -> Form:
    """The first form chosen by a flag it needs that no other form reads, its defaults filled in; one UsageError line
    where no form is chosen, a flag it needs is missing, or a flag only other forms read is given (never ignored)."""
    given = [d for d in dict.fromkeys(d for f in forms for d in f.needs + f.reads)
             if getattr(args, d) is not None and getattr(args, d) is not False]     # 0 is given, False is not
    form = next((f for f in forms if any(d in given and not any(d in g.needs + g.reads for g in forms if g is not f)
                                         for d in f.needs)), None)
    if form is None:
        raise UsageError(f"{command} needs " + " or ".join(f"{_flags(f.needs)} ({f.what})" for f in forms))
    foreign = [d for d in given if d not in form.needs + form.reads]
    if foreign:
        owners = [f.label() for f in forms if set(foreign) & set(f.needs + f.reads)]
        raise UsageError(f"{_flags(foreign)} {'is' if len(foreign) == 1 else 'are'} for {' or '.join(owners)}, "
                         f"not {form.label()}")
    missing = [d for d in form.needs if d not in given]
    if missing:
        raise UsageError(f"{command} needs {_flags(missing)} for {form.label()}")
    for dest, value in form.defaults:
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    return form


def _flags(dests) -> str:
    return ", ".join(f"--{d.replace('_', '-')}" for d in dests)


def size_option(flag: str, text: str) -> int:
    """parse_size's bytes, its one error line naming the option; a negative size is refused as not positive, as 0 is
    (not as malformed)."""
    text = text.strip()
    try:
        size = parse_size(text.removeprefix("-"))
    except UsageError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    if text.startswith("-"):
        raise UsageError(f"{flag}: size {text!r} must be a positive whole number of bytes, at most {MAX_BYTES}")
    return size


def add_mesh_arguments(p, mesh_help: str, required: bool, training: bool = False) -> None:
    """--mesh and how its ranks sit on nodes, and the element type: the device mesh a strategy is priced on.
    `training`: the command also prices training steps, so --dtype takes half precision and defaults to None (a
    layer mesh then uses float32, a training step the calibration's fastest GEMM dtype)."""
    p.add_argument("--mesh", required=required, default=None, help=mesh_help)
    p.add_argument("--ranks-per-node", type=int, default=None, help="ranks per node (default: the last axis's size)")
    p.add_argument("--devices", type=int, default=None, help="device count the mesh must match")
    add_nics_argument(p)
    add_dtype_argument(p, training)


def add_dtype_argument(p, training: bool = False) -> None:
    """--dtype; with `training` any GEMM element type (host or device) and no default: a layer mesh then uses float32,
    a training step the calibration's fastest GEMM dtype."""
    if training:
        gemm = OPS["gemm"]
        p.add_argument("--dtype", default=None, choices=tuple(dict.fromkeys(gemm.dtypes + (gemm.device_dtypes or ()))),
                       help="element type (prices GEMMs; default float32 for --mesh, the calibration's fastest GEMM "
                            "dtype for a training step)")
    else:
        p.add_argument("--dtype", default="float32", choices=OPS["gemm"].dtypes, help="element type (prices GEMMs)")


def add_nics_argument(p) -> None:
    p.add_argument("--nics-per-node", type=int, default=None,
                   help="network links per node shared by concurrent groups of a mesh axis (default 1)")


def nics_per_node(args: argparse.Namespace) -> int:
    """--nics-per-node, 1 where not given (None by default, so that a form that does not read it can refuse it)."""
    if args.nics_per_node is None:
        return 1
    if args.nics_per_node < 1:
        raise UsageError(f"--nics-per-node must be at least 1, not {args.nics_per_node}")
    return args.nics_per_node


def add_json_argument(p) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_strict_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="exit 2 where the calibration lacks the link class a collective needs, instead of saying so "
                        "on stderr and pricing it by another class's models (as infinite where no class has it)")


def report_fallbacks(fallbacks: list[Fallback], calibration: str, strict: bool, say: bool = True) -> list[dict]:
    """The fallbacks as JSON records, after one stderr warning per (wanted, used) pair naming its ops and mesh axes;
    with `strict`, one UsageError line for them all instead. `say`: print the warnings (rank 0 of a job)."""
    pairs: dict[tuple[str, str | None], list[Fallback]] = {}
    for f in fallbacks:
        pairs.setdefault((f.wanted, f.used), []).append(f)
    gaps = {(wanted, used): _gap(wanted, used, group) for (wanted, used), group in pairs.items()}
    if strict and gaps:
        raise UsageError(f"calibration {calibration} has {' and '.join(gaps.values())}; --strict refuses to fall back")
    if say:
        for (_, used), gap in gaps.items():
            then = f"priced by its {used!r} models" if used else "priced infinite"
            print(f"commcal: warning: calibration {calibration} has {gap}; {then}", file=sys.stderr, flush=True)
    return [f.to_dict() for f in fallbacks]


def _gap(wanted: str, used: str | None, group: list[Fallback]) -> str:
    """What the calibration lacks for one (wanted, used) pair, e.g. "no 'inter' model for allgather (mesh axis 0)"."""
    ops = ", ".join(sorted({f.op for f in group}))
    axes = sorted({f.axis for f in group if f.axis is not None})
    where = f"mesh axis {axes[0]}" if len(axes) == 1 else f"mesh axes {', '.join(map(str, axes))}" if axes else ""
    if used is None:
        return f"no model for {ops} on any link class ({f'{where} wants' if where else 'wanted'} {wanted!r})"
    return f"no {wanted!r} model for {ops}" + (f" ({where})" if where else "")


def fmt_s(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.4g} {unit}"
    return f"{s * 1e9:.4g} ns"


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.0f} B"


def add_profile_argument(p) -> None:
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="a compute profile written by `commcal profile`: the kernels it holds are priced by their "
                        "measured time instead of the calibration's GEMM and copy rates")


def load_profile_argument(args):
    """The --profile file read and checked (one UsageError line on any problem), or None."""
    from analysis.kernel_profile import load_profile

    return load_profile(args.profile) if getattr(args, "profile", None) else None


def profile_record(pricer, steps, say: bool = True) -> dict | None:
    """{path, profiled, compute_steps, ranks_per_node, backend, cpu_steal} of the pricer's profile over `steps`
    (None without one), after a stderr warning where it lacks some of their kernels, which the calibration's rates
    then price, one where it timed them on another backend than the calibration's, one where it was measured with
    another number of ranks per node computing at once than the mesh has, and one where a hypervisor took its
    hosts' CPU time."""
    profile = pricer.profile
    if profile is None:
        return None
    hit, total = pricer.profiled(steps)
    if say and hit < total:
        print(f"commcal: warning: profile {profile.path} has {hit} of {total} compute steps' kernels; the "
              f"others are priced by the calibration's GEMM and copy rates (profile these shapes with `commcal "
              f"profile` on the same specs and mesh)", file=sys.stderr, flush=True)
    if say and profile.backend != pricer.cal.backend:
        print(f"commcal: warning: profile {profile.path} timed its kernels with backend {profile.backend!r}, the "
              f"calibration is of {pricer.cal.backend!r}: host and device kernels take different times",
              file=sys.stderr, flush=True)
    here = pricer.mesh.ranks_per_node
    if say and profile.ranks_per_node != here:
        print(f"commcal: warning: profile {profile.path} timed its kernels with {profile.ranks_per_node} rank(s) per "
              f"node computing at once, the mesh has {here}: where ranks share a node's cores and memory, its "
              f"kernels take another time", file=sys.stderr, flush=True)
    stolen = [f"{host} {f:.0%}" for host, f in profile.cpu_steal if f is not None and f > STEAL_WARN]
    if say and stolen:
        print(f"commcal: warning: profile {profile.path} timed its kernels while the hypervisor took CPU time "
              f"(cpu_steal: {', '.join(stolen)}): they are inflated; profile again when the machine is quieter",
              file=sys.stderr, flush=True)
    return {"path": profile.path, "profiled": hit, "compute_steps": total, "ranks_per_node": profile.ranks_per_node,
            "backend": profile.backend, "cpu_steal": dict(profile.cpu_steal)}
