"""Intervals between prompts (issue 31): per-prompt counts in acceptance profiles, the cluster bootstrap, the
interval of the mean and the prediction interval for a new prompt set, and their coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sequoia_opt.errors import ProfileError, SolverError
from sequoia_opt.profiles import AcceptanceProfile, load_acceptance, save_acceptance
from sequoia_opt.solver.intervals import (PromptSpread, acceptance_spreads, bootstrap_se, prediction_interval,
                                          ratio_spread, spread_metadata, step_variance, t975, tree_spread,
                                          tree_values)
from sequoia_opt.tree import Tree


def _counts(rng, P: int, D: int = 3, trials: int = 20, spread: float = 8.0, mean_p1: float = 0.5) -> np.ndarray:
    """(P, D, 4) per-prompt counts of K = 3 ranks: each prompt has its own p_1 ~ Beta around ``mean_p1``."""
    out = np.zeros((P, D, 4), dtype=np.int64)
    for i in range(P):
        p1 = rng.beta(spread * mean_p1, spread * (1 - mean_p1)) * 0.8
        probs = [p1, 0.1, 0.05]
        for d in range(D):
            out[i, d] = rng.multinomial(trials, probs + [1 - sum(probs)])
    return out


def _profile(pc: np.ndarray, **extra) -> AcceptanceProfile:
    counts = pc.sum(axis=(0, 1))
    doc = {"format": "treeopt-acceptance/1", "id": "syn", "measured": {"mode": "greedy", "num_prompts": len(pc)},
           "acceptance": (counts[:-1] / counts.sum()).tolist(), "counts": counts.tolist(),
           "counts_by_prompt": pc.tolist(), **extra}
    return AcceptanceProfile.from_dict(doc)


def test_per_prompt_counts_round_trip_and_old_files_still_load(tmp_path):
    pc = _counts(np.random.default_rng(0), 5)
    back = load_acceptance(save_acceptance(tmp_path / "a.yaml", _profile(pc)))
    np.testing.assert_array_equal(back.prompt_counts, pc)
    assert back.num_prompts == 5
    old = AcceptanceProfile.from_dict({"format": "treeopt-acceptance/1", "acceptance": [0.5, 0.1],
                                       "counts": [50, 10, 40]})
    assert old.prompt_counts is None and old.num_prompts is None
    assert tree_spread(Tree.chain(2), old) is None  # no per-prompt counts: no interval, no error
    assert spread_metadata(Tree.chain(2), old) == {}


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.pop("counts"), "needs 'counts'"),
    (lambda d: d["counts_by_prompt"][0][0].__setitem__(0, d["counts_by_prompt"][0][0][0] + 1), "sum to"),
    (lambda d: d["counts_by_prompt"][1].pop(), "the same D for every prompt"),
    (lambda d: d["counts_by_prompt"][0][0].append(1), "K \\+ 1 = 4 integers"),
    (lambda d: d["counts_by_prompt"][0][0].__setitem__(0, -1), "must be an integer >= 0"),
    (lambda d: d["measured"].__setitem__("num_prompts", 9), "holds 4 prompts"),
    (lambda d: d.__setitem__("acceptance_by_depth", {1: [0.9, 0.0, 0.0]}), "acceptance_by_depth\\[1\\] disagrees"),
])
def test_bad_per_prompt_counts_are_one_line_errors(edit, match):
    pc = _counts(np.random.default_rng(1), 4)
    d = _profile(pc).to_dict()
    edit(d)
    with pytest.raises(ProfileError, match=match):
        AcceptanceProfile.from_dict(d)


def test_tree_values_match_the_solvers_G_under_both_models():
    rng = np.random.default_rng(2)
    tree = Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]])
    p = np.array([0.5, 0.2, 0.1])
    assert tree_values(tree, p[None, None, :])[0] == pytest.approx(tree.expected_tokens(p))
    from sequoia_opt.solver.depth import expected_tokens_by_depth

    rows = rng.uniform(0, 0.3, size=(2, 3))
    assert tree_values(tree, rows[None])[0] == pytest.approx(expected_tokens_by_depth(tree, rows))


def test_the_point_is_the_profiles_own_figure_and_intervals_nest():
    prof = _profile(_counts(np.random.default_rng(3), 24))
    tree = Tree.chain(3)
    g = tree_spread(tree, prof)
    assert g.point == pytest.approx(tree.expected_tokens(prof.acceptance))
    assert g.prompts == 24 and g.replicates == 1000 and g.se > 0
    mlo, mhi = g.mean_interval()
    lo, hi = g.prediction_interval(24)
    assert lo < mlo < g.point < mhi < hi
    assert (hi - lo) / (mhi - mlo) == pytest.approx(math.sqrt(2), rel=1e-9)  # sqrt(1/P + 1/P) / sqrt(1/P)
    assert g.prediction_interval(4)[1] - g.prediction_interval(4)[0] > hi - lo  # fewer prompts: wider
    back = PromptSpread.from_dict(g.to_dict(8), (1.0, None))
    assert back.prediction_interval(8) == pytest.approx(g.prediction_interval(8))


def test_bootstrap_se_matches_the_spread_between_prompt_sets():
    """The bootstrap's standard error from one set of 30 prompts estimates how the figure varies between sets of
    30 prompts drawn from the same population (checked against 400 simulated sets)."""
    rng = np.random.default_rng(4)
    tree = Tree.chain(3)
    prof = _profile(_counts(rng, 30))
    se = tree_spread(tree, prof).se
    sims = []
    for _ in range(400):
        other = _profile(_counts(rng, 30))
        sims.append(tree.expected_tokens(other.acceptance))
    assert se == pytest.approx(float(np.std(sims)), rel=0.3)


@pytest.mark.parametrize("P", [3, 5, 20])
def test_bootstrap_se_of_a_mean_is_the_textbook_standard_error(P):
    """For a plain mean over prompts (every denominator 1) the corrected bootstrap se equals s / sqrt(P) with the
    unbiased s; the plug-in replicates alone are sqrt((P - 1) / P) of it (18 % narrow at 3 prompts)."""
    rng = np.random.default_rng(P)
    y = rng.normal(2.0, 0.4, size=P)
    sp = ratio_spread(y, np.ones(P), replicates=40000, seed=1)
    textbook = float(np.std(y, ddof=1)) / math.sqrt(P)
    assert sp.point == pytest.approx(y.mean())
    assert sp.se == pytest.approx(textbook, rel=0.02)
    assert bootstrap_se(np.array([1.0, 3.0]), 2) == pytest.approx(2.0)  # sd sqrt(2), times sqrt(2 / 1)
    both = bootstrap_se(np.array([[1.0, 0.0], [3.0, 0.0]]), 2)  # (B, F): one se per figure
    assert isinstance(both, np.ndarray) and both.tolist() == pytest.approx([2.0, 0.0])
    with pytest.raises(SolverError, match="at least 2 prompts"):
        bootstrap_se(np.array([1.0, 2.0]), 1)


def test_prediction_interval_covers_new_prompt_sets_and_the_token_interval_does_not():
    """Coverage: with prompts that differ (p_1 varies between them), the prediction interval from a profile of 24
    prompts holds the figure measured on a new set of 24 in about 95 of 100 cases; the Wilson interval of the tokens
    (every trial counted as independent) in far fewer."""
    rng = np.random.default_rng(5)
    tree = Tree.chain(2)
    inside = token_inside = 0
    n = 120
    for _ in range(n):
        prof = _profile(_counts(rng, 24, spread=4.0))
        new = _profile(_counts(rng, 24, spread=4.0))
        lo, hi = tree_spread(tree, prof, replicates=300).prediction_interval(24)
        g_new = tree.expected_tokens(new.acceptance)
        inside += lo <= g_new <= hi
        ci = prof.confidence_interval()
        token_inside += tree.expected_tokens(ci[:, 0]) <= g_new <= tree.expected_tokens(ci[:, 1])
    assert inside / n >= 0.88
    assert token_inside / n < 0.6


def test_acceptance_spreads_and_prompts_needed():
    prof = _profile(_counts(np.random.default_rng(6), 20))
    sp = acceptance_spreads(prof)
    assert len(sp) == 4  # p_1..p_3 and the mass
    assert sp[0].point == pytest.approx(prof.acceptance[0]) and sp[-1].point == pytest.approx(prof.acceptance.sum())
    need = sp[0].prompts_needed(0.05)
    # the interval of the mean those prompts will report is at most 0.05 wide (the same sd, their own t), and
    # one prompt fewer would not do
    assert 2 * t975(need - 1) * sp[0].sd / math.sqrt(need) <= 0.05 + 1e-12
    assert 2 * t975(need - 2) * sp[0].sd / math.sqrt(need - 1) > 0.05
    # a tryout's 4-prompt profile: sd 0.099 between prompts asked 158 prompts (t(3) = 3.18, this profile's) where
    # 61 give the 0.05 interval (t(60) ~ 1.96)
    from sequoia_opt.solver.intervals import PromptSpread

    four = PromptSpread(0.5, 0.099 / 2, 4)
    assert four.prompts_needed(0.05) == 61 and 2 * t975(60) * 0.099 / math.sqrt(61) <= 0.05
    assert PromptSpread(0.5, 0.0, 4).prompts_needed(0.05) == 2  # no spread: any two
    with pytest.raises(SolverError, match="positive"):
        sp[0].prompts_needed(0)


def test_prediction_interval_function_refuses_too_few_prompts():
    with pytest.raises(SolverError, match="at least 2 prompts"):
        prediction_interval(2.0, 0.1, 1, 5)
    with pytest.raises(SolverError, match="at least 1 prompt"):
        prediction_interval(2.0, 0.1, 5, 0)
    assert prediction_interval(1.05, 0.1, 10, 10, clip=(1.0, None))[0] == 1.0
    assert t975(1) == 12.706 and t975(1000) == pytest.approx(1.96, abs=1e-3)


def test_by_depth_spread_resamples_the_depth_rows():
    rng = np.random.default_rng(7)
    pc = _counts(rng, 12)
    pc[:, 0, 0] += 15  # depth 1 accepts far more than depths 2 and 3: a failed positional check
    counts = pc.sum(axis=(0, 1))
    per_depth = pc.sum(axis=0)
    prof = _profile(pc, acceptance_by_depth={d + 1: (per_depth[d, :-1] / per_depth[d].sum()).tolist()
                                             for d in range(3)})
    prof.measured["positional_consistent"] = False
    tree = Tree.chain(3)
    from sequoia_opt.solver.depth import expected_tokens_by_depth

    g = tree_spread(tree, prof)  # auto: by-depth
    assert g.point == pytest.approx(expected_tokens_by_depth(tree, prof.depth_rows()))
    assert g.point != pytest.approx(tree.expected_tokens(prof.acceptance))
    assert tree_spread(tree, prof, model="positional").point == pytest.approx(tree.expected_tokens(counts[:-1]
                                                                                                  / counts.sum()))


def test_a_trees_tokens_per_step_interval_stays_within_what_a_step_can_emit():
    """A tryout read 'predicted 2.211, 95% PI 1.000 to 3.475' for a depth-2 tree: a step emits at most 3 tokens.
    The spread of a tree's G is clipped to [1, D + 1], for any number of new prompts."""
    prof = _profile(_counts(np.random.default_rng(1), 3, trials=4, spread=1.0, mean_p1=0.9))  # 3 prompts: wide
    tree = Tree.chain(2)  # depth 1: at most 2 tokens a step
    g = tree_spread(tree, prof)
    assert g.clip == (1.0, 2.0)
    raw = prediction_interval(g.point, g.se, g.prompts, 1)  # the unclipped interval runs past both ends
    assert raw[0] < 1.0 and raw[1] > 2.0
    assert g.prediction_interval(1) == (1.0, 2.0)


