"""Trees for a serving load on the demo pair (or ``--target`` / ``--draft``): per batch size b, the measured
tokens/s (per sequence and total) of plain batched decoding, of the tree ``solve --batch`` chooses for b (or the
tree a plan gives b: ``--plan``, from ``treeopt tune --shape tree -o`` or ``solve --batch -o``), and of the
batch-1 tree run at b; predicted against measured; greedy exactness of every sequence against plain batch-1
decoding of it alone.

Steps (one run, one machine state): profile T(b, n), c(b, w) and the overhead at every b
(:func:`~sequoia_opt.profiling.batch.profile_batches`, the ``profile latency --batch`` method), choose the
tree per batch (:func:`~sequoia_opt.solver.batch.choose_per_batch`) from the pair's shipped greedy acceptance
profile, then decode held-out prompts (``sequoia_opt/data/prompts/eval.jsonl``, mixed lengths) with the
:class:`~sequoia_opt.decoding.loop.Decoder` over a batch. Prints a table and writes
``results/batch/demo-cpu.json`` (and the batch profile beside it) atomically. Timing: wrap in the lock::

    flock /tmp/treeopt-bench.lock python benchmarks/batch.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from sequoia_opt._io import atomic_write_text
from sequoia_opt.decoding import Decoder
from sequoia_opt.errors import ProfileError
from sequoia_opt.drafting.policies import StaticTreePolicy
from sequoia_opt.jobs.load import default_acceptance_path, load_pair, parse_drafter_spec
from sequoia_opt.profiles import load_acceptance
from sequoia_opt.profiles.batch import parse_batches, save_batch_latency
from sequoia_opt.profiling.batch import profile_batches
from sequoia_opt.profiling.latency import method_text
from sequoia_opt.prompts import demo_prompts_path, encode_prompts, load_prompts
from sequoia_opt.solver.batch import choose_per_batch
from sequoia_opt.solver.hardware import draft_forwards, forwards_outside, plain_ms_per_token, score_tree
from sequoia_opt.solver.schedule import load_plan_trees, range_value
from sequoia_opt.tree import now_iso


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``treeopt tune --shape tree`` prints one that checks its plan)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-prompt-tokens", type=int, default=96, help="prompts are cut to this many tokens")
    ap.add_argument("--tokens", default="1,2,3,4,6,8,12,16", help="n grid of T(b, n) (tokens per row)")
    ap.add_argument("--draft-tokens", default="1,2,4,8,16")
    ap.add_argument("--decode-rounds", type=int, default=3,
                    help="each batch's decoders run this many times, interleaved; medians are reported")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-depth", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=Path, default=None, help="default: the demo's held-out eval prompts")
    ap.add_argument("--out", type=Path, default=Path("results/batch/demo-cpu.json"))
    ap.add_argument("--target", type=Path, default=None, help="target checkpoint (default: the demo target)")
    ap.add_argument("--draft", default=None, help="drafter, as treeopt run's --draft (default: the bundled draft)")
    ap.add_argument("--acceptance", type=Path, default=None,
                    help="the drafter's acceptance profile (default: the pair's saved greedy one under profiles/)")
    ap.add_argument("--plan", type=Path, default=None,
                    help="serve this plan's trees (treeopt tune --shape tree -o, or treeopt solve --batch -o) instead "
                         "of solving them here; they are predicted on this run's T(b, n)")
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    batches = parse_batches(args.batches)
    grid = [int(x) for x in args.tokens.split(",")]
    dgrid = [int(x) for x in args.draft_tokens.split(",")]
    t_start = time.time()

    try:  # a bad plan: one line, before loading
        plan = load_plan_trees(args.plan)[0] if args.plan is not None else None
    except ProfileError as err:
        print(f"error: --plan: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    spec = parse_drafter_spec(args.draft)
    pair = load_pair(args.target, spec, device=torch.device("cpu"), dtype=torch.float32)
    misfit = plan_misfit(plan, batches, grid, dgrid, pair.cost_model) if plan is not None else ""
    if misfit:  # before profiling: its trees are priced on this run's T(b, n) and c(b, w), never extrapolated
        print(f"error: --plan {args.plan}: {misfit}", file=sys.stderr)
        raise SystemExit(2)
    target, tok = pair.target, pair.tokenizer
    acc = load_acceptance(args.acceptance or default_acceptance_path(pair.target_name, spec))
    p = acc.acceptance
    print(f"profiling T(b, n) at batch {batches}, n {grid}, context {args.context} ...", flush=True)
    model = pair.spec.kind == "model"  # else c(b, w) on the drafter's cost probe (a head, self layer-skip)
    prof = profile_batches(target, pair.draft if model else None, batches, grid, dgrid, [args.context],
                           target_name=pair.target_name, draft_name=pair.draft_name, profile_id="cpu_demo_batch",
                           device=torch.device("cpu"), dtype=torch.float32, method=method_text(args.rounds, True, grid),
                           rounds=args.rounds, paired=True, min_repeats=min(3, args.repeats),
                           max_repeats=args.repeats, command="benchmarks/batch.py",
                           draft_probe=None if model else pair.cost_probe(), draft_cost_model=pair.cost_model)
    # named after --out (the default: results/batch/demo-cpu-latency-batch.yaml beside demo-cpu.json)
    prof_path = save_batch_latency(args.out.with_name(f"{args.out.stem}-latency-batch.yaml"), prof)
    if plan is None:
        trees = {c.batch: c.tree for c in choose_per_batch(p, prof, batches, max(grid), args.max_depth)}
        tree1 = trees[1] if 1 in trees else choose_per_batch(p, prof, [1], max(grid), args.max_depth)[0].tree
    else:  # the plan's trees, each predicted on this run's curve of its batch size
        trees = {b: range_value(plan, b) for b in batches}  # past its last range, that range's (as the decoder)
        tree1 = range_value(plan, 1)
    print(f"profiled in {time.time() - t_start:.0f} s; trees: "
          + ", ".join(f"b={b}: {t.size} nodes depth {t.tree_depth}" for b, t in trees.items()), flush=True)

    args.prompts = args.prompts or demo_prompts_path("eval")
    texts = load_prompts(args.prompts, limit=max(batches))
    # mixed lengths: prompt i cut to a length cycling over [P, 0.4 P, 0.75 P, 0.25 P, 0.9 P, 0.6 P, 0.33 P, 0.66 P]
    cuts = [1.0, 0.4, 0.75, 0.25, 0.9, 0.6, 0.33, 0.66]
    prompts = [ids[: max(2, int(args.max_prompt_tokens * cuts[i % len(cuts)]))]
               for i, ids in enumerate(encode_prompts(texts, tok))]
    M = args.max_new_tokens
    max_len = max(len(x) for x in prompts) + M + max(grid) + 1
    plain1 = Decoder(target, max_len=max_len)
    ref = [plain1.generate(x, M).tokens for x in prompts]  # no EOS: every row makes M tokens

    def measure(decs: dict, b: int) -> dict:
        """Run every decoder of ``decs`` ``decode_rounds`` times, interleaved (a slow spell of the shared
        machine then hits all of them), and keep each one's median tokens/s."""
        for dec in decs.values():
            dec.generate_batch(prompts[:b], 4)  # warm-up (buffers, allocator)
        runs: dict = {k: [] for k in decs}
        for _ in range(args.decode_rounds):
            for k, dec in decs.items():
                runs[k].append(dec.generate_batch(prompts[:b], M))
        out = {}
        for k, rs in runs.items():
            rs.sort(key=lambda r: r.tokens_per_second)
            r = rs[len(rs) // 2]
            exact = all(all(res.tokens == ref[i] for i, res in enumerate(x.results)) for x in rs)
            steps = len(r.steps)
            out[k] = {"tokens_per_s_total": r.tokens_per_second,
                      "tokens_per_s_per_sequence": r.tokens_per_second_per_sequence,
                      "tokens_per_s_total_runs": [x.tokens_per_second for x in rs],
                      "steps": steps, "tokens_per_step": r.tokens_per_row_step,
                      "step_ms": r.decode_ms / steps if steps else 0.0, "greedy_exact": exact}
        return out

    rows = []
    for b, tree in trees.items():
        curve = prof.curve(b)
        entry = {"batch": b, "prompt_tokens": [len(x) for x in prompts[:b]]}
        decs = {"plain": Decoder(target, max_len=max_len, max_batch=b),
                "chosen": Decoder(target, _policy(pair, tree), max_len=max_len, max_batch=b)}
        if tree != tree1:
            decs["batch1_tree"] = Decoder(target, _policy(pair, tree1), max_len=max_len, max_batch=b)
        got = measure(decs, b)
        s = score_tree(tree, p, curve)
        entry["plain"] = got["plain"]
        entry["plain"]["predicted_tokens_per_s_total"] = b * 1000.0 / plain_ms_per_token(curve)
        entry["chosen"] = got["chosen"]
        entry["chosen"].update(nodes=tree.size, depth=tree.tree_depth, level_widths=list(tree.level_widths),
                               expected_tokens_per_step=s.expected_tokens, predicted_tokens_per_s_total=b * s.tokens_per_s,
                               predicted_step_ms=s.cost_ms)
        if tree == tree1:
            entry["batch1_tree"] = dict(entry["chosen"], same_as_chosen=True)
        else:
            s1 = score_tree(tree1, p, curve)
            entry["batch1_tree"] = got["batch1_tree"]
            entry["batch1_tree"].update(nodes=tree1.size, depth=tree1.tree_depth,
                                        predicted_tokens_per_s_total=b * s1.tokens_per_s, same_as_chosen=False)
        rows.append(entry)
        ch, pl, b1 = entry["chosen"], entry["plain"], entry["batch1_tree"]
        print(f"b={b}: plain {pl['tokens_per_s_total']:.1f} tok/s, chosen ({ch['nodes']} nodes) "
              f"{ch['tokens_per_s_total']:.1f} (pred {ch['predicted_tokens_per_s_total']:.1f}), batch-1 tree "
              f"{b1['tokens_per_s_total']:.1f}; exact {pl['greedy_exact'] and ch['greedy_exact'] and b1['greedy_exact']}",
              flush=True)

    # machine drift: plain decoding's measured tokens/s against its prediction from the same profile (the shared
    # machine's load changes between the profile and the decode runs); "err@drift" divides it out
    for e in rows:
        e["drift"] = e["plain"]["tokens_per_s_total"] / e["plain"]["predicted_tokens_per_s_total"]
        for k in ("plain", "chosen", "batch1_tree"):
            x = e[k]
            x["prediction_error"] = x["tokens_per_s_total"] / x["predicted_tokens_per_s_total"] - 1
            x["prediction_error_at_drift"] = x["tokens_per_s_total"] / (x["predicted_tokens_per_s_total"] * e["drift"]) - 1
    doc = {"benchmark": "benchmarks/batch.py", "date": now_iso(), "device": prof.device, "threads": args.threads,
           "plan": str(args.plan) if args.plan is not None else None,
           "load_average_at_end": list(os.getloadavg()), "decode_rounds": args.decode_rounds,
           "target": pair.target_name, "draft": pair.draft_name, "acceptance_profile": acc.id,
           "latency_profile": str(prof_path), "context_tokens": args.context, "max_new_tokens": M,
           "prompts": str(args.prompts), "batch1_tree": {"nodes": tree1.size, "depth": tree1.tree_depth},
           "rows": rows, "wall_s": time.time() - t_start}
    atomic_write_text(args.out, json.dumps(doc, indent=2) + "\n")
    hdr = (f"{'batch':>5} | {'plain tot':>9} {'/seq':>6} {'pred':>6} | {'tree':>4} {'D':>2} {'G':>5} {'tok/step':>8} "
           f"{'tree tot':>8} {'/seq':>6} {'pred tot':>8} {'err':>6} {'err@drift':>9} | {'b1 tree tot':>11} | exact")
    print(hdr)
    for e in rows:
        pl, ch, b1 = e["plain"], e["chosen"], e["batch1_tree"]
        err = ch["tokens_per_s_total"] / ch["predicted_tokens_per_s_total"] - 1
        print(f"{e['batch']:>5} | {pl['tokens_per_s_total']:>9.1f} {pl['tokens_per_s_per_sequence']:>6.1f} "
              f"{pl['predicted_tokens_per_s_total']:>6.1f} | "
              f"{ch['nodes']:>4} {ch['depth']:>2} {ch['expected_tokens_per_step']:>5.2f} {ch['tokens_per_step']:>8.2f} "
              f"{ch['tokens_per_s_total']:>8.1f} {ch['tokens_per_s_per_sequence']:>6.1f} "
              f"{ch['predicted_tokens_per_s_total']:>8.1f} {err:>+6.1%} {ch['prediction_error_at_drift']:>+9.1%} | "
              f"{b1['tokens_per_s_total']:>11.1f} | "
              f"{pl['greedy_exact'] and ch['greedy_exact'] and b1['greedy_exact']}")
    print(f"wrote {args.out} ({time.time() - t_start:.0f} s)")


def plan_misfit(plan, batches, grid, dgrid, cost_model: str) -> str:
    """Why this run cannot price the plan's trees ('' when it can): the tree served at a batch size of ``batches``
    (or at 1) verifies more tokens than ``grid`` (T(b, n)'s token counts) reaches, or drafts a forward outside
    ``dgrid`` (c(b, w)'s widths) under the drafter's ``cost_model``: the solver extrapolates neither.

    Args:
        plan: ``[(lo, hi, tree), ...]`` (:func:`~sequoia_opt.solver.schedule.load_plan_trees`).
        batches / grid / dgrid: ``--batches``, ``--tokens``, ``--draft-tokens``.  cost_model: per-level | one-pass.
    """
    for b in sorted({1, *batches}):
        tree = range_value(plan, b)
        if tree.size > max(grid):
            return (f"batch {b} runs a tree of {tree.size} nodes, past --tokens (up to {max(grid)}): add "
                    f"{tree.size} to --tokens")
        forwards = draft_forwards(tree.level_widths, cost_model)
        if forwards_outside(forwards, min(dgrid), max(dgrid)):
            return (f"batch {b} runs a tree whose draft forwards cover {min(forwards)}-{max(forwards)} tokens "
                    f"({cost_model}), outside --draft-tokens ({min(dgrid)}-{max(dgrid)}): widen --draft-tokens")
    return ""


def _policy(pair, tree):
    """Plain decoding for a root-only tree, else the pair's drafter on the static tree."""
    return StaticTreePolicy(pair.new_drafter(), tree) if tree.size > 1 else None


if __name__ == "__main__":
    main()
