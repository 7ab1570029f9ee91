"""Peer benchmark logs (nccl-tests, OSU Micro-Benchmarks, IMB-MPI1) read by content into PeerLog values, which
calib.peers.rundir turns into a commcal run directory. Pure: no MPI."""

from __future__ import annotations

from pathlib import Path

from calib.peers import imb, nccl_tests, osu
from calib.peers.model import Job, PeerLog, fail
from microbench.jsonfile import input_path
from microbench.limits import MAX_FILE_BYTES

READERS = (nccl_tests.read_json, nccl_tests.read_text, osu.read_text, imb.read_text)
"""Each returns None when the text is not its peer's, a PeerLog when it is, and raises (file:line) when it is its
peer's but malformed."""
STARTS = {"nccl-tests": nccl_tests.START, "OSU": osu.TITLE, "IMB-MPI1": imb.BANNER}
"""The line each peer's text output begins with, once per run: one log file holds one run."""


def one_run(path: Path, text: str) -> None:
    """The one-line error where `text` holds the output of two runs (two tools' or two tests' logs concatenated),
    which a reader would read as one: the second's rows under the first's header, or the first's rows lost."""
    starts = [(i, peer) for i, line in enumerate(text.splitlines(), 1) for peer, start in STARTS.items()
              if start.search(line.strip())]
    if len(starts) > 1:
        (_, first), (at, second) = starts[:2]
        raise fail(path, at, f"a second run's output ({second}) after the {first} one: give each run's log as its "
                             "own file")


def read_log(path: str | Path, job: Job = Job()) -> PeerLog:
    """The log at `path`, whichever peer wrote it; UsageError (one line naming the file and line) otherwise.
    `job`: what the caller knows of the job that the log may not say."""
    path = input_path(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise fail(path, 0, f"cannot read ({exc.strerror or exc})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise fail(path, 0, f"more than {MAX_FILE_BYTES >> 20} MiB: not a benchmark's log")
    text = raw.decode("utf-8", errors="replace")
    one_run(path, text)
    for reader in READERS:
        log = reader(path, text, job)
        if log is not None:
            return log
    first = next((i for i, line in enumerate(text.splitlines(), 1) if line.strip()), 1)
    raise fail(path, first, "not a log commcal can import (nccl-tests text or -J JSON, OSU Micro-Benchmarks, "
                            "IMB-MPI1)")
