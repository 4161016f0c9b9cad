"""Speculation plans per batch size: how far to speculate at each batch size, the setting today's engines take
(vLLM's ``num_speculative_tokens_per_batch_size``, TensorRT-LLM's ``draft_len_schedule``, SGLang's adaptive
tiers, llama.cpp's one setting per ``-np``), solved from measured curves instead of swept blind.

Cost model (Sequoia, Chen et al. 2024, section 4.2, with T(b, n) for T(n); :mod:`sequoia_opt.solver.batch`): at
batch b a step of setting s costs ``draft_ms(b, s) + T(b, n_s) + overhead(b)`` and emits G_s tokens in each of
the b rows, so the setting with the most tokens/s per request also has the most in total (b times it). The
shapes an engine offers, each with its own value model:

* ``none`` — plain decoding: G = 1, one target forward over 1 token per row.
* ``chain`` of K drafted tokens (a draft model, a feature head or n-grams) — replayed on the profile's
  teacher-forced ``chain_traces`` when it has them (what ``treeopt tune`` measures; :class:`ChainValue`), else a
  tree of width 1 valued by the same exact DP as every tree (:func:`~sequoia_opt.solver.depth.solve_profile` with
  branching 1: G(K) is the DP's optimum for K + 1 nodes and depth K); charged K draft forwards of 1 token and
  T(b, K + 1) (:func:`~sequoia_opt.solver.chains.chain_cost`).
* ``envelope`` — an EAGLE-2 dynamic tree of (steps, topk, draft tokens) (SGLang's and TensorRT-LLM's EAGLE
  setting), valued by the calibration profile (:func:`~sequoia_opt.solver.dynamic.predict_setting`).
* ``tree`` — a static tree where the engine still takes one, the hardware-aware choice of
  :func:`~sequoia_opt.solver.hardware.choose` on the batch's curve.

A plan is the best setting at each measured batch size; consecutive batch sizes with the same setting merge
into one range, and a range runs from its first measured batch size to the batch size before the next range's
(the last range ends at the largest measured batch size: nothing is predicted past it). The batch size above
which speculation stops paying is the largest measured one whose best setting speculates, when every larger
measured batch size's best is plain decoding.

Generation length: by default every rate is the steady state of long generations. With ``output_tokens`` = N (the
requests' typical answer length), a speculating setting's rates are scaled by its ``length_factor``,
N / (G E[tau]) with E[tau] the expected steps to emit N tokens, the last step truncated
(:func:`~sequoia_opt.solver.generation.answer_length_factor`; about N / (N + E[O]) for long answers, E[O] the
renewal overshoot; 1 / G at N = 1, where no draft can pay). For an engine that drafts no deeper than a request
can still emit (``answer_end_cut``: treeopt's decoder, llama-server) each step at batch 1 is priced at its own
depth, so an answer's last steps cost less than a whole step (:func:`cut_step_costs`; at larger batch sizes a step
is as deep as its deepest row can use, under continuous batching the whole tree). Short answers favour shorter
drafts. Tokens per step (G), the step's ms and the guard stay the steady state's. Envelopes carry no model of
their step lengths and stay at the steady state (the plan says so in its notes).

Intervals: every predicted rate carries a (low, high) interval, from the value model itself: for chains, the
95 % prediction interval between prompts when the profile keeps per-prompt counts or traces
(:mod:`sequoia_opt.solver.intervals`), else the Wilson interval of the acceptance counts pushed through the same
DP (as for trees); for envelopes, the calibration curve against the recorded acceptances. Latency is taken as
measured. A caller with a better model of the spread passes ``interval=`` (:data:`IntervalFn`) and it is used
instead.

Schedule file (``format: treeopt-schedule/1``, :func:`plan_document`, :func:`load_schedule`)::

    format: treeopt-schedule/1
    engine: vllm                       # what it was solved for
    drafter: draft                     # the drafter's label
    latency_profile: ...               # ids of the profiles it was solved from
    acceptance_profile: ...
    context_tokens: 256
    rule: "a server running B requests uses the range that holds B"
    stops_paying_above: 8              # null: speculation pays at the largest measured batch size
    ranges:
      - batch_range: [1, 3]
        setting: {shape: chain, draft_tokens: 4}     # or {shape: none}, {shape: envelope, steps, topk,
                                                     # draft_tokens}, {shape: tree, choices: [[0], ...]}
        predicted: {batch: 1, tokens_per_s_per_request: ..., tokens_per_s_per_request_interval: [lo, hi], ...}
    by_batch: [...]                    # every measured batch size: the best setting and every candidate scored;
                                       # close_call: the runner-up inside the best's interval, where there is one
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .._io import atomic_write_text, document_text, warn_unknown_keys
from ..errors import ProfileError, SolverError
from ..profiles.batch import BatchLatencyProfile, check_starts_at_one
from ..profiles.common import MAX_TOKENS, _check_format, _load_yaml, check_integer
from ..profiles.latency import LatencyCurve
from ..tree import Tree, now_iso
from .depth import ACCEPTANCE_MODELS, check_acceptance_model
from .hardware import StepCost, step_cost

SCHEDULE_FORMAT = "treeopt-schedule/1"

#: the keys a schedule file holds (:func:`plan_document`, the provenance tune records, the engine settings tune
#: adds); any other is warned of by name, as a misspelling (``stops_paying_abve``) was read as absent
SCHEDULE_KEYS = ("format", "engine", "drafter", "shape", "latency_profile", "acceptance_profile",
                 "calibration_profile", "target", "batches", "refined_batches", "given_plan", "context_tokens",
                 "output_tokens", "min_gain", "first_is_longest", "answer_end_cut", "date", "rule", "stops_paying_above",
                 "ranges", "by_batch", "guard", "notes", "method", "draft_model", "lookup", "engine_settings",
                 "engine_releases", "temperature", "threads", "weights")
#: the keys of one entry of a schedule's ``ranges``
SCHEDULE_RANGE_KEYS = ("batch_range", "setting", "predicted")
SHAPES = ("none", "chain", "envelope", "tree")

__all__ = ["SCHEDULE_FORMAT", "SCHEDULE_KEYS", "SHAPES", "SpecSetting", "Predicted", "BatchRow", "Range", "Plan", "IntervalFn",
           "ChainValue", "EnvelopeValue", "TreeValue", "solve_plan", "check_min_gain", "check_output_tokens",
           "predict_ranges", "check_ranges", "plan_document", "save_schedule", "load_schedule", "Schedule",
           "max_draft_measured", "check_draft_measured", "check_setting_measured", "plan_from_ranges",
           "solve_one_setting_plan", "merge_ranges", "switch_midpoints", "unplaced_switches",
           "cut_step_costs", "load_plan_trees"]


# ---------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class SpecSetting:
    """What a server runs at one batch size (module docstring, the shapes).

    Attributes:
        shape: ``"none"``, ``"chain"``, ``"envelope"`` or ``"tree"``.
        draft_tokens: tokens verified per request besides the root: 0, K, the envelope's draft tokens - 1, the
            tree's size - 1.
        steps: draft forwards per step at most (chain: K; envelope: steps; tree: its depth).
        topk: envelope: children per expanded node; tree: its widest branching; chain / none: 1.
        choices: tree: its choice list (rank paths, breadth-first); empty otherwise.
    """

    shape: str
    draft_tokens: int = 0
    steps: int = 0
    topk: int = 1
    choices: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def none(cls) -> "SpecSetting":
        """Plain decoding: no draft, the root alone verified (``draft_tokens`` 0)."""
        return cls("none")

    @classmethod
    def chain(cls, k: int) -> "SpecSetting":
        """K drafted tokens per step (K = 0 is plain decoding, ``none``)."""
        k = int(k)
        return cls("chain", k, k) if k > 0 else cls.none()

    @classmethod
    def envelope(cls, setting: Any) -> "SpecSetting":
        """From an EAGLE :class:`~sequoia_opt.dynamic.DynamicSetting` (its budget counts the root)."""
        return cls("envelope", int(setting.budget) - 1, int(setting.steps), int(setting.topk))

    @classmethod
    def static_tree(cls, tree: Tree) -> "SpecSetting":
        """The setting of a static tree: ``tree`` with its size - 1 draft tokens, its depth as ``steps``, its widest
        branching as ``topk`` and its choice list; plain decoding (:meth:`none`) for a root-only tree."""
        if tree.size < 2:
            return cls.none()
        return cls("tree", tree.size - 1, tree.tree_depth, max(1, tree.max_branching_used),
                   tuple(tuple(int(r) for r in c) for c in tree.choices()))

    @property
    def speculates(self) -> bool:
        """True unless the setting is plain decoding (it verifies at least one draft token per request)."""
        return self.draft_tokens > 0

    @property
    def label(self) -> str:
        """The setting's name in reports: ``none``, ``chain:K``, ``eagle:sS-kK-nN`` (N counts the root, as SGLang's
        draft tokens) or ``tree:nN-dD`` (N nodes with the root, depth D)."""
        if self.shape == "none":
            return "none"
        if self.shape == "chain":
            return f"chain:{self.draft_tokens}"
        if self.shape == "envelope":
            return f"eagle:s{self.steps}-k{self.topk}-n{self.draft_tokens + 1}"
        return f"tree:n{self.draft_tokens + 1}-d{self.steps}"

    def tree(self) -> Tree:
        """The static tree this setting verifies: the root alone, a chain of K + 1 nodes, or the tree (an
        envelope has none: ValueError)."""
        if self.shape == "envelope":
            raise ValueError("an EAGLE envelope grows its tree per step; it has no static tree")
        if self.shape == "tree":
            return Tree.from_choices([list(c) for c in self.choices])
        return Tree.chain(self.draft_tokens + 1)

    def dynamic(self) -> Any:
        """The :class:`~sequoia_opt.dynamic.DynamicSetting` of an envelope (the ``eagle`` rule)."""
        from ..dynamic import DynamicSetting

        return DynamicSetting("eagle", self.steps, self.topk, self.draft_tokens + 1)

    def to_dict(self) -> dict[str, Any]:
        """The schedule file's setting mapping (:meth:`from_dict` reads it back): ``{shape: none}``, a chain's
        ``draft_tokens``, an envelope's ``steps``, ``topk`` and ``draft_tokens`` (counting the root), or a tree's
        ``choices``."""
        if self.shape == "none":
            return {"shape": "none"}
        if self.shape == "chain":
            return {"shape": "chain", "draft_tokens": self.draft_tokens}
        if self.shape == "envelope":
            return {"shape": "envelope", "steps": self.steps, "topk": self.topk,
                    "draft_tokens": self.draft_tokens + 1}
        return {"shape": "tree", "choices": [list(c) for c in self.choices]}

    @classmethod
    def from_dict(cls, d: Any, where: str = "setting") -> "SpecSetting":
        """Read :meth:`to_dict`'s mapping (an envelope's ``draft_tokens`` counts the root, as SGLang's
        ``--speculative-num-draft-tokens``).

        Raises:
            ProfileError (one line): no known ``shape``; a key that shape does not take (``{shape: none,
                draft_tokens: 3}`` or a tree's ``nodes`` was read as plain decoding without a word); a tree without
                its ``choices``; a number out of range.
        """
        if not isinstance(d, Mapping) or d.get("shape") not in SHAPES:
            raise ProfileError(f"{where} must be a mapping with shape one of {', '.join(SHAPES)}, got {d!r}")
        shape = d["shape"]
        extra = sorted(set(map(str, d)) - _SETTING_KEYS[shape])
        if extra:
            takes = ", ".join(sorted(_SETTING_KEYS[shape] - {"shape"})) or "nothing else"
            raise ProfileError(f"{where}: shape {shape} takes {takes}, not {', '.join(extra)}")
        if shape == "tree" and not d.get("choices"):
            raise ProfileError(f"{where}: shape tree needs its choices, a non-empty list of rank paths such as "
                               "[[0], [1], [0, 0]]")
        if shape == "none":
            return cls.none()
        if shape == "chain":
            return cls.chain(check_integer(d.get("draft_tokens"), f"{where}.draft_tokens", high=MAX_TOKENS))
        if shape == "envelope":
            steps = check_integer(d.get("steps"), f"{where}.steps", low=1, high=MAX_TOKENS)
            topk = check_integer(d.get("topk"), f"{where}.topk", low=1, high=MAX_TOKENS)
            n = check_integer(d.get("draft_tokens"), f"{where}.draft_tokens", low=2, high=MAX_TOKENS)
            return cls("envelope", n - 1, steps, topk)
        try:
            return cls.static_tree(Tree.from_choices(d.get("choices") or []))
        except (TypeError, ValueError) as err:
            raise ProfileError(f"{where}.choices: {err}") from None


#: The keys each shape's mapping takes (:meth:`SpecSetting.to_dict`).
_SETTING_KEYS = {"none": {"shape"}, "chain": {"shape", "draft_tokens"},
                 "envelope": {"shape", "steps", "topk", "draft_tokens"}, "tree": {"shape", "choices"}}


# ---------------------------------------------------------------------------------------------- predictions
#: ``(setting, batch, step cost) -> (low, high)`` tokens/s per request: an interval model a caller supplies
#: (e.g. one built from per-prompt acceptance); the value model's own is the default (module docstring).
IntervalFn = Callable[[SpecSetting, int, StepCost], tuple[float, float]]


@dataclass(frozen=True)
class Predicted:
    """A setting's predicted step at one batch size.

    Attributes:
        setting: the setting.  batch: b.  cost: the steady-state step (G per request, ms, tokens/s per request,
            speedup over plain decoding at the same batch size).
        interval: (low, high) tokens/s per request, over the plan's answer length.
        length_factor: the rates' factor over the plan's answer length (module docstring; 1: the steady state).
    """

    setting: SpecSetting
    batch: int
    cost: StepCost
    interval: tuple[float, float]
    length_factor: float = 1.0

    @property
    def tokens_per_s_per_request(self) -> float:
        """Predicted tokens/s of one request at this batch size, over the plan's answer length (the steady-state rate
        times :attr:`length_factor`)."""
        return self.cost.tokens_per_s * self.length_factor

    @property
    def tokens_per_s_total(self) -> float:
        """Predicted tokens/s of the whole batch: b x the per-request rate."""
        return self.batch * self.tokens_per_s_per_request

    @property
    def speedup(self) -> float:
        """Over plain decoding at the same batch size, over the plan's answer length."""
        return self.cost.speedup * self.length_factor

    def to_dict(self) -> dict[str, Any]:
        """The schedule file's ``predicted`` mapping: batch, setting label, G (``expected_tokens_per_step``), the step's
        total, draft and target ms, the length factor, tokens/s per request and in total, each with its (low, high)
        interval, and the speedup; floats rounded (4 decimals for ms and rates, 6 for G, the factor and speedup)."""
        c, (lo, hi) = self.cost, self.interval
        return {"batch": self.batch, "setting": self.setting.label,
                "expected_tokens_per_step": round(c.expected_tokens, 6), "step_ms": round(c.cost_ms, 4),
                "draft_ms": round(c.draft_ms, 4), "target_ms": round(c.target_ms, 4),
                "length_factor": round(self.length_factor, 6),
                "tokens_per_s_per_request": round(self.tokens_per_s_per_request, 4),
                "tokens_per_s_per_request_interval": [round(lo, 4), round(hi, 4)],
                "tokens_per_s_total": round(self.tokens_per_s_total, 4),
                "tokens_per_s_total_interval": [round(self.batch * lo, 4), round(self.batch * hi, 4)],
                "speedup": round(self.speedup, 6)}


