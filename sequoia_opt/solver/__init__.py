"""The solver: the exact Sequoia dynamic program, baselines and the hardware-aware cost model.

- :mod:`.dp`: :func:`solve_dp` (numba), the table G[m, d] and tree reconstruction.
- :mod:`.depth`: :func:`solve_dp_by_depth`, the same DP when acceptance depends on depth (drafters whose
  accepted tokens come in runs, such as prompt lookup), and :func:`expected_tokens_by_depth`.
- :mod:`.reference`: the oracles: the same recurrence in plain Python, the brute-force graft (tests, benchmark
  baselines).
- :mod:`.baselines`: chain, k-ary, SpecInfer k x L, best-first trees.
- :mod:`.hardware`: step cost from latency curves, :func:`choose` (budget and depth), baseline comparison.
- :mod:`.graft`: trees grown by a light and a strong drafter: per-drafter cost, :func:`solve_graft` (the choice),
  baselines (each drafter alone, SpecInfer merge); the value model in :mod:`.graft_value`, the exact DP in
  :mod:`.graft_dp`.
- :mod:`.chains`: chains (a tree of width 1) for chain-verifying engines, and their replay.
- :mod:`.intervals`: intervals between prompts (a cluster bootstrap over a profile's prompts): the interval of
  the mean and the prediction interval for a new prompt set of a given size, of any figure (:class:`PromptSpread`).
"""

from .baselines import best_first, chain, kary_tree, specinfer
from .depth import DepthDPSolution, ValueModel, expected_tokens_by_depth, solve_dp_by_depth
from .dp import DPSolution, optimal_tree, solve_dp
from .graft import (
    GraftAcceptance,
    GraftChoice,
    GraftDPSolution,
    graft_baselines,
    graft_expected_tokens,
    graft_step_cost,
    merge_trees,
    optimal_graft_tree,
    solve_graft,
    solve_graft_dp,
)
from .intervals import PromptSpread, speedup_spread, tree_spread
from .reference import BruteForceGraft, brute_force_graft
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
    "BruteForceGraft",
    "Candidate",
    "Choice",
    "DPSolution",
    "DepthDPSolution",
    "GraftAcceptance",
    "GraftChoice",
    "GraftDPSolution",
    "PromptSpread",
    "StepCost",
    "best_first",
    "brute_force_graft",
    "chain",
    "choose",
    "compare_baselines",
    "expected_tokens_by_depth",
    "speedup_spread",
    "tree_spread",
    "graft_baselines",
    "graft_expected_tokens",
    "graft_step_cost",
    "kary_tree",
    "merge_trees",
    "optimal_graft_tree",
    "optimal_tree",
    "plain_ms_per_token",
    "score_tree",
    "solve_dp",
    "solve_dp_by_depth",
    "solve_graft",
    "solve_graft_dp",
    "specinfer",
    "step_cost",
]
