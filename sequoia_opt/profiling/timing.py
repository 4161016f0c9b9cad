"""Timing that a reviewer can trust: warm-up excluded, device synchronised, repeats until the median settles.

On CUDA, CUDA events bracket each call (device time, not host launch time); on CPU, ``time.perf_counter``
(a monotonic clock) with the thread count recorded by the caller.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Timing:
    """Summary of repeated timings of one call, in milliseconds.

    Attributes:
        median_ms: median over the timed repeats.
        p10_ms, p90_ms: 10th and 90th percentiles (the spread reported beside the median).
        repeats: timed calls (warm-up excluded).
    """

    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int

    def to_dict(self) -> dict[str, float | int]:
        return {"median_ms": round(self.median_ms, 4), "p10_ms": round(self.p10_ms, 4),
                "p90_ms": round(self.p90_ms, 4), "repeats": self.repeats}


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def time_call(
    fn: Callable[[], object],
    device: torch.device | str,
    *,
    warmup: int = 2,
    min_repeats: int = 5,
    max_repeats: int = 50,
    rel_tol: float = 0.02,
    max_seconds: float = 10.0,
) -> Timing:
    """Time ``fn()`` on ``device``: ``warmup`` untimed calls, then batches of ``min_repeats`` timed calls
    until the running median moves by less than ``rel_tol`` (relative) between batches, ``max_repeats``
    calls were timed, or ``max_seconds`` of timing passed (at least ``min_repeats`` calls are always timed).

    Raises ValueError when ``min_repeats < 1`` or ``max_repeats < min_repeats``.
    """
    if min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError("need 1 <= min_repeats <= max_repeats")
    device = torch.device(device)
    cuda = device.type == "cuda"
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    samples: list[float] = []
    prev_median = None
    start = time.perf_counter()
    while len(samples) < max_repeats:
        for _ in range(min_repeats):
            if cuda:
                t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0.record()
                fn()
                t1.record()
                t1.synchronize()
                samples.append(t0.elapsed_time(t1))
            else:
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e3)
        median = statistics.median(samples)
        if prev_median is not None and abs(median - prev_median) <= rel_tol * prev_median:
            break
        if time.perf_counter() - start > max_seconds:
            break
        prev_median = median
    return Timing(statistics.median(samples), _quantile(samples, 0.1), _quantile(samples, 0.9), len(samples))


def token_grid(max_tokens: int, dense_up_to: int = 16, ratio: float = 1.25) -> list[int]:
    """Token counts to profile: every n in ``1..dense_up_to``, then a geometric grid (factor ``ratio``,
    rounded to multiples of 8 where that keeps it increasing) up to and including ``max_tokens``.

    Raises ValueError for ``max_tokens < 1``.
    """
    if max_tokens < 1:
        raise ValueError(f"max tokens must be >= 1, got {max_tokens}")
    grid = list(range(1, min(dense_up_to, max_tokens) + 1))
    x = float(grid[-1])
    while grid[-1] < max_tokens:
        x *= ratio
        n = int(round(x / 8) * 8) if x >= 32 else int(round(x))
        n = min(max(n, grid[-1] + 1), max_tokens)
        grid.append(n)
    return grid
