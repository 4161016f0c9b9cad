"""Hugging Face directories: save/load round trip, sharded index, strict errors naming the tensor."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from sequoia_opt.errors import CheckpointError
from sequoia_opt.model import ModelConfig, Transformer
from sequoia_opt.model.build import expected_tensors
from sequoia_opt.model.hf import save_hf_checkpoint
from sequoia_opt.model.loaders import load_checkpoint, load_model_config
from sequoia_opt.model.tokenizer import bpe_tokenizer_from_vocab

try:  # shared helpers; tests/ is on sys.path under pytest's default import mode
    from test_loaders_gguf import expected_inv_freq, randomize, tiny_config, tiny_vocab
except ImportError:  # tests/ made a package
    from .test_loaders_gguf import expected_inv_freq, randomize, tiny_config, tiny_vocab

TOKENS = torch.tensor([[5, 17, 42, 100, 200, 7, 3, 260, 33, 1], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]])


def tiny_tokenizer():
    tokens, merges, types = tiny_vocab()
    return bpe_tokenizer_from_vocab(tokens, merges, token_types=types, pre="smollm", bos_id=1, eos_id=2)


def saved(tmp_path, seed=0, **cfg):
    model = randomize(Transformer(tiny_config(**cfg)), seed).eval()
    out = save_hf_checkpoint(model, tiny_tokenizer(), tmp_path / "ckpt")
    return model, out


@pytest.mark.parametrize("cfg", [
    dict(tie_embeddings=True),
    dict(tie_embeddings=False, n_kv_heads=1),
    dict(attention_bias=True, tie_embeddings=True, norm_eps=1e-6, rope_theta=1e6),  # Qwen2-style
    dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 64}),
    dict(head_dim=32),  # head_dim != dim / n_heads
])
def test_round_trip_identical_logits(tmp_path, cfg):
    model, out = saved(tmp_path, **cfg)
    files = sorted(p.name for p in out.iterdir())
    assert files == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"]
    stored = load_file(out / "model.safetensors")
    assert ("lm_head.weight" in stored) == (not model.config.tie_embeddings)  # tied weights stored once
    assert all(k.startswith("model.") for k in stored if k != "lm_head.weight")
    hf = json.loads((out / "config.json").read_text())
    assert hf["architectures"] == ["Qwen2ForCausalLM" if model.config.attention_bias else "LlamaForCausalLM"]
    loaded, tok = load_checkpoint(out)
    assert loaded.config == model.config
    assert load_model_config(out) == model.config
    assert (loaded.lm_head.weight is loaded.embed_tokens.weight) == model.config.tie_embeddings
    with torch.no_grad():
        assert torch.equal(loaded(TOKENS), model(TOKENS))
    assert tok.fingerprint() == tiny_tokenizer().fingerprint()
    assert tok.bos_id == 1 and tok.eos_id == 2 and tok.eos_ids == tiny_tokenizer().eos_ids


def test_load_dtype_and_parameters_are_fresh(tmp_path):
    model, out = saved(tmp_path, seed=1)
    loaded, _ = load_checkpoint(out, dtype=torch.bfloat16)
    assert loaded.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in loaded.parameters())
    assert loaded.inv_freq.dtype == torch.float32  # derived rotary buffer recomputed, not left uninitialised
    torch.testing.assert_close(loaded.inv_freq, model.inv_freq)
    n = sum(p.numel() for p in loaded.parameters())
    assert n == model.config.num_parameters()


def test_sharded_checkpoint_with_index(tmp_path):
    model, out = saved(tmp_path, seed=2, tie_embeddings=False)
    tensors = load_file(out / "model.safetensors")
    (out / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, out / fname)
        weight_map.update({k: fname for k in keys})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    loaded, _ = load_checkpoint(out)
    with torch.no_grad():
        assert torch.equal(loaded(TOKENS), model(TOKENS))
    # a shard that the index names but that is gone
    (out / "model-00002-of-00002.safetensors").rename(out / "elsewhere.bin")
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        load_checkpoint(out)
    # refuses to write a single file where an index would shadow it
    with pytest.raises(CheckpointError, match="sharded"):
        save_hf_checkpoint(model, tiny_tokenizer(), out)


def test_a_folder_with_both_a_single_file_and_an_index_is_refused(tmp_path):
    """transformers loads model.safetensors, vLLM the index's shards: treeopt read the shards silently."""
    model, out = saved(tmp_path, seed=2)
    tensors = load_file(out / "model.safetensors")
    save_file({k: v * 0.5 for k, v in tensors.items()}, out / "model-00001-of-00001.safetensors")
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in tensors}}))
    with pytest.raises(CheckpointError, match=re.escape(f"{out} holds both model.safetensors and "
                                                        "model.safetensors.index.json")):
        load_checkpoint(out)
    (out / "model.safetensors").unlink()  # the stale one removed: the shards load
    loaded, _ = load_checkpoint(out)
    assert torch.equal(loaded.embed_tokens.weight, model.embed_tokens.weight * 0.5)


