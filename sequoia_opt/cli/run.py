"""``treeopt run``: plain and tree speculative decoding on the same prompts, speedup and tokens per step
against the prediction, and (greedy) token-for-token equality with plain decoding.

``treeopt run --compare-drafters``: several drafters side by side (``--draft`` repeated, each paired in
order with its own ``-a`` acceptance and ``-l`` latency profile, by default the files ``treeopt profile``
writes): each drafter's best tree is solved here from its own profiles
(:func:`~sequoia_opt.jobs.run.plan_drafter`), then plain decoding once and every drafter's tree run on the
same prompts (:func:`~sequoia_opt.jobs.run.compare_drafters`): one row per drafter.

Two drafters in one tree (issue 16): ``treeopt run --draft LIGHT --draft STRONG --tree GRAFT.yaml`` runs a
grafted tree (``treeopt-tree/2`` naming both, :class:`~sequoia_opt.drafting.policies.GraftPolicy`), the strong
drafter called every step or when ``--scheduler`` says; ``--merge`` with one ``--tree`` per ``--draft`` runs
each drafter's own tree merged into one (SpecInfer, :class:`~sequoia_opt.drafting.policies.MergePolicy`). Both
add a per-drafter table (calls, call rate, time, accepted nodes) to the trees table.

``treeopt run --tree T.yaml --adapt -a ACC.yaml -l LAT.yaml`` (issue 17): each tree also runs adapted, as
``<name> (adaptive)`` in the same table: its tree is re-solved every ``--adapt-every`` steps from the
acceptance this run's verifications measure over the last ``--adapt-window`` steps (the profile ``-a`` as
prior, worth ``--adapt-prior-weight`` trials per rank), with the hardware-aware choice of ``treeopt solve`` on
``-l``, within the tree's budget / depth / branching limits
(:class:`~sequoia_opt.drafting.policies.AdaptiveTreePolicy`). A re-solve table (step, prompt, new tree size,
depth, predicted tokens per step) follows; the results JSON holds the whole log."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from ..errors import TreeoptError
from ..omp import run_policy
from ..report import Report
from ..tree import TreeMetadata
from .common import (BackendOpt, CudaGraphsOpt, DeviceOpt, DtypeOpt, JsonOpt, PromptsOpt, SeedOpt, TargetOpt,
                     TemperatureOpt, TopPOpt, WeightsOpt, _check_results_dir, _check_run_options, _check_tree_readable,
                     _graft_tree_names, _load_graft_tree, _load_tree_entry, _print_error, app,
                     check_cuda_graphs, graphed, handle_errors, located_prompts, note, progress_bar, setting_notes)
from ..drafting.policies.adaptive import DEFAULT_EVERY, DEFAULT_PRIOR_WEIGHT, DEFAULT_WINDOW
from .render import render
from ..jobs.entries import (DEFAULT_COMPARED_DRAFTERS, adaptive_entries, baseline_entries, check_adapt_options,
                            check_dynamic_memory, check_trees_fit, dynamic_entries, dynamic_settings, merged_topology,
                            oversized_tree_warnings, plan_drafters, too_deep_warning, too_deep_warnings,
                            tree_mismatch_warnings)


DraftsOpt = Annotated[
    Optional[list[str]], typer.Option(
        "--draft", help="Drafter: a draft checkpoint (HF folder or .gguf; default: the bundled demo draft), self:L "
        "(the target's first L layers), lookup[:MIN-MAX] (n-gram prompt lookup) or a feature head on the target's "
        "hidden states (eagle3[:PATH], eagle:PATH, medusa:PATH). With --compare-drafters "
        "repeatable (default: the bundled draft model and lookup), each paired in order with one -a and one -l. "
        "Twice with a treeopt-tree/2 --tree: its light then its strong drafter; with --merge: one per --tree.")
]
ProfilesOpt = Annotated[
    Optional[list[Path]], typer.Option(
        "--acceptance", "-a", help="Acceptance profile: of the --compare baselines, and the prior of --adapt's "
        "estimate; with --compare-drafters one per --draft, in order (default: where treeopt profile acceptance "
        "writes it).")
]
LatenciesOpt = Annotated[
    Optional[list[Path]], typer.Option(
        "--latency", "-l", help="Latency profile: of the --compare baselines, and what --adapt's re-solves read; "
        "with --compare-drafters one per --draft, in order (default: where treeopt profile latency writes it).")
]


def _default_profiles(target: Optional[Path], draft: Optional[list[str]], acceptance: Optional[list[Path]],
                      latency: Optional[list[Path]], *, adapt: bool, device: str, temperature: float, top_p: float,
                      dtype: str, weights: str, prompts: Optional[Path] = None
                      ) -> tuple[Optional[list[Path]], Optional[list[Path]], list[str]]:
    """``--compare`` / ``--adapt`` with no -a / -l: the pair's profiles where ``treeopt profile`` writes them
    (:func:`~sequoia_opt.jobs.entries.default_profile_paths`), as the options' help says. Returns ``(acceptance,
    latency, notes)``: a default is taken only where its file exists (a note names it); --compare's latency is
    optional.

    Raises:
        TreeoptError: a profile the option needs is neither given nor at its default path (naming the path and
            the command that writes it).
    """
    from ..jobs.entries import default_profile_paths, profile_command
    from ..jobs.load import parse_drafter_spec

    spec = parse_drafter_spec(draft[0] if draft else None)  # a bad --draft fails here, before anything is read
    paths = default_profile_paths(target, spec, device=device, temperature=temperature, top_p=top_p, dtype=dtype,
                                  weights=weights)
    what = "--adapt" if adapt else "--compare"
    out, notes = [acceptance, latency], []
    for i, (kind, opt) in enumerate((("acceptance", "-a"), ("latency", "-l"))):
        if out[i] is not None:
            continue
        if paths[i].is_file():
            out[i] = [paths[i]]
            notes.append(f"{what}: {opt} {paths[i]} (where treeopt profile {kind} writes it; pass {opt} for another)")
        elif kind == "acceptance" or adapt:
            how = profile_command(kind, target, spec, device=device, temperature=temperature, top_p=top_p,
                                  dtype=dtype, weights=weights, prompts=prompts)  # writes the file the run reads
            raise TreeoptError(f"{what} needs {opt}, the {kind} profile: none given and none at {paths[i]}, where "
                               f"{how} writes it")
    return out[0], out[1], notes


@app.command("run")
@handle_errors
def run_cmd(
    tree: Annotated[Optional[list[Path]], typer.Option("--tree", help="Tree file(s) to run (treeopt YAML, JSON or a Medusa choice list); repeatable. Required unless --compare-drafters, --dynamic or a plan --policy (schedule: / adaptive-schedule:).")] = None,
    target: TargetOpt = None,
    draft: DraftsOpt = None,
    prompts: PromptsOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens generated per prompt.")] = 128,
    num_prompts: Annotated[Optional[int], typer.Option("--num-prompts", help="Use only the first N prompts.")] = None,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    seed: SeedOpt = 0,
    compare: Annotated[bool, typer.Option("--compare", help="Also run the best chain and k-ary tree under --acceptance (and --latency).")] = False,
    compare_drafters: Annotated[bool, typer.Option(
        "--compare-drafters", help="Run each --draft's own best tree (solved here from its -a / -l profiles, "
        "hardware-aware) and plain decoding once, on the same prompts, and compare them side by side.")] = False,
    check_step: Annotated[Optional[bool], typer.Option(
        "--check-step/--no-check-step", help="With --compare-drafters (default on): time each drafter's chosen "
        "tree's step again after the choice, on four of its acceptance profile's prompts, and where it misses the "
        "solver's speedup by more than 10 %, time the best smaller trees too and keep the one that checks fastest "
        "(as the demo does; seconds per drafter).")] = None,
    acceptance: ProfilesOpt = None,
    latency: LatenciesOpt = None,
    merge: Annotated[bool, typer.Option(
        "--merge", help="Two or more --draft, one --tree each (that drafter's own tree, in order): every drafter "
        "proposes its tree each step and their union is verified (SpecInfer's merge).")] = False,
    scheduler: Annotated[Optional[Path], typer.Option(
        "--scheduler", help="With a grafted tree (two --draft, a treeopt-tree/2 --tree): the scheduler file "
        "(treeopt profile scheduler) deciding per step whether the strong drafter is called (default: every "
        "step).")] = None,
    adapt: Annotated[Optional[bool], typer.Option(
        "--adapt/--no-adapt", help="Also run each --tree adapted: re-solved every --adapt-every steps from the "
        "acceptance this run measures (prior: -a; hardware-aware choice: -l), guarded (the safest tree the live "
        "acceptance supports when it leaves the profile's prediction interval), reported next to the static tree. "
        "Default: on when -a and -l are given with one drafter's --tree files.")] = None,
    adapt_every: Annotated[Optional[int], typer.Option(
        "--adapt-every", help=f"With --adapt: steps between re-solves (default {DEFAULT_EVERY}).")] = None,
    adapt_window: Annotated[Optional[int], typer.Option(
        "--adapt-window", help=f"With --adapt: steps the acceptance estimate remembers (default {DEFAULT_WINDOW}).")] = None,
    adapt_prior_weight: Annotated[Optional[float], typer.Option(
        "--adapt-prior-weight", help="With --adapt: pseudo-trials per rank the -a profile is worth in the estimate "
        f"(default {DEFAULT_PRIOR_WEIGHT:g}).")] = None,
    dynamic: Annotated[Optional[list[str]], typer.Option(
        "--dynamic", help="A dynamic-tree setting to run (repeatable): POLICY:steps=S,topk=K,budget=N with POLICY "
        "eagle | entropy | best-first, or a treeopt-dynamic/1 file (treeopt solve --dynamic -o). The tree is chosen "
        "each step from the draft's scores; with or without --tree.")] = None,
    calibration: Annotated[Optional[Path], typer.Option(
        "--calibration", help="With --dynamic: the calibration profile to predict each setting's tokens per step "
        "from; needs -l (the latency profile its speedup is predicted from).")] = None,
    policy: Annotated[Optional[str], typer.Option(
        "--policy", help="The drafting policy each --tree runs with (a plan's needs no --tree): static (default: the tree every step), "
        "chain[:N[,MIN[,PMIN]]] (a chain grown token by token, llama.cpp's draft-max/-min/-p-min rule), "
        "dynamic:POLICY:steps=S,topk=K,budget=N, schedule:FILE (a treeopt tune plan: the chain of the batch range), "
        "adaptive-schedule:FILE[,every=N,window=W,prior-weight=X] (that plan re-ranked during the run from the live "
        "acceptance), or one a plugin "
        "registered (TREEOPT_PLUGINS).")] = None,
    budget: Annotated[Optional[int], typer.Option("--budget", "-n", help="With --compare-drafters: largest tree considered, nodes incl. the root (default: each latency profile's largest measured token count). With --adapt: largest re-solved tree (default: the tree's budget limit).")] = None,
    max_depth: Annotated[Optional[int], typer.Option("--max-depth", "-d", help="With --compare-drafters: depth limit D (default 10). With --adapt: of the re-solves (default 16, as treeopt solve).")] = None,
    max_branching: Annotated[Optional[int], typer.Option("--max-branching", "-b", help="With --compare-drafters: most children per node B (default 8). With --adapt: of the re-solves (default: the tree's, else 32).")] = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    weights: WeightsOpt = "float32",
    backend: BackendOpt = "auto",
    results_dir: Annotated[Path, typer.Option("--results-dir", help="Where <run-id>.json and .csv go.")] = Path("results"),
    engine: Annotated[str, typer.Option(
        "--engine", help="treeopt (the bundled decoder) | llama.cpp: plain and chain speculative decoding on "
        "llama.cpp, --tree being llama.cpp flags (solve --format llama.cpp -o) or a chain tree.")] = "treeopt",
    threads: Annotated[Optional[int], typer.Option("--threads", help="CPU threads: llama.cpp's with --engine "
                                                   "llama.cpp, torch's otherwise (default: the CPUs this process may "
                                                   "use); run with the threads the latency profile was measured "
                                                   "with.")] = None,
    cuda_graphs: CudaGraphsOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Run plain decoding and tree speculative decoding on the same prompts; report speedup, tokens per
    step against the prediction, the time split, and (greedy) exact equality with plain decoding. With
    --compare-drafters: every drafter's own best tree against one plain baseline."""
    from ..engines import engine_name
    from ..model.tuned_linear import check_precision
    from ..jobs.load import load_pair, parse_device, parse_drafter_spec, parse_dtype
    from ..prompts import demo_prompts_path, encode_prompts, load_prompts

    _check_results_dir(results_dir)  # before any file is read or model loaded: a run's results must land
    if engine_name(engine) != "treeopt":
        if engine_name(engine) != "llama.cpp":
            raise TreeoptError(f"run --engine {engine_name(engine)}: treeopt runs llama.cpp here; the GPU engines are "
                               "profiled (profile latency --engine) and served by their own servers")
        from .engine import run_llamacpp

        run_llamacpp(tree=tree, target=target, draft=draft, prompts=prompts, max_new_tokens=max_new_tokens,
                     num_prompts=num_prompts, acceptance=acceptance, latency=latency, threads=threads,
                     results_dir=results_dir, as_json=as_json,
                     other={"--temperature": temperature != 0.0, "--top-p": top_p != 1.0, "--compare": compare,
                            "--compare-drafters": compare_drafters, "--check-step": check_step is not None,
                            "--merge": merge, "--scheduler": scheduler, "--adapt": adapt, "--dynamic": dynamic,
                            "--calibration": calibration,
                            "--device": device != "cpu", "--dtype": dtype != "float32",
                            "--backend": backend != "auto", "--weights": weights != "float32",
                            "--cuda-graphs": cuda_graphs, "--policy": policy is not None})
        return
    check_cuda_graphs(cuda_graphs, device)
    if cuda_graphs and (compare_drafters or merge or scheduler is not None or len(draft or []) > 1):
        raise TreeoptError("--cuda-graphs runs one drafter's --tree files (and --compare, --adapt, --dynamic): drop "
                           "--compare-drafters / --merge / a second --draft (or --cuda-graphs)")
    if threads is not None:
        if threads < 1:
            raise TreeoptError(f"--threads must be at least 1, got {threads}")
        import torch

        torch.set_num_threads(threads)  # the forwards' intra-op threads, as tune / profile measured them
    from ..drafting.registry import parse_policy

    pkind, popts = parse_policy(policy)  # a bad --policy fails here, before anything is read
    if policy is not None and pkind.name != "static" and (compare_drafters or merge or scheduler is not None or adapt
                                                          or compare or len(draft or []) > 1):
        raise TreeoptError(f"--policy {policy} runs one drafter's --tree files (or its own plan): it does not combine "
                           "with --compare, --compare-drafters, --merge, --scheduler, --adapt or two --draft")
    check_precision(weights)
    if max_new_tokens < 1:
        raise TreeoptError("--max-new-tokens must be at least 1")
    adapt_default = adapt is None
    if adapt is None:  # on where a latency profile (and the prior) are given with one drafter's trees
        adapt = bool(tree and acceptance and latency and len(acceptance) == 1 and len(latency) == 1
                     and not compare_drafters and not merge and scheduler is None and len(draft or []) <= 1
                     and (policy is None or pkind.name == "static") and not dynamic
                     and not any(_graft_tree_names(t) for t in tree))
    profile_notes: list[str] = []
    if (compare or adapt) and tree and not (compare_drafters or merge or scheduler is not None or len(draft or []) > 1):
        acceptance, latency, profile_notes = _default_profiles(
            target, draft, acceptance, latency, adapt=bool(adapt), device=device, temperature=temperature,
            top_p=top_p, dtype=dtype, weights=weights, prompts=prompts)
    adapt_every, adapt_window, adapt_prior_weight = check_adapt_options(
        adapt, adapt_every, adapt_window, adapt_prior_weight, acceptance=acceptance, latency=latency,
        multi=compare_drafters or merge or scheduler is not None or len(draft or []) > 1)
    if compare_drafters and (merge or scheduler is not None):
        raise TreeoptError("--compare-drafters runs each drafter's own best tree alone: drop --merge / --scheduler (or "
                           "--compare-drafters)")
    if compare_drafters and (dynamic or calibration is not None):
        raise TreeoptError("--compare-drafters runs each drafter's own static tree: --dynamic / --calibration run one "
                           "drafter's settings with its --tree files (drop them, or --compare-drafters)")
    if check_step is not None and not compare_drafters:
        raise TreeoptError("--check-step/--no-check-step applies only with --compare-drafters (it checks the trees "
                           "solved there; a --tree file's prediction is checked by the run itself)")
    if compare_drafters:
        _compare_drafters_cmd(
            tree=tree, target=target, drafts=draft, prompts=prompts, max_new_tokens=max_new_tokens,
            num_prompts=num_prompts, temperature=temperature, top_p=top_p, seed=seed, compare=compare,
            acceptance=acceptance, latency=latency, budget=budget, max_depth=max_depth, max_branching=max_branching,
            device=device, dtype=dtype, backend=backend, results_dir=results_dir, as_json=as_json, weights=weights,
            check_step=check_step is not False)
        return
    dyn_notes: list[str] = []
    dyn = dynamic_settings(dynamic, calibration, latency, multi=merge or scheduler is not None or len(draft or []) > 1,
                            adapt=adapt, notes=dyn_notes)
    if dynamic and not dyn and not tree:
        raise TreeoptError("no --dynamic setting is left to run: " + "; ".join(dyn_notes))
    if pkind.own_tree is not None and tree:  # the plan's trees would run under the --tree file's name
        raise TreeoptError(f"--policy {policy} runs the plan's own trees (one per batch range): drop --tree "
                           f"{tree[0]} (or run it in a run of its own)")
    own = pkind.own_tree(popts) if pkind.own_tree is not None else None  # a plan runs alone
    if not tree and not dyn and own is None:
        raise TreeoptError("--tree is required: the tree file(s) to run (or --compare-drafters, to run each "
                           "drafter's own best tree; --dynamic, a dynamic-tree setting; or --policy schedule:FILE / "
                           "adaptive-schedule:FILE, a plan)")
    if compare and not tree:
        raise TreeoptError("--compare sizes its baselines by the --tree files: add a --tree (or drop --compare)")
    tree = tree or []
    for name, value in (("--budget", budget), ("--max-depth", max_depth), ("--max-branching", max_branching)):
        if value is not None and not adapt:
            raise TreeoptError(f"{name} limits the trees --compare-drafters solves (or --adapt re-solves); add one "
                               f"(or drop {name})")
        if value is not None and value < 1:
            raise TreeoptError(f"{name} must be at least 1, got {value}")
    n_draft = len(draft or [])
    grafted = [p for p in tree if _graft_tree_names(p)] if n_draft > 1 and not merge else []
    if merge or (grafted and len(grafted) == len(tree) and n_draft == 2):
        _multi_drafter_cmd(
            trees=tree, target=target, drafts=draft, merge=merge, scheduler=scheduler, prompts=prompts,
            max_new_tokens=max_new_tokens, num_prompts=num_prompts, temperature=temperature, top_p=top_p, seed=seed,
            compare=compare, acceptance=acceptance, latency=latency, device=device, dtype=dtype, backend=backend,
            results_dir=results_dir, as_json=as_json, weights=weights)
        return
    if n_draft > 1 and not merge:
        for p in tree:  # a missing or broken file is reported as such, not as a --draft count that does not fit
            if p not in grafted:
                _check_tree_readable(p)
    if grafted and n_draft != 2:
        raise TreeoptError(f"a grafted tree ({grafted[0]}) runs two drafters, its light then its strong one: got "
                           f"{n_draft} --draft")
    if grafted:
        single = next(p for p in tree if p not in grafted)
        raise TreeoptError(f"{single} is one drafter's tree and {grafted[0]} a grafted tree of two: run them "
                           "separately (or --merge: one drafter's own tree per --draft)")
    if n_draft > 1:
        raise TreeoptError(f"--draft was given {n_draft} times: one drafter runs the --tree files; to compare "
                           "drafters, each with its own best tree, add --compare-drafters; to run two drafters in "
                           "one tree, give a treeopt-tree/2 tree naming them (treeopt solve --pair-acceptance) or "
                           "add --merge with one --tree per --draft")
    if scheduler is not None:
        raise TreeoptError("--scheduler decides when a grafted tree calls its strong drafter: give two --draft (light, "
                           "strong) and the treeopt-tree/2 tree naming them")
    for p in tree:
        names = _graft_tree_names(p)
        if not names:
            _check_tree_readable(p)
        if names:
            raise TreeoptError(f"tree {p} names {len(names)} drafters ({', '.join(names)}): run it with one --draft "
                               "per drafter, in that order, light first")
    if acceptance is not None and len(acceptance) > 1 or latency is not None and len(latency) > 1:
        raise TreeoptError("--compare takes one --acceptance and at most one --latency (several pair with several "
                           "--draft under --compare-drafters)")
    acceptance_path = acceptance[0] if acceptance else None
    latency_path = latency[0] if latency else None
    spec = parse_drafter_spec(draft[0] if draft else None)  # a bad --draft fails before anything is read
    plan_notes = []
    if own is not None and not draft:  # a plan solved for a drafter run can make by its name: that one drafts
        planned = _plan_drafter(popts.get("solved_for", {}).get("profiled_draft"))
        if planned is not None:
            spec = planned
            popts.setdefault("solved_for", {})["profiled_draft"] = planned.label  # 'eagle3' is this head: no warning
            plan_notes.append(f"drafting with the plan's drafter {planned.label} (--draft to choose another)")
    if (dyn or pkind.name == "dynamic") and spec is not None and not spec.entry.has_probs:
        # refused here, by its own name (the policy built later named every drafter 'draft'), before models load
        raise TreeoptError(f"drafter {spec.label!r} has no draft probabilities: a dynamic tree (--dynamic, --policy "
                           "dynamic) is chosen from them; use a draft model, self:L or a feature head")
    entries = [_load_tree_entry(p) for p in tree]
    if own is not None:  # the plan's row: named after its file, the tree it serves at batch 1 as its topology
        from ..jobs.run import TreeEntry

        # the pair and engine the plan was solved for: tree_mismatch_warnings below names another one
        entries = [TreeEntry(own[0], own[1], TreeMetadata(extra=dict(popts.get("solved_for", {}))))]
    if pkind.name != "static":  # the tree file's prediction is the static tree's: not this policy's
        batch1 = popts.get("batch1") or {}  # a plan's own, at the one request at a time run serves
        for e in entries:
            e.name = f"{e.name} ({policy})" if own is None else e.name
            e.metadata = replace(e.metadata, expected_tokens_per_step=batch1.get("expected_tokens_per_step"),
                                 predicted_speedup=batch1.get("predicted_speedup"), solver=f"policy:{pkind.name}",
                                 extra={**e.metadata.extra, **batch1.get("extra", {})})
            e.policy = lambda drafter, t=e.tree: pkind.build(drafter, t, popts)
    seen: dict[str, int] = {}
    for e in entries:  # two files called tree.yaml in different folders must not share a results row name
        seen[e.name] = seen.get(e.name, 0) + 1
        if seen[e.name] > 1:
            e.name = f"{e.name}#{seen[e.name]}"
    if not compare and not adapt and (acceptance_path is not None or latency_path is not None and calibration is None):
        if pkind.name != "static":  # --compare and --adapt run static trees only: the advice below is a dead end
            raise TreeoptError(f"--acceptance / --latency choose the --compare baselines or --adapt's re-solves, "
                               f"which run static trees; --policy {policy} reads neither: drop them")
        raise TreeoptError("--acceptance / --latency choose the --compare baselines (or --adapt's prior and "
                           "re-solves); add --compare or --adapt (or drop them)")
    adapt_notes: list[str] = []
    if adapt:
        twins, adapt_notes = adaptive_entries(entries, acceptance_path, latency_path, every=adapt_every,
                                               window=adapt_window, prior_weight=adapt_prior_weight, budget=budget,
                                               max_depth=max_depth, max_branching=max_branching)
        entries = [x for pair in zip(entries, twins) for x in pair]  # each adaptive tree after its static one
        if adapt_default:
            adapt_notes.insert(0, "--adapt is on by default with -a and -l: each tree also runs adapted and guarded "
                                  "(--no-adapt runs the static trees alone)")
    baseline_notes: list[str] = []
    value_label = None
    if compare:
        entries, extra, baseline_notes, value_label = baseline_entries(entries, acceptance_path, latency_path)
        entries += extra
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev, temperature, top_p)
    pfile = prompts or demo_prompts_path("eval")
    texts = load_prompts(pfile, limit=num_prompts)
    settings_notes = setting_notes(temperature=temperature, top_p=top_p, num_prompts=num_prompts,
                                   prompts_found=len(texts), prompts_file=pfile)
    check_dynamic_memory(dyn, target, dev)  # before the weights load
    try:
        pair = load_pair(target, spec, device=dev, dtype=dt, weights=weights, log=note)
    except TreeoptError as err:
        if not plan_notes:
            raise
        # the drafter came from the plan, not from a --draft the user typed: say so
        raise TreeoptError(f"{popts['source']} names drafter {spec.label}, which cannot run here: {err} (pass "
                           "--draft to run the plan with another)") from None
    if cuda_graphs:  # plain decoding and every tree replay the same graphed forwards
        import dataclasses

        pair = dataclasses.replace(pair, target=graphed(pair.target), draft=graphed(pair.draft))
    dyn_warnings: list[str] = []
    entries += dynamic_entries(dyn, pair, calibration, latency_path, temperature, dyn_notes, dyn_warnings,
                               top_p=top_p)
    check_trees_fit(entries, pair)
    ids = encode_prompts(texts, pair.tokenizer, model=pair.target_name)
    from ..device import device_name

    adapt_warnings: list[str] = []
    if adapt or compare:  # the prior and curve every re-solve reads, the baselines' scores: of this pair, this device?
        from ..profiles import load_acceptance, load_latency, warn_on_mismatch

        who = " and ".join(w for w, on in (("--adapt", adapt), ("--compare", compare)) if on)
        adapt_warnings = [f"{who}: {w}" for w in warn_on_mismatch(
            acceptance=load_acceptance(acceptance_path), latency=load_latency(latency_path) if latency_path else None,
            device=device_name(dev), device_type=dev.type, dtype=str(dt).removeprefix("torch."),
            target=pair.target_name, draft=pair.draft_name, weights=pair.weights, temperature=temperature,
            top_p=top_p)]
    warnings = adapt_warnings + dyn_warnings + [w for e in entries for w in tree_mismatch_warnings(
        e.name, e.metadata, device=device_name(dev), dtype=str(dt).removeprefix("torch."),
        target=pair.target_name, draft=pair.draft_name, draft_cost_model=pair.cost_model, device_type=dev.type,
        omp_wait_policy=run_policy(dev.type), temperature=temperature,
        threads=_cpu_threads(dev), weights=pair.weights, top_p=top_p)]
    with located_prompts(texts, pfile):  # a prompt run refuses: named by path:line
        report = _run_and_report(pair, entries, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                 top_p=top_p, seed=seed, backend=backend, results_dir=results_dir, as_json=as_json,
                                 settings={"prompts": str(prompts or "demo eval prompts")}, value_label=value_label)
    report.warnings = warnings + report.warnings
    report.notes = plan_notes + profile_notes + adapt_notes + baseline_notes + dyn_notes + settings_notes + report.notes
    if dev.type == "cpu":
        from ..omp import policy_note

        report.notes.append(policy_note())
    if cuda_graphs:
        stats = {role: m.stats.as_dict() for role, m in (("target", pair.target), ("draft", pair.draft))
                 if hasattr(m, "stats")}
        report.data["cuda_graphs"] = stats
        report.notes.append("forwards replayed from CUDA graphs: " + "; ".join(
            f"{role} {st['captures']} captured, {st['replays']} replays, {sum(st['eager'].values())} eager"
            for role, st in stats.items()))
    if compare:
        report.data["baseline_notes"] = baseline_notes
    render(report, as_json)
    if report.data.get("greedy_ok") is False:
        raise typer.Exit(1)


