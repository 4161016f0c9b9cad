"""Feature-head checkpoints in the public layouts the serving engines read, loaded strictly and written back.

* EAGLE-3 (SGLang ``python/sglang/srt/models/llama_eagle3.py``, vLLM
  ``vllm/model_executor/models/llama_eagle3.py``): ``config.json`` with ``architectures``
  ``LlamaForCausalLMEagle3`` (SGLang) or ``Eagle3LlamaForCausalLM`` (vLLM), the Llama shape of its one decoder
  layer (``hidden_size``, heads, ``intermediate_size``, rotary settings), ``vocab_size`` (the target's),
  ``draft_vocab_size``, optional ``target_hidden_size``, ``norm_before_residual`` and ``bias`` (of ``fc``), and
  the fused target layers ``eagle_config.eagle_aux_hidden_state_layer_ids`` (or at the top level); weights
  ``fc.weight``, ``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
  ``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``, ``norm.weight``,
  ``lm_head.weight`` (draft vocabulary rows), ``d2t`` (draft id -> target id - draft id, int64) and ``t2d``
  (target ids in the draft vocabulary, bool), optionally ``embed_tokens.weight`` (else the target's; required
  where ``hidden_size`` is not ``target_hidden_size``).
* EAGLE-1/2 (vLLM ``llama_eagle.py``; EAGLE's ``cnets.py``): ``architectures`` ``EagleLlamaForCausalLM`` or
  ``LlamaForCausalLM`` (EAGLE's own configs); weights ``fc.weight`` (optionally ``fc.bias``),
  ``layers.{i}.*`` as a Llama block without ``layers.0.input_layernorm``, optionally ``embed_tokens.weight``;
  the LM head is the target's.
* Medusa (``medusa/model/medusa_model.py``): ``config.json`` with ``medusa_num_heads`` and
  ``medusa_num_layers``; ``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt`` holding the state dict of
  ``medusa_head``: ``{k}.{j}.linear.{weight,bias}`` and ``{k}.{L}.weight`` (or the same names under
  ``medusa_head.``).

EAGLE weights are read from ``model.safetensors`` or ``pytorch_model.bin`` (``torch.load`` with
``weights_only``). Strict: every tensor of the layout must be there with its shape and nothing else;
everything is checked against the target's config (its hidden size, vocabulary and layer count) before any
weight is copied, and every refusal is a :class:`~sequoia_opt.errors.CheckpointError` naming the file and the
field or tensor. Which target layer an ``eagle_aux_hidden_state_layer_ids`` entry names differs between the
engines: SGLang reads id i as layer i's output (it captures the input of layer i + 1), vLLM as layer i's
input; treeopt reads SGLang's (the EAGLE-3 authors' and SpecForge's), and says so in every profile. Both engines
capture the listed layers in the target's own order as its forward passes them (``if i in layers_to_capture``
in the layer loop), so ``fc`` fuses them in ascending order whatever the list's order: treeopt sorts them too,
and refuses a layer named twice (the engines would capture it once and hand ``fc`` two features for three).
"""

from __future__ import annotations

import dataclasses
import json
import re
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_save

from .._io import atomic_write_bytes, atomic_write_text, read_json_object, write_all
from ..errors import CheckpointError
from .config import ModelConfig, _hf_rope, config_bool, config_float, config_int, hf_attention_heads
from .heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads
from .hf import FLOAT_DTYPES

__all__ = ["EAGLE3_ARCHITECTURES", "EAGLE_ARCHITECTURES", "read_eagle_config", "check_eagle_head", "load_eagle_head",
           "save_eagle_head", "read_medusa_config", "load_medusa_heads", "save_medusa_heads", "reduced_vocab_maps"]

CONFIG_FILE = "config.json"
EAGLE_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
MEDUSA_WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
#: ``architectures`` an EAGLE-3 head's config may name (SGLang's entry class, vLLM's).
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
#: ``architectures`` an EAGLE-1/2 head's config may name (vLLM's, EAGLE's own configs).
EAGLE_ARCHITECTURES = ("EagleLlamaForCausalLM", "LlamaForCausalLM")
MEDUSA_ARCHITECTURES = ("MedusaModel",)


def _read_json(path: Path) -> dict[str, Any]:
    """A head's ``config.json`` (:func:`~sequoia_opt._io.read_json_object`). Raises :class:`CheckpointError`."""
    return read_json_object(path, error=CheckpointError,
                            missing=f"{path}: not found (a feature head is a folder with {CONFIG_FILE} and its weights)")


