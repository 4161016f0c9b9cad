""":class:`ModelDrafter`: a separate draft model, run once per tree level with its own static KV cache
(Sequoia, Chen et al. 2024; SpecInfer, Miao et al. 2024). Cost model ``"per-level"``. Serves any number of rows.

Per step (tree depth d >= 1, row b with L_b committed tokens): first a catch-up chunk per row, the committed
tokens the draft has not cached yet, ending at the root, fed causally (usually the root alone; the root plus
the last accepted node when that node was on the step tree's last level, which the draft never processes).
Rows' chunks are right-aligned (shorter ones padded with slots marked invalid), so every row's root sits at the
same slot R. The chunk's last logits give the roots' children. Then one forward per level 1 .. d-1 over that
level's nodes at slots ``R + node_index``, positions ``L_b + depth``, each attending its row's prefix and its
own ancestors; the k children of a node (k from the topology, assigned by rank) are the draft's top-k tokens
(greedy) or k samples without replacement from ``q = process_logits(logits)`` (sampling). Commit moves each
row's chunk and accepted path, less a node on the last level, to consecutive slots after its prefix
(:class:`~sequoia_opt.decoding.rows.RowCache`). A batch of one has no padding: the chunk is at
``[cached, L + 1)`` and node i at slot ``L + i``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...attention import TreeMask
from ...decoding.forward import cached_forward, causal_mask, model_output_error, run_causal_chunk
from ...decoding.rows import RowCache
from ...decoding.sampling import process_logits, sample_without_replacement
from ...decoding.state import DecodeState, DraftSettings, RowState
from ...decoding.step_tree import DraftOutput, TreeBuffers, root_tree
from ...errors import DecodingError
from ...model import Transformer
from .base import Drafter

__all__ = ["ModelDrafter", "propose_by_levels", "score_shared_nodes", "guessable_tokens"]


def guessable_tokens(context: int, prompt_len: int) -> int:
    """How many tokens after a prompt of ``prompt_len`` tokens a model of ``context`` positions
    (``max_position_embeddings``) can guess: the guess of the token at position x reads the input at x - 1, which
    fits while x <= context, so the tokens at positions ``prompt_len .. context``: ``max(0, context - prompt_len
    + 1)``. Teacher forcing (:func:`teacher_forced_top1`), ``run``'s warning and ``profile acceptance --chains``
    count by it; the decoder's drafts stop at the same position (:meth:`ModelDrafter.limit`)."""
    return max(0, int(context) - int(prompt_len) + 1)


def teacher_forced_top1(model: Transformer, prompt: Sequence[int], continuation: Sequence[int], *,
                        num_layers: int | None = None) -> list[tuple[int, float]]:
    """A model's greedy guess for each token of ``continuation`` after ``prompt`` and the tokens before it: one
    uncached causal forward over ``prompt + continuation[:-1]`` (``num_layers``: only the first blocks, self
    layer-skip), its argmax and softmax probability at the last ``len(continuation)`` positions.

    Returns:
        ``len(continuation)`` pairs (token id, probability in [0, 1]); empty for an empty continuation. A token
        past the model's context (``max_position_embeddings``, a draft shorter than its target) gets ``(-1, 0.0)``,
        a guess no token equals: there the decoder's drafter proposes nothing and the step commits one token, as
        a rejected draft does.

    Raises:
        DecodingError: an empty prompt.
    """
    if not continuation:
        return []
    P, G = len(prompt), len(continuation)
    if P < 1:
        raise DecodingError("teacher forcing needs a prompt of at least one token")
    room = min(G, guessable_tokens(model.config.max_position_embeddings, P))  # guesses whose inputs fit
    out = [(-1, 0.0)] * (G - room)
    if room == 0:
        return out
    seq = torch.tensor([list(prompt) + list(continuation[:room - 1])], dtype=torch.int64, device=model.device)
    with torch.inference_mode():
        logits = model(seq, num_layers=num_layers)[0, P - 1:].float()  # (room, V)
        probs, top = torch.softmax(logits, dim=-1).max(dim=-1)
    return [(int(t), float(q)) for t, q in zip(top.tolist(), probs.tolist())] + out


