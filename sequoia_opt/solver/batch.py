"""The hardware-aware tree per batch size, and the plan file a server reads (``format: treeopt-batch-trees/1``).

At batch b one step costs ``draft_ms(b) + T(b, n) + overhead(b)`` and emits G(tree) tokens in every one of the
b sequences, so the tree maximising tokens/s per sequence also maximises the batch's total (b times it): the
batch-b choice is :func:`~sequoia_opt.solver.hardware.choose` on the batch-b curve of a
:class:`~sequoia_opt.profiles.batch.BatchLatencyProfile` (Sequoia, Chen et al. 2024, section 4.2, with
T(b, n) for T(n)). As b grows, T(b, n) bends up at smaller n and the chosen tree shrinks towards root-only
(plain decoding) once verification is compute-bound.

Plan file::

    format: treeopt-batch-trees/1
    acceptance_profile: ...
    latency_profile: ...
    context_tokens: 256
    rule: "a server running B sequences uses the entry whose batch_range holds B"
    entries:
      - batch: 1                       # the batch size solved for
        batch_range: [1, 3]            # B in [1, 3] uses this tree (up to the next solved batch - 1)
        nodes: 24
        depth: 6
        level_widths: [1, 4, 7, 6, 4, 1, 1]
        expected_tokens_per_step: 3.1
        tokens_per_s_per_sequence: 41.2
        tokens_per_s_total: 41.2
        plain_tokens_per_s_per_sequence: 21.0
        speedup: 1.96
        choices: [[0], [1], ...]       # Medusa / TensorRT-LLM choice list (root excluded); [] = plain decoding
        engine: {sglang: {...}}        # with --format: that engine's setting for this range

The last solved batch's range ends at that batch (larger batches were not profiled, nothing is predicted for
them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .._io import atomic_write_text, document_text, warn_unknown_keys
from ..errors import ProfileError
from ..profiles.common import MAX_TOKENS, _check_format, _load_yaml, check_integer
from ..profiles.batch import BatchLatencyProfile
from ..tree import Tree, now_iso
from .dp import DPSolution
from .hardware import Choice, choose

BATCH_PLAN_FORMAT = "treeopt-batch-trees/1"

__all__ = ["BATCH_PLAN_FORMAT", "BatchChoice", "choose_per_batch", "choose_at_batch", "larger_solution",
           "plan_document", "save_plan", "load_plan", "tree_for_batch"]


@dataclass(frozen=True)
class BatchChoice:
    """The hardware-aware choice at one batch size.

    Attributes:
        batch: b.  choice: :class:`Choice` on the batch-b curve (its rates are per sequence).
        budget_limit: the budget the DP was given (the asked budget, lowered to the largest n the batch-b
            curve measured).
    """

    batch: int
    choice: Choice
    budget_limit: int

    @property
    def tree(self) -> Tree:
        """The tree chosen at batch b (``choice.tree``)."""
        return self.choice.tree

    @property
    def tokens_per_s_per_sequence(self) -> float:
        """Predicted decoding rate of one of the b sequences, tokens/s (the choice's rate on the batch-b curve)."""
        return self.choice.tokens_per_s

    @property
    def tokens_per_s_total(self) -> float:
        """b x tokens/s per sequence (tokens / s)."""
        return self.batch * self.choice.tokens_per_s

    @property
    def plain_tokens_per_s_per_sequence(self) -> float:
        """Plain batched decoding at b: 1000 / (T(b, 1) + overhead(b)) tokens / s per sequence."""
        return 1000.0 / self.choice.plain_ms_per_token


def choose_per_batch(acceptance: Sequence[float], profile: BatchLatencyProfile, batches: Sequence[int], budget: int,
                     max_depth: int, max_branching: int = 32, *, context: int | None = None,
                     solution: DPSolution | None = None) -> list[BatchChoice]:
    """:func:`choose` at every batch size of ``batches`` on that batch's curve (module docstring).

    Args:
        acceptance: p_1..p_K.  profile: the per-batch latency model.  batches: batch sizes (each measured).
        budget: largest tree size (nodes) considered; lowered per batch to the largest n measured at that batch.
        max_depth, max_branching, context: as :func:`choose`.  solution: DP tables reused across batches.

    Raises:
        ProfileError: a batch size < 1 or not in the profile (:meth:`BatchLatencyProfile.curve`), as
            :func:`choose` otherwise.
    """
    curves = [(int(b), profile.curve(b)) for b in batches]  # every batch checked before any solve
    out = []
    for b, curve in curves:
        ch, limit = choose_at_batch(acceptance, curve, budget, max_depth, max_branching, context=context,
                                    solution=solution)
        solution = larger_solution(solution, ch.solution)
        out.append(BatchChoice(b, ch, limit))
    return out


def choose_at_batch(acceptance: Sequence[float], curve: Any, budget: int, max_depth: int, max_branching: int = 32,
                    *, context: int | None = None, solution: DPSolution | None = None) -> tuple[Choice, int]:
    """:func:`choose` on one batch size's curve (a :class:`~sequoia_opt.profiles.LatencyCurve`), the budget (nodes)
    lowered to the largest n that curve measured. Returns ``(choice, the budget used)``; raises as :func:`choose`."""
    limit = min(int(budget), curve.max_target_tokens(context))
    return choose(acceptance, curve, limit, max_depth, max_branching, context=context, solution=solution), limit


def larger_solution(kept: DPSolution | None, new: DPSolution) -> DPSolution:
    """The DP tables to reuse for the next batch size: ``new`` unless ``kept`` was solved for more nodes."""
    return new if kept is None or new.max_nodes >= kept.max_nodes else kept


def plan_document(choices: Sequence[BatchChoice], *, acceptance_profile: str, latency_profile: str,
                  context: int | None, engine: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``treeopt-batch-trees/1`` mapping for ``choices`` (sorted by batch); ``engine`` maps a batch to its
    engine settings (format name -> setting)."""
    chs = sorted(choices, key=lambda c: c.batch)
    entries = []
    for i, c in enumerate(chs):
        hi = chs[i + 1].batch - 1 if i + 1 < len(chs) else c.batch
        t = c.tree
        e: dict[str, Any] = {
            "batch": c.batch, "batch_range": [c.batch, hi], "nodes": t.size, "depth": t.tree_depth,
            "level_widths": list(t.level_widths), "expected_tokens_per_step": float(c.choice.expected_tokens),
            "tokens_per_s_per_sequence": float(c.tokens_per_s_per_sequence),
            "tokens_per_s_total": float(c.tokens_per_s_total),
            "plain_tokens_per_s_per_sequence": float(c.plain_tokens_per_s_per_sequence),
            "speedup": float(c.choice.speedup), "step_cost_ms": float(c.choice.cost_ms),
            "budget_limit": c.budget_limit, "choices": [list(x) for x in t.choices()],
        }
        if engine and c.batch in engine:
            e["engine"] = engine[c.batch]
        entries.append(e)
    return {"format": BATCH_PLAN_FORMAT, "acceptance_profile": acceptance_profile,
            "latency_profile": latency_profile, "context_tokens": context, "date": now_iso(),
            "rule": "a server running B sequences uses the entry whose batch_range holds B",
            "entries": entries}


def save_plan(path: str | Path, doc: dict[str, Any]) -> Path:
    """Write the plan atomically: JSON when ``path`` ends in ``.json``, else YAML (validated first)."""
    _validate(doc, str(path))
    return atomic_write_text(path, document_text(path, doc))


def _validate(doc: Any, src: str) -> list[tuple[int, int, Tree]]:
    _check_format(doc, BATCH_PLAN_FORMAT, src)
    warn_unknown_keys(doc, ("format", "acceptance_profile", "latency_profile", "context_tokens", "date", "rule",
                            "entries"), src)
    entries = doc.get("entries")
    if not isinstance(entries, list) or not entries:
        raise ProfileError(f"{src}: 'entries' must be a non-empty list")
    out = []
    for i, e in enumerate(entries):
        rng = e.get("batch_range") if isinstance(e, dict) else None
        if isinstance(e, dict):
            warn_unknown_keys(e, ("batch_range", "choices", "level_widths", "engine") + _PLAN_INTEGERS + _PLAN_NUMBERS,
                              f"{src}: entries[{i}]")
        if isinstance(rng, list):
            for x in rng:
                check_integer(x, f"{src}: entries[{i}].batch_range", low=1, high=MAX_TOKENS)
        try:
            lo, hi = (int(x) for x in e["batch_range"])
            choices = e["choices"]
            tree = Tree.from_choices(choices) if choices else Tree.chain(1)
        except (KeyError, TypeError, ValueError) as err:
            raise ProfileError(f"{src}: entries[{i}] needs batch_range [lo, hi] and choices ({err})") from None
        if lo < 1 or hi < lo or (out and lo <= out[-1][1]):
            raise ProfileError(f"{src}: entries[{i}].batch_range {[lo, hi]} must be increasing ranges of batch "
                               "sizes >= 1")
        # the figures stated beside the tree: numbers in range, the shape the tree's own
        for key in _PLAN_INTEGERS:
            if e.get(key) is not None:
                check_integer(e[key], f"{src}: entries[{i}].{key}", high=MAX_TOKENS)
        for key in _PLAN_NUMBERS:
            v = e.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise ProfileError(f"{src}: entries[{i}].{key} = {v!r} must be a number >= 0")
        for key, have in (("nodes", tree.size), ("depth", tree.tree_depth), ("level_widths", list(tree.level_widths))):
            if e.get(key) is not None and e[key] != have:
                raise ProfileError(f"{src}: entries[{i}].{key} is {e[key]} but its choices give {have}")
        out.append((lo, hi, tree))
    if doc.get("context_tokens") is not None:
        check_integer(doc["context_tokens"], f"{src}: context_tokens", high=MAX_TOKENS)
    return out


#: The integer and the other numeric fields of a plan entry (:func:`plan_document`).
_PLAN_INTEGERS = ("batch", "nodes", "depth", "budget_limit")
_PLAN_NUMBERS = ("expected_tokens_per_step", "tokens_per_s_per_sequence", "tokens_per_s_total",
                 "plain_tokens_per_s_per_sequence", "speedup", "step_cost_ms")


def load_plan(path: str | Path) -> list[tuple[int, int, Tree]]:
    """Read a plan file: ``[(lo, hi, tree), ...]`` by batch range. Raises ProfileError."""
    doc, p = _load_yaml(path, "batch plan")  # JSON is YAML too
    return _validate(doc, str(p))


def tree_for_batch(plan: Sequence[tuple[int, int, Tree]], batch: int) -> Tree:
    """The plan's tree for a server running ``batch`` sequences. Raises ProfileError outside every range."""
    for lo, hi, tree in plan:
        if lo <= batch <= hi:
            return tree
    raise ProfileError(f"no entry of the batch plan covers batch {batch} (ranges "
                       f"{', '.join(f'{lo}-{hi}' for lo, hi, _ in plan)})")
