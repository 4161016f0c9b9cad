"""Drafting policies: what decides a step's tree (DESIGN.md, "Drafters and drafting policies").

The static solved tree is :class:`~sequoia_opt.decoding.SpeculativeDecoder`'s own loop (one drafter, one
tree compiled once); the adaptive static tree (re-solved from live acceptance) runs in that loop too, as
:class:`~sequoia_opt.decoding.adaptive.AdaptiveTreeDecoder` (``decoding/adaptive.py``). The policies here grow a step's tree from several drafters and run in
:class:`~sequoia_opt.decoding.multidraft.MultiDraftDecoder`:

* ``graft.py`` — :class:`GraftPolicy`: a light and a strong drafter grow one shared tree from a solved plan
  (TreeGraft, 2026); a scheduler decides per step whether the strong drafter is called.
* ``merge.py`` — :class:`MergePolicy`: each drafter proposes its own tree; the union by shared prefixes is
  verified (SpecInfer, Miao et al. 2024).
* ``dynamic.py`` — :class:`DynamicPolicy`: one drafter, a tree chosen per step from its own scores by a rule
  of :mod:`sequoia_opt.dynamic` (EAGLE-2, entropy branching, best-first / DDTree).
* ``scheduler.py`` — the graft scheduler: features, :class:`AlwaysGraft`, :class:`NeverGraft`, the shipped
  :class:`LogisticScheduler` and its file format.

A new policy is one new file (a :class:`DraftingPolicy`) and a registry line in :data:`POLICIES`.
"""

from .base import DraftingPolicy, StepTree, ancestor_matrix
from .dynamic import DynamicPolicy
from .graft import GraftPolicy, check_graft_plan
from .merge import MergePolicy
from .scheduler import (FEATURE_NAMES, AlwaysGraft, GraftFeatures, GraftScheduler, LogisticScheduler, NeverGraft,
                        load_scheduler, save_scheduler)

__all__ = ["DraftingPolicy", "StepTree", "ancestor_matrix", "GraftPolicy", "check_graft_plan", "MergePolicy", "DynamicPolicy",
           "GraftScheduler", "GraftFeatures", "AlwaysGraft", "NeverGraft", "LogisticScheduler", "FEATURE_NAMES",
           "load_scheduler", "save_scheduler", "POLICIES"]

#: Registry: policy name -> class.
POLICIES = {"graft": GraftPolicy, "merge": MergePolicy, "dynamic": DynamicPolicy}
