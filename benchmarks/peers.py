"""treeopt against its peers on this CPU: one run, the same GGUF, the same prompts, greedy.

Rows (each decodes the demo eval prompts, ``--max-new-tokens`` each, stopping at EOS like plain decoding):

- treeopt plain, ``F.linear`` (untuned): the bundled decoder as a plain PyTorch decoder runs it;
- treeopt plain (tuned linears, ``sequoia_opt.model.tuned_linear``): the baseline of every treeopt speedup;
- treeopt tree: the hardware-aware tree solved from a latency profile measured here, in this run, with the
  tuned linears, and the pair's greedy acceptance profile (default: the shipped one of the demo pair);
- llama.cpp plain, through ``llama-cpp-python`` (the same GGUF, ``--threads`` threads), when installed;
- transformers ``generate`` plain, the GGUF loaded with ``gguf_file=`` (dequantized to float32), and assisted
  generation with the bundled draft (``assistant_model=``: transformers' chain speculative decoding), when
  transformers is installed.

Reports tokens/s (new tokens over decode wall time, prefill included, as every row), tokens/step (new
tokens per target forward) and whether each row's tokens equal treeopt plain decoding's, then the goals of
issue 18 (T(4)/T(1), T(8)/T(1), tree speedup over the best plain decoder, treeopt plain against transformers
plain, the tree against assisted generation, the prediction against the measurement). Writes
``results/peers/<stamp>.json``. Use ``--threads`` for every engine alike.

    python benchmarks/peers.py                      # ~6 min on 2 cores
    python benchmarks/peers.py --num-prompts 2 --max-new-tokens 16   # a smoke run
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sequoia_opt._io import create_run_record  # noqa: E402
from sequoia_opt.tree import now_iso  # noqa: E402

DEFAULT_ACCEPTANCE = ROOT / "profiles" / "SmolLM2-135M-Instruct.Q4_1__treeopt-smollm2-draft" / "acceptance-greedy.yaml"


def _prefix_share(outs: list[list[int]], reference: list[list[int]]) -> float:
    """Mean share of each reference output that a row reproduces before its first different token."""
    shares = []
    for o, r in zip(outs, reference):
        k = next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), min(len(o), len(r)))
        shares.append(k / max(1, len(r)))
    return sum(shares) / max(1, len(shares))


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def treeopt_rows(args, prompts_ids, eos, pair, report_to: dict) -> tuple[list[dict], list[list[int]]]:
    """Profile T(n) here (tuned), solve the hardware-aware tree, run plain + tree; then plain untuned."""
    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.model.tuned_linear import linear_record, tune_linears, untune
    from sequoia_opt.profiles import load_acceptance
    from sequoia_opt.profiling.latency import (build_latency_profile, measure_step_overhead, method_text,
                                               profile_model)
    from sequoia_opt.profiling.timing import token_grid
    from sequoia_opt.solver.hardware import choose
    from sequoia_opt.tree import TreeMetadata

    grid = token_grid(args.max_tokens)
    timing = dict(rounds=2, paired=True, max_repeats=5)
    tt = profile_model(pair.target, grid, [args.context], what="target", **timing)
    dt = profile_model(pair.draft, grid, [args.context], what="draft", **timing)
    overhead = measure_step_overhead(pair.target, pair.draft)
    curve = build_latency_profile(
        target_tables=tt, draft_tables=dt, step_overhead_ms=overhead, device="cpu", dtype=torch.float32,
        target_name=pair.target_name, target_config=pair.target.config, draft_name=pair.draft_name,
        draft_config=pair.draft.config, random_weights=False, profile_id="peers", method=method_text(2, True, grid),
        command="benchmarks/peers.py", linear=linear_record(pair.target), draft_linear=linear_record(pair.draft))
    acc = load_acceptance(args.acceptance)
    choice = choose(acc.acceptance, curve, args.max_tokens, 10, len(acc.acceptance), context=args.context)
    T = {n: curve.target_ms(n, args.context) for n in (1, 2, 4, 8, 16) if n <= args.max_tokens}
    report_to["curve"] = {"T_ms": T, "draft_c1_ms": curve.draft_ms(1, args.context), "overhead_ms": overhead,
                          "linear": linear_record(pair.target)}
    report_to["tree"] = {"size": choice.tree.size, "depth": choice.tree.tree_depth,
                         "predicted_tokens_per_step": choice.expected_tokens,
                         "predicted_speedup": choice.speedup}
    meta = TreeMetadata(budget=choice.budget, max_depth=choice.depth, expected_tokens_per_step=choice.expected_tokens,
                        predicted_speedup=choice.speedup, acceptance_profile=acc.id, latency_profile=curve.id,
                        solver="sequoia-dp+hardware", date=now_iso())
    run = run_trees(pair.target, pair.draft, [TreeEntry("tree", choice.tree, meta)], prompts_ids,
                    max_new_tokens=args.max_new_tokens, eos_ids=eos)
    plain, tree = run.summaries[0], run.summaries[1]
    rows = [
        {"engine": "treeopt", "config": "plain (tuned linears)", "tokens_per_s": plain.tokens_per_s,
         "tokens_per_step": 1.0, "equals_treeopt_plain": True},
        {"engine": "treeopt", "config": f"tree ({choice.tree.size} nodes, hardware-aware)",
         "tokens_per_s": tree.tokens_per_s, "tokens_per_step": tree.tokens_per_step,
         "equals_treeopt_plain": tree.mismatches == 0, "speedup_over_own_plain": tree.speedup,
         "predicted_speedup": choice.speedup, "predicted_tokens_per_step": choice.expected_tokens},
    ]
    # the same plain decoder with every linear on F.linear (what a plain PyTorch decoder runs), after the rest
    from sequoia_opt.decoding import autoregressive_generate

    def plain_all():
        return [autoregressive_generate(pair.target, p, args.max_new_tokens, eos_ids=eos).tokens for p in prompts_ids]

    reference = plain_all()  # warm, tuned: the reference tokens for every other row
    untune(pair.target)
    plain_all()  # warm-up
    out, secs = _timed(plain_all)
    rows.insert(0, {"engine": "treeopt", "config": "plain (F.linear, untuned)",
                    "tokens_per_s": sum(len(o) for o in out) / secs, "tokens_per_step": 1.0,
                    "equals_treeopt_plain": out == reference})
    tune_linears(pair.target)  # back to the plan (from the cache)
    return rows, reference


def llamacpp_rows(args, prompts_ids, eos, reference, gguf_path) -> list[dict]:
    try:
        import llama_cpp
    except ImportError:
        return [{"engine": "llama.cpp", "config": "not installed (pip install llama-cpp-python)"}]
    llm = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=1024, n_threads=args.threads,
                          n_threads_batch=args.threads, verbose=False)

    def one(p):
        llm.reset()
        out = []
        for tok in llm.generate(p, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(tok))
            if tok in eos or len(out) >= args.max_new_tokens:
                break
        return out

    one(prompts_ids[0])  # warm-up
    outs, secs = _timed(lambda: [one(p) for p in prompts_ids])
    return [{"engine": "llama.cpp", "config": f"plain (llama-cpp-python {llama_cpp.__version__})",
             "tokens_per_s": sum(len(o) for o in outs) / secs, "tokens_per_step": 1.0,
             "equals_treeopt_plain": outs == reference,
             "prompts_equal_to_treeopt_plain": sum(a == b for a, b in zip(outs, reference)),
             "common_prefix_share": _prefix_share(outs, reference)}]


def transformers_rows(args, prompts_ids, eos, reference, gguf_path) -> list[dict]:
    try:
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        return [{"engine": "transformers", "config": "not installed (pip install transformers)"}]
    target = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                  dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(str(ROOT / "sequoia_opt" / "data" / "draft"),
                                                 dtype=torch.float32).eval()
    forwards = []
    target.register_forward_pre_hook(lambda *a: forwards.append(1))
    gen_kw = dict(max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=list(eos),
                  pad_token_id=list(eos)[0], top_p=None, top_k=None, temperature=None)

    def run(**kw):
        outs, steps = [], 0
        for p in prompts_ids:
            ids = torch.tensor([p])
            forwards.clear()
            with torch.inference_mode():
                y = target.generate(ids, attention_mask=torch.ones_like(ids), **gen_kw, **kw)
            new = y[0, len(p):].tolist()
            outs.append(new)
            steps += max(1, len(forwards) - 1)  # the prefill forward also yields the first token
        return outs, steps

    rows = []
    for config, kw in (("generate, plain", {}), ("generate, assisted (bundled draft)", {"assistant_model": draft})):
        with torch.inference_mode():
            target.generate(torch.tensor([prompts_ids[0]]), **gen_kw, **kw)  # warm-up
        (outs, steps), secs = _timed(lambda: run(**kw))
        n = sum(len(o) for o in outs)
        rows.append({"engine": "transformers", "config": f"{config} (transformers {transformers.__version__})",
                     "tokens_per_s": n / secs, "tokens_per_step": n / max(1, steps + len(prompts_ids)) if kw else 1.0,
                     "equals_treeopt_plain": outs == reference,
                     "prompts_equal_to_treeopt_plain": sum(a == b for a, b in zip(outs, reference)),
                     "common_prefix_share": _prefix_share(outs, reference)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256, help="context length T(n) is profiled at (tokens)")
    ap.add_argument("--max-tokens", type=int, default=32, help="largest tree (= largest n profiled)")
    ap.add_argument("--acceptance", type=Path, default=DEFAULT_ACCEPTANCE)
    ap.add_argument("--weights", default="float32", help="treeopt's target weight precision (float32|int4|int8)")
    ap.add_argument("--skip", default="", help="comma-separated engines to skip: llama.cpp,transformers")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "peers")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from sequoia_opt.jobs.load import default_target_path, load_pair
    from sequoia_opt.prompts import demo_prompts_path, load_prompts
    from sequoia_opt.device import cpu_name

    gguf_path = default_target_path()
    pair = load_pair(None, None, device=torch.device("cpu"), dtype=torch.float32, weights=args.weights,
                     log=lambda s: print(f"note: {s}", file=sys.stderr))
    eos = sorted(pair.tokenizer.eos_ids)
    prompts = load_prompts(demo_prompts_path("eval"), limit=args.num_prompts)
    ids = [pair.tokenizer.encode(p.text) for p in prompts]
    doc: dict = {"format": "treeopt-bench-peers/1", "date": now_iso(), "device": cpu_name(),
                 "threads": args.threads, "torch": str(torch.__version__), "target": gguf_path.name,
                 "draft": pair.draft_name, "num_prompts": len(ids), "max_new_tokens": args.max_new_tokens,
                 "weights": args.weights}
    rows, reference = treeopt_rows(args, ids, eos, pair, doc)
    skip = set(filter(None, args.skip.split(",")))
    if "llama.cpp" not in skip:
        rows += llamacpp_rows(args, ids, set(eos), reference, gguf_path)
    if "transformers" not in skip:
        rows += transformers_rows(args, ids, eos, reference, gguf_path)
    doc["rows"] = rows

    def tps(engine: str, prefix: str):
        return next((r["tokens_per_s"] for r in rows if r["engine"] == engine and r["config"].startswith(prefix)
                     and "tokens_per_s" in r), None)

    T = doc["curve"]["T_ms"]
    tree = next(r for r in rows if r["config"].startswith("tree"))
    plains = [r["tokens_per_s"] for r in rows if "plain" in r["config"] and "tokens_per_s" in r
              and r["engine"] == "treeopt"]
    goals = {"T4_over_T1": T[4] / T[1], "T8_over_T1": T[8] / T[1],
             "tree_over_best_treeopt_plain": tree["tokens_per_s"] / max(plains),
             "predicted_over_measured_speedup": tree["predicted_speedup"] / tree["speedup_over_own_plain"]}
    if tps("transformers", "generate, plain"):
        goals["treeopt_plain_over_transformers_plain"] = tps("treeopt", "plain (tuned") / tps("transformers", "generate, plain")
        goals["tree_over_transformers_assisted"] = tree["tokens_per_s"] / tps("transformers", "generate, assisted")
    if tps("llama.cpp", "plain"):
        goals["tree_over_llamacpp_plain"] = tree["tokens_per_s"] / tps("llama.cpp", "plain")
    doc["goals"] = goals
    args.out.mkdir(parents=True, exist_ok=True)
    path = create_run_record(args.out, doc)

    print(f"{doc['device']}, {args.threads} threads; {len(ids)} eval prompts x {args.max_new_tokens} tokens, greedy")
    print("T(n) ms (tuned): " + ", ".join(f"T({n}) = {v:.1f}" for n, v in T.items()))
    print("| engine | config | tokens/s | tokens/step | = treeopt plain |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "tokens_per_s" not in r:
            print(f"| {r['engine']} | {r['config']} | - | - | - |")
            continue
        eq = r["equals_treeopt_plain"]
        eq_txt = "yes" if eq else (f"no ({r.get('prompts_equal_to_treeopt_plain', 0)}/{len(ids)} prompts; "
                                   f"{r.get('common_prefix_share', 0):.0%} of tokens before the first difference)")
        print(f"| {r['engine']} | {r['config']} | {r['tokens_per_s']:.1f} | {r['tokens_per_step']:.2f} | {eq_txt} |")
    print("goals: " + ", ".join(f"{k} = {v:.2f}" for k, v in goals.items()))
    print(f"wrote {path}")
    return 0 if tree["equals_treeopt_plain"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
