"""``treeopt profile latency --offload`` (CUDA only): measure what the offload cost model
(:mod:`sequoia_opt.solver.offload`) needs and build T(n) of the target with its layers streamed from pinned
host memory (:mod:`sequoia_opt.model.offload`):

* the host -> device bandwidth: copies of a pinned 256 MiB buffer, median GB/s;
* one layer's copy: its parameters from pinned host memory into a device slot (ms, median);
* one layer's compute over n tokens after ``context`` cached ones, weights resident (ms, per n of the grid);
* the resident part (embeddings, final norm, LM head) over n tokens;
* the draft's c(w) on the device (the draft stays resident);

then T(n) from the model, and beside it end-to-end forwards of the offloaded target at a few n, as a check
of the model (both stored in the profile, ``device.offload``).
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import torch

from ..attention import causal_tree_mask, record_backends
from ..errors import ProfileError
from ..model import Transformer
from ..model.kv_cache import KVCache
from ..model.offload import OffloadState, layer_bytes, offload_layers
from ..profiles import LatencyCurve
from ..solver.offload import OffloadModel, offload_curve
from ..device import device_info
from .latency import ProgressFn, profile_model, time_forward
from .timing import time_call

__all__ = ["measure_h2d_gbps", "profile_offload", "time_layer_copy"]


def _require_cuda(device: torch.device) -> None:
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ProfileError(f"offload profiling streams weights from pinned host memory to a GPU; device {device} is "
                           "not CUDA")


def measure_h2d_gbps(device: torch.device, nbytes: int = 256 << 20, repeats: int = 7) -> float:
    """Host -> device bandwidth (GB/s, 1e9 bytes / s) of pinned-memory copies, median of ``repeats``.

    Raises ProfileError on a device that is not CUDA."""
    _require_cuda(device)
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(device)
    rates = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        torch.cuda.synchronize(device)
        rates.append(nbytes / (a.elapsed_time(b) * 1e-3) / 1e9)
    return float(statistics.median(rates))


def time_layer_copy(state: OffloadState, device: torch.device | str, **timing_kw) -> float:
    """Median ms of one layer's copy from (pinned) host memory into a device slot, on the compute stream: layer
    1 (layer 0 for a one-layer model) into slot 0, through :meth:`OffloadState.load_now`, so the state records
    what slot 0 then holds and the next forward copies layer 0 back instead of computing with layer 1's
    weights."""
    layer = 1 % len(state.host)
    return time_call(lambda: state.load_now(0, layer), device, **timing_kw).median_ms


@torch.inference_mode()
def profile_offload(target: Transformer, draft: Transformer | None, token_counts: Sequence[int],
                    draft_counts: Sequence[int], context: int, *, device: torch.device, target_name: str,
                    draft_name: str | None,
                    profile_id: str, dtype: torch.dtype, progress: ProgressFn | None = None, rounds: int = 1,
                    check_counts: Sequence[int] | None = None, backend: str = "auto",
                    **timing_kw) -> tuple[LatencyCurve, dict[str, Any]]:
    """Measure the offload model's parts on CUDA, put ``target`` in offload mode (in place) and return
    (T(n) curve, info). ``info``: ``h2d_gbps``, ``layer_bytes``, ``n_layers``, ``transfer_ms`` (measured copy
    of one layer), ``measured_ms`` ({n: end-to-end offloaded forward ms} at ``check_counts``, default the
    grid's first, middle and last n), ``model`` (:meth:`OffloadModel.as_dict`), ``attention`` (the attention
    backend that ran, per model, :meth:`~sequoia_opt.attention.BackendRecord.as_dict`; also in the curve's
    ``device`` block). ``backend``: the attention backend asked for.

    ``target`` may sit on the host or on ``device``; ``draft`` must be on ``device`` (it stays resident).

    Raises ProfileError on a device that is not CUDA, or a context + n past the target's context.
    """
    device = torch.device(device)
    _require_cuda(device)
    if context + max(token_counts) > target.config.max_position_embeddings:
        raise ProfileError(f"context {context} + {max(token_counts)} tokens exceeds the target's context")
    cfg = target.config
    bw = measure_h2d_gbps(device)
    nbytes = layer_bytes(target)
    state = offload_layers(target, device)
    slot = state.slots[0]
    torch.cuda.synchronize(device)
    xfer = time_layer_copy(state, device, **timing_kw)
    cache = KVCache(1, cfg.n_kv_heads, context + max(token_counts), cfg.head_dim, dtype=target.dtype, device=device)
    compute, resident = {}, {}
    total = len(token_counts)
    with record_backends() as t_att:
        for j, n in enumerate(token_counts):
            n = int(n)
            x = torch.randn(1, n, cfg.dim, device=device, dtype=target.dtype) * 0.02
            pos = torch.arange(context, context + n, device=device).float()
            ang = pos.unsqueeze(-1) * target.inv_freq
            cos, sin = ang.cos()[None, None], ang.sin()[None, None]
            slots = torch.arange(context, context + n, device=device)
            mask = causal_tree_mask(n, device)
            compute[n] = time_call(lambda: slot(x, cos, sin, cache, slots, context, mask, backend), device,
                                   **timing_kw).median_ms
            toks = torch.randint(0, cfg.vocab_size, (1, n), device=device)
            resident[n] = time_call(lambda: target.lm_head(target.norm(target.embed_tokens(toks))), device,
                                    **timing_kw).median_ms
            if progress:
                progress(f"offload layer compute, {n} tokens", j + 1, total)
        model = OffloadModel(n_layers=cfg.n_layers, layer_bytes=nbytes, h2d_gbps=bw, layer_compute_ms=compute,
                             resident_ms=resident)
        checks = check_counts or sorted({int(token_counts[0]), int(token_counts[len(token_counts) // 2]),
                                         int(token_counts[-1])})
        tcache = target.new_cache(context + max(checks))
        measured = {n: time_forward(target, n, context, cache=tcache, backend=backend, min_repeats=3,
                                    max_repeats=7).median_ms for n in checks}
    overhead = 0.0
    with record_backends() as d_att:
        if draft is not None:
            from .latency import measure_step_overhead

            overhead = measure_step_overhead(target, draft, steps=8, backend=backend)
            dt = profile_model(draft, draft_counts, [context], what="draft", rounds=rounds, backend=backend,
                               **timing_kw)[0]
            draft_ms = {int(w): t.median_ms for w, t in zip(dt.tokens, dt.timings)}
        else:
            draft_ms = {1: 0.0}
    attention = {"requested": backend, "target": t_att.as_dict(),
                 "draft": d_att.as_dict() if draft is not None else None}
    info_dev = {**device_info(device, dtype), "attention": attention}
    curve = offload_curve(model, token_counts, draft_ms, step_overhead_ms=overhead, context=context,
                          profile_id=profile_id, device=info_dev,
                          model_info={"target": target_name, "draft": draft_name, "offloaded": True},
                          source="measured by treeopt profile latency --offload: offload cost model from the "
                                 "measured host->device bandwidth and per-layer copy / compute times",
                          measured_ms=measured)
    info = {"h2d_gbps": bw, "layer_bytes": nbytes, "n_layers": cfg.n_layers, "transfer_ms": xfer,
            "measured_ms": measured, "model": model.as_dict(), "attention": attention}
    return curve, info
