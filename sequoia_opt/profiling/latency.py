"""Latency profiling: one target forward over n tokens, and one draft forward over w tokens, through the
real verification path (static KV cache holding ``context`` tokens, prefix + tree mask), against n.

The result is the latency curve T(n) at each context length L and the draft cost c(w) that the solver's
hardware-aware choice uses (Sequoia, Chen et al. 2024, section 4.2: the best budget depends on how T(n)
grows with n on the device). Latency does not depend on the weights' values, so a random-weight model of
the right shape (``ModelConfig.preset``) profiles a model that was never downloaded; nor on the mask's
pattern for a given n (both backends do the same work for any (n, n) tree mask), so a causal mask is used.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from ..attention import causal_tree_mask
from ..model import ModelConfig, Transformer
from ..profiles import LATENCY_FORMAT, LatencyCurve
from ..tree import now_iso
from ..device import device_info
from .timing import Timing, time_alternating, time_call

ProgressFn = Callable[[str, int, int], None]
"""progress(what, done, total): called after each measured point."""

Timers = tuple[Callable[[int], Timing], Callable[[int, int], tuple[Timing, Timing]]]
"""``(time(n), time_paired(n, ref))`` at one context: the :class:`Timing` (ms) of a forward over n new tokens, and of
n and ``ref`` tokens timed alternately (:func:`sweep_grid`)."""


@dataclass
class LatencyTable:
    """Measured forward times at one context length: ``tokens[i]`` -> ``timings[i]`` (ms)."""

    context: int
    tokens: list[int] = field(default_factory=list)
    timings: list[Timing] = field(default_factory=list)


def random_weight_model(config: ModelConfig, *, device: torch.device | str, dtype: torch.dtype,
                        seed: int = 0) -> Transformer:
    """A model of ``config``'s shape with random weights (normal, std 0.02), built directly on ``device``
    without a CPU detour (parameters are allocated on the meta device first, then materialised).

    Raises torch's out-of-memory error when the shape does not fit the device.
    """
    with torch.device("meta"):
        model = Transformer(config, device="meta", dtype=dtype)
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    # buffers created on meta (rotary inverse frequencies) are recomputed on the real device
    from ..model.llama import rope_inv_freq

    model.inv_freq = rope_inv_freq(config).to(device)
    if config.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.eval()


def _frontier(context: int, row_lengths: Sequence[int] | None) -> int:
    """The cache slot a timed forward's tokens go at: ``context``, or the longest row where ``row_lengths`` gives
    each row's own (:func:`_forward_call`)."""
    return int(context) if row_lengths is None else max(int(x) for x in row_lengths)


def _forward_call(model: Transformer, n: int, context: int, *, backend: str, cache,
                  num_layers: int | None = None, rows: int | None = None,
                  row_lengths: Sequence[int] | None = None) -> Callable[[], None]:
    """A closure running one forward of ``model`` over n random tokens after ``context`` cached tokens (only
    its first ``num_layers`` blocks, then norm and LM head, when given: the self layer-skip draft). With
    ``rows`` = b: b rows of n tokens each, through the batched decoder's path (a per-row
    :class:`~sequoia_opt.attention.RowPrefix`, every prefix slot valid; ``cache`` has >= b rows).

    ``row_lengths`` (b ints, tokens; with ``rows``): row i holds that many cached tokens instead of ``context``, as
    the batched decoder lays rows of different lengths out (:mod:`sequoia_opt.decoding.rows`): the tree goes at
    the shared frontier F = the longest row, and row i sees its first ``row_lengths[i]`` slots (``cache`` holds
    F + n slots)."""
    device = model.device
    tokens = torch.randint(0, model.config.vocab_size, (1 if rows is None else rows, n), device=device)
    if row_lengths is not None:
        if rows is None or len(row_lengths) != rows:
            raise ValueError(f"row_lengths needs one length per row ({rows} rows), got {len(row_lengths)}")
        context = _frontier(context, row_lengths)
    slots = torch.arange(context, context + n, device=device)
    mask = causal_tree_mask(n, device)
    prefix = context
    if rows is not None:
        from ..attention import RowPrefix

        valid = torch.ones(rows, context, dtype=torch.bool, device=device)
        if row_lengths is not None:  # row i's slots past its own length are holes (padding)
            lengths = torch.tensor([int(x) for x in row_lengths], device=device)
            valid = torch.arange(context, device=device)[None, :] < lengths[:, None]
        prefix = RowPrefix(context, valid)
        cache = None if cache is None else cache.rows(0, rows)  # a probe without a KV cache (Medusa's heads)

    @torch.inference_mode()
    def call() -> None:
        model(tokens, slots, cache=cache, cache_slots=slots, prefix_len=prefix, tree_mask=mask,
              backend=backend, num_layers=num_layers)

    return call


