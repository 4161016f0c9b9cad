"""GGUF files (llama.cpp): hyper-parameters and tokenizer from metadata, tensors dequantized, Q/K rows
un-permuted, loaded strictly into :class:`~sequoia_opt.model.llama.Transformer`.

Sources:
- GGUF spec (ggml ``docs/gguf.md``): metadata keys ``general.architecture``, ``{arch}.embedding_length``,
  ``{arch}.block_count``, ``{arch}.feed_forward_length``, ``{arch}.context_length``,
  ``{arch}.attention.head_count[_kv]``, ``{arch}.attention.key_length``,
  ``{arch}.attention.layer_norm_rms_epsilon``, ``{arch}.rope.freq_base``, ``{arch}.rope.dimension_count``,
  ``{arch}.rope.scaling.{type,factor}``, ``tokenizer.ggml.*``; tensor names ``token_embd``,
  ``blk.N.attn_{q,k,v,output,norm}``, ``blk.N.ffn_{gate,up,down,norm}``, ``output_norm``, ``output``,
  ``rope_freqs``. Tensor dimensions are stored fastest-varying first (``ne[0]`` = columns), i.e. reversed
  against numpy/PyTorch order; ``gguf.GGUFReader`` and ``gguf.quants.dequantize`` give numpy order.
- llama.cpp ``convert_hf_to_gguf.py``, ``LlamaModel.permute``: for ``llama`` the Q and K projection rows
  (weights and biases) are reordered per head from HF's rotate-half layout (pairs ``(i, i + D/2)``) to
  llama.cpp's interleaved layout (pairs ``(2i, 2i + 1)``); K uses the KV head count. :func:`unpermute_qk`
  undoes it. ``qwen2`` files are not permuted (llama.cpp runs them with NEOX rotary, the HF layout).
  For Llama 3.1-style ``rope_scaling`` the script writes per-frequency divisors to ``rope_freqs.weight``
  instead of metadata; :func:`config_from_gguf` recognises the standard Llama 3 parameters from them.
- Dequantization is ``gguf.quants.dequantize`` (the ``gguf`` package kept with llama.cpp); tested here for
  F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointError
from .build import build_model
from .config import ModelConfig
from .llama import Transformer, rope_inv_freq
from .tokenizer import Tokenizer, bpe_tokenizer_from_vocab

try:  # a declared dependency; without it, loading a GGUF raises a clear CheckpointError
    import gguf
    from gguf import GGMLQuantizationType, GGUFReader
except ImportError:  # pragma: no cover - gguf is a declared dependency
    gguf = None

#: Architectures loaded, and whether their Q/K rows were permuted by the llama.cpp converter.
ARCHITECTURES: dict[str, bool] = {"llama": True, "qwen2": False}

_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight",
                 "output.weight": "lm_head.weight"}
_ROPE_FREQS = "rope_freqs.weight"


def hf_tensor_name(gguf_name: str) -> str | None:
    """The :class:`Transformer` (HF) parameter name for a GGUF tensor name, or None when there is none
    (``blk.3.attn_q.weight`` -> ``layers.3.self_attn.q_proj.weight``)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.match(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def permute_qk(w: np.ndarray | torch.Tensor, n_head: int):
    """llama.cpp's reordering of Q (or K) projection rows, exactly as ``convert_hf_to_gguf.py``
    ``LlamaModel.permute``: per head, rows ``[x_0 .. x_{D/2-1}, y_0 .. y_{D/2-1}]`` become
    ``[x_0, y_0, x_1, y_1, ...]``.

    Args:
        w: (n_head * head_dim, ...) weight (out, in) or bias (out,), HF layout.
        n_head: query heads for Q, KV heads for K.
    Returns:
        the same shape, GGUF layout.
    """
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray | torch.Tensor, n_head: int):
    """Inverse of :func:`permute_qk`: (n_head * head_dim, ...) rows in GGUF order -> HF rotate-half order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _require_gguf() -> None:
    if gguf is None:  # pragma: no cover
        raise CheckpointError("reading GGUF files needs the 'gguf' package (pip install gguf)")


if gguf is not None:
    class _PlainArrayReader(GGUFReader):
        """``GGUFReader`` that keeps its file view as a plain ``np.ndarray`` over the memory map instead of an
        ``np.memmap``: parsing slices the view once per metadata item (~100k for a 49k-token vocabulary),
        and every ``np.memmap`` slice pays a Python ``__array_finalize__``; this makes opening ~3x faster.
        Parsing itself is the library's, unchanged (tested equal to the plain reader's output)."""

        @property
        def data(self) -> np.ndarray:
            return self._plain_data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain_data = np.asarray(value)  # a base-class view; keeps the memory map alive


def open_gguf(path: str | os.PathLike) -> "GGUFReader":
    """A ``gguf.GGUFReader`` over ``path`` (memory-mapped). Raises :class:`CheckpointError` when the file is
    missing or not GGUF."""
    _require_gguf()
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"GGUF file not found: {path}")
    try:
        return _PlainArrayReader(path, "r")
    except Exception as err:  # bad magic, truncated file: ValueError and friends
        raise CheckpointError(f"cannot read {path} as GGUF: {err}") from None


_MISSING = object()


def _field(reader: "GGUFReader", key: str, default: Any = _MISSING) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if default is _MISSING:
            raise CheckpointError(f"GGUF metadata lacks {key!r}")
        return default
    return f.contents()


def _f32(x: Any) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(x)))


def dequantize_tensor(t) -> np.ndarray:
    """A GGUF tensor (``gguf.ReaderTensor``) as a float32 numpy array in numpy/PyTorch dimension order (the
    reverse of the GGUF shape), for every type ``gguf.quants.dequantize`` supports.

    Raises:
        CheckpointError: an unsupported quantization type, naming the tensor.
    """
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    try:
        # a plain ndarray view of the memory map: slicing np.memmap row by row costs ~10x more
        arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    except NotImplementedError:
        raise CheckpointError(f"tensor {t.name}: quantization {t.tensor_type.name} is not supported") from None
    arr = np.asarray(arr, dtype=np.float32).reshape(shape)
    if not arr.flags.writeable:  # a view of the read-only memory map (F32): copy, so torch may own it
        arr = arr.copy()
    return arr


def _llama3_scaling(factors: np.ndarray, base: ModelConfig) -> dict[str, Any] | None:
    """Recover a Llama 3 ``rope_scaling`` dict from ``rope_freqs`` divisors (convert_hf_to_gguf.py writes
    ``1 / ((1 - smooth) / factor + smooth)`` per frequency). Tries the published parameter sets."""
    factor = _f32(factors.max())
    if np.allclose(factors, 1.0):
        return None
    for orig in (8192, 4096, 2048, 16384, 32768, 131072):
        for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0)):
            cand = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": orig}
            ref = rope_inv_freq(base.with_(rope_scaling=None)).double() / rope_inv_freq(
                base.with_(rope_scaling=cand)).double()
            if np.allclose(ref.numpy(), factors, rtol=1e-4, atol=1e-5):
                return cand
    raise CheckpointError("rope_freqs.weight does not match Llama 3 rope scaling with standard parameters")


def config_from_gguf(reader: "GGUFReader", name: str | None = None) -> ModelConfig:
    """:class:`ModelConfig` from GGUF metadata (keys in the module docstring).

    The vocabulary size is the length of ``tokenizer.ggml.tokens``; embeddings are tied when the file has
    no ``output.weight``; q/k/v bias is read off ``blk.0.attn_q.bias``.

    Raises:
        CheckpointError: an unsupported architecture, a missing key, partial rotary
            (``rope.dimension_count`` != head_dim), or an unsupported rope scaling type (YaRN, LongRoPE).
    """
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"unsupported GGUF architecture {arch!r}; treeopt loads {', '.join(ARCHITECTURES)}")
    names = {t.name for t in reader.tensors}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens.data) if tokens is not None else int(_field(reader, f"{arch}.vocab_size"))
    dim = int(_field(reader, f"{arch}.embedding_length"))
    n_heads = int(_field(reader, f"{arch}.attention.head_count"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", dim // n_heads))
    rot = int(_field(reader, f"{arch}.rope.dimension_count", head_dim))
    if rot != head_dim:
        raise CheckpointError(f"partial rotary (rope.dimension_count {rot} < head_dim {head_dim}) is unsupported")
    config = ModelConfig(
        vocab_size=n_vocab,
        dim=dim,
        n_layers=int(_field(reader, f"{arch}.block_count")),
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", n_heads)),
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        head_dim=head_dim,
        norm_eps=_f32(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_theta=_f32(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 2048)),
        tie_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        name=name or str(_field(reader, "general.name", arch)),
    )
    kind = str(_field(reader, f"{arch}.rope.scaling.type", "none"))
    if kind == "linear":
        config = config.with_(rope_scaling={"rope_type": "linear",
                                            "factor": _f32(_field(reader, f"{arch}.rope.scaling.factor"))})
    elif kind not in ("none", ""):
        raise CheckpointError(f"unsupported rope scaling {kind!r} in GGUF (supported: none, linear, llama3)")
    if _ROPE_FREQS in names:
        t = next(t for t in reader.tensors if t.name == _ROPE_FREQS)
        factors = dequantize_tensor(t).reshape(-1).astype(np.float64)
        if factors.shape != (head_dim // 2,):
            raise CheckpointError(f"{_ROPE_FREQS} has shape {factors.shape}, expected ({head_dim // 2},)")
        config = config.with_(rope_scaling=_llama3_scaling(factors, config))
    return config


def load_gguf_config(path: str | os.PathLike) -> ModelConfig:
    """:func:`config_from_gguf` for a file path (metadata only)."""
    return config_from_gguf(open_gguf(path), name=None)


def tokenizer_from_gguf(reader: "GGUFReader") -> Tokenizer:
    """Rebuild the tokenizer from ``tokenizer.ggml.*`` metadata: ``model`` must be ``gpt2`` (byte-level BPE:
    ``tokens``, ``merges``, ``token_type``, ``pre``), with ``bos_token_id``, ``eos_token_id``,
    ``eot_token_id``/``eom_token_id`` (end of turn, added to the EOS set) and ``add_bos_token``.

    Raises:
        CheckpointError: another tokenizer model (SentencePiece ``llama``, ...), an unknown pre-tokenizer, or
            missing token lists.
    """
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise CheckpointError(f"unsupported GGUF tokenizer model {model!r} (treeopt rebuilds 'gpt2' byte-level BPE)")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = _field(reader, "tokenizer.ggml.merges")
    types = _field(reader, "tokenizer.ggml.token_type", None)
    eos = _field(reader, "tokenizer.ggml.eos_token_id", None)
    extra = [_field(reader, f"tokenizer.ggml.{k}_token_id", None) for k in ("eot", "eom")]
    return bpe_tokenizer_from_vocab(
        tokens, merges,
        token_types=None if types is None else [int(t) for t in types],
        pre=str(_field(reader, "tokenizer.ggml.pre", "default")),
        bos_id=_field(reader, "tokenizer.ggml.bos_token_id", None),
        eos_id=eos,
        eos_ids=[int(i) for i in extra + [eos] if i is not None],
        add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
    )


def load_gguf(path: str | os.PathLike, *, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> tuple[Transformer, Tokenizer]:
    """Load a GGUF model strictly: every GGUF tensor must map to a model parameter (``rope_freqs`` is consumed
    by the config) and every parameter must be present with its shape, else :class:`CheckpointError` naming
    the tensor, before any data is dequantized. Q/K rows are un-permuted for ``llama``.

    Returns:
        ``(model, tokenizer)``, the model in eval mode on ``device`` in ``dtype``.
    """
    path = Path(path)
    reader = open_gguf(path)
    config = config_from_gguf(reader, name=path.stem)
    tokenizer = tokenizer_from_gguf(reader)
    by_name: dict[str, Any] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for t in reader.tensors:
        if t.name == _ROPE_FREQS:
            continue
        name = hf_tensor_name(t.name)
        if name is None:
            raise CheckpointError(f"{path}: unexpected tensor {t.name} (no model parameter maps to it)")
        by_name[name] = t
        shapes[name] = tuple(int(d) for d in reversed(t.shape.tolist()))
    permuted = ARCHITECTURES[_field(reader, "general.architecture")]

    def fetch(name: str) -> torch.Tensor:
        arr = dequantize_tensor(by_name[name])
        if permuted and ".self_attn.q_proj." in name:
            arr = unpermute_qk(arr, config.n_heads)
        elif permuted and ".self_attn.k_proj." in name:
            arr = unpermute_qk(arr, config.n_kv_heads)
        return torch.from_numpy(np.ascontiguousarray(arr))

    model = build_model(config, shapes, fetch, device=device, dtype=dtype, where=str(path))
    return model, tokenizer
