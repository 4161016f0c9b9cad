"""The CLI as a process, stopped the way production stops it: its standard output closed early (``| head -1``)
and SIGTERM mid-command. Each ends with one line (or none) and a signal's exit status, never a traceback, a
status of 1, or a temporary file left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import make_pair  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _closed_stdout_run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``treeopt args`` with its standard output a pipe whose reader has gone (``treeopt ... | head -0``)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, "-m", "sequoia_opt", *args], stdout=w, stderr=subprocess.PIPE,
                              text=True, cwd=cwd, env=_env(), timeout=300)
    finally:
        os.close(w)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("signals")
    return (root, *make_pair(root))


def test_a_closed_stdout_ends_quietly_with_141(pair):
    root = pair[0]
    for args in (["--help"], ["solve", "--help"], ["--version"]):
        p = _closed_stdout_run(args, root)
        assert (p.returncode, p.stderr) == (141, ""), args  # typer and rich exited 1, a failure's status
    acc = root / "acc.yaml"
    acc.write_text("format: treeopt-acceptance/1\nid: a\nacceptance: [0.6, 0.2, 0.1]\n")
    p = _closed_stdout_run(["solve", "-a", str(acc), "--budget", "6", "-o", str(root / "tree.yaml")], root)
    assert (p.returncode, p.stderr) == (141, "")
    assert "nodes:" in (root / "tree.yaml").read_text()  # written before the report: whole
    p = _closed_stdout_run(["solve", "-a", str(acc), "--budget", "6", "--json"], root)
    assert (p.returncode, p.stderr) == (141, "")


def test_sigterm_mid_profile_is_one_line_143_and_no_file(pair):
    root, target, draft, prompts = pair
    out = root / "out dir" / "acc ü.yaml"
    p = subprocess.Popen([sys.executable, "-m", "sequoia_opt", "profile", "acceptance", "--target", str(target),
                          "--draft", str(draft), "--prompts", str(prompts), "--max-new-tokens", "200", "-o", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root, env=_env())
    first = p.stderr.readline()  # the first progress line: measuring has begun
    assert "acceptance" in first, first
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err  # was killed at once (-15): no line, and a write under way left its .tmp
    assert err.strip().splitlines() == ["terminated: each output file is whole or absent (written atomically, last)"]
    assert not out.exists() and not [f for f in root.rglob("*") if f.name.endswith(".tmp")]
