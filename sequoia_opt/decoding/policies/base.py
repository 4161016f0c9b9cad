"""The :class:`DraftingPolicy` protocol and the :class:`StepTree` a policy grows each step.

A drafting policy decides a step's tree by asking one or more drafters for candidates (DESIGN.md, "Drafters
and drafting policies"). :class:`~sequoia_opt.decoding.multidraft.MultiDraftDecoder` runs it: per step
:meth:`DraftingPolicy.draft` returns a :class:`StepTree`, the target verifies it in one forward with tree
attention, the verifier accepts a path exactly, and :meth:`DraftingPolicy.commit` hands that path to every
drafter.

Slots and positions: with ``L = state.cached``, node i of the step tree sits at slot ``L + i`` and position
``L + depth[i]``. Unlike a static tree's breadth-first order, a step tree's nodes are in creation order (every
parent before its children), so nodes a second drafter grafts go after the first drafter's and no node's slot
moves once a drafter has written it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from ...attention import TreeMask
from ..buffers import TreeBuffers
from ..drafters import Drafter, DraftOutput, DraftSettings
from ..sampling import CandidateGroup
from ..stats import Clock

if TYPE_CHECKING:
    from ..speculative import DecodeState

__all__ = ["StepTree", "DraftingPolicy", "ancestor_matrix", "as_drafter"]


def as_drafter(draft: object) -> Drafter:
    """A :class:`Drafter` from what callers pass as a drafter: a draft
    :class:`~sequoia_opt.model.Transformer` is wrapped in a fresh :class:`ModelDrafter` (its own cache), a
    Drafter is returned as it is.

    Raises:
        TypeError: neither.
    """
    from ...model import Transformer
    from ..drafters import ModelDrafter

    if isinstance(draft, Transformer):
        return ModelDrafter(draft)
    if isinstance(draft, Drafter):
        return draft
    raise TypeError(f"a drafter must be a Transformer or a Drafter, got {type(draft).__name__}")


def ancestor_matrix(parent: Sequence[int]) -> np.ndarray:
    """(n, n) bool: ``[i, j]`` True when node j is node i or one of its ancestors (parents precede children)."""
    n = len(parent)
    anc = np.zeros((n, n), dtype=bool)
    for i, p in enumerate(parent):
        if p >= 0:
            anc[i, : i] = anc[p, : i]
        anc[i, i] = True
    return anc


class StepTree:
    """One step's tree of candidates from several drafters, in creation order (parents before children).

    Attributes:
        tokens: per node its token; ``tokens[0]`` is the root.
        parent: per node its parent's index (-1 for the root).
        depth: per node its depth (0 for the root).
        source: per node the index of the drafter that proposed it first (-1 for the root).
        provenance: per node a bit set of every drafter that proposed it (bit k: drafter k), so a token two
            drafters proposed at one node is one node that keeps both provenances.
        children: per node its children in verification order.
        groups: per node the :class:`~sequoia_opt.decoding.sampling.CandidateGroup` s proposed there, in
            trial order; ``group_children[node][g][j]`` is the child that group g's j-th candidate is.
    """

    def __init__(self, root: int) -> None:
        self.tokens: list[int] = [int(root)]
        self.parent: list[int] = [-1]
        self.depth: list[int] = [0]
        self.source: list[int] = [-1]
        self.provenance: list[int] = [0]
        self.children: list[list[int]] = [[]]
        self.groups: list[list[CandidateGroup]] = [[]]
        self.group_children: list[list[list[int]]] = [[]]

    @property
    def n(self) -> int:
        """Nodes, root included."""
        return len(self.tokens)

    @property
    def tree_depth(self) -> int:
        return max(self.depth)

    def path_tokens(self, node: int) -> list[int]:
        """The tokens of the node's root path below the root (empty for the root)."""
        out = []
        while node > 0:
            out.append(self.tokens[node])
            node = self.parent[node]
        return out[::-1]

    def add_group(self, node: int, group: CandidateGroup, *, merge: bool = True) -> list[int]:
        """Add the candidates of ``group`` as children of ``node`` and record the group for verification.

        A candidate whose token is already a child of ``node`` is merged into that child (its provenance gains
        the group's drafter) when ``merge``; otherwise a new node is made (children must then stay distinct
        for greedy verification: the caller guarantees it, e.g. by excluding the existing tokens).

        Returns:
            The child index of each candidate, in rank order.
        """
        existing = {self.tokens[c]: c for c in self.children[node]}
        out = []
        bit = 1 << group.drafter
        for tok in group.tokens.tolist():
            c = existing.get(tok) if merge else None
            if c is None:
                c = len(self.tokens)
                self.tokens.append(int(tok))
                self.parent.append(node)
                self.depth.append(self.depth[node] + 1)
                self.source.append(group.drafter)
                self.provenance.append(bit)
                self.children.append([])
                self.groups.append([])
                self.group_children.append([])
                self.children[node].append(c)
                existing[tok] = c
            else:
                self.provenance[c] |= bit
            out.append(c)
        self.groups[node].append(group)
        self.group_children[node].append(out)
        return out

    def add_drafted(self, out: DraftOutput, buffers: TreeBuffers, drafter: int, *, merge: bool = True) -> list[int]:
        """Add a drafter's static tree (``out`` proposed over ``buffers``) below this tree's root: each node with
        children becomes one candidate group (its q row when ``out.probs`` has one, else point masses).

        Returns:
            ``step_of``: per node of the drafter's tree, the step-tree node it is (the root is 0). Into an
            empty tree with ``merge=False`` that is the identity.
        """
        step_of = [0] * buffers.n
        for node, ch in enumerate(buffers.children):
            if ch:
                q = out.probs[node] if out.probs is not None else None
                kids = self.add_group(step_of[node], CandidateGroup(q, out.tokens[ch[0] : ch[-1] + 1], drafter),
                                      merge=merge)
                for c, s in zip(ch, kids):
                    step_of[c] = s
        return step_of

    def ancestors(self) -> np.ndarray:
        """(n, n) bool ancestor-or-self matrix (:func:`ancestor_matrix`)."""
        return ancestor_matrix(self.parent)

    def tree_mask(self, device: torch.device) -> TreeMask:
        """The (n, n) verification mask: row i may attend tree slot j iff j is on the root-to-i path."""
        return TreeMask.from_dense(torch.from_numpy(self.ancestors()).to(device))


