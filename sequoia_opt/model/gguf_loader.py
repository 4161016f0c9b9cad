"""GGUF files (llama.cpp): hyper-parameters and tokenizer from metadata, tensors dequantized, Q/K rows
un-permuted, loaded strictly into :class:`~sequoia_opt.model.llama.Transformer`.

Sources:
- GGUF spec (ggml ``docs/gguf.md``): metadata keys ``general.architecture``, ``{arch}.embedding_length``,
  ``{arch}.block_count``, ``{arch}.feed_forward_length``, ``{arch}.context_length``,
  ``{arch}.attention.head_count[_kv]``, ``{arch}.attention.key_length``,
  ``{arch}.attention.layer_norm_rms_epsilon``, ``{arch}.rope.*`` (see :func:`rope_from_gguf`),
  ``tokenizer.ggml.*``; tensor names ``token_embd``,
  ``blk.N.attn_{q,k,v,output,norm}``, ``blk.N.ffn_{gate,up,down,norm}``, ``output_norm``, ``output``,
  ``rope_freqs``. Tensor dimensions are stored fastest-varying first (``ne[0]`` = columns), i.e. reversed
  against numpy/PyTorch order; ``gguf.GGUFReader`` and ``gguf.quants.dequantize`` give numpy order.
- llama.cpp ``convert_hf_to_gguf.py``, ``LlamaModel.permute``: for ``llama`` the Q and K projection rows
  (weights and biases) are reordered per head from HF's rotate-half layout (pairs ``(i, i + D/2)``) to
  llama.cpp's interleaved layout (pairs ``(2i, 2i + 1)``); K uses the KV head count. :func:`unpermute_qk`
  undoes it. ``qwen2`` files are not permuted (llama.cpp runs them with NEOX rotary, the HF layout).
  For Llama 3.1-style ``rope_scaling`` the script writes per-frequency divisors to ``rope_freqs.weight``
  instead of metadata; :func:`rope_from_gguf` names them as Llama 3 parameters when they match exactly.
- How llama.cpp applies the rope keys and ``rope_freqs``: ``src/llama-model.cpp`` ``llama_model::load_hparams``
  (defaults, old key names), ``src/llama-context.cpp`` ``llama_context`` constructor (scaling type ``none``
  forces ``freq_scale = 1``; ``yarn`` turns YaRN on; ``attn_factor`` multiplies cos/sin),
  ``src/models/llama.cpp`` / ``src/models/qwen2.cpp`` (``rope_freqs`` is a llama tensor of ``n_rot/2``
  floats; qwen2 passes none), ``ggml/src/ggml-cpu/ops.cpp`` ``ggml_rope_cache_init`` / ``rope_yarn``
  (``theta = p * freq_scale * base^(-2i/n_rot) / freq_factors[i]``; freq factors must be F32).
- Dequantization is ``gguf.quants.dequantize`` (the ``gguf`` package kept with llama.cpp); tested here for
  F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K.
"""

from __future__ import annotations

import functools
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import CheckpointError
from .build import build_model
from .config import ModelConfig
from .llama import Transformer, rope_inv_freq
from .tokenizer import Tokenizer, bpe_tokenizer_from_vocab, spm_tokenizer_from_vocab

try:  # a declared dependency; without it, loading a GGUF raises a clear CheckpointError
    import gguf
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
except ImportError:  # pragma: no cover - gguf is a declared dependency
    gguf = None

if TYPE_CHECKING:
    from .tuned_linear import Int4Blocks

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
        with open(path, "rb") as f:
            magic = f.read(4)
        # gguf's own error for a file cut short is numpy's ("index 0 is out of bounds ..."): say what it means
        what = ("not a GGUF file (it does not start with GGUF)" if magic != b"GGUF" else
                f"truncated or corrupt ({path.stat().st_size} bytes; gguf says: {err})")
        raise CheckpointError(f"cannot read {path} as GGUF: {what}") from None


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


