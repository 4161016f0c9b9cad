"""A Llama-family decoder in PyTorch (gpt-fast / nanoGPT style): RMSNorm, rotary embeddings (with the linear
and Llama 3 ``rope_scaling`` variants and llama.cpp's per-frequency divisors), grouped-query attention, SwiGLU
MLP, tied or untied embeddings, optional q/k/v bias (Qwen2).

Every attention call goes through :func:`sequoia_opt.attention.tree_attention`, so prefill, plain decoding,
level-by-level drafting and tree verification share one code path. Device and dtype are constructor
arguments; nothing reads global defaults.

Weights use the Hugging Face layout (rotary pairs are (i, i + head_dim/2), "rotate_half"); the GGUF loader
undoes llama.cpp's interleaving permutation of the Q and K rows to match.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import TreeMask, require_tree_mask, tree_attention
from .config import ModelConfig
from .kv_cache import ModelKVCache


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """(head_dim / 2,) float32 inverse frequencies in radians per position, computed in float32 operation for
    operation as transformers computes them: pair i rotates by ``position * inv_freq[i]``.

    ``inv_freq[i] = 1 / rope_theta ** (2i / head_dim)``, then ``rope_scaling`` as transformers'
    ``modeling_rope_utils`` applies it: linear divides every frequency by ``factor`` (Chen et al. 2023,
    position interpolation); Llama 3 keeps high frequencies, divides low ones by ``factor`` and interpolates
    in between (Meta's Llama 3.1 reference ``apply_scaling``, transformers ``_compute_llama3_parameters``).
    Float32, not float64 rounded once: transformers 5.25 (``LlamaRotaryEmbedding.compute_default_rope_parameters``,
    ``_compute_linear_scaling_rope_parameters``, ``_compute_llama3_parameters``) works on float32 tensors, and
    its frequencies are those the checkpoints were trained and are served with; the float64 ones differ by an
    ulp or so, which the product with a position near 2**17 turns into ~1e-2 radians. Equal bit for bit to
    transformers' ``rotary_emb.inv_freq``.
    Then each frequency is divided by ``rope_freq_factors[i]`` when set: llama.cpp's
    ``theta = p * freq_scale * base^(-2i/n_rot) / freq_factors[i]`` (ggml ``ggml/src/ggml-cpu/ops.cpp``,
    ``ggml_rope_cache_init`` / ``rope_yarn`` without YaRN), with ``freq_scale = 1 / factor`` the linear
    scaling above.
    """
    hd = config.head_dim
    base = float(config.rope_theta)
    inv_freq = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.int64).to(torch.float32) / hd))  # float32
    rs = config.rope_scaling
    kind = None if rs is None else rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        inv_freq = inv_freq / float(rs["factor"])
    elif kind == "llama3":  # transformers' _compute_llama3_parameters, expression for expression
        factor = float(rs["factor"])
        low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old_ctx = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_ctx / high) * ~(wavelen > old_ctx / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    if config.rope_freq_factors is not None:
        inv_freq = inv_freq / torch.tensor(config.rope_freq_factors, dtype=torch.float32)
    return inv_freq


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, D) by angles whose cos/sin are (B, 1, T, D/2), pairing (i, i + D/2)."""
    x1, x2 = x.float().chunk(2, dim=-1)  # (B, H, T, D/2) each
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state-dict names) that runs device-tuned kernels when it has them.

    Untuned, or with gradients enabled (distillation), or on another device or dtype than the one it was tuned
    for, it is ``F.linear``. :func:`~sequoia_opt.model.tuned_linear.tune_linears` sets :attr:`dispatch`: the
    kernel measured fastest on this machine for the weight's shape at each row-count bucket (rows = tokens x
    batch of the forward), so plain decoding (1 row) and tree verification (2..64 rows) each run their own
    fastest path. See :mod:`sequoia_opt.model.tuned_linear`.
    """

    dispatch = None  # LinearDispatch | None, set by tune_linears

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in_features) -> (..., out_features), in ``x``'s dtype."""
        d = self.dispatch
        if (d is None or x.device.type != "cpu" or x.dtype != torch.float32
                or (torch.is_grad_enabled() and self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        return d(x, self.bias)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019), computed in float32."""

    def __init__(self, dim: int, eps: float, *, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., dim) -> (..., dim), normalised over the last axis in float32, returned in ``x``'s dtype."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query self-attention with a static KV cache."""

    def __init__(self, config: ModelConfig, *, device=None, dtype=None) -> None:
        super().__init__()
        c = config
        kw = dict(device=device, dtype=dtype)
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.q_proj = Linear(c.dim, c.n_heads * c.head_dim, bias=c.attention_bias, **kw)
        self.k_proj = Linear(c.dim, c.n_kv_heads * c.head_dim, bias=c.attention_bias, **kw)
        self.v_proj = Linear(c.dim, c.n_kv_heads * c.head_dim, bias=c.attention_bias, **kw)
        self.o_proj = Linear(c.n_heads * c.head_dim, c.dim, bias=False, **kw)

    def forward(self, x, cos, sin, layer_cache, cache_slots, prefix_len, tree_mask, backend):
        """(B, T, dim) -> (B, T, dim). ``cos`` / ``sin``: (B or 1, 1, T, head_dim/2) rotary tables
        (:func:`apply_rotary`); ``layer_cache``: this layer's cache, None for plain causal attention over the T
        tokens; ``cache_slots``, ``prefix_len``, ``tree_mask``, ``backend`` as :meth:`Transformer.forward`."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, Hq, T, D)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if layer_cache is None:
            # no cache: plain causal attention over the T tokens (training, perplexity)
            if self.n_kv_heads != self.n_heads:
                k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)  # (B, Hq, T, D)
                v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            k_all, v_all = layer_cache.update(cache_slots, k, v)  # (B, Hkv, S, D)
            y = tree_attention(q, k_all, v_all, prefix_len, tree_mask, backend=backend)  # (B, Hq, T, D)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, Hq * D)
        return self.o_proj(y)


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, *, device=None, dtype=None) -> None:
        super().__init__()
        kw = dict(bias=False, device=device, dtype=dtype)
        self.gate_proj = Linear(config.dim, config.intermediate_size, **kw)
        self.up_proj = Linear(config.dim, config.intermediate_size, **kw)
        self.down_proj = Linear(config.intermediate_size, config.dim, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., dim) -> (..., dim) through the (..., intermediate_size) gate and up projections."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, *, device=None, dtype=None) -> None:
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps, **kw)
        self.self_attn = Attention(config, **kw)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps, **kw)
        self.mlp = MLP(config, **kw)

    def forward(self, x, cos, sin, layer_cache, cache_slots, prefix_len, tree_mask, backend):
        """(B, T, dim) -> (B, T, dim); arguments as :meth:`Attention.forward`."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, layer_cache, cache_slots, prefix_len,
                               tree_mask, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """A Llama-family causal language model.

    Parameter names follow Hugging Face's ``LlamaForCausalLM`` without the ``model.`` prefix
    (``embed_tokens.weight``, ``layers.{i}.self_attn.q_proj.weight``, ..., ``norm.weight``,
    ``lm_head.weight``), so checkpoints map one-to-one.

    Args:
        config: the architecture.
        device, dtype: where and in what precision parameters live (explicit; no global defaults).
    """

    def __init__(self, config: ModelConfig, *, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        kw = dict(device=device, dtype=dtype)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim, **kw)
        self.layers = nn.ModuleList(Block(config, **kw) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps, **kw)
        self.lm_head = Linear(config.dim, config.vocab_size, bias=False, **kw)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(config).to(device), persistent=False)

    #: logit columns appended as -inf after the LM head (see :meth:`fit_vocab`); 0 for a checkpoint as loaded
    padded_logits = 0

    def fit_vocab(self, vocab_size: int) -> None:
        """Give the model another vocabulary size, ``vocab_size`` V, in place: for a draft whose embedding is
        padded to another size than its target's while both share one tokenizer (Qwen2.5 0.5B-3B have 151936
        rows, 7B-72B 152064; the ids past the tokenizer's are padding, never real tokens).

        V below the checkpoint's Vc: the embedding and the LM head keep their first V rows (the model can no
        longer propose an id the target does not have). V above it: the embedding gains V - Vc zero rows (an
        id the target emits past Vc is looked up, not out of range) and the LM head's logits gain V - Vc
        columns of -inf, so the model never proposes them and its softmax gives them probability 0. Either
        way ``config.vocab_size`` becomes V and forward returns (B, T, V) logits; tied embeddings stay one
        storage (the head's weight is a view of the embedding's first rows), though no longer one parameter (a
        later ``Module.to`` copies them apart).
        Call it before :func:`~sequoia_opt.model.tuned_linear.tune_linears` (the LM head's shape changes).

        Raises:
            ValueError: ``vocab_size`` not a positive int; called again after a call that padded the logits.
        """
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        if self.padded_logits:
            raise ValueError("fit_vocab was already called on this model")
        if self.config.vocab_size == vocab_size:
            return
        old = self.config.vocab_size
        kw = dict(device=self.device, dtype=self.dtype)
        tied = self.lm_head.weight is self.embed_tokens.weight
        with torch.no_grad():
            emb = torch.zeros(vocab_size, self.config.dim, **kw)
            keep = min(old, vocab_size)
            emb[:keep] = self.embed_tokens.weight[:keep]
            # tied: the head reads the embedding's first rows in place (no second (V, dim) copy)
            head = emb[:keep] if tied else self.lm_head.weight[:keep].clone()
        self.embed_tokens = nn.Embedding(vocab_size, self.config.dim, _weight=emb, **kw)
        self.lm_head = Linear(self.config.dim, keep, bias=False, device="meta", dtype=self.dtype)  # no throwaway init
        self.lm_head.weight = nn.Parameter(head, requires_grad=self.embed_tokens.weight.requires_grad)
        self.padded_logits = vocab_size - keep
        self.config = self.config.with_(vocab_size=vocab_size, tie_embeddings=False)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head over the final norm's output h (B, T, dim): (B, T, V) logits, -inf in the columns
        :meth:`fit_vocab` appended."""
        logits = self.lm_head(h)
        if self.padded_logits:
            logits = F.pad(logits, (0, self.padded_logits), value=float("-inf"))
        return logits

    @property
    def device(self) -> torch.device:
        """The device of the model's weights (the embedding's)."""
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's weights (the embedding's); its KV caches use it."""
        return self.embed_tokens.weight.dtype

    def new_cache(self, max_len: int, batch: int = 1) -> ModelKVCache:
        """Allocate a static KV cache of ``max_len`` slots: per layer (batch, n_kv_heads, max_len, head_dim)
        in the model's dtype and device."""
        c = self.config
        return ModelKVCache(c.n_layers, batch, c.n_kv_heads, max_len, c.head_dim, dtype=self.dtype,
                            device=self.device)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        cache: ModelKVCache | None = None,
        cache_slots: torch.Tensor | None = None,
        prefix_len: int = 0,
        tree_mask: TreeMask | None = None,
        backend: str = "auto",
        num_layers: int | None = None,
        hidden_layers: tuple[int, ...] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits for T new tokens (and, when asked, the hidden states of some layers).

        Args:
            tokens: (B, T) int64 token ids.
            positions: (T,) or (B, T) int64 rotary positions; default ``arange(T)`` (no cache) — in tree
                verification the caller passes ``prefix_len + depth`` (the root, the last committed token,
                sits at position ``prefix_len``, the number of cached tokens).
            cache: the model's :class:`ModelKVCache`; None runs plain causal attention over ``tokens``.
            cache_slots: (T,) int64 cache slots the new keys/values are written to (with ``cache``).
            prefix_len: committed slots ``[0, prefix_len)`` every query attends to without a mask.
            tree_mask: (T, m) mask over slots ``[prefix_len, prefix_len + m)`` (with ``cache``).
            backend: attention backend, ``"auto" | "torch" | "cuda"``.
            num_layers: None (the whole model) or k in ``1..n_layers``: run only the first k blocks, then the
                final norm and the LM head (the self-speculative layer-skip draft: Draft & Verify, Zhang et
                al. 2023; LayerSkip, Elhoushi et al. 2024). With ``cache``, only layers ``0 .. k-1`` of the
                cache are written; the others are left as they are. None takes the same loop over every
                layer as before (no extra work or allocation).
            hidden_layers: None, or layer indices in Hugging Face's ``output_hidden_states`` numbering: i in
                ``0 .. n_layers - 1`` is the residual stream entering block i (0: the token embeddings), i =
                ``n_layers`` the final norm's output (what the LM head reads). What a feature-head drafter reads
                (EAGLE-3 fuses a low, a middle and a high layer; EAGLE-1/2 and Medusa read ``n_layers``). With
                ``num_layers`` only indices ``<= num_layers`` are valid (``num_layers``: the final norm of the
                first ``num_layers`` blocks).

        Returns:
            (B, T, vocab_size) logits in the model's dtype; with ``hidden_layers``, ``(logits, hidden)`` with
            hidden (B, T, len(hidden_layers), dim) in the model's dtype, in the order asked.

        Raises:
            TypeError: ``tree_mask`` is not a :class:`~sequoia_opt.attention.TreeMask` (before any layer runs).
            ValueError: a cached forward without ``cache_slots`` or ``tree_mask``; ``num_layers`` not an int
                in ``1..n_layers``; a hidden layer index outside ``0..num_layers`` (before any layer runs).
        """
        B, T = tokens.shape
        if positions is None:
            positions = torch.arange(T, device=tokens.device)
        if cache is not None and (cache_slots is None or tree_mask is None):
            raise ValueError("a cached forward needs cache_slots and tree_mask")
        if tree_mask is not None:
            require_tree_mask(tree_mask, "Transformer.forward")
        layers = self.layers
        if num_layers is not None:
            n = self.config.n_layers
            if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= n:
                raise ValueError(f"num_layers must be an integer in 1..{n} (the model's n_layers), got "
                                 f"{num_layers!r}")
            layers = self.layers[:num_layers]
        pos = positions.float() if positions.dim() == 2 else positions.float().unsqueeze(0)  # (B|1, T)
        angles = pos.unsqueeze(-1) * self.inv_freq  # (B|1, T, D/2)
        cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)  # (B|1, 1, T, D/2)
        x = self.embed_tokens(tokens)  # (B, T, dim)
        if hidden_layers is not None:
            return self._forward_keeping(x, layers, hidden_layers, cos, sin, cache, cache_slots, prefix_len,
                                         tree_mask, backend)
        for i, layer in enumerate(layers):
            x = layer(x, cos, sin, None if cache is None else cache[i], cache_slots, prefix_len, tree_mask,
                      backend)
        return self._logits(self.norm(x))  # (B, T, vocab)

    def _forward_keeping(self, x, layers, hidden_layers, cos, sin, cache, cache_slots, prefix_len, tree_mask,
                         backend) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward`'s loop, keeping the residual stream at ``hidden_layers`` (its docstring)."""
        n = len(layers)
        want = [int(i) for i in hidden_layers]
        bad = [i for i in want if not 0 <= i <= n]
        if bad or not want:
            raise ValueError(f"hidden layer indices must be in 0..{n} (0: the embeddings, {n}: the final norm's "
                             f"output), got {list(hidden_layers)!r}")
        kept: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(layers):
            if i in want:
                kept[i] = x
            x = layer(x, cos, sin, None if cache is None else cache[i], cache_slots, prefix_len, tree_mask,
                      backend)
        h = self.norm(x)  # (B, T, dim)
        kept[n] = h
        return self._logits(h), torch.stack([kept[i] for i in want], dim=2)  # (B, T, V), (B, T, k, dim)
