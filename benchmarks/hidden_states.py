"""What keeping the target's hidden states costs (feature-head drafters: EAGLE-3, EAGLE, Medusa), and that the
default forward costs what it did: one target forward with its KV cache over n = 1 and n = 8 tokens (plain
decoding, a verify of a small tree) on the demo target, timed alternately call by call (paired medians):

* ``default``: ``Transformer.forward`` as every decoder without a feature head calls it;
* ``keep last`` / ``keep 3``: the same forward keeping the final norm's output (EAGLE, Medusa) / three layers
  (EAGLE-3's low, middle, high), as the target face runs it once a feature head asked.

With ``--checkout DIR`` the ``default`` forward of another checkout (e.g. main before this change) is timed the
same way in this process's place, so one session compares before and after::

    flock /tmp/treeopt-bench.lock python benchmarks/hidden_states.py --out results/hidden_states/after.json
    flock /tmp/treeopt-bench.lock python benchmarks/hidden_states.py --checkout /work/main \\
        --out results/hidden_states/before.json

Prints a table of medians (ms) and ratios to ``default``; writes the JSON atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkout", type=Path, default=None, help="time the default forward of this checkout")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=40, help="timed calls per variant and n (paired)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.checkout is not None:
        sys.path.insert(0, str(args.checkout.resolve()))
    import torch

    from sequoia_opt.attention import causal_tree_mask
    from sequoia_opt.model.loaders import find_demo_target, load_checkpoint, tune_loaded_model
    from sequoia_opt.profiling.timing import time_alternating

    path = find_demo_target()
    target, _ = load_checkpoint(path, device="cpu", dtype=torch.float32)
    tune_loaded_model(target, path)
    n_layers = target.config.n_layers
    ctx = args.context
    cache = target.new_cache(ctx + 8)
    torch.manual_seed(0)
    with torch.inference_mode():
        prompt = torch.randint(0, target.config.vocab_size, (1, ctx))
        target(prompt, torch.arange(ctx), cache=cache, cache_slots=torch.arange(ctx), prefix_len=0,
               tree_mask=causal_tree_mask(ctx))
    variants = {"default": None}
    if args.checkout is None:
        variants.update({"keep last": (n_layers,), "keep 3": (2, n_layers // 2, n_layers - 3)})
    rows = []
    for n in (1, 8):
        toks = torch.randint(0, target.config.vocab_size, (1, n))
        pos = torch.arange(ctx, ctx + n)
        mask = causal_tree_mask(n)

        def call(keep):
            kw = {} if keep is None else {"hidden_layers": keep}

            @torch.inference_mode()
            def run():
                target(toks, pos, cache=cache, cache_slots=pos, prefix_len=ctx, tree_mask=mask, **kw)
            return run

        timings = time_alternating([call(k) for k in variants.values()], "cpu", min_repeats=args.repeats,
                                   max_repeats=args.repeats)
        base = timings[0].median_ms
        for name, t in zip(variants, timings):
            rows.append({"n": n, "variant": name, "median_ms": round(t.median_ms, 3),
                         "p10_ms": round(t.p10_ms, 3), "p90_ms": round(t.p90_ms, 3),
                         "ratio_to_default": round(t.median_ms / base, 4)})
    print(f"checkout: {args.checkout or 'this one'}; context {ctx}; torch threads {torch.get_num_threads()}")
    print("| n | variant | median ms | p10-p90 ms | / default |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['variant']} | {r['median_ms']:.2f} | {r['p10_ms']:.2f}-{r['p90_ms']:.2f} | "
              f"{r['ratio_to_default']:.3f} |")
    if args.out is not None:
        from sequoia_opt._io import atomic_write_text

        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, json.dumps({"format": "treeopt-bench-hidden-states/1",
                                                "checkout": str(args.checkout or "."), "context": ctx,
                                                "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