# ------------------------------------------------------------------------------------------------- weight files
#: EAGLE-3's vocabulary maps: d2t holds id offsets, t2d marks the draft ids (SGLang writes bool, some int64).
_EAGLE3_MAPS = {"d2t": ("I64", "I32"), "t2d": ("BOOL", "I64", "I32", "U8")}
_TORCH_DTYPE_NAMES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                      torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64", torch.complex128: "C128"}


class _Weights:
    """The tensors of one weight file: names, shapes (from headers only) and a ``fetch(name)``."""

    def __init__(self, path: Path, stack: ExitStack) -> None:
        self.path = path
        if path.suffix == ".safetensors":
            try:
                handle = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            except Exception as err:  # safetensors raises its own error types
                raise CheckpointError(f"{path}: cannot be read as safetensors ({err})") from None
            self.shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
            self.dtypes = {k: str(handle.get_slice(k).get_dtype()) for k in handle.keys()}  # "F16", "I64", "BOOL"
            self.fetch: Callable[[str], torch.Tensor] = handle.get_tensor
        else:
            import zipfile

            legacy = not zipfile.is_zipfile(path)  # torch.save's format before 1.6, or a damaged file: no mmap
            try:
                sd = torch.load(path, map_location="cpu", weights_only=True, mmap=not legacy)
            except Exception as err:  # a pickle torch refuses (weights_only), a damaged member, a truncated file
                if legacy:  # torch's own line would be about mmap and _use_new_zipfile_serialization
                    raise CheckpointError(f"{path}: not a PyTorch checkpoint torch.load reads (a zip archive, or "
                                          "the format before 1.6): truncated, corrupt or another format") from None
                text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()  # torch's message carries ANSI bold
                if text.startswith("Weights only load failed"):  # its own lines are advice to unpickle anyway
                    raise CheckpointError(f"{path}: holds objects other than tensors, which torch.load(weights_only="
                                          "True) refuses to unpickle: save a state dict of tensors (or "
                                          "model.safetensors)") from None
                first = text.splitlines()[0] if text else type(err).__name__
                raise CheckpointError(f"{path}: cannot be read as a PyTorch state dict ({first[:200]})") from None
            if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
                raise CheckpointError(f"{path}: not a state dict of tensors")
            self.shapes = {k: tuple(v.shape) for k, v in sd.items()}
            self.dtypes = {k: _TORCH_DTYPE_NAMES.get(v.dtype, str(v.dtype)) for k, v in sd.items()}
            self.fetch = sd.__getitem__

    def check_dtypes(self, integer: Mapping[str, tuple[str, ...]] = {}) -> None:
        """Weights are floating point (F16, BF16, F32, F64); the index maps named in ``integer`` have one of the
        dtypes given there. Raises CheckpointError naming the file and the tensor: a bool, integer or complex
        weight would be cast on load and decode silently wrong."""
        for name, dt in self.dtypes.items():
            allowed = integer.get(name, FLOAT_DTYPES)  # floating point, cast to the decoder's dtype
            if dt not in allowed:
                raise CheckpointError(f"{self.path}: tensor {name} is {dt}; the layout stores it as "
                                      f"{' or '.join(allowed)}")


def _weight_file(folder: Path, names: tuple[str, ...]) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise CheckpointError(f"{folder}: no weights ({' or '.join(names)})")


def _check_names(where: Path, provided: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]],
                 optional: Mapping[str, tuple[int, ...]] = {}) -> None:
    """Strict: every expected tensor present with its shape, optional ones with theirs, nothing else."""
    missing = sorted(expected.keys() - provided.keys())
    if missing:
        raise CheckpointError(f"{where}: missing tensor {missing[0]}" + (f" (and {len(missing) - 1} more)"
                                                                          if len(missing) > 1 else ""))
    extra = sorted(provided.keys() - expected.keys() - optional.keys())
    if extra:
        raise CheckpointError(f"{where}: unexpected tensor {extra[0]}" + (f" (and {len(extra) - 1} more)"
                                                                          if len(extra) > 1 else ""))
    for name, shape in {**expected, **optional}.items():
        if name in provided and tuple(provided[name]) != tuple(shape):
            raise CheckpointError(f"{where}: tensor {name} has shape {tuple(provided[name])}, the layout needs "
                                  f"{tuple(shape)}")


