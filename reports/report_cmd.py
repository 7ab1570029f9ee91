"""`commcal report`: figures plus one HTML page and one Markdown file from runs, a calibration and a validation."""

from __future__ import annotations

import argparse
from pathlib import Path

from microbench.errors import UsageError
from calib.calibration import load_calibration
from microbench.scanfile import read_scan
from reports import calibration_view, measurements, provenance, scan_view, validation_view
from reports.document import Document, Section
from reports.output import output_dir
from reports.render import write_pages
from reports.runs import load_runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", action="append", default=[], metavar="DIR",
                        help="a sweep run directory (repeatable)")
    parser.add_argument("--calibration", action="append", default=[], metavar="CAL",
                        help="a calibration JSON from `commcal fit`")
    parser.add_argument("--validation", action="append", default=[], metavar="DIR",
                        help="a validation directory from `commcal validate`")
    parser.add_argument("--scan", action="append", default=[], metavar="DIR",
                        help="a scan directory from `commcal scan` (a --run DIR holding a scan counts as this)")
    parser.add_argument("--out", required=True, metavar="REPORT_DIR", help="where report.html, report.md and figures/ go")
    parser.add_argument("--title", default="commcal report", help="the report's title")


def build(runs_dirs: list[str], cal_path: str | None, validation_dir: str | None, out: Path,
          title: str = "commcal report", scan_dir: str | None = None) -> Document:
    """Read every input (failing fast on corrupt ones), draw the figures under `out`, return the document."""
    scans = [d for d in runs_dirs if (Path(d) / "scan.json").is_file() and not (Path(d) / "run.json").exists()]
    runs_dirs = [d for d in runs_dirs if d not in scans]
    if scan_dir and scans or len(scans) > 1:
        raise UsageError("one scan per report: give one --scan DIR")
    scan_dir = scan_dir or (scans[0] if scans else None)
    if not (runs_dirs or cal_path or validation_dir or scan_dir):
        raise UsageError("nothing to report: give --run DIR, --calibration CAL, --validation DIR and/or --scan DIR")
    runs = load_runs(runs_dirs) if runs_dirs else None
    cal = load_calibration(cal_path) if cal_path else None
    val = validation_view.load_validation(validation_dir) if validation_dir else None
    scan = read_scan(scan_dir) if scan_dir else None
    prov = [provenance.report_versions()]
    if runs is not None:
        prov.insert(0, provenance.glance([(run.path.name, run.meta) for run in runs.runs]))
        for run in runs.runs:
            prov += provenance.run_tables(run.path.name, run.meta)
    # results first; the full provenance (folded in HTML) closes the report
    if scan is not None:
        prov += provenance.run_tables(scan.path.name, scan.meta)
    sections = [calibration_view.section(cal, out), measurements.section(runs, cal, out),
                validation_view.section(val, out)] if runs or cal or val else []
    if scan is not None:
        sections.append(scan_view.section(scan, out))
    sections.append(Section("provenance", "Provenance", tuple(prov)))
    inputs = ", ".join([*(f"run {d}" for d in runs_dirs), *([f"calibration {cal_path}"] if cal_path else []),
                        *([f"validation {validation_dir}"] if validation_dir else []),
                        *([f"scan {scan_dir}"] if scan_dir else [])])
    return Document(title, f"Built from {inputs}.", tuple(sections))


REPORT_FILES = ("report.html", "report.md")
"""The page (figures embedded) and its Markdown (figures beside it)."""


def write(doc: Document, out: Path) -> tuple[Path, Path]:
    """REPORT_FILES, each written atomically."""
    return write_pages(doc, out, REPORT_FILES)


def _one(given: list[str], option: str) -> str | None:
    """The one value of an option a report takes once (argparse would keep the last silently)."""
    if len(given) > 1:
        raise UsageError(f"one {option.split()[0][2:]} per report: give {option} once, not {len(given)} times")
    return given[0] if given else None


def run(args: argparse.Namespace) -> int:
    out = output_dir(args.out, [*args.run, *args.calibration, *args.validation, *args.scan],
                     REPORT_FILES)
    runs = [Path(r).resolve() for r in args.run]
    if len(set(runs)) < len(runs):
        raise UsageError("--run: the same run directory given twice")
    doc = build(args.run, _one(args.calibration, "--calibration CAL"), _one(args.validation, "--validation DIR"), out,
                args.title, _one(args.scan, "--scan DIR"))
    html, md = write(doc, out)
    print(f"wrote {html} and {md}")
    return 0
