"""Adaptive speculation plans: a chain plan re-ranked during the run from the acceptance the served requests show
(issue 29's plans, issue 31's guard for a workload that moves).

Why. A plan (:func:`~sequoia_opt.solver.schedule.solve_plan`) picks a draft length K per batch size from the
latency profile and the acceptance of the profile prompts. Where two lengths are predicted a few percent apart
(a *close call*), the acceptance of the traffic decides between them, and the traffic is not the profile's
prompts: on the demo pair the served eval requests accepted 7-13 % more tokens per step than the profile prompts,
which made K = 2 beat the chosen K = 1 by 9 % at batch 2 (``benchmarks/schedules.py``, 2026-12-03); re-solved
from the served requests' own acceptance, the same cost model chose the measured best at every batch size. So the
run measures that acceptance itself and re-ranks the plan's candidates with it, as SGLang's adaptive mode follows
the accepted length, but through the measured cost of every candidate at every batch size rather than a fixed
step rule.

Three parts, none of which re-measures latency (the plan's step costs are kept as solved):

* :class:`ChainEstimate` — per-depth conditional acceptance of a chain, counted over the last ``window`` steps
  and shrunk towards the plan's own. A chain's draft at depth d + 1 is *tried* when drafts 1..d were accepted
  and the chain was at least d + 1 long; it is a hit when accepted: ``h_d = P(draft d + 1 accepted | drafts 1..d
  accepted)``. G(K), the tokens per step of a chain of K, is ``1 + sum_{j=1..K} prod_{d<j} h_d`` (each
  accepted draft adds a token to the bonus token). The prior's ``h0_d`` come from the plan's own G(K)
  (:func:`hazards_from_chain_g`: ``h0_0 = G(1) - 1``, ``h0_d = (G(d + 1) - G(d)) / (G(d) - G(d - 1))``, so the
  prior reproduces the plan's G, replayed or DP-valued, up to clipping where an increment would grow). A chain of K never tries depths past K: those keep the prior *scaled by the live-to-prior ratio of
  the depths tried* (``rho = (hits + w) / (expected hits under the prior + w)``), i.e. the traffic is assumed to
  shift every depth's acceptance by a common factor where it cannot be seen (on the demo pair's served requests
  both measured depths moved up, by 23 % and 46 %). Each depth is ``(hits_d + w min(1, rho h0_d)) / (trials_d + w)``.
* :class:`PlanAdapter` — the controller: the plan's candidates per measured batch size (K, the prior G(K), the
  step's ms, the length factor), the estimate, and every ``every`` steps a re-ranking: at each measured batch
  size the K with the most tokens/s, ``G_live(K) x length_factor(K) / step_ms(b, K)`` (ties to the shorter
  chain; the plan's ``min_gain`` and TensorRT-LLM's first-is-longest rule applied as the solver applies them),
  merged into ranges as the plan merges them (:func:`~sequoia_opt.solver.schedule.merge_ranges`). No model, no
  torch: testable from synthetic trials. Every re-ranking is logged (:class:`PlanResolve`).
* :class:`AdaptiveSchedulePolicy` — :class:`~sequoia_opt.drafting.policies.schedule.SchedulePolicy` whose
  :meth:`~AdaptiveSchedulePolicy.observe` feeds every row's trials to the adapter and swaps the ranges between
  steps. Buffers are sized for the longest candidate once. Greedy output is the target's greedy decoding
  whatever chain a step uses (switching is exact between steps), so it equals plain decoding.

Limits: chains only (a plan of envelopes or trees is refused, and so is a given schedule that scores only its own
settings: re-ranking needs every K scored); the latency side is the profile's (the guard of a machine that slows
is not this); the length factor is the plan's (computed from the prior's acceptance: under a higher live
acceptance the true factor is a little lower, which favours longer chains by that little); rows at different
batch sizes share one estimate (greedy acceptance does not depend on the batch size). Plain steps take their
place in the window. Where the live ranking sent the batch size in use to plain decoding, it stays plain, without
re-ranking, for ``window`` steps; by then its trials have drained out, the prior comes back and the next
re-ranking runs the plan's chains again: a *probe*, on trial for a window. A ranking that sends the batch size back
to plain decoding during that window fails it and doubles the wait before the next probe (``window`` x 1, 2, 4, up
to ``window`` x :data:`~sequoia_opt.drafting.policies.adaptive.MAX_PROBE_BACKOFF` plain steps: the exponential
back-off of :class:`~sequoia_opt.drafting.policies.adaptive.TreeAdapter`'s guard); a chain that holds the window
passes it and resets the wait (a verdict on the probe's first ``every`` steps alone would pass by luck); so
where speculation does not pay the probes cost ``every / (window + every)`` of the steps at first (20 % at the
defaults, at the chains' speed) and fall to ``every / (8 window + every)`` (3 %). The defaults are
:class:`~sequoia_opt.drafting.policies.adaptive.AdaptiveTreePolicy`'s (16, 64, 8); ``--policy
adaptive-schedule:FILE`` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ...decoding.policy import StepView
from ...decoding.sampling import NodeVisit
from ...decoding.state import DecodeState, DraftSettings
from ...decoding.step_tree import TreeBuffers
from ...errors import ProfileError
from ...tree import Tree
from ..drafters import Drafter
from .adaptive import (DEFAULT_EVERY, DEFAULT_PRIOR_WEIGHT, DEFAULT_WINDOW, MAX_PROBE_BACKOFF, WindowedCounts,
                       _positive_int)
from .schedule import SchedulePolicy

__all__ = ["ChainEstimate", "PlanCandidates", "PlanResolve", "PlanAdapter", "AdaptiveSchedulePolicy",
           "hazards_from_chain_g", "chain_g_from_hazards"]


def hazards_from_chain_g(g: Sequence[float]) -> np.ndarray:
    """Per-depth conditional acceptance of a chain from its tokens per step G(0..K) (G(0) = 1, non-decreasing):
    ``h_0 = G(1) - 1``, ``h_d = (G(d + 1) - G(d)) / (G(d) - G(d - 1))`` (module docstring). (K,) float64 in
    [0, 1]; a depth after one whose increment is 0 gets 0.

    Raises:
        ProfileError: G(0) != 1, fewer than two entries, a non-finite entry.
    """
    g = np.asarray(g, dtype=np.float64)
    if g.ndim != 1 or g.size < 2 or not np.all(np.isfinite(g)) or abs(g[0] - 1.0) > 1e-9:
        raise ProfileError(f"chain tokens per step G(0..K) must start at G(0) = 1 and hold K >= 1 more, got {g.tolist()}")
    inc = np.maximum(np.diff(g), 0.0)  # (K,) G(k) - G(k - 1): P(drafts 1..k all accepted)
    prev = np.concatenate([[1.0], inc[:-1]])
    h = np.divide(inc, prev, out=np.zeros_like(inc), where=prev > 1e-12)
    return np.clip(h, 0.0, 1.0)


def chain_g_from_hazards(h: Sequence[float]) -> np.ndarray:
    """G(0..K) of chains under per-depth conditional acceptances ``h`` (K,): ``G(K) = 1 + sum_{j<=K} prod_{d<j}
    h_d``. (K + 1,) float64."""
    h = np.clip(np.asarray(h, dtype=np.float64), 0.0, 1.0)
    return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(h))])


class ChainEstimate(WindowedCounts):
    """The running per-depth acceptance of a chain (module docstring), over the last ``window`` steps.

    Args:
        prior_g: (K + 1,) the plan's G(0..K), tokens per step of chains of 0..K drafts.
        window: steps remembered (>= 1); a step's trials are every row's.
        prior_weight: pseudo-trials per depth the prior is worth (>= 0).

    Attributes:
        prior_hazards: (K,) ``h0``.  trials / hits: (K,) int64 counts over the window, per depth of the draft
            tried (index d: the draft at depth d + 1).  steps: steps added since :meth:`reset`.

    Raises:
        ProfileError: a bad ``prior_g`` (:func:`hazards_from_chain_g`).  DecodingError: ``window < 1`` or a
            negative / non-finite weight.
    """

    def __init__(self, prior_g: Sequence[float], *, window: int = DEFAULT_WINDOW,
                 prior_weight: float = DEFAULT_PRIOR_WEIGHT) -> None:
        self.prior_hazards = hazards_from_chain_g(prior_g)
        super().__init__(self.prior_hazards.size, window, prior_weight)

    @property
    def depth(self) -> int:
        """K, the deepest draft estimated."""
        return int(self.prior_hazards.size)

    def counts(self, visits: Iterable[NodeVisit]) -> tuple[np.ndarray, np.ndarray]:
        """(trials, hits), each (K,) int64, of one row's verification trials: a visit at depth d with a candidate
        tried its draft at depth d + 1 (a hit when rank 0 was accepted); trials deeper than K are not counted."""
        t = np.zeros(self.depth, dtype=np.int64)
        h = np.zeros(self.depth, dtype=np.int64)
        for v in visits:
            d = int(v.depth)
            if v.num_children < 1 or d >= self.depth:
                continue
            t[d] += 1
            h[d] += v.accepted_rank == 0
        return t, h

    def add_step(self, rows_visits: Iterable[Iterable[NodeVisit]]) -> int:
        """Count one step's trials (every row's; a plain step counts none and still takes its place in the
        window), dropping the step that leaves the window. Returns the trials it added."""
        t = np.zeros(self.depth, dtype=np.int64)
        h = np.zeros(self.depth, dtype=np.int64)
        for visits in rows_visits:
            tt, hh = self.counts(visits)
            t += tt
            h += hh
        self._add(t, h)
        return int(t.sum())

    @property
    def ratio(self) -> float:
        """``rho``: the window's hits over the hits the prior expects on the same trials, each with ``w``
        pseudo-hits at the prior's rate (1 with no trials)."""
        w = self.prior_weight
        expected = float(self.trials @ self.prior_hazards)
        return (float(self.hits.sum()) + w) / (expected + w) if expected + w > 0 else 1.0

    @property
    def hazards(self) -> np.ndarray:
        """(K,) per-depth conditional acceptance: counts shrunk towards the prior scaled by :attr:`ratio`."""
        w = self.prior_weight
        shifted = np.minimum(1.0, self.ratio * self.prior_hazards)
        den = self.trials + w
        est = np.divide(self.hits + w * shifted, den, out=shifted.copy(), where=den > 0)
        return np.clip(est, 0.0, 1.0)

    def g(self) -> np.ndarray:
        """(K + 1,) G(0..K) under :attr:`hazards`."""
        return chain_g_from_hazards(self.hazards)


