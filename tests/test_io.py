"""Atomic output: modes, symlinks, refusals, no temp files left behind."""

import os
import stat

import pytest

from sequoia_opt._io import atomic_write_text
from sequoia_opt.errors import OutputError


def test_new_file_gets_umask_mode_and_replaces_atomically(tmp_path):
    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "a" / "b.yaml", "x: 1\n")
    finally:
        os.umask(old)
    assert p.read_text() == "x: 1\n"
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    os.chmod(p, 0o600)
    atomic_write_text(p, "x: 2\n")
    assert p.read_text() == "x: 2\n" and stat.S_IMODE(p.stat().st_mode) == 0o600
    assert sorted(x.name for x in p.parent.iterdir()) == ["b.yaml"]


def test_symlink_is_written_through(tmp_path):
    target = tmp_path / "real.yaml"
    target.write_text("old")
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


@pytest.mark.parametrize("make", ["dir", "under_file"])
def test_refuses_paths_it_cannot_write(tmp_path, make):
    if make == "dir":
        path = tmp_path / "d"
        path.mkdir()
    else:
        (tmp_path / "f").write_text("x")
        path = tmp_path / "f" / "x.yaml"
    with pytest.raises(OutputError, match="cannot write"):
        atomic_write_text(path, "data")
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


def test_refuses_a_device():
    with pytest.raises(OutputError, match="not a regular file"):
        atomic_write_text("/dev/null", "data")
