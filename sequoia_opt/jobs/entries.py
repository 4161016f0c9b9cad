"""The runs ``treeopt run`` builds, as library functions: each drafter's plan from its profiles
(:func:`plan_drafters`), the compared baselines (:func:`baseline_entries`), the dynamic settings
(:func:`dynamic_settings`, :func:`dynamic_entries`), the adaptive twins of static trees (:func:`adaptive_entries`),
SpecInfer's merged topology (:func:`merged_topology`), and the checks that come before any weights load. The CLI
(``cli/run.py``) parses options, calls these, runs :func:`~sequoia_opt.jobs.run.run_trees` and renders.

Errors name the ``treeopt run`` options they come from (these functions exist to serve them).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Optional

from ..drafting.policies.adaptive import DEFAULT_EVERY, DEFAULT_PRIOR_WEIGHT, DEFAULT_WINDOW
from ..errors import TreeoptError
from ..tree import Tree, TreeMetadata

__all__ = ["tree_mismatch_warnings", "DEFAULT_COMPARED_DRAFTERS", "plan_drafters", "merged_topology",
           "baseline_entries", "dynamic_settings", "check_dynamic_memory", "dynamic_entries", "check_trees_fit",
           "check_adapt_options", "adaptive_entries"]


def tree_mismatch_warnings(name: str, meta: TreeMetadata, *, device: str, dtype: str, target: str,
                           draft: str, draft_cost_model: str | None = None, device_type: str | None = None,
                           omp_wait_policy: str | None = None, temperature: float | None = None,
                           threads: int | None = None, weights: dict | None = None,
                           top_p: float | None = None) -> list[str]:
    """Warnings when a tree was solved from profiles measured on another device / dtype / pair than the
    one it is about to run on (its prediction then describes other hardware). ``device``: the device's name,
    ``device_type`` its torch type (:func:`~sequoia_opt.profiles.same_device`); ``omp_wait_policy``: the CPU
    run's OpenMP wait policy (:mod:`sequoia_opt.omp`: spinning and sleeping threads price a tree step 1.1x and
    1.6x a plain step on the 2-core VM, so a profile timed under the other policy mispredicts); ``temperature``:
    the run's (a tree solved from a greedy profile predicts greedy acceptance, not sampled); ``top_p``: the run's
    nucleus mass, compared where both the run and the profile sample (the nucleus cuts both models' distributions:
    a tiny pair's best 8-node tree at temperature 1 expects 2.15 tokens/step at top-p 0.5, 2.67 at 1.0);
    ``threads``: a CPU run's torch threads (a curve timed on 1 thread priced a step 1.7x dearer than 2 threads ran
    it); ``weights``: the checkpoints' fingerprints in use (:func:`~sequoia_opt.jobs.load.weights_record`),
    against the acceptance profile's (``profiled_weights``: another checkpoint of the same name accepts otherwise)."""
    from ..profiles import same_device, weights_mismatch
    from ..profiles.checks import sampling_differences, same_weights

    out = []
    sampling = {key for key, _, _ in sampling_differences(meta.extra.get("profiled_temperature"),
                                                          meta.extra.get("profiled_top_p"), temperature, top_p)}
    for key, have in (("device", device), ("dtype", dtype), ("target", target), ("draft", draft),
                      ("draft_cost_model", draft_cost_model), ("engine", "treeopt"),
                      ("omp_wait_policy", omp_wait_policy), ("temperature", temperature), ("top_p", top_p),
                      ("threads", threads)):
        want = meta.extra.get(f"profiled_{key}")
        if have is None or want is None:
            continue
        if key in ("temperature", "top_p"):
            same = key not in sampling
        elif key == "threads":
            try:
                same = float(want) == float(have)
            except (TypeError, ValueError):
                same = True  # a file that does not say: nothing to compare
        else:
            same = (same_device(want, have, device_type) if key == "device"
                    else str(want).strip().lower() == str(have).strip().lower())
        if not same and key in ("target", "draft"):  # another name for the same weights (a copy): not another model
            same = same_weights({"weights": meta.extra.get("profiled_weights")}, weights, key)
        if not same:
            out.append(f"tree {name!r} was solved from profiles measured with {key} {want!r}, but this run "
                       f"uses {have!r}: its predicted figures describe that setting")
    out += [f"tree {name!r} was solved from an acceptance profile measured with other weights: {w}; its predicted "
            "figures describe that checkpoint" for w in weights_mismatch({"weights": meta.extra.get("profiled_weights")},
                                                                        weights)]
    return out


