"""Adaptive static trees: a solved tree re-solved during the run from the acceptance this run's verifications
measure (issue 17; DESIGN.md, "Drafters and drafting policies": an adaptive static tree).

A static tree is solved once from a profile's positional acceptance vector (Sequoia, Chen et al. 2024,
section 3.1: ``p_k`` = the probability that a node's k-th candidate is the one accepted). When the workload
differs from the profile prompts (code after prose, a repetitive document), the tree no longer fits. Here the
decoder keeps a running estimate of p from every verification trial of this run, with the profile as prior,
and every N steps solves the Sequoia DP again (section 3.2 / 4.1; :func:`~sequoia_opt.solver.dp.solve_dp`)
with the same hardware-aware choice of budget and depth ``treeopt solve -l`` makes
(:func:`~sequoia_opt.solver.hardware.choose`), within the original budget / depth / branching limits. The DP
takes about a millisecond at working budgets; the time is measured and charged to the step that ran it.

Three parts:

* :class:`OnlineAcceptance` — the running estimate. Counts are kept per rank as *conditional* trials: rank k
  is tried at a node when ranks ``0..k-1`` were tried there and rejected and the node has a k-th candidate;
  it is a hit when rank k is accepted. ``h_k = hits_k / trials_k`` estimates
  ``P(rank k accepted | ranks < k rejected)``, and the positional vector is
  ``p_k = h_k * prod_{j<k} (1 - h_j)`` (the Kaplan-Meier form). Counting conditionally is what lets nodes of
  any width contribute: a node with 2 candidates that rejects both says nothing about rank 2 (it was never
  tried), where an unconditional count would read it as "rank 2 rejected". The result is always a valid
  acceptance vector (entries in [0, 1], sum ``1 - prod (1 - h_k) <= 1``); it need not be non-increasing
  (the DP is exact for any p).
* :class:`TreeAdapter` — the controller: the estimate, the re-solve schedule, the current tree and the log
  of re-solves (:class:`Resolve`). No model, no torch: testable from synthetic visits.
* :class:`AdaptiveTreePolicy` — the static policy (:class:`~sequoia_opt.drafting.policies.static.StaticTreePolicy`)
  whose :meth:`~AdaptiveTreePolicy.observe` feeds each step's trials to its adapter and swaps the tree in
  between steps. Greedy output is the target's greedy decoding whatever tree a step uses, so it equals plain
  decoding.

Forgetting is a window of the last W steps (exact integer counts over a deque; a step with no trial, e.g.
root-only, still takes its place, so after W root-only steps the estimate is the prior again and the tree
can grow back). The estimate, the tree and the step count run across generations: the run is the workload
(:meth:`AdaptiveTreePolicy.restart` starts over). The estimate is pooled over depths (Sequoia's positional
model); a profile's per-depth vectors are not used here.

The guard (issue 31: a workload that moves). Given the acceptance profile (with its per-prompt counts), the
adapter knows how far the current tree's tokens per step may move on prompts of the profile's kind: the 95 %
prediction interval of :mod:`sequoia_opt.solver.intervals`, for a new set as large as the window (its tokens
over the tokens each profile prompt generated). At every re-solve the window's own estimate (no prior) gives the
live tokens per step of the tree in use. Inside the interval, the re-solve is the usual one (prior + window).
Outside it, the profile no longer describes the traffic: the prior is dropped and the tree is solved from the
window's per-rank 95 % lower bounds (Wilson), the safest setting the live acceptance supports; when no tree beats
plain decoding under them, the tree is the root alone (plain decoding). While it runs root-only for the guard,
those steps do not empty the window (the live estimate that sent it there stays), and after ``window`` such
steps a one-block probe (a chain of one draft, the cheapest tree that measures anything) refreshes it. The probe
joins the window that sent the guard to plain decoding: one block of ``every`` trials judged alone sits inside
the wide interval of so small a window, and the prior then brings the profile's tree back for a losing block
(measured: 0.90x of plain on the shifted benchmark, against 0.955x when the probe joins the window); a workload
that recovers is seen after a few probes, as the window rolls. A probe
costs (it drafts where drafting does not pay), so the wait doubles after every probe that finds the traffic still
below the interval (``window`` x 1, 2, 4, up to :data:`MAX_PROBE_BACKOFF` root-only steps: exponential back-off,
as a retransmission timer backs off), and is ``window`` again once a probe leads back to a tree. Every
re-solve logs why it ran (:attr:`Resolve.reason`), the live tokens per step and the interval.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from ...decoding.policy import StepView
from ...decoding.sampling import NodeVisit
from ...decoding.state import DecodeState
from ...errors import DecodingError
from ...profiles import LatencyCurve, validate_acceptance
from ...tree import Tree
from ..drafters import Drafter
from .static import StaticTreePolicy

__all__ = ["WindowedCounts", "OnlineAcceptance", "Resolve", "TreeAdapter", "AdaptiveTreePolicy", "DEFAULT_EVERY", "DEFAULT_WINDOW",
           "DEFAULT_PRIOR_WEIGHT", "MAX_PROBE_BACKOFF"]

#: Steps between re-solves (``treeopt run --adapt-every``).
DEFAULT_EVERY = 16
#: Steps the estimate remembers (``treeopt run --adapt-window``).
DEFAULT_WINDOW = 64
#: Pseudo-trials per rank the prior is worth (``treeopt run --adapt-prior-weight``).
DEFAULT_PRIOR_WEIGHT = 8.0
#: The guard's longest wait between probes, in windows of root-only steps (the module docstring's back-off).
MAX_PROBE_BACKOFF = 8


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise DecodingError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def hazards_from_acceptance(acceptance: Sequence[float]) -> np.ndarray:
    """The conditional acceptance per rank of a positional vector: ``h_k = p_k / (1 - sum_{j<k} p_j)``, the
    probability that rank k is accepted given ranks ``0..k-1`` were rejected. (K,) float64 in [0, 1]; a rank
    whose earlier ranks take all the mass (denominator 0) gets 0.

    Raises:
        SolverError: ``acceptance`` is not a valid vector (:func:`~sequoia_opt.profiles.validate_acceptance`).
    """
    p = validate_acceptance(acceptance)
    left = 1.0 - np.concatenate([[0.0], np.cumsum(p)[:-1]])  # (K,) mass not taken by ranks < k
    h = np.divide(p, left, out=np.zeros_like(p), where=left > 1e-12)
    return np.clip(h, 0.0, 1.0)


def acceptance_from_hazards(hazards: Sequence[float]) -> np.ndarray:
    """The positional vector of per-rank conditional acceptances: ``p_k = h_k * prod_{j<k} (1 - h_j)``.
    (K,) float64, entries in [0, 1], sum ``1 - prod_k (1 - h_k) <= 1``."""
    h = np.clip(np.asarray(hazards, dtype=np.float64), 0.0, 1.0)
    survive = np.concatenate([[1.0], np.cumprod(1.0 - h)[:-1]])  # (K,) P(ranks < k all rejected)
    return h * survive


def visit_counts(visits: Iterable[NodeVisit], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Conditional trials and hits per rank ``0..width-1`` of some verification trials.

    A visit with ``c`` children and accepted rank ``r`` tried ranks ``0..r`` (``r`` a hit, the others misses);
    with ``r`` None it tried all ``c`` ranks and every one missed. Ranks ``>= width`` are outside the vector
    (a visit accepted there counts as ranks ``0..width-1`` tried and missed).

    Returns:
        ``(trials, hits)``, each (width,) int64.
    """
    trials = np.zeros(width, dtype=np.int64)
    hits = np.zeros(width, dtype=np.int64)
    for v in visits:
        r = v.accepted_rank
        tried = min(v.num_children if r is None else r + 1, width)
        trials[:tried] += 1
        if r is not None and r < width:
            hits[r] += 1
    return trials, hits


