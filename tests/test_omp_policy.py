"""The OpenMP wait policy chosen from the machine's load at start (sequoia_opt.omp)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sequoia_opt.omp import IDLE_SLACK_CORES, REASON_VARIABLE, busy_cores, choose_wait_policy


def test_threads_spin_only_where_the_cores_they_need_are_idle():
    assert choose_wait_policy(2, 2, 0.1)[0] == "ACTIVE"
    assert choose_wait_policy(2, 2, IDLE_SLACK_CORES + 0.01)[0] == "PASSIVE"  # a job on a core: sleep
    assert choose_wait_policy(2, 2, 1.0)[0] == "PASSIVE"
    assert choose_wait_policy(8, 4, 3.9)[0] == "ACTIVE"  # 4 threads beside 4 busy cores of 8: room to spin
    assert choose_wait_policy(8, 4, 4.5)[0] == "PASSIVE"
    policy, reason = choose_wait_policy(2, 2, None)
    assert policy == "PASSIVE" and "could not be read" in reason
    assert "1.0 of 2 cores busy" in choose_wait_policy(2, 2, 1.0)[1]
    with pytest.raises(ValueError):
        choose_wait_policy(0, 1, 0.0)
    with pytest.raises(ValueError):
        choose_wait_policy(2, 2, -1.0)


def test_busy_cores_reads_the_non_idle_share_of_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    # a file that does not change between the samples: no interval, no reading
    assert busy_cores(0.0, str(stat)) is None
    assert busy_cores(0.0, str(tmp_path / "missing")) is None
    got = busy_cores(0.05)
    if os.path.exists("/proc/stat"):
        assert got is not None and 0.0 <= got <= (os.cpu_count() or 1) + 1e-9


def _policy_in_child(env: dict[str, str], code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout.split()
    return out


def test_the_command_keeps_a_policy_the_user_set_and_otherwise_chooses_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", REASON_VARIABLE)}
    code = ("import os, sequoia_opt.cli, sys; print(os.environ.get('OMP_WAIT_POLICY'), "
            "os.environ.get('TREEOPT_OMP_WAIT_REASON', '').split(' ')[0], 'torch' in sys.modules)")
    policy, first_word, torch_loaded = _policy_in_child(env, code)
    assert policy in ("ACTIVE", "PASSIVE") and first_word and torch_loaded == "True"
    user = _policy_in_child({**env, "OMP_WAIT_POLICY": "PASSIVE"}, code)
    assert user[:2] == ["PASSIVE", "set"]
    # torch loaded first: the runtime has read its variables, so nothing is set (a label would be a lie)
    late = _policy_in_child(env, "import torch, os; from sequoia_opt.omp import apply_default; "
                                 "print(apply_default(), os.environ.get('OMP_WAIT_POLICY'))")
    assert late == ["None", "None"]


def test_a_tree_profiled_under_the_other_policy_is_flagged():
    from sequoia_opt.jobs.entries import tree_mismatch_warnings
    from sequoia_opt.tree import TreeMetadata

    meta = TreeMetadata(extra={"profiled_omp_wait_policy": "PASSIVE"})
    kw = dict(device="cpu x", dtype="float32", target="t", draft="d")
    (w,) = tree_mismatch_warnings("tree", meta, omp_wait_policy="ACTIVE", **kw)
    assert "omp_wait_policy 'PASSIVE'" in w and "'ACTIVE'" in w
    assert tree_mismatch_warnings("tree", meta, omp_wait_policy="passive", **kw) == []
    assert tree_mismatch_warnings("tree", meta, omp_wait_policy=None, **kw) == []  # a GPU run: not compared
