"""Hugging Face model directories: ``config.json`` + safetensors (single file or sharded with
``model.safetensors.index.json``) + ``tokenizer.json``; loading (strict) and saving (how the project ships its
trained draft model).

Layout follows ``transformers``' ``LlamaForCausalLM`` / ``Qwen2ForCausalLM``: tensors are named
``model.layers.{i}.self_attn.q_proj.weight`` ... ``model.norm.weight`` and ``lm_head.weight``; the ``model.``
prefix is stripped to get :class:`~sequoia_opt.model.llama.Transformer` parameter names. With
``tie_word_embeddings`` the LM head is the embedding and ``lm_head.weight`` is normally absent.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_save

from .._io import atomic_write_bytes, atomic_write_text, read_json_object, write_all
from ..errors import CheckpointError
from .build import build_model
from .config import ModelConfig
from .llama import Transformer
from .tokenizer import Tokenizer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
GENERATION_CONFIG_FILE = "generation_config.json"

_PREFIX = "model."
_DERIVED_SUFFIXES = (".rotary_emb.inv_freq",)  # old Llama checkpoints store this derived buffer; ignored


#: The safetensors dtypes a checkpoint's weights may have: float ones, cast to the run's dtype on load (an integer
#: tensor is a quantized checkpoint's packing or scale, which a cast would turn into other weights).
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (:func:`~sequoia_opt._io.read_json_object`). Raises :class:`CheckpointError`:
    missing, unreadable, unparsable, or not an object."""
    return read_json_object(path, error=CheckpointError, missing=f"{path.name} not found in {path.parent}")


def load_hf_config(path: str | os.PathLike, *, shape_only: bool = False) -> ModelConfig:
    """:class:`ModelConfig` from ``path/config.json``, or from ``path`` itself when it is a ``.json`` file
    (``shape_only`` as :meth:`ModelConfig.from_hf`). Raises :class:`CheckpointError` (missing file or key,
    unsupported architecture)."""
    path = Path(path)
    is_file = path.suffix.lower() == ".json"
    # a folder's (or its config.json's) name is the folder's; a config saved under its own name, that name
    name = (path.stem if path.name != CONFIG_FILE else path.resolve().parent.name) if is_file else path.resolve().name
    return _config_of(path if is_file else path / CONFIG_FILE, name, shape_only)


def _config_of(file: Path, name: str, shape_only: bool = False) -> ModelConfig:
    """:meth:`ModelConfig.from_hf` of one config file, its refusals naming the file (a target's or a draft's)."""
    try:
        return ModelConfig.from_hf(_read_json(file), name=name, shape_only=shape_only)
    except CheckpointError as err:
        if str(file) in str(err):
            raise
        msg = str(err).removeprefix("config.json: ").removeprefix("config.json ")  # the file named once
        raise CheckpointError(f"{file}: {msg}") from None


