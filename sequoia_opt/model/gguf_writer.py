"""Write a model the project loads (the bundled draft, any Llama-family HF or GGUF checkpoint) as a GGUF file
that llama.cpp loads, with its tokenizer: the inverse of :mod:`.gguf_loader` (issue 20: llama.cpp's
speculative decoding takes the draft as a GGUF, ``--model-draft``).

Sources: the GGUF spec (ggml ``docs/gguf.md``) and llama.cpp ``convert_hf_to_gguf.py`` (``LlamaModel``:
metadata keys, tensor names, the Q/K row permutation :func:`~.gguf_loader.permute_qk`, tokenizer keys
``tokenizer.ggml.*`` with token types 1 normal / 3 control / 4 user-defined / 5 unused, ``Qwen2Model``: no
permutation). Tensors are written with ``gguf.GGUFWriter`` (the package kept with llama.cpp); 1-D tensors
(norms, biases) are always F32, as llama.cpp's converter writes them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._io import atomic_output_path
from ..errors import CheckpointError
from .config import ModelConfig
from .gguf_loader import _BLOCK_NAMES, _GLOBAL_NAMES, _ROPE_FREQS, permute_qk
from .llama import Transformer, rope_inv_freq
from .tokenizer import _DEFAULT_PATTERNS, _LLAMA3_PATTERN, _QWEN2_PATTERN, SpmTokenizer, Tokenizer

#: ``--outtype`` values: how 2-D weights are stored (1-D tensors are F32 in every case).
OUTTYPES = ("f32", "f16", "q8_0")

_HF_TO_GGUF = {**{v: k.removesuffix(".weight") for k, v in _GLOBAL_NAMES.items()},
               **{v: k for k, v in _BLOCK_NAMES.items()}}


def gguf_tensor_name(name: str) -> str:
    """The GGUF tensor name of a :class:`Transformer` parameter (``layers.3.self_attn.q_proj.weight`` ->
    ``blk.3.attn_q.weight``); the inverse of :func:`~.gguf_loader.hf_tensor_name`.

    Raises:
        CheckpointError: a parameter with no GGUF name.
    """
    if name in _HF_TO_GGUF:
        return _HF_TO_GGUF[name] + ".weight"
    parts = name.split(".")
    if parts[0] == "layers" and len(parts) >= 4:
        module, kind = ".".join(parts[2:-1]), parts[-1]
        if module in _HF_TO_GGUF:
            return f"blk.{parts[1]}.{_HF_TO_GGUF[module]}.{kind}"
    raise CheckpointError(f"parameter {name} has no GGUF tensor name")


def gguf_pre_tokenizer(tokenizer: Tokenizer) -> str:
    """The ``tokenizer.ggml.pre`` name llama.cpp runs the same pre-tokenization as, read off the
    ``tokenizers`` pre-tokenizer (the inverse of :data:`~.tokenizer.PRE_TOKENIZERS`): GPT-2 ``ByteLevel`` ->
    ``gpt-2``; ``Digits(individual) + ByteLevel`` (SmolLM, StarCoder) -> ``smollm``; the Llama 3 and Qwen2 split
    regexes -> ``llama-bpe`` / ``qwen2``; llama.cpp's default regex sequence -> ``default``.

    Raises:
        CheckpointError: another pre-tokenizer (llama.cpp would split text differently).
    """
    pre = json.loads(tokenizer.backend.to_str()).get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"  # llama.cpp's name (llama-vocab.cpp); it refuses "gpt2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split"] * len(_DEFAULT_PATTERNS) + ["ByteLevel"] and [
            (st.get("pattern") or {}).get("Regex") for st in steps[:-1]] == list(_DEFAULT_PATTERNS):
        return "default"
    if kinds == ["Split", "ByteLevel"]:
        pattern = (steps[0].get("pattern") or {}).get("Regex")
        for name, regex in (("llama-bpe", _LLAMA3_PATTERN), ("qwen2", _QWEN2_PATTERN)):
            if pattern == regex:
                return name
    raise CheckpointError(f"cannot name this tokenizer's pre-tokenizer ({' + '.join(map(str, kinds)) or 'none'}) "
                          "for llama.cpp (known: default, gpt-2, smollm, llama-bpe, qwen2)")


def _merges(tokenizer: Tokenizer) -> list[str]:
    model = json.loads(tokenizer.backend.to_str()).get("model") or {}
    if model.get("type") != "BPE":
        raise CheckpointError(f"tokenizer model {model.get('type')!r}: the GGUF writer writes byte-level BPE (gpt2) only")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if not merges:
        raise CheckpointError("the tokenizer has no BPE merges; llama.cpp's gpt2 tokenizer needs "
                              "tokenizer.ggml.merges (and the gguf package writes no empty array)")
    return merges


def _tokens(tokenizer: Tokenizer, n_vocab: int) -> tuple[list[str], list[int]]:
    """Token strings in id order and their GGUF types; ids past the tokenizer (a padded embedding) become
    ``[PAD<id>]`` of type unused, as llama.cpp's converter pads them."""
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in vocab.items()}
    if len(by_id) != len(vocab) or (by_id and max(by_id) >= n_vocab):
        raise CheckpointError(f"the tokenizer has {len(vocab)} tokens (largest id {max(by_id)}) but the model's "
                              f"embedding {n_vocab} rows")
    added = {a.content: a.special for a in tokenizer.backend.get_added_tokens_decoder().values()}
    tokens, types = [], []
    for i in range(n_vocab):
        t = by_id.get(i)
        if t is None:
            tokens.append(f"[PAD{i}]")
            types.append(5)
        else:
            tokens.append(t)
            types.append(1 if t not in added else (3 if added[t] else 4))
    return tokens, types


