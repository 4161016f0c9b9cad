"""Pair profiles (the strong drafter's acceptance given the light drafter's candidates) and the graft
scheduler's offline value and training."""

from __future__ import annotations

import numpy as np
import pytest
from test_decoding import PROMPTS, _model, _perturbed

from sequoia_opt.drafting import ModelDrafter
from sequoia_opt.drafting.policies import GraftFeatures
from sequoia_opt.errors import ProfileError
from sequoia_opt.profiles import LatencyCurve
from sequoia_opt.profiling.graft import (NothingToLearn, SchedulerSample, collect_scheduler_samples,
                                         measure_pair_acceptance, pair_measurement_plan, scheduler_value,
                                         train_scheduler)


@pytest.fixture(scope="module")
def target():
    return _model(0)


def test_measurement_plan_shape():
    tree, labels = pair_measurement_plan(2, 3, 2)
    assert tree.size == 11 and tree.tree_depth == 2
    assert tree.choices()[:5] == [[0], [1], [2], [3], [4]]
    assert labels == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1]
    with pytest.raises(ProfileError, match="widths >= 1"):
        pair_measurement_plan(0, 1, 1)


def test_a_strong_drafter_equal_to_the_target_recovers_every_miss(target):
    """The strong drafter is the target itself: whenever the light's A candidates miss the target's greedy
    token, the strong's first grafted candidate is it. So no trial ends with none accepted, and the strong's
    conditional ranks beyond 0 are never accepted."""
    weak = _perturbed(target, 1.0, 3)
    c = measure_pair_acceptance(target, lambda: ModelDrafter(weak), lambda: ModelDrafter(target), PROMPTS,
                                light_width=2, strong_width=2, depth=3, max_new_tokens=16)
    counts = c.counts
    assert c.trials == counts.sum() > 20
    assert counts[4] == 0 and counts[3] == 0  # none accepted; strong rank 1
    assert counts[2] > 0  # the strong's rank 0 recovered some misses
    assert sum(row.sum() for row in c.by_depth.values()) == c.trials
    assert set(c.by_depth) <= {1, 2, 3} and c.by_depth[1].sum() == c.steps  # every step has a root trial
    assert c.tokens >= c.steps and c.strong_ms > 0 and c.light_ms > 0


def _curve(t1=10.0, slope=0.5):
    return LatencyCurve.synthetic({n: t1 + slope * (n - 1) for n in (1, 2, 4, 8, 16, 32)}, {1: 1.0, 32: 2.0},
                                  step_overhead_ms=1.0)


def test_scheduler_value_prices_the_strong_drafter_in_light_only_tokens():
    s = [SchedulerSample((0.5, 0.5, 0.5, 1.0), 3, 1, 4.0, 1.0, 9, 5, 0),
         SchedulerSample((0.5, 0.5, 0.5, 1.0), 1, 1, 4.0, 1.0, 9, 5, 0)]
    value, r = scheduler_value(s, _curve())
    # light-only: tokens (1 + 1) * 2 = 4 over ms 2 * (1 + T(5) + 1) = 2 * 14 = 28
    assert r == pytest.approx(4 / 28)
    cost = 4.0 + (10 + 0.5 * 8) - (10 + 0.5 * 4)  # strong ms + T(9) - T(5)
    assert value.tolist() == pytest.approx([2 - r * cost, 0 - r * cost])


def test_training_learns_when_the_strong_drafter_pays():
    """Synthetic steps: the strong drafter adds 3 tokens when the light drafter is unsure (root confidence
    < 0.5) and none otherwise. The trained scheduler calls exactly on unsure steps and keeps the oracle's
    value (0.96) on held-out prompts."""
    rng = np.random.default_rng(0)
    samples = []
    for i in range(200):
        conf = float(rng.uniform())
        extra = 3 if conf < 0.5 else 0
        samples.append(SchedulerSample((conf, conf, conf, float(rng.uniform(0, 3))), 1 + extra, 1, 2.0, 1.0, 9, 5,
                                       i % 10))
    sched = train_scheduler(samples, _curve(), pair={"target": "t", "light": "a", "strong": "b"})
    assert sched.decide(GraftFeatures(0.1, 0.1, 0.1, 1.0)) and not sched.decide(GraftFeatures(0.9, 0.9, 0.9, 1.0))
    held = sched.card["held_out"]
    # weighted by |value| (2.43 tokens gained vs 0.57 lost here) the boundary leans towards calling
    # (conf ~0.53, not 0.5): a few more calls than the oracle, most of the value kept
    assert held["accuracy"] > 0.9 and held["value_kept"] > 0.95
    assert held["value_always"] < held["value_kept"]  # calling every step would waste the confident steps
    assert sched.card["samples"] == 200 and len(sched.card["held_out_prompts"]) == 3
    # nothing to learn is typed (the graft job ships Always/NeverGraft from .always, not from the message's words)
    with pytest.raises(NothingToLearn, match="too few") as few:
        train_scheduler(samples[:5], _curve(), pair={})
    pays_never = [SchedulerSample(s.features, 1, 1, 2.0, 1.0, 9, 5, s.prompt_index) for s in samples]
    with pytest.raises(NothingToLearn, match="'never' scheduler") as never:
        train_scheduler(pays_never, _curve(), pair={})
    pays_always = [SchedulerSample(s.features, 9, 5, 1.0, 1.0, 1, 1, s.prompt_index) for s in samples]
    with pytest.raises(NothingToLearn, match="'always' scheduler") as always:
        train_scheduler(pays_always, _curve(), pair={})
    assert (few.value.always, never.value.always, always.value.always) == (False, False, True)
    assert isinstance(few.value, ProfileError)


def test_scheduler_samples_record_each_full_step(target):
    from test_graft_policy import LABELS, PLAN

    weak, strong = _perturbed(target, 0.6, 1), _perturbed(target, 0.15, 2)
    samples = collect_scheduler_samples(target, lambda: ModelDrafter(weak), lambda: ModelDrafter(strong), PLAN,
                                        LABELS, PROMPTS, max_new_tokens=16)
    assert len(samples) > 10
    assert all(s.n_full == PLAN.size and s.n_light == 5 for s in samples)
    assert all(0 <= s.accepted_light <= s.accepted_full <= PLAN.tree_depth for s in samples)
    assert any(s.accepted_full > s.accepted_light for s in samples)  # grafted nodes were accepted
    assert {s.prompt_index for s in samples} == set(range(len(PROMPTS)))