def _weight_files(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files to read, and the index's weight map (None without an index).

    Raises:
        CheckpointError: also when ``path`` holds both ``model.safetensors`` and an index: transformers loads the
            single file, vLLM the index's shards, so which weights the folder means is ambiguous.
    """
    index = path / INDEX_FILE
    if index.is_file() and (path / WEIGHTS_FILE).is_file():
        raise CheckpointError(f"{path} holds both {WEIGHTS_FILE} and {INDEX_FILE} (transformers reads the single "
                              f"file, vLLM the index's shards); remove the stale one")
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index} has no weight_map")
        files = sorted(set(weight_map.values()))
        for f in files:
            if not (path / f).is_file():
                raise CheckpointError(f"{index} lists shard {f}, which is missing")
        return [path / f for f in files], weight_map
    single = path / WEIGHTS_FILE
    if single.is_file():
        return [single], None
    found = sorted(path.glob("*.safetensors"))
    if len(found) == 1:
        return found, None
    if not found:
        raise CheckpointError(f"no *.safetensors weights in {path} (PyTorch .bin checkpoints are not loaded)")
    raise CheckpointError(f"{path} holds {len(found)} safetensors files but no {INDEX_FILE}")


def _hf_name(name: str) -> str:
    return name[len(_PREFIX):] if name.startswith(_PREFIX) else name


def check_tokenizer_fits(tokenizer: Tokenizer, rows: int, path: str | os.PathLike) -> None:
    """Raise CheckpointError naming ``path`` when the tokenizer has more tokens than the embedding's ``rows``
    (an id it encodes would index past the embedding)."""
    if tokenizer.vocab_size > rows:
        raise CheckpointError(f"{path}: tokenizer has {tokenizer.vocab_size} tokens but the embedding only {rows}")


def load_hf_tokenizer(path: str | os.PathLike, hf_config: dict[str, Any] | None = None) -> Tokenizer:
    """``path/tokenizer.json`` with BOS/EOS from ``tokenizer_config.json``, ``config.json`` and
    ``generation_config.json`` (``eos_token_id`` may be an int or a list; all of them end generation; a
    ``bos_token_id`` there is not taken when ``tokenizer_config.json`` says ``"bos_token": null``), and the
    chat template from ``chat_template.jinja`` or ``tokenizer_config.json`` (:meth:`Tokenizer.from_file`).

    Raises:
        CheckpointError: ``tokenizer.json`` missing or unreadable.
    """
    path = Path(path)
    tok = Tokenizer.from_file(path / TOKENIZER_FILE)
    cfgs = [hf_config if hf_config is not None else {}]
    gen = path / GENERATION_CONFIG_FILE
    if gen.is_file():
        cfgs.append(_read_json(gen))
    eos = set(tok.eos_ids)
    bos = tok.bos_id
    conf_path = path / "tokenizer_config.json"
    conf = _read_json(conf_path) if conf_path.is_file() else {}
    # "bos_token": null there says the tokenizer has no BOS (Qwen2.5, whose config.json still names bos_token_id
    # <|endoftext|>): transformers then gives a chat template no bos_token, so neither does treeopt
    no_bos = "bos_token" in conf and conf["bos_token"] is None
    for c in cfgs:
        e = c.get("eos_token_id")
        eos.update(int(i) for i in (e if isinstance(e, list) else [e] if e is not None else []))
        if bos is None and not no_bos and isinstance(c.get("bos_token_id"), int):
            bos = int(c["bos_token_id"])
    eos = {i for i in eos if 0 <= i < tok.vocab_size}
    return Tokenizer(tok.backend, bos_id=bos, eos_ids=eos, eos_id=tok.eos_id, chat_template=tok.chat_template)


def _check_kv_heads(path: Path, hf_config: dict[str, Any], config: ModelConfig,
                    shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse, naming the tensor and the config field in one line, a ``k_proj`` whose rows are not the config's
    KV heads x head_dim (a config without ``num_key_value_heads`` takes transformers' family default, which a
    GQA checkpoint's weights then contradict; the strict check said only "shape mismatch")."""
    from .config import _hf_family, hf_kv_heads_source

    for i in range(config.n_layers):
        shape = shapes.get(f"layers.{i}.self_attn.k_proj.weight")
        want = config.n_kv_heads * config.head_dim
        if shape is None or len(shape) != 2 or shape[0] == want:
            continue
        heads = (f"{shape[0] // config.head_dim} KV heads" if shape[0] % config.head_dim == 0
                 else f"not a multiple of head_dim {config.head_dim}")
        raise CheckpointError(f"{path}: shape mismatch for model.layers.{i}.self_attn.k_proj.weight: {shape[0]} "
                              f"rows ({heads}), but {CONFIG_FILE} "
                              f"{hf_kv_heads_source(hf_config, _hf_family(hf_config), config.n_kv_heads)} gives "
                              f"{want} (x head_dim {config.head_dim})")


def load_hf(path: str | os.PathLike, *, device: torch.device | str = "cpu",
            dtype: torch.dtype = torch.float32) -> tuple[Transformer, Tokenizer]:
    """Load a Hugging Face model directory strictly (see :mod:`sequoia_opt.model.build`).

    Raises:
        CheckpointError: a missing file, an unsupported architecture, a tensor missing from the checkpoint,
            an unexpected tensor, a tensor that is not float (:data:`FLOAT_DTYPES`), a shape mismatch, a tensor in
            two shards or not where the index says, or a tokenizer larger than the embedding; each names the file
            or tensor, before any weight is copied.
    """
    path = Path(path)
    hf_config = _read_json(path / CONFIG_FILE)
    config = _config_of(path / CONFIG_FILE, path.resolve().name)  # the folder: _name_or_path is often stale
    tokenizer = load_hf_tokenizer(path, hf_config)
    check_tokenizer_fits(tokenizer, config.vocab_size, path)
    files, weight_map = _weight_files(path)
    with ExitStack() as stack:
        where: dict[str, tuple[Any, str]] = {}  # model name -> (open file, checkpoint name)
        shapes: dict[str, tuple[int, ...]] = {}
        for file in files:
            try:
                handle = stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
            except Exception as err:  # safetensors raises its own error types
                raise CheckpointError(f"cannot read {file}: {err}") from None
            for key in handle.keys():
                if key.endswith(_DERIVED_SUFFIXES):
                    continue
                if weight_map is not None and weight_map.get(key) != file.name:
                    raise CheckpointError(f"{file}: tensor {key} is not listed for this shard in {INDEX_FILE}")
                name = _hf_name(key)
                if name in where:
                    raise CheckpointError(f"{path}: tensor {key} appears twice ({where[name][1]})")
                where[name] = (handle, key)
                piece = handle.get_slice(key)
                shapes[name] = tuple(piece.get_shape())
                if str(piece.get_dtype()) not in FLOAT_DTYPES:
                    raise CheckpointError(f"{file}: tensor {key} is {piece.get_dtype()}; treeopt reads float weights "
                                          f"({', '.join(FLOAT_DTYPES)}): give the unquantized checkpoint, or a GGUF")
        if weight_map is not None:
            absent = [k for k in weight_map if _hf_name(k) not in where and not k.endswith(_DERIVED_SUFFIXES)]
            if absent:
                raise CheckpointError(f"{path}: {INDEX_FILE} lists tensor {absent[0]}, absent from its shard")
        _check_kv_heads(path, hf_config, config, shapes)
        tied_head = config.tie_embeddings and "lm_head.weight" in shapes
        if tied_head:  # some exports store the tied head anyway; it must then equal the embedding
            shapes.pop("lm_head.weight")

        def fetch(name: str) -> torch.Tensor:
            handle, key = where[name]
            return handle.get_tensor(key)

        model = build_model(config, shapes, fetch, device=device, dtype=dtype, where=str(path))
        if tied_head:
            head = where["lm_head.weight"][0].get_tensor(where["lm_head.weight"][1])
            if tuple(head.shape) != tuple(model.embed_tokens.weight.shape) or not torch.equal(
                    head.to(dtype).to(model.device), model.embed_tokens.weight.detach()):
                raise CheckpointError(f"{path}: config ties embeddings but lm_head.weight differs from "
                                      f"model.embed_tokens.weight")
    return model, tokenizer


def hf_config_dict(config: ModelConfig, *, dtype: torch.dtype | None = None,
                   bos_id: int | None = None, eos_ids: list[int] | None = None) -> dict[str, Any]:
    """``config.json`` contents for ``config`` (transformers keys). A model with q/k/v bias is written as
    ``Qwen2ForCausalLM`` (HF's Llama puts the bias on ``o_proj`` too, which this model has not).

    Raises:
        CheckpointError: ``config.rope_freq_factors`` is set (llama.cpp per-frequency divisors from a GGUF
            ``rope_freqs.weight``), which no transformers ``rope_scaling`` type expresses.
    """
    if config.rope_freq_factors is not None:
        raise CheckpointError(f"{config.name}: rope_freq_factors (a GGUF rope_freqs.weight) have no config.json "
                              f"equivalent; cannot write a Hugging Face checkpoint")
    qwen = config.attention_bias
    out: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen else "llama",
        "_name_or_path": config.name,
        "vocab_size": config.vocab_size,
        "hidden_size": config.dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "intermediate_size": config.intermediate_size,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_embeddings,
        "attention_bias": config.attention_bias,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "use_cache": True,
    }
    if dtype is not None:
        out["torch_dtype"] = str(dtype).removeprefix("torch.")
    if bos_id is not None:
        out["bos_token_id"] = bos_id
    if eos_ids:
        out["eos_token_id"] = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    return out


