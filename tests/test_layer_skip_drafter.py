"""The self-speculative layer-skip drafter (``self:L``): the target's first L layers + norm + head, sharing
the target's KV cache. Greedy output equals plain decoding (also near the end of the context), sampling
follows the target's law, the prefix-layer forward equals a truncated model, bad L is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_decoding import CFG, PROMPTS, SEQUOIA_LIKE, TREES, _model, _with_context

from sequoia_opt.attention import causal_tree_mask
from sequoia_opt.decoding import AutoregressiveDecoder, autoregressive_generate, process_logits
from sequoia_opt.drafting import LayerSkipDrafter, SpeculativeDecoder
from sequoia_opt.drafting import DRAFTERS, parse_drafter_spec
from sequoia_opt.errors import DecodingError
from sequoia_opt.model import ModelConfig, Transformer
from sequoia_opt.tree import Tree
from tiny_pair import draft_one, verify_one

CFG4 = CFG.with_(n_layers=4)


def _damped(model: Transformer, first: int, factor: float) -> Transformer:
    """Scale the residual contributions (o_proj, down_proj) of blocks ``first..`` by ``factor``, so the first
    layers decide most of the output: the layer-skip draft then agrees with the target partly, and
    verification sees acceptances and rejections."""
    with torch.no_grad():
        for block in model.layers[first:]:
            block.self_attn.o_proj.weight.mul_(factor)
            block.mlp.down_proj.weight.mul_(factor)
    return model


@pytest.fixture(scope="module")
def target4() -> Transformer:
    return _damped(_model(0, CFG4), 2, 0.3)


def _truncated(model: Transformer, k: int) -> Transformer:
    """A Transformer with n_layers = k built from ``model``'s first k blocks, norm and head (strict load)."""
    out = Transformer(model.config.with_(n_layers=k), device="cpu", dtype=torch.float32).eval()
    out.load_state_dict({name: t for name, t in model.state_dict().items()
                         if not name.startswith("layers.") or int(name.split(".")[1]) < k})
    return out


# ---------------------------------------------------------------------------------------------- the forward


