"""GGUF loading on tiny files written here with gguf.GGUFWriter: dequantization per type, llama.cpp's Q/K row
permutation and its inverse, metadata -> config (rope scaling included), strictness, and logits equal to the
source model's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gguf  # a required dependency (pyproject.toml): missing, this file fails rather than skips
from gguf import GGMLQuantizationType as Q

from sequoia_opt.errors import CheckpointError
from sequoia_opt.model import ModelConfig, Transformer
from sequoia_opt.model.gguf_loader import (
    dequantize_tensor, hf_tensor_name, open_gguf, permute_qk, unpermute_qk)
from sequoia_opt.model.llama import apply_rotary, rope_inv_freq
from sequoia_opt.model.loaders import load_checkpoint, load_model_config

# -- helpers ---------------------------------------------------------------------------------------------------


def bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "o r", "1 2"]


def tiny_vocab() -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token_types) of a small byte-level BPE vocabulary with ChatML specials first."""
    tokens = SPECIALS + bytes_to_unicode() + [m.replace(" ", "") for m in MERGES]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, MERGES, types


def randomize(model: Transformer, seed: int) -> Transformer:
    """Fill every parameter from a seeded generator (norm weights around 1) so logits depend on all of them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.2 * noise)
    return model


def tiny_config(**kw) -> ModelConfig:
    base = dict(vocab_size=len(tiny_vocab()[0]), dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                intermediate_size=128, max_position_embeddings=256, norm_eps=1e-5, rope_theta=10000.0,
                name="tiny")
    base.update(kw)
    return ModelConfig(**base)


GGUF_NAMES = {v: k for k, v in {
    "token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight"}.items()}
BLOCK = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "input_layernorm": "attn_norm",
         "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str:
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    _, i, rest = hf.split(".", 2)
    mod, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{BLOCK[mod]}.{kind}"


def qtype_for(name: str) -> Q:
    """A mix of types: norms and biases F32, embeddings F16, attention Q8_0, MLP alternating F16 / Q8_0."""
    if name.endswith("norm.weight") or name.endswith(".bias"):
        return Q.F32
    if "embed" in name or "lm_head" in name:
        return Q.F16
    if "self_attn" in name:
        return Q.Q8_0
    return Q.F16 if "layers.0." in name else Q.Q8_0


def add_tiny_tokenizer(w, pre: str, *, add_bos: bool | None, model: str = "gpt2", pad_id: int | None = None) -> None:
    """Write :func:`tiny_vocab` as ``w``'s tokenizer metadata (BOS 1, EOS 2); ``add_bos`` / ``pad_id`` None write no
    ``tokenizer.ggml.add_bos_token`` / pad id."""
    tokens, merges, types = tiny_vocab()
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if pad_id is not None:
        w.add_pad_token_id(pad_id)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)


def roundtrip(arr: np.ndarray, q: Q) -> np.ndarray:
    return gguf.quants.dequantize(gguf.quants.quantize(arr, q), q).reshape(arr.shape)


def write_gguf(path, model: Transformer, *, arch: str = "llama", permute: bool = True, pre: str = "smollm",
               drop: str | None = None, extra: str | None = None, rope_freqs: np.ndarray | None = None,
               linear_factor: float | None = None, tokenizer_model: str = "gpt2", rope_dim: int | None = None,
               edit=None) -> dict[str, np.ndarray]:
    """Write ``model`` as a GGUF the way llama.cpp's converter does; return the HF-layout weights as the
    loader should reconstruct them (after quantization). ``rope_dim`` overrides ``rope.dimension_count``;
    ``edit(writer)`` adds metadata; ``rope_freqs`` is stored as F32 unless given as float16."""
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    w.add_block_count(c.n_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.dim)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.norm_eps)
    w.add_rope_dimension_count(c.head_dim if rope_dim is None else rope_dim)
    if edit is not None:
        edit(w)
    if linear_factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(linear_factor)
    add_tiny_tokenizer(w, pre, add_bos=False, model=tokenizer_model, pad_id=0)
    expected = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_embeddings:
            continue
        arr = t.detach().float().numpy().copy()
        q = qtype_for(name)
        expected[name] = roundtrip(arr, q) if q != Q.F32 else arr
        if permute and ".q_proj." in name:
            arr = permute_qk(arr, c.n_heads)
        elif permute and ".k_proj." in name:
            arr = permute_qk(arr, c.n_kv_heads)
        if name == drop:
            continue
        if q == Q.F32:
            w.add_tensor(gguf_name(name), arr.astype(np.float32))
        elif q == Q.F16:
            w.add_tensor(gguf_name(name), arr.astype(np.float16))
        else:
            w.add_tensor(gguf_name(name), gguf.quants.quantize(arr, q), raw_dtype=q)
    if extra:
        w.add_tensor(extra, np.zeros(c.dim, dtype=np.float32))
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs if rope_freqs.dtype == np.float16 else
                     rope_freqs.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def reference(config: ModelConfig, weights: dict[str, np.ndarray]) -> Transformer:
    ref = Transformer(config)
    if config.tie_embeddings:
        weights = {**weights, "lm_head.weight": weights["embed_tokens.weight"]}
    ref.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()}, strict=True)
    return ref.eval()


TOKENS = torch.tensor([[5, 17, 42, 100, 200, 7, 3, 260, 33, 1]])


# -- dequantization per type -----------------------------------------------------------------------------------

def _pack_q4_k(d, dmin, sc, m, q):
    """ggml block_q4_K (ggml-common.h): d, dmin (f16), 12 bytes of 6-bit scales/mins, 128 bytes of nibbles.
    sc, m: (8,) ints < 64; q: (8, 32) ints < 16. Layout from ggml-quants.c get_scale_min_k4 /
    dequantize_row_q4_K; value = d * sc[j] * q[j] - dmin * m[j]."""
    scales = np.zeros(12, dtype=np.uint8)
    for j in range(4):
        scales[j] = sc[j] & 63
        scales[j + 4] = m[j] & 63
    for j in range(4, 8):
        scales[j + 4] = (sc[j] & 0xF) | ((m[j] & 0xF) << 4)
        scales[j - 4] |= (sc[j] >> 4) << 6
        scales[j] |= (m[j] >> 4) << 6
    qs = np.zeros(128, dtype=np.uint8)
    for p in range(4):
        qs[32 * p:32 * p + 32] = q[2 * p] | (q[2 * p + 1] << 4)
    return np.concatenate([np.array([d, dmin], dtype=np.float16).view(np.uint8), scales, qs])


def _pack_q6_k(d, sc, q):
    """ggml block_q6_K: ql (128 B, low nibbles), qh (64 B, high 2 bits), 16 int8 scales, d (f16).
    q: (256,) ints in [0, 64), value = d * sc[i // 16] * (q - 32). Layout from dequantize_row_q6_K."""
    ql = np.zeros(128, dtype=np.uint8)
    qh = np.zeros(64, dtype=np.uint8)
    for half in range(2):
        y, L, H = q[128 * half:128 * half + 128], ql[64 * half:64 * half + 64], qh[32 * half:32 * half + 32]
        for l in range(32):
            q1, q2, q3, q4 = y[l], y[l + 32], y[l + 64], y[l + 96]
            L[l] = (q1 & 0xF) | ((q3 & 0xF) << 4)
            L[l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4)
            H[l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
    return np.concatenate([ql, qh, np.asarray(sc, dtype=np.int8).view(np.uint8),
                           np.array([d], dtype=np.float16).view(np.uint8)])


def test_dequantize_each_type_through_a_gguf_file(tmp_path):
    rng = np.random.default_rng(0)
    rows, cols = 3, 512  # non-square, several blocks per row; GGUF stores the shape as (512, 3)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    w.add_tensor("f32", x)
    w.add_tensor("f16", x.astype(np.float16))
    for q in (Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1):
        w.add_tensor(q.name.lower(), gguf.quants.quantize(x, q), raw_dtype=q)
    # K-quants: gguf has no quantizer; pack known integers and scales by ggml's block layout instead
    nb = rows * cols // 256
    k4 = [(float(rng.uniform(0.01, 0.1)), float(rng.uniform(0.01, 0.1)), rng.integers(0, 64, 8),
           rng.integers(0, 64, 8), rng.integers(0, 16, (8, 32))) for _ in range(nb)]
    k6 = [(float(rng.uniform(0.01, 0.1)), rng.integers(-128, 128, 16), rng.integers(0, 64, 256))
          for _ in range(nb)]
    w.add_tensor("q4_k", np.stack([_pack_q4_k(*b) for b in k4]).reshape(rows, -1), raw_dtype=Q.Q4_K)
    w.add_tensor("q6_k", np.stack([_pack_q6_k(*b) for b in k6]).reshape(rows, -1), raw_dtype=Q.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    f16 = lambda v: float(np.float16(v))  # noqa: E731  (scales are stored as f16)
    exp_k4 = np.concatenate([np.concatenate([f16(d) * sc[j] * q[j] - f16(dm) * m[j] for j in range(8)])
                             for d, dm, sc, m, q in k4]).reshape(rows, cols)
    exp_k6 = np.concatenate([f16(d) * np.repeat(sc, 16) * (q.astype(np.float64) - 32) for d, sc, q in k6])
    exp_k6 = exp_k6.reshape(rows, cols)
    amax = np.abs(x).reshape(rows, -1, 32).max(-1, keepdims=True)
    spread = np.ptp(x.reshape(rows, -1, 32), axis=-1, keepdims=True)
    blockwise = lambda err: err.reshape(rows, -1, 32)  # noqa: E731

    got = {t.name: dequantize_tensor(t) for t in open_gguf(tmp_path / "q.gguf").tensors}
    for name, arr in got.items():
        assert arr.shape == (rows, cols) and arr.dtype == np.float32, name
    np.testing.assert_array_equal(got["f32"], x)
    np.testing.assert_allclose(got["f16"], x, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(got["bf16"], x, rtol=8e-3, atol=1e-6)
    # Q8_0: 32-value blocks, scale amax/127 (f16); error at most half a step plus f16 rounding
    assert (blockwise(np.abs(got["q8_0"] - x)) <= amax / 127 * 0.5 + amax * 2e-3).all()
    # Q4_0: levels -8..7 times amax/8 (sign of the extreme): half a step, or one step where the opposite
    # extreme is clipped at +7
    assert (blockwise(np.abs(got["q4_0"] - x)) <= amax / 8 + amax * 4e-3).all()
    assert np.abs(got["q4_0"] - x).mean() < (amax / 8).mean() * 0.3
    # Q4_1: 16 levels between min and max
    assert (blockwise(np.abs(got["q4_1"] - x)) <= spread / 15 * 0.5 + spread * 4e-3).all()
    np.testing.assert_allclose(got["q4_k"], exp_k4, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["q6_k"], exp_k6, rtol=1e-5, atol=1e-6)


# -- llama.cpp Q/K permutation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("n_head,head_dim,cols", [(4, 8, 16), (3, 64, 5), (1, 2, 3), (2, 16, 0)])
def test_unpermute_inverts_llama_cpp_permute(n_head, head_dim, cols):
    g = torch.Generator().manual_seed(n_head * 100 + head_dim)
    shape = (n_head * head_dim, cols) if cols else (n_head * head_dim,)  # weight or bias
    w = torch.randn(shape, generator=g)
    p = permute_qk(w, n_head)
    assert p.shape == w.shape
    assert torch.equal(p, w) == (head_dim == 2)  # a head of one rotary pair is left as is
    assert torch.equal(unpermute_qk(p, n_head), w)
    assert np.array_equal(unpermute_qk(permute_qk(w.numpy(), n_head), n_head), w.numpy())


def test_permutation_maps_rotate_half_to_interleaved_rotary():
    """What the permutation is for: HF's rotate-half rotary on W equals llama.cpp's interleaved-pair rotary on
    permute(W), up to the same row order. So un-permuting is right, not merely invertible."""
    n_head, hd, dim, T = 3, 8, 12, 5
    g = torch.Generator().manual_seed(1)
    W, x = torch.randn(n_head * hd, dim, generator=g), torch.randn(T, dim, generator=g)
    cfg = ModelConfig(vocab_size=8, dim=n_head * hd, n_layers=1, n_heads=n_head, n_kv_heads=n_head,
                      intermediate_size=8)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * rope_inv_freq(cfg)  # (T, hd/2)
    q_hf = (x @ W.T).view(T, n_head, hd).transpose(0, 1)[None]  # (1, H, T, hd)
    rot_hf = apply_rotary(q_hf, ang.cos()[None, None], ang.sin()[None, None])[0]  # (H, T, hd)
    q_gg = (x @ permute_qk(W, n_head).T).view(T, n_head, hd // 2, 2)  # pairs (2i, 2i+1)
    a, b = q_gg[..., 0], q_gg[..., 1]
    c, s = ang.cos()[:, None], ang.sin()[:, None]
    rot_gg = torch.stack([a * c - b * s, a * s + b * c], -1).reshape(T, n_head * hd)  # ggml rope "norm" mode
    expected = permute_qk(rot_hf.transpose(0, 1).reshape(T, n_head * hd).T, n_head).T
    torch.testing.assert_close(rot_gg, expected, rtol=1e-5, atol=1e-5)


def test_tensor_name_mapping():
    assert hf_tensor_name("token_embd.weight") == "embed_tokens.weight"
    assert hf_tensor_name("blk.12.attn_q.bias") == "layers.12.self_attn.q_proj.bias"
    assert hf_tensor_name("blk.0.ffn_down.weight") == "layers.0.mlp.down_proj.weight"
    assert hf_tensor_name("blk.0.attn_norm.weight") == "layers.0.input_layernorm.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("blk.0.ffn_gate_exps.weight") is None


# -- whole files -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tied,n_kv", [(True, 2), (False, 1), (False, 4)])
def test_gguf_llama_logits_match_source_model(tmp_path, tied, n_kv):
    cfg = tiny_config(tie_embeddings=tied, n_kv_heads=n_kv)
    src = randomize(Transformer(cfg), seed=3).eval()
    expected = write_gguf(tmp_path / "m.gguf", src)
    model, tok = load_checkpoint(tmp_path / "m.gguf")
    assert model.config == cfg.with_(name="m")
    assert (model.lm_head.weight is model.embed_tokens.weight) == tied
    assert tok.vocab_size == cfg.vocab_size and tok.bos_id == 1 and 2 in tok.eos_ids
    with torch.no_grad():
        got = model(TOKENS)
        torch.testing.assert_close(got, reference(cfg, expected)(TOKENS), rtol=1e-4, atol=1e-4)
        # and close to the unquantized source (Q8_0 / F16 error only)
        assert (got - src(TOKENS)).abs().mean() < 0.05 * src(TOKENS).abs().mean()  # measured ~0.02


def test_gguf_qwen2_bias_not_permuted(tmp_path):
    cfg = tiny_config(attention_bias=True, tie_embeddings=True, rope_theta=1000000.0, norm_eps=1e-6)
    src = randomize(Transformer(cfg), seed=4).eval()
    expected = write_gguf(tmp_path / "q.gguf", src, arch="qwen2", permute=False, pre="qwen2")
    model, _ = load_checkpoint(tmp_path / "q.gguf", dtype=torch.float64)
    assert model.config.attention_bias and model.dtype == torch.float64
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS).float(), reference(cfg, expected)(TOKENS), rtol=1e-4, atol=1e-4)


def test_gguf_permuted_llama_q_k_bias_is_unpermuted(tmp_path):
    cfg = tiny_config(attention_bias=True)
    src = randomize(Transformer(cfg), seed=5).eval()
    expected = write_gguf(tmp_path / "b.gguf", src, arch="llama", permute=True)
    model, _ = load_checkpoint(tmp_path / "b.gguf")
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), reference(cfg, expected)(TOKENS), rtol=1e-4, atol=1e-4)


def test_gguf_strict_missing_and_unexpected(tmp_path):
    src = randomize(Transformer(tiny_config()), seed=6)
    write_gguf(tmp_path / "a.gguf", src, drop="layers.1.mlp.up_proj.weight")
    with pytest.raises(CheckpointError, match=r"missing tensor.*layers\.1\.mlp\.up_proj\.weight"):
        load_checkpoint(tmp_path / "a.gguf")
    write_gguf(tmp_path / "b.gguf", src, extra="blk.0.attn_sinks.weight")
    with pytest.raises(CheckpointError, match=r"unexpected tensor blk\.0\.attn_sinks\.weight"):
        load_checkpoint(tmp_path / "b.gguf")
    write_gguf(tmp_path / "c.gguf", src, pre="no-such-pre")
    with pytest.raises(CheckpointError, match="no-such-pre"):
        load_checkpoint(tmp_path / "c.gguf")
    write_gguf(tmp_path / "d.gguf", src, tokenizer_model="bert")
    with pytest.raises(CheckpointError, match="tokenizer model 'bert'"):
        load_checkpoint(tmp_path / "d.gguf")
    (tmp_path / "e.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match=r"e.gguf as GGUF: not a GGUF file \(it does not start with GGUF\)"):
        load_checkpoint(tmp_path / "e.gguf")
    # cut short: gguf's own error is numpy's ("index 0 is out of bounds ..."), said as what it means
    (tmp_path / "f.gguf").write_bytes((tmp_path / "a.gguf").read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=r"f.gguf as GGUF: truncated or corrupt \(1000 bytes; gguf says"):
        load_checkpoint(tmp_path / "f.gguf")


def test_gguf_rope_scaling_from_metadata_and_rope_freqs(tmp_path):
    cfg = tiny_config(dim=128, n_heads=4, n_kv_heads=2, rope_theta=500000.0, max_position_embeddings=131072)
    src = Transformer(cfg)
    write_gguf(tmp_path / "lin.gguf", src, linear_factor=4.0)
    assert load_model_config(tmp_path / "lin.gguf").rope_scaling == {"rope_type": "linear", "factor": 4.0}
    for factor in (8.0, 32.0):
        scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
        # convert_hf_to_gguf.py stores the divisors base_inv_freq / scaled_inv_freq as rope_freqs.weight
        divisors = (rope_inv_freq(cfg).double() / rope_inv_freq(cfg.with_(rope_scaling=scaling)).double()).numpy()
        assert divisors.min() == 1.0 and divisors.max() == factor  # the test spans all three bands
        write_gguf(tmp_path / "l3.gguf", src, rope_freqs=divisors)
        got = load_model_config(tmp_path / "l3.gguf")
        assert got.rope_scaling == scaling
        model, _ = load_checkpoint(tmp_path / "l3.gguf")
        torch.testing.assert_close(model.inv_freq, rope_inv_freq(cfg.with_(rope_scaling=scaling)))


def test_rope_inv_freq_against_hand_computed_values():
    cfg = tiny_config(dim=64, n_heads=4, rope_theta=500000.0)  # head_dim 16: 8 frequencies
    base = [1.0 / 500000.0 ** (2 * i / 16) for i in range(8)]
    lin = rope_inv_freq(cfg.with_(rope_scaling={"rope_type": "linear", "factor": 4.0}))
    torch.testing.assert_close(lin, torch.tensor([f / 4.0 for f in base]), rtol=1e-6, atol=0)
    sc = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    want = []
    for f in base:  # Meta's apply_scaling, written out
        wavelen = 2 * math.pi / f
        if wavelen < 8192 / 4.0:
            want.append(f)
        elif wavelen > 8192 / 1.0:
            want.append(f / 8.0)
        else:
            smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
            want.append((1 - smooth) * f / 8.0 + smooth * f)
    bands = {("high" if 2 * math.pi / f < 2048 else "low" if 2 * math.pi / f > 8192 else "mid") for f in base}
    assert bands == {"high", "mid", "low"}
    torch.testing.assert_close(rope_inv_freq(cfg.with_(rope_scaling=sc)), torch.tensor(want), rtol=1e-6, atol=0)
    torch.testing.assert_close(rope_inv_freq(cfg), torch.tensor(base), rtol=1e-6, atol=0)


# -- every rope key and rope_freqs, as llama.cpp applies them -------------------------------------------------
# llama.cpp (src/llama-model.cpp load_hparams, src/llama-context.cpp, ggml-cpu ops.cpp ggml_rope_cache_init /
# rope_yarn) rotates pair i at position p by p * freq_scale * base^(-2i/n_rot) / freq_factors[i], with
# freq_scale = 1 / rope.scaling.factor (type defaults to linear; type none forces 1; factor 0 means 1).

def expected_inv_freq(theta: float, head_dim: int, divisors) -> torch.Tensor:
    """(head_dim / 2,) float64 base^(-2i/d) / divisors[i], written out here independently of rope_inv_freq."""
    return torch.tensor([theta ** (-2 * i / head_dim) / float(divisors[i]) for i in range(head_dim // 2)],
                        dtype=torch.float64)


FREQ_FACTORS = np.array([1.0, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 0.5])  # exact in float32; head_dim 16


@pytest.mark.parametrize("ones", [True, False])
def test_gguf_linear_factor_and_rope_freqs_both_apply(tmp_path, ones):
    """The reported bug: linear factor 4 plus a rope_freqs tensor loaded with no scaling at all."""
    cfg = tiny_config(rope_theta=500000.0)
    hd = cfg.head_dim
    ff = np.ones(hd // 2) if ones else FREQ_FACTORS
    src = randomize(Transformer(cfg), seed=7).eval()
    weights = write_gguf(tmp_path / "m.gguf", src, linear_factor=4.0, rope_freqs=ff)
    want = expected_inv_freq(500000.0, hd, 4.0 * ff)  # base^(-2i/d) / (factor * ff_i)
    model, _ = load_checkpoint(tmp_path / "m.gguf")
    torch.testing.assert_close(model.inv_freq.double(), want, rtol=1e-6, atol=0)
    got = load_model_config(tmp_path / "m.gguf")
    assert got.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    assert got.rope_freq_factors == (None if ones else tuple(FREQ_FACTORS))
    # logits: the same weights built from a ModelConfig with that rope setup, and with the rotary buffer
    # overwritten by the frequencies computed above
    built = reference(cfg.with_(rope_scaling={"rope_type": "linear", "factor": 4.0},
                                rope_freq_factors=None if ones else tuple(FREQ_FACTORS)), weights)
    by_hand = reference(cfg, weights)
    by_hand.inv_freq = want.float()
    unscaled = reference(cfg, weights)
    with torch.no_grad():
        out = model(TOKENS)
        torch.testing.assert_close(out, built(TOKENS), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out, by_hand(TOKENS), rtol=1e-5, atol=1e-5)
        assert (out - unscaled(TOKENS)).abs().max() > 1e-2  # the scaling shows in the logits


@pytest.mark.parametrize("edit,divisor", [
    (lambda w: w.add_rope_scaling_factor(4.0), 4.0),  # no type: llama.cpp defaults to linear
    (lambda w: w.add_float32("llama.rope.scale_linear", 2.0), 2.0),  # the old key name
    (lambda w: (w.add_rope_scaling_type(gguf.RopeScalingType.NONE), w.add_rope_scaling_factor(4.0)), 1.0),
    (lambda w: (w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR), w.add_rope_scaling_factor(0.0)), 1.0),
    (lambda w: (w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR), w.add_rope_scaling_factor(2.0),
                w.add_rope_scaling_orig_ctx_len(1024), w.add_rope_scaling_finetuned(True),
                w.add_rope_scaling_attn_factors(1.0)), 2.0),  # YaRN-only and no-op keys: no effect
], ids=["factor-without-type", "scale_linear", "type-none", "factor-0", "no-op-keys"])
def test_gguf_rope_keys_applied_as_llama_cpp(tmp_path, edit, divisor):
    cfg = tiny_config(rope_theta=10000.0)
    write_gguf(tmp_path / "m.gguf", Transformer(cfg), edit=edit)
    model, _ = load_checkpoint(tmp_path / "m.gguf")
    want = expected_inv_freq(10000.0, cfg.head_dim, [divisor] * (cfg.head_dim // 2))
    torch.testing.assert_close(model.inv_freq.double(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("kw,key", [
    (dict(edit=lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.YARN)), "llama.rope.scaling.type = 'yarn'"),
    (dict(edit=lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)),
     "llama.rope.scaling.type = 'longrope'"),
    (dict(edit=lambda w: w.add_string("llama.rope.scaling.type", "ntk")), "llama.rope.scaling.type = 'ntk'"),
    (dict(edit=lambda w: w.add_rope_scaling_attn_factors(0.5)), "llama.rope.scaling.attn_factor = 0.5"),
    (dict(edit=lambda w: w.add_rope_scaling_factor(-2.0)), "llama.rope.scaling.factor = -2.0"),
    (dict(edit=lambda w: w.add_rope_scaling_yarn_log_mul(0.1)), "llama.rope.scaling.yarn_log_multiplier = 0.1"),
    (dict(edit=lambda w: w.add_rope_freq_base_swa(10000.0)), "llama.rope.freq_base_swa = 10000.0"),
    (dict(rope_dim=8), "llama.rope.dimension_count = 8"),
    (dict(rope_freqs=FREQ_FACTORS.astype(np.float16)), "rope_freqs.weight has type F16"),
    (dict(rope_freqs=np.array([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])), "rope_freqs.weight holds non-positive"),
    (dict(rope_freqs=FREQ_FACTORS, arch="qwen2", permute=False, pre="qwen2"), "rope_freqs.weight in a 'qwen2'"),
    (dict(edit=lambda w: w.add_string("llama.rope.scaling.factor", "4")), "llama.rope.scaling.factor = '4' must be "
                                                                          "a number"),
    (dict(theta=0.0), "llama.rope.freq_base = 0.0 must be a positive finite number"),
    (dict(theta=-10000.0), "llama.rope.freq_base = -10000.0 must be a positive finite number"),
    (dict(theta=float("nan")), "llama.rope.freq_base = nan must be a positive finite number"),
])
def test_gguf_unsupported_rope_setting_refused_in_one_line(tmp_path, kw, key):
    theta = kw.pop("theta", None)
    if theta is not None:  # written through a config whose base is what llama.cpp would be given
        import dataclasses
        model = Transformer(tiny_config())
        model.config = dataclasses.replace(model.config, rope_theta=theta)
        write_gguf(tmp_path / "m.gguf", model, **kw)
    else:
        write_gguf(tmp_path / "m.gguf", Transformer(tiny_config()), **kw)
    for load in (load_model_config, load_checkpoint):
        with pytest.raises(CheckpointError) as err:
            load(tmp_path / "m.gguf")
        assert key in str(err.value) and "\n" not in str(err.value)


def test_gguf_rope_freqs_not_matching_llama3_apply_as_stored(tmp_path):
    """Divisors near, but not exactly, Llama 3 scaling are applied as stored (llama.cpp reads them as they are),
    not snapped to the nearest Llama 3 parameters."""
    cfg = tiny_config(dim=128, n_heads=4, rope_theta=500000.0)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    divisors = (rope_inv_freq(cfg).double() / rope_inv_freq(cfg.with_(rope_scaling=scaling)).double()).numpy()
    divisors[-1] *= 1.001
    write_gguf(tmp_path / "m.gguf", Transformer(cfg), rope_freqs=divisors)
    got = load_model_config(tmp_path / "m.gguf")
    assert got.rope_scaling is None and got.rope_freq_factors == tuple(divisors.astype(np.float32).tolist())
    model, _ = load_checkpoint(tmp_path / "m.gguf")
    want = expected_inv_freq(500000.0, cfg.head_dim, divisors.astype(np.float32))
    torch.testing.assert_close(model.inv_freq.double(), want, rtol=1e-6, atol=0)


def _tokenizer_gguf(path, pre: str, add_bos: bool | None, add_eos: bool | None = None):
    """A metadata-only GGUF of the tiny vocabulary with ``tokenizer.ggml.pre = pre``; ``add_bos`` / ``add_eos``
    None write no ``tokenizer.ggml.add_bos_token`` (as many converted Llama 3 files) / ``add_eos_token``."""
    w = gguf.GGUFWriter(str(path), "llama")
    add_tiny_tokenizer(w, pre, add_bos=add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("pre, add_bos, bos_first", [
    ("llama-bpe", None, True), ("llama3", None, True),  # llama.cpp's LLAMA3 pre-type adds BOS by default
    ("llama-bpe", False, False), ("smollm", None, False), ("qwen2", None, False), ("smaug-bpe", None, False),
    ("smollm", True, True)])
def test_gguf_add_bos_default_follows_llama_cpp(tmp_path, pre, add_bos, bos_first):
    # checked against llama-cpp-python 0.3.x: Llama(vocab_only=True).tokenize(b"the", add_bos=True)
    from sequoia_opt.model.gguf_loader import tokenizer_from_gguf

    tok = tokenizer_from_gguf(open_gguf(_tokenizer_gguf(tmp_path / "t.gguf", pre, add_bos)))
    ids = tok.encode("the")
    assert ids[:1] == [1] if bos_first else ids[0] != 1
    assert ids[1 if bos_first else 0:] == [tok.token_to_id("t"), tok.token_to_id("he")]


@pytest.mark.parametrize("add_bos, want", [(True, [1, 119, 260, 2]), (False, [119, 260, 2])])
def test_gguf_add_eos_token_appends_eos_as_llama_cpp(tmp_path, add_bos, want):
    # llama-cpp-python 0.3.36, Llama(vocab_only=True).tokenize(b"the", add_bos=True) on this file: [1, 119, 260, 2]
    # (llama.cpp appends EOS to a BPE vocabulary's prompt where add_eos_token is true); treeopt read the key on the
    # SentencePiece path only, so its prompts lacked the EOS llama-server's had
    from sequoia_opt.model.gguf_loader import tokenizer_from_gguf

    tok = tokenizer_from_gguf(open_gguf(_tokenizer_gguf(tmp_path / "e.gguf", "smollm", add_bos, add_eos=True)))
    assert tok.encode("the") == want
    absent = tokenizer_from_gguf(open_gguf(_tokenizer_gguf(tmp_path / "t.gguf", "smollm", add_bos)))
    assert absent.encode("the") == want[:-1]  # no key: no EOS, llama.cpp's default


@pytest.mark.parametrize("pre", ["default", None])
def test_gguf_default_pre_tokenizer_is_llama_cpp_default_regex(tmp_path, pre):
    # llama.cpp runs its own default regex sequence (not GPT-2's) for pre "default" and for a file without the
    # key; its last step cuts digit runs into threes, so "5512" -> "551" "2" and the merge "1 2" cannot apply
    # (GPT-2's regex keeps "5512" whole: 5, 5, 12). Ids checked against llama-cpp-python 0.3.x.
    from sequoia_opt.model.gguf_loader import tokenizer_from_gguf
    from sequoia_opt.model.gguf_writer import gguf_pre_tokenizer

    path = _tokenizer_gguf(tmp_path / "t.gguf", "default", False)
    if pre is None:  # the same file without tokenizer.ggml.pre
        r = open_gguf(path)
        w = gguf.GGUFWriter(str(tmp_path / "n.gguf"), "llama")
        for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                    "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
            f = r.fields[key]
            w.add_key_value(key, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        path = tmp_path / "n.gguf"
    tok = tokenizer_from_gguf(open_gguf(path))
    t = tok.token_to_id
    assert tok.encode("5512") == [t("5"), t("5"), t("1"), t("2")]
    assert tok.encode("12 the") == [t("12"), t("Ġthe")]
    assert gguf_pre_tokenizer(tok) == "default"  # written back under the name llama.cpp reads the same way


def test_gguf_refusals_name_the_file_before_any_dequantization(tmp_path, monkeypatch):
    import sequoia_opt.model.gguf_loader as gl

    src = randomize(Transformer(tiny_config()), 0)
    write_gguf(tmp_path / "good.gguf", src)
    r = open_gguf(tmp_path / "good.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "i32.gguf"), "llama")  # the same file, the last layer's up_proj as I32
    for key, f in r.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            w.add_key_value(key, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
    for t in r.tensors:
        plain = t.tensor_type in (Q.F32, Q.F16)
        arr = (np.zeros(tuple(reversed(t.shape.tolist())), np.int32) if t.name == "blk.1.ffn_up.weight"
               else np.asarray(t.data))
        w.add_tensor(t.name, arr, raw_dtype=None if plain or arr.dtype == np.int32 else t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    calls = []
    real = gl.dequantize_tensor
    monkeypatch.setattr(gl, "dequantize_tensor", lambda t: calls.append(t.name) or real(t))
    with pytest.raises(CheckpointError, match=r"i32\.gguf: tensor blk\.1\.ffn_up\.weight: quantization I32 is not "
                                              r"supported$"):
        load_checkpoint(tmp_path / "i32.gguf")
    assert calls == []  # refused up front, not after dequantizing the tensors before it
    write_gguf(tmp_path / "gemma.gguf", src, arch="gemma")
    with pytest.raises(CheckpointError, match=r"gemma\.gguf: unsupported GGUF architecture 'gemma'"):
        load_checkpoint(tmp_path / "gemma.gguf")
    write_gguf(tmp_path / "wpm.gguf", src, tokenizer_model="bert")
    with pytest.raises(CheckpointError, match=r"wpm\.gguf: unsupported GGUF tokenizer model 'bert'"):
        load_checkpoint(tmp_path / "wpm.gguf")


def test_gguf_chat_renders_a_sentencepiece_ggufs_template_without_rebuilding_its_tokenizer(tmp_path):
    """tune --engine llama.cpp renders chat prompts with the GGUF's template and lets llama.cpp tokenize them; it
    rebuilt treeopt's tokenizer to do so, and that refuses a SentencePiece vocabulary ('llama': Llama 2, Mistral,
    TinyLlama GGUFs), which llama.cpp runs: every chat prompt file was refused for those models. Rendering needs the
    template and the BOS/EOS token text alone."""
    from sequoia_opt.model.gguf_loader import gguf_chat, tokenizer_from_gguf
    from sequoia_opt.prompts import Prompt, prompt_texts

    w = gguf.GGUFWriter(str(tmp_path / "spm.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "▁hi"] + [f"<0x{b:02X}>" for b in range(256)])  # byte tokens: what
    # llama.cpp writes a character outside the vocabulary with (treeopt refuses a vocabulary without them)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader = open_gguf(tmp_path / "spm.gguf")
    chat = gguf_chat(reader)
    msgs = [{"role": "user", "content": "hi"}]
    assert tokenizer_from_gguf(reader).render_chat(msgs) == "<s>[INST] hi [/INST]"  # treeopt's own rebuild agrees
    assert chat.render_chat(msgs) == "<s>[INST] hi [/INST]"
    assert prompt_texts([Prompt(text="raw"), Prompt(text="", messages=tuple(msgs))], chat) == ["raw", "<s>[INST] hi [/INST]"]


@pytest.mark.parametrize("model, tokens, merges, bos, eos", [
    ("gpt2", [chr(33 + i) for i in range(14)] + ['!"'], ['! "'], ",", ","),  # llama.cpp's BPE default: id 11 for both
    ("llama", ["<unk>", "<s>", "</s>", "▁hi"], None, "<s>", "</s>"),  # SentencePiece: 1 and 2
])
def test_gguf_chat_takes_llama_cpps_default_bos_eos_ids_where_the_file_names_none(tmp_path, model, tokens, merges,
                                                                                 bos, eos):
    """gguf_chat read BOS / EOS only from tokenizer.ggml.bos/eos_token_id: a file without them rendered a template's
    bos_token as '', where llama.cpp (and tokenizer_from_gguf for BPE) uses its default ids (11; 1 and 2)."""
    from sequoia_opt.model.gguf_loader import gguf_chat, tokenizer_from_gguf

    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    if merges is not None:
        w.add_tokenizer_pre("default")
        w.add_token_merges(merges)
    w.add_chat_template("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}{{ eos_token }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader = open_gguf(tmp_path / "t.gguf")
    msgs = [{"role": "user", "content": "x"}]
    assert gguf_chat(reader).render_chat(msgs) == f"{bos}x{eos}"
    if model == "gpt2":  # treeopt's own tokenizer of the file agrees
        assert tokenizer_from_gguf(reader).render_chat(msgs) == f"{bos}x{eos}"


def _edited_tokenizer_gguf(path, src, drop=(), pre: str | None = None):
    """A copy of the metadata-only GGUF ``src`` without the keys in ``drop`` (and ``tokenizer.ggml.pre = pre``)."""
    r = open_gguf(src)
    w = gguf.GGUFWriter(str(path), "llama")
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        value = pre if key == "tokenizer.ggml.pre" and pre is not None else f.contents()
        w.add_key_value(key, value, f.types[0], f.types[-1] if len(f.types) > 1 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("pre, add_bos", [("llama-bpe", None), ("smollm", True)])
def test_gguf_without_bos_or_eos_id_takes_llama_cpps_default_id(tmp_path, pre, add_bos):
    # llama.cpp gives a gpt2 vocabulary BOS = EOS = 11 before reading the keys: a llama-bpe file without
    # tokenizer.ggml.bos_token_id starts every prompt with 11 (llama-cpp-python 0.3.36: tokenize(b"the",
    # add_bos=True) == [11, 119, 260], token_bos() == token_eos() == 11); treeopt added no BOS (or refused the
    # file: "asks for a BOS token but names none") and ended answers at no EOS of llama.cpp's
    from sequoia_opt.model.gguf_loader import tokenizer_from_gguf

    src = _tokenizer_gguf(tmp_path / "t.gguf", pre, add_bos)
    path = _edited_tokenizer_gguf(tmp_path / "n.gguf", src, drop=("tokenizer.ggml.bos_token_id",
                                                                  "tokenizer.ggml.eos_token_id"))
    tok = tokenizer_from_gguf(open_gguf(path))
    assert tok.bos_id == 11 and tok.eos_id == 11 and 11 in tok.eos_ids
    assert tok.encode("the") == [11, tok.token_to_id("t"), tok.token_to_id("he")] == [11, 119, 260]


def test_gguf_pre_gpt2_refused_as_llama_cpp_refuses_it(tmp_path):
    # llama.cpp: "error loading model vocabulary: unknown pre-tokenizer type: 'gpt2'" (its GPT-2 name is "gpt-2");
    # treeopt read the file as GPT-2 and profiled a pair llama-server cannot load
    src = _tokenizer_gguf(tmp_path / "t.gguf", "gpt-2", None)
    path = _edited_tokenizer_gguf(tmp_path / "g.gguf", src, pre="gpt2")
    src_model = randomize(Transformer(tiny_config()), 0)
    write_gguf(tmp_path / "m.gguf", src_model, pre="gpt2")
    with pytest.raises(CheckpointError, match=r"^\S*m\.gguf: GGUF tokenizer\.ggml\.pre = 'gpt2' is refused by "
                                              r"llama\.cpp \(unknown pre-tokenizer type\); its name for this "
                                              r"pre-tokenizer is 'gpt-2'$"):
        load_checkpoint(tmp_path / "m.gguf")
    from sequoia_opt.model.gguf_loader import tokenizer_from_gguf

    with pytest.raises(CheckpointError, match="tokenizer.ggml.pre = 'gpt2'"):
        tokenizer_from_gguf(open_gguf(path))
    assert tokenizer_from_gguf(open_gguf(src)).encode("the")  # "gpt-2" still reads


@pytest.mark.parametrize("edit, msg", [
    (lambda w: w.add_bos_token_id(100_000), "BOS id 100000 is outside the vocabulary of"),
    (lambda w: w.add_int32("tokenizer.ggml.eos_token_id", 2), "GGUF tokenizer.ggml.eos_token_id must be a uint32 "
                                                             "token id, got int32"),
    (lambda w: w.add_string("tokenizer.ggml.add_bos_token", "false"), "GGUF tokenizer.ggml.add_bos_token must be a "
                                                                      "bool, got string"),
    (lambda w: w.add_uint8("tokenizer.ggml.add_eos_token", 1), "GGUF tokenizer.ggml.add_eos_token must be a "
                                                               "bool, got uint8"),
])
def test_hostile_bpe_gguf_special_keys_are_one_error_naming_the_key(tmp_path, edit, msg):
    """The byte-level BPE path read its special ids and add_bos_token untyped, as the SentencePiece path did before
    it was hardened: a BOS id past the tokens was an IndexError, an int32 id was taken where llama.cpp refuses the
    file, and add_bos_token = "false" (a string) was read as true. Each is one CheckpointError naming the key."""
    from sequoia_opt.model.gguf_loader import tokenizer_from_gguf

    tokens, merges, types = tiny_vocab()
    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    edit(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError) as err:
        tokenizer_from_gguf(open_gguf(tmp_path / "t.gguf"))
    assert str(err.value).startswith(msg), str(err.value)