@dataclass(frozen=True)
class BatchRow:
    """One measured batch size: the best setting, plain decoding, and every candidate scored (best first), those an
    engine's rule rules out too; ``cap``: the most draft tokens the rule leaves this batch size (TensorRT-LLM's: no
    more than batch 1), None without one. Re-ranking (:class:`~sequoia_opt.drafting.policies.adaptive_schedule.
    PlanAdapter`) needs every candidate: the rule's cap is chosen again from all of them."""

    batch: int
    best: Predicted
    plain: Predicted
    candidates: tuple[Predicted, ...]
    cap: int | None = None

    @property
    def close_call(self) -> Predicted | None:
        """The best other setting when its predicted tokens/s lies inside the best's prediction interval: a new
        sample of prompts could rank the two either way (None otherwise, and always without an interval).

        Why it matters: the acceptance of one prompt set read as another's is the plan's largest error. Demo
        pair, held-out eval requests against the profile prompts: tokens per step 7-13 % above the profile's at
        K = 1-3, which made K = 2 beat the chosen K = 1 by 4-5 % at batch 2 and 4, where the two were predicted
        0-3 % apart; re-solved from the served requests' own acceptance the plan chose the measured best at every
        batch size (``benchmarks/schedules.py``, served_acceptance).
        """
        lo = self.best.interval[0]
        alt = next((c for c in self.candidates if c.setting != self.best.setting
                    and (self.cap is None or c.setting.draft_tokens <= self.cap)
                    and c.tokens_per_s_per_request <= self.best.tokens_per_s_per_request), None)
        if alt is None or lo >= self.best.tokens_per_s_per_request:
            return None
        return alt if alt.tokens_per_s_per_request >= lo else None


@dataclass(frozen=True)
class Range:
    """Batch sizes ``lo..hi`` run ``setting``; ``predicted`` is its step at the first measured batch size in the
    range (None when none is: a given schedule's range between two measured batch sizes)."""

    lo: int
    hi: int
    setting: SpecSetting
    predicted: Predicted | None


@dataclass
class Plan:
    """A speculation plan (module docstring).

    Attributes:
        rows: per measured batch size, ascending.  ranges: the merged ranges.
        stops_paying_above: the largest measured batch size where speculation pays when plain decoding is best at
            every larger one; None when speculation pays at the largest measured batch size; 0 when it pays at
            none.
        shape: the value model's shape.  context: the context (tokens) the curves were read at.
        provenance: ids of the profiles and what was solved (written into the schedule file).
        notes: one line each, what the user should know (a K limit lowered, a constraint applied).
        interval_method: how the predictions' intervals were made (the value model's ``interval_method``:
            ``between prompts``, ``wilson``, or ``none`` / another word for a model without one).
        output_tokens: the generation length (tokens per request) the rates were scaled to (module docstring);
            None for the steady state of long generations.
        min_gain: the lead over plain decoding a setting needed to be chosen (:func:`solve_plan`'s; 0: none).
        first_is_longest: whether no batch size may draft more than the smallest one (TensorRT-LLM's rule).
        answer_end_cut: whether batch 1 priced an answer's cut last steps (:func:`solve_plan`'s).
        own_best: with ``first_is_longest``, each row's own choice without the rule (what the rule's plan gave up
            where it differs); empty without the rule.
    """

    rows: list[BatchRow]
    ranges: list[Range]
    stops_paying_above: int | None
    shape: str
    context: int | None
    provenance: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    interval_method: str = "none"
    output_tokens: int | None = None
    min_gain: float = 0.0
    first_is_longest: bool = False
    answer_end_cut: bool = False
    own_best: tuple[Predicted, ...] = ()

    @property
    def own_best_first(self) -> Predicted:
        """Batch 1's own choice (the rule's plan may run another there so that larger batch sizes draft longer)."""
        return self.own_best[0] if self.own_best else self.rows[0].best

    @property
    def pays_nowhere(self) -> bool:
        """True when speculation beats plain decoding at no measured batch size (``stops_paying_above == 0``)."""
        return self.stops_paying_above == 0

    def setting_at(self, batch: int) -> SpecSetting:
        """The setting of the range holding ``batch``. Raises ProfileError past the ranges."""
        for r in self.ranges:
            if r.lo <= batch <= r.hi:
                return r.setting
        raise ProfileError(f"the plan covers batch sizes 1..{self.ranges[-1].hi}, not {batch}")

    def row(self, batch: int) -> BatchRow:
        """The solved row of ``batch``. Raises ProfileError for a batch size that was not solved."""
        for r in self.rows:
            if r.batch == batch:
                return r
        raise ProfileError(f"batch size {batch} was not solved (solved: {', '.join(str(r.batch) for r in self.rows)})")


