"""Speedup over a generation of finite length: the last step's overshoot.

A tree's predicted speedup, ``G x T_plain / T_step``, is the steady state: every step emits its accepted path and
the bonus token. A generation of N tokens ends inside a step, and that step emits only what is left (the decoder
truncates at ``max_new_tokens`` or at EOS), so the tree runs more steps than ``N / G``, while plain decoding runs
exactly N. Over the 40-token generations of ``benchmarks/prediction_splits.py`` that is 2 % of the steps of a
10-node tree, a bias every measured speedup of short generations carries.

The expected number of steps follows from renewal theory. Let X >= 1 be the tokens one step emits (untruncated;
steps are taken as independent draws) with mean mu = G. The steps needed to reach N tokens are
tau = min{n : X_1 + ... + X_n >= N}; by Wald's identity ``E[tau] = (N + E[O]) / mu`` with O the overshoot
``X_1 + ... + X_tau - N``. For integer steps (span 1) and N large against X, the overshoot's limiting law is
``P(O = j) = P(X > j) / mu`` (j = 0, 1, ...: the residual waiting time of a discrete renewal process; Feller,
*An Introduction to Probability Theory and Its Applications*, vol. 1, ch. XIII, recurrent events), so
``E[O] = E[X (X - 1)] / (2 mu)``. The speedup over generations of N tokens is then the steady-state speedup times
``N / (N + E[O])``.

X's law comes from the tree: P(X >= k + 1) is the probability that some node at depth k is accepted, the sum of
the reach probabilities of the depth-k nodes (at most one node per depth lies on the accepted path).

The decoder also drafts no deeper than a row can still emit (n tokens left: the tree cut to depth n - 1, as
llama-server cuts its drafts at ``n_remaining - 1``), so a batch of one's last steps are cheaper than a whole
step. :func:`expected_cost` weighs each step of the recursion by the cost of the tree it verifies; at larger
batch sizes the depth is the deepest any row can use, which under continuous batching is almost always the whole
tree, and the step count alone is the model.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["step_length_tail", "end_overshoot_tokens", "finite_generation_factor", "expected_steps",
           "expected_cost", "answer_length_factor", "EXACT_STEPS_UP_TO"]

#: :func:`answer_length_factor` runs the exact recursion up to this many tokens, the renewal limit past it (where
#: the two agree to well under 0.1 %).
EXACT_STEPS_UP_TO = 4096


def chain_rate(expected_tokens: float, depth: int) -> float:
    """The one acceptance rate ``a`` of a chain of ``depth`` drafted tokens whose expected tokens per step
    ``1 + a + .. + a^depth`` is ``expected_tokens`` (bisection to double precision): what stands for a step's
    length distribution where only G and the depth are known (:func:`step_length_tail` of that chain:
    ``a^k``, k = 0 .. depth).

    Raises:
        ValueError: ``depth`` < 1, or ``expected_tokens`` outside [1, depth + 1].
    """
    if depth < 1 or not 1.0 <= expected_tokens <= depth + 1:
        raise ValueError(f"a chain of {depth} drafted tokens has 1 to {depth + 1} tokens per step, not "
                         f"{expected_tokens}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** k for k in range(depth + 1)) < expected_tokens else (lo, mid)
    return (lo + hi) / 2


def step_length_tail(depths: Sequence[int], reach: Sequence[float]) -> np.ndarray:
    """``(D + 1,)`` float64: entry k is P(X >= k + 1), the probability a step emits more than k tokens.

    Args:
        depths: (n,) each node's depth (root 0).
        reach: (n,) each node's probability of being accepted (root 1), e.g.
            :meth:`~sequoia_opt.tree.Tree.path_probabilities` or
            :meth:`~sequoia_opt.solver.depth.ValueModel.path_probabilities`.

    Raises:
        ValueError: lengths differ, no nodes, or a reach probability outside [0, 1].
    """
    d = np.asarray(depths, dtype=np.int64)
    p = np.asarray(reach, dtype=np.float64)
    if d.shape != p.shape or d.size == 0:
        raise ValueError(f"depths and reach need the same nonzero length, got {d.size} and {p.size}")
    if np.any(p < -1e-12) or np.any(p > 1 + 1e-9) or np.any(d < 0):
        raise ValueError("reach probabilities must lie in [0, 1] and depths be >= 0")
    return np.minimum(np.bincount(d, weights=np.clip(p, 0.0, 1.0)), 1.0)


def end_overshoot_tokens(depths: Sequence[int], reach: Sequence[float]) -> float:
    """E[O], tokens the last step of a long generation would emit past its end (module docstring):
    ``E[X (X - 1)] / (2 E[X])`` with ``E[X] = sum_k P(X >= k+1)`` and ``E[X (X - 1)] = sum_k 2 k P(X >= k+1)``.
    0 for the root alone (plain decoding never overshoots). Raises ValueError as :func:`step_length_tail`."""
    tail = step_length_tail(depths, reach)
    k = np.arange(tail.size, dtype=np.float64)
    mu = float(tail.sum())
    return float((2.0 * k * tail).sum()) / (2.0 * mu)


def finite_generation_factor(overshoot_tokens: float, new_tokens: float, generations: int = 1) -> float:
    """The steady-state speedup's factor over ``generations`` generations of ``new_tokens`` tokens in all:
    ``N / (N + generations x E[O])`` (1 when nothing was generated).

    Raises:
        ValueError: a negative overshoot, token count or generation count.
    """
    if overshoot_tokens < 0 or new_tokens < 0 or generations < 0:
        raise ValueError("overshoot, new tokens and generations must be >= 0")
    if new_tokens == 0:
        return 1.0
    return float(new_tokens) / (float(new_tokens) + generations * float(overshoot_tokens))


def expected_steps(tail: Sequence[float], new_tokens: int) -> float:
    """E[tau], the expected steps to emit ``new_tokens`` tokens when every step emits X tokens independently with
    P(X >= k + 1) = ``tail[k]`` (:func:`step_length_tail`), the last step truncated: the exact recursion
    ``m(n) = 1 + sum_j P(X = j) m(n - j)``, ``m(n <= 0) = 0`` (O(N x D)). Exact for every N, where Wald's
    ``(N + E[O]) / E[X]`` with the limiting E[O] holds for N large against X only; at N = 1 it is 1 step,
    whatever the tree. (:func:`expected_cost` with every step costing 1.)

    Raises:
        ValueError: ``new_tokens`` < 0, or a tail that does not start at 1 or is not non-increasing in [0, 1].
    """
    t = np.asarray(tail, dtype=np.float64)
    return _cost_recursion(t, new_tokens, np.ones(t.size))


def expected_cost(tail: Sequence[float], new_tokens: int, depth_costs: Sequence[float], *,
                  room: int | None = None) -> float:
    """E[C], the expected cost (the unit of ``depth_costs``, e.g. ms) of emitting ``new_tokens`` tokens when a step
    with n tokens left verifies the tree cut to depth ``min(D, n - 1)`` (the decoder drafts no deeper than a row
    can emit: :meth:`~sequoia_opt.drafting.policies.StaticTreePolicy.step_depth_for`) and costs
    ``depth_costs[min(D, n - 1)]``. The recursion of :func:`expected_steps` with each step weighted by its cost,
    ``c(n) = depth_costs[min(D, n - 1)] + sum_j P(X = j) c(n - j)``, ``c(n <= 0) = 0``: cutting the tree at depth
    n - 1 changes no step's emitted tokens (the stop rule would have cut the rest), only its cost. With every
    entry equal to one step's cost it is that cost times :func:`expected_steps`.

    An answer that ends before the decoder's stop rule (on an EOS token, ``room`` > ``new_tokens``) was drafted
    for the ``room`` tokens the row could still emit, not for its unknown end: its step with n tokens left verifies
    the tree cut to depth ``min(D, n + room - new_tokens - 1)``, the whole tree while ``room - new_tokens >= D``.

    Args:
        tail: (D + 1,) as :func:`expected_steps`.  depth_costs: (D + 1,) one step's cost with the tree cut to
            depth 0 .. D (entry 0: plain decoding's step; entry D: the whole tree's).
        room: the tokens the decoder could emit when the answer started (its ``max_new_tokens``); None:
            ``new_tokens`` (the answer ran to the stop rule).

    Raises:
        ValueError: as :func:`expected_steps`; ``depth_costs`` of another length than ``tail`` or not positive;
            ``room`` < ``new_tokens``.
    """
    t = np.asarray(tail, dtype=np.float64)
    c = np.asarray(depth_costs, dtype=np.float64)
    if c.shape != t.shape or not np.all(np.isfinite(c)) or np.any(c <= 0):
        raise ValueError(f"depth_costs needs {t.size} positive costs (depth 0 .. {t.size - 1}), got {list(c)}")
    if room is not None and room < new_tokens:
        raise ValueError(f"room ({room} tokens) is below the answer's {new_tokens}")
    return _cost_recursion(t, new_tokens, c, 0 if room is None else int(room) - int(new_tokens))


def _cost_recursion(t: np.ndarray, new_tokens: int, c: np.ndarray, slack: int = 0) -> float:
    """``c(n) = c[min(D, n + slack - 1)] + sum_j P(X = j) c(n - j)``, ``c(n <= 0) = 0``, at n = ``new_tokens``;
    ``t`` the (D + 1,) tail, ``c`` (D + 1,) the step costs by depth, ``slack`` the tokens the stop rule allowed
    past the answer's end. Checks the tail and the count (ValueError)."""
    if new_tokens < 0:
        raise ValueError(f"new tokens must be >= 0, got {new_tokens}")
    if t.size == 0 or abs(t[0] - 1.0) > 1e-9 or np.any(np.diff(t) > 1e-12) or np.any(t < -1e-12):
        raise ValueError("a step-length tail starts at P(X >= 1) = 1 and does not increase")
    pmf = t - np.append(t[1:], 0.0)  # pmf[j - 1] = P(X = j), j = 1 .. D + 1
    D1 = pmf.size
    m = np.zeros(int(new_tokens) + 1)
    for n in range(1, int(new_tokens) + 1):
        lo = max(0, n - D1)  # m(n - j) for j = 1 .. D + 1, zero where n - j <= 0
        prev = m[lo:n][::-1]  # m(n - 1), m(n - 2), ... m(lo)
        m[n] = c[min(D1 - 1, n + slack - 1)] + float(np.dot(pmf[: prev.size], prev))
    return float(m[int(new_tokens)])


