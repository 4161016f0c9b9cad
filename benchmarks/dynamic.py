"""Dynamic trees, calibration and adaptive static trees on the demo pair and this device (issue 17), greedy.

1. Profiles, each with the command a user runs (``treeopt ...`` in a subprocess): this machine's latency curve
   (``profile latency``), the calibration profile (``profile acceptance --calibration``) on the demo's *profile*
   prompts (Python code only), and a positional acceptance profile of English prose (``profile acceptance``
   on the first half of ``benchmarks/data/prose-moby-dick.jsonl``, Moby-Dick, public domain). The code
   acceptance profile is the shipped one (also measured on the profile prompts).
2. Solve: the hardware-aware static DP tree from the code profile (``choose``, as ``treeopt solve -l``) and
   from the prose profile; budget B = the code tree's size. Each dynamic policy at budget B with the steps /
   topk its calibration prediction ranks best, and the hardware-aware best dynamic setting over every budget
   (``solve --dynamic``'s choice).
3. Run on the held-out *eval* code prompts (one ``run_trees`` call, one plain baseline): the static DP tree,
   the three policies at B, the best dynamic setting, and the static tree adapted (``run --adapt``).
4. Run a mixed stream, code and prose prompts alternating (eval code prompts, the second half of the prose
   file), profiled on code only: the code tree, the prose tree, the best dynamic policy at B, and the code
   tree adapted. "Per-domain best": each prompt decoded by its own domain's tree (code tree on code prompts,
   prose tree on prose prompts), from the same run's rows.

Reported: tokens/s, speedup over plain decoding in the same run, tokens/step predicted (static: G under the
profile; dynamic: the calibration's prediction) and measured, greedy equality. Goals: the best dynamic
policy at least +10 % tokens/step over the static DP tree at equal budget; each dynamic setting's predicted
tokens/step within 5 % of measured; on the mixed stream the adaptive tree beats every fixed tree's tokens/s and
comes within 5 % of the per-domain best. Writes ``results/dynamic/<date>.json`` and the profiles under
``results/dynamic/<date>/``::

    python benchmarks/dynamic.py            # ~25 min on 2 CPU cores
    python benchmarks/dynamic.py --quick    # smoke test, ~4 min
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from sequoia_opt._io import create_files, new_run_id

PROSE = Path(__file__).parent / "data" / "prose-moby-dick.jsonl"


def treeopt(*args: object) -> None:
    cmd = [sys.executable, "-m", "sequoia_opt", *map(str, args)]
    print("$ treeopt " + " ".join(map(str, args)), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def split_prose(out: Path) -> tuple[Path, Path]:
    lines = PROSE.read_text(encoding="utf-8").splitlines(keepends=True)
    half = len(lines) // 2
    prof, ev = out / "prose-profile.jsonl", out / "prose-eval.jsonl"
    prof.write_text("".join(lines[:half]), encoding="utf-8")
    ev.write_text("".join(lines[half:]), encoding="utf-8")
    return prof, ev


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--num-prompts", type=int, default=None, help="eval prompts per domain (default 8; quick 2)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="tokens per prompt (default 64; quick 16)")
    ap.add_argument("--latency", type=Path, default=None, help="reuse this latency profile (default: measure)")
    ap.add_argument("--calibration", type=Path, default=None, help="reuse this calibration profile")
    ap.add_argument("--prose-acceptance", type=Path, default=None, help="reuse this prose acceptance profile")
    ap.add_argument("--budget", type=int, default=32, help="largest static tree / dynamic budget (default 32)")
    ap.add_argument("--equal-budget", type=int, default=16,
                    help="also compare at this budget: the DP-optimal static tree of that size against each policy "
                         "(default 16; 0 to skip)")
    ap.add_argument("--out", type=Path, default=Path("results/dynamic"))
    args = ap.parse_args(argv)

    import torch

    from sequoia_opt.profiles.calibration import load_calibration
    from sequoia_opt.drafting.policies import AdaptiveTreePolicy, DynamicPolicy, TreeAdapter
    from sequoia_opt.dynamic import POLICY_NAMES, DynamicSetting
    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.jobs.load import load_pair
    from sequoia_opt.profiles import load_acceptance, load_latency
    from sequoia_opt.prompts import demo_prompts_path, load_prompts
    from sequoia_opt.solver import choose
    from sequoia_opt.solver.dynamic import choose_dynamic, predict_setting, setting_grid
    from sequoia_opt.tree import Tree, TreeMetadata

    quick = args.quick
    n_eval = args.num_prompts or (2 if quick else 8)
    new = args.max_new_tokens or (16 if quick else 64)
    date = new_run_id(None)  # unique: two runs never share a folder or a results file
    out = args.out / date
    out.mkdir(parents=True, exist_ok=True)
    prose_prof, prose_eval = split_prose(out)
    pair = load_pair(None, None, device=torch.device("cpu"), dtype=torch.float32)
    code_acc_path = Path("profiles") / pair.slug / "acceptance-greedy.yaml"

    # 1. profiles
    lat = args.latency or out / "latency.yaml"
    if args.latency is None:
        treeopt("profile", "latency", "--context", "256", "--max-tokens", 16 if quick else 64,
                "--rounds", 1 if quick else 3, "-o", lat)
    cal = args.calibration or out / "calibration-greedy.yaml"
    if args.calibration is None:
        treeopt("profile", "acceptance", "--calibration", "--num-prompts", 3 if quick else 16,
                "--max-new-tokens", 16 if quick else 64, "-o", cal)
    pacc = args.prose_acceptance or out / "acceptance-prose.yaml"
    if args.prose_acceptance is None:
        treeopt("profile", "acceptance", "--prompts", prose_prof, "--num-prompts", 3 if quick else 12,
                "--max-new-tokens", 16 if quick else 64, "-o", pacc)
    curve, calib = load_latency(lat), load_calibration(cal)
    code_acc, prose_acc = load_acceptance(code_acc_path), load_acceptance(pacc)
    top = min(args.budget, curve.max_target_tokens())

    # 2. solve
    code = choose(code_acc.acceptance, curve, top, 12)
    prose = choose(prose_acc.acceptance, curve, top, 12)
    B = max(code.tree.size, 2)
    E = min(args.equal_budget, top)
    grid = setting_grid(calib, max_budget=top, budgets=sorted({B, E, 4, 6, 8, 12, 16, 24, 32} - {0}))
    ch = choose_dynamic(calib, curve, grid)

    def best_at(budget):
        return {p: max((r for r in ch.rows if r.setting.policy == p and r.setting.budget == budget),
                       key=lambda r: r.tokens_per_step, default=None) for p in POLICY_NAMES}

    at_b = best_at(B)
    at_e = best_at(E) if E >= 2 and E != B else {}
    best_dyn = ch.best

    def static_entry(name, c):
        meta = TreeMetadata(budget=c.budget, max_depth=c.depth, expected_tokens_per_step=c.expected_tokens,
                            predicted_speedup=c.speedup, solver="sequoia-dp")
        return TreeEntry(name, c.tree, meta)

    def dyn_entry(r):
        meta = TreeMetadata(budget=r.setting.budget, max_depth=r.setting.steps,
                            expected_tokens_per_step=r.tokens_per_step, predicted_speedup=r.speedup,
                            solver=f"dynamic:{r.setting.policy}", extra={"setting": r.setting.to_dict()})
        return TreeEntry(r.setting.label, Tree.chain(1), meta,
                         policy=lambda d, s=r.setting: DynamicPolicy(d, s, name=pair.draft_name))

    def adaptive_entry(c):
        ad = TreeAdapter(c.tree, code_acc.acceptance, curve, budget=top, max_depth=12, max_branching=8, every=16,
                         window=64, prior_weight=8.0)
        return TreeEntry("static DP (adaptive)", c.tree, TreeMetadata(expected_tokens_per_step=c.expected_tokens),
                         policy=lambda d: AdaptiveTreePolicy(d, ad))

    eos = sorted(pair.tokenizer.eos_ids)
    code_ids = [pair.tokenizer.encode(p.text) for p in load_prompts(demo_prompts_path("eval"), limit=n_eval)]
    prose_ids = [pair.tokenizer.encode(p.text) for p in load_prompts(prose_eval, limit=n_eval)]

    def progress(what, done, total):
        print(f"  [{done}/{total}] {what}", flush=True)

    # 3. eval code prompts
    entries = [static_entry("static DP", code)]
    seen = set()
    for p in POLICY_NAMES:
        if at_b[p] is not None:
            entries.append(dyn_entry(at_b[p]))
            seen.add(at_b[p].setting)
    if best_dyn.setting not in seen:
        entries.append(dyn_entry(best_dyn))
        seen.add(best_dyn.setting)
    if at_e:
        from sequoia_opt.solver import optimal_tree

        t = optimal_tree(code_acc.acceptance, E, 12, 8)
        entries.append(TreeEntry(f"static DP n{E}", t, TreeMetadata(budget=E, expected_tokens_per_step=t.expected_tokens(
            code_acc.acceptance), solver="sequoia-dp")))
        for p in POLICY_NAMES:
            if at_e[p] is not None and at_e[p].setting not in seen:
                entries.append(dyn_entry(at_e[p]))
    entries.append(adaptive_entry(code))
    print(f"eval (code): {len(code_ids)} prompts x {new} tokens, {len(entries)} trees + plain", flush=True)
    run_code = run_trees(pair.target, pair.new_drafter, entries, code_ids, max_new_tokens=new, eos_ids=eos,
                         progress=progress)

    # 4. mixed stream
    mixed = [x for ab in zip(code_ids, prose_ids) for x in ab]
    domain = ["code", "prose"] * len(code_ids)
    best_policy = max((r for r in at_b.values() if r is not None), key=lambda r: r.tokens_per_step)
    m_entries = [static_entry("code tree", code), static_entry("prose tree", prose),
                 dyn_entry(best_policy), adaptive_entry(code)]
    print(f"mixed stream: {len(mixed)} prompts, code and prose alternating", flush=True)
    run_mixed = run_trees(pair.target, pair.new_drafter, m_entries, mixed, max_new_tokens=new, eos_ids=eos,
                          progress=progress)

    # in-sample check of the prediction method: a calibration recorded on the eval prompts themselves (the
    # profile -> eval difference is then the workload's, not the method's)
    cal_eval = out / "calibration-eval-greedy.yaml"
    treeopt("profile", "acceptance", "--calibration", "--prompts", demo_prompts_path("eval"), "--num-prompts", n_eval,
            "--max-new-tokens", new, "-o", cal_eval)
    calib_eval = load_calibration(cal_eval)
    in_sample = {e.name: predict_setting(calib_eval, DynamicSetting.from_dict(e.metadata.extra["setting"]), curve).tokens_per_step
                 for e in entries if "setting" in e.metadata.extra}

    def rows_of(run):
        plain = run.summaries[0]
        return [{"name": s.tree, "size": s.size, "tokens_per_s": s.tokens_per_s, "speedup": s.speedup,
                 "tokens_per_step": s.tokens_per_step, "predicted_tokens_per_step": s.predicted_tokens_per_step,
                 "predicted_speedup": s.predicted_speedup, "mismatches": s.mismatches,
                 "adaptive_resolves": len((s.adaptive or {}).get("resolves", [])) if s.adaptive else None}
                for s in run.summaries if s is not plain] , plain.tokens_per_s

    code_rows, code_plain = rows_of(run_code)
    mixed_rows, mixed_plain = rows_of(run_mixed)
    # per-domain best: code tree on code prompts, prose tree on prose prompts (same run's rows)
    tok = ms = 0.0
    for r in run_mixed.rows:
        if (r.tree == "code tree" and domain[r.prompt_index] == "code") or \
                (r.tree == "prose tree" and domain[r.prompt_index] == "prose"):
            tok += r.new_tokens
            ms += r.decode_ms
    per_domain = 1000 * tok / ms

    static_row = code_rows[0]
    dyn_rows = [r for r in code_rows if r["name"].split(":")[0] in POLICY_NAMES]
    at_b_rows = [r for r in dyn_rows if r["name"].endswith(f"-n{B}")]
    best_at_b = max(at_b_rows, key=lambda r: r["tokens_per_step"]) if at_b_rows else None
    adaptive = next(r for r in mixed_rows if r["name"].endswith("(adaptive)"))
    fixed = [r for r in mixed_rows if not r["name"].endswith("(adaptive)")]
    e_static = next((r for r in code_rows if r["name"] == f"static DP n{E}"), None)
    e_rows = [r for r in dyn_rows if r["name"].endswith(f"-n{E}")]
    best_at_e = max(e_rows, key=lambda r: r["tokens_per_step"]) if e_rows else None
    goals = {
        "best dynamic at budget B, tokens/step over static DP": (best_at_b["tokens_per_step"] / static_row["tokens_per_step"]
                                                                if best_at_b else None),
        f"best dynamic at budget {E}, tokens/step over the static DP tree of {E}": (
            best_at_e["tokens_per_step"] / e_static["tokens_per_step"] if best_at_e and e_static else None),
        "dynamic predicted / measured tokens/step": {r["name"]: r["predicted_tokens_per_step"] / r["tokens_per_step"]
                                                     for r in dyn_rows},
        "dynamic predicted in-sample / measured tokens/step": {r["name"]: in_sample[r["name"]] / r["tokens_per_step"]
                                                               for r in dyn_rows if r["name"] in in_sample},
        "static DP predicted / measured tokens/step": static_row["predicted_tokens_per_step"] / static_row["tokens_per_step"],
        "mixed: adaptive tokens/s over the best fixed tree": adaptive["tokens_per_s"] / max(r["tokens_per_s"] for r in fixed),
        "mixed: adaptive tokens/s over per-domain best": adaptive["tokens_per_s"] / per_domain,
        "greedy equal everywhere": all(r["mismatches"] == 0 for r in code_rows + mixed_rows),
    }
    doc = {"date": date, "device": str(curve.device.get("name")), "threads": torch.get_num_threads(),
           "budget_B": B, "equal_budget": E, "prompts_per_domain": n_eval, "max_new_tokens": new,
           "profiles": {"latency": str(lat), "calibration": str(cal), "calibration_eval": str(cal_eval),
                        "code_acceptance": str(code_acc_path),
                        "prose_acceptance": str(pacc)},
           "calibration_ece": calib.ece(),
           "static": {"code": {"size": code.tree.size, "depth": code.tree.tree_depth, "G": code.expected_tokens,
                               "speedup": code.speedup},
                      "prose": {"size": prose.tree.size, "depth": prose.tree.tree_depth, "G": prose.expected_tokens,
                                "speedup": prose.speedup}},
           "dynamic_choice": best_dyn.to_dict(), "dynamic_at_B": {p: (r.to_dict() if r else None) for p, r in at_b.items()},
           "dynamic_at_equal_budget": {p: (r.to_dict() if r else None) for p, r in at_e.items()},
           "eval_code": {"plain_tokens_per_s": code_plain, "rows": code_rows},
           "mixed": {"plain_tokens_per_s": mixed_plain, "rows": mixed_rows, "per_domain_best_tokens_per_s": per_domain},
           "goals": goals}
    (path,) = create_files({args.out / f"{date}.json": json.dumps(doc, indent=2, default=float) + "\n"})
    for title, rows, plain in (("eval (code)", code_rows, code_plain), ("mixed stream", mixed_rows, mixed_plain)):
        print(f"\n{title}: plain {plain:.2f} tokens/s")
        print(f"  {'name':28s} {'nodes':>5s} {'tok/s':>7s} {'speedup':>7s} {'tok/step':>8s} {'pred':>6s} {'=plain':>6s}")
        for r in rows:
            pred = r["predicted_tokens_per_step"]
            print(f"  {r['name']:28s} {r['size']:5d} {r['tokens_per_s']:7.2f} {r['speedup']:7.3f} "
                  f"{r['tokens_per_step']:8.3f} {pred if pred is not None else float('nan'):6.3f} "
                  f"{'yes' if r['mismatches'] == 0 else 'NO':>6s}")
    print(f"\nper-domain best (mixed): {per_domain:.2f} tokens/s")
    print(json.dumps(goals, indent=2, default=float))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
