"""What the policies share: committing a path to a drafter in the drafter's own numbering, and the base of the
policies that grow one shared tree per step for a batch of one (dynamic, graft, merge).

The protocol itself, :class:`~sequoia_opt.decoding.policy.DraftingPolicy`, lives beside the loop that calls it
(:mod:`sequoia_opt.decoding.policy`); the tree type is :class:`~sequoia_opt.decoding.step_tree.StepTree`.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ...decoding.policy import DraftingPolicy
from ...decoding.state import DecodeState
from ...decoding.step_tree import Room, StepTree
from ..drafters import Drafter

__all__ = ["DraftingPolicy", "SharedTreePolicy", "commit_drafter", "check_depth_limit"]


def check_depth_limit(drafter: Drafter, deepest: int, what: str, *, hint: str) -> None:
    """Refuse a tree that gives ``drafter`` nodes deeper than it can ever propose (:attr:`Drafter.depth_limit`,
    Medusa's K heads): ``deepest`` is the deepest node it would propose (tokens below the root), ``what`` names the
    tree, ``hint`` the option that solves one that fits. The static, chain and dynamic policies clip such a tree to
    the limit instead (one grown level at a time); the graft and merge policies place each drafter's nodes, so they
    cannot.

    Raises:
        DecodingError: one line naming the drafter, its limit and the tree's depth.
    """
    from ...errors import DecodingError

    limit = drafter.depth_limit
    if limit is not None and deepest > limit:
        name = getattr(drafter, "name", type(drafter).__name__)  # `name` is not part of the Drafter protocol
        raise DecodingError(f"{name} can propose depths 1..{limit} only, but {what} gives it nodes at depth "
                            f"{deepest}: solve that tree with depth {limit} or less ({hint})")


def commit_drafter(drafter: Drafter, state: DecodeState, path: Sequence[int], own: Callable[[int], int | None],
                   step_depth: int) -> None:
    """Commit a batch-of-one step's accepted ``path`` (step-tree nodes from the root) to ``drafter``.

    A drafter sharing the target's cache takes the whole path (the target's compaction has moved it). Any other
    takes the path while it stays on nodes it proposed or ran over, in its own numbering (``own(node)``: its
    node, or None past what it ran over; its catch-up chunk feeds the rest next time it is asked).
    ``step_depth`` 0 says it was not asked this step.
    """
    if drafter.shares_target_cache:
        drafter.commit(state, [list(path)], step_depth)
        return
    mine = []
    for j in path:
        o = own(j)
        if o is None:
            break
        mine.append(o)
    drafter.commit(state, [mine], step_depth)


class SharedTreePolicy(DraftingPolicy):
    """A policy that grows one tree per step from its drafters' scores for a batch of one (dynamic, graft,
    merge). Near the end of the context or the cache, where its largest tree or a drafter's deepest level would
    not fit, a step is the root alone (a plain decoding step, no drafter asked), which is exact."""

    max_rows = 1
    reports_drafters = True

    def whole_fits(self, state: DecodeState, room: Room) -> bool:
        """Does the largest tree fit the row's room and every drafter's context, and can every drafter draft now
        (:meth:`~sequoia_opt.drafting.drafters.Drafter.shared_depth`: a feature head has no feature before a
        1-token prompt's first root)?"""
        if not room.fits(self.max_size, self.max_depth):
            return False
        L = state.row.cached
        return all(L <= d.context - self.max_depth and d.shared_depth(state) > 0 for d in self.drafters)

    def root_only(self, state: DecodeState) -> list[StepTree]:
        """This step's tree is the root alone; no drafter is asked."""
        self.drafter_ms = [0.0] * len(self.drafters)
        self.drafter_calls = [0] * len(self.drafters)
        self._root_only = True
        return [StepTree.root_only(state.row.root, self.settings.device)]

    def commit_root_only(self, state: DecodeState) -> bool:
        """After a root-only step, tell every drafter (a shared-cache drafter follows the target's count).
        Returns whether the step was root-only."""
        if not getattr(self, "_root_only", False):
            return False
        self._root_only = False
        for d in self.drafters:
            d.commit(state, [[0]], 0)
        return True
