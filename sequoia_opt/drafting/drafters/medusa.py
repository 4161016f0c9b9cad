""":class:`MedusaDrafter`: Medusa's heads over the target's last hidden state, proposing every level of a step's
tree in one pass (Medusa, Cai et al. 2024, sections 2.1 and 2.2: head k proposes the token k + 2 positions
after the hidden state's, the tree is the Cartesian product of the heads' top candidates). Cost model
``"one-pass"``: one forward of the K heads per step, whatever the tree. CLI name ``medusa``
(``--draft medusa:PATH``). Architecture and layout: :mod:`sequoia_opt.model.heads`,
:mod:`sequoia_opt.model.head_checkpoints`.

At :meth:`~MedusaDrafter.bind` it asks the target face for its final norm's output (hidden index
``n_layers``); it keeps, per row, the hidden state of the last committed token before the root (position
L - 1: the prefill's last, then each committed path's last node), which is what produced the root. The
children of every node at depth d come from head d: greedy, head d's top-k (siblings distinct, the same for
every node of the level); sampling, k ordered samples without replacement from head d's q, drawn per node,
verified against q. A tree deeper than K levels is clipped to K (:meth:`~MedusaDrafter.limit`). No cache.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ...decoding.state import DecodeState, DraftSettings, RowState
from ...decoding.step_tree import DraftOutput, TreeBuffers, root_tree
from ...errors import DecodingError
from ...model.heads import MedusaHeads
from .base import Drafter
from .eagle import draft_level

__all__ = ["MedusaDrafter"]


class MedusaDrafter(Drafter):
    """Medusa heads as a drafter (module docstring).

    Args:
        heads: the :class:`~sequoia_opt.model.heads.MedusaHeads` (on the target's device).
        target_layers: the target's ``n_layers`` (the heads read hidden index n_layers, after the final norm).
        context: the target's ``max_position_embeddings``.

    Attributes:
        last: per live row, (H,) the target's hidden state at position L - 1 (None before a row has one).
    """

    cost_model = "one-pass"
    has_probs = True
    max_rows = 1 << 30
    reads_target_features = True

    def __init__(self, heads: MedusaHeads, target_layers: int, *, context: int = 1 << 30) -> None:
        self.heads = heads
        self.vocab_size = heads.config.vocab_size
        self.device = heads.device
        self.context = int(context)
        self.layers = (int(target_layers),)
        self.name = f"the Medusa heads {heads.config.name!r}"
        self.settings: DraftSettings | None = None
        self.face = None
        self.last: list[torch.Tensor | None] = []
        self._logits: tuple[int, torch.Tensor] | None = None  # (cached, (K, V) logits) of a shared-tree step

    def bind(self, settings: DraftSettings) -> None:
        self._bind_once(settings)
        if settings.target is None:
            raise DecodingError(f"{self.name} read the target's hidden states: they need the decoder's target face")
        settings.target.request_hidden(self.layers)
        self.face = settings.target

    def reset(self) -> None:
        self.last, self._logits = [], None

    def prefill(self, state: DecodeState) -> None:
        self.last = [self._prompt_state(b) for b in range(len(state.rows))]

    def join(self, state: DecodeState, rows: Sequence[int]) -> None:
        """Rows ``rows`` (the last ones) joined a running batch: their prompts' last hidden states, as
        :meth:`prefill` takes them."""
        self.last.extend(self._prompt_state(i) for i in rows)

    def _prompt_state(self, b: int) -> torch.Tensor | None:
        """(H,) the last hidden state of row ``b``'s prefilled prompt; None for a one-token prompt (nothing
        prefilled: the heads wait for the first committed path)."""
        h = self.face.prefill_hidden(b, self.layers)  # (P - 1, 1, H)
        return h[-1, 0] if h.shape[0] else None

    def keep(self, rows: Sequence[int]) -> None:
        self.last = [self.last[b] for b in rows]

    @property
    def depth_limit(self) -> int:
        """K: its heads propose depths 1..K (Cai et al. 2024, section 2.1.1: head k predicts the token k positions
        past the one the target's own LM head predicts)."""
        return self.heads.config.num_heads

    def shared_depth(self, state: DecodeState) -> int:
        """K (its heads propose depths 1..K), 0 before the target gave it a hidden state."""
        return 0 if any(h is None for h in self.last) else super().shared_depth(state)

    def limit(self, state: DecodeState, buffers: TreeBuffers, depth: int | None = None) -> int:
        D = buffers.tree_depth if depth is None else min(depth, buffers.tree_depth)
        return min(D, self.shared_depth(state))

    def propose(self, state: DecodeState, buffers: TreeBuffers,
                forced_tokens: torch.Tensor | None = None) -> DraftOutput:
        s, buf = self.settings, buffers
        B, n, D = len(state.rows), buf.n, buf.tree_depth
        dev = s.device
        logits = self.heads(torch.stack(self.last), heads=D)  # (B, D, V): head d proposes depth d + 1
        out = root_tree([r.root for r in state.rows], n, dev) if forced_tokens is None else forced_tokens
        probs = None if s.greedy else torch.empty(B, n, self.vocab_size, device=dev)
        conf = torch.zeros(B, n, device=dev) if s.want_confidence else None
        for d in range(D):
            sl = buf.level_slices[d]
            w = sl.stop - sl.start
            lg = logits[:, d: d + 1].expand(B, w, self.vocab_size)  # (B, w_d, V): every node of level d
            draft_level(buf, d, lg, out, probs, conf, s, None, self.vocab_size, self.name, forced_tokens is not None,
                        s.generators(state.rows))
        return DraftOutput(out, probs, D, conf)

    def score_nodes(self, row: RowState, tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor,
                    nodes: Sequence[int], first: bool) -> torch.Tensor:
        """(len(nodes), V): node i's children come from head ``depth[i]`` (its parent's path does not matter).

        Raises:
            DecodingError: a node at depth K or deeper (K heads propose depths 1..K).
        """
        if first or self._logits is None or self._logits[0] != row.cached:
            self._logits = (row.cached, self.heads(self.last[0]))  # (K, V)
        d = depth[torch.as_tensor(list(nodes), dtype=torch.int64, device=depth.device)]
        K = self.depth_limit
        if int(d.max()) >= K:
            raise DecodingError(f"{self.name} propose depths 1..{K}; a tree of more levels asks for depth "
                                f"{int(d.max()) + 1}: keep the depth at {K} or less (a dynamic setting's steps=, "
                                "--calibration-steps, profile graft's --max-depth)")
        return self._logits[1][d]

    def commit(self, state: DecodeState, paths: Sequence[Sequence[int]], step_depth: int) -> None:
        """The last node of each row's committed path (the face's) is the next root's predecessor."""
        self.last = [self.face.path_hidden(b, self.layers)[-1, 0] for b in range(len(state.rows))]
        self._logits = None


class MedusaPassProbe:
    """One unit of Medusa's cost for the latency profiler: the K heads' forward over one hidden state, which is
    all a step drafts whatever its tree (``one-pass``: the table is flat in the nodes proposed). Looks like a
    model to :func:`~sequoia_opt.profiling.latency.profile_model`; its "forward over w tokens" ignores w.

    Args:
        heads: the Medusa heads.  target: the target model (its vocabulary and context).
    """

    def __init__(self, heads: MedusaHeads, target) -> None:
        from types import SimpleNamespace

        self.heads = heads
        self.device = heads.device
        self.config = SimpleNamespace(max_position_embeddings=target.config.max_position_embeddings,
                                      vocab_size=heads.config.vocab_size, name=heads.config.name)
        g = torch.Generator(device=self.device).manual_seed(0)
        self._hidden = torch.randn(1, heads.config.hidden_size, generator=g, device=self.device, dtype=heads.dtype)

    def new_cache(self, max_len: int, batch: int = 1) -> None:
        """None: the heads read one hidden state and keep no KV cache (the profiler's cache argument is ignored)."""
        return None

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, **_: object) -> torch.Tensor:
        return self.heads(self._hidden)  # (1, K, V)
