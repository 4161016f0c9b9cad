"""llama.cpp's latency curve and acceptance, measured through its own forwards and logits.

* :func:`profile_latency` — T(n): one target ``llama_decode`` over n tokens after ``context`` cached tokens *with
  logits for all n positions* (verification reads them all), the draft's c(w) the same way, and the per-step
  overhead of a speculative step outside the two models' forwards; in the ``treeopt-latency/1`` format with
  ``engine: {name: llama.cpp, version}``.
* :func:`profile_latency_batch` — T(b, n), c(b, w) and the overhead per batch size b: b sequences of n tokens
  each in one ``llama_decode`` (one sequence id per row, a KV cache per sequence, as ``llama-server -np b``
  decodes its slots), in the ``treeopt-latency-batch/1`` format.
* :func:`measure_acceptance` — the greedy positional acceptance vector on llama.cpp's own logits, teacher-forced
  along the target's greedy output: the rank of the target's token among the draft's logits at each position.
"""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from ...errors import EngineError
from ...solver.chains import ChainSetting
from .binding import LlamaCppModel, engine_info, top1
from .decode import generate

__all__ = ["forward_calls", "batch_calls", "measure_step_overhead", "loop_decoders", "profile_latency",
           "profile_latency_batch", "measure_acceptance"]

ProgressFn = Callable[[str, int, int], None]


def _filled(model: LlamaCppModel, context: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    model.clear()
    if context:
        model.prefill(rng.integers(0, model.n_vocab, context).tolist())


def forward_calls(model: LlamaCppModel, *, seed: int = 0) -> Callable[[int], Callable[[int], Callable[[], None]]]:
    """``calls_at(context)`` for :func:`~sequoia_opt.profiling.latency.engine_timers`: fills ``model``'s KV
    cache with ``context`` random tokens and returns ``call(n)``, a closure running one ``llama_decode`` over
    n random tokens at positions ``context..context + n - 1`` with logits for all n, then removing their cells."""
    rng = np.random.default_rng(seed)

    def calls_at(ctx: int) -> Callable[[int], Callable[[], None]]:
        _filled(model, ctx, seed)

        def call(n: int) -> Callable[[], None]:
            toks = rng.integers(0, model.n_vocab, n).tolist()

            def run() -> None:
                model.decode(toks, ctx, logits=True)
                model.synchronize()
                model.seq_rm(ctx)

            return run

        return call

    return calls_at


def batch_calls(model: LlamaCppModel, batch: int, *,
                seed: int = 0) -> Callable[[int], Callable[[int], Callable[[], None]]]:
    """:func:`forward_calls` for ``batch`` rows: every row's sequence holds ``context`` random tokens; ``call(n)``
    runs one ``llama_decode`` over n random tokens per row (b x n tokens, row r in sequence r at positions
    ``context..context + n - 1``, logits for all), then removes their cells."""
    rng = np.random.default_rng(seed)

    def calls_at(ctx: int) -> Callable[[int], Callable[[], None]]:
        model.clear()
        for s in range(batch):
            if ctx:
                model.prefill(rng.integers(0, model.n_vocab, ctx).tolist(), s)

        def call(n: int) -> Callable[[], None]:
            toks = rng.integers(0, model.n_vocab, batch * n).tolist()
            seqs = [[s] for s in range(batch) for _ in range(n)]
            pos = [ctx + i for _ in range(batch) for i in range(n)]

            def run() -> None:
                model.decode(toks, 0, logits=True, seq_ids=seqs, positions=pos)
                model.synchronize()
                for s in range(batch):
                    model.seq_rm(ctx, -1, s)

            return run

        return call

    return calls_at


def measure_batch_overhead(target: LlamaCppModel, draft: LlamaCppModel | None, batch: int, *, n_max: int = 2,
                           prompt_len: int = 32, steps: int = 12, seed: int = 0) -> float:
    """The loop's per-step cost outside the forwards at ``batch`` rows on llama.cpp (ms): the median
    ``bookkeeping_ms`` of ``steps`` steps of static chains of ``n_max`` (plain without a draft) on random
    prompts."""
    from ...decoding import Decoder
    from ...drafting.policies import StaticTreePolicy
    from ...tree import Tree
    from .target import LlamaCppDrafter, LlamaCppTarget

    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, target.n_vocab, prompt_len).tolist() for _ in range(batch)]
    policy = (StaticTreePolicy(LlamaCppDrafter(draft, target.n_vocab), Tree.chain(n_max + 1), cut_at_answer_end=False)
              if draft is not None else None)
    res = Decoder(LlamaCppTarget(target, max_batch=batch), policy, max_batch=batch).generate_batch(prompts, steps)
    return float(statistics.median(s.bookkeeping_ms for s in res.steps)) if res.steps else 0.0


