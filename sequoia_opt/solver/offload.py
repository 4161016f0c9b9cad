"""Cost model of an offloaded target: T(n) when every decoder layer's weights stream over the host link each
forward (Sequoia, Chen et al. 2024, section 4 and its offloading experiments: an L40 running a 70B target
offloaded, where T(n) stays flat far past 64 tokens and the chosen trees are deep and narrow, depth ~8).

With layers streamed in order and the next layer's copy overlapped with the current layer's compute
(:mod:`sequoia_opt.model.offload`, double-buffered), one forward over n tokens through L layers takes::

    x      = layer_bytes / h2d_bandwidth                      # one layer's copy (ms)
    c(n)   = one layer's compute over n tokens on the device  # measured, or a roofline for synthetic models
    T(n)   = x + sum_{l=0}^{L-2} max(x, c(n)) + c(n)          # pipeline: first copy exposed, then the slower of
           + resident_ms(n) + overhead_ms                     #  copy / compute per layer, last compute exposed;
                                                              #  embeddings + LM head on device; launch / sync

which is ``sum_l max(x, c(n))`` plus the pipeline's two exposed ends; while ``c(n) < x`` (transfer-bound) T(n)
does not grow with n at all. The draft (small) stays resident, so its c(w) is its ordinary on-device cost.

:func:`offload_curve` turns the model into an ordinary ``treeopt-latency/1`` :class:`LatencyCurve` (the
offload parameters stored under ``device.offload``), so ``treeopt solve`` needs nothing new to choose the
regime's trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ProfileError
from ..profiles import LATENCY_FORMAT, LatencyCurve

__all__ = ["OffloadModel", "offload_curve", "roofline_layer_ms", "synthetic_offload_model"]


def _interp(table: Mapping[int, float], n: float, what: str) -> float:
    ks = sorted(table)
    if n < ks[0] or n > ks[-1]:
        raise ProfileError(f"{what} at {n:g} tokens is outside the measured range {ks[0]}..{ks[-1]}")
    return float(np.interp(n, ks, [table[k] for k in ks]))


@dataclass(frozen=True)
class OffloadModel:
    """The parameters of an offloaded forward (module docstring).

    Attributes:
        n_layers: L, layers streamed.
        layer_bytes: bytes one layer's weights take (streamed once per layer per forward).
        h2d_gbps: host -> device bandwidth in GB/s (1e9 bytes / s), pinned memory.
        layer_compute_ms: {n: ms} one layer's compute over n tokens on the device (interpolated, never
            extrapolated).
        resident_ms: {n: ms} embeddings, final norm and LM head on the device (default 0).
        overhead_ms: fixed cost per forward (kernel launches, synchronisation), ms.
    """

    n_layers: int
    layer_bytes: float
    h2d_gbps: float
    layer_compute_ms: Mapping[int, float]
    resident_ms: Mapping[int, float] = field(default_factory=dict)
    overhead_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.n_layers < 1 or self.layer_bytes <= 0 or not self.h2d_gbps > 0:
            raise ProfileError(f"offload model needs n_layers >= 1, layer_bytes > 0 and h2d_gbps > 0, got "
                               f"{self.n_layers}, {self.layer_bytes}, {self.h2d_gbps}")
        if not self.layer_compute_ms:
            raise ProfileError("offload model needs at least one layer compute time")

    @property
    def transfer_ms(self) -> float:
        """x: one layer's copy over the host link (ms)."""
        return self.layer_bytes / (self.h2d_gbps * 1e9) * 1e3

    def compute_ms(self, n: float) -> float:
        """c(n): one layer's compute over n tokens (ms)."""
        return _interp(self.layer_compute_ms, n, "offload layer compute")

    def target_ms(self, n: float) -> float:
        """T(n) of the offloaded target (ms), the pipeline formula of the module docstring."""
        x, c = self.transfer_ms, self.compute_ms(n)
        res = _interp(self.resident_ms, n, "resident compute") if self.resident_ms else 0.0
        return x + (self.n_layers - 1) * max(x, c) + c + res + self.overhead_ms

    def transfer_bound_until(self) -> int | None:
        """The largest tabulated n with c(n) <= x (T flat up to there); None when even n = 1 is compute-bound."""
        ok = [n for n in sorted(self.layer_compute_ms) if self.layer_compute_ms[n] <= self.transfer_ms]
        return ok[-1] if ok else None

    def as_dict(self) -> dict[str, Any]:
        """The model as plain types for a report: its inputs (layers, bytes per layer, host link in GB/s, per-n layer
        compute and resident compute in ms, overhead in ms) and the derived copy time per layer
        (``transfer_ms_per_layer``, ms)."""
        return {"n_layers": self.n_layers, "layer_bytes": float(self.layer_bytes), "h2d_gbps": float(self.h2d_gbps),
                "transfer_ms_per_layer": self.transfer_ms,
                "layer_compute_ms": {int(k): float(v) for k, v in sorted(self.layer_compute_ms.items())},
                "resident_ms": {int(k): float(v) for k, v in sorted(self.resident_ms.items())},
                "overhead_ms": float(self.overhead_ms)}


