"""`commcal diff CAL_A CAL_B`: print what changed between two calibrations; with --out, also a figure, HTML and
Markdown; with --check, exit 1 when anything changed beyond its CIs. Given two scan directories, what changed
between the scans (reports.scan_diff); --check then exits 1 on a newly slow node or pair, or a figure B lacks."""

from __future__ import annotations

import argparse
from pathlib import Path

from calib.calibration import load_calibration
from microbench.errors import UsageError
from microbench.scanfile import read_scan
from reports import diff, scan_diff
from reports.document import Document, Note, Section, Text
from reports.output import output_dir
from reports.plotting import save_figure
from reports.render import write_pages


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cal_a", metavar="CAL_A", help="the earlier (reference) calibration JSON, or scan directory")
    parser.add_argument("cal_b", metavar="CAL_B", help="the later calibration JSON, or scan directory")
    parser.add_argument("--out", metavar="DIR", help="also write diff.html, diff.md and figures/diff.png/.svg here")
    parser.add_argument("--check", action="store_true", help="exit 1 if any parameter changed beyond its 95%% CIs (scans: if a node or "
                        "pair is newly slow, or B lacks a usable figure)")


def _text_table(table) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(table.columns, *table.rows)]
    line = lambda row: "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([line(table.columns), line(["-" * w for w in widths]), *map(line, table.rows)])


def document(cal_a, cal_b, items: list[diff.Change], out: Path) -> Document:
    a, b = cal_a.result, cal_b.result
    changed = [c for c in items if c.significant]
    blocks = [Text(f"A: {cal_a.path} (created {a.created_utc}); B: {cal_b.path} (created {b.created_utc})."),
              Note(f"{len(changed)} of {len(items)} parameters changed beyond their 95% CIs: "
                   + ", ".join(f"{c.subject} {c.parameter}" for c in changed), "warning") if changed
              else Note("No parameter changed beyond its 95% CIs.")]
    if a.machines() != b.machines():
        blocks.append(Note(f"A was measured on {sorted(a.machines()) or 'unknown'}, B on "
                           f"{sorted(b.machines()) or 'unknown'}: not the same machine.", "warning"))
    blocks += [diff.table(items),
               save_figure(diff.figure(items), out, "diff", "Relative change per parameter",
                           "Relative change of each model's alpha and bandwidth (and GEMM rate) from A to B; red bars "
                           "changed beyond the 95% CIs, the grey band is A's own CI.")]
    return Document("commcal calibration diff", f"{cal_a.path} → {cal_b.path}",
                    (Section("diff", "What changed", tuple(blocks)),))


DIFF_FILES = ("diff.html", "diff.md")


def write(doc: Document, out: Path) -> None:
    """DIFF_FILES, each written atomically, and a line saying so."""
    html, md = write_pages(doc, out, DIFF_FILES)
    print(f"wrote {html} and {md}")


def run_scans(args: argparse.Namespace) -> int:
    """Two scans: per pair bandwidth and latency ratio, and what became slow (or stopped being)."""
    a, b = read_scan(args.cal_a), read_scan(args.cal_b)
    d = scan_diff.compare(a, b)
    table = scan_diff.table(d)
    print(_text_table(table))
    lines = scan_diff.summary(d)
    print("\n" + "\n".join(lines))
    if args.out is not None:
        out = output_dir(args.out, [args.cal_a, args.cal_b], DIFF_FILES)
        doc = Document("commcal scan diff", f"{a.path} → {b.path}", (Section("diff", "What changed", (
            Note("; ".join(lines), "warning" if d.worse else "note"), table)),))
        write(doc, out)
    return 1 if args.check and d.worse else 0


def run(args: argparse.Namespace) -> int:
    scans = [(Path(p) / "scan.json").is_file() for p in (args.cal_a, args.cal_b)]
    if any(scans):
        if not all(scans):
            raise UsageError(f"cannot compare a scan with a calibration ({args.cal_a}, {args.cal_b})")
        return run_scans(args)
    cal_a, cal_b = load_calibration(args.cal_a), load_calibration(args.cal_b)
    if cal_a.backend != cal_b.backend:
        raise UsageError(f"cannot compare backend {cal_a.backend!r} ({args.cal_a}) with {cal_b.backend!r} "
                         f"({args.cal_b})")
    items = diff.changes(cal_a.result, cal_b.result)
    print(_text_table(diff.table(items)))
    changed = sum(c.significant for c in items)
    print(f"\n{changed} of {len(items)} parameters changed beyond their 95% CIs")
    if args.out is not None:
        out = output_dir(args.out, [args.cal_a, args.cal_b], DIFF_FILES)
        doc = document(cal_a, cal_b, items, out)
        write(doc, out)
    return 1 if args.check and changed else 0
