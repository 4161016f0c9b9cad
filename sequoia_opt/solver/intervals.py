"""Intervals between prompts: how far a predicted figure (an acceptance entry, a tree's tokens per step, its
speedup) may move on another set of prompts of the same kind.

Why not the Wilson interval of the tokens. The trials of one prompt are correlated (a prompt that repeats its
own lines accepts long runs step after step), so an interval that counts every token as an independent draw is
far too narrow for a new set of prompts: on the demo pair a profile's p_1 of 0.51 had a token interval of
0.48-0.54 while the next 20 prompts of the same source measured about 0.40 (issue 31). The prompt is the unit
here, as it is for the measured tokens per step (:func:`~sequoia_opt.jobs.run.tokens_per_step_ci95`).

Method (a cluster bootstrap over prompts; Davison & Hinkley 1997, section 3.8, resampling clusters). An
acceptance profile keeps its trials' outcomes per prompt (``counts_by_prompt``, (P, D, K + 1)). A replicate
draws P prompts with replacement (multinomial weights), sums their counts, and computes the figure from the
resampled vectors exactly as the solver computes it from the profile (the pooled positional vector, or the
per-depth rows of the ``by-depth`` model). The replicates' standard deviation, times ``sqrt(P / (P - 1))``, is
the standard error ``se`` of the figure estimated from P prompts; ``sd = se * sqrt(P)`` is the spread of the
figure between single prompts. (The factor: the bootstrap draws from the P prompts as they are, so its variance
of a mean is the plug-in ``(P - 1) / P`` of the unbiased one, and the factor widens every interval by 2.6 % at
P = 20, 11.8 % at P = 5. Davison & Hinkley 1997, section 2.3.) Then, with Student's t at P - 1 degrees of freedom
(95 %)::

    interval of the mean                      point +- t * se
    prediction interval, a new set of m prompts  point +- t * sd * sqrt(1/P + 1/m)

the second adding the new set's own variation between prompts (sd^2 / m) to the estimate's (sd^2 / P): the
range the figure measured on m prompts that the profile never saw should fall in, 95 times in 100. (The normal
form with the bootstrap's se, rather than the bootstrap's percentiles, lets one stored pair (se, P) give the
interval for any m: ``treeopt run`` rescales a tree file's spread to its own number of prompts.) The number of
prompts for an interval of the mean of width W is ``ceil((2 t sd / W)^2)``.

What is not in it: the latency profile's timing noise (a speedup interval scales the tokens-per-step interval
by the step's fixed cost ratio), and a shift of kind (code profile, prose traffic): no interval of one kind
covers another, which is what the run's guard is for (:mod:`sequoia_opt.drafting.policies.adaptive`).

Library use (one figure, a tree's expected tokens per step on a new set of 16 prompts)::

    from sequoia_opt.profiles import load_acceptance
    from sequoia_opt.solver.intervals import tree_spread, speedup_spread
    acc = load_acceptance("acceptance-greedy.yaml")
    g = tree_spread(tree, acc)                    # PromptSpread (None: an old profile without per-prompt counts)
    g.point, g.mean_interval(), g.prediction_interval(16)
    s = speedup_spread(g, step_cost)              # the speedup's, from the tree's StepCost
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import SolverError
from ..profiles.common import Z975
from ..tree import Tree

__all__ = ["PromptSpread", "t975", "bootstrap_se", "resample_prompt_counts", "bootstrap_rows", "tree_values",
           "value_spread", "tree_spread", "tree_spreads", "speedup_spread", "acceptance_spreads", "prediction_interval",
           "spread_metadata", "ratio_spread", "step_variance", "DEFAULT_REPLICATES"]

#: Bootstrap replicates (resamples of the profile's prompts) per figure.
DEFAULT_REPLICATES = 1000

# two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom; the normal quantile past that
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    """The two-sided 95 % quantile of Student's t with ``df`` >= 1 degrees of freedom (1.96 past 30).

    Raises:
        SolverError: ``df`` < 1 (one prompt has no spread to scale).
    """
    if df < 1:
        raise SolverError(f"Student's t needs at least 1 degree of freedom (2 prompts), got {df}")
    return _T975[df - 1] if df <= len(_T975) else Z975


def prediction_interval(point: float, se: float, prompts: int, new_prompts: int,
                        clip: tuple[float | None, float | None] = (None, None),
                        extra_variance: float = 0.0) -> tuple[float, float]:
    """The 95 % prediction interval of a figure measured on ``new_prompts`` prompts the estimate never saw:
    ``point +- t(P - 1) * se * sqrt(P) * sqrt(1/P + 1/m)`` (module docstring), clipped to ``clip``;
    ``extra_variance``: what a new prompt's figure varies beyond the profile's single prompts (added to their
    variance ``se^2 P``: :meth:`PromptSpread.prediction_interval`).

    Raises:
        SolverError: ``prompts`` below 2 or ``new_prompts`` below 1.
    """
    if prompts < 2:
        raise SolverError(f"an interval between prompts needs at least 2 prompts, got {prompts}")
    if new_prompts < 1:
        raise SolverError(f"a new prompt set has at least 1 prompt, got {new_prompts}")
    half = t975(prompts - 1) * se * math.sqrt(prompts) * math.sqrt(1.0 / prompts + 1.0 / new_prompts)
    if extra_variance > 0:
        half = math.hypot(half, t975(prompts - 1) * math.sqrt(extra_variance / new_prompts))
    return _clip(point - half, point + half, clip)


def _clip(lo: float, hi: float, clip: tuple[float | None, float | None]) -> tuple[float, float]:
    a, b = clip
    return (lo if a is None else max(lo, a), hi if b is None else min(hi, b))


@dataclass(frozen=True)
class PromptSpread:
    """A predicted figure with its spread between prompts (module docstring).

    Attributes:
        point: the figure from the whole profile (tokens per step, a speedup, an acceptance probability).
        se: its standard error over the profile's P prompts (the bootstrap replicates' standard deviation).
        prompts: P, the prompts the estimate comes from (>= 2).
        replicates: bootstrap replicates behind ``se`` (0: derived, e.g. scaled from another spread).
        clip: (low, high) bounds of the figure's range (tokens per step >= 1, a probability in [0, 1]).
        step_variance / steps_per_prompt: for tokens per step, the variance of one step's tokens under the
            prediction's own model (:func:`step_variance`) and the steps each profile prompt contributed (its
            trials at depth 1). A new set's prompts that run fewer steps each average less of that step noise
            than the profile's did: :meth:`prediction_interval` widens for them (None: not recorded).
    """

    point: float
    se: float
    prompts: int
    replicates: int = 0
    clip: tuple[float | None, float | None] = (None, None)
    step_variance: float | None = None
    steps_per_prompt: float | None = None

    @property
    def sd(self) -> float:
        """The figure's standard deviation between single prompts, ``se * sqrt(P)``."""
        return self.se * math.sqrt(self.prompts)

    def mean_interval(self) -> tuple[float, float]:
        """95 % interval of the mean over prompts of this kind: ``point +- t(P - 1) * se``."""
        half = t975(self.prompts - 1) * self.se
        return _clip(self.point - half, self.point + half, self.clip)

    def prediction_interval(self, new_prompts: int, steps_per_prompt: float | None = None) -> tuple[float, float]:
        """95 % interval of the figure measured on ``new_prompts`` new prompts (:func:`prediction_interval`).

        ``steps_per_prompt``: the new prompts' mean steps each (a run knows its own). The spread between single
        prompts this profile measured holds step noise averaged over its own ``steps_per_prompt``; prompts of
        fewer steps average less of it, so their spread is ``sd^2 + step_variance (1/n_new - 1/n_profile)``
        (never narrowed below the profile's). A fidelity tryout's 12-token answers had 2.3-3.2 times the
        profile's spread between prompts, and 48-88 % of its sets fell inside the interval that ignored it.
        """
        extra = 0.0
        if steps_per_prompt is not None and self.step_variance and self.steps_per_prompt and steps_per_prompt > 0:
            extra = max(0.0, self.step_variance * (1.0 / steps_per_prompt - 1.0 / self.steps_per_prompt))
        return prediction_interval(self.point, self.se, self.prompts, new_prompts, self.clip, extra)

    def prompts_needed(self, width: float) -> int:
        """Prompts whose interval of the mean is at most ``width`` wide (full width, the figure's unit): the
        smallest N >= 2 with ``2 t(N - 1) sd / sqrt(N) <= width``, the interval those N prompts will report (the
        sd this profile estimated standing for theirs). The t of the N prompts, not of this profile's: a 4-prompt
        profile's t(3) = 3.18 asked for 2.6 times the prompts a 1.96 needs.

        Raises:
            SolverError: ``width`` not positive.
        """
        if not width > 0:
            raise SolverError(f"an interval width must be positive, got {width!r}")
        if self.sd == 0:
            return 2
        n = max(2, math.ceil((2.0 * Z975 * self.sd / width) ** 2))  # t >= z: at least this many
        while 2.0 * t975(n - 1) * self.sd / math.sqrt(n) > width:
            n += 1  # t(n - 1) falls to z by n = 31: a few steps at most
        return n

    def scaled(self, factor: float, clip: tuple[float | None, float | None] = (0.0, None)) -> "PromptSpread":
        """The spread of ``factor`` x the figure (a speedup from tokens per step at a fixed step cost)."""
        var = None if self.step_variance is None else self.step_variance * factor * factor
        return PromptSpread(self.point * factor, self.se * abs(factor), self.prompts, self.replicates, clip, var,
                            self.steps_per_prompt)

    def to_dict(self, new_prompts: int | None = None) -> dict[str, Any]:
        """``{point, se, prompts, mean_interval, [new_prompts, prediction_interval]}`` for files and JSON."""
        d: dict[str, Any] = {"point": float(self.point), "se": float(self.se), "prompts": int(self.prompts),
                             "replicates": int(self.replicates),
                             "mean_interval": [float(x) for x in self.mean_interval()]}
        if self.step_variance is not None and self.steps_per_prompt is not None:
            d["step_variance"], d["steps_per_prompt"] = float(self.step_variance), float(self.steps_per_prompt)
        if new_prompts is not None:
            d["new_prompts"] = int(new_prompts)
            d["prediction_interval"] = [float(x) for x in self.prediction_interval(new_prompts)]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], clip: tuple[float | None, float | None] = (None, None)
                  ) -> "PromptSpread | None":
        """The spread a :meth:`to_dict` mapping records; None when it is not one (a hand-edited or older file:
        the caller shows no interval rather than failing)."""
        try:
            point, se, prompts = float(d["point"]), float(d["se"]), int(d["prompts"])
            replicates = int(d.get("replicates") or 0)
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        if not (math.isfinite(point) and math.isfinite(se) and se >= 0 and prompts >= 2):
            return None
        try:
            var, steps = float(d["step_variance"]), float(d["steps_per_prompt"])
        except (KeyError, TypeError, ValueError, OverflowError):
            var = steps = None  # an older file: the interval as it was
        if var is not None and not (math.isfinite(var) and var >= 0 and math.isfinite(steps) and steps > 0):
            var = steps = None
        return cls(point, se, prompts, replicates, clip, var, steps)


