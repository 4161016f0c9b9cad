"""The OpenMP wait policy of a CPU run: threads sleep between parallel regions unless the user chose otherwise.

A forward of a small model runs hundreds of short parallel regions. Between them libgomp's threads either spin
(``OMP_WAIT_POLICY=ACTIVE``; libgomp's default with the variable unset spins for a while, then sleeps) or sleep on
a futex (``PASSIVE``). Measured on the 2-core VM
(``docs/measurements.md``, "OpenMP threads on a shared CPU"):

* beside other jobs, spinning threads burn the slice a sibling needs to reach the next barrier: one forward ran
  3-8x slower and erratic (``benchmarks/omp_wait.py``); sleeping threads stayed stable;
* on an idle machine spinning is faster, most of all for speculative steps (the draft model's many tiny regions pay
  a wake-up each when threads sleep): the demo pair's 4-node tree ran at 1.71x plain decoding spinning against
  1.16x sleeping (``benchmarks/omp_decode.py``). But under spinning the profiler's paired timing (a tree step beside
  a plain step, ``profiling.steps``) priced a 2-token verify at 0.7x a plain step where the run measured 1.0x, so
  the solver chose a 2-node tree and predicted 1.69x for a tree that ran at 1.40x (``treeopt demo`` with
  ``OMP_WAIT_POLICY=ACTIVE``, 2026-12-02).

So the ``treeopt`` command sets ``PASSIVE`` unless the user set a policy (:func:`apply_default`), and a user on a
dedicated idle machine may set ``OMP_WAIT_POLICY=ACTIVE`` for speed, knowing the predictions are less faithful
there. Every CPU latency profile records the policy (``device.omp_wait_policy``), run reports note it
(:func:`policy_note`), and ``treeopt run`` warns when a tree was solved from a profile timed under another policy.

This module imports nothing heavy: :func:`apply_default` must run before torch loads the runtime.
"""

from __future__ import annotations

import os
import sys

__all__ = ["apply_default", "run_policy", "policy_note", "DEFAULT_POLICY", "REASON_VARIABLE"]

#: the policy the treeopt command sets when the user set none
DEFAULT_POLICY = "PASSIVE"
#: where :func:`apply_default` records why the policy is what it is (the run reports print it)
REASON_VARIABLE = "TREEOPT_OMP_WAIT_REASON"


def apply_default() -> str | None:
    """Set ``OMP_WAIT_POLICY`` to :data:`DEFAULT_POLICY` unless the user set it, or torch is already loaded (the
    runtime has read the variable; setting it then would only mislabel the run). Returns the policy in effect as
    far as the environment says (None: the runtime's default, torch was loaded first)."""
    if "OMP_WAIT_POLICY" in os.environ:
        os.environ.setdefault(REASON_VARIABLE, "set by the user")
        return os.environ["OMP_WAIT_POLICY"]
    if "torch" in sys.modules:
        return None
    os.environ["OMP_WAIT_POLICY"] = DEFAULT_POLICY
    os.environ[REASON_VARIABLE] = ("treeopt's default: sleeping threads stay stable beside other jobs and keep the "
                                   "profiler's paired timing faithful; OMP_WAIT_POLICY=ACTIVE is faster on an idle "
                                   "machine, with less faithful predictions")
    return DEFAULT_POLICY


def run_policy(device_type: str) -> str | None:
    """The wait policy a run on ``device_type`` (``"cpu"``, ``"cuda"``, ...) records: ``OMP_WAIT_POLICY`` on a CPU
    (None when unset: the runtime's default), None on any other device (its threads are not the compute)."""
    return os.environ.get("OMP_WAIT_POLICY") if device_type == "cpu" else None


def policy_note() -> str:
    """One line for a CPU run's report: the wait policy the threads ran under and why (:func:`apply_default`)."""
    policy = os.environ.get("OMP_WAIT_POLICY")
    if policy is None:
        return "OpenMP threads: the runtime's default wait (spin, then sleep): torch was loaded before treeopt chose"
    reason = os.environ.get(REASON_VARIABLE)
    return f"OpenMP threads: OMP_WAIT_POLICY={policy}" + (f" ({reason})" if reason else "")
