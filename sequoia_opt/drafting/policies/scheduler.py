"""When to call the strong drafter: the online scheduler of a graft policy (TreeGraft, 2026: a light policy
distilled from an offline value computation decides per step whether the costly drafter is worth calling).

Features (:class:`GraftFeatures`), read after the light drafter has grown its part of the step's tree, all
cheap: the light drafter's confidence (:attr:`~sequoia_opt.decoding.step_tree.DraftOutput.confidence`: a
model's top-1 probability, prompt lookup's top-follower share) at the root and along its rank-0 spine, and
the recent acceptance (an exponential average of accepted nodes per step). A shipped scheduler is a logistic
model over them, :class:`LogisticScheduler`, trained offline by
:func:`~sequoia_opt.profiling.graft.train_scheduler` from the value of calling the strong drafter (expected
extra accepted tokens minus its cost in tokens) and saved as a small YAML file with its card.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from ..._io import atomic_write_text, check_numbers, read_text_file, safe_load_yaml, warn_unknown_keys, yaml_error_text
from ...errors import ProfileError

__all__ = ["GraftFeatures", "GraftScheduler", "AlwaysGraft", "NeverGraft", "LogisticScheduler", "SCHEDULER_FORMAT",
           "FEATURE_NAMES", "load_scheduler", "save_scheduler", "spine_features"]

SCHEDULER_FORMAT = "treeopt-scheduler/1"
#: The feature vector's entries, in order (:meth:`GraftFeatures.vector`).
FEATURE_NAMES = ("light_conf_root", "light_conf_spine_mean", "light_conf_spine_min", "recent_accepted")


@dataclass(frozen=True)
class GraftFeatures:
    """What the scheduler sees before calling the strong drafter (all in [0, 1] but ``recent_accepted``).

    Attributes:
        light_conf_root: the light drafter's confidence at the root.
        light_conf_spine_mean / light_conf_spine_min: mean and minimum of its confidence over the nodes of its
            rank-0 spine that have children (the root included).
        recent_accepted: exponential average (weight 1/2) of accepted nodes per step over the last steps
            (tokens; 0 at the start of a generation).
    """

    light_conf_root: float
    light_conf_spine_mean: float
    light_conf_spine_min: float
    recent_accepted: float

    def vector(self) -> list[float]:
        """The features in :data:`FEATURE_NAMES` order."""
        return [self.light_conf_root, self.light_conf_spine_mean, self.light_conf_spine_min, self.recent_accepted]


class GraftScheduler(ABC):
    """Decides per step whether the strong drafter is called."""

    name: str = "scheduler"

    @abstractmethod
    def decide(self, features: GraftFeatures) -> bool:
        """True: call the strong drafter this step."""


class AlwaysGraft(GraftScheduler):
    """Call the strong drafter every step (the static grafted tree)."""

    name = "always"

    def decide(self, features: GraftFeatures) -> bool:
        return True


class NeverGraft(GraftScheduler):
    """Never call it (the light drafter's part of the tree alone)."""

    name = "never"

    def decide(self, features: GraftFeatures) -> bool:
        return False


@dataclass
class LogisticScheduler(GraftScheduler):
    """Call the strong drafter when ``sigmoid(bias + weights . features) >= threshold``.

    Attributes:
        weights: one per entry of :data:`FEATURE_NAMES`.
        bias: the intercept.
        threshold: the probability above which it calls (0.5 unless tuned).
        pair: what it was trained for: ``target``, ``light`` and ``strong`` drafter labels (checked on load).
        card: how it was trained and how well it tracks the offline value (free-form, saved with it).
    """

    weights: list[float]
    bias: float
    threshold: float = 0.5
    pair: dict[str, str] = field(default_factory=dict)
    card: dict[str, Any] = field(default_factory=dict)
    name: str = "logistic"

    def __post_init__(self) -> None:
        if len(self.weights) != len(FEATURE_NAMES):
            raise ProfileError(f"a scheduler needs {len(FEATURE_NAMES)} weights ({', '.join(FEATURE_NAMES)}), "
                               f"got {len(self.weights)}")
        if not all(math.isfinite(float(w)) for w in [*self.weights, self.bias]) or not 0 <= self.threshold <= 1:
            raise ProfileError("a scheduler's weights and bias must be finite and its threshold in [0, 1]")

    def probability(self, features: GraftFeatures) -> float:
        """sigmoid(bias + weights . features)."""
        z = self.bias + sum(w * x for w, x in zip(self.weights, features.vector()))
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def decide(self, features: GraftFeatures) -> bool:
        return self.probability(features) >= self.threshold

    def to_dict(self) -> dict[str, Any]:
        """The scheduler file's mapping (:data:`SCHEDULER_FORMAT`, ``kind: logistic``, the pair, the feature names the
        weights go with, weights, bias, threshold, card): what :func:`save_scheduler` writes and
        :func:`load_scheduler` reads back."""
        return {"format": SCHEDULER_FORMAT, "kind": "logistic", "pair": dict(self.pair),
                "features": list(FEATURE_NAMES), "weights": [float(w) for w in self.weights],
                "bias": float(self.bias), "threshold": float(self.threshold), "card": self.card}


def save_scheduler(path: str | Path, scheduler: LogisticScheduler) -> Path:
    """Write the scheduler as YAML, atomically."""
    return atomic_write_text(path, yaml.safe_dump(scheduler.to_dict(), sort_keys=False))


def load_scheduler(path: str | Path, *, pair: dict[str, str] | None = None) -> LogisticScheduler:
    """Read a scheduler file; with ``pair``, refuse one trained for another pair.

    Raises:
        ProfileError: unreadable file, another format or kind, features in another order, bad numbers, or (with
            ``pair``) a ``target`` / ``light`` / ``strong`` label that differs from the file's.
    """
    text = read_text_file(path, error=ProfileError, what="scheduler file")
    try:
        doc = safe_load_yaml(text)
    except yaml.YAMLError as err:
        raise ProfileError(f"{path}: not valid YAML ({yaml_error_text(err)})") from None
    if not isinstance(doc, dict) or doc.get("format") != SCHEDULER_FORMAT:
        raise ProfileError(f"{path}: not a {SCHEDULER_FORMAT} file (format: "
                           f"{doc.get('format') if isinstance(doc, dict) else None!r})")
    check_numbers(doc, str(path), ProfileError)
    warn_unknown_keys(doc, ("format", "kind", "pair", "features", "weights", "bias", "threshold", "card"), str(path))
    if doc.get("kind", "logistic") != "logistic":  # the only kind this version reads: never run another as one
        raise ProfileError(f"{path}: scheduler kind {doc.get('kind')!r} is not one this version runs ('logistic')")
    if list(doc.get("features", [])) != list(FEATURE_NAMES):
        raise ProfileError(f"{path}: features {doc.get('features')} differ from this version's {list(FEATURE_NAMES)}")
    try:
        sched = LogisticScheduler(weights=[float(w) for w in doc["weights"]], bias=float(doc["bias"]),
                                  threshold=float(doc.get("threshold", 0.5)), pair=dict(doc.get("pair") or {}),
                                  card=dict(doc.get("card") or {}))
    except (KeyError, TypeError, ValueError) as err:
        raise ProfileError(f"{path}: bad scheduler entry ({err})") from None
    if pair:
        for key, want in pair.items():
            have = sched.pair.get(key)
            if have is not None and want is not None and have != want:
                raise ProfileError(f"{path} was trained for {key} {have!r}, not {want!r}: train one for this pair "
                                   "(treeopt profile scheduler)")
    return sched


def spine_features(confidence: Sequence[float], spine: Sequence[int], recent_accepted: float) -> GraftFeatures:
    """Features from the light drafter's per-node confidence and its rank-0 spine's nodes with children."""
    vals = [float(confidence[i]) for i in spine] or [0.0]
    return GraftFeatures(vals[0], sum(vals) / len(vals), min(vals), float(recent_accepted))
