"""Writes that never leave a half-written file and never replace what is not a plain file: a symbolic link is written
through, a device stays a device, the mode is the umask's, and a link loop is one line."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from calib.synthetic import synthetic_calibration
from conftest import run_main
from microbench.atomic import atomic_write_text


def test_a_link_is_written_through_and_kept(tmp_path):
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("old")
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_is_written_to_not_replaced(tmp_path):
    """--out /dev/null: the device takes the bytes and stays a device (a rename over it would delete the machine's
    /dev/null for everyone); tested on a null device made here, not the machine's own."""
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    atomic_write_text(null, "x" * 100)
    assert stat.S_ISCHR(null.stat().st_mode) and not list(tmp_path.glob(".*.tmp"))


def test_a_written_file_has_the_umasks_mode(tmp_path):
    """Calibrations and runs are read by other users of a cluster: 0644 under umask 022, as open() gives."""
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644


@pytest.mark.parametrize("argv", [["fit", "{loop}", "--out", "{tmp}/c.json"],
                                  ["export", "{cal}", "--format", "simai", "--out", "{loop}"],
                                  ["calibration", "from-spec", "selene", "--out", "{loop}"],
                                  ["calibration", "from-spec", "{loop}", "--out", "{tmp}/s.json"]])
def test_a_link_loop_is_one_line(argv, tmp_path, capsys):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(synthetic_calibration({("allreduce", "intra"): (5e-6, 1e-10)})))
    fill = {"{loop}": str(tmp_path / "loop1"), "{cal}": str(cal)}
    code, _, err = run_main(capsys, [fill.get(a, a.replace("{tmp}", str(tmp_path))) for a in argv])
    assert code == 2 and err.count("\n") == 1 and "loop1" in err, err
    assert (tmp_path / "loop1").is_symlink() and not list(Path(tmp_path).glob(".*.tmp"))