def _number_field(reader: "GGUFReader", key: str, default: float) -> float:
    """A numeric metadata value as :func:`_f32`; a string, a bool or an array there is refused, naming the key
    (llama.cpp reads these keys as numbers and rejects another type)."""
    value = _field(reader, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise CheckpointError(f"GGUF {key} = {value!r} must be a number")
    return _f32(value)


@functools.lru_cache(maxsize=None)
def _can_dequantize(qtype: "GGMLQuantizationType") -> bool:
    """Whether ``gguf.quants.dequantize`` has a dequantizer for ``qtype`` (tried on one zero block, once per type;
    integer types, F64, Q8_1 and Q8_K have none)."""
    block_bytes = gguf.GGML_QUANT_SIZES.get(qtype, (1, 0))[1]
    if block_bytes == 0:
        return False
    try:
        gguf.quants.dequantize(np.zeros((1, block_bytes), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


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
    """The Llama 3 ``rope_scaling`` dict whose frequencies equal ``base``'s divided by ``factors`` (the
    (head_dim / 2,) ``rope_freqs`` divisors; convert_hf_to_gguf.py writes ``1 / ((1 - smooth) / factor +
    smooth)`` per frequency) to float32 precision (rtol 1e-6), trying the published parameter sets; None when
    none matches (the divisors are then applied as they are)."""
    want = rope_inv_freq(base).double().numpy() / factors
    factor = _f32(factors.max())
    for orig in (8192, 4096, 2048, 16384, 32768, 131072):
        for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0)):
            cand = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": orig}
            if np.allclose(rope_inv_freq(base.with_(rope_scaling=cand)).double().numpy(), want, rtol=1e-6, atol=0):
                return cand
    return None


#: ``{arch}.rope.*`` keys :func:`rope_from_gguf` reads (suffixes); any other key under ``{arch}.rope.`` is refused.
_ROPE_KEYS = ("freq_base", "dimension_count", "scaling.type", "scaling.factor", "scale_linear",
              "scaling.attn_factor", "scaling.original_context_length", "scaling.finetuned")


def rope_from_gguf(reader: "GGUFReader", arch: str, head_dim: int) -> dict[str, Any]:
    """The rotary setup of a GGUF file as llama.cpp applies it (sources in the module docstring), as
    :class:`ModelConfig` fields ``rope_theta``, ``rope_scaling`` and ``rope_freq_factors``.

    llama.cpp rotates pair i of a head at position p by ``theta_i = p * freq_scale * base^(-2i/n_rot) / ff_i``
    radians, and multiplies cos/sin by ``attn_factor``. Each key (prefix ``{arch}.rope.``):

    - ``freq_base``: ``base`` (default 10000). Applied.
    - ``dimension_count``: ``n_rot`` (default head_dim). Must equal head_dim (llama.cpp's llama and qwen2
      graphs require it too); partial rotary is refused.
    - ``scaling.type``: default ``linear``. ``none`` forces ``freq_scale = 1`` whatever the factor; ``linear``
      applies the factor; ``yarn``, ``longrope`` and unknown names are refused.
    - ``scaling.factor`` (else the old key ``scale_linear``): ``freq_scale = 1 / factor``, no scaling when
      absent or 0. Applied as ``rope_scaling = {"rope_type": "linear", "factor": factor}``; negative or
      non-finite is refused.
    - ``scaling.attn_factor``: 1 accepted; anything else refused (it would scale rotated q and k).
    - ``scaling.original_context_length``, ``scaling.finetuned``: read by llama.cpp but used only by YaRN
      (refused above) and by other architectures' graphs; accepted, no effect.
    - any other ``{arch}.rope.*`` key (``scaling.yarn_*``, ``freq_base_swa``, ``dimension_sections``, ...):
      refused.
    - tensor ``rope_freqs.weight``: ``ff``, (head_dim / 2,) F32 positive divisors, on top of the linear factor;
      ``llama`` only (llama.cpp's qwen2 does not load it). Named as Llama 3 ``rope_scaling`` when it matches
      exactly and there is no linear factor, else kept as ``rope_freq_factors``; all ones is no change.

    Raises:
        CheckpointError: one line naming the refused key or tensor and its value.
    """
    prefix = f"{arch}.rope."
    kind = str(_field(reader, prefix + "scaling.type", "linear"))
    if kind not in ("none", "linear"):
        raise CheckpointError(f"GGUF {prefix}scaling.type = {kind!r} is not supported (none, linear)")
    for key in reader.fields:
        if key.startswith(prefix) and key[len(prefix):] not in _ROPE_KEYS:
            raise CheckpointError(f"GGUF {key} = {_field(reader, key)!r} is not supported")
    rot = int(_field(reader, prefix + "dimension_count", head_dim))
    if rot != head_dim:
        raise CheckpointError(f"GGUF {prefix}dimension_count = {rot} is not supported: partial rotary "
                              f"(head_dim {head_dim})")
    attn_factor = _number_field(reader, prefix + "scaling.attn_factor", 1.0)
    if attn_factor != 1.0:
        raise CheckpointError(f"GGUF {prefix}scaling.attn_factor = {attn_factor} is not supported (only 1)")
    factor_key = prefix + ("scaling.factor" if prefix + "scaling.factor" in reader.fields else "scale_linear")
    factor = _number_field(reader, factor_key, 0.0)
    if kind == "linear" and not (math.isfinite(factor) and factor >= 0):
        raise CheckpointError(f"GGUF {factor_key} = {factor} is not supported (a positive factor, or 0 for none)")
    scale = kind == "linear" and factor not in (0.0, 1.0)
    base = _number_field(reader, prefix + "freq_base", 10000.0)
    if not (math.isfinite(base) and base > 0):
        raise CheckpointError(f"GGUF {prefix}freq_base = {base} must be a positive finite number")
    out: dict[str, Any] = {"rope_theta": base,
                           "rope_scaling": {"rope_type": "linear", "factor": factor} if scale else None,
                           "rope_freq_factors": None}
    t = next((t for t in reader.tensors if t.name == _ROPE_FREQS), None)
    if t is None:
        return out
    if arch != "llama":
        raise CheckpointError(f"GGUF tensor {_ROPE_FREQS} in a {arch!r} file is not supported (llama.cpp's "
                              f"{arch} does not read it)")
    if t.tensor_type != GGMLQuantizationType.F32:
        raise CheckpointError(f"GGUF tensor {_ROPE_FREQS} has type {t.tensor_type.name}; llama.cpp's rope "
                              f"reads F32")
    ff = dequantize_tensor(t).reshape(-1).astype(np.float64)
    if ff.shape != (head_dim // 2,):
        raise CheckpointError(f"{_ROPE_FREQS} has shape {ff.shape}, expected ({head_dim // 2},)")
    if not (np.isfinite(ff).all() and (ff > 0).all()):
        raise CheckpointError(f"GGUF tensor {_ROPE_FREQS} holds non-positive or non-finite values "
                              f"(min {ff.min()}) and is not supported")
    if (ff == 1.0).all():
        return out
    base = ModelConfig(vocab_size=1, dim=head_dim, n_layers=1, n_heads=1, n_kv_heads=1, intermediate_size=1,
                       rope_theta=out["rope_theta"])
    llama3 = None if scale else _llama3_scaling(ff, base)
    if llama3 is not None:
        return {**out, "rope_scaling": llama3}
    return {**out, "rope_freq_factors": tuple(float(f) for f in ff)}


def config_from_gguf(reader: "GGUFReader", name: str | None = None) -> ModelConfig:
    """:class:`ModelConfig` from GGUF metadata (keys in the module docstring).

    The vocabulary size is the length of ``tokenizer.ggml.tokens``; embeddings are tied when the file has
    no ``output.weight``; q/k/v bias is read off ``blk.0.attn_q.bias``.

    Raises:
        CheckpointError: an unsupported architecture, a missing key, or a rope key or tensor that
            :func:`rope_from_gguf` refuses.
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
    return ModelConfig(
        vocab_size=n_vocab,
        dim=dim,
        n_layers=int(_field(reader, f"{arch}.block_count")),
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", n_heads)),
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        head_dim=head_dim,
        norm_eps=_f32(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        **rope_from_gguf(reader, arch, head_dim),
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 2048)),
        tie_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        name=name or str(_field(reader, "general.name", arch)),
    )


def load_gguf_config(path: str | os.PathLike) -> ModelConfig:
    """:func:`config_from_gguf` for a file path (metadata only). Raises CheckpointError naming ``path`` (a
    command reads two GGUFs, target and draft: "lacks 'llama.vocab_size'" alone did not say which)."""
    reader = open_gguf(path)
    try:
        return config_from_gguf(reader, name=None)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from None


#: ``tokenizer.ggml.pre`` names for which llama.cpp adds BOS when ``tokenizer.ggml.add_bos_token`` is absent
#: (``llama-vocab.cpp``: ``add_bos = true`` with ``LLAMA_VOCAB_PRE_TYPE_LLAMA3``; ``smaug-bpe`` does not set it).
_ADD_BOS_BY_DEFAULT = ("llama-bpe", "llama3")

#: The BOS and EOS id llama.cpp gives a ``gpt2`` (byte-level BPE) vocabulary whose file names none
#: (``llama-vocab.cpp``: ``special_bos_id = special_eos_id = 11`` before the ``tokenizer.ggml.*_token_id`` keys are
#: read; checked with llama-cpp-python 0.3.36, ``Llama(vocab_only=True).token_bos()``).
_BPE_DEFAULT_SPECIAL_ID = 11

#: The BOS / EOS ids llama.cpp gives a vocabulary whose file names none, by ``tokenizer.ggml.model``
#: (``llama-vocab.cpp``'s defaults: ``gpt2`` 11 and 11; SentencePiece ``llama`` 1 and 2).
_DEFAULT_SPECIAL_IDS = {"gpt2": {"bos": _BPE_DEFAULT_SPECIAL_ID, "eos": _BPE_DEFAULT_SPECIAL_ID},
                        "llama": {"bos": 1, "eos": 2}}


def _default_special_id(model: str | None, name: str, n_tokens: int) -> int | None:
    """llama.cpp's id for the ``name`` token (``bos`` / ``eos``) of a ``model`` vocabulary of ``n_tokens`` tokens
    whose file names none (:data:`_DEFAULT_SPECIAL_IDS`); None where it has none or it lies past the tokens."""
    i = _DEFAULT_SPECIAL_IDS.get(model or "", {}).get(name)
    return i if i is not None and i < n_tokens else None


def _token_id_field(reader: "GGUFReader", name: str, default: Any = None) -> Any:
    """``tokenizer.ggml.<name>_token_id`` read as llama.cpp reads it, a uint32 (:func:`_typed_field`)."""
    return _typed_field(reader, f"tokenizer.ggml.{name}_token_id", (GGUFValueType.UINT32,), "a uint32 token id",
                        default=default)


def _flag_field(reader: "GGUFReader", name: str, default: bool) -> bool:
    """``tokenizer.ggml.<name>`` (``add_bos_token``, ``add_eos_token``, ``add_space_prefix``) read as llama.cpp reads
    it, a bool (:func:`_typed_field`); ``default`` where the file has none."""
    return bool(_typed_field(reader, f"tokenizer.ggml.{name}", (GGUFValueType.BOOL,), "a bool", default=default))


def _chat_template(reader: "GGUFReader") -> str | None:
    """``tokenizer.chat_template``, or None. Raises CheckpointError for one that is not a string."""
    template = _field(reader, "tokenizer.chat_template", None)
    if template is not None and not isinstance(template, str):
        raise CheckpointError(f"GGUF tokenizer.chat_template must be a string, got {type(template).__name__}")
    return template


#: ``tokenizer.ggml.pre`` values :data:`~sequoia_opt.model.tokenizer.PRE_TOKENIZERS` knows that llama.cpp refuses
#: (``unknown pre-tokenizer type``), with the name llama.cpp reads for the same pre-tokenizer.
_PRE_REFUSED_BY_LLAMA_CPP = {"gpt2": "gpt-2"}


def tokenizer_from_gguf(reader: "GGUFReader") -> Tokenizer:
    """Rebuild the tokenizer from ``tokenizer.ggml.*`` metadata: ``model`` must be ``gpt2`` (byte-level BPE:
    ``tokens``, ``merges``, ``token_type``, ``pre``), with ``bos_token_id``, ``eos_token_id``,
    ``eot_token_id``/``eom_token_id`` (end of turn, added to the EOS set), ``add_bos_token`` and
    ``add_eos_token`` (llama.cpp appends EOS to a prompt where it is true, default false); the chat
    template from ``tokenizer.chat_template``. Without ``add_bos_token`` BOS is added as llama.cpp adds it:
    for the Llama 3 pre-tokenizers of :data:`_ADD_BOS_BY_DEFAULT` (whose converted files often lack the key,
    the HF tokenizer adding BOS in its post-processor), not for the others. Without ``bos_token_id`` /
    ``eos_token_id`` the id is llama.cpp's default for this vocabulary type, 11 (:data:`_BPE_DEFAULT_SPECIAL_ID`),
    so a ``llama-bpe`` file without a BOS id still starts its prompts with token 11, as llama.cpp does.

    A SentencePiece vocabulary (``model`` ``llama``: Llama 2, Mistral v0.1, TinyLlama, CodeLlama) is rebuilt by
    :func:`_spm_tokenizer_from_gguf` instead.

    Raises:
        CheckpointError: another tokenizer model (``bert``, ``t5``, ...), an unknown pre-tokenizer or one
            llama.cpp refuses (``gpt2``; its name is ``gpt-2``), missing token lists, a special id that is not a
            uint32 inside the tokens, an ``add_bos_token`` / ``add_eos_token`` that is not a bool.
    """
    model = _field(reader, "tokenizer.ggml.model")
    if model == "llama":
        return _spm_tokenizer_from_gguf(reader)
    if model != "gpt2":
        raise CheckpointError(f"unsupported GGUF tokenizer model {model!r} (treeopt rebuilds 'gpt2' byte-level BPE "
                              "and 'llama' SentencePiece)")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = _field(reader, "tokenizer.ggml.merges")
    types = _field(reader, "tokenizer.ggml.token_type", None)
    extra = [_token_id_field(reader, k) for k in ("eot", "eom")]
    pre = str(_field(reader, "tokenizer.ggml.pre", "default"))
    if pre in _PRE_REFUSED_BY_LLAMA_CPP:  # treeopt would read the file, llama.cpp (what it is run with) not
        raise CheckpointError(f"GGUF tokenizer.ggml.pre = {pre!r} is refused by llama.cpp (unknown pre-tokenizer "
                              f"type); its name for this pre-tokenizer is {_PRE_REFUSED_BY_LLAMA_CPP[pre]!r}")
    bos, eos = (_token_id_field(reader, k, _default_special_id(model, k, len(tokens))) for k in ("bos", "eos"))
    template = _chat_template(reader)
    return bpe_tokenizer_from_vocab(
        tokens, merges,
        token_types=None if types is None else [int(t) for t in types],
        pre=pre,
        bos_id=bos,
        eos_id=eos,
        eos_ids=[int(i) for i in extra + [eos] if i is not None],
        add_bos=_flag_field(reader, "add_bos_token", pre in _ADD_BOS_BY_DEFAULT and bos is not None),
        add_eos=_flag_field(reader, "add_eos_token", False),
        chat_template=template,
    )


def _typed_field(reader: "GGUFReader", key: str, types: tuple, what: str, *, array: bool = False,
                 default: Any = _MISSING) -> Any:
    """:func:`_field`, the value (each element where ``array``) of one of the GGUF value ``types``, as llama.cpp's
    typed reads take it (``get_key`` refuses another type; ``get_arr_data`` reinterprets the bytes).

    Raises:
        CheckpointError: another type, naming ``key``, ``what`` it must be and the type found.
    """
    f = reader.fields.get(key)
    if f is not None:
        is_array = f.types[0] == GGUFValueType.ARRAY
        got = f.types[1:] if is_array else f.types  # an empty array names no element type
        if is_array != array or len(got) > 1 or (got and got[0] not in types):
            found = " of ".join(["array"] * is_array + [t.name.lower() for t in got])
            raise CheckpointError(f"GGUF {key} must be {what}, got {found}")
    return _field(reader, key, default)


_BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))


def _spm_tokenizer_from_gguf(reader: "GGUFReader") -> Tokenizer:
    """:func:`tokenizer_from_gguf` for a SentencePiece (``tokenizer.ggml.model = "llama"``) vocabulary, with
    llama.cpp's defaults where the file is silent (``llama-vocab.cpp``): ``scores`` 0, ``token_type`` normal,
    ``add_space_prefix`` and ``add_bos_token`` true, ``add_eos_token`` false, BOS 1 and EOS 2
    (:data:`_DEFAULT_SPECIAL_IDS`); ``eot_token_id`` / ``eom_token_id`` join the EOS set. See
    :func:`~sequoia_opt.model.tokenizer.spm_tokenizer_from_vocab`.

    Keys are read with the types llama.cpp reads them with: ``tokens`` strings, ``scores`` float32, ``token_type``
    int32 (llama.cpp reinterprets another element type's bytes), ``*_token_id`` uint32, ``add_*`` bool (llama.cpp
    refuses another type).

    Raises:
        CheckpointError: naming the key: no or an empty token list, a key of another type, a score or token-type
            list of another length, a NaN score (llama.cpp's merge queue has no order then), a token string
            repeated (llama.cpp aborts), a byte token ``<0x00>`` .. ``<0xFF>`` missing (llama.cpp aborts on a
            character it must write as that byte), a special id outside the token list (llama.cpp falls back to
            its default id with a warning), a chat template that is not a string.
    """
    ints, f32, strs = (GGUFValueType.INT32,), (GGUFValueType.FLOAT32,), (GGUFValueType.STRING,)
    key = "tokenizer.ggml."
    tokens = [str(t) for t in _typed_field(reader, key + "tokens", strs, "an array of strings", array=True)]
    if not tokens:
        raise CheckpointError(f"GGUF {key}tokens is empty")
    scores = _typed_field(reader, key + "scores", f32, "an array of float32", array=True, default=None)
    types = _typed_field(reader, key + "token_type", ints, "an array of int32", array=True, default=None)
    for name, values in (("scores", scores), ("token_type", types)):
        if values is not None and len(values) != len(tokens):
            raise CheckpointError(f"GGUF {key}{name} has {len(values)} entries for {len(tokens)} tokens")
    if scores is not None:
        scores = [float(s) for s in scores]
        nan = next((i for i, s in enumerate(scores) if math.isnan(s)), None)
        if nan is not None:
            raise CheckpointError(f"GGUF {key}scores holds NaN (token {nan}, {tokens[nan]!r})")
    seen: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if seen.setdefault(t, i) != i:
            raise CheckpointError(f"GGUF {key}tokens repeats the token {t!r} (ids {seen[t]} and {i}); llama.cpp "
                                  "aborts on it")
    missing = [b for b in _BYTE_TOKENS if b not in seen]
    if missing:
        raise CheckpointError(f"GGUF {key}tokens lacks {len(missing)} of the 256 byte tokens ({missing[0]} first): "
                              "llama.cpp aborts on a character it must write as a missing byte")
    template = _chat_template(reader)
    ids: dict[str, int | None] = {}
    for name in ("bos", "eos", "eot", "eom"):
        i = _token_id_field(reader, name)
        if i is not None and not 0 <= int(i) < len(tokens):
            raise CheckpointError(f"GGUF {key}{name}_token_id = {i} is outside the {len(tokens)} tokens")
        ids[name] = int(i) if i is not None else _default_special_id("llama", name, len(tokens))
    return spm_tokenizer_from_vocab(
        tokens, [0.0] * len(tokens) if scores is None else scores,
        token_types=None if types is None else [int(t) for t in types],
        add_space_prefix=_flag_field(reader, "add_space_prefix", True),
        bos_id=ids["bos"], eos_id=ids["eos"],
        eos_ids=[i for i in (ids["eot"], ids["eom"], ids["eos"]) if i is not None],
        add_bos=_flag_field(reader, "add_bos_token", ids["bos"] is not None),
        add_eos=_flag_field(reader, "add_eos_token", False),
        chat_template=template,
    )


class GGUFChat:
    """A GGUF's chat template with its BOS / EOS token text, for an engine that tokenizes rendered text itself
    (llama.cpp): :func:`~sequoia_opt.prompts.prompt_texts` reads ``chat_template`` and calls :meth:`render_chat`.
    Needs no tokenizer treeopt can rebuild (a SentencePiece ``llama`` vocabulary renders too)."""

    def __init__(self, chat_template: str | None, bos_token: str | None, eos_token: str | None):
        self.chat_template, self.bos_token, self.eos_token = chat_template, bos_token, eos_token

    def render_chat(self, messages, *, add_generation_prompt: bool = True) -> str:
        """As :meth:`~sequoia_opt.model.tokenizer.Tokenizer.render_chat` (BOS / EOS written as their token text).

        Raises:
            ChatTemplateError: no chat template, or the template does not parse or refuses the conversation.
        """
        from .chat_template import ChatTemplateError, render_chat

        if self.chat_template is None:
            raise ChatTemplateError("the model has no chat template (no tokenizer.chat_template in its GGUF)")
        return render_chat(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                           bos_token=self.bos_token, eos_token=self.eos_token)


def gguf_chat(reader: "GGUFReader") -> GGUFChat:
    """The chat template (``tokenizer.chat_template``) and the text of the ``bos_token_id`` / ``eos_token_id``
    tokens (``tokenizer.ggml.tokens``) of any tokenizer model, BPE or SentencePiece; a file without an id has
    llama.cpp's default for its tokenizer model (:data:`_DEFAULT_SPECIAL_IDS`), as :func:`tokenizer_from_gguf`.

    Raises:
        CheckpointError: a template that is not a string, or a BOS / EOS id outside the token list.
    """
    template = _chat_template(reader)
    tokens = _field(reader, "tokenizer.ggml.tokens", None) if template is not None else None
    model = _field(reader, "tokenizer.ggml.model", None)
    text = {}
    for name in ("bos", "eos"):
        default = None if tokens is None else _default_special_id(model, name, len(tokens))
        i = _field(reader, f"tokenizer.ggml.{name}_token_id", default)
        if i is None or tokens is None:
            text[name] = None
            continue
        if not 0 <= int(i) < len(tokens):
            raise CheckpointError(f"GGUF tokenizer.ggml.{name}_token_id = {i} is outside the {len(tokens)} tokens")
        text[name] = str(tokens[int(i)])
    return GGUFChat(template, text["bos"], text["eos"])


def load_gguf(path: str | os.PathLike, *, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> tuple[Transformer, Tokenizer]:
    """Load a GGUF model strictly: every GGUF tensor must map to a model parameter (``rope_freqs`` is consumed
    by the config), be of a type :func:`dequantize_tensor` reads, and every parameter must be present with its
    shape, else :class:`CheckpointError` naming the file and the tensor (or metadata key), before any data is
    dequantized. Q/K rows are un-permuted for ``llama``.

    Returns:
        ``(model, tokenizer)``, the model in eval mode on ``device`` in ``dtype``.
    """
    path = Path(path)
    reader = open_gguf(path)
    try:  # name the file: a command reads two GGUFs (target and draft)
        config = config_from_gguf(reader, name=path.stem)
        tokenizer = tokenizer_from_gguf(reader)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from None
    by_name: dict[str, Any] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for t in reader.tensors:
        if t.name == _ROPE_FREQS:
            continue
        name = hf_tensor_name(t.name)
        if name is None:
            raise CheckpointError(f"{path}: unexpected tensor {t.name} (no model parameter maps to it)")
        if not _can_dequantize(t.tensor_type):  # up front: not after dequantizing every tensor before it
            raise CheckpointError(f"{path}: tensor {t.name}: quantization {t.tensor_type.name} is not supported")
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


def _int4_blocks_of(t) -> "Int4Blocks":
    """A Q4_0 / Q4_1 tensor's own blocks as :class:`~sequoia_opt.model.tuned_linear.Int4Blocks` (PyTorch
    dimension order, rows not yet un-permuted).

    ggml's layout per block of 32 weights (``ggml-common.h``): Q4_0 is ``d`` (fp16) then 16 bytes of codes,
    ``w = d (q - 8)``; Q4_1 is ``d``, ``m`` (fp16) then the codes, ``w = d q + m``. Byte j holds element j in
    its low nibble and element j + 16 in its high nibble.
    """
    from .tuned_linear import Int4Blocks

    out_f, in_f = (int(d) for d in reversed(t.shape.tolist()))
    kind = t.tensor_type.name
    head = 2 if kind == "Q4_0" else 4
    raw = np.asarray(t.data).reshape(out_f, in_f // 32, head + 16)  # (out, groups, bytes per block)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (out, groups)
    qs = raw[..., head:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(out_f, in_f)  # (out, in) codes 0..15
    if kind == "Q4_0":
        zero = np.zeros_like(d)
    else:
        m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zero = m + 8.0 * d  # d q + m = d (q - 8) + (m + 8 d)
    return Int4Blocks(torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(d), torch.from_numpy(zero))


def gguf_int4_blocks(path: str | os.PathLike) -> dict[str, "Int4Blocks"]:
    """Parameter name (Hugging Face naming) -> the 4-bit blocks of every Q4_0 / Q4_1 linear weight of a GGUF
    file, rows un-permuted as :func:`load_gguf` un-permutes Q and K, for the ``int4`` kernel of
    :mod:`~sequoia_opt.model.tuned_linear` (an exact representation of the dequantized weight). Tensors of
    other types (F32, Q8_0, K-quants) are left out; so are embeddings (a lookup, not a linear).

    Raises:
        CheckpointError: the file cannot be read as GGUF.
    """
    from .tuned_linear import Int4Blocks

    reader = open_gguf(path)
    config = config_from_gguf(reader, name=Path(path).stem)
    permuted = ARCHITECTURES[_field(reader, "general.architecture")]
    out: dict[str, Int4Blocks] = {}
    for t in reader.tensors:
        name = hf_tensor_name(t.name) if t.name != _ROPE_FREQS else None
        if name is None or t.tensor_type.name not in ("Q4_0", "Q4_1") or name == "embed_tokens.weight":
            continue
        b = _int4_blocks_of(t)
        heads = (config.n_heads if ".self_attn.q_proj." in name
                 else config.n_kv_heads if ".self_attn.k_proj." in name else None)
        if permuted and heads is not None:
            b = Int4Blocks(unpermute_qk(b.q, heads), unpermute_qk(b.scale, heads), unpermute_qk(b.zero, heads))
        out[name] = b
    return out
