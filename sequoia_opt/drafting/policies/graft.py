""":class:`GraftPolicy`: two drafters of different cost grow one shared tree (TreeGraft, 2026).

The plan is a solved tree whose nodes each name their drafter (``plan_drafter[i]``: 0 = the light drafter,
1 = the strong one; :class:`~sequoia_opt.tree.DrafterTree`). A strong node of per-drafter rank r under a
parent is the strong drafter's r-th candidate *among the tokens the light drafter did not already propose
there*; siblings are light first, and a strong node's children are strong nodes (a grafted branch is the
strong drafter's own recovered path).

One step:

1. The light drafter proposes its part of the plan (the plan's light-only subtree, a static tree compiled
   once) with its ordinary :meth:`~sequoia_opt.drafting.drafters.Drafter.propose`: nodes ``0 .. n_l - 1`` of
   the step tree, in that subtree's breadth-first order, with their draft distributions and confidence.
2. The scheduler (:mod:`~sequoia_opt.drafting.policies.scheduler`) reads cheap features of that part and
   decides whether the strong drafter is called this step.
3. If it is: level by level, the strong drafter runs over the nodes it needs (every ancestor-or-self of a node
   where it grafts; the root through its catch-up chunk), re-scoring the light drafter's candidates there,
   and grafts its candidates at the plan's graft positions: greedy, its top-b tokens with the light's
   children excluded; sampling, b ordered samples without replacement from its q with those tokens removed
   (:func:`~sequoia_opt.decoding.sampling.sample_excluding`), verified against that conditional q. Grafted
   nodes are appended after the light's (their slots never move a light node), nothing the light proposed is
   removed, and the strong's candidates never repeat a light sibling. A prompt-lookup strong drafter grafts
   its ranked candidates as point masses.
4. Near the answer's end the step drafts the plan cut to what the row can still emit (its first d + 1 levels,
   d = :attr:`~sequoia_opt.decoding.state.RowState.useful_depth`; :class:`GraftLayout`), the root alone at d = 0.
5. Commit: the light drafter commits the accepted path while it stays on its nodes; the strong drafter, when
   it was called, the path while it stays on nodes it ran over (its catch-up chunk feeds the rest next
   time it is called); a drafter sharing the target's cache commits the whole path.

Exactness: greedy verification is unchanged (siblings are distinct tokens); under sampling each node's
candidates are verified group by group against the distribution they were drawn from
(:func:`~sequoia_opt.decoding.sampling.verify_groups_node`, SpecInfer's multi-step speculative sampling).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...decoding.sampling import CandidateGroup, process_logits, sample_excluding
from ...decoding.state import DecodeState, DraftSettings
from ...decoding.step_tree import Room, StepTree, TreeBuffers, ancestor_matrix
from ...errors import DecodingError
from ...tree import Tree
from ..drafters import Drafter, as_drafter
from .base import SharedTreePolicy, check_depth_limit, commit_drafter
from .scheduler import AlwaysGraft, GraftScheduler, spine_features

__all__ = ["GraftPolicy", "GraftLayout", "check_graft_plan"]


def check_graft_plan(tree: Tree, drafter: Sequence[int]) -> None:
    """Refuse a plan the graft policy cannot run.

    Raises:
        DecodingError: labels not one per node, a label other than 0 / 1, a light sibling after a strong one,
            or a light node under a strong one.
    """
    if len(drafter) != tree.size:
        raise DecodingError(f"the plan names {len(drafter)} drafters for {tree.size} nodes")
    for i in range(1, tree.size):
        k = int(drafter[i])
        if k not in (0, 1):
            raise DecodingError(f"plan node {i} names drafter {k}; a graft plan has drafters 0 (light) and 1 (strong)")
        p = tree.parent[i]
        if p > 0 and int(drafter[p]) == 1 and k == 0:
            raise DecodingError(f"plan node {i} is a light node under a strong node {p}: a grafted branch is the "
                                "strong drafter's own")
    for ch in tree.children:
        labels = [int(drafter[c]) for c in ch]
        if labels != sorted(labels):
            raise DecodingError("a plan node has a light child after a strong one (siblings are light first)")


class GraftLayout:
    """A graft plan laid out as one step's nodes: the light drafter's part first (its subtree's breadth-first
    order), the strong drafter's after, with the graft sites and the levels the strong drafter runs over.
    :class:`GraftPolicy` keeps one per depth it drafts at: the whole plan's, and near the answer's end the plan
    cut to its first d + 1 levels (levels are contiguous in the plan's breadth-first order, so the cut plan is a
    prefix of it and a graft plan itself).

    Attributes:
        plan, labels: the plan and its per-node drafters (0 light, 1 strong; the root's entry is ignored).
        depth: the plan's depth (tokens below the root).
        light_tree: the light drafter's part as a tree of its own: the step's first ``n_light`` nodes.
        n_light: step nodes the light drafter proposes (the root included).
        step_parent, step_depth: per step node (n = ``plan.size`` when the strong drafter is called), its parent
            and depth.
        graft_sites: step node -> how many strong children it gets (in the plan's rank order).
        graft_kids: step node -> its planned strong children's step nodes, in rank order.
        strong_levels: per depth, the step nodes the strong drafter runs over (every ancestor-or-self of a graft
            site).
        reselect_levels: parent depth -> grafts re-selected there (:class:`GraftPolicy` ``reselect``): the grafts
            under light parents at that depth, where every one is a leaf.
        light_spine: the light tree's rank-0 spine nodes that have children (root first).
        buffers, step_depth_t (n,) int64, step_anc_t (n, n) bool: compiled on the decoder's device by
            :meth:`bind`.
    """

    def __init__(self, plan: Tree, labels: Sequence[int]) -> None:
        self.plan, self.labels = plan, tuple(int(k) for k in labels)
        self.depth = plan.tree_depth
        lab, depth = self.labels, plan.depth
        light_nodes = [i for i in range(plan.size) if i == 0 or lab[i] == 0]
        strong_nodes = [i for i in range(1, plan.size) if lab[i] == 1]
        step_of = {p: j for j, p in enumerate(light_nodes)}  # plan node -> step node
        for j, p in enumerate(strong_nodes):
            step_of[p] = len(light_nodes) + j
        self.light_tree = Tree(parent=[-1] + [step_of[plan.parent[i]] for i in light_nodes[1:]],
                               rank=[plan.rank[i] for i in light_nodes])
        self.n_light = len(light_nodes)
        self.step_parent, self.step_depth = [-1] * plan.size, [0] * plan.size
        for p, j in step_of.items():
            self.step_depth[j] = int(depth[p])
            if p:
                self.step_parent[j] = step_of[plan.parent[p]]
        sites: dict[int, int] = {}
        self.graft_kids: dict[int, list[int]] = {}
        for p in strong_nodes:
            at = step_of[plan.parent[p]]
            sites[at] = sites.get(at, 0) + 1
            self.graft_kids.setdefault(at, []).append(step_of[p])
        self.graft_sites = dict(sorted(sites.items()))
        anc = self.step_anc = ancestor_matrix(self.step_parent)  # (n, n) bool
        need = sorted({j for at in sites for j in range(plan.size) if anc[at, j]})
        self.strong_levels: list[list[int]] = []
        for d in range(self.depth + 1):
            level = [j for j in need if self.step_depth[j] == d]
            if level:
                self.strong_levels.append(level)
        self.reselect_levels: dict[int, int] = {}
        blocked: set[int] = set()  # a depth where a graft has children keeps the plan's positions
        for p in strong_nodes:
            if plan.parent[p] == 0 or lab[plan.parent[p]] == 0:
                j = int(depth[plan.parent[p]])
                if plan.children[p]:
                    blocked.add(j)
                self.reselect_levels[j] = self.reselect_levels.get(j, 0) + 1
        for j in blocked:
            self.reselect_levels.pop(j, None)
        self.light_spine, node = [], 0
        while self.light_tree.children[node]:
            self.light_spine.append(node)
            node = self.light_tree.children[node][0]
        self.buffers: TreeBuffers | None = None

    def cut(self, depth: int) -> "GraftLayout":
        """The plan cut to its levels ``0..depth`` (``0 <= depth <= self.depth``), laid out afresh (not compiled)."""
        plan = self.plan.cut(depth)
        return GraftLayout(plan, self.labels[: plan.size])

    def bind(self, device: torch.device | str) -> None:
        """Compile the light tree, and the step tree's depths and ancestor matrix for the strong drafter's
        forwards, on ``device``."""
        self.buffers = TreeBuffers.build(self.light_tree, device)
        self.step_depth_t = torch.tensor(self.step_depth, dtype=torch.int64, device=device)
        self.step_anc_t = torch.from_numpy(self.step_anc).to(device)


class GraftPolicy(SharedTreePolicy):
    """A light and a strong drafter grow one tree from a solved plan; a scheduler decides when the strong
    drafter is called (module docstring).

    Args:
        light, strong: the two drafters (each bound to this policy's decoder only; a draft Transformer is
            wrapped in a ModelDrafter).
        plan: the plan's topology (canonical breadth-first :class:`~sequoia_opt.tree.Tree`).
        plan_drafter: per plan node, 0 (light) or 1 (strong); the root's entry is ignored.
        names: the two drafters' labels (for reports).
        scheduler: the :class:`GraftScheduler` (default :class:`AlwaysGraft`: a static grafted tree).
        reselect: re-select the graft positions each step from the strong drafter's scores (TreeGraft's
            re-scoring; :meth:`_reselect`): at every depth where the plan grafts leaves only, its number of
            grafts goes to the light nodes whose root path and next token the strong drafter rates highest,
            among the nodes it runs over anyway (the same cost). Default False: the plan's positions.
        cut_at_answer_end: draft no deeper than the row can still emit (:attr:`RowState.useful_depth
            <sequoia_opt.decoding.state.RowState.useful_depth>`; True): the plan cut to its first d + 1 levels
            (:class:`GraftLayout`), the root alone at d = 0. Greedy output is the same either way; only the step's
            cost drops. The graft profiler sets it False: every step is the whole plan.

    Raises:
        DecodingError: a plan :func:`check_graft_plan` refuses, ``names`` not two names; a strong drafter that
            cannot run over a shared tree is refused when it is first asked.
    """

    wants_confidence = True

    def __init__(self, light: Drafter, strong: Drafter, plan: Tree, plan_drafter: Sequence[int],
                 names: Sequence[str] = ("light", "strong"), scheduler: GraftScheduler | None = None,
                 reselect: bool = False, *, cut_at_answer_end: bool = True) -> None:
        check_graft_plan(plan, plan_drafter)
        light, strong = as_drafter(light), as_drafter(strong)
        self.drafters = (light, strong)
        self.names = tuple(names)
        if len(self.names) != 2:
            raise DecodingError(f"a graft policy names its two drafters (light, strong), got {list(self.names)}")
        self.scheduler = scheduler or AlwaysGraft()
        self.plan, self.plan_drafter = plan, tuple(int(k) for k in plan_drafter)
        self.max_size, self.max_depth = plan.size, plan.tree_depth
        lab = self.plan_drafter
        layout = GraftLayout(plan, lab)
        strong_deepest = max((int(plan.depth[i]) for i in range(1, plan.size) if lab[i] == 1), default=0)
        for k, (drafter, deepest) in enumerate(((light, layout.light_tree.tree_depth), (strong, strong_deepest))):
            check_depth_limit(drafter, deepest, f"the grafted tree's {('light', 'strong')[k]} part",
                              hint="profile graft's and solve's --max-depth for a grafted tree")
        self.reselect = bool(reselect)
        self.cut_at_answer_end = bool(cut_at_answer_end)
        self.layout = layout  # this step's: the whole plan, or the plan cut at the answer's end
        self._layouts = {plan.tree_depth: layout}
        self.recent_accepted = 0.0
        self.drafter_ms, self.drafter_calls = [0.0, 0.0], [0, 0]
        self._called = False
        self._ran: dict[int, int] = {}  # this step: step node -> the planned node it is, for those the strong ran over
        self.last_features = None

    # this step's layout (the whole plan's unless cut at the answer's end)
    n_light = property(lambda self: self.layout.n_light, doc="Step nodes the light drafter proposes this step.")
    light_tree = property(lambda self: self.layout.light_tree, doc="The light drafter's part of this step's plan.")
    graft_sites = property(lambda self: self.layout.graft_sites, doc="Step node -> strong children grafted there.")
    reselect_levels = property(lambda self: self.layout.reselect_levels,
                               doc="Parent depth -> grafts re-selected there (``reselect``).")

    @classmethod
    def from_drafter_tree(cls, light: Drafter, strong: Drafter, dtree, scheduler: GraftScheduler | None = None,
                          reselect: bool = False) -> "GraftPolicy":
        """From a :class:`~sequoia_opt.tree.DrafterTree` (two drafters, light first). Raises DecodingError when
        ``dtree`` names other than two drafters, and as the constructor."""
        if len(dtree.names) != 2:
            raise DecodingError(f"a graft plan names two drafters (light, strong); this one names {list(dtree.names)}")
        return cls(light, strong, dtree.tree, dtree.drafter, dtree.names, scheduler, reselect)

    def bind(self, settings: DraftSettings) -> None:
        super().bind(settings)
        for layout in self._layouts.values():
            layout.bind(settings.device)

    def layout_at(self, depth: int) -> GraftLayout:
        """The plan cut to ``depth`` (``1 <= depth <= max_depth``; the whole plan at max_depth), laid out and
        compiled once and kept."""
        layout = self._layouts.get(depth)
        if layout is None:
            layout = self._layouts[depth] = self._layouts[self.max_depth].cut(depth)
            layout.bind(self.settings.device)
        return layout

    def reset(self) -> None:
        super().reset()
        self.recent_accepted = 0.0

    def observe(self, state: DecodeState, step) -> None:
        self.recent_accepted = 0.5 * self.recent_accepted + 0.5 * step.acceptances[0].accepted_nodes

    # ------------------------------------------------------------------ one step
    def draft(self, state: DecodeState, rooms: Sequence[Room]) -> list[StepTree]:
        if not self.whole_fits(state, rooms[0]):
            return self.root_only(state)
        depth = min(self.max_depth, state.row.useful_depth) if self.cut_at_answer_end else self.max_depth
        if depth == 0:
            return self.root_only(state)
        self.layout = self.layout_at(depth)
        return [self._draft(state)]

    def _draft(self, state: DecodeState) -> StepTree:
        s, buf = self.settings, self.layout.buffers
        light, strong = self.drafters
        tree = StepTree(state.root)
        t0 = self.clock.now()
        conf = None
        if buf.tree_depth > 0:
            out = light.propose(state, buf)
            probs = out.probs[0] if out.probs is not None else None
            tree.add_drafted(out.tokens[0], probs, buf, 0, merge=False)  # nodes 0 .. n_l - 1, its own order
            conf = out.confidence[0].tolist() if out.confidence is not None else None
        t1 = self.clock.now()
        self.drafter_ms = [t1 - t0, 0.0]
        self.drafter_calls = [int(buf.tree_depth > 0), 0]
        self._called = False
        self._ran = {}
        if not self.graft_sites:
            return tree
        feats = spine_features(conf if conf is not None else [0.0] * tree.n, self.layout.light_spine,
                               self.recent_accepted)
        self.last_features = feats
        if not self.scheduler.decide(feats):
            return tree
        self._called = True
        self._graft(state, tree, strong, s)
        self.drafter_ms[1] = self.clock.now() - t1
        self.drafter_calls[1] = 1
        return tree

    def _graft(self, state: DecodeState, tree: StepTree, strong: Drafter, s: DraftSettings) -> None:
        """Run the strong drafter level by level and graft its candidates. The strong drafter works in the
        plan's step-node numbering (its slots, depths and ancestor rows are fixed by the plan); ``real`` maps
        a planned node to the node it became in ``tree``. A site with nothing left to graft (the strong
        drafter's mass, top-p nucleus or finite logits all lie on the light's children there) gets fewer
        grafted children or none, and the planned nodes below a missing one are not drafted."""
        device = s.device
        lay = self.layout
        n = lay.plan.size
        tokens = torch.zeros(n, dtype=torch.int64, device=device)  # (n,) planned step nodes' tokens
        tokens[: tree.n] = torch.tensor(tree.token_list, dtype=torch.int64, device=device)
        depth, anc = lay.step_depth_t, lay.step_anc_t
        real = list(range(lay.n_light)) + [-1] * (n - lay.n_light)
        path_p = {0: 1.0}  # re-selection: the strong drafter's probability of each light node's root path
        for li, level in enumerate(lay.strong_levels):
            nodes = [j for j in level if real[j] >= 0]
            if not nodes:
                continue
            logits = strong.score_nodes(state.row, tokens, depth, anc, nodes, li == 0)
            self._ran.update((real[j], j) for j in nodes)
            d = lay.step_depth[nodes[0]]
            reselected = self.reselect and logits is not None and d in lay.reselect_levels
            if reselected:
                self._reselect(tree, nodes, logits, lay.reselect_levels[d], path_p, s)
            for row, node in enumerate(nodes):
                b = lay.graft_sites.get(node)
                if not b or (reselected and node < lay.n_light):  # re-selected: the light parents' grafts
                    continue
                at = real[node]
                exclude = [tree.token_list[c] for c in tree.children[at]]
                if logits is None:  # a drafter without a model: its ranked candidates, as point masses
                    cands, _ = strong.ranked(state.seq, tree.path_tokens(at), min(b + len(exclude), strong.vocab_size))
                    new = torch.tensor([t for t in cands if t not in exclude][:b], dtype=torch.int64, device=device)
                    group = CandidateGroup(None, new, 1)
                elif s.greedy:
                    lg = logits[row].float().clone()
                    if exclude:
                        lg[torch.tensor(exclude, device=device)] = float("-inf")
                    top = lg.topk(min(b, lg.numel()))
                    group = CandidateGroup(None, top.indices[top.values > float("-inf")], 1)
                else:
                    try:
                        q = process_logits(logits[row], s.temperature, s.top_p)
                    except ValueError as err:
                        raise DecodingError(f"the strong drafter {self.names[1]!r} at step node {at} (depth "
                                            f"{lay.step_depth[node]}): {err}") from None
                    cand, q_cond = sample_excluding(q, b, exclude, s.generator_of(state.row))
                    group = CandidateGroup(q_cond, cand[q_cond[cand] > 0], 1)  # no zero-mass padding
                if not group.tokens.numel():
                    continue  # nothing left to graft here
                kids = tree.add_group(at, group, merge=False)
                for j, c in zip(lay.graft_kids[node], kids):
                    real[j] = c
                    tokens[j] = tree.token_list[c]

    def _reselect(self, tree: StepTree, nodes: Sequence[int], logits: torch.Tensor, g: int,
                  path_p: dict[int, float], s: DraftSettings) -> None:
        """Re-select this level's g graft positions from the strong drafter's scores (TreeGraft's re-scoring):
        every light node of the level that the strong drafter ran over is a candidate parent, every token its
        light children do not already have a candidate child; a pair (v, t) scores P_strong(path to v) *
        q_strong(t | v) (P_strong: the product of the strong's probabilities of the light tokens along v's
        path, temperature 1), and the g best pairs are grafted, ranked by score under each parent. Candidates
        chosen by score are not samples of q: under sampling they are verified as point masses (exact for any
        candidates drawn before verification)."""
        probs = logits.float().softmax(-1)  # (w, V)
        light_rows = [(row, v) for row, v in enumerate(nodes) if v < self.n_light]
        for row, v in light_rows:  # the path probability of v's light children, for the next level
            for c in tree.children[v]:
                path_p[c] = path_p.get(v, 0.0) * float(probs[row, tree.token_list[c]])
        pairs: list[tuple[float, int, int]] = []
        for row, v in light_rows:
            pv = path_p.get(v, 0.0)
            pr = probs[row].clone()
            ex = [tree.token_list[c] for c in tree.children[v]]
            if ex:
                pr[torch.tensor(ex, device=pr.device)] = -1.0
            top = pr.topk(min(g, pr.numel() - len(ex)))
            pairs += [(pv * float(x), v, int(t)) for x, t in zip(top.values.tolist(), top.indices.tolist())]
        pairs.sort(key=lambda x: -x[0])
        chosen: dict[int, list[int]] = {}
        for _, v, t in pairs[:g]:
            chosen.setdefault(v, []).append(t)
        for v in sorted(chosen):
            tree.add_group(v, CandidateGroup(None, torch.tensor(chosen[v], dtype=torch.int64, device=s.device), 1),
                           merge=False)  # leaves: the strong drafter never runs over them

    def commit(self, state: DecodeState, trees: Sequence[StepTree], paths: Sequence[Sequence[int]]) -> None:
        if self.commit_root_only(state):
            return
        light, strong = self.drafters
        lay, ran = self.layout, self._ran
        n_light = lay.n_light
        # the light tree's nodes are the step tree's first n_l (its own numbering); the strong drafter ran over
        # step nodes at their own slots
        commit_drafter(light, state, paths[0], lambda j: j if j < n_light else None, lay.buffers.tree_depth)
        if strong.shares_target_cache:
            commit_drafter(strong, state, paths[0], int, lay.depth)
        elif self._called:  # its cache holds the nodes it ran over at their planned slots
            commit_drafter(strong, state, paths[0], ran.get, lay.depth + 1)
        else:  # not asked this step: told so (step depth 0), as every drafter is after every step
            strong.commit(state, [[0]], 0)