#: The drafters ``run --compare-drafters`` compares when no --draft is given (self:L needs its L: name it).
DEFAULT_COMPARED_DRAFTERS = (None, "lookup")


def default_profile_paths(target: Optional[Path], spec, *, device, temperature: float = 0.0, top_p: float = 1.0,
                          dtype: str = "float32", weights: str = "float32") -> tuple[Path, Path]:
    """``(acceptance, latency)``: where ``treeopt profile acceptance`` / ``profile latency`` write the profiles of
    the pair (``target``, None: the bundled one; ``spec`` a parsed --draft) in this sampling mode, on ``device``
    in this precision: what ``run --compare-drafters``, ``--compare`` and ``--adapt`` read when -a / -l are not
    given. Nothing is read; the files may not exist."""
    from .load import default_acceptance_path, default_latency_path, default_target_path, model_label, precision_suffix
    from ..device import device_slug

    tlabel = model_label(Path(target) if target else default_target_path())
    mode = "greedy" if temperature == 0 else f"sampling-t{temperature:g}-p{top_p:g}"
    return (Path(default_acceptance_path(tlabel, spec, mode)),
            Path(default_latency_path(tlabel, spec, device_slug(device), precision_suffix(dtype, weights))))


def profile_command(kind: str, target: Optional[Path], spec, *, device, temperature: float = 0.0, top_p: float = 1.0,
                    dtype: str = "float32", weights: str = "float32", prompts: Optional[Path] = None) -> str:
    """``treeopt profile <kind> ...`` (``acceptance`` or ``latency``): the command that writes the file
    :func:`default_profile_paths` names for the pair (``target``; ``spec`` a parsed --draft, left out when it is
    the bundled draft model) in this sampling mode, precision and device (``prompts``: the run's own, named for an
    acceptance profile, since the demo's may not fit the model): what a message for a missing profile names, or
    the file written is another."""
    args = f" --target {shlex.quote(str(target))}" if target else ""
    if not (spec.kind == "model" and spec.path is None):
        args += f" --draft {shlex.quote(spec.spec)}"
    if str(device) != "cpu":
        args += f" --device {device}"
    if kind == "acceptance" and temperature:
        args += f" --temperature {temperature:g} --top-p {top_p:g}"
    if kind == "acceptance" and dtype != "float32":  # recorded, and a run in another dtype is warned about
        args += f" --dtype {dtype}"
    if kind == "acceptance" and prompts is not None:
        args += f" --prompts {shlex.quote(str(prompts))}"
    if kind == "latency":
        args += "".join(f" --{opt} {v}" for opt, v in (("dtype", dtype), ("weights", weights)) if v != "float32")
    return f"treeopt profile {kind}{args}"


