"""Latency per batch size: T(b, n), c(b, w) and the step overhead at batch b, timed exactly as batch 1 is
(:func:`~sequoia_opt.profiling.latency.profile_model`: rounds, medians, forwards paired with the n = 1 forward
of the same batch) but through the batched decoder's forward (b rows of n tokens, a per-row
:class:`~sequoia_opt.attention.RowPrefix`; :mod:`sequoia_opt.decoding.rows`).

Why per batch: at batch b a tree of n nodes feeds the target b x n tokens, so the curve that decides the
budget (Sequoia, Chen et al. 2024, section 4.2) is T(b, n) against n, which bends up at a smaller n the
larger b is; the tree that is best at batch 1 is too big at batch 32.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Sequence

import torch

from ..model import Transformer
from ..profiles.batch import BatchLatencyProfile
from ..tree import Tree, now_iso
from .latency import (GridSweep, ProgressFn, ProgressTally, build_latency_profile, interleave_rounds,
                      model_sweep)

__all__ = ["measure_batch_overhead", "profile_batches", "OVERHEAD_TREE", "request_contexts", "row_contexts"]

#: The tree the per-step overhead is measured with (the batch-1 default of measure_step_overhead).
OVERHEAD_TREE = Tree.from_choices([[0], [1], [2], [3], [0, 0], [0, 1], [0, 0, 0], [0, 0, 0, 0]])


def request_contexts(prompt_lengths: Sequence[int], new_tokens: int) -> list[int]:
    """The contexts (tokens) the steps of requests read: each prompt of ``prompt_lengths`` at every stage of an
    answer of ``new_tokens`` tokens (the step of its j-th token reads the prompt and j - 1 answer tokens). Under
    continuous batching a live row is at any stage of any request, so these are what a row's context is drawn from
    (:func:`row_contexts`).

    Raises:
        ValueError: no prompt, a negative length, or ``new_tokens`` < 1.
    """
    lengths = [int(x) for x in prompt_lengths]
    if not lengths or min(lengths) < 0 or int(new_tokens) < 1:
        raise ValueError(f"need prompt lengths >= 0 and new_tokens >= 1, got {len(lengths)} prompts, "
                         f"new_tokens {new_tokens}")
    return [p + j for p in lengths for j in range(int(new_tokens))]


def row_contexts(context: int, batch: int, requests: Sequence[int] | None) -> list[int]:
    """The contexts (tokens, ascending) of the ``batch`` rows T(b, n) is timed on at ``context``: the expected
    order statistics of ``batch`` rows drawn from ``requests`` (the contexts requests read,
    :func:`request_contexts`), shifted so that their mean is ``context``; every row at ``context`` when
    ``requests`` is None or b = 1.

    Why. treeopt's batched decoder keeps rows of different lengths in one padded cache
    (:mod:`sequoia_opt.decoding.rows`): every forward attends over the shared frontier F, the longest row, so a step
    at b rows reads b x F slots however short the other rows are. Timed with every row at the requests' mean
    context, T(b, n) prices a batch whose longest row is the mean; a served batch's longest row grows with b. On the
    editing workload's requests (prompts of 87-182 tokens, 16-token answers, mean context 128) the served frontier
    averaged 139, 158 and 188 slots at 4, 8 and 16 rows of plain decoding, and the plain step at 16 rows (demo
    target, 1 thread) took 52.7 ms with a frontier of 199 against 48.4 ms at 143; the schedules benchmark's
    prediction at 16 rows came out 13-15 % fast in two runs while batch 8 was exact. The expected longest of b rows
    is E[X_(b:b)], and the expected order statistics sum to b times the mean, so the rows keep the mean at
    ``context`` (what the cost model's context means) and their longest is the frontier a batch of b meets. A paged
    KV cache (vLLM, SGLang) reads each row's own length, which the mean already prices; this is the padded layout's
    cost.

    E[X_(i:b)] = x_0 + sum_k (x_{k+1} - x_k) P(X_(i:b) > x_k), with P(X_(i:b) <= x) = P(Binomial(b, F(x)) >= i) and F
    the empirical distribution of ``requests`` (David and Nagaraja, Order Statistics, 3rd ed., section 2.1). The rows
    are rounded to whole tokens summing to b x ``context``; where ``context`` lies so far below the requests' mean that
    the shortest row would fall under one token, the spread is narrowed around ``context`` instead. The frontier may
    also run up to :data:`~sequoia_opt.decoding.rows.REPACK_WASTE` past the longest row between repacks (rows
    accepting different lengths): that slack is not timed.

    Raises:
        ValueError: ``batch`` < 1, ``context`` < 0, or an empty ``requests``.
    """
    import math

    import numpy as np

    if int(batch) < 1 or int(context) < 0:
        raise ValueError(f"need batch >= 1 and context >= 0, got batch {batch}, context {context}")
    b = int(batch)
    if requests is None or b == 1:
        return [int(context)] * b
    xs = np.asarray(sorted(int(x) for x in requests), dtype=np.float64)
    if xs.size == 0:
        raise ValueError("row_contexts needs at least one request context")
    values, counts = np.unique(xs, return_counts=True)
    cdf = np.cumsum(counts) / xs.size  # F(x_k)
    j = np.arange(b + 1)
    log_comb = np.array([math.lgamma(b + 1) - math.lgamma(k + 1) - math.lgamma(b - k + 1) for k in j])
    expected = np.full(b, values[0])
    for k in range(values.size - 1):  # P(X_(i:b) > x_k) = P(Binomial(b, F(x_k)) < i), i = 1..b
        f = min(max(float(cdf[k]), 1e-300), 1.0 - 1e-16)
        pmf = np.exp(log_comb + j * math.log(f) + (b - j) * math.log1p(-f))
        below = np.cumsum(pmf)[:b]  # P(Binomial <= i - 1) for i = 1..b
        expected += (values[k + 1] - values[k]) * below
    # shifted to mean ``context``; where that would take the shortest row below one token (zero at context 0), the
    # spread is narrowed around the mean instead of clipped, so the rows' mean stays ``context``
    floor = min(1, int(context))
    below = xs.mean() - expected[0]
    scale = 1.0 if below <= 0 or int(context) - below >= floor else (int(context) - floor) / below
    rows = int(context) + scale * (expected - xs.mean())
    return _round_keeping_sum(rows, b * int(context))


def _round_keeping_sum(xs: Any, total: int) -> list[int]:
    """``xs`` (ascending reals whose sum is ``total`` up to float error) rounded to integers summing to ``total``:
    each floored, then one more token to the largest remainders (Hamilton's method), the order kept."""
    import numpy as np

    xs = np.asarray(xs, dtype=np.float64)
    out = np.floor(xs + 1e-9).astype(np.int64)
    left = int(total) - int(out.sum())
    if left > 0:  # ties go to the later (longer) rows, so the result stays ascending
        order = sorted(range(len(xs)), key=lambda i: (xs[i] - out[i], i), reverse=True)
        for i in order[:left]:
            out[i] += 1
    return [int(x) for x in out]


@torch.inference_mode()
def measure_batch_overhead(target: Transformer, draft: Transformer | None, batch: int, *, tree: Tree | None = None,
                           prompt_len: int = 32, steps: int = 16, seed: int = 0) -> float:
    """The loop's fixed per-step cost outside the model forwards at batch ``batch`` (ms): greedy verification of
    every row, KV compaction of both caches, stop checks (``BatchStep.bookkeeping_ms``), median over ``steps``
    steps of random prompts of ``prompt_len`` tokens (plain decoding without a draft)."""
    from ..decoding import Decoder
    from ..drafting.policies import StaticTreePolicy

    tree = Tree.chain(1) if draft is None else tree or OVERHEAD_TREE
    gen = torch.Generator(device="cpu").manual_seed(seed)
    prompts = [torch.randint(0, target.config.vocab_size, (prompt_len,), generator=gen).tolist() for _ in range(batch)]
    policy = StaticTreePolicy(draft, tree, cut_at_answer_end=False) if draft is not None else None
    dec = Decoder(target, policy, max_len=prompt_len + steps * tree.size + tree.size + 1, max_batch=batch)
    res = dec.generate_batch(prompts, steps)
    return float(statistics.median(s.bookkeeping_ms for s in res.steps)) if res.steps else 0.0


class _Recorded:
    """A :class:`GridSweep` whose rounds count their attention calls into ``record`` and report to a part of
    ``tally``: the per-batch-size backend record of :func:`profile_batches`, whose rounds interleave."""

    def __init__(self, sweep: GridSweep, record: Any, tally: ProgressTally):
        self.sweep, self.record = sweep, record
        sweep.progress = tally.part(sweep.total)

    @property
    def done(self) -> bool:
        return self.sweep.done

    def run_round(self) -> None:
        from ..attention import record_backends

        with record_backends() as rec:
            self.sweep.run_round()
        self.record.ran.update(rec.ran)
        self.record.refused.update(rec.refused)


def profile_batches(target: Transformer, draft: Transformer | None, batches: Sequence[int],
                    token_counts: Sequence[int], draft_counts: Sequence[int], contexts: Sequence[int], *,
                    target_name: str, draft_name: str | None, profile_id: str, device: torch.device,
                    dtype: torch.dtype, random_weights: bool = False, method: str | None = None,
                    progress: ProgressFn | None = None, rounds: int = 1, paired: bool = False,
                    command: str = "treeopt profile latency --batch", loop: str | None = None,
                    loop_drafter: Callable[[], object] | None = None, draft_probe: Any = None,
                    draft_cost_model: str = "per-level", requests: Sequence[int] | None = None,
                    **timing_kw) -> BatchLatencyProfile:
    """Measure T(b, n) at every batch b, n in ``token_counts`` (tokens per row), c(b, w) of the draft model
    (w in ``draft_counts``) and the step overhead at b. Returns a :class:`BatchLatencyProfile`.

    A drafter without a draft model (``draft`` None) whose cost is a model forward (a feature head's level or
    pass, self layer-skip's first L layers: its :class:`~sequoia_opt.drafting.registry.CostProbe` with a model,
    ``draft_probe``) has c(b, w) timed on that probe at b rows, in its ``draft_cost_model``; without one (n-grams)
    drafting is priced by the loop's timed step alone.

    With ``loop`` (``"chain"`` or ``"static"``, the probe's shape) and a drafter, every batch size's curve also
    records the decoding loop's own step at b rows (:func:`~sequoia_opt.profiling.steps.time_loop` with ``rows=b``:
    verify with the logits handed to acceptance, bookkeeping, the draft beyond c(b, w)), which the cost model then
    charges as at batch 1 (issue 31): T(b, n) timed alone leaves out per-row work that grows with b. The drafter is
    the draft model, or ``loop_drafter`` (a function making a fresh drafter, e.g. ``ModelPair.new_drafter``) where
    there is none, at the batch sizes it serves (``max_rows``); without a draft model the steps run on
    :func:`~sequoia_opt.profiling.steps.repeating_prompts`, text that copies itself, where the target accepts what
    n-grams draft and each step commits whole chains, as on the requests n-grams pay on.

    ``requests`` (the contexts requests read, :func:`request_contexts`): at batch b the b rows of every forward and
    loop step hold contexts spread as a batch of those requests' would (:func:`row_contexts`: mean ``context``,
    the longest the frontier such a batch attends over), recorded as each curve's row contexts; None: every row
    at ``context``.

    The batch sizes are timed in turn, round by round (:func:`~sequoia_opt.profiling.latency.interleave_rounds`):
    round r of T(b, n), c(b, w) and the loop's step at every b before round r + 1 of any, so a slow spell of a
    shared machine lands on every batch size, and on the forwards and the loop's steps, alike: the levels of the
    curves keep their order (:class:`~sequoia_opt.profiling.latency.GridSweep` says what timing them one after the
    other did). The loop's extra rounds (sizes whose step ratio is not yet known) interleave too. ``progress`` counts
    every sweep's points together.

    Raises ProfileError as :func:`profile_model` (empty grid, context past the model's).
    """
    from ..attention import BackendRecord

    batches = list(dict.fromkeys(int(b) for b in batches))
    tally = ProgressTally(progress)
    att = {b: {"target": BackendRecord(), "draft": BackendRecord()} for b in batches}  # per batch size and model
    grids: dict[int, tuple[GridSweep, GridSweep | None]] = {}
    loops: dict[int, list] = {}
    sweeps: list = []  # round r of every batch size's target, draft and loop in turn: interleave_rounds
    if loop is not None:
        from .steps import LOOP_MAX_ROUNDS, LoopSweep, random_prompts, repeating_prompts, static_loop_decoders

        V = target.config.vocab_size
        copies = draft is None  # n-grams (or a head): text that repeats, whose drafts the target accepts
    spread = {b: {int(c): row_contexts(int(c), b, requests) for c in contexts} for b in batches}  # b -> context -> rows
    for b in batches:
        at = spread[b].__getitem__
        tt = model_sweep(target, token_counts, contexts, what=f"target (batch {b})", rounds=rounds, paired=paired,
                         rows=b, row_contexts=at, **timing_kw)
        dt = None
        if draft is not None:
            dt = model_sweep(draft, draft_counts, contexts, what=f"draft (batch {b})", rounds=rounds, paired=paired,
                             rows=b, row_contexts=at, **timing_kw)
        elif draft_probe is not None and draft_probe.model is not None:
            dt = model_sweep(draft_probe.model, draft_counts, contexts, what=f"{draft_probe.label} (batch {b})",
                             rounds=rounds, paired=paired, rows=b, num_layers=draft_probe.num_layers, row_contexts=at,
                             **timing_kw)
        grids[b] = (tt, dt)
        sweeps += [_Recorded(tt, att[b]["target"], tally)] + ([_Recorded(dt, att[b]["draft"], tally)] if dt else [])
        drafter = draft if draft is not None else loop_drafter
        if loop is None or drafter is None or (draft is None and getattr(drafter(), "max_rows", 1) < b):
            continue  # a drafter serving fewer rows (self layer-skip: one) has no step at b rows to time
        # a row may accept a whole chain each step on text that repeats: room for every step's n tokens
        longest = max(max(r) for r in spread[b].values()) + (16 if copies else 2) * max(token_counts) + 16
        make = static_loop_decoders(target, drafter, max_len=longest, max_batch=b, policy=loop)
        loops[b] = [LoopSweep(make, token_counts, int(c), V, policy=loop, rounds=max(1, min(int(rounds), 2)),
                              max_rounds=LOOP_MAX_ROUNDS, rows=b,
                              prompts=repeating_prompts(b, int(c), V, contexts=spread[b][int(c)]) if copies
                              else random_prompts(spread[b][int(c)], V)) for c in contexts]
        for sw in loops[b]:
            sw.progress = tally.part(sw.total)
        sweeps += loops[b]
    interleave_rounds(sweeps)

    curves = {}
    for b in batches:
        tt, dt = grids[b]
        overhead = measure_batch_overhead(target, draft, b)
        curves[b] = build_latency_profile(
            target_tables=tt.tables(), draft_tables=dt.tables() if dt is not None else None,
            step_overhead_ms=overhead, device=device, dtype=dtype,
            target_name=target_name, target_config=target.config, draft_name=draft_name,
            draft_config=draft.config if draft is not None else None, random_weights=random_weights,
            profile_id=f"{profile_id}@batch{b}", method=method, command=command,
            attention={"requested": "auto", "target": att[b]["target"].as_dict(),
                       "draft": att[b]["draft"].as_dict() if dt is not None else None},
            loop_tables=[sw.table() for sw in loops[b]] if b in loops else None,
            draft_cost_model=draft_cost_model,
            row_contexts=[spread[b][int(c)] for c in contexts] if requests is not None else None)
    seen = {"target": BackendRecord(), "draft": BackendRecord()}  # every batch size's calls, per model
    for role, rec in seen.items():
        for b in batches:
            rec.ran.update(att[b][role].ran)
            rec.refused.update(att[b][role].refused)
    first = curves[min(curves)]
    dev = {**first.device, "attention": {"requested": "auto", "target": seen["target"].as_dict(),
                                         "draft": seen["draft"].as_dict() if draft is not None else None}}
    return BatchLatencyProfile(id=profile_id, curves=curves, device=dev, model=dict(first.model),
                               source=(first.source or "").replace(f"{profile_id}@batch{min(curves)}", profile_id)
                               + f"; batch sizes {','.join(map(str, sorted(curves)))}, tokens per row",
                               date=now_iso())