def _compare_drafters_cmd(*, tree, target, drafts, prompts, max_new_tokens, num_prompts, temperature, top_p, seed,
                          compare, acceptance, latency, budget, max_depth, max_branching, device, dtype, backend,
                          results_dir, as_json, weights="float32", check_step: bool = True) -> None:
    """``treeopt run --compare-drafters``: every check and every drafter's solve first, then the weights load
    (the target once), each chosen tree's step timed again (``check_step``,
    :func:`~sequoia_opt.jobs.compare.check_plans`), then one run: plain decoding and each drafter's best tree on
    the same prompts."""
    from ..jobs.compare import CHECK_KEYS, CHECK_PROMPTS, check_plans, compare_drafters, drafter_table
    from ..model.loaders import load_model_config
    from ..jobs.load import (check_drafter, default_target_path, load_drafters, parse_device, parse_drafter_spec,
                            parse_dtype)
    from ..profiles import warn_on_mismatch
    from ..device import device_name
    from ..prompts import PromptFileError, demo_prompts_path, encode_prompts, load_prompts, recorded_prompts_path

    if tree:
        raise TreeoptError("--compare-drafters runs each drafter's own best tree, solved from its profiles: drop "
                           "--tree (or run the tree files without --compare-drafters)")
    if compare:
        raise TreeoptError("--compare and --compare-drafters are separate modes (baselines of one drafter, or "
                           "drafters side by side): pass one")
    max_depth = 10 if max_depth is None else max_depth
    max_branching = 8 if max_branching is None else max_branching
    for name, value in (("--budget", budget), ("--max-depth", max_depth), ("--max-branching", max_branching)):
        if value is not None and value < 1:
            raise TreeoptError(f"{name} must be at least 1, got {value}")
    specs = [parse_drafter_spec(d) for d in (drafts if drafts else DEFAULT_COMPARED_DRAFTERS)]
    seen: dict[str, str] = {}
    for spec in specs:
        key = spec.label.lower()
        if key in seen:
            raise TreeoptError(f"--draft {spec.spec} is named twice (or two drafters share the label {spec.label!r}): "
                               "each drafter runs once, with its own profiles")
        seen[key] = spec.spec
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev, temperature, top_p)
    tpath = Path(target) if target else default_target_path()
    tconfig = load_model_config(tpath)
    for spec in specs:  # L in range, tokenizers: before the profiles are looked for
        check_drafter(spec, tconfig, tpath)
    plans, paths = plan_drafters(specs, acceptance, latency, target=target, device=dev, temperature=temperature,
                                  top_p=top_p, budget=budget, max_depth=max_depth, max_branching=max_branching,
                                  defaults=not drafts, prompts=prompts, dtype=str(dt).removeprefix("torch."),
                                  weights=weights)
    pfile = prompts or demo_prompts_path("eval")
    texts = load_prompts(pfile, limit=num_prompts)
    notes = setting_notes(temperature=temperature, top_p=top_p, num_prompts=num_prompts, prompts_found=len(texts),
                          prompts_file=pfile)
    pairs = load_drafters(target, specs, device=dev, dtype=dt, weights=weights, log=note)
    pair = pairs[0]
    check_trees_fit([p.entry(None) for p in plans], pair)
    ids = encode_prompts(texts, pair.tokenizer, model=pair.target_name)
    mode = "greedy" if temperature == 0 else "sampling"
    warnings: list[str] = []
    dtype_name = str(dt).removeprefix("torch.")
    for plan, dpair in zip(plans, pairs):
        on = dict(device=device_name(dev), device_type=dev.type, dtype=dtype_name, target=dpair.target_name,
                  draft=dpair.draft_name)
        for w in warn_on_mismatch(acceptance=plan.acceptance, latency=plan.curve, weights=dpair.weights,
                                  temperature=temperature, top_p=top_p, **on):
            if w not in warnings:
                warnings.append(w)
        limit = dpair.new_drafter().depth_limit  # Medusa's heads: a deeper tree is cut every step
        if limit is not None and plan.tree.tree_depth > limit:
            warnings.append(too_deep_warning(f"{plan.label}: its tree is", plan.tree.tree_depth, dpair.draft_name,
                                             limit))
        measured_mode = plan.acceptance.measured.get("mode")
        if measured_mode is not None and measured_mode != mode and plan.acceptance.measured.get("temperature") is None:
            warnings.append(f"acceptance profile {plan.acceptance.id!r} was measured in {measured_mode} mode, this "
                            f"run is {mode}: {plan.label}'s predicted tokens per step describe the other mode")
    from ..decoding.forward import check_capacity, check_each_prompt, check_prompt

    ctx = pair.target.config.max_position_embeddings
    with located_prompts(texts, pfile):  # every request checked before the step checks time anything
        check_each_prompt(ids, lambda p: check_capacity(len(check_prompt(p, pair.vocab_size)), max_new_tokens,
                                                        cache_len=ctx, context=ctx, model="the target"))
    check_notes: list[str] = []
    makers = [p.new_drafter for p in pairs]
    if check_step:  # the choice rode the latency curve's noise: each chosen step timed again, on profile prompts
        check_ids, where = [], []
        for plan in plans:
            recorded = plan.acceptance.measured.get("prompts")
            ppath, ids_, why = recorded_prompts_path(recorded), None, ""
            if ppath is not None:
                try:
                    ids_ = encode_prompts(load_prompts(ppath, limit=CHECK_PROMPTS), pair.tokenizer,
                                          model=pair.target_name) or None
                except PromptFileError as err:  # looked for, not required: the check runs on a random context
                    why = f"; its profile's prompts {ppath} do not load here: {err}"
            elif recorded:
                why = f"; its profile's prompts {recorded} are not on this machine"
            check_ids.append(ids_)
            where.append(f"{len(ids_)} prompts of {ppath}" if ids_
                         else f"a random context (its drafts mostly rejected{why})")
        with progress_bar() as progress:
            warnings.extend(check_plans(plans, pair.target, makers, check_ids, backend=backend, progress=progress))
        check_notes = [f"{p.label}: the chosen tree's step was timed again on {w}" for p, w in zip(plans, where)
                       if "step_check" in p.metadata.extra]  # a root alone has no step to check
    with progress_bar() as progress:
        cmp = compare_drafters(
            pair.target, plans, makers, ids, max_new_tokens=max_new_tokens,
            temperature=temperature, top_p=top_p, seed=seed, eos_ids=sorted(pair.tokenizer.eos_ids),
            backend=backend, progress=progress,
            settings={"target": pair.target_name, "compare_drafters": True,
                      "prompts": str(prompts or "demo eval prompts"),
                      "profiles": {p.label: {"acceptance": str(a), "latency": str(lat)}
                                   for p, (a, lat) in zip(plans, paths)},
                      # each tree's step timed again after the choice (jobs.compare.check_plan), when it was
                      "step_checks": {p.name: {k: p.metadata.extra[k] for k in CHECK_KEYS if k in p.metadata.extra}
                                      for p in plans if "step_check" in p.metadata.extra}})
    run = cmp.run
    jpath, cpath = run.save(results_dir)
    report = Report(title="treeopt run --compare-drafters")
    report.summary = {"target": pair.target_name, "drafters": ", ".join(p.label for p in plans), "prompts": len(ids),
                      "max new tokens": max_new_tokens, "mode": mode,
                      "plain decoding (tokens/s)": run.summaries[0].tokens_per_s, "results": f"{jpath}, {cpath}"}
    report.tables.append(drafter_table(cmp.rows))
    report.tables.append(_trees_table(run, temperature, "each drafter's own profiles and acceptance model, as in "
                                                        "the drafters table"))
    for plan, (a, lat) in zip(plans, paths):
        report.notes.append(f"{plan.label}: tree solved from {a} and {lat} (budget {plan.budget}, max depth "
                            f"{plan.max_depth}, max branching {plan.max_branching}, context {plan.context})")
        if plan.tree.size == 1 and "rechosen_from" not in plan.metadata.extra:  # else the check's warning says why
            report.notes.append(f"{plan.label}: no tree beats plain decoding under its profiles; its best tree is the "
                                "root alone (plain decoding through the speculative decoder)")
    report.notes.extend(notes + check_notes + _node_notes(run))
    report.warnings = warnings
    report.warnings += mismatch_warnings(run)
    report.data = {**run.to_dict(), "greedy_ok": run.greedy_ok if temperature == 0 else None,
                   "json": str(jpath), "csv": str(cpath)}
    render(report, as_json)
    if report.data["greedy_ok"] is False:
        raise typer.Exit(1)


