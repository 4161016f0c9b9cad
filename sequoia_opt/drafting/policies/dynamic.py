""":class:`DynamicPolicy`: a tree chosen per step from the drafter's own scores (EAGLE-2, entropy branching,
best-first / DDTree).

The rule (:mod:`sequoia_opt.dynamic`) grows a candidate tree by asking the drafter, one forward at a time,
for the ranked candidates of some nodes (:meth:`~sequoia_opt.drafting.drafters.Drafter.score_nodes`: node i
of the candidate tree at slot ``L + i`` and position ``L + depth[i]`` of the drafter's cache); the nodes it
keeps become the step's :class:`~sequoia_opt.decoding.step_tree.StepTree`, verified by the target in one
forward. The solver's predictor runs the same rule over recorded draft distributions.

Draft probabilities: greedy decoding ranks by the drafter's softmax at temperature 1; sampling by its q (the
decoder's temperature and top-p applied to the draft logits).

Exactness:

* greedy: siblings are distinct tokens, so the target's argmax walk is plain decoding's output;
* sampling, ``eagle`` and ``best-first``: the kept candidates are the drafter's top-ranked tokens chosen by
  score, not samples of q, so they are verified as point masses (a candidate x is accepted with the
  residual's probability of x, else removed from it; exact for any candidates fixed before verification).
  This is what SGLang's tree verification does (``tree_speculative_sampling_target_only``);
* sampling, ``entropy``: a node's children are ordered samples without replacement from its q, and how many
  it gets depends on its own entropy and on other nodes, never on the values of its own children, so they
  are verified against q (SpecInfer's multi-step speculative sampling), as a static tree's.

Commit: the drafter commits the accepted path while it stays on nodes it ran over (mapped back to their
candidate-tree slots); its catch-up chunk feeds the rest next step. A drafter sharing the target's cache
(self layer-skip) commits the whole path, which the target's compaction has moved.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from ...decoding.sampling import CandidateGroup, process_logits, sample_without_replacement
from ...decoding.state import DecodeState, DraftSettings, RowState
from ...decoding.step_tree import Room, StepTree
from ...dynamic import CandidateTree, DynamicSetting, Expansion, grow, max_candidates, max_tree_size
from ...errors import DecodingError
from ..drafters import Drafter, as_drafter
from .base import SharedTreePolicy, commit_drafter

__all__ = ["DynamicPolicy"]


class DynamicPolicy(SharedTreePolicy):
    """One drafter, a tree chosen per step by a dynamic rule (module docstring).

    Args:
        drafter: a drafter with draft probabilities that can run over a shared tree (a draft model, self:L;
            a draft Transformer is wrapped in a ModelDrafter).
        setting: the rule and its limits (:class:`~sequoia_opt.dynamic.DynamicSetting`).
        name: the drafter's label (for reports).

    Attributes:
        last_tree: the last step's :class:`~sequoia_opt.dynamic.CandidateTree` (what the rule grew, its
            forwards); ``last_selected``: the candidate nodes verified, in step-tree order.
        cut_at_answer_end: grow no level past what the row can still use (:attr:`RowState.useful_depth`; True).
            The calibration recorder, which measures whole recording trees, passes False.

    Raises:
        DecodingError: a drafter without draft probabilities (prompt lookup), when the policy is made.
    """

    def __init__(self, drafter: Drafter, setting: DynamicSetting, name: str = "draft", *,
                 cut_at_answer_end: bool = True) -> None:
        self.cut_at_answer_end = bool(cut_at_answer_end)
        drafter = as_drafter(drafter)
        if not drafter.has_probs:  # refused here, not at the first step after the prefill
            raise DecodingError(f"drafter {name!r} has no draft probabilities ({type(drafter).__name__}): a dynamic "
                                "tree is chosen from them; use a draft model, self:L or a feature head")
        self.drafters = (drafter,)
        self.names = (str(name),)
        self.setting = setting
        self.max_size = max_candidates(setting)  # the drafter's slots; the verified tree has <= budget nodes
        self.max_depth = setting.steps
        self.drafter_ms, self.drafter_calls = [0.0], [0]
        self.last_tree: CandidateTree | None = None
        self.last_selected: list[int] = []

    @property
    def max_verified(self) -> int:
        return max_tree_size(self.setting)

    def draft(self, state: DecodeState, rooms: Sequence[Room]) -> list[StepTree]:
        if not self.whole_fits(state, rooms[0]):
            return self.root_only(state)
        reach = self.drafters[0].shared_depth(state)  # Medusa's K heads: a deeper setting grows K levels
        if self.cut_at_answer_end:  # and no level past what the row can still emit
            reach = min(reach, state.row.useful_depth)
        if reach <= 0:
            return self.root_only(state)
        s = self.settings
        t0 = self.clock.now()
        ex = _DraftExpander(self.drafters[0], self.names[0], state.row, s, self.max_size,
                            sample=not s.greedy and self.setting.policy == "entropy")
        setting = self.setting if reach >= self.setting.steps else replace(self.setting, steps=reach)
        cand, selected = grow(setting, state.root, ex)
        tree = StepTree(state.root)
        step_of = {0: 0}
        kids: dict[int, list[int]] = {}
        for c in selected[1:]:
            kids.setdefault(cand.parent[c], []).append(c)
        for c in selected:  # creation order: a parent's group is added before its children's
            ch = sorted(kids.get(c, ()), key=lambda i: cand.rank[i])
            if not ch:
                continue
            q = ex.q_rows.get(c) if ex.sample else None
            toks = torch.tensor([cand.token[i] for i in ch], dtype=torch.int64, device=s.device)
            for i, j in zip(ch, tree.add_group(step_of[c], CandidateGroup(q, toks, 0), merge=False)):
                step_of[i] = j
        self.last_tree = cand
        self.last_selected = sorted(step_of, key=step_of.__getitem__)
        self.drafter_ms, self.drafter_calls = [self.clock.now() - t0], [1]
        return [tree]

    def commit(self, state: DecodeState, trees: Sequence[StepTree], paths: Sequence[Sequence[int]]) -> None:
        if self.commit_root_only(state):
            return
        ran = set(self.last_tree.expanded)
        sel = self.last_selected
        # the drafter ran over the candidate tree at slots L + candidate index: its own numbering
        commit_drafter(self.drafters[0], state, paths[0], lambda j: sel[j] if sel[j] in ran else None,
                       self.max_depth if self.drafters[0].shares_target_cache else self.max_depth + 1)


class _DraftExpander:
    """The runtime :class:`~sequoia_opt.dynamic.Expander`: one ``score_nodes`` forward per call."""

    def __init__(self, drafter: Drafter, name: str, row: RowState, s: DraftSettings, n_max: int,
                 sample: bool) -> None:
        self.drafter, self.name, self.state, self.s, self.sample = drafter, name, row, s, sample
        self.tokens = torch.zeros(n_max, dtype=torch.int64, device=s.device)  # (n_max,) candidate tokens
        self.depth = torch.zeros(n_max, dtype=torch.int64, device=s.device)  # (n_max,) their depths
        self.anc = np.zeros((n_max, n_max), dtype=bool)  # (n_max, n_max) ancestor-or-self
        self.synced = 0
        self.first = True
        self.q_rows: dict[int, torch.Tensor] = {}  # sampling: node -> (V,) q its children were drawn from

    def _sync(self, tree: CandidateTree) -> None:
        lo, hi = self.synced, tree.n
        if hi == lo:
            return
        self.tokens[lo:hi] = torch.tensor(tree.token[lo:hi], dtype=torch.int64)
        self.depth[lo:hi] = torch.tensor(tree.depth[lo:hi], dtype=torch.int64)
        for i in range(lo, hi):
            p = tree.parent[i]
            if p >= 0:
                self.anc[i, :i] = self.anc[p, :i]
            self.anc[i, i] = True
        self.synced = hi

    def expand(self, tree: CandidateTree, nodes: list[int], k: int) -> list[Expansion]:
        self._sync(tree)
        s = self.s
        m = tree.n
        anc = torch.from_numpy(self.anc[:m, :m]).to(s.device)  # (m, m)
        logits = self.drafter.score_nodes(self.state, self.tokens[:m], self.depth[:m], anc, nodes, self.first)
        self.first = False
        if logits is None:
            raise DecodingError(f"drafter {self.name!r} has no draft probabilities (prompt lookup): a dynamic tree "
                                "is chosen from them; use a draft model or self:L")
        try:
            if s.greedy:
                q = logits.float().softmax(-1)  # (w, V) temperature 1
                if not torch.isfinite(q).all():
                    raise ValueError("NaN or infinite draft logits")
            else:
                q = process_logits(logits, s.temperature, s.top_p)  # (w, V)
            ent = -(q * q.clamp_min(1e-30).log()).sum(-1)  # (w,) nats
            kk = min(k, q.shape[-1])
            if self.sample:
                nnz = int((q > 0).sum(-1).min())
                # (w, k') ordered samples, from this row's own generator
                cand = sample_without_replacement(q, min(kk, nnz), s.generator_of(self.state))
                vals = q.gather(1, cand)
            else:
                vals, cand = q.topk(kk, dim=-1)  # (w, k) rank order
        except ValueError as err:
            raise DecodingError(f"drafter {self.name!r}: {err}") from None
        if self.sample:
            for v, row in zip(nodes, q):
                self.q_rows[v] = row
        out = []
        for toks, ps, h in zip(cand.tolist(), vals.tolist(), ent.tolist()):
            keep = [(t, p) for t, p in zip(toks, ps) if p > 0]
            out.append(Expansion([t for t, _ in keep], [p for _, p in keep], h))
        return out
