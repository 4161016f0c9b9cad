"""The :class:`Drafter` protocol: what :class:`~sequoia_opt.decoding.SpeculativeDecoder` asks of a proposer.

A drafter proposes ranked candidates for the nodes of a step's tree, with the draft distributions they were
drawn from where it has them, owns its cache (if any) and commits the accepted path to it. The decoder owns
everything else: the tree and its clipping near the end of the context, verification, acceptance, the target
and its cache, the stop rules. (DESIGN.md, "Drafters and drafting policies".)

Slots and positions follow :mod:`~sequoia_opt.decoding.buffers`: with ``L = state.cached`` committed tokens
before the root, tree node i sits at slot ``L + i`` and position ``L + depth[i]``; levels are contiguous
runs of nodes in breadth-first order, and a node's children are contiguous and in rank order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Sequence

import torch

if TYPE_CHECKING:  # the decoder's types; importing them here would be circular
    from ...model import ModelKVCache, Transformer
    from ..buffers import TreeBuffers
    from ..speculative import DecodeState

__all__ = ["Drafter", "DraftOutput", "DraftSettings", "CostModel", "root_tree"]

CostModel = Literal["per-level", "one-pass"]


@dataclass
class DraftOutput:
    """The drafted tree.

    Attributes:
        tokens: (n,) int64 token of every node, breadth-first; ``tokens[0]`` is the root.
        probs: (n, V) float32 draft distribution at each node that has children (the q its children were
            sampled from); None for greedy decoding, for a root-only step, and for a drafter that has no
            distributions (:attr:`Drafter.has_probs` False). Rows of leaves are undefined.
        depth: the depth of the tree drafted this step: the decoder's tree depth D, or less when the step's
            tree was clipped near the end of the context or the cache (then n is that clipped tree's size).
        confidence: (n,) float32 the drafter's confidence at each node that has children, in [0, 1]: a
            model's top-1 probability (softmax of its logits at temperature 1), prompt lookup's share of the
            top follower among the followers of the longest matched suffix (0 without a match); only when
            :attr:`DraftSettings.want_confidence` is set (a graft scheduler's features), else None. Rows of
            leaves are undefined.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None
    depth: int
    confidence: torch.Tensor | None = None


@dataclass
class DraftSettings:
    """What the decoder tells its drafter once, in :meth:`Drafter.bind`.

    Attributes:
        device: the target's device (the drafter's tensors live there).
        max_len: the decoder's cache slots; a drafter with a cache allocates this many.
        backend: the resolved attention backend (``"torch"`` or ``"cuda"``).
        temperature: 0 = greedy (rank k is the drafter's k-th best token); > 0 = sampling (children are
            ordered samples without replacement from the node's q).
        top_p: nucleus mass in (0, 1] the decoder applies to the target; a model drafter applies it to q too.
        generator: the decoder's random source. The decoder replaces this field when its ``generator``
            attribute is replaced, so read it at each :meth:`Drafter.propose`, never keep a copy.
        tree_depth: D, the depth of the decoder's whole tree when it was made (0: no step ever drafts; such a
            decoder refuses a deeper tree in :meth:`~sequoia_opt.decoding.SpeculativeDecoder.set_tree`).
        target: the decoder's target model (None only when settings are made outside a decoder).
        target_cache: the decoder's target KV cache (``SpeculativeDecoder.target_cache``, ``max_len`` slots,
            every target layer), for a drafter that shares it (self layer-skip writes the K/V of the
            target's first layers at the tree's slots, which verification then overwrites). A drafter with
            its own cache ignores both fields; no drafter may write target slots below the step's root.
        want_confidence: fill :attr:`DraftOutput.confidence` (a multi-drafter policy's scheduler reads it).
    """

    device: torch.device
    max_len: int
    backend: str
    temperature: float
    top_p: float
    generator: torch.Generator
    tree_depth: int
    target: Transformer | None = None
    target_cache: ModelKVCache | None = None
    want_confidence: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def root_tree(root: int, n: int, device: torch.device) -> torch.Tensor:
    """An (n,) int64 tree-token tensor with ``root`` at node 0 and the rest unset, for a drafter to fill."""
    out = torch.empty(n, dtype=torch.int64, device=device)
    out[0] = root
    return out


class Drafter(ABC):
    """A proposer of tree candidates (one drafter serves one decoder, one generation at a time).

    The decoder calls, in order: from its constructor :meth:`bind`, then :meth:`max_root_for_depth` once per
    depth 1..D (again for each tree :meth:`~sequoia_opt.decoding.SpeculativeDecoder.set_tree` swaps in); per generation :meth:`reset` then :meth:`prefill`; per step :meth:`propose` (not for a
    root-only step) and, unless generation stops, :meth:`commit`.

    Class attributes:
        cost_model: ``"per-level"``: one forward per tree level over that level's w nodes, cost c(w) ms
            (a draft model, self layer-skip); ``"one-pass"``: one forward proposes every level (Medusa heads,
            block diffusion drafters such as DFlash). The solver's cost model follows it; the decoder does
            not (it calls :meth:`propose` once per step either way).
        has_probs: whether :meth:`propose` returns the draft distributions q when sampling. A drafter
            without them proposes point masses: when sampling, its candidates are verified as point masses
            (a candidate x with q = one-hot(x): accepted with the residual's probability of x, else removed
            from the residual; :func:`~sequoia_opt.decoding.sampling.verify_point_mass_node`), which is exact
            for any candidates that do not depend on the verifier's random numbers; greedy needs no q.

    Attributes (set by the subclass):
        vocab_size: V; candidates are ids in ``[0, V)`` and q rows have V columns. Must equal the target's.
        device: where its tensors live. Must be the target's.
        context: positions the drafter can see (a model's ``max_position_embeddings``); reported as the
            decoder's ``draft_context``; its limits reach the decoder through :meth:`max_root_for_depth`.
        cached: committed tokens in its cache, slots ``[0, cached)`` (0 for a drafter without one); the
            decoder's ``DecodeState.draft_cached`` reports it.
    """

    cost_model: ClassVar[CostModel]
    has_probs: ClassVar[bool]
    shares_target_cache: ClassVar[bool] = False
    vocab_size: int
    device: torch.device
    context: int
    cached: int = 0

    @abstractmethod
    def bind(self, settings: DraftSettings) -> None:
        """Take the decoder's settings and allocate the cache (if any). Called once, by the decoder's
        constructor, after the vocabulary and device checks.

        Raises:
            DecodingError: the drafter is already bound to a decoder (its cache cannot serve two).
        """

    @abstractmethod
    def max_root_for_depth(self, d: int, buffers: TreeBuffers) -> int:
        """The drafter's limit for the decoder's clipping: the largest root slot / position L at which it
        can propose the decoder's tree (``buffers``) clipped to depth ``d`` (``1 <= d <= D``), given its
        context and its cache slots. May be negative (never at this depth). The decoder takes the minimum
        of this and the target's limit, once per depth for each tree it compiles; the result must be non-increasing
        in d. A per-level model drafter processes levels ``0 .. d-1``: positions up to ``L + d - 1``, slots
        up to ``L + buffers.level_slices[d].start - 1``.
        """

    def reset(self) -> None:
        """Forget the committed tokens (``cached = 0``); the decoder calls it before every generation."""
        self.cached = 0

    @abstractmethod
    def prefill(self, prompt_ids: Sequence[int], will_draft: bool) -> None:
        """Take in the prompt (the whole prompt, at least one token; its last token is the first root and
        is not committed to any cache: a cache takes ``prompt_ids[:-1]``, setting ``cached``).

        Args:
            prompt_ids: the checked prompt, ints in ``[0, V)``.
            will_draft: False when no step of this generation proposes (the first step is root-only and the
                clipped depth never grows): the drafter should then run nothing, e.g. because the prompt is
                already past its context.
        """

    @abstractmethod
    def propose(self, state: DecodeState, buffers: TreeBuffers,
                forced_tokens: torch.Tensor | None = None) -> DraftOutput:
        """Propose the step's tree: every node's children, by rank, filled into the tree tokens.

        Args:
            state: the decoding state, read only (``seq``, ``root``, ``cached`` = L); must not be modified,
                so that proposing twice from the same state does the same work (the sampling tests do).
            buffers: the step's tree (depth ``d = buffers.tree_depth >= 1``, n nodes; the decoder's whole
                tree, or that tree clipped near the end; never root-only: the decoder serves those itself).
                A node of level ``j`` with k children gets the drafter's k best tokens (greedy) or k ordered
                samples without replacement from its q (sampling); siblings carry distinct tokens.
            forced_tokens: None, or (n,) int64 on the device, already checked by the decoder (shape, root)
                and owned by this call: the tree's tokens are these (teacher forcing). The drafter returns
                this tensor as ``tokens``, fills q as if it had proposed them, and leaves its cache exactly
                as if it had.

        Returns:
            :class:`DraftOutput` with ``depth = d``; ``probs`` (n, V) float32 when sampling and
            :attr:`has_probs`, else None.

        Raises:
            DecodingError: when sampling, draft output it cannot make a distribution from (NaN or +inf
                logits, naming the drafter).
        """

    @abstractmethod
    def commit(self, state_L: int, path: Sequence[int], step_depth: int, slots: torch.Tensor) -> None:
        """The accepted path of a step that did not end generation: commit it and update ``cached``.

        Args:
            state_L: L of the step (the root's slot and position), before the commit.
            path: accepted node indices from the root (0), in depth order.
            step_depth: the depth of the step's tree (0: a root-only step, where :meth:`propose` was not
                called).
            slots: (A,) int64 ``L + path`` on the device, as the target compacts them (reuse it; do not
                allocate another).
        """

    def score_nodes(self, state: DecodeState, tokens: torch.Tensor, depth: torch.Tensor,
                    ancestors: torch.Tensor, nodes: Sequence[int], first: bool) -> torch.Tensor | None:
        """Run the drafter over some nodes of a step's shared tree (a multi-drafter policy's call; the tree
        is any parent-before-child order, node i at slot ``L + i`` and position ``L + depth[i]``).

        Args:
            state: the decoding state (read only).
            tokens: (m,) int64 tokens of the tree's nodes so far (``tokens[0]`` the root).
            depth: (m,) int64 their depths.
            ancestors: (m, m) bool ancestor-or-self matrix of those nodes.
            nodes: node indices to run over this call, each with every ancestor already run over by this
                drafter in this step or earlier in ``nodes``; with ``first`` the call's first node must be
                the root (0), which is fed with the committed tokens the drafter has not cached yet.
            first: this is the drafter's first call in this step.

        Returns:
            (len(nodes), V) logits, or None for a drafter without a model (prompt lookup: the policy asks its
            ``candidates`` instead).

        Raises:
            DecodingError: a drafter that cannot join a shared tree (the default).
        """
        from ...errors import DecodingError

        raise DecodingError(f"{type(self).__name__} cannot run over a shared multi-drafter tree")