def _multi_drafter_cmd(*, trees, target, drafts, merge, scheduler, prompts, max_new_tokens, num_prompts,
                       temperature, top_p, seed, compare, acceptance, latency, device, dtype, backend, results_dir,
                       as_json, weights="float32") -> None:
    """``treeopt run`` with several drafters in one tree: a grafted tree (two --draft, ``treeopt-tree/2`` trees
    naming them) or ``--merge`` (one drafter's own tree per --draft). Every check first (trees against the
    drafters, the graft plans, the scheduler's pair, the drafters' vocabularies against the target's config),
    then the weights load and one run: plain decoding and every multi-drafter tree on the same prompts. A
    failure during the run is one line, exit 1, and no results file.

    Raises:
        TreeoptError: as the checks above (exit 2, before any model forward).
    """
    from dataclasses import replace

    from ..drafting.policies import GraftPolicy, MergePolicy, load_scheduler
    from ..jobs.graft import graft_weights_warnings
    from ..jobs.run import TreeEntry, run_trees
    from ..jobs.load import default_target_path, load_drafters, model_label, parse_device, parse_drafter_spec, \
        parse_dtype
    from ..device import device_name
    from ..prompts import demo_prompts_path, encode_prompts, load_prompts

    if compare:
        raise TreeoptError("--compare scores one drafter's baselines; for two drafters treeopt solve --pair-acceptance "
                           "prints the grafted tree's (each drafter alone, the SpecInfer merge)")
    if acceptance or latency:
        raise TreeoptError("--acceptance / --latency choose the --compare baselines of one drafter: drop them with "
                           "several drafters")
    specs = [parse_drafter_spec(d) for d in drafts or []]
    seen: set[str] = set()
    for spec in specs:
        if spec.label.lower() in seen:
            raise TreeoptError(f"--draft {spec.spec} is named twice (or two drafters share the label {spec.label!r}): "
                               "each drafter proposes once per step")
        seen.add(spec.label.lower())
    notes: list[str] = []
    if merge:
        if len(specs) < 2:
            raise TreeoptError(f"--merge runs several drafters' own trees merged into one: give two or more --draft, "
                               f"one per --tree (got {len(specs)} --draft)")
        if len(trees) != len(specs):
            raise TreeoptError(f"--merge runs one --tree per --draft, in order: got {len(specs)} --draft and "
                               f"{len(trees)} --tree")
        if scheduler is not None:
            raise TreeoptError("--scheduler decides when a grafted tree calls its strong drafter; --merge calls every "
                               "drafter every step (drop one of them)")
        for p in trees:
            names = _graft_tree_names(p)
            if names:
                raise TreeoptError(f"--merge takes each drafter's own tree (treeopt-tree/1); {p} names "
                                   f"{len(names)} drafters ({', '.join(names)})")
        own = [_load_tree_entry(p) for p in trees]
    else:
        light, strong = specs
        grafts = [(Path(p), *_load_graft_tree(p, light, strong)) for p in trees]
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev, temperature, top_p)
    tp = Path(target) if target else default_target_path()
    sched = None
    if scheduler is not None:
        sched = load_scheduler(scheduler, pair={"target": model_label(tp), "light": specs[0].label,
                                                "strong": specs[1].label})
    pfile = prompts or demo_prompts_path("eval")
    texts = load_prompts(pfile, limit=num_prompts)
    pairs = load_drafters(tp, specs, device=dev, dtype=dt, weights=weights, log=note)  # specs and configs (vocabularies) checked first
    pair = pairs[0]
    labels = [p.draft_name for p in pairs]
    makers = [p.new_drafter for p in pairs]
    dtype_name = str(dt).removeprefix("torch.")
    warnings: list[str] = []
    entries = []
    if merge:
        union = merged_topology([e.tree for e in own])
        trees_ = tuple(e.tree for e in own)
        meta = TreeMetadata(budget=union.size, max_depth=union.tree_depth, solver="specinfer-merge",
                            extra={"drafters": labels, "trees": [str(p) for p in trees]})
        entries.append(TreeEntry("specinfer merge", union, meta, drafter="+".join(labels),
                                 policy=lambda _: MergePolicy([m() for m in makers], trees_, labels)))
        for e, p in zip(own, pairs):
            warnings += tree_mismatch_warnings(e.name, e.metadata, device=device_name(dev), dtype=dtype_name,
                                               target=p.target_name, draft=p.draft_name,
                                               draft_cost_model=p.cost_model, device_type=dev.type,
                                               omp_wait_policy=run_policy(dev.type), temperature=temperature,
                                               top_p=top_p, threads=_cpu_threads(dev), weights=p.weights)
        notes.append("specinfer merge: no predicted tokens per step (each drafter's tree was solved alone; treeopt "
                     "solve --pair-acceptance estimates the merge)")
    else:
        seen_names: dict[str, int] = {}
        used_weights = (pairs[0].weights, pairs[1].weights)  # fingerprints read once (about 1 MiB per weight file)
        for path, dtree, meta in grafts:
            name = path.stem + (" (scheduled)" if sched is not None else "")
            seen_names[name] = seen_names.get(name, 0) + 1
            if seen_names[name] > 1:
                name = f"{name}#{seen_names[name]}"
            predicted = (sched.card.get("predicted") or {}) if sched is not None else {}
            if sched is not None and predicted.get("tree_choices") == dtree.tree.choices() \
                    and predicted.get("tree_drafter") == list(dtree.drafter):
                meta = replace(meta, expected_tokens_per_step=predicted["tokens_per_step"], predicted_speedup=None)
                notes.append(f"{name}: predicted tokens/step with the scheduler (its card: the static tree's "
                             f"{predicted.get('static_tokens_per_step', float('nan')):.4g} less what the skipped "
                             f"calls added on the profile steps; call rate {predicted.get('call_rate', float('nan')):.2f})")
            elif sched is not None:
                notes.append(f"{name}: the scheduler was trained for another tree (or carries no prediction): the "
                             "predicted figures are the static tree's (the strong drafter called every step)")
            warnings += tree_mismatch_warnings(name, meta, device=device_name(dev), dtype=dtype_name,
                                               target=pair.target_name, draft=None, device_type=dev.type,
                                               omp_wait_policy=run_policy(dev.type), temperature=temperature,
                                               top_p=top_p, threads=_cpu_threads(dev))
            warnings += graft_weights_warnings(name, meta, *used_weights)

            def policy(_, dtree=dtree):
                return GraftPolicy.from_drafter_tree(makers[0](), makers[1](), dtree, sched)

            entries.append(TreeEntry(name, dtree.tree, meta, drafter="+".join(labels), policy=policy))
    check_trees_fit(entries, pair)
    ids = encode_prompts(texts, pair.tokenizer, model=pair.target_name)
    kind = "merge" if merge else "graft"
    settings = {"target": pair.target_name, "prompts": str(prompts or "demo eval prompts"),
                "multi_drafter": {"policy": kind, "drafters": labels, "cost_models": [p.cost_model for p in pairs],
                                  "trees": [str(p) for p in trees],
                                  "scheduler": str(scheduler) if scheduler is not None else None}}
    try:
        with located_prompts(texts, pfile), progress_bar() as progress:  # a prompt refused: named by path:line
            run = run_trees(pair.target, None, entries, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                            top_p=top_p, seed=seed, eos_ids=sorted(pair.tokenizer.eos_ids), backend=backend,
                            progress=progress, settings=settings)
    except TreeoptError:
        raise
    except Exception as err:  # a drafter (or the target) failing mid-run: one line, nothing written
        _print_error(f"the run stopped: {type(err).__name__}: {err} (no results were written)")
        raise typer.Exit(1) from None
    jpath, cpath = run.save(results_dir)
    report = Report(title=f"treeopt run ({kind}: {' + '.join(labels)})")
    report.summary = {"target": pair.target_name, "drafters": ", ".join(labels), "policy": kind,
                      "scheduler": str(scheduler) if scheduler is not None else ("-" if merge else "none (every step)"),
                      "prompts": len(ids), "max new tokens": max_new_tokens,
                      "mode": "greedy" if temperature == 0 else "sampling",
                      "plain decoding (tokens/s)": run.summaries[0].tokens_per_s, "results": f"{jpath}, {cpath}"}
    report.tables.append(_trees_table(run, temperature, None if merge else "the grafted trees' files (pair profile)"))
    title, cols, rows = _drafters_table(run)
    report.tables.append((title, cols, rows))
    warnings += mismatch_warnings(run)
    report.warnings = warnings
    report.notes = notes + setting_notes(temperature=temperature, top_p=top_p, num_prompts=num_prompts,
                                         prompts_found=len(texts), prompts_file=pfile)
    report.data = {**run.to_dict(), "per_drafter": [dict(zip(cols, r)) for r in rows],
                   "greedy_ok": run.greedy_ok if temperature == 0 else None, "json": str(jpath), "csv": str(cpath)}
    render(report, as_json)
    if report.data["greedy_ok"] is False:
        raise typer.Exit(1)