@dataclass(frozen=True)
class PlanCandidates:
    """One measured batch size of a chain plan: per draft length K its step and length factor.

    Attributes:
        batch: b.  ks: (m,) draft lengths scored (0: plain decoding).  step_ms: (m,) ms of one step at b.
        length_factor: (m,) the rates' factor over the plan's answer length (1: steady state).
    """

    batch: int
    ks: tuple[int, ...]
    step_ms: tuple[float, ...]
    length_factor: tuple[float, ...]


@dataclass(frozen=True)
class PlanResolve:
    """One re-ranking of an adaptive plan.

    Attributes:
        step: steps decoded since the reset when it ran.  ranges: ``(lo, hi, K)`` chosen.  changed: whether they
        differ from the ranges they replace.  tokens_per_step: G(0..K) under the estimate.  ratio: the estimate's
        live-to-prior ratio.  trials: (K,) trials per depth in the window.  reason: ``scheduled`` (every
        ``every`` steps), ``probe`` (after a plain wait: the window drained, the prior's ranking), ``probe on
        trial`` (a ranking during the window after a probe that keeps its chain), ``probe failed`` (a ranking that
        drops it: the next wait doubles) or ``probe passed`` (the chain held a window: the wait is reset).
        backoff: the plain wait before the next probe, in windows.
    """

    step: int
    ranges: tuple[tuple[int, int, int], ...]
    changed: bool
    tokens_per_step: tuple[float, ...]
    ratio: float
    trials: tuple[int, ...]
    reason: str = "scheduled"
    backoff: int = 1

    def as_dict(self) -> dict[str, Any]:
        """The record as plain types for a run's results JSON (ranges as ``[lo, hi, K]`` lists; G and the ratio rounded
        to 4 decimals)."""
        return {"step": self.step, "ranges": [list(r) for r in self.ranges], "changed": self.changed,
                "tokens_per_step": [round(x, 4) for x in self.tokens_per_step], "ratio": round(self.ratio, 4),
                "trials": list(self.trials), "reason": self.reason, "backoff": self.backoff}


