"""The interval ``treeopt run`` reports around measured tokens per step."""

import math
import statistics

import pytest

from sequoia_opt.jobs.run import tokens_per_step_ci95


def test_one_prompt_uses_the_normal_interval_over_its_steps():
    lo, hi = tokens_per_step_ci95([[2.0, 3.0, 4.0]])
    half = 1.959963984540054 * 1.0 / math.sqrt(3)  # stdev of 2, 3, 4 is 1
    assert (lo, hi) == pytest.approx((3.0 - half, 3.0 + half))
    # the low end never goes below 1 token per step (every step emits its bonus token)
    lo, hi = tokens_per_step_ci95([[1.0, 3.0]])
    assert lo == 1.0 and hi == pytest.approx(2.0 + 1.959963984540054 * math.sqrt(2) / math.sqrt(2))


def test_two_prompts_use_the_cluster_robust_ratio_interval_with_t_quantile():
    # prompt 0: 4 steps of 1 token (y=4, x=4); prompt 1: 2 steps of 3 tokens (y=6, x=2); G = 10 / 6
    lo, hi = tokens_per_step_ci95([[1, 1, 1, 1], [3, 3]])
    g = 10 / 6
    var = 2 / 1 * ((4 - g * 4) ** 2 + (6 - g * 2) ** 2) / 6**2
    half = 12.706 * math.sqrt(var)  # t, 1 degree of freedom
    assert g - half < 1  # so the low end is clipped at one token per step
    assert lo == 1.0 and hi == pytest.approx(g + half, rel=1e-4)


def test_an_easy_prompt_widens_the_interval_beyond_the_per_step_one():
    # five prompts accepting ~half the time and one that accepts almost everything: the per-step interval
    # treats its 40 long steps as 40 independent draws and is far too narrow
    ordinary = [[1.0, 2.0] * 20 for _ in range(5)]
    easy = [[3.0] * 40]
    groups = ordinary + easy
    steps = [v for g in groups for v in g]
    mean = statistics.fmean(steps)
    per_step_half = 1.959963984540054 * statistics.stdev(steps) / math.sqrt(len(steps))
    lo, hi = tokens_per_step_ci95(groups)
    assert (lo + hi) / 2 == pytest.approx(mean)
    assert (hi - lo) / 2 > 3 * per_step_half
    # the ordinary prompts' own value, 1.5, is rejected by the per-step interval but not over prompts
    assert not mean - per_step_half < 1.5 < mean + per_step_half
    assert lo < 1.5 < hi


def test_prompts_without_steps_are_ignored_and_no_steps_give_nan():
    assert tokens_per_step_ci95([[], [1.0, 2.0, 3.0]]) == tokens_per_step_ci95([[1.0, 2.0, 3.0]])
    lo, hi = tokens_per_step_ci95([[], []])
    assert math.isnan(lo) and math.isnan(hi)
    assert tokens_per_step_ci95([[2.0]]) == (2.0, 2.0)


def test_run_trees_serves_what_the_target_context_allows_with_a_shorter_draft_context():
    """The cache is sized from the target's context: a draft with fewer positions only clips the trees near
    its end (before, max_len was capped at the draft's 40 positions and both decoders refused 45 + 10)."""
    import torch

    from sequoia_opt.decoding import autoregressive_generate
    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.model import ModelConfig, Transformer
    from sequoia_opt.tree import Tree

    cfg = ModelConfig.preset("tiny").with_(max_position_embeddings=64)
    torch.manual_seed(0)
    target = Transformer(cfg).eval()
    draft = Transformer(cfg.with_(max_position_embeddings=40)).eval()
    draft.load_state_dict(target.state_dict())
    prompts = [list(range(3, 48)), list(range(100, 130))]  # 45 and 30 tokens
    entries = [TreeEntry("chain", Tree.chain(5)), TreeEntry("star", Tree.from_choices([[0], [1], [0, 0]]))]
    report = run_trees(target, draft, entries, prompts, max_new_tokens=10, warmup=False)
    assert report.greedy_ok
    plain = [r for r in report.rows if r.tree == "plain"]
    assert [r.new_tokens for r in plain] == [10, 10]
    assert autoregressive_generate(target, prompts[0], 10).tokens  # and plain decoding alone serves it too