class WindowedCounts:
    """Trials and hits per index (a rank, a depth), summed exactly over the last ``window`` steps, with the weight
    of a prior in pseudo-trials: the counting both online estimates share (:class:`OnlineAcceptance` here, the chain
    estimate of adaptive plans in :mod:`~sequoia_opt.drafting.policies.adaptive_schedule`).

    Args:
        size: indices counted.  window: steps remembered, W >= 1.  prior_weight: pseudo-trials per index, >= 0.

    Attributes:
        trials / hits: (size,) int64 counts over the window.  steps: steps added since the last :meth:`reset`
        (all of them, not only the window's).

    Raises:
        DecodingError: ``window < 1`` or a negative / non-finite weight.
    """

    def __init__(self, size: int, window: int, prior_weight: float) -> None:
        self._size = int(size)
        self.window = _positive_int("the adaptation window (steps)", window)
        w = float(prior_weight)
        if not np.isfinite(w) or w < 0:
            raise DecodingError(f"the prior weight must be a number of pseudo-trials >= 0, got {prior_weight!r}")
        self.prior_weight = w
        self.reset()

    def reset(self) -> None:
        """Forget every step (the estimate is the prior again)."""
        self._steps: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self.trials = np.zeros(self._size, dtype=np.int64)
        self.hits = np.zeros(self._size, dtype=np.int64)
        self.steps = 0

    def _add(self, trials: np.ndarray, hits: np.ndarray) -> None:
        """One step's counts in; the step that leaves the window out."""
        self._steps.append((trials, hits))
        self.trials += trials
        self.hits += hits
        if len(self._steps) > self.window:
            old_t, old_h = self._steps.popleft()
            self.trials -= old_t
            self.hits -= old_h
        self.steps += 1


