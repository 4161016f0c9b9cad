"""``treeopt run``: execute trees with the bundled decoder next to plain decoding, on the same prompts, device
and precision, and compare what was measured with what the solver predicted.

For each prompt the plain autoregressive baseline runs once; every tree then decodes the same prompt. In
greedy mode each tree's output must equal plain decoding's token for token (a mismatch is reported with the
first differing position and fails the run). Reported per tree: tokens per second, speedup over plain
decoding (ratio of decode throughputs, prefill excluded), tokens per step (mean and 95 % interval) against the
tree's predicted expected tokens per step, and the time split into draft / verify / bookkeeping.

Every decoder is the one loop, :class:`~sequoia_opt.decoding.loop.Decoder`, with the entry's drafting policy: its
own (:attr:`TreeEntry.policy`: adaptive, dynamic, graft, merge), or the static tree with its drafter. An
adaptive policy's summary carries its re-solve log (:attr:`TreeSummary.adaptive`).

Tokens per step is what the steps emitted: new tokens over steps (a generation's last step emits only what is
left before ``max_new_tokens`` or EOS), the figure the prediction for this run's answer lengths is
(:func:`answer_factor`). The untruncated count (accepted nodes + 1 per step; past an EOS the accepted path runs
on) is kept as ``tokens_per_step_untruncated``: it equals the emitted one where answers end at
``max_new_tokens`` (the decoder drafts no deeper than a row can still emit) and exceeds it where they end on EOS.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .._io import create_files, new_run_id, remove_uncommitted
from ..errors import ProfileWarning
from ..decoding import Decoder, DraftingPolicy, GenerationResult
from ..decoding.forward import check_each_prompt
from ..decoding.sampling import prompt_seed
from ..drafting.drafters import Drafter, drafter_factory
from ..drafting.drafters.model import guessable_tokens
from ..drafting.policies import SchedulePolicy, StaticTreePolicy
from ..model import Transformer
from ..omp import run_policy
from ..solver.intervals import Z975, t975
from ..tree import Tree, TreeMetadata, now_iso

ProgressFn = Callable[[str, int, int], None]


@dataclass
class TreeEntry:
    """A tree to run, under a display name, with the metadata its YAML carried (for the prediction).

    Attributes:
        name: the tree's name in results (unique within one run).
        tree: the tree.
        metadata: what the solver knew (predicted tokens per step and speedup are read from it).
        draft: this tree's own proposer, as :func:`run_trees` takes ``draft`` (a draft Transformer, or a
            function making a fresh :class:`~sequoia_opt.drafting.drafters.Drafter` per decoder); None = the
            ``draft`` given to :func:`run_trees`. Lets one run hold trees of different drafters against one
            plain baseline.
        drafter: the drafter's label for results (``treeopt-smollm2-draft``, ``self:6``, ``lookup:1-3``);
            None = the run's drafter.
        policy: ``policy(drafter)`` makes a fresh :class:`~sequoia_opt.decoding.policy.DraftingPolicy` (adaptive,
            dynamic, graft, merge: ``sequoia_opt.drafting.policies``) around a fresh drafter of the entry (its
            ``draft``, else the run's; None when there is neither: a graft or merge policy brings its own); None
            = the static tree ``tree`` with that drafter. With a policy, ``tree`` names the topology in the
            results (the plan's, the initial tree's); an adaptive policy restarts after the warm-up.
    """

    name: str
    tree: Tree
    metadata: TreeMetadata = field(default_factory=TreeMetadata)
    draft: Transformer | Drafter | Callable[[], Transformer | Drafter] | None = None
    drafter: str | None = None
    policy: Callable[[Drafter | None], DraftingPolicy] | None = None


@dataclass
class PromptRow:
    """One (prompt, decoder) measurement; one CSV row."""

    tree: str
    prompt_index: int
    prompt_tokens: int
    new_tokens: int
    steps: int
    tokens_per_step: float
    decode_ms: float
    tokens_per_s: float
    draft_ms: float
    verify_ms: float
    bookkeeping_ms: float
    matches_plain: bool | None
    first_mismatch: int | None
    tokens_per_step_untruncated: float = 0.0


@dataclass
class TreeSummary:
    """Aggregates over all prompts for one tree (or for plain decoding, ``tree == "plain"``).

    Attributes:
        size / depth: the tree's nodes (root included) and depth; for a policy that changes its tree as it runs
            (``--adapt``, ``adaptive-schedule``), the largest it verified.
        tokens_per_s: total new tokens / total decode time (prefill excluded), tokens/s.
        speedup: ``tokens_per_s`` / plain decoding's ``tokens_per_s`` (same prompts).
        tokens_per_step / tps_ci95: tokens per step as emitted (new tokens over steps: the last step of a
            generation emits only what is left) and its 95 % interval over prompts (:func:`tokens_per_step_ci95`).
        tokens_per_step_untruncated: accepted nodes + 1 per step, past an EOS too (the module docstring).
        predicted_tokens_per_step: the tree file's tokens per step for generations of this run's lengths: its
            steady-state G (``predicted_tokens_per_step_steady``) x :func:`answer_factor` (a generation ends inside a
            step, which emits only what is left: :mod:`sequoia_opt.solver.generation`; exact from the file's
            ``node_rates``, else approximated), at most min(D + 1, max_new_tokens); what the measured
            ``tokens_per_step`` is compared with. An adaptive tree's: its steady mean (None if absent).
        predicted_speedup: the tree file's speedup for generations of this run's lengths: its steady-state figure
            (``predicted_speedup_steady``) x :func:`answer_factor` priced (the steps the decoder cuts at an
            answer's end at their own cost), held between 1x and the steady figure; the steady figure where no
            factor applies.
        predicted_tokens_per_step_steady / predicted_speedup_steady: the file's figures as written (None if
            absent).
        draft_ms / verify_ms / bookkeeping_ms: totals (ms).
        mismatches: prompts whose greedy output differed from plain decoding (greedy mode only).
        drafter: the label of the drafter that ran this tree when its entry named one (None otherwise).
        drafters: for a multi-drafter entry, per drafter (light first): ``name``, ``calls`` (steps it was
            asked in), ``call_rate`` (calls / the steps that asked any drafter: a step near the end of the
            context or of an answer may be the root alone, which asks none), ``ms`` (its total wall time),
            ``ms_per_call`` and ``accepted_nodes`` (accepted nodes it proposed); empty otherwise.
        adaptive: for an adaptive entry (its policy has an ``adapter``), :meth:`TreeAdapter.as_dict`: its settings
            and limits, the initial and final trees, and ``resolves``, the log of re-solves (step, generation,
            tokens so far, new tree's size / depth / level widths, predicted tokens per step and speedup,
            whether the tree changed, solve ms, the estimate, why it ran); None otherwise. ``size`` / ``depth`` are
            then the largest tree's it verified, and ``predicted_tokens_per_step`` the step-weighted mean of the
            trees' predictions.
        predicted_interval / predicted_speedup_interval: the 95 % prediction intervals of tokens per step and of
            the speedup (scaled as ``predicted_speedup``) for a new set of this run's prompts
            (:mod:`sequoia_opt.solver.intervals`, from the spread the tree file records, ``tokens_per_step_spread`` /
            ``speedup_spread``); None when it records none.
        inside_prediction: whether the measured tokens per step lies inside ``predicted_interval`` (None without).
        node_acceptance: for a static tree, per non-root node how often it was accepted once its parent was
            (:meth:`~sequoia_opt.decoding.stats.NodeAcceptance.rows`: ``node``, ``depth``, ``rank``, ``reached``,
            ``accepted``, ``rate``) and, where the tree file records the value model's rates (``node_rates``,
            written by ``treeopt solve``), ``predicted``; None for other policies.
    """

    tree: str
    size: int
    depth: int
    new_tokens: int
    steps: int
    tokens_per_s: float
    speedup: float
    tokens_per_step: float
    tps_ci95: tuple[float, float]
    predicted_tokens_per_step: float | None
    predicted_speedup: float | None
    draft_ms: float
    verify_ms: float
    bookkeeping_ms: float
    mismatches: int
    drafter: str | None = None
    drafters: list[dict[str, Any]] = field(default_factory=list)
    adaptive: dict[str, Any] | None = None
    predicted_interval: tuple[float, float] | None = None
    predicted_speedup_interval: tuple[float, float] | None = None
    inside_prediction: bool | None = None
    predicted_speedup_steady: float | None = None
    node_acceptance: list[dict[str, Any]] | None = None
    predicted_tokens_per_step_steady: float | None = None
    tokens_per_step_untruncated: float = 0.0


def prediction_intervals(meta: TreeMetadata | None, prompts: int, steps_per_prompt: float | None = None
                         ) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """The 95 % prediction intervals (tokens per step, speedup) for a new set of ``prompts`` prompts from the spreads
    a tree file records (``tokens_per_step_spread`` / ``speedup_spread``, written by ``treeopt solve``; rescaled to
    this number of prompts and, where the file records the step noise, to the run's ``steps_per_prompt``,
    :meth:`~sequoia_opt.solver.intervals.PromptSpread.prediction_interval`). An interval is None when the file
    records none, or records one for another figure than its prediction (a re-scored tree)."""
    from ..solver.intervals import PromptSpread

    if meta is None or prompts < 1:
        return None, None
    out = []
    for key, point, clip in (("tokens_per_step_spread", meta.expected_tokens_per_step, (1.0, None)),
                             ("speedup_spread", meta.predicted_speedup, (0.0, None))):
        raw = meta.extra.get(key)
        sp = PromptSpread.from_dict(raw, clip) if isinstance(raw, dict) else None
        ok = sp is not None and point is not None and abs(sp.point - point) <= 1e-6 * max(1.0, abs(point))
        out.append(sp.prediction_interval(prompts, steps_per_prompt) if ok else None)
    return out[0], out[1]


@dataclass
class RunReport:
    """Everything ``treeopt run`` measured; serialised to ``results/<run_id>.json`` and ``.csv``.

    ``drafters``: one :class:`DrafterRow` (as a dict) per drafter when the run compared drafters
    (:func:`compare_drafters`), stored under ``"drafters"`` in the JSON; empty otherwise.
    """

    run_id: str
    settings: dict[str, Any]
    summaries: list[TreeSummary]
    rows: list[PromptRow]
    mismatch_details: list[dict[str, Any]] = field(default_factory=list)
    drafters: list[dict[str, Any]] = field(default_factory=list)

    @property
    def greedy_ok(self) -> bool:
        """True unless some greedy output differed from plain decoding."""
        return not self.mismatch_details

    def to_dict(self) -> dict[str, Any]:
        """The results JSON's mapping (``format: treeopt-run/1``): run id, settings, one dict per
        :class:`TreeSummary` and per :class:`PromptRow`, the greedy mismatches, and ``drafters`` when the run compared
        drafters."""
        d = {"format": "treeopt-run/1", "run_id": self.run_id, "settings": self.settings,
             "summaries": [asdict(s) for s in self.summaries], "rows": [asdict(r) for r in self.rows],
             "mismatches": self.mismatch_details}
        if self.drafters:
            d["drafters"] = self.drafters
        return d

    def to_csv(self) -> str:
        """The results CSV's text: a header, then one line per :class:`PromptRow` (its fields in order), each followed
        by the run's scalar settings (sorted by name; list and dict settings are left out)."""
        buf = io.StringIO()
        keys = list(asdict(self.rows[0]).keys()) if self.rows else list(PromptRow.__dataclass_fields__)
        settings_keys = sorted(k for k, v in self.settings.items() if not isinstance(v, (list, dict)))
        w = csv.writer(buf)
        w.writerow(keys + settings_keys)
        for r in self.rows:
            d = asdict(r)
            w.writerow([d[k] for k in keys] + [self.settings[k] for k in settings_keys])
        return buf.getvalue()

    def save(self, results_dir: str | Path) -> tuple[Path, Path]:
        """Create ``<results_dir>/<run_id>.json`` and ``.csv`` as one unit (:func:`~sequoia_opt._io.create_files`:
        both or neither, the CSV first so a JSON always has its CSV). Never replaces a file: when a file of
        this run id exists already (another run's), the run takes a fresh id (:func:`~sequoia_opt._io.new_run_id`)
        and ``run_id`` changes. A run's CSV without its JSON in the folder (a run killed between the two names) is
        removed first (:func:`~sequoia_opt._io.remove_uncommitted`), each with a
        :class:`~sequoia_opt.errors.ProfileWarning` naming it. Returns ``(json path, csv path)``.

        Raises:
            OutputError: the OS refuses the write, or another writer takes the fresh names between the check
                and the commit (nothing of this run is left then).
        """
        d = Path(results_dir)
        for f in remove_uncommitted(d, ".csv", ".json"):  # a run killed between its two names left its CSV alone
            warnings.warn(ProfileWarning(f"removed {f}: a run's CSV without its JSON (a run stopped between writing "
                                         "the two)"))
        for _ in range(8):
            if not any((d / f"{self.run_id}{ext}").exists() for ext in (".json", ".csv")):
                break
            self.run_id = new_run_id(self.run_id.split("-", 1)[0])
        c, j = create_files({d / f"{self.run_id}.csv": self.to_csv(),
                             d / f"{self.run_id}.json": json.dumps(self.to_dict(), indent=1) + "\n"})
        return j, c


