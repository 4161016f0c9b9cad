"""Tree topology as data.

A speculation tree of size n holds n nodes in breadth-first order. Node 0 is the root: the last committed
token, depth 0. Every other node i has a ``parent[i] < i`` and a ``rank[i]``: it is the ``rank``-th candidate
its parent's draft distribution proposed (rank 0 = the first sample / the highest-probability token).

Only ``parent`` and ``rank`` are stored. Everything else (depth, children, level widths, root-to-node paths,
the ancestor-or-self attention mask, position offsets, expected tokens per step) is derived from them, so
there is one source of truth. One verification forward feeds the target all n tokens (root included).

Canonical order: nodes are sorted by (depth, parent, rank). That makes every level a contiguous slice
(what a level-by-level draft needs) and makes the YAML round-trip exact. :meth:`Tree.from_edges` sorts any
valid edge list into canonical order.

Expected tokens per step (Sequoia, Chen et al. 2024, section 3.1 / eq. 1): under a positional acceptance
vector ``p = (p_1 .. p_K)``, where ``p_k`` is the probability that the k-th candidate is the one accepted,

    G(tree) = sum over nodes v of  prod_{u on the root->v path, u != root} p_{rank(u) + 1}

the root contributing 1 (the target always emits one token per step).

Several drafters (issue 16, TreeGraft 2026): :class:`DrafterTree` is a plain tree plus each node's drafter
index (light first); a node of drafter j is j's r-th candidate among the tokens the lighter drafters did not
already propose at its parent. YAML ``treeopt-tree/2`` stores it (top-level ``drafters``, a node's
``drafter``); the /2 readers read /1 too, and the /1 readers read a /2 file that names a single drafter.
"""

from __future__ import annotations

import datetime as _dt
import math
import numbers
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import yaml

from ._io import atomic_write_text, check_numbers, read_text_file, safe_load_yaml, warn_unknown_keys, yaml_error_text
from .errors import MultiDrafterTreeError, TreeValidationError

TREE_FORMAT = "treeopt-tree/1"
#: The multi-drafter tree format: adds top-level ``drafters`` and a node's ``drafter`` (reads /1 too).
TREE_FORMAT_V2 = "treeopt-tree/2"
TREE_FORMATS = (TREE_FORMAT, TREE_FORMAT_V2)
#: The largest budget or depth a tree file's metadata may state (2**31 - 1 nodes).
MAX_TREE_NODES = 2**31 - 1


