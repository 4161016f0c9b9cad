"""The :class:`DraftingPolicy` protocol: what decides each step's tree, as the loop sees it (DESIGN.md,
"Drafters and drafting policies").

A policy grows one :class:`~sequoia_opt.decoding.step_tree.StepTree` per row by asking one or more drafters
for candidates; the loop verifies the trees, accepts each row's path exactly, emits, commits the target, then
hands the paths back to the policy (:meth:`DraftingPolicy.commit`) and shows it the step
(:meth:`DraftingPolicy.observe`). The loop never asks who proposed a candidate: verification reads only the
distribution each candidate group was drawn from (none: a point mass). Implementations live in
``sequoia_opt.drafting.policies`` (static, adaptive, dynamic, graft, merge); no policy is plain decoding.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import torch

from .stats import Clock

if TYPE_CHECKING:
    from .sampling import Acceptance
    from .state import DecodeState, DraftSettings
    from .step_tree import Room, StepTree

__all__ = ["DraftingPolicy", "StepView"]


@dataclass(frozen=True)
class StepView:
    """One step as a policy observes it, after every row committed (rows in the step's batch order, finished
    rows included).

    Attributes:
        trees: per row, the tree verified.
        logits: per row, the target's (n_b, V) logits over it.
        acceptances: per row, what verification accepted (path, tokens, trials).
        emitted: per row, the tokens emitted (after the stop rules).
    """

    trees: Sequence[StepTree]
    logits: Sequence[torch.Tensor]
    acceptances: Sequence[Acceptance]
    emitted: Sequence[Sequence[int]]


class DraftingPolicy(ABC):
    """Grows each step's trees (module docstring).

    The loop calls, in order: :meth:`bind` once (from its constructor); per generation :meth:`reset`, then
    :meth:`prefill` after the target's prefill; per step :meth:`draft`, then (after the target committed)
    :meth:`commit` with every row's path, then :meth:`observe`, then :meth:`keep` when rows finished.

    Attributes (a subclass sets ``drafters``, ``names``, ``max_size`` and ``max_depth`` in its constructor: the
    decoder binds only the drafters listed, and sizes the caches and the drafters' depth from the two limits):
        drafters: the drafters, lightest first (at least one).  names: their labels (for reports), one each.
        max_size: the most nodes a step's tree can have (root included): the cache slots a step may need.
        max_depth: the deepest a step's tree can be.
        max_rows: the most rows one step serves (the decoder's ``max_batch`` may not exceed it).
        drafter_ms / drafter_calls: per drafter, the last step's wall time (ms) and whether it was asked.
        clock: the :class:`~sequoia_opt.decoding.stats.Clock` of the decoder's device (set by :meth:`bind`).
        wants_confidence: whether drafters fill their confidence (a scheduler reads it).
        reports_drafters: whether each step's record carries the per-drafter figures (time, calls, the drafter
            of each accepted node); a one-drafter static policy's are the step's own.
    """

    drafters: tuple[Any, ...] = ()
    names: tuple[str, ...] = ()
    max_size: int = 1
    max_depth: int = 0
    max_rows: int = 1
    drafter_ms: list[float]
    drafter_calls: list[int]
    wants_confidence: bool = False
    reports_drafters: bool = True

    @property
    def max_verified(self) -> int:
        """The most nodes a step's verified tree can have (root included); ``max_size`` unless the policy grows
        candidates it does not verify (a dynamic tree's re-ranking)."""
        return self.max_size

    def bind(self, settings: DraftSettings) -> None:
        """Bind every drafter to the decoder and time drafters on its device (CUDA is synchronised before each
        reading, as the loop's own clock)."""
        settings.want_confidence = self.wants_confidence
        self.settings = settings
        self.clock = Clock(settings.device)
        self.drafter_ms = [0.0] * len(self.drafters)
        self.drafter_calls = [0] * len(self.drafters)
        for d in self.drafters:
            d.bind(settings)

    def reset(self) -> None:
        """A new generation begins: every drafter forgets what it committed."""
        for d in self.drafters:
            d.reset()

    def prefill(self, state: DecodeState) -> None:
        """Take in the rows' prompts (the target has prefilled them); ``state.rows[b].seq`` is prompt b."""
        for d in self.drafters:
            d.prefill(state)

    @abstractmethod
    def draft(self, state: DecodeState, rooms: Sequence[Room]) -> list[StepTree]:
        """One tree per live row. ``rooms[b]`` is what the target can take from row b this step; a tree past it
        is clipped by the loop (:meth:`~sequoia_opt.decoding.step_tree.StepTree.within`) before verification,
        but a drafter with a cache of its own writes a slot per node it drafts: the policy must ask a drafter for
        no more than the room, the row's ``useful_depth`` and the drafter's own
        :meth:`~sequoia_opt.drafting.drafters.Drafter.limit` allow (``StaticTreePolicy.step_depth_for`` cuts a
        static tree so). Must not change ``state``."""

    @abstractmethod
    def commit(self, state: DecodeState, trees: Sequence[StepTree], paths: Sequence[Sequence[int]]) -> None:
        """Commit each row's accepted path (node indices of its tree, from the root) to every drafter; the rows'
        ``cached`` has not moved yet (L of the step), while ``seq`` already ends with the step's emitted tokens
        (the loop emits, then commits: ``row.root`` is the next step's root)."""

    def observe(self, state: DecodeState, step: StepView) -> None:
        """What the step did (a policy that adapts re-solves here; its time is the step's bookkeeping)."""

    def keep(self, rows: Sequence[int]) -> None:
        """Only rows ``rows`` stay in the batch, in that order (new row i is old row ``rows[i]``)."""
        for d in self.drafters:
            d.keep(rows)

    def join(self, state: DecodeState, rows: Sequence[int]) -> None:
        """Rows ``rows`` of ``state.rows`` (the last ones) joined a running batch; the target has prefilled them.
        Every drafter takes them in (:meth:`~sequoia_opt.drafting.drafters.Drafter.join`)."""
        for d in self.drafters:
            d.join(state, rows)
