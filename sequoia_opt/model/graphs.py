"""CUDA-graph replay of the bundled decoder's forwards: the verify and draft forwards captured once per static
shape and replayed, as serving engines run them (gpt-fast's ``torch.compile(mode="reduce-overhead")``, vLLM's
and SGLang's captured decode graphs). Eager PyTorch pays one kernel launch per op from Python (hundreds per
forward), which hides how T(n) really grows on a GPU.

:class:`GraphedTransformer` wraps a :class:`~sequoia_opt.model.Transformer` and keeps its call interface, so
every decoder and profiler takes it unchanged (it is a ``Transformer``: its modules are the wrapped model's,
shared, not copied). A cached forward of T tokens is captured per key

    (batch B, tokens T, positions' rank, num_layers, attention backend, the KV cache's buffers)

with static input buffers (token ids (B, T), positions (T,) or (B, T), cache slots (T,), the attention mask
(T, S)) and a static output (B, T, V); a call copies its inputs into them and replays. The KV cache is
already static, so the graph writes it in place. What changes from step to step (the committed length L,
the tree's m slots) cannot be a launch argument of a replay, so the graphed forward attends over the whole
cache, S slots, through one (T, S) mask: ones on ``[0, L)``, the tree mask on ``[L, L + m)``, zeros after
(the layout gpt-fast uses for its compiled decode). Outputs equal the eager forward's up to rounding; the
attention reads S keys instead of L + m (the cache is sized for the request, so the difference is the unused
tail).

A shape is captured the second time it is seen (a prefill's one-off length runs eagerly; a tree's verify
shape repeats every step), and forwards that cannot be graphed run eagerly and are counted by reason in
:attr:`GraphedTransformer.stats`: no KV cache, a per-row prefix (:class:`~sequoia_opt.attention.RowPrefix`),
more than ``max_tokens`` tokens. The returned logits are a copy (a later replay overwrites the static
output).

CUDA only: :func:`cuda_graphs` refuses another device. Tests inject ``graph_factory`` to check the
bookkeeping on a CPU with a graph that re-runs its function on replay.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
import torch.nn as nn

from ..attention import RowPrefix, TreeMask, require_tree_mask
from .kv_cache import ModelKVCache
from .llama import Transformer

__all__ = ["GraphedTransformer", "GraphStats", "cuda_graphs", "graphs_unsupported_reason"]


class _Graph(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor: ...

    def replay(self) -> None: ...


class _TorchCudaGraph:
    """One ``torch.cuda.CUDAGraph``: a warm-up call on a side stream (lazy cuBLAS / allocator set-up stays out
    of the capture), then the capture into ``pool`` (shared by one wrapper's graphs: they never replay
    concurrently, and each one's output stays allocated, so one's intermediates may reuse another's)."""

    def __init__(self, pool: Any) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph, pool=self.pool):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()


@dataclass
class GraphStats:
    """What a :class:`GraphedTransformer` did.

    Attributes:
        captures: graphs captured (one per key; again after an eviction).
        replays: forwards served by a replay.
        eager: ``{reason: forwards}`` run eagerly: ``"first sighting"`` (captured when seen again), ``"no KV
            cache"``, ``"per-row prefix"``, ``"more than N tokens"``, ``"autograd"``.
        evictions: graphs dropped to stay within ``max_graphs`` (least recently used first).
    """

    captures: int = 0
    replays: int = 0
    eager: Counter = field(default_factory=Counter)
    evictions: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The counts as plain types (``eager`` a dict sorted by reason), for a run's results JSON."""
        return {"captures": self.captures, "replays": self.replays, "eager": dict(sorted(self.eager.items())),
                "evictions": self.evictions}


@dataclass
class _Captured:
    """One captured shape: the static inputs the graph reads and the static logits it writes."""

    graph: _Graph
    tokens: torch.Tensor  # (B, T) int64
    positions: torch.Tensor  # (T,) or (B, T) int64
    slots: torch.Tensor  # (T,) int64
    mask: torch.Tensor  # (T, S) bool: prefix ones, tree mask, zeros
    logits: torch.Tensor | None = None  # (B, T, V), set by the capture

    def load(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, prefix_len: int,
             tree: torch.Tensor) -> None:
        """Copy one call's inputs into the static buffers (``tree``: the (T, m) dense tree mask)."""
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.slots.copy_(slots)
        m = tree.shape[1]
        self.mask.zero_()
        self.mask[:, :prefix_len] = True
        self.mask[:, prefix_len:prefix_len + m].copy_(tree)


