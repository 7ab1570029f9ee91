"""commcal import of the real peer logs of tests/data/peers, damaged the ways a user's copy can be: cut short, a header
without rows or rows without a header, two runs' output in one file, columns lost or added, numbers as text, NaN,
inf, negative, zero, tiny or huge, sizes shuffled or repeated, Windows line endings, bytes that are not UTF-8, an
empty, binary or directory "log", and nccl-tests JSON of the wrong types. Each is read (exit 0, a run directory) or
refused in one line naming the file and line (exit 2), never a traceback or a numpy warning; a refused import
leaves no run directory, nor its hidden staging directory."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from conftest import run_main

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

PEERS = Path(__file__).parent / "data" / "peers"
LATENCY, ALLREDUCE = PEERS / "osu-7.5" / "osu_latency.txt", PEERS / "osu-7.5" / "osu_allreduce.txt"
IMB = PEERS / "imb-2021.11" / "imb-mpi1-2ranks.txt"
NCCL = PEERS / "nccl-tests-synthetic" / "all_reduce_perf-1node-2ranks.txt"
NCCL_JSON = PEERS / "nccl-tests-synthetic" / "sendrecv_perf-2nodes-I.json"
BANDWIDTH = PEERS / "osu-7.5" / "osu_bw.txt"
FLAGS = {LATENCY: ["--link", "intra"], BANDWIDTH: ["--link", "intra"], ALLREDUCE: ["--link", "intra", "--procs", "2"],
         IMB: ["--link", "intra"], NCCL: [], NCCL_JSON: []}


@dataclass(frozen=True)
class Case:
    """One damaged copy of `log`: `damage` maps its text to the copy's content (None: a directory in its place);
    `says` is in the one error line, or None where the copy is still a log to import."""

    log: Path
    damage: Callable[[str], str | bytes | None]
    says: str | None


def rows(change: Callable[[list[str]], list[str]]) -> Callable[[str], str]:
    """Apply `change` to the table rows (the lines that start with a digit), keeping every other line in place."""
    def damage(text: str) -> str:
        lines = text.split("\n")
        at = [i for i, line in enumerate(lines) if line.strip()[:1].isdigit()]
        for i, row in zip(at, change([lines[i] for i in at])):
            lines[i] = row
        return "\n".join(line for line in lines if line is not None)
    return damage


def cell(column: int, value: str, first_only: bool = True) -> Callable[[str], str]:
    """Set one column of the first row (or of every row) to `value`."""
    def change(table: list[str]) -> list[str]:
        return [" ".join(row.split()[:column] + [value] + row.split()[column + 1:]) if k == 0 or not first_only
                else row for k, row in enumerate(table)]
    return rows(change)


def json_set(*keys, value) -> Callable[[str], str]:
    """The JSON log with doc[k0][k1]... set to `value`."""
    def damage(text: str) -> str:
        doc = json.loads(text)
        inner = doc
        for k in keys[:-1]:
            inner = inner[k]
        inner[keys[-1]] = value
        return json.dumps(doc)
    return damage


CASES = {
    # cut short, headers and rows apart
    "cut mid-line": Case(LATENCY, lambda t: t[:len(t) // 2], "expected 2 columns"),
    "header without rows": Case(LATENCY, rows(lambda r: [None] * len(r)), "no measurements under its title"),
    "rows without a header": Case(LATENCY, lambda t: t.replace("# Size", "#"), "no measurements under its title"),
    "rows alone": Case(LATENCY, lambda t: "\n".join(x for x in t.split("\n") if x[:1].isdigit()), "not a log"),
    "IMB cut mid-table": Case(IMB, lambda t: t[:t.index("524288") + 20], "expected 4 columns"),
    "nccl-tests cut mid-row": Case(NCCL, lambda t: t[:t.index("9.54")], "expected 13 columns"),
    # two runs in one file
    "two OSU tests": Case(LATENCY, lambda t: t + ALLREDUCE.read_text(), "a second run's output (OSU) after the OSU"),
    "IMB then OSU": Case(IMB, lambda t: t + LATENCY.read_text(), "(OSU) after the IMB-MPI1 one"),
    "OSU then nccl-tests": Case(LATENCY, lambda t: t + NCCL.read_text(), "(nccl-tests) after the OSU one"),
    "two nccl-tests runs": Case(NCCL, lambda t: t + t, "a second run's output (nccl-tests)"),
    "JSON then OSU": Case(NCCL_JSON, lambda t: t + LATENCY.read_text(), "truncated or corrupt nccl-tests JSON"),
    # columns
    "a column lost": Case(ALLREDUCE, rows(lambda r: [" ".join(x.split()[:-1]) for x in r]), "expected 5 columns"),
    "a column added": Case(LATENCY, rows(lambda r: [x + "  7" for x in r]), "expected 2 columns"),
    "OSU header misnamed": Case(LATENCY, lambda t: t.replace("# Size ", "# Sizes"), "lacks a Size column"),
    "IMB header misnamed": Case(IMB, lambda t: t.replace("#bytes", "#bytesX"), "lacks a #bytes"),
    "IMB a column added": Case(IMB, rows(lambda r: [x + "  7" for x in r]), "expected 4 columns"),
    "nccl-tests columns lost": Case(NCCL, rows(lambda r: [" ".join(x.split()[:9]) for x in r]), "expected 13"),
    # numbers
    "time as text": Case(LATENCY, cell(1, "abc"), "'abc' is not a number"),
    "time NaN": Case(LATENCY, cell(1, "NaN"), "'NaN' is not a finite number > 0"),
    "time inf": Case(ALLREDUCE, cell(3, "inf"), "'inf' is not a finite number > 0"),
    "time negative": Case(IMB, cell(3, "-3.5", first_only=False), "'-3.5' is not a finite number > 0"),
    "time zero": Case(NCCL, cell(5, "0"), "a time outside 1e-12 to 1e+06 s"),
    "time 1e308": Case(LATENCY, cell(1, "1e308"), "a time outside"),
    "time below a picosecond": Case(LATENCY, cell(1, "1e-300"), "a time outside 1e-12"),
    "time a huge integer": Case(NCCL, cell(5, "9" * 40), "a time outside"),
    "bandwidth a huge integer": Case(BANDWIDTH, cell(1, "9" * 40), "a time outside 1e-12"),
    "size 0": Case(LATENCY, cell(0, "0"), None),
    "size negative": Case(IMB, cell(0, "-8"), "'-8' is not a whole number"),
    "size fractional": Case(NCCL, cell(0, "8.5"), "'8.5' is not a whole number"),
    "size huge": Case(LATENCY, cell(0, "9" * 30), "is too large"),
    "sizes out of order": Case(LATENCY, rows(lambda r: r[::-1]), None),
    "a size repeated": Case(NCCL, rows(lambda r: r[:1] * 2 + r[2:]), "measures nccl-allreduce-intra-p2-1024B"),
    "#wrong 1e30": Case(NCCL, cell(8, "1e30"), "#wrong '1e30' is not a whole number"),
    "#wrong huge": Case(NCCL, cell(8, "9" * 30), "#wrong 999999999999999999999999999999 is too large"),
    "IMB additional processes huge": Case(IMB, lambda t: t.replace(
        "#processes = 2", f"#processes = 2\n# ( {2 ** 62} additional processes waiting", 1), f"a job of {2 ** 62 + 2}"),
    # bytes
    "Windows line endings": Case(NCCL, lambda t: t.replace("\n", "\r\n"), None),
    "not UTF-8 in a comment": Case(IMB, lambda t: t.encode().replace(b"#---", b"#\xff\xfe-", 1), None),
    "a very long comment line": Case(LATENCY, lambda t: "#" + "x" * 2_000_000 + "\n" + t, None),
    "empty": Case(LATENCY, lambda t: "", "not a log commcal can import"),
    "binary": Case(LATENCY, lambda t: bytes(range(256)) * 64, "not a log commcal can import"),
    "UTF-16": Case(LATENCY, lambda t: t.encode("utf-16"), "not a log commcal can import"),
    "a directory": Case(LATENCY, lambda t: None, "cannot read"),
    # nccl-tests JSON of the wrong types
    "JSON results a number": Case(NCCL_JSON, json_set("results", value=5), "'results' is not a list"),
    "JSON args a number": Case(NCCL_JSON, json_set("args", value=5), "'args' is not a list"),
    "JSON args an object": Case(NCCL_JSON, json_set("args", value={"./all_reduce_perf": 1}), "'args' is not a list"),
    "JSON a result a list": Case(NCCL_JSON, json_set("results", 0, value=[1]), "results[0] has no out_of_place"),
    "JSON time a huge integer": Case(NCCL_JSON, json_set("results", 0, "out_of_place", "time", value=10 ** 400),
                                     "lacks a numeric size or a out_of_place.time above 0"),
    "JSON time NaN": Case(NCCL_JSON, lambda t: t.replace('"time":8.094020042909168', '"time":NaN', 1),
                          "out_of_place.time above 0"),
    "JSON iteration times huge": Case(NCCL_JSON, json_set("results", 0, "out_of_place_per_iter", "times_us",
                                                          value=[10 ** 400]), "times_us is not a list of times"),
    "JSON iteration times tiny": Case(NCCL_JSON, json_set("results", 0, "out_of_place_per_iter", "times_us",
                                                          value=[1e-300]), "a time outside 1e-12"),
    "JSON nwrong NaN": Case(NCCL_JSON, lambda t: t.replace('"nwrong":0.0', '"nwrong":NaN', 1), "nwrong nan is not a"),
    "JSON nwrong 1e300": Case(NCCL_JSON, json_set("results", 0, "out_of_place", "nwrong", value=1e300),
                              "nwrong 1e+300 is not a count"),
    "JSON nwrong text": Case(NCCL_JSON, json_set("results", 0, "out_of_place", "nwrong", value="5"), "not a count"),
    "JSON nwrong negative": Case(NCCL_JSON, json_set("results", 0, "out_of_place", "nwrong", value=-5),
                                 "not a count"),
    "JSON a device without host": Case(NCCL_JSON, json_set("config", "devices", value=[{"rank": 0}, {"rank": 1}]),
                                       "objects with a whole rank and a hostname"),
    "JSON a rank twice": Case(NCCL_JSON, json_set("config", "devices", 1, "rank", value=0), "gives ranks [0, 0]"),
    "JSON size 0": Case(NCCL_JSON, json_set("results", 0, "size", value=0), None),
    "JSON nested deep": Case(NCCL_JSON, lambda t: '{"results": ' + "[" * 100000 + "]" * 100000 + "}",
                             "truncated or corrupt nccl-tests JSON"),
}


def write(path: Path, content: str | bytes | None) -> None:
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def left_behind(tmp_path: Path) -> list[str]:
    """What an import left beside its log (peer.log): any run directory, staging directory or stray file."""
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "peer.log")


CLEAN: dict[Path, set[tuple[str, float]]] = {}


def imported(capsys, log: Path, out: Path, flags: list[str]) -> set[tuple[str, float]]:
    """The (point_id, median_s) pairs `commcal import` of `log` writes into `out` (asserting it exits 0)."""
    code, _, err = run_main(capsys, ["import", str(log), "--out", str(out), *flags])
    assert code == 0 and err == "", err
    summary = pd.read_parquet(out / "summary.parquet")
    return set(zip(summary.point_id, summary.median_s))


def clean(capsys, tmp_path: Path, log: Path) -> set[tuple[str, float]]:
    """What the undamaged `log` imports as (once per log and session)."""
    if log not in CLEAN:
        CLEAN[log] = imported(capsys, log, tmp_path / "clean", FLAGS[log])
    return CLEAN[log]


NO_LINE = {"a directory", "empty", "binary", "UTF-16"}
"""Cases refused before any line is read: the file as a whole (the JSON reader's errors name a field instead)."""


@pytest.mark.parametrize("name", CASES)
def test_damaged_logs_are_read_or_refused_in_one_line(capsys, tmp_path, name):
    case = CASES[name]
    log = tmp_path / "peer.log"
    write(log, case.damage(case.log.read_text()))
    code, stdout, err = run_main(capsys, ["import", str(log), "--out", str(tmp_path / "out"), *FLAGS[case.log]])
    if case.says is None:
        assert code == 0 and err == "" and (tmp_path / "out" / "run.json").is_file(), err
        # the points of the clean log, at most the one a damage made unreadable (a size of 0) left out
        got, want = imported(capsys, log, tmp_path / "again", FLAGS[case.log]), clean(capsys, tmp_path, case.log)
        assert got <= want and len(got) >= len(want) - 1, sorted(want - got)
        return
    assert code == 2 and stdout == "" and err.count("\n") == 1, err
    assert f"{log}:" in err and case.says in err, err
    if name not in NO_LINE and case.log != NCCL_JSON:
        assert re.match(rf"commcal: error: {re.escape(str(log))}:[1-9]\d*: ", err), err
    assert left_behind(tmp_path) == [], left_behind(tmp_path)


def test_an_import_that_fails_while_writing_leaves_no_directory(capsys, tmp_path, monkeypatch):
    """A disk that fills while the run is written (here: its summary.parquet) is one line naming --out, not the hidden
    staging directory, and neither stays, nor the parents made for a new --out: the run appears at --out whole or not
    at all. An existing empty --out is written in place and left as it was found: there, empty, its mode kept."""
    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    out = tmp_path / "out"
    code, stdout, err = run_main(capsys, ["import", str(LATENCY), "--out", str(out), "--link", "intra"])
    assert code == 2 and err.count("\n") == 1 and "No space left on device" in err, err
    assert f"--out {out}: cannot write the run directory (summary.parquet" in err and ".out." not in err, err
    assert left_behind(tmp_path) == []
    nested = tmp_path / "new" / "parents" / "out"
    code, stdout, err = run_main(capsys, ["import", str(LATENCY), "--out", str(nested), "--link", "intra"])
    assert code == 2 and f"--out {nested}: cannot write the run directory" in err, err
    assert left_behind(tmp_path) == [], "the parents made for a new --out stay only with the run"
    out.mkdir(mode=0o750)
    code, stdout, err = run_main(capsys, ["import", str(LATENCY), "--out", str(out), "--link", "intra"])
    assert code == 2 and f"--out {out}: cannot write the run directory" in err, err
    assert left_behind(tmp_path) == ["out"] and list(out.iterdir()) == [] and out.stat().st_mode & 0o777 == 0o750
    monkeypatch.undo()
    code, _, err = run_main(capsys, ["import", str(LATENCY), "--out", str(out), "--link", "intra"])
    assert code == 0 and (out / "summary.parquet").is_file() and out.stat().st_mode & 0o777 == 0o750, err


def test_a_damaged_log_still_read_fits_and_reports_without_warnings(capsys, tmp_path, laid_out_only):
    """A log read despite its damage (Windows line endings, rows shuffled, a 0-byte row, bytes not UTF-8 in a comment)
    gives the run the clean log gives: fit and report read it without a warning about it."""
    damaged = rows(lambda r: [r[0].replace("8 ", "0 ", 1)] + r[1:][::-1])(LATENCY.read_text())
    log = tmp_path / "peer.log"
    log.write_bytes(("# \udcff\n" + damaged).encode("utf-8", "surrogateescape").replace(b"\n", b"\r\n"))
    run = tmp_path / "out"
    assert run_main(capsys, ["import", str(log), "--out", str(run), "--link", "intra"])[0] == 0
    code, _, err = run_main(capsys, ["fit", str(run), "--out", str(tmp_path / "cal.json"), "--quiet"])
    assert code == 0 and str(run) not in err, err
    code, _, err = run_main(capsys, ["report", "--run", str(run), "--calibration", str(tmp_path / "cal.json"),
                                     "--out", str(tmp_path / "report")])
    assert code == 0 and err == "", err
