"""The step as the runner runs it: the decoding loop's own draft / verify / bookkeeping times per tree size, timed
through :class:`~sequoia_opt.decoding.loop.Decoder` with the policy and the target face that will run (issue 31).

Why. T(n) and c(w) time one model's forward in isolation, over and over: its weights stay in the CPU's caches,
and nothing reads the logits. A real step alternates two models (each evicts the other's weights), fetches the
target's logits where acceptance reads them (llama.cpp: n rows of a 49k vocabulary copied into Python), reduces
them (argmax or the residual rule), reads the draft's logits for its candidates, and commits the path to both
caches. On this CPU that work made llama.cpp chains run 22-39 % slower than T(n) + c(w) + a fixed overhead
predicted. So the latency profile also records, per tree size n on the target's grid, the loop's medians:

* ``verify_ms(n)`` — the loop's verify part (the target forward over the n tree tokens and the logits handed to
  acceptance), what the cost model charges in place of T(n);
* ``bookkeeping_ms(n)`` — accept, emit, the target's and the drafters' commit, the policy's observe: in place
  of the fixed ``step_overhead_ms``;
* ``draft_step_extra_ms`` and ``draft_extra_ms`` — the loop's draft time beyond the profile's c(w) (its logits
  read, the model's weights reloaded after the target ran, the catch-up over the committed path): once per step
  that drafts, and per draft forward (:func:`draft_extras`);
* n = 1 is plain decoding (no policy): the baseline every speedup divides by.

The probe steps run on a prompt of ``context`` random tokens (the context the curve was measured at), so
almost every draft is rejected: the timed step is the policy's step at that size, with the shortest commit. The
probe tree of size n is the first n nodes of the breadth-first 4-ary tree for a static policy (a few levels,
as solved trees are) and a chain of n - 1 drafts for a chain policy (what chain engines run).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from ..decoding import Decoder
from ..tree import Tree

__all__ = ["LoopTable", "probe_tree", "repeating_prompts", "random_prompts", "time_loop", "ratio_rel_se",
           "round_rel_se", "DEFAULT_REL_SE", "LOOP_MAX_ROUNDS", "static_loop_decoders", "draft_extras",
           "StepCheck", "check_chosen_step"]

ProgressFn = Callable[[str, int, int], None]


@dataclass
class LoopTable:
    """The loop's step times at one context (module docstring), one entry per tree size.

    Attributes:
        context: tokens in the context while timing.
        policy: the policy the steps ran (``static`` or ``chain``).
        tokens: (k,) tree sizes n (1 = plain decoding), increasing.
        verify_ms / bookkeeping_ms / draft_ms: (k,) medians per step (ms).
        level_widths: per size, the probe tree's level widths (the draft forwards it ran: every level but the
            last, one forward each).
        timed: per size, the step pairs behind its medians (a step where a row left the batch or had its tree
            clipped is not counted).
    """

    context: int
    policy: str
    tokens: list[int] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    bookkeeping_ms: list[float] = field(default_factory=list)
    draft_ms: list[float] = field(default_factory=list)
    level_widths: list[tuple[int, ...]] = field(default_factory=list)
    timed: list[int] = field(default_factory=list)


def probe_tree(n: int, policy: str = "static", max_depth: int | None = None) -> Tree:
    """The tree of n nodes whose steps are timed: a chain of n - 1 drafts (``chain``) or the first n nodes of the
    breadth-first 4-ary tree (``static``). ``max_depth``: the drafter proposes no deeper (Medusa's K heads): the
    static tree is the first n nodes of the narrowest k-ary tree (k >= 4) of that depth that holds n, so that no
    step is clipped (a clipped step is not counted, and sizes past the 4-ary tree's depth were left untimed)."""
    if policy == "chain":
        return Tree.chain(n)
    from ..solver.baselines import kary_tree

    if max_depth is None:
        return kary_tree(4, n, n)
    k = 4
    while sum(k ** d for d in range(max_depth + 1)) < n:
        k += 1
    return kary_tree(k, max_depth, n)


def repeating_prompts(rows: int, context: int, vocab_size: int, *, period: int = 16, seed: int = 0,
                      contexts: Sequence[int] | None = None) -> list[list[int]]:
    """``rows`` prompts of ``context + 1`` tokens (row i: ``contexts[i] + 1`` when given), each a random segment of
    ``period`` ids repeated: text that copies itself, where an n-gram drafter (prompt lookup) proposes the
    segment's continuation and a target that copies accepts it, so each step commits a whole chain, as on the
    requests n-grams pay on. On random ids n-grams match nothing and pad their chains with filler that the target
    rejects: a step that commits one token.

    Raises:
        ValueError: ``period`` < 2, ``rows`` < 1, or ``contexts`` not one per row.
    """
    if period < 2 or rows < 1:
        raise ValueError(f"need period >= 2 and rows >= 1, got period {period}, rows {rows}")
    sizes = [int(context)] * int(rows) if contexts is None else [int(c) for c in contexts]
    if len(sizes) != int(rows):
        raise ValueError(f"need one context per row ({rows} rows), got {len(sizes)}")
    rng = np.random.default_rng(seed)
    out = []
    for c in sizes:
        seg = rng.integers(0, vocab_size, period).tolist()
        out.append((seg * (c // period + 2))[: c + 1])
    return out


def random_prompts(contexts: Sequence[int], vocab_size: int, *, seed: int = 0) -> list[list[int]]:
    """One prompt of random ids below ``vocab_size`` per row, row i of ``contexts[i] + 1`` tokens (its context and the
    root of the first step's tree): the probe steps' prompts, on which almost every draft is rejected."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, int(c) + 1).tolist() for c in contexts]


#: the relative standard error a step ratio is measured to when :func:`time_loop` may add rounds (``max_rounds``)
DEFAULT_REL_SE = 0.02
#: the most rounds a latency profile times the loop's step in at one batch size (``max_rounds`` of the batch
#: profilers, treeopt's and llama.cpp's): a size gets more rounds until its step ratio is known to 2 %
LOOP_MAX_ROUNDS = 6
#: :func:`time_loop`'s timed and untimed step pairs per size and round (what :func:`loop_positions` counts)
LOOP_STEPS, LOOP_WARMUP = 8, 2


def round_rel_se(round_medians: Sequence[float]) -> float:
    """The standard error of the mean of per-round medians relative to it: stdev / sqrt(R) / mean over the R
    rounds (each round a fresh decoder, timed in its own seconds). inf with fewer than 3 rounds or a mean <= 0.

    Why rounds and not steps. A decoder instance keeps its speed: on this VM (demo pair, batch 1, 10 rounds of 16
    paired steps) the 2-token chain step's verify ratio to the plain step beside it ranged 1.07-1.24 between rounds
    (sd 0.047) while the steps of one round agreed closely, so the steps' own spread (:func:`ratio_rel_se`) said
    2 % after two rounds while two rounds left the ratio 3 % from its mean, and the latency profiles of seven
    benchmark runs read it anywhere from 1.01 to 1.19 (batch 1's choice of K flips across that range)."""
    xs = [float(x) for x in round_medians]
    if len(xs) < 3:
        return float("inf")
    mean = statistics.fmean(xs)
    if mean <= 0:
        return float("inf")
    return statistics.stdev(xs) / (len(xs) ** 0.5) / mean


def ratio_rel_se(xs: Sequence[float]) -> float:
    """The standard error of the median of ``xs`` relative to it, from the median absolute deviation (robust to
    the heavy tail of a shared machine's step times): 1.2533 x 1.4826 MAD / sqrt(k) / median, the normal
    approximation of the median's error. inf with fewer than 3 values or a median <= 0."""
    if len(xs) < 3:
        return float("inf")
    med = statistics.median(xs)
    if med <= 0:
        return float("inf")
    mad = statistics.median(abs(x - med) for x in xs)
    return 1.2533 * 1.4826 * mad / (len(xs) ** 0.5) / med


def loop_positions(context: int, largest_tree: int, *, steps: int = LOOP_STEPS, warmup: int = LOOP_WARMUP) -> int:
    """Positions :func:`time_loop` decodes into at ``context`` with trees up to ``largest_tree`` tokens: the prompt
    (``context + 1`` tokens), ``warmup + steps + 1`` plain steps, and room for the largest tree at the last step.
    A model whose context is shorter clips the large trees' last steps (and refuses a prompt past it)."""
    return int(context) + 1 + int(warmup) + int(steps) + 1 + int(largest_tree)


def check_loop_fits(context: int, largest_tree: int, model_context: int, *, model: str, fixes: str,
                    longest: int | None = None) -> None:
    """Refuse (ProfileError, one line) timing the loop at ``context`` with trees up to ``largest_tree`` tokens on a
    model whose context is ``model_context`` tokens, when :func:`loop_positions` passes it; the line names the
    ``--context`` that fits and ``fixes`` (the caller's other options). ``longest``: the longest row's context where
    a batch's rows are spread around ``context`` (:func:`~sequoia_opt.profiling.batch.row_contexts`), which is what
    must fit."""
    from ..errors import ProfileError

    top = max(int(context), int(longest or 0))
    need = loop_positions(top, largest_tree)
    if need > model_context:
        fit = context - (need - model_context)
        lower = f"lower --context to {fit}" if fit >= 0 else "lower --context"
        row = f" (its longest row at {top})" if top > context else ""
        raise ProfileError(f"timing the decoding loop at --context {context}{row} with trees up to {largest_tree} "
                           f"tokens decodes {need} positions, past {model}'s context of {model_context} tokens: "
                           f"{lower} or {fixes}")


def time_loop(make_decoder: Callable[[int], Decoder], token_counts: Sequence[int], context: int, vocab_size: int, *,
              policy: str = "static", steps: int = LOOP_STEPS, warmup: int = LOOP_WARMUP, rounds: int = 2,
              seed: int = 0, progress: ProgressFn | None = None, make_plain: Callable[[], Decoder] | None = None,
              rows: int = 1, prompts: Sequence[Sequence[int]] | None = None, max_rounds: int | None = None,
              rel_se: float = DEFAULT_REL_SE) -> LoopTable:
    """Time the loop's steps at every tree size (module docstring), each alternated step by step with a plain
    decoding step (the reference), as :func:`~sequoia_opt.profiling.latency.profile_model` pairs T(n) with T(1).

    On a machine whose speed drifts by tens of percent over seconds (a shared VM), unpaired steps are timed at
    different speeds and the table's shape (what the solver's choice depends on) comes out wrong. Here every timed
    step of size n has a plain step beside it; a size keeps ``median(part / the paired plain step's verify ms)`` x the
    median plain verify ms over all pairs, for its verify, bookkeeping and draft parts alike (n = 1: the plain
    steps' own verify and bookkeeping medians). This is :class:`LoopSweep` run whole; a LoopSweep runs a round at a
    time beside other sweeps (the loop at each batch size, :func:`~sequoia_opt.profiling.batch.profile_batches`).

    Args:
        make_decoder: ``make_decoder(n)`` returns a :class:`~sequoia_opt.decoding.loop.Decoder` whose policy drafts
            :func:`probe_tree` ``(n, policy)`` each step (n = 1: plain decoding, no policy). Called once per size
            and round; a decoder's models may be shared between calls.
        token_counts: tree sizes n (the target curve's grid, with 1: the plain baseline).
        context: committed tokens before the timed steps (random ids below ``vocab_size``).
        steps / warmup: timed and untimed step pairs per size and round.  rounds: sweeps of the grid.
        max_rounds: up to this many sweeps in all (default ``rounds``): after ``rounds``, the sizes whose step
            ratio is not yet known to ``rel_se`` get another round, until none is left or the rounds run out. Known
            means both the steps' spread (:func:`ratio_rel_se` over every pair) and the spread between rounds
            (:func:`round_rel_se` over the rounds' medians, which needs 3 rounds) are within ``rel_se``: each round
            is a fresh decoder, and decoders differ by more than their steps do. On this VM a step's time scatters
            by 10-30 %, and 16 pairs left the chain's first drafted token 15 % cheaper than 108 pairs measured it
            (and the plan chose K = 1 for it).
        make_plain: the reference's plain decoder, one that does not share state with ``make_decoder``'s (a
            llama.cpp target context holds one sequence: the reference needs its own); default
            ``make_decoder(1)`` (treeopt's decoder: each decoder owns its caches).
        rows: the batch size b: every step runs b rows (b random prompts), the table is the loop's step at b
            (the decoders must take ``max_batch`` >= b); a step where a row's tree was clipped is not counted.
        prompts: the b prompts of ``context + 1`` tokens to step (default: random ids); e.g.
            :func:`repeating_prompts` for an n-gram drafter, whose drafts are accepted only on text that repeats.
            Rows may differ in length (:func:`~sequoia_opt.profiling.batch.row_contexts`: the batched decoder's
            steps then attend over the longest row); ``context`` names the table.

    Returns:
        :class:`LoopTable`; a step the decoder clipped (near the end of the context) is not counted.

    Raises:
        DecodingError: as the decoder (a context past the target's).
    """
    return LoopSweep(make_decoder, token_counts, context, vocab_size, policy=policy, steps=steps, warmup=warmup,
                     rounds=rounds, seed=seed, progress=progress, make_plain=make_plain, rows=rows, prompts=prompts,
                     max_rounds=max_rounds, rel_se=rel_se).run()


class LoopSweep:
    """:func:`time_loop` one round at a time (arguments and errors as there): each :meth:`run_round` times every
    tree size once more (after ``rounds``, only the sizes whose step ratio is not yet known to ``rel_se``),
    :meth:`table` turns the rounds so far into the :class:`LoopTable`. Several sweeps (the loop at each batch size)
    run a round each in turn with :func:`~sequoia_opt.profiling.latency.interleave_rounds`, so the machine's drift
    lands on every batch size's plain step alike (:class:`~sequoia_opt.profiling.latency.GridSweep` says why).
    """

    def __init__(self, make_decoder: Callable[[int], Decoder], token_counts: Sequence[int], context: int,
                 vocab_size: int, *, policy: str = "static", steps: int = LOOP_STEPS, warmup: int = LOOP_WARMUP,
                 rounds: int = 2, seed: int = 0, progress: ProgressFn | None = None,
                 make_plain: Callable[[], Decoder] | None = None, rows: int = 1,
                 prompts: Sequence[Sequence[int]] | None = None, max_rounds: int | None = None,
                 rel_se: float = DEFAULT_REL_SE):
        if prompts is None:
            prompts = random_prompts([int(context)] * max(1, int(rows)), vocab_size, seed=seed)
        self.prompts = [list(x) for x in prompts]
        self.make_decoder, self.make_plain = make_decoder, make_plain or (lambda: make_decoder(1))
        self.token_counts, self.context, self.policy = list(token_counts), int(context), policy
        self.steps, self.warmup, self.progress, self.rel_se = int(steps), int(warmup), progress, rel_se
        self.plain: list[tuple[float, float]] = []  # (verify, bookkeeping) of every reference step
        self.sizes = [int(n) for n in token_counts if n > 1]
        self.ratios: dict[int, list[tuple[float, float, float]]] = {n: [] for n in self.sizes}
        self.round_of: dict[int, list[int]] = {n: [] for n in self.sizes}  # the round of each pair in ``ratios``
        self.rounds = int(rounds)
        self.last = max(self.rounds, int(max_rounds or rounds))
        self.round, self.count, self.total = 0, 0, max(1, len(self.sizes)) * self.rounds

    def known(self, n: int) -> bool:
        """Size n's step ratio is known to ``rel_se``, between its steps and between its rounds."""
        steps_ = [sum(x) for x in self.ratios[n]]
        by_round: dict[int, list[float]] = {}
        for r_, x in zip(self.round_of[n], steps_):
            by_round.setdefault(r_, []).append(x)
        return (ratio_rel_se(steps_) <= self.rel_se
                and round_rel_se([statistics.median(v) for v in by_round.values()]) <= self.rel_se)

    def _todo(self) -> list[int]:
        """The sizes the next round times ([] when none is left)."""
        if self.round >= self.last:
            return []
        return self.sizes if self.round < self.rounds else [n for n in self.sizes if not self.known(n)]

    @property
    def done(self) -> bool:
        """No round is left: ``rounds`` have run and every size is known, or ``max_rounds`` have run."""
        return self.round >= self.rounds and not self._todo()  # _todo is empty once max_rounds have run

    def run_round(self) -> None:
        """Time the sizes of the next round (nothing once :attr:`done`)."""
        r, todo = self.round, self._todo()
        if r >= self.rounds:  # an extra round: only the sizes not yet known, none once done
            if not todo:
                return
            self.total += len(todo)
        prompts, context, warmup, steps = self.prompts, self.context, self.warmup, self.steps
        longest = max(len(x) for x in prompts) - 1  # rows of different contexts: room behind the longest
        with torch.inference_mode():
            for n in todo or [1]:
                ref = self.make_plain()
                ref_state = ref.start_batch(prompts, warmup + steps + 1)
                dec = self.make_decoder(n) if n > 1 else None
                state = None
                if dec is not None:  # room for n tokens a step where the decoder has it: accepted drafts must
                    # not finish a row before the timed steps are done
                    room = getattr(dec, "max_len", None)
                    m = warmup + steps + 1
                    if room is not None:
                        m = max(m, min(m * n, int(room) - (longest + 1) - n))
                    positions = getattr(dec, "context", None)  # the model's own context bounds the room too
                    if positions is not None:
                        m = max(warmup + steps + 1, min(m, int(positions) - (longest + 1)))
                    state = dec.start_batch(prompts, m)
                for i in range(warmup + steps):
                    if ref_state.finished or (state is not None and state.finished):
                        break
                    p = ref.step(ref_state)
                    if dec is None:
                        if i >= warmup:
                            self.plain.append((p.verify_ms, p.bookkeeping_ms))
                        continue
                    st = dec.step(state)
                    if i >= warmup:
                        self.plain.append((p.verify_ms, p.bookkeeping_ms))
                        # the step at b rows of n tokens each: not one where a row left (it finished early
                        # on accepted drafts) or had its tree clipped
                        full = st.batch == len(prompts) and all(x.tree_size == n for x in st.rows)
                        if full and p.verify_ms > 0:
                            self.ratios[n].append((st.draft_ms / p.verify_ms, st.verify_ms / p.verify_ms,
                                                   st.bookkeeping_ms / p.verify_ms))
                            self.round_of[n].append(r)
                del ref, dec
                self.count += 1
                if self.progress:
                    self.progress(f"loop step ({self.policy}), context {context}, {n} tokens, round {r + 1}/"
                                  f"{self.rounds if r < self.rounds else self.last}", self.count, self.total)
        self.round += 1

    def run(self) -> LoopTable:
        """Run every round left and return :meth:`table`."""
        while not self.done:
            self.run_round()
        return self.table()

    def table(self) -> LoopTable:
        """The :class:`LoopTable` of the rounds run so far (no sizes before any plain step was timed)."""
        table = LoopTable(context=self.context, policy=self.policy)
        plain = self.plain
        if not plain:
            return table
        v1 = statistics.median(x[0] for x in plain)
        for n in self.token_counts:
            if n == 1:
                table.tokens.append(1)
                table.draft_ms.append(0.0)
                table.verify_ms.append(v1)
                table.bookkeeping_ms.append(statistics.median(x[1] for x in plain))
                table.timed.append(len(plain))
            elif self.ratios.get(int(n)):
                pairs = self.ratios[int(n)]
                table.tokens.append(int(n))
                table.draft_ms.append(v1 * statistics.median(x[0] for x in pairs))
                table.verify_ms.append(v1 * statistics.median(x[1] for x in pairs))
                table.bookkeeping_ms.append(v1 * statistics.median(x[2] for x in pairs))
                table.timed.append(len(pairs))
            else:
                continue
            table.level_widths.append(tuple(int(w) for w in probe_tree(int(n), self.policy).level_widths))
        return table


def static_loop_decoders(target, make_drafter: Callable[[], object], *, backend: str = "auto",
                         max_len: int | None = None, max_batch: int = 1, policy: str = "static",
                         tree: Tree | None = None) -> Callable[[int], Decoder]:
    """``make_decoder`` for :func:`time_loop` on treeopt's decoder: plain decoding at n = 1, else a
    :class:`~sequoia_opt.drafting.policies.StaticTreePolicy` of :func:`probe_tree` ``(n, policy)`` (a chain is a
    static tree of width 1, as a speculation plan runs it), or of ``tree`` itself when given (one chosen tree,
    :func:`check_chosen_step`), with a fresh drafter from ``make_drafter``
    (:func:`~sequoia_opt.drafting.drafters.drafter_factory`: a draft Transformer, a Drafter factory), serving up
    to ``max_batch`` rows."""
    from ..drafting.drafters import drafter_factory
    from ..drafting.policies import StaticTreePolicy

    make = drafter_factory(make_drafter)

    def make_decoder(n: int) -> Decoder:
        if n == 1:
            return Decoder(target, None, backend=backend, max_len=max_len, max_batch=max_batch)
        drafter = make()
        probe = tree if tree is not None else probe_tree(n, policy, getattr(drafter, "depth_limit", None))
        pol = StaticTreePolicy(drafter, probe, cut_at_answer_end=False)
        return Decoder(target, pol, backend=backend, max_len=max_len, max_batch=max_batch)

    return make_decoder


def draft_extras(table: LoopTable, draft_ms: Callable[[int], float], cost_model: str = "per-level",
                 max_width: int | None = None) -> tuple[float, float]:
    """The loop's draft time beyond the profile's c(w), as ``(per_step, per_forward)`` ms: a step of f > 0 draft
    forwards is charged ``sum of c(w) + per_step + f x per_forward``.

    Why two parts. The first draft forward of a step runs just after the target's forward has evicted the draft's
    weights from the CPU's caches (and, with accepted drafts, catches the drafter up over the committed path); the
    forwards after it find the weights warm. Timed through the loop on the demo pair (2026-12-05, 1 thread, chains
    of 1..8 drafts at 101 tokens of context), the draft part of a step was 0.70 + 1.47 x forwards ms at batch 1
    (c(1) alone: about 1.35). One extra per forward, the median of the sizes' (what a profile without
    ``draft_step_extra_ms`` holds), charged a one-draft chain 0.4 ms too little and an eight-draft chain 1 ms too
    much: at batch 2 the served steps of K = 1 and 2 ran 12 % over their prediction and K = 8 4 % under
    (``benchmarks/schedules.py``, three runs).

    The fit: per timed size, ``r = draft_ms(n) - sum of c over the step's draft forwards`` against its forward
    count f (the forwards as :func:`~sequoia_opt.solver.hardware.draft_forwards` charges them; a size with a forward
    wider than ``max_width``, past the measured c, is left out); ``per_forward`` is the Theil-Sen slope (the median
    of the slopes between every two sizes with different counts: robust to one noisy size, as the loop's medians
    are), at least 0, and ``per_step`` the median of ``r - per_forward x f``. With one forward count among the
    sizes (a one-pass drafter always runs one forward) the two cannot be told apart, and a negative ``per_step``
    would undercharge every step: then ``per_step`` is 0 and ``per_forward`` the median of ``r / f``, at least 0.
    ``(0, 0)`` when no timed step drafted.
    """
    from ..solver.hardware import draft_forwards

    pts = []  # (forwards, draft ms beyond c) per timed size
    for d_ms, widths in zip(table.draft_ms, table.level_widths):
        fw = draft_forwards(widths, cost_model)
        if fw and (max_width is None or max(fw) <= max_width):
            pts.append((len(fw), d_ms - sum(draft_ms(w) for w in fw)))
    if not pts:
        return 0.0, 0.0
    slopes = [(r2 - r1) / (f2 - f1) for i, (f1, r1) in enumerate(pts) for f2, r2 in pts[i + 1:] if f2 != f1]
    if slopes:
        per_forward = max(0.0, statistics.median(slopes))
        per_step = statistics.median(r - per_forward * f for f, r in pts)
        if per_step >= 0:
            return per_step, per_forward
    # one forward count, or sizes below a line through 0: one extra per forward
    return 0.0, max(0.0, statistics.median(r / f for f, r in pts))


@dataclass(frozen=True)
class StepCheck:
    """The chosen tree's own step, timed again after the choice (:func:`check_chosen_step`).

    Why. The solver picks the tree whose *measured* step looks cheapest among many sizes; where the curve is noisy
    (a shared CPU, a bumpy T(n)), the winner's measurement is biased low (the winner's curse: the maximum of noisy
    estimates overstates the maximum of the true values), and so is the prediction read from it. A measurement
    taken after the choice, independent of it, is not: the choice stays, its predicted speedup comes from the
    fresh timing (on the demo pair the solver's own figure read 1.49x for a tree that ran at 1.33x).

    Attributes:
        tree_size: n, the tree's nodes.
        plain_ms: the loop's plain step (verify + bookkeeping), median of the paired reference steps (ms).
        step_ms: the tree's step (draft + verify + bookkeeping) in ms: on a random context the median ratio to the
            plain step beside it times ``plain_ms``, as :func:`time_loop` keeps it; on prompts the mean tree step (and
            ``plain_ms`` the mean plain step).
        steps: the step pairs behind it (requested ones where the tree was clipped are left out).
        on: ``"random"`` (a random context: the step at its cheapest, medians) or ``"prompts"`` (real prompts:
            drafts accepted as they will be, means).
    """

    tree_size: int
    plain_ms: float
    step_ms: float
    steps: int
    on: str = "random"

    def speedup(self, expected_tokens: float) -> float:
        """The predicted speedup with this step: ``G x plain_ms / step_ms`` (G: tokens per step)."""
        return float(expected_tokens) * self.plain_ms / self.step_ms

    def as_dict(self) -> dict:
        return {"tree_size": self.tree_size, "plain_ms": round(self.plain_ms, 4), "step_ms": round(self.step_ms, 4),
                "ratio": round(self.step_ms / self.plain_ms, 6), "steps": self.steps, "on": self.on}


def check_chosen_step(target, make_drafter: Callable[[], object], tree: Tree, context: int, *,
                      backend: str = "auto", steps: int = 12, warmup: int = 2, rounds: int = 2, seed: int = 1,
                      progress: ProgressFn | None = None,
                      prompts: Sequence[Sequence[int]] | None = None) -> StepCheck | None:
    """Time the chosen ``tree``'s own step through the decoder, each step paired with a plain step (:class:`StepCheck`
    says why), on ``context`` random tokens, or on the user's ``prompts`` when given.

    On random tokens almost every draft is rejected, so the timed step has the shortest catch-up and commit, and a
    prompt-lookup drafter finds nothing to propose: the probe is the step at its cheapest. On real prompts the
    drafts are accepted as they will be, so the drafter's catch-up over the accepted path, the longer commit and
    the policy's work on it are in the timed step (on the demo pair they cost 5 % of the step that the random probe
    missed: ``benchmarks/step_parts.py``). Each decoder steps its prompt in blocks, as a run does
    (:data:`CHECK_BLOCK_STEPS`), and the figure is the ratio of the *means*, as a run's tokens/s averages steps, not
    the median ratio a curve keeps to rank sizes robustly.

    Args:
        target: the target Transformer.  make_drafter: a draft Transformer or a Drafter factory.
        tree: the chosen tree (a root-only tree has nothing to check: None).
        steps / warmup: timed and untimed step pairs per round (on ``prompts``: timed steps per decoder and round, in
            blocks of :data:`CHECK_BLOCK_STEPS` or more on as many prompts, one block of ``steps`` when fewer).
            rounds: repeats, rotating through the prompts.  seed: the random prompt's.
        prompts: token-id lists (e.g. the acceptance profile's prompts, not the held-out ones): decode these
            instead of a random context (each at most ``context`` tokens are used, its last ones).

    Returns:
        :class:`StepCheck`, or None for a root-only tree or when no step ran unclipped.

    Raises:
        DecodingError: as the decoder (a context past the target's).
    """
    if tree.size < 2:
        return None
    if prompts:
        keep = max(1, int(context))
        return _check_on_prompts(target, make_drafter, tree, [list(p)[-keep:] for p in prompts if len(p)],
                                 backend=backend, steps=steps, warmup=warmup, rounds=rounds, progress=progress)
    make_decoder = static_loop_decoders(target, make_drafter, backend=backend, tree=tree,
                                        max_len=int(context) + (warmup + steps + 2) * tree.size + 16)
    table = time_loop(make_decoder, [1, tree.size], context, target.config.vocab_size, steps=steps, warmup=warmup,
                      rounds=rounds, seed=seed, progress=progress)
    if tree.size not in table.tokens:
        return None
    i = table.tokens.index(tree.size)
    return StepCheck(tree.size, table.verify_ms[0] + table.bookkeeping_ms[0],
                     table.draft_ms[i] + table.verify_ms[i] + table.bookkeeping_ms[i], table.timed[i])


#: the shortest run of consecutive steps one decoder takes in a prompt check (a block): a run steps one decoder
#: many times in a row, and the tree's step beside a plain step in lockstep read 4 % cheaper than in blocks
#: (demo pair, 9-node tree, 3 repeats: lockstep 1.60x plain, blocks 1.65x, the run 1.67x)
CHECK_BLOCK_STEPS = 6


def _check_on_prompts(target, make_drafter, tree: Tree, prompts: list[list[int]], *, backend: str, steps: int,
                      warmup: int, rounds: int, progress: ProgressFn | None) -> StepCheck | None:
    """:func:`check_chosen_step` on real prompts, as a run steps them: per round, one plain and one tree decoder
    (their caches allocated once); each decodes the round's prompts in blocks of consecutive steps (at least
    :data:`CHECK_BLOCK_STEPS`, ``steps`` in all per decoder and round), plain first on even blocks and the tree first
    on odd ones, so a drift of the machine's speed between blocks falls on both; ``warmup`` untimed steps open
    each decoder's first block. The rounds rotate through the prompts. The StepCheck is the mean plain step and the
    mean tree step (a tree step that was clipped, or came after its row finished, is not counted)."""
    if not prompts:
        return None
    per_round = max(1, min(len(prompts), int(steps) // CHECK_BLOCK_STEPS))
    block = max(1, -(-int(steps) // per_round))
    longest = max(len(p) for p in prompts)
    make_decoder = static_loop_decoders(target, make_drafter, backend=backend, tree=tree,
                                        max_len=longest + (warmup + block + 2) * tree.size + 16)
    plain_ms: list[float] = []
    tree_ms: list[float] = []

    def run_block(dec, prompt: list[int], n: int, skip: int, out: list[float], size: int) -> None:
        m = (n + skip + 1) * size  # room for every step to accept its whole tree, within the model's context
        state = dec.start_batch([prompt], max(n + skip + 1, min(m, int(getattr(dec, "context", m + len(prompt)))
                                                              - len(prompt))))
        for i in range(n + skip):
            if state.finished:
                return
            st = dec.step(state)
            if i >= skip and st.rows and all(x.tree_size == size for x in st.rows):
                out.append(st.total_ms)

    with torch.inference_mode():
        for r in range(rounds):
            ref, dec = make_decoder(1), make_decoder(tree.size)
            chosen = [prompts[(r * per_round + j) % len(prompts)] for j in range(per_round)]
            for j, p in enumerate(chosen):
                skip = warmup if j == 0 else 0
                pair = [(ref, plain_ms, 1), (dec, tree_ms, tree.size)]
                for d, out, size in (pair if (r + j) % 2 == 0 else pair[::-1]):
                    run_block(d, p, block, skip, out, size)
            del ref, dec
            if progress:
                progress(f"step check on {per_round} prompts, {tree.size} tokens, round {r + 1}/{rounds}", r + 1,
                         rounds)
    if not tree_ms or not plain_ms:
        return None
    return StepCheck(tree.size, statistics.fmean(plain_ms), statistics.fmean(tree_ms), len(tree_ms),
                     on="prompts")