def _finite(t: torch.Tensor, name: str, where: Path) -> torch.Tensor:
    """``t`` itself; CheckpointError naming ``where`` and the tensor when it holds NaN or infinite values."""
    if not torch.isfinite(t.float()).all():
        raise CheckpointError(f"{where}: tensor {name} holds NaN or infinite values")
    return t


def _fill(module: torch.nn.Module, fetch: Callable[[str], torch.Tensor], name_of: Callable[[str], str],
          where: Path) -> None:
    """Copy every parameter of ``module`` from ``fetch(name_of(param name))`` (shapes already checked)."""
    with torch.no_grad():
        for name, p in module.state_dict(keep_vars=True).items():
            t = _finite(fetch(name_of(name)), name_of(name), where)
            p.copy_(t.to(dtype=p.dtype, device=p.device))


# ------------------------------------------------------------------------------------------------- EAGLE
def read_eagle_config(folder: str | Path, kind: str, target: ModelConfig) -> EagleConfig:
    """An EAGLE head's :class:`EagleConfig` from ``folder/config.json``, checked against the target.

    Raises:
        CheckpointError: naming ``config.json`` and the field: an architecture that is not an ``kind`` head,
            a vocabulary or hidden size other than the target's (or a layer count, where treeopt's trainer
            recorded it as ``treeopt.target_num_hidden_layers``), an EAGLE-3 head without its fused layer ids
            (or ids outside the target's layers), more than one decoder layer for EAGLE-3, a bad Llama field.
    """
    path = Path(folder) / CONFIG_FILE
    cfg = _read_json(path)
    archs = cfg.get("architectures")
    # an EAGLE-3 head may say LlamaForCausalLM as EAGLE's published heads do (the engines take the method from their
    # own setting, not from the config): named eagle3:PATH, its layout decides (midlayer.*, fused layer ids)
    known = EAGLE3_ARCHITECTURES + ("LlamaForCausalLM",) if kind == "eagle3" else EAGLE_ARCHITECTURES
    eagle3_keys = ("draft_vocab_size", "eagle_config", "eagle_aux_hidden_state_layer_ids")
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in known or (
            kind == "eagle3" and archs[0] == "LlamaForCausalLM" and not any(k in cfg for k in eagle3_keys)):
        llama = (f"; LlamaForCausalLM with EAGLE-3's keys ({', '.join(eagle3_keys)}): a draft model has none"
                 if kind == "eagle3" else "")
        raise CheckpointError(f"{path}: architectures = {archs!r} is not an {'EAGLE-3' if kind == 'eagle3' else 'EAGLE'} "
                              f"head (known: {', '.join(known[:-1] if kind == 'eagle3' else known)}{llama})")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{path}: hidden_act = {act!r}; the heads run SwiGLU (silu)")
    V = config_int(cfg, "vocab_size", path)
    if V != target.vocab_size:
        raise CheckpointError(f"{path}: vocab_size = {V} but the target's vocabulary has {target.vocab_size} tokens "
                              "(a head for another target)")
    H = config_int(cfg, "hidden_size", path)
    Ht = config_int(cfg, "target_hidden_size", path, H) if cfg.get("target_hidden_size") is not None else H
    if Ht != target.dim:
        key = "target_hidden_size" if cfg.get("target_hidden_size") is not None else "hidden_size"
        raise CheckpointError(f"{path}: {key} = {Ht} but the target's hidden size is {target.dim} (a head for "
                              "another target)")
    own = cfg.get("treeopt") if isinstance(cfg.get("treeopt"), dict) else {}
    if own.get("target_num_hidden_layers") is not None:  # what treeopt's trainer records of its target
        Lt = own["target_num_hidden_layers"]
        if isinstance(Lt, bool) or not isinstance(Lt, int) or Lt < 1:
            raise CheckpointError(f"{path}: treeopt.target_num_hidden_layers = {Lt!r} must be an integer >= 1")
        if Lt != target.n_layers:
            raise CheckpointError(f"{path}: treeopt.target_num_hidden_layers = {Lt} but the target has "
                                  f"{target.n_layers} layers (a head for another target)")
    n_layers = config_int(cfg, "num_hidden_layers", path)
    Vd = V
    aux: tuple[int, ...] = ()
    if kind == "eagle3":
        if n_layers != 1:
            raise CheckpointError(f"{path}: num_hidden_layers = {n_layers}; an EAGLE-3 head has one decoder layer "
                                  "(SGLang and vLLM stack further layers differently)")
        Vd = config_int(cfg, "draft_vocab_size", path, V) if cfg.get("draft_vocab_size") is not None else V
        if Vd > V:
            raise CheckpointError(f"{path}: draft_vocab_size = {Vd} exceeds the target's vocabulary ({V})")
        ec = {} if cfg.get("eagle_config") is None else cfg["eagle_config"]  # null: absent
        if not isinstance(ec, dict):
            raise CheckpointError(f"{path}: eagle_config = {ec!r} must be an object (the engines read "
                                  "eagle_config.eagle_aux_hidden_state_layer_ids from it)")
        if ec.get("use_aux_hidden_state", True) is False:
            raise CheckpointError(f"{path}: eagle_config.use_aux_hidden_state = false (an EAGLE-3 head reading the "
                                  "last layer only) is not supported; use --draft eagle:PATH for EAGLE-1/2 heads")
        ids = ec.get("eagle_aux_hidden_state_layer_ids")  # null there: absent, as the engines' .get() reads it
        if ids is None:
            ids = cfg.get("eagle_aux_hidden_state_layer_ids")
        if ids is None:
            raise CheckpointError(f"{path}: eagle_config.eagle_aux_hidden_state_layer_ids is missing: an EAGLE-3 "
                                  "head must name the target layers it fuses")
        last = target.n_layers - 2
        if (not isinstance(ids, list) or len(ids) != 3
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= last for i in ids)):
            raise CheckpointError(f"{path}: eagle_aux_hidden_state_layer_ids = {ids!r} must be 3 layer indices in "
                                  f"0..{last} (the target has {target.n_layers} layers; id i is layer i's output)")
        if len(set(ids)) != len(ids):
            twice = next(i for i in ids if ids.count(i) > 1)
            raise CheckpointError(f"{path}: eagle_aux_hidden_state_layer_ids = {ids!r} names layer {twice} twice: the "
                                  "engines capture each layer once, so fc would get fewer than its 3 features")
        aux = tuple(sorted(int(i) for i in ids))  # fused in the target's layer order, as the engines capture them
    n_heads, n_kv = hf_attention_heads(cfg, where=path)  # in the file's own keys (ModelConfig says dim / n_heads)
    try:
        theta, scaling = _hf_rope(cfg)
        layer = ModelConfig(
            vocab_size=Vd, dim=H, n_layers=n_layers, n_heads=n_heads,
            n_kv_heads=n_kv,
            intermediate_size=config_int(cfg, "intermediate_size", path),
            head_dim=0 if cfg.get("head_dim") is None else config_int(cfg, "head_dim", path, minimum=0),
            norm_eps=1e-6 if cfg.get("rms_norm_eps") is None else config_float(cfg, "rms_norm_eps", path),
            rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=config_int(cfg, "max_position_embeddings", path, 2048),
            attention_bias=config_bool(cfg, "attention_bias", path), name=str(cfg.get("_name_or_path") or kind))
    except CheckpointError as err:  # each message names this file once: the field readers name it already,
        msg = str(err)              # the rope reader says 'config.json', ModelConfig's own checks nothing
        if not msg.startswith(str(path)):
            msg = f"{path}:{msg[len(CONFIG_FILE):]}" if msg.startswith(CONFIG_FILE) else f"{path}: {msg}"
        raise CheckpointError(msg) from None
    return EagleConfig(kind=kind, layer=layer, vocab_size=V, target_hidden_size=Ht, aux_layers=aux,
                       fc_bias=config_bool(cfg, "bias", path),
                       norm_before_residual=config_bool(cfg, "norm_before_residual", path), name=layer.name)


