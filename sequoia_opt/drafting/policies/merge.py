""":class:`MergePolicy`: every drafter proposes its own tree and the union by shared prefixes is verified
(SpecInfer, Miao et al. 2024, section 3: the token trees of several small speculative models merged into one).

One step: each drafter proposes its tree (a static tree per drafter, compiled once) with its ordinary
:meth:`~sequoia_opt.drafting.drafters.Drafter.propose`; drafter 0's nodes are the step tree's first nodes,
and every other drafter's nodes are walked in breadth-first order: a node whose token is already a child of
its (mapped) parent is merged into that child (which keeps both provenances), any other is appended. At a
node, each drafter's children form one candidate group with that drafter's distribution, tried in drafter
order (:func:`~sequoia_opt.decoding.sampling.verify_groups_node`: exact for candidates of different
drafters, SpecInfer's multi-step speculative sampling). Each drafter commits the accepted path while it stays
on nodes of its own tree, in its own tree's numbering (its cache holds its tree at those slots). Near the
answer's end each drafter's tree is cut to what the row can still emit (its first d + 1 levels, d =
:attr:`~sequoia_opt.decoding.state.RowState.useful_depth`), the root alone at d = 0.
"""

from __future__ import annotations

from typing import Sequence

from ...decoding.state import DecodeState, DraftSettings
from ...decoding.step_tree import Room, StepTree, TreeBuffers
from ...errors import DecodingError
from ...tree import Tree
from ..drafters import Drafter, as_drafter
from .base import SharedTreePolicy, check_depth_limit, commit_drafter

__all__ = ["MergePolicy"]


class MergePolicy(SharedTreePolicy):
    """SpecInfer's merge: the union of every drafter's own tree (module docstring).

    Args:
        drafters: the drafters (each bound to this policy's decoder only), in verification order.
        trees: one tree per drafter (its own solved tree).
        names: their labels.
        cut_at_answer_end: draft no deeper than the row can still emit (module docstring; True). Greedy output
            is the same either way; only the step's cost drops.

    Raises:
        DecodingError: not one tree per drafter, fewer than two drafters, or not one name per drafter.
    """

    def __init__(self, drafters: Sequence[Drafter], trees: Sequence[Tree], names: Sequence[str] | None = None, *,
                 cut_at_answer_end: bool = True) -> None:
        if len(drafters) < 2 or len(drafters) != len(trees):
            raise DecodingError(f"a merge needs one tree per drafter and at least two drafters, got {len(drafters)} "
                                f"drafters and {len(trees)} trees")
        self.drafters = tuple(as_drafter(d) for d in drafters)
        self.trees = tuple(trees)
        self.names = tuple(names) if names is not None else tuple(f"drafter{i}" for i in range(len(drafters)))
        if len(self.names) != len(self.drafters):
            raise DecodingError(f"a merge needs one name per drafter: got {len(self.names)} names for "
                                f"{len(self.drafters)} drafters")
        for d, t, name in zip(self.drafters, self.trees, self.names):  # else every step was the root alone
            check_depth_limit(d, t.tree_depth, f"its tree in the merge ({name})", hint="solve's --max-depth")
        self.max_depth = max(t.tree_depth for t in trees)
        self.max_size = sum(t.size for t in trees) - (len(trees) - 1)  # every non-root node distinct at most
        self.cut_at_answer_end = bool(cut_at_answer_end)
        k = len(drafters)
        self.drafter_ms, self.drafter_calls = [0.0] * k, [0] * k
        self._buffers: list[TreeBuffers] = []  # each drafter's whole tree
        self._step_buffers: list[TreeBuffers] = []  # this step's: each cut at the answer's end
        self._own: list[dict[int, int]] = []  # per drafter: step node -> its own node

    def bind(self, settings: DraftSettings) -> None:
        super().bind(settings)
        self._buffers = [TreeBuffers.build(t, settings.device) for t in self.trees]

    def whole_fits(self, state: DecodeState, room: Room) -> bool:
        return super().whole_fits(state, room) and all(
            d.limit(state, buf) == buf.tree_depth for d, buf in zip(self.drafters, self._buffers) if buf.tree_depth)

    def draft(self, state: DecodeState, rooms: Sequence[Room]) -> list[StepTree]:
        if not self.whole_fits(state, rooms[0]):
            return self.root_only(state)
        depth = min(self.max_depth, state.row.useful_depth) if self.cut_at_answer_end else self.max_depth
        if depth == 0:
            return self.root_only(state)
        self._step_buffers = [b.clipped(min(depth, b.tree_depth)) for b in self._buffers]  # compiled once each
        tree = StepTree(state.root)
        self._own = []
        for k, (d, buf) in enumerate(zip(self.drafters, self._step_buffers)):
            t0 = self.clock.now()
            own: dict[int, int] = {0: 0}  # step node -> own node
            if buf.tree_depth > 0:
                out = d.propose(state, buf)
                probs = out.probs[0] if out.probs is not None else None
                for c, s in enumerate(tree.add_drafted(out.tokens[0], probs, buf, k)):
                    own.setdefault(s, c)
            self._own.append(own)
            self.drafter_ms[k] = self.clock.now() - t0
            self.drafter_calls[k] = int(buf.tree_depth > 0)
        return [tree]

    def commit(self, state: DecodeState, trees: Sequence[StepTree], paths: Sequence[Sequence[int]]) -> None:
        if self.commit_root_only(state):
            return
        for k, (d, buf) in enumerate(zip(self.drafters, self._step_buffers)):
            commit_drafter(d, state, paths[0], self._own[k].get, buf.tree_depth)