class OnlineAcceptance(WindowedCounts):
    """A running positional acceptance estimate over the last ``window`` steps, with a prior (module
    docstring for the estimator).

    Per rank k (K = the prior's width): ``h_k = (hits_k + w * h0_k) / (trials_k + w)`` with ``w`` the prior
    weight (pseudo-trials per rank) and ``h0`` the prior's conditional acceptance
    (:func:`hazards_from_acceptance`); a rank never tried in the window keeps ``h0_k``. The positional vector
    is :func:`acceptance_from_hazards` of ``h``.

    Args:
        prior: (K,) positional acceptance vector (an acceptance profile's), sum <= 1.
        window: steps remembered, W >= 1; the counts are exact sums over the last W :meth:`add_step` calls.
        prior_weight: pseudo-trials per rank, >= 0 (0: the counts alone wherever a rank was tried).

    Attributes:
        prior: (K,) the prior vector.  prior_hazards: (K,) its conditional form.
        trials / hits: (K,) int64 counts over the window.
        steps: steps added since the last :meth:`reset` (all of them, not only the window's).

    Raises:
        SolverError: a bad prior vector.  DecodingError: ``window < 1`` or a negative / non-finite weight.
    """

    def __init__(self, prior: Sequence[float], *, window: int = DEFAULT_WINDOW,
                 prior_weight: float = DEFAULT_PRIOR_WEIGHT) -> None:
        self.prior = validate_acceptance(prior, what="prior acceptance vector")
        self.prior_hazards = hazards_from_acceptance(self.prior)
        super().__init__(self.prior.size, window, prior_weight)

    @property
    def width(self) -> int:
        """K, the ranks estimated."""
        return int(self.prior.size)

    def add_step(self, visits: Iterable[NodeVisit]) -> None:
        """Count one decoding step's verification trials (:attr:`StepStats.visits`; none for a root-only
        step, which still takes its place in the window), dropping the step that leaves the window."""
        self._add(*visit_counts(visits, self.width))

    @property
    def hazards(self) -> np.ndarray:
        """(K,) conditional acceptance per rank: the counts shrunk towards the prior (class docstring)."""
        w = self.prior_weight
        den = self.trials + w
        est = np.divide(self.hits + w * self.prior_hazards, den, out=self.prior_hazards.copy(), where=den > 0)
        return np.clip(est, 0.0, 1.0)

    @property
    def acceptance(self) -> np.ndarray:
        """(K,) the positional acceptance vector p_1..p_K the DP takes (valid: entries >= 0, sum <= 1)."""
        return acceptance_from_hazards(self.hazards)

    def live_acceptance(self, lower: bool = False) -> np.ndarray:
        """(K,) the window's own positional vector (no prior): ``hits_k / trials_k`` per rank, a rank never tried
        in the window keeping the prior's; with ``lower`` each rank's 95 % Wilson lower bound instead (what the
        guard solves the safest tree from; an untried rank then counts 0)."""
        from ...profiles import wilson_interval

        h = self.prior_hazards.copy() if not lower else np.zeros(self.width)
        for k in range(self.width):
            if self.trials[k] > 0:
                h[k] = wilson_interval(float(self.hits[k]), float(self.trials[k]))[0] if lower \
                    else self.hits[k] / self.trials[k]
        return acceptance_from_hazards(h)


