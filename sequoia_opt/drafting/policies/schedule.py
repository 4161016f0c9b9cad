""":class:`SchedulePolicy`: a speculation plan run the way engines run one — at each step the static tree (a
chain of K, or plain decoding) of the batch range that holds the number of live rows (vLLM's
``num_speculative_tokens_per_batch_size``, TensorRT-LLM's ``draft_len_schedule``, SGLang's adaptive tiers; the
plan from :func:`~sequoia_opt.solver.schedule.solve_plan`). Past the last range the last range's tree is used
(as vLLM carries its last K).

Switching trees between steps is exact: between steps every cache holds exactly the committed tokens whatever
tree was verified (:meth:`StaticTreePolicy.set_tree`), so greedy output equals plain decoding at every step.
The drafter's caches are sized once, for the largest tree of the plan; each tree is compiled once.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...decoding.state import DecodeState, DraftSettings
from ...decoding.step_tree import Room, StepTree, TreeBuffers
from ...errors import DecodingError
from ...tree import Tree
from ..drafters import Drafter
from .static import StaticTreePolicy

__all__ = ["SchedulePolicy"]


class SchedulePolicy(StaticTreePolicy):
    """A static tree per batch range (module docstring).

    Args:
        drafter: the drafter every range drafts with.
        ranges: ``(lo, hi, tree)`` in order, the first starting at 1, contiguous; a root-only tree is plain
            decoding for that range.
        name: the drafter's label.
        capacity: the largest tree the policy may ever run (default: the ranges' widest): the drafter's and the
            decoder's buffers are sized for it once, so that a subclass may later swap in ranges of larger trees
            (:class:`~sequoia_opt.drafting.policies.adaptive_schedule.AdaptiveSchedulePolicy`).

    Attributes:
        switches: how many times the tree changed between steps.  used: per step, the batch size and the tree's
            size (for reports).

    Raises:
        DecodingError: ranges that overlap, leave a batch size out, or do not start at 1.
    """

    def __init__(self, drafter: Drafter, ranges: Sequence[tuple[int, int, Tree]], name: str = "draft", *,
                 capacity: Tree | None = None) -> None:
        from ...errors import TreeoptError
        from ...solver.schedule import check_ranges

        ranges = [(int(lo), int(hi), t) for lo, hi, t in ranges]
        try:
            check_ranges(ranges, "speculation plan")
        except TreeoptError as err:
            raise DecodingError(str(err)) from None
        trees = [t for *_, t in ranges] + ([capacity] if capacity is not None else [])
        widest = max(trees, key=lambda t: (t.tree_depth, t.size))
        super().__init__(drafter, widest, name)
        self.ranges = ranges
        self.max_size = max(t.size for t in trees)
        self.max_depth = max(t.tree_depth for t in trees)
        self.max_width = max(t.max_branching_used for t in trees)
        self._compiled: dict[int, TreeBuffers] = {}  # id(tree) -> its buffers (their cuts kept with them)
        self.switches = 0
        self.used: list[tuple[int, int]] = []

    def bind(self, settings: DraftSettings) -> None:
        super().bind(settings)
        for *_, t in self.ranges:
            self._compiled.setdefault(id(t), TreeBuffers.build(t, settings.device))

    def tree_for(self, batch: int) -> Tree:
        """The tree of the range holding ``batch`` (the last range's past the end)."""
        from ...solver.schedule import range_value

        return range_value(self.ranges, batch)

    def _use_tree(self, tree: Tree) -> None:
        compiled = self._compiled.get(id(tree))
        if compiled is None:
            super()._use_tree(tree)
            return
        self.tree, self.buffers = tree, compiled

    def draft(self, state: DecodeState, rooms: Sequence[Room],
              forced_tokens: torch.Tensor | Sequence[Sequence[int]] | None = None) -> list[StepTree]:
        """Every row's tree this step: the tree of the range holding the live rows' count ``len(state.rows)`` (the
        batch size), drafted as :class:`StaticTreePolicy` drafts its one tree (``forced_tokens``: (B, n), n that
        tree's size). Counts a switch when the range changed since the last step."""
        tree = self.tree_for(len(state.rows))
        if tree is not self.tree:
            self._use_tree(tree)
            self.switches += 1
        self.used.append((len(state.rows), tree.size))
        return super().draft(state, rooms, forced_tokens)