def time_forward(model: Transformer, n: int, context: int, *, backend: str = "auto",
                 cache=None, num_layers: int | None = None, rows: int | None = None,
                 row_lengths: Sequence[int] | None = None, **timing_kw) -> Timing:
    """Time one forward of ``model`` over n new tokens after ``context`` cached tokens (batch 1; ``rows`` and
    ``row_lengths`` as :func:`_forward_call`), through its first ``num_layers`` blocks only when given.

    The cache is allocated once per context by the caller (or here); its contents are irrelevant to the
    time. Returns a :class:`Timing` in ms.
    """
    if cache is None:
        cache = model.new_cache(_frontier(context, row_lengths) + n, batch=rows or 1)
    return time_call(_forward_call(model, n, context, backend=backend, cache=cache, num_layers=num_layers,
                                   rows=rows, row_lengths=row_lengths), model.device, **timing_kw)


def time_forward_paired(model: Transformer, n: int, reference: int, context: int, *, backend: str = "auto",
                        cache=None, num_layers: int | None = None, rows: int | None = None,
                        row_lengths: Sequence[int] | None = None, **timing_kw) -> tuple[Timing, Timing]:
    """Time forwards over n and over ``reference`` tokens alternately, call by call
    (:func:`~sequoia_opt.profiling.timing.time_alternating`; ``rows`` and ``row_lengths`` as
    :func:`_forward_call`). Returns (Timing of n, Timing of reference), ms."""
    if cache is None:
        cache = model.new_cache(_frontier(context, row_lengths) + max(n, reference), batch=rows or 1)
    calls = [_forward_call(model, k, context, backend=backend, cache=cache, num_layers=num_layers, rows=rows,
                           row_lengths=row_lengths) for k in (n, reference)]
    t_n, t_ref = time_alternating(calls, model.device, **timing_kw)
    return t_n, t_ref


def profile_model(model: Transformer, token_counts: Sequence[int], contexts: Sequence[int], *,
                  what: str = "target", backend: str = "auto", progress: ProgressFn | None = None,
                  rounds: int = 1, paired: bool = False, num_layers: int | None = None,
                  rows: int | None = None, **timing_kw) -> list[LatencyTable]:
    """Measure ``model`` at every (context, n) pair. Returns one :class:`LatencyTable` per context
    (:func:`model_sweep`'s sweep run whole: every round of a context before the next context).

    ``rows`` = b times b rows of n tokens per forward through the batched decoder's attention path
    (T(b, n), :mod:`sequoia_opt.profiling.batch`); None is the batch-1 path.

    ``num_layers`` times the model's first ``num_layers`` blocks + final norm + LM head only: the cost c(w)
    of the self layer-skip drafter ``self:L`` (:class:`~sequoia_opt.drafting.drafters.LayerSkipDrafter`).

    With ``rounds`` > 1 the whole token grid of a context is swept ``rounds`` times and each n keeps the
    median of its per-round medians (p10 / p90: the medians of the per-round percentiles; repeats: the sum).
    On a shared machine a slow spell then spoils one round of one n rather than the whole entry, which
    matters most for T(1), the baseline every predicted speedup divides by.

    With ``paired`` every n other than the grid's first (the reference, normally 1) is timed alternately with
    the reference, call by call, and the table keeps ``T(ref) x median over rounds of T(n) / T(ref)`` (p10 /
    p90 scaled the same way), T(ref) being the median of all its timings. The solver's choice depends on the
    curve's shape, T(n) / T(1); on a machine whose speed drifts by tens of percent over minutes (shared VMs)
    unpaired points are timed at different speeds and that shape comes out wrong, paired ratios do not. It
    costs one reference forward per timed forward.

    Raises ProfileError for an empty grid or a context + n past the model's ``max_position_embeddings``.
    """
    return model_sweep(model, token_counts, contexts, what=what, backend=backend, progress=progress, rounds=rounds,
                       paired=paired, num_layers=num_layers, rows=rows, **timing_kw).run()