def _eagle_expected(config: EagleConfig) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(expected, optional) tensor name -> shape of an EAGLE head's weight file (built on the meta device)."""
    V, H = config.vocab_size, config.hidden_size
    meta = EagleHead(config, torch.empty(V, H, device="meta"), torch.empty(V, H, device="meta"), device="meta")
    expected = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
    optional = {"embed_tokens.weight": (V, H)}
    if config.kind == "eagle3":
        Vd = config.draft_vocab_size
        if Vd < V:
            expected.update({"d2t": (Vd,), "t2d": (V,)})
        else:
            optional.update({"d2t": (Vd,), "t2d": (V,)})
    return expected, optional


def reduced_vocab_maps(d2t: torch.Tensor | None, t2d: torch.Tensor | None, vocab_size: int,
                       where: str) -> torch.Tensor:
    """The draft vocabulary's target ids, (V_d,) int64, from EAGLE-3's ``d2t`` (target id - draft id) and check
    ``t2d`` against it. ``d2t`` None: a head without one, whose draft vocabulary is the target's whole vocabulary
    in order (ids ``0 .. vocab_size - 1``), which a ``t2d`` must then mark entirely.

    Raises:
        CheckpointError: naming ``where`` and the entry: a target id outside ``[0, vocab_size)``, two draft ids
            mapped to one target id, a ``t2d`` that does not mark exactly those ids.
    """
    if d2t is None:
        if t2d is not None and not bool(t2d.to(torch.bool).all()):
            first = int((~t2d.to(torch.bool)).nonzero()[0])
            raise CheckpointError(f"{where}: t2d[{first}] is false, but without d2t the draft vocabulary is the "
                                  f"target's whole vocabulary (draft_vocab_size = {vocab_size}): t2d must mark "
                                  "every id")
        return torch.arange(vocab_size, dtype=torch.int64)
    d2t = d2t.to(torch.int64)
    ids = torch.arange(d2t.numel(), dtype=torch.int64) + d2t  # (V_d,)
    bad = ((ids < 0) | (ids >= vocab_size)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise CheckpointError(f"{where}: d2t[{i}] = {int(d2t[i])} maps draft token {i} to target id {int(ids[i])}, "
                              f"outside the target vocabulary [0, {vocab_size})")
    if torch.unique(ids).numel() != ids.numel():
        raise CheckpointError(f"{where}: d2t maps two draft tokens to one target id")
    if t2d is not None:
        mark = torch.zeros(vocab_size, dtype=torch.bool)
        mark[ids] = True
        if not torch.equal(t2d.to(torch.bool), mark):
            first = int((t2d.to(torch.bool) != mark).nonzero()[0])
            raise CheckpointError(f"{where}: t2d[{first}] disagrees with d2t (t2d must mark exactly the target ids "
                                  "of the draft vocabulary)")
    return ids


def check_eagle_head(folder: str | Path, kind: str, target: ModelConfig) -> EagleConfig:
    """Every check :func:`load_eagle_head` makes, reading ``config.json``, the weight file's headers and (EAGLE-3)
    the small ``d2t`` / ``t2d`` tensors only: what ``--draft eagle3:PATH`` checks before the target loads.

    Raises:
        CheckpointError: as :func:`read_eagle_config`; a missing, unexpected or mis-shaped tensor, a ``d2t``
            outside the target vocabulary (:func:`reduced_vocab_maps`), a ``t2d`` leaving an id out of a
            whole-vocabulary head (no ``d2t``), naming the file.
    """
    config = read_eagle_config(folder, kind, target)
    with ExitStack() as stack:
        w = _Weights(_weight_file(Path(folder), EAGLE_WEIGHT_FILES), stack)
        config, _ = _check_eagle_weights(config, w)
    return config


def _check_eagle_weights(config: EagleConfig, w: _Weights) -> tuple[EagleConfig, torch.Tensor | None]:
    """Check the weight file strictly; returns the config (an EAGLE head's ``fc`` bias is read from the file:
    EAGLE's ``cnets.py`` has one by default and its configs do not say so) and the draft ids (EAGLE-3 with
    ``d2t``, else None)."""
    if config.kind == "eagle" and "fc.bias" in w.shapes and not config.fc_bias:
        config = dataclasses.replace(config, fc_bias=True)
    if config.kind == "eagle":  # (EAGLE-3's one layer is checked with its config)
        _check_count(w.path.with_name(CONFIG_FILE), "num_hidden_layers", config.layer.n_layers,
                     _indices_under(w.shapes, "layers."), "decoder layers")
    expected, optional = _eagle_expected(config)
    H, Ht = config.hidden_size, config.target_hidden_size
    if H != Ht and "embed_tokens.weight" not in w.shapes:  # the target's (V, H_t) embedding does not fit its layer
        raise CheckpointError(f"{w.path}: missing tensor embed_tokens.weight: the head's hidden size ({H}) is not "
                              f"the target's ({Ht}), so it cannot read the target's token embedding and must bring "
                              f"its own {optional['embed_tokens.weight']}")
    d2t = w.shapes.get("d2t")
    if config.kind == "eagle3" and d2t is not None and len(d2t) == 1 and d2t[0] != config.draft_vocab_size:
        # the config's field, not lm_head's rows: a missing draft_vocab_size reads as the whole vocabulary
        whole = " (missing: the whole vocabulary)" if config.draft_vocab_size == config.vocab_size else ""
        raise CheckpointError(f"{w.path.with_name(CONFIG_FILE)}: draft_vocab_size = {config.draft_vocab_size}{whole} "
                              f"but {w.path.name}'s d2t maps {d2t[0]} draft ids")
    _check_names(w.path, w.shapes, expected, optional)
    w.check_dtypes(_EAGLE3_MAPS if config.kind == "eagle3" else {})
    if config.kind == "eagle3" and ("d2t" in w.shapes or "t2d" in w.shapes):
        ids = reduced_vocab_maps(w.fetch("d2t") if "d2t" in w.shapes else None,
                                 w.fetch("t2d") if "t2d" in w.shapes else None, config.vocab_size, str(w.path))
        return config, ids if "d2t" in w.shapes else None  # without d2t the head's logits are target ids already
    return config, None


def load_eagle_head(folder: str | Path, kind: str, target: Any, *, device: torch.device | str | None = None,
                    dtype: torch.dtype = torch.float32) -> tuple[EagleHead, torch.Tensor | None]:
    """Load an EAGLE-3 (``kind="eagle3"``) or EAGLE-1/2 (``"eagle"``) head for ``target`` (a
    :class:`~sequoia_opt.model.Transformer`: its embedding, and for EAGLE its LM head, are shared unless the
    checkpoint brings an ``embed_tokens.weight``).

    Returns:
        ``(head, draft_ids)``: the head in eval mode on the target's device (``device`` overrides), and for a
        reduced draft vocabulary its (V_d,) int64 target ids (None when the head's logits are target ids).

    Raises:
        CheckpointError: as :func:`check_eagle_head`, before any weight is copied; NaN or infinite weights.
    """
    folder = Path(folder)
    config = read_eagle_config(folder, kind, target.config)
    dev = target.device if device is None else torch.device(device)
    with ExitStack() as stack:
        w = _Weights(_weight_file(folder, EAGLE_WEIGHT_FILES), stack)
        config, ids = _check_eagle_weights(config, w)
        emb = target.embed_tokens.weight
        if "embed_tokens.weight" in w.shapes:
            emb = _finite(w.fetch("embed_tokens.weight"), "embed_tokens.weight", w.path).to(device=dev, dtype=dtype)
        head = EagleHead(config, emb, target.lm_head if kind == "eagle" else None, device=dev, dtype=dtype)
        _fill(head, w.fetch, lambda n: n, w.path)
    return head.eval(), (None if ids is None else ids.to(dev))


def eagle_config_dict(config: EagleConfig, *, dtype: torch.dtype | None = None,
                      extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``config.json`` of an EAGLE head in the engines' layout (module docstring); ``extra`` keys are added
    (e.g. the target's name)."""
    c = config.layer
    out: dict[str, Any] = {
        "architectures": [EAGLE3_ARCHITECTURES[0] if config.kind == "eagle3" else EAGLE_ARCHITECTURES[0]],
        "model_type": "llama",
        "_name_or_path": config.name,
        "hidden_size": c.dim, "intermediate_size": c.intermediate_size, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim,
        "hidden_act": "silu", "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
        "max_position_embeddings": c.max_position_embeddings, "attention_bias": c.attention_bias,
        "tie_word_embeddings": False, "vocab_size": config.vocab_size,
    }
    if config.kind == "eagle3":
        out.update({"draft_vocab_size": config.draft_vocab_size, "target_hidden_size": config.target_hidden_size,
                    "bias": config.fc_bias, "norm_before_residual": config.norm_before_residual,
                    "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(config.aux_layers),
                                     "use_aux_hidden_state": True}})
    if dtype is not None:
        out["torch_dtype"] = str(dtype).removeprefix("torch.")
    out.update(extra or {})
    return out


def save_eagle_head(head: EagleHead, out_dir: str | Path, *, draft_ids: torch.Tensor | None = None,
                    dtype: torch.dtype | None = None, extra: Mapping[str, Any] | None = None) -> Path:
    """Write ``head`` as ``config.json`` + ``model.safetensors`` in the engines' layout (module docstring),
    the two files as one set; ``draft_ids`` (V_d,) the reduced vocabulary's target ids (written as ``d2t`` /
    ``t2d``); ``dtype`` the stored precision (default the head's). Returns ``out_dir``.

    Raises:
        CheckpointError: a reduced vocabulary without ``draft_ids`` or with ids :func:`reduced_vocab_maps`
            refuses (nothing is written).
    """
    config = head.config
    tensors = {k: v.detach().to("cpu", dtype or v.dtype).contiguous() for k, v in head.state_dict().items()}
    if config.kind == "eagle3" and (draft_ids is not None or config.draft_vocab_size < config.vocab_size):
        if draft_ids is None or draft_ids.numel() != config.draft_vocab_size:
            raise CheckpointError(f"a draft vocabulary of {config.draft_vocab_size} tokens needs its "
                                  f"{config.draft_vocab_size} target ids")
        ids = draft_ids.to("cpu", torch.int64)
        reduced_vocab_maps(ids - torch.arange(ids.numel()), None, config.vocab_size, "draft_ids")
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        tensors.update({"d2t": (ids - torch.arange(ids.numel())).contiguous(), "t2d": t2d})
    out = Path(out_dir)
    cfg = eagle_config_dict(config, dtype=dtype or head.dtype, extra=extra)
    _save_pair(out, EAGLE_WEIGHT_FILES[0], safetensors_save(tensors, metadata={"format": "pt"}), cfg)
    return out


# ------------------------------------------------------------------------------------------------- Medusa
_MEDUSA_PREFIX = "medusa_head."


def read_medusa_config(folder: str | Path, target: ModelConfig) -> MedusaConfig:
    """Medusa heads' :class:`MedusaConfig` from ``config.json`` and the weight file's headers, checked
    against the target (H and V come from the weights: Medusa's config does not store them; where a config does
    name ``hidden_size`` or ``vocab_size``, they are checked too).

    Raises:
        CheckpointError: naming the file and the field: another architecture, a missing head or layer count,
            an LM head whose shape is not the target's (vocabulary, hidden size), a missing or extra tensor.
    """
    folder = Path(folder)
    path = folder / CONFIG_FILE
    cfg = _read_json(path)
    archs = cfg.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not set(archs) <= set(MEDUSA_ARCHITECTURES)):
        raise CheckpointError(f"{path}: architectures = {archs!r} are not Medusa heads (known: "
                              f"{', '.join(MEDUSA_ARCHITECTURES)}, or none)")
    for key in ("medusa_num_heads", "medusa_num_layers"):
        if key not in cfg:
            raise CheckpointError(f"{path}: {key} is missing (Medusa's config names its heads and their layers)")
    K = config_int(cfg, "medusa_num_heads", path)
    L = config_int(cfg, "medusa_num_layers", path, minimum=0)
    for key, theirs in (("hidden_size", target.dim), ("vocab_size", target.vocab_size)):
        if cfg.get(key) is not None and config_int(cfg, key, path) != theirs:  # a config that names them (Medusa-2's)
            raise CheckpointError(f"{path}: {key} = {cfg[key]} but the target's is {theirs} (heads for another "
                                  "target)")
    config = MedusaConfig(num_heads=K, num_layers=L, hidden_size=target.dim, vocab_size=target.vocab_size,
                          name=folder.name, base_model=cfg.get("base_model_name_or_path"))
    with ExitStack() as stack:
        w = _Weights(_weight_file(folder, MEDUSA_WEIGHT_FILES), stack)
        _check_medusa_weights(config, w)
    return config


def _medusa_names(w: _Weights) -> tuple[dict[str, tuple[int, ...]], Callable[[str], str]]:
    """The weight file's tensors under :class:`MedusaHeads` names (``medusa_head.{k}.{j}...``), and module name ->
    the file's name: the same where the file's names carry the ``medusa_head.`` prefix (a whole model's state
    dict), without it where none does (Medusa's own ``medusa_lm_head`` files).

    Raises:
        CheckpointError: a file whose names mix the two."""
    prefixed = [k.startswith(_MEDUSA_PREFIX) for k in w.shapes]
    if all(prefixed):
        return dict(w.shapes), lambda n: n
    if any(prefixed):
        bare = next(k for k, p in zip(w.shapes, prefixed) if not p)
        raise CheckpointError(f"{w.path}: tensor {bare} has no {_MEDUSA_PREFIX!r} prefix where others have it: "
                              "Medusa heads are stored with it on every tensor (a model's state dict) or on none "
                              "(Medusa's medusa_lm_head files), and nothing else")
    return {_MEDUSA_PREFIX + k: v for k, v in w.shapes.items()}, lambda n: n[len(_MEDUSA_PREFIX):]


def _indices_under(names, prefix: str) -> set[int]:
    """The integer i of every name ``<prefix><i>.…`` (``medusa_head.3.0.linear.weight`` -> 3)."""
    out = set()
    for n in names:
        if n.startswith(prefix):
            head = n[len(prefix):].split(".", 1)[0]
            if head.isdigit():
                out.add(int(head))
    return out


def _check_count(path: Path, key: str, claimed: int, found: set[int], what: str) -> None:
    """A config's count against the file's: refused before a module of ``claimed`` parts is built (a count of
    10**9 would build 10**9 modules before any name was compared)."""
    if claimed != len(found):
        raise CheckpointError(f"{path}: {key} = {claimed} but the weight file holds {len(found)} {what}"
                              + (f" (indices {min(found)}..{max(found)})" if found else ""))


def _check_medusa_weights(config: MedusaConfig, w: _Weights) -> None:
    """Medusa's weight file against ``config``: head and block counts, head 0's LM head, then strictly every
    tensor's name, shape and dtype; messages name the file's own tensors (CheckpointError)."""
    shapes, file_name = _medusa_names(w)
    _check_count(w.path.with_name(CONFIG_FILE), "medusa_num_heads", config.num_heads,
                 _indices_under(shapes, _MEDUSA_PREFIX), "heads")
    blocks = _indices_under(shapes, f"{_MEDUSA_PREFIX}0.")  # head 0: its residual blocks 0..L-1 and LM head L
    if blocks and len(blocks) != config.num_layers + 1:
        raise CheckpointError(f"{w.path.with_name(CONFIG_FILE)}: medusa_num_layers = {config.num_layers} but the weight "
                              f"file's head 0 holds {len(blocks) - 1} residual blocks before its LM head")
    head0 = f"{_MEDUSA_PREFIX}0.{config.num_layers}.weight"
    want = (config.vocab_size, config.hidden_size)
    if head0 in shapes and tuple(shapes[head0]) != want:
        raise CheckpointError(f"{w.path}: {file_name(head0)} has shape {tuple(shapes[head0])} but the target's "
                              f"vocabulary x hidden size is {want} (heads for another target)")
    meta = MedusaHeads(config, device="meta")
    _check_names(w.path, w.shapes, {file_name(k): tuple(v.shape) for k, v in meta.state_dict().items()})
    w.check_dtypes()


def load_medusa_heads(folder: str | Path, target: Any, *, device: torch.device | str | None = None,
                      dtype: torch.dtype = torch.float32) -> MedusaHeads:
    """Load Medusa heads for ``target`` (checked by :func:`read_medusa_config` first). Returns them in eval mode
    on the target's device (``device`` overrides).

    Raises:
        CheckpointError: as :func:`read_medusa_config`, before any weight is copied; NaN or infinite weights.
    """
    folder = Path(folder)
    config = read_medusa_config(folder, target.config)
    dev = target.device if device is None else torch.device(device)
    with ExitStack() as stack:
        w = _Weights(_weight_file(folder, MEDUSA_WEIGHT_FILES), stack)
        heads = MedusaHeads(config, device=dev, dtype=dtype)
        _fill(heads, w.fetch, _medusa_names(w)[1], w.path)
    return heads.eval()


def save_medusa_heads(heads: MedusaHeads, out_dir: str | Path, *, base_model: str | None = None) -> Path:
    """Write ``heads`` as Medusa does: ``config.json`` (``medusa_num_heads``, ``medusa_num_layers``,
    ``base_model_name_or_path``) and ``medusa_lm_head.safetensors`` holding ``medusa_head``'s state dict
    (names ``{k}.{j}...``), as one set. Returns ``out_dir``."""
    c = heads.config
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in heads.medusa_head.state_dict().items()}
    out = Path(out_dir)
    _save_pair(out, MEDUSA_WEIGHT_FILES[0], safetensors_save(tensors, metadata={"format": "pt"}),
               {"medusa_num_heads": c.num_heads, "medusa_num_layers": c.num_layers,
                "base_model_name_or_path": base_model or c.base_model})
    return out


def _save_pair(out: Path, weight_file: str, weights: bytes, config: Mapping[str, Any]) -> None:
    """A head's weight file then its ``config.json``, as one set (:func:`~sequoia_opt._io.write_all`): a failure
    puts the first back, so a folder never holds new weights beside an old config."""
    out.mkdir(parents=True, exist_ok=True)
    write_all([(out / weight_file, lambda q: atomic_write_bytes(q, weights)),
               (out / CONFIG_FILE, lambda q: atomic_write_text(q, json.dumps(config, indent=2) + "\n"))])