def measure_step_overhead(target: LlamaCppModel, draft: LlamaCppModel, *, n_max: int = 4, prompt_len: int = 32,
                          steps: int = 24, seed: int = 0) -> float:
    """The per-step cost of a chain speculative step outside the two models' forwards (ms): argmax of the
    verified rows, the acceptance test, ``seq_rm`` of both contexts, the batches' filling, stop checks; the
    median of :attr:`Step.bookkeeping_ms` over ``steps`` steps of :func:`generate` on a random prompt."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, target.n_vocab, prompt_len).tolist()
    gen = generate(target, prompt, steps * (n_max + 1), draft=draft, setting=ChainSetting(n_max))
    return float(statistics.median(s.bookkeeping_ms for s in gen.steps[:steps])) if gen.steps else 0.0


def _file_type(path: Path) -> str:
    from ...model.gguf_loader import _field, open_gguf

    from gguf import LlamaFileType

    ft = _field(open_gguf(path), "general.file_type", None)
    try:
        return LlamaFileType(int(ft)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):
        return "unknown"


def loop_decoders(target: LlamaCppModel, draft: LlamaCppModel, reference: LlamaCppModel):
    """``(make_decoder, make_plain)`` for :func:`~sequoia_opt.profiling.steps.time_loop` on llama.cpp:
    ``make_decoder(n)`` decodes plain at n = 1, else a chain of n - 1 drafts
    (:class:`~sequoia_opt.drafting.policies.ChainPolicy`, p-min 0) over a
    :class:`~sequoia_opt.engines.llamacpp.target.LlamaCppDrafter` (both contexts shared between calls);
    ``make_plain()`` decodes plain on ``reference``, a second context of the target (a context holds one
    sequence, and the reference's steps alternate with the chain's)."""
    from ...decoding import Decoder
    from ...drafting.policies import ChainPolicy
    from .target import LlamaCppDrafter, LlamaCppTarget

    def make_decoder(n: int) -> Decoder:
        policy = None if n == 1 else ChainPolicy(LlamaCppDrafter(draft, target.n_vocab), n - 1)
        return Decoder(LlamaCppTarget(target), policy)

    return make_decoder, lambda: Decoder(LlamaCppTarget(reference), None)


def batch_loop_decoders(target: LlamaCppModel, make_drafter: Callable[[], object], reference: LlamaCppModel,
                        batch: int):
    """``(make_decoder, make_plain)`` for :func:`~sequoia_opt.profiling.steps.time_loop` at ``batch`` rows on
    llama.cpp, as a speculation plan runs them (``benchmarks/schedules.py``, ``SchedulePolicy``): ``make_decoder(n)``
    decodes plain at n = 1, else a static chain of n nodes
    (:class:`~sequoia_opt.drafting.policies.StaticTreePolicy`) over a fresh drafter from ``make_drafter`` (a
    :class:`~sequoia_opt.engines.llamacpp.target.LlamaCppDrafter` on a draft context of ``batch`` sequences, or
    n-grams); ``make_plain()`` decodes plain on ``reference``, a second target context of ``batch`` sequences."""
    from ...decoding import Decoder
    from ...drafting.policies import StaticTreePolicy
    from ...profiling.steps import probe_tree
    from .target import LlamaCppTarget

    def make_decoder(n: int) -> Decoder:
        policy = None if n == 1 else StaticTreePolicy(make_drafter(), probe_tree(n, "chain"), cut_at_answer_end=False)
        return Decoder(LlamaCppTarget(target, max_batch=batch), policy, max_batch=batch)

    return make_decoder, lambda: Decoder(LlamaCppTarget(reference, max_batch=batch), None, max_batch=batch)


def profile_latency(target_path: Path, draft_path: Path | None, *, contexts: Sequence[int],
                    token_counts: Sequence[int], draft_token_counts: Sequence[int], n_threads: int = 2,
                    rounds: int = 3, paired: bool = True, max_repeats: int = 30, progress: ProgressFn | None = None,
                    target_name: str | None = None, draft_name: str | None = None, loop: bool = True):
    """The llama.cpp latency profile of a target GGUF and a draft GGUF (``treeopt-latency/1`` with ``engine``):
    T(n) and c(w) with logits for every position (:func:`forward_calls`, timed by
    :func:`~sequoia_opt.profiling.latency.sweep_grid` with its rounds and pairing against n = 1), and the
    per-step overhead (:func:`measure_step_overhead`). ``draft_path`` None records no draft (0 ms). With ``loop``
    and a draft, the decoding loop's chain steps at every target token count too (:func:`loop_decoders`,
    :func:`~sequoia_opt.profiling.steps.time_loop`: a chain of n - 1 drafts, the logits read into Python for
    acceptance and for draft-p-min, both contexts alternating as the runner runs them).

    Returns:
        the validated :class:`~sequoia_opt.profiles.LatencyCurve`.

    Raises:
        EngineError: llama-cpp-python missing, a GGUF llama.cpp refuses, a context + n past a model's context.
    """
    from ...profiling.latency import engine_timers, method_text, sweep_grid

    widest = max(max(token_counts), max(draft_token_counts))
    meta = _meta(target_path, draft_path, contexts, widest, n_threads, target_name, draft_name)
    # 256: what measure_step_overhead's run needs; the loop's 9 steps commit up to a chain each past the context
    n_ctx = max(max(contexts) + 10 * widest + 16, 256)
    kw = dict(min_repeats=min(5, max_repeats), max_repeats=max_repeats)
    with LlamaCppModel(target_path, n_ctx=n_ctx, n_threads=n_threads) as tm:
        ttables = sweep_grid(engine_timers(forward_calls(tm), "cpu", **kw), token_counts, contexts, what="target",
                             progress=progress, rounds=rounds, paired=paired)
        dtables, overhead, loops = None, 0.0, None
        if draft_path is not None:
            with LlamaCppModel(draft_path, n_ctx=n_ctx, n_threads=n_threads) as dm:
                dtables = sweep_grid(engine_timers(forward_calls(dm, seed=1), "cpu", **kw), draft_token_counts,
                                     contexts, what="draft", progress=progress, rounds=rounds, paired=paired)
                overhead = measure_step_overhead(tm, dm)
                if loop:
                    from ...profiling.steps import time_loop

                    with LlamaCppModel(target_path, n_ctx=n_ctx, n_threads=n_threads) as ref:
                        make, plain = loop_decoders(tm, dm, ref)
                        loops = [time_loop(make, token_counts, c, tm.n_vocab, policy="chain", rounds=min(rounds, 2),
                                           progress=progress, make_plain=plain) for c in contexts]
    return _curve(meta, ttables, dtables, overhead, meta["pid"], method_text(rounds, paired, token_counts),
                  "treeopt profile latency --engine llama.cpp", loop_tables=loops)


def _meta(target_path, draft_path, contexts, widest, n_threads, target_name, draft_name) -> dict:
    """What a llama.cpp profile records of its models and device; refuses a context past a model's."""
    from ...model.loaders import load_model_config
    from ...device import cpu_name, device_slug

    tcfg = load_model_config(target_path)
    dcfg = load_model_config(draft_path) if draft_path is not None else None
    for cfg, path in ((tcfg, target_path), (dcfg, draft_path)):
        if cfg is not None and max(contexts) + widest > cfg.max_position_embeddings:
            raise EngineError(f"context {max(contexts)} + {widest} tokens exceeds {Path(path).name}'s context of "
                              f"{cfg.max_position_embeddings} tokens")
    tname = target_name or Path(target_path).stem
    dname = draft_name or (Path(draft_path).stem if draft_path is not None else None)
    device_meta = {"name": cpu_name(), "type": "cpu", "dtype": _file_type(Path(target_path)),
                   "draft_dtype": _file_type(Path(draft_path)) if draft_path is not None else None,
                   "threads": n_threads}
    pid = f"{device_slug('cpu')}_{tname}" + (f"__{dname}" if dname else "") + "_llama.cpp"
    return {"tcfg": tcfg, "dcfg": dcfg, "tname": tname, "dname": dname, "device_meta": device_meta, "pid": pid}


