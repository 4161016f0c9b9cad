"""Profiles for a pair of drafters, and the graft scheduler's offline training (TreeGraft, 2026).

**The conditional acceptance vector.** Grafting needs, besides each drafter's own vector, the strong
drafter's positional acceptance *for candidates the light drafter did not already propose at that node*.
It is measured with the decoder's own verifier on a measurement plan (:func:`pair_measurement_plan`): a
light rank-0 spine of depth D where every spine node proposes A light candidates and then B strong
candidates grafted next to them (the strong's top-B tokens, or B samples, with the light's A removed). Each
spine node the accepted path reaches is one trial; its outcome is the light candidate of rank r accepted
(outcome r), the strong candidate of conditional rank r (outcome A + r), or none (outcome A + B), counted per
depth of the children, exactly like :mod:`~sequoia_opt.profiling.acceptance`'s single-drafter vectors.

**The scheduler's value.** With the strong drafter called at every step of a graft plan, each step records
the scheduler's features (:class:`~sequoia_opt.drafting.policies.GraftFeatures`), the nodes accepted in the
whole tree, and the nodes accepted in the light drafter's part alone (the accepted path's prefix on light
nodes: under greedy verification exactly what the light-only tree would have accepted, since it accepts the
longest prefix of the target's own continuation). The value of calling the strong drafter at that step, in
tokens, is the extra accepted nodes minus what its cost buys without it:

    value = (accepted_full - accepted_light) - r * (strong_ms + T(n_full) - T(n_light))

with r = tokens per ms of the light-only tree (its predicted tokens per step over its step cost, from the
same run). Calling is worth it exactly when value > 0 (it then raises tokens per second). A logistic model of
``value > 0`` on the features, each step weighted by ``|value|`` (the steps where the choice matters most
count most), is the shipped scheduler (:func:`train_scheduler`); its card says how much of the offline
oracle's value it keeps on held-out steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..decoding import Decoder
from ..drafting.drafters import Drafter
from ..drafting.policies import AlwaysGraft, GraftPolicy, LogisticScheduler
from ..errors import ProfileError
from ..model import Transformer
from ..profiles import LatencyCurve
from ..tree import Tree

__all__ = ["pair_measurement_plan", "PairCounts", "measure_pair_acceptance", "SchedulerSample",
           "collect_scheduler_samples", "train_scheduler", "scheduler_value", "require_sklearn", "NothingToLearn"]

ProgressFn = Callable[[str, int, int], None]


def pair_measurement_plan(light_width: int, strong_width: int, depth: int) -> tuple[Tree, list[int]]:
    """The plan that measures a pair: a light rank-0 spine of ``depth`` levels where every spine node has
    ``light_width`` light children then ``strong_width`` strong ones. Returns the tree and each node's drafter
    (0 light, 1 strong). Size ``1 + (A + B) * D``.

    Raises:
        ProfileError: a width below 1 (A, B) or a depth below 1.
    """
    if light_width < 1 or strong_width < 1 or depth < 1:
        raise ProfileError(f"a pair measurement needs light and strong widths >= 1 and depth >= 1, got "
                           f"{light_width}, {strong_width}, {depth}")
    W = light_width + strong_width
    tree = Tree.from_choices([[0] * d + [r] for d in range(depth) for r in range(W)])
    labels = [0] + [int(c[-1] >= light_width) for c in tree.choices()]
    return tree, labels


@dataclass
class PairCounts:
    """Trial outcomes of a pair measurement.

    Attributes:
        light_width, strong_width: A and B.
        by_depth: depth of the proposed children (1 = the root's) -> (A + B + 1,) int64 counts: light rank r
            (index r), strong conditional rank r (index A + r), none accepted (index A + B).
        steps, tokens: decoding steps run and tokens emitted; strong_ms / light_ms: total drafter time (ms).
    """

    light_width: int
    strong_width: int
    by_depth: dict[int, np.ndarray] = field(default_factory=dict)
    steps: int = 0
    tokens: int = 0
    light_ms: float = 0.0
    strong_ms: float = 0.0

    def add(self, depth: int, outcome: int) -> None:
        row = self.by_depth.setdefault(depth, np.zeros(self.light_width + self.strong_width + 1, dtype=np.int64))
        row[outcome] += 1

    @property
    def counts(self) -> np.ndarray:
        """(A + B + 1,) counts over every depth."""
        out = np.zeros(self.light_width + self.strong_width + 1, dtype=np.int64)
        for row in self.by_depth.values():
            out += row
        return out

    @property
    def trials(self) -> int:
        return int(self.counts.sum())


def measure_pair_acceptance(
    target: Transformer, light: Callable[[], Drafter], strong: Callable[[], Drafter],
    prompts: Sequence[Sequence[int]], *, light_width: int, strong_width: int, depth: int = 4,
    temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, max_new_tokens: int = 64,
    eos_ids: Sequence[int] = (), backend: str = "auto", progress: ProgressFn | None = None,
) -> PairCounts:
    """Run :func:`pair_measurement_plan` with the strong drafter called every step and count the trials
    (module docstring).

    Args:
        target: the target model.
        light, strong: functions making a fresh drafter each (light first).
        prompts: token-id lists.
        light_width, strong_width, depth: A, B and D of the measurement plan.
        temperature, top_p, seed: 0 = greedy; > 0 sampling (the strong's candidates are then samples of its q
            with the light's removed).
        max_new_tokens: tokens generated per prompt.

    Returns:
        :class:`PairCounts`.

    Raises:
        DecodingError: vocabularies or devices differ, a request does not fit: before decoding.
    """
    tree, labels = pair_measurement_plan(light_width, strong_width, depth)
    gen = torch.Generator(device=target.device)
    gen.manual_seed(seed)
    policy = GraftPolicy(light(), strong(), tree, labels, scheduler=AlwaysGraft(), cut_at_answer_end=False)
    dec = Decoder(target, policy, temperature=temperature, top_p=top_p, generator=gen, eos_ids=eos_ids,
                  backend=backend)
    for p in prompts:
        dec.check(p, max_new_tokens)
    W = light_width + strong_width
    counts = PairCounts(light_width, strong_width)
    for i, p in enumerate(prompts):
        res = dec.generate(p, max_new_tokens)
        for s in res.steps:
            counts.steps += 1
            counts.tokens += s.accepted_len
            if s.drafter_ms:
                counts.light_ms += s.drafter_ms[0]
                counts.strong_ms += s.drafter_ms[1]
            for v in s.visits:
                if v.num_children == W:
                    counts.add(v.depth + 1, W if v.accepted_rank is None else v.accepted_rank)
        if progress:
            progress(f"pair acceptance, prompt {i + 1}/{len(prompts)}", i + 1, len(prompts))
    return counts


@dataclass(frozen=True)
class SchedulerSample:
    """One step of a graft plan run with the strong drafter called (module docstring).

    Attributes:
        features: the scheduler's features, :data:`~sequoia_opt.drafting.policies.FEATURE_NAMES` order.
        accepted_full / accepted_light: nodes accepted in the whole tree / in the light part alone.
        strong_ms / light_ms: the drafters' wall time this step (ms).
        n_full / n_light: tree sizes with and without the strong drafter's nodes.
        prompt_index: which prompt the step belongs to (for held-out splits by prompt).
    """

    features: tuple[float, ...]
    accepted_full: int
    accepted_light: int
    strong_ms: float
    light_ms: float
    n_full: int
    n_light: int
    prompt_index: int


def collect_scheduler_samples(
    target: Transformer, light: Callable[[], Drafter], strong: Callable[[], Drafter], plan: Tree,
    plan_drafter: Sequence[int], prompts: Sequence[Sequence[int]], *, max_new_tokens: int = 64,
    temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, eos_ids: Sequence[int] = (),
    backend: str = "auto", progress: ProgressFn | None = None,
) -> list[SchedulerSample]:
    """Run the graft ``plan`` with the strong drafter called at every step (no step's choice is skipped) and
    record one :class:`SchedulerSample` per step where the plan could graft (full-size steps).

    Raises:
        DecodingError: as :func:`measure_pair_acceptance`.
    """
    gen = torch.Generator(device=target.device)
    gen.manual_seed(seed)
    policy = GraftPolicy(light(), strong(), plan, plan_drafter, scheduler=AlwaysGraft(), cut_at_answer_end=False)
    dec = Decoder(target, policy, temperature=temperature, top_p=top_p, generator=gen, eos_ids=eos_ids,
                  backend=backend)
    for p in prompts:
        dec.check(p, max_new_tokens)
    out: list[SchedulerSample] = []
    for i, p in enumerate(prompts):
        state = dec.start(p, max_new_tokens)
        while not state.finished:
            dec.step(state)
            stats = state.result.steps[-1]
            if stats.tree_size != plan.size or policy.last_features is None:
                continue
            path_nodes = stats.accepted_drafters
            light_acc = 0
            for d in path_nodes:
                if d != 0:
                    break
                light_acc += 1
            out.append(SchedulerSample(tuple(policy.last_features.vector()), stats.accepted_nodes, light_acc,
                                       stats.drafter_ms[1], stats.drafter_ms[0], plan.size, policy.n_light, i))
        if progress:
            progress(f"scheduler samples, prompt {i + 1}/{len(prompts)}", i + 1, len(prompts))
    return out


def scheduler_value(samples: Sequence[SchedulerSample], curve: LatencyCurve, context: int | None = None
                    ) -> tuple[np.ndarray, float]:
    """Per sample the value of calling the strong drafter, in tokens (module docstring), and r, the light-only
    tree's tokens per ms used to price the strong drafter's cost.

    Raises:
        ProfileError: no samples, or a tree size outside the curve's measured range.
    """
    if not samples:
        raise ProfileError("no scheduler samples: the graft plan never ran a full-size step")
    def step_ms(n: int) -> float:  # the target's part of a step of n tokens: verify and bookkeeping
        return curve.step_target_ms(n, context) + curve.step_overhead(n, context)

    t_full = {s.n_full: step_ms(s.n_full) for s in samples}
    t_light = {s.n_light: step_ms(s.n_light) for s in samples}
    light_tokens = sum(1 + s.accepted_light for s in samples)
    light_ms = sum(s.light_ms + t_light[s.n_light] for s in samples)
    r = light_tokens / light_ms
    value = np.array([(s.accepted_full - s.accepted_light) - r * (s.strong_ms + t_full[s.n_full] - t_light[s.n_light])
                      for s in samples])
    return value, r


def require_sklearn():
    """scikit-learn's ``LogisticRegression`` (what :func:`train_scheduler` fits), imported here so a command can
    check for it before minutes of sampling.

    Raises:
        ProfileError: scikit-learn is not installed (``pip install 'sequoia_opt[scheduler]'``).
    """
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError:  # pragma: no cover - depends on the environment
        raise ProfileError("training a scheduler needs scikit-learn: pip install 'sequoia_opt[scheduler]' "
                           "(or scikit-learn)") from None
    return LogisticRegression


class NothingToLearn(ProfileError):
    """The samples cannot train a scheduler (:func:`train_scheduler`): too few, or one class only.

    Attributes:
        always: the strong drafter paid at every sample step (ship :class:`~sequoia_opt.drafting.policies.AlwaysGraft`);
            False: at none, or too few samples to tell (ship ``NeverGraft``: the light tree alone).
    """

    def __init__(self, message: str, *, always: bool = False) -> None:
        super().__init__(message)
        self.always = bool(always)


def train_scheduler(samples: Sequence[SchedulerSample], curve: LatencyCurve, *, pair: dict[str, str],
                    context: int | None = None, holdout_fraction: float = 0.3, seed: int = 0,
                    extra_card: dict[str, Any] | None = None) -> LogisticScheduler:
    """Fit the shipped scheduler: a logistic model of ``value > 0`` on the features, weighted by ``|value|``
    (scikit-learn's ``LogisticRegression``), trained on the prompts not held out and scored on the held-out
    ones; the card records the training set and how much of the oracle's value it keeps.

    Card entries (held-out steps): ``call_rate`` (how often it calls), ``oracle_call_rate``, ``accuracy``
    (its decision equals the oracle's), ``value_kept`` = value of its calls / value of the oracle's calls
    (1 = the oracle; 0 = never calling), ``value_always`` = value of calling every step / the oracle's
    (the static grafted tree, for comparison); the same on the training steps.

    Raises:
        NothingToLearn: fewer than 20 samples, or one class only (the strong drafter always or never pays: then
            ship :class:`~sequoia_opt.drafting.policies.AlwaysGraft` / ``NeverGraft``, as its ``always`` and
            message say).
        ProfileError: scikit-learn is not installed (:func:`require_sklearn`).
    """
    LogisticRegression = require_sklearn()
    if len(samples) < 20:
        raise NothingToLearn(f"{len(samples)} scheduler samples are too few to train on (need >= 20)")
    value, r = scheduler_value(samples, curve, context)
    X = np.array([s.features for s in samples], dtype=np.float64)
    y = (value > 0).astype(int)
    if y.min() == y.max():
        which = "always" if y[0] else "never"
        raise NothingToLearn(f"the strong drafter {'pays at every' if y[0] else 'pays at no'} step of the "
                             f"{len(samples)} samples: ship the '{which}' scheduler instead of a learned one",
                             always=bool(y[0]))
    prompts = sorted({s.prompt_index for s in samples})
    rng = np.random.default_rng(seed)
    held = set(rng.choice(prompts, size=max(1, int(round(holdout_fraction * len(prompts)))), replace=False).tolist()) \
        if len(prompts) > 1 else set()
    test = np.array([s.prompt_index in held for s in samples])
    train = ~test if test.any() and (~test).any() else np.ones(len(samples), dtype=bool)
    if y[train].min() == y[train].max():  # the split left one class: train on every step
        train = np.ones(len(samples), dtype=bool)
    model = LogisticRegression(C=100.0, max_iter=5000)  # weak regularisation: few features, many steps
    model.fit(X[train], y[train], sample_weight=np.abs(value[train]) + 1e-6)

    def scores(mask: np.ndarray) -> dict[str, float]:
        if not mask.any():
            return {}
        call = model.predict_proba(X[mask])[:, 1] >= 0.5
        v, oracle = value[mask], value[mask] > 0
        best = float(v[oracle].sum())
        return {"steps": int(mask.sum()), "call_rate": round(float(call.mean()), 4),
                "oracle_call_rate": round(float(oracle.mean()), 4),
                "accuracy": round(float((call == oracle).mean()), 4),
                "value_kept": round(float(v[call].sum()) / best, 4) if best > 0 else None,
                "value_always": round(float(v.sum()) / best, 4) if best > 0 else None,
                "mean_value_tokens": round(float(v.mean()), 4)}

    card = {"how": ("logistic regression (scikit-learn) of value > 0 on the features, sample weight |value|; "
                    "value = extra accepted nodes from calling the strong drafter - r * its cost in ms "
                    "(strong drafter time + T(n_full) - T(n_light)), r = light-only tokens per ms"),
            "samples": len(samples), "prompts": len(prompts), "held_out_prompts": sorted(int(i) for i in held),
            "r_tokens_per_ms": round(r, 6), "latency_profile": curve.id,
            "train": scores(train), "held_out": scores(test), **(extra_card or {})}
    return LogisticScheduler(weights=[float(w) for w in model.coef_[0]], bias=float(model.intercept_[0]),
                             threshold=0.5, pair=dict(pair), card=card)