def model_sweep(model: Transformer, token_counts: Sequence[int], contexts: Sequence[int], *,
                what: str = "target", backend: str = "auto", progress: ProgressFn | None = None,
                rounds: int = 1, paired: bool = False, num_layers: int | None = None,
                rows: int | None = None, row_contexts: Callable[[int], Sequence[int]] | None = None,
                **timing_kw) -> GridSweep:
    """:func:`profile_model`'s measurement as a :class:`GridSweep` not yet run, to run whole (:meth:`GridSweep.run`)
    or a round at a time beside other sweeps (:func:`interleave_rounds`). Arguments and errors as
    :func:`profile_model`; ``row_contexts(context)`` (with ``rows``): the ``rows`` contexts the rows of the table at
    ``context`` hold (:func:`~sequoia_opt.profiling.batch.row_contexts`; default: every row at ``context``).
    """
    from ..errors import ProfileError

    if not token_counts or not contexts:
        raise ProfileError("need at least one token count and one context length")
    held = {int(c): [int(x) for x in row_contexts(int(c))] if row_contexts is not None else None for c in contexts}
    longest = max(_frontier(c, v) for c, v in held.items())
    if longest + max(token_counts) > model.config.max_position_embeddings:
        raise ProfileError(f"context {longest} + {max(token_counts)} tokens exceeds the {what} model's "
                           f"context of {model.config.max_position_embeddings} tokens")
    if rounds < 1:
        raise ProfileError(f"rounds must be at least 1, got {rounds}")

    def timers_at(ctx: int):
        lengths = held[int(ctx)]
        cache = model.new_cache(_frontier(ctx, lengths) + max(token_counts), batch=rows or 1)
        kw = dict(backend=backend, cache=cache, num_layers=num_layers, rows=rows, row_lengths=lengths, **timing_kw)
        return (lambda n: time_forward(model, n, ctx, **kw),
                lambda n, r: time_forward_paired(model, n, r, ctx, **kw))

    return GridSweep(timers_at, token_counts, contexts, what=what, progress=progress, rounds=rounds, paired=paired)


def engine_timers(calls_at: Callable[[int], Callable[[int], Callable[[], None]]], device: torch.device | str = "cpu",
                  **timing_kw):
    """:func:`sweep_grid`'s ``timers_at`` for an engine given by ``calls_at(context)``, which sets that context up
    (a KV cache holding ``context`` tokens) and returns ``call(n)``: a closure running one forward over n new
    tokens there and leaving the cache as it found it. Times with :func:`time_call` / :func:`time_alternating`."""
    def timers_at(ctx: int):
        call = calls_at(ctx)
        return (lambda n: time_call(call(n), device, **timing_kw),
                lambda n, r: tuple(time_alternating([call(n), call(r)], device, **timing_kw)))

    return timers_at


