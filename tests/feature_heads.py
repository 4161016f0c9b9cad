"""Tiny feature-head checkpoints written in exactly the public layouts (tensor names and config keys as SGLang's and
vLLM's ``llama_eagle3.py``, vLLM's ``llama_eagle.py`` and Medusa's ``medusa_model.py`` read them), and an
independent reference computation of each head written from those layouts (plain tensor math, one item at a
time, no cache and no treeopt module). Not a test module itself."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from sequoia_opt.model import ModelConfig, Transformer

TARGET4 = ModelConfig(vocab_size=257, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, intermediate_size=128,
                      max_position_embeddings=512, name="tiny4")


def random_target(config: ModelConfig = TARGET4, seed: int = 0, std: float = 0.3) -> Transformer:
    torch.manual_seed(seed)
    m = Transformer(config)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.fill_(1.0) if "norm" in name else p.normal_(0.0, std)
    return m.eval().requires_grad_(False)


def _rand(shape, g, std=0.2):
    return (torch.randn(*shape, generator=g) * std).float()


def _norm(shape, g):
    return 1.0 + 0.1 * torch.randn(*shape, generator=g)


# ---------------------------------------------------------------------------------------------- EAGLE-3 layout
def eagle3_tensors(*, H=64, Ht=64, V=257, draft_ids=None, heads=4, kv=2, hd=16, inter=96, seed=0) -> dict:
    """Every tensor of an EAGLE-3 head, named as the engines read them."""
    g = torch.Generator().manual_seed(seed)
    Vd = V if draft_ids is None else len(draft_ids)
    t = {
        "fc.weight": _rand((H, 3 * Ht), g, 0.1),
        "midlayer.input_layernorm.weight": _norm((H,), g),
        "midlayer.hidden_norm.weight": _norm((H,), g),
        "midlayer.post_attention_layernorm.weight": _norm((H,), g),
        "midlayer.self_attn.q_proj.weight": _rand((heads * hd, 2 * H), g),
        "midlayer.self_attn.k_proj.weight": _rand((kv * hd, 2 * H), g),
        "midlayer.self_attn.v_proj.weight": _rand((kv * hd, 2 * H), g),
        "midlayer.self_attn.o_proj.weight": _rand((H, heads * hd), g),
        "midlayer.mlp.gate_proj.weight": _rand((inter, H), g),
        "midlayer.mlp.up_proj.weight": _rand((inter, H), g),
        "midlayer.mlp.down_proj.weight": _rand((H, inter), g),
        "norm.weight": _norm((H,), g),
        "lm_head.weight": _rand((Vd, H), g, 0.5),
    }
    if draft_ids is not None:
        ids = torch.as_tensor(draft_ids, dtype=torch.int64)
        t["d2t"] = ids - torch.arange(len(ids))
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[ids] = True
        t["t2d"] = t2d
    return t


def eagle3_config(*, H=64, V=257, Vd=None, heads=4, kv=2, hd=16, inter=96, ids=(0, 1, 2), **over) -> dict:
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
           "num_hidden_layers": 1, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
           "vocab_size": V, "draft_vocab_size": Vd or V, "tie_word_embeddings": False, "hidden_act": "silu",
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids), "use_aux_hidden_state": True}}
    cfg.update(over)
    return cfg


def write_head(folder: Path, config: dict, tensors: dict, weights: str = "model.safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if weights.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / weights))
    else:
        torch.save(tensors, folder / weights)
    return folder


def write_eagle3(folder: Path, *, V=257, draft_ids=None, ids=(0, 1, 2), seed=0, **config_over) -> Path:
    t = eagle3_tensors(V=V, draft_ids=draft_ids, seed=seed)
    return write_head(folder, eagle3_config(V=V, Vd=None if draft_ids is None else len(draft_ids), ids=ids,
                                            **config_over), t)


# ---------------------------------------------------------------------------------------------- EAGLE-1/2 layout
def eagle_tensors(*, H=64, layers=2, heads=4, kv=2, hd=16, inter=96, bias=True, seed=0) -> dict:
    g = torch.Generator().manual_seed(seed)
    t = {"fc.weight": _rand((H, 2 * H), g, 0.1)}
    if bias:
        t["fc.bias"] = _rand((H,), g, 0.1)
    for i in range(layers):
        p = f"layers.{i}."
        if i > 0:  # EAGLE's first layer has no input norm
            t[p + "input_layernorm.weight"] = _norm((H,), g)
        t.update({p + "self_attn.q_proj.weight": _rand((heads * hd, H), g),
                  p + "self_attn.k_proj.weight": _rand((kv * hd, H), g),
                  p + "self_attn.v_proj.weight": _rand((kv * hd, H), g),
                  p + "self_attn.o_proj.weight": _rand((H, heads * hd), g),
                  p + "post_attention_layernorm.weight": _norm((H,), g),
                  p + "mlp.gate_proj.weight": _rand((inter, H), g),
                  p + "mlp.up_proj.weight": _rand((inter, H), g),
                  p + "mlp.down_proj.weight": _rand((H, inter), g)})
    return t


def eagle_config(*, H=64, V=257, layers=2, heads=4, kv=2, hd=16, inter=96, **over) -> dict:
    cfg = {"architectures": ["EagleLlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
           "num_hidden_layers": layers, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
           "vocab_size": V, "hidden_act": "silu"}
    cfg.update(over)
    return cfg


def write_eagle(folder: Path, *, seed=0, weights="pytorch_model.bin", **over) -> Path:
    return write_head(folder, eagle_config(**over), eagle_tensors(seed=seed), weights)


# ---------------------------------------------------------------------------------------------- Medusa layout
def medusa_tensors(*, H=64, V=257, heads=3, layers=1, seed=0, prefix="") -> dict:
    g = torch.Generator().manual_seed(seed)
    t = {}
    for k in range(heads):
        for j in range(layers):
            t[f"{prefix}{k}.{j}.linear.weight"] = _rand((H, H), g)
            t[f"{prefix}{k}.{j}.linear.bias"] = _rand((H,), g)
        t[f"{prefix}{k}.{layers}.weight"] = _rand((V, H), g, 0.5)
    return t


def write_medusa(folder: Path, *, heads=3, layers=1, seed=0, weights="medusa_lm_head.pt", prefix="", V=257,
                 **over) -> Path:
    cfg = {"medusa_num_heads": heads, "medusa_num_layers": layers, "base_model_name_or_path": "tiny4", **over}
    return write_head(folder, cfg, medusa_tensors(heads=heads, layers=layers, seed=seed, prefix=prefix, V=V), weights)


# ---------------------------------------------------------------------------------------------- the reference
def _rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, hd, theta=10000.0):
    """x (heads, hd) at one position; pairs (i, i + hd/2)."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = (pos * inv).float()
    c, s = ang.cos(), ang.sin()
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([a * c - b * s, b * c + a * s], -1)


