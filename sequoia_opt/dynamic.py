"""Dynamic trees as data: the rules that grow a step's tree from the drafter's own scores.

A static tree (Sequoia) is solved once from an average acceptance vector. A *dynamic* tree is chosen per step
from the draft probabilities the drafter just produced. Three rules, each a pure function of an
:class:`Expander` (the thing that runs the drafter over some nodes and returns their ranked candidates), so
the decoder's policies (:mod:`sequoia_opt.drafting.policies`, the expander is a real draft forward) and the
solver's predictor (:mod:`sequoia_opt.solver.dynamic`, the expander replays recorded draft distributions) run
the very same code:

* ``eagle`` — EAGLE-2 (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft
  Trees", section 4): for ``steps`` levels expand the ``topk`` frontier nodes with the highest path
  probability (the product of the draft probabilities along the root path) into their ``topk`` best children,
  then keep the ``budget`` nodes (root included) with the highest path probability (re-ranking). This is
  SGLang's ``--speculative-num-steps / --speculative-eagle-topk / --speculative-num-draft-tokens``.
* ``entropy`` — entropy-based branching: level by level, in path-probability order, a node gets
  ``min(topk, max(1, round(exp(H))))`` children, H its draft entropy in nats (exp(H), the perplexity, is the
  draft's effective number of choices: one child where the draft is sure, more where it is not), until the
  ``budget`` is spent or ``steps`` levels are grown. Every grown node is verified (no re-ranking).
* ``best-first`` — a best-first tree under a node budget (DDTree, Ringel & Romano 2026, "Accelerating
  Speculative Decoding with Block Diffusion Draft Trees"): a heap of candidate continuations keyed by draft
  path probability; the best is popped into the tree until the tree has ``budget`` nodes. DDTree reads
  per-position distributions of a one-pass drafter; a per-level drafter here scores the popped nodes lazily,
  in batches (one draft forward over every popped, unscored node, run when the heap's best could be beaten by
  one of their children), at most ``steps`` forwards; after the last, popped nodes stay leaves. The order is
  exactly best-first while forwards remain.

Nodes are numbered in creation order (every parent before its children); the root is node 0. A rule returns
the :class:`CandidateTree` it grew and the nodes it keeps (``selected``, ancestor-closed, in creation order).
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field
from typing import Protocol, Sequence

__all__ = ["POLICY_NAMES", "DynamicSetting", "Expansion", "Expander", "CandidateTree", "grow", "parse_setting",
           "entropy_children", "max_candidates", "max_tree_size"]

#: The dynamic rules, by the name the CLI and profiles use.
POLICY_NAMES = ("eagle", "entropy", "best-first")

#: The largest steps, topk or budget a setting may hold (2**31 - 1; memory bounds it far lower, see
#: :func:`step_memory_bytes`).
MAX_SETTING = 2**31 - 1


@dataclass(frozen=True)
class DynamicSetting:
    """One dynamic-tree setting.

    Attributes:
        policy: ``"eagle"``, ``"entropy"`` or ``"best-first"`` (module docstring).
        steps: the most draft forwards per step; also the deepest the tree can be (SGLang's
            ``--speculative-num-steps``).
        topk: eagle: children per expanded node and frontier width (``--speculative-eagle-topk``); entropy and
            best-first: the most children a node can get.
        budget: nodes verified per step, the root included (``--speculative-num-draft-tokens``, which counts the
            root); the target's forward is over at most this many tokens.

    Raises:
        ValueError: an unknown policy, steps / topk < 1, budget < 2.
    """

    policy: str
    steps: int
    topk: int
    budget: int

    def __post_init__(self) -> None:
        if self.policy not in POLICY_NAMES:
            raise ValueError(f"unknown dynamic policy {self.policy!r}; one of {', '.join(POLICY_NAMES)}")
        for name in ("steps", "topk"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"a dynamic setting's {name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.budget, int) or isinstance(self.budget, bool) or self.budget < 2:
            raise ValueError(f"a dynamic setting's budget counts the root and must be >= 2, got {self.budget!r}")
        for name in ("steps", "topk", "budget"):
            if getattr(self, name) > MAX_SETTING:
                raise ValueError(f"a dynamic setting's {name} = {getattr(self, name)} is out of range (at most "
                                 f"{MAX_SETTING})")

    @property
    def label(self) -> str:
        """``eagle:s4-k4-n16`` (steps, topk, budget)."""
        return f"{self.policy}:s{self.steps}-k{self.topk}-n{self.budget}"

    def to_dict(self) -> dict:
        """The file's ``setting`` mapping, ``{policy, steps, topk, budget}``: what :meth:`from_dict` reads back."""
        return {"policy": self.policy, "steps": self.steps, "topk": self.topk, "budget": self.budget}

    @classmethod
    def from_dict(cls, d: dict) -> "DynamicSetting":
        """From a file's ``setting`` mapping; integers as written (2.5, inf or "3" are refused, not rounded).
        Raises ValueError."""
        try:
            return cls(str(d["policy"]), d["steps"], d["topk"], d["budget"])
        except (KeyError, TypeError) as err:
            raise ValueError(f"a dynamic setting needs policy, steps, topk and budget ({err})") from None


