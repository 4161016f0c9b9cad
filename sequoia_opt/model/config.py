"""Model configuration for the Llama family (Llama 2/3, Mistral, Qwen2, SmolLM), gpt-fast ``ModelArgs`` style:
a dataclass with named presets and derived fields."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import CheckpointError

#: ``rope_scaling`` types applied (as ``transformers``' ``modeling_rope_utils`` computes them); others refused.
ROPE_TYPES = ("default", "linear", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


_MISSING = object()


def config_int(cfg: dict[str, Any], key: str, where: Any = "config.json", default: Any = _MISSING, *,
               minimum: int = 1) -> int:
    """An integer field of a ``config.json`` (a JSON integer, not a string, float or bool), at least ``minimum``.

    Raises:
        CheckpointError: ``"<where> lacks '<key>'"`` (absent, no default) or ``"<where>: <key> = <value> must be an
            integer >= <minimum>"``.
    """
    v = cfg.get(key, default)
    if v is _MISSING:
        raise CheckpointError(f"{where} lacks {key!r}")
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise CheckpointError(f"{where}: {key} = {v!r} must be an integer >= {minimum}")
    return int(v)


def config_float(cfg: dict[str, Any], key: str, where: Any = "config.json", default: Any = _MISSING) -> float:
    """A positive finite number field of a ``config.json`` (``rms_norm_eps``).

    Raises:
        CheckpointError: ``"<where>: <key> = <value> must be a positive number"`` (a string, a list, NaN, 0, < 0).
    """
    v = cfg.get(key, default)
    if v is _MISSING:
        raise CheckpointError(f"{where} lacks {key!r}")
    if not _positive(v):
        raise CheckpointError(f"{where}: {key} = {v!r} must be a positive number")
    return float(v)


def config_bool(cfg: dict[str, Any], key: str, where: Any = "config.json", default: bool = False) -> bool:
    """A ``true`` / ``false`` field of a ``config.json`` (``"no"`` or ``"false"`` as strings would read as True).

    Raises:
        CheckpointError: ``"<where>: <key> = <value> must be true or false"``.
    """
    v = cfg.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise CheckpointError(f"{where}: {key} = {v!r} must be true or false")
    return v


def check_rope_scaling(rs: Any) -> None:
    """Refuse a ``rope_scaling`` dict that :func:`~sequoia_opt.model.llama.rope_inv_freq` would not compute as
    ``transformers`` does (``modeling_rope_utils``: ``_compute_default_rope_parameters``,
    ``_compute_linear_scaling_rope_parameters``, ``_compute_llama3_parameters``).

    Accepted: None; ``{"rope_type" (or legacy "type"): "default"}``; ``"linear"`` with a positive ``factor``;
    ``"llama3"`` with all of ``factor``, ``low_freq_factor``, ``high_freq_factor`` (> ``low_freq_factor``) and
    ``original_max_position_embeddings`` (transformers requires them too). Other keys are ignored, as
    transformers ignores them for these types.

    Raises:
        CheckpointError: one line naming the key and value: another type (``dynamic``, whose frequencies
            change with the sequence length; ``yarn``, ``longrope``, ...), a missing or non-positive parameter.
    """
    if rs is None:
        return
    if not isinstance(rs, dict):
        raise CheckpointError(f"rope_scaling = {rs!r} is not a dict")
    kind = rs.get("rope_type", rs.get("type"))
    if kind not in ROPE_TYPES:
        raise CheckpointError(f"rope_scaling rope_type = {kind!r} is not supported "
                              f"(supported: {', '.join(ROPE_TYPES)})")
    needed = {"default": (), "linear": ("factor",), "llama3": _LLAMA3_KEYS}[kind]
    for key in needed:
        if key not in rs:
            raise CheckpointError(f"rope_scaling ({kind}) lacks {key!r}")
        if not _positive(rs[key]):
            raise CheckpointError(f"rope_scaling ({kind}) {key} = {rs[key]!r} is not a positive number")
    if kind == "llama3" and rs["high_freq_factor"] <= rs["low_freq_factor"]:
        raise CheckpointError(f"rope_scaling (llama3) high_freq_factor = {rs['high_freq_factor']!r} must exceed "
                              f"low_freq_factor = {rs['low_freq_factor']!r}")


def _hf_rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, rope_scaling)`` of a ``config.json``: transformers 4 writes ``rope_theta`` and
    ``rope_scaling``; transformers 5 writes one ``rope_parameters`` dict holding ``rope_type``, ``rope_theta``
    and the scaling parameters (and reads ``rope_scaling`` as an alias of it). A ``partial_rotary_factor``
    other than 1 (rotary on part of each head) is refused."""
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    if params is not None and scaling is not None and params != scaling:
        raise CheckpointError(f"config.json has both rope_parameters = {params!r} and rope_scaling = {scaling!r}")
    rope = params if params is not None else scaling
    if rope is not None and not isinstance(rope, dict):
        raise CheckpointError(f"config.json rope_{'parameters' if params is not None else 'scaling'} = {rope!r} "
                              f"is not a dict")
    rope = dict(rope or {})
    nested = [k for k, v in rope.items() if isinstance(v, dict)]
    if nested:  # transformers 5 keys rope_parameters by layer type for models that mix attention types
        raise CheckpointError(f"config.json rope parameters per layer type ({', '.join(nested)}) are not supported")
    theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
    partial = rope.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise CheckpointError(f"config.json partial_rotary_factor = {partial!r} is not supported (rotary on the "
                              f"whole head only)")
    if not _positive(theta):
        raise CheckpointError(f"config.json rope_theta = {theta!r} is not a positive number")
    if params is None:
        return float(theta), scaling
    # transformers 5 reads a missing rope_type as "default", which takes no other parameter
    return float(theta), None if rope.get("rope_type", rope.get("type", "default")) == "default" else rope


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a Llama-family decoder.

    Attributes:
        vocab_size: tokens in the embedding / LM head.
        dim: hidden size d_model.
        n_layers: decoder blocks.
        n_heads: query heads.
        n_kv_heads: key/value heads (grouped-query attention when < n_heads; Ainslie et al. 2023).
        intermediate_size: SwiGLU hidden size.
        head_dim: per-head size; derived as ``dim // n_heads`` when 0.
        norm_eps: RMSNorm epsilon.
        rope_theta: rotary base (Su et al. 2021).
        rope_scaling: None, or a Hugging Face ``rope_scaling`` dict: ``{"rope_type": "linear", "factor": f}``
            or ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
            "original_max_position_embeddings"}`` (checked by :func:`check_rope_scaling`).
        rope_freq_factors: None, or (head_dim / 2,) positive divisors of the rotary frequencies, applied after
            ``rope_scaling``: llama.cpp's ``rope_freqs.weight`` ("freq factors"), which has no ``config.json``
            equivalent unless it matches Llama 3 scaling.
        max_position_embeddings: the model's context length in tokens.
        tie_embeddings: the LM head shares the embedding matrix.
        attention_bias: q/k/v projections carry a bias (Qwen2).
        name: a label for reports.
    """

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    head_dim: int = 0
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    rope_freq_factors: tuple[float, ...] | None = None
    max_position_embeddings: int = 2048
    tie_embeddings: bool = False
    attention_bias: bool = False
    name: str = field(default="llama", compare=False)  # a label: two configs of one shape are one model

    def __post_init__(self) -> None:
        for key in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "intermediate_size",
                    "max_position_embeddings"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CheckpointError(f"model config {key} = {v!r} must be a positive integer")
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim < 0:
            raise CheckpointError(f"model config head_dim = {self.head_dim!r} must be an integer >= 0 "
                                  "(0: dim / n_heads)")
        if not _positive(self.norm_eps):
            raise CheckpointError(f"model config norm_eps = {self.norm_eps!r} must be a positive number")
        if self.head_dim == 0:
            if self.dim % self.n_heads:
                raise CheckpointError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.head_dim % 2:
            raise CheckpointError(f"head_dim {self.head_dim} is odd: rotary embeddings rotate pairs of dimensions, so "
                                  "a Llama-family head_dim is even")
        if self.n_heads % self.n_kv_heads:
            raise CheckpointError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        check_rope_scaling(self.rope_scaling)
        if self.rope_freq_factors is not None:
            ff = tuple(float(f) for f in self.rope_freq_factors)
            if len(ff) != self.head_dim // 2 or not all(_positive(f) for f in ff):
                raise CheckpointError(f"rope_freq_factors must be {self.head_dim // 2} positive numbers "
                                      f"(head_dim / 2), got {len(ff)}")
            object.__setattr__(self, "rope_freq_factors", ff)

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    def num_parameters(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        d, h, kv, hd = self.dim, self.n_heads, self.n_kv_heads, self.head_dim
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        if self.attention_bias:
            attn += h * hd + 2 * kv * hd
        mlp = 3 * d * self.intermediate_size
        emb = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return self.n_layers * (attn + mlp + 2 * d) + d + emb

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (``dataclasses.asdict``; the rotary scaling mapping copied): ``ModelConfig(**d)`` gives
        the config back."""
        return asdict(self)

    def with_(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (re-derives ``head_dim`` when ``dim``/``n_heads`` change)."""
        if ("dim" in changes or "n_heads" in changes) and "head_dim" not in changes:
            changes["head_dim"] = 0
        return replace(self, **changes)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], name: str | None = None, *, shape_only: bool = False) -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dict (LlamaForCausalLM, MistralForCausalLM,
        Qwen2ForCausalLM; rotary settings as transformers 4 or 5 writes them, see :func:`check_rope_scaling`).
        Raises :class:`CheckpointError` for a missing key, an unknown architecture, an unsupported rotary
        setting or a ``quantization_config`` (GPTQ, AWQ, bitsandbytes, ...: named by its ``quant_method``).
        ``shape_only``: the config describes a shape and no weights are read from it (``treeopt profile latency
        --random-weights --arch config.json``): a ``quantization_config`` is not refused then, the quantized
        checkpoint's architecture is the float one's."""
        family = _hf_family(cfg)
        quant = cfg.get("quantization_config")
        # GPTQ / AWQ / bitsandbytes / FP8: packed tensors, else a quantization on load
        if quant is not None and not shape_only:
            method = quant.get("quant_method") if isinstance(quant, dict) else None
            raise CheckpointError(f"config.json quantization_config (quant_method {method!r}): a quantized checkpoint, "
                                  "which treeopt does not load (it reads float weights: give the unquantized "
                                  "checkpoint, or a GGUF)")
        rope_theta, rope_scaling = _hf_rope(cfg)
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise CheckpointError(f"config.json hidden_act {act!r}: treeopt's Llama-family layers run SwiGLU (silu); "
                                  "another activation would decode another model")
        if cfg.get("mlp_bias") not in (None, False):
            raise CheckpointError(f"config.json mlp_bias = {json.dumps(cfg['mlp_bias'])}: its gate, up and down "
                                  "projections would carry biases, which treeopt's Llama-family layers do not add "
                                  "(another model would be decoded)")
        if family != "qwen2" and cfg.get("attention_bias"):
            raise CheckpointError("config.json attention_bias = true: Llama's and Mistral's put a bias on q, k, v and "
                                  "o_proj; treeopt's decoder carries the q/k/v biases only (Qwen2's)")
        n_heads, n_kv = hf_attention_heads(cfg, family)
        return cls(
            vocab_size=config_int(cfg, "vocab_size"),
            dim=config_int(cfg, "hidden_size"),
            n_layers=config_int(cfg, "num_hidden_layers"),
            n_heads=n_heads,
            n_kv_heads=n_kv,
            intermediate_size=config_int(cfg, "intermediate_size"),
            head_dim=0 if cfg.get("head_dim") is None else config_int(cfg, "head_dim", minimum=0),
            # absent: transformers' default for all three families
            norm_eps=1e-6 if cfg.get("rms_norm_eps") is None else config_float(cfg, "rms_norm_eps"),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=_hf_context(cfg, family),
            tie_embeddings=config_bool(cfg, "tie_word_embeddings"),
            attention_bias=family == "qwen2",
            name=name or cfg.get("_name_or_path") or cfg.get("model_type", ""),
        )

    @classmethod
    def preset(cls, name: str) -> "ModelConfig":
        """A named preset (shapes of public checkpoints, for random-weight latency profiling and tests).
        Raises :class:`CheckpointError` for an unknown name; see :data:`PRESETS`."""
        try:
            return PRESETS[name]
        except KeyError:
            raise CheckpointError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None


PRESETS: dict[str, ModelConfig] = {
    "llama-2-7b": ModelConfig(32000, 4096, 32, 32, 32, 11008, norm_eps=1e-5, max_position_embeddings=4096,
                              name="llama-2-7b"),
    "llama-2-13b": ModelConfig(32000, 5120, 40, 40, 40, 13824, max_position_embeddings=4096, name="llama-2-13b"),
    "llama-3-8b": ModelConfig(128256, 4096, 32, 32, 8, 14336, rope_theta=500000.0,
                              max_position_embeddings=8192, name="llama-3-8b"),
    "llama-3.1-8b": ModelConfig(128256, 4096, 32, 32, 8, 14336, rope_theta=500000.0,
                                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                                max_position_embeddings=131072, name="llama-3.1-8b"),
    "llama-3.2-1b": ModelConfig(128256, 2048, 16, 32, 8, 8192, head_dim=64, rope_theta=500000.0,
                                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                                max_position_embeddings=131072, tie_embeddings=True, name="llama-3.2-1b"),
    "mistral-7b": ModelConfig(32000, 4096, 32, 32, 8, 14336, rope_theta=1000000.0,
                              max_position_embeddings=32768, name="mistral-7b"),
    "qwen2-0.5b": ModelConfig(151936, 896, 24, 14, 2, 4864, norm_eps=1e-6, rope_theta=1000000.0,
                              max_position_embeddings=32768, tie_embeddings=True, attention_bias=True,
                              name="qwen2-0.5b"),
    "smollm2-135m": ModelConfig(49152, 576, 30, 9, 3, 1536, rope_theta=100000.0, max_position_embeddings=8192,
                                tie_embeddings=True, name="smollm2-135m"),
    "smollm2-360m": ModelConfig(49152, 960, 32, 15, 5, 2560, rope_theta=100000.0, max_position_embeddings=8192,
                                tie_embeddings=True, name="smollm2-360m"),
    # JackFram/llama-68m, the draft of the Sequoia and SpecInfer papers for Llama-2 targets
    "llama-68m": ModelConfig(32000, 768, 2, 12, 12, 3072, max_position_embeddings=2048, name="llama-68m"),
    "tiny": ModelConfig(256, 64, 2, 4, 2, 128, max_position_embeddings=512, name="tiny"),
}


#: The Hugging Face families :meth:`ModelConfig.from_hf` loads: ``model_type`` -> architecture name.
HF_FAMILIES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def _hf_family(cfg: dict[str, Any]) -> str:
    """A config's family (a key of :data:`HF_FAMILIES`): its ``model_type``, else the first known name in
    ``architectures``. Exact names: a prefix test let qwen2_moe / Qwen2-VL in, which are other architectures.
    Raises CheckpointError for any other."""
    mtype = cfg.get("model_type") or ""
    archs = cfg.get("architectures") or []
    if mtype:
        family = mtype if mtype in HF_FAMILIES else None
    else:
        family = next((f for f, a in HF_FAMILIES.items() if a in archs), None)
    if family is None:
        named = (f"model_type {mtype!r}" if mtype else f"architectures {archs!r}" if archs
                 else "no model_type or architectures")
        raise CheckpointError(f"config.json names {named}: treeopt loads {', '.join(HF_FAMILIES)} "
                              f"({', '.join(HF_FAMILIES.values())})")
    return family


#: ``num_key_value_heads`` when a config.json lacks the key: transformers' config class defaults (``LlamaConfig``
#: None, i.e. ``num_attention_heads``; ``Qwen2Config`` 32; ``MistralConfig`` 8). An explicit null is
#: ``num_attention_heads`` in all three (their ``__init__``).
_HF_DEFAULT_KV_HEADS: dict[str, int | None] = {"llama": None, "qwen2": 32, "mistral": 8}


def hf_kv_heads(cfg: dict[str, Any], family: str, n_heads: int, where: Any = "config.json") -> int:
    """The KV head count transformers reads from a ``config.json`` of ``family``: ``num_key_value_heads``; absent,
    the family's default (:data:`_HF_DEFAULT_KV_HEADS`); null (or a Llama default), ``n_heads``.

    Raises:
        CheckpointError: a value that is not a positive integer (:func:`config_int`).
    """
    if "num_key_value_heads" not in cfg:
        return _HF_DEFAULT_KV_HEADS[family] or n_heads
    return n_heads if cfg["num_key_value_heads"] is None else config_int(cfg, "num_key_value_heads", where)


def hf_attention_heads(cfg: dict[str, Any], family: str = "llama", where: Any = "config.json") -> tuple[int, int]:
    """``(query heads, KV heads)`` of a Hugging Face-style ``config.json`` (a target's, or a feature head's, which
    the engines read as Llama's), checked in the file's own key names before :class:`ModelConfig` would say
    ``dim`` / ``n_heads``: ``hidden_size`` divisible by ``num_attention_heads`` (when no ``head_dim`` is given),
    and the KV heads (:func:`hf_kv_heads`) dividing the query heads.

    Raises:
        CheckpointError: ``"<where>: <key> = <value> ..."`` for a missing, non-integer or inconsistent count.
    """
    n_heads = config_int(cfg, "num_attention_heads", where)
    n_kv = hf_kv_heads(cfg, family, n_heads, where)
    if cfg.get("head_dim") is None and (hidden := config_int(cfg, "hidden_size", where)) % n_heads:
        raise CheckpointError(f"{where}: hidden_size = {hidden} is not divisible by num_attention_heads = {n_heads} "
                              "(and no head_dim is given)")
    if n_heads % n_kv:
        raise CheckpointError(f"{where}: {hf_kv_heads_source(cfg, family, n_kv)}, which does not divide "
                              f"num_attention_heads = {n_heads}")
    return n_heads, n_kv


def hf_kv_heads_source(cfg: dict[str, Any], family: str, n_kv: int) -> str:
    """Where :func:`hf_kv_heads`' value ``n_kv`` came from, for an error message:
    ``"num_key_value_heads = 4"``, or ``"has no num_key_value_heads (transformers' qwen2 default: 32)"``."""
    if "num_key_value_heads" in cfg:
        return f"num_key_value_heads = {json.dumps(cfg['num_key_value_heads'])}"
    default = "num_attention_heads" if _HF_DEFAULT_KV_HEADS[family] is None else str(n_kv)
    return f"has no num_key_value_heads (transformers' {family} default: {default}, {n_kv} KV heads)"


#: ``max_position_embeddings`` when a config.json lacks it: transformers' defaults (``LlamaConfig`` 2048,
#: ``MistralConfig`` 4096 * 32, ``Qwen2Config`` 32768); a Mistral config is then capped at its 4096 window
_HF_DEFAULT_CONTEXT = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768}