class GridSweep:
    """:func:`sweep_grid` one round at a time: each :meth:`run_round` times every (context, n) pair once (paired
    as :func:`profile_model` says), :meth:`tables` turns the rounds so far into one :class:`LatencyTable` (ms) per
    context. Several sweeps run a round each in turn with :func:`interleave_rounds`.

    Why rounds that can be interleaved: a shared VM's speed drifts by tens of percent over minutes. Pairing keeps
    each curve's shape (T(n) / T(1)) true, but two curves timed one after the other (T(b, n) at batch 2, then at
    batch 4) land at different speeds, and their levels come out in the wrong order: the editing workload's
    profile of 2026-12-07 timed T(2, 1) at 89.4 ms, above T(4, 1) at 85.3 ms, and its plan's tokens/s at batch 2
    was predicted 23 % under what the same batch size served. Interleaved, a slow spell lands on every curve's
    round alike, and each curve keeps its median over rounds.

    :meth:`run_round` calls ``timers_at(context)`` once per context and round (it sets that context up: a KV cache
    holding ``context`` tokens) and drops what it returns at the round's end, so sweeps waiting their turn hold no
    cache; :meth:`run` sets each context up once for all its rounds. The order does not change the times: on the
    demo target (1 thread, context 125, 2026-12-07) T(b, n) at b = 1, 2, 4, 8 and n = 1..3 timed batch size after
    batch size and round by round, alternated three times in one process, agreed within 5 % (interleaved /
    sequential 0.98-1.05, medians; ``benchmarks/profile_order.py``, ``results/profile_order/``).

    Raises ProfileError for ``rounds`` below 1.
    """

    def __init__(self, timers_at: Callable[[int], Timers],
                 token_counts: Sequence[int], contexts: Sequence[int], *, what: str = "target",
                 progress: ProgressFn | None = None, rounds: int = 1, paired: bool = False):
        from ..errors import ProfileError

        if rounds < 1:
            raise ProfileError(f"rounds must be at least 1, got {rounds}")
        self.timers_at, self.what, self.progress = timers_at, what, progress
        self.token_counts, self.contexts = [int(n) for n in token_counts], [int(c) for c in contexts]
        self.rounds, self.paired, self.round = int(rounds), bool(paired), 0
        self.total, self.count = len(self.token_counts) * len(self.contexts) * self.rounds, 0
        # per context: each n's Timing per round; paired: the reference's median timed beside each
        self.per_n = [[[] for _ in self.token_counts] for _ in self.contexts]
        self.ref_of = [[[] for _ in self.token_counts] for _ in self.contexts]

    @property
    def done(self) -> bool:
        """Every round has run."""
        return self.round >= self.rounds

    def run_round(self) -> None:
        """Time every (context, n) pair once more (nothing once :attr:`done`)."""
        if self.done:
            return
        for j, ctx in enumerate(self.contexts):
            self.time_context(j, self.timers_at(ctx), self.round)
        self.round += 1

    def time_context(self, j: int, timers: Timers, r: int) -> None:
        """Round ``r`` of context ``contexts[j]`` with its ``timers`` (what ``timers_at`` returned for it)."""
        time_one, time_pair = timers
        ref, ctx = self.token_counts[0], self.contexts[j]
        for i, n in enumerate(self.token_counts):
            if self.paired and i > 0:
                t_n, t_ref = time_pair(n, ref)
                self.per_n[j][i].append(t_n)
                self.ref_of[j][i].append(t_ref.median_ms)
            else:
                self.per_n[j][i].append(time_one(n))
            self.count += 1
            if self.progress:
                tag = f", round {r + 1}/{self.rounds}" if self.rounds > 1 else ""
                self.progress(f"{self.what} forward, context {ctx}, {n} tokens{tag}", self.count, self.total)

    def run(self) -> list[LatencyTable]:
        """Run the rounds left context by context (every round of one context before the next, its set-up made
        once: an engine's costs a prefill) and return :meth:`tables`."""
        for j, ctx in enumerate(self.contexts):
            timers = self.timers_at(ctx)
            for r in range(self.round, self.rounds):
                self.time_context(j, timers, r)
            del timers
        self.round = self.rounds
        return self.tables()

    def tables(self) -> list[LatencyTable]:
        """One table per context from the rounds run so far: each n keeps the median of its per-round medians
        (paired: ``T(ref) x`` the per-round ratios, T(ref) the median of all the reference's timings)."""
        tables = []
        for ctx, per_n, ref_of in zip(self.contexts, self.per_n, self.ref_of):
            if not per_n[0]:
                continue
            t_ref = statistics.median([t.median_ms for t in per_n[0]] + [m for ms in ref_of for m in ms])
            table = LatencyTable(context=ctx)
            for i, (n, ts, refs) in enumerate(zip(self.token_counts, per_n, ref_of)):
                table.tokens.append(n)
                if refs:  # T(ref) x T(n) / T(ref) of the same pair
                    scale = [t_ref / m for m in refs]
                elif self.paired and i == 0:  # the reference itself: the median over all its timings
                    scale = [t_ref / statistics.median(t.median_ms for t in ts)] * len(ts)
                else:
                    scale = [1.0] * len(ts)
                table.timings.append(Timing(statistics.median(t.median_ms * k for t, k in zip(ts, scale)),
                                            statistics.median(t.p10_ms * k for t, k in zip(ts, scale)),
                                            statistics.median(t.p90_ms * k for t, k in zip(ts, scale)),
                                            sum(t.repeats for t in ts)))
            tables.append(table)
        return tables