def _curve(meta: dict, ttables, dtables, overhead: float, pid: str, method: str, command: str,
           loop_tables=None):
    import torch

    from ...profiling.latency import build_latency_profile

    return build_latency_profile(
        target_tables=ttables, draft_tables=dtables, step_overhead_ms=overhead, device="cpu", dtype=torch.float32,
        target_name=meta["tname"], target_config=meta["tcfg"], draft_name=meta["dname"], draft_config=meta["dcfg"],
        random_weights=False, profile_id=pid, method=method + "; llama_decode with logits for every position",
        command=command, engine=engine_info(), device_meta=meta["device_meta"], loop_tables=loop_tables)


def profile_latency_batch(target_path: Path, draft_path: Path | None, batches: Sequence[int], *,
                          contexts: Sequence[int], token_counts: Sequence[int], draft_token_counts: Sequence[int],
                          n_threads: int = 2, rounds: int = 3, paired: bool = True, max_repeats: int = 30,
                          max_seconds: float = 10.0, progress: ProgressFn | None = None,
                          target_name: str | None = None, draft_name: str | None = None,
                          lookup: tuple[int, int] | None = None, loop: bool = True):
    """T(b, n), c(b, w) and the per-step overhead at every batch size b on llama.cpp (module docstring): one
    context of b sequences per batch size, a KV cache per sequence (``kv_unified`` off, llama-server's default),
    timed as :func:`profile_latency` times batch 1 (:func:`batch_calls`; overhead:
    :func:`measure_batch_overhead`); ``max_seconds`` caps the timing of one (batch, n) point.

    With ``loop`` and a drafter (the draft GGUF, or n-grams: ``lookup`` = (min, max) n-gram, without a draft), every
    batch size's curve also records the decoding loop's own chain step at b rows (:func:`batch_loop_decoders`,
    :func:`~sequoia_opt.profiling.steps.time_loop`: the logits of b x n rows read into Python, the acceptance,
    the commits), which the cost model charges instead of T(b, n) plus the overhead (issue 31: on this engine the
    step's work outside ``llama_decode`` grows with b x n). n-grams step on
    :func:`~sequoia_opt.profiling.steps.repeating_prompts`, where the target accepts their chains.

    Returns:
        the :class:`~sequoia_opt.profiles.batch.BatchLatencyProfile` (``treeopt-latency-batch/1``).

    Raises:
        EngineError: as :func:`profile_latency`.
    """
    from ...profiles.batch import BatchLatencyProfile
    from ...profiling.latency import engine_timers, method_text, sweep_grid
    from ...tree import now_iso

    widest = max(max(token_counts), max(draft_token_counts))
    meta = _meta(target_path, draft_path, contexts, widest, n_threads, target_name, draft_name)
    per_seq = max(max(contexts) + widest + 8, 64 + 12 * 3 + 8)  # the overhead run's prompt and steps fit too
    kw = dict(min_repeats=min(5, max_repeats), max_repeats=max_repeats, max_seconds=max_seconds)
    curves = {}
    for b in sorted({int(x) for x in batches}):
        cfg = dict(n_ctx=per_seq * b, n_threads=n_threads, n_seq_max=b, kv_unified=False)
        with LlamaCppModel(target_path, **cfg) as tm:
            tt = sweep_grid(engine_timers(batch_calls(tm, b), "cpu", **kw), token_counts, contexts,
                            what=f"target (batch {b})", progress=progress, rounds=rounds, paired=paired)
            dt, overhead = None, 0.0
            if draft_path is not None:
                with LlamaCppModel(draft_path, **cfg) as dm:
                    dt = sweep_grid(engine_timers(batch_calls(dm, b, seed=1), "cpu", **kw), draft_token_counts,
                                    contexts, what=f"draft (batch {b})", progress=progress, rounds=rounds,
                                    paired=paired)
                    overhead = measure_batch_overhead(tm, dm, b)
            else:
                overhead = measure_batch_overhead(tm, None, b)
        loops = None
        if loop and (draft_path is not None or lookup is not None):
            loops = _batch_loop_tables(target_path, draft_path, lookup, b, contexts, token_counts, n_threads,
                                       rounds, progress)
        curves[b] = _curve(meta, tt, dt, overhead, f"{meta['pid']}_batch@batch{b}",
                           method_text(rounds, paired, token_counts), "treeopt tune --engine llama.cpp",
                           loop_tables=loops)
    first = curves[min(curves)]
    return BatchLatencyProfile(id=f"{meta['pid']}_batch", curves=curves, device=dict(first.device),
                               model=dict(first.model), source=f"measured by treeopt tune on llama.cpp, batch sizes "
                               f"{','.join(map(str, sorted(curves)))} (b sequences of n tokens per forward)",
                               date=now_iso())


