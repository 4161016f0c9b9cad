"""Predicting dynamic-tree settings and choosing the hardware-aware one.

Method (simulation over recorded draft distributions, then calibration): for each recorded step of a
:class:`~sequoia_opt.profiles.calibration.CalibrationProfile`, the setting's rule (:func:`sequoia_opt.dynamic.grow`,
the decoder's own code) runs over the recorded draft tree instead of a live drafter (:class:`ReplayExpander`:
a node's candidates are its recorded children, by rank, with their draft probabilities and the node's
entropy). The rule's tree is then valued as Sequoia values a tree (expected tokens per step = 1 + the sum over
nodes of the probability that the whole root path is accepted), with each node's acceptance given its parent
read from the calibration curve at its draft probability (:meth:`CalibrationProfile.acceptance_of`); the
per-step values are averaged. The cost of the step is what the rule did on that step: one draft forward per
expansion, c(w) at its width w, and the target's T(n) at the verified size n (Sequoia section 4.2's split):

    G = mean_steps [1 + sum_{v in tree} prod_{u on root..v} a(q_u)]
    cost_ms = mean_steps [sum_forwards c(w) + T(n)] + step overhead;   tokens/s = 1000 G / cost_ms

``replay`` in the results is the same tree valued with each node's recorded acceptance instead of the
calibration curve (an oracle for the recording's own steps: how much the calibration's independence
assumption costs). A node the rule expands that the recording did not is a leaf (counted in ``coverage``).
Under sampling the entropy rule draws its children; the replay takes the recorded top-ranked ones instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..profiles.calibration import CalibrationProfile, RecordedStep
from ..dynamic import POLICY_NAMES, CandidateTree, DynamicSetting, Expansion, grow, max_tree_size
from ..errors import ProfileError
from ..profiles import LatencyCurve
from .hardware import StepCost, cost_of_step

__all__ = ["ReplayExpander", "DynamicPrediction", "predict_setting", "setting_grid", "choose_dynamic"]


class ReplayExpander:
    """An :class:`~sequoia_opt.dynamic.Expander` over one recorded step: a grown node's token is the index of
    the recorded node it is, so its candidates are that node's recorded children (tokens = their indices)."""

    def __init__(self, step: RecordedStep) -> None:
        self.step = step
        self.uncovered = 0

    def expand(self, tree: CandidateTree, nodes: list[int], k: int) -> list[Expansion]:
        """Each node's first ``k`` recorded children, with their recorded draft probabilities and the recorded node's
        entropy (nats; 0 where the recording has none). A node the recording never expanded gets no candidates and
        is counted in :attr:`uncovered`."""
        s, out = self.step, []
        for v in nodes:
            rec = tree.token[v]
            kids = s.children[rec][:k]
            if not kids and math.isnan(s.entropy[rec]):
                self.uncovered += 1
            h = 0.0 if math.isnan(s.entropy[rec]) else float(s.entropy[rec])
            out.append(Expansion(list(kids), [float(s.prob[c]) for c in kids], h))
        return out


@dataclass
class DynamicPrediction:
    """A setting's predicted figures (means over the recorded steps).

    Attributes:
        setting: the dynamic setting.
        replay: G valued by the recorded acceptances (G by the calibration curve is ``tokens_per_step``).
        tree_size: mean verified nodes (root included).  forwards: mean draft forwards per step.
        coverage: fraction of steps where the rule never expanded a node the recording had not.
        cost: the mean step's :class:`~sequoia_opt.solver.hardware.StepCost` (its ``expected_tokens`` is G by
            the calibration curve, ``tokens_per_step`` here; draft, target, overhead and total ms; tokens/s;
            speedup over plain decoding).
    """

    setting: DynamicSetting
    replay: float
    tree_size: float
    forwards: float
    coverage: float
    cost: StepCost

    @property
    def label(self) -> str:
        """The setting's label, ``policy:sS-kK-nN`` (:attr:`DynamicSetting.label`)."""
        return self.setting.label

    @property
    def tokens_per_step(self) -> float:
        """G by the calibration curve (the cost's ``expected_tokens``)."""
        return self.cost.expected_tokens

    @property
    def draft_ms(self) -> float:
        """Mean drafting time per step, ms (c(w) summed over each recorded step's draft forwards, averaged)."""
        return self.cost.draft_ms

    @property
    def target_ms(self) -> float:
        """Mean target verification time per step, ms (T(n) at each recorded step's verified nodes, averaged)."""
        return self.cost.target_ms

    @property
    def cost_ms(self) -> float:
        """Mean step time, ms: draft + target + the loop's overhead."""
        return self.cost.cost_ms

    @property
    def tokens_per_s(self) -> float:
        """Predicted decoding rate, tokens/s: 1000 * G / cost_ms."""
        return self.cost.tokens_per_s

    @property
    def speedup(self) -> float:
        """Predicted tokens/s over plain decoding's on the same curve (ratio)."""
        return self.cost.speedup

    def to_dict(self) -> dict[str, Any]:
        """The prediction as plain types: G by the curve and by replay, mean tree size and forwards, the step cost's ms
        and rates, coverage, label (floats rounded to 6 decimals) and the ``setting`` mapping."""
        d = {"tokens_per_step": self.tokens_per_step, "replay": self.replay, "tree_size": self.tree_size,
             "forwards": self.forwards}
        d.update((k, getattr(self.cost, k)) for k in _COST_FIELDS)
        d.update(coverage=self.coverage, label=self.label)
        d = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in d.items()}
        d["setting"] = self.setting.to_dict()
        return d


