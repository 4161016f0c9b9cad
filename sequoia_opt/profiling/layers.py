"""Which L for the self layer-skip drafter ``self:L``: measure every L of a grid on this device and pair, and
keep the one whose hardware-aware tree predicts the highest speedup.

The self-speculative drafter runs the target's first L blocks + final norm + LM head
(:class:`~sequoia_opt.drafting.drafters.LayerSkipDrafter`; Draft & Verify, Zhang et al. 2023; LayerSkip,
Elhoushi et al. 2024). L trades two things against each other:

* acceptance falls as L shrinks (the early layers' output agrees less often with the full model's,
  unless the target was trained for early exit as LayerSkip's models are);
* the draft cost c(w) grows with L (about ``L / n_layers`` of a target forward, plus the LM head).

Neither side can be guessed, so for each L this measures both (the positional acceptance vector with the
decoder's own verifier, :func:`~sequoia_opt.profiling.acceptance.measure_acceptance`; c(w) through the
verification path, :func:`~sequoia_opt.profiling.latency.profile_drafter`) and lets the solver's
hardware-aware choice (Sequoia, Chen et al. 2024, section 4.2; :func:`~sequoia_opt.solver.hardware.choose`)
pick the best tree for it. The best L is the one whose best tree predicts the most tokens per second. The
target's own T(n) does not depend on L: the caller measures it once (:func:`profile_model`) and passes the
tables in.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..errors import ProfileError, SolverError
from ..model import Transformer
from ..model.tuned_linear import linear_record
from ..profiles import LatencyCurve
from ..solver.hardware import Choice, choose
from .acceptance import AcceptanceCounts, measure_acceptance
from ..device import device_slug
from .latency import LatencyTable, build_latency_profile, method_text, profile_drafter

__all__ = ["LayerChoice", "LayerSweep", "default_layer_grid", "check_layers", "sweep_layers", "DRAFT_TOKENS"]

ProgressFn = Callable[[str, int, int], None]

#: The draft widths w timed per L by default (tokens). Per-level trees interpolate c(w) between them; the
#: solver never reads c past the largest.
DRAFT_TOKENS = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class LayerChoice:
    """What one L measured and what the solver makes of it.

    Attributes:
        num_layers: L, the target's leading blocks the draft runs (``1 .. n_layers - 1``).
        counts: the acceptance trials of ``self:L`` (:func:`measure_acceptance` with a
            :class:`~sequoia_opt.drafting.drafters.LayerSkipDrafter`), greedy or sampling as asked.
        draft_tables: c(w) of ``self:L`` in ms, one :class:`LatencyTable` per context of the target tables
            (:func:`profile_drafter` with the ``self:L`` cost probe).
        curve: the target's tables and these draft tables as a validated ``treeopt-latency/1`` curve, draft
            cost model ``"per-level"``, drafter named ``self:L`` (:func:`build_latency_profile`).
        choice: the hardware-aware choice for this L's acceptance vector and curve
            (:func:`~sequoia_opt.solver.hardware.choose` at the sweep's context), or None when there were no
            trials or the solver refused (ProfileError / SolverError).
        expected_tokens: G of the chosen tree, tokens per step (1.0 when ``choice`` is None: plain decoding).
        predicted_speedup: the choice's predicted speedup over plain decoding (1.0 when ``choice`` is None).
        c1_over_T1: c(1) / T(1) at the sweep's context: one draft forward over one token against one
            target forward over one token, from the measured tables (medians, unrounded).
    """

    num_layers: int
    counts: AcceptanceCounts
    draft_tables: list[LatencyTable]
    curve: LatencyCurve
    choice: Choice | None
    expected_tokens: float
    predicted_speedup: float
    c1_over_T1: float


@dataclass
class LayerSweep:
    """The rows of a sweep, in increasing L, and the best of them.

    Attributes:
        rows: one :class:`LayerChoice` per L swept, L increasing.
        best: the row with the highest ``predicted_speedup``; ties go to the smaller L (the cheaper draft,
            and the smaller share of the target's cache it writes).
    """

    rows: list[LayerChoice]
    best: LayerChoice


def default_layer_grid(n_layers: int, count: int = 6) -> list[int]:
    """``count`` values of L spread evenly over ``1 .. n_layers - 1``, always ending at ``n_layers - 1``.

    The grid is ``round(i * (n_layers - 1) / count)`` for ``i = 1 .. count`` (halves round up), made distinct:
    its top is the most accurate draft there is (one layer short of the target), its bottom
    ``(n_layers - 1) / count``; L = 1 is in the grid only when the spacing is at most about 1. A target not
    trained for early exit usually needs most of its layers to be accepted, so the top of the range is
    always measured. With ``count >= n_layers - 1`` the grid is every L. Example: 30 layers ->
    ``[5, 10, 15, 19, 24, 29]``.

    Raises:
        ProfileError: ``n_layers < 2`` (no L leaves a layer out) or ``count < 1``.
    """
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 2:
        raise ProfileError(f"a self:L draft needs a target of at least 2 layers (L in 1..n_layers-1), the "
                           f"target has {n_layers}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ProfileError(f"the layer grid needs at least one L, got count = {count!r}")
    top = n_layers - 1
    if count >= top:
        return list(range(1, top + 1))
    return sorted({max(1, math.floor(i * top / count + 0.5)) for i in range(1, count + 1)})


def check_layers(layers: Sequence[int], n_layers: int, *, what: str = "the layer grid") -> list[int]:
    """Check the L values to sweep against the target's ``n_layers`` and return them sorted, without
    duplicates. (Nothing is loaded or run: call it before the weights load.) ``what`` names the grid in
    messages (the CLI passes ``--layers``).

    Raises:
        ProfileError: one line: an empty grid, an L that is not an integer, or one outside
            ``1 .. n_layers - 1`` (L = n_layers would be the target itself).
    """
    vals = list(layers)
    if not vals:
        raise ProfileError(f"{what} is empty: give at least one L in 1..{n_layers - 1}")
    for L in vals:
        if isinstance(L, bool) or not isinstance(L, numbers.Integral):
            raise ProfileError(f"{what} must hold integers, got L = {L!r}")
        if not 1 <= L <= n_layers - 1:
            raise ProfileError(f"{what} has L = {L}: L must be in 1..{n_layers - 1} (the target has {n_layers} "
                               "layers; L = n_layers would be the target itself)")
    return sorted({int(L) for L in vals})


def _ms_at_one(table: LatencyTable, what: str) -> float:
    """The median ms at one token of a measured table (ProfileError when n = 1 was not measured)."""
    if 1 not in table.tokens:
        raise ProfileError(f"the {what} table at context {table.context} did not measure one token; n = 1 is the "
                           "plain-decoding baseline (T(1)) and the draft's smallest forward (c(1))")
    return table.timings[table.tokens.index(1)].median_ms


def _solution(counts: "AcceptanceCounts", budget: int, max_depth: int, max_branching: int):
    """The DP solution ``treeopt solve --acceptance-model auto`` would use for the profile these counts make
    (per-depth vectors when the positional check fails on two depths or more, else the pooled vector)."""
    from ..profiles import AcceptanceProfile
    from ..solver.depth import solve_profile
    from .acceptance import _positional_flag

    prof = AcceptanceProfile(id="sweep", acceptance=counts.vector(), measured=_positional_flag(counts),
                             by_depth=counts.depth_vectors(min_trials=30))
    return solve_profile(prof, budget, max_depth, max_branching, "auto")[0]


def sweep_layers(
    target: Transformer,
    prompt_ids: Sequence[Sequence[int]],
    *,
    target_tables: list[LatencyTable],
    step_overhead_ms: float,
    layers: Sequence[int] | None = None,
    width: int = 8,
    depth: int = 4,
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    draft_tokens: Sequence[int] = DRAFT_TOKENS,
    budget: int = 64,
    max_depth: int = 10,
    max_branching: int = 8,
    eos_ids: Sequence[int] = (),
    backend: str = "auto",
    context: int | None = None,
    target_name: str = "target",
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    progress: ProgressFn | None = None,
    rounds: int = 1,
    paired: bool = True,
    **timing_kw,
) -> LayerSweep:
    """Measure ``self:L`` for every L of ``layers`` and choose, per L, the hardware-aware tree; return the
    rows and the L with the highest predicted speedup.

    Per L, in increasing order: the acceptance trials of a
    :class:`~sequoia_opt.drafting.drafters.LayerSkipDrafter` over ``prompt_ids`` (:func:`measure_acceptance`
    with a ``width`` x ``depth`` measurement tree, ``max_new_tokens`` per prompt, greedy when
    ``temperature`` is 0); its c(w) at every context of ``target_tables`` and every w of ``draft_tokens``
    (:func:`profile_drafter`, ``rounds`` and ``paired`` as :func:`~sequoia_opt.profiling.latency.profile_model`,
    ``timing_kw`` passed on: ``min_repeats``, ``max_repeats``, ...); the latency curve of target + this draft
    (:func:`build_latency_profile`, cost model ``"per-level"``, drafter ``self:L``); and
    :func:`~sequoia_opt.solver.hardware.choose` (``budget`` nodes incl. the root, ``max_depth``,
    ``max_branching``) at ``context``.

    Args:
        target: the target model; the drafts are its first L blocks (weights and KV cache shared).
        prompt_ids: token id lists (at least one), the acceptance prompts.
        target_tables: the target's T(n) tables in ms (:func:`profile_model` output: one per context,
            measuring n = 1 and up to at least ``budget``). The target is timed once, by the caller; the
            drafts are timed at these tables' contexts.
        step_overhead_ms: the fixed per-step cost in ms (:func:`measure_step_overhead`), the same for every L
            (verification and cache compaction do not depend on the draft).
        layers: the L values (default :func:`default_layer_grid` of the target's ``n_layers``); swept sorted,
            without duplicates.
        draft_tokens: the draft widths w timed (tokens); must include 1 (c(1) is the ratio reported).
        context: the context length (tokens) the choice and ``c1_over_T1`` read the curve at: one of the
            target tables' contexts (default: the first table's).
        target_name, device, dtype: metadata of the curves (default: ``"target"``, the target's device and
            dtype); each curve's id is ``<device slug>_<target_name>__self-L<L>_<dtype>``, as ``treeopt
            profile latency --draft self:L`` names its profile.
        progress: ``progress(what, done, total)`` per measured point; ``what`` starts ``L=<L> acceptance`` or
            ``L=<L> draft timing``.

    Returns:
        :class:`LayerSweep`: rows in increasing L; ``best`` the highest predicted speedup (ties: smaller L).

    Raises:
        ProfileError: before anything is measured: an empty or out-of-range layer grid (L in
            ``1 .. n_layers - 1``), no prompts, no target tables, a table without n = 1, ``draft_tokens``
            without 1 or with a w < 1, a context that is not one of the tables', a context + widest draft
            past the target's positions, ``budget`` past the largest target count measured, ``rounds < 1``,
            ``width`` / ``depth`` / ``max_new_tokens`` below 1.
        SolverError: ``budget``, ``max_depth`` or ``max_branching`` below 1.
        DecodingError: as :func:`measure_acceptance` (a prompt too long for the context, ids outside the
            vocabulary, ...), before the first L's first forward.
    """
    n_layers = target.config.n_layers
    grid = check_layers(default_layer_grid(n_layers) if layers is None else layers, n_layers)
    if not prompt_ids:
        raise ProfileError("no prompts to measure acceptance on")
    for name, value in (("width", width), ("depth", depth), ("max_new_tokens", max_new_tokens),
                        ("rounds", rounds)):
        if value < 1:
            raise ProfileError(f"{name} must be at least 1, got {value}")
    for name, value in (("budget", budget), ("max depth", max_depth), ("max branching", max_branching)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SolverError(f"{name} must be an integer >= 1, got {value!r}")
    if not target_tables:
        raise ProfileError("no target latency tables: time the target first (profile_model)")
    dtok = sorted({int(w) for w in draft_tokens})
    if not dtok or dtok[0] < 1:
        raise ProfileError(f"draft widths must be at least 1 token, got {list(draft_tokens)}")
    if dtok[0] != 1:
        raise ProfileError(f"draft widths must include 1 (c(1) is the draft's smallest forward), got {dtok}")
    contexts = [t.context for t in target_tables]
    ctx = contexts[0] if context is None else int(context)
    if ctx not in contexts:
        raise ProfileError(f"context {context} tokens is not one of the target tables' contexts {contexts}")
    t_one = {t.context: _ms_at_one(t, "target") for t in target_tables}
    top = max(contexts) + dtok[-1]
    if top > target.config.max_position_embeddings:
        raise ProfileError(f"context {max(contexts)} + {dtok[-1]} draft tokens exceeds the target's context of "
                           f"{target.config.max_position_embeddings} tokens")
    table_at = target_tables[contexts.index(ctx)]
    if budget > max(table_at.tokens):
        raise ProfileError(f"budget {budget} exceeds the largest target token count {max(table_at.tokens)} "
                           f"measured at context {ctx}; refusing to extrapolate (lower the budget or time more "
                           "target tokens)")

    from ..drafting.drafters import LayerSkipDrafter
    from ..drafting.registry import CostProbe

    dev = torch.device(device) if device is not None else target.device
    dt = dtype if dtype is not None else target.dtype
    dt_name = str(dt).removeprefix("torch.")
    method = method_text(rounds, paired, dtok)

    def tagged(L: int, phase: str) -> ProgressFn | None:
        if progress is None:
            return None
        return lambda what, done, total: progress(f"L={L} {phase}, {what}", done, total)

    rows: list[LayerChoice] = []
    for L in grid:
        counts = measure_acceptance(target, lambda L=L: LayerSkipDrafter(target, L), prompt_ids, width=width,
                                    depth=depth, temperature=temperature, top_p=top_p, seed=seed,
                                    max_new_tokens=max_new_tokens, eos_ids=eos_ids, backend=backend,
                                    progress=tagged(L, "acceptance"))
        dtables = profile_drafter(target, CostProbe(f"self:{L} draft", model=target, num_layers=L), dtok, contexts,
                                  backend=backend, progress=tagged(L, "draft timing"), rounds=rounds, paired=paired,
                                  **timing_kw)
        curve = build_latency_profile(
            target_tables=target_tables, draft_tables=dtables, step_overhead_ms=step_overhead_ms, device=dev,
            dtype=dt, target_name=target_name, target_config=target.config, draft_name=f"self:{L}",
            draft_config=None, random_weights=False,
            profile_id=f"{device_slug(dev)}_{target_name}__self-L{L}_{dt_name}", method=method,
            draft_cost_model="per-level", command="treeopt profile layers", linear=linear_record(target))
        choice: Choice | None = None
        if counts.trials:
            try:
                choice = choose(counts.vector(), curve, budget, max_depth, max_branching, context=ctx,
                                solution=_solution(counts, budget, max_depth, max_branching))
            except (ProfileError, SolverError):
                choice = None
        c1 = _ms_at_one(dtables[contexts.index(ctx)], f"self:{L} draft")
        rows.append(LayerChoice(
            num_layers=L, counts=counts, draft_tables=dtables, curve=curve, choice=choice,
            expected_tokens=choice.expected_tokens if choice is not None else 1.0,
            predicted_speedup=choice.speedup if choice is not None else 1.0,
            c1_over_T1=c1 / t_one[ctx]))
    # a root-only choice scores 1 up to rounding: compare at 1e-9, as choose() ranks its candidates
    best = max(rows, key=lambda r: (round(r.predicted_speedup, 9), -r.num_layers))
    return LayerSweep(rows=rows, best=best)
