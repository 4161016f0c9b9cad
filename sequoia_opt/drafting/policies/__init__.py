"""Drafting policies: what decides each step's tree (DESIGN.md, "Drafters and drafting policies"). Each is a
:class:`~sequoia_opt.decoding.policy.DraftingPolicy` run by the one loop,
:class:`~sequoia_opt.decoding.loop.Decoder`; no policy is plain decoding. One file each:

* ``static.py`` — :class:`StaticTreePolicy`: one drafter, one solved tree every step (Sequoia); a chain of K
  is the width-1 tree. Serves as many rows as its drafter does.
* ``chain.py`` — :class:`ChainPolicy`: a chain grown token by token with llama.cpp's draft-max / draft-min /
  draft-p-min rule.
* ``adaptive.py`` — :class:`AdaptiveTreePolicy`: the static tree re-solved during the run from the acceptance
  it measures (:class:`TreeAdapter`).
* ``dynamic.py`` — :class:`DynamicPolicy`: one drafter, a tree chosen per step from its own scores by a rule
  of :mod:`sequoia_opt.dynamic` (EAGLE-2, entropy branching, best-first / DDTree).
* ``schedule.py`` — :class:`SchedulePolicy`: a speculation plan, the static tree (a chain of K) of the batch range
  that holds the live rows, as vLLM, TensorRT-LLM and SGLang pick a draft length per batch size.
* ``adaptive_schedule.py`` — :class:`AdaptiveSchedulePolicy`: a chain plan whose ranges are re-ranked during the run
  from the acceptance the served requests show (:class:`PlanAdapter`).
* ``graft.py`` — :class:`GraftPolicy`: a light and a strong drafter grow one shared tree from a solved plan
  (TreeGraft, 2026); a scheduler decides per step whether the strong drafter is called.
* ``merge.py`` — :class:`MergePolicy`: each drafter proposes its own tree; the union by shared prefixes is
  verified (SpecInfer, Miao et al. 2024).
* ``scheduler.py`` — the graft scheduler: features, :class:`AlwaysGraft`, :class:`NeverGraft`, the shipped
  :class:`LogisticScheduler` and its file format.

A new policy is one new file and a registry line (:data:`sequoia_opt.drafting.registry.POLICIES`).
"""

from .adaptive import AdaptiveTreePolicy, OnlineAcceptance, Resolve, TreeAdapter
from .base import DraftingPolicy, SharedTreePolicy, commit_drafter
from .chain import ChainPolicy, top1_share
from .dynamic import DynamicPolicy
from .graft import GraftPolicy, check_graft_plan
from .merge import MergePolicy
from .scheduler import (FEATURE_NAMES, AlwaysGraft, GraftFeatures, GraftScheduler, LogisticScheduler, NeverGraft,
                        load_scheduler, save_scheduler)
from .static import StaticTreePolicy, check_tree_width
from .schedule import SchedulePolicy
from .adaptive_schedule import AdaptiveSchedulePolicy, PlanAdapter

__all__ = ["DraftingPolicy", "SharedTreePolicy", "commit_drafter", "ChainPolicy", "top1_share", "StaticTreePolicy", "check_tree_width", "SchedulePolicy",
           "AdaptiveSchedulePolicy", "PlanAdapter",
           "AdaptiveTreePolicy", "TreeAdapter", "OnlineAcceptance", "Resolve", "GraftPolicy", "check_graft_plan",
           "MergePolicy", "DynamicPolicy", "GraftScheduler", "GraftFeatures", "AlwaysGraft", "NeverGraft",
           "LogisticScheduler", "FEATURE_NAMES", "load_scheduler", "save_scheduler"]