def _rewrite(out, edit):
    tensors = load_file(out / "model.safetensors")
    edit(tensors)
    save_file(tensors, out / "model.safetensors")


def test_missing_tensor_is_named(tmp_path):
    _, out = saved(tmp_path)
    _rewrite(out, lambda t: t.pop("model.layers.1.self_attn.v_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) layers\.1\.self_attn\.v_proj\.weight"):
        load_checkpoint(out)


def test_unexpected_tensor_is_named(tmp_path):
    _, out = saved(tmp_path)
    _rewrite(out, lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": torch.zeros(64)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\) layers\.0\.self_attn\.o_proj\.bias"):
        load_checkpoint(out)


def test_shape_mismatch_is_named(tmp_path):
    _, out = saved(tmp_path)
    _rewrite(out, lambda t: t.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(96, 64)}))
    with pytest.raises(CheckpointError, match=r"layers\.0\.mlp\.up_proj\.weight \(checkpoint \(96, 64\), "
                                              r"model \(128, 64\)\)"):
        load_checkpoint(out)


def test_config_disagreeing_with_weights_is_a_shape_error(tmp_path):
    _, out = saved(tmp_path)
    cfg = json.loads((out / "config.json").read_text())
    cfg["num_key_value_heads"] = 4
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"shape mismatch.*k_proj\.weight"):
        load_checkpoint(out)


def test_tied_lm_head_present_must_equal_embedding(tmp_path):
    model, out = saved(tmp_path, tie_embeddings=True)
    _rewrite(out, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    loaded, _ = load_checkpoint(out)  # accepted: equal to the embedding
    assert loaded.lm_head.weight is loaded.embed_tokens.weight
    _rewrite(out, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1}))
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        load_checkpoint(out)


def test_untied_config_without_lm_head_is_missing(tmp_path):
    _, out = saved(tmp_path, tie_embeddings=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) lm_head\.weight"):
        load_checkpoint(out)


