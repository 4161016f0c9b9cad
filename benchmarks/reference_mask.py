"""The torch reference's attention mask built once per forward against once per layer (commit b015e1f), plain
decoding and a K-token chain on the demo pair, in the same run.

Every forward of the bundled decoder on a CPU runs :func:`~sequoia_opt.attention.tree_attention_reference` in each
of the target's layers (30 on the demo target). Its SDPA mask, (G*T, L + m) for rows of one length or
(B, 1, G*T, L + m) with per-row validity (a batch whose rows differ in length, as every continuously batched
one does), is the same in every layer of a forward. ``memo`` (now) builds it in the first layer and keeps it on the
:class:`~sequoia_opt.attention.TreeMask` / :class:`~sequoia_opt.attention.RowPrefix`; ``per layer`` (before)
builds it in each layer, put back here by replacing the memo with a call that always builds.

Per batch size of ``--batches``: the eval prompts' last 96 tokens (real prompts: rows of different lengths, so the
per-row path runs at batch > 1), ``--tokens`` new tokens per row, decoded with each way in alternating rounds
(the order flips each round, so the VM's drift hits both alike); per way the median step ms over the steps after the
first two, per round; the ratio is the median of the per-round ratios. Greedy output is checked equal.

    flock /tmp/treeopt-bench.lock python benchmarks/reference_mask.py      # about 3 min on this CPU

Writes ``results/reference_mask/<run-id>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sequoia_opt.attention as attention  # noqa: E402
from sequoia_opt._io import create_files, new_run_id  # noqa: E402
from sequoia_opt.decoding.loop import Decoder  # noqa: E402
from sequoia_opt.drafting import StaticTreePolicy  # noqa: E402
from sequoia_opt.jobs.load import load_pair  # noqa: E402
from sequoia_opt.prompts import demo_prompts_path, encode_prompts, load_prompts  # noqa: E402
from sequoia_opt.tree import Tree, now_iso  # noqa: E402

_MEMO = attention._memo_mask
WAYS = {"memo": _MEMO, "per layer": lambda memo, key, held, build: build()}


def decode(pair, prompts: list[list[int]], k: int, tokens: int) -> tuple[float, list[list[int]]]:
    """One batch decoded with a K-token chain (0: plain decoding): the median step ms after the first two steps,
    and the tokens per row."""
    policy = StaticTreePolicy(pair.new_drafter(), Tree.chain(k + 1)) if k else None
    dec = Decoder(pair.target, policy, max_batch=len(prompts), max_len=512)
    state = dec.start_batch(prompts, tokens)
    ms = []
    while not state.finished:
        ms.append(dec.step(state).total_ms)
    return statistics.median(ms[2:] or ms), [r.tokens for r in state.results]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,16", help="batch sizes, comma-separated")
    ap.add_argument("--ks", default="0,2", help="chain lengths K, comma-separated (0: plain decoding)")
    ap.add_argument("--tokens", type=int, default=24, help="new tokens per row")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, default=ROOT / "results/reference_mask")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    pair = load_pair(None, None, device=torch.device("cpu"), dtype=torch.float32)
    ids = [p[-96:] for p in encode_prompts(load_prompts(demo_prompts_path("eval")), pair.tokenizer)]
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        for k in (int(x) for x in args.ks.split(",")):
            prompts = [ids[i % len(ids)] for i in range(b)]
            ms: dict[str, list[float]] = {w: [] for w in WAYS}
            out: dict[str, list[list[int]]] = {}
            try:
                for r in range(args.rounds):
                    for w in (list(WAYS) if r % 2 == 0 else list(WAYS)[::-1]):
                        attention._memo_mask = WAYS[w]
                        step_ms, toks = decode(pair, prompts, k, args.tokens)
                        ms[w].append(step_ms)
                        out.setdefault(w, toks)
            finally:
                attention._memo_mask = _MEMO
            ratio = statistics.median(o / n for o, n in zip(ms["per layer"], ms["memo"], strict=True))
            rows.append({"batch": b, "k": k, "step_ms": {w: statistics.median(v) for w, v in ms.items()},
                         "step_ms_rounds": ms, "speedup_memo_over_per_layer": ratio,
                         "greedy_equal": out["memo"] == out["per layer"]})
            print(f"batch {b:>3} K={k}: step ms {statistics.median(ms['per layer']):.2f} per layer -> "
                  f"{statistics.median(ms['memo']):.2f} memo, {ratio:.3f}x, greedy equal {rows[-1]['greedy_equal']}",
                  flush=True)
    run_id = new_run_id(None)
    doc = {"format": "treeopt-bench-reference-mask/1", "run_id": run_id, "date": now_iso(), "threads": 1,
           "prompts": "sequoia_opt/data/prompts/eval.jsonl (last 96 tokens)", "tokens_per_row": args.tokens,
           "rounds": args.rounds, "rows": rows, "wall_s": time.time() - t0,
           "command": "flock /tmp/treeopt-bench.lock python benchmarks/reference_mask.py " + " ".join(sys.argv[1:])}
    (path,) = create_files({args.out / f"{run_id}.json": json.dumps(doc, indent=2) + "\n"})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