def test_run_trees_names_the_prompt_that_overflows_the_context():
    import pytest
    import torch

    from sequoia_opt.errors import DecodingError
    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.model import ModelConfig, Transformer
    from sequoia_opt.tree import Tree

    cfg = ModelConfig.preset("tiny").with_(max_position_embeddings=64, name="tiny64")
    torch.manual_seed(0)
    target = Transformer(cfg).eval()
    prompts = [list(range(3, 13)), list(range(3, 63))]  # 10 and 60 tokens; 60 + 8 > 64
    with pytest.raises(DecodingError, match=r"^prompt 2 of 2 \(60 tokens\): prompt \(60 tokens\) \+ max_new_tokens \(8\) "
                                            r"= 68 tokens exceed the model context: the target model 'tiny64' has "
                                            r"a context of 64 tokens \(max_position_embeddings, or the sliding "
                                            r"attention window where smaller\); shorten the prompt to at most 56 tokens "
                                            r"or ask for at most 4 new tokens$"):
        run_trees(target, target, [TreeEntry("chain", Tree.chain(3))], prompts, max_new_tokens=8, warmup=False)
    from sequoia_opt.profiling.acceptance import measure_acceptance

    with pytest.raises(DecodingError, match=r"^prompt 2 of 2 \(60 tokens\): prompt \(60 tokens\) \+ max_new_tokens"):
        measure_acceptance(target, target, prompts, width=2, depth=2, max_new_tokens=8)  # named as run names it


def test_the_interval_stops_at_the_most_a_step_can_emit():
    """Two prompts of a depth-5 tree read '1.000 to 11.332' tokens per step: a step emits at most depth + 1 = 6."""
    per_prompt = [[6.0, 6.0, 6.0], [1.0]]
    lo, hi = tokens_per_step_ci95(per_prompt)
    assert hi > 6.0  # the cluster-robust interval itself runs past it
    assert tokens_per_step_ci95(per_prompt, most=6) == (lo, 6.0)
    assert tokens_per_step_ci95([[2.0, 3.0]], most=10) == tokens_per_step_ci95([[2.0, 3.0]])


def test_the_interval_stops_at_what_the_generation_lets_a_step_emit():
    """A tryout's run at --max-new-tokens 2 read a 95 % CI of '1.0 to 3.0' tokens per step: a row with 2 tokens to
    go drafts at most 1 level, so no step emits more than 2 (the CI and the prediction interval stop at
    min(D + 1, max_new_tokens))."""
    import torch

    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.model import ModelConfig, Transformer
    from sequoia_opt.tree import Tree, TreeMetadata

    cfg = ModelConfig.preset("tiny").with_(max_position_embeddings=64)
    torch.manual_seed(0)
    target = Transformer(cfg).eval()
    spread = {"point": 3.0, "se": 0.5, "prompts": 4, "replicates": 100, "mean_interval": [2.0, 4.0]}
    meta = TreeMetadata(expected_tokens_per_step=3.0, extra={"tokens_per_step_spread": spread})
    prompts = [list(range(3, 13)), list(range(20, 31)), list(range(40, 49))]
    report = run_trees(target, target, [TreeEntry("chain", Tree.chain(5), meta)], prompts, max_new_tokens=2,
                       warmup=False)  # the target drafts for itself: every node accepted
    s = report.summaries[1]
    assert report.greedy_ok and s.tokens_per_step == 2.0 and s.tps_ci95 == (2.0, 2.0)
    assert s.predicted_interval is not None and s.predicted_interval[1] == 2.0  # not 3 + t x se x ...


def test_run_predicts_plain_steps_past_the_drafts_context():
    """A prompt longer than the draft's context: every step is the root alone, and run predicts it so (1 token per
    step, 1x: a plain step costs a plain step, the whole tree's G / S plain steps) instead of the tree's steady
    state; a prompt the draft sees whole keeps the tree's prediction."""
    import numpy as np
    import torch

    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.model import ModelConfig, Transformer
    from sequoia_opt.profiles import AcceptanceProfile
    from sequoia_opt.solver.depth import ValueModel
    from sequoia_opt.tree import Tree, TreeMetadata

    cfg = ModelConfig.preset("tiny").with_(max_position_embeddings=64)
    torch.manual_seed(0)
    target = Transformer(cfg).eval()
    draft = Transformer(cfg.with_(max_position_embeddings=40)).eval()
    draft.load_state_dict(target.state_dict())
    tree = Tree.chain(3)
    vm = ValueModel.of_profile(AcceptanceProfile(id="a", acceptance=np.array([0.9])), "positional")
    meta = TreeMetadata(expected_tokens_per_step=vm.expected_tokens(tree), predicted_speedup=2.0,
                        extra=vm.run_checks(tree))
    long = run_trees(target, draft, [TreeEntry("chain", tree, meta)], [list(range(3, 48))], max_new_tokens=8,
                     warmup=False)  # 45 prompt tokens, the draft sees 40
    s = long.summaries[1]
    assert long.greedy_ok and s.tokens_per_step == 1.0
    assert s.predicted_tokens_per_step == pytest.approx(1.0) and s.predicted_speedup == pytest.approx(1.0)
    short = run_trees(target, draft, [TreeEntry("chain", tree, meta)], [list(range(3, 13))], max_new_tokens=8,
                      warmup=False)
    assert short.summaries[1].predicted_tokens_per_step > 2.0


