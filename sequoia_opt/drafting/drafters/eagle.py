""":class:`EagleDrafter`: an EAGLE-3 or EAGLE-1/2 head drafting from the target's own hidden states (EAGLE,
Li et al. 2024; EAGLE-2's dynamic trees, Li et al. 2024b, draft with the same head; EAGLE-3, Li et al. 2025).
Cost model ``"per-level"``: one head forward per tree level. Serves any number of rows. CLI names ``eagle3``
(``--draft eagle3:PATH``) and ``eagle`` (``--draft eagle:PATH``). The architecture and the checkpoint layouts
are :mod:`sequoia_opt.model.heads` and :mod:`sequoia_opt.model.head_checkpoints`.

What it reads: at :meth:`~EagleDrafter.bind` it asks the target face for the hidden states of the layers it
fuses (:meth:`~sequoia_opt.decoding.target.TargetFace.request_hidden`); the face keeps them for every prefilled
token and for each step's committed path, and the drafter reads them at :meth:`~EagleDrafter.prefill` and
:meth:`~EagleDrafter.commit`. The loop knows nothing of it.

Sequence layout (a row with L committed tokens before its root x_L): the head's item j pairs token x_{j+1}
with the target feature f_j of position j, at cache slot / rotary position j (batch of one); the cache holds
the items whose features are the target's, up to the root's item (x_L, f_{L-1}) at slot L - 1. Tree node i
(the root is node 0) goes at slot ``L - 1 + i`` and position ``L - 1 + depth[i]``, its input hidden state the
head's output at its parent (a drafted node has no target feature yet: EAGLE's predicted feature). Per step:

1. catch-up chunk: the committed tokens whose items are not cached yet, ending with the root's, each with its
   target feature (features arrive one step late: the target computes f at verification), fed causally
   (rows right-aligned as :class:`~sequoia_opt.drafting.drafters.ModelDrafter`'s chunks); its last item's
   logits give the root's children.
2. one forward per tree level 1 .. d - 1 over that level's nodes (each attending its row's committed items and
   its own ancestors), children by rank: the head's top-k (greedy) or k ordered samples without replacement
   from its q (sampling). With a reduced draft vocabulary (EAGLE-3's d2t) candidates are mapped to target ids
   and q is the draft distribution placed on those ids (zero elsewhere), which is what verification reads.
3. commit: the chunk's items stay cached (their features are the target's); the tree's items are dropped
   (computed from predicted features, EAGLE recomputes them with the true ones). The committed path's target
   features become the next chunk's.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...attention import TreeMask
from ...decoding.forward import causal_mask
from ...decoding.rows import RowCache
from ...decoding.sampling import process_logits, sample_without_replacement
from ...decoding.state import DecodeState, DraftSettings, RowState
from ...decoding.step_tree import DraftOutput, TreeBuffers, root_tree
from ...errors import DecodingError
from ...model.heads import EagleHead
from .base import Drafter

__all__ = ["EagleDrafter", "draft_candidates", "draft_level"]


def draft_candidates(logits: torch.Tensor, k: int, settings: DraftSettings, draft_ids: torch.Tensor | None,
                     vocab_size: int, who: str, generators: Sequence[torch.Generator] | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Children of w nodes from a head's logits: greedy, the top-k (rank order); sampling, k ordered samples
    without replacement from ``q = process_logits(logits)``.

    Args:
        logits: (B, w, V_d) over the head's vocabulary.
        k: children per node.
        draft_ids: (V_d,) the target ids of a reduced draft vocabulary, or None (V_d = V).
        vocab_size: V, the target's.
        generators: when sampling, the B rows' random sources (``settings.generators(state.rows)``: each row
            draws from its own); None: ``settings.generator`` for every row.

    Returns:
        ``(tokens, q)``: tokens (B, w, k) target ids; q (B, w, V) float32 the distribution they were drawn
        from, placed on target ids (None when greedy).

    Raises:
        DecodingError: when sampling, logits :func:`process_logits` refuses (NaN, +inf), naming ``who``.
    """
    B, w, Vd = logits.shape
    try:
        if settings.greedy:  # NaN logits only make bad candidates, which the target's check rejects
            cand = logits.topk(min(k, Vd), dim=-1).indices  # (B, w, k) rank order
            return (cand if draft_ids is None else draft_ids[cand]), None
        qd = process_logits(logits, settings.temperature, settings.top_p)  # (B, w, V_d)
        if draft_ids is None:
            q = qd
        else:
            q = torch.zeros(B, w, vocab_size, dtype=qd.dtype, device=qd.device)
            q[..., draft_ids] = qd  # (B, w, V): the draft distribution on target ids
        gen = settings.generator if generators is None else generators
        cand = sample_without_replacement(q.reshape(B * w, -1), k, gen).reshape(B, w, k)
        return cand, q
    except ValueError as err:
        raise DecodingError(f"{who} produced unusable output: {err}") from None


