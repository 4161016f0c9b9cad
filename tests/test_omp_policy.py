"""The OpenMP wait policy of CPU runs (sequoia_opt.omp): PASSIVE unless the user set one, never a label after the
runtime loaded."""

from __future__ import annotations

import os
import subprocess
import sys

from sequoia_opt.omp import REASON_VARIABLE, policy_note


def _in_child(env: dict[str, str], code: str) -> list[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=True).stdout.split()


def test_the_command_keeps_a_policy_the_user_set_and_otherwise_sets_passive_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", REASON_VARIABLE)}
    code = ("import os, sequoia_opt.cli, sys; print(os.environ.get('OMP_WAIT_POLICY'), "
            "os.environ.get('TREEOPT_OMP_WAIT_REASON', '').split(' ')[0], 'torch' in sys.modules)")
    assert _in_child(env, code) == ["PASSIVE", "treeopt's", "True"]
    assert _in_child({**env, "OMP_WAIT_POLICY": "ACTIVE"}, code) == ["ACTIVE", "set", "True"]
    # torch loaded first: the runtime has read its variables, so nothing is set (a label would be a lie)
    late = _in_child(env, "import torch, os; from sequoia_opt.omp import apply_default; "
                          "print(apply_default(), os.environ.get('OMP_WAIT_POLICY'))")
    assert late == ["None", "None"]


def test_the_note_says_the_policy_and_why(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv(REASON_VARIABLE, "set by the user")
    assert policy_note() == "OpenMP threads: OMP_WAIT_POLICY=ACTIVE (set by the user)"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert "runtime's default" in policy_note()


def test_a_tree_profiled_under_the_other_policy_is_flagged():
    from sequoia_opt.jobs.entries import tree_mismatch_warnings
    from sequoia_opt.tree import TreeMetadata

    meta = TreeMetadata(extra={"profiled_omp_wait_policy": "PASSIVE"})
    kw = dict(device="cpu x", dtype="float32", target="t", draft="d")
    (w,) = tree_mismatch_warnings("tree", meta, omp_wait_policy="ACTIVE", **kw)
    assert "omp_wait_policy 'PASSIVE'" in w and "'ACTIVE'" in w
    assert tree_mismatch_warnings("tree", meta, omp_wait_policy="passive", **kw) == []
    assert tree_mismatch_warnings("tree", meta, omp_wait_policy=None, **kw) == []  # a GPU run: not compared
