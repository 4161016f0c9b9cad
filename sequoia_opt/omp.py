"""The OpenMP wait policy a CPU run uses, chosen from how busy the machine is when the program starts.

Why. A forward of a small model runs hundreds of short parallel regions. Between them libgomp's threads either spin
(``OMP_WAIT_POLICY=ACTIVE``, the runtime's default) or sleep on a futex (``PASSIVE``). Which is faster depends on
the machine's load, and by a wide margin (2-core VM, the demo pair, run_trees over 6 eval prompts x 40 tokens,
each policy in its own process, alternately; ``docs/measurements.md``, "OpenMP threads"):

* idle machine: spinning ran plain decoding at 55-59 ms a token against 60-70 sleeping, and the draft model's
  4-node tree at 58-61 ms a step against 91-120: a speculative step barely dearer than a plain one, because the
  draft model's many tiny regions pay a wake-up each when threads sleep. Tree over plain: 1.76x spinning, 1.23x
  sleeping;
* busy machine (other jobs on the cores): a spinning thread burns the slice its sibling needs to reach the next
  barrier; one forward ran 3-8x slower and erratic (``benchmarks/omp_wait.py``), sleeping stayed stable.

So :func:`apply_default` (called by the ``treeopt`` command before torch loads) samples the CPU's busy time for a
moment and lets threads spin only when the cores the run's threads need are idle; otherwise they sleep. A policy
the user set is kept. The choice lands in the environment (``OMP_WAIT_POLICY``, read once when torch loads the
runtime) and in :data:`REASON_VARIABLE` (why), and every CPU latency profile records the policy it ran under
(``device.omp_wait_policy``): a profile timed under one policy predicts a run under the same one.

This module imports nothing heavy: it must run before torch.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ["busy_cores", "choose_wait_policy", "apply_default", "policy_note", "REASON_VARIABLE", "IDLE_SLACK_CORES"]

#: where :func:`apply_default` records why it chose the policy (the run reports print it)
REASON_VARIABLE = "TREEOPT_OMP_WAIT_REASON"
#: busy cores tolerated beyond what the run's threads leave free before threads must sleep (a shell, a monitor)
IDLE_SLACK_CORES = 0.3


def busy_cores(interval_s: float = 0.15, stat_path: str = "/proc/stat") -> float | None:
    """Cores busy with other work right now: the non-idle share of the CPU time over ``interval_s`` (from
    ``/proc/stat``'s ``cpu`` line: idle and iowait against the total) times the core count. None where
    ``/proc/stat`` cannot be read (not Linux)."""

    def sample() -> tuple[int, int] | None:
        try:
            with open(stat_path) as f:
                line = f.readline().split()
        except OSError:
            return None
        if not line or line[0] != "cpu":
            return None
        vals = [int(v) for v in line[1:]]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        return sum(vals[:8]), idle  # user nice system idle iowait irq softirq steal (guest is inside user)

    a = sample()
    if a is None:
        return None
    time.sleep(max(0.0, interval_s))
    b = sample()
    if b is None or b[0] <= a[0]:
        return None
    total, idle = b[0] - a[0], b[1] - a[1]
    return (1.0 - idle / total) * (os.cpu_count() or 1)


def choose_wait_policy(cores: int, threads: int, busy: float | None) -> tuple[str, str]:
    """``(policy, reason)``: ``"ACTIVE"`` (spin) when the ``threads`` the run will use fit beside the ``busy`` cores
    with :data:`IDLE_SLACK_CORES` to spare, else ``"PASSIVE"`` (sleep); ``"PASSIVE"`` when the load is unknown
    (None), the safe choice on a shared machine.

    Raises:
        ValueError: ``cores`` or ``threads`` below 1, or a negative ``busy``.
    """
    if cores < 1 or threads < 1:
        raise ValueError(f"cores and threads must be >= 1, got {cores} and {threads}")
    if busy is None:
        return "PASSIVE", "the machine's load could not be read: threads sleep (safe on a shared machine)"
    if busy < 0:
        raise ValueError(f"busy cores must be >= 0, got {busy}")
    free = cores - busy
    if free + IDLE_SLACK_CORES >= threads:
        return "ACTIVE", (f"{busy:.1f} of {cores} cores busy at start: the {threads} threads spin between parallel "
                          "regions (faster on an idle machine; set OMP_WAIT_POLICY=PASSIVE if other jobs will start)")
    return "PASSIVE", (f"{busy:.1f} of {cores} cores busy at start: the {threads} threads sleep between parallel "
                       "regions (spinning beside other jobs is 3-8x slower; OMP_WAIT_POLICY=ACTIVE overrides)")


def apply_default(threads: int | None = None, *, interval_s: float = 0.15) -> str | None:
    """Set ``OMP_WAIT_POLICY`` from the machine's load (:func:`choose_wait_policy`) unless the user set it, or
    torch is already loaded (the runtime has read the variable; setting it then would only mislabel the run).
    ``threads``: the threads the run will use (default: the core count, torch's default). Returns the policy now
    in effect as far as the environment says (None: the runtime's default, torch was loaded first)."""
    if "OMP_WAIT_POLICY" in os.environ:
        os.environ.setdefault(REASON_VARIABLE, "set by the user")
        return os.environ["OMP_WAIT_POLICY"]
    if "torch" in sys.modules:
        return None
    cores = os.cpu_count() or 1
    policy, reason = choose_wait_policy(cores, min(cores, threads or cores), busy_cores(interval_s))
    os.environ["OMP_WAIT_POLICY"] = policy
    os.environ[REASON_VARIABLE] = reason
    return policy


def policy_note() -> str:
    """One line for a CPU run's report: the wait policy the threads ran under and why (:func:`apply_default`)."""
    policy = os.environ.get("OMP_WAIT_POLICY")
    if policy is None:
        return "OpenMP threads: the runtime's default wait (spin, then sleep): torch was loaded before treeopt chose"
    reason = os.environ.get(REASON_VARIABLE)
    return f"OpenMP threads: OMP_WAIT_POLICY={policy}" + (f" ({reason})" if reason else "")