@pytest.mark.parametrize("k", [1, 2, 3])
def test_prefix_layer_forward_equals_a_truncated_model(target4, k):
    small = _truncated(target4, k)
    tokens = torch.tensor([[3, 17, 200, 9, 41, 77, 5]])
    with torch.inference_mode():
        torch.testing.assert_close(target4(tokens, num_layers=k), small(tokens), rtol=1e-5, atol=1e-5)
        # cached: only the first k layers of the big cache are written, with the truncated model's K/V
        big, ref = target4.new_cache(16), small.new_cache(16)
        for layer in big.layers[k:]:
            layer.k.fill_(7.0)
        idx = torch.arange(7)
        mask = causal_tree_mask(7)
        a = target4(tokens, idx, cache=big, cache_slots=idx, prefix_len=0, tree_mask=mask, backend="torch",
                    num_layers=k)
        b = small(tokens, idx, cache=ref, cache_slots=idx, prefix_len=0, tree_mask=mask, backend="torch")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for i in range(k):
        torch.testing.assert_close(big[i].k, ref[i].k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(big[i].v, ref[i].v, rtol=1e-5, atol=1e-5)
    assert all(bool((layer.k == 7.0).all()) and bool((layer.v == 0).all()) for layer in big.layers[k:])


def test_full_forward_is_num_layers_none(target4):
    tokens = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        assert torch.equal(target4(tokens), target4(tokens, num_layers=None))
        assert torch.equal(target4(tokens), target4(tokens, num_layers=4))
    for bad in (0, 5, True, 1.0):
        with pytest.raises(ValueError, match="num_layers"):
            target4(tokens, num_layers=bad)


# ---------------------------------------------------------------------------------------------- the drafter


def test_registry_and_protocol(target4):
    kind = DRAFTERS["self"]
    assert (kind.cost_model, kind.loads_model, kind.has_probs) == ("per-level", False, True)
    d = kind.build(parse_drafter_spec("self:2"), target4, None)
    assert isinstance(d, LayerSkipDrafter) and d.num_layers == 2
    assert d.cost_model == "per-level" and d.has_probs and d.context == CFG4.max_position_embeddings
    assert d.vocab_size == CFG4.vocab_size and d.device == target4.device and d.cache is None


@pytest.mark.parametrize("bad", [0, -1, 4, 5, True, 1.5, "2"])
def test_bad_num_layers_is_refused_naming_L_and_n_layers(target4, bad):
    with pytest.raises(DecodingError, match=r"L in 1\.\.3 \(the target has n_layers = 4.*got L = ") as err:
        LayerSkipDrafter(target4, bad)
    assert "\n" not in str(err.value)


def test_a_one_layer_target_has_no_valid_L():
    with pytest.raises(DecodingError, match="n_layers = 1"):
        LayerSkipDrafter(_model(5, CFG.with_(n_layers=1)), 1)


def test_drafter_must_serve_its_own_target_once(target4):
    d = LayerSkipDrafter(target4, 2)
    with pytest.raises(DecodingError, match="same target"):
        SpeculativeDecoder(_model(1, CFG4), d, Tree.chain(2))
    SpeculativeDecoder(target4, d, Tree.chain(2))
    with pytest.raises(DecodingError, match="already serves"):
        SpeculativeDecoder(target4, d, Tree.chain(2))


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("tree_name", ["chain", "wide", "sequoia", "budget1"])
def test_greedy_equals_plain_decoding(target4, k, tree_name):
    dec = SpeculativeDecoder(target4, LayerSkipDrafter(target4, k), TREES[tree_name], backend="torch")
    assert dec.target_cache is dec.policy.drafter.cache  # shared, nothing allocated for the draft
    accepted = 0
    for prompt in PROMPTS:
        ref = autoregressive_generate(target4, prompt, 20).tokens
        state = dec.start(prompt, 20)
        while not state.finished:
            stats = dec.step(state).rows[0]
            accepted += stats.accepted_nodes
            if not state.finished:
                assert dec.policy.drafter.cached == state.cached  # the drafter's count is the target's
        assert state.result.tokens == ref, (k, tree_name, prompt)
    if tree_name != "budget1":
        assert accepted > 0  # the draft is not useless: some of its candidates were accepted


def test_greedy_with_all_but_one_layer_accepts_most(target4):
    """With the damped last layer, the 3-layer draft nearly is the target: most nodes are accepted."""
    dec = SpeculativeDecoder(target4, LayerSkipDrafter(target4, 3), Tree.chain(4))
    res = dec.generate(PROMPTS[2], 30)
    assert res.tokens == autoregressive_generate(target4, PROMPTS[2], 30).tokens
    assert len(res.steps) < 20


@pytest.mark.parametrize("tree_name", ["sequoia", "chain12"])
def test_greedy_near_the_context_end_equals_plain_decoding(target4, tree_name):
    tgt = _with_context(target4, 64)
    tree = Tree.chain(12) if tree_name == "chain12" else SEQUOIA_LIKE
    dec = SpeculativeDecoder(tgt, LayerSkipDrafter(tgt, 2), tree, backend="torch")
    rng = np.random.default_rng(1)
    clipped = 0
    for P in range(58, 64):
        prompt = rng.integers(0, CFG.vocab_size, size=P).tolist()
        ref = autoregressive_generate(tgt, prompt, 64 - P).tokens
        for M in (1, 64 - P):
            res = dec.generate(prompt, M)
            assert res.tokens == ref[:M], (P, M)
            clipped += sum(s.tree_depth < tree.tree_depth for s in res.steps)
    assert clipped > 0


def test_greedy_with_a_short_cache_equals_plain_decoding(target4):
    """max_len barely above the request: the shared cache clips the tree like the target's own limit."""
    prompt, M = PROMPTS[3], 14
    dec = SpeculativeDecoder(target4, LayerSkipDrafter(target4, 2), SEQUOIA_LIKE, max_len=len(prompt) + M)
    assert dec.generate(prompt, M).tokens == AutoregressiveDecoder(target4, max_len=len(prompt) + M).generate(
        prompt, M).tokens


def test_forced_tokens_leave_the_target_cache_as_proposing_does(target4):
    dec = SpeculativeDecoder(target4, LayerSkipDrafter(target4, 2), SEQUOIA_LIKE)
    state = dec.start(PROMPTS[2], 10)
    proposed = draft_one(dec, state)
    snap = [(layer.k.clone(), layer.v.clone()) for layer in dec.target_cache.layers]
    again = draft_one(dec, state, proposed.tokens)
    assert torch.equal(again.tokens, proposed.tokens)
    for (k, v), layer in zip(snap, dec.target_cache.layers):
        assert torch.equal(k, layer.k) and torch.equal(v, layer.v)


# ---------------------------------------------------------------------------------------------- sampling


def _micro4():
    cfg = ModelConfig(vocab_size=5, dim=16, n_layers=3, n_heads=2, n_kv_heads=1, intermediate_size=32,
                      max_position_embeddings=16, name="micro")
    tgt = _model(4, cfg)
    with torch.no_grad():  # sharpen: the first layer's q then differs from p by ~0.2 in total variation
        tgt.lm_head.weight.mul_(3)
    return tgt


@pytest.mark.parametrize("trials", [pytest.param(800, id="fast"),
                                    pytest.param(20_000, id="long", marks=pytest.mark.slow)])
def test_sampling_first_token_follows_the_target(trials):
    """Over independent steps from one state, the first emitted token follows the target's sampling law
    p(. | prompt) (computed exactly); the draft's q differs from it (so acceptance and residual both run)."""
    tgt = _micro4()
    prompt, T, top_p = [2, 4, 1], 1.0, 0.95
    with torch.inference_mode():
        p1 = process_logits(tgt(torch.tensor([prompt]))[0, -1], T, top_p)  # (5,)
        q1 = process_logits(tgt(torch.tensor([prompt]), num_layers=1)[0, -1], T, top_p)
    assert 0.5 * (p1 - q1).abs().sum() > 0.1
    tree = Tree.from_choices([[0], [1], [0, 0]])
    dec = SpeculativeDecoder(tgt, LayerSkipDrafter(tgt, 1), tree, temperature=T, top_p=top_p,
                             generator=torch.Generator().manual_seed(0))
    state = dec.start(prompt, 4)
    first = torch.zeros(5)
    with torch.inference_mode():
        for _ in range(trials):
            drafted = draft_one(dec, state)
            first[dec.accept(drafted, verify_one(dec, state, drafted)).tokens[0]] += 1
    tv = 0.5 * (first / trials - p1).abs().sum().item()
    # sampling noise over 5 tokens: ~0.03 at 800 trials (catches wiring errors: TV(p, q) is ~0.2), ~0.006 at
    # 20k (the slow run, about 2 minutes on a loaded 2-core CPU)
    assert tv < (0.1 if trials < 10_000 else 0.01), tv