def _drafters_table(run) -> tuple[str, list[str], list[list]]:
    """Per drafter of every multi-drafter tree of a run (:attr:`~sequoia_opt.jobs.run.TreeSummary.drafters`):
    calls (steps it was asked in), call rate (calls over the steps that asked any drafter), its total time (ms),
    ms per call, and the accepted nodes it proposed."""
    rows = [[s.tree, d["name"], d["calls"], d["call_rate"], d["ms"], d["ms_per_call"], d["accepted_nodes"]]
            for s in run.summaries[1:] for d in s.drafters]
    return ("drafters of each tree", ["name", "drafter", "calls", "call rate", "ms", "ms per call", "accepted nodes"],
            rows)


def _cpu_threads(dev) -> int | None:
    """A CPU run's torch threads (what a tree's latency profile was timed with is compared to it), else None."""
    import torch

    return torch.get_num_threads() if dev.type == "cpu" else None


def _prediction_label(entries, value_label: str | None = None) -> tuple[str, list[str]]:
    """What the trees table's predicted columns are, for its title: the static trees' value model
    (``value_label`` when --compare scored them all, else what their files record: acceptance model and
    profile), then the adaptive trees' and dynamic settings' own models. Returns ``(label, warnings)``: a
    warning when the static trees' files record more than one value model."""
    parts, warnings = [], []
    if value_label is not None:
        parts.append(value_label)
    else:
        groups: dict[str, list[str]] = {}
        for e in entries:
            m = e.metadata
            if e.policy is None and m.expected_tokens_per_step is not None:
                key = f"{m.extra.get('acceptance_model') or 'positional'} acceptance" + (
                    f" of profile {m.acceptance_profile!r}" if m.acceptance_profile else "")
                groups.setdefault(key, []).append(e.name)
        if len(groups) == 1:
            parts.append(f"{next(iter(groups))}, from the tree files")
        elif groups:
            parts.append("; ".join(f"{k} for {', '.join(v)}" for k, v in groups.items()))
            warnings.append("the predicted columns mix value models (" + "; ".join(groups) + "): one tree file's "
                            "figures are not comparable with another's; --compare -a PROFILE scores every tree "
                            "under one")
    solver = [str(e.metadata.solver or "") if e.policy is not None else "" for e in entries]
    dynamic = [x.startswith("dynamic") for x in solver]
    kinds = sorted({x.removeprefix("policy:") for x in solver if x.startswith("policy:")})
    if any(e.policy is not None and not d and not x.startswith("policy:")
           for e, d, x in zip(entries, dynamic, solver)):  # run_cmd's other policy: --adapt
        parts.append("adaptive trees: their re-solves' positional estimate")
    planned = any(x == "policy:schedule" and e.metadata.expected_tokens_per_step is not None
                  for e, x in zip(entries, solver))
    for k in kinds:  # --policy KIND: no tree file's prediction holds for it
        if k == "adaptive-schedule":
            parts.append("a plan re-ranked live: the chain estimate of the steps it ran")
        elif k == "schedule" and planned:
            parts.append("--policy schedule: the plan's own prediction for its batch-1 range (one request at a time, "
                         "as run serves them)")
        else:
            parts.append(f"--policy {k}: none (treeopt tune's table predicts a plan)")
    if any(dynamic):
        parts.append("dynamic settings: their calibration profile")
    return "; ".join(parts), warnings


