"""Per-step statistics, and the results of a generation of one prompt or of a batch."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .sampling import NodeVisit

__all__ = ["StepStats", "GenerationResult", "NodeVisit", "NodeAcceptance", "BatchStep", "BatchResult", "Clock"]


@dataclass(frozen=True)
class StepStats:
    """One decoding step (one target forward).

    Attributes:
        tokens: the tokens emitted this step (accepted tokens then the bonus token, after EOS /
            ``max_new_tokens`` truncation).
        accepted_len: ``len(tokens)``, tokens emitted this step.
        accepted_nodes: speculated nodes the verifier accepted (before truncation; the bonus not counted).
        accepted_ranks: rank of the accepted node at depth 1, 2, ... (length ``accepted_nodes``).
        visits: one :class:`NodeVisit` per verification trial (a node on the accepted path with children):
            its depth, number of children and the accepted rank or None. The acceptance profiler estimates
            positional acceptance vectors from these.
        draft_ms: wall time of the draft (ms; 0 for autoregressive decoding).
        verify_ms: wall time of the target forward (ms).
        bookkeeping_ms: wall time of accept + commit (cache compaction, truncation) in ms.
        tree_size: nodes of the tree this step verified, root included (1 for plain decoding). Equals the
            decoder's tree size except near the end of the context or the KV cache, where the speculative
            decoder clips its tree to the levels that fit.
        tree_depth: depth of that tree (0 for plain decoding and for a root-only step).
        accepted_drafters: for a multi-drafter tree, the index of the drafter that proposed each accepted
            node (depth order; a node two drafters proposed counts for the first); empty otherwise.
        drafter_ms: for a multi-drafter tree, wall time (ms) spent in each drafter this step; empty otherwise.
        drafter_calls: for a multi-drafter tree, 1 for each drafter that was asked this step, else 0.
    """

    tokens: tuple[int, ...]
    accepted_len: int
    accepted_nodes: int
    accepted_ranks: tuple[int, ...]
    visits: tuple[NodeVisit, ...]
    draft_ms: float
    verify_ms: float
    bookkeeping_ms: float
    tree_size: int = 1
    tree_depth: int = 0
    accepted_drafters: tuple[int, ...] = ()
    drafter_ms: tuple[float, ...] = ()
    drafter_calls: tuple[int, ...] = ()

    @property
    def total_ms(self) -> float:
        """Wall time of the step, ms: draft + verify + bookkeeping."""
        return self.draft_ms + self.verify_ms + self.bookkeeping_ms


class NodeAcceptance:
    """How often each node of a static tree was accepted once its parent was, counted over the steps of a run: the
    value model's assumption checked in the context the tree runs in.

    Sequoia's positional model (Chen et al. 2024, section 3.1) values a child of rank k at ``p_k`` whatever its
    parent, and the per-depth model at ``p_{d,k}``; both are measured on a rank-0 spine (the acceptance profiler's
    measurement tree), so a child of a rank-1 or rank-2 node, reached only when the drafter's top guess was wrong,
    is valued with rates measured after it was right. The rates here are measured where each node sits.

    Args:
        tree: the static tree the steps verified.

    Attributes:
        reached: (n,) int64, per node the steps whose accepted path held its parent (the root: every step counted).
        accepted: (n,) int64, per node the steps whose accepted path held it.
        skipped: steps not counted (a tree clipped to fewer nodes than its levels near the end of the context, or
            a path the tree does not hold: another tree's step). A step whose tree was cut to its first d levels (an
            answer's last tokens, the context's end) counts the nodes it held.
    """

    def __init__(self, tree) -> None:
        self.tree = tree
        n = tree.size
        self._children: list[dict[int, int]] = [dict() for _ in range(n)]  # node -> {rank: child}
        for v in range(1, n):
            self._children[int(tree.parent[v])][int(tree.rank[v])] = v
        self._depth = [int(d) for d in tree.depth]
        self._cut_size = np.cumsum(tree.level_widths).tolist()  # nodes of the tree cut to depth 0 .. D
        self.reached = np.zeros(n, dtype=np.int64)
        self.accepted = np.zeros(n, dtype=np.int64)
        self.skipped = 0
        self.by_prompt: list[tuple[np.ndarray, np.ndarray]] = []

    def start_prompt(self) -> None:
        """The steps that follow belong to a new prompt (``by_prompt``: (reached, accepted) per prompt, for an
        interval between prompts: the steps of one prompt are correlated)."""
        n = self.tree.size
        self.by_prompt.append((np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)))

    def add(self, steps) -> "NodeAcceptance":
        """Count steps (:class:`StepStats`, each with its accepted path's ranks), in the current prompt's counts too
        when one was started; returns self."""
        tables = [(self.reached, self.accepted), *self.by_prompt[-1:]]
        for s in steps:
            d = int(s.tree_depth)
            if d >= len(self._cut_size) or s.tree_size != self._cut_size[d]:
                self.skipped += 1
                continue
            path, v = [0], 0
            for r in s.accepted_ranks:
                v = self._children[v].get(int(r), -1)
                if v < 0:
                    break
                path.append(v)
            if v < 0:  # a path the tree does not hold: not this tree's step
                self.skipped += 1
                continue
            for reached, accepted in tables:
                reached[0] += 1
                for u in path:
                    accepted[u] += 1
                    for child in self._children[u].values():
                        if self._depth[child] <= d:
                            reached[child] += 1
        return self

    def rows(self) -> list[dict]:
        """Per non-root node in index order: ``node`` (its ranks from the root), ``depth``, ``rank``, ``reached``,
        ``accepted``, ``rate`` (accepted / reached; None when never reached) and ``se``, the rate's standard error
        between prompts (the ratio estimator's cluster-robust one, ``sqrt(P / (P - 1) sum_i (a_i - rate n_i)^2) /
        sum_i n_i`` over P prompts; None with fewer than two prompts started)."""
        out = []
        P = len(self.by_prompt)
        n_p = np.stack([r for r, _ in self.by_prompt]) if P >= 2 else None
        a_p = np.stack([a for _, a in self.by_prompt]) if P >= 2 else None
        for v, path in enumerate(self.tree.choices(), start=1):
            r, a = int(self.reached[v]), int(self.accepted[v])
            se = None
            if n_p is not None and r:
                resid = a_p[:, v] - (a / r) * n_p[:, v]
                se = float(np.sqrt(P / (P - 1) * float(resid @ resid)) / r)
            out.append({"node": [int(x) for x in path], "depth": len(path), "rank": int(path[-1]), "reached": r,
                        "accepted": a, "rate": a / r if r else None, "se": se})
        return out


@dataclass
class GenerationResult:
    """Output of ``generate`` (batch size 1).

    Attributes:
        tokens: the new tokens (prompt excluded), at most ``max_new_tokens``; ends with an EOS id when
            generation stopped on one.
        prompt_len: tokens in the prompt.
        steps: one :class:`StepStats` per target forward after the prefill.
        prefill_ms: wall time of the prefill (ms; target and draft).
        stop_reason: ``"eos"``, ``"max_new_tokens"`` or ``"empty"`` (``max_new_tokens == 0``).
    """

    tokens: list[int]
    prompt_len: int
    steps: list[StepStats] = field(default_factory=list)
    prefill_ms: float = 0.0
    stop_reason: str = "max_new_tokens"

    @property
    def num_steps(self) -> int:
        """Target forwards after the prefill (one per :class:`StepStats`)."""
        return len(self.steps)

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per target forward (0 when there were no steps)."""
        return len(self.tokens) / len(self.steps) if self.steps else 0.0

    @property
    def draft_ms(self) -> float:
        """Total drafting wall time over the steps, ms (in a batch, each step's time is the whole batch step's)."""
        return sum(s.draft_ms for s in self.steps)

    @property
    def verify_ms(self) -> float:
        """Total target-forward wall time over the steps, ms (in a batch, each step's time is the whole batch
        step's)."""
        return sum(s.verify_ms for s in self.steps)

    @property
    def bookkeeping_ms(self) -> float:
        """Total accept + commit wall time over the steps, ms (in a batch, each step's time is the whole batch
        step's)."""
        return sum(s.bookkeeping_ms for s in self.steps)

    def drafter_totals(self) -> tuple[list[float], list[int], list[int]]:
        """Per drafter of a multi-drafter decoder: total ms, steps it was asked in, accepted nodes it
        proposed (empty lists for a single-drafter or plain decoder)."""
        k = max((len(s.drafter_ms) for s in self.steps), default=0)
        ms, calls, accepted = [0.0] * k, [0] * k, [0] * k
        for s in self.steps:
            for i, v in enumerate(s.drafter_ms):
                ms[i] += v
            for i, v in enumerate(s.drafter_calls):
                calls[i] += v
            for d in s.accepted_drafters:
                if d < k:
                    accepted[d] += 1
        return ms, calls, accepted

    @property
    def decode_ms(self) -> float:
        """Wall time of all steps (ms), prefill excluded."""
        return sum(s.total_ms for s in self.steps)

    @property
    def tokens_per_second(self) -> float:
        """Decoding throughput (tokens / s), prefill excluded."""
        ms = self.decode_ms
        return 1000.0 * len(self.tokens) / ms if ms > 0 else 0.0


@dataclass(frozen=True)
class BatchStep:
    """One step of the loop over the live rows.

    Attributes:
        batch: live rows in this step (rows of the forwards).
        tree_size, tree_depth: the largest row tree of the step (1, 0 for plain decoding).
        emitted: tokens emitted by each live row (after its stop rules), in row order.
        draft_ms, verify_ms, bookkeeping_ms: wall time of drafting, of the target forward, and of accept +
            commit + the policy's observation + row removal (ms).
        rows: each live row's :class:`StepStats` of this step, in row order.
    """

    batch: int
    tree_size: int
    tree_depth: int
    emitted: tuple[int, ...]
    draft_ms: float
    verify_ms: float
    bookkeeping_ms: float
    rows: tuple[StepStats, ...] = ()

    @property
    def total_ms(self) -> float:
        """Wall time of the batch step, ms: draft + verify + bookkeeping."""
        return self.draft_ms + self.verify_ms + self.bookkeeping_ms


@dataclass
class BatchResult:
    """A batch's generation: one :class:`GenerationResult` per prompt (in the order given; their ``steps``
    hold each row's per-step tokens, with the batch step's times) and the batch's steps.

    Attributes:
        results: per prompt.
        steps: per batched step.
        prefill_ms: wall time of the prefill of every row (ms).
    """

    results: list[GenerationResult]
    steps: list[BatchStep] = field(default_factory=list)
    prefill_ms: float = 0.0

    @property
    def decode_ms(self) -> float:
        """Wall time of all batched steps (ms), prefill excluded."""
        return sum(s.total_ms for s in self.steps)

    @property
    def total_tokens(self) -> int:
        """New tokens emitted over every prompt of the batch (prompts excluded)."""
        return sum(len(r.tokens) for r in self.results)

    @property
    def tokens_per_second(self) -> float:
        """Total decoding throughput of the batch (tokens / s over all sequences), prefill excluded."""
        ms = self.decode_ms
        return 1000.0 * self.total_tokens / ms if ms > 0 else 0.0

    @property
    def tokens_per_second_per_sequence(self) -> float:
        """Throughput per sequence: total tokens / s divided by the batch size (tokens / s)."""
        return self.tokens_per_second / max(1, len(self.results))

    @property
    def tokens_per_row_step(self) -> float:
        """Tokens a live row emits per step, the figure a plan's expected tokens per step predicts: the tokens
        the steps emitted over the row-steps they ran (a row that finished takes no more steps, so a batch whose
        rows end at different steps is not diluted by idle rows; the prefill's first token is not a step's).
        0 without steps."""
        row_steps = sum(s.batch for s in self.steps)
        return sum(sum(s.emitted) for s in self.steps) / row_steps if row_steps else 0.0


class Clock:
    """``time.perf_counter`` in ms, synchronising CUDA first when the device is a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    def now(self) -> float:
        """The current ``time.perf_counter`` in ms, after ``torch.cuda.synchronize`` when the device is a GPU (so a
        difference of two readings includes the GPU work queued between them)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter() * 1000.0