def test_bad_paths_and_files(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="neither"):
        load_checkpoint(tmp_path / "weights.bin")
    _, out = saved(tmp_path)
    (out / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer"):
        load_checkpoint(out)
    (out / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        load_model_config(out)


def test_unknown_architecture_refused(tmp_path):
    _, out = saved(tmp_path)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=re.escape(f"{out / 'config.json'}: names model_type 'gpt2': treeopt "
                                                        "loads llama, mistral, qwen2")):
        load_checkpoint(out)


def test_expected_tensors_tied_vs_untied():
    tied = expected_tensors(tiny_config(tie_embeddings=True))
    untied = expected_tensors(tiny_config(tie_embeddings=False))
    assert set(untied) - set(tied) == {"lm_head.weight"}
    assert tied["layers.0.self_attn.k_proj.weight"] == (2 * 16, 64)  # GQA: n_kv_heads * head_dim rows
    assert ModelConfig.preset("smollm2-135m").num_parameters() == sum(
        torch.Size(s).numel() for s in expected_tensors(ModelConfig.preset("smollm2-135m")).values())


# -- rotary settings in config.json: applied as transformers applies them, or refused in one line ------------

def _with_config(out, drop=(), **changes):
    cfg = json.loads((out / "config.json").read_text())
    for key in drop:
        cfg.pop(key, None)
    cfg.update(changes)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


@pytest.mark.parametrize("changes,drop,theta,divisor", [
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), (), 10000.0, 2.0),  # transformers 4, legacy "type"
    (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}),
     ("rope_theta", "rope_scaling"), 500000.0, 2.0),  # transformers 5: theta inside rope_parameters
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6}), ("rope_theta", "rope_scaling"), 1e6, 1.0),
], ids=["linear", "v5-linear", "v5-default"])
def test_hf_rope_settings_applied(tmp_path, changes, drop, theta, divisor):
    _, out = saved(tmp_path)
    _with_config(out, drop, **changes)
    model, _ = load_checkpoint(out)
    assert model.config.rope_theta == theta
    want = expected_inv_freq(theta, model.config.head_dim, [divisor] * (model.config.head_dim // 2))
    torch.testing.assert_close(model.inv_freq.double(), want, rtol=1e-6, atol=0)


def test_hf_rope_parameters_llama3_equals_legacy_rope_scaling(tmp_path):
    model, out = saved(tmp_path, rope_scaling=LLAMA3)
    _with_config(out, ("rope_theta", "rope_scaling"), rope_parameters={**LLAMA3, "rope_theta": 10000.0})
    assert load_model_config(out) == model.config


@pytest.mark.parametrize("changes,message", [
    (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_type = 'dynamic'"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
     "rope_type = 'yarn'"),
    (dict(rope_scaling={"rope_type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}),
     "rope_type = 'longrope'"),
    (dict(rope_scaling={"rope_type": "linear"}), "lacks 'factor'"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 0}), "factor = 0"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "lacks 'low_freq_factor'"),
    (dict(rope_scaling={**LLAMA3, "high_freq_factor": 1.0}), "high_freq_factor = 1.0"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor = 0.5"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}),
     "partial_rotary_factor = 0.25"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_parameters={"rope_type": "default"}),
     "both rope_parameters"),
    (dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
     "per layer type (full_attention)"),
    # a key the layers would ignore (another activation), a shape rotary embeddings cannot take: not decoded as
    # another model
    (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
    (dict(head_dim=15), "head_dim 15 is odd"),
    (dict(attention_bias=True), "attention_bias = true: Llama's and Mistral's put a bias on q, k, v and o_proj"),
    (dict(mlp_bias=True), "mlp_bias = true: its gate, up and down projections would carry biases"),
    (dict(mlp_bias="false"), 'mlp_bias = "false": its gate'),  # a string is not false: quoted as written
    (dict(model_type=None, architectures=None), "names no model_type or architectures: treeopt loads llama"),
    (dict(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=0),
     "sliding_window = 0 must be a positive integer"),
    # an integer field's refusal (config_int writes "config.json: ..."): a tryout read the file named twice
    (dict(num_hidden_layers=0), "num_hidden_layers = 0 must be an integer >= 1"),
    # a quantized checkpoint, refused by the config and its method before any tensor (GPTQ / AWQ tensors are
    # qweight, qzeros, scales: the strict check named one of those as unexpected; a bitsandbytes config over float
    # weights, which transformers quantizes on load, loaded as an unquantized model)
    (dict(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128}),
     "quantization_config (quant_method 'gptq'): a quantized checkpoint"),
    (dict(quantization_config={"quant_method": "awq", "bits": 4}), "quantization_config (quant_method 'awq')"),
    (dict(quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True}),
     "quantization_config (quant_method 'bitsandbytes')"),
])
def test_hf_unsupported_setting_refused_in_one_line(tmp_path, changes, message):
    _, out = saved(tmp_path)
    _with_config(out, **changes)
    for load in (load_model_config, load_checkpoint):
        with pytest.raises(CheckpointError) as err:
            load(out)
        assert message in str(err.value) and "\n" not in str(err.value)
        assert str(err.value).startswith(f"{out / 'config.json'}: ")  # which checkpoint: a target's or a draft's
        assert "config.json" not in str(err.value).split(": ", 1)[1]  # the file named once


