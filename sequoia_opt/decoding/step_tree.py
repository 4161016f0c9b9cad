"""The tree a decoding step verifies: :class:`StepTree` (one type for static and grown trees), the static
tree compiled once into device buffers (:class:`TreeBuffers`, Medusa ``generate_medusa_buffers`` style), and
what a drafter returns (:class:`DraftOutput`).

Slot and position convention (shared by drafting, verification and commit): a row with L committed tokens
before its root (the last committed token, not yet cached) writes tree node i at cache slot ``F + i`` (F the
row's frontier: ``F == L`` for a batch of one, see :mod:`~sequoia_opt.decoding.rows`) at rotary position
``L + depth[i]``. A static tree's nodes are breadth-first, so every level is a contiguous run of slots; a grown
tree's nodes are in creation order (every parent before its children), so nodes a second drafter grafts go
after the first drafter's and no node's slot moves once a drafter has written it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ..attention import TreeMask
from ..tree import Tree
from .sampling import CandidateGroup

__all__ = ["TreeBuffers", "StepTree", "DraftOutput", "Room", "ancestor_matrix", "root_tree"]


@dataclass(frozen=True)
class Room:
    """What the target can take from one row this step (the loop's clipping near the end of the context or
    the cache, written once: :meth:`StepTree.within`).

    Attributes:
        nodes: the most tree nodes (root included, >= 1) its cache slots hold this step.
        depth: the deepest node (>= 0) its positions allow (``max_position_embeddings - 1 - L``).
    """

    nodes: int
    depth: int

    def fits(self, n: int, depth: int) -> bool:
        """Does a tree of n nodes and this depth fit?"""
        return n <= self.nodes and depth <= self.depth


@dataclass
class DraftOutput:
    """What :meth:`~sequoia_opt.drafting.drafters.Drafter.propose` returns for the B rows of a step, all
    drafting the same static tree (n nodes, breadth-first).

    Attributes:
        tokens: (B, n) int64 token of every node; ``tokens[:, 0]`` are the rows' roots.
        probs: (B, n, V) float32 draft distribution at each node that has children (the q its children were
            sampled from); None for greedy decoding and for a drafter without distributions
            (:attr:`~sequoia_opt.drafting.drafters.Drafter.has_probs` False). Rows of leaves are undefined.
        depth: the depth of the tree drafted (the policy's tree, or less near the end of the context).
        confidence: (B, n) float32 the drafter's confidence at each node that has children, in [0, 1] (a
            model's top-1 probability at temperature 1, prompt lookup's top-follower share); only when
            :attr:`~sequoia_opt.decoding.state.DraftSettings.want_confidence` is set, else None.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None
    depth: int
    confidence: torch.Tensor | None = None


def root_tree(roots: Sequence[int], n: int, device: torch.device) -> torch.Tensor:
    """A (B, n) int64 tree-token tensor with the rows' roots at node 0 and the rest unset, for a drafter to fill."""
    out = torch.empty(len(roots), n, dtype=torch.int64, device=device)
    out[:, 0] = torch.tensor(list(roots), dtype=torch.int64)
    return out


