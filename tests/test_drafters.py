"""The Drafter protocol (sequoia_opt.drafting.drafters): the registry, the draft model as a ModelDrafter
(identical to passing the Transformer), and a non-model drafter plugged into the loop: an oracle that
proposes the target's greedy continuation in one pass, with no cache and no probabilities."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_decoding import CFG, PROMPTS, SEQUOIA_LIKE, TREES, _model, _perturbed, _with_context

from sequoia_opt.decoding import AutoregressiveDecoder, autoregressive_generate
from sequoia_opt.drafting import SpeculativeDecoder
from sequoia_opt.drafting import DRAFTERS, Drafter, DrafterSpec, ModelDrafter
from sequoia_opt.decoding import DraftOutput, DraftSettings
from sequoia_opt.decoding.step_tree import root_tree
from sequoia_opt.errors import DecodingError
from sequoia_opt.tree import Tree


@pytest.fixture(scope="module")
def pair():
    target = _model(0)
    return target, _perturbed(target, 0.3, seed=1)


class OracleDrafter(Drafter):
    """Proposes, at every node of depth j, the target's greedy token at depth j + 1 of the continuation of
    the committed tokens (rank 0) and the next ids after it (ranks 1, 2, ...), the same for every node of a
    level, as parallel heads would: one pass per step, no cache, no probabilities (greedy only)."""

    cost_model = "one-pass"
    has_probs = False

    def __init__(self, target):
        self.target = target
        self.vocab_size = target.config.vocab_size
        self.device = target.device
        self.context = target.config.max_position_embeddings
        self.calls = 0

    def bind(self, settings: DraftSettings) -> None:
        self.settings = settings

    def limit(self, state, buffers, depth=None):
        # the greedy continuation up to depth d reads positions up to L + d - 1
        D = buffers.tree_depth if depth is None else min(depth, buffers.tree_depth)
        return max(0, min(D, self.context - max(r.cached for r in state.rows)))

    def prefill(self, state):
        pass

    def propose(self, state, buffers, forced_tokens=None):
        self.calls += 1
        out = root_tree([r.root for r in state.rows], buffers.n, self.device) if forced_tokens is None \
            else forced_tokens
        for b, row in enumerate(state.rows):
            seq = list(row.seq)
            for d in range(1, buffers.tree_depth + 1):
                g = int(self.target(torch.tensor([seq]))[0, -1].argmax())  # the greedy token at depth d
                seq.append(g)
                if forced_tokens is None:
                    out[b, buffers.level_slices[d]] = (g + buffers.child_rank[d]) % self.vocab_size
        return DraftOutput(out, None, buffers.tree_depth)

    def commit(self, state, paths, step_depth):
        pass


def test_registry_holds_the_model_drafter(pair):
    kind = DRAFTERS["model"]
    assert kind.cost_model == "per-level" and kind.loads_model and kind.has_probs
    drafter = kind.build(DrafterSpec("model"), pair[0], pair[1])
    assert isinstance(drafter, ModelDrafter) and drafter.model is pair[1]
    assert drafter.cost_model == "per-level" and drafter.has_probs
    assert drafter.context == CFG.max_position_embeddings and drafter.cached == 0 and drafter.cache is None


def _same_run(a, b):
    assert a.tokens == b.tokens
    assert [(s.tokens, s.accepted_ranks, s.tree_size, s.tree_depth) for s in a.steps] == \
        [(s.tokens, s.accepted_ranks, s.tree_size, s.tree_depth) for s in b.steps]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_model_drafter_passed_explicitly_equals_passing_the_model(pair, temperature):
    target, draft = pair
    def run(d, tree):
        dec = SpeculativeDecoder(target, d, tree, temperature=temperature, top_p=0.9,
                                 generator=torch.Generator().manual_seed(3))
        return dec, [dec.generate(p, 16) for p in PROMPTS]

    for tree in (SEQUOIA_LIKE, TREES["wide"], Tree.chain(1)):
        plain_dec, plain = run(draft, tree)
        wrapped_dec, wrapped = run(ModelDrafter(draft), tree)
        for a, b in zip(plain, wrapped):
            _same_run(a, b)
        wrapped_d, plain_d = wrapped_dec.policy.drafter, plain_dec.policy.drafter
        assert wrapped_d.model is draft and wrapped_d.context == plain_d.context
        assert (wrapped_d.cache is None) == (plain_d.cache is None) == (tree.tree_depth == 0)


def test_replacing_the_generator_reaches_the_drafter(pair):
    target, draft = pair
    fresh = SpeculativeDecoder(target, draft, SEQUOIA_LIKE, temperature=1.0, generator=torch.Generator().manual_seed(4))
    dec = SpeculativeDecoder(target, draft, SEQUOIA_LIKE, temperature=1.0)
    dec.generate(PROMPTS[1], 5)
    dec.generator = torch.Generator().manual_seed(4)
    _same_run(dec.generate(PROMPTS[2], 16), fresh.generate(PROMPTS[2], 16))


@pytest.mark.parametrize("tree_name", ["sequoia", "wide", "chain", "budget1"])
def test_oracle_drafter_equals_plain_greedy(pair, tree_name):
    target = pair[0]
    tree = TREES[tree_name]
    oracle = OracleDrafter(target)
    dec = SpeculativeDecoder(target, oracle, tree, backend="torch")
    assert dec.policy.drafter is oracle
    ar = AutoregressiveDecoder(target)
    for prompt in PROMPTS:
        state = dec.start(prompt, 20)
        while not state.finished:
            dec.step(state)
        assert state.result.tokens == ar.generate(prompt, 20).tokens, prompt
        assert oracle.cached == 0  # no cache
        # rank 0 is always the target's choice: every step but the last accepts a whole rank-0 path
        assert all(s.accepted_nodes == tree.tree_depth for s in state.result.steps[:-1])
    assert (oracle.calls > 0) == (tree.tree_depth > 0)


@pytest.mark.parametrize("tree_name", ["sequoia", "chain12"])
def test_oracle_drafter_near_the_context_end_equals_plain_greedy(pair, tree_name):
    ctx = 64
    target = _with_context(pair[0], ctx)
    tree = Tree.chain(12) if tree_name == "chain12" else TREES[tree_name]
    dec = SpeculativeDecoder(target, OracleDrafter(target), tree, backend="torch")
    rng = np.random.default_rng(1)
    assert_near_the_end_equals_plain(dec, [rng.integers(0, CFG.vocab_size, size=P).tolist()
                                           for P in (ctx - 14, ctx - 5, ctx - 1)])


def assert_near_the_end_equals_plain(dec, prompts):
    """``dec`` serves each prompt (near the end of its target's context) with every budget from 1 to the
    context's end exactly like plain greedy decoding, and some step had its tree clipped."""
    target, tree = dec.target_model, dec.policy.tree
    ctx = target.config.max_position_embeddings
    clipped = 0
    for prompt in prompts:
        P = len(prompt)
        ref = autoregressive_generate(target, prompt, ctx - P).tokens
        for M in sorted({1, (ctx - P + 1) // 2, ctx - P}):
            res = dec.generate(prompt, M)
            assert res.tokens == ref[:M], (P, M)
            clipped += sum(s.tree_depth < tree.tree_depth for s in res.steps)
    assert clipped > 0


def test_sampling_with_a_drafter_without_probabilities_verifies_point_masses(pair):
    """No q: the candidates are verified as point masses (exactness: tests/test_lookup_drafter.py)."""
    target = pair[0]

    def run(seed):
        dec = SpeculativeDecoder(target, OracleDrafter(target), SEQUOIA_LIKE, temperature=1.0,
                                 generator=torch.Generator().manual_seed(seed))
        return dec.generate(PROMPTS[1], 12)

    a, b = run(1), run(1)
    _same_run(a, b)
    assert len(a.tokens) == 12 and all(0 <= t < CFG.vocab_size for t in a.tokens)
    left = 12  # every step drafts the whole tree, but no deeper than the tokens left can use
    for s in a.steps:
        assert s.tree_depth == min(SEQUOIA_LIKE.tree_depth, left - 1)
        left -= s.accepted_len


def test_a_drafter_serves_one_decoder_and_draft_must_be_a_model_or_a_drafter(pair):
    target, draft = pair
    drafter = ModelDrafter(draft)
    SpeculativeDecoder(target, drafter, SEQUOIA_LIKE)
    with pytest.raises(DecodingError, match="already serves a decoder"):
        SpeculativeDecoder(target, drafter, SEQUOIA_LIKE)
    with pytest.raises(DecodingError, match="the draft must be a Transformer or a Drafter, got str"):
        SpeculativeDecoder(target, "llama-68m", SEQUOIA_LIKE)
    with pytest.raises(DecodingError, match="vocabulary"):
        SpeculativeDecoder(target, OracleDrafter(_model(1, CFG.with_(vocab_size=128))), SEQUOIA_LIKE)


def test_the_solver_charges_a_drafter_by_its_declared_cost_model(pair):
    """The drafter protocol's cost models are the ones a latency profile stores; a one-pass drafter (the
    oracle here, as a parallel-heads drafter would be) is charged one draft forward over the tree's n - 1
    speculated tokens, a per-level one (the draft model, self layer-skip) one forward per level but the last."""
    from typing import get_args

    from sequoia_opt.drafting.drafters import CostModel, LayerSkipDrafter
    from sequoia_opt.profiles import DRAFT_COST_MODELS, LatencyCurve
    from sequoia_opt.solver import score_tree

    assert get_args(CostModel) == DRAFT_COST_MODELS
    target = pair[0]
    table = {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0, 16: 16.0, 32: 32.0}  # c(w) = w ms, T(n) = 10 ms
    acc = [0.6, 0.2, 0.1]
    for drafter, draft_ms in ((OracleDrafter(target), SEQUOIA_LIKE.size - 1),
                              (ModelDrafter(pair[1]), sum(SEQUOIA_LIKE.level_widths[:-1])),
                              (LayerSkipDrafter(target, 1), sum(SEQUOIA_LIKE.level_widths[:-1]))):
        curve = LatencyCurve.synthetic({1: 10.0, 32: 10.0}, table, cost_model=drafter.cost_model)
        cost = score_tree(SEQUOIA_LIKE, acc, curve)
        assert cost.draft_ms == pytest.approx(draft_ms) and cost.cost_ms == pytest.approx(draft_ms + 10.0)