@dataclass(frozen=True)
class Resolve:
    """One re-solve of an adaptive tree (a row of ``treeopt run --adapt``'s re-solve log).

    Attributes:
        step: steps decoded (since the adapter's reset) when it ran; its tree serves step ``step`` onwards.
        generation: the generation (prompt, 0-based since the reset) it ran in.
        tokens: tokens emitted since the reset, when it ran.
        size / depth / level_widths: the tree chosen (nodes incl. the root; depth; nodes per level).
        expected_tokens: its predicted tokens per step G under the estimate.
        speedup: its predicted speedup over plain decoding (the latency curve's cost model).
        changed: whether it differs from the tree it replaces.
        solve_ms: wall time of the DP and the hardware-aware choice (ms).
        acceptance: the estimate it solved with, p_1..p_K.
        reason: why this tree: ``scheduled`` (the usual re-solve), ``left the prediction interval`` (the guard:
            solved from the live lower bounds), ``probe`` (a block of one-draft chains after a root-only fallback).
        live_tokens_per_step: the tree in use's tokens per step under the window's own estimate (None: no guard,
            or too few trials in the window).
        interval: the 95 % prediction interval of that tree's tokens per step on the profile's kind (None: no
            guard).
    """

    step: int
    generation: int
    tokens: int
    size: int
    depth: int
    level_widths: tuple[int, ...]
    expected_tokens: float
    speedup: float
    changed: bool
    solve_ms: float
    acceptance: tuple[float, ...]
    reason: str = "scheduled"
    live_tokens_per_step: float | None = None
    interval: tuple[float, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The record as plain types for a run's results JSON (tuples as lists; ``interval`` a ``[lo, hi]``
        list or None)."""
        d = asdict(self)
        d["level_widths"] = list(self.level_widths)
        d["acceptance"] = list(self.acceptance)
        d["interval"] = list(self.interval) if self.interval is not None else None
        return d


class TreeAdapter:
    """The adaptive tree's controller: the running estimate (:class:`OnlineAcceptance`), a re-solve every
    ``every`` steps (:func:`~sequoia_opt.solver.hardware.choose` on the estimate, within the limits), the
    current tree and the log of re-solves.

    Args:
        initial: the tree the run starts with (the static tree being adapted).
        prior: (K,) the acceptance profile's vector (the estimate's prior).
        curve: the latency profile the hardware-aware choice reads (T(n), c(w), the drafter's cost model).
        budget: the largest tree a re-solve may choose (nodes incl. the root), within what ``curve`` measured.
        max_depth: the depth limit D of a re-solve (>= 1).  max_branching: B, most children per node.
        every: steps between re-solves (>= 1).  window: steps the estimate remembers (>= 1).
        prior_weight: pseudo-trials per rank the prior is worth (>= 0).
        context: context length (tokens) to read ``curve`` at; None = the smallest measured.
        profile: the acceptance profile the prior comes from: with its per-prompt counts it arms the guard
            (module docstring); None or a profile without them: no guard.
        guard: False disarms the guard.
        min_trials: the window's trials below which the guard does not judge (too little to tell).

    Attributes:
        tree: the current tree.  estimate: the :class:`OnlineAcceptance`.  resolves: the log, oldest first.
        steps / tokens / generation: steps decoded, tokens emitted, generations started since the reset.
        prior_choice: the choice solved from the prior alone at construction (it checks the limits against
            the curve before any model runs, and loads the compiled DP).

    Raises:
        DecodingError: ``every`` or ``window`` below 1, a bad prior weight.  SolverError: a bad prior vector,
            budget, depth or branching.  ProfileError: a budget past the largest target token count ``curve``
            measured, or no tree ``curve`` can score.
    """

    def __init__(self, initial: Tree, prior: Sequence[float], curve: LatencyCurve, *, budget: int, max_depth: int,
                 max_branching: int = 32, every: int = DEFAULT_EVERY, window: int = DEFAULT_WINDOW,
                 prior_weight: float = DEFAULT_PRIOR_WEIGHT, context: int | None = None, profile=None,
                 guard: bool = True, min_trials: int = 16) -> None:
        self.every = _positive_int("the re-solve interval (steps)", every)
        self.estimate = OnlineAcceptance(prior, window=window, prior_weight=prior_weight)
        self.initial, self.curve, self.context = initial, curve, context
        self.budget, self.max_depth, self.max_branching = budget, max_depth, max_branching
        self.prior_choice = self._choose(self.estimate.prior)
        armed = (guard and profile is not None and getattr(profile, "prompt_counts", None) is not None
                 and profile.prompt_counts.shape[0] >= 2 and profile.width == self.estimate.width)
        self.profile = profile if armed else None
        self.min_trials = int(min_trials)
        new = (profile.measured.get("max_new_tokens") if armed else None) or 0
        self._prompt_tokens = float(new) if isinstance(new, (int, float)) and new > 0 else 32.0
        self._spreads: dict[tuple, Any] = {}
        self.reset()

    @property
    def guarded(self) -> bool:
        """Whether the guard is armed (module docstring)."""
        return self.profile is not None

    def _choose(self, acceptance: np.ndarray):
        # imported here so that importing the policies does not load the compiled DP
        from ...solver.hardware import choose

        return choose(acceptance, self.curve, self.budget, self.max_depth, self.max_branching, context=self.context,
                      top=1)

    def reset(self) -> None:
        """Back to the initial tree, the prior, an empty log, no steps."""
        self.estimate.reset()
        self.tree = self.initial
        self.resolves: list[Resolve] = []
        self.steps = self.tokens = 0
        self.generation = -1
        # predicted tokens per step of the tree in use: the initial tree's under the prior, then each re-solve's
        self._predicted = self.initial.expected_tokens(self.estimate.prior)
        self._predicted_p = self.estimate.prior  # the acceptance the tree in use was predicted with
        self._predicted_sum = 0.0
        self._window_tokens: deque[int] = deque()
        self._fallback = False  # root-only since the guard chose it
        self._idle = 0  # root-only steps of the fallback so far (they leave the window as it is)
        self._backoff = 1  # windows of root-only steps before the next probe (doubles per failed probe)
        self._probing = False  # the tree in use is a probe

    def start_generation(self) -> None:
        """A new generation (prompt) begins: counted for the log."""
        self.generation += 1

    @property
    def window(self) -> int:
        """W, the steps the running estimate remembers (its :class:`OnlineAcceptance`'s window)."""
        return self.estimate.window

    @property
    def prior_weight(self) -> float:
        """The estimate's prior weight, pseudo-trials per rank."""
        return self.estimate.prior_weight

    @property
    def predicted_tokens_per_step(self) -> float | None:
        """The step-weighted mean of the predicted tokens per step of the trees used since the reset (the
        initial tree's under the prior, each re-solved tree's under the estimate it was solved with; a step cut
        near an answer's end is its cut tree's); None before the first step."""
        return self._predicted_sum / self.steps if self.steps else None

    def observe(self, visits: Iterable[NodeVisit], tokens: int, depth: int | None = None) -> Tree | None:
        """Count one step (its verification trials, its emitted tokens: every row's of a batch's step); every
        ``every`` steps re-solve.

        Args:
            depth: the depth the step's tree was cut to (near an answer's or the context's end: the tree's first
                ``depth + 1`` levels, :meth:`~sequoia_opt.tree.Tree.cut`); None: the whole tree. The step's
                prediction (:attr:`predicted_tokens_per_step`) is the tree it ran, the cut one.

        Returns:
            The new tree when a re-solve (or the guard's probe) chose one different from the current tree (the
            caller swaps it in before the next step), else None.
        """
        visits = list(visits)
        self.steps += 1
        self.tokens += int(tokens)
        self._predicted_sum += self._predicted_at(depth)
        if self._fallback and self.tree.size == 1:  # the guard's root-only steps keep the live estimate as it is
            self._idle += 1
            if self._idle >= self.window * self._backoff and self._idle % self.every == 0:
                return self._probe()
            return None
        self.estimate.add_step(visits)
        self._window_tokens.append(int(tokens))
        if len(self._window_tokens) > self.window:
            self._window_tokens.popleft()
        if self.steps % self.every:
            return None
        return self.tree if self.resolve().changed else None

    def _predicted_at(self, depth: int | None) -> float:
        """The predicted tokens per step of the tree in use cut to ``depth`` (None, or its own depth or more: the
        whole tree's), under the acceptance its prediction was made with."""
        if depth is None or depth >= self.tree.tree_depth:
            return self._predicted
        return self.tree.cut(max(int(depth), 0)).expected_tokens(self._predicted_p)

    def _spread(self, tree: Tree):
        """The tree's tokens-per-step spread between the profile's prompts (positional, as the estimate), cached."""
        from ...solver.intervals import tree_spread

        key = tuple(map(tuple, tree.choices()))
        if key not in self._spreads:
            self._spreads[key] = tree_spread(tree, self.profile, model="positional", replicates=400)
        return self._spreads[key]

    def check(self) -> tuple[float, tuple[float, float]] | None:
        """The guard's test of the tree in use: ``(live tokens per step, 95 % prediction interval)``, the interval
        for a new set as large as the window (its tokens over the tokens a profile prompt generated); None when
        the guard is not armed, the tree is the root alone, or the window holds fewer than ``min_trials``
        trials."""
        if self.profile is None or self.tree.size == 1 or int(self.estimate.trials[0]) < self.min_trials:
            return None
        live = float(self.tree.expected_tokens(self.estimate.live_acceptance()))
        m = max(1, int(round(sum(self._window_tokens) / self._prompt_tokens)))
        lo, hi = self._spread(self.tree).prediction_interval(m)
        return live, (lo, min(hi, float(self.tree.tree_depth + 1)))  # a step emits at most D + 1 tokens

    def _probe(self) -> Tree | None:
        """After ``window`` root-only steps of a fallback: one block of one-draft chains to measure again."""
        from ...solver.hardware import score_tree

        probe = Tree.chain(2)
        self._fallback, self._idle, self._probing = False, 0, True
        p = self.estimate.live_acceptance()
        cost = score_tree(probe, p, self.curve, self.context)
        rec = Resolve(step=self.steps, generation=max(self.generation, 0), tokens=self.tokens, size=probe.size,
                      depth=probe.tree_depth, level_widths=tuple(int(w) for w in probe.level_widths),
                      expected_tokens=float(cost.expected_tokens), speedup=float(cost.speedup), changed=True,
                      solve_ms=0.0, acceptance=tuple(float(x) for x in p), reason="probe")
        self.tree, self._predicted, self._predicted_p = probe, rec.expected_tokens, p
        self.resolves.append(rec)
        return probe

    def resolve(self) -> Resolve:
        """Re-solve now from the current estimate: the hardware-aware choice within the limits becomes the
        current tree; when the guard finds the live tokens per step outside the prediction interval, from the
        window's lower bounds instead (module docstring). The :class:`Resolve` is logged and returned."""
        t0 = time.perf_counter()
        judged = self.check()
        reason, live, interval = "scheduled", None, None
        p = self.estimate.acceptance
        if judged is not None:
            live, interval = judged
            if not interval[0] <= live <= interval[1]:
                reason = "left the prediction interval"
                p = self.estimate.live_acceptance(lower=True)
        choice = self._choose(p)
        ms = (time.perf_counter() - t0) * 1000.0
        tree = choice.tree
        changed = tree != self.tree
        rec = Resolve(step=self.steps, generation=max(self.generation, 0), tokens=self.tokens, size=tree.size,
                      depth=tree.tree_depth, level_widths=tuple(int(w) for w in tree.level_widths),
                      expected_tokens=float(choice.expected_tokens), speedup=float(choice.speedup), changed=changed,
                      solve_ms=ms, acceptance=tuple(float(x) for x in p), reason=reason, live_tokens_per_step=live,
                      interval=interval)
        self.tree, self._predicted, self._predicted_p = tree, rec.expected_tokens, p
        self._fallback = reason != "scheduled" and tree.size == 1
        if self._probing:  # the probe's verdict: still below (wait longer before the next one), or a tree again
            self._backoff = min(2 * self._backoff, MAX_PROBE_BACKOFF) if tree.size == 1 else 1
        self._probing = False
        self._idle = 0
        self.resolves.append(rec)
        return rec

    def as_dict(self) -> dict[str, Any]:
        """The settings, the counts and the log (for a run's results JSON)."""
        return {"every": self.every, "window": self.window, "prior_weight": self.prior_weight,
                "budget": self.budget, "max_depth": self.max_depth, "max_branching": self.max_branching,
                "context": self.context, "latency_profile": self.curve.id, "guard": self.guarded,
                "prior": [float(x) for x in self.estimate.prior], "steps": self.steps, "tokens": self.tokens,
                "predicted_tokens_per_step": self.predicted_tokens_per_step,
                "initial_tree": self.initial.choices(), "final_tree": self.tree.choices(),
                "final_size": self.tree.size, "final_depth": self.tree.tree_depth,
                "resolves": [r.as_dict() for r in self.resolves]}


class AdaptiveTreePolicy(StaticTreePolicy):
    """The static policy with its tree re-solved during the run by a :class:`TreeAdapter` (module docstring).

    After each step (:meth:`observe`, inside the step's timed bookkeeping, so the measured tokens per second
    pays for the adaptation: the counting, the DP, compiling the new tree's buffers) every row's trials go to the
    adapter as one step (a batch's step re-solves at most once); when a re-solve picks another tree it is swapped
    in before the next step. Its ``max_size`` is the
    larger of the initial tree and the adapter's budget, so the decoder's caches hold every tree it may choose.

    Args:
        drafter: as :class:`~sequoia_opt.drafting.policies.static.StaticTreePolicy`.
        adapter: the :class:`TreeAdapter` (its ``tree`` is the first step's tree); reset here.
        name: the drafter's label.

    Raises:
        DecodingError: an initial tree of depth 0 (the drafter would allocate nothing, and no re-solved tree
            could draft).
    """

    def __init__(self, drafter: Drafter, adapter: TreeAdapter, name: str = "draft") -> None:
        adapter.reset()
        if adapter.tree.tree_depth == 0:
            raise DecodingError("an adaptive tree must start with a tree of depth >= 1 (from a root-only tree the "
                                "decoder allocates nothing to draft with)")
        super().__init__(drafter, adapter.tree, name)
        self.adapter = adapter
        self.max_size = max(adapter.tree.size, adapter.budget)

    def restart(self) -> None:
        """Start the adaptation over: the initial tree, the prior, an empty log (e.g. after a warm-up)."""
        self.adapter.reset()
        if self.tree != self.adapter.tree:
            self.set_tree(self.adapter.tree)

    def reset(self) -> None:
        """A new generation: the drafter forgets it, the adapter counts it (the estimate runs across
        generations: the run is the workload)."""
        super().reset()
        self.adapter.start_generation()

    def observe(self, state: DecodeState, step: StepView) -> None:
        # one step of the adapter however many rows it served (every row's trials, every row's tokens): a row each
        # re-solved up to B / every times a step, every solve but the last thrown away, and counted ``every`` in rows
        visits = [v for acc in step.acceptances for v in acc.visits]
        new = self.adapter.observe(visits, sum(len(e) for e in step.emitted), self.step_depth)
        if new is not None and new != self.tree:
            self.set_tree(new)