#: The step cost's figures in a :class:`DynamicPrediction`'s dict, in order.
_COST_FIELDS = ("draft_ms", "target_ms", "overhead_ms", "cost_ms", "tokens_per_s", "speedup")


def _tree_value(tree: CandidateTree, nodes: Sequence[int], acc: np.ndarray) -> float:
    """1 + sum over the non-root nodes of the product of ``acc`` (indexed by the grown node) on the root path."""
    reach = {0: 1.0}
    for v in nodes[1:]:  # creation order: a parent is valued before its children
        reach[v] = reach[tree.parent[v]] * float(acc[v])
    return float(sum(reach.values()))


def predict_setting(profile: CalibrationProfile, setting: DynamicSetting, curve: LatencyCurve,
                    context: int | None = None, *, max_steps: int | None = None) -> DynamicPrediction:
    """Predict one setting over the profile's recorded steps (module docstring).

    Args:
        profile: the calibration profile (recorded steps and reliability table).
        setting: the dynamic setting.
        curve: the latency profile: T(n) for the target, c(w) for the drafter.
        context: context length the curve is read at (None = its smallest).
        max_steps: use at most this many recorded steps (evenly spaced), for speed.

    Raises:
        ProfileError: a verified size or a draft width outside the curve's measured range (never
            extrapolated).
    """
    steps = profile.steps
    if max_steps is not None and len(steps) > max_steps:
        steps = [steps[i] for i in np.linspace(0, len(steps) - 1, max_steps).round().astype(int)]
    g = r = size = fw = dms = tms = over = 0.0
    covered = 0
    for step in steps:
        ex = ReplayExpander(step)
        tree, sel = grow(setting, 0, ex)
        rec = np.asarray(tree.token)
        g += _tree_value(tree, sel, profile.acceptance_of(np.asarray(tree.prob)))
        r += _tree_value(tree, sel, np.where(np.arange(tree.n) == 0, 1.0, step.accept[rec]))
        size += len(sel)
        fw += len(tree.forward_widths)
        dms += curve.step_draft_ms(tree.forward_widths, context)
        tms += curve.step_target_ms(len(sel), context)
        over += curve.step_overhead(len(sel), context)
        covered += ex.uncovered == 0
    m = len(steps)
    return DynamicPrediction(setting, r / m, size / m, fw / m, covered / m,
                             cost_of_step(g / m, dms / m, tms / m, curve, context, over / m))


def setting_grid(profile: CalibrationProfile, *, policies: Sequence[str] = POLICY_NAMES,
                 budgets: Sequence[int] | None = None, max_budget: int = 64,
                 topks: Sequence[int] = (1, 2, 3, 4, 6, 8), max_steps: int | None = None) -> list[DynamicSetting]:
    """The settings :func:`choose_dynamic` scores: steps 1..the recording's, topk up to the recording's,
    budgets up to ``max_budget`` (default grid 4, 6, 8, 12, 16, 24, 32, 48, 64, and ``max_budget`` itself), every
    policy; settings whose
    budget exceeds what the rule can grow are left out (they equal a smaller one)."""
    rec = profile.recording
    S = min(rec["steps"], max_steps or rec["steps"])
    ks = sorted({k for k in topks if k <= rec["topk"]})
    bs = sorted({b for b in (budgets or (4, 6, 8, 12, 16, 24, 32, 48, 64)) if 2 <= b <= max_budget} | {max_budget})
    out = []
    for pol in policies:
        for s in range(1, S + 1):
            for k in ks:
                for b in bs:
                    setting = DynamicSetting(pol, s, k, b)
                    if max_tree_size(setting) == b:
                        out.append(setting)
    return out


@dataclass
class DynamicChoice:
    """The scored settings, best first, and the notes on what was left out (never silently)."""

    rows: list[DynamicPrediction]
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> DynamicPrediction:
        """The highest predicted tokens/s (``rows[0]``)."""
        return self.rows[0]

    def best_of(self, policy: str) -> DynamicPrediction | None:
        """The best-scored setting of ``policy`` (``"eagle"``, ``"entropy"``, ``"best-first"``), None when none was
        scored."""
        return next((r for r in self.rows if r.setting and r.setting.policy == policy), None)


def choose_dynamic(profile: CalibrationProfile, curve: LatencyCurve, settings: Sequence[DynamicSetting], *,
                   context: int | None = None, max_steps: int | None = 200) -> DynamicChoice:
    """Score every setting (:func:`predict_setting`) and sort by predicted tokens per second.

    A setting whose budget is past the curve's largest measured target token count, or whose draft forwards
    fall outside its measured draft widths (wider than the widest, or narrower than a table that starts at a
    block), is left out with a note.

    Raises:
        ProfileError: no setting could be scored.
    """
    rows, notes = [], []
    top_n = curve.max_target_tokens(context)
    low_w, top_w = curve.min_draft_tokens(context), curve.max_draft_tokens(context)
    over_budget = sorted({s.budget for s in settings if s.budget > top_n})
    if over_budget:
        notes.append(f"budgets {over_budget} are past the latency profile's largest measured token count ({top_n}):"
                     " left out (T(n) is never extrapolated)")
    wide = 0
    for s in settings:
        if s.budget > top_n:
            continue
        try:
            rows.append(predict_setting(profile, s, curve, context, max_steps=max_steps))
        except ProfileError:
            wide += 1
    if wide:
        notes.append(f"{wide} setting(s) need draft forwards outside the measured {low_w}..{top_w} tokens: left out")
    if not rows:
        raise ProfileError("no dynamic setting could be scored within the latency profile's measured range "
                           f"(target up to {top_n} tokens, draft up to {top_w})")
    rows.sort(key=lambda r: -r.tokens_per_s)
    return DynamicChoice(rows, notes)