def test_gguf_freq_factors_have_no_config_json_and_nothing_is_written(tmp_path):
    cfg = tiny_config(rope_freq_factors=(1.0, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 0.5))
    with pytest.raises(CheckpointError, match="rope_freq_factors"):
        save_hf_checkpoint(Transformer(cfg), tiny_tokenizer(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key, value", [("max_position_embeddings", 0), ("max_position_embeddings", -5),
                                        ("vocab_size", 0), ("n_layers", 1.5)])
def test_config_refuses_sizes_that_are_not_positive_integers(key, value):
    from sequoia_opt.model import ModelConfig

    with pytest.raises(CheckpointError, match=f"model config {key} = {value!r} must be a positive integer"):
        ModelConfig.preset("tiny").with_(**{key: value})


def test_model_config_reads_a_config_json_file_by_its_own_name(tmp_path):
    """--arch my.json read the config.json beside it, not my.json."""
    from sequoia_opt.model.hf import hf_config_dict

    tiny = ModelConfig.preset("tiny")
    (tmp_path / "config.json").write_text(json.dumps(hf_config_dict(tiny.with_(dim=48, n_heads=4, n_kv_heads=2))))
    mine = tmp_path / "small.json"
    mine.write_text(json.dumps(hf_config_dict(tiny.with_(dim=32, n_heads=4, n_kv_heads=2))))
    assert load_model_config(mine).dim == 32
    assert load_model_config(tmp_path).dim == 48


@pytest.mark.parametrize("model_type, archs", [("qwen2_moe", ["Qwen2MoeForCausalLM"]),
                                               ("qwen2_vl", ["Qwen2VLForConditionalGeneration"]),
                                               ("", ["Qwen2MoeForCausalLM"])])
def test_config_refuses_architectures_that_only_share_a_prefix(model_type, archs):
    from sequoia_opt.model.hf import hf_config_dict

    cfg = {**hf_config_dict(ModelConfig.preset("tiny")), "model_type": model_type, "architectures": archs}
    named = f"model_type {model_type!r}" if model_type else f"architectures {archs!r}"
    with pytest.raises(CheckpointError, match=re.escape(f"config.json names {named}: treeopt loads")):
        ModelConfig.from_hf(cfg)
    cfg.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    assert ModelConfig.from_hf(cfg).vocab_size == ModelConfig.preset("tiny").vocab_size


@pytest.mark.parametrize("changes,context", [
    (dict(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=8), 8),
    (dict(model_type="mistral", architectures=["MistralForCausalLM"]), 64),  # 4096 by default: past the context
    (dict(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None), 64),
    (dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], sliding_window=8), 64),  # off unless asked
    (dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], sliding_window=8, use_sliding_window=True), 8),
    (dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], sliding_window=8, use_sliding_window=True,
          max_window_layers=99), 64),  # no layer at or above max_window_layers slides
    (dict(sliding_window=16), 16),  # transformers 5 masks a Llama window (4 ignored it): within it both agree
    (dict(sliding_window=None), 64),
    (dict(sliding_window=0), 64), (dict(sliding_window=False), 64),  # what transformers 4 ignored: still loads
    (dict(sliding_window=4096.0), 64),
])
def test_a_sliding_window_caps_the_context(tmp_path, changes, context):
    """Full causal attention equals sliding-window attention for sequences within the window: the context is capped
    there, so a longer sequence gets the context error instead of the wrong attention."""
    _, out = saved(tmp_path, max_position_embeddings=64)
    _with_config(out, **changes)
    assert load_model_config(out).max_position_embeddings == context


