""":class:`LayerSkipDrafter`: self-speculative drafting with the target's own first L layers, then its final
norm and LM head (Draft & Verify, Zhang et al. 2023; LayerSkip, Elhoushi et al. 2024). No second
checkpoint: the drafter shares the target's weights and, for those L layers, its KV cache. Cost model
``"per-level"`` (one forward of L layers per tree level). CLI name ``self`` (``--draft self:L``).

Per step (tree depth d >= 1, L_c = the root's slot and position, the target's committed count): one forward
of the first L layers over the root alone at slot L_c, whose logits give the root's children; then one such
forward per level 1 .. d-1 over that level's nodes at their slots, each attending the prefix and its own
ancestors; children by rank exactly as :class:`~sequoia_opt.drafting.drafters.ModelDrafter` takes them (the
same loop, :func:`~sequoia_opt.drafting.drafters.model.propose_by_levels`).

Why sharing the target's cache is exact. The drafter writes layers ``0 .. L-1`` of the decoder's target
cache at the step's tree slots ``L_c .. L_c + num_drafted - 1`` only (a batch of one: the target's frontier is
L_c), never below the root. The K/V a
layer l < L holds for a token depend only on that token, its position and the layers-below K/V of its
ancestors (the committed prefix and its tree ancestors), which are the same tokens at the same positions
in the drafter's forward and the target's verification forward. The verification forward then writes every
layer at every tree slot ``L_c .. L_c + n - 1`` before it reads them (a layer writes its K/V, then attends),
so what the target reads is its own values (equal to the drafter's up to floating-point summation order,
and in any case the target's, so verification is exactly what it would be without the drafter); the
target's compaction then moves the accepted path's slots in every layer. So after every step the prefix
``[0, L_c')`` of the first L layers holds exactly what the drafter needs: the drafter has no cache of its own
and no catch-up beyond the root, and its committed count :attr:`cached` always equals the target's.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...attention import TreeMask
from ...decoding.state import DecodeState, DraftSettings, RowState
from ...decoding.step_tree import DraftOutput, TreeBuffers
from ...decoding.target import TransformerTarget
from ...errors import DecodingError
from ...model import Transformer
from .base import Drafter
from .model import propose_by_levels, score_shared_nodes, teacher_forced_top1

__all__ = ["LayerSkipDrafter"]


class LayerSkipDrafter(Drafter):
    """The target's first ``num_layers`` blocks + its final norm + LM head, as a drafter (batch of one).

    Args:
        target: the decoder's target model (the same object must be the decoder's target: :meth:`bind`
            checks it).
        num_layers: L, the number of leading blocks the draft runs, an int in ``1 .. n_layers - 1`` (L =
            n_layers would be the target itself).

    Attributes:
        target, num_layers: as given.
        face: the decoder's target face (its cache is shared, never allocated here), set by :meth:`bind`.
        context: the target's ``max_position_embeddings``.
        cached: the target's committed count (see the module docstring: always equal).

    Raises:
        DecodingError: ``num_layers`` not an int in ``1 .. n_layers - 1``, naming L and n_layers.
    """

    cost_model = "per-level"
    has_probs = True
    shares_target_cache = True

    def __init__(self, target: Transformer, num_layers: int) -> None:
        n = target.config.n_layers
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= n - 1:
            raise DecodingError(
                f"self:L drafting needs L in 1..{n - 1} (the target has n_layers = {n}; L = n_layers would be "
                f"the target itself), got L = {num_layers!r}")
        self.target = target
        self.num_layers = num_layers
        self.vocab_size = target.config.vocab_size
        self.device = target.device
        self.context = target.config.max_position_embeddings
        self.cached = 0
        self.face: TransformerTarget | None = None
        self.settings: DraftSettings | None = None
        self._masks: dict[int, TreeMask] = {}
        self._role = f"first-{num_layers}-layer draft of the target"

    @property
    def cache(self):
        """The decoder's target KV cache (shared)."""
        return self.face.cache if self.face is not None else None

    def bind(self, settings: DraftSettings) -> None:
        """Take the decoder's target face (its cache becomes the draft's).

        Raises:
            DecodingError: already bound; the decoder's target is not this drafter's target model.
        """
        face = settings.target
        if not isinstance(face, TransformerTarget) or face.model is not self.target:
            raise DecodingError("a LayerSkipDrafter drafts with its decoder's target and shares its KV cache: "
                                "pass the same target model to the drafter and to the decoder")
        self._bind_once(settings)
        self.face = face

    def limit(self, state: DecodeState, buffers: TreeBuffers, depth: int | None = None) -> int:
        # levels 0 .. d-1: positions up to L + d - 1, slots up to L + num_drafted_d - 1 (the target's own room,
        # positions up to L + d and slots up to L + n_d - 1, is stricter and the loop clips to it)
        D = buffers.tree_depth if depth is None else min(depth, buffers.tree_depth)
        L = state.row.cached
        for d in range(D, 0, -1):
            if L + d - 1 <= self.context - 1 and L + buffers.level_slices[d].start <= self.face.max_len:
                return d
        return 0

    def prefill(self, state: DecodeState) -> None:
        # the target's prefill has written prompt[:-1] in every layer, the draft's L included
        self.cached = state.row.cached

    def propose(self, state: DecodeState, buffers: TreeBuffers,
                forced_tokens: torch.Tensor | None = None) -> DraftOutput:
        row = state.row  # level 0: the root alone (the prefix is in the shared cache)
        return propose_by_levels(self.target, self.face.rows, [row.seq[row.cached:]], state, buffers,
                                 self.settings, self._masks, forced_tokens, num_layers=self.num_layers,
                                 role=self._role)

    def teacher_forced(self, prompt: Sequence[int], continuation: Sequence[int]) -> list[tuple[int, float]]:
        """The first L blocks' greedy guesses along ``continuation`` (:meth:`Drafter.teacher_forced`,
        :func:`~sequoia_opt.drafting.drafters.model.teacher_forced_top1`)."""
        return teacher_forced_top1(self.target, prompt, continuation, num_layers=self.num_layers)

    def score_nodes(self, row: RowState, tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor,
                    nodes: Sequence[int], first: bool) -> torch.Tensor:
        L = row.cached  # the root alone (the prefix is in the shared cache)
        return score_shared_nodes(self.target, self.face.rows.view, row.seq[L : L + 1], L, row, tokens, depth,
                                  ancestors, nodes, first, self.settings, self._masks, num_layers=self.num_layers)

    def commit(self, state: DecodeState, paths: Sequence[Sequence[int]], step_depth: int) -> None:
        # the target's compaction has moved the path in every layer (after a root-only step too)
        self.cached = state.row.cached + len(paths[0])
