"""The target face: what the decoding loop asks of the model whose output it preserves, whatever runs it.

A target face prefills the rows' prompts, says how much room each row has for this step's tree (cache slots
and positions: :class:`~sequoia_opt.decoding.step_tree.Room`), verifies one tree per row in one forward with
tree attention (SpecInfer, Miao et al. 2024, section 4), and commits each row's accepted path to its cache.
:class:`TransformerTarget` is the bundled torch model over a static KV cache in the row layout
(:mod:`~sequoia_opt.decoding.rows`); ``sequoia_opt.engines.llamacpp.target`` is llama.cpp, whose rejected KV
cells are removed with ``llama_memory_seq_rm``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Sequence

import torch

from ..attention import RowPrefix, TreeMask, resolve_backend
from ..errors import DecodingError
from ..model import Transformer
from .forward import causal_mask, is_whole, run_causal_chunk
from .rows import RowCache
from .step_tree import Room, StepTree

if TYPE_CHECKING:
    from .state import DecodeState

__all__ = ["TargetFace", "TransformerTarget"]


class TargetFace(ABC):
    """The target as the loop sees it (module docstring).

    Attributes (set by the implementation):
        vocab_size: V.  device: where logits and drafters' tensors live.  context: the positions it can see
        (``max_position_embeddings`` / llama.cpp's ``n_ctx``).  max_len: cache slots per row.
        max_batch: the most rows one step serves.  max_width: the most children a node may have (a face that
        verifies chains only says 1).  name: how messages name it.  backend (optional): the attention backend
        ``"torch" | "cuda"`` the policy's model drafters run with; a face without one gives them the decoder's
        ``backend`` argument, resolved for ``device``.

    A face that serves more than one row (``max_batch > 1``) implements :meth:`keep`: rows finish at different
    steps, and a decoder of more than one row refuses a face without it (rows would be verified against another
    row's cache); a decoder of one row never calls it.
    """

    vocab_size: int
    device: torch.device
    context: int
    max_len: int
    max_batch: int = 1
    max_width: int | None = None
    name: str = "the target model"

    @abstractmethod
    def prefill(self, prompts: Sequence[Sequence[int]]) -> None:
        """Start a generation of ``len(prompts)`` rows: row i's cache takes ``prompts[i][:-1]`` (its last token
        is the first root)."""

    @abstractmethod
    def room(self, state: DecodeState, want: int) -> list[Room]:
        """Each live row's room for this step's tree; ``want`` is the largest tree the policy may grow (a face
        may make room for it, e.g. by repacking). ``Room.nodes < 1`` means not even the root fits."""

    @abstractmethod
    def verify(self, state: DecodeState, trees: Sequence[StepTree]) -> list[torch.Tensor]:
        """One forward over every row's tree: node i of row b at its slot, position ``L_b + depth[i]``, attending
        the row's committed prefix and its own ancestors. Returns per row (n_b, V) logits."""

    @abstractmethod
    def commit(self, state: DecodeState, paths: Sequence[Sequence[int]]) -> None:
        """Row b's accepted path (node indices from the root) becomes committed after its prefix (``cached`` of
        the rows has not moved yet; ``seq`` already ends with the step's emitted tokens); every other tree slot is
        free again."""

    def keep(self, rows: Sequence[int]) -> None:
        """Only rows ``rows`` stay in the batch (the others finished), in that order: new row i is old row
        ``rows[i]`` (:func:`~sequoia_opt.decoding.loop.keep_order`). Called only with a live row left, so never
        for a batch of one. Raises DecodingError for a face that cannot (the default)."""
        raise DecodingError(f"{self.name} cannot drop finished rows from a batch (it does not implement keep)")

    # ------------------------------------------------------------------ hidden states (feature heads)
    def request_hidden(self, layers: Sequence[int]) -> None:
        """A drafter asks, once at bind, for the target's hidden states of ``layers``
        (:meth:`~sequoia_opt.model.Transformer.forward`'s ``hidden_layers`` numbering: i < n_layers the residual
        stream entering block i, n_layers the final norm's output). From then on the face keeps them for every
        prefill token (:meth:`prefill_hidden`) and for each committed path (:meth:`path_hidden`). What a feature
        head (EAGLE-3, EAGLE, Medusa) reads; the loop itself never does.

        Raises:
            DecodingError: a face that cannot return hidden states (the default), or an index out of range.
        """
        raise DecodingError(f"{self.name} does not return hidden states, which feature-head drafters (EAGLE-3, "
                            "EAGLE, Medusa) read; run them with the bundled torch target")

    def prefill_hidden(self, row: int, layers: Sequence[int]) -> torch.Tensor:
        """(P_row - 1, len(layers), dim) the hidden states of row ``row``'s prefilled tokens (its prompt but the
        last token), positions 0 .. P - 2, after :meth:`prefill`. Raises DecodingError as :meth:`request_hidden`."""
        raise DecodingError(f"{self.name} does not return hidden states")

    def path_hidden(self, row: int, layers: Sequence[int]) -> torch.Tensor:
        """(len(path), len(layers), dim) the hidden states of row ``row``'s last committed path (the root first),
        after :meth:`commit`: positions L .. L + len(path) - 1 of the step that committed it. Raises
        DecodingError as :meth:`request_hidden`."""
        raise DecodingError(f"{self.name} does not return hidden states")

    def join(self, state: DecodeState, prompts: Sequence[Sequence[int]]) -> None:
        """Rows join a running batch after its ``len(state.rows)`` live rows: new row j's cache takes
        ``prompts[j][:-1]``. Raises DecodingError for a face that cannot (the default)."""
        raise DecodingError(f"{self.name} cannot take rows into a running batch")


class TransformerTarget(TargetFace):
    """The bundled torch :class:`~sequoia_opt.model.Transformer` as the loop's target: a static KV cache of
    ``max_batch`` rows x ``max_len`` slots in the row layout (:class:`~sequoia_opt.decoding.rows.RowCache`).

    A batch of one has no holes, so every forward passes the plain int prefix and any attention backend (the
    CUDA kernel included) serves it; a batch with holes goes through the torch reference's per-row masks.

    Args:
        model: the target model.
        max_len: cache slots per row (>= 1).
        max_batch: rows allocated (>= 1).
        backend: attention backend ``"auto" | "torch" | "cuda"``, resolved once here.

    Raises:
        DecodingError: ``max_len`` or ``max_batch`` not an integer, or below 1.
    """

    def __init__(self, model: Transformer, *, max_len: int, max_batch: int = 1, backend: str = "auto") -> None:
        if not is_whole(max_len):  # 16.5 slots was 16 and True one, silently
            raise DecodingError(f"max_len must be an integer >= 1 (cache slots per row), got {max_len!r}")
        if max_len < 1:
            raise DecodingError(f"max_len must be >= 1 (one slot for a root-only step), got {max_len}")
        if not is_whole(max_batch) or max_batch < 1:
            raise DecodingError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.device = model.device
        self.context = model.config.max_position_embeddings
        self.max_len, self.max_batch = int(max_len), int(max_batch)
        self.backend = resolve_backend(backend, self.device)
        self.cache = model.new_cache(self.max_len, batch=self.max_batch)
        self.rows = RowCache(self.cache, self.device)
        self._masks: dict[int, TreeMask] = {}
        name = getattr(model.config, "name", None)
        self.name = "the target model" + (f" {name!r}" if name else "")
        # hidden states a feature head asked for (request_hidden): None = none asked, the default forward
        self.hidden_layers: tuple[int, ...] | None = None
        self._prefill_h: list[torch.Tensor] = []  # per row (P - 1, k, dim)
        self._tree_h: list[torch.Tensor] = []  # per row (n, k, dim), the last verify
        self._path_h: list[torch.Tensor] = []  # per row (len(path), k, dim), the last commit

    def request_hidden(self, layers: Sequence[int]) -> None:
        n = self.model.config.n_layers
        want = sorted({int(i) for i in layers} | set(self.hidden_layers or ()))
        bad = [i for i in want if not 0 <= i <= n]
        if bad:
            raise DecodingError(f"{self.name} has hidden states 0..{n} (0: the embeddings, {n}: the final norm's "
                                f"output); a drafter asked for {bad[0]}")
        self.hidden_layers = tuple(want)

    def _pick(self, h: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
        have = self.hidden_layers or ()
        try:
            idx = [have.index(int(i)) for i in layers]
        except ValueError:
            raise DecodingError(f"hidden states of layers {list(layers)} were not requested (request_hidden) from "
                                f"{self.name}") from None
        return h[:, idx] if idx != list(range(len(have))) else h

    def prefill_hidden(self, row: int, layers: Sequence[int]) -> torch.Tensor:
        return self._pick(self._prefill_h[row], layers)

    def path_hidden(self, row: int, layers: Sequence[int]) -> torch.Tensor:
        return self._pick(self._path_h[row], layers)

    def prefill(self, prompts: Sequence[Sequence[int]]) -> None:
        self.rows.reset(len(prompts))
        keep = self.hidden_layers
        self._prefill_h, self._tree_h, self._path_h = [], [], []
        for i, p in enumerate(prompts):
            if keep is None:
                if len(p) > 1:
                    run_causal_chunk(self.model, self.rows.row(i), p[:-1], 0, self.backend, self._masks)
                continue
            h = torch.zeros(0, len(keep), self.model.config.dim, dtype=self.model.dtype, device=self.device)
            if len(p) > 1:
                _, h = run_causal_chunk(self.model, self.rows.row(i), p[:-1], 0, self.backend, self._masks,
                                        hidden_layers=keep)
            self._prefill_h.append(h)  # (P - 1, k, dim)
        self.rows.prefilled([len(p) - 1 for p in prompts])

    def room(self, state: DecodeState, want: int) -> list[Room]:
        rows = self.rows
        if (rows.frontier + want > rows.max_len and (rows.holes or rows.batch > 1)) or rows.wasteful():
            rows.repack()  # a repack restores every row's own slot count (and what a step reads)
        nodes = rows.max_len - rows.frontier
        return [Room(nodes, self.context - 1 - r.cached) for r in state.rows]

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: TreeMask,
                row_masks: torch.Tensor | None = None) -> torch.Tensor:
        """One forward of (B, T) tokens at slots ``[F, F + T)`` of every row, (B, T) positions, the tree
        ``mask`` (T, T) shared by the rows or ``row_masks`` (B, T, T) per row. Returns (B, T, V) logits."""
        rows = self.rows
        F = rows.frontier
        T = tokens.shape[1]
        slots = torch.arange(F, F + T, dtype=torch.int64, device=self.device)
        prefix = rows.prefix()
        if row_masks is not None:
            valid = rows.valid[:, :F] if isinstance(prefix, RowPrefix) or rows.batch > 1 else \
                torch.ones(rows.batch, F, dtype=torch.bool, device=self.device)
            prefix = RowPrefix(F, valid, row_masks)
        if self.hidden_layers is not None:  # a feature head asked for hidden states: kept per row, per node
            logits, hidden = self.model(tokens, positions, cache=rows.view, cache_slots=slots, prefix_len=prefix,
                                        tree_mask=mask, backend=self.backend, hidden_layers=self.hidden_layers)
            self._tree_h = list(hidden)  # per row (T, k, dim)
            return logits
        return self.model(tokens, positions, cache=rows.view, cache_slots=slots, prefix_len=prefix,
                          tree_mask=mask, backend=self.backend)

    def verify(self, state: DecodeState, trees: Sequence[StepTree]) -> list[torch.Tensor]:
        dev = self.device
        rows = state.rows
        if len(trees) == 1:  # a batch of one: the tree's own mask and depths, no stacking
            t, L = trees[0], rows[0].cached
            logits = self.forward(t.tokens.to(dev).unsqueeze(0), (t.depth_tensor(dev) + L).unsqueeze(0),
                                  t.mask(dev))
            return [logits[0]]
        n = max(t.n for t in trees)
        same = all(t.buffers is not None and t.buffers is trees[0].buffers for t in trees)
        tokens = torch.zeros(len(trees), n, dtype=torch.int64, device=dev)
        depth = torch.zeros(len(trees), n, dtype=torch.int64, device=dev)
        for b, t in enumerate(trees):
            tokens[b, : t.n] = t.tokens.to(dev)
            depth[b, : t.n] = t.depth_tensor(dev)
        Lt = torch.tensor([r.cached for r in rows], dtype=torch.int64, device=dev).unsqueeze(1)
        if same:
            logits = self.forward(tokens, depth + Lt, trees[0].mask(dev))
        else:  # per-row trees: padding nodes see themselves only (their logits are never read)
            masks = torch.eye(n, dtype=torch.bool, device=dev).repeat(len(trees), 1, 1)  # (B, n, n)
            for b, t in enumerate(trees):
                masks[b, : t.n, : t.n] = t.mask(dev).dense
            logits = self.forward(tokens, depth + Lt, causal_mask(n, dev), masks)
        return [logits[b, : t.n] for b, t in enumerate(trees)]

    def commit(self, state: DecodeState, paths: Sequence[Sequence[int]]) -> None:
        F = self.rows.frontier
        self.rows.commit([[F + i for i in p] for p in paths] if len(paths) > 1 or len(paths[0]) > 1 else [[F]])
        if self.hidden_layers is not None:
            self._path_h = [h[torch.as_tensor(list(p), dtype=torch.int64, device=h.device)]
                            for h, p in zip(self._tree_h, paths)]  # per row (len(path), k, dim)

    def keep(self, rows: Sequence[int]) -> None:
        self.rows.keep(rows)
        if self.hidden_layers is not None:
            pick = lambda xs: [xs[b] for b in rows] if len(xs) > max(rows, default=-1) else xs  # noqa: E731
            self._prefill_h, self._tree_h, self._path_h = pick(self._prefill_h), pick(self._tree_h), pick(self._path_h)

    def join(self, state: DecodeState, prompts: Sequence[Sequence[int]]) -> None:
        """Rows join after the live rows: row ``B + j``'s cache takes ``prompts[j][:-1]`` (and its prompt's
        hidden states, when a feature head asked for them). Raises DecodingError when the live and joining rows
        exceed ``max_batch``."""
        B = self.rows.batch
        if B + len(prompts) > self.max_batch:
            raise DecodingError(f"{B} live rows and {len(prompts)} joining exceed max_batch={self.max_batch}")
        keep = self.hidden_layers
        for j, p in enumerate(prompts):
            if keep is None:
                if len(p) > 1:
                    run_causal_chunk(self.model, self.rows.row(B + j), p[:-1], 0, self.backend, self._masks)
                continue
            # a feature head asked for hidden states: the joining row's prompt states, as prefill keeps them
            h = torch.zeros(0, len(keep), self.model.config.dim, dtype=self.model.dtype, device=self.device)
            if len(p) > 1:
                _, h = run_causal_chunk(self.model, self.rows.row(B + j), p[:-1], 0, self.backend, self._masks,
                                        hidden_layers=keep)
            empty = h[:0]
            self._prefill_h.append(h)
            self._tree_h.append(empty)
            self._path_h.append(empty)
        self.rows.add([len(p) - 1 for p in prompts])