def propose_by_levels(model: Transformer, rows: RowCache, chunks: Sequence[Sequence[int]], state: DecodeState,
                      buffers: TreeBuffers, settings: DraftSettings, masks: dict[int, TreeMask],
                      forced_tokens: torch.Tensor | None = None, *, num_layers: int | None = None,
                      role: str = "draft") -> DraftOutput:
    """The per-level drafting loop of every drafter that is a :class:`Transformer` run once per tree level
    (:class:`ModelDrafter`; the layer-skip drafter with ``num_layers``), for B rows (module docstring).

    Args:
        model: the drafting model; ``num_layers``: None (all its layers) or its first k layers only.
        rows: the cache it writes, in the row layout (its frontier F: the chunk goes at ``[F, F + c)``).
        chunks: per row the catch-up chunk, committed tokens ending at the row's root.
        state, buffers, forced_tokens: as :meth:`Drafter.propose` (``forced_tokens`` (B, n)).
        settings: the decoder's :class:`~sequoia_opt.decoding.state.DraftSettings`.
        masks: the drafter's memo of causal chunk masks, by length.
        role: how an error names the model.

    Returns:
        :class:`DraftOutput`: (B, n) tokens, (B, n, V) float32 q when sampling else None, depth d.

    Raises:
        DecodingError: when sampling, logits :func:`process_logits` refuses (NaN, +inf), naming the model.
    """
    s, buf = settings, buffers
    B, n, D = len(chunks), buf.n, buf.tree_depth
    dev = s.device
    out = root_tree([r.root for r in state.rows], n, dev) if forced_tokens is None else forced_tokens
    probs = None if s.greedy else torch.empty(B, n, model.config.vocab_size, device=dev)
    conf = torch.zeros(B, n, device=dev) if s.want_confidence else None
    lens = [len(c) for c in chunks]
    c = max(lens)
    F = rows.frontier
    if B == 1 and not rows.holes:  # no padding, no holes: the chunk at [F, F + c), node i at slot L + i
        logits = run_causal_chunk(model, rows.view, chunks[0], F, s.backend, masks, num_layers)[-1:].unsqueeze(0)
        prefix = rows.prefix(None, F + c - 1)
    else:
        padded = any(k != c for k in lens)
        tok = torch.tensor([[0] * (c - len(ch)) + list(ch) for ch in chunks], dtype=torch.int64, device=dev)
        pos = torch.tensor([[0] * (c - k) + list(range(r.cached + 1 - k, r.cached + 1))
                            for k, r in zip(lens, state.rows)], dtype=torch.int64, device=dev)  # (B, c)
        chunk_valid = (torch.arange(c, device=dev).unsqueeze(0)
                       >= torch.tensor([c - k for k in lens], device=dev).unsqueeze(1)) if padded else None
        slots = torch.arange(F, F + c, dtype=torch.int64, device=dev)
        logits = model(tok, pos, cache=rows.view, cache_slots=slots, prefix_len=rows.prefix(chunk_valid),
                       tree_mask=causal_mask(c, dev, masks), backend=s.backend,
                       num_layers=num_layers)[:, -1:]  # (B, 1, V): the roots'
        prefix = rows.prefix(chunk_valid[:, : c - 1] if padded else None, F + c - 1)
    R = F + c - 1  # every row's root slot
    Lt = torch.tensor([r.cached for r in state.rows], dtype=torch.int64, device=dev).unsqueeze(1)  # (B, 1)
    for d in range(D):
        sl = buf.level_slices[d]
        if d > 0:
            # (w_d, e_d) mask: prefix unmasked, then each node's ancestors-or-self among levels <= d
            logits = model(out[:, sl], buf.depth[sl].unsqueeze(0) + Lt, cache=rows.view,
                           cache_slots=buf.node_index[sl] + R, prefix_len=prefix, tree_mask=buf.level_masks[d],
                           backend=s.backend, num_layers=num_layers)  # (B, w_d, V)
        k = buf.level_branching[d]
        q = None
        if conf is not None:
            conf[:, sl] = logits.float().softmax(-1).amax(-1)  # (B, w_d) top-1 probability at temperature 1
        try:
            if probs is not None:
                q = process_logits(logits, s.temperature, s.top_p)  # (B, w_d, V)
                probs[:, sl] = q
            if forced_tokens is not None:
                continue
            if q is None:
                # greedy: NaN draft logits only make bad candidates, which the target's check rejects
                cand = logits.topk(k, dim=-1).indices  # (B, w_d, k) the draft's top-k, rank order
            else:
                w = q.shape[1]
                cand = sample_without_replacement(q.reshape(B * w, -1), k, s.generators(state.rows)).reshape(B, w, k)
        except ValueError as err:
            raise model_output_error(err, model, role) from None
        out[:, buf.level_slices[d + 1]] = cand[:, buf.child_parent_local[d + 1], buf.child_rank[d + 1]]
    return DraftOutput(out, probs, D, conf)


