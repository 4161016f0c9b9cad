""":class:`ModelDrafter`: a separate draft model, run once per tree level with its own static KV cache
(Sequoia, Chen et al. 2024; SpecInfer, Miao et al. 2024). Cost model ``"per-level"``.

Per step (tree depth d >= 1, L = the root's slot and position): first a catch-up chunk, the committed
tokens the draft has not cached yet ending at the root, as one causal chunk (usually the root alone; the root
plus the last accepted node when that node was on the step tree's last level, which the draft never
processes). Its last logits give the root's children. Then one forward per level 1 .. d-1 over that level's
nodes at their slots, each attending the prefix and its own ancestors; the k children of a node (k from the
topology, assigned by rank) are the draft's top-k tokens (greedy) or k samples without replacement from
``q = process_logits(logits)`` (sampling). Commit moves the accepted path's slots, less a node on the last
level, to consecutive slots after the prefix (:meth:`ModelKVCache.compact`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ...attention import TreeMask
from ...errors import DecodingError
from ...model import ModelKVCache, Transformer
from ..buffers import TreeBuffers
from ..core import cached_forward, model_output_error, run_causal_chunk
from ..sampling import process_logits, sample_without_replacement
from .base import DraftOutput, Drafter, DraftSettings, root_tree

if TYPE_CHECKING:
    from ..speculative import DecodeState

__all__ = ["ModelDrafter", "propose_by_levels", "score_shared_nodes"]


def propose_by_levels(model: Transformer, cache: ModelKVCache, chunk: Sequence[int], chunk_start: int,
                      state: DecodeState, buffers: TreeBuffers, settings: DraftSettings,
                      masks: dict[int, TreeMask], forced_tokens: torch.Tensor | None = None, *,
                      num_layers: int | None = None, role: str = "draft") -> DraftOutput:
    """The per-level drafting loop shared by every drafter that is a :class:`Transformer` run once per tree
    level (:class:`ModelDrafter`; :class:`~sequoia_opt.decoding.drafters.layer_skip.LayerSkipDrafter`
    with ``num_layers``): :meth:`Drafter.propose`'s contract, in this order (so the random draws are made in
    the same order for every such drafter).

    Level 0 is ``chunk``, committed tokens ending at the root, fed causally at slots / positions
    ``[chunk_start, L + 1)`` (``L = state.cached``); its last logits give the root's children. Then one
    forward per level 1 .. d-1 over that level's nodes at slots ``L + node_index``, positions ``L + depth``,
    each attending the prefix ``[0, L)`` and its own ancestors (``buffers.level_masks``). A node's k children
    are the top-k tokens (greedy) or k ordered samples without replacement from
    ``q = process_logits(logits)`` (sampling; q is returned for verification).

    Args:
        model: the drafting model; ``num_layers``: None (all its layers) or its first k layers only.
        cache: where the forwards write K/V (every slot of ``[chunk_start, L + num_drafted)`` it writes).
        chunk, chunk_start: the catch-up chunk and its first slot; ``chunk_start + len(chunk) == L + 1``.
        state, buffers, forced_tokens: as :meth:`Drafter.propose`.
        settings: the decoder's :class:`DraftSettings` (device, backend, temperature, top_p, generator).
        masks: the drafter's memo of causal chunk masks, by length.
        role: how an error names the model (:func:`~sequoia_opt.decoding.core.model_output_error`).

    Returns:
        :class:`DraftOutput`: (n,) tokens, (n, V) float32 q when sampling else None, depth d.

    Raises:
        DecodingError: when sampling, logits :func:`process_logits` refuses (NaN, +inf), naming the model.
    """
    s, buf, L = settings, buffers, state.cached
    n, D = buf.n, buf.tree_depth
    out = root_tree(state.root, n, s.device) if forced_tokens is None else forced_tokens
    probs = None if s.greedy else torch.empty(n, model.config.vocab_size, device=s.device)
    conf = torch.zeros(n, device=s.device) if s.want_confidence else None
    logits = run_causal_chunk(model, cache, chunk, chunk_start, s.backend, masks,
                              num_layers)[-1:]  # (1, V): the root's
    for d in range(D):
        sl = buf.level_slices[d]
        if d > 0:
            slots = buf.node_index[sl] + L  # (w_d,) level d's slots
            positions = buf.depth[sl] + L  # (w_d,) all = L + d
            # (w_d, e_d) mask: prefix unmasked, then each node's ancestors-or-self among levels <= d
            logits = cached_forward(model, cache, out[sl], positions, slots, L, buf.level_masks[d], s.backend,
                                    num_layers)  # (w_d, V)
        k = buf.level_branching[d]
        q = None
        if conf is not None:
            conf[sl] = logits.float().softmax(-1).amax(-1)  # (w_d,) top-1 probability at temperature 1
        try:
            if probs is not None:
                q = process_logits(logits, s.temperature, s.top_p)  # (w_d, V)
                probs[sl] = q
            if forced_tokens is not None:
                continue
            if q is None:
                # greedy: NaN draft logits only make bad candidates, which the target's check rejects
                cand = logits.topk(k, dim=-1).indices  # (w_d, k) the draft's top-k, rank order
            else:
                cand = sample_without_replacement(q, k, s.generator)  # (w_d, k) ordered samples
        except ValueError as err:
            raise model_output_error(err, model, role) from None
        nxt = buf.level_slices[d + 1]
        out[nxt] = cand[buf.child_parent_local[d + 1], buf.child_rank[d + 1]]
    return DraftOutput(out, probs, D, conf)


def score_shared_nodes(model: Transformer, cache: ModelKVCache, chunk: Sequence[int], chunk_start: int,
                       state: DecodeState, tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor,
                       nodes: Sequence[int], first: bool, settings: DraftSettings, masks: dict[int, TreeMask], *,
                       num_layers: int | None = None, role: str = "draft") -> torch.Tensor:
    """:meth:`Drafter.score_nodes` for a model run over nodes of a shared tree: with ``first``, the catch-up
    chunk (committed tokens ending at the root, slots ``[chunk_start, L + 1)``) gives the root's logits;
    the other nodes go in one forward at slots ``L + i``, positions ``L + depth[i]``, each attending the
    prefix ``[0, L)`` and its ancestors-or-self among tree slots ``[L, L + max(nodes) + 1)``.

    Returns (len(nodes), V) logits in the model's dtype.
    """
    L = state.cached
    rows = []
    rest = list(nodes)
    if first:
        if not rest or rest[0] != 0:
            raise DecodingError("a drafter's first call in a step must start with the root (node 0)")
        rows.append(run_causal_chunk(model, cache, chunk, chunk_start, settings.backend, masks, num_layers)[-1:])
        rest = rest[1:]
    if rest:
        idx = torch.as_tensor(rest, dtype=torch.int64, device=settings.device)  # (w,)
        m = max(rest) + 1
        mask = TreeMask.from_dense(ancestors[idx, :m].contiguous())  # (w, m) prefix + ancestors-or-self
        rows.append(cached_forward(model, cache, tokens[idx], depth[idx] + L, idx + L, L, mask, settings.backend,
                                   num_layers))  # (w, V)
    return torch.cat(rows) if len(rows) > 1 else rows[0]


class ModelDrafter(Drafter):
    """A draft :class:`~sequoia_opt.model.Transformer` sharing the target's tokenizer (dtype may differ).

    Args:
        model: the draft model; its device must be the target's.

    Attributes:
        model: the draft model.
        cache: its static cache of the decoder's ``max_len`` slots, allocated by :meth:`bind`; None until
            then, and when the decoder's tree has depth 0 (no step ever drafts).
        context: the model's ``max_position_embeddings`` (may be shorter than the target's: the decoder
            then clips, and past it every step is root-only).
    """

    cost_model = "per-level"
    has_probs = True

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.device = model.device
        self.context = model.config.max_position_embeddings
        self.cached = 0
        self.cache: ModelKVCache | None = None
        self.settings: DraftSettings | None = None
        self._masks: dict[int, TreeMask] = {}  # causal masks of the catch-up chunks, by length

    def bind(self, settings: DraftSettings) -> None:
        if self.settings is not None:
            raise DecodingError("this ModelDrafter already serves a decoder (it owns one KV cache); make one "
                                "per decoder")
        self.settings = settings
        self.cache = self.model.new_cache(settings.max_len) if settings.tree_depth > 0 else None

    def max_root_for_depth(self, d: int, buffers: TreeBuffers) -> int:
        # levels 0 .. d-1: positions up to L + d - 1, slots up to L + num_drafted_d - 1
        return min(self.context - d, self.cache.max_len - buffers.level_slices[d].start)

    def prefill(self, prompt_ids: Sequence[int], will_draft: bool) -> None:
        if len(prompt_ids) > 1 and self.cache is not None and will_draft:
            run_causal_chunk(self.model, self.cache, prompt_ids[:-1], 0, self.settings.backend, self._masks)
            self.cached = len(prompt_ids) - 1

    def propose(self, state: DecodeState, buffers: TreeBuffers,
                forced_tokens: torch.Tensor | None = None) -> DraftOutput:
        # level 0: every committed token the draft has not cached yet, ending at the root (slot L)
        return propose_by_levels(self.model, self.cache, state.seq[self.cached : state.cached + 1], self.cached,
                                 state, buffers, self.settings, self._masks, forced_tokens, role="draft")

    def score_nodes(self, state: DecodeState, tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor,
                    nodes: Sequence[int], first: bool) -> torch.Tensor:
        return score_shared_nodes(self.model, self.cache, state.seq[self.cached : state.cached + 1], self.cached,
                                  state, tokens, depth, ancestors, nodes, first, self.settings, self._masks)

    def commit(self, state_L: int, path: Sequence[int], step_depth: int, slots: torch.Tensor) -> None:
        # after a root-only step the draft ran no forward: its cache and count stay as they are
        if self.cache is not None and step_depth > 0:
            m = len(path) if len(path) - 1 < step_depth else len(path) - 1  # the draft skips the last level
            self.cache.compact(slots[:m], state_L)
            self.cached = state_L + m