def _check_ks(batch: int, ks: list[int], where: str = "the plan") -> None:
    """Raises ProfileError unless ``ks`` (ascending) is every draft length from 0 to its last."""
    if ks != list(range(ks[-1] + 1)):
        raise ProfileError(f"{where}: batch {batch} scores draft lengths {ks}, not every K from 0 to {ks[-1]}: "
                           "re-ranking needs every K scored (a given schedule scores only its own settings; solve "
                           "the plan with treeopt tune)")


def _k_of(label: str, where: str) -> int:
    if label == "none":
        return 0
    if isinstance(label, str) and label.startswith("chain:") and label[6:].isdigit():
        return int(label[6:])
    raise ProfileError(f"{where}: an adaptive plan re-ranks chains; {label!r} is not one (none or chain:K)")


class PlanAdapter:
    """The adaptive plan's controller (module docstring).

    Args:
        candidates: per measured batch size, ascending, its :class:`PlanCandidates`, each scoring every draft
            length from 0 (plain decoding) to its longest (a first-is-longest plan scores fewer past its first
            batch size; a batch size is re-ranked among what it scored).
        prior_g: (K + 1,) the plan's G(0..K), K the longest candidate.
        ranges: the plan's own ranges ``(lo, hi, K)`` (the first steps run them).
        every: steps between re-rankings.  window / prior_weight: the estimate's (:class:`ChainEstimate`).
        min_gain: the plan's (a speculating K must beat plain decoding's rate by more than this fraction).
        first_is_longest: the plan's (no batch size drafts more than the smallest one).

    Attributes:
        ranges: the ranges in use.  estimate: the :class:`ChainEstimate`.  log: every :class:`PlanResolve`.
        backoff: the plain wait before the next probe, in windows (1 .. ``MAX_PROBE_BACKOFF``; module docstring).

    Raises:
        ProfileError: no batch size, batch sizes not ascending, a batch size not scoring every K from 0 to its
            longest, a K past ``prior_g``; a range whose K no candidate scores; ranges that do not cover 1..their end
            (:func:`~sequoia_opt.solver.schedule.check_ranges`).  DecodingError: bad ``every`` / ``window`` /
            ``prior_weight``.
    """

    def __init__(self, candidates: Sequence[PlanCandidates], prior_g: Sequence[float],
                 ranges: Sequence[tuple[int, int, int]], *, every: int = DEFAULT_EVERY, window: int = DEFAULT_WINDOW,
                 prior_weight: float = DEFAULT_PRIOR_WEIGHT, min_gain: float = 0.0,
                 first_is_longest: bool = False) -> None:
        from ...solver.schedule import check_ranges

        self.candidates = list(candidates)
        if not self.candidates:
            raise ProfileError("an adaptive plan needs at least one measured batch size")
        batches = [c.batch for c in self.candidates]
        if batches != sorted(set(batches)):
            raise ProfileError(f"an adaptive plan's batch sizes must be distinct and ascending, got {batches}")
        for c in self.candidates:
            _check_ks(c.batch, list(c.ks))
        self.ks = tuple(sorted({k for c in self.candidates for k in c.ks}))
        self.estimate = ChainEstimate(prior_g, window=window, prior_weight=prior_weight)
        if max(self.ks) > self.estimate.depth:
            raise ProfileError(f"the plan scores chains up to K = {max(self.ks)} but its G(K) stops at "
                               f"K = {self.estimate.depth}")
        self.initial = tuple((int(lo), int(hi), int(k)) for lo, hi, k in ranges)
        check_ranges(self.initial, "adaptive plan")
        for lo, hi, k in self.initial:  # a range's K must be one the live ranking can price and return to
            if k not in self.ks:
                raise ProfileError(f"the range {lo}-{hi} runs K = {k}, which no batch size's candidates score "
                                   f"(K in {list(self.ks)})")
        self.every = _positive_int("the steps between re-rankings", every)
        self.last = self.initial[-1][1]
        self.min_gain, self.first_is_longest = float(min_gain), bool(first_is_longest)
        self.reset()

    @classmethod
    def of_plan(cls, plan: Any, **kwargs: Any) -> "PlanAdapter":
        """From a solved :class:`~sequoia_opt.solver.schedule.Plan` of chains (its ranges start at 1).

        Raises:
            ProfileError: a plan scoring other shapes, or not every K from 0 to its longest (a given schedule
                predicted by ``plan_from_ranges`` scores only its own settings), or as the constructor.
        """
        rows = []
        for r in plan.rows:
            cs = sorted(r.candidates, key=lambda c: c.setting.draft_tokens)
            if any(c.setting.shape not in ("none", "chain") for c in cs):
                raise ProfileError("an adaptive plan re-ranks chains; this plan scores other shapes")
            ks = [c.setting.draft_tokens for c in cs]
            _check_ks(r.batch, ks)
            rows.append(PlanCandidates(r.batch, tuple(ks), tuple(c.cost.cost_ms for c in cs),
                                       tuple(c.length_factor for c in cs)))
        g = {c.setting.draft_tokens: c.cost.expected_tokens for c in plan.rows[0].candidates}
        ranges = [(1 if i == 0 else x.lo, x.hi, x.setting.draft_tokens) for i, x in enumerate(plan.ranges)]
        kwargs.setdefault("min_gain", getattr(plan, "min_gain", 0.0))
        kwargs.setdefault("first_is_longest", getattr(plan, "first_is_longest", False))
        return cls(rows, [g[k] for k in range(max(g) + 1)], ranges, **kwargs)

    @classmethod
    def of_document(cls, doc: Mapping[str, Any], where: str = "schedule", **kwargs: Any) -> "PlanAdapter":
        """From a ``treeopt-schedule/1`` mapping with its ``by_batch`` candidates (``treeopt tune --schedule``).

        Raises:
            ProfileError: no ``by_batch``, a candidate that is not a chain, a field missing or not a number.
        """
        rows_in = doc.get("by_batch")
        if not isinstance(rows_in, list) or not rows_in:
            raise ProfileError(f"{where}: no by_batch candidates to re-rank (write the plan with treeopt tune "
                               "--schedule FILE)")
        rows, g = [], {}
        for i, row in enumerate(rows_in):
            cands = row.get("candidates") if isinstance(row, dict) else None
            if not isinstance(cands, list) or not cands:
                raise ProfileError(f"{where}: by_batch[{i}].candidates must be a non-empty list")
            scored = []
            for j, c in enumerate(cands):
                at = f"{where}: by_batch[{i}].candidates[{j}]"
                if not isinstance(c, dict):
                    raise ProfileError(f"{at} must be a mapping")
                k = _k_of(c.get("setting"), at)
                lacks = [f for f in ("step_ms", "length_factor", "expected_tokens_per_step") if f not in c]
                if lacks:  # plans from before tune priced answer lengths have no length_factor
                    raise ProfileError(f"{at} lacks {', '.join(lacks)}: a plan written before treeopt tune recorded "
                                       "them; re-run treeopt tune --schedule FILE (schedule:FILE runs it as it is)")
                try:
                    ms, lf, gk = (float(c[f]) for f in ("step_ms", "length_factor", "expected_tokens_per_step"))
                except (KeyError, TypeError, ValueError):
                    raise ProfileError(f"{at}: step_ms, length_factor and expected_tokens_per_step must be "
                                       "numbers") from None
                if not (np.isfinite(ms) and ms > 0 and np.isfinite(lf) and lf > 0 and np.isfinite(gk) and gk >= 1):
                    raise ProfileError(f"{at}: step_ms and length_factor must be > 0 and expected_tokens_per_step "
                                       ">= 1")
                scored.append((k, ms, lf))
                g.setdefault(k, gk)
            scored.sort()
            b = row.get("batch")
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise ProfileError(f"{where}: by_batch[{i}].batch must be an integer >= 1")
            _check_ks(b, [k for k, _, _ in scored], where)
            rows.append(PlanCandidates(b, tuple(k for k, _, _ in scored), tuple(ms for _, ms, _ in scored),
                                       tuple(lf for _, _, lf in scored)))
        if sorted(g) != list(range(max(g) + 1)):
            raise ProfileError(f"{where}: the candidates must score every draft length 0..{max(g)}")
        from ...solver.schedule import SpecSetting

        ranges = []
        for i, e in enumerate(doc.get("ranges") or []):
            at = f"{where}: ranges[{i}]"
            rng = e.get("batch_range") if isinstance(e, dict) else None
            if not isinstance(rng, list) or len(rng) != 2:
                raise ProfileError(f"{at}.batch_range must be [lo, hi]")
            lo, hi = rng
            ranges.append((1 if i == 0 else lo, hi, _k_of(SpecSetting.from_dict(e.get("setting"), at).label, at)))
        min_gain = doc.get("min_gain")
        min_gain = 0.0 if min_gain is None else min_gain
        if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)) or not 0 <= min_gain < float("inf"):
            raise ProfileError(f"{where}: min_gain must be a number >= 0, got {min_gain!r}")
        first_is_longest = doc.get("first_is_longest", False)
        if not isinstance(first_is_longest, bool):
            raise ProfileError(f"{where}: first_is_longest must be true or false, got {first_is_longest!r}")
        kwargs.setdefault("min_gain", float(min_gain))
        kwargs.setdefault("first_is_longest", first_is_longest)
        try:
            return cls(rows, [g[k] for k in range(max(g) + 1)], ranges, **kwargs)
        except ProfileError as err:  # named by the file it came from
            raise ProfileError(str(err) if str(err).startswith(where) else f"{where}: {err}") from None

    def reset(self) -> None:
        """Start over: the plan's ranges, the prior, an empty log."""
        self.estimate.reset()
        self.ranges = self.initial
        self.log: list[PlanResolve] = []
        self._g = chain_g_from_hazards(self.estimate.prior_hazards)  # the latest ranking's G(0..K)
        self._predicted: list[float] = []  # per step, G of the chain it ran under the ranking in force
        self.backoff = 1
        self._idle = 0  # plain steps in a row at a batch size the ranking sent to plain decoding
        self._fresh = 0  # trials counted since the last ranking
        self._probe_batch: int | None = None  # the batch size a probe on trial measures
        self._probe_step = 0  # the step it started at

    def rank(self, g: Sequence[float]) -> tuple[tuple[int, int, int], ...]:
        """The ranges ``(lo, hi, K)`` that G(0..K) = ``g`` makes best: per measured batch size the K with the most
        tokens/s ``g[K] x length_factor / step_ms`` (ties to the shorter chain; ``min_gain`` and
        ``first_is_longest`` as :func:`~sequoia_opt.solver.schedule.solve_plan` applies them), merged as a plan
        merges (:func:`~sequoia_opt.solver.schedule.merge_ranges`); the first range starts at 1, the last ends
        where the plan's did.

        Raises:
            ProfileError: ``g`` shorter than the longest candidate + 1.
        """
        from ...solver.schedule import first_is_longest_choice, merge_ranges

        if len(g) < max(self.ks) + 1:
            raise ProfileError(f"G(0..K) needs {max(self.ks) + 1} entries, got {len(g)}")
        per_batch = [[(k, g[k] * lf / ms) for k, ms, lf in zip(c.ks, c.step_ms, c.length_factor)]
                     for c in self.candidates]

        def choose(i: int, cap: int | None) -> int:
            rates = {k: r for k, r in per_batch[i] if cap is None or k <= cap}
            top = max(rates.values())
            k = min(k for k, r in rates.items() if r >= top * (1 - 1e-12))
            if self.min_gain > 0 and k and top <= rates[0] * (1.0 + self.min_gain):
                k = 0
            return self.candidates[i].ks.index(k)

        idx = (first_is_longest_choice(per_batch, choose)[0] if self.first_is_longest
               else [choose(i, None) for i in range(len(per_batch))])
        best = [(c.batch, c.ks[i]) for c, i in zip(self.candidates, idx)]
        merged = merge_ranges(best, self.last)
        return tuple((1 if i == 0 else lo, hi, k) for i, (lo, hi, k) in enumerate(merged))

    @property
    def predicted_tokens_per_step(self) -> float | None:
        """The step-weighted mean over the steps counted of the G (tokens per step per row) of the chain each ran,
        under the ranking in force at that step (None before a step with its K given)."""
        return float(np.mean(self._predicted)) if self._predicted else None

    def k_at(self, batch: int, ranges: Sequence[tuple[int, int, int]] | None = None) -> int:
        """The draft length ``ranges`` (default: those in use) give ``batch`` live rows (the last range's past
        the end)."""
        from ...solver.schedule import range_value

        return range_value(self.ranges if ranges is None else ranges, batch)

    def end_step(self, rows_visits: Iterable[Iterable[NodeVisit]], k_used: int | None = None,
                 batch: int | None = None) -> tuple[tuple[int, int, int], ...] | None:
        """Count one step (every row's trials; ``k_used``: the draft length it ran, cut near an answer's end, for
        :attr:`predicted_tokens_per_step`; ``batch``: its live rows, for the probes) and every ``every`` steps
        re-rank, except while a batch size the ranking sent to plain decoding waits for its probe with nothing
        measured since the last ranking (module docstring; without ``batch``, every ``every`` steps). Returns the
        new ranges when they changed, else None."""
        self._fresh += self.estimate.add_step(rows_visits)
        if k_used is not None:
            self._predicted.append(float(self._g[min(int(k_used), len(self._g) - 1)]))
        waiting = batch is not None and self._probe_batch is None and self.k_at(batch) == 0
        self._idle = self._idle + 1 if waiting else 0
        if self.estimate.steps % self.every:
            return None
        wait_over = waiting and self._idle >= self.estimate.window * self.backoff
        if waiting and not wait_over and not self._fresh:
            return None
        g = self._g = self.estimate.g()
        ranges = self.rank(g)
        reason = "scheduled"
        if self._probe_batch is not None:  # a probe on trial: failed as soon as a ranking drops its chain, passed
            # once the chain has held a whole window (a first verdict on ``every`` steps would pass by luck alone)
            if not self.k_at(self._probe_batch, ranges):
                reason, self.backoff, self._probe_batch = "probe failed", min(2 * self.backoff, MAX_PROBE_BACKOFF), None
            elif self.estimate.steps - self._probe_step >= self.estimate.window:
                reason, self.backoff, self._probe_batch = "probe passed", 1, None
            else:
                reason = "probe on trial"
        elif wait_over:
            self._idle = 0
            if self.k_at(batch, ranges):  # the prior's ranking drafts here again: a probe
                reason, self._probe_batch, self._probe_step = "probe", batch, self.estimate.steps
        self._fresh = 0
        changed = ranges != self.ranges
        self.log.append(PlanResolve(self.estimate.steps, ranges, changed, tuple(float(x) for x in g),
                                    self.estimate.ratio, tuple(int(t) for t in self.estimate.trials), reason,
                                    self.backoff))
        self.ranges = ranges
        return ranges if changed else None

    def report(self) -> dict[str, Any]:
        """The adaptation as a mapping (for results files)."""
        return {"initial_ranges": [list(r) for r in self.initial], "final_ranges": [list(r) for r in self.ranges],
                "min_gain": self.min_gain, "first_is_longest": self.first_is_longest,
                "predicted_tokens_per_step": self.predicted_tokens_per_step,
                "prior_tokens_per_step": [round(float(x), 4) for x in chain_g_from_hazards(self.estimate.prior_hazards)],
                "every": self.every, "window": self.estimate.window, "prior_weight": self.estimate.prior_weight,
                "steps": self.estimate.steps, "backoff": self.backoff,
                "probes": sum(r.reason == "probe" for r in self.log), "resolves": [r.as_dict() for r in self.log]}

    as_dict = report  # the name ``treeopt run``'s report reads an adapter by (as TreeAdapter's)


