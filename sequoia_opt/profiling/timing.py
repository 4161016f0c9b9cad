"""Timing that a reviewer can trust: warm-up excluded, device synchronised, repeats until the median settles.

On CUDA, CUDA events bracket each call (device time, not host launch time); on CPU, ``time.perf_counter``
(a monotonic clock) with the thread count recorded by the caller.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

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
    return time_alternating([fn], device, warmup=warmup, min_repeats=min_repeats, max_repeats=max_repeats,
                            rel_tol=rel_tol, max_seconds=max_seconds)[0]


def time_alternating(
    fns: Sequence[Callable[[], object]],
    device: torch.device | str,
    *,
    warmup: int = 2,
    min_repeats: int = 5,
    max_repeats: int = 50,
    rel_tol: float = 0.02,
    max_seconds: float = 10.0,
) -> list[Timing]:
    """Time several calls interleaved call by call (a, b, a, b, ...) with :func:`time_call`'s rules: each is
    warmed up, and batches of ``min_repeats`` rounds run until every call's running median settles within
    ``rel_tol``, ``max_repeats`` rounds were timed or ``max_seconds`` passed.

    Interleaving is what makes a *ratio* of two timings trustworthy on a machine whose speed drifts (a shared
    VM, a GPU changing clocks): a slow spell lands on both calls instead of on whichever ran during it.
    Returns one :class:`Timing` (ms) per call, in the order given.

    Raises ValueError when ``fns`` is empty, ``min_repeats < 1`` or ``max_repeats < min_repeats``.
    """
    if not fns:
        raise ValueError("nothing to time")
    if min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError(f"need 1 <= min_repeats <= max_repeats, got min_repeats={min_repeats}, "
                         f"max_repeats={max_repeats}")
    device = torch.device(device)
    cuda = device.type == "cuda"
    for fn in fns:
        for _ in range(warmup):
            fn()
    if cuda:
        torch.cuda.synchronize(device)
    samples: list[list[float]] = [[] for _ in fns]
    prev: list[float] | None = None
    start = time.perf_counter()
    while len(samples[0]) < max_repeats:
        for _ in range(min(min_repeats, max_repeats - len(samples[0]))):  # never past max_repeats
            for fn, out in zip(fns, samples):
                if cuda:
                    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0.record()
                    fn()
                    t1.record()
                    t1.synchronize()
                    out.append(t0.elapsed_time(t1))
                else:
                    t0 = time.perf_counter()
                    fn()
                    out.append((time.perf_counter() - t0) * 1e3)
        medians = [statistics.median(xs) for xs in samples]
        if prev is not None and all(abs(m - q) <= rel_tol * q for m, q in zip(medians, prev)):
            break
        if time.perf_counter() - start > max_seconds:
            break
        prev = medians
    return [Timing(statistics.median(xs), _quantile(xs, 0.1), _quantile(xs, 0.9), len(xs)) for xs in samples]


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