def _run_and_report(pair, entries, ids, *, max_new_tokens, temperature, top_p, seed, backend, results_dir,
                    as_json, settings, value_label: str | None = None) -> Report:
    from ..jobs.run import run_trees

    predicted, label_warnings = _prediction_label(entries, value_label)
    with progress_bar() as progress:  # a prompt it refuses is a PromptError, which the caller locates
        run = run_trees(pair.target, pair.new_drafter, entries, ids, max_new_tokens=max_new_tokens,
                        temperature=temperature, top_p=top_p, seed=seed, eos_ids=sorted(pair.tokenizer.eos_ids),
                        backend=backend, progress=progress,
                        settings={"target": pair.target_name, "draft": pair.draft_name,
                                  "draft_cost_model": pair.cost_model, "predicted_by": predicted, **settings})
    jpath, cpath = run.save(results_dir)
    report = Report(title="treeopt run")
    plain = run.summaries[0]
    report.summary = {"target": pair.target_name, "draft": pair.draft_name, "prompts": len(ids),
                      "max new tokens": max_new_tokens, "mode": "greedy" if temperature == 0 else "sampling",
                      "plain decoding (tokens/s)": plain.tokens_per_s, "results": f"{jpath}, {cpath}"}
    report.warnings = label_warnings
    past = draft_context_warning(pair, ids, max_new_tokens)
    if past is not None:
        report.warnings.append(past)
    report.warnings += oversized_tree_warnings(entries, pair) + too_deep_warnings(entries, pair)
    report.tables.append(_trees_table(run, temperature, predicted))
    if any(s.adaptive for s in run.summaries):
        table, notes = _resolve_table(run)
        if table[2]:  # a plan re-ranked live reports in a note only
            report.tables.append(table)
        report.notes += notes
    report.notes += _node_notes(run)
    report.warnings += mismatch_warnings(run)
    report.data = {**run.to_dict(), "greedy_ok": run.greedy_ok if temperature == 0 else None,
                   "json": str(jpath), "csv": str(cpath)}
    return report