# ---------------------------------------------------------------------------------------------- bootstrap
def resample_prompt_counts(prompt_counts: np.ndarray, replicates: int = DEFAULT_REPLICATES,
                           seed: int = 0) -> np.ndarray:
    """Cluster bootstrap of per-prompt counts: ``replicates`` resamples of the P prompts with replacement,
    each summed. ``prompt_counts`` (P, ...) int; returns (replicates, ...) int64 (the sums).

    Raises:
        SolverError: fewer than 2 prompts.
    """
    c = np.asarray(prompt_counts, dtype=np.int64)
    P = c.shape[0]
    if P < 2:
        raise SolverError(f"an interval between prompts needs at least 2 prompts, got {P}")
    rng = np.random.default_rng(seed)
    w = rng.multinomial(P, np.full(P, 1.0 / P), size=replicates)  # (B, P) times each prompt is drawn
    return np.tensordot(w, c, axes=(1, 0)).astype(np.int64)  # (B, ...)


def bootstrap_se(values: np.ndarray, prompts: int) -> np.ndarray | float:
    """The standard error of a figure from its cluster-bootstrap replicates over ``prompts`` prompts: the
    replicates' standard deviation times ``sqrt(P / (P - 1))`` (module docstring: the plug-in bootstrap's variance
    of a mean is ``(P - 1) / P`` of the unbiased estimate). ``values`` (B,) replicates of one figure: a float;
    (B, F) of F figures: (F,).

    Raises:
        SolverError: fewer than 2 prompts.
    """
    if prompts < 2:
        raise SolverError(f"an interval between prompts needs at least 2 prompts, got {prompts}")
    sd = np.std(np.asarray(values, dtype=np.float64), axis=0, ddof=1) * math.sqrt(prompts / (prompts - 1))
    return float(sd) if np.ndim(sd) == 0 else sd


