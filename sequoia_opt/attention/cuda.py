"""The CUDA backend of :func:`sequoia_opt.attention.tree_attention`: a bit-mask tree-attention kernel split
across the KV cache (``kernels/tree_attention.cu``), built on first use and cached.

What the kernel computes is the reference's function (prefix keys dense, tree keys through the bit mask,
grouped-query attention, fp32 accumulation); how it is organised is written at the top of the .cu file.
Sources: FlashAttention-2 (Dao, 2023) for the tiled online softmax and the register-resident P; Flash-Decoding
(Dao, Haziza, Massa, Sizov, 2023) for splitting the keys across thread blocks and combining partial
(max, sum-exp, acc) triples; SpecInfer (Miao et al., 2024, section 4) for the tree mask over a KV cache.

Building. The extension is compiled with :func:`torch.utils.cpp_extension.load` (JIT, ninja, the local nvcc),
not NVRTC: the entry point takes torch tensors and must launch on torch's current stream, which needs torch's
C++ headers and libraries at build time; an NVRTC/cuda-python route would avoid the host compiler but would
need its own launch and stream plumbing (cuda-python is not a dependency). The .cu itself includes no torch
header, so it also compiles standalone with nvcc (``tests/test_kernel_compile.py``). The build is cached in
``$TORCH_EXTENSIONS_DIR/<name>`` when that variable is set, else ``~/.cache/treeopt/torch_extensions/<name>``;
``<name>`` carries a hash of the kernel sources, so editing them rebuilds. Only the current device's
architecture is built unless ``TORCH_CUDA_ARCH_LIST`` says otherwise. ``TREEOPT_DISABLE_CUDA_KERNEL=1`` makes
:func:`is_available` return False; ``TREEOPT_KERNELS_DIR`` points at another kernels folder.

Supported: CUDA tensors, float16 or bfloat16 (q and both caches one dtype), head_dim 64 or 128, contiguous
caches, ``Hq % Hkv == 0``. Anything else: :func:`unsupported_reason` says why, and ``backend="auto"`` uses the
torch reference instead.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import warnings
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import torch

# the package __init__ imports this module lazily (never at its own import), so no import cycle
from . import require_dense_mask, require_tree_mask

if TYPE_CHECKING:  # pragma: no cover
    from . import TreeMask

__all__ = [
    "BLOCK_M",
    "BLOCK_N",
    "is_available",
    "unavailable_reason",
    "unsupported_reason",
    "supports",
    "plan_splits",
    "split_k_reference",
    "tree_attention_cuda",
    "kernel_dir",
    "load_extension",
]

BLOCK_M = 64  # query rows (GQA group x T, flattened) per thread block; kBlockM in tree_attention.h
BLOCK_N = 64  # keys per tile; kBlockN in tree_attention.h
LOG2E = 1.4426950408889634

_SOURCES = ("tree_attention.h", "tree_attention.cu", "tree_attention_binding.cpp")
_unavailable_reason: str | None = None  # set when a check or build failed; a failed build is not retried


# --------------------------------------------------------------------------------------------------------------
# Split planning and the pure-torch model of the kernel's split-K math (runs anywhere, tested on CPU)


def plan_splits(
    n_keys: int, rows: int, batch_kv_heads: int, num_sms: int, *, blocks_per_sm: int = 2, min_tiles_per_split: int = 2
) -> tuple[int, int]:
    """Number of key splits and key tiles per split for one launch (flash-decoding's split-K).

    The grid has ``ceil(rows / BLOCK_M) * batch_kv_heads`` blocks per split; splits are added until the grid
    holds about ``blocks_per_sm * num_sms`` blocks (two resident blocks per SM at head_dim 128 on Hopper),
    keeping at least ``min_tiles_per_split`` tiles of ``BLOCK_N`` keys per split so the partial outputs
    (written and re-read by the combine kernel) stay small next to the K/V bytes. Empty splits never occur:
    ``tiles_per_split * (num_splits - 1) < n_tiles <= tiles_per_split * num_splits``.

    Args:
        n_keys: L + m, keys each query row may see (>= 1).
        rows: query rows per KV head, ``(Hq // Hkv) * T``.
        batch_kv_heads: ``B * Hkv``.
        num_sms: multiprocessors of the device.

    Returns:
        (num_splits, tiles_per_split), both >= 1.

    Raises:
        ValueError: ``n_keys``, ``rows``, ``batch_kv_heads`` or ``num_sms`` below 1.
    """
    if n_keys < 1 or rows < 1 or batch_kv_heads < 1 or num_sms < 1:
        raise ValueError(f"plan_splits needs positive sizes, got {n_keys=}, {rows=}, {batch_kv_heads=}, {num_sms=}")
    n_tiles = -(-n_keys // BLOCK_N)
    base_blocks = -(-rows // BLOCK_M) * batch_kv_heads
    want = -(-(blocks_per_sm * num_sms) // base_blocks)
    splits = max(1, min(want, n_tiles // max(1, min_tiles_per_split)))
    tiles_per_split = -(-n_tiles // splits)
    splits = -(-n_tiles // tiles_per_split)
    return splits, tiles_per_split


def split_k_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_len: int,
    tree_dense: torch.Tensor,
    scale: float,
    num_splits: int,
    tiles_per_split: int,
) -> torch.Tensor:
    """The kernel's arithmetic in plain torch: the same key splits, per-split normalised partial outputs
    and log2-sum-exp2 values, then the same combine. Useful to test the split/combine math on a CPU.

    Args:
        q: (B, Hq, T, D); k_cache, v_cache: (B, Hkv, S, D); tree_dense: (T, m) bool; any float dtype (the
            math runs in float32, or float64 when q is float64).
        prefix_len, scale: as in :func:`sequoia_opt.attention.tree_attention`.
        num_splits, tiles_per_split: a plan as :func:`plan_splits` returns (any plan that covers the keys).

    Returns:
        (B, Hq, T, D) in q's dtype. Rows that see no key are zeros (as the kernel and torch's SDPA give).

    Raises:
        TypeError: ``tree_dense`` is not a tensor (a TreeMask: pass its ``.dense``).
        ValueError: ``tree_dense`` is not 2-D bool.
    """
    require_dense_mask(tree_dense, "split_k_reference")
    B, Hq, T, D = q.shape
    Hkv = k_cache.shape[1]
    m = tree_dense.shape[1]
    n_keys = prefix_len + m
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = Hq // Hkv
    k = k_cache[:, :, :n_keys].to(work).repeat_interleave(group, dim=1)  # (B, Hq, L + m, D)
    v = v_cache[:, :, :n_keys].to(work).repeat_interleave(group, dim=1)
    # (T, L + m): prefix always visible, tree slots through the mask
    visible = torch.cat([torch.ones(T, prefix_len, dtype=torch.bool, device=q.device), tree_dense.to(q.device)], 1)
    s = (q.to(work) @ k.transpose(-1, -2)) * (scale * LOG2E)  # (B, Hq, T, L + m), log2 units
    s = s.masked_fill(~visible, -math.inf)
    neg_inf = torch.tensor(-math.inf, dtype=work, device=q.device)
    o_parts, lses = [], []
    for sp in range(num_splits):
        lo, hi = sp * tiles_per_split * BLOCK_N, min((sp + 1) * tiles_per_split * BLOCK_N, n_keys)
        if lo >= hi:
            o_parts.append(torch.zeros(B, Hq, T, D, dtype=work, device=q.device))
            lses.append(torch.full((B, Hq, T), -math.inf, dtype=work, device=q.device))
            continue
        ss = s[..., lo:hi]
        mx = ss.amax(dim=-1, keepdim=True)  # (B, Hq, T, 1)
        m_use = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
        p = torch.exp2(ss - m_use)
        l = p.sum(dim=-1, keepdim=True)
        seen = l > 0
        o_parts.append(torch.where(seen, (p @ v[..., lo:hi, :]) / torch.where(seen, l, torch.ones_like(l)), 0.0))
        lses.append(torch.where(seen, m_use + torch.log2(torch.where(seen, l, torch.ones_like(l))), neg_inf).squeeze(-1))
    lse = torch.stack(lses)  # (splits, B, Hq, T)
    o = torch.stack(o_parts)  # (splits, B, Hq, T, D)
    gmax = lse.amax(dim=0, keepdim=True)
    w = torch.where(torch.isinf(gmax), torch.zeros_like(lse), torch.exp2(lse - gmax))
    wsum = w.sum(dim=0)  # (B, Hq, T)
    out = (w.unsqueeze(-1) * o).sum(dim=0) / torch.where(wsum > 0, wsum, torch.ones_like(wsum)).unsqueeze(-1)
    return out.to(q.dtype)


# --------------------------------------------------------------------------------------------------------------
# Building and loading


def kernel_dir() -> Path:
    """The folder holding ``tree_attention.{h,cu}`` and the binding: ``$TREEOPT_KERNELS_DIR``, else the
    repository's ``kernels/`` (a source checkout), else ``sequoia_opt/kernels`` (package data)."""
    env = os.environ.get("TREEOPT_KERNELS_DIR")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [here.parents[2] / "kernels", here.parents[1] / "kernels"]
    for c in candidates:
        if all((c / name).is_file() for name in _SOURCES):
            return c
    return candidates[0]


def _build_name(kdir: Path) -> str:
    h = hashlib.sha256()
    for name in _SOURCES:
        h.update((kdir / name).read_bytes())
    h.update(torch.__version__.encode())
    h.update(str(torch.version.cuda).encode())
    return f"treeopt_tree_attention_{h.hexdigest()[:12]}"


def _build_root() -> Path:
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "treeopt" / "torch_extensions"


@lru_cache(maxsize=1)
def load_extension():
    """Build (first call; about a minute) or load (cached) the extension module and return it. Set
    ``TREEOPT_KERNEL_VERBOSE=1`` to see the compiler's command lines and resource report.

    Raises:
        RuntimeError: no CUDA device, no CUDA compiler, missing sources, or a failed build (the message holds
            the compiler's reason).
    """
    if not torch.cuda.is_available() or torch.version.cuda is None:
        raise RuntimeError("torch has no CUDA device (CPU build or no driver)")
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None and shutil.which("nvcc") is None:
        raise RuntimeError("no CUDA compiler: nvcc not found and CUDA_HOME unset")
    kdir = kernel_dir()
    missing = [n for n in _SOURCES if not (kdir / n).is_file()]
    if missing:
        raise RuntimeError(f"kernel sources missing in {kdir}: {missing}")
    name = _build_name(kdir)
    build_dir = _build_root() / name
    build_dir.mkdir(parents=True, exist_ok=True)

    major, minor = torch.cuda.get_device_capability()
    arch_env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if not arch_env:
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"  # build for this device only
    try:
        return cpp_extension.load(
            name=name,
            sources=[str(kdir / "tree_attention_binding.cpp"), str(kdir / "tree_attention.cu")],
            extra_include_paths=[str(kdir)],
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3", "--use_fast_math", "-lineinfo"],  # -std: torch picks its own
            build_directory=str(build_dir),
            verbose=os.environ.get("TREEOPT_KERNEL_VERBOSE", "") not in ("", "0"),
        )
    finally:
        if not arch_env:
            del os.environ["TORCH_CUDA_ARCH_LIST"]


def unavailable_reason() -> str | None:
    """Why :func:`is_available` is False (None when it is True or was not asked yet)."""
    if os.environ.get("TREEOPT_DISABLE_CUDA_KERNEL", "") not in ("", "0"):
        return "disabled by TREEOPT_DISABLE_CUDA_KERNEL"
    return _unavailable_reason


def is_available() -> bool:
    """True when the kernel can run here: a CUDA device, a CUDA compiler, and the extension built (built on
    the first call, then cached). Never raises; on failure warns once and returns False, and
    :func:`unavailable_reason` says why."""
    global _unavailable_reason
    if os.environ.get("TREEOPT_DISABLE_CUDA_KERNEL", "") not in ("", "0"):
        return False
    if _unavailable_reason is not None:
        return False  # a failed build is not retried in this process
    try:
        load_extension()
    except Exception as err:  # noqa: BLE001 - any build/import failure means "fall back to torch"
        _unavailable_reason = f"{type(err).__name__}: {err}"
        if torch.cuda.is_available():
            warnings.warn(f"tree-attention CUDA kernel unavailable, using torch: {_unavailable_reason}", stacklevel=2)
        return False
    return True


# --------------------------------------------------------------------------------------------------------------
# The entry point


def unsupported_reason(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> str | None:
    """None when the kernel supports these tensors, else a one-line reason. Checks device, dtype, head_dim
    and layout only; it neither builds nor loads the extension."""
    if q.device.type != "cuda":
        return f"tensors on {q.device}, the kernel needs CUDA"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {q.dtype}, the kernel takes float16 or bfloat16"
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        return f"q is {q.dtype} but the cache is {k_cache.dtype}/{v_cache.dtype}"
    if k_cache.device != q.device or v_cache.device != q.device:
        return "q and the cache are on different devices"
    if q.dim() != 4 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        return f"shapes q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}"
    if q.shape[-1] not in (64, 128) or k_cache.shape[-1] != q.shape[-1]:
        return f"head_dim {q.shape[-1]}, the kernel takes 64 or 128"
    if q.shape[0] != k_cache.shape[0] or q.shape[1] % k_cache.shape[1]:
        return f"batch / head counts of q {tuple(q.shape)} and cache {tuple(k_cache.shape)} do not match"
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return "the KV cache is not contiguous"
    if k_cache.data_ptr() % 16 or v_cache.data_ptr() % 16:
        return "the KV cache is not 16-byte aligned"
    return None


def supports(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """True when :func:`unsupported_reason` finds nothing."""
    return unsupported_reason(q, k_cache, v_cache) is None


@lru_cache(maxsize=16)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def tree_attention_cuda(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_len: int,
    tree_mask: "TreeMask",
    scale: float,
    *,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Tree attention with the CUDA kernel. Shapes and meaning as in
    :func:`sequoia_opt.attention.tree_attention` (which validates slot ranges before calling this):

    Args:
        q: (B, Hq, T, D) float16/bfloat16 CUDA tensor; copied to contiguous if it is not.
        k_cache, v_cache: (B, Hkv, S, D), q's dtype and device, contiguous; ``Hq % Hkv == 0``; D in {64, 128}.
        prefix_len: L, slots [0, L) are seen by every query.
        tree_mask: :class:`~sequoia_opt.attention.TreeMask` of (T, m); its ``bits`` (T, ceil(m/64)) int64 are
            what the kernel reads (moved to q's device if they are elsewhere: keep the mask on the device).
        scale: softmax scale.
        num_splits: override the split plan (tests and benchmarks); default :func:`plan_splits`. Clamped to
            the number of key tiles; the kernel may use fewer splits so that none is empty.
        out: optional (B, Hq, T, D) contiguous tensor of q's dtype and device to write into (the GPU check
            fills it with NaN first so unwritten elements show).

    Returns:
        (B, Hq, T, D) in q's dtype; rows that see no key at all are zeros.

    Raises:
        TypeError: ``tree_mask`` is not a TreeMask (build one with ``TreeMask.from_dense(mask)``).
        ValueError: tensors the kernel does not support (see :func:`unsupported_reason`).
        RuntimeError: the extension cannot be built or the launch fails.
    """
    require_tree_mask(tree_mask, "tree_attention_cuda")
    reason = unsupported_reason(q, k_cache, v_cache)
    if reason is not None:
        raise ValueError(f"tree_attention backend 'cuda': {reason}")
    B, Hq, T, D = q.shape
    Hkv = k_cache.shape[1]
    m = tree_mask.num_tree_keys
    n_keys = prefix_len + m
    if tree_mask.num_queries != T:
        raise ValueError(f"tree mask has {tree_mask.num_queries} rows for {T} queries")
    if prefix_len < 0 or n_keys > k_cache.shape[2]:
        raise ValueError(f"slots [0, {n_keys}) do not fit a cache of {k_cache.shape[2]} slots")
    q = q.contiguous()
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {tuple(q.shape)} {q.dtype} tensor on {q.device}")
    if n_keys == 0:
        return out.zero_()
    bits = tree_mask.bits
    if bits.device != q.device:
        bits = bits.to(q.device, non_blocking=True)
    bits = bits.contiguous()
    rows = (Hq // Hkv) * T
    if num_splits is None:
        num_splits, tiles_per_split = plan_splits(n_keys, rows, B * Hkv, _num_sms(q.device.index or 0))
    else:
        n_tiles = -(-n_keys // BLOCK_N)
        tiles_per_split = -(-n_tiles // max(1, min(num_splits, n_tiles)))
        num_splits = -(-n_tiles // tiles_per_split)
    if num_splits > 1:
        o_part = torch.empty((num_splits, B, Hq, T, D), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((num_splits, B, Hq, T), dtype=torch.float32, device=q.device)
    else:
        o_part = lse_part = torch.empty(0, dtype=torch.float32, device=q.device)
    ext = load_extension()
    ext.forward(q, k_cache, v_cache, bits, out, o_part, lse_part, prefix_len, m, tiles_per_split, num_splits, float(scale))
    return out
