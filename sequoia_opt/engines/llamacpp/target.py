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
    """A llama.cpp context as the loop's target (module docstring): a batch of one, ``n_ctx`` cells.

    Args:
        model: the target GGUF's :class:`~sequoia_opt.engines.llamacpp.binding.LlamaCppModel`; a context with
            ``n_seq_max`` sequences verifies trees of up to ``n_seq_max - 1`` leaves (1: chains only). A tree needs
            a unified KV cache (``kv_unified=True``), so that one cell can belong to several sequences.

    Attributes:
        max_len / context: ``n_ctx`` (a cell per position).  max_leaves: the most leaves of a verified tree.
    """

    max_batch = 1

    def __init__(self, model: LlamaCppModel) -> None:
        self.model = model
        self.vocab_size = model.n_vocab
        self.device = torch.device("cpu")
        self.context = self.max_len = model.n_ctx
        self.max_leaves = max(1, model.n_seq_max - 1)
        self.max_width = None if self.max_leaves > 1 else 1
        self.name = f"the target model {model.path.stem!r} (llama.cpp)"
        self._leaves: list[list[int]] | None = None

    def prefill(self, prompts: Sequence[Sequence[int]]) -> None:
        (p,) = prompts
        self.model.clear()
        if len(p) > 1:
            self.model.prefill(list(p[:-1]))

    def room(self, state: DecodeState, want: int) -> list[Room]:
        L = state.row.cached
        return [Room(self.max_len - L, self.context - 1 - L)]

    def verify(self, state: DecodeState, trees: Sequence[StepTree]) -> list[torch.Tensor]:
        (tree,) = trees
        m, L, n = self.model, state.row.cached, tree.n
        toks = tree.token_list
        if all(len(c) <= 1 for c in tree.children):  # a chain: sequence 0, consecutive positions
            self._leaves = None
            m.decode(toks, L, logits=True)
        else:
            below = _leaves_below(tree)
            P = len(below[0])
            if P > self.max_leaves:
                raise DecodingError(f"{self.name} verifies trees of at most {self.max_leaves} leaves (its context has "
                                    f"{m.n_seq_max} sequences); this tree has {P}")
            for j in range(P):  # the committed cells in every path's sequence
                m.seq_cp(0, j + 1)
            self._leaves = below
            m.decode(toks, L, logits=True, seq_ids=[[j + 1 for j in b] for b in below],
                     positions=[L + int(d) for d in tree.depth])
        return [torch.from_numpy(m.logits(n).copy())]

    def commit(self, state: DecodeState, paths: Sequence[Sequence[int]]) -> None:
        (path,) = paths
        m, L = self.model, state.row.cached
        end = L + len(path)  # the committed cells after the step: positions < end
        if self._leaves is None:
            m.seq_rm(end)
            return
        seq = self._leaves[path[-1]][0] + 1  # a path whose prefix is the accepted one
        m.seq_rm(end, -1, seq)
        m.seq_keep(seq)  # drops every other tree cell; the committed cells keep only this sequence
        m.seq_cp(seq, 0)
        m.seq_rm(-1, -1, seq)
        self._leaves = None


class LlamaCppDrafter(Drafter):
    """A draft GGUF on llama.cpp as a drafter: it grows a chain one token at a time (llama.cpp's
    ``draft-simple``; :meth:`score_nodes`, what a chain policy asks), with its own context. Greedy only (its
    candidates are the argmax); a batch of one.

    Args:
        model: the draft GGUF's :class:`~sequoia_opt.engines.llamacpp.binding.LlamaCppModel`.

    Attributes:
        cached: committed tokens in its KV cache (positions ``[0, cached)``).
    """

    cost_model = "per-level"
    has_probs = False

    def __init__(self, model: LlamaCppModel) -> None:
        self.model = model
        self.vocab_size = model.n_vocab
        self.device = torch.device("cpu")
        self.context = model.n_ctx
        self.cached = 0
        self.settings: DraftSettings | None = None

    def bind(self, settings: DraftSettings) -> None:
        self._bind_once(settings)
        if not settings.greedy:
            raise DecodingError("the llama.cpp drafter proposes greedily (llama.cpp's draft-simple): decode with "
                                "temperature 0")

    def reset(self) -> None:
        self.model.clear()
        self.cached = 0

    def prefill(self, state: DecodeState) -> None:
        self.model.clear()
        self.cached = 0

    def limit(self, state: DecodeState, buffers: TreeBuffers, depth: int | None = None) -> int:
        D = buffers.tree_depth if depth is None else min(depth, buffers.tree_depth)
        return max(0, min(D, self.context - state.row.cached))  # levels 0 .. d-1 at positions up to L + d - 1

    def propose(self, state: DecodeState, buffers: TreeBuffers,
                forced_tokens: torch.Tensor | None = None) -> DraftOutput:
        raise DecodingError("the llama.cpp drafter grows chains token by token: use it with the chain policy")

    def score_nodes(self, row: RowState, tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor,
                    nodes: Sequence[int], first: bool) -> torch.Tensor:
        """A chain's next node: with ``first`` the committed tokens it has not seen, ending at the root; else the
        one node (its token at position ``L + depth``). Returns (1, V) logits."""
        m, L = self.model, row.cached
        if first:
            pending = row.seq[self.cached : L + 1]
            m.decode(pending, self.cached, logits=False)
        else:
            (node,) = nodes
            m.decode([int(tokens[node])], L + int(depth[node]), logits=True)
        return torch.from_numpy(np.array(m.logits(1)))

    def commit(self, state: DecodeState, paths: Sequence[Sequence[int]], step_depth: int) -> None:
        if step_depth == 0:
            return
        L = state.row.cached
        self.cached = L + len(paths[0])  # the root and the accepted nodes it ran over
        self.model.seq_rm(self.cached)