#: Precisions whose rounding a tree's wider forward can change at a near-tie of the top two logits.
LOW_PRECISION = ("bfloat16", "float16")


def mismatch_warnings(run) -> list[str]:
    """One line per (tree, prompt) whose greedy output differed from plain decoding, with its first differing
    position; in bfloat16 / float16 one more saying what that usually means: a tree's forward over n tokens rounds
    its matrix products differently from plain decoding's one-token forward, and where the top two logits nearly
    tie the argmax can flip (both outputs are the target's greedy decoding under its own rounding; float32 decodes
    equal). Empty when every output matched."""
    out = [f"tree {m['tree']!r} differs from plain decoding on prompt {m['prompt_index']} at position "
           f"{m['first_mismatch']}: plain {m['plain']} vs tree {m['tree_output']}" for m in run.mismatch_details]
    dtype = run.settings.get("dtype")
    if out and dtype in LOW_PRECISION:
        out.append(f"in {dtype} a tree's forward over several tokens rounds differently from plain decoding's "
                   "one-token forward, and where the top two logits nearly tie the greedy token can flip: output "
                   "equality is guaranteed in float32 (rerun with --dtype float32 to check the decoder)")
    return out


def draft_context_warning(pair, ids, max_new_tokens: int) -> str | None:
    """One line when a draft model's context (``max_position_embeddings``) is shorter than the requests: the
    positions past it are decoded plainly (the trees clip to the root there), which holds a run's tokens per step
    down where the profile measured none of it; None when every position fits, or the drafter is not a draft
    model. ``ids``: the prompts' token ids; ``max_new_tokens``: tokens generated per prompt."""
    ctx = pair.draft_context
    if ctx is None or not ids or ctx >= pair.target.config.max_position_embeddings:
        return None
    from ..drafting.drafters.model import guessable_tokens

    # of the max_new_tokens positions after each prompt, those past what the draft can guess decode plainly
    past = sum(max_new_tokens - min(max_new_tokens, guessable_tokens(ctx, len(p))) for p in ids)
    if past == 0:
        return None
    share = past / (len(ids) * max_new_tokens)
    return (f"the draft's context is {ctx} tokens (max_position_embeddings), shorter than these requests: "
            f"{share:.0%} of the positions generated lie past it and decode plainly (the tree clips to the root "
            "there); use shorter prompts or --max-new-tokens, or a draft with a longer context")


