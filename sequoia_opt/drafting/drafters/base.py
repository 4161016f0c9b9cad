"""The :class:`Drafter` protocol: what a drafting policy asks of a proposer.

A drafter proposes ranked candidates for the nodes of a step's tree, with the draft distributions they were
drawn from where it has them, owns its cache (if any) and commits the accepted path to it. The policy decides
the tree; the loop (:class:`~sequoia_opt.decoding.loop.Decoder`) owns the target, verification, acceptance and
the stop rules (DESIGN.md, "Drafters and drafting policies").

Rows and slots follow :mod:`~sequoia_opt.decoding.step_tree`: row b with L_b committed tokens before its root
sits at positions ``L_b + depth`` for its tree's nodes; a drafter with its own cache lays it out as the target
does (:class:`~sequoia_opt.decoding.rows.RowCache`: a batch of one writes node i at slot ``L + i``).
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Literal, Sequence

import torch

from ...decoding.state import DecodeState, DraftSettings, RowState
from ...decoding.step_tree import DraftOutput, TreeBuffers
from ...errors import DecodingError

if TYPE_CHECKING:
    pass

__all__ = ["Drafter", "CostModel"]

#: How the solver charges a drafter (:attr:`Drafter.cost_model`): ``"per-level"``, one forward per tree level
#: over that level's w nodes at c(w) ms; ``"one-pass"``, one forward (or lookup) proposes every level, c(n - 1).
CostModel = Literal["per-level", "one-pass"]


class Drafter(ABC):
    """A proposer of tree candidates (one drafter serves one decoder, one generation at a time).

    The policy calls, in order: :meth:`bind` once (from the decoder's constructor); per generation
    :meth:`reset`, then :meth:`prefill`; per step :meth:`limit` and :meth:`propose` (a static tree for every
    live row) or :meth:`score_nodes` (a shared tree a policy grows, batch of one; :meth:`ranked` for a drafter
    without a model), then :meth:`commit`; :meth:`keep` when rows finish and :meth:`join` when rows join a
    running batch (continuous batching; the default refuses). A subclass must implement the abstract methods and
    set ``vocab_size`` and ``device``; the rest has defaults that fit a drafter without a model or a cache.

    Class attributes:
        cost_model: ``"per-level"``: one forward per tree level over that level's w nodes, cost c(w) ms (a
            draft model, self layer-skip); ``"one-pass"``: one forward proposes every level (Medusa heads, block
            diffusion drafters such as DFlash; prompt lookup). The solver's cost model follows it.
        has_probs: whether :meth:`propose` returns the draft distributions q when sampling. A drafter without
            them proposes point masses, verified as such (exact for any candidates fixed before verification).
        shares_target_cache: it writes the target's own cache (self layer-skip) and commits nothing of its own.
        max_rows: the most rows one :meth:`propose` serves.
        reads_target_features: it drafts from the target's hidden states (a feature head: EAGLE, Medusa), so it
            has nothing to draft from before the target has run over a prompt's first token.

    Attributes (set by the subclass):
        vocab_size: V (the target's). device: where its tensors live (the target's). context: positions it can
            see (default: no limit of its own; a model's context sets it). cached: committed tokens of row 0 in its
            cache (0 without one).
    """

    cost_model: ClassVar[CostModel]
    has_probs: ClassVar[bool]
    shares_target_cache: ClassVar[bool] = False
    max_rows: ClassVar[int] = 1
    reads_target_features: ClassVar[bool] = False
    vocab_size: int
    device: torch.device
    context: int = sys.maxsize
    cached: int = 0
    settings: DraftSettings | None = None

    def _bind_once(self, settings: DraftSettings) -> None:
        """Keep the decoder's settings. Raises DecodingError when already bound (one decoder per drafter)."""
        if self.settings is not None:
            raise DecodingError(f"this {type(self).__name__} already serves a decoder; make one per decoder")
        self.settings = settings

    @abstractmethod
    def bind(self, settings: DraftSettings) -> None:
        """Take the decoder's settings and allocate the cache (if any). Called once.

        Raises:
            DecodingError: the drafter is already bound to a decoder (its cache cannot serve two).
        """

    def reset(self) -> None:
        """Forget the committed tokens; called before every generation."""
        self.cached = 0

    @abstractmethod
    def prefill(self, state: DecodeState) -> None:
        """Take in the rows' prompts (``state.rows[b].seq``; the last token of each is the first root and is not
        committed to any cache: a cache takes ``seq[:-1]``)."""

    def limit(self, state: DecodeState, buffers: TreeBuffers, depth: int | None = None) -> int:
        """The deepest level d <= ``depth`` (default the tree's depth) of ``buffers`` this drafter can propose
        for every live row now (its context, its cache slots); 0: none. Default: no limit of its own."""
        return buffers.tree_depth if depth is None else min(depth, buffers.tree_depth)

    @abstractmethod
    def propose(self, state: DecodeState, buffers: TreeBuffers,
                forced_tokens: torch.Tensor | None = None) -> DraftOutput:
        """Propose the step's static tree for every live row: every node's children, by rank.

        Args:
            state: the decoding state, read only; proposing twice from the same state does the same work.
            buffers: the tree (depth ``d >= 1``, within :meth:`limit`); a node with k children gets the
                drafter's k best tokens (greedy) or k ordered samples without replacement from its q (sampling);
                siblings carry distinct tokens.
            forced_tokens: None, or (B, n) int64 on the device (teacher forcing): the tree's tokens are these;
                the drafter fills q as if it had proposed them and leaves its cache as if it had.

        Returns:
            :class:`~sequoia_opt.decoding.step_tree.DraftOutput`: (B, n) tokens, (B, n, V) q when sampling and
            :attr:`has_probs`, the depth d.

        Raises:
            DecodingError: when sampling, draft output it cannot make a distribution from, naming the drafter.
        """

    @abstractmethod
    def commit(self, state: DecodeState, paths: Sequence[Sequence[int]], step_depth: int) -> None:
        """Each row's accepted path in this drafter's own tree of the step (node indices from the root, in depth
        order, only nodes it proposed or ran over); ``step_depth`` is the depth of what it drafted (0: it was
        not asked this step). The rows' ``cached`` is the step's L; their ``seq`` already ends with the step's
        emitted tokens (the accepted path's and the bonus token: ``len(seq) > cached + 1``)."""

    @property
    def depth_limit(self) -> int | None:
        """The deepest level this drafter can ever propose, in any tree (Medusa: its K heads propose depths 1..K);
        None: no limit of its own. The graft and merge policies refuse, at construction, a tree that gives it
        deeper nodes (:func:`~sequoia_opt.drafting.policies.base.check_depth_limit`): a merge made every step the
        root alone, without a word, and a graft failed at its first step."""
        return None

    def shared_depth(self, state: DecodeState) -> int:
        """The deepest level this drafter can score now in a shared tree of a batch of one (:meth:`score_nodes`,
        the chain, dynamic, graft and merge policies), its context aside (the policies check that); 0: it cannot
        draft this step (a feature head before the target has given it a feature: a 1-token prompt's first step),
        which the policies make a root-only step. Default: :attr:`depth_limit` (none: no limit of its own)."""
        return self.depth_limit if self.depth_limit is not None else 1 << 30

    def keep(self, rows: Sequence[int]) -> None:
        """Only rows ``rows`` stay in the batch, in that order (new row i is old row ``rows[i]``)."""

    def join(self, state: DecodeState, rows: Sequence[int]) -> None:
        """Rows ``rows`` of ``state.rows`` (the last ones, ascending) joined a running batch: take in their
        prompts as :meth:`prefill` does. Raises DecodingError for a drafter that cannot (the default)."""
        raise DecodingError(f"{type(self).__name__} cannot take rows into a running batch")

    def teacher_forced(self, prompt: Sequence[int], continuation: Sequence[int]) -> list[tuple[int, float]] | None:
        """This drafter's top-1 guess for every token of a known continuation, teacher-forced: guess i is what it
        would draft for ``continuation[i]`` after ``prompt + continuation[:i]``. Along the target's own greedy
        output this is exactly what a greedy chain drafts once the tokens before it were accepted, so one pass
        prices a chain of every length and every start (:func:`~sequoia_opt.profiling.acceptance.chain_traces`).
        Needs no :meth:`bind` and touches no cache.

        Returns:
            per continuation token, ``(token id, the drafter's probability of it)`` (prompt lookup: its match
            confidence); None for a drafter that cannot be teacher-forced on tokens alone (the default: a feature
            head also needs the target's hidden states).
        """
        return None

    def score_nodes(self, row: RowState, tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor,
                    nodes: Sequence[int], first: bool) -> torch.Tensor | None:
        """Run the drafter over some nodes of a step's shared tree (a multi-drafter or dynamic policy's call,
        batch of one; the tree is any parent-before-child order, node i at slot ``L + i`` and position
        ``L + depth[i]``).

        Args:
            row: the decoding row (read only).
            tokens: (m,) int64 tokens of the tree's nodes so far (``tokens[0]`` the root).
            depth: (m,) int64 their depths.
            ancestors: (m, m) bool ancestor-or-self matrix of those nodes.
            nodes: node indices to run over this call, each with every ancestor already run over by this
                drafter in this step or earlier in ``nodes``; with ``first`` the call's first node must be the
                root (0), fed with the committed tokens the drafter has not cached yet.
            first: this is the drafter's first call in this step.

        Returns:
            (len(nodes), V) logits, or None for a drafter without a model (prompt lookup: the policy asks its
            :meth:`ranked` candidates instead).

        Raises:
            DecodingError: a drafter that cannot join a shared tree (the default).
        """
        raise DecodingError(f"{type(self).__name__} cannot run over a shared multi-drafter tree")

    def ranked(self, seq: Sequence[int], path: Sequence[int], k: int) -> tuple[list[int], float]:
        """A drafter without a model (:meth:`score_nodes` returns None): its ``k`` best candidates after the
        context ``seq + path`` (committed tokens, then the node's root path below the root), distinct ids by
        rank, and its confidence in the first, in [0, 1] (prompt lookup: the top follower's share). A batch of
        one, as :meth:`score_nodes`.

        Raises:
            DecodingError: a drafter that has no ranked candidates of its own (the default: it returns logits).
        """
        raise DecodingError(f"{type(self).__name__} returns no ranked candidates of its own (it scores nodes)")