_SPEC = re.compile(r"^\s*(eagle|entropy|best-first)\s*[:,]\s*(.*)$")


def parse_setting(spec: str) -> DynamicSetting:
    """A setting from ``POLICY:steps=S,topk=K,budget=N`` (also the label form ``eagle:s4-k4-n16``).

    Raises:
        ValueError: anything else, with the expected form.
    """
    form = "POLICY:steps=S,topk=K,budget=N with POLICY one of eagle, entropy, best-first (e.g. eagle:steps=4,topk=4,budget=16)"
    m = _SPEC.match(spec)
    if not m:
        raise ValueError(f"cannot read dynamic setting {spec!r}; expected {form}")
    rest = m.group(2).strip()
    short = re.fullmatch(r"s(\d+)-k(\d+)-n(\d+)", rest)
    if short:
        return DynamicSetting(m.group(1), int(short.group(1)), int(short.group(2)), int(short.group(3)))
    vals: dict[str, int] = {}
    for part in filter(None, (x.strip() for x in rest.split(","))):
        key, _, val = part.partition("=")
        key = key.strip()
        if key not in ("steps", "topk", "budget") or not val.strip().lstrip("-").isdigit():
            raise ValueError(f"cannot read {part!r} in dynamic setting {spec!r}; expected {form}")
        if key in vals:
            raise ValueError(f"dynamic setting {spec!r} gives {key} twice")
        vals[key] = int(val)
    missing = [k for k in ("steps", "topk", "budget") if k not in vals]
    if missing:
        raise ValueError(f"dynamic setting {spec!r} lacks {', '.join(missing)}; expected {form}")
    return DynamicSetting(m.group(1), vals["steps"], vals["topk"], vals["budget"])


def _can_grow(s: DynamicSetting) -> int:
    """Nodes ``steps`` levels can hold under the rule, whatever the budget: eagle expands k frontier nodes per
    level, ``1 + k + (steps - 1) k^2``; the others every node, ``1 + sum_{d=1..steps} k^d``."""
    if s.policy == "eagle":
        return 1 + s.topk + (s.steps - 1) * s.topk * s.topk
    return sum(s.topk ** d for d in range(s.steps + 1))


def max_candidates(s: DynamicSetting) -> int:
    """The most nodes the rule's candidate tree can hold, root included (the drafter's slots): eagle grows all
    it can before re-ranking; the other two never grow past the budget."""
    return _can_grow(s) if s.policy == "eagle" else max_tree_size(s)


def max_tree_size(s: DynamicSetting) -> int:
    """The most nodes the rule can verify: the budget, or what ``steps`` levels can hold when that is less."""
    return min(s.budget, _can_grow(s))


def step_memory_bytes(s: DynamicSetting, vocab_size: int) -> int:
    """Bytes one decoding step of the setting allocates at most (what :class:`DynamicPolicy` holds while it
    grows a tree): the (n, n) bool ancestor-or-self matrix over the n = :func:`max_candidates` candidate nodes
    and its copy on the decoding device (2 n^2), and the draft distributions of the widest forward, w nodes
    over the vocabulary, as float32 logits, probabilities and their logarithms (12 w V); w is topk for
    ``eagle`` (its frontier), else the budget less the root. EAGLE at topk 128 over 8 steps: n = 114,817,
    26 GB."""
    n = max_candidates(s)
    w = max(1, min(n - 1, s.topk if s.policy == "eagle" else s.budget - 1))
    return 2 * n * n + 12 * w * int(vocab_size)


