"""Model configuration for the Llama family (Llama 2/3, Mistral, Qwen2, SmolLM), gpt-fast ``ModelArgs`` style:
a dataclass with named presets and derived fields."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import CheckpointError


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
            "original_max_position_embeddings"}``.
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
    max_position_embeddings: int = 2048
    tie_embeddings: bool = False
    attention_bias: bool = False
    name: str = "llama"

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            if self.dim % self.n_heads:
                raise CheckpointError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise CheckpointError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind not in ("linear", "llama3", "default"):
                raise CheckpointError(f"unsupported rope_scaling type {kind!r} (supported: linear, llama3)")

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
        return asdict(self)

    def with_(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (re-derives ``head_dim`` when ``dim``/``n_heads`` change)."""
        if ("dim" in changes or "n_heads" in changes) and "head_dim" not in changes:
            changes["head_dim"] = 0
        return replace(self, **changes)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], name: str | None = None) -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dict (LlamaForCausalLM, MistralForCausalLM,
        Qwen2ForCausalLM). Raises :class:`CheckpointError` for a missing key or an unknown architecture."""
        archs = cfg.get("architectures") or []
        mtype = cfg.get("model_type", "")
        known = ("llama", "mistral", "qwen2")
        if mtype not in known and not any(a.lower().startswith(known) for a in archs):
            raise CheckpointError(f"unsupported architecture {archs or mtype!r}; treeopt loads {', '.join(known)}")
        try:
            n_heads = int(cfg["num_attention_heads"])
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                dim=int(cfg["hidden_size"]),
                n_layers=int(cfg["num_hidden_layers"]),
                n_heads=n_heads,
                n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
                intermediate_size=int(cfg["intermediate_size"]),
                head_dim=int(cfg.get("head_dim") or 0),
                norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(cfg.get("rope_theta", 10000.0)),
                rope_scaling=cfg.get("rope_scaling"),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", mtype == "qwen2")),
                name=name or cfg.get("_name_or_path") or mtype,
            )
        except KeyError as err:
            raise CheckpointError(f"config.json lacks {err.args[0]!r}") from None

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
