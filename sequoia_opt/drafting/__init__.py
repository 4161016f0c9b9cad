"""Drafting: the drafters (``drafters/``), the drafting policies (``policies/``) and the registry that names
them (``registry.py``); they plug into the one loop, :class:`~sequoia_opt.decoding.loop.Decoder`.

The decoders of earlier releases are kept one release as thin factories over that loop:
:func:`SpeculativeDecoder` (a static tree), :func:`AdaptiveTreeDecoder` (an adaptive one),
:func:`MultiDraftDecoder` (any policy); plain decoding is ``Decoder(target)``
(:func:`~sequoia_opt.decoding.loop.plain_decoder`).
"""

from __future__ import annotations

from typing import Any

from ..decoding.loop import Decoder
from ..tree import Tree
from .drafters import (Drafter, EagleDrafter, LayerSkipDrafter, MedusaDrafter, ModelDrafter, PromptLookupDrafter,
                       as_drafter, drafter_factory)
from .policies import (AdaptiveSchedulePolicy, AdaptiveTreePolicy, ChainPolicy, DynamicPolicy, GraftPolicy, MergePolicy,
                       OnlineAcceptance, Resolve, SchedulePolicy, StaticTreePolicy, TreeAdapter)
from .registry import (DRAFTERS, POLICIES, DrafterKind, DrafterSpec, PolicyKind, load_plugins, parse_drafter_spec,
                       parse_policy, register_drafter, register_policy)

__all__ = ["Drafter", "ModelDrafter", "PromptLookupDrafter", "LayerSkipDrafter", "EagleDrafter", "MedusaDrafter",
           "as_drafter", "drafter_factory",
           "StaticTreePolicy", "ChainPolicy", "SchedulePolicy", "AdaptiveSchedulePolicy", "AdaptiveTreePolicy",
           "DynamicPolicy", "GraftPolicy", "MergePolicy", "TreeAdapter",
           "OnlineAcceptance", "Resolve",
           "DRAFTERS", "POLICIES", "DrafterKind", "DrafterSpec", "PolicyKind", "parse_drafter_spec", "parse_policy",
           "register_drafter", "register_policy", "load_plugins",
           "SpeculativeDecoder", "AdaptiveTreeDecoder", "MultiDraftDecoder"]


def SpeculativeDecoder(target: Any, draft: Any, tree: Tree, **kwargs: Any) -> Decoder:  # noqa: N802 (a factory)
    """``Decoder(target, StaticTreePolicy(draft, tree), **kwargs)``: a static tree (a draft Transformer or any
    Drafter). Kept one release for callers of the earlier class."""
    return Decoder(target, StaticTreePolicy(as_drafter(draft), tree), **kwargs)


def AdaptiveTreeDecoder(target: Any, draft: Any, adapter: TreeAdapter, **kwargs: Any) -> Decoder:  # noqa: N802
    """``Decoder(target, AdaptiveTreePolicy(draft, adapter), **kwargs)``. Kept one release."""
    return Decoder(target, AdaptiveTreePolicy(as_drafter(draft), adapter), **kwargs)


def MultiDraftDecoder(target: Any, policy: Any, **kwargs: Any) -> Decoder:  # noqa: N802 (a factory)
    """``Decoder(target, policy, **kwargs)``. Kept one release."""
    return Decoder(target, policy, **kwargs)
