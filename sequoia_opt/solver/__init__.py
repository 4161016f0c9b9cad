"""The solver: the exact Sequoia dynamic program, baselines and the hardware-aware cost model.

- :mod:`.dp`: :func:`solve_dp` (numba), the table G[m, d] and tree reconstruction.
- :mod:`.reference`: the same recurrence in plain Python (tests, benchmark baseline).
- :mod:`.baselines`: chain, k-ary, SpecInfer k x L, best-first trees.
- :mod:`.hardware`: step cost from latency curves, :func:`choose` (budget and depth), baseline comparison.
"""

from .baselines import best_first, chain, kary_tree, specinfer
from .dp import DPSolution, optimal_tree, solve_dp
from .hardware import (
    BaselineResult,
    Candidate,
    Choice,
    StepCost,
    choose,
    compare_baselines,
    plain_ms_per_token,
    score_tree,
    step_cost,
)

__all__ = [
    "BaselineResult",
    "Candidate",
    "Choice",
    "DPSolution",
    "StepCost",
    "best_first",
    "chain",
    "choose",
    "compare_baselines",
    "kary_tree",
    "optimal_tree",
    "plain_ms_per_token",
    "score_tree",
    "solve_dp",
    "specinfer",
    "step_cost",
]
