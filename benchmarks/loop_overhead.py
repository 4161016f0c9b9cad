"""The loop's own per-step work, outside the model forwards: ``bookkeeping_ms`` (accept, emit, KV compaction,
the policy's commit and observation) and ``draft_ms`` of a step whose drafter is free (prompt lookup), for plain
decoding and two static trees with the demo pair on this machine. Medians over every step of every round.

Runs against this checkout, or against another one (``--checkout DIR``: it is put first on ``sys.path``), so one
command measures the code before and after a change of the loop in the same session:

    flock /tmp/treeopt-bench.lock python benchmarks/loop_overhead.py --out results/loop/after.json
    git worktree add /tmp/before <commit> && \\
    flock /tmp/treeopt-bench.lock python benchmarks/loop_overhead.py --checkout /tmp/before --out results/loop/before.json

The two files go side by side with ``--compare before.json after.json`` (ratios after / before).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def _decoders(target, draft, tree, lookup):
    """Plain, a tree with the draft model, the same tree with prompt lookup: through whichever API this checkout
    has (the one loop, or the earlier decoder classes)."""
    try:
        from sequoia_opt.decoding import Decoder
        from sequoia_opt.drafting import ModelDrafter, StaticTreePolicy

        def whole(drafter):  # every step the whole tree, as the earlier checkouts ran it (an attribute they ignore)
            policy = StaticTreePolicy(drafter, tree)
            policy.cut_at_answer_end = False
            return policy

        return {"plain": Decoder(target, max_len=512),
                "tree (draft model)": Decoder(target, whole(ModelDrafter(draft)), max_len=512),
                "tree (lookup)": Decoder(target, whole(lookup()), max_len=512)}
    except ImportError:
        from sequoia_opt.decoding import AutoregressiveDecoder, SpeculativeDecoder

        return {"plain": AutoregressiveDecoder(target, max_len=512),
                "tree (draft model)": SpeculativeDecoder(target, draft, tree, max_len=512),
                "tree (lookup)": SpeculativeDecoder(target, lookup(), tree, max_len=512)}


def measure(args) -> dict:
    import torch

    try:
        from sequoia_opt.jobs.load import load_pair
    except ImportError:  # an earlier checkout
        from sequoia_opt.pipeline import load_pair
    from sequoia_opt.prompts import demo_prompts_path, load_prompts
    from sequoia_opt.tree import Tree

    try:
        from sequoia_opt.drafting import PromptLookupDrafter
    except ImportError:
        from sequoia_opt.decoding import PromptLookupDrafter

    torch.set_num_threads(args.threads)
    pair = load_pair(None, None, device=torch.device("cpu"), dtype=torch.float32)
    tok = pair.tokenizer
    prompts = [tok.encode(p.text) for p in load_prompts(demo_prompts_path("eval"), limit=args.prompts)]
    tree = Tree.from_choices([[0], [1], [0, 0], [0, 0, 0]])
    V = pair.target.config.vocab_size
    decs = _decoders(pair.target, pair.draft, tree, lambda: PromptLookupDrafter(V))
    for d in decs.values():  # warm-up
        d.generate(prompts[0], 8)
    steps = {k: [] for k in decs}
    tps = {k: [] for k in decs}
    outputs = {k: [] for k in decs}
    for _ in range(args.rounds):
        for k, d in decs.items():  # interleaved: a slow spell of the shared machine hits every decoder
            for p in prompts:
                r = d.generate(p, args.new_tokens)
                steps[k] += r.steps
                tps[k].append(r.tokens_per_second)
                outputs[k].append(r.tokens)
    out = {}
    for k in decs:
        s = steps[k]
        out[k] = {"steps": len(s), "bookkeeping_ms_median": statistics.median(x.bookkeeping_ms for x in s),
                  "draft_ms_median": statistics.median(x.draft_ms for x in s),
                  "verify_ms_median": statistics.median(x.verify_ms for x in s),
                  "tokens_per_s_median": statistics.median(tps[k]),
                  "equal_to_plain": outputs[k] == outputs["plain"]}
    return {"checkout": args.checkout or str(Path(__file__).resolve().parents[1]), "threads": args.threads,
            "prompts": args.prompts, "new_tokens": args.new_tokens, "rounds": args.rounds,
            "tree": tree.choices(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "decoders": out}


def compare(before: Path, after: Path) -> None:
    b, a = json.loads(before.read_text()), json.loads(after.read_text())
    print(f"{'decoder':<22}{'bookkeeping ms':>30}{'draft ms':>26}{'tokens/s':>26}")
    for k in a["decoders"]:
        x, y = b["decoders"][k], a["decoders"][k]
        row = [f"{k:<22}"]
        for key in ("bookkeeping_ms_median", "draft_ms_median", "tokens_per_s_median"):
            ratio = f"{y[key] / x[key]:>5.2f}x" if x[key] else "  new"  # plain decoding timed no draft before
            row.append(f"{x[key]:>9.4f} -> {y[key]:>8.4f} ({ratio})")
        print("".join(row))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkout", help="measure this checkout of treeopt instead of this one")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    sys.path.insert(0, args.checkout or str(Path(__file__).resolve().parents[1]))
    res = measure(args)
    for k, v in res["decoders"].items():
        print(f"{k:<22} bookkeeping {v['bookkeeping_ms_median']:.4f} ms  draft {v['draft_ms_median']:.4f} ms  "
              f"verify {v['verify_ms_median']:.2f} ms  {v['tokens_per_s_median']:.1f} tokens/s  "
              f"equal to plain: {v['equal_to_plain']}")
    if args.out:
        from sequoia_opt._io import atomic_write_text

        atomic_write_text(args.out, json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