def answer_length_factor(depths: Sequence[int], reach: Sequence[float], new_tokens: int,
                         depth_costs: Sequence[float] | None = None) -> float:
    """The factor on a tree's steady-state rate (tokens/s, speedup) over answers of ``new_tokens`` tokens:
    ``N / (E[X] x E[tau])`` (:func:`expected_steps`: exact up to :data:`EXACT_STEPS_UP_TO` tokens, the renewal
    limit ``N / (N + E[O])`` past it). 1 for the root alone; at N = 1, ``1 / E[X]``: one step, one token.

    With ``depth_costs`` ((D + 1,) one step's cost with the tree cut to each depth, :func:`expected_cost`), the
    last steps cost what the cut tree costs: ``N x depth_costs[D] / (E[X] x E[C])``; at N = 1 the one step is plain
    decoding's, so the factor is ``depth_costs[D] / (E[X] x depth_costs[0])``. Past :data:`EXACT_STEPS_UP_TO`
    tokens the renewal limit is kept (the cut steps' saving is under 0.1 % there).

    Raises:
        ValueError: as :func:`step_length_tail` and :func:`expected_cost`; ``new_tokens`` < 1.
    """
    if new_tokens < 1:
        raise ValueError(f"an answer has at least 1 token, got {new_tokens}")
    tail = step_length_tail(depths, reach)
    mu = float(tail.sum())
    if tail.size == 1:
        return 1.0
    if new_tokens > EXACT_STEPS_UP_TO:
        return finite_generation_factor(end_overshoot_tokens(depths, reach), new_tokens)
    if depth_costs is not None:
        return float(new_tokens) * float(depth_costs[-1]) / (mu * expected_cost(tail, new_tokens, depth_costs))
    return float(new_tokens) / (mu * expected_steps(tail, new_tokens))
