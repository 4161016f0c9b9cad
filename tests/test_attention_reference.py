"""The torch side of tree attention, on CPU: the bit-packed mask, the torch reference against a float64 naive
attention, the pure-torch model of the CUDA kernel's split-K + combine, the split planner, and the backend
selection when no CUDA kernel is available."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sequoia_opt.attention import TreeMask, causal_tree_mask, pack_mask_bits, tree_attention
from sequoia_opt.attention import cuda as ta_cuda
from sequoia_opt.attention import tree_attention_reference


# ------------------------------------------------------------------------------------------------------------
# helpers


def random_parents(n: int, gen: torch.Generator) -> list[int]:
    """A random tree of n nodes in breadth-first-compatible order: parent[i] < i, root has -1."""
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """(n, n) bool: [i, j] is True when j is i or an ancestor of i."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def tree_rows(T: int, m: int, gen: torch.Generator) -> torch.Tensor:
    """(T, m) mask: the last T nodes of a random m-node tree (m == T: verification; m > T: a draft level)."""
    return ancestor_mask(random_parents(m, gen))[m - T :]


def naive_attention_f64(q, k_cache, v_cache, prefix_len, tree_dense, scale):
    """Attention written out per query head in float64: head h reads KV head h // (Hq // Hkv); every query
    sees slots [0, L) and the tree slots its mask row allows; a row that sees nothing is zero."""
    B, Hq, T, D = q.shape
    Hkv = k_cache.shape[1]
    m = tree_dense.shape[1]
    group = Hq // Hkv
    visible = torch.cat([torch.ones(T, prefix_len, dtype=torch.bool), tree_dense], dim=1)  # (T, L + m)
    out = torch.zeros(B, Hq, T, D, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            k = k_cache[b, h // group, : prefix_len + m].double()  # (L + m, D)
            v = v_cache[b, h // group, : prefix_len + m].double()
            s = (q[b, h].double() @ k.T) * scale  # (T, L + m)
            s = s.masked_fill(~visible, -math.inf)
            mx = s.amax(dim=-1, keepdim=True)
            mx = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
            p = torch.exp(s - mx)
            denom = p.sum(dim=-1, keepdim=True)
            out[b, h] = torch.where(denom > 0, (p @ v) / torch.where(denom > 0, denom, 1.0), 0.0)
    return out


def make_case(B, Hq, Hkv, T, L, m, D, gen, dtype=torch.float32, extra_slots=3):
    q = torch.randn(B, Hq, T, D, generator=gen).to(dtype)
    S = L + m + extra_slots
    k = torch.randn(B, Hkv, S, D, generator=gen).to(dtype)
    v = torch.randn(B, Hkv, S, D, generator=gen).to(dtype)
    return q, k, v


def rel_err(out, ref):
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


# ------------------------------------------------------------------------------------------------------------
# bit packing


def unpack_bits(bits: torch.Tensor, m: int) -> torch.Tensor:
    words = bits.numpy().view(np.uint64)  # the kernel reads the words as uint64
    T = words.shape[0]
    out = np.zeros((T, m), dtype=bool)
    for j in range(m):
        out[:, j] = (words[:, j // 64] >> np.uint64(j % 64)) & np.uint64(1)
    return torch.from_numpy(out)


@pytest.mark.parametrize("m", [1, 63, 64, 65, 130])
@pytest.mark.parametrize("T", [1, 7, 65])
def test_pack_mask_bits_roundtrip_odd_sizes(T, m):
    gen = torch.Generator().manual_seed(T * 1000 + m)
    dense = torch.rand(T, m, generator=gen) < 0.5
    bits = pack_mask_bits(dense)
    assert bits.dtype == torch.int64
    assert bits.shape == (T, max(1, (m + 63) // 64))
    assert torch.equal(unpack_bits(bits, m), dense)
    # bits past m are zero (the kernel never reads them, but garbage there would hide an off-by-one)
    words = bits.numpy().view(np.uint64)
    if m % 64:
        assert np.all(words[:, -1] >> np.uint64(m % 64) == 0)


def test_pack_mask_bits_exact_words_and_bit_63():
    dense = torch.zeros(3, 130, dtype=torch.bool)
    dense[0, 63] = True  # the sign bit of an int64 word
    dense[1, 0] = dense[1, 64] = dense[1, 129] = True
    dense[2, :] = True
    words = pack_mask_bits(dense).numpy().view(np.uint64)
    assert int(words[0, 0]) == 1 << 63 and int(words[0, 1]) == 0 and int(words[0, 2]) == 0
    assert [int(w) for w in words[1]] == [1, 1, 1 << 1]
    assert [int(w) for w in words[2]] == [2**64 - 1, 2**64 - 1, 0b11]


def test_tree_mask_from_tree_ancestors():
    gen = torch.Generator().manual_seed(0)
    parents = random_parents(70, gen)
    dense = ancestor_mask(parents)
    tm = TreeMask.from_dense(dense)
    assert tm.num_queries == 70 and tm.num_tree_keys == 70
    assert torch.equal(unpack_bits(tm.bits, 70), dense)
    assert torch.equal(unpack_bits(causal_tree_mask(65).bits, 65), torch.ones(65, 65, dtype=torch.bool).tril())


# ------------------------------------------------------------------------------------------------------------
# the torch reference against float64 naive attention

REF_CASES = [
    # B, Hq, Hkv, T, L, m, D
    (1, 1, 1, 1, 0, 1, 64),  # single query, no prefix
    (1, 4, 1, 7, 1, 7, 64),  # GQA 4, a one-token prefix
    (2, 8, 1, 7, 130, 12, 64),  # GQA 8, a draft level: the last 7 of 12 tree slots
    (1, 8, 2, 129, 65, 129, 32),  # T past two words of mask bits
    (1, 2, 2, 64, 0, 64, 128),  # m exactly one word, no prefix
    (1, 4, 4, 1, 4097, 1, 16),  # plain decoding over a long prefix
]


@pytest.mark.parametrize("B,Hq,Hkv,T,L,m,D", REF_CASES)
def test_reference_matches_naive_float64(B, Hq, Hkv, T, L, m, D):
    gen = torch.Generator().manual_seed(B + Hq + T + L + m + D)
    q, k, v = make_case(B, Hq, Hkv, T, L, m, D, gen)
    dense = tree_rows(T, m, gen)
    scale = D**-0.5
    ref = naive_attention_f64(q, k, v, L, dense, scale)
    out = tree_attention(q, k, v, L, TreeMask.from_dense(dense), backend="torch")
    assert out.shape == (B, Hq, T, D) and out.dtype == torch.float32
    assert rel_err(out, ref) < 1e-5


def test_reference_random_mask_with_empty_rows_is_zero_without_prefix():
    gen = torch.Generator().manual_seed(7)
    q, k, v = make_case(1, 4, 2, 9, 0, 70, 64, gen)
    dense = torch.rand(9, 70, generator=gen) < 0.3
    dense[3] = False  # sees nothing at all
    ref = naive_attention_f64(q, k, v, 0, dense, 0.125)
    out = tree_attention(q, k, v, 0, TreeMask.from_dense(dense), scale=0.125, backend="torch")
    assert torch.all(out[:, :, 3] == 0)
    assert rel_err(out, ref) < 1e-5


def test_one_mask_object_across_calls_is_right_at_every_prefix_length_and_grouping():
    """The reference keeps its full mask on the TreeMask / RowPrefix between calls (one forward's layers build it
    once): a TreeMask reused at other prefix lengths and head groupings, and a RowPrefix reused with another
    tree mask (a drafter's levels), must each get the mask of that call, not the one kept."""
    from sequoia_opt.attention import RowPrefix

    gen = torch.Generator().manual_seed(11)
    dense = tree_rows(3, 3, gen)
    tree = TreeMask.from_dense(dense)
    for L, (Hq, Hkv) in [(5, (4, 2)), (5, (4, 2)), (9, (4, 2)), (9, (4, 4)), (5, (6, 2)), (0, (4, 2))]:
        q, k, v = make_case(2, Hq, Hkv, 3, L, 3, 8, gen)
        out = tree_attention(q, k, v, L, tree, backend="torch")
        assert rel_err(out, naive_attention_f64(q, k, v, L, dense, 8**-0.5)) < 1e-5, (L, Hq, Hkv)
    assert len(tree._reference) == 1  # one entry: the last call's
    F = 6
    valid = torch.ones(2, F, dtype=torch.bool)
    valid[1, [1, 4]] = False  # row 1 has two holes
    rows = RowPrefix(F, valid)
    q, k, v = make_case(2, 4, 2, 3, F, 3, 8, gen)
    for level in (tree, TreeMask.from_dense(tree_rows(3, 3, gen)), tree):  # another tree mask between, then back
        out = tree_attention(q, k, v, rows, level, backend="torch")
        keep = torch.cat([valid[1].nonzero().flatten(), torch.arange(F, F + 3)])
        alone = naive_attention_f64(q[1:], k[1:, :, keep], v[1:, :, keep], int(valid[1].sum()), level.dense, 8**-0.5)
        assert rel_err(out[1:], alone) < 1e-5
        assert rel_err(out[:1], naive_attention_f64(q[:1], k[:1], v[:1], F, level.dense, 8**-0.5)) < 1e-5


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 2e-2), (torch.float16, 5e-3)])
def test_reference_low_precision_within_tolerance_used_by_gpu_check(dtype, tol):
    """The GPU check's tolerances must admit torch's own low-precision attention on the same inputs."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = make_case(1, 8, 2, 7, 300, 7, 64, gen, dtype=dtype)
    dense = tree_rows(7, 7, gen)
    ref = naive_attention_f64(q, k, v, 300, dense, 0.125)
    out = tree_attention(q, k, v, 300, TreeMask.from_dense(dense), scale=0.125, backend="torch")
    assert out.dtype == dtype
    assert rel_err(out, ref) < tol / 2


# ------------------------------------------------------------------------------------------------------------
# the kernel's split-K + combine math, in torch


@pytest.mark.parametrize(
    "B,Hq,Hkv,T,L,m,D",
    [(1, 4, 1, 7, 0, 7, 32), (1, 8, 2, 5, 1, 9, 16), (2, 4, 2, 3, 4097, 3, 16), (1, 2, 1, 129, 200, 129, 16)],
)
@pytest.mark.parametrize("num_sms", [1, 8, 132])
def test_split_k_reference_matches_naive(B, Hq, Hkv, T, L, m, D, num_sms):
    gen = torch.Generator().manual_seed(L + m + num_sms)
    q, k, v = make_case(B, Hq, Hkv, T, L, m, D, gen, dtype=torch.float64)
    dense = tree_rows(T, m, gen)
    splits, tps = ta_cuda.plan_splits(L + m, (Hq // Hkv) * T, B * Hkv, num_sms)
    out = ta_cuda.split_k_reference(q, k, v, L, dense, D**-0.5, splits, tps)
    ref = naive_attention_f64(q, k, v, L, dense, D**-0.5)
    assert rel_err(out, ref) < 1e-12


def test_split_k_reference_with_splits_that_see_nothing():
    """Splits holding only tree keys a row cannot see, and a row that sees nothing: weights 0, no NaN."""
    gen = torch.Generator().manual_seed(3)
    T, L, m, D = 4, 0, 200, 16
    q, k, v = make_case(1, 2, 1, T, L, m, D, gen, dtype=torch.float64)
    dense = torch.zeros(T, m, dtype=torch.bool)
    dense[0, 0] = True  # row 0 sees only slot 0 (split 0)
    dense[1, 199] = True  # row 1 sees only the last slot (last split)
    dense[2, ::50] = True
    # row 3 sees nothing
    out = ta_cuda.split_k_reference(q, k, v, L, dense, 0.25, num_splits=4, tiles_per_split=1)
    ref = naive_attention_f64(q, k, v, L, dense, 0.25)
    assert not torch.isnan(out).any()
    assert torch.all(out[:, :, 3] == 0)
    assert rel_err(out, ref) < 1e-12


@pytest.mark.parametrize("n_keys", [1, 63, 64, 65, 1000, 4097, 16384 + 256, 32768 + 256])
@pytest.mark.parametrize("rows", [1, 7, 64, 129, 2048])
@pytest.mark.parametrize("bkv", [1, 8, 64])
@pytest.mark.parametrize("num_sms", [1, 108, 132])
def test_plan_splits_covers_keys_without_empty_splits(n_keys, rows, bkv, num_sms):
    splits, tps = ta_cuda.plan_splits(n_keys, rows, bkv, num_sms)
    n_tiles = -(-n_keys // ta_cuda.BLOCK_N)
    assert splits >= 1 and tps >= 1
    assert tps * (splits - 1) < n_tiles <= tps * splits
    if splits > 1:
        assert tps >= 2  # at least min_tiles_per_split tiles each
    # the grid stays near two blocks per SM (or the keys run out)
    blocks = splits * -(-rows // ta_cuda.BLOCK_M) * bkv
    assert blocks <= max(2 * num_sms + 2 * -(-rows // ta_cuda.BLOCK_M) * bkv, -(-rows // ta_cuda.BLOCK_M) * bkv)


def test_plan_splits_llama3_8b_shape_fills_h200():
    # 32 query heads / 8 KV heads, n = 64 tree tokens, L = 4096: 4 row tiles x 8 heads = 32 blocks per split
    splits, tps = ta_cuda.plan_splits(4096 + 64, 4 * 64, 8, 132)
    assert splits * 32 >= 132 and tps * 64 * splits >= 4160


def test_plan_splits_rejects_nonpositive():
    with pytest.raises(ValueError):
        ta_cuda.plan_splits(0, 1, 1, 1)


# ------------------------------------------------------------------------------------------------------------
# backend selection on a machine without the kernel


def test_cuda_backend_unavailable_on_cpu_falls_back():
    if torch.cuda.is_available():
        pytest.skip("this test is about machines without CUDA")
    assert ta_cuda.is_available() is False  # never raises
    assert ta_cuda.unavailable_reason()
    gen = torch.Generator().manual_seed(0)
    q, k, v = make_case(1, 4, 2, 3, 5, 3, 64, gen, dtype=torch.bfloat16)
    tm = causal_tree_mask(3)
    out = tree_attention(q, k, v, 5, tm)  # auto -> torch
    assert torch.equal(out, tree_attention_reference(q, k, v, 5, tm.dense, 64**-0.5))
    with pytest.raises(RuntimeError):
        tree_attention(q, k, v, 5, tm, backend="cuda")
    with pytest.raises(ValueError):
        ta_cuda.tree_attention_cuda(q, k, v, 5, tm, 0.125)  # CPU tensors


def test_unsupported_reason_names_the_problem():
    q = torch.zeros(1, 4, 2, 96)
    k = torch.zeros(1, 2, 8, 96)
    assert "cuda" in ta_cuda.unsupported_reason(q, k, k).lower()
    assert ta_cuda.supports(q, k, k) is False


def test_kernel_sources_present():
    kdir = ta_cuda.kernel_dir()
    for name in ("tree_attention.h", "tree_attention.cu", "tree_attention_binding.cpp"):
        assert (kdir / name).is_file(), name
    # the header's tile sizes are the planner's
    header = (kdir / "tree_attention.h").read_text()
    assert f"kBlockM = {ta_cuda.BLOCK_M};" in header and f"kBlockN = {ta_cuda.BLOCK_N};" in header


# ------------------------------------------------------------------------------------------------------------
# wrong-type arguments are refused at the entry points, with the type that was expected


def test_tree_attention_refuses_a_plain_tensor_as_mask():
    gen = torch.Generator().manual_seed(0)
    q, k, v = make_case(1, 4, 2, 3, 5, 3, 16, gen)
    dense = causal_tree_mask(3).dense
    with pytest.raises(TypeError, match=r"tree_attention takes tree_mask as a sequoia_opt.attention.TreeMask, "
                                        r"got torch.Tensor; build one .* with TreeMask.from_dense\(mask\)"):
        tree_attention(q, k, v, 5, dense)
    with pytest.raises(TypeError, match="got numpy.ndarray"):
        tree_attention(q, k, v, 5, dense.numpy())
    with pytest.raises(TypeError, match="tree_attention takes q as a torch.Tensor, got numpy.ndarray"):
        tree_attention(q.numpy(), k, v, 5, causal_tree_mask(3))
    out = tree_attention(q, k, v, 5, TreeMask.from_dense(dense))  # the remedy the message names works
    assert torch.equal(out, tree_attention_reference(q, k, v, 5, dense, 16**-0.5))


def test_dense_mask_entry_points_refuse_a_tree_mask_or_a_non_tensor():
    gen = torch.Generator().manual_seed(0)
    q, k, v = make_case(1, 4, 2, 3, 5, 3, 16, gen)
    tm = causal_tree_mask(3)
    with pytest.raises(TypeError, match="tree_attention_reference takes the dense .* got a TreeMask; pass its .dense"):
        tree_attention_reference(q, k, v, 5, tm, 0.25)
    with pytest.raises(ValueError, match="2-D bool"):  # a float mask would be added to the scores by SDPA
        tree_attention_reference(q, k, v, 5, tm.dense.float(), 0.25)
    with pytest.raises(TypeError, match="split_k_reference takes the dense .* got a TreeMask"):
        ta_cuda.split_k_reference(q, k, v, 5, tm, 0.25, 1, 1)
    with pytest.raises(TypeError, match="TreeMask.from_dense takes a .* got numpy.ndarray; convert it with "
                                        "torch.from_numpy"):
        TreeMask.from_dense(np.ones((2, 2), dtype=bool))
    with pytest.raises(TypeError, match="TreeMask.from_dense takes a .* got list"):
        TreeMask.from_dense([[True]])
    with pytest.raises(TypeError, match="got a TreeMask"):
        TreeMask.from_dense(tm)


def test_cuda_entry_point_refuses_a_plain_tensor_as_mask_before_anything_else():
    gen = torch.Generator().manual_seed(0)
    q, k, v = make_case(1, 4, 2, 3, 5, 3, 64, gen, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"tree_attention_cuda takes tree_mask as a .*TreeMask, got torch.Tensor; "
                                        r".*TreeMask.from_dense\(mask\)"):
        ta_cuda.tree_attention_cuda(q, k, v, 5, causal_tree_mask(3).dense, 0.125)


def test_resolve_backend_takes_a_device_or_its_name():
    from sequoia_opt.attention import resolve_backend

    assert resolve_backend("torch", "cpu") == resolve_backend("auto", torch.device("cpu")) == "torch"
    if not torch.cuda.is_available():
        assert resolve_backend("auto", "cpu") == "torch"
    with pytest.raises(TypeError, match="resolve_backend takes device as a torch.device or str, got int"):
        resolve_backend("auto", 0)


def test_transformer_forward_refuses_a_plain_tensor_as_mask_before_any_layer():
    from sequoia_opt.model import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny")).eval()
    cache = model.new_cache(8)
    calls = []
    handle = model.layers[0].register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with torch.inference_mode(), pytest.raises(TypeError, match=r"Transformer.forward takes tree_mask as a "
                                                                    r".*TreeMask, got torch.Tensor"):
            model(torch.tensor([[1, 2]]), torch.arange(2), cache=cache, cache_slots=torch.arange(2),
                  tree_mask=causal_tree_mask(2).dense)
    finally:
        handle.remove()
    assert calls == []  # refused before the first layer (and before any cache write)
    with torch.inference_mode():
        out = model(torch.tensor([[1, 2]]), torch.arange(2), cache=cache, cache_slots=torch.arange(2),
                    tree_mask=causal_tree_mask(2))
    assert out.shape == (1, 2, 256)