def _rope_factors(config: ModelConfig) -> np.ndarray | None:
    """(head_dim / 2,) float32 divisors of the rotary frequencies for ``rope_freqs.weight``: llama.cpp's form of
    Llama 3 scaling and of explicit freq factors (what :func:`~.gguf_loader.rope_from_gguf` reads back)."""
    rs = config.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind != "llama3" and config.rope_freq_factors is None:
        return None
    plain = config.with_(rope_scaling=None if kind == "llama3" else config.rope_scaling, rope_freq_factors=None)
    factors = (rope_inv_freq(plain).double() / rope_inv_freq(config).double()).numpy()
    return factors.astype(np.float32)


def write_gguf(path: str | os.PathLike, model: Transformer, tokenizer: Tokenizer, *, outtype: str = "f16",
               name: str | None = None) -> Path:
    """Write ``model`` and ``tokenizer`` as a GGUF file llama.cpp loads; atomically (nothing is left at
    ``path`` on failure).

    Architecture ``llama`` (Q and K rows permuted with :func:`~.gguf_loader.permute_qk`, as llama.cpp's
    converter does, so llama.cpp's interleaved rotary equals HF's rotate-half), or ``qwen2`` for a model with
    q/k/v biases (no permutation). Tied embeddings write no ``output.weight`` (llama.cpp reuses
    ``token_embd``). Linear rope scaling goes to ``{arch}.rope.scaling.*``, Llama 3 scaling and freq factors to
    ``rope_freqs.weight``.

    Args:
        path: the ``.gguf`` file to write.
        model: the model, any dtype (tensors are read as float32 and stored as ``outtype``).
        tokenizer: its byte-level BPE tokenizer (``tokenizer.ggml.model = gpt2``).
        outtype: ``f32``, ``f16`` or ``q8_0`` for 2-D weights (:data:`OUTTYPES`).
        name: ``general.name`` (default: the config's name).

    Returns:
        the path written.

    Raises:
        CheckpointError: an unknown outtype, a tokenizer that is not byte-level BPE (SentencePiece) or whose
            pre-tokenizer llama.cpp cannot name, a vocabulary larger than the embedding, rope scaling llama.cpp
            cannot take.
        OutputError: the file cannot be written.
    """
    import gguf
    from gguf import GGMLQuantizationType as Q, LlamaFileType

    if outtype not in OUTTYPES:
        raise CheckpointError(f"unknown GGUF outtype {outtype!r}; choose one of {', '.join(OUTTYPES)}")
    c = model.config
    arch = "qwen2" if c.attention_bias else "llama"
    rs = c.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type"))
    if arch == "qwen2" and (kind == "llama3" or c.rope_freq_factors is not None):
        raise CheckpointError("llama.cpp's qwen2 reads no rope_freqs: a biased model with Llama 3 scaling or freq "
                              "factors cannot be written")
    if isinstance(tokenizer, SpmTokenizer):  # else "cannot name this tokenizer's pre-tokenizer (None)"
        raise CheckpointError("the tokenizer is SentencePiece (GGUF tokenizer.ggml.model 'llama'); the GGUF writer "
                              "writes byte-level BPE ('gpt2') vocabularies only: use a SentencePiece .gguf draft as is")
    pre = gguf_pre_tokenizer(tokenizer)
    merges = _merges(tokenizer)
    tokens, types = _tokens(tokenizer, c.vocab_size)
    add_bos = tokenizer.bos_id is not None and tokenizer.encode("a")[:1] == [tokenizer.bos_id]
    file_type = {"f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16, "q8_0": LlamaFileType.MOSTLY_Q8_0}

    state = {k: v.detach().to("cpu", torch.float32).numpy() for k, v in model.state_dict().items()}
    if c.tie_embeddings:
        state.pop("lm_head.weight", None)
    with atomic_output_path(path) as tmp:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_name(name or c.name)
        w.add_file_type(file_type[outtype])
        w.add_context_length(c.max_position_embeddings)
        w.add_embedding_length(c.dim)
        w.add_block_count(c.n_layers)
        w.add_feed_forward_length(c.intermediate_size)
        w.add_head_count(c.n_heads)
        w.add_head_count_kv(c.n_kv_heads)
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
        w.add_rope_dimension_count(c.head_dim)
        w.add_rope_freq_base(float(c.rope_theta))
        w.add_layer_norm_rms_eps(float(c.norm_eps))
        w.add_vocab_size(c.vocab_size)
        if kind == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(rs["factor"]))
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        if tokenizer.bos_id is not None:
            w.add_bos_token_id(tokenizer.bos_id)
        if tokenizer.eos_id is not None:
            w.add_eos_token_id(tokenizer.eos_id)
        w.add_add_bos_token(add_bos)
        if tokenizer.chat_template is not None:
            w.add_chat_template(tokenizer.chat_template)
        factors = _rope_factors(c) if arch == "llama" else None
        if factors is not None:
            w.add_tensor(_ROPE_FREQS, factors)
        for key, arr in state.items():
            tname = gguf_tensor_name(key)
            if arch == "llama" and ".self_attn.q_proj." in key:
                arr = permute_qk(arr, c.n_heads)
            elif arch == "llama" and ".self_attn.k_proj." in key:
                arr = permute_qk(arr, c.n_kv_heads)
            arr = np.ascontiguousarray(arr)
            if arr.ndim == 1 or outtype == "f32":
                w.add_tensor(tname, arr.astype(np.float32))
            elif outtype == "f16":
                w.add_tensor(tname, arr.astype(np.float16))
            else:
                if arr.shape[-1] % 32:
                    raise CheckpointError(f"tensor {tname}: {arr.shape[-1]} columns are not a multiple of 32 "
                                          "(Q8_0 blocks); use --outtype f16")
                w.add_tensor(tname, gguf.quants.quantize(arr, Q.Q8_0), raw_dtype=Q.Q8_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return Path(path)


def describe(path: str | os.PathLike) -> dict[str, Any]:
    """What a written GGUF holds, for a report: architecture, tensor count, size in MB, file type."""
    from .gguf_loader import _field, open_gguf

    r = open_gguf(path)
    return {"architecture": _field(r, "general.architecture"), "tensors": len(r.tensors),
            "size_mb": round(Path(path).stat().st_size / 1e6, 2),
            "file_type": int(_field(r, "general.file_type", -1))}
