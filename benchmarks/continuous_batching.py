"""Continuous batching on treeopt's decoder: what a request that finishes costs the step, in three ways of
dropping it from the KV caches, and what the frontier that joins and leaves push ahead of the rows costs.

A server's rows finish one by one; each time, the decoder drops the finished row from the target's and the
draft model's KV caches (:meth:`~sequoia_opt.decoding.rows.RowCache.keep`). Three ways, each the baseline of the
next, all in the same run:

* ``full copy`` (before commit a6bb34d): the live rows shifted up in order, every kept row's whole cache copied
  (all ``max_len`` slots);
* ``shift`` (a6bb34d): the live rows shifted up in order, only the rows after the first that leaves copied, and
  only their committed prefix ``[0, frontier)``;
* ``fill`` (:func:`~sequoia_opt.decoding.loop.keep_order`): a finished row's place takes the last live row,
  as a server's slot table refills a freed slot; only the rows that fill holes are copied (their prefix);
* ``fill+repack`` (now): ``fill``, and a cache whose frontier has run more than a quarter of itself past its
  longest row is repacked before the step (:data:`~sequoia_opt.decoding.rows.REPACK_WASTE`): every step reads
  ``[0, frontier)`` of every row, and under continuous batching the frontier only grows (joiners' prompts sit far
  behind it). Without it a cache is repacked only when the next tree does not fit.

The older ways are put back on some of the decoders (``--settings`` each run every way of ``--ways``, in lockstep,
so the VM's drift hits them alike).

The stream is ``benchmarks/schedules.py``'s: the eval prompts (their last 96 tokens), one request joining per
step up to ``--peak`` live rows, ``--tokens`` new tokens each, the demo pair, greedy, one thread. Per setting and
way: decode tokens/s (step time only, prefill and joins excluded), and the median bookkeeping ms of the steps
where a row left and of those where none did. Greedy output is checked equal across every decoder.

    flock /tmp/treeopt-bench.lock python benchmarks/continuous_batching.py     # about 10 min on 2 cores
    flock /tmp/treeopt-bench.lock python benchmarks/continuous_batching.py --ways fill,fill+repack --requests 256

Writes ``results/continuous_batching/<run-id>.json``.
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from schedules import WORKLOADS, Engine, Served, lockstep, request_ids, round_order  # noqa: E402

from sequoia_opt._io import create_files, new_run_id  # noqa: E402
from sequoia_opt.decoding.rows import RowCache  # noqa: E402
from sequoia_opt.model import ModelKVCache  # noqa: E402
from sequoia_opt.tree import now_iso  # noqa: E402

import sequoia_opt.decoding.loop as loop_module  # noqa: E402

WAYS = ("full copy", "shift", "fill", "fill+repack")
_keep_rows, _keep, _keep_order = ModelKVCache.keep_rows, RowCache.keep, loop_module.keep_order
_WAY = {"now": "fill"}  # the way of the decoder stepping now (set by Logged around its step)


def _keep_order_either(finished) -> list[int]:
    """The loop's keep_order, or for the older ways the live rows in order (they shifted up)."""
    if _WAY["now"].startswith("fill"):
        return _keep_order(finished)
    return [b for b, f in enumerate(finished) if not f]


def _keep_rows_either(self: ModelKVCache, keep: torch.Tensor, slots: int | None = None) -> None:
    """ModelKVCache.keep_rows, or for ``full copy`` the copy before a6bb34d (every kept row, every slot)."""
    if _WAY["now"] == "full copy":
        for layer in self.layers:
            for buf in (layer.k, layer.v):
                buf[: keep.numel()] = buf.index_select(0, keep)
        return
    _keep_rows(self, keep, slots)


def _counted_keep(self: RowCache, keep) -> None:
    """RowCache.keep, counting its calls (``_keeps``: the steps where a row left)."""
    self._keeps = getattr(self, "_keeps", 0) + 1
    _keep(self, keep)