def save_hf_checkpoint(model: Transformer, tokenizer: Tokenizer, out_dir: str | os.PathLike) -> Path:
    """Write ``model`` and ``tokenizer`` as a Hugging Face directory that :func:`load_hf` (and
    ``transformers``) can read: ``config.json``, ``model.safetensors`` (``model.``-prefixed names, tensors in
    the model's dtype, a tied embedding stored once), ``generation_config.json`` (BOS and all EOS ids),
    ``tokenizer.json`` and ``tokenizer_config.json``, written as one set (:func:`~sequoia_opt._io.write_all`: on a
    failure every file is put back as it was). Returns ``out_dir``.

    Raises:
        CheckpointError: the tokenizer has more tokens than the model's embedding, ``out_dir`` already
            holds a sharded checkpoint (its index would take precedence over the new single file), or the
            config has no ``config.json`` form (see :func:`hf_config_dict`); nothing is written then.
    """
    out = Path(out_dir)
    if (out / INDEX_FILE).exists():
        raise CheckpointError(f"{out} already holds a sharded checkpoint ({INDEX_FILE}); choose another folder")
    c = model.config
    if tokenizer.vocab_size > c.vocab_size:
        raise CheckpointError(f"tokenizer has {tokenizer.vocab_size} tokens, the model only {c.vocab_size}")
    eos = ([tokenizer.eos_id] if tokenizer.eos_id is not None else []) + sorted(
        tokenizer.eos_ids - {tokenizer.eos_id})
    tensors = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_embeddings:
            continue
        key = name if name == "lm_head.weight" else _PREFIX + name
        tensors[key] = t.detach().to("cpu").contiguous()
    cfg = hf_config_dict(c, dtype=model.dtype, bos_id=tokenizer.bos_id, eos_ids=eos)  # may refuse: before writing
    out.mkdir(parents=True, exist_ok=True)
    weights = safetensors_save(tensors, metadata={"format": "pt"})
    gen = {"bos_token_id": tokenizer.bos_id, "eos_token_id": eos, "do_sample": False}
    # one set: the tokenizer (its two files), then the weights, config.json last (what a loader reads first); a
    # failure or Ctrl-C puts back every file already written, so the folder never mixes two checkpoints
    write_all([(out / "tokenizer_config.json", lambda q: None),  # tokenizer.save writes it next: kept to put back
               (out / TOKENIZER_FILE, tokenizer.save),
               (out / GENERATION_CONFIG_FILE, lambda q: atomic_write_text(q, json.dumps(gen, indent=2) + "\n")),
               (out / WEIGHTS_FILE, lambda q: atomic_write_bytes(q, weights)),
               (out / CONFIG_FILE, lambda q: atomic_write_text(q, json.dumps(cfg, indent=2) + "\n"))])
    return out