def roofline_layer_ms(n: float, *, dim: int, intermediate: int, n_heads: int, n_kv_heads: int, head_dim: int,
                      context: int, bytes_per_param: float, tflops: float, hbm_gbps: float) -> float:
    """A roofline estimate of one Llama layer's compute over n tokens after ``context`` cached ones (ms), for
    synthetic offload models (tests, examples): the larger of its FLOPs at ``tflops`` (1e12 / s) and its
    device-memory bytes (weights from the slot once, K/V of the context) at ``hbm_gbps``."""
    params = dim * (n_heads * head_dim + 2 * n_kv_heads * head_dim) + n_heads * head_dim * dim + 3 * dim * intermediate
    flops = 2.0 * params * n + 4.0 * n * (context + n) * n_heads * head_dim
    moved = params * bytes_per_param + 2.0 * (context + n) * n_kv_heads * head_dim * bytes_per_param
    return max(flops / (tflops * 1e12), moved / (hbm_gbps * 1e9)) * 1e3


def offload_curve(model: OffloadModel, token_counts: Sequence[int], draft_ms: Mapping[int, float], *,
                  step_overhead_ms: float, context: int, profile_id: str, device: Mapping[str, Any] | None = None,
                  model_info: Mapping[str, Any] | None = None, source: str | None = None,
                  measured_ms: Mapping[int, float] | None = None) -> LatencyCurve:
    """A ``treeopt-latency/1`` :class:`LatencyCurve` whose T(n) is ``model.target_ms(n)`` at ``token_counts``,
    with the resident draft's ``draft_ms`` ({w: ms}) and ``step_overhead_ms``; ``device.offload`` records the
    model's parameters (and ``measured_ms``, end-to-end offloaded forwards, when given).

    Raises ProfileError for a token count outside the model's compute table.
    """
    ns = sorted({int(n) for n in token_counts})
    dev = dict(device or {})
    dev["offload"] = model.as_dict() | ({"measured_forward_ms": {int(k): float(v) for k, v in measured_ms.items()}}
                                        if measured_ms else {})
    ws = sorted(draft_ms)
    doc = {"format": LATENCY_FORMAT, "id": profile_id,
           "source": source or "offload cost model (sequoia_opt.solver.offload): T(n) = first copy + (L - 1) x "
                               "max(copy, compute(n)) + last compute + resident + overhead",
           "device": dev, "model": dict(model_info or {}), "step_overhead_ms": float(step_overhead_ms),
           "curves": [{"context_tokens": int(context),
                       "target": {"tokens": ns, "target_forward_ms": [round(model.target_ms(n), 4) for n in ns]},
                       "draft": {"cost_model": "per-level", "tokens": ws,
                                 "draft_forward_ms": [float(draft_ms[w]) for w in ws]}}]}
    return LatencyCurve.from_dict(doc, source=f"offload curve {profile_id!r}", default_id=profile_id)


def synthetic_offload_model(config: Any, token_counts: Sequence[int], *, h2d_gbps: float, tflops: float,
                            hbm_gbps: float, context: int, bytes_per_param: float = 2.0,
                            overhead_ms: float = 0.0) -> OffloadModel:
    """An :class:`OffloadModel` for a :class:`~sequoia_opt.model.ModelConfig` on a device described by its
    host link (``h2d_gbps``), compute (``tflops``) and memory bandwidth (``hbm_gbps``): layer bytes from the
    shape, layer and resident compute from :func:`roofline_layer_ms`. For tests and examples on machines
    without a GPU; a measured model comes from ``treeopt profile latency --offload``."""
    c = config
    kw = dict(dim=c.dim, intermediate=c.intermediate_size, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads,
              head_dim=c.head_dim, context=context, bytes_per_param=bytes_per_param, tflops=tflops, hbm_gbps=hbm_gbps)
    per_layer = (c.dim * (c.n_heads * c.head_dim + 2 * c.n_kv_heads * c.head_dim) + c.n_heads * c.head_dim * c.dim
                 + 3 * c.dim * c.intermediate_size + 2 * c.dim)
    head = c.vocab_size * c.dim
    resident = {int(n): max(2.0 * head * n / (tflops * 1e12), head * bytes_per_param / (hbm_gbps * 1e9)) * 1e3
                for n in token_counts}
    return OffloadModel(n_layers=c.n_layers, layer_bytes=per_layer * bytes_per_param, h2d_gbps=h2d_gbps,
                        layer_compute_ms={int(n): roofline_layer_ms(n, **kw) for n in token_counts},
                        resident_ms=resident, overhead_ms=overhead_ms)