class Logged(Served):
    """:class:`Served` that keeps each step's (live rows, step ms, bookkeeping ms, tokens, rows that left)."""

    def __init__(self, *a, way: str, **kw) -> None:
        super().__init__(*a, **kw)
        self.way = way
        self.log: list[tuple[int, float, float, int, int]] = []

    def advance(self, steps: int) -> None:
        for _ in range(steps):
            if self.done:
                return
            steps = len(self.state.steps) if self.state is not None else 0
            keeps = getattr(self.dec.face.rows, "_keeps", 0)
            _WAY["now"] = self.way
            super().advance(1)
            if self.state is not None and len(self.state.steps) > steps:
                st = self.state.steps[-1]
                left = getattr(self.dec.face.rows, "_keeps", 0) - keeps  # the step dropped a finished row
                self.log.append((st.batch, st.total_ms, st.bookkeeping_ms, sum(st.emitted), left))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default="0,1", help="fixed draft lengths K to serve the stream with (0: plain)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--peak", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ways", default=",".join(WAYS), help=f"the ways to run, of {', '.join(WAYS)}")
    ap.add_argument("--out", type=Path, default=ROOT / "results/continuous_batching")
    args = ap.parse_args()
    if min(args.requests, args.tokens, args.peak, args.rounds) < 1:
        ap.error("--requests, --tokens, --peak and --rounds must be at least 1")
    ways = list(dict.fromkeys(w.strip() for w in args.ways.split(",")))  # each once, in the order given
    if not ways or any(w not in WAYS for w in ways):
        ap.error(f"--ways: each of {', '.join(WAYS)}")
    torch.set_num_threads(1)
    ModelKVCache.keep_rows, RowCache.keep = _keep_rows_either, _counted_keep
    loop_module.keep_order = _keep_order_either
    t0 = time.time()
    eng = Engine("treeopt", None, 1, 512)
    ids = request_ids(eng, WORKLOADS["eval"][0], 96, args.requests)
    ks = [int(x) for x in args.settings.split(",")]
    names = [f"K={k} {how}" for k in ks for how in ways]
    logs: dict[str, list] = {n: [] for n in names}
    tokens: dict[str, list] = {n: [] for n in names}
    repacks: dict[str, list] = {n: [] for n in names}
    for r in range(args.rounds):
        order = round_order(names, r)
        served = {}
        for i, n in enumerate(order):
            k, way = int(n.split()[0][2:]), n.split(" ", 1)[1]
            dec = eng.decoder(args.peak, k=k, slot=i)
            if way != "fill+repack":  # the older ways repack only when the next tree does not fit
                for rows in (dec.face.rows, getattr(getattr(dec.policy, "drafter", None), "rows", None)):
                    if rows is not None:
                        rows.repack_waste = None
            served[n] = Logged(dec, ids, args.tokens, lambda s, a: min(args.peak, s + 1), None, way=way)
        lockstep(list(served.values()), 4)
        for n, x in served.items():
            logs[n].append(x.log)
            tokens[n].append([res.tokens for res in x.state.results])
            repacks[n].append(x.dec.face.rows.repacks)
        print(f"[{time.time() - t0:6.0f} s] round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    ref = tokens[names[0]][0]
    rows = []
    for n in names:
        tps = [1000.0 * sum(s[3] for s in lg) / sum(s[1] for s in lg) for lg in logs[n]]
        left = [s[2] for lg in logs[n] for s in lg if s[4] > 0]
        stay = [s[2] for lg in logs[n] for s in lg if s[4] == 0]
        rows.append({"setting": n, "tokens_per_s": statistics.median(tps), "rounds": tps,
                     "bookkeeping_ms_when_a_row_left": statistics.median(left) if left else None,
                     "bookkeeping_ms_otherwise": statistics.median(stay) if stay else None,
                     "steps_with_a_row_leaving": len(left) // args.rounds,
                     "target_repacks_per_round": repacks[n],
                     "greedy_equal": all(t == ref for t in tokens[n])})
    by = {x["setting"]: x for x in rows}
    pairs = [(f"{a}_over_{b}".replace(" ", "_").replace("+", "_"), a, b) for a, b in zip(WAYS[1:], WAYS)
             if a in ways and b in ways]
    ratios: dict[str, dict[str, float]] = {key: {} for key, *_ in pairs}
    for k in ks:
        for key, a, b in pairs:
            new, old = by[f"K={k} {a}"]["rounds"], by[f"K={k} {b}"]["rounds"]
            ratios[key][f"K={k}"] = statistics.median(x / y for x, y in zip(new, old, strict=True))  # paired rounds
    run_id = new_run_id(None)
    doc = {"format": "treeopt-bench-continuous-batching/1", "run_id": run_id, "date": now_iso(),
           "stream": {"requests": args.requests, "tokens_per_request": args.tokens, "peak": args.peak,
                      "prompts": "sequoia_opt/data/prompts/eval.jsonl (last 96 tokens)"},
           "rounds": args.rounds, "threads": 1, "ways": ways, "rows": rows,
           "tokens_per_s_ratios": ratios, "wall_s": time.time() - t0,
           "command": "flock /tmp/treeopt-bench.lock python benchmarks/continuous_batching.py " + " ".join(sys.argv[1:])}
    (path,) = create_files({args.out / f"{run_id}.json": json.dumps(doc, indent=2) + "\n"})
    print(f"{'setting':<20}{'tok/s':>8}{'bookkeeping ms, a row left':>29}{'otherwise':>11}{'= plain':>9}")
    for x in rows:
        bl, bo = x["bookkeeping_ms_when_a_row_left"], x["bookkeeping_ms_otherwise"]
        print(f"{x['setting']:<20}{x['tokens_per_s']:>8.1f}{(bl or float('nan')):>29.1f}{(bo or float('nan')):>11.1f}"
              f"{'yes' if x['greedy_equal'] else 'NO':>9}")
    for key, by_k in ratios.items():
        print(f"{key.replace('_over_', ' / ').replace('_', ' ')}, tokens/s (median of per-round ratios): "
              + ", ".join(f"{k} {v:.3f}x" for k, v in by_k.items()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