def _batch_loop_tables(target_path: Path, draft_path: Path | None, lookup: tuple[int, int] | None, batch: int,
                       contexts: Sequence[int], token_counts: Sequence[int], n_threads: int, rounds: int,
                       progress: ProgressFn | None) -> list:
    """The loop's chain steps at ``batch`` rows (:func:`profile_latency_batch`), one table per context. Its own
    contexts: room for every timed step to commit a whole chain (text that repeats is accepted), which the
    T(b, n) contexts are not sized for."""
    from ...drafting.drafters import PromptLookupDrafter
    from ...profiling.steps import LOOP_MAX_ROUNDS, repeating_prompts, time_loop
    from .target import LlamaCppDrafter

    widest = max(token_counts)
    cfg = dict(n_ctx=(max(contexts) + 16 * widest + 32) * batch, n_threads=n_threads, n_seq_max=batch,
               kv_unified=False)
    with contextlib.ExitStack() as stack:
        tm = stack.enter_context(LlamaCppModel(target_path, **cfg))
        ref = stack.enter_context(LlamaCppModel(target_path, **cfg))
        if draft_path is not None:
            dm = stack.enter_context(LlamaCppModel(draft_path, **cfg))
            make_drafter = lambda: LlamaCppDrafter(dm, tm.n_vocab)  # noqa: E731
        else:
            lo, hi = lookup
            make_drafter = lambda: PromptLookupDrafter(tm.n_vocab, prompt_lookup_min=lo,  # noqa: E731
                                                       prompt_lookup_max=hi)
        make, plain = batch_loop_decoders(tm, make_drafter, ref, batch)
        return [time_loop(make, token_counts, int(c), tm.n_vocab, policy="chain", rounds=max(1, min(rounds, 2)),
                          max_rounds=LOOP_MAX_ROUNDS, progress=progress, make_plain=plain, rows=batch,
                          prompts=repeating_prompts(batch, int(c), tm.n_vocab) if draft_path is None else None)
                for c in contexts]