def draft_level(buf: TreeBuffers, d: int, logits: torch.Tensor, out: torch.Tensor, probs: torch.Tensor | None,
                conf: torch.Tensor | None, settings: DraftSettings, draft_ids: torch.Tensor | None, vocab_size: int,
                who: str, forced: bool, generators: Sequence[torch.Generator] | None = None) -> None:
    """Level d of a static tree from a head's (B, w_d, V_d) logits at its nodes: the confidence (top-1
    probability at temperature 1) and q of those nodes, and (unless ``forced``) their children's tokens by rank
    into ``out`` (B, n) (:func:`draft_candidates`, with ``generators``, one per row)."""
    sl = buf.level_slices[d]
    if conf is not None:
        conf[:, sl] = logits.float().softmax(-1).amax(-1)  # (B, w_d)
    cand, q = draft_candidates(logits, buf.level_branching[d], settings, draft_ids, vocab_size, who, generators)
    if probs is not None:
        probs[:, sl] = q
    if not forced:
        out[:, buf.level_slices[d + 1]] = cand[:, buf.child_parent_local[d + 1], buf.child_rank[d + 1]]


class EagleDrafter(Drafter):
    """An EAGLE-3 / EAGLE-1/2 head as a drafter (module docstring).

    Args:
        head: the :class:`~sequoia_opt.model.heads.EagleHead` (on the target's device).
        target_layers: the target's ``n_layers`` (EAGLE reads its final norm's output, hidden index n_layers).
        draft_ids: (V_d,) int64 the target ids of a reduced draft vocabulary (EAGLE-3's d2t), or None.
        context: the target's ``max_position_embeddings`` (the head's own limits it further).

    Raises:
        DecodingError: ``draft_ids`` whose length is not the head's draft vocabulary size; at :meth:`bind`, no
            target face in the settings, or one that refuses the hidden states (:meth:`TargetFace.request_hidden`).

    Attributes:
        layers: the target hidden states it reads (``hidden_layers`` numbering).
        rows: its KV cache in the row layout (allocated by :meth:`bind`; None when the policy never drafts).
        row_cached: per live row, the items in its cache (item j pairs x_{j+1} with f_j).
    """

    cost_model = "per-level"
    has_probs = True
    max_rows = 1 << 30
    reads_target_features = True

    def __init__(self, head: EagleHead, target_layers: int, draft_ids: torch.Tensor | None = None, *,
                 context: int | None = None) -> None:
        self.head = head
        cfg = head.config
        self.kind = cfg.kind
        self.vocab_size = cfg.vocab_size
        self.device = head.device
        self.context = min(cfg.layer.max_position_embeddings, context or cfg.layer.max_position_embeddings)
        self.layers = cfg.feature_layers(target_layers)
        self.draft_ids = None if draft_ids is None else draft_ids.to(self.device)
        if self.draft_ids is not None and self.draft_ids.numel() != cfg.draft_vocab_size:
            raise DecodingError(f"the head has {cfg.draft_vocab_size} draft tokens but {self.draft_ids.numel()} "
                                "target ids map them")
        self.name = f"the {'EAGLE-3' if self.kind == 'eagle3' else 'EAGLE'} head {cfg.name!r}"
        self.settings: DraftSettings | None = None
        self.face = None
        self.rows: RowCache | None = None
        self.row_cached: list[int] = []
        self._pending: list[torch.Tensor] = []  # per row (m, k, H_t): features of positions row_cached .. L - 1
        self._masks: dict[int, TreeMask] = {}
        self._chunk: tuple[int, list[int]] | None = None  # (c, per-row chunk lengths) of the last forward
        self._node_out: torch.Tensor | None = None  # (n, H) a shared tree's node outputs (score_nodes)

    @property
    def cached(self) -> int:  # type: ignore[override]
        return self.row_cached[0] if self.row_cached else 0

    # ------------------------------------------------------------------ lifecycle
    def bind(self, settings: DraftSettings) -> None:
        self._bind_once(settings)
        face = settings.target
        if face is None:
            raise DecodingError(f"{self.name} reads the target's hidden states: it needs the decoder's target face")
        face.request_hidden(self.layers)
        self.face = face
        if settings.tree_depth > 0:
            self.rows = RowCache(self.head.new_cache(settings.max_len, batch=settings.max_batch), self.device)

    def reset(self) -> None:
        self.row_cached, self._pending, self._chunk = [], [], None

    def prefill(self, state: DecodeState) -> None:
        B = len(state.rows)
        self.row_cached = [0] * B
        self._pending = []
        feats = [self.face.prefill_hidden(b, self.layers) for b in range(B)]  # (L_b, k, H_t) each
        if self.rows is None:
            self._pending = feats
            return
        self.rows.reset(B)
        done = [self._take_prompt(b, r, feats[b]) for b, r in enumerate(state.rows)]
        self.rows.prefilled(done)
        self.row_cached = done

    def join(self, state: DecodeState, rows: Sequence[int]) -> None:
        """Rows ``rows`` (the last ones) joined a running batch: their prompts' target features (the face kept
        them at its join) go through the head as :meth:`prefill` does, into the rows' own cache rows."""
        done = []
        for i in rows:
            f = self.face.prefill_hidden(i, self.layers)  # (L_i, k, H_t)
            if self.rows is None:
                self._pending.append(f)
                done.append(0)
            else:
                done.append(self._take_prompt(i, state.rows[i], f))
        if self.rows is not None:
            self.rows.add(done)
        self.row_cached.extend(done)

    def _take_prompt(self, b: int, row: RowState, feats: torch.Tensor) -> int:
        """Row ``b``'s prompt through the head into its own cache row: items 1 .. L - 1 of the prompt that the
        head's positions can hold (the root's item is the first chunk's); the features after them wait in
        ``_pending``. ``feats``: (L, k, H_t) the prompt's target features. Returns the items taken."""
        L = row.cached
        k = L - 1 if 1 <= L - 1 <= self.context - 1 else 0
        if k:
            with torch.inference_mode():
                self._chunk_forward(self.rows.row(b), [row.seq[1: k + 1]], [feats[:k]], 0, [0])
        self._pending.append(feats[k:])
        return k

    def keep(self, rows: Sequence[int]) -> None:
        self.row_cached = [self.row_cached[b] for b in rows]
        self._pending = [self._pending[b] for b in rows]
        if self.rows is not None:
            self.rows.keep(rows)

    # ------------------------------------------------------------------ forwards
    def _chunk_forward(self, cache, tokens: Sequence[Sequence[int]], feats: Sequence[torch.Tensor], start: int,
                       starts_pos: Sequence[int], prefix=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Items of B rows' chunks (right-aligned to c) at slots ``[start, start + c)``: tokens (per row, c_b),
        target features (c_b, k, H_t), first positions ``starts_pos``. Every item's keys and values go into
        ``cache``; returns the last item's (every row's root's) (B, 1, V_d) logits and (B, 1, H) output (the
        head's MLP and LM head run on that item alone: ``last_only``)."""
        dev = self.device
        B = len(tokens)
        c = max(len(t) for t in tokens)
        tok = torch.zeros(B, c, dtype=torch.int64, device=dev)
        pos = torch.zeros(B, c, dtype=torch.int64, device=dev)
        f = torch.zeros(B, c, *feats[0].shape[1:], dtype=feats[0].dtype, device=dev)  # (B, c, k, H_t)
        for b, (t, fb, p0) in enumerate(zip(tokens, feats, starts_pos)):
            n = len(t)
            tok[b, c - n:] = torch.as_tensor(list(t), dtype=torch.int64)
            pos[b, c - n:] = torch.arange(p0, p0 + n, dtype=torch.int64)
            f[b, c - n:] = fb
        hidden = self.head.fuse(f)  # (B, c, H)
        slots = torch.arange(start, start + c, dtype=torch.int64, device=dev)
        return self.head(tok, hidden, pos if B > 1 else pos[0], cache=cache, cache_slots=slots,
                         prefix_len=start if prefix is None else prefix, tree_mask=causal_mask(c, dev, self._masks),
                         backend=self.settings.backend, last_only=True)

    def _chunks(self, rows: Sequence[RowState]) -> tuple[list[list[int]], list[torch.Tensor]]:
        """Per row the catch-up chunk: tokens x_{row_cached + 1} .. x_L and features f_{row_cached} .. f_{L - 1}.

        Raises:
            DecodingError: features missing for a committed token (a step's commit did not reach the drafter).
        """
        toks, feats = [], []
        for b, r in enumerate(rows):
            c = r.cached - self.row_cached[b]
            if self._pending[b].shape[0] != c or c < 1:
                raise DecodingError(f"{self.name} holds target features for {self._pending[b].shape[0]} of the "
                                    f"{c} committed tokens it has not cached: a step's commit did not reach it")
            toks.append(r.seq[self.row_cached[b] + 1: r.cached + 1])
            feats.append(self._pending[b])
        return toks, feats

    def shared_depth(self, state: DecodeState) -> int:
        """0 for a root at position 0 (no target feature before it), else no limit of its own."""
        return 0 if state.row.cached < 1 else super().shared_depth(state)

    def limit(self, state: DecodeState, buffers: TreeBuffers, depth: int | None = None) -> int:
        D = buffers.tree_depth if depth is None else min(depth, buffers.tree_depth)
        if self.rows is None or D == 0 or any(r.cached < 1 for r in state.rows):
            return 0  # a root at position 0 has no target feature before it
        if self.rows.wasteful():
            self.rows.repack()  # holes would be read by every level's forward (RowCache)
        max_L = max(r.cached for r in state.rows)
        chunk = max(r.cached - c for r, c in zip(state.rows, self.row_cached))
        starts = buffers.level_slices

        def fits(d: int) -> bool:
            # levels 0 .. d-1 at positions up to L - 1 + d - 1; slots up to R + start_d - 1, R = F + chunk - 1
            return max_L + d - 2 <= self.context - 1 and self.rows.frontier + chunk - 1 + starts[d].start <= \
                self.rows.max_len

        if fits(D):
            return D
        if self.rows.holes or self.rows.batch > 1:
            self.rows.repack()
        for d in range(D, 0, -1):
            if fits(d):
                return d
        return 0

    def propose(self, state: DecodeState, buffers: TreeBuffers,
                forced_tokens: torch.Tensor | None = None) -> DraftOutput:
        s, buf, head = self.settings, buffers, self.head
        B, n, D = len(state.rows), buf.n, buf.tree_depth
        dev = s.device
        toks, feats = self._chunks(state.rows)
        lens = [len(t) for t in toks]
        c = max(lens)
        rows = self.rows
        F = rows.frontier
        padded = B > 1 and any(k != c for k in lens)
        chunk_valid = (torch.arange(c, device=dev).unsqueeze(0)
                       >= torch.tensor([c - k for k in lens], device=dev).unsqueeze(1)) if padded else None
        logits, root_h = self._chunk_forward(rows.view, toks, feats, F,  # (B, 1, V_d), (B, 1, H): the roots'
                                             [r.cached - k for r, k in zip(state.rows, lens)],
                                             prefix=rows.prefix(chunk_valid))
        self._chunk = (c, lens)
        prefix = rows.prefix(chunk_valid[:, : c - 1] if padded else None, F + c - 1)
        R = F + c - 1  # every row's root slot
        Lt = torch.tensor([r.cached - 1 for r in state.rows], dtype=torch.int64, device=dev).unsqueeze(1)  # (B, 1)
        out = root_tree([r.root for r in state.rows], n, dev) if forced_tokens is None else forced_tokens
        probs = None if s.greedy else torch.empty(B, n, self.vocab_size, device=dev)
        conf = torch.zeros(B, n, device=dev) if s.want_confidence else None
        node_h = torch.empty(B, buf.num_drafted, head.config.hidden_size, dtype=head.dtype, device=dev)
        node_h[:, :1] = root_h
        for d in range(D):
            sl = buf.level_slices[d]
            if d > 0:
                parents = buf.child_parent_local[d] + buf.level_slices[d - 1].start  # (w_d,)
                logits, h = head(out[:, sl], node_h[:, parents], buf.depth[sl].unsqueeze(0) + Lt, cache=rows.view,
                                 cache_slots=buf.node_index[sl] + R, prefix_len=prefix,
                                 tree_mask=buf.level_masks[d], backend=s.backend)  # (B, w_d, V_d), (B, w_d, H)
                if d < D - 1:
                    node_h[:, sl] = h
            draft_level(buf, d, logits, out, probs, conf, s, self.draft_ids, self.vocab_size, self.name,
                        forced_tokens is not None, s.generators(state.rows))
        return DraftOutput(out, probs, D, conf)

    def score_nodes(self, row: RowState, tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor,
                    nodes: Sequence[int], first: bool) -> torch.Tensor:
        """Logits (len(nodes), V) over target ids (a reduced vocabulary's other ids at -inf); node i's input
        hidden state is its parent's output, so nodes of one call whose parent is in the same call run in a
        later forward than the parent. Shapes as :meth:`Drafter.score_nodes`: ``tokens`` / ``depth`` (m,) int64,
        ``ancestors`` (m, m) bool. Raises DecodingError when ``first`` and ``nodes`` does not start with the
        root (0)."""
        L = row.cached
        dev = self.device
        head = self.head
        rest = list(nodes)
        out: list[torch.Tensor] = []
        if first:
            if not rest or rest[0] != 0:
                raise DecodingError("a drafter's first call in a step must start with the root (node 0)")
            toks, feats = self._chunks([row])
            lg, h = self._chunk_forward(self.rows.view, toks, feats, self.rows.frontier, [self.row_cached[0]])
            self._chunk = (len(toks[0]), [len(toks[0])])
            self._node_out = torch.empty(max(tokens.shape[0], 1), head.config.hidden_size, dtype=head.dtype,
                                         device=dev)
            self._node_out[0] = h[0, -1]
            out.append(lg[0, -1:])
            rest = rest[1:]
        if self._node_out.shape[0] < tokens.shape[0]:
            grown = torch.empty(tokens.shape[0], head.config.hidden_size, dtype=head.dtype, device=dev)
            grown[: self._node_out.shape[0]] = self._node_out
            self._node_out = grown
        R = L - 1  # the root's slot and position (batch of one: the frontier is row_cached)
        # each node's parent: its proper ancestor of the largest index (parents precede their children)
        parent = {v: int(ancestors[v, :v].nonzero().max()) for v in rest}
        while rest:
            wave: list[int] = []
            for v in rest:  # a node whose parent runs in this wave waits for the next one
                if parent[v] in wave:
                    break
                wave.append(v)
            idx = torch.as_tensor(wave, dtype=torch.int64, device=dev)  # (w,)
            par = torch.as_tensor([parent[v] for v in wave], dtype=torch.int64, device=dev)  # (w,)
            m = max(wave) + 1
            mask = TreeMask.from_dense(ancestors[idx, :m].contiguous())  # (w, m) prefix + ancestors-or-self
            lg, h = head(tokens[idx].unsqueeze(0), self._node_out[par].unsqueeze(0), (depth[idx] + R).unsqueeze(0),
                         cache=self.rows.view, cache_slots=idx + R, prefix_len=R, tree_mask=mask,
                         backend=self.settings.backend)  # (1, w, V_d), (1, w, H)
            self._node_out[idx] = h[0]
            out.append(lg[0])
            rest = rest[len(wave):]
        logits = torch.cat(out) if len(out) > 1 else out[0]  # (len(nodes), V_d)
        if self.draft_ids is None:
            return logits
        full = torch.full((logits.shape[0], self.vocab_size), float("-inf"), dtype=logits.dtype, device=dev)
        full[:, self.draft_ids] = logits
        return full

    def commit(self, state: DecodeState, paths: Sequence[Sequence[int]], step_depth: int) -> None:
        """The chunk the head ran this step stays cached; the target features of every committed path (the
        face's, whatever numbering ``paths`` uses) become the next chunk's (module docstring, step 3)."""
        new = [self.face.path_hidden(b, self.layers) for b in range(len(state.rows))]  # (len(path), k, H_t)
        ran = self.rows is not None and step_depth > 0 and self._chunk is not None
        if not ran:
            self._pending = [torch.cat([p, h]) for p, h in zip(self._pending, new)]
            self._chunk = None  # a forward whose items were not committed is rewritten by the next one
            return
        c, lens = self._chunk
        self._chunk = None
        F = self.rows.frontier
        self.rows.commit([list(range(F + c - k, F + c)) for k in lens])
        self.row_cached = [rc + k for rc, k in zip(self.row_cached, lens)]
        self._pending = new


class EagleLevelProbe:
    """One unit of an EAGLE head's cost for the latency profiler: one head forward over w drafted nodes with
    its KV cache (what every tree level runs), fed random tokens and hidden states; the ``fc`` over the catch-up
    chunk's target features, run once per step over the few tokens just accepted, is not in it. Looks like a
    model to :func:`~sequoia_opt.profiling.latency.profile_model`.

    Args:
        head: the EAGLE head.  target: the target model (its vocabulary and context bound the timed forwards).
    """

    def __init__(self, head: EagleHead, target) -> None:
        from types import SimpleNamespace

        self.head = head
        self.device = head.device
        ctx = min(head.config.layer.max_position_embeddings, target.config.max_position_embeddings)
        self.config = SimpleNamespace(max_position_embeddings=ctx, vocab_size=head.config.vocab_size,
                                      name=head.config.name)
        self._hidden: torch.Tensor | None = None

    def new_cache(self, max_len: int, batch: int = 1):
        """The head's static KV cache for the timed forwards: per layer (batch, n_kv_heads, max_len, head_dim)."""
        return self.head.new_cache(max_len, batch=batch)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, *, cache, cache_slots, prefix_len, tree_mask,
                 backend: str = "auto", num_layers: int | None = None) -> torch.Tensor:
        B, T = tokens.shape
        h = self._hidden
        if h is None or h.shape[0] < B or h.shape[1] < T:
            g = torch.Generator(device=self.device).manual_seed(0)
            h = self._hidden = torch.randn(B, T, self.head.config.hidden_size, generator=g, device=self.device,
                                           dtype=self.head.dtype)
        return self.head(tokens, h[:B, :T], positions, cache=cache, cache_slots=cache_slots, prefix_len=prefix_len,
                         tree_mask=tree_mask, backend=backend)[0]