def score_shared_nodes(model: Transformer, cache, chunk: Sequence[int], chunk_start: int, row: RowState,
                       tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor, nodes: Sequence[int],
                       first: bool, settings: DraftSettings, masks: dict[int, TreeMask], *,
                       num_layers: int | None = None) -> torch.Tensor:
    """:meth:`Drafter.score_nodes` for a model run over nodes of a shared tree (batch of one): with ``first``,
    the catch-up chunk (committed tokens ending at the root, slots ``[chunk_start, L + 1)``) gives the root's
    logits; the other nodes go in one forward at slots ``L + i``, positions ``L + depth[i]``, each attending the
    prefix ``[0, L)`` and its ancestors-or-self among tree slots ``[L, L + max(nodes) + 1)``.

    Returns (len(nodes), V) logits in the model's dtype.

    Raises:
        DecodingError: ``first`` and ``nodes`` does not start with the root (node 0).
    """
    L = row.cached
    out = []
    rest = list(nodes)
    if first:
        if not rest or rest[0] != 0:
            raise DecodingError("a drafter's first call in a step must start with the root (node 0)")
        out.append(run_causal_chunk(model, cache, chunk, chunk_start, settings.backend, masks, num_layers)[-1:])
        rest = rest[1:]
    if rest:
        idx = torch.as_tensor(rest, dtype=torch.int64, device=settings.device)  # (w,)
        m = max(rest) + 1
        mask = TreeMask.from_dense(ancestors[idx, :m].contiguous())  # (w, m) prefix + ancestors-or-self
        out.append(cached_forward(model, cache, tokens[idx], depth[idx] + L, idx + L, L, mask, settings.backend,
                                  num_layers))  # (w, V)
    return torch.cat(out) if len(out) > 1 else out[0]