def test_an_answer_ending_on_eos_is_measured_as_emitted_as_it_is_predicted():
    """A tryout's answers ended on EOS at the first token: run measured 4.0 tokens/step (accepted nodes + 1, past
    the EOS) against the 1.0 predicted for a 1-token answer, and marked it '(OUT)'. Tokens per step is what the steps
    emitted, as the prediction for the run's lengths is; the untruncated count is kept beside it."""
    import numpy as np
    import torch

    from sequoia_opt.decoding import autoregressive_generate
    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.model import ModelConfig, Transformer
    from sequoia_opt.profiles import AcceptanceProfile
    from sequoia_opt.solver.depth import ValueModel
    from sequoia_opt.tree import Tree, TreeMetadata

    cfg = ModelConfig.preset("tiny").with_(max_position_embeddings=64)
    torch.manual_seed(0)
    target = Transformer(cfg).eval()
    prompt = list(range(3, 13))
    first = autoregressive_generate(target, prompt, 1).tokens[0]
    tree = Tree.chain(4)
    vm = ValueModel.of_profile(AcceptanceProfile(id="a", acceptance=np.array([0.9])), "positional")
    meta = TreeMetadata(expected_tokens_per_step=vm.expected_tokens(tree), extra=vm.run_checks(tree))
    run = run_trees(target, target, [TreeEntry("chain", tree, meta)], [prompt], max_new_tokens=8, eos_ids=[first],
                    warmup=False)  # the target drafts for itself: all 3 nodes accepted, the EOS the first of them
    s, row = run.summaries[1], run.rows[1]
    assert run.greedy_ok and (s.new_tokens, s.steps) == (1, 1)
    assert s.tokens_per_step == row.tokens_per_step == 1.0 and s.tokens_per_step_untruncated == 4.0
    assert row.tokens_per_step_untruncated == 4.0
    assert s.predicted_tokens_per_step == pytest.approx(1.0) and s.inside_prediction is not False


def test_a_greedy_mismatch_in_low_precision_says_what_it_usually_means():
    """A tryout's bfloat16 run differed from plain decoding at two near-ties (top-2 logit gaps 0.04 and 0.017): the
    tree's wider forward rounds differently. The mismatch lines stay; in bfloat16 / float16 one more line says so
    and how to check the decoder (float32 decodes equal)."""
    from types import SimpleNamespace

    from sequoia_opt.cli.run import mismatch_warnings

    details = [{"tree": "tree", "prompt_index": 3, "first_mismatch": 19, "plain": [1, 2], "tree_output": [3, 4]}]
    bf16 = mismatch_warnings(SimpleNamespace(mismatch_details=details, settings={"dtype": "bfloat16"}))
    assert bf16[0] == "tree 'tree' differs from plain decoding on prompt 3 at position 19: plain [1, 2] vs tree [3, 4]"
    assert len(bf16) == 2 and bf16[1].startswith("in bfloat16 a tree's forward") and "--dtype float32" in bf16[1]
    assert mismatch_warnings(SimpleNamespace(mismatch_details=details, settings={"dtype": "float32"})) == bf16[:1]
    assert mismatch_warnings(SimpleNamespace(mismatch_details=[], settings={"dtype": "bfloat16"})) == []


@pytest.mark.parametrize("extra", [
    {"end_overshoot_tokens": 0.6},  # an older file: no node rates (it predicted 0.80x for one token)
    {"end_overshoot_tokens": 0.6, "node_rates": [0.9, 0.9, 0.9]},  # rates of another tree: G 3.44, the file's 2.0
    {"depth_step_ms": [50.0, 49.0, 1e6, 1e6]},  # a dip within 5 % and a typo: shapes only, the point is clamped
])
def test_a_runs_speedup_prediction_lies_between_plain_and_the_steady_state(extra):
    """A review: older files predicted 0.80x for a one-token answer (plain decoding: 1x), rates copied from another
    tree 1.17x, hand-edited costs above the steady state. One token is 1x with no spread; longer answers lie between
    1x and the file's steady speedup."""
    import torch

    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.model import ModelConfig, Transformer
    from sequoia_opt.tree import Tree, TreeMetadata

    cfg = ModelConfig.preset("tiny").with_(max_position_embeddings=64)
    torch.manual_seed(0)
    target = Transformer(cfg).eval()
    spread = {"point": 1.5, "se": 0.1, "prompts": 10}
    meta = TreeMetadata(expected_tokens_per_step=2.0, predicted_speedup=1.5, extra={**extra, "speedup_spread": spread})
    for n, lo, hi in ((1, 1.0, 1.0), (3, 1.0, 1.5), (12, 1.0, 1.5)):
        run = run_trees(target, target, [TreeEntry("chain", Tree.chain(4), meta)], [list(range(3, 13))],
                        max_new_tokens=n, warmup=False)
        s = run.summaries[1]
        assert lo <= s.predicted_speedup <= hi, (n, s.predicted_speedup)
        if n == 1:
            assert s.predicted_speedup == pytest.approx(1.0) and s.predicted_speedup_interval == pytest.approx((1, 1))