@pytest.mark.parametrize("changes,drop,context", [
    # Qwen2Config defaults sliding_window to 4096, like MistralConfig: transformers slides there (it read 8192)
    (dict(use_sliding_window=True, max_window_layers=0), ("sliding_window",), 4096),
    (dict(use_sliding_window=True, max_window_layers=0, sliding_window=None), (), 8192),  # null: no window
    (dict(max_window_layers=0), ("sliding_window",), 8192),  # off unless asked
    # transformers 5 reads layer_types instead of max_window_layers: a layer named sliding slides (it read 8192)
    (dict(use_sliding_window=True, sliding_window=20, max_window_layers=99,
          layer_types=["full_attention", "sliding_attention"]), (), 20),
    (dict(use_sliding_window=True, sliding_window=20, max_window_layers=99,
          layer_types=["full_attention", "full_attention"]), (), 8192),
])
def test_a_qwen2_window_reads_transformers_default_and_layer_types(tmp_path, changes, drop, context):
    _, out = saved(tmp_path)
    _with_config(out, drop=drop, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                 max_position_embeddings=8192, **changes)
    assert load_model_config(out).max_position_embeddings == context


def test_a_config_without_rms_norm_eps_reads_transformers_default_and_is_named_by_its_folder(tmp_path):
    _, out = saved(tmp_path)
    _with_config(out, ("rms_norm_eps",), _name_or_path="/old/training/run")
    cfg = load_model_config(out)
    assert cfg.norm_eps == 1e-6  # LlamaConfig / MistralConfig / Qwen2Config default
    assert cfg.name == out.name and load_checkpoint(out)[0].config.name == out.name
    assert load_model_config(out / "config.json").name == out.name  # its folder's
    (tmp_path / "smollm2-135m.json").write_text((out / "config.json").read_text())
    assert load_model_config(tmp_path / "smollm2-135m.json").name == "smollm2-135m"  # saved under its own name


def test_a_config_with_a_byte_order_mark_loads(tmp_path):
    """An editor on Windows writes config.json with a UTF-8 BOM: json refused it ('Unexpected UTF-8 BOM')."""
    _, out = saved(tmp_path)
    cfg = out / "config.json"
    want = load_model_config(out)
    cfg.write_bytes("\ufeff".encode() + cfg.read_bytes())
    assert load_model_config(out) == want


@pytest.mark.parametrize("text, kind", [("[1, 2]", "list"), ('"llama"', "str"), ("null", "NoneType")])
def test_a_config_that_is_not_a_json_object_is_refused_by_name(tmp_path, text, kind):
    """A config.json holding a list or a string crashed with AttributeError ('list' object has no attribute 'get')."""
    _, out = saved(tmp_path)
    (out / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=re.escape(f"{out / 'config.json'}: a JSON object was expected, "
                                                        f"not {kind}")):
        load_model_config(out)