def graphs_unsupported_reason(model: nn.Module) -> str | None:
    """None when :func:`cuda_graphs` can wrap ``model``, else one line saying why (not a Transformer, not on a
    CUDA device, offloaded layers, already wrapped)."""
    if isinstance(model, GraphedTransformer):
        return "the model is already wrapped for CUDA graphs"
    if not isinstance(model, Transformer):
        return f"CUDA graphs wrap a treeopt Transformer, got {type(model).__name__}"
    if getattr(model, "offload_state", None) is not None:
        return "an offloaded model streams its layers on a side stream; CUDA graphs are not captured for it"
    if model.device.type != "cuda":
        return f"CUDA graphs need a model on a CUDA device, this one is on {model.device}"
    return None


def _cache_key(cache: ModelKVCache) -> tuple:
    """The buffers a graph writes and reads: every layer's K and V address, and their shape and dtype (a graph
    replays onto exactly these addresses, so a new cache at new addresses is a new key)."""
    first = cache[0].k
    return (tuple(first.shape), first.dtype,
            tuple(p for layer in cache.layers for p in (layer.k.data_ptr(), layer.v.data_ptr())))


class GraphedTransformer(Transformer):
    """A :class:`Transformer` whose cached forwards replay CUDA graphs (module docstring). Same call interface
    and results as the wrapped model's :meth:`~sequoia_opt.model.Transformer.forward` (up to rounding), same
    parameters (shared), so decoders, drafters and profilers take it as they take the model.

    Args:
        model: the model to wrap (on CUDA unless ``graph_factory`` is given).
        max_tokens: forwards over more tokens run eagerly (a long prefill is seen once and its graph would
            hold a large static output); default 256.
        max_graphs: graphs kept, least recently used dropped first; default 128.
        capture_after: a shape is captured on its ``capture_after``-th sighting (earlier ones run eagerly);
            default 2.
        graph_factory: tests only: makes the graph objects (default: CUDA graphs sharing one memory pool).

    Raises:
        ValueError: :func:`graphs_unsupported_reason` objects (without ``graph_factory``), or bad limits.
    """

    def __init__(self, model: Transformer, *, max_tokens: int = 256, max_graphs: int = 128, capture_after: int = 2,
                 graph_factory: Callable[[], _Graph] | None = None) -> None:
        reason = graphs_unsupported_reason(model)
        if graph_factory is not None and reason is not None and "CUDA device" in reason:
            reason = None  # an injected graph runs anywhere (tests on a CPU)
        if reason is not None:
            raise ValueError(reason)
        if max_tokens < 1 or max_graphs < 1 or capture_after < 1:
            raise ValueError(f"max_tokens, max_graphs and capture_after must be >= 1, got {max_tokens}, "
                             f"{max_graphs}, {capture_after}")
        nn.Module.__init__(self)
        self.config = model.config
        self.embed_tokens = model.embed_tokens
        self.layers = model.layers
        self.norm = model.norm
        self.lm_head = model.lm_head
        self.padded_logits = model.padded_logits
        self.register_buffer("inv_freq", model.inv_freq, persistent=False)
        self.train(model.training)
        self.max_tokens, self.max_graphs, self.capture_after = max_tokens, max_graphs, capture_after
        if graph_factory is None:
            pool = torch.cuda.graph_pool_handle()
            graph_factory = lambda: _TorchCudaGraph(pool)  # noqa: E731
        self._graph_factory = graph_factory
        self._graphs: OrderedDict[tuple, _Captured] = OrderedDict()
        self._sightings: Counter = Counter()
        self.stats = GraphStats()

    @property
    def num_graphs(self) -> int:
        """Graphs held now."""
        return len(self._graphs)

    def reset(self) -> None:
        """Drop every graph (their memory returns to the pool) and the sighting counts; stats are kept."""
        self._graphs.clear()
        self._sightings.clear()

    def _eager_reason(self, tokens, cache, prefix_len, tree_mask) -> str | None:
        if cache is None or tree_mask is None:
            return "no KV cache"
        if isinstance(prefix_len, RowPrefix):
            return "per-row prefix"
        if tokens.shape[1] > self.max_tokens:
            return f"more than {self.max_tokens} tokens"
        if torch.is_grad_enabled() and self.embed_tokens.weight.requires_grad:
            return "autograd"
        return None

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, *,
                cache: ModelKVCache | None = None, cache_slots: torch.Tensor | None = None,
                prefix_len: int | RowPrefix = 0, tree_mask: TreeMask | None = None, backend: str = "auto",
                num_layers: int | None = None, hidden_layers: tuple[int, ...] | None = None) -> torch.Tensor:
        """:meth:`Transformer.forward`, replayed from a CUDA graph when the call can be (module docstring); a
        forward keeping hidden states (``hidden_layers``, a feature-head drafter's) runs eagerly.

        Returns:
            (B, T, vocab_size) logits in the model's dtype (a fresh tensor, not the graph's static output); with
            ``hidden_layers``, ``(logits, hidden)`` as :meth:`Transformer.forward`.

        Raises:
            As :meth:`Transformer.forward`; ValueError when ``prefix_len + m`` passes the cache's slots.
        """
        eager = lambda: super(GraphedTransformer, self).forward(  # noqa: E731
            tokens, positions, cache=cache, cache_slots=cache_slots, prefix_len=prefix_len, tree_mask=tree_mask,
            backend=backend, num_layers=num_layers, **({} if hidden_layers is None else
                                                        {"hidden_layers": hidden_layers}))
        reason = "hidden states" if hidden_layers is not None else self._eager_reason(tokens, cache, prefix_len,
                                                                                       tree_mask)
        if reason is None and cache_slots is None:
            reason = "no KV cache"
        if reason is not None:
            self.stats.eager[reason] += 1
            return eager()
        require_tree_mask(tree_mask, "GraphedTransformer.forward")
        B, T = tokens.shape
        if positions is None:
            positions = torch.arange(T, device=tokens.device)
        S = cache.max_len
        m = tree_mask.num_tree_keys
        if tree_mask.num_queries != T or prefix_len < 0 or prefix_len + m > S:
            raise ValueError(f"a forward of {T} tokens with {prefix_len} prefix slots and a ({tree_mask.num_queries}, "
                             f"{m}) tree mask does not fit a cache of {S} slots")
        key = (B, T, positions.dim(), num_layers, backend, _cache_key(cache))
        entry = self._graphs.get(key)
        if entry is None:
            self._sightings[key] += 1
            if self._sightings[key] < self.capture_after:
                self.stats.eager["first sighting"] += 1
                return eager()
            entry = self._capture(key, tokens, positions, cache, cache_slots, prefix_len, tree_mask, backend,
                                  num_layers)
        else:
            self._graphs.move_to_end(key)
            with torch.inference_mode():
                entry.load(tokens, positions, cache_slots, prefix_len, tree_mask.dense)
        with torch.inference_mode():
            entry.graph.replay()
        self.stats.replays += 1
        return entry.logits.clone()

    def _capture(self, key, tokens, positions, cache, cache_slots, prefix_len, tree_mask, backend,
                 num_layers) -> _Captured:
        while len(self._graphs) >= self.max_graphs:
            self._graphs.popitem(last=False)
            self.stats.evictions += 1
        dev = tokens.device
        with torch.inference_mode():
            entry = _Captured(graph=self._graph_factory(), tokens=torch.empty_like(tokens),
                              positions=torch.empty_like(positions, dtype=torch.int64),
                              slots=torch.empty_like(cache_slots, dtype=torch.int64),
                              mask=torch.zeros(tokens.shape[1], cache.max_len, dtype=torch.bool, device=dev))
            entry.load(tokens, positions, cache_slots, prefix_len, tree_mask.dense)
            run_model = super().forward

            def step() -> torch.Tensor:
                # prefix_len 0: the whole cache is the "tree" region, seen through the static (T, S) mask
                full = TreeMask.from_dense(entry.mask)  # bits packed inside the graph
                return run_model(entry.tokens, entry.positions, cache=cache, cache_slots=entry.slots, prefix_len=0,
                                 tree_mask=full, backend=backend, num_layers=num_layers)

            entry.logits = entry.graph.capture(step)
        self._graphs[key] = entry
        self.stats.captures += 1
        return entry


def cuda_graphs(model: Transformer, **kw: Any) -> GraphedTransformer:
    """Wrap ``model`` in a :class:`GraphedTransformer` (keyword arguments as its constructor's).

    Raises:
        ValueError: the model cannot be graphed (:func:`graphs_unsupported_reason`: not on CUDA, offloaded, ...).
    """
    return GraphedTransformer(model, **kw)