def plan_drafters(specs, acceptance: Optional[list[Path]], latency: Optional[list[Path]], *, target: Optional[Path],
                   device, temperature: float, top_p: float, budget: Optional[int], max_depth: int,
                   max_branching: int, defaults: bool = False,
                   prompts: Optional[Path] = None, dtype: str = "float32",
                   weights: str = "float32") -> tuple[list, list[tuple[Path, Path]]]:
    """Each drafter's profiles (given, or at the default paths) and its best tree, before any weights load.

    Returns ``(plans, [(acceptance path, latency path)])`` in the order of ``specs``. ``defaults``: the specs
    are :data:`DEFAULT_COMPARED_DRAFTERS` (no --draft was given; messages say so). ``prompts``: the run's prompt
    file, named in the command a missing acceptance profile is written with (the demo's may not fit the model).
    ``dtype`` / ``weights``: the run's precision (``--dtype``, ``--weights``): a run in another precision reads
    the curve profiled in it (:func:`~sequoia_opt.jobs.load.precision_suffix`), not the float32 one.

    Raises:
        TreeoptError: count mismatches between --draft and -a / -l, a missing profile (naming the command
            that writes it), profiles of another drafter, a budget the profile did not measure.
    """
    from .compare import plan_drafter
    from .load import weights_record
    from ..profiles import load_acceptance, load_latency, weights_mismatch

    n = len(specs)
    what = "default drafters (no --draft: the bundled draft model and lookup)" if defaults else "--draft"
    for opt, given in (("--acceptance", acceptance), ("--latency", latency)):
        if given is not None and len(given) != n:
            raise TreeoptError(f"--compare-drafters pairs every --draft with one {opt}, in order: got {n} {what} "
                               f"and {len(given)} {opt}")
    plans, paths = [], []
    for i, spec in enumerate(specs):
        a_default, l_default = default_profile_paths(target, spec, device=device, temperature=temperature,
                                                     top_p=top_p, dtype=dtype, weights=weights)
        a_path = acceptance[i] if acceptance is not None else a_default
        l_path = latency[i] if latency is not None else l_default
        for kind, path, opt in (("acceptance", a_path, "-a"), ("latency", l_path, "-l")):
            if not Path(path).is_file():
                how = profile_command(kind, target, spec, device=device, temperature=temperature, top_p=top_p,
                                      dtype=dtype, weights=weights, prompts=prompts)
                raise TreeoptError(f"no {kind} profile of drafter {spec.label} at {path}: write it with {how} (or pass "
                                   f"{opt} PATH)")
        acc, curve = load_acceptance(a_path), load_latency(l_path)
        if acceptance is None:  # picked by name: another checkpoint of this name is another drafter
            other = weights_mismatch(acc.measured, weights_record(target, spec))
            if other:
                how = profile_command("acceptance", target, spec, device=device, temperature=temperature,
                                      top_p=top_p, dtype=dtype, weights=weights, prompts=prompts)
                raise TreeoptError(f"the acceptance profile at {a_path} is not of drafter {spec.label} in use: "
                                   f"{other[0]}; profile this one with {how} -o PATH and pass -a PATH")
        plans.append(plan_drafter(spec.label, spec.cost_model, acc, curve, budget=budget, max_depth=max_depth,
                                  max_branching=max_branching))
        paths.append((Path(a_path), Path(l_path)))
    return plans, paths


def merged_topology(trees) -> Tree:
    """The planned shape of SpecInfer's merge of several drafters' own trees: every tree's root children side
    by side under one root, in drafter order (the union when no two drafters propose the same token; at run
    time shared tokens merge and the tree is smaller, :class:`~sequoia_opt.drafting.policies.MergePolicy`)."""
    from ..tree import Tree

    choices, offset = [], 0
    for t in trees:
        choices += [[c[0] + offset, *c[1:]] for c in t.choices()]
        offset += len(t.children[0])
    return Tree.from_choices(choices)