def _rows_of(counts: np.ndarray, depths: Sequence[int] | None) -> np.ndarray:
    """(B, R, K) acceptance rows from (B, D, K + 1) counts: the pooled vector (R = 1) when ``depths`` is None,
    else :meth:`~sequoia_opt.profiles.AcceptanceProfile.depth_rows`' rows over the stored depths (a depth not
    stored, or without a trial in a replicate, repeats the row above; the first falls back to the pooled)."""
    pooled = counts.sum(axis=1)  # (B, K + 1)
    n = pooled.sum(axis=1, keepdims=True)
    pooled_p = np.divide(pooled[:, :-1], n, out=np.zeros(pooled[:, :-1].shape), where=n > 0)  # (B, K)
    if depths is None:
        return pooled_p[:, None, :]
    stored = set(depths)
    rows, last = [], pooled_p
    for d in range(1, max(stored) + 1):
        if d in stored and d <= counts.shape[1]:
            c = counts[:, d - 1]  # (B, K + 1)
            m = c.sum(axis=1, keepdims=True)
            v = np.divide(c[:, :-1], m, out=np.zeros(c[:, :-1].shape), where=m > 0)
            last = np.where(m > 0, v, last)
        rows.append(last)
    return np.stack(rows, axis=1)


def bootstrap_rows(profile, model: str = "auto", replicates: int = DEFAULT_REPLICATES,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray] | None:
    """The profile's acceptance rows and their bootstrap replicates under the value model ``model``
    (:func:`~sequoia_opt.solver.depth.resolve_acceptance_model`: the pooled vector, or the per-depth rows).

    Returns:
        ``(rows, replicates)``: (R, K) the profile's own rows (as the solver reads them) and (B, R, K) the
        resampled ones; None when the profile has no per-prompt counts or fewer than 2 prompts (an old file).

    Raises:
        SolverError: as :func:`~sequoia_opt.solver.depth.resolve_acceptance_model`.
    """
    from .depth import resolve_acceptance_model

    pc = getattr(profile, "prompt_counts", None)
    if pc is None or pc.shape[0] < 2:
        return None
    used = resolve_acceptance_model(profile, model)
    depths = sorted(profile.by_depth) if used == "by-depth" else None
    rows = profile.depth_rows() if used == "by-depth" else profile.acceptance[None, :]
    boot = _rows_of(resample_prompt_counts(pc, replicates, seed), depths)
    return np.asarray(rows, dtype=np.float64), boot