def _row(name: str, i: int, res: GenerationResult, plain: GenerationResult | None, greedy: bool) -> PromptRow:
    match, first = None, None
    if greedy and plain is not None:
        match = res.tokens == plain.tokens
        if not match:
            first = next((k for k, (a, b) in enumerate(zip(res.tokens, plain.tokens)) if a != b),
                         min(len(res.tokens), len(plain.tokens)))
    untruncated = [s.accepted_nodes + 1 for s in res.steps]
    return PromptRow(tree=name, prompt_index=i, prompt_tokens=res.prompt_len, new_tokens=len(res.tokens),
                     steps=res.num_steps, tokens_per_step=len(res.tokens) / res.num_steps if res.steps else 0.0,
                     decode_ms=res.decode_ms, tokens_per_s=res.tokens_per_second, draft_ms=res.draft_ms,
                     verify_ms=res.verify_ms, bookkeeping_ms=res.bookkeeping_ms, matches_plain=match,
                     first_mismatch=first,
                     tokens_per_step_untruncated=statistics.fmean(untruncated) if untruncated else 0.0)


def tokens_per_step_ci95(per_prompt: Sequence[Sequence[float]], most: float | None = None) -> tuple[float, float]:
    """95 % interval of the mean tokens per step ``sum(tokens) / sum(steps)`` over all prompts' steps.

    Steps of one prompt are not independent: an easy prompt (one that repeats its own lines) accepts long
    runs step after step, so an interval that treats every step as a separate draw is too narrow to test a
    prediction against. The prompt is the unit here: with m >= 2 prompts the mean is a ratio estimator and
    its variance the cluster-robust one, ``m / (m - 1) * sum_i (y_i - G * x_i)^2 / (sum_i x_i)^2`` (y_i: the
    prompt's tokens, x_i: its steps, G: the mean), with Student's t at m - 1 degrees of freedom. With one
    prompt the steps are the only replication and the normal interval over steps is returned.

    Args:
        per_prompt: per prompt, the tokens each step emitted; prompts without steps are ignored.
        most: the most tokens a step can emit (a tree of depth D: D + 1); None: no bound.

    Returns:
        ``(low, high)`` tokens per step, the low end clipped at 1 (every step emits a token) and the high end at
        ``most``; ``(nan, nan)`` without any step.
    """
    lo, hi = _tokens_per_step_ci95(per_prompt)
    return lo, (min(hi, float(most)) if most is not None and not math.isnan(hi) else hi)


