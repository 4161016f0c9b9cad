"""The state of a generation between steps: one :class:`RowState` per sequence of the batch (a batch of one
is one row), and the settings a policy's drafters are bound with (:class:`DraftSettings`).

Per row: the committed tokens ``seq`` (prompt, then emitted tokens); the target cache holds ``seq[:-1]``
(``cached`` = L tokens) and ``seq[-1]``, the last committed token, is the root of the next tree. A row's
stop rules are applied in one place, :meth:`RowState.emit`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from ..errors import DecodingError
from .stats import GenerationResult

__all__ = ["RowState", "DecodeState", "DraftSettings", "truncate", "eos_set"]


def truncate(emitted: Sequence[int], remaining: int, eos_ids: Iterable[int]) -> tuple[list[int], str | None]:
    """Apply the stop rules to one step's tokens of one row.

    Keeps at most ``remaining`` tokens and cuts after the first EOS (the EOS itself is kept).

    Returns:
        ``(tokens, stop_reason)`` with ``stop_reason`` ``"eos"``, ``"max_new_tokens"`` or None (go on).
    """
    eos = eos_ids if isinstance(eos_ids, (set, frozenset)) else set(eos_ids)
    out: list[int] = []
    for t in emitted[:remaining]:
        out.append(int(t))
        if t in eos:
            return out, "eos"
    if len(out) >= remaining:
        return out, "max_new_tokens"
    return out, None


def eos_set(eos_ids: int | Iterable[int]) -> frozenset[int]:
    """The EOS ids as a frozenset: one id or several, Python, numpy or 0-d / 1-d tensor integers (a tokenizer's
    ``np.int64`` eos id raised a TypeError). Raises DecodingError for anything else, or a negative id."""
    if isinstance(eos_ids, torch.Tensor):
        eos_ids = eos_ids.reshape(-1).tolist()
    items = [eos_ids] if isinstance(eos_ids, (int, np.integer)) else eos_ids
    if isinstance(items, (str, bytes)):  # iterable, but characters or bytes are not token ids
        raise DecodingError(f"eos_ids must be token ids (integers >= 0), got {eos_ids!r}")
    try:
        ids = list(items)
    except TypeError:
        raise DecodingError(f"eos_ids must be a token id or ids, got {eos_ids!r}") from None
    if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0 for t in ids):
        raise DecodingError(f"eos_ids must be token ids (integers >= 0), got {eos_ids!r}")
    return frozenset(int(t) for t in ids)


@dataclass
class RowState:
    """One sequence of a generation.

    Attributes:
        seq: every committed token, prompt then emitted tokens; ``seq[-1]`` is the root of the next tree.
        cached: L, committed tokens in the target cache; ``len(seq) == L + 1``.
        max_new_tokens: the row's budget of new tokens.
        result: the :class:`GenerationResult` being filled (``result.tokens`` are the new tokens so far).
        index: the row's prompt index in the batch given to :meth:`~sequoia_opt.decoding.loop.Decoder.start`.
        finished: True once a stop rule fired.
        generator: the row's own random source under sampling (drafting and verification of this row draw from
            it alone, so its tokens do not depend on which other rows share the batch, as vLLM and SGLang seed
            per request); None: the decoder's (:meth:`DraftSettings.generator_of`).
    """

    seq: list[int]
    cached: int
    max_new_tokens: int
    result: GenerationResult
    index: int = 0
    finished: bool = False
    generator: torch.Generator | None = field(default=None, repr=False, compare=False)

    @property
    def root(self) -> int:
        """The last committed token, ``seq[-1]``: the root of the row's next tree (already sampled, not yet
        in the cache)."""
        return self.seq[-1]

    @property
    def remaining(self) -> int:
        """New tokens the row may still emit."""
        return self.max_new_tokens - len(self.result.tokens)

    @property
    def useful_depth(self) -> int:
        """The deepest draft this row can still use (>= 0): ``remaining - 1``. A step emits its accepted path and
        the bonus token, at most ``remaining``, so a node deeper than this is drafted and verified for nothing (the
        cut llama-server applies to its draft, ``server_slot::get_n_draft_max``: ``n_remaining - 1``)."""
        return max(0, self.remaining - 1)

    def emit(self, tokens: Sequence[int], eos_ids: frozenset[int]) -> list[int]:
        """Emit a step's tokens (accepted nodes, then the bonus) after the stop rules (:func:`truncate`: the
        first EOS, ``max_new_tokens``) into ``result.tokens`` and ``seq``; on a stop set ``finished`` and the
        result's ``stop_reason``. Returns the tokens emitted. The only place stop rules are applied."""
        result = self.result
        emitted, stop = truncate(tokens, self.max_new_tokens - len(result.tokens), eos_ids)
        result.tokens.extend(emitted)
        self.seq.extend(emitted)
        if stop is not None:
            self.finished, result.stop_reason = True, stop
        return emitted