def baseline_entries(entries, acceptance: Optional[Path], latency: Optional[Path]) -> tuple[list, list, list[str], str]:
    """``--compare``: the best chain and k-ary tree within the largest --tree's size and depth, and every
    static tree of the table scored under ONE value model (:class:`~sequoia_opt.solver.depth.ValueModel`):
    the model the --tree files were solved with when they agree (else the profile's ``auto`` model, as
    ``treeopt solve``), from the acceptance profile given here, and the latency profile's cost model. A tree
    whose file predicted otherwise is re-scored (a note gives both figures); a baseline that is one of the
    --tree files is not run twice (a note says so); when the latency profile stops short of the largest tree,
    the baselines are chosen within what it measured (a note says so).

    Returns:
        ``(entries, baselines, notes, label)``: ``entries`` with the static trees' predictions re-scored, the
        baseline entries, the notes (they go to the output and the JSON) and the value model's label (the
        trees table's title names it).
    """
    from dataclasses import replace

    from ..errors import ProfileError
    from .run import TreeEntry
    from ..profiles import load_acceptance, load_latency
    from ..solver import compare_baselines, step_cost
    from ..solver.hardware import run_costs
    from ..solver.depth import ValueModel

    if acceptance is None:
        raise TreeoptError("--compare needs --acceptance (to pick the best chain and k-ary tree)")
    acc = load_acceptance(acceptance)
    curve = load_latency(latency) if latency else None
    static = [e for e in entries if e.policy is None]
    recorded = {e.metadata.extra.get("acceptance_model") for e in static}
    model = recorded.pop() if len(recorded) == 1 and None not in recorded else "auto"
    notes = []
    if model == "by-depth" and not acc.by_depth:
        notes.append(f"--compare: the trees were solved with per-depth acceptance, profile {acc.id!r} has no "
                     "per-depth vectors: every tree is scored with its positional vector")
        model = "positional"
    vm = ValueModel.of_profile(acc, model if model in ("positional", "by-depth") else "auto")

    def predict(tree):  # (G, step cost) under the table's value model and cost model; the step None off the curve
        g = vm.expected_tokens(tree)
        if curve is None:
            return g, None
        try:
            return g, step_cost(tree.level_widths, g, curve)
        except ProfileError:
            return g, None

    def spreads(tree, step) -> dict:  # the prediction's spread between prompts, as solve records it
        from ..solver.intervals import spread_metadata

        return spread_metadata(tree, acc, vm.name, step)

    out_entries = []
    for e in entries:
        if e.policy is not None:  # adaptive or dynamic: its own value model
            out_entries.append(e)
            continue
        g, step = predict(e.tree)
        old = e.metadata.expected_tokens_per_step
        if old is not None and abs(old - g) > 5e-4:
            notes.append(f"tree {e.name!r}: predicted {g:.3f} tokens/step under {vm.label} (its file: {old:.3f}, "
                         f"{e.metadata.extra.get('acceptance_model') or 'positional'} acceptance of profile "
                         f"{e.metadata.acceptance_profile!r}): every tree of the table is scored one way")
        extra = {k: v for k, v in e.metadata.extra.items() if k not in ("tokens_per_step_spread", "speedup_spread")}
        extra.update(spreads(e.tree, step))
        extra.update(vm.run_checks(e.tree))  # scored one way, as its G
        extra.update(run_costs(e.tree, curve))
        out_entries.append(replace(e, metadata=replace(e.metadata, expected_tokens_per_step=g,
                                                       predicted_speedup=step.speedup if step else None, extra=extra)))
    budget = max(e.tree.size for e in static)
    max_depth = max(max(e.tree.tree_depth for e in static), 1)
    if curve is not None and budget > curve.max_target_tokens():
        measured = curve.max_target_tokens()
        notes.append(f"--compare baselines limited to {measured} nodes (asked: {budget}, the largest tree): latency "
                     f"profile {curve.id!r} was measured up to {measured} target tokens; profile more tokens "
                     f"(treeopt profile latency --max-tokens {budget}) to compare at the trees' size")
        budget = measured
    runs = {tuple(map(tuple, e.tree.choices())): e.name for e in static}
    out = []
    for b in compare_baselines(vm.acceptance, budget, max_depth, 32, curve, by_depth=vm.rows):
        if b.name.startswith(("chain", "k-ary")):
            if b.note:
                notes.append(b.note)
            label = f"{b.name} " + " ".join(f"{k}={v}" for k, v in b.params.items())
            same = runs.get(tuple(map(tuple, b.tree.choices())))
            if same is not None:
                notes.append(f"--compare: the best {label} is tree {same!r} itself; it runs once, under that name")
                continue
            meta = TreeMetadata(budget=b.tree.size, expected_tokens_per_step=b.expected_tokens,
                                predicted_speedup=b.cost.speedup if b.cost else None, acceptance_profile=acc.id,
                                latency_profile=curve.id if curve else None, solver=f"baseline:{b.name}",
                                extra={"acceptance_model": vm.name, **spreads(b.tree, b.cost),
                                       **vm.run_checks(b.tree), **run_costs(b.tree, curve)})
            out.append(TreeEntry(name=label, tree=b.tree, metadata=meta))
    return out_entries, out, notes, vm.label


