""":class:`ChainPolicy`: a chain grown token by token, as chain-speculating engines draft (llama.cpp's
``draft-simple`` in ``common/speculative.cpp``; vLLM's and TensorRT-LLM's draft lengths): at most ``n_max``
drafts, each the drafter's top-1 token; drafting stops early when the drafter's top-1 probability among its top
``top_k`` logits (llama.cpp's draft sampler keeps 10) is below ``p_min``; a step that drafted fewer than
``n_min`` verifies none of them; and no step drafts more than the row's remaining tokens less one (the last
token is always the target's).

With ``p_min = 0`` and ``n_min = 0`` the chain is the static width-1 tree of ``n_max`` drafts (what the Sequoia
DP with branching 1 values); the early stop is what a replay of recorded traces values
(:func:`~sequoia_opt.solver.chains.predict_replay`). Candidates are argmax tokens, verified greedily or, when
sampling, as point masses (exact for any candidates fixed before verification).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...decoding.sampling import CandidateGroup
from ...decoding.state import DecodeState
from ...decoding.step_tree import Room, StepTree
from ...errors import DecodingError
from ..drafters import Drafter, as_drafter
from .base import SharedTreePolicy, commit_drafter

__all__ = ["ChainPolicy", "top1_share"]


def top1_share(logits: torch.Tensor, top_k: int = 10) -> tuple[int, float]:
    """The argmax of a (V,) logit row and its softmax probability among the row's ``top_k`` largest logits
    (llama.cpp's draft sampler: top-k 10, then the distribution p-min is read from)."""
    vals, idx = logits.float().topk(min(top_k, logits.numel()))
    p = torch.softmax(vals.double(), -1)
    return int(idx[0]), float(p[0])


class ChainPolicy(SharedTreePolicy):
    """A chain of at most ``n_max`` drafts grown token by token (module docstring); a batch of one.

    Args:
        drafter: any drafter that can run over a shared tree one node at a time
            (:meth:`~sequoia_opt.drafting.drafters.Drafter.score_nodes`: a draft model, self:L, llama.cpp's draft,
            a feature head), or one without a model that ranks candidates itself (prompt lookup: its
            :meth:`~sequoia_opt.drafting.drafters.Drafter.ranked` top candidate, p-min read from its match
            confidence, as llama.cpp's n-gram drafting chains).
        n_max: the most drafts per step (>= 1).  n_min: fewer drafts are dropped (>= 0).
        p_min: stop at a top-1 probability below this, in [0, 1].  top_k: the logits p-min is read among.
        name: the drafter's label.

    Raises:
        DecodingError: a setting out of range.
    """

    reports_drafters = False

    def __init__(self, drafter: Drafter, n_max: int, n_min: int = 0, p_min: float = 0.0, *, name: str = "draft",
                 top_k: int = 10) -> None:
        if isinstance(n_max, bool) or int(n_max) != n_max or n_max < 1 or int(n_min) != n_min or n_min < 0 \
                or not 0.0 <= float(p_min) <= 1.0 or top_k < 1:
            raise DecodingError(f"a chain needs draft-max >= 1, draft-min >= 0 and draft-p-min in [0, 1], got "
                                f"{n_max!r}, {n_min!r}, {p_min!r}")
        self.drafter = as_drafter(drafter)
        self.drafters, self.names = (self.drafter,), (str(name),)
        self.n_max, self.n_min, self.p_min, self.top_k = int(n_max), int(n_min), float(p_min), int(top_k)
        self.max_size, self.max_depth, self.max_width = self.n_max + 1, self.n_max, 1
        self._ran: frozenset[int] = frozenset()

    def draft(self, state: DecodeState, rooms: Sequence[Room]) -> list[StepTree]:
        row, room = state.row, rooms[0]
        L = row.cached
        n = min(self.n_max, row.useful_depth, room.nodes - 1, room.depth, self.drafter.context - L,
                self.drafter.shared_depth(state))  # Medusa's K heads: a longer chain is clipped to K
        if n <= 0:
            return self.root_only(state)
        self._root_only = False
        dev = self.settings.device
        tokens = torch.zeros(self.max_size, dtype=torch.int64, device=dev)  # (n_max + 1,) the chain's tokens
        tokens[0] = row.root
        depth = torch.arange(self.max_size, dtype=torch.int64, device=dev)  # (n_max + 1,) node i at depth i
        anc = torch.ones(self.max_size, self.max_size, dtype=torch.bool, device=dev).tril()  # a chain's ancestors
        drafts, ran = [], []
        while len(drafts) < n:
            node = len(drafts)
            logits = self.drafter.score_nodes(row, tokens, depth, anc, [node], node == 0)
            ran.append(node)
            if logits is None:  # a drafter without a model (prompt lookup): its top candidate and its confidence
                cands, prob = self.drafter.ranked(row.seq, drafts, 1)
                tok = cands[0]
            else:
                tok, prob = top1_share(logits[-1], self.top_k)
            if prob < self.p_min:
                break
            drafts.append(tok)
            tokens[node + 1] = tok
        if len(drafts) < self.n_min:
            drafts = []
        tree = StepTree(row.root)
        for i, tok in enumerate(drafts):
            tree.add_group(i, CandidateGroup(None, torch.tensor([tok], dtype=torch.int64), 0), merge=False)
        self._ran = frozenset(ran)
        self.drafter_calls = [1]
        return [tree]

    def commit(self, state: DecodeState, trees: Sequence[StepTree], paths: Sequence[Sequence[int]]) -> None:
        if self.commit_root_only(state):
            return
        ran = self._ran
        commit_drafter(self.drafter, state, paths[0], lambda j: j if j in ran else None, self.n_max + 1)
