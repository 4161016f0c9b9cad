"""Where a tree's real step differs from the probe's (issue 31): the loop's timed step of a tree
(``time_loop``: random-token prompts, nearly every draft rejected, each step paired with a plain step) against the
same tree's steps in real generations on held-out prompts, part by part (draft, verify, bookkeeping), each as a
ratio to the plain step of its own setting, and the real steps split by how many drafts they accepted.

The demo pair (float32), this CPU; the tree is the one the demo pair's solver picks on this CPU (10 nodes, depth 2)
unless ``--tree`` gives a choice list. Prints the table and writes ``results/step_parts/<run-id>.json``::

    flock /tmp/treeopt-bench.lock python benchmarks/step_parts.py              # ~3 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sequoia_opt.omp import apply_default  # noqa: E402

apply_default()  # as the treeopt command: threads sleep unless OMP_WAIT_POLICY is set

DEMO_TREE = [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [2, 0]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", default=json.dumps(DEMO_TREE), help="the tree's choice list (JSON)")
    ap.add_argument("--prompts", type=int, default=10, help="held-out eval prompts")
    ap.add_argument("--new-tokens", type=int, default=40)
    ap.add_argument("--context", type=int, default=256, help="the probe's context (tokens)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "results/step_parts")
    args = ap.parse_args(argv)

    import torch

    from sequoia_opt._io import create_run_record
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.drafters import drafter_factory
    from sequoia_opt.drafting.policies import StaticTreePolicy
    from sequoia_opt.jobs.load import load_pair, parse_device, parse_dtype
    from sequoia_opt.profiling.steps import time_loop
    from sequoia_opt.prompts import demo_prompts_path, encode_prompts, load_prompts
    from sequoia_opt.tree import Tree, now_iso

    tree = Tree.from_choices(json.loads(args.tree))
    pair = load_pair(None, None, device=parse_device("cpu"), dtype=parse_dtype("float32"))
    ids = encode_prompts(load_prompts(demo_prompts_path("eval"), limit=args.prompts), pair.tokenizer,
                         model=pair.target_name)
    eos = sorted(pair.tokenizer.eos_ids)
    longest = max(len(p) for p in ids) + args.new_tokens + tree.size + 1
    max_len = max(longest, args.context + (args.steps + 3) * tree.size + 16)
    make = drafter_factory(pair.new_drafter)

    def decoder(n: int) -> Decoder:
        return Decoder(pair.target, None if n == 1 else StaticTreePolicy(make(), tree, cut_at_answer_end=False),
                       eos_ids=eos, max_len=max_len)

    probe = time_loop(decoder, [1, tree.size], args.context, pair.target.config.vocab_size, steps=args.steps,
                      rounds=args.rounds)
    plain, tree_dec = decoder(1), decoder(tree.size)
    plain.generate(ids[0], 8)
    tree_dec.generate(ids[0], 8)
    P: dict[str, list[float]] = {"verify": [], "bookkeeping": []}
    T: dict[str, list[float]] = {"draft": [], "verify": [], "bookkeeping": []}
    accepted: list[int] = []
    with torch.inference_mode():
        for p in ids:  # prompt by prompt, plain then the tree: a drifting machine slows both alike
            a, b = plain.generate(p, args.new_tokens), tree_dec.generate(p, args.new_tokens)
            for s in a.steps:
                P["verify"].append(s.verify_ms)
                P["bookkeeping"].append(s.bookkeeping_ms)
            for s in b.steps:
                T["draft"].append(s.draft_ms)
                T["verify"].append(s.verify_ms)
                T["bookkeeping"].append(s.bookkeeping_ms)
                accepted.append(s.accepted_nodes)
    med = statistics.median
    real_plain = med(P["verify"]) + med(P["bookkeeping"])
    probe_plain = probe.verify_ms[0] + probe.bookkeeping_ms[0]
    i = probe.tokens.index(tree.size)
    probe_parts = {"draft": probe.draft_ms[i], "verify": probe.verify_ms[i], "bookkeeping": probe.bookkeeping_ms[i]}
    real_parts = {k: med(v) for k, v in T.items()}
    rows = []
    for part in ("draft", "verify", "bookkeeping"):
        rows.append({"part": part, "probe_ms": probe_parts[part], "real_ms": real_parts[part],
                     "probe_over_plain": probe_parts[part] / probe_plain, "real_over_plain": real_parts[part] / real_plain})
    by_accepted = []
    for k in sorted(set(accepted)):
        sel = [j for j, a in enumerate(accepted) if a == k]
        by_accepted.append({"accepted_drafts": k, "steps": len(sel),
                            **{f"{part}_ms": med([T[part][j] for j in sel]) for part in T}})
    doc = {"format": "treeopt-bench-step-parts/1", "date": now_iso(),
           "command": "flock /tmp/treeopt-bench.lock python benchmarks/step_parts.py", "tree": tree.choices(),
           "threads": torch.get_num_threads(), "load_avg_1min": os.getloadavg()[0], "prompts": len(ids),
           "new_tokens": args.new_tokens, "probe_context": args.context, "probe_plain_ms": probe_plain,
           "real_plain_ms": real_plain, "probe_step_over_plain": sum(probe_parts.values()) / probe_plain,
           "real_step_over_plain": sum(real_parts.values()) / real_plain, "parts": rows, "real_by_accepted": by_accepted}
    print(f"plain step: probe {probe_plain:.2f} ms, real {real_plain:.2f} ms; tree step / plain step: probe "
          f"{doc['probe_step_over_plain']:.3f}, real {doc['real_step_over_plain']:.3f}")
    print(f"{'part':<12} {'probe ms':>9} {'real ms':>9} {'probe/plain':>12} {'real/plain':>11}")
    for r in rows:
        print(f"{r['part']:<12} {r['probe_ms']:>9.2f} {r['real_ms']:>9.2f} {r['probe_over_plain']:>12.3f} "
              f"{r['real_over_plain']:>11.3f}")
    for r in by_accepted:
        print(f"  real steps accepting {r['accepted_drafts']}: {r['steps']} steps, draft {r['draft_ms']:.2f} / verify "
              f"{r['verify_ms']:.2f} / bookkeeping {r['bookkeeping_ms']:.2f} ms")
    out = create_run_record(args.out, doc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