def _hf_context(cfg: dict[str, Any], family: str) -> int:
    """The context treeopt decodes a Hugging Face config at: ``max_position_embeddings`` (when absent, the
    family's transformers default, :data:`_HF_DEFAULT_CONTEXT`), capped at the sliding attention window when one
    applies (Mistral's ``sliding_window``; Qwen2's when ``use_sliding_window`` and some layer is at or above
    ``max_window_layers`` or named ``"sliding_attention"`` in ``layer_types``; both families' window is 4096 when
    ``sliding_window`` is absent, as transformers' config classes default it; a Llama config's ``sliding_window``
    when set: transformers 4 ignored it, transformers 5's mask applies it, and within the window both agree). treeopt's
    attention is full causal; within the window it equals the model's sliding attention exactly, so decoding is
    refused past the window (a too-long prompt gets the context error) rather than run with the wrong attention.
    Raises CheckpointError for a window that is not a positive integer."""
    try:
        context = int(cfg.get("max_position_embeddings", _HF_DEFAULT_CONTEXT[family]))
    except (TypeError, ValueError):
        raise CheckpointError(f"config.json max_position_embeddings = {cfg.get('max_position_embeddings')!r} must "
                              "be a positive integer") from None
    # transformers' defaults: MistralConfig and Qwen2Config both default sliding_window to 4096 (a Qwen2 config with
    # use_sliding_window and no sliding_window slides at 4096); LlamaConfig has none
    window = cfg.get("sliding_window", 4096 if family in ("mistral", "qwen2") else None)
    n_layers, from_layer = cfg.get("num_hidden_layers"), cfg.get("max_window_layers")
    # Qwen2 slides only with use_sliding_window, from layer max_window_layers, or on the layers its layer_types
    # (transformers 5, which then reads it instead) names "sliding_attention"; a Llama window set by the config is
    # read by transformers 5's masks (not by 4's): capped, the context decodes the same under either
    layer_types = cfg.get("layer_types")
    named_sliding = isinstance(layer_types, list) and "sliding_attention" in layer_types
    no_layer_slides = (isinstance(from_layer, int) and isinstance(n_layers, int) and from_layer >= n_layers
                       and not named_sliding)
    applies = family in ("mistral", "llama") or (family == "qwen2" and bool(cfg.get("use_sliding_window", False))
                                                 and not no_layer_slides)
    if window is None or not applies:
        return context
    if family == "llama" and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        return context  # configs that loaded before Llama's window was read (0, false, 4096.0): ignored as then
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise CheckpointError(f"config.json sliding_window = {window!r} must be a positive integer or null")
    return min(context, window)