def _tokens_per_step_ci95(per_prompt: Sequence[Sequence[float]]) -> tuple[float, float]:
    groups = [list(map(float, g)) for g in per_prompt if len(g) > 0]
    if not groups:
        return (math.nan, math.nan)
    if len(groups) == 1:
        xs = groups[0]
        m = statistics.fmean(xs)
        if len(xs) < 2:
            return (m, m)
        half = Z975 * statistics.stdev(xs) / math.sqrt(len(xs))
        return (max(m - half, 1.0), m + half)
    y = [sum(g) for g in groups]
    x = [len(g) for g in groups]
    n = sum(x)
    g_mean = sum(y) / n
    k = len(groups)
    var = k / (k - 1) * sum((yi - g_mean * xi) ** 2 for yi, xi in zip(y, x)) / n**2
    half = t975(k - 1) * math.sqrt(var)
    return (max(g_mean - half, 1.0), g_mean + half)  # a step emits at least its bonus token


def _positive(x: Any) -> float | None:
    """``x`` as a float when it is a finite number > 0 (not a bool or a string), else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
        return None
    return float(x)


def relative_depth_costs(meta: TreeMetadata, depth: int) -> list[float] | None:
    """(D + 1,) a step's cost with the tree cut to depth 0 .. D in plain steps (entry 0: 1, the root alone), made to
    agree with the file's own prediction: entry D is ``G / S`` (its tokens per step over its speedup: the whole
    tree's step over a plain one's, as the figure ``run`` scales was priced, a re-timed step check's too). The
    shape between comes from the file's ``depth_step_ms`` where it holds D + 1 positive numbers that do not fall
    (within 5 %), else a straight line in the depth. None without both G and S.

    Raises nothing: a hand-edited ``depth_step_ms`` that breaks these rules is not read."""
    G, S = _positive(meta.expected_tokens_per_step), _positive(meta.predicted_speedup)
    if G is None or S is None or depth < 1:
        return None
    r = G / S
    raw = meta.extra.get("depth_step_ms")
    c = [_positive(x) for x in raw] if isinstance(raw, list) and len(raw) == depth + 1 else None
    if c is not None and all(x is not None for x in c) and all(b >= 0.95 * a for a, b in zip(c, c[1:])) \
            and c[-1] > c[0]:
        u = [x / c[0] for x in c]
        out = [1.0 + (x - 1.0) * (r - 1.0) / (u[-1] - 1.0) for x in u]
    else:
        out = [1.0 + (r - 1.0) * d / depth for d in range(depth + 1)]
    return out if all(x > 0 for x in out) else None


def answer_factor(tree: Tree | None, meta: TreeMetadata | None, lengths: Sequence[int], *,
                  priced: bool = False, speculable: Sequence[int] | None = None,
                  depth: int | None = None, rooms: Sequence[int] | None = None) -> float | None:
    """The factor on a tree's steady-state tokens/step (``priced`` False) or speedup (``priced`` True) over
    generations of ``lengths`` tokens.

    Tokens/step: ``sum N_i / (G x sum E[tau_i])``, E[tau_i] the expected steps to emit N_i tokens (the last step
    emits only what is left: :mod:`~sequoia_opt.solver.generation`), exact for every length from the distribution
    of a step's tokens: the tree's, where the file records the value model's ``node_rates`` for ``tree`` (and they
    give its G within 2 %); else (a graft or dynamic policy, an older file) a chain of the policy's ``depth``
    (``tree``'s when given) whose one rate gives the file's G, an approximation; without a depth, the renewal limit
    ``sum N / (sum N + generations x E[O])`` from the file's ``end_overshoot_tokens`` (long generations only, not
    priced). None without G and either.

    Speedup: the same, with each step priced at its cost (:func:`relative_depth_costs`: a step of the tree cut to
    depth d, in plain steps): the decoder drafts no deeper than a row can still emit, so a generation's last steps
    cost less than a whole tree's; ``sum N_i x c_D / (G x sum E[C_i])``
    (:func:`~sequoia_opt.solver.generation.expected_cost`). Without the file's speedup, the tokens/step factor.

    ``speculable`` (one per generation): the tokens a drafter's steps can emit before its own context ends
    (:func:`~sequoia_opt.drafting.drafters.model.guessable_tokens` and the bonus token of the last one); the rest
    are plain steps, one token each at plain decoding's cost. None: every token.

    ``rooms`` (one per generation, priced only): the tokens the decoder could emit when it started (its
    ``max_new_tokens``), where an answer ended before them on an EOS token: its steps were drafted for the room,
    not for the end nobody knew, so fewer of them were cut (``expected_cost``'s ``room``). None: each answer ran
    to the stop rule."""
    from ..solver.generation import chain_rate, expected_cost, expected_steps, step_length_tail

    # per generation (tokens n, speculable tokens k, the room r its speculative steps were drafted for)
    pairs = []
    for i, n in enumerate(int(x) for x in lengths):
        if n <= 0:
            continue
        s = None if speculable is None else int(speculable[i])
        k = n if s is None else max(0, min(n, s))
        r = n if rooms is None else int(rooms[i])
        # cut by its drafter's context: cut there, whatever room the row had; else the context bounds the room too
        r = k if k < n else max(k, r if s is None else min(r, s))
        pairs.append((n, k, r))
    if meta is None or not pairs:
        return None
    total = sum(n for n, _, _ in pairs)
    G = _positive(meta.expected_tokens_per_step)
    G = G if G is not None and G >= 1.0 else None
    rates = meta.extra.get("node_rates")
    tail = None
    if tree is not None and tree.size > 1 and isinstance(rates, list) and len(rates) == tree.size - 1 \
            and all((_positive(x) is not None and x <= 1) or x == 0 for x in rates):
        reach = [1.0] * tree.size
        for v in range(1, tree.size):
            reach[v] = reach[tree.parent[v]] * float(rates[v - 1])
        tail = step_length_tail(tree.depth, reach)
        if G is not None and abs(float(tail.sum()) - G) > 0.02 * G:  # rates of another tree or model: not read
            tail = None
    D = tree.tree_depth if tree is not None else depth
    if tail is None and G is not None and D and 1 <= D and G <= D + 1:
        a = chain_rate(G, D)  # a chain whose one rate gives G stands for the step's tokens
        tail = np.array([a ** k for k in range(D + 1)])
    if tail is None:  # no depth: the renewal limit from the file's overshoot, tokens/step only
        overshoot = meta.extra.get("end_overshoot_tokens")
        if not (isinstance(overshoot, (int, float)) and not isinstance(overshoot, bool) and overshoot >= 0):
            return None
        if G is None:  # the plain steps cannot be weighed against the speculative ones: all speculable
            pairs = [(n, n, r) for n, _, r in pairs]
        return total / sum(k + float(overshoot) * (k > 0) + (G or 1.0) * (n - k) for n, k, _ in pairs)
    mu = float(tail.sum())
    costs = relative_depth_costs(meta, tail.size - 1) if priced else None
    if costs is not None:
        spent = sum(expected_cost(tail, k, costs, room=r) + (n - k) * costs[0] for n, k, r in pairs)
        return total * costs[-1] / (mu * spent)
    return total / (mu * sum(expected_steps(tail, k) + (n - k) for n, k, _ in pairs))


def _summary(name: str, size: int, depth: int, results: list[GenerationResult], rows: list[PromptRow],
             plain_tps: float | None, meta: TreeMetadata | None, drafter: str | None = None,
             names: Sequence[str] = (), tree: Tree | None = None, most: int | None = None,
             draft_context: int | None = None, factor_depth: int | None = None,
             max_new_tokens: int | None = None) -> TreeSummary:
    per_prompt = [[float(s.accepted_len) for s in r.steps] for r in results]  # emitted: what the prediction is
    per_step = [v for steps in per_prompt for v in steps]
    untruncated = [float(s.accepted_nodes + 1) for r in results for s in r.steps]
    new = sum(len(r.tokens) for r in results)
    ms = sum(r.decode_ms for r in results)
    tps = 1000.0 * new / ms if ms > 0 else 0.0
    generations = sum(1 for g in per_prompt if g)
    steps_each = len(per_step) / generations if generations else None  # the step noise each prompt averages
    g_int, s_int = prediction_intervals(meta, generations, steps_each)
    mean_tps = statistics.fmean(per_step) if per_step else 0.0
    steady = meta.predicted_speedup if meta else 1.0
    predicted = steady
    predicted_g = meta.expected_tokens_per_step if meta else 1.0
    # the run's generations end inside a step (solver.generation): the steady state over these lengths
    done = [r for r in results if r.steps]
    lengths = [len(r.tokens) for r in done]
    # the tokens past the drafters' context are plain steps (the trees clip to the root there); the last step
    # that drafts emits its bonus token too
    spec = None if draft_context is None else [guessable_tokens(draft_context, r.prompt_len) + 1 for r in done]
    f = answer_factor(tree, meta, lengths, speculable=spec, depth=factor_depth)
    if f is not None:
        # an answer ended on EOS was drafted for the tokens the row had left, not cut at its end
        rooms = [max_new_tokens if max_new_tokens and r.stop_reason == "eos" else len(r.tokens) for r in done]
        fs = answer_factor(tree, meta, lengths, priced=True, speculable=spec, depth=factor_depth,
                           rooms=rooms)  # cut steps cheaper
        if predicted is not None and predicted > 0:
            # between plain decoding (1x: a one-token answer is one plain step) and the steady state: a run's
            # answers neither gain on the tree's steady state nor fall below what its steps can do at 1 token each
            steady_s = predicted
            predicted = min(max(steady_s * fs, min(1.0, steady_s)), max(1.0, steady_s))
            if s_int is not None:  # the spread shrinks toward 1x as the point does (none at one token a step)
                k = (predicted - 1.0) / (steady_s - 1.0) if abs(steady_s - 1.0) > 1e-9 else 1.0
                ends = sorted(1.0 + (x - 1.0) * k for x in s_int)
                s_int = (ends[0], ends[1])
        if predicted_g is not None:
            predicted_g = max(1.0, predicted_g * f)  # a step emits at least one token
        if g_int is not None:
            g_int = (max(1.0, g_int[0] * f), g_int[1] * f)
    if tree is not None and tree.size == 1:  # the root alone is plain decoding, whatever a (hand-made) file claims
        predicted_g, g_int, predicted, s_int = 1.0, (1.0, 1.0), 1.0, None
    if most is not None:  # a file's figures may not know the bound (or the run's lengths)
        if g_int is not None:
            g_int = (min(g_int[0], float(most)), min(g_int[1], float(most)))
        if predicted_g is not None:
            predicted_g = min(predicted_g, float(most))
    return TreeSummary(
        tree=name, size=size, depth=depth, new_tokens=new, steps=sum(r.num_steps for r in results),
        tokens_per_s=tps, speedup=(tps / plain_tps) if plain_tps else 1.0,
        tokens_per_step=mean_tps, tps_ci95=tokens_per_step_ci95(per_prompt, most),
        predicted_tokens_per_step=predicted_g,
        predicted_speedup=predicted, predicted_speedup_steady=steady,
        predicted_tokens_per_step_steady=meta.expected_tokens_per_step if meta else 1.0,
        draft_ms=sum(r.draft_ms for r in results), verify_ms=sum(r.verify_ms for r in results),
        bookkeeping_ms=sum(r.bookkeeping_ms for r in results),
        mismatches=sum(1 for r in rows if r.matches_plain is False), drafter=drafter,
        drafters=_drafter_stats(results, names) if names else [], predicted_interval=g_int,
        predicted_speedup_interval=s_int,
        inside_prediction=None if g_int is None else bool(g_int[0] <= mean_tps <= g_int[1]),
        tokens_per_step_untruncated=statistics.fmean(untruncated) if untruncated else 0.0,
    )


def node_acceptance_rows(tree: Tree, results: Sequence[GenerationResult],
                         meta: TreeMetadata | None = None) -> list[dict[str, Any]]:
    """Per non-root node of a static ``tree``, its acceptance once its parent was accepted over the steps of
    ``results`` (:class:`~sequoia_opt.decoding.stats.NodeAcceptance`), with ``predicted`` where ``meta`` records the
    value model's ``node_rates`` for this tree (one per non-root node)."""
    from ..decoding.stats import NodeAcceptance

    counts = NodeAcceptance(tree)
    for r in results:
        counts.start_prompt()
        counts.add(r.steps)
    rows = counts.rows()
    rates = meta.extra.get("node_rates") if meta is not None else None
    if isinstance(rates, list) and len(rates) == len(rows):
        for row, q in zip(rows, rates):
            row["predicted"] = float(q)
    return rows


def node_misses(rows: Sequence[dict[str, Any]], *, alpha: float = 0.01, min_reached: int = 30,
                most: int = 4) -> list[str]:
    """The nodes of :func:`node_acceptance_rows` whose predicted rate lies outside the interval of their measured rate
    (at least ``min_reached`` trials), farthest first, at most ``most``, one phrase each: ``"[1, 0] 0.31 of 120
    (predicted 0.51)"``: where the value model is wrong in this run's context. The interval is ``rate +- z se``
    with the standard error between prompts (``se``; the steps of one prompt are correlated), else Wilson's over
    the steps; ``z`` keeps the chance of naming any node of an exact model below ``alpha`` (Bonferroni over the
    nodes tested)."""
    from statistics import NormalDist

    from ..profiles.common import wilson_interval

    tested = [r for r in rows if r.get("predicted") is not None and r["reached"] >= min_reached]
    if not tested:
        return []
    z = NormalDist().inv_cdf(1.0 - alpha / (2 * len(tested)))
    out = []
    for r in tested:
        q = r["predicted"]
        if r.get("se") is not None:
            lo, hi = r["rate"] - z * r["se"], r["rate"] + z * r["se"]
        else:
            lo, hi = wilson_interval(r["accepted"], r["reached"], z)
        if not lo <= q <= hi:
            out.append((abs(r["rate"] - q), f"{r['node']} {r['rate']:.2f} of {r['reached']} (predicted {q:.2f})"))
    return [t for _, t in sorted(out, key=lambda x: -x[0])[:most]]


def _drafter_stats(results: list[GenerationResult], names: Sequence[str]) -> list[dict[str, Any]]:
    """Per drafter of a multi-drafter entry: calls, call rate, time and accepted nodes over all prompts."""
    k = len(names)
    ms, calls, accepted = [0.0] * k, [0] * k, [0] * k
    steps = sum(any(s.drafter_calls) for r in results for s in r.steps)  # a root-only step asks no drafter
    for r in results:
        m, c, a = r.drafter_totals()
        for i in range(min(k, len(m))):
            ms[i] += m[i]
            calls[i] += c[i]
            accepted[i] += a[i]
    return [{"name": names[i], "calls": calls[i], "call_rate": calls[i] / steps if steps else 0.0, "ms": ms[i],
             "ms_per_call": ms[i] / calls[i] if calls[i] else 0.0, "accepted_nodes": accepted[i]} for i in range(k)]


def run_trees(
    target: Transformer,
    draft: Transformer | Drafter | Callable[[], Transformer | Drafter] | None,
    entries: Sequence[TreeEntry],
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    eos_ids: Sequence[int] = (),
    backend: str = "auto",
    warmup: bool = True,
    settings: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
) -> RunReport:
    """Run plain decoding and every tree in ``entries`` on every prompt; return the comparison.

    Args:
        target: the target model.
        draft: the proposer: a draft Transformer, or a function making a fresh
            :class:`~sequoia_opt.drafting.drafters.Drafter` per decoder (e.g. ``ModelPair.new_drafter``; each
            tree gets its own decoder, and a drafter serves one; :func:`~sequoia_opt.drafting.drafters.drafter_factory`),
            or one Drafter instance when ``entries`` holds a single tree. Same vocabulary and device as the target.
            An entry with its own :attr:`TreeEntry.draft` runs with that one instead (None here is allowed when
            every entry has its own).
        entries: trees with names and their YAML metadata (for predicted figures); an entry with a ``policy``
            runs that policy (its cache sized for the policy's largest tree).
        prompts: token-id lists (each at least one token).
        max_new_tokens: tokens to generate per prompt.
        temperature, top_p, seed: 0 = greedy (outputs must equal plain decoding); sampling otherwise, every
            decoder seeded with ``seed`` for each prompt.
        warmup: decode the first prompt once, untimed, with each decoder first (allocators, caches).
        settings: extra key/values recorded with the results (model names, device, dtype, files).

    Returns:
        :class:`RunReport`; in greedy mode ``greedy_ok`` is False when some output differed.

    Raises:
        DecodingError: a tree the draft cannot produce, a prompt + ``max_new_tokens`` past the target's
            context, mismatched vocabularies: all before the first timed forward. (A draft with a shorter
            context is fine: the trees are clipped near its end, see
            :class:`~sequoia_opt.drafting.policies.StaticTreePolicy`.)
        ValueError: no entries, or an entry without a drafter when ``draft`` is None.
    """
    if not entries:
        raise ValueError("no trees to run")
    if draft is None and any(e.draft is None and e.policy is None for e in entries):
        raise ValueError("draft is None but some entries have no drafter of their own (TreeEntry.draft)")
    greedy = temperature == 0
    device = target.device
    longest = max(len(p) for p in prompts)
    # slots for a whole tree at every step; requests are checked against the TARGET's context (a shorter
    # draft context only clips the trees near its end, it must not cap the cache plain decoding uses too)
    make_draft = drafter_factory(draft) if draft is not None else None
    # one fresh policy per decoder: the entry's own, or its static tree with a fresh drafter (a drafter binds to
    # one decoder)
    def policy_of(e: TreeEntry) -> DraftingPolicy:
        make = drafter_factory(e.draft) if e.draft is not None else make_draft
        drafter = make() if make is not None else None
        return e.policy(drafter) if e.policy is not None else StaticTreePolicy(drafter, e.tree)

    policies = [policy_of(e) for e in entries]
    max_len = min(target.config.max_position_embeddings, longest + max_new_tokens) + max(p.max_size for p in policies)

    def gen(s: int) -> torch.Generator:
        g = torch.Generator(device=device)
        g.manual_seed(s)
        return g

    kw = dict(temperature=temperature, top_p=top_p, eos_ids=eos_ids, backend=backend, max_len=max_len)
    plain = Decoder(target, None, generator=gen(seed), **kw)
    decoders = [Decoder(target, pol, generator=gen(seed), **kw) for pol in policies]
    def check(p: Sequence[int]) -> None:  # every request validated before any timed work
        for d in decoders:  # first: their messages call the target "the target"
            d.check(p, max_new_tokens)
        plain.check(p, max_new_tokens)

    check_each_prompt(prompts, check)
    if warmup:
        plain.generate(prompts[0], min(8, max_new_tokens))
        for d in decoders:
            d.generate(prompts[0], min(8, max_new_tokens))
            if hasattr(d.policy, "restart"):
                d.policy.restart()  # the warm-up's steps are not the run's: the initial tree and the prior
    total = len(prompts) * (1 + len(entries))
    done = 0
    plain_results: list[GenerationResult] = []
    results: list[list[GenerationResult]] = [[] for _ in entries]
    rows: list[PromptRow] = []
    mismatches: list[dict[str, Any]] = []
    for i, p in enumerate(prompts):
        plain.generator = gen(prompt_seed(seed, i))
        base = plain.generate(p, max_new_tokens)
        plain_results.append(base)
        rows.append(_row("plain", i, base, None, greedy))
        done += 1
        if progress:
            progress(f"prompt {i + 1}/{len(prompts)}: plain decoding", done, total)
        for j, (e, d) in enumerate(zip(entries, decoders)):
            d.generator = gen(prompt_seed(seed, i))
            res = d.generate(p, max_new_tokens)
            results[j].append(res)
            row = _row(e.name, i, res, base, greedy)
            rows.append(row)
            if row.matches_plain is False:
                mismatches.append({"tree": e.name, "prompt_index": i, "first_mismatch": row.first_mismatch,
                                   "plain": base.tokens[row.first_mismatch:row.first_mismatch + 5],
                                   "tree_output": res.tokens[row.first_mismatch:row.first_mismatch + 5]})
            done += 1
            if progress:
                progress(f"prompt {i + 1}/{len(prompts)}: {e.name}", done, total)
    plain_rows = [r for r in rows if r.tree == "plain"]
    plain_summary = _summary("plain", 1, 0, plain_results, plain_rows, None, None, most=1)
    summaries = [plain_summary]
    for e, pol, res in zip(entries, policies, results):
        names = pol.names if pol.reports_drafters else ()
        static = isinstance(pol, StaticTreePolicy)
        size, depth = (e.tree.size, e.tree.tree_depth) if static else (pol.max_verified, pol.max_depth)
        meta = e.metadata
        adapter = getattr(pol, "adapter", None)
        if adapter is not None:  # its trees change: the largest it verified (the final one read 1 node beside
            served = [st for r in res for st in r.steps]  # tokens/step from the earlier, deeper trees);
            size = max((st.tree_size for st in served), default=1)  # predicted: the step-weighted mean over them
            depth = max((st.tree_depth for st in served), default=0)
            extra = {k: v for k, v in meta.extra.items()
                     if k not in ("end_overshoot_tokens", "node_rates", "depth_step_ms")}
            meta = replace(meta, expected_tokens_per_step=adapter.predicted_tokens_per_step, predicted_speedup=None,
                           extra=extra)  # the file's tree's length figures are not the trees it ran
        # a step emits at most this many tokens (the intervals stop there): the (deepest verified) tree's depth + 1,
        # and no more than the generation asks (the decoder drafts no deeper than a row can still emit)
        most = min(depth + 1, max_new_tokens)
        contexts = [d.context for d in pol.drafters if d.context < target.config.max_position_embeddings]
        summaries.append(_summary(e.name, size, depth, res, [r for r in rows if r.tree == e.name],
                                  plain_summary.tokens_per_s, meta, e.drafter, names,
                                  tree=(pol.tree_for(1) if isinstance(pol, SchedulePolicy) else e.tree)
                                  if static and adapter is None else None, most=most,
                                  draft_context=min(contexts) if contexts else None,
                                  factor_depth=None if adapter is not None else depth,  # trees it swapped: none
                                  max_new_tokens=max_new_tokens))
        if e.policy is None and e.tree.size > 1:  # a fixed tree (an adaptive or plan policy changes its tree)
            summaries[-1].node_acceptance = node_acceptance_rows(e.tree, res, meta)
        if adapter is not None:
            summaries[-1].adaptive = adapter.as_dict()
    run_settings = {"date": now_iso(), "max_new_tokens": max_new_tokens, "temperature": temperature,
                    "top_p": top_p, "seed": seed, "num_prompts": len(prompts), "device": str(device),
                    "dtype": str(target.dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
                    "omp_wait_policy": run_policy(device.type),
                    "trees": {e.name: e.tree.choices() for e in entries}}
    if any(e.drafter is not None for e in entries):
        run_settings["drafters"] = {e.name: e.drafter for e in entries if e.drafter is not None}
    run_settings.update(settings or {})
    return RunReport(run_id=new_run_id(), settings=run_settings, summaries=summaries, rows=rows,
                     mismatch_details=mismatches)