class RefEagle3:
    """EAGLE-3 from the layout, one item at a time: item = (token, input hidden, position); attention over the
    items made visible to it (their K/V computed when they ran) and itself."""

    def __init__(self, tensors: dict, emb: torch.Tensor, heads=4, kv=2, hd=16):
        self.w, self.emb, self.heads, self.kv, self.hd = tensors, emb, heads, kv, hd

    def fuse(self, feats):  # (3, Ht) -> (H,)
        return self.w["fc.weight"] @ feats.reshape(-1)

    def item(self, token, hidden, pos, visible):
        """Returns (logits over the draft vocabulary, r2, (k, v)); ``visible`` a list of (k, v) of earlier items."""
        w, m = self.w, "midlayer."
        x = torch.cat([_rms(self.emb[token], w[m + "input_layernorm.weight"]),
                       _rms(hidden, w[m + "hidden_norm.weight"])])
        q = (w[m + "self_attn.q_proj.weight"] @ x).view(self.heads, self.hd)
        k = (w[m + "self_attn.k_proj.weight"] @ x).view(self.kv, self.hd)
        v = (w[m + "self_attn.v_proj.weight"] @ x).view(self.kv, self.hd)
        q, k = _rope(q, pos, self.hd), _rope(k, pos, self.hd)
        ks = torch.stack([kk for kk, _ in visible] + [k])  # (n, kv, hd)
        vs = torch.stack([vv for _, vv in visible] + [v])
        group = self.heads // self.kv
        out = []
        for h in range(self.heads):
            s = ks[:, h // group] @ q[h] / math.sqrt(self.hd)  # (n,)
            out.append(torch.softmax(s, 0) @ vs[:, h // group])
        attn = w[m + "self_attn.o_proj.weight"] @ torch.cat(out)
        r1 = hidden + attn
        n = _rms(r1, w[m + "post_attention_layernorm.weight"])
        mlp = w[m + "mlp.down_proj.weight"] @ (torch.nn.functional.silu(w[m + "mlp.gate_proj.weight"] @ n)
                                               * (w[m + "mlp.up_proj.weight"] @ n))
        r2 = r1 + mlp
        return w["lm_head.weight"] @ _rms(r2, w["norm.weight"]), r2, (k, v)


class RefEagle:
    """EAGLE-1 from the layout: x = fc(cat(emb, f)) (+ bias), Llama blocks (block 0 without input norm), the
    target's LM head on the output."""

    def __init__(self, tensors: dict, emb: torch.Tensor, lm_head: torch.Tensor, layers=2, heads=4, kv=2, hd=16):
        self.w, self.emb, self.lm, self.layers, self.heads, self.kv, self.hd = tensors, emb, lm_head, layers, heads, kv, hd

    def fuse(self, feats):
        return feats.reshape(-1)

    def item(self, token, hidden, pos, visible):
        """``visible``: per earlier item a list of per-layer (k, v). Returns (logits, out, per-layer (k, v))."""
        w = self.w
        x = w["fc.weight"] @ torch.cat([self.emb[token], hidden]) + w.get("fc.bias", 0)
        kvs = []
        for i in range(self.layers):
            p = f"layers.{i}."
            h = x if i == 0 else _rms(x, w[p + "input_layernorm.weight"])
            q = (w[p + "self_attn.q_proj.weight"] @ h).view(self.heads, self.hd)
            k = (w[p + "self_attn.k_proj.weight"] @ h).view(self.kv, self.hd)
            v = (w[p + "self_attn.v_proj.weight"] @ h).view(self.kv, self.hd)
            q, k = _rope(q, pos, self.hd), _rope(k, pos, self.hd)
            kvs.append((k, v))
            ks = torch.stack([it[i][0] for it in visible] + [k])
            vs = torch.stack([it[i][1] for it in visible] + [v])
            group = self.heads // self.kv
            out = [torch.softmax(ks[:, hh // group] @ q[hh] / math.sqrt(self.hd), 0) @ vs[:, hh // group]
                   for hh in range(self.heads)]
            x = x + w[p + "self_attn.o_proj.weight"] @ torch.cat(out)
            n = _rms(x, w[p + "post_attention_layernorm.weight"])
            x = x + w[p + "mlp.down_proj.weight"] @ (torch.nn.functional.silu(w[p + "mlp.gate_proj.weight"] @ n)
                                                     * (w[p + "mlp.up_proj.weight"] @ n))
        return self.lm @ x, x, kvs


def ref_medusa(tensors: dict, hidden: torch.Tensor, heads=3, layers=1, prefix="") -> torch.Tensor:
    """(K, V) Medusa logits of one hidden state: per head, ResBlocks x + SiLU(Wx + b), then its LM head."""
    out = []
    for k in range(heads):
        x = hidden
        for j in range(layers):
            x = x + torch.nn.functional.silu(tensors[f"{prefix}{k}.{j}.linear.weight"] @ x
                                             + tensors[f"{prefix}{k}.{j}.linear.bias"])
        out.append(tensors[f"{prefix}{k}.{layers}.weight"] @ x)
    return torch.stack(out)
