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

from ._io import atomic_write_text, read_text_file
from .errors import TreeValidationError

TREE_FORMAT = "treeopt-tree/1"


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
        """A chain of ``length`` nodes (root + ``length - 1`` speculated tokens, all rank 0)."""
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
        p = np.asarray(acceptance, dtype=np.float64)
        out = np.ones(self.size, dtype=np.float64)
        for i in range(1, self.size):
            r = self.rank[i]
            out[i] = out[self.parent[i]] * (p[r] if r < p.size else 0.0)
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
        d = {k: getattr(self, k) for k in self._KEYS}
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TreeMetadata":
        known = {k: d.get(k) for k in cls._KEYS}
        extra = {k: v for k, v in d.items() if k not in cls._KEYS}
        return cls(**known, extra=extra)


def now_iso() -> str:
    """Current UTC time as an ISO-8601 string with seconds, for metadata ``date`` fields."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def tree_to_yaml(tree: Tree, metadata: TreeMetadata | None = None) -> str:
    """Serialize to ``treeopt-tree/1`` YAML text (format line, metadata mapping, flow-style node list)."""
    meta = (metadata or TreeMetadata()).to_dict()
    meta = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in meta.items()}
    head = yaml.safe_dump({"format": TREE_FORMAT, "metadata": meta}, sort_keys=False)
    nodes = "".join(f"  - {{parent: {p}, rank: {r}}}\n" for p, r in zip(tree.parent, tree.rank))
    return head + "nodes:\n" + nodes


def tree_from_yaml(text: str, *, source: str = "tree YAML") -> tuple[Tree, TreeMetadata]:
    """Parse ``treeopt-tree/1`` YAML text. Raises :class:`TreeValidationError` with one clear line on an
    unknown format version, a malformed node list or an invalid topology."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise TreeValidationError(f"{source}: not valid YAML ({err.__class__.__name__})") from err
    if not isinstance(doc, dict):
        raise TreeValidationError(f"{source}: expected a mapping with 'format' and 'nodes'")
    fmt = doc.get("format")
    if fmt != TREE_FORMAT:
        raise TreeValidationError(f"{source}: unknown format {fmt!r}; this version reads {TREE_FORMAT!r}")
    nodes = doc.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise TreeValidationError(f"{source}: 'nodes' must be a non-empty list")
    parent, rank = [], []
    for i, node in enumerate(nodes):
        if not isinstance(node, dict) or "parent" not in node or "rank" not in node:
            raise TreeValidationError(f"{source}: node {i} must be a mapping with 'parent' and 'rank'")
        p, r = node["parent"], node["rank"]
        if isinstance(p, bool) or isinstance(r, bool) or not isinstance(p, int) or not isinstance(r, int):
            raise TreeValidationError(f"{source}: node {i}: parent and rank must be integers")
        parent.append(p)
        rank.append(r)
    meta_raw = doc.get("metadata") or {}
    if not isinstance(meta_raw, dict):
        raise TreeValidationError(f"{source}: 'metadata' must be a mapping")
    meta = TreeMetadata.from_dict(meta_raw)
    md = meta.max_depth
    if md is not None and (isinstance(md, bool) or not isinstance(md, int) or md < 0):
        raise TreeValidationError(f"{source}: metadata max_depth must be a non-negative integer or null, got {md!r}")
    try:
        tree = Tree(parent=parent, rank=rank, max_depth=meta.max_depth)
    except TreeValidationError as err:
        raise TreeValidationError(f"{source}: {err}") from None
    return tree, meta


def save_tree(path: str | Path, tree: Tree, metadata: TreeMetadata | None = None) -> Path:
    """Write a tree as ``treeopt-tree/1`` YAML atomically. Returns the path."""
    return atomic_write_text(path, tree_to_yaml(tree, metadata))


def load_tree(path: str | Path) -> tuple[Tree, TreeMetadata]:
    """Read a ``treeopt-tree/1`` YAML file. Raises :class:`TreeValidationError` (also for a missing file)."""
    text = read_text_file(path, error=TreeValidationError, what="tree file")
    return tree_from_yaml(text, source=str(path))