def ancestor_matrix(parent: Sequence[int]) -> np.ndarray:
    """(n, n) bool: ``[i, j]`` True when node j is node i or one of its ancestors (parents precede children)."""
    n = len(parent)
    anc = np.zeros((n, n), dtype=bool)
    for i, p in enumerate(parent):
        if p >= 0:
            anc[i, : i] = anc[p, : i]
        anc[i, i] = True
    return anc


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
        cuts: the :meth:`clipped` buffers compiled so far, by depth (each compiled once, whatever holds these).
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
    cuts: dict[int, "TreeBuffers"] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def tree_depth(self) -> int:
        """D, the depth of the deepest node."""
        return self.tree.tree_depth

    @classmethod
    def build(cls, tree: Tree, device: torch.device | str) -> "TreeBuffers":
        """Compile ``tree`` into buffers on ``device`` (done once per policy and tree)."""
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
        nodes of level ``depth`` become leaves, and the nodes above keep all their children. The policies use it
        near the end of the context, the cache or an answer (:meth:`StepTree.within`); each depth is compiled once
        and kept (:attr:`cuts`).

        Raises:
            ValueError: ``depth`` outside ``[0, tree_depth]``.
        """
        if depth == self.tree_depth:
            return self
        cut = self.cuts.get(depth)
        if cut is None:
            cut = self.cuts[depth] = TreeBuffers.build(self.tree.cut(depth), self.depth.device)  # ValueError there
        return cut


_ROOT_ONLY = Tree(parent=(-1,), rank=(0,))


class StepTree:
    """One row's tree of candidates for one step: what the target verifies, whoever proposed it.

    One type serves every policy. A *static* tree (:meth:`static`) is a solved topology compiled once into
    :class:`TreeBuffers` plus this step's tokens (and the drafter's q when sampling): nothing is built per step
    but this object. A *grown* tree (``StepTree(root)`` then :meth:`add_group` / :meth:`add_drafted`) is built
    node by node by a policy from one or several drafters, in creation order (parents before children).

    Verification (:meth:`~sequoia_opt.decoding.loop.Decoder.accept`) reads a node's children in rank order,
    and under sampling its candidate groups (:meth:`groups`): each the candidates one drafter proposed there,
    with the distribution they were drawn from (None: point masses).

    Attributes:
        n: nodes, root included.  tree_depth: the deepest node's depth.
        parent / depth: per node (``parent[0] == -1``, ``depth[0] == 0``).
        children: per node its children's indices in rank order.
        source: per node the index of the drafter that proposed it first (-1 for the root); a static tree's
            nodes are all its drafter's.
        provenance: per node a bit set of every drafter that proposed it (bit k: drafter k).
        buffers: the compiled static tree (None for a grown tree).
        confidence: per node the drafter's confidence, where the drafter gave one (a scheduler's features).
    """

    __slots__ = ("parent", "depth", "children", "source", "provenance", "_tokens", "_token_list", "_groups",
                 "_group_children", "_log", "buffers", "probs", "drafter", "confidence", "_mask", "_depth_t")

    def __init__(self, root: int) -> None:
        self.parent: list[int] = [-1]
        self.depth: list[int] = [0]
        self.children: list[list[int]] = [[]]
        self.source: list[int] = [-1]
        self.provenance: list[int] = [0]
        self._token_list: list[int] | None = [int(root)]
        self._tokens: torch.Tensor | None = None
        self._groups: list[list[CandidateGroup]] | None = [[]]
        self._group_children: list[list[list[int]]] | None = [[]]
        self._log: list[tuple[int, int]] = []  # (node, group index) in the order groups were added
        self.buffers: TreeBuffers | None = None
        self.probs: torch.Tensor | None = None
        self.drafter = 0
        self.confidence: torch.Tensor | None = None
        self._mask: TreeMask | None = None
        self._depth_t: torch.Tensor | None = None

    # ------------------------------------------------------------------ static trees
    @classmethod
    def static(cls, buffers: TreeBuffers, tokens: torch.Tensor, probs: torch.Tensor | None = None, *,
               drafter: int = 0, confidence: torch.Tensor | None = None) -> "StepTree":
        """A solved static tree with this step's tokens.

        Args:
            buffers: the compiled topology (n nodes, breadth-first).
            tokens: (n,) int64 tokens, ``tokens[0]`` the root, on the device.
            probs: (n, V) float32 the drafter's q at each node with children (sampling), or None (greedy, or a
                drafter without distributions: its candidates are point masses).
            drafter: the proposing drafter's index (for reports).
            confidence: (n,) the drafter's confidence per node, or None.
        """
        t = cls.__new__(cls)
        tree = buffers.tree
        t.buffers, t._tokens, t.probs, t.drafter, t.confidence = buffers, tokens, probs, drafter, confidence
        t.parent, t.depth, t.children = tree.parent, tree.depth, buffers.children
        t._token_list = t._groups = t._group_children = None
        t.source = t.provenance = None  # derived on demand (reports): every node is the drafter's
        t._mask, t._depth_t = buffers.tree_mask, buffers.depth
        return t

    @classmethod
    def root_only(cls, root: int, device: torch.device) -> "StepTree":
        """The root alone: a plain decoding step (one target forward over one token)."""
        return cls.static(TreeBuffers.build(_ROOT_ONLY, device), torch.tensor([int(root)], dtype=torch.int64,
                                                                              device=device))

    # ------------------------------------------------------------------ shape
    @property
    def n(self) -> int:
        """Nodes in the tree, root included."""
        return len(self.parent)

    @property
    def tree_depth(self) -> int:
        """D, the deepest node's depth (0 for a root-only tree)."""
        return self.buffers.tree_depth if self.buffers is not None else max(self.depth)

    @property
    def root(self) -> int:
        """The root's token id (the row's last committed token)."""
        return self.token_list[0]

    @property
    def token_list(self) -> list[int]:
        """Every node's token, as Python ints (``[0]`` the root)."""
        if self._token_list is None:
            self._token_list = self._tokens.tolist()
        return self._token_list

    @property
    def tokens(self) -> torch.Tensor:
        """(n,) int64 the nodes' tokens (a static tree's on the drafter's device; a grown tree's on the CPU until
        the target moves them)."""
        if self._tokens is None or self._tokens.shape[0] != self.n:
            self._tokens = torch.tensor(self._token_list, dtype=torch.int64)
        return self._tokens

    def depth_tensor(self, device: torch.device) -> torch.Tensor:
        """(n,) int64 the nodes' depths (position offsets from the root) on ``device``."""
        if self._depth_t is None:
            self._depth_t = torch.tensor(self.depth, dtype=torch.int64, device=device)
        return self._depth_t

    def ancestors(self) -> np.ndarray:
        """(n, n) bool ancestor-or-self matrix (:func:`ancestor_matrix`)."""
        return ancestor_matrix(self.parent)

    def mask(self, device: torch.device) -> TreeMask:
        """The (n, n) verification mask: row i may attend tree slot j iff j is on the root-to-i path
        (SpecInfer section 4); with the unmasked committed prefix it is the whole verification mask."""
        if self._mask is None:
            self._mask = TreeMask.from_dense(torch.from_numpy(self.ancestors()).to(device))
        return self._mask

    def rank_of(self, node: int) -> int:
        """The rank of ``node`` among its parent's children (0 = the parent's first candidate)."""
        if self.buffers is not None:
            return int(self.buffers.tree.rank[node])
        return self.children[self.parent[node]].index(node)

    def source_of(self, node: int) -> int:
        """The drafter that proposed ``node`` first (-1 for the root)."""
        if self.source is None:
            return -1 if node == 0 else self.drafter
        return self.source[node]

    def path_tokens(self, node: int) -> list[int]:
        """The tokens of the node's root path below the root (empty for the root)."""
        toks, out = self.token_list, []
        while node > 0:
            out.append(toks[node])
            node = self.parent[node]
        return out[::-1]

    # ------------------------------------------------------------------ verification's view
    def groups(self, node: int) -> list[CandidateGroup]:
        """The node's candidate groups in trial order (a static tree: one, its drafter's, with the node's q when
        it has one); :meth:`group_children` maps each group's candidates to child indices."""
        if self._groups is not None:
            return self._groups[node]
        ch = self.children[node]
        if not ch:
            return []
        q = self.probs[node] if self.probs is not None else None
        return [CandidateGroup(q, self._tokens[ch[0] : ch[-1] + 1], self.drafter)]  # siblings contiguous

    def group_children(self, node: int) -> list[list[int]]:
        """Per group of :meth:`groups`, the child each of its candidates is."""
        if self._group_children is not None:
            return self._group_children[node]
        ch = self.children[node]
        return [list(ch)] if ch else []

    # ------------------------------------------------------------------ growing
    def _grown(self) -> None:
        if self.buffers is not None:
            raise TypeError("a static StepTree is compiled once; grow a StepTree(root) instead")

    def add_group(self, node: int, group: CandidateGroup, *, merge: bool = True) -> list[int]:
        """Add the candidates of ``group`` as children of ``node`` and record the group for verification.

        A candidate whose token is already a child of ``node`` is merged into that child (its provenance gains
        the group's drafter) when ``merge``; otherwise a new node is made (children must then stay distinct
        for greedy verification: the caller guarantees it, e.g. by excluding the existing tokens).

        Returns:
            The child index of each candidate, in rank order.

        Raises:
            TypeError: on a static tree.
        """
        self._grown()
        toks = self._token_list
        existing = {toks[c]: c for c in self.children[node]}
        out = []
        bit = 1 << group.drafter
        for tok in group.tokens.tolist():
            c = existing.get(tok) if merge else None
            if c is None:
                c = len(toks)
                toks.append(int(tok))
                self.parent.append(node)
                self.depth.append(self.depth[node] + 1)
                self.source.append(group.drafter)
                self.provenance.append(bit)
                self.children.append([])
                self._groups.append([])
                self._group_children.append([])
                self.children[node].append(c)
                existing[tok] = c
            else:
                self.provenance[c] |= bit
            out.append(c)
        self._log.append((node, len(self._groups[node])))
        self._groups[node].append(group)
        self._group_children[node].append(out)
        self._mask = self._depth_t = None
        return out

    def add_drafted(self, tokens: torch.Tensor, probs: torch.Tensor | None, buffers: TreeBuffers, drafter: int, *,
                    merge: bool = True) -> list[int]:
        """Add one row of a drafter's static tree (``tokens`` (n,), ``probs`` (n, V) or None, proposed over
        ``buffers``) below this tree's root: each node with children becomes one candidate group (its q row when
        ``probs`` has one, else point masses).

        Returns:
            ``step_of``: per node of the drafter's tree, the step-tree node it is (the root is 0). Into an
            empty tree with ``merge=False`` that is the identity.
        """
        step_of = [0] * buffers.n
        for node, ch in enumerate(buffers.children):
            if ch:
                q = probs[node] if probs is not None else None
                kids = self.add_group(step_of[node], CandidateGroup(q, tokens[ch[0] : ch[-1] + 1], drafter),
                                      merge=merge)
                for c, s in zip(ch, kids):
                    step_of[c] = s
        return step_of

    # ------------------------------------------------------------------ clipping (the loop's, written once)
    def within(self, room: Room) -> "StepTree":
        """This tree cut to what ``room`` holds, exactly: itself when it fits.

        A static tree keeps its first d + 1 whole levels (the largest d with ``n_d <= room.nodes`` and
        ``d <= room.depth``; levels are contiguous, so the kept nodes keep their indices, slots and positions).
        A grown tree keeps its first k nodes of depth <= ``room.depth`` (creation order is parent-first, so the
        kept nodes form a tree with unchanged indices), and each candidate group is cut before its first dropped
        candidate: a prefix of ordered samples without replacement is itself such a sample, and point masses
        need no order, so verification stays exact (and greedy output is the target's).

        Raises:
            ValueError: ``room.nodes < 1`` (not even the root fits).
        """
        if room.fits(self.n, self.tree_depth):
            return self
        if room.nodes < 1:
            raise ValueError("no room for the root: not even one node fits")
        if self.buffers is not None:
            buf = self.buffers
            d = min(room.depth, buf.tree_depth)
            while buf.level_slices[d].stop > room.nodes:
                d -= 1
            cut = buf.clipped(d)
            m = cut.n
            probs = self.probs[:m] if self.probs is not None else None
            conf = self.confidence[:m] if self.confidence is not None else None
            return StepTree.static(cut, self._tokens[:m], probs, drafter=self.drafter, confidence=conf)
        k = 1
        while k < min(self.n, room.nodes) and self.depth[k] <= room.depth:
            k += 1
        t = StepTree(self.token_list[0])
        for node, gi in self._log:  # replayed in creation order, so every kept node keeps its index
            if node >= k:
                continue
            g, kids = self._groups[node][gi], self._group_children[node][gi]
            keep = 0
            while keep < len(kids) and kids[keep] < k:
                keep += 1
            if keep:
                t.add_group(node, CandidateGroup(g.q, g.tokens[:keep], g.drafter), merge=True)
        if self.confidence is not None:
            t.confidence = self.confidence[:k]
        return t
