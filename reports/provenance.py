"""Where the numbers came from: each run's run.json, flattened into readable tables, and the report's own versions."""

from __future__ import annotations

import datetime as dt
import platform
from importlib import metadata

from reports.document import Table

ENV_KEYS = ("env", "environment")
"""run.json members holding environment variables; shown in a table of their own."""
SKIP = ("schema", "version", "layout")
"""run.json members not shown: the format's own tag, and the per-rank host list (ranks_per_node says it shorter)."""


def flatten(obj, prefix: str = "") -> dict[str, str]:
    """{'mpi': {'library': 'Open MPI'}} -> {'mpi.library': 'Open MPI'}; lists of scalars joined by commas."""
    if isinstance(obj, dict):
        out: dict[str, str] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, list) and all(not isinstance(v, (dict, list)) for v in obj):
        return {prefix[:-1]: ", ".join(map(str, obj))}
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: str(obj)}


GLANCE = (("machine", ("machine",)), ("hosts", ("hosts",)), ("ranks", ("world_size",)),
          ("MPI library", ("mpi_library_version", "mpi_library")), ("mpi4py", ("versions.mpi4py",)),
          ("backend", ("backend",)), ("started", ("start_time", "started_utc", "date")))
"""The columns of the one-line-per-run summary, each from the first run.json key (flattened) that is present."""


def glance(runs: list[tuple[str, dict]]) -> Table:
    """One row per run: where, with what MPI, when; the MPI library's first clause only (its banner is long)."""
    rows = []
    for name, meta in runs:
        flat = flatten(meta)
        cells = [next((flat[k] for k in keys if k in flat), "unknown") for _, keys in GLANCE]
        cells[3] = cells[3].split(",")[0]
        rows.append((name, *cells))
    return Table("Runs at a glance", ("run", *(c for c, _ in GLANCE)), tuple(rows))


def run_tables(name: str, meta: dict) -> list[Table]:
    """One key/value table of the run's provenance, and one of its recorded environment if it has one."""
    body = {k: v for k, v in meta.items() if k not in ENV_KEYS and k not in SKIP}
    tables = [Table(f"Run {name}", ("field", "value"), tuple(flatten(body).items()), folded=True)]
    for key in ENV_KEYS:
        if isinstance(meta.get(key), dict) and meta[key]:
            tables.append(Table(f"Run {name}: environment", ("variable", "value"),
                                tuple(flatten(meta[key]).items()), folded=True))
    return tables


def report_versions() -> Table:
    """The software that drew this report, and when."""
    rows = [("date", dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
            ("host", platform.node()), ("python", platform.python_version())]
    for dist in ("commcal", "numpy", "pandas", "matplotlib"):
        try:
            rows.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            rows.append((dist, "not installed"))
    return Table("This report", ("field", "value"), tuple(rows))
