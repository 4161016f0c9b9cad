"""Acceptance and latency profiles: versioned YAML schemas, validation, loading and atomic saving.

Two files feed the solver. Every figure carries its unit in its key name (``_ms`` for milliseconds,
``tokens`` for token counts); a key with another time unit (``_s``, ``_us``, ``_ns``) is refused rather than
guessed. Any problem raises :class:`~sequoia_opt.errors.ProfileError` with one line naming the file, the key
and the problem.

Acceptance profile, ``format: treeopt-acceptance/1`` (Sequoia, Chen et al. 2024, section 3.1)::

    format: treeopt-acceptance/1
    id: llama2-7b_jf68m_greedy        # optional; defaults to the file stem
    example: false                    # optional; true for illustrative, not measured, data
    source: "how the numbers were obtained"   # optional free text
    measured:                         # what was measured (all optional except mode)
      target: meta-llama/Llama-2-7b-hf
      draft: JackFram/llama-68m
      mode: greedy                    # greedy | sampling
      temperature: 0.0
      top_p: 1.0
      width: 8                        # K, candidates proposed per node while measuring
      num_samples: 2000
      date: "2025-01-01T00:00:00+00:00"
      device: NVIDIA H100 80GB HBM3
      dtype: float16
      prompts: data/prompts.jsonl
    acceptance: [0.62, 0.12, ...]     # K entries, p_k = P(the k-th candidate is the accepted one); sum <= 1
    counts: [1240, 240, ..., 310]     # optional; K + 1 integers: times candidate k was accepted, then the
                                      # times all K were rejected. acceptance must equal counts / sum(counts).
    acceptance_by_depth:              # optional; depth (1 = children of the root) -> K-entry vector
      1: [...]

Latency profile, ``format: treeopt-latency/1``::

    format: treeopt-latency/1
    id: h100_llama2-7b_fp16           # optional; defaults to the file stem
    example: false
    source: "..."
    device: {name: NVIDIA H100 80GB HBM3, torch_version: 2.3.0, driver_version: "550.54", dtype: float16,
             threads: 1}
    model:
      target: meta-llama/Llama-2-7b-hf
      target_shape: {n_layers: 32, d_model: 4096, n_heads: 32}   # free-form mapping
      draft: JackFram/llama-68m
      draft_shape: {...}
      random_weights: false           # true when timed with random weights of the right shape
    engine: {name: llama.cpp, version: 0.3.36}   # optional; what ran the forwards (absent: treeopt's decoder)
    step_overhead_ms: 0.4             # fixed per-step cost (sampling, acceptance, commit), >= 0
    curves:                           # one entry per context length, increasing context_tokens
      - context_tokens: 512
        target:                       # one target forward over `tokens` new tokens at this context
          tokens: [1, 2, 4, 8, 16, 32, 64, 128]          # strictly increasing, >= 1
          target_forward_ms: [20.1, 20.2, ...]           # median per row
          target_forward_spread_ms: [0.2, ...]           # optional; interquartile range (p75 - p25)
        draft:                        # one draft forward over `tokens` tokens at this context
          cost_model: per-level       # optional, default per-level; the same in every curve (see below)
          tokens: [1, 2, 4, ...]
          draft_forward_ms: [1.1, ...]
          draft_forward_spread_ms: [...]                 # optional

The draft table's ``cost_model`` is how the solver charges the drafter per step (the drafter's own
:attr:`~sequoia_opt.drafting.drafters.Drafter.cost_model`; DESIGN.md, "Drafters and drafting policies"):
``per-level`` (one draft forward per tree level over that level's width w, c(w): a draft model, self
layer-skip) or ``one-pass`` (one forward proposes every level: Medusa heads, block diffusion drafters such
as DFlash; c is read at the number of speculated tokens, see :func:`~sequoia_opt.solver.hardware.step_cost`).
A profile without the key reads as ``per-level`` (every profile written before the key existed); another
value, or different values in different curves, is refused. Saving always writes it.

``engine`` names what ran the forwards (issue 20): a mapping with a non-empty ``name`` (``treeopt``, ``llama.cpp``,
``sglang``, ``vllm``) and free-form details (``version``, ...). A profile without it was measured on treeopt's
bundled decoder, and is saved without it; :func:`sequoia_opt.engines.engine_mismatch` warns when a profile of one
engine solves for another.

:class:`LatencyCurve` interpolates linearly between measured token counts and between context lengths and
refuses (``ProfileError``) to extrapolate past the measured range.

Acceptance pair profile, ``format: treeopt-acceptance-pair/1`` (:class:`PairAcceptanceProfile`): a light and
a strong drafter measured together for grafted trees (issue 16), per depth one count vector of the outcomes
(light rank r, strong conditional rank r, none); see the class for the layout.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml

from ._io import atomic_write_text, check_numbers, read_text_file
from .errors import ProfileError, ProfileWarning, SolverError

ACCEPTANCE_FORMAT = "treeopt-acceptance/1"
LATENCY_FORMAT = "treeopt-latency/1"
#: A light and a strong drafter measured together (:class:`PairAcceptanceProfile`, issue 16).
PAIR_ACCEPTANCE_FORMAT = "treeopt-acceptance-pair/1"

#: Slack allowed on ``sum(p) <= 1`` for rounding in profiles written by hand or by other tools.
SUM_TOLERANCE = 1e-6

#: The drafter cost models a latency profile's draft table may declare (the first is the default).
DRAFT_COST_MODELS = ("per-level", "one-pass")

_WRONG_TIME_UNITS = ("_s", "_sec", "_secs", "_seconds", "_us", "_ns", "_usec", "_millis")

#: The largest count a file may hold (acceptance counts, trials, samples): 2**53, the largest integer a
#: float64 holds exactly (counts are divided in float64, and a sum of 1024 of them still fits int64).
MAX_COUNT = 2**53
#: The largest token count, context length, batch size, depth or width a file may hold (2**31 - 1).
MAX_TOKENS = 2**31 - 1
#: The largest time a file may hold, in ms (1e9 ms, about 11.6 days: past it a figure is not a measurement).
MAX_MS = 1e9
#: A forward over n > 1 tokens measured below this fraction of the one-token forward is implausible (more
#: work in less than half the time: noise, a machine under other load, a cache effect): loading warns.
IMPLAUSIBLE_FRACTION = 0.5


# ---------------------------------------------------------------------------------------------- helpers
def validate_acceptance(acceptance: Any, *, error: type[Exception] = SolverError, what: str = "acceptance vector") -> np.ndarray:
    """Check a positional acceptance vector and return it as a ``(K,)`` float64 array.

    Raises ``error`` (default :class:`SolverError`) with one line when it is not a 1-D sequence of numbers,
    is empty, holds NaN / inf or a negative entry, or sums above ``1 + SUM_TOLERANCE`` (Sequoia section 3.1:
    the entries are probabilities of disjoint events).
    """
    if isinstance(acceptance, (str, bytes)) or isinstance(acceptance, Mapping):
        raise error(f"{what} must be a list of probabilities, got {type(acceptance).__name__}")
    try:
        p = np.asarray(acceptance, dtype=np.float64)
    except (TypeError, ValueError):
        raise error(f"{what} must be a list of numbers") from None
    if p.ndim != 1:
        raise error(f"{what} must be a flat list of probabilities, got shape {p.shape}")
    if p.size == 0:
        raise error(f"{what} is empty: it needs at least one entry p_1")
    bad = np.nonzero(~np.isfinite(p))[0]
    if bad.size:
        raise error(f"{what} entry p_{bad[0] + 1} is {p[bad[0]]} (must be a finite probability)")
    neg = np.nonzero(p < 0)[0]
    if neg.size:
        raise error(f"{what} entry p_{neg[0] + 1} = {p[neg[0]]} is negative")
    total = float(p.sum())
    if total > 1.0 + SUM_TOLERANCE:
        raise error(f"{what} sums to {total:.6g} > 1 (entries are probabilities of disjoint events)")
    return p


def wilson_interval(k: float, n: float, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval (low, high) for a proportion of ``k`` successes in ``n`` trials, default 95 %
    (``k`` may be an expected count); (0, 1) when ``n`` is 0."""
    if n <= 0:
        return 0.0, 1.0
    phat, z2 = k / n, z * z
    centre = (phat + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(max(phat * (1 - phat), 0.0) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(centre - half, 0.0), min(centre + half, 1.0)


def _load_yaml(path: str | Path, kind: str) -> tuple[dict[str, Any], Path]:
    path = Path(path)
    text = read_text_file(path, error=ProfileError, what=f"{kind} profile")
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as err:
        raise ProfileError(f"{path}: not valid YAML ({err.__class__.__name__})") from None
    article = "an" if kind[:1] in "aeiou" else "a"
    if doc is None:
        raise ProfileError(f"{path}: the file is empty (expected {article} {kind} profile)")
    if not isinstance(doc, dict):
        raise ProfileError(f"{path}: {article} {kind} profile must be a YAML mapping with a 'format' key")
    check_numbers(doc, str(path), ProfileError)
    return doc, path


def _check_format(doc: Mapping[str, Any], expected: str, src: str) -> None:
    fmt = doc.get("format")
    if fmt == expected:
        return
    family = expected.split("/")[0]
    if isinstance(fmt, str) and fmt.startswith(family + "/"):
        raise ProfileError(f"{src}: format version {fmt!r} is not supported; this version reads {expected!r}")
    raise ProfileError(f"{src}: format is {fmt!r}, expected {expected!r}")


def _number(value: Any, where: str, *, positive: bool = False, high: float | None = None) -> float:
    """A finite, non-negative (``positive``: > 0) number, at most ``high``; ProfileError naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ProfileError(f"{where} must be a number, got {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an integer past float64's range
        raise ProfileError(f"{where} = {value} is out of range (must be finite)") from None
    if not math.isfinite(v):
        raise ProfileError(f"{where} is {v} (must be finite)")
    if v < 0 or (positive and v == 0):
        raise ProfileError(f"{where} = {v} must be {'positive' if positive else 'non-negative'}")
    if high is not None and v > high:
        raise ProfileError(f"{where} = {v:g} is out of range (at most {high:g})")
    return v


def check_integer(value: Any, where: str, *, low: int = 0, high: int = MAX_COUNT,
                  error: type[Exception] = ProfileError) -> int:
    """An integer in ``[low, high]`` from a file (bools, floats, inf and NaN refused: a count is written as an
    integer), as a Python int; otherwise ``error`` with one line naming ``where`` and the range. The bounds
    keep every value inside int64 (:data:`MAX_COUNT`, :data:`MAX_TOKENS`)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise error(f"{where} = {value!r} must be an integer >= {low}")
    if value < low:
        raise error(f"{where} = {value} must be an integer >= {low}")
    if value > high:
        raise error(f"{where} = {value} is out of range (at most {high})")
    return int(value)


def _flag(doc: Mapping[str, Any], key: str, source: str) -> bool:
    """A true/false key (default false); a string such as 'false' is refused, not read as true."""
    value = doc.get(key, False)
    if not isinstance(value, bool):
        raise ProfileError(f"{source}: {key!r} must be true or false, got {value!r}")
    return value


def _reject_wrong_units(table: Mapping[str, Any], where: str) -> None:
    for key in table:
        k = str(key)
        if any(k.endswith(suffix) for suffix in _WRONG_TIME_UNITS):
            raise ProfileError(f"{where}: key {k!r} has an unsupported unit; times must be milliseconds in keys ending in _ms")


def _plain(value: Any) -> Any:
    """Numpy scalars/arrays to plain Python for YAML."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------- acceptance
@dataclass
class AcceptanceProfile:
    """A measured (or example) positional acceptance vector (Sequoia section 3.1).

    Attributes:
        id: profile id recorded in tree metadata (the ``id`` key or the file stem).
        acceptance: (K,) float64, ``p_k`` = probability the k-th candidate is the accepted one.
        counts: (K+1,) int64 or None; per-candidate accept counts, last entry = all rejected.
        measured: what was measured (target, draft, mode, temperature, top_p, width, num_samples, date,
            device, dtype, prompts).
        by_depth: optional depth -> (K,) vector.
        example: True for illustrative data that was not measured.
        source: free text on where the numbers come from.
    """

    id: str
    acceptance: np.ndarray
    counts: np.ndarray | None = None
    measured: dict[str, Any] = field(default_factory=dict)
    by_depth: dict[int, np.ndarray] = field(default_factory=dict)
    example: bool = False
    source: str | None = None

    @property
    def width(self) -> int:
        """K, the number of candidate positions in the vector."""
        return int(self.acceptance.size)

    @property
    def num_samples(self) -> int | None:
        """Total samples behind the vector (sum of counts), or ``measured.num_samples``, or None."""
        if self.counts is not None:
            return int(self.counts.sum())
        n = self.measured.get("num_samples")
        return int(n) if isinstance(n, int) and not isinstance(n, bool) else None

    def confidence_interval(self, z: float = 1.959963984540054) -> np.ndarray:
        """Wilson score interval for every ``p_k``: ``(K, 2)`` array of (low, high), default 95 %.

        Raises ProfileError when the profile carries no ``counts``.
        """
        if self.counts is None:
            raise ProfileError(f"acceptance profile {self.id!r} has no counts; a confidence interval needs them")
        n = float(self.counts.sum())
        k = self.counts[:-1].astype(np.float64)
        phat = k / n
        z2 = z * z
        centre = (phat + z2 / (2 * n)) / (1 + z2 / n)
        half = z * np.sqrt(phat * (1 - phat) / n + z2 / (4 * n * n)) / (1 + z2 / n)
        return np.stack([np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)], axis=1)

    def depth_rows(self) -> np.ndarray:
        """(R, K) per-depth vectors for :func:`~sequoia_opt.solver.solve_dp_by_depth`: row r for children at
        depth r + 1, R = the deepest measured depth; a depth left out (too few trials) repeats the row above
        it. Without per-depth vectors: the pooled vector as the single row."""
        if not self.by_depth:
            return self.acceptance[None, :].copy()
        rows, last = [], self.acceptance
        for d in range(1, max(self.by_depth) + 1):
            last = self.by_depth.get(d, last)
            rows.append(last)
        return np.stack(rows)

    @property
    def positional_consistent(self) -> bool | None:
        """Whether the acceptance mass of every measured depth agreed with the pooled one (the positional
        assumption, Sequoia section 3.1; ``measured.positional_consistent``, written by ``treeopt profile
        acceptance``); None when not recorded."""
        v = self.measured.get("positional_consistent")
        return None if v is None else bool(v)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"format": ACCEPTANCE_FORMAT, "id": self.id}
        if self.example:
            d["example"] = True
        if self.source:
            d["source"] = self.source
        d["measured"] = _plain(dict(self.measured))
        d["acceptance"] = [float(x) for x in self.acceptance]
        if self.counts is not None:
            d["counts"] = [int(x) for x in self.counts]
        if self.by_depth:
            d["acceptance_by_depth"] = {int(k): [float(x) for x in v] for k, v in sorted(self.by_depth.items())}
        return d

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *, source: str = "acceptance profile", default_id: str = "acceptance") -> "AcceptanceProfile":
        """Validate a parsed ``treeopt-acceptance/1`` mapping. Raises ProfileError with one line."""
        _check_format(doc, ACCEPTANCE_FORMAT, source)
        if "acceptance" not in doc:
            raise ProfileError(f"{source}: missing key 'acceptance' (the K-entry vector p_1..p_K)")
        p = validate_acceptance(doc["acceptance"], error=ProfileError, what=f"{source}: 'acceptance'")
        measured = doc.get("measured") or {}
        if not isinstance(measured, dict):
            raise ProfileError(f"{source}: 'measured' must be a mapping")
        mode = measured.get("mode")
        if mode is not None and mode not in ("greedy", "sampling"):
            raise ProfileError(f"{source}: measured.mode is {mode!r}, expected 'greedy' or 'sampling'")
        for key in ("temperature", "top_p", "tokens_per_step"):
            if measured.get(key) is not None:
                _number(measured[key], f"{source}: measured.{key}")
        t, top_p = measured.get("temperature"), measured.get("top_p")
        if top_p is not None and not 0 < top_p <= 1:
            raise ProfileError(f"{source}: measured.top_p = {top_p} must be in (0, 1]")
        if mode is not None and t is not None and (mode == "greedy") != (t == 0):
            raise ProfileError(f"{source}: measured.mode is {mode!r} but measured.temperature is {t}; greedy is "
                               "temperature 0 and sampling a temperature > 0")
        for key in ("width", "num_samples", "num_prompts", "steps", "max_new_tokens"):
            v = measured.get(key)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ProfileError(f"{source}: measured.{key} = {v!r} must be a non-negative integer")
                check_integer(v, f"{source}: measured.{key}", high=MAX_TOKENS if key == "width" else MAX_COUNT)
        # the sizes a profile states must agree with its data (a hand-edited or truncated vector otherwise
        # solves for another K without a word)
        if measured.get("width") is not None and measured["width"] != p.size:
            raise ProfileError(f"{source}: measured.width is {measured['width']} but 'acceptance' has {p.size} "
                               "entries; the two must agree (K)")
        counts = None
        if doc.get("counts") is not None:
            raw = doc["counts"]
            if not isinstance(raw, list) or len(raw) != p.size + 1:
                raise ProfileError(f"{source}: 'counts' must list K + 1 = {p.size + 1} integers (the last = all rejected)")
            for i, c in enumerate(raw):
                if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                    raise ProfileError(f"{source}: counts[{i}] = {c!r} must be a non-negative integer")
                check_integer(c, f"{source}: counts[{i}]")
            counts = np.asarray(raw, dtype=np.int64)
            if counts.sum() == 0:
                raise ProfileError(f"{source}: 'counts' are all zero")
            implied = counts[:-1] / counts.sum()
            worst = int(np.argmax(np.abs(implied - p)))
            if abs(implied[worst] - p[worst]) > 1e-3:
                raise ProfileError(
                    f"{source}: acceptance p_{worst + 1} = {p[worst]:.6g} disagrees with counts "
                    f"({implied[worst]:.6g} = {counts[worst]}/{counts.sum()})"
                )
            if measured.get("num_samples") is not None and measured["num_samples"] != int(counts.sum()):
                raise ProfileError(f"{source}: measured.num_samples is {measured['num_samples']} but 'counts' sum "
                                   f"to {int(counts.sum())}; the two must agree")
        by_depth: dict[int, np.ndarray] = {}
        raw_depth = doc.get("acceptance_by_depth") or {}
        if not isinstance(raw_depth, dict):
            raise ProfileError(f"{source}: 'acceptance_by_depth' must map depth -> vector")
        for k, v in raw_depth.items():
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise ProfileError(f"{source}: acceptance_by_depth key {k!r} must be a depth >= 1")
            check_integer(k, f"{source}: acceptance_by_depth key", low=1, high=MAX_TOKENS)
            by_depth[k] = validate_acceptance(v, error=ProfileError, what=f"{source}: acceptance_by_depth[{k}]")
            if by_depth[k].size != p.size:
                raise ProfileError(f"{source}: acceptance_by_depth[{k}] has {by_depth[k].size} entries but "
                                   f"'acceptance' has {p.size}; every vector of a profile has K entries")
        pid = doc.get("id", default_id)
        if not isinstance(pid, str) or not pid:
            raise ProfileError(f"{source}: 'id' must be a non-empty string")
        return cls(
            id=pid,
            acceptance=p,
            counts=counts,
            measured=dict(measured),
            by_depth=by_depth,
            example=_flag(doc, "example", source),
            source=doc.get("source"),
        )


def load_acceptance(path: str | Path) -> AcceptanceProfile:
    """Read and validate a ``treeopt-acceptance/1`` YAML file. Raises ProfileError (also if missing)."""
    doc, p = _load_yaml(path, "acceptance")
    return AcceptanceProfile.from_dict(doc, source=str(p), default_id=p.stem)


def save_acceptance(path: str | Path, profile: AcceptanceProfile) -> Path:
    """Validate and write an acceptance profile atomically. Returns the path."""
    d = profile.to_dict()
    AcceptanceProfile.from_dict(d, source=str(path))
    return atomic_write_text(path, yaml.safe_dump(d, sort_keys=False, default_flow_style=None))


# ---------------------------------------------------------------------------------------------- drafter pair
#: Default: a depth with fewer trials than this is pooled into the last row (the threshold ``treeopt profile
#: acceptance`` uses for per-depth vectors).
PAIR_MIN_TRIALS = 30


@dataclass
class PairAcceptanceProfile:
    """What a light and a strong drafter together achieve on one target: the value model of a grafted tree
    (issue 16; TreeGraft 2026; :class:`~sequoia_opt.solver.graft.GraftAcceptance`).

    Measurement. Along a spine (the accepted path), at every spine node the light drafter proposes its top
    A = ``light_width`` candidates and the strong drafter its top B = ``strong_width`` candidates among the
    tokens the light did not propose (its conditional ranks). One trial = one spine node the path reached;
    its outcome is which candidate the target accepted: light rank r, strong conditional rank r, or none.

    Attributes:
        id: profile id (the ``id`` key or the file stem).
        drafters: (light, strong) names.
        cost_models: each drafter's cost model (:data:`DRAFT_COST_MODELS`), light first.
        measured: what was measured, free-form like :attr:`AcceptanceProfile.measured` (target, temperature,
            top_p, prompts, date, device, ...); ``temperature`` / ``top_p`` are checked when present.
        light_width / strong_width: A and B (>= 1 each).
        counts_by_depth: depth d (1 = the root's children) -> (A + B + 1,) int64 outcome counts of the
            trials at spine nodes of depth d - 1: entries ``0..A-1`` light rank r accepted, ``A..A+B-1``
            strong conditional rank r - A accepted, the last none of them. The sum is the depth's trials.
        example: True for illustrative data.  source: free text.

    YAML (``format: treeopt-acceptance-pair/1``)::

        format: treeopt-acceptance-pair/1
        id: lookup+smollm2-360m_greedy
        drafters: [lookup:1-3, smollm2-360m]       # light first
        cost_models: [per-level, per-level]
        measured: {target: ..., temperature: 0.0, top_p: 1.0, prompts: ..., date: ...}
        light_width: 2                              # A
        strong_width: 3                             # B
        outcome_counts_by_depth:                    # A + B + 1 counts: light 0..A-1, strong 0..B-1, none
          1: [410, 95, 160, 40, 21, 274]
          2: [...]

    Raises (construction and :meth:`from_dict`): ProfileError with one line.
    """

    id: str
    drafters: tuple[str, str]
    cost_models: tuple[str, str]
    light_width: int
    strong_width: int
    counts_by_depth: dict[int, np.ndarray]
    measured: dict[str, Any] = field(default_factory=dict)
    example: bool = False
    source: str | None = None

    def __post_init__(self) -> None:
        src = f"acceptance pair profile {self.id!r}"
        if not isinstance(self.id, str) or not self.id:
            raise ProfileError(f"{src}: 'id' must be a non-empty string")
        names = tuple(self.drafters) if isinstance(self.drafters, (list, tuple)) else ()
        if len(names) != 2 or not all(isinstance(x, str) and x.strip() for x in names) or names[0] == names[1]:
            raise ProfileError(f"{src}: 'drafters' must name two different drafters, light first, got "
                               f"{self.drafters!r}")
        models = tuple(self.cost_models) if isinstance(self.cost_models, (list, tuple)) else ()
        if len(models) != 2:
            raise ProfileError(f"{src}: 'cost_models' must give one cost model per drafter (2), got "
                               f"{self.cost_models!r}")
        for name, m in zip(names, models):
            check_cost_model(m, f"{src}: the cost model of drafter {name!r}")
        for key in ("light_width", "strong_width"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ProfileError(f"{src}: {key} = {v!r} must be an integer >= 1")
            check_integer(v, f"{src}: {key}", low=1, high=MAX_TOKENS)
        A, B = int(self.light_width), int(self.strong_width)
        if not isinstance(self.counts_by_depth, Mapping) or not self.counts_by_depth:
            raise ProfileError(f"{src}: 'outcome_counts_by_depth' must map depth -> A + B + 1 = {A + B + 1} counts")
        counts: dict[int, np.ndarray] = {}
        for d, raw in self.counts_by_depth.items():
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
                raise ProfileError(f"{src}: outcome_counts_by_depth key {d!r} must be a depth >= 1")
            check_integer(d, f"{src}: outcome_counts_by_depth key", low=1, high=MAX_TOKENS)
            values = raw.tolist() if isinstance(raw, np.ndarray) else raw
            if not isinstance(values, list) or len(values) != A + B + 1:
                raise ProfileError(f"{src}: outcome_counts_by_depth[{d}] must list A + B + 1 = {A + B + 1} counts "
                                   f"(light 0..{A - 1}, strong 0..{B - 1}, none), got {raw!r}")
            for i, c in enumerate(values):
                if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0:
                    raise ProfileError(f"{src}: outcome_counts_by_depth[{d}][{i}] = {c!r} must be a non-negative "
                                       "integer")
                check_integer(c, f"{src}: outcome_counts_by_depth[{d}][{i}]")
            counts[int(d)] = np.asarray(values, dtype=np.int64)
        if sum(int(c.sum()) for c in counts.values()) == 0:
            raise ProfileError(f"{src}: every outcome count is zero")
        if not isinstance(self.measured, Mapping):
            raise ProfileError(f"{src}: 'measured' must be a mapping")
        for key in ("temperature", "top_p"):
            if self.measured.get(key) is not None:
                _number(self.measured[key], f"{src}: measured.{key}")
        top_p = self.measured.get("top_p")
        if top_p is not None and not 0 < top_p <= 1:
            raise ProfileError(f"{src}: measured.top_p = {top_p} must be in (0, 1]")
        self.drafters, self.cost_models = names, models
        self.light_width, self.strong_width = A, B
        self.counts_by_depth = dict(sorted(counts.items()))
        self.measured = dict(self.measured)

    # -------------------------------------------------------------- derived
    @property
    def trials_by_depth(self) -> dict[int, int]:
        """depth -> trials (spine nodes of depth d - 1 the path reached)."""
        return {d: int(c.sum()) for d, c in self.counts_by_depth.items()}

    def outcome_labels(self) -> list[str]:
        """Names of the A + B + 1 outcomes, in count order (``light 0``, .., ``strong 0``, .., ``none``)."""
        return ([f"light {r}" for r in range(self.light_width)] + [f"strong {r}" for r in range(self.strong_width)]
                + ["none"])

    def depth_counts(self, min_trials: int = PAIR_MIN_TRIALS) -> np.ndarray:
        """(R, A + B + 1) int64 outcome counts per row, row r for children at depth r + 1: the leading depths
        1, 2, .. that have at least ``min_trials`` trials each keep their own row, and everything from the
        first depth that has fewer (a gap counts as 0 trials) to the deepest is pooled into the last row,
        the row deeper levels use anyway (solver/depth.py's convention). Unlike
        :meth:`AcceptanceProfile.depth_rows`, whose profiles drop sparse depths when written, no trial is
        lost. R >= 1; with too few trials at depth 1, everything is one row."""
        depths = sorted(self.counts_by_depth)
        own = 0
        while own + 1 in self.counts_by_depth and self.counts_by_depth[own + 1].sum() >= min_trials:
            own += 1
        rows = [self.counts_by_depth[d] for d in range(1, own + 1)]
        tail = [self.counts_by_depth[d] for d in depths if d > own]
        if tail:
            rows.append(np.sum(tail, axis=0))
        if rows[-1].sum() == 0 and len(rows) > 1:  # an empty pooled tail says nothing: the last row repeats
            rows.pop()
        return np.stack(rows).astype(np.int64)

    def _probabilities(self, min_trials: int) -> np.ndarray:
        c = self.depth_counts(min_trials).astype(np.float64)
        n = c.sum(axis=1, keepdims=True)
        if np.any(n == 0):
            raise ProfileError(f"acceptance pair profile {self.id!r}: a depth row has no trials")
        return c / n

    def light_rows(self, min_trials: int = PAIR_MIN_TRIALS) -> np.ndarray:
        """(R, A) float64: row r = P(the light's rank-k candidate is the accepted child at depth r + 1), the
        light's positional acceptance vector per depth (rows of :meth:`depth_counts`)."""
        return self._probabilities(min_trials)[:, : self.light_width]

    def strong_rows(self, min_trials: int = PAIR_MIN_TRIALS) -> np.ndarray:
        """(R, B) float64: row r = P(the strong's conditional rank-k candidate is the accepted child at depth
        r + 1) at a node where the light proposed A children (unconditional on the rank, as Sequoia's
        vectors: ``light_rows()[r].sum() + strong_rows()[r].sum() <= 1``)."""
        A = self.light_width
        return self._probabilities(min_trials)[:, A: A + self.strong_width]

    def confidence_interval(self, z: float = 1.959963984540054, min_trials: int = PAIR_MIN_TRIALS) -> np.ndarray:
        """Wilson score intervals (default 95 %) of every accept outcome per row: (R, A + B, 2) array of
        (low, high), columns light ranks then strong ranks (:meth:`AcceptanceProfile.confidence_interval`)."""
        c = self.depth_counts(min_trials).astype(np.float64)
        n = c.sum(axis=1, keepdims=True)
        phat = c[:, :-1] / n
        z2 = z * z
        centre = (phat + z2 / (2 * n)) / (1 + z2 / n)
        half = z * np.sqrt(phat * (1 - phat) / n + z2 / (4 * n * n)) / (1 + z2 / n)
        return np.stack([np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)], axis=-1)

    # -------------------------------------------------------------- io
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"format": PAIR_ACCEPTANCE_FORMAT, "id": self.id}
        if self.example:
            d["example"] = True
        if self.source:
            d["source"] = self.source
        d["drafters"] = list(self.drafters)
        d["cost_models"] = list(self.cost_models)
        d["measured"] = _plain(dict(self.measured))
        d["light_width"] = self.light_width
        d["strong_width"] = self.strong_width
        d["outcome_counts_by_depth"] = {int(k): [int(x) for x in v] for k, v in self.counts_by_depth.items()}
        return d

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *, source: str = "acceptance pair profile",
                  default_id: str = "pair") -> "PairAcceptanceProfile":
        """Validate a parsed ``treeopt-acceptance-pair/1`` mapping. Raises ProfileError with one line (a file of
        another format or version included)."""
        _check_format(doc, PAIR_ACCEPTANCE_FORMAT, source)
        for key in ("drafters", "cost_models", "light_width", "strong_width", "outcome_counts_by_depth"):
            if key not in doc:
                raise ProfileError(f"{source}: missing key {key!r}")
        pid = doc.get("id", default_id)
        try:
            return cls(id=pid, drafters=doc["drafters"], cost_models=doc["cost_models"],
                       light_width=doc["light_width"], strong_width=doc["strong_width"],
                       counts_by_depth=doc["outcome_counts_by_depth"], measured=doc.get("measured") or {},
                       example=_flag(doc, "example", source), source=doc.get("source"))
        except ProfileError as err:
            raise ProfileError(f"{source}: {err}") from None


def load_pair_acceptance(path: str | Path) -> PairAcceptanceProfile:
    """Read and validate a ``treeopt-acceptance-pair/1`` YAML file. Raises ProfileError (also if missing)."""
    doc, p = _load_yaml(path, "acceptance pair")
    return PairAcceptanceProfile.from_dict(doc, source=str(p), default_id=p.stem)


def save_pair_acceptance(path: str | Path, profile: PairAcceptanceProfile) -> Path:
    """Validate (by re-parsing) and write an acceptance pair profile atomically. Returns the path."""
    d = profile.to_dict()
    PairAcceptanceProfile.from_dict(d, source=str(path))
    return atomic_write_text(path, yaml.safe_dump(d, sort_keys=False, default_flow_style=None))


# ---------------------------------------------------------------------------------------------- latency
@dataclass(frozen=True)
class _Table:
    tokens: np.ndarray  # (k,) int64, strictly increasing
    ms: np.ndarray  # (k,) float64 medians
    spread_ms: np.ndarray | None  # (k,) or None


def _parse_table(raw: Any, value_key: str, where: str) -> _Table:
    if not isinstance(raw, dict):
        raise ProfileError(f"{where} must be a mapping with 'tokens' and {value_key!r}")
    _reject_wrong_units(raw, where)
    spread_key = value_key.replace("_ms", "_spread_ms")
    unknown = set(map(str, raw)) - {"tokens", value_key, spread_key}
    if unknown:
        raise ProfileError(f"{where}: unknown key {sorted(unknown)[0]!r} (expected tokens, {value_key}, {spread_key})")
    for key in ("tokens", value_key):
        if key not in raw:
            raise ProfileError(f"{where}: missing key {key!r}")
    tokens, values = raw["tokens"], raw[value_key]
    if not isinstance(tokens, list) or not tokens:
        raise ProfileError(f"{where}.tokens must be a non-empty list of token counts")
    if not isinstance(values, list) or len(values) != len(tokens):
        raise ProfileError(f"{where}.{value_key} must be a list as long as tokens ({len(tokens)})")
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ProfileError(f"{where}.tokens[{i}] = {t!r} must be an integer >= 1")
        check_integer(t, f"{where}.tokens[{i}]", low=1, high=MAX_TOKENS)
        if i and t <= tokens[i - 1]:
            raise ProfileError(f"{where}.tokens must be strictly increasing ({tokens[i - 1]} then {t})")
    ms = np.array([_number(v, f"{where}.{value_key}[{i}]", high=MAX_MS) for i, v in enumerate(values)])
    if value_key == "target_forward_ms" and np.any(ms == 0):  # a draft may be 0 ms (none profiled), not T(n)
        raise ProfileError(f"{where}.{value_key}[{int(np.argmax(ms == 0))}] = 0 must be positive (a target "
                           "forward takes time)")
    spread = None
    if raw.get(spread_key) is not None:
        s = raw[spread_key]
        if not isinstance(s, list) or len(s) != len(tokens):
            raise ProfileError(f"{where}.{spread_key} must be a list as long as tokens ({len(tokens)})")
        spread = np.array([_number(v, f"{where}.{spread_key}[{i}]", high=MAX_MS) for i, v in enumerate(s)])
    return _Table(np.asarray(tokens, dtype=np.int64), ms, spread)


def _ranges(rows: list[int], tokens) -> str:
    """Runs of adjacent measured points by their token counts: rows ``[4, 5, 6, 9]`` of tokens
    ``[1, 2, 4, 8, 9, 12, 16, 20, 25, 31]`` -> ``"9..16, 31"``."""
    parts, start = [], rows[0]
    for a, b in zip(rows, rows[1:] + [None]):
        if b != a + 1:
            parts.append(str(int(tokens[start])) if start == a else f"{int(tokens[start])}..{int(tokens[a])}")
            start = b
    return ", ".join(parts)


def check_cost_model(value: Any, where: str) -> str:
    """``value`` if it is one of :data:`DRAFT_COST_MODELS`, else ProfileError naming ``where`` and the choices."""
    if value not in DRAFT_COST_MODELS:
        raise ProfileError(f"{where} is {value!r}; expected one of {', '.join(DRAFT_COST_MODELS)}")
    return value


def _interp(table: _Table, n: float, what: str, src: str) -> float:
    lo, hi = int(table.tokens[0]), int(table.tokens[-1])
    if n > hi:
        raise ProfileError(
            f"{src}: {what} at {n:g} tokens would extrapolate past the largest measured count {hi} tokens; "
            "profile larger counts or lower the budget"
        )
    if n < lo:
        raise ProfileError(f"{src}: {what} at {n:g} tokens is below the smallest measured count {lo} tokens")
    return float(np.interp(n, table.tokens, table.ms))


@dataclass(frozen=True)
class LatencyCurve:
    """Latency model from a ``treeopt-latency/1`` profile: target forward T(n), draft forward c(w), overhead.

    Attributes:
        id: profile id (``id`` key or file stem).
        contexts: (C,) int64 increasing context lengths (tokens) that were measured.
        step_overhead_ms: fixed per-step cost in ms.
        device / model: the metadata mappings as stored.
        cost_model: the drafter's cost model, ``"per-level"`` or ``"one-pass"`` (:data:`DRAFT_COST_MODELS`;
            the draft tables' ``cost_model`` key, default ``"per-level"``); how
            :func:`~sequoia_opt.solver.hardware.step_cost` charges c.

    Raises:
        ProfileError: (construction) an unknown ``cost_model``.
    """

    id: str
    contexts: np.ndarray
    step_overhead_ms: float
    _target: tuple[_Table, ...] = field(repr=False)
    _draft: tuple[_Table, ...] = field(repr=False)
    device: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    example: bool = False
    source: str | None = None
    cost_model: str = DRAFT_COST_MODELS[0]
    engine_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_cost_model(self.cost_model, f"latency profile {self.id!r}: draft cost_model")

    @property
    def engine(self) -> str:
        """The engine that ran the forwards (``engine.name``); ``"treeopt"`` (the bundled decoder) when unnamed."""
        return str(self.engine_info.get("name") or "treeopt")

    def implausible_points(self) -> list[str]:
        """One line per table (target or draft, per context) whose forwards over n > 1 tokens take less than
        :data:`IMPLAUSIBLE_FRACTION` of the one-token forward, naming the points: such a curve makes large trees
        look nearly free. Empty for a plausible curve (or a table that did not measure n = 1)."""
        out = []
        for c, tables in zip(self.contexts, zip(self._target, self._draft)):
            for what, table in zip(("T", "c"), tables):
                tok, ms = table.tokens, table.ms
                if tok[0] != 1 or ms[0] <= 0:
                    continue
                low = [i for i in range(1, len(tok)) if ms[i] < IMPLAUSIBLE_FRACTION * ms[0]]
                if not low:
                    continue
                vals = [float(ms[i]) for i in low]
                span = f"{min(vals):.4g}" if min(vals) == max(vals) else f"{min(vals):.4g}..{max(vals):.4g}"
                out.append(f"{what}({_ranges(low, tok)}) = {span} ms at context {int(c)} is "
                           f"below {IMPLAUSIBLE_FRACTION:g} x {what}(1) = {float(ms[0]):.4g} ms: an implausible "
                           f"{'target' if what == 'T' else 'draft'} curve (noise or other load while profiling?); "
                           "re-measure before trusting trees solved from it")
        return out

    # -------------------------------------------------------------- queries
    def max_target_tokens(self, context: int | None = None) -> int:
        """Largest target token count measured at every context used for ``context`` (no extrapolation)."""
        return int(min(t.tokens[-1] for t in self._bracket(self._target, context)[0]))

    def max_draft_tokens(self, context: int | None = None) -> int:
        """Largest draft token count measured (no extrapolation past it)."""
        return int(min(t.tokens[-1] for t in self._bracket(self._draft, context)[0]))

    def _bracket(self, tables: tuple[_Table, ...], context: int | None) -> tuple[list[_Table], list[float]]:
        """Tables and weights (Python floats) for a context: exact match, or a linear mix of the two measured
        contexts around it. ProfileError outside the measured range (below the smallest as above the
        largest: the curve would describe another context than the one asked for)."""
        ctx = self.contexts
        if context is None:
            return [tables[0]], [1.0]
        c = float(context)
        if not math.isfinite(c) or c < 0:
            raise ProfileError(f"context length must be a non-negative number of tokens, got {context!r}")
        if c > ctx[-1]:
            raise ProfileError(
                f"latency profile {self.id!r}: context {context} tokens is beyond the largest measured "
                f"context {int(ctx[-1])} tokens; refusing to extrapolate"
            )
        if c < ctx[0]:
            raise ProfileError(
                f"latency profile {self.id!r}: context {context} tokens is below the smallest measured "
                f"context {int(ctx[0])} tokens; refusing to extrapolate (profile it: treeopt profile latency "
                f"--context {int(c)},...)"
            )
        j = int(np.searchsorted(ctx, c))
        if ctx[j] == c:
            return [tables[j]], [1.0]
        w = float((c - ctx[j - 1]) / (ctx[j] - ctx[j - 1]))
        return [tables[j - 1], tables[j]], [1.0 - w, w]

    def target_ms(self, n: float, context: int | None = None) -> float:
        """T(n): ms for one target forward over n tokens at ``context`` tokens of context (default: the
        smallest measured). Linear interpolation between measured counts and contexts.

        Raises ProfileError when n or the context is outside the measured range.
        """
        tabs, ws = self._bracket(self._target, context)
        return sum(w * _interp(t, n, "target forward", f"latency profile {self.id!r}") for t, w in zip(tabs, ws))

    def draft_ms(self, w: float, context: int | None = None) -> float:
        """c(w): ms for one draft forward over w tokens; same interpolation and refusal as :meth:`target_ms`."""
        tabs, ws = self._bracket(self._draft, context)
        return sum(k * _interp(t, w, "draft forward", f"latency profile {self.id!r}") for t, k in zip(tabs, ws))

    def target_tokens(self, context: int | None = None) -> np.ndarray:
        """Measured target token counts at the (first) table used for ``context``."""
        return self._bracket(self._target, context)[0][0].tokens.copy()

    # -------------------------------------------------------------- io
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"format": LATENCY_FORMAT, "id": self.id}
        if self.example:
            d["example"] = True
        if self.source:
            d["source"] = self.source
        d["device"] = _plain(dict(self.device))
        d["model"] = _plain(dict(self.model))
        if self.engine_info:
            d["engine"] = _plain(dict(self.engine_info))
        d["step_overhead_ms"] = float(self.step_overhead_ms)
        curves = []
        for c, t, dr in zip(self.contexts, self._target, self._draft):
            tt: dict[str, Any] = {"tokens": t.tokens.tolist(), "target_forward_ms": t.ms.tolist()}
            if t.spread_ms is not None:
                tt["target_forward_spread_ms"] = t.spread_ms.tolist()
            dd: dict[str, Any] = {"cost_model": self.cost_model, "tokens": dr.tokens.tolist(),
                                  "draft_forward_ms": dr.ms.tolist()}
            if dr.spread_ms is not None:
                dd["draft_forward_spread_ms"] = dr.spread_ms.tolist()
            curves.append({"context_tokens": int(c), "target": tt, "draft": dd})
        d["curves"] = curves
        return d

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *, source: str = "latency profile", default_id: str = "latency",
                  check_plausible: bool = True) -> "LatencyCurve":
        """Validate a parsed ``treeopt-latency/1`` mapping. Raises ProfileError with one line; warns
        (:class:`~sequoia_opt.errors.ProfileWarning`, one per table, naming the points) about an implausible
        curve (:meth:`implausible_points`) unless ``check_plausible`` is False."""
        _check_format(doc, LATENCY_FORMAT, source)
        _reject_wrong_units(doc, source)
        if "step_overhead_ms" not in doc:
            raise ProfileError(f"{source}: missing key 'step_overhead_ms' (use 0 if not measured)")
        overhead = _number(doc["step_overhead_ms"], f"{source}: step_overhead_ms", high=MAX_MS)
        curves = doc.get("curves")
        if not isinstance(curves, list) or not curves:
            raise ProfileError(f"{source}: 'curves' must be a non-empty list (one entry per context length)")
        contexts, targets, drafts, cost_models = [], [], [], []
        for i, cur in enumerate(curves):
            where = f"{source}: curves[{i}]"
            if not isinstance(cur, dict):
                raise ProfileError(f"{where} must be a mapping")
            _reject_wrong_units(cur, where)
            c = cur.get("context_tokens")
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise ProfileError(f"{where}.context_tokens = {c!r} must be a non-negative integer")
            check_integer(c, f"{where}.context_tokens", high=MAX_TOKENS)
            if contexts and c <= contexts[-1]:
                raise ProfileError(f"{where}: context_tokens must be strictly increasing ({contexts[-1]} then {c})")
            contexts.append(c)
            if "target" not in cur or "draft" not in cur:
                raise ProfileError(f"{where} needs both a 'target' and a 'draft' table")
            targets.append(_parse_table(cur["target"], "target_forward_ms", f"{where}.target"))
            draft = cur["draft"]
            if isinstance(draft, dict):  # the cost model, default per-level, one for every curve
                cost_models.append(check_cost_model(draft.get("cost_model", DRAFT_COST_MODELS[0]),
                                                    f"{where}.draft.cost_model"))
                if cost_models[-1] != cost_models[0]:
                    raise ProfileError(f"{where}.draft.cost_model is {cost_models[-1]!r} but curves[0]'s is "
                                       f"{cost_models[0]!r} (a missing key reads as {DRAFT_COST_MODELS[0]!r}); "
                                       "one drafter has one cost model")
                draft = {k: v for k, v in draft.items() if k != "cost_model"}
            drafts.append(_parse_table(draft, "draft_forward_ms", f"{where}.draft"))
        device = doc.get("device") or {}
        model = doc.get("model") or {}
        if not isinstance(device, dict) or not isinstance(model, dict):
            raise ProfileError(f"{source}: 'device' and 'model' must be mappings")
        pid = doc.get("id", default_id)
        if not isinstance(pid, str) or not pid:
            raise ProfileError(f"{source}: 'id' must be a non-empty string")
        engine = doc.get("engine") or {}
        if not isinstance(engine, dict) or (engine and not (isinstance(engine.get("name"), str)
                                                            and engine["name"].strip())):
            raise ProfileError(f"{source}: 'engine' must be a mapping with a non-empty 'name' (treeopt, llama.cpp, "
                               f"sglang, vllm), got {engine!r}")
        curve = cls(
            id=pid,
            contexts=np.asarray(contexts, dtype=np.int64),
            step_overhead_ms=overhead,
            _target=tuple(targets),
            _draft=tuple(drafts),
            device=dict(device),
            model=dict(model),
            example=_flag(doc, "example", source),
            source=doc.get("source"),
            cost_model=cost_models[0] if cost_models else DRAFT_COST_MODELS[0],
            engine_info=dict(engine),
        )
        if check_plausible:
            import warnings

            for msg in curve.implausible_points():
                warnings.warn(f"{source}: {msg}", ProfileWarning, stacklevel=2)
        return curve

    @classmethod
    def synthetic(
        cls,
        target: Mapping[int, float],
        draft: Mapping[int, float],
        *,
        step_overhead_ms: float = 0.0,
        context: int = 0,
        id: str = "synthetic",
        cost_model: str = DRAFT_COST_MODELS[0],
    ) -> "LatencyCurve":
        """A one-context curve from ``{tokens: ms}`` mappings (tests, examples), its draft table declaring
        ``cost_model``. Validated like a file."""
        t = sorted(target.items())
        d = sorted(draft.items())
        doc = {
            "format": LATENCY_FORMAT,
            "id": id,
            "example": True,
            "step_overhead_ms": step_overhead_ms,
            "curves": [
                {
                    "context_tokens": context,
                    "target": {"tokens": [k for k, _ in t], "target_forward_ms": [v for _, v in t]},
                    "draft": {"cost_model": cost_model, "tokens": [k for k, _ in d],
                              "draft_forward_ms": [v for _, v in d]},
                }
            ],
        }
        return cls.from_dict(doc, source=f"synthetic curve {id!r}", default_id=id, check_plausible=False)