# ---------------------------------------------------------------------------------------------- value models
def check_draft_measured(max_draft: int, profile: BatchLatencyProfile, batches: Sequence[int],
                         context: int | None = None) -> None:
    """Refuse chains of up to ``max_draft`` drafted tokens where some batch size's curve did not measure
    ``T(b, max_draft + 1)`` (no extrapolation).

    Raises:
        ProfileError: naming the batch size, what it measured and ``--max-draft``.
    """
    for b in sorted(batches):
        top = profile.curve(b).max_target_tokens(context) - 1
        if max_draft > top:
            raise ProfileError(f"draft length {max_draft} is past what latency profile {profile.id!r} measured "
                               f"at batch {b} (T(b, n) up to n = {top + 1}, so K <= {top}); lower --max-draft or "
                               "profile more tokens")


def check_setting_measured(setting: SpecSetting, batch: int, profile: BatchLatencyProfile,
                           context: int | None = None, where: str = "") -> None:
    """Refuse ``setting`` at ``batch`` where its K + 1 verified tokens lie past the largest n the profile's T(b, n)
    measured there (no extrapolation).

    Raises:
        ProfileError: naming ``where`` (a file, or nothing), the setting, the batch size and what was measured.
    """
    top = profile.curve(batch).max_target_tokens(context) - 1
    if setting.draft_tokens > top:
        raise ProfileError(f"{where}{': ' if where else ''}{setting.label} at batch {batch} is past what latency "
                           f"profile {profile.id!r} measured (T(b, n) up to n = {top + 1})")


def max_draft_measured(profile: BatchLatencyProfile, batches: Sequence[int], context: int | None = None) -> int:
    """The longest chain every batch size's curve prices without extrapolating: min over b of the largest
    measured T(b, n), less the root."""
    return min(profile.curve(b).max_target_tokens(context) for b in batches) - 1


def _tps_interval(g_lo: float, g_hi: float, cost: StepCost) -> tuple[float, float]:
    return 1000.0 * g_lo / cost.cost_ms, 1000.0 * g_hi / cost.cost_ms


#: how :class:`ChainValue` values a chain: ``replay`` needs a profile's ``chain_traces``; ``auto`` replays them
#: when present, else as :func:`~sequoia_opt.solver.depth.resolve_acceptance_model`; the rest as ``treeopt solve``
CHAIN_ACCEPTANCE_MODELS = ACCEPTANCE_MODELS[:1] + ("replay",) + ACCEPTANCE_MODELS[1:]


def check_chain_acceptance_model(name: str) -> str:
    """``name`` when it is one of :data:`CHAIN_ACCEPTANCE_MODELS`. Raises SolverError (one line) otherwise."""
    return check_acceptance_model(name, CHAIN_ACCEPTANCE_MODELS)