def _node_notes(run) -> list[str]:
    """One note per fixed tree whose value model misses at some node in this run
    (:func:`~sequoia_opt.jobs.run.node_misses`; every node's counts are in the JSON)."""
    from ..jobs.run import node_misses

    out = []
    for s in run.summaries:
        missed = node_misses(s.node_acceptance or [])
        if missed:
            out.append(f"{s.tree}: the value model misses at some nodes (measured rate once the parent was accepted, "
                       f"its 99 % interval between prompts excluding the predicted one): {'; '.join(missed)}")
    return out


def _trees_table(run, temperature: float, predicted: str | None = None) -> tuple[str, list[str], list[list]]:
    """The per-tree table of a run: measured against predicted, the time split, and greedy equality; the
    title names what the predicted columns come from (``predicted``)."""
    rows = []

    def span(iv, mark=None):
        return "-" if iv is None else f"{iv[0]:.3f} to {iv[1]:.3f}" + ("" if mark is None else
                                                                        (" (in)" if mark else " (OUT)"))

    for s in run.summaries[1:]:
        rows.append([s.tree, s.size, s.depth, s.tokens_per_step, f"{s.tps_ci95[0]:.3f} to {s.tps_ci95[1]:.3f}",
                     s.predicted_tokens_per_step, span(s.predicted_interval, s.inside_prediction), s.tokens_per_s,
                     s.speedup, s.predicted_speedup, span(s.predicted_speedup_interval),
                     s.draft_ms, s.verify_ms, s.bookkeeping_ms,
                     "-" if temperature else ("yes" if s.mismatches == 0 else f"NO ({s.mismatches})")])
    n_prompts = len({r.prompt_index for r in run.rows})
    return ("trees against plain decoding" + (f" (predicted: {predicted})" if predicted else "")
            + ("; 95% CI: the measured mean's, over prompts" + (" (2 prompts: one degree of freedom, an unstable "
                                                                "interval; give 3 or more)" if n_prompts == 2 else "")
               if n_prompts > 1 else
               "; 95% CI: the measured mean's, over the steps of the one prompt (too narrow for new prompts: give "
               "more prompts)")
            + "; 95% PI: the prediction's for this many new prompts; "
            "tokens/step: as the steps emitted (the last step of a generation emits only what is left); predicted and "
            "pred. speedup: for generations of this run's lengths (exact from the tree file's node_rates, else "
            "approximated; the steps cut at an answer's end priced at their own cost), at most what a step can emit",
            ["name", "nodes", "depth", "tokens/step", "95% CI", "predicted", "95% PI", "tokens/s", "speedup",
             "pred. speedup", "speedup 95% PI", "draft ms", "verify ms", "bookkeeping ms", "= plain"], rows)


