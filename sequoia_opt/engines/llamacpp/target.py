"""llama.cpp in the one loop: as the target face (:class:`LlamaCppTarget`) and as a drafter
(:class:`LlamaCppDrafter`), so ``run --engine llama.cpp`` decodes through :class:`~sequoia_opt.decoding.loop.Decoder`
like every other target and policy, clipping near the end of the context instead of refusing.

Verification. A chain (every node one child: what llama.cpp's own speculative decoding verifies) is one
``llama_decode`` of the root and its drafts at positions ``L .. L + n - 1`` of sequence 0, logits for each;
commit removes the rejected cells (``llama_memory_seq_rm``). A tree uses llama.cpp's sequences as its paths
(the mask llama.cpp builds lets a token see the cells of its first sequence id at positions up to its own):
leaf j's root-to-leaf path is sequence j + 1, a node belongs to the sequences of the leaves below it, and the
committed cells, in sequence 0, are copied into each path's sequence before the forward
(``llama_memory_seq_cp``); after acceptance the path's sequence is kept, cut after the last accepted node, and
renamed back to sequence 0. Exact: every node attends exactly the committed prefix and its own ancestors, the
mask of SpecInfer section 4.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ...decoding.forward import is_whole
from ...decoding.state import DecodeState, DraftSettings, RowState
from ...decoding.step_tree import DraftOutput, Room, StepTree, TreeBuffers
from ...decoding.target import TargetFace
from ...errors import DecodingError
from ...drafting.drafters.base import Drafter
from .binding import LlamaCppModel

__all__ = ["LlamaCppTarget", "LlamaCppDrafter"]


def _leaves_below(tree: StepTree) -> list[list[int]]:
    """Per node, the indices (0-based, in order) of the leaves below it or itself."""
    n = tree.n
    leaves = [i for i in range(n) if not tree.children[i]]
    index = {leaf: j for j, leaf in enumerate(leaves)}
    below: list[list[int]] = [[] for _ in range(n)]
    for i in range(n - 1, -1, -1):  # parents precede children: children done first
        below[i] = [index[i]] if i in index else [j for c in tree.children[i] for j in below[c]]
    return below


class LlamaCppTarget(TargetFace):
    """A llama.cpp context as the loop's target (module docstring): a batch of one (chains and trees) or of
    ``max_batch`` rows (chains per row, one sequence id per row, all rows' chains in one ``llama_batch``, as
    ``llama-server -np B`` decodes its slots).

    Args:
        model: the target GGUF's :class:`~sequoia_opt.engines.llamacpp.binding.LlamaCppModel`. For a batch of one,
            a context with ``n_seq_max`` sequences verifies trees of up to ``n_seq_max - 1`` leaves (1: chains
            only), which needs a unified KV cache (``kv_unified=True``) so that one cell can belong to several
            sequences. For ``max_batch`` rows the context needs ``n_seq_max >= max_batch`` and a KV cache per
            sequence (``kv_unified=False``, as :func:`~sequoia_opt.engines.llamacpp.profile.profile_latency_batch`
            opens it): each row then holds
            :attr:`~sequoia_opt.engines.llamacpp.binding.LlamaCppModel.seq_cells` = ``n_ctx / n_seq_max`` cells of
            its own (with a unified cache every row would count all ``n_ctx`` cells as its room, which the rows
            share).
        max_batch: the most rows one step serves.

    Attributes:
        max_len / context: cells (positions) per row.  max_leaves: the most leaves of a verified tree.

    Raises:
        DecodingError: ``max_batch`` < 1 or past the context's sequences. :meth:`verify`: a tree of more leaves
            than ``n_seq_max - 1``.
    """

    def __init__(self, model: LlamaCppModel, max_batch: int = 1) -> None:
        if not is_whole(max_batch) or max_batch < 1:
            raise DecodingError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if max_batch > 1 and model.n_seq_max < max_batch:
            raise DecodingError(f"{max_batch} rows need a llama.cpp context of at least {max_batch} sequences "
                                f"(n_seq_max); this one has {model.n_seq_max}")
        self.model = model
        self.max_batch = int(max_batch)
        self.vocab_size = model.n_vocab
        self.device = torch.device("cpu")
        self.context = self.max_len = model.seq_cells if max_batch > 1 else model.n_ctx
        self.max_leaves = max(1, model.n_seq_max - 1) if max_batch == 1 else 1
        self.max_width = None if self.max_leaves > 1 else 1
        self.name = f"the target model {model.path.stem!r} (llama.cpp)"
        self._leaves: list[list[int]] | None = None
        self._seq: list[int] = []  # the sequence id of every live row

    def _prefill_row(self, prompt: Sequence[int], seq: int) -> None:
        if len(prompt) > 1:
            self.model.prefill(list(prompt[:-1]), seq)

    def prefill(self, prompts: Sequence[Sequence[int]]) -> None:
        self.model.clear()
        self._seq = list(range(len(prompts)))
        for p, seq in zip(prompts, self._seq):
            self._prefill_row(p, seq)

    def join(self, state: DecodeState, prompts: Sequence[Sequence[int]]) -> None:
        free = [s for s in range(self.max_batch) if s not in self._seq]
        if len(prompts) > len(free) or self.max_batch == 1:
            raise DecodingError(f"{len(self._seq)} live rows and {len(prompts)} joining exceed {self.name}'s "
                                f"max_batch={self.max_batch} rows")
        for p, seq in zip(prompts, free):
            self._prefill_row(p, seq)
            self._seq.append(seq)

    def keep(self, rows: Sequence[int]) -> None:
        kept = [self._seq[b] for b in rows]
        for seq in set(self._seq) - set(kept):
            self.model.seq_rm(-1, -1, seq)  # a finished row's cells are free again
        self._seq = kept

    def room(self, state: DecodeState, want: int) -> list[Room]:
        return [Room(self.max_len - r.cached, self.context - 1 - r.cached) for r in state.rows]

    def verify(self, state: DecodeState, trees: Sequence[StepTree]) -> list[torch.Tensor]:
        m = self.model
        if len(trees) > 1 or all(len(c) <= 1 for t in trees for c in t.children):
            return self._verify_chains(state, trees)
        (tree,) = trees
        L, n = state.row.cached, tree.n
        below = _leaves_below(tree)
        P = len(below[0])
        if P > self.max_leaves:
            raise DecodingError(f"{self.name} verifies trees of at most {self.max_leaves} leaves (its context has "
                                f"{m.n_seq_max} sequences); this tree has {P}")
        for j in range(P):  # the committed cells in every path's sequence
            m.seq_cp(0, j + 1)
        self._leaves = below
        m.decode(tree.token_list, L, logits=True, seq_ids=[[j + 1 for j in b] for b in below],
                 positions=[L + int(d) for d in tree.depth])
        return [torch.from_numpy(m.logits(n).copy())]

    def _verify_chains(self, state: DecodeState, trees: Sequence[StepTree]) -> list[torch.Tensor]:
        """Every row's chain in one ``llama_decode`` (more when they exceed ``n_batch``): row b's node i at
        position ``L_b + i`` of its sequence, logits for every node."""
        m = self.model
        self._leaves = None
        groups: list[list[int]] = [[]]
        size = 0
        for b, t in enumerate(trees):
            if t.n > m.n_batch:
                raise DecodingError(f"a tree of {t.n} nodes exceeds {self.name}'s batch of {m.n_batch} tokens")
            if size + t.n > m.n_batch:
                groups.append([])
                size = 0
            groups[-1].append(b)
            size += t.n
        out: list[torch.Tensor] = []
        for group in groups:
            toks, seqs, pos = [], [], []
            for b in group:
                t, L = trees[b], state.rows[b].cached
                toks += t.token_list
                seqs += [[self._seq[b]]] * t.n
                pos += [L + i for i in range(t.n)]
            m.decode(toks, 0, logits=True, seq_ids=seqs, positions=pos)
            rows = m.logits(len(toks))
            at = 0
            for b in group:
                out.append(torch.from_numpy(rows[at: at + trees[b].n].copy()))
                at += trees[b].n
        return out

    def commit(self, state: DecodeState, paths: Sequence[Sequence[int]]) -> None:
        m = self.model
        if self._leaves is None:
            for row, path, seq in zip(state.rows, paths, self._seq):
                m.seq_rm(row.cached + len(path), -1, seq)  # the committed cells after the step: positions < end
            return
        (path,) = paths
        end = state.row.cached + len(path)
        seq = self._leaves[path[-1]][0] + 1  # a path whose prefix is the accepted one
        m.seq_rm(end, -1, seq)
        m.seq_keep(seq)  # drops every other tree cell; the committed cells keep only this sequence
        m.seq_cp(seq, 0)
        m.seq_rm(-1, -1, seq)
        self._leaves = None


class LlamaCppDrafter(Drafter):
    """A draft GGUF on llama.cpp as a drafter, with its own context: greedy chains, as llama.cpp's
    ``draft-simple`` drafts them. A chain policy grows one token at a time for a batch of one
    (:meth:`score_nodes`); a static chain (:class:`~sequoia_opt.drafting.policies.StaticTreePolicy` with a width-1
    tree) is proposed for every row at once (:meth:`propose`: the rows' catch-up chunks in one ``llama_decode``,
    then one decode per level over every row's node), each row in its own sequence. Greedy only (its candidates
    are the argmax).

    Args:
        model: the draft GGUF's :class:`~sequoia_opt.engines.llamacpp.binding.LlamaCppModel`. One row: any
            context. More rows: ``n_seq_max`` >= the rows it serves and a KV cache per sequence
            (``kv_unified=False``); with a unified cache it serves one row (:attr:`max_rows`).
        vocab_size: the target's V, where the draft's embedding is padded to another size (the Qwen2.5 pairs:
            151936 rows against 152064; llama.cpp's draft-simple takes sizes up to
            :data:`~sequoia_opt.engines.llamacpp.models.SPEC_VOCAB_MAX_SIZE_DIFFERENCE` apart): it proposes the
            argmax among ids below ``min(V, n_vocab)``, and :meth:`score_nodes` returns (1, V) logits (columns
            past the draft's rows -inf, as :meth:`~sequoia_opt.model.llama.Transformer.fit_vocab` pads a torch
            draft). Default: the draft's own ``n_vocab``.

    Raises:
        DecodingError: :meth:`bind` with sampling (it proposes greedily); :meth:`propose` a tree wider than a chain
            or forced tokens; :meth:`join` past :attr:`max_rows` rows.

    Attributes:
        row_cached: per live row, committed tokens in its sequence (positions ``[0, cached)``); ``cached`` is
            row 0's.
    """

    cost_model = "per-level"
    has_probs = False

    def __init__(self, model: LlamaCppModel, vocab_size: int | None = None) -> None:
        self.model = model
        self.vocab_size = model.n_vocab if vocab_size is None else int(vocab_size)
        self._cols = min(self.vocab_size, model.n_vocab)  # the logit columns both vocabularies have
        self.device = torch.device("cpu")
        self.context = model.seq_cells if model.n_seq_max > 1 and not model.kv_unified else model.n_ctx
        self.max_rows = max(1, model.n_seq_max) if not model.kv_unified else 1
        self.row_cached: list[int] = []
        self._seq: list[int] = []
        self.settings: DraftSettings | None = None

    @property
    def cached(self) -> int:  # type: ignore[override]
        return self.row_cached[0] if self.row_cached else 0

    def bind(self, settings: DraftSettings) -> None:
        self._bind_once(settings)
        if not settings.greedy:
            raise DecodingError("the llama.cpp drafter proposes greedily (llama.cpp's draft-simple): decode with "
                                "temperature 0")

    def reset(self) -> None:
        self.model.clear()
        self.row_cached, self._seq = [], []

    def prefill(self, state: DecodeState) -> None:
        self.model.clear()
        self._seq = list(range(len(state.rows)))
        self.row_cached = [0] * len(state.rows)  # the first proposal catches up on the prompt

    def join(self, state: DecodeState, rows: Sequence[int]) -> None:
        free = [s for s in range(self.max_rows) if s not in self._seq]
        if len(rows) > len(free):
            raise DecodingError(f"the llama.cpp drafter serves at most {self.max_rows} rows")
        for _, seq in zip(rows, free):
            self.model.seq_rm(-1, -1, seq)
            self._seq.append(seq)
            self.row_cached.append(0)

    def keep(self, rows: Sequence[int]) -> None:
        kept = [self._seq[b] for b in rows]
        for seq in set(self._seq) - set(kept):
            self.model.seq_rm(-1, -1, seq)
        self._seq = kept
        self.row_cached = [self.row_cached[b] for b in rows]

    def limit(self, state: DecodeState, buffers: TreeBuffers, depth: int | None = None) -> int:
        D = buffers.tree_depth if depth is None else min(depth, buffers.tree_depth)
        L = max(r.cached for r in state.rows)
        return max(0, min(D, self.context - L))  # levels 0 .. d-1 at positions up to L + d - 1

    def propose(self, state: DecodeState, buffers: TreeBuffers,
                forced_tokens: torch.Tensor | None = None) -> DraftOutput:
        if buffers.n != buffers.tree_depth + 1:
            raise DecodingError("the llama.cpp drafter proposes chains (llama.cpp's draft-simple): give a width-1 tree")
        if forced_tokens is not None:
            raise DecodingError("the llama.cpp drafter takes no forced tokens")
        m, D, B = self.model, buffers.tree_depth, len(state.rows)
        out = torch.zeros(B, buffers.n, dtype=torch.int64)
        toks, seqs, pos, want = [], [], [], []
        for b, r in enumerate(state.rows):  # catch-up chunks, ending at each root: one decode for every row
            chunk = r.seq[self.row_cached[b]: r.cached + 1]
            toks += chunk
            seqs += [[self._seq[b]]] * len(chunk)
            pos += list(range(self.row_cached[b], r.cached + 1))
            want += [False] * (len(chunk) - 1) + [True]
            out[b, 0] = r.root
        self._decode_chunks(toks, seqs, pos, want)
        rows = self._last
        for d in range(1, D + 1):
            out[:, d] = torch.from_numpy(rows[:, :self._cols].argmax(-1))
            if d == D:
                break
            m.decode(out[:, d].tolist(), 0, logits=True, seq_ids=[[s] for s in self._seq],
                     positions=[r.cached + d for r in state.rows])
            rows = m.logits(B)
        return DraftOutput(out, None, D)

    def _decode_chunks(self, toks, seqs, pos, want) -> None:
        """Decode ``toks`` in ``n_batch`` chunks; ``self._last`` gets the (B, V) logits of the tokens in ``want``."""
        m, got = self.model, []
        for s in range(0, len(toks), m.n_batch):
            w = want[s: s + m.n_batch]
            m.decode(toks[s: s + m.n_batch], 0, logits=w, seq_ids=seqs[s: s + m.n_batch],
                     positions=pos[s: s + m.n_batch])
            if any(w):
                got.append(np.array(m.logits(sum(w))))
        self._last = np.concatenate(got)

    def score_nodes(self, row: RowState, tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor,
                    nodes: Sequence[int], first: bool) -> torch.Tensor:
        """A chain's next node (a batch of one): with ``first`` the committed tokens it has not seen, ending at the
        root (in ``n_batch`` chunks: a long prompt is one catch-up); else the one node (its token at position
        ``L + depth``). Returns (1, V) logits."""
        m, L = self.model, row.cached
        if first:  # in n_batch chunks (a long prompt's catch-up exceeds one batch); logits for the root's row
            start = self.row_cached[0]
            pending = row.seq[start: L + 1]
            for s in range(0, len(pending), m.n_batch):
                m.decode(pending[s: s + m.n_batch], start + s, logits=False)
        else:
            (node,) = nodes
            m.decode([int(tokens[node])], L + int(depth[node]), logits=True)
        row = np.full((1, self.vocab_size), -np.inf, dtype=np.float32)
        row[:, :self._cols] = m.logits(1)[:, :self._cols]
        return torch.from_numpy(row)

    def commit(self, state: DecodeState, paths: Sequence[Sequence[int]], step_depth: int) -> None:
        """Each row keeps its root and the accepted nodes it ran over (at most ``step_depth``: the chain's last
        node is never run over); the rest of its cells go."""
        if step_depth == 0:
            return
        for b, (r, path) in enumerate(zip(state.rows, paths)):
            self.row_cached[b] = r.cached + min(len(path), step_depth)
            self.model.seq_rm(self.row_cached[b], -1, self._seq[b])