def load_latency(path: str | Path) -> LatencyCurve:
    """Read and validate a ``treeopt-latency/1`` YAML file. Raises ProfileError (also if missing)."""
    doc, p = _load_yaml(path, "latency")
    return LatencyCurve.from_dict(doc, source=str(p), default_id=p.stem)


def save_latency(path: str | Path, curve: LatencyCurve) -> Path:
    """Write a latency profile atomically (validated by re-parsing first). Returns the path."""
    d = curve.to_dict()
    LatencyCurve.from_dict(d, source=str(path))
    return atomic_write_text(path, yaml.safe_dump(d, sort_keys=False, default_flow_style=None))


# ---------------------------------------------------------------------------------------------- mismatch
_DEVICE_TYPE = re.compile(r"(cpu|cuda|mps|xpu|hip)(:\d+)?")


def same_device(recorded: Any, name: Any, device_type: str | None = None) -> bool:
    """Whether a profile's recorded device is the device ``name`` (of torch type ``device_type``). Profiles
    record the device's name (``sequoia_opt.device.device_name``: the CPU model, the GPU's name); files
    written before acceptance profiles did hold its type (``cpu``, ``cuda:0``), which matches every device of
    that type (one device, one name: "cpu" and "AMD EPYC 7B13" are the same machine). Names compare without
    case or surrounding blanks.
    """
    r, n = str(recorded).strip().lower(), str(name).strip().lower()
    r_type, n_type = _DEVICE_TYPE.fullmatch(r), _DEVICE_TYPE.fullmatch(n)
    if r_type and n_type:
        return r_type.group(1) == n_type.group(1)
    if r_type:
        return device_type is None or r_type.group(1) == device_type.strip().lower().split(":")[0]
    if n_type:
        return True  # the caller knows only the type: a name cannot be told apart from it
    return r == n