def tree_values(tree: Tree, rows: np.ndarray) -> np.ndarray:
    """G(tree), expected tokens per step, under each of B sets of acceptance rows, vectorised.

    Args:
        tree: any tree (breadth-first, parents before children).
        rows: (B, R, K) float64; row r of a set scores children at depth r + 1 (deeper levels the last row),
            rank k its entry k (a rank past K scores 0), as
            :func:`~sequoia_opt.solver.depth.expected_tokens_by_depth` (R = 1: Sequoia's positional G).

    Returns:
        (B,) float64.
    """
    rows = np.asarray(rows, dtype=np.float64)
    B, R, K = rows.shape
    prob = np.ones((B, tree.size))
    depth, parent, rank = tree.depth, tree.parent, tree.rank
    for v in range(1, tree.size):
        k = int(rank[v])
        w = rows[:, min(int(depth[v]) - 1, R - 1), k] if k < K else 0.0
        prob[:, v] = prob[:, parent[v]] * w
    return prob.sum(axis=1)


def value_spread(profile, value: Callable[[np.ndarray], np.ndarray], *, model: str = "auto",
                 replicates: int = DEFAULT_REPLICATES, seed: int = 0,
                 clip: tuple[float | None, float | None] = (None, None)) -> PromptSpread | None:
    """The spread between prompts of any figure computed from acceptance rows (module docstring).

    Args:
        profile: an :class:`~sequoia_opt.profiles.AcceptanceProfile` with per-prompt counts.
        value: maps (B, R, K) rows to (B,) figures (e.g. ``lambda r: tree_values(tree, r)``; a batch plan's
            tokens per second at one batch size).
        model: the value model the figure is solved under (``auto``, ``positional``, ``by-depth``).
        replicates, seed: the bootstrap's.  clip: the figure's range.

    Returns:
        :class:`PromptSpread` (its point: the figure from the profile's own rows), or None for a profile
        without per-prompt counts (written before they existed) or with one prompt.
    """
    got = bootstrap_rows(profile, model, replicates, seed)
    if got is None:
        return None
    rows, boot = got
    point = float(np.asarray(value(rows[None]))[0])
    vals = np.asarray(value(boot), dtype=np.float64)
    P = int(profile.prompt_counts.shape[0])
    return PromptSpread(point, bootstrap_se(vals, P), P, int(replicates), clip)