class ChainValue:
    """Chains of K = 0..``max_draft`` drafted tokens under an acceptance profile: G(K), the expected tokens per
    step.

    * ``replay`` (``auto``'s choice when the profile has ``chain_traces``, :func:`~sequoia_opt.profiling.acceptance.
      chain_traces`): each K replayed on the profile prompts' teacher-forced agreements
      (:func:`~sequoia_opt.solver.chains.replay_counts`), exact for greedy decoding on them. Why not per-depth
      rates from every start: a chain never starts inside a run it would have accepted whole, so rates averaged
      over every position over-value long chains (demo pair, 32 prompts x 64 tokens: K = 2 by 3.5 %, K = 4 by
      6.7 %, K = 8 by 12 % against the replay; the decoder matches the replay step for step). G is the steady
      state (steps with room for all K drafts); :meth:`length_factor` replays answers of the plan's length.
    * otherwise Sequoia's DP with branching 1 (a chain is a tree of width 1) under the profile's positional or
      per-depth vectors (:func:`~sequoia_opt.solver.depth.resolve_acceptance_model`).

    Its interval: with per-prompt data, the 95 % prediction interval between prompts for a new set as large as
    the profile's (issue 31, :mod:`sequoia_opt.solver.intervals`: tokens of one prompt are correlated; the replay
    resamples its per-prompt tokens and steps, :func:`~sequoia_opt.solver.intervals.ratio_spread`); else the same
    DP on the Wilson bounds of p_1 (95 %, tokens counted as independent: too narrow for new traffic), or the point
    without counts.

    Args:
        acceptance: an :class:`~sequoia_opt.profiles.AcceptanceProfile`.  max_draft: the longest chain scored.
        acceptance_model: ``auto`` | ``replay`` | ``positional`` | ``by-depth``.

    Attributes:
        model_used: the model G came from.  g, g_lo, g_hi: per K, G and its interval.  whole_answer_ks: replay only,
            the K that fewer than half the traced answers have room for (their G is whole answers', end steps
            included).

    Raises:
        SolverError: max_draft < 0; ``replay`` of a profile without ``chain_traces``; as
            :func:`~sequoia_opt.solver.depth.solve_profile`.
    """

    shape = "chain"

    def __init__(self, acceptance: Any, max_draft: int, *, acceptance_model: str = "auto") -> None:
        from .depth import solve_profile, solve_dp_by_depth
        from .dp import solve_dp

        if isinstance(max_draft, bool) or int(max_draft) != max_draft or max_draft < 0:
            raise SolverError(f"the longest chain must be an integer >= 0, got {max_draft!r}")
        self.acceptance, self.max_draft = acceptance, int(max_draft)
        K = max(1, self.max_draft)
        self._factors: dict[tuple[int, int, tuple[float, ...] | None], float] = {}
        self.whole_answer_ks: list[int] = []  # replay: K whose steady state the traces are too short to show
        traces = getattr(acceptance, "chain_traces", None)
        check_chain_acceptance_model(acceptance_model)
        if acceptance_model == "replay" and not traces:
            raise SolverError(f"acceptance profile {getattr(acceptance, 'id', '?')!r} has no chain_traces to replay "
                              "(measure one with treeopt profile acceptance --chains, or use --acceptance-model auto)")
        if traces and acceptance_model in ("auto", "replay"):
            self._replay(list(traces), K)
            return
        sol, self.model_used = solve_profile(acceptance, K + 1, K, 1, acceptance_model)
        self.g = [1.0] + [float(sol.table[k + 1, k]) for k in range(1, K + 1)]
        self.g_lo, self.g_hi = list(self.g), list(self.g)
        self.interval_method = "none"
        if self._prompt_intervals(K):
            return
        if getattr(acceptance, "counts", None) is not None:
            self.interval_method = "wilson"
            ci = acceptance.confidence_interval()
            p1 = float(acceptance.acceptance[0])
            for j, bound in ((0, self.g_lo), (1, self.g_hi)):
                b1 = float(ci[0, j])
                if self.model_used == "by-depth":
                    rows = acceptance.depth_rows().copy()
                    rows[:, 0] = np.clip(rows[:, 0] * (b1 / p1 if p1 > 0 else 0.0), 0.0, 1.0)
                    rows[:, 1:] = 0.0
                    s = solve_dp_by_depth(rows, K + 1, K, 1)
                else:
                    s = solve_dp(np.array([b1]), K + 1, K, 1)
                bound[1:] = [float(s.table[k + 1, k]) for k in range(1, K + 1)]

    def _replay(self, traces: list[str], K: int) -> None:
        """G, its interval and the answer lengths' replays from ``chain_traces`` (class docstring)."""
        from .chains import replay_counts
        from .intervals import ratio_spread

        self.model_used, self._traces = "replay", traces
        measured = getattr(self.acceptance, "measured", {}) or {}
        self._traced_tokens = int(measured.get("max_new_tokens") or max(len(t) for t in traces))
        self.g, self.g_lo, self.g_hi = [1.0], [1.0], [1.0]
        self.interval_method = "between prompts" if len(traces) >= 2 else "none"
        for k in range(1, K + 1):
            tok, steps = replay_counts(traces, k)
            room = [i for i, n in enumerate(steps) if n > 0]  # the answers with room for k drafts
            if len(room) < max(min(2, len(traces)), (len(traces) + 1) // 2):
                # most answers are too short for k drafts: their steady state would be a few long answers' (and
                # its interval as narrow as those few): the whole answers, end steps and all
                tok, steps = replay_counts(traces, k, self._traced_tokens)
                self.whole_answer_ks.append(k)
            else:
                tok, steps = [tok[i] for i in room], [steps[i] for i in room]
            g = sum(tok) / sum(steps)
            spread = ratio_spread(tok, steps, clip=(1.0, None))  # None for one answer
            lo, hi = spread.prediction_interval(spread.prompts) if spread is not None else (g, g)
            self.g.append(g)
            self.g_lo.append(min(lo, g))
            self.g_hi.append(max(hi, g))

    def _replay_factor(self, k: int, output_tokens: int, depth_costs: Sequence[float] | None = None) -> float:
        """Answers of at most N = ``output_tokens`` tokens: the traces replayed, each cut at N. Past the traced
        length, an answer that ended there (an EOS) stays as it was, and one that ran to the traced length goes on
        at the steady rate G for its N - traced more tokens (its end-of-answer steps kept: with every answer
        traced to its end this is rate = 1 / (1 / G + c / N), c the extra steps per answer). With ``depth_costs``
        (N within the traces) each step counts its cost over the whole chain's
        (:func:`~sequoia_opt.solver.chains.replay_step_costs`: the last steps of an answer cut at N draft less)."""
        from .chains import replay_counts, replay_step_costs

        g, traced = self.g[k], self._traced_tokens
        n = min(int(output_tokens), traced)
        if depth_costs is not None and int(output_tokens) <= traced:
            tok, steps = replay_step_costs(self._traces, k, n, [c / depth_costs[k] for c in depth_costs])
        else:
            tok, steps = replay_counts(self._traces, k, n)
        more = max(0, int(output_tokens) - traced) * sum(len(t) >= traced for t in self._traces)
        return (sum(tok) + more) / (sum(steps) + more / g) / g

    def _prompt_intervals(self, K: int) -> bool:
        """Fill ``g_lo`` / ``g_hi`` from the spread between prompts; False when the profile has no per-prompt
        counts (or one prompt)."""
        from ..tree import Tree
        from .intervals import tree_spreads

        pc = getattr(self.acceptance, "prompt_counts", None)
        if pc is None or pc.shape[0] < 2:
            return False
        spreads = tree_spreads([Tree.chain(k + 1) for k in range(1, K + 1)], self.acceptance, model=self.model_used)
        if spreads is None:
            return False
        for k, spread in enumerate(spreads, start=1):
            lo, hi = spread.prediction_interval(spread.prompts)
            # the interval around the DP's own point (the bootstrap's point is the same G up to rounding)
            self.g_lo[k], self.g_hi[k] = min(lo, self.g[k]), max(hi, self.g[k])
        self.interval_method = "between prompts"
        return True

    def settings(self) -> list[SpecSetting]:
        """The candidates at every batch size: chains of K = 0 (plain decoding) to ``max_draft`` drafted tokens."""
        return [SpecSetting.chain(k) for k in range(0, self.max_draft + 1)]

    def length_factor(self, setting: SpecSetting, output_tokens: int,
                      depth_costs: Sequence[float] | None = None) -> float:
        """The rate's factor for a chain of ``setting.draft_tokens`` over answers of ``output_tokens`` tokens, under
        the value model G is read from (:meth:`~sequoia_opt.solver.depth.ValueModel.answer_length_factor`); 1 for
        plain decoding. ``depth_costs``: (K + 1,) ms of a step drafting 0 .. K tokens (:func:`cut_step_costs`), for
        the cheaper last steps of an answer (a batch of one); None: every step costs the chain's."""
        from ..tree import Tree
        from .depth import ValueModel

        k, n = setting.draft_tokens, int(output_tokens)
        key = (k, n, None if depth_costs is None else tuple(float(c) for c in depth_costs))
        if key not in self._factors and self.model_used == "replay":
            self._factors[key] = self._replay_factor(k, n, depth_costs) if k else 1.0
        if key not in self._factors:
            vm = ValueModel.of_profile(self.acceptance, self.model_used)
            self._factors[key] = vm.answer_length_factor(Tree.chain(k + 1), n, depth_costs)
        return self._factors[key]

    def predict(self, setting: SpecSetting, batch: int, curve: LatencyCurve,
                context: int | None) -> tuple[StepCost, tuple[float, float]]:
        """The step of a chain (or ``none``) at ``batch`` and its default interval (tokens/s per request).

        Raises:
            SolverError: a shape other than none / chain, or K past ``max_draft``.
        """
        from .chains import chain_cost

        k = setting.draft_tokens
        if setting.shape not in ("none", "chain") or k > self.max_draft:
            raise SolverError(f"a chain value model of K <= {self.max_draft} cannot price {setting.label}")
        cost = chain_cost(k, self.g[k], curve, context)
        return cost, _tps_interval(self.g_lo[k], self.g_hi[k], cost)


class EnvelopeValue:
    """EAGLE envelopes (steps, topk, draft tokens) valued by a calibration profile
    (:func:`~sequoia_opt.solver.dynamic.predict_setting`: the EAGLE-2 rule replayed over recorded draft trees,
    each node's acceptance read from the calibration curve); the interval spans the calibration value and the
    recorded acceptances' replay of the same trees.

    Args:
        calibration: a :class:`~sequoia_opt.profiles.calibration.CalibrationProfile`.
        settings: the envelopes scored (default: :func:`~sequoia_opt.solver.dynamic.setting_grid`, eagle only).
        max_steps: recorded steps used per prediction (evenly spaced).
    """

    shape = "envelope"
    #: the interval's source (:attr:`Plan.interval_method`): the calibration value against the recorded replay
    interval_method = "calibration vs replay"

    def __init__(self, calibration: Any, settings: Sequence[Any] | None = None, *, max_steps: int | None = 200) -> None:
        from .dynamic import setting_grid

        self.calibration = calibration
        self._settings = list(settings) if settings is not None else setting_grid(calibration, policies=("eagle",))
        self.max_steps = max_steps
        self.max_draft = max((s.budget - 1 for s in self._settings), default=0)

    def settings(self) -> list[SpecSetting]:
        """The candidates at every batch size: plain decoding and every envelope scored."""
        return [SpecSetting.none()] + [SpecSetting.envelope(s) for s in self._settings]

    def predict(self, setting: SpecSetting, batch: int, curve: LatencyCurve,
                context: int | None) -> tuple[StepCost, tuple[float, float]]:
        """The step of ``setting`` at ``batch`` rows on ``curve`` (read at ``context`` tokens), and its tokens/s
        per request interval (low, high).

        Raises:
            ProfileError: as :func:`~sequoia_opt.solver.dynamic.predict_setting` (a size or width past the curve).
        """
        from .dynamic import predict_setting

        if setting.shape == "none":
            cost = step_cost([1], 1.0, curve, context)  # a root-only tree, as the chain and tree models price K = 0
            return cost, (cost.tokens_per_s, cost.tokens_per_s)
        pred = predict_setting(self.calibration, setting.dynamic(), curve, context, max_steps=self.max_steps)
        g, r = pred.tokens_per_step, pred.replay
        return pred.cost, _tps_interval(min(g, r), max(g, r), pred.cost)


class TreeValue:
    """Static trees: at each batch size the hardware-aware tree of :func:`~sequoia_opt.solver.hardware.choose`
    (budget lowered to what the batch's curve measured), valued positionally. The interval is the tree's G over a
    new prompt set as large as the profile's (the spread between its prompts, a cluster bootstrap:
    :func:`~sequoia_opt.solver.intervals.tree_spreads`) where the profile keeps per-prompt counts, else G under the
    Wilson bounds of every p_k (``interval_method`` says which, as :class:`ChainValue`'s).

    Args:
        acceptance: an :class:`~sequoia_opt.profiles.AcceptanceProfile` (its positional vector).
        budget: the most nodes a tree holds, root included (the tokens verified per row; lowered at each batch size
            to what its curve measured).  max_depth / max_branching: the DP's limits.
    """

    shape = "tree"

    def __init__(self, acceptance: Any, *, budget: int = 64, max_depth: int = 12, max_branching: int = 16) -> None:
        self.acceptance, self.budget, self.max_depth, self.max_branching = acceptance, budget, max_depth, max_branching
        self.max_draft = budget - 1
        self._solution = None
        pc = getattr(acceptance, "prompt_counts", None)
        self.interval_method = ("between prompts" if pc is not None and pc.shape[0] >= 2 else
                                "wilson" if getattr(acceptance, "counts", None) is not None else "none")
        self._g_intervals: dict[tuple, tuple[float, float]] = {}

    def settings_at(self, batch: int, curve: LatencyCurve, context: int | None) -> list[SpecSetting]:
        """The candidates at ``batch``: plain decoding, the hardware-aware tree on that batch's curve, and the
        hardware-aware tree of each smaller depth cap (1 .. its depth - 1). In the steady state the first tree wins
        by construction; the shallower ones are what short answers (``output_tokens``) may prefer, as every K is a
        candidate for chains: a tree deeper than the answer's remaining tokens drafts levels nothing can accept."""
        from .batch import choose_at_batch, larger_solution

        p = self.acceptance.acceptance
        ch, _ = choose_at_batch(p, curve, self.budget, self.max_depth, self.max_branching, context=context,
                                solution=self._solution)
        self._solution = larger_solution(self._solution, ch.solution)
        trees = [ch.tree]
        for c in ch.shallower.values():  # the choice under each smaller depth cap, deepest cap first
            t = ch.solution.tree(c.budget, c.depth)
            if all(t.choices() != u.choices() for u in trees):
                trees.append(t)
        return [SpecSetting.none()] + [SpecSetting.static_tree(t) for t in trees]

    def predict(self, setting: SpecSetting, batch: int, curve: LatencyCurve,
                context: int | None) -> tuple[StepCost, tuple[float, float]]:
        """The step of ``setting`` (plain or a static tree) at ``batch`` rows on ``curve``, and its tokens/s per
        request interval (low, high) (the class docstring's)."""
        tree = setting.tree()
        g = tree.expected_tokens(self.acceptance.acceptance)
        cost = step_cost(tree.level_widths, g, curve, context)
        if tree.size < 2 or self.interval_method == "none":
            return cost, (cost.tokens_per_s, cost.tokens_per_s)
        lo, hi = self._g_interval(tree, g)
        return cost, _tps_interval(lo, hi, cost)

    def _g_interval(self, tree: Tree, g: float) -> tuple[float, float]:
        """(low, high) tokens per step of ``tree`` (its G ``g`` inside), once per tree."""
        from .intervals import tree_spreads

        key = tuple(tuple(c) for c in tree.choices())
        if key not in self._g_intervals:
            spreads = tree_spreads([tree], self.acceptance, model="positional") \
                if self.interval_method == "between prompts" else None
            if spreads is not None:
                lo, hi = spreads[0].prediction_interval(spreads[0].prompts)
            else:
                ci = self.acceptance.confidence_interval()
                top = ci[:, 1] / max(1.0, float(ci[:, 1].sum()))  # a vector's mass is at most 1
                lo, hi = tree.expected_tokens(ci[:, 0]), tree.expected_tokens(top)
            self._g_intervals[key] = (min(lo, g), max(hi, g))
        return self._g_intervals[key]

    def length_factor(self, setting: SpecSetting, output_tokens: int,
                      depth_costs: Sequence[float] | None = None) -> float:
        """The rate's factor for the setting's tree over answers of ``output_tokens`` tokens, under the positional
        vector it is valued by (``depth_costs``: as :meth:`ChainValue.length_factor`, the tree cut to each depth);
        1 without a tree."""
        from .generation import answer_length_factor

        if setting.shape != "tree":
            return 1.0
        tree = setting.tree()
        return answer_length_factor(tree.depth, tree.path_probabilities(self.acceptance.acceptance), output_tokens,
                                    depth_costs)


# ---------------------------------------------------------------------------------------------- solving
def cut_step_costs(setting: SpecSetting, curve: LatencyCurve, context: int | None) -> list[float] | None:
    """(D + 1,) ms of one step of the setting's tree cut to depth 0 .. D (a chain of K: drafting 0 .. K tokens;
    entry 0 is plain decoding's step) on ``curve``, the costs a batch of one's last steps pay: the decoder drafts
    no deeper than a row can still emit (:meth:`~sequoia_opt.drafting.policies.StaticTreePolicy.step_depth_for`).
    None for plain decoding and envelopes (their depth is the rule's, not cut here).

    Raises:
        ProfileError: a width or size outside the curve's measured range (as :func:`step_cost`).
    """
    if setting.shape == "chain":
        widths = [1] * (setting.draft_tokens + 1)
    elif setting.shape == "tree":
        widths = list(setting.tree().level_widths)
    else:
        return None
    if len(widths) < 2:
        return None
    return [step_cost(widths[: d + 1], 1.0, curve, context).cost_ms for d in range(len(widths))]


def _predict(value: Any, setting: SpecSetting, batch: int, curve: LatencyCurve, context: int | None,
             interval: IntervalFn | None, output_tokens: int | None, answer_end_cut: bool = False) -> Predicted:
    """One setting's prediction under ``value`` (its interval replaced by ``interval``'s when given), its rates
    scaled to ``output_tokens``-token generations when given (module docstring). With ``answer_end_cut`` (an
    engine that drafts no deeper than a request can still emit) the factor at batch 1 prices an answer's cheaper
    last steps (:func:`cut_step_costs`); at larger batch sizes a step drafts as deep as its deepest row can use,
    which under continuous batching is the whole tree."""
    cost, iv = value.predict(setting, batch, curve, context)
    if interval is not None:
        iv = tuple(float(x) for x in interval(setting, batch, cost))
    f = 1.0
    if output_tokens is not None and setting.speculates and hasattr(value, "length_factor"):
        costs = cut_step_costs(setting, curve, context) if answer_end_cut and batch == 1 else None
        f = value.length_factor(setting, output_tokens, costs) if costs is not None else \
            value.length_factor(setting, output_tokens)
        iv = (iv[0] * f, iv[1] * f)
    return Predicted(setting, batch, cost, iv, f)


def check_output_tokens(output_tokens: int | None) -> None:
    """Raises ProfileError unless ``output_tokens`` is None or an integer >= 1 (tokens per request)."""
    if output_tokens is not None:
        check_integer(output_tokens, "--output-tokens", low=1, high=MAX_TOKENS)


def _candidates(value: Any, batch: int, curve: LatencyCurve, context: int | None,
                interval: IntervalFn | None, output_tokens: int | None = None,
                answer_end_cut: bool = False) -> list[Predicted]:
    settings = value.settings_at(batch, curve, context) if hasattr(value, "settings_at") else value.settings()
    out = [_predict(value, s, batch, curve, context, interval, output_tokens, answer_end_cut) for s in settings]
    # best first; ties (equal rate) go to the setting that drafts less
    out.sort(key=lambda p: (-round(p.tokens_per_s_per_request, 9), p.setting.draft_tokens, p.setting.label))
    return out


FIRST_IS_LONGEST_RULE = "no batch size drafts more than batch 1"
"""TensorRT-LLM's rule on a draft-length schedule, as the notes and ``treeopt tune`` name it."""


def first_is_longest_choice(per_batch: Sequence[Sequence[tuple[int, float]]],
                            choose: Callable[[int, int | None], int]) -> tuple[list[int], float, float]:
    """TensorRT-LLM's ``draft_len_schedule`` rule (its smallest batch size carries ``max_draft_len``: no batch size
    drafts more than batch 1) applied to a plan's free choices, with batch 1's draft length chosen for every batch
    size solved, not for batch 1 alone.

    Capping every batch size at batch 1's own best loses the most where speculation pays *more* at larger batch
    sizes than at batch 1 (a draft dear at one row: a CPU, a large drafter); where batch 1 should not speculate at
    all, it turned the whole plan to plain decoding. So each draft length batch 1 can run is tried as the cap (its
    best candidate of that length at batch 1, every other batch size its own choice within the cap), and the cap
    kept is the one whose worst batch size runs closest to its own best tokens/s (max-min: without the traffic's
    mix of batch sizes, no batch size is left further below its best than the rule forces); ties go to the higher
    mean over the batch sizes, then to batch 1's own choice.

    Args:
        per_batch: per batch size, ascending from batch 1, its candidates' ``(draft tokens, tokens/s)`` (any rate
            proportional to tokens/s at that batch size).
        choose: ``choose(i, cap)`` -> the index of batch size i's own choice among its candidates with at most
            ``cap`` draft tokens (None: all); it applies the plan's other rules (``min_gain``, ties).

    Returns:
        ``(indices, kept, own)``: each batch size's chosen candidate index; the worst batch size's tokens/s relative
        to its own best under that choice, and under the cap at batch 1's own choice (equal when it was kept).
    """
    n = len(per_batch)
    top = [max(r for _, r in c) for c in per_batch]

    def under(i0: int) -> tuple[list[int], tuple[float, float]]:
        idx = [i0] + [choose(b, per_batch[0][i0][0]) for b in range(1, n)]
        rel = [per_batch[b][i][1] / top[b] for b, i in enumerate(idx)]
        return idx, (min(rel), sum(rel) / n)

    own = choose(0, None)
    best, best_score = under(own)
    own_score = best_score
    for k in sorted({k for k, _ in per_batch[0]} - {per_batch[0][own][0]}):  # batch 1's best of each other length
        i0 = max((i for i, (kk, _) in enumerate(per_batch[0]) if kk == k), key=lambda i: per_batch[0][i][1])
        idx, score = under(i0)
        if score[0] > best_score[0] + 1e-12 or (abs(score[0] - best_score[0]) <= 1e-12
                                                and score[1] > best_score[1] + 1e-12):
            best, best_score = idx, score
    return best, best_score[0], own_score[0]


def check_min_gain(min_gain: float) -> None:
    """Raises ProfileError unless ``min_gain`` (a fraction of plain decoding's tokens/s) lies in [0, 10)."""
    if not 0.0 <= float(min_gain) < 10.0:
        raise ProfileError(f"--min-gain {min_gain} must lie in [0, 10) (a fraction: 0.05 is 5 %)")


def solve_plan(value: Any, profile: BatchLatencyProfile, batches: Sequence[int] | None = None, *,
               context: int | None = None, interval: IntervalFn | None = None, first_is_longest: bool = False,
               max_batch: int | None = None, min_gain: float = 0.0, output_tokens: int | None = None,
               answer_end_cut: bool = False, provenance: Mapping[str, Any] | None = None) -> Plan:
    """The speculation plan: the best setting of ``value`` at every batch size, merged into ranges (module
    docstring).

    Args:
        value: a value model (:class:`ChainValue`, :class:`EnvelopeValue`, :class:`TreeValue`, or one of your own
            with the same face: ``shape``, ``max_draft``, ``settings()`` or ``settings_at(batch, curve, context)``
            (the candidate :class:`SpecSetting` s, plain decoding among them), ``predict(setting, batch, curve,
            context)`` -> ``(StepCost, (low, high) tokens/s per request)``, and optionally
            ``length_factor(setting, output_tokens, depth_costs=None)`` and ``interval_method``; ``depth_costs``,
            passed at batch 1 only, is :func:`cut_step_costs`).
        profile: T(b, n), c(b, w) and the overhead per batch size.
        batches: the batch sizes to solve (default: every one the profile measured); each must be measured.
        context: context length (tokens) the curves are read at (None: each curve's smallest).
        interval: an interval model replacing the value model's own (:data:`IntervalFn`).
        first_is_longest: no batch size drafts more than the smallest one does (TensorRT-LLM's
            ``draft_len_schedule`` rule: its smallest key carries ``max_draft_len``).
        max_batch: the last range ends here instead of at the largest measured batch size (an engine's largest
            batch; the figures past the measured batch sizes are not predicted).
        min_gain: speculate at a batch size only where the best setting's predicted tokens/s beats plain
            decoding's by more than this fraction (0.05: 5 %); a smaller predicted lead keeps plain decoding
            there (the step cost the profile does not time and timing noise can erase it).
        output_tokens: the requests' typical answer length (tokens): rates over generations that long (module
            docstring); None: the steady state.
        answer_end_cut: the engine drafts no deeper than a request can still emit (treeopt's decoder;
            llama-server, ``n_remaining - 1``): with ``output_tokens``, batch 1 prices the cheaper last steps.
        provenance: written into the schedule file.

    Raises:
        ProfileError: no batch size, or none of 1 (a plan's first range starts at one live request); a batch
            size the profile did not measure; a chain longer than some batch's
            curve measured (``T(b, K + 1)``: K past the profile); ``max_batch`` below the largest batch size solved;
            ``min_gain`` outside [0, 10); ``output_tokens`` not a positive integer.
        SolverError / ProfileError: as the value model's ``predict``.
    """
    batches = sorted({int(b) for b in (batches if batches is not None else profile.batches)})
    if not batches:
        raise ProfileError("no batch size to solve")
    check_starts_at_one(batches, f"the batch sizes solved ({','.join(map(str, batches))})")
    curves = [(b, profile.curve(b)) for b in batches]  # every batch size checked before any solve
    if getattr(value, "shape", "") == "chain":
        check_draft_measured(value.max_draft, profile, batches, context)
    last = _last_batch(batches, max_batch)
    check_min_gain(min_gain)
    check_output_tokens(output_tokens)
    every_at = [_candidates(value, b, curve, context, interval, output_tokens, answer_end_cut) for b, curve in curves]

    def choose(i: int, cap: int | None) -> int:
        """Batch size i's choice within ``cap`` draft tokens: its best, or plain decoding under ``min_gain``."""
        every = every_at[i]
        j = next(j for j, p in enumerate(every) if cap is None or p.setting.draft_tokens <= cap)
        plain = next(j for j, p in enumerate(every) if not p.setting.speculates)
        if min_gain > 0 and every[j].setting.speculates and \
                every[j].tokens_per_s_per_request <= every[plain].tokens_per_s_per_request * (1.0 + min_gain):
            return plain
        return j

    notes = []
    free = [choose(i, None) for i in range(len(every_at))]
    if first_is_longest:
        chosen, kept, own = first_is_longest_choice(
            [[(p.setting.draft_tokens, p.tokens_per_s_per_request) for p in e] for e in every_at], choose)
        if chosen != free:
            b1, b1_own = every_at[0][chosen[0]], every_at[0][free[0]]
            if chosen[0] == free[0]:
                notes.append(f"{FIRST_IS_LONGEST_RULE} (the engine's rule), though a longer draft would "
                             f"pay at some: the worst batch size solved runs {100 * kept:.1f} % of its best tokens/s, "
                             "and a longer draft at batch 1 would leave batch 1 further below its own")
            else:
                loss = 100 * (1 - b1.tokens_per_s_per_request / b1_own.tokens_per_s_per_request)
                notes.append(f"the engine's rule ({FIRST_IS_LONGEST_RULE}): batch 1 runs "
                             f"{b1.setting.label}, {loss:.1f} % below its own best ({b1_own.setting.label}), so that "
                             f"larger batch sizes may draft longer; capped at {b1_own.setting.label} instead, the "
                             f"worst batch size solved would run {100 * own:.1f} % of its best tokens/s, not "
                             f"{100 * kept:.1f} %")
    else:
        chosen = free
    rows: list[BatchRow] = []
    for i, (b, _) in enumerate(curves):
        cap = every_at[0][chosen[0]].setting.draft_tokens if first_is_longest and i > 0 else None
        rows.append(BatchRow(b, every_at[i][chosen[i]], next(p for p in every_at[i] if not p.setting.speculates),
                             tuple(every_at[i]), cap))
    best_at = {r.batch: r.best for r in rows}
    ranges = [Range(lo, hi, s, best_at[lo]) for lo, hi, s in merge_ranges([(r.batch, r.best.setting) for r in rows],
                                                                            last)]
    paying = [r.batch for r in rows if r.best.setting.speculates]
    stops = 0 if not paying else None if paying[-1] == rows[-1].batch else paying[-1]
    if last > batches[-1]:
        past = (f"batch size {last} takes" if last == batches[-1] + 1 else
                f"batch sizes {batches[-1] + 1}..{last} take")
        notes.append(f"{past} batch {batches[-1]}'s setting "
                     f"({ranges[-1].setting.label}): nothing past batch {batches[-1]} was measured, so nothing there "
                     "is predicted (measure larger batch sizes to solve them)")
    notes += _length_notes(value, output_tokens)
    close = [(r, c) for r in rows if (c := r.close_call) is not None]
    if close:
        gaps = [100 * (1 - c.tokens_per_s_total / r.best.tokens_per_s_total) for r, c in close]
        what = (f"{close[0][1].setting.label} {gaps[0]:.1f} % below {close[0][0].best.setting.label}" if len(close) == 1
                else f"{min(gaps):.1f}-{max(gaps):.1f} % below")
        notes.append(f"close calls at batch {', '.join(str(r.batch) for r, _ in close)}: the runner-up is predicted "
                     f"{what}, inside the best's prediction interval, so a new sample of prompts could rank them either "
                     "way (close_call in the plan file; profile on more of your traffic, or measure both)")
    return Plan(rows, ranges, stops, value.shape, context, dict(provenance or {}), notes,
                getattr(value, "interval_method", "none"), output_tokens, float(min_gain), bool(first_is_longest),
                bool(answer_end_cut), tuple(e[i] for i, e in zip(free, every_at)) if first_is_longest else ())


def switch_midpoints(plan: Plan) -> list[int]:
    """The batch sizes that bisect the plan's unmeasured switches: for every two neighbouring solved batch sizes
    ``a < b`` with ``b - a >= 2`` whose best settings differ, ``(a + b) // 2``. Ascending; empty when every switch
    lies between consecutive integers (or the plan never switches).

    Why: a range takes the setting of the measured batch size it starts at (:func:`merge_ranges`), so on the grid
    1, 2, 4, 8, 16 three live rows run batch 2's K whatever T(3, n) is. On the demo pair (CPU, greedy, eval
    requests) K = 2 ran 2-4 % ahead of K = 1 at two rows and 0-2 % behind at three (``benchmarks/schedules.py``,
    2026-12-05): the plan lost its lead over vLLM's rule in the 2-3 range. Timing T(b, n) where a switch is and
    solving again is bisection on the batch size; ``treeopt tune --refine N`` runs N rounds of it.
    """
    return [(lo.batch + hi.batch) // 2 for lo, hi in unplaced_switches(plan)]


def unplaced_switches(plan: Plan) -> list[tuple[BatchRow, BatchRow]]:
    """The neighbouring solved rows ``(lo, hi)`` whose best settings differ with a batch size nobody solved between
    them (``hi.batch - lo.batch >= 2``): where the plan switches somewhere unmeasured (:func:`switch_midpoints`)."""
    return [(lo, hi) for lo, hi in zip(plan.rows, plan.rows[1:])
            if hi.batch - lo.batch >= 2 and lo.best.setting != hi.best.setting]


def merge_ranges(best: Sequence[tuple[int, Any]], last: int) -> list[tuple[int, int, Any]]:
    """Ranges from the best setting of each measured batch size (module docstring): ``best`` is ``(batch,
    setting)`` ascending; consecutive batch sizes with equal settings merge, a range runs from its first measured
    batch size to the one before the next range's, and the last ends at ``last``. Returns ``(lo, hi, setting)``."""
    starts: list[tuple[int, Any]] = []
    for b, s in best:
        if not starts or starts[-1][1] != s:
            starts.append((int(b), s))
    return [(lo, (starts[i + 1][0] - 1) if i + 1 < len(starts) else int(last), s) for i, (lo, s) in enumerate(starts)]


def _last_batch(batches: Sequence[int], max_batch: int | None) -> int:
    """Where a plan's last range ends: ``max_batch``, else the largest batch size solved (``batches`` ascending).
    Raises ProfileError for a ``max_batch`` below that."""
    if max_batch is not None and max_batch < batches[-1]:
        raise ProfileError(f"--max-batch {max_batch} is below the largest batch size solved ({batches[-1]})")
    return int(max_batch) if max_batch is not None else int(batches[-1])


def range_value(ranges: Sequence[tuple[int, int, Any]], batch: int) -> Any:
    """The setting (or tree, or draft length) of the range ``(lo, hi, value)`` holding ``batch`` live rows; past the
    last range, the last range's: how a server runs a plan at a concurrency it was not solved for."""
    return next((v for lo, hi, v in ranges if lo <= batch <= hi), ranges[-1][2])


def _length_notes(value: Any, output_tokens: int | None) -> list[str]:
    if output_tokens is not None and not hasattr(value, "length_factor"):
        return [f"{value.shape} rates are the steady state: no model of their step lengths scales them to "
                f"{output_tokens}-token answers"]
    return []


def check_ranges(ranges: Sequence[tuple[int, int, Any]], where: str = "schedule") -> None:
    """A schedule's batch ranges ``(lo, hi, setting)``, in order: the first starts at 1, each ``lo <= hi``,
    each starts right after the previous ends (no overlap, no batch size missing).

    Raises:
        ProfileError: one line naming the first bad range.
    """
    if not ranges:
        raise ProfileError(f"{where}: no batch ranges")
    prev = 0
    for i, (lo, hi, _) in enumerate(ranges, 1):  # counted as a reader counts the file's ranges: from 1
        for name, v in (("start", lo), ("end", hi)):
            check_integer(v, f"{where}: range {i} {name}", low=1, high=MAX_TOKENS)
        if hi < lo:
            raise ProfileError(f"{where}: range {i} [{lo}, {hi}] ends before it starts")
        if lo <= prev:
            raise ProfileError(f"{where}: range {i} [{lo}, {hi}] overlaps the previous one (which ends at {prev})")
        if lo != prev + 1:
            what = "the first range must start at batch size 1" if i == 1 else \
                f"batch sizes {prev + 1}..{lo - 1} are in no range"
            raise ProfileError(f"{where}: {what} (range {i} is [{lo}, {hi}])")
        prev = hi


def predict_ranges(ranges: Sequence[tuple[int, int, SpecSetting]], value: Any, profile: BatchLatencyProfile,
                   batches: Sequence[int] | None = None, *, context: int | None = None,
                   interval: IntervalFn | None = None, output_tokens: int | None = None,
                   answer_end_cut: bool = False) -> list[Predicted]:
    """Predict a given schedule (a user's, or a peer's rule) at every measured batch size it covers
    (``output_tokens`` and ``answer_end_cut`` as :func:`solve_plan`).

    Raises:
        ProfileError: bad ranges (:func:`check_ranges`); a setting past what the profile measured (K + 1 past
            T(b, n)'s largest n); ``output_tokens`` not a positive integer.
    """
    check_ranges(ranges)
    check_output_tokens(output_tokens)
    out = []
    for b in sorted(batches if batches is not None else profile.batches):
        setting = next((s for lo, hi, s in ranges if lo <= b <= hi), None)
        if setting is None:
            continue
        curve = profile.curve(b)
        check_setting_measured(setting, b, profile, context)
        out.append(_predict(value, setting, b, curve, context, interval, output_tokens, answer_end_cut))
    return out


def solve_one_setting_plan(value: Any, profile: BatchLatencyProfile, batches: Sequence[int] | None = None, *,
                           context: int | None = None, max_batch: int | None = None, min_gain: float = 0.0,
                           output_tokens: int | None = None, answer_end_cut: bool = False,
                           provenance: Mapping[str, Any] | None = None) -> Plan:
    """The plan of an engine that runs one speculative setting per server and can only turn it off above a
    concurrency (TensorRT-LLM's EAGLE-3 dynamic tree with ``max_concurrency``): ranges ``(1, c, s)`` then
    ``(c + 1, last, none)``, or plain decoding everywhere. Every candidate setting ``s`` of ``value`` and every cut
    ``c`` at a measured batch size is scored by the mean, over the batch sizes, of its predicted total tokens/s as
    a share of the best any setting reaches there (so that large batch sizes do not outweigh small ones); a pair is
    a candidate only where ``s`` beats plain decoding by more than ``min_gain`` (:func:`solve_plan`'s) at every
    batch size it covers. The best scoring pair is the plan (:func:`plan_from_ranges`), with a note of its share.
    An engine's own rule on which settings it takes is the caller's to apply to ``value``'s settings.

    Raises:
        ProfileError: as :func:`solve_plan`.
    """
    check_min_gain(min_gain)
    check_output_tokens(output_tokens)
    min_gain = float(min_gain)
    bs = sorted({int(b) for b in (batches if batches is not None else profile.batches)})
    if not bs:
        raise ProfileError("no batch size to solve")
    check_starts_at_one(bs, f"the batch sizes solved ({','.join(map(str, bs))})")
    last = _last_batch(bs, max_batch)
    none = SpecSetting.none()
    table: dict[SpecSetting, list[float]] = {}
    for st in dict.fromkeys([none, *value.settings()]):  # plain decoding scored even where value leaves it out
        row = []
        for b in bs:
            curve = profile.curve(b)
            row.append(_predict(value, st, b, curve, context, None, output_tokens,
                                answer_end_cut).tokens_per_s_per_request)
        table[st] = row
    best = [max(col) for col in zip(*table.values())]
    share = lambda row: sum(x / m for x, m in zip(row, best)) / len(bs)  # noqa: E731
    plain = table[none]
    choice, score = [(1, last, none)], share(plain)
    for st, row in table.items():
        if not st.speculates:
            continue
        for c in range(len(bs)):  # speculate at bs[0..c], plain above
            if row[c] <= plain[c] * (1.0 + min_gain):  # past here it does not clear the bar
                break
            mixed = row[: c + 1] + plain[c + 1:]
            if share(mixed) > score + 1e-12:
                hi = last if c + 1 == len(bs) else bs[c + 1] - 1
                choice = [(1, hi, st)] + ([(hi + 1, last, none)] if hi < last else [])
                score = share(mixed)
    plan = plan_from_ranges(choice, value, profile, bs, context=context, output_tokens=output_tokens,
                            answer_end_cut=answer_end_cut, provenance=provenance)
    plan.min_gain = min_gain
    plan.notes.insert(0, f"one setting per server ({choice[0][2].label}"
                      + (f", none above batch {choice[0][1]}" if len(choice) > 1 else "")
                      + f"): its predicted tokens/s are {100 * score:.1f} % of the best setting's at each batch size, "
                      "on average")
    return plan


def plan_from_ranges(ranges: Sequence[tuple[int, int, SpecSetting]], value: Any, profile: BatchLatencyProfile,
                     batches: Sequence[int] | None = None, *, context: int | None = None,
                     interval: IntervalFn | None = None, output_tokens: int | None = None,
                     answer_end_cut: bool = False, provenance: Mapping[str, Any] | None = None) -> Plan:
    """A given schedule as a :class:`Plan`: every measured batch size it covers predicted under ``value`` (its
    setting, and plain decoding beside it), its own ranges kept (``output_tokens`` and ``answer_end_cut`` as
    :func:`solve_plan`).

    Raises:
        ProfileError: as :func:`predict_ranges`.
    """
    preds = predict_ranges(ranges, value, profile, batches, context=context, interval=interval,
                           output_tokens=output_tokens, answer_end_cut=answer_end_cut)
    if not preds:
        raise ProfileError("the schedule covers none of the measured batch sizes")
    end = max(hi for _, hi, _ in ranges)
    past = [int(b) for b in sorted(batches if batches is not None else profile.batches) if b > end]
    notes = _length_notes(value, output_tokens)
    if past:
        what = f"batch size {past[0]} was" if len(past) == 1 else f"batch sizes {', '.join(map(str, past))} were"
        notes.append(f"{what} measured but past the schedule's last range (it ends at {end}): not predicted; an "
                     "engine given this schedule runs its last setting there")
    top = max(p.batch for p in preds)
    if end > top:  # the ranges above the largest measured batch size are exported as given, priced nowhere
        beyond = [(lo, hi, st) for lo, hi, st in ranges if hi > top]
        notes.append(f"the schedule's ranges past batch {top}, the largest predicted here ("
                     + ", ".join(f"{max(lo, top + 1)}-{hi}: {st.label}" for lo, hi, st in beyond)
                     + "), are exported as it gives them: nothing there is predicted (add larger --batches, or "
                       "measure larger batch sizes, to check them)")
    none = SpecSetting.none()
    plains = predict_ranges([(1, end, none)], value, profile, [p.batch for p in preds],
                            context=context, interval=interval)
    rate = lambda c: c.tokens_per_s_per_request  # noqa: E731
    rows = [BatchRow(p.batch, p, q, tuple(sorted((p, q), key=rate, reverse=True)) if p.setting.speculates else (p,))
            for p, q in zip(preds, plains)]
    out_ranges = [Range(int(lo), int(hi), st, next((p for p in preds if lo <= p.batch <= hi), None))
                  for lo, hi, st in ranges]
    # the schedule's row is its own setting whatever it predicts: speculation pays where it beats plain decoding
    paying = [r.batch for r in rows if r.best.setting.speculates and rate(r.best) > rate(r.plain)]
    slower = [r for r in rows if r.best.setting.speculates and rate(r.best) <= rate(r.plain)]
    if slower:
        notes.append("the schedule speculates where plain decoding is predicted faster: " + ", ".join(
            f"batch {r.batch} ({r.best.setting.label} {r.best.tokens_per_s_total:.4g} against plain "
            f"{r.plain.tokens_per_s_total:.4g} tok/s total)" for r in slower))
    stops = 0 if not paying else None if paying[-1] == rows[-1].batch else paying[-1]
    shape = next((st.shape for *_, st in ranges if st.speculates), "none")
    return Plan(rows, out_ranges, stops, shape, context, dict(provenance or {}), notes,
                interval_method=getattr(value, "interval_method", "none"), output_tokens=output_tokens,
                answer_end_cut=answer_end_cut)


# ---------------------------------------------------------------------------------------------- the guard
@dataclass(frozen=True)
class GuardRule:
    """What to watch on a server running one speculating range of a plan (issue 31, part 4): the guard of
    ``treeopt run`` (:mod:`sequoia_opt.drafting.policies.adaptive`) as a rule an operator or a watchdog applies to
    the engine's logged mean acceptance length (tokens per step per request: accepted drafts + 1), since no
    engine takes one as a setting.

    Attributes:
        lo / hi: the batch range.  setting: its label.
        expected_tokens_per_step: the plan's prediction at the range's first measured batch size.
        interval_low: the low end of its 95 % interval (tokens per step): below it for a sustained window, the
            traffic is not what was profiled; re-profile on a sample of it (``treeopt tune``).
        interval_method: how that interval was made (:attr:`Plan.interval_method`); only ``between prompts``
            bounds a new set of prompts (issue 31), so only then does the rule read it.
        break_even: the tokens per step below which the setting is slower than plain decoding (its step ms over
            plain's), the largest over the range's measured batch sizes (a forward over K + 1 tokens costs more
            of a plain one's as b grows, so the range's largest batch size is usually the one that needs most):
            below it, stop speculating in this range.
        break_even_batch: the measured batch size that break-even is taken at (None: not recorded).
    """

    lo: int
    hi: int
    setting: str
    expected_tokens_per_step: float
    interval_low: float
    break_even: float
    interval_method: str = "none"
    break_even_batch: int | None = None

    @property
    def reads_interval(self) -> bool:
        """Whether the rule's interval bounds new traffic (made between prompts, and below the point)."""
        return self.interval_method == "between prompts" and self.interval_low < self.expected_tokens_per_step

    def to_dict(self) -> dict[str, Any]:
        """The rule as plain types for the schedule file: ``batch_range`` ``[lo, hi]``, the setting's label, G, the
        interval's low end (tokens per step), how the interval was made and the break-even tokens per step; floats
        rounded to 4 decimals."""
        return {"batch_range": [self.lo, self.hi], "setting": self.setting,
                "expected_tokens_per_step": round(self.expected_tokens_per_step, 4),
                "interval_low": round(self.interval_low, 4), "interval_method": self.interval_method,
                "break_even": round(self.break_even, 4),
                **({"break_even_batch": self.break_even_batch} if self.break_even_batch is not None else {})}


def guard_rules(plan: Plan) -> list[GuardRule]:
    """One :class:`GuardRule` per speculating range of ``plan`` with a prediction (a range between measured batch
    sizes has none) that is predicted faster than plain decoding at its first measured batch size (TensorRT-LLM's
    rule can run batch 1 slower, so that larger batch sizes may draft: nothing to guard there). ``break_even =
    step_ms / plain step_ms`` (plain emits one token a step), the largest over the measured batch sizes the range
    holds (it was the first one's alone: a range 4-8 said "below 1.36", batch 4's figure, where batch 8 needs
    more); ``interval_low`` is the tokens-per-step low end of the
    prediction's interval, never above the point: its tokens/s low end (per request) / ``length_factor`` x the step's
    ms / 1000 (the steady state's, as ``expected_tokens``)."""
    rules = []
    for r in plan.ranges:
        p = r.predicted
        if p is None or not r.setting.speculates:
            continue
        try:
            plain_ms = plan.row(p.batch).plain.cost.cost_ms
        except ProfileError:
            continue
        g = p.cost.expected_tokens
        if g <= p.cost.cost_ms / plain_ms:  # predicted slower than plain already (an engine's rule runs it): no guard
            continue
        low = min(g, p.interval[0] / p.length_factor * p.cost.cost_ms / 1000.0)  # the steady state's, as g
        evens = [(p.cost.cost_ms / plain_ms, p.batch)]
        for row in plan.rows:  # the range's other measured batch sizes, priced for the same setting
            if not r.lo <= row.batch <= r.hi or row.batch == p.batch or row.plain.cost.cost_ms <= 0:
                continue
            c = next((c for c in row.candidates if c.setting == r.setting), None)
            if c is not None:
                evens.append((c.cost.cost_ms / row.plain.cost.cost_ms, row.batch))
        even, at = max(evens)
        rules.append(GuardRule(r.lo, r.hi, r.setting.label, g, low, even, plan.interval_method, at))
    return rules


# ---------------------------------------------------------------------------------------------- the file
def plan_document(plan: Plan, *, engine: str, drafter: str | None = None) -> dict[str, Any]:
    """The ``treeopt-schedule/1`` mapping of ``plan`` (module docstring)."""
    doc: dict[str, Any] = {"format": SCHEDULE_FORMAT, "engine": engine, "drafter": drafter, "shape": plan.shape}
    doc.update(plan.provenance)
    doc.update({"context_tokens": plan.context, "output_tokens": plan.output_tokens,
                **({"min_gain": plan.min_gain} if plan.min_gain else {}),
                **({"first_is_longest": True} if plan.first_is_longest else {}),
                **({"answer_end_cut": True} if plan.answer_end_cut else {}), "date": now_iso(),
                "rule": "a server running B requests uses the range that holds B",
                "stops_paying_above": plan.stops_paying_above,
                "ranges": [{"batch_range": [r.lo, r.hi], "setting": r.setting.to_dict(),
                            "predicted": r.predicted.to_dict() if r.predicted is not None else None}
                           for r in plan.ranges],
                "by_batch": [{"batch": r.batch, "best": r.best.to_dict(), "plain": r.plain.to_dict(),
                              **({"close_call": cc.setting.label} if (cc := r.close_call) is not None else {}),
                              "candidates": [c.to_dict() for c in r.candidates]} for r in plan.rows]})
    rules = guard_rules(plan)
    if rules:
        doc["guard"] = [g.to_dict() for g in rules]
    if plan.notes:
        doc["notes"] = list(plan.notes)
    return doc


def save_schedule(path: str | Path, doc: Mapping[str, Any]) -> Path:
    """Write a schedule atomically (JSON for ``.json``, else YAML), validated first. Returns the path.

    Raises:
        ProfileError: a document that is not a valid ``treeopt-schedule/1`` (nothing is written).
    """
    return atomic_write_text(path, schedule_text(path, doc))


def schedule_text(path: str | Path, doc: Mapping[str, Any]) -> str:
    """A schedule document as :func:`save_schedule` writes it to ``path`` (JSON for ``.json``, else YAML), validated
    first. Raises ProfileError: a document that is not a valid ``treeopt-schedule/1``."""
    _validate(doc, str(path))
    return document_text(path, doc)


@dataclass(frozen=True)
class Schedule:
    """A schedule read from a file: its ranges and the document (engine, drafter, provenance)."""

    ranges: tuple[tuple[int, int, SpecSetting], ...]
    doc: dict[str, Any]

    def setting_at(self, batch: int) -> SpecSetting:
        """The setting of the range holding ``batch``. Raises ProfileError past the ranges."""
        for lo, hi, s in self.ranges:
            if lo <= batch <= hi:
                return s
        raise ProfileError(f"the schedule covers batch sizes 1..{self.ranges[-1][1]}, not {batch}")


def _validate(doc: Any, src: str) -> Schedule:
    _check_format(doc, SCHEDULE_FORMAT, src)
    warn_unknown_keys(doc, SCHEDULE_KEYS, src)
    raw = doc.get("ranges")
    if not isinstance(raw, list) or not raw:
        raise ProfileError(f"{src}: 'ranges' must be a non-empty list of {{batch_range: [lo, hi], setting: ...}}")
    ranges = []
    for i, e in enumerate(raw):
        rng = e.get("batch_range") if isinstance(e, dict) else None
        if isinstance(e, dict):
            warn_unknown_keys(e, SCHEDULE_RANGE_KEYS, f"{src}: ranges[{i}]")
        if not isinstance(rng, list) or len(rng) != 2:
            raise ProfileError(f"{src}: ranges[{i}].batch_range must be [lo, hi]")
        lo = check_integer(rng[0], f"{src}: ranges[{i}].batch_range[0]", low=1, high=MAX_TOKENS)
        hi = check_integer(rng[1], f"{src}: ranges[{i}].batch_range[1]", low=1, high=MAX_TOKENS)
        ranges.append((lo, hi, SpecSetting.from_dict(e.get("setting"), f"{src}: ranges[{i}].setting")))
    check_ranges(ranges, src)
    # the batch sizes the file says it was solved for must lie in its ranges: a file cut short keeps valid YAML
    # with fewer ranges, and an engine would run the last one's setting at every larger batch size
    listed = doc.get("batches") if isinstance(doc.get("batches"), list) else []
    rows = doc.get("by_batch") if isinstance(doc.get("by_batch"), list) else []
    solved = [b for b in listed if isinstance(b, int)] + [e["batch"] for e in rows
                                                          if isinstance(e, dict) and isinstance(e.get("batch"), int)]
    if solved and max(solved) > ranges[-1][1]:
        raise ProfileError(f"{src}: its ranges end at batch size {ranges[-1][1]}, but it was solved for batch sizes up "
                           f"to {max(solved)} ('batches' / 'by_batch'): a file cut short or edited by hand?")
    # a range's setting at a measured batch size must be one that batch size's candidates scored (an edited range,
    # K = 600, ran a 601-token chain at 0.004x with no word); a range holding no measured batch size (a given
    # plan's) has none to compare. tune, the engines and the decoder read plans through here
    for e in rows:
        if not (isinstance(e, dict) and isinstance(e.get("batch"), int) and isinstance(e.get("candidates"), list)):
            continue
        scored = {str(c.get("setting")) for c in e["candidates"] if isinstance(c, dict)}
        hit = next(((i, lo, hi, st) for i, (lo, hi, st) in enumerate(ranges) if lo <= e["batch"] <= hi), None)
        if scored and hit is not None and hit[3].label not in scored:
            i, lo, hi, setting = hit
            raise ProfileError(f"{src}: ranges[{i}] (batch sizes {lo}-{hi}) runs {setting.label} at batch size "
                               f"{e['batch']}, where 'by_batch' scored only {', '.join(sorted(scored, key=_label_order))}"
                               ": edited by hand? re-solve it with treeopt tune")
    s = doc.get("stops_paying_above")
    if s is not None:
        check_integer(s, f"{src}: stops_paying_above", high=MAX_TOKENS)
    # the drafter settings tune --plan exports as they are (into vLLM's speculative_config, SGLang's flags)
    for key in ("method", "draft_model"):
        v = doc.get(key)
        if v is not None and (not isinstance(v, str) or not v.strip()):
            raise ProfileError(f"{src}: {key} = {v!r} must be a name (text), as tune writes it")
    lookup = doc.get("lookup")
    if lookup is not None:
        if not (isinstance(lookup, list) and len(lookup) == 2 and all(
                isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_LOOKUP_NGRAM for n in lookup)
                and lookup[0] <= lookup[1]):
            raise ProfileError(f"{src}: lookup = {lookup!r} must be [MIN, MAX] n-gram sizes, integers with "
                               f"1 <= MIN <= MAX <= {MAX_LOOKUP_NGRAM}")
    return Schedule(tuple(ranges), dict(doc))


#: the largest n-gram size a plan's ``lookup`` may name (the registry takes any size ``lookup:MIN-MAX``; an engine
#: with a bound of its own, llama.cpp's 1..1024, refuses past it in its export)
MAX_LOOKUP_NGRAM = MAX_TOKENS


def _label_order(label: Any) -> tuple:
    """Settings' labels in a readable order: none, then chains by K, then the rest by name."""
    text = str(label)
    if text == "none":
        return (0, 0, "")
    if text.startswith("chain:") and text[6:].isdigit():
        return (1, int(text[6:]), "")
    return (2, 0, text)


def load_schedule(path: str | Path, *, profile: BatchLatencyProfile | None = None,
                  context: int | None = None) -> Schedule:
    """Read a ``treeopt-schedule/1`` file (YAML or JSON). With ``profile``, every range's setting must be priced
    by every measured batch size the range holds (its K + 1 within T(b, n)'s measured n).

    Raises:
        ProfileError: a missing or malformed file, overlapping or missing batch ranges, K past the profile.
    """
    doc, p = _load_yaml(path, "schedule")
    sched = _validate(doc, str(p))
    if profile is not None:
        for lo, hi, s in sched.ranges:
            for b in profile.batches:
                if lo <= b <= hi:
                    check_setting_measured(s, b, profile, context, str(p))
    return sched


def load_plan_trees(path: str | Path) -> tuple[list[tuple[int, int, Tree]], dict[str, Any], Schedule | None]:
    """The static tree per batch range of a plan treeopt's decoder serves: a ``treeopt-schedule/1`` file
    (``treeopt tune -o``: chains, static trees or none) or a ``treeopt-batch-trees/1`` file (``treeopt solve
    --batch -o``). Returns ``([(lo, hi, tree), ...], the file's mapping, its Schedule)``, the Schedule None for a
    batch-trees plan (whose figures are its ``entries``).

    Raises:
        ProfileError: a missing or malformed file, another format, overlapping or missing ranges, a range that
            wants an EAGLE envelope (no static tree: ``--policy dynamic`` runs envelopes).
    """
    from .batch import BATCH_PLAN_FORMAT, load_plan

    doc, p = _load_yaml(path, "schedule")
    if doc.get("format") == BATCH_PLAN_FORMAT:  # its loader allows gaps (a tree per range solved): served, none
        ranges = load_plan(p)
        check_ranges(ranges, str(p))
        return ranges, doc, None
    sched = _validate(doc, str(p))
    for lo, hi, s in sched.ranges:
        if s.shape == "envelope":
            raise ProfileError(f"{p}: batch sizes {lo}-{hi} want an EAGLE envelope ({s.label}), which grows its tree "
                               "each step: run envelopes with --policy dynamic")
    return [(lo, hi, s.tree()) for lo, hi, s in sched.ranges], doc, sched