def warn_on_mismatch(
    *,
    acceptance: AcceptanceProfile | None = None,
    latency: LatencyCurve | None = None,
    device: str | None = None,
    dtype: str | None = None,
    target: str | None = None,
    draft: str | None = None,
    device_type: str | None = None,
) -> list[str]:
    """Warnings (strings, one per problem) when the profiles were measured on another device / dtype / model
    pair than the one in use, or disagree with each other. Values that are unknown on either side are not
    compared. ``device`` is the device's name (``sequoia_opt.device.device_name``), ``device_type`` its torch
    type (``cpu``, ``cuda``), for profiles that recorded only a type (:func:`same_device`). Returns ``[]``
    when everything matches.
    """
    out: list[str] = []

    def cmp(label: str, have: Any, want: Any, pid: str) -> None:
        if have is None or want is None:
            return
        if label == "device":
            differs = not same_device(have, want, device_type)
        else:
            differs = str(have).strip().lower() != str(want).strip().lower()
        if differs:
            out.append(f"profile {pid!r} was measured with {label} {have!r}, but this run uses {want!r}")

    if acceptance is not None:
        m = acceptance.measured
        cmp("target", m.get("target"), target, acceptance.id)
        cmp("draft", m.get("draft"), draft, acceptance.id)
        cmp("device", m.get("device"), device, acceptance.id)
        cmp("dtype", m.get("dtype"), dtype, acceptance.id)
        if acceptance.example:
            out.append(f"acceptance profile {acceptance.id!r} is EXAMPLE data, not a measurement")
    if latency is not None:
        cmp("device", latency.device.get("name"), device, latency.id)
        cmp("dtype", latency.device.get("dtype"), dtype, latency.id)
        cmp("target", latency.model.get("target"), target, latency.id)
        cmp("draft", latency.model.get("draft"), draft, latency.id)
        if latency.example:
            out.append(f"latency profile {latency.id!r} is EXAMPLE data, not a measurement")
    if acceptance is not None and latency is not None:
        for key, lk in (("target", "target"), ("draft", "draft")):
            a, b = acceptance.measured.get(key), latency.model.get(lk)
            if a is not None and b is not None and str(a).lower() != str(b).lower():
                out.append(f"the acceptance profile's {key} {a!r} differs from the latency profile's {b!r}")
        a_cost = acceptance.measured.get("draft_cost_model")
        if a_cost is not None and str(a_cost) != latency.cost_model:
            out.append(f"the acceptance profile's drafter has cost model {a_cost!r} but the latency profile charges "
                       f"{latency.cost_model!r}: the predicted cost is that of another kind of drafter")
    return out