def tree_spread(tree: Tree, profile, *, model: str = "auto", replicates: int = DEFAULT_REPLICATES,
                seed: int = 0) -> PromptSpread | None:
    """The spread between prompts of a tree's expected tokens per step G (a chain is a tree of width 1) under
    the profile's value model; None for a profile without per-prompt counts. Clipped to [1, D + 1] tokens per step
    (a step emits at least the bonus token and at most the deepest path's D tokens and the bonus)."""
    spreads = tree_spreads([tree], profile, model=model, replicates=replicates, seed=seed)
    return None if spreads is None else spreads[0]


def tree_spreads(trees: Sequence[Tree], profile, *, model: str = "auto", replicates: int = DEFAULT_REPLICATES,
                 seed: int = 0) -> list[PromptSpread] | None:
    """:func:`tree_spread` of several trees from one resample of the profile's prompts (the same replicates for
    every tree, as separate calls with one seed would draw them); None for a profile without per-prompt counts."""
    got = bootstrap_rows(profile, model, replicates, seed)
    if got is None:
        return None
    rows, boot = got
    pc = np.asarray(profile.prompt_counts)
    P = int(pc.shape[0])
    steps = float(pc[:, 0, :].sum(axis=1).mean())  # each profile prompt's trials at depth 1: its steps
    return [PromptSpread(float(tree_values(t, rows[None])[0]), bootstrap_se(tree_values(t, boot), P), P,
                         int(replicates), (1.0, float(t.tree_depth + 1)), step_variance(t, rows),
                         steps if steps > 0 else None) for t in trees]


