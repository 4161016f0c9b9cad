"""Chains: speculation of a fixed draft length, the setting a chain-verifying engine takes (llama.cpp's
``--spec-draft-n-max/-n-min/-p-min``; vLLM's and TensorRT-LLM's draft lengths). A chain is a tree of width 1: it is
solved by the same exact DP (Sequoia, Chen et al. 2024, section 3.2) with branching 1, through the same
hardware-aware choice; a setting with draft-p-min > 0 is valued by replaying its rule over recorded traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["ChainSetting", "replay_chain", "replay_counts", "replay_step_costs", "predict_replay", "ChainChoice",
           "chain_cost", "solve_chain", "predict_chain"]


@dataclass(frozen=True)
class ChainSetting:
    """llama.cpp's speculative settings for a draft model (``--spec-draft-n-max/-n-min/-p-min``).

    Attributes:
        n_max: draft tokens per step at most (0: no speculation, plain decoding).
        n_min: a step that drafted fewer is run without them.
        p_min: drafting stops at a draft top-1 probability (over its top 10 logits) below this.
    """

    n_max: int
    n_min: int = 0
    p_min: float = 0.0


def replay_chain(traces: Sequence[Sequence[tuple[int, float, bool]]], setting: ChainSetting) -> tuple[float, float, float]:
    """What a chain setting does on recorded traces (:func:`~sequoia_opt.engines.llamacpp.measure_acceptance`), replaying llama.cpp's rule:
    from each position the draft proposes while its top-1 probability is at least ``p_min``, at most ``n_max``
    (fewer than ``n_min``: none); the accepted prefix and the target's token are emitted and the next step
    starts after them. A trace is one prompt's positions, each ``(the draft's top-1 token, its probability
    among the draft's top 10 logits, whether it equals the target's token)``. Returns (tokens per step, drafted
    tokens per step, draft forwards per step)."""
    steps = tokens = drafted = forwards = 0
    for k, j, f in _replay_steps(traces, setting):
        steps += 1
        tokens += j + 1
        drafted += k
        forwards += f
    return tokens / max(1, steps), drafted / max(1, steps), forwards / max(1, steps)


def _replay_steps(traces: Sequence[Sequence[tuple[int, float, bool]]], setting: ChainSetting):
    """Per replayed step (:func:`replay_chain`): (tokens drafted and verified, tokens accepted, draft forwards)."""
    for trace in traces:
        t = 0
        while t < len(trace):
            room = min(setting.n_max, len(trace) - t - 1)  # as generate: the last token is the target's
            k = 0
            while k < room and trace[t + k][1] >= setting.p_min:
                k += 1
            f = 0 if room <= 0 else (k if k == room else k + 1)
            if k < setting.n_min:
                k = 0
            j = 0
            while j < k and trace[t + j][2]:
                j += 1
            yield k, j, f
            t += j + 1


def replay_counts(flags: Sequence[str], k: int, length: int | None = None) -> tuple[list[int], list[int]]:
    """A greedy chain of ``k`` drafts replayed on teacher-forced agreement strings (per prompt, ``1`` where the
    drafter's top-1 equals the target's greedy token; a profile's ``chain_traces``): per prompt, the tokens
    emitted and the steps run. Exact for greedy decoding on those prompts: a drafted token is accepted iff every
    one before it in the step was (then the drafter saw the target's own tokens) and it agrees.

    Args:
        flags: per prompt, a string of ``0`` / ``1``.  k: drafts per step (0: plain decoding).
        length: None: the steady state of long answers, only steps with room for all k drafts (a step near the
            answer's end drafts fewer, as the decoder does, and is left out); an int: answers of at most
            ``length`` tokens (each string cut there), every step.

    Returns:
        (tokens, steps), one entry per prompt (a prompt with no full-room step has 0 and 0 in the steady state).
    """
    tokens, steps = [], []
    full = ChainSetting(k)
    for f in flags:
        trace = [(0, 1.0, c == "1") for c in (f if length is None else f[:length])]
        n = t = 0
        for drafted, j, _ in _replay_steps([trace], full):
            if length is None and drafted < k:
                break  # the end of the answer: this and every later step has less room
            n += 1
            t += j + 1
        tokens.append(t)
        steps.append(n)
    return tokens, steps


def replay_step_costs(flags: Sequence[str], k: int, length: int,
                      step_costs: Sequence[float]) -> tuple[list[int], list[float]]:
    """:func:`replay_counts` over answers of at most ``length`` tokens with each step weighed by its cost: per
    prompt, the tokens emitted and the summed ``step_costs[d]`` of its steps, d the drafts the step verifies.

    An answer cut at ``length`` (its string at least that long) ends as the decoder ends it: a step with n tokens
    left drafts min(k, n - 1) (:meth:`~sequoia_opt.drafting.policies.StaticTreePolicy.step_depth_for`). An answer
    that ended before (an EOS the decoder could not see coming) drafts k at every step.

    Args:
        flags: per prompt, a string of ``0`` / ``1``.  k: drafts per step.  length: the answer length (tokens).
        step_costs: (k + 1,) a step's cost drafting 0 .. k tokens (any unit).

    Raises:
        ValueError: ``step_costs`` without k + 1 entries.
    """
    if len(step_costs) != k + 1:
        raise ValueError(f"a chain of {k} needs {k + 1} step costs (0 .. {k} drafts), got {len(step_costs)}")
    tokens, costs = [], []
    full = ChainSetting(k)
    for f in flags:
        cut = len(f) >= length
        trace = [(0, 1.0, c == "1") for c in f[:length]]
        t, c = 0, 0.0
        for drafted, j, _ in _replay_steps([trace], full):
            t += j + 1
            c += float(step_costs[drafted if cut else k])
        tokens.append(t)
        costs.append(c)
    return tokens, costs


def predict_replay(traces: Sequence[Sequence[tuple[int, float, bool]]], setting: ChainSetting, curve: Any,
                   context: int | None = None):
    """Predicted :class:`~sequoia_opt.solver.hardware.StepCost` of any chain setting (draft-p-min and draft-min
    included) from recorded traces: each replayed step (:func:`replay_chain`) costs its draft forwards at c(1)
    and T(drafted + 1) on ``curve``; the mean step goes through the cost model's
    :func:`~sequoia_opt.solver.hardware.cost_of_step`. The acceptance is the traces' own (runs of agreement
    included), not a positional vector's. With the decoding loop timed in ``curve``, a step costs the loop's
    verify and bookkeeping at its size and c(1) + the loop's extra per draft forward, and its extra once per step
    that drafts."""
    from .hardware import cost_of_step

    n = tok = 0
    draft = target = over = 0.0
    draft_of: dict[int, float] = {}  # a step of f draft forwards of one token: the curve's charge, once per f
    for k, j, f in _replay_steps(traces, setting):
        n += 1
        tok += j + 1
        if f not in draft_of:
            draft_of[f] = curve.step_draft_ms([1] * f, context)
        draft += draft_of[f]
        target += curve.step_target_ms(k + 1, context)
        over += curve.step_overhead(k + 1, context)
    n = max(1, n)
    return cost_of_step(tok / n, draft / n, target / n, curve, context, over / n)


@dataclass
class ChainChoice:
    """The chain solved for llama.cpp: its setting, the predicted step, and every length scored.

    Attributes:
        setting: the best draft length (draft-min 0, draft-p-min 0).  expected_tokens: its tokens per step.
        cost_ms: its step (ms).  tokens_per_s / speedup: 1000 G / cost_ms, and over plain decoding.
        plain_ms_per_token: plain decoding's step (ms; one token a step).
        by_length: per draft length 0..the longest scored, ``{draft_max, expected_tokens_per_step, cost_ms,
            tokens_per_s, speedup}``.
        acceptance_model: the value model G came from (``positional`` or ``by-depth``).
    """

    setting: ChainSetting
    expected_tokens: float
    cost_ms: float
    tokens_per_s: float
    speedup: float
    plain_ms_per_token: float
    by_length: list[dict[str, float]]
    acceptance_model: str


def chain_cost(n: int, g: float, curve: Any, context: int | None = None):
    """:class:`~sequoia_opt.solver.hardware.StepCost` of a chain of n drafted tokens with G tokens per step:
    n draft forwards of 1 token (per-level, every level but the last: the chain's n + 1 nodes), T(n + 1)."""
    from .hardware import step_cost

    return step_cost([1] * (n + 1), g, curve, context)


def solve_chain(acceptance: Any, curve: Any, *, max_draft: int = 16, context: int | None = None,
                acceptance_model: str = "auto") -> ChainChoice:
    """The chain with the most predicted tokens per second on ``curve``: Sequoia's DP with branching 1 (a chain
    is a tree of width 1) under the profile's acceptance model, through the hardware-aware
    :func:`~sequoia_opt.solver.hardware.choose`, draft lengths 0..``max_draft`` (clamped to the curve's
    largest measured target count - 1). Draft-min 0 and draft-p-min 0: a fixed-length chain, the setting
    this cost model values exactly.

    Raises:
        SolverError / ProfileError: as :func:`~sequoia_opt.solver.hardware.choose`.
    """
    from .depth import solve_profile
    from .hardware import choose

    budget = max(1, min(max_draft + 1, curve.max_target_tokens(context)))
    sol, model_used = solve_profile(acceptance, budget, max(1, budget - 1), 1, acceptance_model)
    ch = choose(acceptance.acceptance, curve, budget, max(1, budget - 1), 1, context=context, solution=sol, top=budget)
    rows = []
    for n in range(0, budget):
        g = float(sol.table[n + 1, max(1, n)]) if n > 0 else 1.0
        c = chain_cost(n, g, curve, context)
        rows.append({"draft_max": n, "expected_tokens_per_step": g, "cost_ms": c.cost_ms,
                     "tokens_per_s": c.tokens_per_s, "speedup": c.speedup})
    n_best = ch.tree.size - 1
    return ChainChoice(ChainSetting(n_best, 0, 0.0), ch.expected_tokens, ch.cost_ms, ch.tokens_per_s, ch.speedup,
                       ch.plain_ms_per_token, rows, model_used)


def predict_chain(setting: ChainSetting, acceptance: Any, curve: Any, context: int | None = None,
                  acceptance_model: str = "auto"):
    """Predicted :class:`~sequoia_opt.solver.hardware.StepCost` of a fixed-length chain setting (p-min 0,
    draft-min at most draft-max) under ``acceptance`` and the acceptance model :func:`solve_chain` uses
    (:func:`~sequoia_opt.solver.depth.resolve_acceptance_model`): G = 1 + sum_j prod_{d <= j} p_1(d), p_1 the
    same at every depth (positional) or the profile's per-depth rows; None for a setting this model cannot
    value (p-min > 0)."""
    from .depth import resolve_acceptance_model

    if setting.p_min > 0:
        return None
    used = resolve_acceptance_model(acceptance, acceptance_model)
    rows = acceptance.depth_rows() if used == "by-depth" else acceptance.acceptance[None, :]
    g, reach = 1.0, 1.0
    for d in range(setting.n_max):
        reach *= float(rows[min(d, len(rows) - 1)][0])
        g += reach
    return chain_cost(setting.n_max, g, curve, context)