def test_the_step_variance_of_a_tree_is_its_tokens_per_step_variance():
    p = 0.6
    assert step_variance(Tree.chain(2), np.array([[p, 0.2]])) == pytest.approx(p * (1 - p))  # X in {1, 2}
    # a chain of 2 drafts: X = 1, 2, 3 with 1 - p, p (1 - p), p^2; exact against the distribution
    x = np.array([1.0, 2.0, 3.0])
    w = np.array([1 - p, p * (1 - p), p * p])
    assert step_variance(Tree.chain(3), np.array([[p]])) == pytest.approx((w * x * x).sum() - (w * x).sum() ** 2)
    assert step_variance(Tree.chain(1), np.array([[p]])) == 0.0  # the root alone emits 1 token every step


def test_the_prediction_interval_widens_for_prompts_of_fewer_steps_than_the_profiles():
    """A fidelity tryout: the spread between prompts a profile measures holds step noise averaged over its own
    ~38 steps per prompt; a run of 12-token answers (about 8 steps each) had 2.3-3.2 times that spread and fell
    outside the interval in up to half of its prompt sets. The interval now rescales the step noise to the run's
    steps per prompt, and never narrows below the profile's."""
    rng = np.random.default_rng(3)
    prof = _profile(_counts(rng, 12, trials=40))
    sp = tree_spread(Tree.chain(3), prof)
    assert sp.steps_per_prompt == pytest.approx(40.0)
    assert sp.step_variance == pytest.approx(step_variance(Tree.chain(3), np.array([prof.acceptance])))
    base = sp.prediction_interval(24)
    assert sp.prediction_interval(24, steps_per_prompt=80.0) == base  # more steps than the profile: as before
    lo, hi = sp.prediction_interval(24, steps_per_prompt=8.0)
    t = t975(sp.prompts - 1)
    want = t * math.sqrt(sp.se ** 2 + (sp.sd ** 2 + sp.step_variance * (1 / 8 - 1 / 40)) / 24)
    assert (hi - lo) / 2 == pytest.approx(want) and hi - lo > base[1] - base[0]
    back = PromptSpread.from_dict(sp.to_dict(24), sp.clip)  # the tree file carries both
    assert (back.step_variance, back.steps_per_prompt) == (pytest.approx(sp.step_variance), pytest.approx(40.0))
    assert back.prediction_interval(24, 8.0) == pytest.approx((lo, hi))
    old = {k: v for k, v in sp.to_dict(24).items() if k not in ("step_variance", "steps_per_prompt")}
    assert PromptSpread.from_dict(old, sp.clip).prediction_interval(24, 8.0) == pytest.approx(base)  # older file
    speed = sp.scaled(1.5)
    assert speed.prediction_interval(24, 8.0)[1] - speed.prediction_interval(24, 8.0)[0] == pytest.approx(1.5 * (hi - lo))
