"""The CUDA kernel against float64 attention on a GPU (marked gpu: run with ``pytest -m gpu`` on a CUDA
machine; skipped elsewhere). benchmarks/gpu_check.py runs the full sweep; this is the quick version."""

from __future__ import annotations

import pytest
import torch

from sequoia_opt.attention import TreeMask, tree_attention
from sequoia_opt.attention import cuda as ta_cuda

from test_attention_reference import naive_attention_f64, rel_err, tree_rows

pytestmark = pytest.mark.gpu  # deselected by default; selected (-m gpu) without a CUDA device, it fails


@pytest.fixture(autouse=True, scope="module")
def _cuda_device():
    if not torch.cuda.is_available():
        pytest.fail("-m gpu needs a CUDA device")

TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module")
def kernel():
    if not ta_cuda.is_available():
        pytest.fail(f"CUDA device present but the kernel is unavailable: {ta_cuda.unavailable_reason()}")
    return ta_cuda


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize(
    "B,Hq,Hkv,T,L,m",
    [(1, 1, 1, 1, 0, 1), (1, 4, 1, 7, 1, 7), (2, 8, 1, 129, 1000, 129), (1, 8, 2, 7, 4097, 12), (1, 4, 4, 64, 65, 64)],
)
@pytest.mark.parametrize("num_splits", [None, 1, 1000])
def test_kernel_matches_float64(kernel, dtype, D, B, Hq, Hkv, T, L, m, num_splits):
    gen = torch.Generator().manual_seed(B * 7 + Hq + T + L + m + D)
    S = L + m + 5
    q = torch.randn(B, Hq, T, D, generator=gen)
    k = torch.randn(B, Hkv, S, D, generator=gen)
    v = torch.randn(B, Hkv, S, D, generator=gen)
    k[:, :, L + m :] = float("nan")  # slots past the tree must never be read
    v[:, :, L + m :] = float("nan")
    dense = tree_rows(T, m, gen)
    ref = naive_attention_f64(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), L, dense, D**-0.5)
    dev = torch.device("cuda")
    tm = TreeMask.from_dense(dense).to(dev)
    qd, kd, vd = (x.to(dev, dtype) for x in (q, k, v))
    out = torch.full_like(qd, float("nan"))
    kernel.tree_attention_cuda(qd, kd, vd, L, tm, D**-0.5, num_splits=num_splits, out=out)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    assert rel_err(out.cpu(), ref) < TOL[dtype]


def test_auto_backend_uses_kernel_on_cuda(kernel):
    dev = torch.device("cuda")
    q = torch.randn(1, 4, 3, 64, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 10, 64, device=dev, dtype=torch.bfloat16)
    tm = TreeMask.from_dense(torch.ones(3, 3, dtype=torch.bool).tril()).to(dev)
    a = tree_attention(q, k, k, 7, tm, backend="auto")
    b = tree_attention(q, k, k, 7, tm, backend="torch")
    assert rel_err(a.cpu().float(), b.cpu().double()) < 2e-2
    # float32 on CUDA: auto falls back to the reference, explicit cuda refuses
    tree_attention(q.float(), k.float(), k.float(), 7, tm, backend="auto")
    with pytest.raises(ValueError):
        tree_attention(q.float(), k.float(), k.float(), 7, tm, backend="cuda")