def interleave_rounds(sweeps: Sequence[Any]) -> None:
    """Run ``sweeps`` (each with ``done`` and ``run_round()``: a :class:`GridSweep`, a
    :class:`~sequoia_opt.profiling.steps.LoopSweep`) a round each in turn, in the order given, until every one is
    done: a drift of the machine's speed then lands on every sweep's rounds alike (:class:`GridSweep`)."""
    while True:
        todo = [s for s in sweeps if not s.done]
        if not todo:
            return
        for s in todo:
            s.run_round()


class ProgressTally:
    """One progress line for interleaved sweeps: :meth:`part` gives each sweep a ``progress`` of its own, and the
    tally reports the sum of every part's done and total points to ``progress`` (a part's total may grow: a
    :class:`~sequoia_opt.profiling.steps.LoopSweep`'s extra rounds)."""

    def __init__(self, progress: ProgressFn | None):
        self.progress, self.parts = progress, []

    def part(self, total: int) -> ProgressFn | None:
        """A ``progress(what, done, total)`` for one sweep of ``total`` points so far (None when the tally reports
        to nothing)."""
        if self.progress is None:
            return None
        i = len(self.parts)
        self.parts.append((0, int(total)))

        def report(what: str, done: int, total: int) -> None:
            self.parts[i] = (done, total)
            self.progress(what, sum(d for d, _ in self.parts), sum(t for _, t in self.parts))

        return report


def sweep_grid(timers_at: Callable[[int], Timers],
               token_counts: Sequence[int], contexts: Sequence[int], *, what: str = "target",
               progress: ProgressFn | None = None, rounds: int = 1, paired: bool = False) -> list[LatencyTable]:
    """Time a forward at every (context, n) pair with :func:`profile_model`'s rounds and pairing, for any
    engine: ``timers_at(context)`` sets that context up and returns ``(time(n), time_paired(n, ref))``, the
    :class:`Timing` of a forward over n new tokens there, and of n and ``ref`` tokens timed alternately
    (:func:`engine_timers` makes them for an engine's forward). Returns one :class:`LatencyTable` (ms) per context.
    Every round of one context runs before the next context's (:class:`GridSweep` to interleave sweeps).

    Raises ProfileError for ``rounds`` below 1.
    """
    return GridSweep(timers_at, token_counts, contexts, what=what, progress=progress, rounds=rounds,
                     paired=paired).run()


def time_lookup_propose(make_drafter: Callable[[], object], target: Transformer, w: int, context: int, *,
                        seed: int = 0, **timing_kw) -> Timing:
    """Time one :meth:`~sequoia_opt.drafting.drafters.Drafter.propose` of a one-pass drafter without a model
    (prompt lookup) for a chain of ``w`` drafted nodes after ``context`` committed tokens, through the policy's
    own draft (ms).

    A chain is the most lookups ``w`` drafted nodes can need (every node but the last leaf proposes), so this
    is an upper bound for any tree of ``w + 1`` nodes. The context is random tokens drawn from 64 ids, so
    that suffixes recur and every lookup finds followers (the costly case). The index over the context is
    built by the untimed warm-up calls, as the policy's prefill builds it before the first step.
    """
    from ..decoding import Decoder
    from ..decoding.state import DecodeState, RowState
    from ..decoding.stats import GenerationResult
    from ..decoding.step_tree import Room
    from ..drafting.policies import StaticTreePolicy
    from ..tree import Tree

    gen = torch.Generator(device="cpu").manual_seed(seed)
    V = target.config.vocab_size
    pool = torch.randperm(V, generator=gen)[: min(64, V)]
    seq = pool[torch.randint(0, len(pool), (context + 1,), generator=gen)].tolist()
    policy = StaticTreePolicy(make_drafter(), Tree.chain(w + 1), cut_at_answer_end=False)  # root + w drafted
    Decoder(target, policy, max_len=context + w + 2)
    result = GenerationResult(tokens=[], prompt_len=len(seq))
    state = DecodeState(rows=[RowState(seq=seq, cached=context, max_new_tokens=w + 1, result=result)],
                        results=[result])
    policy.reset()
    policy.prefill(state)
    rooms = [Room(w + 1, w)]
    return time_call(lambda: policy.draft(state, rooms), target.device, **timing_kw)