def _plan_drafter(name: Optional[str]):
    """The drafter a plan file names (its ``drafter``: tune's label of the drafter it measured) as a
    :class:`~sequoia_opt.drafting.registry.DrafterSpec`, where run can make it from the name alone: prompt lookup
    (``lookup:1-3``), layer skip (``self:L``), a bundled head (``eagle3``). None for a checkpoint (a label is no
    path) or a name that is no drafter: run drafts with ``--draft`` or the bundled draft model then, and warns when
    that is another drafter than the plan's. A plan from ``tune --draft lookup`` was run with the draft model."""
    from ..drafting.registry import DRAFTERS
    from ..jobs.load import parse_drafter_spec

    if not name:
        return None
    try:
        spec = parse_drafter_spec(str(name))
    except TreeoptError:  # a bundled head's label (eagle3:treeopt-smollm2-eagle3) names no path: its kind does
        kind = str(name).partition(":")[0].strip().lower()
        if kind == "model" or kind not in DRAFTERS or DRAFTERS[kind].default_path is None:
            return None
        try:
            spec = parse_drafter_spec(kind)  # the kind's bundled checkpoint, when that is the one the label names
        except TreeoptError:  # the bundled checkpoint is missing
            return None
        return spec if spec.label == str(name) else None
    return spec if spec.path is None and spec.kind != "model" else None


#: Re-solve rows shown in the table; past it only the re-solves that changed the tree (the JSON has them all).
RESOLVE_ROWS = 40


def _resolve_table(run) -> tuple[tuple[str, list[str], list[list]], list[str]]:
    """The re-solve log of every adaptive tree of a run (:attr:`~sequoia_opt.jobs.run.TreeSummary.adaptive`):
    per re-solve the step (since the run began), the prompt, tokens so far, the new tree's size, depth and
    level widths, its predicted tokens per step and speedup, whether it changed the tree, the solve time; a plan
    re-ranked live (``--policy adaptive-schedule``) gets one note with its ranges before and after instead.
    Returns ``(table, notes)``."""
    rows, notes = [], []

    def live(r) -> str:  # the guard's reading: live tokens/step against the prediction interval
        if r.get("live_tokens_per_step") is None:
            return "-"
        lo, hi = r["interval"]
        return f"{r['live_tokens_per_step']:.2f} in {lo:.2f}-{hi:.2f}" if lo <= r["live_tokens_per_step"] <= hi \
            else f"{r['live_tokens_per_step']:.2f} OUT of {lo:.2f}-{hi:.2f}"

    for s in run.summaries:
        if not s.adaptive:
            continue
        if "final_ranges" in s.adaptive:  # a plan re-ranked live (adaptive-schedule): its ranges, not a tree
            a = s.adaptive
            rng = lambda rs: ", ".join(f"{lo}-{hi}: K={k}" for lo, hi, k in rs)  # noqa: E731
            notes.append(f"{s.tree}: {len(a['resolves'])} re-rankings over {a['steps']} steps, "
                         f"{sum(r['changed'] for r in a['resolves'])} changed the plan; ranges {rng(a['initial_ranges'])}"
                         f" -> {rng(a['final_ranges'])} (live rows -> draft length; each re-ranking is in the JSON)")
            continue
        log = s.adaptive["resolves"]
        shown = log if len(log) <= RESOLVE_ROWS else [r for r in log if r["changed"]]
        rows += [[s.tree, r["step"], r["generation"], r["tokens"], r.get("reason", "scheduled"), live(r), r["size"],
                  r["depth"], " ".join(map(str, r["level_widths"])), r["expected_tokens"], r["speedup"],
                  "yes" if r["changed"] else "no", r["solve_ms"]] for r in shown]
        changed = sum(r["changed"] for r in log)
        mean_ms = sum(r["solve_ms"] for r in log) / len(log) if log else 0.0
        notes.append(f"{s.tree}: {len(log)} re-solves over {s.adaptive['steps']} steps, {changed} changed the tree "
                     f"(final: {s.adaptive['final_size']} nodes, depth {s.adaptive['final_depth']}; the largest it "
                     f"verified: {s.size} nodes, depth {s.depth}); {mean_ms:.2f} ms per re-solve"
                     + (f"; the table shows the {len(shown)} that changed it (all are in the JSON)"
                        if shown is not log else ""))
        moved = [r for r in log if r.get("reason") == "left the prediction interval"]
        if moved:
            first = moved[0]
            notes.append(f"{s.tree}: the guard found the live tokens per step outside the profile's 95 % prediction "
                         f"interval at {len(moved)} re-solves (first at step {first['step']}, prompt "
                         f"{first['generation']}: {first['live_tokens_per_step']:.2f} against {first['interval'][0]:.2f}"
                         f"-{first['interval'][1]:.2f}) and solved those from the live acceptance's lower bounds"
                         + (" (plain decoding where no tree beat it)" if any(r["size"] == 1 for r in moved) else ""))
    return ("re-solves of the adaptive trees (why: scheduled, or the guard: left the prediction interval / probe)",
            ["name", "step", "prompt", "tokens", "why", "live tokens/step", "nodes", "depth", "level widths",
             "pred. tokens/step", "pred. speedup", "changed", "solve ms"], rows), notes
