"""GPU check of the tree-attention kernel: build, correctness sweep, timing against SDPA and FlexAttention, JSON
under the output folder and a table last. ``benchmarks/gpu_check.sh`` runs it as two of its stages (build, then
correctness + bench) under one deadline; the latency profiles, offload and engine stages are its other stages.

    python3 benchmarks/gpu_check.py                 # build, correctness, bench: about 2-4 minutes on an H200
    python3 benchmarks/gpu_check.py --steps correctness --quick
    python3 benchmarks/gpu_check.py --dry-run       # CPU, torch backend, tiny sizes: proves the script runs

Steps (each guarded: one failing does not lose the others' results; each writes its JSON when done):

1. build: build (or load from the cache) the kernel extension and time it; build.json. A dry run checks the
   sources and names the build without compiling.
2. correctness: fresh random inputs at odd sizes (T in {1,7,64,129,256}, L in {0,1,1000,4097,16384}, one
   32768 + 37 prefix and the CUDA-graph layout (no prefix, the whole cache masked, a long zero tail), GQA 1/4/8, head_dim 64/128, fp16/bf16; tree masks of random trees, some draft levels
   with m > T, some forced split counts, cache slots past the tree filled with NaN), output NaN-poisoned
   before each run, relative Frobenius error against float64 attention within TOL (what bf16/fp16 inputs and
   outputs allow; the error of torch's own SDPA in the same dtype is recorded beside it). The grid runs in a
   fixed shuffled order, so a sweep cut short by its budget is a uniform sample: it is INCOMPLETE, not FAIL.
3. bench: Llama-3-8B heads (32 q heads, 8 KV heads, head_dim 128, bf16), B=1, n in {16,64,128} tree tokens,
   L in {1k,4k,16k}; the kernel vs F.scaled_dot_product_attention with a dense (n, L+n) bool mask (GQA through
   enable_gqa, and with K/V pre-expanded: the faster counts), and vs FlexAttention with a tree mask_mod
   (compiled: on the goal row n=64, L=4096 only, one compile). Every row also checks the kernel's output on
   its first input against float64 attention (``ours_rel_err`` beside the time, and SDPA's). CUDA events
   around CUDA-graph replays (eager if capture fails), warm-up excluded, median of many replays; inputs rotate
   over enough copies to exceed the L2 cache. GB/s counts the bytes that must move: K and V of the L + n
   slots once, q read and the output written once; compared with a measured device-to-device copy.
4. summary: goals PASS/MISS, ``kernel_ok`` (no correctness case and no bench row over its tolerance: the
   latency profiles then ask for ``--backend cuda``), JSON, the table.

Exit status: 0 when no correctness case failed and the sweep finished, 3 when it was cut short by its budget
with no failure (INCOMPLETE), 1 when a case failed or the kernel is unavailable, 2 on a usage error. Timing
goals that are missed do not change the exit status (they are reported).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sequoia_opt.attention import TreeMask, tree_attention  # noqa: E402
from sequoia_opt.attention import cuda as ta_cuda  # noqa: E402

# Relative Frobenius error allowed against float64 attention. bf16 keeps 8 significant bits: the output's own
# rounding is ~2e-3 relative and P rounded to bf16 before P V adds about as much; fp16 keeps 11 bits.
TOL = {"float16": 5e-3, "bfloat16": 2e-2, "float32": 1e-4}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

GOAL_COPY_FRACTION = 0.70  # at L >= 4096
GOAL_SPEEDUP_VS_SDPA = 1.5  # at n = 64, L = 4096
GOAL_VS_FLEX = 1.0  # not slower


# ----------------------------------------------------------------------------------------------------------------
# small utilities


def log(msg: str) -> None:
    print(msg, flush=True)


def random_tree_parents(n: int, gen: torch.Generator) -> list[int]:
    """Parents of a random n-node tree, parent[i] < i (breadth-first compatible), root -1. Biased towards
    recent nodes so trees get deep as well as wide."""
    parents = [-1]
    for i in range(1, n):
        lo = max(0, i - 8) if torch.rand((), generator=gen) < 0.7 else 0
        parents.append(int(torch.randint(lo, i, (1,), generator=gen)))
    return parents


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """(n, n) bool, [i, j] True when j is i or an ancestor of i (the tree's verification mask)."""
    n = len(parents)
    depth_first = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        depth_first[i, i] = True
        if parents[i] >= 0:
            depth_first[i] |= depth_first[parents[i]]
    return depth_first


def tree_rows(T: int, m: int, gen: torch.Generator) -> torch.Tensor:
    """(T, m): rows of the last T nodes of a random m-node tree (m == T: verification; m > T: a draft level)."""
    return ancestor_mask(random_tree_parents(m, gen))[m - T :]


def naive_attention_f64(q, k, v, prefix_len: int, tree_dense: torch.Tensor, scale: float) -> torch.Tensor:
    """Float64 attention on q's device. q (B, Hq, T, D); k, v (B, Hkv, S, D); tree_dense (T, m) bool.
    Query head h reads KV head h // (Hq // Hkv); rows that see no key are zeros. Returns (B, Hq, T, D) f64."""
    B, Hq, T, D = q.shape
    Hkv = k.shape[1]
    m = tree_dense.shape[1]
    n = prefix_len + m
    head_map = torch.arange(Hq, device=q.device) // (Hq // Hkv)
    kk = k[:, :, :n].double().index_select(1, head_map)  # (B, Hq, L + m, D)
    vv = v[:, :, :n].double().index_select(1, head_map)
    visible = torch.cat([torch.ones(T, prefix_len, dtype=torch.bool, device=q.device), tree_dense.to(q.device)], 1)
    s = (q.double() @ kk.transpose(-1, -2)) * scale  # (B, Hq, T, L + m)
    s = s.masked_fill(~visible, -math.inf)
    mx = s.amax(dim=-1, keepdim=True)
    mx = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
    p = torch.exp(s - mx)
    del s
    denom = p.sum(dim=-1, keepdim=True)
    out = (p @ vv) / torch.where(denom > 0, denom, torch.ones_like(denom))
    return torch.where(denom > 0, out, torch.zeros_like(out))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (out.double() - ref).norm()
    return float(diff / ref.norm().clamp_min(1e-300))


def write_json(path: Path, obj: Any) -> None:
    """Write obj as JSON (indent 2) through a temporary file and a rename (a kill never leaves half a file).
    benchmarks/gpu_check.sh archives the folder into $OUT after every stage."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": str(device),
        "host": platform.node(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            l2_mib=round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
        )
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20,
            ).stdout.strip()  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            pass
    return env


# ----------------------------------------------------------------------------------------------------------------
# timing


class Timer:
    """Median time of a list of closures (each one call of the op on its own input copy)."""

    def __init__(self, device: torch.device, warmup: int = 3, reps: int = 30):
        self.device, self.warmup, self.reps = device, warmup, reps

    def __call__(self, fns: list[Callable[[], Any]], use_graph: bool = True) -> dict[str, Any]:
        if self.device.type != "cuda":
            for f in fns:
                f()
            times = []
            for _ in range(max(3, self.reps // 5)):
                t0 = time.perf_counter()
                for f in fns:
                    f()
                times.append((time.perf_counter() - t0) * 1e3 / len(fns))
            return {"ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "mode": "cpu-wall"}
        for _ in range(self.warmup):
            for f in fns:
                f()
        torch.cuda.synchronize()
        run: Callable[[], Any] = lambda: [f() for f in fns]  # noqa: E731
        mode = "eager"
        if use_graph:
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for f in fns:
                        f()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for f in fns:
                        f()
                run, mode = graph.replay, "cuda-graph"
            except Exception as err:  # noqa: BLE001 - fall back to eager timing, say so
                torch.cuda.synchronize()
                mode = f"eager (graph capture failed: {type(err).__name__})"
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            run()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) / len(fns))
        return {"ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "mode": mode}


def copy_bandwidth(device: torch.device, nbytes: int) -> dict[str, Any]:
    """Device-to-device copy of nbytes, counting bytes read plus bytes written."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = Timer(device, warmup=3, reps=20)([lambda: dst.copy_(src)], use_graph=False)
    gbps = 2 * nbytes / (t["ms"] * 1e-3) / 1e9
    del src, dst
    return {"bytes": nbytes, "ms": t["ms"], "gb_per_s": gbps, "counts": "read + write"}


# ----------------------------------------------------------------------------------------------------------------
# step 1: correctness


def correctness_cases(args) -> list[dict[str, Any]]:
    """The sweep: every (T, L, group, D, dtype) of the grids, B=1 and 2 KV heads; some B=2, some draft levels
    (m > T), some forced split counts (1 and one per tile)."""
    if args.dry_run:
        Ts, Ls, groups, Ds, dts = [1, 7], [0, 1, 70], [1, 4], [64], ["bfloat16", "float32"]
    elif args.quick:
        Ts, Ls, groups, Ds, dts = [1, 7, 129], [0, 1, 4097], [1, 8], [64, 128], ["float16", "bfloat16"]
    else:
        Ts, Ls, groups, Ds, dts = [1, 7, 64, 129, 256], [0, 1, 1000, 4097, 16384], [1, 4, 8], [64, 128], ["float16", "bfloat16"]
    cases = []
    i = 0
    for dt in dts:
        for D in Ds:
            for G in groups:
                for T in Ts:
                    for L in Ls:
                        B = 2 if (L == 1000 or (args.dry_run and L == 70)) and T <= 64 else 1
                        m = T + 37 if (i % 5 == 2) else T  # every fifth case: a draft level, queries = last T of m
                        splits = [None]
                        if i % 7 == 3:
                            splits = [None, 1, 100000]
                        for ns in splits:
                            cases.append(dict(B=B, Hkv=2, group=G, T=T, L=L, m=m, D=D, dtype=dt, num_splits=ns))
                        i += 1
    # a fixed shuffle: a sweep its budget cuts short is a uniform sample of the grid, not its first rows
    random.Random(args.seed).shuffle(cases)
    return cases


def edge_cases(args) -> list[dict[str, Any]]:
    """Cases run before the grid: a long prefix past 32k keys with an odd length (prefix tiles and the split
    plan at the end of the range the benchmark times), at the benchmark's head shape; and rows that see nothing
    (L = 0, one empty mask row) with m around the 64-bit word edges."""
    dt = "float32" if args.dry_run else "bfloat16"
    D = 64 if args.dry_run else 128
    long_L = 300 + 37 if args.dry_run else 32768 + 37
    cases = [dict(B=1, Hkv=2 if args.dry_run else 8, group=4, T=T, L=long_L, m=T, D=D, dtype=dt, num_splits=None)
             for T in (1, 64)]
    for T, m in ((9, 70), (3, 64), (5, 65), (2, 130)):
        cases.append(dict(B=1, Hkv=2, group=4, T=T, L=0, m=m, D=D, dtype=dt, num_splits=None, empty_row=1))
    # the CUDA-graph layout (sequoia_opt.model.graphs): no prefix, the whole cache masked: ones over the committed
    # tokens, the tree, then a long all-zero tail of unused slots (whole splits that see no key)
    for T, committed, tail in ((1, 2085, 91), (64, 520, 1400)) if not args.dry_run else ((1, 85, 40), (8, 20, 140)):
        cases.append(dict(B=1, Hkv=2 if args.dry_run else 8, group=4, T=T, L=0, m=committed + T + tail, D=D,
                          dtype=dt, num_splits=None, graphs_layout=(committed, tail)))
    return cases


def run_case(case: dict[str, Any], device: torch.device, gen: torch.Generator, dry_run: bool,
             dgen: torch.Generator | None = None) -> dict[str, Any]:
    """One correctness case: fresh inputs (drawn on the device with ``dgen`` when given), poisoned output,
    float64 reference. Returns the case with its errors and ``passed``."""
    B, Hkv, G, T, L, m, D = (case[k] for k in ("B", "Hkv", "group", "T", "L", "m", "D"))
    dtype = DTYPES[case["dtype"]]
    Hq = Hkv * G
    S = L + m + 5
    g, where = (dgen, device) if dgen is not None else (gen, torch.device("cpu"))
    q = torch.randn(B, Hq, T, D, generator=g, device=where).to(device, dtype)
    k = torch.randn(B, Hkv, S, D, generator=g, device=where).to(device, dtype)
    v = torch.randn(B, Hkv, S, D, generator=g, device=where).to(device, dtype)
    if not dry_run:
        k[:, :, L + m :] = float("nan")  # past the tree: must never be read
        v[:, :, L + m :] = float("nan")
    if case.get("graphs_layout") is not None:
        committed, tail = case["graphs_layout"]
        dense = torch.cat([torch.ones(T, committed, dtype=torch.bool), tree_rows(T, T, gen),
                           torch.zeros(T, tail, dtype=torch.bool)], 1)  # (T, m)
    else:
        dense = tree_rows(T, m, gen)
    if case.get("empty_row") is not None:
        dense[case["empty_row"]] = False
    scale = D**-0.5
    tm = TreeMask.from_dense(dense).to(device)
    ref = naive_attention_f64(q, k, v, L, dense, scale)
    out = torch.full_like(q, float("nan"))  # poison: unwritten elements stay NaN
    if dry_run:
        out.copy_(tree_attention(q, k, v, L, tm, scale=scale, backend="torch"))
    else:
        ta_cuda.tree_attention_cuda(q, k, v, L, tm, scale, num_splits=case["num_splits"], out=out)
        torch.cuda.synchronize()
    n_nan = int(torch.isnan(out).sum())
    err = rel_err(out.nan_to_num(0.0), ref) if n_nan == 0 else float("nan")
    # torch's SDPA in the same dtype on the same inputs, as a yardstick (cache sliced: no NaN slots)
    sd = tree_attention(q, k[:, :, : L + m].contiguous(), v[:, :, : L + m].contiguous(), L, tm, scale=scale, backend="torch")
    sdpa_err = rel_err(sd, ref)
    tol = TOL[case["dtype"]]
    res = dict(case, Hq=Hq, S=S, rel_err=err, sdpa_rel_err=sdpa_err, nan_count=n_nan, tol=tol)
    res["passed"] = bool(n_nan == 0 and err <= tol)
    return res


def sweep_status(planned: int, results: list[dict[str, Any]]) -> str:
    """PASS (every planned case ran and passed), FAIL (a case failed, whatever else happened) or INCOMPLETE (the
    budget stopped the sweep with no failure so far)."""
    if any(not r["passed"] for r in results):
        return "FAIL"
    return "PASS" if len(results) == planned else "INCOMPLETE"


def step_correctness(args, device: torch.device, budget_s: float) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(args.seed)
    dgen = torch.Generator(device=device).manual_seed(args.seed + 17) if device.type == "cuda" else None
    cases = edge_cases(args) + correctness_cases(args)
    log(f"[correctness] {len(cases)} cases, budget {budget_s:.0f} s")
    t0 = time.time()
    results = []
    for idx, case in enumerate(cases):
        if time.time() - t0 > budget_s:
            log(f"[correctness] budget spent after {idx} of {len(cases)} cases")
            break
        try:
            r = run_case(case, device, gen, args.dry_run, dgen)
        except Exception as err:  # noqa: BLE001
            r = dict(case, passed=False, error=f"{type(err).__name__}: {err}")
            if device.type == "cuda":
                try:
                    torch.cuda.synchronize()
                except Exception:  # noqa: BLE001 - a sticky CUDA error: nothing more will run
                    results.append(r)
                    log(f"[correctness] CUDA context broken: {r['error']}")
                    break
        results.append(r)
        if not r["passed"]:
            log(f"  FAIL {case}: err={r.get('rel_err')} nan={r.get('nan_count')} {r.get('error', '')}")
    worst: dict[str, Any] = {}
    for dt in sorted({r["dtype"] for r in results}):
        errs = [r["rel_err"] for r in results if r["dtype"] == dt and "rel_err" in r and not math.isnan(r["rel_err"])]
        sd = [r["sdpa_rel_err"] for r in results if r["dtype"] == dt and "sdpa_rel_err" in r]
        worst[dt] = {"max_rel_err": max(errs, default=float("nan")), "max_sdpa_rel_err": max(sd, default=float("nan")),
                     "tol": TOL[dt]}  # fmt: skip
    n_pass = sum(r["passed"] for r in results)
    status = sweep_status(len(cases), results)
    summary = {
        "status": status,
        "cases_planned": len(cases),
        "cases_run": len(results),
        "cases_passed": n_pass,
        "complete": len(results) == len(cases),
        "passed": status == "PASS",
        "failed": len(results) - n_pass,
        "max_prefix_len": max((r["L"] for r in results), default=0),
        "seconds": round(time.time() - t0, 1),
        "worst_by_dtype": worst,
        "backend": "torch (dry run)" if args.dry_run else "cuda",
    }
    log(f"[correctness] {status}: {n_pass}/{len(results)} passed of {len(cases)} planned in {summary['seconds']} s")
    return {"summary": summary, "cases": results}


# ----------------------------------------------------------------------------------------------------------------
# step 2: timing


def _flex_factory(device: torch.device):
    """A compiled flex_attention and create_block_mask, or (None, reason)."""
    if device.type != "cuda":
        return None, "FlexAttention timing needs CUDA"
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
        return (torch.compile(flex_attention, dynamic=False), create_block_mask), None
    except Exception as err:  # noqa: BLE001
        return None, f"{type(err).__name__}: {err}"


GOAL_ROW = (64, 4096)  # (n, L): the row the speedup goals are judged on, and the one FlexAttention is compiled for
FLEX_COMPILE_S = 60.0  # what FlexAttention's compile may take; skipped with a note when less is left


def step_bench(args, device: torch.device, budget_s: float, copy_bw: dict[str, Any] | None,
               on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Time the grid's rows (module docstring, step 3) within ``budget_s`` seconds. After every row ``on_row``
    (when given) gets the result so far, ``complete`` False: a stage stopped at its cap keeps the rows it timed.
    Returns ``{"rows", "rows_planned", "complete", "flex_note", "seconds"}``."""
    t_start = time.time()
    if args.dry_run:
        B, Hq, Hkv, D, dtype = 1, 4, 2, 64, torch.float32
        grid = [(4, 64), (8, 130)]
        goal_row = (4, 64)
    else:
        B, Hq, Hkv, D, dtype = 1, 32, 8, 128, torch.bfloat16  # Llama-3-8B attention heads
        # the goal rows first (n=64 at L=4096, then L >= 4096), so a tight budget drops the least useful ones
        grid = [(n, L) for L in (4096, 16384, 1024) for n in (64, 16, 128)]
        goal_row = GOAL_ROW
    G = Hq // Hkv
    timer = Timer(device, warmup=3, reps=args.reps)
    flex, flex_reason = (None, "disabled (--no-flex)") if args.no_flex else _flex_factory(device)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0
    rows = []
    gen = torch.Generator().manual_seed(args.seed + 1)
    for n, L in grid:
        if time.time() - t_start > budget_s:
            log(f"[bench] budget spent, skipping n={n} L={L} and later")
            break
        row: dict[str, Any] = {"n": n, "L": L, "B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "dtype": str(dtype).replace("torch.", "")}
        try:
            N = L + n
            esize = torch.finfo(dtype).bits // 8
            kv_bytes = 2 * B * Hkv * N * D * esize
            must_move = kv_bytes + 2 * B * Hq * n * D * esize  # K, V once; q in, out back
            row["bytes"] = must_move
            row["flops"] = 4 * B * Hq * n * N * D  # QK^T and PV, all keys (the tree part is tiny)
            # enough input copies to exceed the L2 twice over (expanded SDPA reads G times the K/V bytes)
            copies = 1 if device.type != "cuda" else int(min(32, max(2, math.ceil(2 * l2 / kv_bytes) + 1)))
            row["input_copies"] = copies
            dense = tree_rows(n, n, gen)
            tm = TreeMask.from_dense(dense).to(device)
            mask_full = torch.cat([torch.ones(n, L, dtype=torch.bool), dense], 1).to(device)  # (n, L + n)
            sets = []
            for _ in range(copies):
                q = torch.randn(B, Hq, n, D, device=device, dtype=dtype)
                k = torch.randn(B, Hkv, N, D, device=device, dtype=dtype)
                v = torch.randn(B, Hkv, N, D, device=device, dtype=dtype)
                sets.append((q, k, v))
            scale = D**-0.5
            backend = "torch" if args.dry_run else "cuda"
            # the timed shape, checked: the kernel's output on the first input against float64 attention
            ref64 = naive_attention_f64(sets[0][0], sets[0][1], sets[0][2], L, dense, scale)
            out = tree_attention(sets[0][0], sets[0][1], sets[0][2], L, tm, scale=scale, backend=backend)
            row["ours_rel_err"] = rel_err(out, ref64) if not torch.isnan(out).any() else float("nan")
            row["sdpa_rel_err"] = rel_err(F.scaled_dot_product_attention(
                sets[0][0], sets[0][1], sets[0][2], attn_mask=mask_full, scale=scale, enable_gqa=True), ref64)
            row["tol"] = TOL[str(dtype).replace("torch.", "")]
            row["ours_ok"] = bool(row["ours_rel_err"] <= row["tol"])
            del ref64, out
            ours = timer([lambda s=s: tree_attention(s[0], s[1], s[2], L, tm, scale=scale, backend=backend) for s in sets])
            row["ours"] = ours
            if device.type == "cuda":
                plan = ta_cuda.plan_splits(N, G * n, B * Hkv, torch.cuda.get_device_properties(device).multi_processor_count)
                row["splits"], row["tiles_per_split"] = plan
            # SDPA with a dense bool mask: GQA inside SDPA, and K/V pre-expanded to Hq heads (outside the timing)
            sdpa = {}
            try:
                sdpa["gqa"] = timer([lambda s=s: F.scaled_dot_product_attention(s[0], s[1], s[2], attn_mask=mask_full,
                                                                                 scale=scale, enable_gqa=True)
                                     for s in sets])  # fmt: skip
            except Exception as err:  # noqa: BLE001
                sdpa["gqa"] = {"error": f"{type(err).__name__}: {err}"}
            try:
                exp_sets = [(s[0], s[1].repeat_interleave(G, 1), s[2].repeat_interleave(G, 1)) for s in sets]
                sdpa["expanded"] = timer([lambda s=s: F.scaled_dot_product_attention(s[0], s[1], s[2], attn_mask=mask_full,
                                                                                      scale=scale)
                                          for s in exp_sets])  # fmt: skip
                del exp_sets
            except Exception as err:  # noqa: BLE001
                sdpa["expanded"] = {"error": f"{type(err).__name__}: {err}"}
            row["sdpa"] = sdpa
            sdpa_ms = [x["ms"] for x in sdpa.values() if "ms" in x]
            row["sdpa_best_ms"] = min(sdpa_ms) if sdpa_ms else None
            # FlexAttention with the tree as a mask_mod over a dense (n, n) table: compiled for the goal row only
            # (each shape is a compile of tens of seconds)
            flex_left = budget_s - (time.time() - t_start)
            if (n, L) != goal_row:
                row["flex"] = {"error": f"not timed: FlexAttention is compiled for the goal row n={goal_row[0]} "
                                        f"L={goal_row[1]} only"}
            elif flex is not None and flex_left < FLEX_COMPILE_S:
                row["flex"] = {"error": f"not timed: {flex_left:.0f} s left, its compile may take {FLEX_COMPILE_S:.0f}"}
            elif flex is not None:
                try:
                    flex_fn, create_block_mask = flex
                    table = dense.to(device)

                    def mask_mod(b, h, q_idx, kv_idx, L=L, n=n, table=table):
                        rel = kv_idx - L
                        in_tree = table[q_idx.clamp(0, n - 1), rel.clamp(0, n - 1)]
                        return (kv_idx < L) | ((rel >= 0) & in_tree)

                    block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=n, KV_LEN=N, device=str(device))
                    fl = [lambda s=s: flex_fn(s[0], s[1], s[2], block_mask=block_mask, scale=scale, enable_gqa=True)
                          for s in sets]  # fmt: skip
                    out_flex = fl[0]()
                    ref = tree_attention(sets[0][0], sets[0][1], sets[0][2], L, tm, scale=scale, backend="torch")
                    row["flex_rel_err_vs_sdpa"] = rel_err(out_flex, ref.double())
                    row["flex"] = timer(fl)
                except Exception as err:  # noqa: BLE001
                    row["flex"] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            else:
                row["flex"] = {"error": flex_reason or "budget spent"}
            ms = ours["ms"]
            row["ours_gb_per_s"] = must_move / (ms * 1e-3) / 1e9
            row["ours_tflop_per_s"] = row["flops"] / (ms * 1e-3) / 1e12
            if copy_bw:
                row["copy_fraction"] = row["ours_gb_per_s"] / copy_bw["gb_per_s"]
            if row["sdpa_best_ms"]:
                row["speedup_vs_sdpa"] = row["sdpa_best_ms"] / ms
            if "ms" in row["flex"]:
                row["speedup_vs_flex"] = row["flex"]["ms"] / ms
            del sets
        except Exception as err:  # noqa: BLE001
            row["error"] = f"{type(err).__name__}: {err}"
            row["traceback"] = traceback.format_exc()[-2000:]
        rows.append(row)
        log(
            f"[bench] n={n:4d} L={L:6d}  ours {row.get('ours', {}).get('ms', float('nan')) * 1e3:8.1f} us"
            f"  sdpa {((row.get('sdpa_best_ms') or float('nan')) * 1e3):8.1f} us"
            f"  flex {row.get('flex', {}).get('ms', float('nan')) * 1e3:8.1f} us"
            f"  {row.get('ours_gb_per_s', float('nan')):7.0f} GB/s  err {row.get('ours_rel_err', float('nan')):.1e}"
            f" {row.get('error', '')}"
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if on_row is not None:
            on_row({"rows": rows, "rows_planned": len(grid), "complete": False, "flex_note": flex_reason,
                    "seconds": round(time.time() - t_start, 1)})
    return {"rows": rows, "rows_planned": len(grid), "complete": len(rows) == len(grid), "flex_note": flex_reason,
            "seconds": round(time.time() - t_start, 1)}


def goals(bench: dict[str, Any] | None) -> list[dict[str, Any]]:
    out = []
    if not bench:
        return [{"goal": "timing goals", "status": "NOT RUN"}]
    for r in bench["rows"]:
        if r.get("L", 0) >= 4096 and "copy_fraction" in r:
            out.append({"goal": f">= {GOAL_COPY_FRACTION:.0%} of copy bandwidth at n={r['n']} L={r['L']}",
                        "value": round(r["copy_fraction"], 3),
                        "status": "PASS" if r["copy_fraction"] >= GOAL_COPY_FRACTION else "MISS"})  # fmt: skip
    key = [r for r in bench["rows"] if r.get("n") == 64 and r.get("L") == 4096]
    if key:
        r = key[0]
        sp = r.get("speedup_vs_sdpa")
        out.append({"goal": f">= {GOAL_SPEEDUP_VS_SDPA}x faster than SDPA dense mask at n=64 L=4096",
                    "value": None if sp is None else round(sp, 2),
                    "status": "NOT RUN" if sp is None else ("PASS" if sp >= GOAL_SPEEDUP_VS_SDPA else "MISS")})  # fmt: skip
        fx = r.get("speedup_vs_flex")
        out.append({"goal": "not slower than FlexAttention at n=64 L=4096",
                    "value": None if fx is None else round(fx, 2),
                    "status": "NOT RUN" if fx is None else ("PASS" if fx >= GOAL_VS_FLEX else "MISS")})  # fmt: skip
    return out


# ----------------------------------------------------------------------------------------------------------------
# build and verdict


def step_build(args, device: torch.device) -> dict[str, Any]:
    """Build (or load from the cache) the kernel extension, timed; a dry run checks the sources and names the
    build without compiling. Returns ``{"ok", "seconds", "reason", "name", "kernel_dir"}``."""
    kdir = ta_cuda.kernel_dir()
    res: dict[str, Any] = {"kernel_dir": str(kdir), "cuda_home": os.environ.get("CUDA_HOME")}
    missing = [n for n in ta_cuda._SOURCES if not (kdir / n).is_file()]
    if missing:
        return dict(res, ok=False, seconds=0.0, reason=f"kernel sources missing in {kdir}: {missing}")
    res["name"] = ta_cuda._build_name(kdir)
    if args.dry_run:
        log(f"[build] dry run: sources found in {kdir}, build {res['name']} (not compiled on a CPU)")
        return dict(res, ok=True, seconds=0.0, reason="dry run: not compiled")
    t0 = time.time()
    ok = ta_cuda.is_available()
    res.update(ok=ok, seconds=round(time.time() - t0, 1), reason=ta_cuda.unavailable_reason())
    log(f"[build] kernel {'built/loaded' if ok else 'UNAVAILABLE'} in {res['seconds']} s {res['reason'] or ''}")
    return res


def kernel_verdict(correctness: dict[str, Any] | None, bench: dict[str, Any] | None) -> tuple[bool, str]:
    """Whether later stages should time the kernel (``--backend cuda``): no correctness case failed, and every
    benchmark row's output is within tolerance of float64 attention. Returns (ok, why)."""
    if correctness is None:
        return False, "the correctness sweep did not run"
    if correctness["status"] == "FAIL":
        return False, f"{correctness['failed']} correctness case(s) failed"
    if correctness["cases_run"] == 0:
        return False, "no correctness case ran"
    bad = [f"n={r['n']} L={r['L']}" for r in (bench or {}).get("rows", []) if r.get("ours_ok") is False]
    if bad:
        return False, f"benchmark rows over tolerance: {', '.join(bad)}"
    why = f"{correctness['cases_passed']} correctness cases passed ({correctness['status']})"
    if bench:
        why += f", {sum(1 for r in bench['rows'] if r.get('ours_ok'))} benchmark rows within tolerance"
    return True, why


# ----------------------------------------------------------------------------------------------------------------
# table and main


def print_table(summary: dict[str, Any]) -> None:
    log("")
    log("=" * 100)
    env = summary.get("environment", {})
    log(f"tree-attention GPU check  {env.get('gpu', env.get('device'))}  torch {env.get('torch')}  "
        f"cuda {env.get('torch_cuda')}  {env.get('date')}")  # fmt: skip
    if summary.get("copy_bandwidth"):
        log(f"device copy bandwidth: {summary['copy_bandwidth']['gb_per_s']:.0f} GB/s (read + write)")
    c = summary.get("correctness")
    if c:
        worst = "  ".join(f"{dt}: max err {w['max_rel_err']:.2e} (sdpa {w['max_sdpa_rel_err']:.2e}, tol {w['tol']:.0e})"
                          for dt, w in c["worst_by_dtype"].items())  # fmt: skip
        log(f"correctness: {c['status']}  {c['cases_passed']}/{c['cases_run']} passed of {c['cases_planned']} planned"
            f"  {worst}")
    else:
        log("correctness: NOT RUN")
    b = summary.get("bench")
    if b:
        log(f"{'n':>4} {'L':>6} {'ours us':>9} {'sdpa us':>9} {'flex us':>9} {'GB/s':>7} {'%copy':>6} "
            f"{'TFLOP/s':>8} {'x sdpa':>7} {'x flex':>7} {'splits':>6} {'err':>8}")  # fmt: skip
        for r in sorted(b["rows"], key=lambda r: (r["L"], r["n"])):
            def f(x, fmt):
                return format(x, fmt) if isinstance(x, (int, float)) and x is not None else "-"

            log(f"{r['n']:>4} {r['L']:>6} {f(r.get('ours', {}).get('ms', None) and r['ours']['ms'] * 1e3, '9.1f'):>9} "
                f"{f(r.get('sdpa_best_ms') and r['sdpa_best_ms'] * 1e3, '9.1f'):>9} "
                f"{f(r.get('flex', {}).get('ms') and r['flex']['ms'] * 1e3, '9.1f'):>9} "
                f"{f(r.get('ours_gb_per_s'), '7.0f'):>7} {f(r.get('copy_fraction') and 100 * r['copy_fraction'], '6.1f'):>6} "
                f"{f(r.get('ours_tflop_per_s'), '8.1f'):>8} {f(r.get('speedup_vs_sdpa'), '7.2f'):>7} "
                f"{f(r.get('speedup_vs_flex'), '7.2f'):>7} {r.get('splits', '-'):>6} {f(r.get('ours_rel_err'), '8.1e'):>8}"
                + (f"  ERROR {r['error']}" if "error" in r else ""))  # fmt: skip
    else:
        log("bench: NOT RUN")
    for g in summary.get("goals", []):
        log(f"  [{g['status']}] {g['goal']}" + (f"  ({g['value']})" if g.get("value") is not None else ""))
    log(f"kernel for the latency profiles: {'yes' if summary.get('kernel_ok') else 'NO'} ({summary.get('kernel_why')})")
    log("=" * 100)


STEPS = ("build", "correctness", "bench")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Steps: build, correctness, bench. Results: <out>/{environment,build,correctness,"
                                        "bench,summary}.json")  # fmt: skip
    ap.add_argument("--steps", default=",".join(STEPS),
                    help="comma-separated subset of: build, correctness, bench (default: all)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=REPO / "results" / "gpu", help="folder for the JSON (default results/gpu)")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, torch backend, tiny sizes: exercise the script without a GPU")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="a smaller correctness sweep")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile takes tens of seconds)")
    ap.add_argument("--reps", type=int, default=30, help="timed replays per measurement (median reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=300.0, help="total time budget; steps shrink to fit")
    args = ap.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    bad = [s for s in steps if s not in STEPS]
    if bad:
        ap.error(f"unknown step(s) {bad}")
    args.steps = steps
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        log("no CUDA device: run with --dry-run on a CPU machine")
        return 1
    else:
        device = torch.device("cuda")
    summary: dict[str, Any] = {"environment": environment(device), "args": {k: str(v) for k, v in vars(args).items()}}
    write_json(out_dir / "environment.json", summary["environment"])
    log(f"[env] {summary['environment']}")

    def left() -> float:
        return args.budget_s - (time.time() - t0)

    if "build" in args.steps:
        summary["build"] = step_build(args, device)
        write_json(out_dir / "build.json", summary["build"])
    kernel_up = True
    if device.type == "cuda" and ("correctness" in args.steps or "bench" in args.steps):
        tb = time.time()
        kernel_up = ta_cuda.is_available()  # a cache hit after the build step / stage
        summary["kernel_load"] = {"ok": kernel_up, "seconds": round(time.time() - tb, 1),
                                  "reason": ta_cuda.unavailable_reason()}
        try:
            summary["copy_bandwidth"] = copy_bandwidth(device, 1 << 30)
            log(f"[copy] {summary['copy_bandwidth']['gb_per_s']:.0f} GB/s device-to-device (read + write)")
        except Exception as err:  # noqa: BLE001
            summary["copy_bandwidth"] = None
            log(f"[copy] failed: {err}")
    else:
        summary["copy_bandwidth"] = None

    corr = None
    if "correctness" in args.steps:
        try:
            if not kernel_up:
                raise RuntimeError(f"kernel unavailable: {summary['kernel_load']['reason']}")
            res = step_correctness(args, device, budget_s=max(20.0, left() * 0.4))
            write_json(out_dir / "correctness.json", res)
            corr = res["summary"]
        except Exception as err:  # noqa: BLE001
            summary["correctness_error"] = traceback.format_exc()[-3000:]
            log(f"[correctness] ERROR {type(err).__name__}: {err}")
        summary["correctness"] = corr
        write_json(out_dir / "summary.json", summary)

    def bench_so_far(partial: dict[str, Any]) -> None:
        # the rows timed so far, in bench.json and summary.json (which gpu_check.sh reads for its figures and the
        # kernel verdict): the stage's cap may stop the bench at any row
        write_json(out_dir / "bench.json", partial)
        summary["bench"], summary["goals"] = partial, goals(partial)
        if "correctness" in args.steps:
            summary["kernel_ok"], summary["kernel_why"] = kernel_verdict(corr, partial)
        write_json(out_dir / "summary.json", summary)

    bench = None
    if "bench" in args.steps:
        try:
            if not kernel_up:
                raise RuntimeError(f"kernel unavailable: {summary['kernel_load']['reason']}")
            bench = step_bench(args, device, budget_s=max(20.0, left() - 5.0), copy_bw=summary.get("copy_bandwidth"),
                               on_row=bench_so_far)
            write_json(out_dir / "bench.json", bench)
        except Exception as err:  # noqa: BLE001
            summary["bench_error"] = traceback.format_exc()[-3000:]
            log(f"[bench] ERROR {type(err).__name__}: {err}")
        summary["bench"] = bench
        summary["goals"] = goals(bench)

    if "correctness" in args.steps:
        summary["kernel_ok"], summary["kernel_why"] = kernel_verdict(corr, bench)
    status = (corr or {}).get("status", "FAIL" if "correctness" in args.steps else "PASS")
    if "build" in args.steps and not summary["build"]["ok"]:
        status = "FAIL"
    summary["seconds"] = round(time.time() - t0, 1)
    summary["exit_code"] = {"PASS": 0, "INCOMPLETE": 3}.get(status, 1)
    write_json(out_dir / "summary.json", summary)
    print_table(summary)
    return summary["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
