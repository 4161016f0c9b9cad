""":class:`StaticTreePolicy`: one drafter and one solved tree, the same every step (Sequoia, Chen et al. 2024:
the tree the DP chose for this pair and this device; a chain of K is the width-1 tree). Serves as many rows
as its drafter does, every row drafting the same tree in one batched draft forward per level.

The tree is compiled once into :class:`~sequoia_opt.decoding.step_tree.TreeBuffers`. Near the end of the
context or of a cache, a step uses the tree cut to its first d + 1 levels (levels are contiguous in
breadth-first order, so the cut tree is a prefix of the nodes, each keeping its slot and position), with the
largest d that the target's room and the drafter's own limit (:meth:`~sequoia_opt.drafting.drafters.Drafter.limit`:
a draft model's context and cache slots) allow; at d = 0 no drafter is asked and the step is plain decoding.
The cut trees are compiled on first use and kept; while the whole tree fits, choosing it costs two integer
comparisons and the drafter's own check.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...decoding.state import DecodeState, DraftSettings
from ...decoding.step_tree import Room, StepTree, TreeBuffers
from ...errors import DecodingError
from ...tree import Tree
from ..drafters import Drafter, as_drafter
from .base import DraftingPolicy

__all__ = ["StaticTreePolicy", "check_tree_width"]


def check_tree_width(tree: Tree, vocab_size: int) -> None:
    """Refuse a tree with a node of more children than the vocabulary has tokens (DecodingError)."""
    if tree.max_branching_used > vocab_size:
        raise DecodingError(
            f"the tree has a node with {tree.max_branching_used} children but the vocabulary has only "
            f"{vocab_size} tokens: a node cannot propose more distinct candidates than that")


class StaticTreePolicy(DraftingPolicy):
    """One drafter, one solved tree (module docstring).

    Args:
        drafter: a :class:`~sequoia_opt.drafting.drafters.Drafter` (bound to this policy's decoder), or a draft
            :class:`~sequoia_opt.model.Transformer` (wrapped in a ModelDrafter).
        tree: the speculation topology (n nodes, depth D); a root-only tree never asks the drafter.
        name: the drafter's label (for reports).
        cut_at_answer_end: the attribute below.

    Attributes:
        tree, buffers: the tree and its compiled buffers (after :meth:`bind`).  drafter: the drafter.
        step_depth: the depth the last step drafted (0: root-only).
        cut_at_answer_end: draft no deeper than the rows can still emit (:meth:`step_depth_for`; True). The
            profilers that measure a tree (its acceptance, its step time) set it False: every step is the whole tree.

    Raises:
        DecodingError: (at bind) a node with more children than the vocabulary has tokens.
    """

    reports_drafters = False

    def __init__(self, drafter: Drafter, tree: Tree, name: str = "draft", *, cut_at_answer_end: bool = True) -> None:
        self.cut_at_answer_end = bool(cut_at_answer_end)
        self.drafter = as_drafter(drafter)
        self.drafters, self.names = (self.drafter,), (str(name),)
        self.tree = tree
        self.max_size, self.max_depth = tree.size, tree.tree_depth
        self.max_width = tree.max_branching_used
        self.max_rows = self.drafter.max_rows
        self.buffers: TreeBuffers | None = None
        self.step_depth = 0

    def bind(self, settings: DraftSettings) -> None:
        check_tree_width(self.tree, settings.target.vocab_size if settings.target is not None else 1 << 62)
        super().bind(settings)
        self._use_tree(self.tree)

    def _use_tree(self, tree: Tree) -> None:
        self.tree = tree
        self.buffers = TreeBuffers.build(tree, self.settings.device)
        self.max_width = tree.max_branching_used

    def set_tree(self, tree: Tree) -> None:
        """Replace the tree between steps (an adaptive policy's re-solve). The caches stay as they are:
        between steps they hold exactly the committed tokens whatever tree was used, and every step is exact
        for any tree, so swapping never changes greedy output (nor the sampled distribution). A tree larger
        than the decoder's slots is clipped at every step, as always.

        Raises:
            DecodingError: a node with more children than the vocabulary has tokens; a tree of depth >= 1 for a
                decoder bound with a root-only tree (its drafter allocated nothing to draft with).
        """
        check_tree_width(tree, self.settings.target.vocab_size)
        if tree.tree_depth > 0 and self.settings.tree_depth == 0:
            raise DecodingError("this decoder was made with a root-only tree, so its drafter allocated nothing to "
                                "draft with; make the decoder with a tree of depth >= 1 to swap in deeper trees")
        self._use_tree(tree)

    def buffers_at(self, depth: int) -> TreeBuffers:
        """The tree cut to ``depth`` (itself at depth D), compiled once and kept (:meth:`TreeBuffers.clipped`)."""
        return self.buffers.clipped(depth)

    def step_depth_for(self, state: DecodeState, rooms: Sequence[Room]) -> int:
        """The depth this step's tree uses for every row: the deepest whose levels fit every row's room and the
        drafter's limit, and no deeper than the rows can still use: the largest
        :attr:`~sequoia_opt.decoding.state.RowState.useful_depth` over the rows (r - 1 for r tokens left; a row
        near its end does not make the others shallower). Greedy: the tokens emitted are the same either way (the
        stop rule would have cut them); only the step's cost drops. Sampling: the same distribution, but a cut
        step draws fewer samples from the generator, so one seed's later tokens differ."""
        buf = self.buffers
        D = buf.tree_depth
        if self.cut_at_answer_end:
            D = min(D, max(r.useful_depth for r in state.rows))
        nodes = min(r.nodes for r in rooms)
        deep = min(r.depth for r in rooms)
        d = D
        if not (buf.n <= nodes and D <= deep):
            d = min(D, max(deep, 0))
            while d > 0 and buf.level_slices[d].stop > nodes:
                d -= 1
        return self.drafter.limit(state, buf, d) if d > 0 else 0

    def draft(self, state: DecodeState, rooms: Sequence[Room],
              forced_tokens: torch.Tensor | Sequence[Sequence[int]] | None = None) -> list[StepTree]:
        """Every row drafts this step's tree (module docstring).

        Args:
            forced_tokens: optional (B, n) tree tokens to use instead of proposing them (teacher forcing, for
                tests and replays; ``[:, 0]`` must be the roots; n is the step's tree size). The drafter still
                runs over them, so its cache ends up exactly as if it had proposed them.

        Raises:
            DecodingError: forced tokens of the wrong shape or roots; when sampling, draft logits with NaN or
                +inf.
        """
        d = self.step_depth_for(state, rooms)
        self.step_depth = d
        buf = self.buffers if d == self.buffers.tree_depth else self.buffers_at(d)
        dev = self.settings.device
        B = len(state.rows)
        forced = None
        if forced_tokens is not None:
            forced = torch.as_tensor(forced_tokens, dtype=torch.int64).to(dev).reshape(B, -1).clone()
            roots = [r.root for r in state.rows]
            if forced.shape != (B, buf.n) or forced[:, 0].tolist() != roots:
                raise DecodingError(f"forced tree tokens must have shape ({B}, {buf.n}) and start with the roots "
                                    f"{roots}")
        if d == 0:
            self.drafter_calls = [0]
            toks = forced if forced is not None else torch.tensor([[r.root] for r in state.rows], device=dev)
            return [StepTree.static(buf, toks[b]) for b in range(B)]
        self.drafter_calls = [1]
        out = self.drafter.propose(state, buf, forced)
        probs, conf = out.probs, out.confidence
        return [StepTree.static(buf, out.tokens[b], probs[b] if probs is not None else None,
                                confidence=conf[b] if conf is not None else None) for b in range(B)]

    def commit(self, state: DecodeState, trees: Sequence[StepTree], paths: Sequence[Sequence[int]]) -> None:
        self.drafter.commit(state, paths, self.step_depth)