def profile_drafter(target: Transformer, probe: object, token_counts: Sequence[int], contexts: Sequence[int],
                    *, backend: str = "auto", progress: ProgressFn | None = None, rounds: int = 1,
                    paired: bool = False, **timing_kw) -> list[LatencyTable]:
    """c(w) for any drafter, one :class:`LatencyTable` per context, in the units its cost model charges, as its
    :class:`~sequoia_opt.drafting.registry.CostProbe` says (``ModelPair.cost_probe()``):

    * a probe with a model (per-level): one forward of that model (its first ``num_layers`` blocks + norm + LM
      head when given: self layer-skip) over w tokens (:func:`profile_model`); a draft :class:`Transformer` is
      taken as such a probe;
    * a probe without a model (one-pass, no model: prompt lookup): one proposal of w drafted nodes by a fresh
      drafter from ``probe.make`` (:func:`time_lookup_propose`).

    Raises ProfileError as :func:`profile_model` (grid, context past the model's).
    """
    if isinstance(probe, Transformer):
        return profile_model(probe, token_counts, contexts, what="draft", backend=backend, progress=progress,
                             rounds=rounds, paired=paired, **timing_kw)
    if probe.model is not None:
        return profile_model(probe.model, token_counts, contexts, what=probe.label, backend=backend,
                             progress=progress, rounds=rounds, paired=paired, num_layers=probe.num_layers,
                             **timing_kw)
    total = len(token_counts) * len(contexts)
    tables, done = [], 0
    for ctx in contexts:
        table = LatencyTable(context=int(ctx))
        for w in token_counts:
            runs = [time_lookup_propose(probe.make, target, int(w), int(ctx), seed=r, **timing_kw)
                    for r in range(rounds)]
            table.tokens.append(int(w))
            table.timings.append(Timing(statistics.median(t.median_ms for t in runs),
                                        statistics.median(t.p10_ms for t in runs),
                                        statistics.median(t.p90_ms for t in runs), sum(t.repeats for t in runs)))
            done += 1
            if progress:
                progress(f"{probe.label}, context {ctx}, {w} nodes", done, total)
        tables.append(table)
    return tables


def _spread(t: Timing) -> float:
    return round(t.p90_ms - t.p10_ms, 4)


#: (p90 - p10) / median of one timed point past which :func:`noisy_points` names it
NOISY_SPREAD = 0.5


def noisy_points(tables: Sequence[LatencyTable], what: str = "T") -> list[str]:
    """One line per table whose timed points spread (p10 to p90) more than :data:`NOISY_SPREAD` x their median,
    naming them: a curve timed beside other load (a tryout's busy 2-core VM timed T(5) below T(1), p10-p90 74.9 ms
    around 85.8), on which the solver chooses noise. Empty for a steady curve."""
    out = []
    for table in tables:
        bad = [(n, t) for n, t in zip(table.tokens, table.timings)
               if t.median_ms > 0 and (t.p90_ms - t.p10_ms) > NOISY_SPREAD * t.median_ms]
        if bad:
            worst_n, worst = max(bad, key=lambda x: (x[1].p90_ms - x[1].p10_ms) / x[1].median_ms)
            out.append(f"{what}(n) at context {table.context} spread widely at n = "
                       f"{', '.join(str(n) for n, _ in bad[:8])}{' ...' if len(bad) > 8 else ''} (worst: {what}"
                       f"({worst_n}) {worst.p10_ms:.4g}-{worst.p90_ms:.4g} ms around {worst.median_ms:.4g}): other "
                       "load while timing? re-run with more --rounds, or on a quiet machine, before trusting what is "
                       "solved from it")
    return out


def method_text(rounds: int, paired: bool, token_counts: Sequence[int]) -> str:
    """How :func:`profile_model` timed a grid, for the profile's ``source`` line:
    ``"3 rounds, each n timed alternately with n = 1"``. A one-entry grid has nothing to pair, and the
    reference is the grid's first n, as in :func:`profile_model`."""
    text = f"{rounds} round{'s' if rounds != 1 else ''}"
    return text + (f", each n timed alternately with n = {token_counts[0]}" if paired and len(token_counts) > 1
                   else "")