def check_step_memory(s: DynamicSetting, vocab_size: int, free_bytes: int, where: str = "this machine") -> None:
    """Refuse a setting whose step needs more memory than ``free_bytes`` (:func:`step_memory_bytes`).

    Raises:
        ValueError: one line naming the setting, the memory it needs and the memory free on ``where``.
    """
    need = step_memory_bytes(s, vocab_size)
    if need > free_bytes:
        n = max_candidates(s)
        raise ValueError(f"{s.label}: one step needs about {_gib(need)} ({n:,} candidate nodes: a {n:,} x {n:,} "
                         f"ancestor matrix, and draft distributions over {vocab_size:,} tokens), more than the "
                         f"{_gib(free_bytes)} free on {where}: lower topk or steps")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def entropy_children(entropy: float, topk: int) -> int:
    """Children of a node under entropy branching: ``min(topk, max(1, round(exp(H))))``, H in nats."""
    return int(min(topk, max(1, round(math.exp(min(entropy, 50.0))))))


@dataclass
class Expansion:
    """What one draft forward says about one node.

    Attributes:
        tokens: candidate tokens in rank order (distinct; at most the ``k`` asked for; only tokens with a
            positive draft probability).
        probs: their draft probabilities under the node (same length), non-increasing for ranked candidates
            (samples without replacement need not be).
        entropy: the entropy (nats) of the node's whole draft distribution.
    """

    tokens: list[int]
    probs: list[float]
    entropy: float


class Expander(Protocol):
    """Runs the drafter over some nodes (one forward) and returns each node's ranked candidates.

    ``expand(tree, nodes, k)`` is called with nodes whose parents were expanded earlier (the first call is
    ``[0]``, the root); it returns one :class:`Expansion` per node with up to ``k`` candidates.
    """

    def expand(self, tree: "CandidateTree", nodes: list[int], k: int) -> list[Expansion]:
        """One draft forward over ``nodes`` of ``tree`` (each node's parent already expanded; the first call is
        ``[0]``, the root): one :class:`Expansion` per node, in the order of ``nodes``, each with at most ``k``
        candidates."""


@dataclass
class CandidateTree:
    """The nodes a rule grew this step, in creation order.

    Attributes:
        token, parent, depth, rank: per node (the root: token given, parent -1, depth 0, rank 0).
        prob: the node's draft probability under its parent (1 for the root).
        path: the product of ``prob`` along the root path (the EAGLE-2 / DDTree score).
        expanded: nodes the drafter ran over (in forward order); ``entropy`` of each, by node.
        forward_widths: the width of each draft forward (nodes per forward), in order.
    """

    token: list[int] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    rank: list[int] = field(default_factory=list)
    prob: list[float] = field(default_factory=list)
    path: list[float] = field(default_factory=list)
    expanded: list[int] = field(default_factory=list)
    entropy: dict[int, float] = field(default_factory=dict)
    forward_widths: list[int] = field(default_factory=list)

    @classmethod
    def rooted(cls, root: int) -> "CandidateTree":
        """A tree of the root alone: token ``root``, parent -1, depth 0, rank 0, prob and path 1."""
        return cls(token=[int(root)], parent=[-1], depth=[0], rank=[0], prob=[1.0], path=[1.0])

    @property
    def n(self) -> int:
        """Nodes grown so far, root included."""
        return len(self.token)

    def add(self, parent: int, token: int, prob: float, rank: int) -> int:
        """Append a child of ``parent`` with ``token`` at ``rank``, its draft probability ``prob`` under the parent
        (its path is the parent's times ``prob``); returns the new node's index."""
        self.token.append(int(token))
        self.parent.append(int(parent))
        self.depth.append(self.depth[parent] + 1)
        self.rank.append(int(rank))
        self.prob.append(float(prob))
        self.path.append(self.path[parent] * float(prob))
        return self.n - 1

    def run(self, expander: Expander, nodes: list[int], k: int) -> list[Expansion]:
        """One draft forward over ``nodes`` through ``expander`` (:meth:`Expander.expand`), recorded: the nodes join
        :attr:`expanded`, the forward's width joins :attr:`forward_widths`, each node's entropy (nats) is kept.
        Returns the expansions, one per node in order; adds no nodes (the rule adds the candidates it keeps)."""
        out = expander.expand(self, nodes, k)
        self.expanded.extend(nodes)
        self.forward_widths.append(len(nodes))
        for v, e in zip(nodes, out):
            self.entropy[v] = float(e.entropy)
        return out