class DraftingPolicy(ABC):
    """Grows each step's tree by asking one or more drafters (DESIGN.md, "Drafters and drafting policies").

    The decoder calls, in order: :meth:`bind` once (from its constructor); per generation :meth:`reset` and
    :meth:`prefill`; per step :meth:`draft` (unless the step is root-only), then, unless generation stops,
    :meth:`commit`.

    Attributes:
        drafters: the drafters, lightest first.
        names: their labels (for reports).
        max_size: the most nodes a step's tree can have (root included).
        max_depth: the deepest a step's tree can be.
        drafter_ms / drafter_calls: per drafter, the last step's wall time (ms) and whether it was asked.
        clock: the :class:`~sequoia_opt.decoding.stats.Clock` of the decoder's device (set by :meth:`bind`).
    """

    drafters: tuple[Drafter, ...]
    names: tuple[str, ...]
    max_size: int
    max_depth: int
    drafter_ms: list[float]
    drafter_calls: list[int]
    wants_confidence: bool = False

    @property
    def max_verified(self) -> int:
        """The most nodes a step's verified tree can have (root included); ``max_size`` unless the policy grows
        candidates it does not verify (a dynamic tree's re-ranking)."""
        return self.max_size

    def bind(self, settings: DraftSettings) -> None:
        """Bind every drafter to the decoder (:meth:`Drafter.bind`), and time drafters on the decoder's device
        (:attr:`clock`: CUDA is synchronised before each reading, as the decoder's own clock)."""
        settings.want_confidence = self.wants_confidence
        self.clock = Clock(settings.device)
        for d in self.drafters:
            d.bind(settings)

    def last_full_root(self, context: int, max_len: int) -> int:
        """The largest L (root slot and position) at which every tree this policy can draft fits the
        target (positions up to ``L + max_depth`` below ``context``, slots up to ``L + max_size - 1`` below
        ``max_len``) and every drafter's context. Past it the decoder makes root-only steps."""
        last = min(context - 1 - self.max_depth, max_len - self.max_size)
        for d in self.drafters:
            last = min(last, d.context - self.max_depth)
        return last

    def reset(self) -> None:
        for d in self.drafters:
            d.reset()

    def prefill(self, prompt_ids: Sequence[int], will_draft: bool) -> None:
        for d in self.drafters:
            d.prefill(prompt_ids, will_draft)

    @abstractmethod
    def draft(self, state: DecodeState) -> StepTree:
        """The step's tree (at least one node below the root is not required: a policy may propose none)."""

    @abstractmethod
    def commit(self, state_L: int, path: Sequence[int], tree: StepTree | None) -> None:
        """Commit the accepted path (step-tree node indices from the root) to every drafter; ``tree`` is None
        after a root-only step (no drafter was asked)."""

    def observe(self, accepted_nodes: int) -> None:
        """What the step accepted (for a policy that adapts: a scheduler's recent-acceptance feature)."""