def measure_acceptance(target: LlamaCppModel, draft: LlamaCppModel, prompts: Sequence[Sequence[int]],
                       max_new_tokens: int, *, width: int = 8, eos_ids: Iterable[int] = (),
                       progress: ProgressFn | None = None, prompt_counts: list | None = None,
                       ) -> tuple[np.ndarray, list[list[tuple[int, float, bool]]]]:
    """Greedy acceptance of ``draft`` for ``target`` on llama.cpp's logits (Sequoia section 3.1, greedy: the
    accepted candidate is the target's argmax): for each prompt the target's greedy continuation
    (:func:`generate`, plain), then one draft decode over prompt + continuation with logits at every
    continuation position; the target's token's rank among the draft's logits is one trial.

    Returns:
        ``(counts, traces)``: counts (width + 1,) int64, ``counts[k]`` the trials whose target token was the
        draft's rank-k candidate, ``counts[width]`` none of the top ``width``; traces, per prompt and
        continuation position, (draft top-1 token, its probability among the draft's top 10 logits, whether
        it equals the target's token), what a chain's draft-p-min rule reads. With ``prompt_counts`` (a list) each
        prompt's (1, width + 1) counts are appended to it (every trial is a depth-1 trial here): the per-prompt
        counts of an acceptance profile (``counts_by_prompt``, intervals between prompts).

    Raises:
        EngineError: llama.cpp refuses a decode; DecodingError: as :func:`generate` (an empty prompt, a prompt
            and answer past the target's context).
    """
    counts = np.zeros(width + 1, dtype=np.int64)
    traces = []
    for i, ids in enumerate(prompts):
        cont = generate(target, ids, max_new_tokens, eos_ids=eos_ids).tokens
        full = list(ids) + cont
        draft.clear()
        first = len(ids) - 1  # the logits at position p predict token p + 1
        if first > 0:
            draft.prefill(full[:first])
        rows_tokens = full[first: len(full) - 1]
        trace = []
        before = counts.copy()
        for s in range(0, len(rows_tokens), draft.n_batch):
            chunk = rows_tokens[s: s + draft.n_batch]
            draft.decode(chunk, first + s, logits=True)
            rows = draft.logits(len(chunk))
            for r in range(len(chunk)):
                want = full[first + s + r + 1]
                row = rows[r]
                rank = int((row > row[want]).sum())
                counts[min(rank, width)] += 1
                tok, prob = top1(row)
                trace.append((tok, prob, tok == want))
        traces.append(trace)
        if prompt_counts is not None:
            prompt_counts.append((counts - before)[None, :])
        if progress:
            progress("llama.cpp acceptance", i + 1, len(prompts))
    return counts, traces