def step_variance(tree: Tree, rows: np.ndarray) -> float:
    """The variance of one step's emitted tokens X under acceptance rows (R, K) (:func:`tree_values`' model):
    with r_d the probability the accepted path reaches depth d (the sum of depth d's path probabilities),
    ``E[X - 1] = sum r_d`` and ``E[(X - 1)^2] = sum (2d - 1) r_d``."""
    from .depth import path_probabilities_by_depth

    prob = path_probabilities_by_depth(tree, np.asarray(rows, dtype=np.float64))
    depth = np.asarray(tree.depth)
    r = np.bincount(depth, weights=prob)[1:]  # r_1 .. r_D
    d = np.arange(1, len(r) + 1)
    return float(max(0.0, ((2 * d - 1) * r).sum() - r.sum() ** 2))


def speedup_spread(tokens: PromptSpread, step) -> PromptSpread:
    """The speedup's spread from the tokens-per-step spread and the tree's
    :class:`~sequoia_opt.solver.hardware.StepCost` (speedup = G x plain ms per token / step ms, the step's cost
    fixed: the acceptance's variation between prompts, not the latency profile's timing noise)."""
    factor = step.speedup / step.expected_tokens if step.expected_tokens else 0.0
    return tokens.scaled(factor)


def acceptance_spreads(profile, replicates: int = DEFAULT_REPLICATES, seed: int = 0) -> list[PromptSpread] | None:
    """The spread between prompts of every pooled p_k, then of the acceptance mass sum p_k (K + 1 entries);
    None for a profile without per-prompt counts."""
    got = bootstrap_rows(profile, "positional", replicates, seed)
    if got is None:
        return None
    rows, boot = got
    point = np.concatenate([rows[0], [rows[0].sum()]])
    vals = np.concatenate([boot[:, 0, :], boot[:, 0, :].sum(axis=1, keepdims=True)], axis=1)  # (B, K + 1)
    P = int(profile.prompt_counts.shape[0])
    se = bootstrap_se(vals, P)
    return [PromptSpread(float(p), float(s), P, int(replicates), (0.0, 1.0)) for p, s in zip(point, se)]


def spread_metadata(tree: Tree, profile, model: str = "auto", step=None,
                    new_prompts: int | None = None) -> dict[str, Any]:
    """What a tree file records of its prediction's spread between prompts: ``tokens_per_step_spread`` and, with the
    tree's :class:`~sequoia_opt.solver.hardware.StepCost` ``step``, ``speedup_spread`` (:meth:`PromptSpread.to_dict`
    with the prediction interval for ``new_prompts``, default the profile's count); ``treeopt run`` rescales them to
    its own number of prompts. Empty for a profile without per-prompt counts."""
    g = tree_spread(tree, profile, model=model)
    if g is None:
        return {}
    m = g.prompts if new_prompts is None else int(new_prompts)
    out = {"tokens_per_step_spread": g.to_dict(m)}
    if step is not None:
        out["speedup_spread"] = speedup_spread(g, step).to_dict(m)
    return out


def ratio_spread(numerators: Sequence[float], denominators: Sequence[float], *, replicates: int = DEFAULT_REPLICATES,
                 seed: int = 0, clip: tuple[float | None, float | None] = (None, None)) -> PromptSpread | None:
    """The spread between prompts of a ratio of sums, per prompt ``numerators[i] / denominators[i]`` pooled as
    ``sum(num) / sum(den)`` (a measured tokens per step: tokens over steps of each prompt), by the cluster
    bootstrap over prompts. None with fewer than 2 prompts or a zero denominator sum."""
    y = np.asarray(numerators, dtype=np.float64)
    x = np.asarray(denominators, dtype=np.float64)
    if y.size < 2 or x.sum() <= 0:
        return None
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(y.size, np.full(y.size, 1.0 / y.size), size=replicates)  # (B, P)
    den = draws @ x
    vals = np.divide(draws @ y, den, out=np.full(replicates, y.sum() / x.sum()), where=den > 0)
    return PromptSpread(float(y.sum() / x.sum()), bootstrap_se(vals, int(y.size)), int(y.size), int(replicates), clip)