def _by_path(tree: CandidateTree, nodes: Sequence[int]) -> list[int]:
    """Nodes by path probability, highest first; ties by creation order (a parent before its children)."""
    return sorted(nodes, key=lambda i: (-tree.path[i], i))


def _eagle(s: DynamicSetting, tree: CandidateTree, ex: Expander) -> list[int]:
    frontier = [0]
    for step in range(s.steps):
        new = []
        for v, e in zip(frontier, tree.run(ex, frontier, s.topk)):
            new += [tree.add(v, t, q, r) for r, (t, q) in enumerate(zip(e.tokens[: s.topk], e.probs[: s.topk]))]
        if step + 1 == s.steps or not new:
            break
        frontier = _by_path(tree, new)[: s.topk]
        frontier.sort()
    keep = _by_path(tree, range(1, tree.n))[: s.budget - 1]
    return [0] + sorted(keep)


def _entropy(s: DynamicSetting, tree: CandidateTree, ex: Expander) -> list[int]:
    frontier, left = [0], s.budget - 1
    for _ in range(s.steps):
        if left <= 0 or not frontier:
            break
        frontier = sorted(_by_path(tree, frontier)[:left])
        exps = dict(zip(frontier, tree.run(ex, frontier, s.topk)))
        new = []
        for v in _by_path(tree, frontier):
            e = exps[v]
            k = min(entropy_children(e.entropy, s.topk), left, len(e.tokens))
            new += [tree.add(v, t, q, r) for r, (t, q) in enumerate(zip(e.tokens[:k], e.probs[:k]))]
            left -= k
            if left <= 0:
                break
        frontier = new
    return list(range(tree.n))


def _best_first(s: DynamicSetting, tree: CandidateTree, ex: Expander) -> list[int]:
    heap: list[tuple[float, int, int, int, float]] = []  # (-path, order, parent, rank, prob), token in a side map
    tokens: dict[int, int] = {}
    order = 0

    def push(v: int, e: Expansion) -> None:
        nonlocal order
        for r, (t, q) in enumerate(zip(e.tokens[: s.topk], e.probs[: s.topk])):
            heapq.heappush(heap, (-tree.path[v] * q, order, v, r, q))
            tokens[order] = t
            order += 1

    forwards = 1
    push(0, tree.run(ex, [0], s.topk)[0])
    pending: list[int] = []
    while tree.n < s.budget:
        best_pending = max((tree.path[v] for v in pending), default=-1.0)
        if pending and forwards < s.steps and (not heap or -heap[0][0] < best_pending):
            for v, e in zip(pending, tree.run(ex, pending, s.topk)):
                push(v, e)
            forwards += 1
            pending = []
            continue
        if not heap:
            break
        _, o, v, r, q = heapq.heappop(heap)
        pending.append(tree.add(v, tokens.pop(o), q, r))
    return list(range(tree.n))


_RULES = {"eagle": _eagle, "entropy": _entropy, "best-first": _best_first}


def grow(setting: DynamicSetting, root: int, expander: Expander) -> tuple[CandidateTree, list[int]]:
    """Grow one step's tree by ``setting``'s rule (module docstring).

    Args:
        setting: the rule and its limits.
        root: the root token (the last committed token).
        expander: runs the drafter (or replays a recording) over nodes; see :class:`Expander`.

    Returns:
        ``(tree, selected)``: every node grown (``tree.n <= max_candidates(setting)``), and the nodes to verify,
        ancestor-closed, in creation order, the root first (``len(selected) <= setting.budget``; fewer when the
        drafter offered fewer candidates).
    """
    tree = CandidateTree.rooted(root)
    selected = _RULES[setting.policy](setting, tree, expander)
    return tree, selected