def dynamic_settings(specs: Optional[list[str]], calibration: Optional[Path], latency: Optional[list[Path]], *,
                      multi: bool, adapt: bool, notes: Optional[list[str]] = None) -> list[tuple[Any, dict, dict]]:
    """The --dynamic settings, read and checked before any model loads: ``[(setting, predicted figures,
    provenance)]``. Predicted figures come from --calibration and -l when given (a setting the latency
    profile cannot score, its budget or a draft forward past what it measured, is dropped with a note in
    ``notes``, as ``solve --dynamic`` leaves it out), else from a setting file's ``predicted``; a setting given
    as text has none. With ``device``, a setting whose step would need more memory than the device has free
    (:func:`~sequoia_opt.dynamic.step_memory_bytes`, at the target's vocabulary) is refused.

    Raises:
        TreeoptError: a setting that cannot be read or does not fit in memory, --calibration without
            --dynamic, --dynamic with several drafters or --adapt (one line, exit 2).
    """
    from ..dynamic import parse_setting
    from ..errors import ProfileError
    from ..exports import load_dynamic_setting

    if not specs:
        if calibration is not None:
            raise TreeoptError("--calibration predicts --dynamic settings: add --dynamic (or drop --calibration)")
        return []
    if multi:
        raise TreeoptError("--dynamic runs one drafter (the tree is chosen from its scores): give at most one --draft")
    if adapt:
        raise TreeoptError("--adapt re-solves static trees; a --dynamic setting already follows the workload: run them "
                           "separately")
    out = []
    for spec in specs:
        if Path(spec).suffix.lower() in (".yaml", ".yml", ".json") or Path(spec).is_file():
            setting, doc = load_dynamic_setting(spec)
            out.append((setting, doc.get("predicted") or {}, doc.get("provenance") or {}))
            continue
        try:
            out.append((parse_setting(spec), {}, {}))
        except ValueError as err:
            raise TreeoptError(str(err)) from None
    labels = [s.label for s, _, _ in out]
    twice = next((x for i, x in enumerate(labels) if x in labels[:i]), None)
    if twice is not None:  # two rows of one name in the results could not be told apart
        raise TreeoptError(f"--dynamic {twice} is given twice: each setting runs once")
    if calibration is not None and (not latency or len(latency) != 1):
        raise TreeoptError("--calibration predicts a setting's tokens/s with one --latency profile: add -l")
    if calibration is not None:
        from ..profiles.calibration import load_calibration
        from ..profiles import load_latency
        from ..solver.dynamic import predict_setting

        cal, curve = load_calibration(calibration), load_latency(latency[0])
        top_n = curve.max_target_tokens()
        kept = []
        for setting, _, provenance in out:
            try:
                if setting.budget > top_n:
                    raise ProfileError(f"its budget {setting.budget} is past the largest target token count {top_n} "
                                       f"latency profile {curve.id!r} measured")
                pred = predict_setting(cal, setting, curve, max_steps=200)
            except ProfileError as err:
                if notes is not None:
                    notes.append(f"{setting.label} not run: {err} (T(n) and c(w) are never extrapolated: profile more "
                                 "tokens, or lower its budget / topk)")
                continue
            if pred.coverage < 1.0 and notes is not None:  # past the recording: those nodes are priced as leaves
                notes.append(f"{setting.label} expands nodes the calibration recording did not in "
                             f"{100 * (1 - pred.coverage):.0f} % of its steps (deeper or wider than it recorded): "
                             "its prediction counts them as leaves and reads low; record the calibration with at "
                             "least its steps and topk")
            kept.append((setting, {"tokens_per_step": pred.tokens_per_step, "speedup": pred.speedup,
                                   "coverage": pred.coverage, "from": "calibration"}, provenance))
        out = kept
    return out


def check_dynamic_memory(settings: list[tuple[Any, dict, dict]], target: Optional[Path], device) -> None:
    """Refuse, before any model loads, a --dynamic setting whose step would need more memory than ``device``
    has free (:func:`~sequoia_opt.dynamic.check_step_memory` at the target's vocabulary, read from its config).

    Raises:
        TreeoptError: one line naming the setting and the memory.
    """
    from ..dynamic import check_step_memory
    from ..model.loaders import load_model_config
    from .load import default_target_path
    from ..device import free_memory_bytes

    if not settings:
        return
    vocab = load_model_config(Path(target) if target else default_target_path()).vocab_size
    free = free_memory_bytes(device)
    for setting, _, _ in settings:
        try:
            check_step_memory(setting, vocab, free, str(device))
        except ValueError as err:
            raise TreeoptError(str(err)) from None


