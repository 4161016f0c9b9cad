"""Feature heads: drafters that read the target's own hidden states instead of running a model of their own
(DESIGN.md, "Drafters and drafting policies"). Architecture only; the public checkpoint layouts are read and
written by :mod:`sequoia_opt.model.head_checkpoints`, the drafters live in ``sequoia_opt.drafting.drafters``.

* :class:`EagleHead`, kind ``"eagle3"`` (EAGLE-3, Li et al. 2025, section 3; the layout SGLang's and vLLM's
  ``llama_eagle3.py`` read): ``fc`` fuses the target's hidden states of a low, a middle and a high layer,
  (..., 3 H_t) -> (..., H). One decoder layer (``midlayer``) takes, at a position, the token's embedding and a
  hidden state g::

      x  = cat(input_layernorm(embed(token)), hidden_norm(g))       # (..., 2H): q/k/v read 2H
      r1 = g + o_proj(attention(x))                                  # (hidden_norm(g) with norm_before_residual)
      r2 = r1 + mlp(post_attention_layernorm(r1))
      logits = lm_head(norm(r2))                                     # the draft vocabulary (d2t maps it)

  g is the fused target feature at a committed position and the layer's own r2 at a drafted one (the
  "hidden state before the norm" the engines feed to the next draft step).
* :class:`EagleHead`, kind ``"eagle"`` (EAGLE-1, Li et al. 2024, section 4; EAGLE-2 drafts with the same head;
  vLLM's ``llama_eagle.py``): ``x = fc(cat(embed(token), f))`` (2H -> H), then Llama blocks whose first has no
  input norm (EAGLE's ``cnets.py``); its output is the next feature, which the *target's* LM head reads.
  f is the target's last hidden state (after its final norm) at a committed position and the head's own
  output at a drafted one.
* :class:`MedusaHeads` (Medusa, Cai et al. 2024, section 2.1; ``medusa_model.py``): head k (0-based) maps the
  target's last hidden state h to logits of the token k + 2 positions after h's own: ``ResBlock^L`` (x +
  SiLU(Wx + b)) then its own LM head.

Position convention of the EAGLE heads (EAGLE's ``cnets.py`` pairs ``hidden_states[:, i]`` with
``input_ids[:, i + 1]``): the head's sequence item j pairs token x_{j+1} with the feature of position j, so it
sits one position before the token; rotary attention depends only on position differences, so any constant
shift would do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import TreeMask
from .config import ModelConfig
from .kv_cache import ModelKVCache
from .llama import MLP, Attention, Block, Linear, RMSNorm, rope_inv_freq

__all__ = ["EagleConfig", "EagleHead", "MedusaConfig", "MedusaHeads", "EAGLE_KINDS"]

#: The EAGLE head kinds: ``eagle3`` (fused low / middle / high features) and ``eagle`` (EAGLE-1/2, last layer).
EAGLE_KINDS = ("eagle3", "eagle")


@dataclass(frozen=True)
class EagleConfig:
    """What an EAGLE head is (read from its ``config.json`` by :mod:`.head_checkpoints`).

    Attributes:
        kind: ``"eagle3"`` or ``"eagle"``.
        layer: its decoder layer(s) as a :class:`ModelConfig` (``dim`` H, heads, head_dim, MLP size, rotary
            settings, ``max_position_embeddings``; ``vocab_size`` is the draft vocabulary, ``n_layers`` its
            decoder layers: 1 for EAGLE-3).
        vocab_size: V, the target's vocabulary (candidates are target ids).
        target_hidden_size: H_t, the width of each target feature.
        aux_layers: EAGLE-3: the target layers whose outputs ``fc`` fuses, ascending and distinct, the order the
            engines capture them in (SGLang's numbering of ``eagle_aux_hidden_state_layer_ids``: layer i's
            output, i in ``0 .. n_layers - 2``); EAGLE: empty.
        fc_bias: ``fc`` has a bias.
        norm_before_residual: EAGLE-3: the residual is ``hidden_norm(g)`` instead of g (vLLM's option).
        name: a label for reports.

    Raises:
        ValueError: ``aux_layers`` not ascending and distinct.
    """

    kind: str
    layer: ModelConfig
    vocab_size: int
    target_hidden_size: int
    aux_layers: tuple[int, ...] = ()
    fc_bias: bool = False
    norm_before_residual: bool = False
    name: str = "eagle"

    def __post_init__(self) -> None:
        layers = tuple(self.aux_layers)
        if list(layers) != sorted(set(layers)):
            raise ValueError(f"aux_layers {list(layers)} must be ascending and distinct: the engines fuse the target "
                             "layers in the order its forward passes them, each once")

    @property
    def hidden_size(self) -> int:
        """H, the head's own hidden size (its decoder layer's ``dim``; may differ from the target's H_t)."""
        return self.layer.dim

    @property
    def draft_vocab_size(self) -> int:
        """The draft vocabulary the head's LM head scores (``layer.vocab_size``; EAGLE-3 heads may use fewer ids than
        the target's V, mapped back to target ids)."""
        return self.layer.vocab_size

    def feature_layers(self, target_layers: int) -> tuple[int, ...]:
        """The target hidden states this head reads, in :meth:`~sequoia_opt.model.Transformer.forward`'s
        ``hidden_layers`` numbering: EAGLE-3, the output of each aux layer i (index i + 1); EAGLE, the final
        norm's output (index ``target_layers``)."""
        if self.kind == "eagle3":
            return tuple(i + 1 for i in self.aux_layers)
        return (int(target_layers),)


class EagleHead(nn.Module):
    """An EAGLE-3 or EAGLE-1/2 head (module docstring), sharing the target's token embedding (and, for EAGLE,
    its LM head) unless the checkpoint brings its own.

    Args:
        config: the head's :class:`EagleConfig`.
        embedding: (V, H) the token embedding it reads (the target's, or the checkpoint's ``embed_tokens``);
            kept as a reference, not a parameter of the head (not trained, not saved).
        lm_head: EAGLE only: the target's LM head the head's features are read with: its (V, H) weight, or the
            target's ``lm_head`` module itself, whose CPU-tuned kernels then run it (kept outside the head's
            parameters: not trained, not saved).
        device, dtype: of the head's own parameters.

    Parameter names follow the public layouts: EAGLE-3 ``fc.*``, ``midlayer.*``, ``norm.weight``,
    ``lm_head.weight``; EAGLE ``fc.*``, ``layers.{i}.*`` (no ``layers.0.input_layernorm``).

    Raises:
        ValueError: ``config.kind`` is not one of :data:`EAGLE_KINDS`.
    """

    def __init__(self, config: EagleConfig, embedding: torch.Tensor, lm_head: torch.Tensor | None = None, *,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        c = config.layer
        H = c.dim
        kw = dict(device=device, dtype=dtype)
        # shared references, never parameters of the head (a Parameter assigned here would be registered)
        self.embedding = embedding.detach()  # (V, H)
        # EAGLE: the target's LM head; a module is held in a tuple so that it is not registered as the head's
        self._target_lm: tuple[nn.Module, ...] = (lm_head,) if isinstance(lm_head, nn.Module) else ()
        w = lm_head.weight if isinstance(lm_head, nn.Module) else lm_head
        self.target_lm_head = None if w is None else w.detach()  # (V, H)
        if config.kind == "eagle3":
            self.fc = Linear(3 * config.target_hidden_size, H, bias=config.fc_bias, **kw)
            self.midlayer = nn.Module()
            m = self.midlayer
            m.input_layernorm = RMSNorm(H, c.norm_eps, **kw)
            m.hidden_norm = RMSNorm(H, c.norm_eps, **kw)
            m.self_attn = Attention(c, **kw)
            for name, width in (("q_proj", c.n_heads), ("k_proj", c.n_kv_heads), ("v_proj", c.n_kv_heads)):
                setattr(m.self_attn, name, Linear(2 * H, width * c.head_dim, bias=c.attention_bias, **kw))
            m.post_attention_layernorm = RMSNorm(H, c.norm_eps, **kw)
            m.mlp = MLP(c, **kw)
            self.norm = RMSNorm(H, c.norm_eps, **kw)
            self.lm_head = Linear(H, c.vocab_size, bias=False, **kw)
        elif config.kind == "eagle":
            self.fc = Linear(2 * H, H, bias=config.fc_bias, **kw)
            self.layers = nn.ModuleList(Block(c, **kw) for _ in range(c.n_layers))
            self.layers[0].input_layernorm = nn.Identity()  # EAGLE's first layer has no input norm
        else:
            raise ValueError(f"unknown EAGLE head kind {config.kind!r}; known: {', '.join(EAGLE_KINDS)}")
        self.register_buffer("inv_freq", rope_inv_freq(c).to(device), persistent=False)

    @property
    def device(self) -> torch.device:
        """The device of the head's weights (``fc``'s)."""
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the head's weights (``fc``'s); its KV cache (:meth:`new_cache`) uses it."""
        return self.fc.weight.dtype

    @property
    def n_layers(self) -> int:
        """Decoder layers (KV cache layers)."""
        return self.config.layer.n_layers

    def new_cache(self, max_len: int, batch: int = 1) -> ModelKVCache:
        """A static KV cache of ``max_len`` slots: per layer (batch, n_kv_heads, max_len, head_dim)."""
        c = self.config.layer
        return ModelKVCache(c.n_layers, batch, c.n_kv_heads, max_len, c.head_dim, dtype=self.dtype,
                            device=self.device)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The head's input hidden state at committed positions from the target's features.

        Args:
            features: (..., k, H_t) the target's hidden states at the layers :meth:`EagleConfig.feature_layers`
                names, in that order (k = 3 for EAGLE-3, 1 for EAGLE).

        Returns:
            (..., H) in the head's dtype: ``fc(cat(features))`` for EAGLE-3, the feature itself for EAGLE.
        """
        f = features.to(self.dtype)
        if self.config.kind == "eagle3":
            return self.fc(f.flatten(-2))  # (..., 3 H_t) -> (..., H)
        return f[..., 0, :]

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos / sin (B|1, 1, T, head_dim / 2) of (T,) or (B, T) positions."""
        pos = positions.float() if positions.dim() == 2 else positions.float().unsqueeze(0)  # (B|1, T)
        angles = pos.unsqueeze(-1) * self.inv_freq  # (B|1, T, D/2)
        return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)

    def attention_input(self, tokens: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """EAGLE-3's midlayer before attention: ``(x, residual)`` with x (B, T, 2H) =
        ``cat(input_layernorm(embed(tokens)), hidden_norm(hidden))`` and the residual (B, T, H)."""
        m = self.midlayer
        emb = F.embedding(tokens, self.embedding).to(self.dtype)  # (B, T, H)
        h = m.hidden_norm(hidden)
        residual = h if self.config.norm_before_residual else hidden
        return torch.cat([m.input_layernorm(emb), h], dim=-1), residual

    def after_attention(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """EAGLE-3's midlayer after attention: ``(logits (B, T, V_d), r2 (B, T, H))`` from the attention
        output (B, T, H) (after ``o_proj``) and the residual (T may be 1 of the forward's items: the MLP and the
        LM head are per item)."""
        m = self.midlayer
        r1 = residual + attn
        r2 = r1 + m.mlp(m.post_attention_layernorm(r1))
        return self.lm_head(self.norm(r2)), r2

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, *,
                cache: ModelKVCache | None = None, cache_slots: torch.Tensor | None = None,
                prefix_len: Any = 0, tree_mask: TreeMask | None = None,
                backend: str = "auto", last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One head forward over T items (a token and its input hidden state each).

        Args:
            tokens: (B, T) int64 target token ids.
            hidden: (B, T, H) input hidden states (:meth:`fuse` of target features, or the head's own output).
            positions: (T,) or (B, T) int64 rotary positions.
            cache, cache_slots, prefix_len, tree_mask, backend: as :meth:`~sequoia_opt.model.Transformer.forward`
                (None cache: plain causal attention over the T items, training).
            last_only: only the last item's logits and output (T' = 1 below): every item still goes through
                attention (its keys and values into the cache), but the MLP after it (EAGLE-3) and the LM head
                run on the last item alone. A catch-up chunk reads only its last item's (the root's).

        Returns:
            ``(logits, out)``: logits (B, T', V_d) over the draft vocabulary (EAGLE-3) or the target's (EAGLE);
            out (B, T', H), the hidden state the next draft step takes in; T' = T, or 1 with ``last_only``.
        """
        cos, sin = self.rotary(positions)
        if self.config.kind == "eagle3":
            x, residual = self.attention_input(tokens, hidden)
            attn = self.midlayer.self_attn(x, cos, sin, None if cache is None else cache[0], cache_slots,
                                           prefix_len, tree_mask, backend)  # (B, T, H)
            if last_only:
                attn, residual = attn[:, -1:], residual[:, -1:]
            return self.after_attention(attn, residual)
        emb = F.embedding(tokens, self.embedding).to(self.dtype)  # (B, T, H)
        x = self.fc(torch.cat([emb, hidden.to(self.dtype)], dim=-1))  # (B, T, 2H) -> (B, T, H)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if cache is None else cache[i], cache_slots, prefix_len, tree_mask, backend)
        if last_only:
            x = x[:, -1:]
        if self._target_lm and self._target_lm[0].weight.dtype == x.dtype and not torch.is_grad_enabled():
            return self._target_lm[0](x), x  # the target's own (tuned) LM head; training differentiates F.linear
        return F.linear(x, self.target_lm_head.to(x.dtype)), x


@dataclass(frozen=True)
class MedusaConfig:
    """Medusa heads (``config.json``: ``medusa_num_heads``, ``medusa_num_layers``; H and V from the weights).

    Attributes:
        num_heads: K, heads (head k proposes depth k + 1 of a step's tree).
        num_layers: residual blocks per head.
        hidden_size: H, the target's hidden size.  vocab_size: V, the target's vocabulary.
        name: a label for reports.
    """

    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    name: str = "medusa"
    base_model: str | None = field(default=None, compare=False)


class _ResBlock(nn.Module):
    """Medusa's residual block: x + SiLU(linear(x)) (``medusa_model.py`` ``ResBlock``)."""

    def __init__(self, hidden: int, **kw) -> None:
        super().__init__()
        self.linear = Linear(hidden, hidden, bias=True, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """Medusa's K heads over the target's last hidden state (module docstring); parameter names
    ``medusa_head.{k}.{j}.linear.{weight,bias}`` (j < L) and ``medusa_head.{k}.{L}.weight``."""

    def __init__(self, config: MedusaConfig, *, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        kw = dict(device=device, dtype=dtype)
        H, V = config.hidden_size, config.vocab_size
        self.medusa_head = nn.ModuleList(
            nn.Sequential(*[_ResBlock(H, **kw) for _ in range(config.num_layers)], Linear(H, V, bias=False, **kw))
            for _ in range(config.num_heads))

    @property
    def device(self) -> torch.device:
        """The device of the heads' weights."""
        return self.medusa_head[0][-1].weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the heads' weights; :meth:`forward` casts the hidden states it reads to it."""
        return self.medusa_head[0][-1].weight.dtype

    def forward(self, hidden: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """Logits of the first ``heads`` heads (default all K).

        Args:
            hidden: (..., H) the target's last hidden state (after its final norm).

        Returns:
            (..., heads, V) logits; ``[..., k, :]`` proposes the token k + 2 positions after ``hidden``'s.
        """
        h = hidden.to(self.dtype)
        k = self.config.num_heads if heads is None else int(heads)
        return torch.stack([self.medusa_head[i](h) for i in range(k)], dim=-2)