class ModelDrafter(Drafter):
    """A draft :class:`~sequoia_opt.model.Transformer` sharing the target's tokenizer (dtype may differ).

    Args:
        model: the draft model; its device must be the target's.

    Attributes:
        model: the draft model.
        rows: its cache (the decoder's ``max_batch`` rows x ``max_len`` slots) in the row layout, allocated by
            :meth:`bind`; None until then, and when the policy never drafts (tree depth 0).
        cache: the whole cache (``rows.base``), or None.
        context: the model's ``max_position_embeddings`` (may be shorter than the target's: trees are then
            clipped to the levels it can still draft, and past it every step is root-only).
        row_cached: per live row, committed tokens in its cache; ``cached`` is row 0's.
    """

    cost_model = "per-level"
    has_probs = True
    max_rows = 1 << 30

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.device = model.device
        self.context = model.config.max_position_embeddings
        self.rows: RowCache | None = None
        self.cache = None
        self.settings: DraftSettings | None = None
        self.row_cached: list[int] = []
        self._masks: dict[int, TreeMask] = {}  # causal masks of the catch-up chunks, by length
        self._chunk: tuple[int, list[int]] | None = None  # (c, per-row chunk lengths) of the last proposal

    @property
    def cached(self) -> int:  # type: ignore[override]
        return self.row_cached[0] if self.row_cached else 0

    def bind(self, settings: DraftSettings) -> None:
        self._bind_once(settings)
        if settings.tree_depth > 0:
            self.cache = self.model.new_cache(settings.max_len, batch=settings.max_batch)
            self.rows = RowCache(self.cache, self.device)

    def reset(self) -> None:
        self.row_cached = []
        self._chunk = None

    def prefill(self, state: DecodeState) -> None:
        B = len(state.rows)
        self.row_cached = [0] * B
        if self.rows is None:
            return
        self.rows.reset(B)
        done = [self._take_prompt(i, r) for i, r in enumerate(state.rows)]
        self.rows.prefilled(done)
        self.row_cached = done

    def join(self, state: DecodeState, rows: Sequence[int]) -> None:
        done = [self._take_prompt(i, state.rows[i]) if self.rows is not None else 0 for i in rows]
        if self.rows is not None:
            self.rows.add(done)
        self.row_cached.extend(done)

    def _take_prompt(self, i: int, row: RowState) -> int:
        """Row ``i``'s prompt but its last token through the draft into its own cache row; returns the tokens
        taken (0 for a prompt already past the draft's context: it never drafts, no position past it)."""
        k = len(row.seq) - 1 if len(row.seq) - 1 <= self.context - 1 else 0
        if k:
            run_causal_chunk(self.model, self.rows.row(i), row.seq[:k], 0, self.settings.backend, self._masks)
        return k

    def _fits(self, d: int, max_L: int, chunk: int, start_d: int) -> bool:
        # levels 0 .. d-1: positions up to L + d - 1; slots up to R + start_d - 1, R = F + chunk - 1
        return max_L + d - 1 <= self.context - 1 and self.rows.frontier + chunk - 1 + start_d <= self.rows.max_len

    def limit(self, state: DecodeState, buffers: TreeBuffers, depth: int | None = None) -> int:
        D = buffers.tree_depth if depth is None else min(depth, buffers.tree_depth)
        if self.rows is None or D == 0:
            return 0
        if self.rows.wasteful():
            self.rows.repack()  # holes would be read by every level's forward (RowCache)
        Ls = [r.cached for r in state.rows]
        max_L = max(Ls)
        chunk = max(L + 1 - c for L, c in zip(Ls, self.row_cached))
        starts = buffers.level_slices
        if self._fits(D, max_L, chunk, starts[D].start):
            return D
        if self.rows.holes or self.rows.batch > 1:
            self.rows.repack()  # holes first: a repack restores every row's own slot count
        for d in range(D, 0, -1):
            if self._fits(d, max_L, chunk, starts[d].start):
                return d
        return 0

    def propose(self, state: DecodeState, buffers: TreeBuffers,
                forced_tokens: torch.Tensor | None = None) -> DraftOutput:
        chunks = [r.seq[c : r.cached + 1] for r, c in zip(state.rows, self.row_cached)]
        self._chunk = (max(len(ch) for ch in chunks), [len(ch) for ch in chunks])
        return propose_by_levels(self.model, self.rows, chunks, state, buffers, self.settings, self._masks,
                                 forced_tokens, role="draft")

    def teacher_forced(self, prompt: Sequence[int], continuation: Sequence[int]) -> list[tuple[int, float]]:
        """The draft model's greedy guesses along ``continuation`` (:meth:`Drafter.teacher_forced`,
        :func:`teacher_forced_top1`)."""
        return teacher_forced_top1(self.model, prompt, continuation)

    def score_nodes(self, row: RowState, tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor,
                    nodes: Sequence[int], first: bool) -> torch.Tensor:
        dc = self.row_cached[0]
        if first:
            self._chunk = (row.cached + 1 - dc, [row.cached + 1 - dc])
        return score_shared_nodes(self.model, self.rows.view, row.seq[dc : row.cached + 1], dc, row, tokens, depth,
                                  ancestors, nodes, first, self.settings, self._masks)

    def commit(self, state: DecodeState, paths: Sequence[Sequence[int]], step_depth: int) -> None:
        # after a step it was not asked in, the draft ran no forward: its cache and counts stay as they are
        if self.rows is None or step_depth == 0 or self._chunk is None:
            return
        c, lens = self._chunk
        self._chunk = None
        F = self.rows.frontier
        R = F + c - 1
        src = []
        for b, path in enumerate(paths):
            m = len(path) if len(path) - 1 < step_depth else len(path) - 1  # the draft skips the last level
            src.append(list(range(F + c - lens[b], R)) + [R + i for i in path[:m]])
            self.row_cached[b] += len(src[-1])
        self.rows.commit(src)

    def keep(self, rows: Sequence[int]) -> None:
        self.row_cached = [self.row_cached[b] for b in rows]
        if self.rows is not None:
            self.rows.keep(rows)