@dataclass
class DecodeState:
    """A generation's state: its live rows (finished rows leave the batch after the step that ends them).

    Attributes:
        rows: the live rows, in batch-row order (row b of every cache is ``rows[b]``).
        results: every prompt's :class:`GenerationResult`, in the order the prompts were given.
        steps: one :class:`~sequoia_opt.decoding.stats.BatchStep` per step.
        prefill_ms: wall time of the prefill (target and drafters), ms.
    """

    rows: list[RowState]
    results: list[GenerationResult]
    steps: list[Any] = field(default_factory=list)
    prefill_ms: float = 0.0
    #: (the decoder, its prefill count) that made this state's caches: a decoder's caches hold one generation, and a
    #: state stepped after its decoder started another read the other's cache (wrong tokens, no error)
    owner: tuple[Any, int] | None = field(default=None, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        """True when every row has stopped."""
        return not self.rows

    @property
    def batch(self) -> int:
        """Live rows."""
        return len(self.rows)

    @property
    def row(self) -> RowState:
        """The one row of a batch of one (raises ValueError for a batch, or once it finished: ``result``)."""
        if len(self.rows) != 1:
            raise ValueError(f"this state has {len(self.rows)} live rows, not one")
        return self.rows[0]

    @property
    def result(self) -> GenerationResult:
        """The result of a generation of one prompt. Raises ValueError when the state decodes more than one
        prompt (read :attr:`results`)."""
        if len(self.results) != 1:
            raise ValueError(f"this state decodes {len(self.results)} prompts; read results")
        return self.results[0]

    # a batch of one, read through the state (drafters and tests of batch-1 policies)
    @property
    def seq(self) -> list[int]:
        """The one row's committed tokens, prompt then emitted (:attr:`RowState.seq`; ValueError unless one
        row is live)."""
        return self.row.seq

    @property
    def cached(self) -> int:
        """The one row's committed tokens in the target cache, L (:attr:`RowState.cached`; ValueError
        unless one row is live)."""
        return self.row.cached

    @property
    def root(self) -> int:
        """The one row's next tree root, ``seq[-1]`` (:attr:`RowState.root`; ValueError unless one row is live)."""
        return self.row.root


@dataclass
class DraftSettings:
    """What the decoder tells a policy's drafters once, in ``bind``.

    Attributes:
        device: the target's device (the drafters' tensors live there).
        max_len: the decoder's cache slots per row; a drafter with a cache allocates this many.
        max_batch: the most rows a step serves (a drafter with a cache allocates this many rows).
        backend: the resolved attention backend (``"torch"`` or ``"cuda"``).
        temperature: 0 = greedy (rank k is the drafter's k-th best token); > 0 = sampling (children are
            ordered samples without replacement from the node's q).
        top_p: nucleus mass in (0, 1] the decoder applies to the target; a model drafter applies it to q too.
        generator: the decoder's random source, which seeds each row's own (:attr:`RowState.generator`); a
            drafter draws a row's numbers from :meth:`generator_of` that row (:meth:`generators` for a batch),
            never from this field. The decoder replaces it when its ``generator`` attribute is replaced, so
            read it at each proposal, never keep a copy.
        tree_depth: the deepest tree the policy drafts (0: no step ever drafts, nothing to allocate).
        target: the decoder's :class:`~sequoia_opt.decoding.target.TargetFace` (a drafter that shares the
            target's weights and cache, self layer-skip, reads its model and cache there; a feature head reads
            the hidden states it returns).
        want_confidence: fill :attr:`~sequoia_opt.decoding.step_tree.DraftOutput.confidence` (a graft
            policy's scheduler reads it).
    """

    device: torch.device
    max_len: int
    backend: str
    temperature: float
    top_p: float
    generator: torch.Generator
    tree_depth: int
    max_batch: int = 1
    target: Any = None  # the TargetFace (decoding/target.py, which imports this module)
    want_confidence: bool = False

    @property
    def greedy(self) -> bool:
        """True when ``temperature == 0``: the drafters rank tokens by probability instead of sampling them."""
        return self.temperature == 0

    def generator_of(self, row: RowState) -> torch.Generator:
        """The random source of ``row``'s draws: its own generator, or the decoder's for a row without one."""
        return row.generator if row.generator is not None else self.generator

    def generators(self, rows: Sequence[RowState]) -> list[torch.Generator]:
        """:meth:`generator_of` every row, in order (for
        :func:`~sequoia_opt.decoding.sampling.sample_without_replacement` over a batch)."""
        return [self.generator_of(r) for r in rows]
