"""The solver: the exact Sequoia dynamic program, baselines and the hardware-aware cost model.

- :mod:`.dp`: :func:`solve_dp` (numba), the table G[m, d] and tree reconstruction.
- :mod:`.depth`: :func:`solve_dp_by_depth`, the same DP when acceptance depends on depth (drafters whose
  accepted tokens come in runs, such as prompt lookup), and :func:`expected_tokens_by_depth`.
- :mod:`.reference`: the same recurrence in plain Python (tests, benchmark baseline).
- :mod:`.baselines`: chain, k-ary, SpecInfer k x L, best-first trees.
- :mod:`.hardware`: step cost from latency curves, :func:`choose` (budget and depth), baseline comparison.
"""

from .baselines import best_first, chain, kary_tree, specinfer
from .depth import DepthDPSolution, expected_tokens_by_depth, solve_dp_by_depth
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
    "DepthDPSolution",
    "StepCost",
    "best_first",
    "chain",
    "choose",
    "compare_baselines",
    "expected_tokens_by_depth",
    "kary_tree",
    "optimal_tree",
    "plain_ms_per_token",
    "score_tree",
    "solve_dp",
    "solve_dp_by_depth",
    "specinfer",
    "step_cost",
]