def build_latency_profile(
    *,
    target_tables: list[LatencyTable],
    draft_tables: list[LatencyTable] | None,
    step_overhead_ms: float,
    device: torch.device | str,
    dtype: torch.dtype,
    target_name: str,
    target_config: ModelConfig,
    draft_name: str | None,
    draft_config: ModelConfig | None,
    random_weights: bool,
    profile_id: str,
    method: str | None = None,
    draft_cost_model: str = "per-level",
    command: str = "treeopt profile latency",
    linear: Mapping[str, Any] | None = None,
    draft_linear: Mapping[str, Any] | None = None,
    engine: dict | None = None,
    device_meta: dict | None = None,
    attention: Mapping[str, Any] | None = None,
    cuda_graphs: Mapping[str, Any] | None = None,
    loop_tables: Sequence[Any] | None = None,
    row_contexts: Sequence[Sequence[int] | None] | None = None,
) -> LatencyCurve:
    """Assemble measured tables into a validated ``treeopt-latency/1`` :class:`LatencyCurve`.

    ``method`` (for example :func:`method_text`'s) is appended to the profile's ``source`` line, which names
    ``command`` as what measured it (``treeopt profile layers`` writes profiles too).
    ``draft_cost_model`` (``"per-level"`` or ``"one-pass"``, the drafter's
    :attr:`~sequoia_opt.drafting.drafters.Drafter.cost_model`) is stored in every draft table; ``draft_name``
    names the drafter (a checkpoint label, ``self:L``, ``lookup:MIN-MAX``).

    ``engine`` (``{"name": "llama.cpp", "version": ...}``) names the engine that ran the forwards when it is not
    treeopt's decoder, and ``device_meta`` then replaces the torch device's mapping (what that engine ran on).

    Without a draft (``draft_tables`` None) the draft table records 0 ms at one token and the profile says
    the draft cost was not measured. Spreads are p90 - p10 of the repeats (ms).

    ``linear`` / ``draft_linear`` (:func:`~sequoia_opt.model.tuned_linear.linear_record` of the target and
    the draft model) are recorded as ``device.linear`` / ``device.draft_linear``: the CPU kernels the timed
    forwards ran, per weight shape and row-count bucket.

    ``attention`` is recorded as ``device.attention``: the backend asked for and, per model, the attention
    backend that ran and why the kernel was refused (:meth:`~sequoia_opt.attention.BackendRecord.as_dict`), so a
    kernel that failed to load is never replaced by the reference without a trace. ``cuda_graphs`` (per model,
    :meth:`~sequoia_opt.model.graphs.GraphStats.as_dict`) is recorded as ``device.cuda_graphs`` when the forwards
    were replayed from CUDA graphs.

    ``loop_tables`` (one :class:`~sequoia_opt.profiling.steps.LoopTable` per context, in order, or None) are the
    decoding loop's own steps (issue 31), stored as each curve's ``loop``: verify and bookkeeping per tree size and
    the draft time beyond this profile's c(w), per draft forward and once per step that drafts
    (:func:`~sequoia_opt.profiling.steps.draft_extras`). ``row_contexts`` (one per context, in order, or None):
    the contexts a batch's rows were timed at (:func:`~sequoia_opt.profiling.batch.row_contexts`), stored as each
    curve's ``row_context_tokens``.
    """
    import numpy as np

    from .steps import draft_extras

    curves = []
    for i, tt in enumerate(target_tables):
        target = {"tokens": tt.tokens, "target_forward_ms": [round(t.median_ms, 4) for t in tt.timings],
                  "target_forward_spread_ms": [_spread(t) for t in tt.timings]}
        if draft_tables is not None:
            dt = draft_tables[i]
            draft = {"cost_model": draft_cost_model, "tokens": dt.tokens,
                     "draft_forward_ms": [round(t.median_ms, 4) for t in dt.timings],
                     "draft_forward_spread_ms": [_spread(t) for t in dt.timings]}
        else:
            draft = {"cost_model": draft_cost_model, "tokens": list(tt.tokens),
                     "draft_forward_ms": [0.0] * len(tt.tokens)}
        curves.append({"context_tokens": tt.context, "target": target, "draft": draft})
        if row_contexts is not None and row_contexts[i] is not None:
            curves[-1]["row_context_tokens"] = [int(x) for x in row_contexts[i]]
        lp = loop_tables[i] if loop_tables is not None else None
        if lp is not None and lp.tokens:
            dt_tok, dt_ms = draft["tokens"], draft["draft_forward_ms"]
            per_step, per_forward = draft_extras(lp, lambda w: float(np.interp(w, dt_tok, dt_ms)), draft_cost_model,
                                                 max_width=dt_tok[-1]) if draft_tables is not None else (0.0, 0.0)
            curves[-1]["loop"] = {"policy": lp.policy, "tokens": list(lp.tokens),
                                  "verify_ms": [round(x, 4) for x in lp.verify_ms],
                                  "bookkeeping_ms": [round(x, 4) for x in lp.bookkeeping_ms],
                                  "draft_extra_ms": round(per_forward, 4),
                                  "draft_step_extra_ms": round(per_step, 4)}

    def shape(c: ModelConfig) -> dict[str, int]:
        return {"n_layers": c.n_layers, "d_model": c.dim, "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads,
                "head_dim": c.head_dim, "intermediate_size": c.intermediate_size, "vocab_size": c.vocab_size,
                "parameters": c.num_parameters()}

    doc = {
        "format": LATENCY_FORMAT,
        "id": profile_id,
        "source": (f"measured by {command}" + (f" ({method})" if method else "")
                   + (" with RANDOM weights of the model's shape "
                   "(latency does not depend on weight values)" if random_weights else "")
                   + ("" if draft_tables is not None else "; draft cost NOT measured (recorded as 0 ms)")),
        "date": now_iso(),
        "device": device_meta if device_meta is not None else {
            **device_info(device, dtype), **({"linear": dict(linear)} if linear else {}),
            **({"draft_linear": dict(draft_linear)} if draft_linear else {}),
            **({"attention": dict(attention)} if attention else {}),
            **({"cuda_graphs": dict(cuda_graphs)} if cuda_graphs else {})},
        **({"engine": dict(engine)} if engine else {}),
        "model": {"target": target_name, "target_shape": shape(target_config),
                  "draft": draft_name, "draft_shape": shape(draft_config) if draft_config else None,
                  "random_weights": random_weights},
        "step_overhead_ms": round(float(step_overhead_ms), 4),
        "curves": curves,
    }
    return LatencyCurve.from_dict(doc, source=f"latency profile {profile_id!r}", default_id=profile_id)