def dynamic_entries(settings: list[tuple[Any, dict, dict]], pair, calibration: Optional[Path],
                     latency: Optional[Path], temperature: float, notes: list[str],
                     warnings: Optional[list[str]] = None, top_p: Optional[float] = None) -> list:
    """One TreeEntry per dynamic setting (a fresh DynamicPolicy per decoder), with its prediction
    (:func:`dynamic_settings`: from --calibration and -l, else from its file when the file was solved for this
    drafter; a note says when it was not). Warnings about the calibration (other weights, another decoding mode or
    top-p, too few bins) go to ``warnings``, as a tree's do (to ``notes`` when None)."""
    from ..drafting.policies import DynamicPolicy
    from ..dynamic import max_candidates
    from .run import TreeEntry
    from ..tree import Tree

    if not settings:
        return []
    if calibration is not None:
        from ..profiles.calibration import load_calibration
        from ..profiles import load_latency
        from ..profiles.calibration import calibration_warnings, same_pair

        cal = load_calibration(calibration)
        same_pair(cal, load_latency(latency), run=(pair.target_name, pair.draft_name), weights=pair.weights)
        (notes if warnings is None else warnings).extend(calibration_warnings(cal, temperature=temperature,
                                                                              weights=pair.weights, top_p=top_p))
    ctx = pair.target.config.max_position_embeddings
    out = []
    for setting, predicted, provenance in settings:
        solved_for = provenance.get("draft")
        if predicted.get("from") != "calibration" and predicted and solved_for is not None \
                and str(solved_for).lower() != str(pair.draft_name).lower():
            notes.append(f"{setting.label}: its file was solved for drafter {solved_for!r}, this run drafts with "
                         f"{pair.draft_name!r}: its prediction is not shown")
            predicted = {}
        solved_t = provenance.get("temperature")
        if predicted.get("from") != "calibration" and predicted and isinstance(solved_t, (int, float)) \
                and (float(solved_t) == 0) != (float(temperature) == 0):  # greedy against sampled acceptance
            mode = lambda t: "greedy" if float(t) == 0 else f"sampling at temperature {float(t):g}"  # noqa: E731
            (notes if warnings is None else warnings).append(
                f"{setting.label}: its file was solved from a calibration recorded in {mode(solved_t)} mode, this "
                f"run decodes in {mode(temperature)} mode: its predicted figures describe that mode")
        if setting.topk > pair.vocab_size:
            raise TreeoptError(f"{setting.label}: topk {setting.topk} is more than the vocabulary's {pair.vocab_size} tokens")
        if max_candidates(setting) >= ctx or setting.steps >= ctx:  # whole_fits would hold every step to its root
            raise TreeoptError(f"{setting.label}: its candidate tree grows to {max_candidates(setting)} nodes over "
                               f"{setting.steps} levels, and the target's context holds {ctx} tokens: it could draft "
                               "at no step; lower steps, topk or budget")
        meta = TreeMetadata(budget=setting.budget, max_depth=setting.steps,
                            expected_tokens_per_step=predicted.get("tokens_per_step"),
                            predicted_speedup=predicted.get("speedup"), solver=f"dynamic:{setting.policy}",
                            extra={"dynamic": setting.to_dict()})

        def make(drafter, s=setting):
            return DynamicPolicy(drafter, s, name=pair.draft_name)

        out.append(TreeEntry(setting.label, Tree.chain(1), meta, policy=make, drafter=pair.draft_name))
    return out


def check_trees_fit(entries, pair) -> None:
    """Refuse trees the draft cannot produce (a node with more children than the vocabulary has tokens).
    A tree deeper than what the context has left is not refused: the decoder clips it, step by step, to the
    levels that fit (see :class:`~sequoia_opt.drafting.policies.StaticTreePolicy`; :func:`oversized_tree_warnings`
    says so when the tree can never be verified whole)."""
    V = pair.vocab_size
    for e in entries:
        if e.tree.max_branching_used > V:
            raise TreeoptError(f"tree {e.name!r} has a node with {e.tree.max_branching_used} children; the "
                               f"vocabulary has only {V} tokens")


