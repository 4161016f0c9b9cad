"""A tree compiled once into the tensors every decoding step needs (Medusa ``generate_medusa_buffers`` style).

Slot and position convention (shared by drafting, verification and commit): with L committed tokens in
the cache (slots ``[0, L)``) and the root being the last committed token (not yet cached), tree node i is
written at cache slot ``L + i`` and sits at rotary position ``L + depth[i]``. Slots are breadth-first, so
every level is a contiguous run of slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..attention import TreeMask
from ..tree import Tree

__all__ = ["TreeBuffers"]


@dataclass(frozen=True)
class TreeBuffers:
    """Device tensors derived from a :class:`~sequoia_opt.tree.Tree` (n nodes, depth D).

    Attributes:
        tree: the topology these buffers were compiled from.
        n: number of nodes (root included).
        depth: (n,) int64 depth of each node = its position offset from the root's position L.
        node_index: (n,) int64 ``arange(n)`` = each node's slot offset from L.
        tree_mask: verification mask, (n, n): row i may attend tree slot j iff node j is on the root-to-i
            path (ancestor-or-self). Together with the unmasked committed prefix ``[0, L)`` this is the whole
            (n, L + n) verification mask (SpecInfer section 4).
        level_slices: per depth d in ``0..D``, the slice of node indices at that depth.
        level_masks: per depth d, a (w_d, e_d) mask where ``w_d`` is the level's width and ``e_d`` the number
            of nodes at depth <= d: the draft's mask when it processes level d, whose nodes attend the
            prefix plus their ancestors among levels ``0..d`` (slots ``[L, L + e_d)``).
        level_branching: per depth d, the most children any node of level d has (0 for the last level).
        child_parent_local: per depth d >= 1, (w_d,) int64 index of each node's parent within level d - 1
            (entry 0 is None).
        child_rank: per depth d >= 1, (w_d,) int64 each node's rank (entry 0 is None). Level d's tokens are
            ``candidates[child_parent_local[d], child_rank[d]]`` where ``candidates`` is the (w_{d-1}, k)
            candidate table the draft proposed for level d - 1.
        children: per node, its children's indices in rank order (Python, for the accept walk).
        num_drafted: nodes the draft processes in a step (all levels but the last; 1 for a root-only tree).
    """

    tree: Tree
    n: int
    depth: torch.Tensor
    node_index: torch.Tensor
    tree_mask: TreeMask
    level_slices: tuple[slice, ...]
    level_masks: tuple[TreeMask, ...]
    level_branching: tuple[int, ...]
    child_parent_local: tuple[torch.Tensor | None, ...]
    child_rank: tuple[torch.Tensor | None, ...]
    children: tuple[tuple[int, ...], ...]
    num_drafted: int

    @property
    def tree_depth(self) -> int:
        """D, the depth of the deepest node."""
        return self.tree.tree_depth

    @classmethod
    def build(cls, tree: Tree, device: torch.device | str) -> "TreeBuffers":
        """Compile ``tree`` into buffers on ``device`` (done once per decoder)."""
        n = tree.size
        anc = torch.from_numpy(np.ascontiguousarray(tree.ancestor_mask))  # (n, n) bool
        slices = tree.level_slices
        level_masks, branching, parent_local, ranks = [], [], [], []
        parent = np.asarray(tree.parent, dtype=np.int64)
        rank = np.asarray(tree.rank, dtype=np.int64)
        for d, sl in enumerate(slices):
            # (w_d, e_d): rows = level d's nodes; columns = every node of depth <= d (slots [L, L + e_d))
            level_masks.append(TreeMask.from_dense(anc[sl, : sl.stop].clone().to(device)))
            branching.append(max((len(tree.children[i]) for i in range(sl.start, sl.stop)), default=0))
            if d == 0:
                parent_local.append(None)
                ranks.append(None)
            else:
                prev = slices[d - 1]
                parent_local.append(torch.as_tensor(parent[sl] - prev.start, device=device))
                ranks.append(torch.as_tensor(rank[sl], device=device))
        depth = torch.as_tensor(tree.depth, dtype=torch.int64, device=device)
        return cls(
            tree=tree,
            n=n,
            depth=depth,
            node_index=torch.arange(n, dtype=torch.int64, device=device),
            tree_mask=TreeMask.from_dense(anc.to(device)),
            level_slices=tuple(slices),
            level_masks=tuple(level_masks),
            level_branching=tuple(branching),
            child_parent_local=tuple(parent_local),
            child_rank=tuple(ranks),
            children=tree.children,
            num_drafted=slices[-1].start if len(slices) > 1 else 1,
        )

    def clipped(self, depth: int) -> "TreeBuffers":
        """These buffers' tree cut to its levels ``0..depth``, compiled on the same device.

        Levels are contiguous in breadth-first order, so the cut tree is the first
        ``level_slices[depth].stop`` nodes: every kept node keeps its index, slot and position offset, the
        nodes of level ``depth`` become leaves, and the nodes above keep all their children. The decoder uses
        it near the end of the context or the cache (:class:`~sequoia_opt.decoding.SpeculativeDecoder`).

        Raises:
            ValueError: ``depth`` outside ``[0, tree_depth]``.
        """
        if not 0 <= depth <= self.tree_depth:
            raise ValueError(f"cannot clip a tree of depth {self.tree_depth} to depth {depth}")
        if depth == self.tree_depth:
            return self
        keep = self.level_slices[depth].stop
        tree = Tree(parent=self.tree.parent[:keep], rank=self.tree.rank[:keep])
        return TreeBuffers.build(tree, self.depth.device)