@pytest.mark.parametrize("key, value, message", [
    ("rms_norm_eps", "abc", "config.json: rms_norm_eps = 'abc' must be a positive number"),  # was a ValueError
    ("rms_norm_eps", -1e-5, "config.json: rms_norm_eps = -1e-05 must be a positive number"),  # was taken
    ("head_dim", -64, "config.json: head_dim = -64 must be an integer >= 0"),  # was a RuntimeError in torch
    ("hidden_size", "576", "config.json: hidden_size = '576' must be an integer >= 1"),
    ("intermediate_size", 0, "config.json: intermediate_size = 0 must be an integer >= 1"),
    ("tie_word_embeddings", "false", "config.json: tie_word_embeddings = 'false' must be true or false"),  # read True
    ("vocab_size", None, "config.json lacks 'vocab_size'"),
])
def test_config_fields_of_the_wrong_kind_are_one_line_naming_the_field(key, value, message):
    from sequoia_opt.model.hf import hf_config_dict

    cfg = hf_config_dict(ModelConfig.preset("tiny"))
    if value is None:
        del cfg[key]
    else:
        cfg[key] = value
    with pytest.raises(CheckpointError) as err:
        ModelConfig.from_hf(cfg)
    assert str(err.value) == message
    cfg = hf_config_dict(ModelConfig.preset("tiny"))
    cfg.update(num_key_value_heads=None, head_dim=None, rms_norm_eps=None)  # null: the transformers defaults
    c = ModelConfig.from_hf(cfg)
    assert (c.n_kv_heads, c.head_dim, c.norm_eps) == (c.n_heads, c.dim // c.n_heads, 1e-6)


def test_a_checkpoint_that_fails_midway_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    """save_hf_checkpoint writes its files as one set: when the last one (config.json) fails, the tokenizer,
    generation config and weights already written are put back, so the folder holds the old checkpoint whole."""
    import os
    import sys
    from pathlib import Path

    import sequoia_opt.model.hf as hf
    from sequoia_opt.errors import OutputError

    sys.path.insert(0, os.path.dirname(__file__))
    from tiny_pair import byte_tokenizer, random_model

    out = tmp_path / "ckpt"
    hf.save_hf_checkpoint(random_model(0), byte_tokenizer(), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                           "tokenizer_config.json"}
    real = hf.atomic_write_text

    def refuse_config(path, text):
        if Path(path).name == "config.json":
            raise OutputError(f"cannot write {path}: disk full")
        return real(path, text)

    monkeypatch.setattr(hf, "atomic_write_text", refuse_config)
    other = Transformer(ModelConfig.preset("tiny").with_(vocab_size=300, name="tiny"))
    with pytest.raises(OutputError, match="disk full"):
        hf.save_hf_checkpoint(other, byte_tokenizer(), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    fresh = tmp_path / "fresh"
    with pytest.raises(OutputError, match="disk full"):
        hf.save_hf_checkpoint(other, byte_tokenizer(), fresh)
    assert list(fresh.iterdir()) == []


@pytest.mark.parametrize("changes, context", [
    (dict(), 2048),  # LlamaConfig's default
    (dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"]), 32768),  # Qwen2Config's (it read 2048)
    (dict(model_type="mistral", architectures=["MistralForCausalLM"]), 4096),  # 4096 * 32, capped at the window
    (dict(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None), 4096 * 32),
])
def test_a_config_without_max_position_embeddings_reads_its_familys_transformers_default(tmp_path, changes, context):
    """transformers builds a config lacking ``max_position_embeddings`` with its class's default, which differs by
    family; 2048 for all refused Qwen2 and Mistral prompts transformers serves."""
    _, out = saved(tmp_path)
    _with_config(out, drop=("max_position_embeddings",), **changes)
    assert load_model_config(out).max_position_embeddings == context


@pytest.mark.parametrize("family, arch", [("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM"),
                                          ("mistral", "MistralForCausalLM")])
def test_a_config_without_num_key_value_heads_reads_its_familys_transformers_default(tmp_path, family, arch):
    # transformers' defaults differ by family: LlamaConfig num_attention_heads, Qwen2Config 32, MistralConfig 8
    # (treeopt read num_attention_heads for all three: a Qwen2 / Mistral config decoded as another model)
    transformers = pytest.importorskip("transformers")
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "mistral": transformers.MistralConfig}[family]
    _, out = saved(tmp_path)
    _with_config(out, ("num_key_value_heads", "head_dim"), model_type=family, architectures=[arch],
                 num_attention_heads=64, hidden_size=128, attention_bias=family == "qwen2")
    cfg = json.loads((out / "config.json").read_text())
    want = cls.from_dict(cfg).num_key_value_heads
    assert want == {"llama": 64, "qwen2": 32, "mistral": 8}[family]
    assert load_model_config(out).n_kv_heads == want


def test_kv_heads_disagreeing_with_k_proj_names_the_tensor_and_the_field(tmp_path):
    _, out = saved(tmp_path)  # 4 heads, 2 KV heads of head_dim 16: k_proj (32, 64)
    _with_config(out, ("num_key_value_heads",))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(out)
    assert str(err.value) == (f"{out}: shape mismatch for model.layers.0.self_attn.k_proj.weight: 32 rows (2 KV "
                              f"heads), but config.json has no num_key_value_heads (transformers' llama default: "
                              f"num_attention_heads, 4 KV heads) gives 64 (x head_dim 16)")
    _with_config(out, num_key_value_heads=1)
    with pytest.raises(CheckpointError, match=r"k_proj\.weight: 32 rows \(2 KV heads\), but config\.json "
                                              r"num_key_value_heads = 1 gives 16 \(x head_dim 16\)$"):
        load_checkpoint(out)
    _with_config(out, model_type="qwen2", architectures=["Qwen2ForCausalLM"])  # no key: Qwen2Config's 32
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("num_key_value_heads")
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json: has no num_key_value_heads \(transformers' qwen2 "
                                              r"default: 32, 32 KV heads\), which does not divide "
                                              r"num_attention_heads = 4$"):
        load_model_config(out)


@pytest.mark.parametrize("rope_scaling", [None, LLAMA3 | {"original_max_position_embeddings": 8192},
                                          {"rope_type": "linear", "factor": 4.0}], ids=["default", "llama3", "linear"])
def test_rotary_frequencies_and_logits_equal_transformers_near_position_2_17(tmp_path, rope_scaling):
    # transformers computes inv_freq in float32 (modeling_rope_utils; LlamaRotaryEmbedding); treeopt computed it in
    # float64 and rounded: an ulp apart, which position 131071 turns into ~1e-2 rad (Llama 3.1's context). The
    # frequencies must be transformers' bit for bit, and so the logits at positions near 2**17.
    transformers = pytest.importorskip("transformers")
    _, out = saved(tmp_path, head_dim=64, n_heads=2, n_kv_heads=1, max_position_embeddings=131072,
                   rope_theta=500000.0, rope_scaling=rope_scaling)
    ours, _ = load_checkpoint(out)
    ref = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert torch.equal(ours.inv_freq, ref.model.rotary_emb.inv_freq)
    pos = torch.arange(131064, 131072)
    with torch.no_grad():
        got = ours(TOKENS[:1, :8], pos)
        want = ref(input_ids=TOKENS[:1, :8], position_ids=pos[None]).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_head_counts_are_named_in_the_config_files_keys(tmp_path):
    """A target's config.json and a feature head's share one check (hf_attention_heads): ModelConfig's own
    message said "dim 64 is not divisible by n_heads 5", names no file has."""
    _, out = saved(tmp_path)  # hidden 64, 4 heads
    _with_config(out, ("head_dim",), num_attention_heads=5, num_key_value_heads=5)
    with pytest.raises(CheckpointError, match=r"config\.json: hidden_size = 64 is not divisible by "
                                              r"num_attention_heads = 5 \(and no head_dim is given\)$"):
        load_model_config(out)
    _with_config(out, num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(CheckpointError, match=r"config\.json: num_key_value_heads = 3, which does not divide "
                                              r"num_attention_heads = 4$"):
        load_model_config(out)
    _with_config(out, num_key_value_heads=None)  # transformers reads an explicit null as num_attention_heads
    assert load_model_config(out).n_kv_heads == 4


def test_an_integer_weight_tensor_is_refused_not_cast(tmp_path):
    """A draft whose MLP weights were stored as int8 (no quantization_config) loaded and was cast to float without a
    word: another model. It is refused, naming the file and tensor; float16 weights still load."""
    from safetensors.torch import load_file, save_file

    _, out = saved(tmp_path)
    (weights,) = sorted(out.glob("*.safetensors"))
    tensors = load_file(str(weights))
    key = next(k for k in tensors if k.endswith("mlp.up_proj.weight"))
    save_file({**tensors, key: tensors[key].to(torch.int8)}, str(weights))
    with pytest.raises(CheckpointError, match=re.escape(f"{weights}: tensor {key} is I8; treeopt reads float weights "
                                                        "(F16, BF16, F32, F64)")):
        load_checkpoint(out)
    save_file({k: v.to(torch.float16) for k, v in tensors.items()}, str(weights))
    model, _ = load_checkpoint(out)
    assert model.embed_tokens.weight.dtype == torch.float32