@torch.inference_mode()
def measure_step_overhead(target: Transformer, draft: object, *, tree=None, prompt_len: int = 32,
                          steps: int = 24, backend: str = "auto", seed: int = 0) -> float:
    """The fixed per-step cost of tree decoding outside the model forwards (ms): verification (argmax or
    the residual rule), path selection, KV-cache compaction of both models and stop checks, as the decoder
    itself measures it (``StepStats.bookkeeping_ms``). Median over ``steps`` steps on a random prompt; the
    value is a measurement of this device, not a guess.

    ``draft``: a draft Transformer, a Drafter, or a function making one (called once;
    :func:`~sequoia_opt.drafting.drafters.drafter_factory`). ``tree`` defaults to a 4-wide star under a
    4-deep chain (a typical small Sequoia tree shape).
    """
    from ..decoding import Decoder
    from ..drafting.drafters import drafter_factory
    from ..drafting.policies import StaticTreePolicy
    from ..tree import Tree

    if tree is None:
        tree = Tree.from_choices([[0], [1], [2], [3], [0, 0], [0, 1], [0, 0, 0], [0, 0, 0, 0]])
    gen = torch.Generator(device="cpu").manual_seed(seed)
    prompt = torch.randint(0, target.config.vocab_size, (prompt_len,), generator=gen).tolist()
    dec = Decoder(target, StaticTreePolicy(drafter_factory(draft)(), tree, cut_at_answer_end=False), backend=backend,
                  max_len=prompt_len + steps * tree.size + tree.size + 1)
    result = dec.generate(prompt, steps)
    import statistics

    return float(statistics.median(s.bookkeeping_ms for s in result.steps)) if result.steps else 0.0
