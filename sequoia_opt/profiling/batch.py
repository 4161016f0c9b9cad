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
from .latency import ProgressFn, build_latency_profile, profile_model

__all__ = ["measure_batch_overhead", "profile_batches", "OVERHEAD_TREE"]

#: The tree the per-step overhead is measured with (the batch-1 default of measure_step_overhead).
OVERHEAD_TREE = Tree.from_choices([[0], [1], [2], [3], [0, 0], [0, 1], [0, 0, 0], [0, 0, 0, 0]])


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


def profile_batches(target: Transformer, draft: Transformer | None, batches: Sequence[int],
                    token_counts: Sequence[int], draft_counts: Sequence[int], contexts: Sequence[int], *,
                    target_name: str, draft_name: str | None, profile_id: str, device: torch.device,
                    dtype: torch.dtype, random_weights: bool = False, method: str | None = None,
                    progress: ProgressFn | None = None, rounds: int = 1, paired: bool = False,
                    command: str = "treeopt profile latency --batch", loop: str | None = None,
                    loop_drafter: Callable[[], object] | None = None, draft_probe: Any = None,
                    draft_cost_model: str = "per-level", **timing_kw) -> BatchLatencyProfile:
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

    Raises ProfileError as :func:`profile_model` (empty grid, context past the model's).
    """
    from ..attention import BackendRecord, record_backends

    curves = {}
    seen = {"target": BackendRecord(), "draft": BackendRecord()}  # every batch size's calls, per model
    for b in batches:
        with record_backends() as t_att:
            tt = profile_model(target, token_counts, contexts, what=f"target (batch {b})", progress=progress,
                               rounds=rounds, paired=paired, rows=int(b), **timing_kw)
        dt = None
        with record_backends() as d_att:
            if draft is not None:
                dt = profile_model(draft, draft_counts, contexts, what=f"draft (batch {b})", progress=progress,
                                   rounds=rounds, paired=paired, rows=int(b), **timing_kw)
            elif draft_probe is not None and draft_probe.model is not None:
                dt = profile_model(draft_probe.model, draft_counts, contexts, what=f"{draft_probe.label} (batch {b})",
                                   progress=progress, rounds=rounds, paired=paired, rows=int(b),
                                   num_layers=draft_probe.num_layers, **timing_kw)
        for role, rec in (("target", t_att), ("draft", d_att)):
            seen[role].ran.update(rec.ran)
            seen[role].refused.update(rec.refused)
        overhead = measure_batch_overhead(target, draft, int(b))
        loops = None
        drafter = draft if draft is not None else loop_drafter
        if drafter is not None and draft is None and getattr(drafter(), "max_rows", 1) < int(b):
            drafter = None  # a drafter serving fewer rows (self layer-skip: one) has no step at b rows to time
        if loop is not None and drafter is not None:
            from .steps import LOOP_MAX_ROUNDS, repeating_prompts, static_loop_decoders, time_loop

            V = target.config.vocab_size
            copies = draft is None  # n-grams (or a head): text that repeats, whose drafts the target accepts
            # a row may accept a whole chain each step on text that repeats: room for every step's n tokens
            longest = max(contexts) + (16 * max(token_counts) if copies else 2 * max(token_counts)) + 16
            make = static_loop_decoders(target, drafter, max_len=longest, max_batch=int(b), policy=loop)
            loops = [time_loop(make, token_counts, int(c), V, policy=loop, rounds=max(1, min(int(rounds), 2)),
                               max_rounds=LOOP_MAX_ROUNDS, rows=int(b), progress=progress,
                               prompts=repeating_prompts(int(b), int(c), V) if copies else None)
                     for c in contexts]
        curves[int(b)] = build_latency_profile(
            target_tables=tt, draft_tables=dt, step_overhead_ms=overhead, device=device, dtype=dtype,
            target_name=target_name, target_config=target.config, draft_name=draft_name,
            draft_config=draft.config if draft is not None else None, random_weights=random_weights,
            profile_id=f"{profile_id}@batch{b}", method=method, command=command,
            attention={"requested": "auto", "target": t_att.as_dict(),
                       "draft": d_att.as_dict() if dt is not None else None}, loop_tables=loops,
            draft_cost_model=draft_cost_model)
    first = curves[min(curves)]
    dev = {**first.device, "attention": {"requested": "auto", "target": seen["target"].as_dict(),
                                         "draft": seen["draft"].as_dict() if draft is not None else None}}
    return BatchLatencyProfile(id=profile_id, curves=curves, device=dev, model=dict(first.model),
                               source=(first.source or "").replace(f"{profile_id}@batch{min(curves)}", profile_id)
                               + f"; batch sizes {','.join(map(str, sorted(curves)))}, tokens per row",
                               date=now_iso())