@dataclass(frozen=True, eq=True)
class Tree:
    """A speculation tree: ``parent`` and ``rank`` for n nodes in canonical breadth-first order.

    Args:
        parent: length-n sequence; ``parent[0] == -1`` (the root), ``0 <= parent[i] < i`` otherwise.
        rank: length-n sequence; ``rank[0] == 0``; ``rank[i]`` is the candidate index under its parent.
        max_depth: optional limit; a node deeper than this is an error.
        max_branching: optional limit B; a rank >= B is an error.

    Raises:
        TreeValidationError: no root, a second root, a parent that does not precede its child, a negative
            index, duplicate (parent, rank), a rank gap (rank 2 without rank 1 under the same parent),
            a rank >= ``max_branching``, a depth > ``max_depth``, or nodes not in canonical order.
    """

    parent: tuple[int, ...]
    rank: tuple[int, ...]
    max_depth: int | None = field(default=None, compare=False, repr=False)
    max_branching: int | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parent", _int_tuple(self.parent, "parent"))
        object.__setattr__(self, "rank", _int_tuple(self.rank, "rank"))
        _validate(self.parent, self.rank, self.max_depth, self.max_branching)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def chain(cls, length: int) -> "Tree":
        """A chain of ``length`` nodes (root + ``length - 1`` speculated tokens, all rank 0).
        Raises TreeValidationError for a ``length`` that is not an integer >= 1 (``2.5`` and ``True`` included)."""
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
            raise TreeValidationError(f"a chain's length is a whole number of nodes, got {length!r}")
        if length < 1:
            raise TreeValidationError(f"a chain needs at least 1 node (the root), got {length}")
        return cls(parent=[-1] + list(range(length - 1)), rank=[0] * length)

    @classmethod
    def from_edges(cls, parent: Sequence[int], rank: Sequence[int], **limits: Any) -> "Tree":
        """Build a tree from nodes in any order where node 0 is the root, sorting into canonical order.

        ``parent[i]`` indexes the input order. Raises :class:`TreeValidationError` like the constructor,
        and when the edges contain a cycle or a node unreachable from the root.
        """
        n = len(parent)
        if n == 0 or len(rank) != n:
            raise TreeValidationError("a tree needs a root and as many ranks as parents")
        if parent[0] != -1:
            raise TreeValidationError("node 0 must be the root (parent -1)")
        order, new_index = _canonical_order(parent, rank)
        new_parent = [-1] + [new_index[int(parent[v])] for v in order[1:]]
        new_rank = [int(rank[v]) for v in order]
        return cls(parent=new_parent, rank=new_rank, **limits)

    @classmethod
    def from_choices(cls, choices: Iterable[Sequence[int]], **limits: Any) -> "Tree":
        """Import a Medusa / TensorRT-LLM choice list such as ``[[0], [0, 0], [1]]``.

        Each choice is the rank path from the root to one node (the root itself is implicit). Every prefix
        of a choice must be a choice too. Raises :class:`TreeValidationError` otherwise.
        """
        paths: list[tuple[int, ...]] = []
        seen: set[tuple[int, ...]] = set()
        for c in choices:
            try:
                t = tuple(int(x) for x in c)
            except (TypeError, ValueError) as err:
                raise TreeValidationError(f"choice {c!r} is not a list of integer ranks") from err
            if not t:
                raise TreeValidationError("an empty choice: the root is implicit, do not list it")
            if any(x < 0 for x in t):
                raise TreeValidationError(f"choice {list(t)} has a negative rank")
            if t in seen:
                raise TreeValidationError(f"choice {list(t)} is listed twice")
            seen.add(t)
            paths.append(t)
        for t in paths:
            if len(t) > 1 and t[:-1] not in seen:
                raise TreeValidationError(f"choice {list(t)} has no parent {list(t[:-1])} in the list")
        paths.sort(key=lambda t: (len(t), t))
        index = {(): 0}
        parent, rank = [-1], [0]
        for t in paths:
            index[t] = len(parent)
            parent.append(index[t[:-1]])
            rank.append(t[-1])
        return cls(parent=parent, rank=rank, **limits)

    # ------------------------------------------------------------------ derived topology
    @property
    def size(self) -> int:
        """Number of nodes n, root included (= tokens fed to the target in one verification)."""
        return len(self.parent)

    def __len__(self) -> int:
        return self.size

    @cached_property
    def depth(self) -> np.ndarray:
        """(n,) int64 depth of each node; the root has depth 0. Also the position offset of each node."""
        d = np.zeros(self.size, dtype=np.int64)
        for i in range(1, self.size):
            d[i] = d[self.parent[i]] + 1
        return d

    @property
    def positions(self) -> np.ndarray:
        """(n,) int64 position offsets: node i sits at position ``prefix_len - 1 + depth[i]`` (root = last
        committed token). Same as :attr:`depth`."""
        return self.depth

    @property
    def tree_depth(self) -> int:
        """Depth of the deepest node (0 for a root-only tree). Levels = ``tree_depth + 1``."""
        return int(self.depth[-1])

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """For each node, its children's indices ordered by rank."""
        ch: list[list[int]] = [[] for _ in range(self.size)]
        for i in range(1, self.size):
            ch[self.parent[i]].append(i)
        return tuple(tuple(c) for c in ch)

    @cached_property
    def level_widths(self) -> tuple[int, ...]:
        """Number of nodes at each depth 0..tree_depth (the root level has width 1)."""
        return tuple(int(x) for x in np.bincount(self.depth))

    @cached_property
    def level_slices(self) -> tuple[slice, ...]:
        """For each depth, the slice of node indices at that depth (levels are contiguous)."""
        out, start = [], 0
        for w in self.level_widths:
            out.append(slice(start, start + w))
            start += w
        return tuple(out)

    def cut(self, depth: int) -> "Tree":
        """This tree cut to its levels ``0..depth``: levels are contiguous in the canonical breadth-first order, so
        the cut tree is the first ``level_slices[depth].stop`` nodes, each keeping its index (and slot); the nodes
        of level ``depth`` become leaves. Itself at its own depth.

        Raises:
            ValueError: ``depth`` outside ``[0, tree_depth]``.
        """
        if not 0 <= depth <= self.tree_depth:
            raise ValueError(f"cannot clip a tree of depth {self.tree_depth} to depth {depth}")
        if depth == self.tree_depth:
            return self
        keep = self.level_slices[depth].stop
        return Tree(parent=self.parent[:keep], rank=self.rank[:keep])

    @cached_property
    def max_branching_used(self) -> int:
        """Largest number of children of any node (0 for a root-only tree)."""
        return max((len(c) for c in self.children), default=0)

    @cached_property
    def paths(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the node indices on the root-to-node path, root first, node last."""
        out: list[tuple[int, ...]] = [(0,)]
        for i in range(1, self.size):
            out.append(out[self.parent[i]] + (i,))
        return tuple(out)

    @cached_property
    def ancestor_mask(self) -> np.ndarray:
        """(n, n) bool ancestor-or-self mask: ``mask[i, j]`` is True when node j is on the root-to-i path.

        Row i is what query i may attend to among the tree tokens in a verification forward (it also
        attends to the whole committed prefix, which is not part of this matrix). Lower-triangular since
        parents precede children.
        """
        m = np.zeros((self.size, self.size), dtype=bool)
        for i in range(self.size):
            m[i, 0] = True
            m[i, i] = True
            if i:
                m[i, : i] |= m[self.parent[i], : i]
        return m

    def choices(self) -> list[list[int]]:
        """The Medusa / TensorRT-LLM choice list: the rank path of every non-root node, in node order."""
        out: list[list[int]] = [[]]
        for i in range(1, self.size):
            out.append(out[self.parent[i]] + [self.rank[i]])
        return out[1:]

    # ------------------------------------------------------------------ acceptance model
    def path_probabilities(self, acceptance: Sequence[float]) -> np.ndarray:
        """(n,) float64: for each node, the probability that it is reached (accepted) under the positional
        acceptance vector ``acceptance = (p_1 .. p_K)``. The root is 1. A rank >= K contributes 0.

        Sequoia (Chen et al. 2024), section 3.1: a node is accepted iff every node on its path is accepted,
        and the k-th child is the accepted one with probability p_k independently of depth.
        """
        w = self.node_weights(acceptance)
        out = np.ones(self.size, dtype=np.float64)
        for i in range(1, self.size):
            out[i] = out[self.parent[i]] * w[i]
        return out

    def node_weights(self, acceptance: Sequence[float]) -> np.ndarray:
        """(n,) float64: each node's probability of being accepted once its parent is, under the positional vector
        ``acceptance`` (``p`` of its rank; 0 for a rank >= K; the root 1): the factors of
        :meth:`path_probabilities`."""
        p = np.asarray(acceptance, dtype=np.float64)
        rank = np.asarray(self.rank)
        out = np.where(rank < p.size, p[np.minimum(rank, p.size - 1)], 0.0) if p.size else np.zeros(self.size)
        out[0] = 1.0
        return out

    def expected_tokens(self, acceptance: Sequence[float]) -> float:
        """Expected tokens per step G(tree) = sum of :meth:`path_probabilities` (root counts 1).

        Sequoia section 3.1. The value is in tokens per verification step.
        """
        return float(self.path_probabilities(acceptance).sum())

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict[str, Any]:
        """Node list as stored in YAML: ``[{"parent": -1, "rank": 0}, ...]`` under key ``nodes``."""
        return {"nodes": [{"parent": p, "rank": r} for p, r in zip(self.parent, self.rank)]}

    def summary(self) -> str:
        """One line: size, depth, level widths."""
        return f"{self.size} nodes, depth {self.tree_depth}, level widths {list(self.level_widths)}"


def _canonical_order(parent: Sequence[int], rank: Sequence[int]) -> tuple[list[int], dict[int, int]]:
    """Breadth-first order of an edge list whose node 0 is the root, children by rank: ``(order, new_index)``
    with ``order[j]`` the input index of canonical node j and ``new_index`` its inverse. Raises
    :class:`TreeValidationError` for a parent outside the node range, a cycle or an unreachable node."""
    n = len(parent)
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        p = int(parent[i])
        if not 0 <= p < n:
            raise TreeValidationError(f"node {i}: parent {p} is not a node index in [0, {n})")
        children[p].append(i)
    order = [0]
    new_index = {0: 0}
    head = 0
    while head < len(order):
        v = order[head]
        head += 1
        for c in sorted(children[v], key=lambda c: int(rank[c])):
            new_index[c] = len(order)
            order.append(c)
    if len(order) != n:
        raise TreeValidationError("some nodes are not reachable from the root (a cycle or a second root)")
    return order, new_index


def _int_tuple(values: Any, name: str) -> tuple[int, ...]:
    """``values`` as a tuple of Python ints; a float, bool, string or None is an error, never truncated."""
    try:
        items = list(values)
    except TypeError:
        raise TreeValidationError(f"{name} must be a sequence of integers, got {type(values).__name__}") from None
    out = []
    for i, x in enumerate(items):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise TreeValidationError(f"node {i}: {name} must be an integer, got {x!r}")
        out.append(int(x))
    return tuple(out)


def _validate(
    parent: tuple[int, ...], rank: tuple[int, ...], max_depth: int | None, max_branching: int | None
) -> None:
    n = len(parent)
    if n == 0:
        raise TreeValidationError("the tree has no nodes: node 0 must be the root (parent -1)")
    if len(rank) != n:
        raise TreeValidationError(f"{n} parents but {len(rank)} ranks")
    if parent[0] != -1:
        raise TreeValidationError(f"missing root: node 0 must have parent -1, it has parent {parent[0]}")
    if rank[0] != 0:
        raise TreeValidationError(f"the root must have rank 0, it has rank {rank[0]}")
    depth = [0] * n
    seen: set[tuple[int, int]] = set()
    prev_key = (0, -1, 0)
    for i in range(1, n):
        p, r = parent[i], rank[i]
        if p == -1:
            raise TreeValidationError(f"node {i} is a second root (parent -1); a tree has exactly one root")
        if p < 0 or r < 0:
            raise TreeValidationError(f"node {i}: negative index (parent {p}, rank {r})")
        if p >= n:
            raise TreeValidationError(f"node {i}: parent {p} is out of range (the tree has {n} nodes, 0..{n - 1})")
        if p >= i:
            raise TreeValidationError(f"node {i}: parent {p} does not precede its child (breadth-first order)")
        if (p, r) in seen:
            raise TreeValidationError(f"node {i}: duplicate (parent {p}, rank {r})")
        seen.add((p, r))
        if max_branching is not None and r >= max_branching:
            raise TreeValidationError(f"node {i}: rank {r} >= the allowed branching {max_branching}")
        depth[i] = depth[p] + 1
        if max_depth is not None and depth[i] > max_depth:
            raise TreeValidationError(f"node {i}: depth {depth[i]} is beyond the limit {max_depth}")
        key = (depth[i], p, r)
        if key < prev_key:
            raise TreeValidationError(
                f"node {i} is out of canonical breadth-first order (sort by depth, parent, rank; "
                "Tree.from_edges does this)"
            )
        prev_key = key
    for p, r in seen:
        if r > 0 and (p, r - 1) not in seen:
            raise TreeValidationError(f"rank gap under node {p}: rank {r} without rank {r - 1}")


# ---------------------------------------------------------------------- several drafters


@dataclass(frozen=True, eq=True)
class DrafterTree:
    """A draft tree grown by several drafters (issue 16; TreeGraft 2026): a plain :class:`Tree` plus, for
    every node, the index of the drafter that proposed it.

    Semantics. Drafters are ordered light first (index 0, e.g. prompt lookup or a small draft model), then
    stronger, costlier ones. A node labelled with drafter j and *drafter rank* r (:attr:`drafter_rank`) is
    drafter j's r-th candidate at its parent **among the tokens not already proposed at that parent by
    drafters with a smaller index** (a conditional rank: the strong drafter's candidates are grafted next to
    the light's, never duplicating them). Siblings are ordered by drafter index, so ``tree.rank`` (the
    sibling index) of a node is the number of its siblings from smaller drafters plus its drafter rank.

    Args:
        tree: the topology (canonical breadth-first order, unchanged :class:`Tree` rules).
        drafter: (n,) drafter index of each node; the root's is 0 by convention (no drafter proposes it).
        names: the drafters' names, light first (at least one).

    Raises:
        TreeValidationError: ``drafter`` not one per node, an index outside ``[0, len(names))``, a root not
            labelled 0, no names / an empty or repeated name, or siblings not ordered light first (a node of
            a smaller drafter index after one of a larger index under the same parent).

    A single-drafter ``DrafterTree(tree, (0,) * n, (name,))`` is the plain tree: :attr:`drafter_rank` equals
    ``tree.rank``, and its YAML may be written as ``treeopt-tree/1`` by :func:`save_tree`.
    """

    tree: Tree
    drafter: tuple[int, ...]
    names: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.tree, Tree):
            raise TreeValidationError(f"a drafter tree wraps a Tree, got {type(self.tree).__name__}")
        object.__setattr__(self, "drafter", _int_tuple(self.drafter, "drafter"))
        if isinstance(self.names, str):
            raise TreeValidationError("names must be a list of drafter names, not one string")
        try:
            names = tuple(self.names)
        except TypeError:
            raise TreeValidationError(f"names must be a list of drafter names, got {self.names!r}") from None
        object.__setattr__(self, "names", names)
        if not names:
            raise TreeValidationError("a drafter tree needs at least one drafter name")
        for j, name in enumerate(names):
            if not isinstance(name, str) or not name.strip():
                raise TreeValidationError(f"drafter {j}: name must be a non-empty string, got {name!r}")
        if len(set(names)) != len(names):
            raise TreeValidationError(f"drafter names must be distinct, got {list(names)}")
        n, lab = self.tree.size, self.drafter
        if len(lab) != n:
            raise TreeValidationError(f"{len(lab)} drafter labels for a tree of {n} nodes; give one per node")
        if lab[0] != 0:
            raise TreeValidationError(f"the root's drafter must be 0 (by convention), got {lab[0]}")
        for i, j in enumerate(lab):
            if not 0 <= j < len(names):
                raise TreeValidationError(
                    f"node {i}: drafter index {j} is out of range [0, {len(names)}) (drafters: {list(names)})")
        for p, kids in enumerate(self.tree.children):
            for a, b in zip(kids, kids[1:]):
                if lab[b] < lab[a]:
                    raise TreeValidationError(
                        f"node {b}: drafter {lab[b]} ({names[lab[b]]}) comes after its sibling {a} of drafter "
                        f"{lab[a]} ({names[lab[a]]}) under node {p}; siblings must be ordered light first "
                        "(drafter index non-decreasing along rank)")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def single(cls, tree: Tree, name: str = "draft") -> "DrafterTree":
        """The plain ``tree`` as grown by one drafter ``name`` (every node labelled 0)."""
        return cls(tree, (0,) * tree.size, (name,))

    @classmethod
    def from_edges(cls, parent: Sequence[int], rank: Sequence[int], drafter: Sequence[int],
                   names: Sequence[str], **limits: Any) -> "DrafterTree":
        """Build from nodes in any order (node 0 = the root; ``rank`` = sibling index), sorting into canonical
        order and carrying each node's drafter along. Raises :class:`TreeValidationError` like the
        constructor and :meth:`Tree.from_edges`."""
        n = len(parent)
        if n == 0 or len(rank) != n or len(drafter) != n:
            raise TreeValidationError(f"{n} parents, {len(rank)} ranks and {len(drafter)} drafter labels: "
                                      "a drafter tree needs one of each per node, root included")
        if parent[0] != -1:
            raise TreeValidationError("node 0 must be the root (parent -1)")
        order, new_index = _canonical_order(parent, rank)
        tree = Tree(parent=[-1] + [new_index[int(parent[v])] for v in order[1:]],
                    rank=[rank[v] for v in order], **limits)
        return cls(tree, tuple(drafter[v] for v in order), tuple(names))

    # ------------------------------------------------------------------ the plain tree's view
    @property
    def size(self) -> int:
        """Number of nodes n, root included."""
        return self.tree.size

    def __len__(self) -> int:
        return self.tree.size

    @property
    def parent(self) -> tuple[int, ...]:
        """Parent index of each node (-1 for the root), the plain tree's."""
        return self.tree.parent

    @property
    def rank(self) -> tuple[int, ...]:
        """Sibling index of each node (light siblings first); see :attr:`drafter_rank` for the conditional
        rank within the node's own drafter."""
        return self.tree.rank

    @property
    def depth(self) -> np.ndarray:
        """(n,) int64 depth of each node (0 for the root), the plain tree's."""
        return self.tree.depth

    @property
    def tree_depth(self) -> int:
        """Depth of the deepest node (0 for a root-only tree)."""
        return self.tree.tree_depth

    @property
    def level_widths(self) -> tuple[int, ...]:
        """Nodes at each depth 0..tree_depth, every drafter's together (the root level has width 1)."""
        return self.tree.level_widths

    @property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """For each node, its children's indices by rank (light siblings first)."""
        return self.tree.children

    # ------------------------------------------------------------------ derived, per drafter
    @property
    def num_drafters(self) -> int:
        """Number of drafters named (``len(names)``), used or not."""
        return len(self.names)

    @cached_property
    def drafter_rank(self) -> tuple[int, ...]:
        """(n,) each node's rank among its drafter's candidates at its parent: ``rank`` minus the number of
        earlier siblings with a smaller drafter index (the root's is 0). For drafter 0 it equals ``rank``."""
        out = [0] * self.size
        for kids in self.tree.children:
            seen: dict[int, int] = {}
            for c in kids:
                j = self.drafter[c]
                out[c] = seen.get(j, 0)
                seen[j] = out[c] + 1
        return tuple(out)

    @cached_property
    def drafter_counts(self) -> tuple[int, ...]:
        """Non-root nodes proposed by each drafter (length :attr:`num_drafters`; the root is proposed by no
        drafter, so the counts sum to n - 1)."""
        c = [0] * self.num_drafters
        for j in self.drafter[1:]:
            c[j] += 1
        return tuple(c)

    @cached_property
    def expands(self) -> tuple[tuple[int, ...], ...]:
        """For each drafter k, the sorted node indices with at least one child labelled k (the nodes whose
        candidates drafter k must propose)."""
        out: list[set[int]] = [set() for _ in range(self.num_drafters)]
        for v in range(1, self.size):
            out[self.drafter[v]].add(self.tree.parent[v])
        return tuple(tuple(sorted(s)) for s in out)

    @cached_property
    def light_under_strong(self) -> bool:
        """True when some node has an ancestor of a larger drafter index (two drafters: a light node under a
        strong one). The graft policy runs only trees where this is False (a grafted branch is the strong
        drafter's own recovered path; :func:`~sequoia_opt.drafting.policies.graft.check_graft_plan`)."""
        top = [0] * self.size  # the largest drafter index on the root path, the node included
        for v in range(1, self.size):  # canonical order: parents before children
            above = top[self.tree.parent[v]]
            if self.drafter[v] < above:
                return True
            top[v] = max(above, self.drafter[v])
        return False

    def processed(self, k: int) -> tuple[int, ...]:
        """The sorted node indices drafter k runs a forward over in a step: the ancestors-or-self of
        :attr:`expands` ``[k]`` (a per-level drafter needs each expanded node and, one level at a time, its
        ancestors in its cache). Empty when drafter k proposes nothing. Raises TreeValidationError for a k
        outside ``[0, num_drafters)``."""
        self._check_drafter(k)
        seen: set[int] = set()
        for v in self.expands[k]:
            seen.update(self.tree.paths[v])
        return tuple(sorted(seen))

    def processed_level_widths(self, k: int) -> tuple[int, ...]:
        """How many nodes of :meth:`processed` ``(k)`` lie at each depth 0..tree_depth (length
        ``tree_depth + 1``; level 0 is the root; zeros where drafter k processes nothing)."""
        w = [0] * (self.tree_depth + 1)
        for v in self.processed(k):
            w[int(self.tree.depth[v])] += 1
        return tuple(w)

    def light_only(self) -> tuple["DrafterTree", tuple[int, ...]]:
        """The subtree of the nodes whose root path holds drafter-0 nodes only (what the light drafter alone
        grows), same names, and the index map ``old -> new`` (length n, -1 for a node left out). Light
        siblings come first, so kept nodes keep their ranks and their relative (canonical) order."""
        keep = [False] * self.size
        keep[0] = True
        for v in range(1, self.size):
            keep[v] = keep[self.tree.parent[v]] and self.drafter[v] == 0
        index, parent, rank = [-1] * self.size, [], []
        for v in range(self.size):
            if keep[v]:
                index[v] = len(parent)
                parent.append(-1 if v == 0 else index[self.tree.parent[v]])
                rank.append(self.tree.rank[v])
        return DrafterTree(Tree(parent=parent, rank=rank), (0,) * len(parent), self.names), tuple(index)

    def _check_drafter(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k < self.num_drafters:
            raise TreeValidationError(f"drafter index {k!r} is out of range [0, {self.num_drafters})")

    def to_dict(self) -> dict[str, Any]:
        """As stored in ``treeopt-tree/2`` YAML: ``drafters`` and ``nodes`` (``drafter`` omitted when 0)."""
        nodes = []
        for p, r, j in zip(self.tree.parent, self.tree.rank, self.drafter):
            nodes.append({"parent": p, "rank": r, **({"drafter": j} if j else {})})
        return {"drafters": list(self.names), "nodes": nodes}

    def summary(self) -> str:
        """One line: size, depth, level widths and nodes per drafter."""
        per = ", ".join(f"{name} {c}" for name, c in zip(self.names, self.drafter_counts))
        return f"{self.tree.summary()}; nodes per drafter: {per}"


# ---------------------------------------------------------------------- YAML document


@dataclass
class TreeMetadata:
    """What the solver knew when it chose a tree; stored beside the nodes in ``treeopt-tree/1`` YAML.

    Attributes:
        budget: node budget n the tree was solved for (nodes including the root).
        max_depth: depth limit D used by the solver.
        expected_tokens_per_step: G(tree) under the acceptance profile (tokens per step).
        predicted_speedup: predicted speedup over plain autoregressive decoding (ratio), if a latency
            profile was used.
        acceptance_profile / latency_profile: ids of the profiles used (None when absent).
        solver: what produced the tree (e.g. ``"sequoia-dp"``, ``"chain"``, ``"import:medusa"``).
        date: ISO-8601 date-time string.
        extra: anything else (kept as-is on round-trip).
    """

    budget: int | None = None
    max_depth: int | None = None
    expected_tokens_per_step: float | None = None
    predicted_speedup: float | None = None
    acceptance_profile: str | None = None
    latency_profile: str | None = None
    solver: str | None = None
    date: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = (
        "budget",
        "max_depth",
        "expected_tokens_per_step",
        "predicted_speedup",
        "acceptance_profile",
        "latency_profile",
        "solver",
        "date",
    )

    def to_dict(self) -> dict[str, Any]:
        """The file's ``metadata`` mapping: every field by name (None where unknown), then the :attr:`extra` entries."""
        d = {k: getattr(self, k) for k in self._KEYS}
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TreeMetadata":
        """From a file's ``metadata`` mapping: the known keys (None when absent), every other key kept in :attr:`extra`.
        Checks nothing: the tree loader checks the values it reads and raises TreeValidationError."""
        known = {k: d.get(k) for k in cls._KEYS}
        extra = {k: v for k, v in d.items() if k not in cls._KEYS}
        return cls(**known, extra=extra)


def now_iso() -> str:
    """Current UTC time as an ISO-8601 string with seconds, for metadata ``date`` fields."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _metadata_yaml(fmt: str, metadata: TreeMetadata | None) -> str:
    meta = (metadata or TreeMetadata()).to_dict()
    meta = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in meta.items()}
    return yaml.safe_dump({"format": fmt, "metadata": meta}, sort_keys=False)


def tree_to_yaml(tree: Tree, metadata: TreeMetadata | None = None) -> str:
    """Serialize to ``treeopt-tree/1`` YAML text (format line, metadata mapping, flow-style node list)."""
    nodes = "".join(f"  - {{parent: {p}, rank: {r}}}\n" for p, r in zip(tree.parent, tree.rank))
    return _metadata_yaml(TREE_FORMAT, metadata) + "nodes:\n" + nodes


def drafter_tree_to_yaml(dtree: DrafterTree, metadata: TreeMetadata | None = None) -> str:
    """Serialize to ``treeopt-tree/2`` YAML text: format line, metadata mapping, ``drafters: [names]`` (light
    first), and one flow-style node per line with ``parent``, ``rank`` (sibling index) and ``drafter`` (its
    index in ``drafters``; left out when 0)::

        format: treeopt-tree/2
        metadata: {...}
        drafters: [lookup, smollm2-360m]
        nodes:
          - {parent: -1, rank: 0}
          - {parent: 0, rank: 0}
          - {parent: 0, rank: 1, drafter: 1}
    """
    names = yaml.safe_dump({"drafters": list(dtree.names)}, sort_keys=False, default_flow_style=None, width=1 << 30)
    nodes = "".join(
        f"  - {{parent: {p}, rank: {r}" + (f", drafter: {j}}}\n" if j else "}\n")
        for p, r, j in zip(dtree.tree.parent, dtree.tree.rank, dtree.drafter)
    )
    return _metadata_yaml(TREE_FORMAT_V2, metadata) + names + "nodes:\n" + nodes


def _parse_tree_document(text: str, source: str):
    """Parse ``treeopt-tree/1`` or ``/2`` text into ``(format, Tree, drafter labels, names or None, metadata)``;
    ``names`` is None for /1 (it has none). Raises TreeValidationError with one line, prefixed by ``source``."""
    try:
        doc = safe_load_yaml(text)
    except yaml.YAMLError as err:
        raise TreeValidationError(f"{source}: not valid YAML ({yaml_error_text(err)})") from err
    if not isinstance(doc, dict):
        raise TreeValidationError(f"{source}: expected a mapping with 'format' and 'nodes'")
    check_numbers(doc, source, TreeValidationError)
    fmt = doc.get("format")
    if fmt not in TREE_FORMATS:
        raise TreeValidationError(
            f"{source}: unknown format {fmt!r}; this version reads {' and '.join(map(repr, TREE_FORMATS))}")
    # ``derived``: the JSON export's figures from the nodes (size, depth, choices), ignored on import
    warn_unknown_keys(doc, ("format", "metadata", "nodes", "drafters", "derived"), source)
    names = None
    if fmt == TREE_FORMAT_V2:
        raw = doc.get("drafters")
        if not isinstance(raw, list) or not raw or not all(isinstance(x, str) and x.strip() for x in raw):
            raise TreeValidationError(f"{source}: format {TREE_FORMAT_V2} needs 'drafters', a non-empty list of "
                                      f"drafter names (light first), got {raw!r}")
        names = tuple(raw)
    elif "drafters" in doc:
        raise TreeValidationError(f"{source}: 'drafters' is a {TREE_FORMAT_V2} key; this file says {fmt!r}")
    nodes = doc.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise TreeValidationError(f"{source}: 'nodes' must be a non-empty list")
    parent, rank, drafter = [], [], []
    seen: set = set()  # a misspelt node key (``drafer: 1`` read as drafter 0) is named once, at its first node
    for i, node in enumerate(nodes):
        if not isinstance(node, dict) or "parent" not in node or "rank" not in node:
            raise TreeValidationError(f"{source}: node {i} must be a mapping with 'parent' and 'rank'")
        p, r = node["parent"], node["rank"]
        if len(node) > 2 and not node.keys() <= seen:
            fresh = {k: v for k, v in node.items() if k not in seen}
            seen |= node.keys()
            warn_unknown_keys(fresh, ("parent", "rank", "drafter"), f"{source}: node {i}")
        if isinstance(p, bool) or isinstance(r, bool) or not isinstance(p, int) or not isinstance(r, int):
            raise TreeValidationError(f"{source}: node {i}: parent and rank must be integers")
        j = node.get("drafter", 0)
        if "drafter" in node and fmt != TREE_FORMAT_V2:
            raise TreeValidationError(f"{source}: node {i} has a 'drafter', which {fmt} does not have; "
                                      f"write the file as {TREE_FORMAT_V2}")
        if isinstance(j, bool) or not isinstance(j, int):
            raise TreeValidationError(f"{source}: node {i}: drafter must be an integer index into 'drafters', "
                                      f"got {j!r}")
        parent.append(p)
        rank.append(r)
        drafter.append(j)
    meta_raw = doc.get("metadata") or {}
    if not isinstance(meta_raw, dict):
        raise TreeValidationError(f"{source}: 'metadata' must be a mapping")
    meta = TreeMetadata.from_dict(meta_raw)
    for key in ("max_depth", "budget"):
        v = getattr(meta, key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_TREE_NODES):
            raise TreeValidationError(f"{source}: metadata {key} must be an integer in 0..{MAX_TREE_NODES} or null, "
                                      f"got {v!r}")
    for key, low in (("expected_tokens_per_step", 1.0), ("predicted_speedup", 0.0)):
        v = getattr(meta, key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= low):
            raise TreeValidationError(f"{source}: metadata {key} must be a number >= {low:g} or null, got {v!r}")
    try:
        tree = Tree(parent=parent, rank=rank, max_depth=meta.max_depth)
    except TreeValidationError as err:
        raise TreeValidationError(f"{source}: {err}") from None
    meta = _fresh_run_metadata(meta, tree, source)  # another tree's figures first: dropped, not refused
    _check_run_metadata(meta, tree, source)
    return fmt, tree, tuple(drafter), names, meta


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_run_metadata(meta: "TreeMetadata", tree: "Tree", source: str) -> None:
    """The metadata ``treeopt run`` reads to predict and report, checked when the file is read (a bad value failed
    after the decoding, and the run's results were lost; an impossible one was shown as a prediction).

    Raises:
        TreeValidationError: ``expected_tokens_per_step`` above the tree's depth + 1 (no step emits more);
            ``node_rates`` not a list of probabilities; ``end_overshoot_tokens`` not a number in 0..depth;
            ``budget_limit`` / ``max_branching`` not a positive integer; a ``*_spread`` that is not a mapping.
    """
    top = tree.tree_depth + 1
    if meta.expected_tokens_per_step is not None and meta.expected_tokens_per_step > top + 1e-9:
        raise TreeValidationError(f"{source}: metadata expected_tokens_per_step = {meta.expected_tokens_per_step} but "
                                  f"a tree of depth {tree.tree_depth} emits at most {top} tokens per step")
    x = meta.extra
    rates = x.get("node_rates")
    if rates is not None and not (isinstance(rates, list) and all(_real(q) and 0 <= q <= 1 for q in rates)):
        raise TreeValidationError(f"{source}: metadata node_rates must list probabilities in [0, 1] (one per node "
                                  "but the root)")  # of another tree's length: dropped (_fresh_run_metadata)
    over = x.get("end_overshoot_tokens")
    if over is not None and not (_real(over) and 0 <= over <= tree.tree_depth):
        raise TreeValidationError(f"{source}: metadata end_overshoot_tokens = {over!r} must be a number in "
                                  f"0..{tree.tree_depth} (tokens a step emits past a generation's end)")
    for key in ("budget_limit", "max_branching"):
        v = x.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TREE_NODES):
            raise TreeValidationError(f"{source}: metadata {key} = {v!r} must be an integer in 1..{MAX_TREE_NODES}")
    for key in ("tokens_per_step_spread", "speedup_spread"):
        if x.get(key) is not None and not isinstance(x[key], dict):
            raise TreeValidationError(f"{source}: metadata {key} must be a mapping (point, se, prompts)")


#: the metadata that predicts one tree's run: of another tree (a header copied onto edited nodes) it is dropped
_PREDICTION_KEYS = ("node_rates", "depth_step_ms", "end_overshoot_tokens", "tokens_per_step_spread", "speedup_spread",
                    "step_check", "checked_trees", "solver_predicted_speedup")


def _fresh_run_metadata(meta: "TreeMetadata", tree: "Tree", source: str) -> "TreeMetadata":
    """``meta``, less its predictions where they are another tree's: ``node_rates`` (one per node but the root) or
    ``depth_step_ms`` (one per depth 0..D) of another length than this tree's, as when nodes were edited under a
    solved file's header (the run showed the solved tree's G for the edited one, above what the edit can emit).
    Warns (:class:`~sequoia_opt.errors.ProfileWarning`) once, naming what the figures were for."""
    import warnings
    from dataclasses import replace

    from .errors import ProfileWarning

    x = meta.extra
    rates, costs = x.get("node_rates"), x.get("depth_step_ms")
    of_nodes = len(rates) + 1 if isinstance(rates, list) and len(rates) != tree.size - 1 else None
    of_depth = len(costs) - 1 if isinstance(costs, list) and len(costs) != tree.tree_depth + 1 else None
    if of_nodes is None and of_depth is None:
        return meta
    other = f"a {of_nodes}-node tree" if of_nodes is not None else f"a tree of depth {of_depth}"
    warnings.warn(f"{source}: its metadata predicts {other} but the file holds {tree.size} nodes (depth "
                  f"{tree.tree_depth}), edited after it was solved: no prediction for it (solve it again for one)",
                  ProfileWarning, stacklevel=3)
    return replace(meta, expected_tokens_per_step=None, predicted_speedup=None,
                   extra={k: v for k, v in x.items() if k not in _PREDICTION_KEYS})


def tree_from_yaml(text: str, *, source: str = "tree YAML") -> tuple[Tree, TreeMetadata]:
    """Parse ``treeopt-tree/1`` YAML text, or ``treeopt-tree/2`` text that names a single drafter. Raises
    :class:`TreeValidationError` with one clear line on an unknown format version, a malformed node list, an
    invalid topology, or (:class:`MultiDrafterTreeError`, a subclass) a /2 tree that names more than one drafter
    (read that with :func:`drafter_tree_from_yaml` / :func:`load_drafter_tree`)."""
    fmt, tree, drafter, names, meta = _parse_tree_document(text, source)
    if names is not None:
        if len(names) > 1:
            raise MultiDrafterTreeError(
                f"{source}: a multi-drafter tree ({len(names)} drafters: {', '.join(names)}); a single-drafter "
                "reader cannot run it, use the multi-drafter path (load_drafter_tree)")
        try:
            DrafterTree(tree, drafter, names)
        except TreeValidationError as err:
            raise TreeValidationError(f"{source}: {err}") from None
    return tree, meta


def drafter_tree_from_yaml(text: str, *, source: str = "tree YAML") -> tuple[DrafterTree, TreeMetadata]:
    """Parse ``treeopt-tree/2`` or ``/1`` YAML text into a :class:`DrafterTree`. A /1 tree is one drafter's:
    every node is labelled 0 and the drafter is named by the metadata's ``drafter`` or ``profiled_draft`` key
    when it holds a name (what ``treeopt solve`` records), else ``"draft"``.

    Raises :class:`TreeValidationError` with one line (prefixed by ``source``) as :func:`tree_from_yaml`, and
    for drafter labels out of range, not one per node, or siblings not ordered light first.
    """
    fmt, tree, drafter, names, meta = _parse_tree_document(text, source)
    if names is None:
        name = next((v for v in (meta.extra.get("drafter"), meta.extra.get("profiled_draft"))
                     if isinstance(v, str) and v.strip()), "draft")
        names = (name,)
    try:
        return DrafterTree(tree, drafter, names), meta
    except TreeValidationError as err:
        raise TreeValidationError(f"{source}: {err}") from None


def save_tree(path: str | Path, tree: Tree, metadata: TreeMetadata | None = None) -> Path:
    """Write a tree as ``treeopt-tree/1`` YAML atomically, read back first as :func:`load_tree` will. Returns the
    path.

    Raises:
        TreeValidationError: metadata the loader refuses (a ``max_depth`` the tree exceeds, a figure out of range,
            run metadata of the wrong type): the file would be one its own loader refuses; nothing is written.
    """
    text = tree_to_yaml(tree, metadata)
    tree_from_yaml(text, source=str(path))
    return atomic_write_text(path, text)


def save_drafter_tree(path: str | Path, dtree: DrafterTree, metadata: TreeMetadata | None = None) -> Path:
    """Write a drafter tree as ``treeopt-tree/2`` YAML atomically (:func:`drafter_tree_to_yaml`), read back first
    as :func:`load_drafter_tree` will. Returns the path.

    Raises:
        TreeValidationError: metadata the loader refuses (a ``max_depth`` the tree exceeds, a figure out of range);
            nothing is written.
    """
    text = drafter_tree_to_yaml(dtree, metadata)
    drafter_tree_from_yaml(text, source=str(path))
    return atomic_write_text(path, text)


def load_tree(path: str | Path) -> tuple[Tree, TreeMetadata]:
    """Read a ``treeopt-tree/1`` YAML file (or a single-drafter /2 one; :func:`tree_from_yaml`). Raises
    :class:`TreeValidationError` (also for a missing file, and for a multi-drafter tree)."""
    text = read_text_file(path, error=TreeValidationError, what="tree file")
    return tree_from_yaml(text, source=str(path))


def load_drafter_tree(path: str | Path) -> tuple[DrafterTree, TreeMetadata]:
    """Read a ``treeopt-tree/2`` or ``/1`` YAML file as a :class:`DrafterTree`
    (:func:`drafter_tree_from_yaml`). Raises :class:`TreeValidationError` (also for a missing file)."""
    text = read_text_file(path, error=TreeValidationError, what="tree file")
    return drafter_tree_from_yaml(text, source=str(path))