def oversized_tree_warnings(entries, pair) -> list[str]:
    """One line per static tree of at least as many nodes as the target's context holds: it is clipped at every
    step and never verified whole, so its prediction does not hold (a 600-node chain ran at 0.004x the plain
    speed without a word)."""
    ctx = pair.target.config.max_position_embeddings
    return [f"tree {e.name!r} has {e.tree.size} nodes and the target's context holds {ctx} tokens: every step clips "
            "it to the levels that fit, it is never verified whole, and its prediction does not hold (solve it with "
            "a budget below the context)" for e in entries if e.policy is None and e.tree.size >= ctx]


def too_deep_warnings(entries, pair) -> list[str]:
    """One line per tree (static, or a dynamic setting's steps) deeper than the drafter can propose
    (:attr:`~sequoia_opt.drafting.drafters.Drafter.depth_limit`: Medusa's K heads, depths 1..K): every step is cut
    to that depth, so the tree's prediction (made for the whole tree) does not hold; said instead of cut silently."""
    limit = pair.new_drafter().depth_limit
    if limit is None:
        return []
    out = []
    for e in entries:
        steps = (e.metadata.extra.get("dynamic") or {}).get("steps") if e.metadata is not None else None
        depth = int(steps) if e.policy is not None and steps is not None else e.tree.tree_depth
        if e.policy is not None and steps is None:
            continue  # a policy of its own (a chain schedule, a graft): it checks its depth itself
        if depth > limit:
            out.append(too_deep_warning(f"tree {e.name!r} is", depth, pair.draft_name, limit))
    return out


def too_deep_warning(what: str, depth: int, drafter: str, limit: int) -> str:
    """The line for a tree ``depth`` levels deep run by a drafter that proposes no deeper than ``limit``
    (:attr:`~sequoia_opt.drafting.drafters.Drafter.depth_limit`); ``what``: its subject (``"tree 't' is"``)."""
    return (f"{what} {depth} levels deep and {drafter} proposes no deeper than depth {limit}: every step is cut to "
            f"{limit} levels, and the prediction made for the whole tree does not hold (solve it with --max-depth "
            f"{limit})")


# ---------------------------------------------------------------------------------------------- --adapt
def check_adapt_options(adapt: bool, every: Optional[int], window: Optional[int], prior_weight: Optional[float], *,
                         acceptance: Optional[list[Path]], latency: Optional[list[Path]],
                         multi: bool) -> tuple[int, int, float]:
    """The ``--adapt`` options checked before anything is read; returns ``(every, window, prior_weight)``
    with the defaults filled in.

    Raises:
        TreeoptError: an ``--adapt-*`` option without ``--adapt``; ``--adapt`` with several drafters or
            ``--compare-drafters``; every or window below 1; a negative or non-finite prior weight; ``--adapt``
            without ``--acceptance`` or ``--latency``.
    """
    import math

    given = [n for n, v in (("--adapt-every", every), ("--adapt-window", window),
                            ("--adapt-prior-weight", prior_weight)) if v is not None]
    if not adapt:
        if given:
            raise TreeoptError(f"{given[0]} sets how --adapt re-solves the tree: add --adapt (or drop {given[0]})")
        return DEFAULT_EVERY, DEFAULT_WINDOW, DEFAULT_PRIOR_WEIGHT
    if multi:
        raise TreeoptError("--adapt re-solves one drafter's static tree: drop it with --compare-drafters, --merge, "
                           "--scheduler or several --draft")
    every = DEFAULT_EVERY if every is None else every
    window = DEFAULT_WINDOW if window is None else window
    prior_weight = DEFAULT_PRIOR_WEIGHT if prior_weight is None else prior_weight
    if every < 1:
        raise TreeoptError(f"--adapt-every must be at least 1 (steps between re-solves), got {every}")
    if window < 1:
        raise TreeoptError(f"--adapt-window must be at least 1 (steps the acceptance estimate remembers), got {window}")
    if not math.isfinite(prior_weight) or prior_weight < 0:
        raise TreeoptError(f"--adapt-prior-weight must be a number >= 0 (pseudo-trials per rank), got {prior_weight:g}")
    missing = [opt for opt, v in (("--acceptance", acceptance), ("--latency", latency)) if not v]
    if missing:
        raise TreeoptError(f"--adapt needs --acceptance (the prior of its running estimate) and --latency (what its "
                           f"hardware-aware re-solves read): missing {' and '.join(missing)}")
    return every, window, prior_weight