class AdaptiveSchedulePolicy(SchedulePolicy):
    """A chain plan whose ranges are re-ranked during the run by a :class:`PlanAdapter` (module docstring).

    The re-ranking runs in :meth:`observe`, inside the step's timed bookkeeping, so the measured tokens/s pays
    for it. The estimate runs across generations (the run is the workload); :meth:`restart` starts it over.

    Args:
        drafter: the drafter every chain drafts with.  adapter: the :class:`PlanAdapter` (reset here).
        name: the drafter's label.

    Raises:
        DecodingError: (at bind) as :class:`~sequoia_opt.drafting.policies.static.StaticTreePolicy`.
    """

    def __init__(self, drafter: Drafter, adapter: PlanAdapter, name: str = "draft") -> None:
        adapter.reset()
        self.chains = {k: Tree.chain(k + 1) for k in adapter.ks}
        super().__init__(drafter, self._trees(adapter.ranges), name, capacity=self.chains[max(adapter.ks)])
        self.adapter = adapter

    def _trees(self, ranges: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, Tree]]:
        return [(lo, hi, self.chains[k]) for lo, hi, k in ranges]

    def bind(self, settings: DraftSettings) -> None:
        super().bind(settings)
        for t in self.chains.values():
            self._compiled.setdefault(id(t), TreeBuffers.build(t, settings.device))

    def restart(self) -> None:
        """Start the adaptation over (the plan's ranges, the prior)."""
        self.adapter.reset()
        self.ranges = self._trees(self.adapter.ranges)

    def observe(self, state: DecodeState, step: StepView) -> None:
        super().observe(state, step)
        new = self.adapter.end_step([acc.visits for acc in step.acceptances], self.step_depth,  # the chain it ran:
                                    len(state.rows))  # cut near an answer's end, K there
        if new is not None:
            self.ranges = self._trees(new)