def adaptive_entries(entries, acceptance: Path, latency: Path, *, every: int, window: int, prior_weight: float,
                      budget: Optional[int], max_depth: Optional[int], max_branching: Optional[int],
                      guard: bool = True) -> tuple[list, list[str]]:
    """One adaptive twin per tree entry, ``<name> (adaptive)``, starting from that tree (nothing is loaded
    but the two profiles; each :class:`~sequoia_opt.drafting.policies.TreeAdapter` solves the prior once,
    which checks the limits against the latency profile).

    Limits of the re-solves: ``budget`` or the tree's recorded budget limit (``treeopt solve`` writes it),
    else its budget, else its size, lowered to the latency profile's largest measured token count when a
    limit that was not given exceeds it (a note says so); ``max_depth`` or 16 (``treeopt solve``'s default), at
    most the profile's ``draft_depth_limit`` (Medusa's K heads);
    ``max_branching`` or the tree's recorded one, else 32. ``guard``: arm each adapter's guard (it needs the
    acceptance profile's per-prompt counts; :class:`~sequoia_opt.drafting.policies.TreeAdapter`).

    Returns:
        ``(entries, notes)``.

    Raises:
        TreeoptError: a root-only tree; ``--budget`` past what the latency profile measured; a bad profile.
    """
    from ..drafting.policies import AdaptiveTreePolicy, TreeAdapter
    from .run import TreeEntry
    from ..profiles import load_acceptance, load_latency
    from ..solver.hardware import SINGLE_DEFAULTS

    acc, curve = load_acceptance(acceptance), load_latency(latency)
    measured = curve.max_target_tokens()
    out, notes = [], []
    for e in entries:
        if e.tree.tree_depth == 0:
            raise TreeoptError(f"--adapt: tree {e.name!r} is the root alone; an adaptive tree starts from a tree of "
                               "depth >= 1 (its drafter has nothing to draft with otherwise)")
        extra = e.metadata.extra
        b = budget if budget is not None else int(extra.get("budget_limit") or e.metadata.budget or e.tree.size)
        if budget is None and b > measured:
            notes.append(f"{e.name} (adaptive): re-solves limited to {measured} nodes (the tree's budget: {b}): latency "
                         f"profile {curve.id!r} was measured up to {measured} target tokens")
            b = measured
        # Medusa's K heads: deeper re-solves are cut
        d = acc.capped_depth(SINGLE_DEFAULTS["max_depth"] if max_depth is None else max_depth)
        br = max_branching if max_branching is not None else int(extra.get("max_branching")
                                                                 or SINGLE_DEFAULTS["max_branching"])
        adapter = TreeAdapter(e.tree, acc.acceptance, curve, budget=b, max_depth=d, max_branching=br, every=every,
                              window=window, prior_weight=prior_weight, profile=acc, guard=guard)
        out.append(TreeEntry(f"{e.name} (adaptive)", e.tree, e.metadata,
                             policy=lambda drafter, a=adapter: AdaptiveTreePolicy(drafter, a)))
        notes.append(f"{e.name} (adaptive): re-solved every {every} steps from the acceptance of the last {window} "
                     f"steps (prior {acc.id!r}, worth {prior_weight:g} trials per rank) with latency profile "
                     f"{curve.id!r}, within budget {b}, depth {d}, branching {br}; the time of each re-solve is "
                     "charged to its step")
        if adapter.guarded:
            notes.append(f"{e.name} (adaptive): guarded: when the window's tokens per step leaves the profile's 95 % "
                         "prediction interval, the tree is solved from the window's lower bounds (plain decoding "
                         "when no tree beats it there)")
        elif guard:
            notes.append(f"{e.name} (adaptive): not guarded: acceptance profile {acc.id!r} keeps no per-prompt counts "
                         "(re-measure it with treeopt profile acceptance to arm the guard)")
    return out, notes
