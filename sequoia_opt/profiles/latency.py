"""The latency profile, ``treeopt-latency/1`` (the format: :mod:`sequoia_opt.profiles`): T(n) per context, the
drafter's c(w) and cost model, the step overhead, the engine that ran the forwards (:class:`LatencyCurve`)."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .._io import atomic_write_text, document_text, warn_unknown_keys
from ..errors import ProfileError, ProfileWarning
from .common import (DRAFT_COST_MODELS, IMPLAUSIBLE_FRACTION, IMPLAUSIBLE_GROWTH, LATENCY_CURVE_KEYS, LATENCY_FORMAT,
                     LATENCY_KEYS, MAX_MS, MAX_TOKENS, _check_format, _flag, _load_yaml, _number, _plain,
                     _reject_wrong_units, check_integer)

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


#: The policies whose loop steps a latency profile may record (:mod:`sequoia_opt.profiling.steps`).
LOOP_POLICIES = ("static", "chain")


@dataclass(frozen=True)
class _Loop:
    """The decoding loop's own step times at one context (``loop`` of a curve; :mod:`sequoia_opt.profiling.steps`)."""

    policy: str
    tokens: np.ndarray  # (k,) int64 tree sizes, strictly increasing, the first 1 (plain decoding)
    verify_ms: np.ndarray  # (k,) float64
    bookkeeping_ms: np.ndarray  # (k,) float64
    draft_extra_ms: float  # per draft forward
    draft_step_extra_ms: float = 0.0  # once per step that drafts (0 in profiles written before it was measured)


def _parse_rows(raw: Any, where: str) -> tuple[int, ...]:
    """A curve's ``row_context_tokens``: a non-empty list of token counts, one per row."""
    if not isinstance(raw, list) or not raw:
        raise ProfileError(f"{where} must be a non-empty list of token counts, one per row")
    rows = tuple(check_integer(x, f"{where}[{i}]", high=MAX_TOKENS) for i, x in enumerate(raw))
    if list(rows) != sorted(rows):
        raise ProfileError(f"{where} must be ascending (the rows' contexts, shortest first), got {list(rows)}")
    return rows


def _parse_loop(raw: Any, where: str) -> _Loop:
    if not isinstance(raw, dict):
        raise ProfileError(f"{where} must be a mapping with policy, tokens, verify_ms, bookkeeping_ms, draft_extra_ms")
    _reject_wrong_units(raw, where)
    keys = {"policy", "tokens", "verify_ms", "bookkeeping_ms", "draft_extra_ms"}
    optional = {"draft_step_extra_ms"}
    unknown = set(map(str, raw)) - keys - optional
    if unknown:
        raise ProfileError(f"{where}: unknown key {sorted(unknown)[0]!r} "
                           f"(expected {', '.join(sorted(keys | optional))})")
    missing = keys - set(map(str, raw))
    if missing:
        raise ProfileError(f"{where}: missing key {sorted(missing)[0]!r}")
    if raw["policy"] not in LOOP_POLICIES:
        raise ProfileError(f"{where}.policy is {raw['policy']!r}; expected one of {', '.join(LOOP_POLICIES)}")
    tokens = raw["tokens"]
    if not isinstance(tokens, list) or not tokens or tokens[0] != 1:
        raise ProfileError(f"{where}.tokens must list tree sizes from 1 (plain decoding), strictly increasing")
    for i, t in enumerate(tokens):
        check_integer(t, f"{where}.tokens[{i}]", low=1, high=MAX_TOKENS)
        if i and t <= tokens[i - 1]:
            raise ProfileError(f"{where}.tokens must be strictly increasing ({tokens[i - 1]} then {t})")
    cols = {}
    for key in ("verify_ms", "bookkeeping_ms"):
        v = raw[key]
        if not isinstance(v, list) or len(v) != len(tokens):
            raise ProfileError(f"{where}.{key} must be a list as long as tokens ({len(tokens)})")
        cols[key] = np.array([_number(x, f"{where}.{key}[{i}]", positive=key == "verify_ms", high=MAX_MS)
                              for i, x in enumerate(v)])
    extra = _number(raw["draft_extra_ms"], f"{where}.draft_extra_ms", high=MAX_MS)
    step_extra = _number(raw.get("draft_step_extra_ms", 0.0), f"{where}.draft_step_extra_ms", high=MAX_MS)
    return _Loop(raw["policy"], np.asarray(tokens, dtype=np.int64), cols["verify_ms"], cols["bookkeeping_ms"], extra,
                 step_extra)


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
        date: when it was measured (the ``date`` key, ISO 8601 text; None in a file without one).

    A batch profile's curve at b rows may have timed its rows at different contexts (each curve entry's
    ``row_context_tokens``, :func:`~sequoia_opt.profiling.batch.row_contexts`): :meth:`row_contexts` says which.

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
    _loop: tuple[_Loop | None, ...] = field(default=(), repr=False)
    date: str | None = None
    _rows: tuple[tuple[int, ...] | None, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        check_cost_model(self.cost_model, f"latency profile {self.id!r}: draft cost_model")
        if not self._loop:
            object.__setattr__(self, "_loop", (None,) * len(self.contexts))
        if not self._rows:
            object.__setattr__(self, "_rows", (None,) * len(self.contexts))

    def row_contexts(self, context: int) -> list[int] | None:
        """The contexts (tokens, one per row, ascending) the rows of the curve at ``context`` were timed at where the
        profile recorded them (:func:`~sequoia_opt.profiling.batch.row_contexts`; a batch-1 curve of such a profile
        records ``[context]``); None where it did not (every row held ``context``) or ``context`` was not
        measured."""
        i = self._context_index(context)
        return None if i is None or self._rows[i] is None else list(self._rows[i])

    def _context_index(self, context: int) -> int | None:
        """The index of ``context`` in :attr:`contexts`, None where it was not measured."""
        hit = np.flatnonzero(self.contexts == int(context))
        return int(hit[0]) if hit.size else None

    # -------------------------------------------------------------- the loop's step (issue 31)
    def has_loop(self, context: int | None = None) -> bool:
        """Whether the decoding loop's own steps were timed at every context ``context`` is read from
        (:mod:`sequoia_opt.profiling.steps`); without, the step is T(n) + c(w) + ``step_overhead_ms``."""
        tabs, _ = self._bracket(self._loop, context)
        return all(t is not None for t in tabs)

    @property
    def loop_policy(self) -> str | None:
        """The policy whose loop steps were timed (``static`` / ``chain``), None when none were."""
        return next((t.policy for t in self._loop if t is not None), None)

    def loop_policy_at(self, context: int | None) -> str | None:
        """The policy whose loop steps were timed at ``context`` (the tables it is read from: that context's, or the
        two measured around it; None: the smallest measured), None when none were there. A batch profile that kept
        another ``--context``'s curves (:meth:`~sequoia_opt.profiles.batch.BatchLatencyProfile.keeping`) may hold
        another policy's loop at another context.

        Raises:
            ProfileError: ``context`` outside the measured contexts (as every read at a context).
        """
        tabs, _ = self._bracket(self._loop, context)
        return next((t.policy for t in tabs if t is not None), None)

    def _loop_at(self, key: str, n: float, context: int | None) -> float:
        tabs, ws = self._bracket(self._loop, context)
        out = 0.0
        for t, w in zip(tabs, ws):
            lo, hi = int(t.tokens[0]), int(t.tokens[-1])
            if not lo <= n <= hi:
                raise ProfileError(f"latency profile {self.id!r}: the loop's step at {n:g} tokens is outside the timed "
                                   f"sizes {lo}..{hi}; refusing to extrapolate")
            out += w * float(np.interp(n, t.tokens, getattr(t, key)))
        return out

    def step_target_ms(self, n: float, context: int | None = None) -> float:
        """What a step of n tree tokens spends verifying (ms): the loop's timed verify part when the profile has one
        (:meth:`has_loop`), else T(n). Raises ProfileError outside the measured range."""
        return self._loop_at("verify_ms", n, context) if self.has_loop(context) else self.target_ms(n, context)

    def step_overhead(self, n: float, context: int | None = None) -> float:
        """A step's bookkeeping (ms): the loop's timed bookkeeping at n tree tokens, else ``step_overhead_ms``."""
        return self._loop_at("bookkeeping_ms", n, context) if self.has_loop(context) else self.step_overhead_ms

    def _loop_extra(self, key: str, context: int | None) -> float:
        """A loop's draft extra (``key``, a :class:`_Loop` field) at ``context``, 0 without a timed loop."""
        if not self.has_loop(context):
            return 0.0
        tabs, ws = self._bracket(self._loop, context)
        return sum(w * getattr(t, key) for t, w in zip(tabs, ws))

    def draft_extra_ms(self, context: int | None = None) -> float:
        """Per draft forward, what the loop adds to c(w) (ms; 0 without a timed loop)."""
        return self._loop_extra("draft_extra_ms", context)

    def draft_step_extra_ms(self, context: int | None = None) -> float:
        """Once per step that drafts, what the loop adds to its first draft forward beyond ``draft_extra_ms`` (ms;
        the draft's weights reloaded after the target's forward: :func:`~sequoia_opt.profiling.steps.draft_extras`;
        0 without a timed loop or in a profile written before it was measured)."""
        return self._loop_extra("draft_step_extra_ms", context)

    def step_draft_ms(self, forwards: Sequence[float], context: int | None = None) -> float:
        """A step's draft time (ms) for its draft forwards' token counts ``forwards`` (in order; empty: the step
        does not draft): ``sum of c(w)``, plus with a timed loop ``draft_extra_ms`` per forward and
        ``draft_step_extra_ms`` once. Raises ProfileError for a width outside the measured c (no extrapolation)."""
        if not len(forwards):
            return 0.0
        return (sum(self.draft_ms(w, context) for w in forwards) + len(forwards) * self.draft_extra_ms(context)
                + self.draft_step_extra_ms(context))

    @property
    def engine(self) -> str:
        """The engine that ran the forwards (``engine.name``); ``"treeopt"`` (the bundled decoder) when unnamed."""
        return str(self.engine_info.get("name") or "treeopt")

    def implausible_points(self) -> list[str]:
        """One line per table (target or draft, per context) whose forwards over n > 1 tokens take less than
        :data:`IMPLAUSIBLE_FRACTION` of the one-token forward, naming the points: such a curve makes large trees
        look nearly free; and one per target table where a forward takes more than
        :data:`IMPLAUSIBLE_GROWTH` x what its extra tokens explain over the one measured before it (a forward over
        n tokens costs at most about n / m x the one over m < n: a point typed 10x too low or too high makes a
        hole in a plan). Empty for a plausible curve."""
        out = []
        for c, tables in zip(self.contexts, zip(self._target, self._draft)):
            at = f" at context {int(c)}" if len(self.contexts) > 1 else ""  # one table: no context to name
            for what, table in zip(("T", "c"), tables):
                tok, ms = table.tokens, table.ms
                low = [i for i in range(1, len(tok)) if ms[i] < IMPLAUSIBLE_FRACTION * ms[0]] \
                    if tok[0] == 1 and ms[0] > 0 else []
                if low:
                    vals = [float(ms[i]) for i in low]
                    span = f"{min(vals):.4g}" if min(vals) == max(vals) else f"{min(vals):.4g}..{max(vals):.4g}"
                    out.append(f"{what}({_ranges(low, tok)}) = {span} ms{at} is below {IMPLAUSIBLE_FRACTION:g} x "
                               f"{what}(1) ({what}(1) = {float(ms[0]):.4g} ms): an implausible "
                               f"{'target' if what == 'T' else 'draft'} curve (noise or other load while profiling?); "
                               "re-measure before trusting what is solved from it")
                    continue
                if what == "c":  # a draft's c(w) may be ~0 (n-grams): its ratios say nothing
                    continue
                for i in range(1, len(tok)):
                    grow = float(tok[i] / tok[i - 1])
                    # a jump, at one point only: the low side a single point (the first, or a dip) or the high side
                    # (a spike). A level shift (CUDA graphs up to 256 tokens, eager past them) is not one
                    lone = (i == 1 or ms[i - 2] > 2.0 * ms[i - 1]) or (i + 1 < len(tok) and ms[i + 1] < 0.5 * ms[i])
                    if ms[i - 1] > 0 and ms[i] > IMPLAUSIBLE_GROWTH * grow * ms[i - 1] and lone:
                        out.append(f"T({int(tok[i])}) = {float(ms[i]):.4g} ms{at} is {float(ms[i] / ms[i - 1]):.1f} x "
                                   f"T({int(tok[i - 1])}) = {float(ms[i - 1]):.4g} ms, far more than {grow:g} x the "
                                   "tokens explain: one of the two is implausible (a typo, noise or other load while "
                                   "profiling?); correct or re-measure it before trusting what is solved from it")
                        break
        return out

    # -------------------------------------------------------------- queries
    def max_target_tokens(self, context: int | None = None) -> int:
        """Largest target token count measured at every context used for ``context`` (no extrapolation), and
        timed in the loop there when the profile timed it (:meth:`has_loop`)."""
        top = int(min(t.tokens[-1] for t in self._bracket(self._target, context)[0]))
        if self.has_loop(context):
            top = min(top, int(min(t.tokens[-1] for t in self._bracket(self._loop, context)[0])))
        return top

    def target_points(self, context: int) -> tuple[np.ndarray, np.ndarray]:
        """The target table measured at exactly ``context``: tokens (N,) int64 and T (N,) ms.

        Raises:
            ProfileError: ``context`` is not one of :attr:`contexts`.
        """
        i = self._context_index(context)
        if i is None:
            raise ProfileError(f"latency profile {self.id!r} measured contexts {self.contexts.tolist()}, not {context}")
        t = self._target[i]
        return t.tokens, t.ms

    def max_draft_tokens(self, context: int | None = None) -> int:
        """Largest draft token count measured (no extrapolation past it)."""
        return int(min(t.tokens[-1] for t in self._bracket(self._draft, context)[0]))

    def min_draft_tokens(self, context: int | None = None) -> int:
        """Smallest draft token count measured (no extrapolation below it; 1 for a profile ``treeopt profile``
        wrote, larger for a hand-made or engine table that starts at a block size)."""
        return int(max(t.tokens[0] for t in self._bracket(self._draft, context)[0]))

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
        """The ``treeopt-latency/1`` file mapping (:meth:`from_dict` reads it back): ``id``, ``example`` / ``source``
        / ``date`` when set, ``device``, ``model``, ``engine`` when set, ``step_overhead_ms`` (ms), and per measured
        context (``context_tokens``) the target table (token counts n, T(n) in ms, spreads when measured), the draft
        table (its ``cost_model``, widths w, c(w) in ms) and the loop's timed steps when measured."""
        d: dict[str, Any] = {"format": LATENCY_FORMAT, "id": self.id}
        if self.example:
            d["example"] = True
        if self.source:
            d["source"] = self.source
        if self.date:
            d["date"] = self.date
        d["device"] = _plain(dict(self.device))
        d["model"] = _plain(dict(self.model))
        if self.engine_info:
            d["engine"] = _plain(dict(self.engine_info))
        d["step_overhead_ms"] = float(self.step_overhead_ms)
        curves = []
        for c, t, dr, lp, rows in zip(self.contexts, self._target, self._draft, self._loop, self._rows):
            tt: dict[str, Any] = {"tokens": t.tokens.tolist(), "target_forward_ms": t.ms.tolist()}
            if t.spread_ms is not None:
                tt["target_forward_spread_ms"] = t.spread_ms.tolist()
            dd: dict[str, Any] = {"cost_model": self.cost_model, "tokens": dr.tokens.tolist(),
                                  "draft_forward_ms": dr.ms.tolist()}
            if dr.spread_ms is not None:
                dd["draft_forward_spread_ms"] = dr.spread_ms.tolist()
            curves.append({"context_tokens": int(c), "target": tt, "draft": dd})
            if rows is not None:
                curves[-1]["row_context_tokens"] = list(rows)
            if lp is not None:
                curves[-1]["loop"] = {"policy": lp.policy, "tokens": lp.tokens.tolist(),
                                      "verify_ms": lp.verify_ms.tolist(), "bookkeeping_ms": lp.bookkeeping_ms.tolist(),
                                      "draft_extra_ms": float(lp.draft_extra_ms),
                                      "draft_step_extra_ms": float(lp.draft_step_extra_ms)}
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
        warn_unknown_keys(doc, LATENCY_KEYS, source)
        if "step_overhead_ms" not in doc:
            raise ProfileError(f"{source}: missing key 'step_overhead_ms' (use 0 if not measured)")
        overhead = _number(doc["step_overhead_ms"], f"{source}: step_overhead_ms", high=MAX_MS)
        curves = doc.get("curves")
        if not isinstance(curves, list) or not curves:
            raise ProfileError(f"{source}: 'curves' must be a non-empty list (one entry per context length)")
        contexts, targets, drafts, cost_models, loops, spreads = [], [], [], [], [], []
        for i, cur in enumerate(curves):
            where = f"{source}: curves[{i}]"
            if not isinstance(cur, dict):
                raise ProfileError(f"{where} must be a mapping")
            _reject_wrong_units(cur, where)
            warn_unknown_keys(cur, LATENCY_CURVE_KEYS, where)
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
            loops.append(_parse_loop(cur["loop"], f"{where}.loop") if cur.get("loop") is not None else None)
            spreads.append(_parse_rows(cur["row_context_tokens"], f"{where}.row_context_tokens")
                           if cur.get("row_context_tokens") is not None else None)
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
            _loop=tuple(loops),
            date=_date_text(doc.get("date"), source),
            _rows=tuple(spreads),
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


def _date_text(value: Any, source: str) -> str | None:
    """A profile's ``date`` as ISO 8601 text: a string as written, a date YAML read from an unquoted timestamp as its
    ``isoformat()``; None when absent. Raises ProfileError (one line) for anything else."""
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    raise ProfileError(f"{source}: 'date' must be a date (ISO 8601 text), got {value!r}")


def load_latency(path: str | Path) -> LatencyCurve:
    """Read and validate a ``treeopt-latency/1`` YAML file. Raises ProfileError (also if missing)."""
    doc, p = _load_yaml(path, "latency")
    return LatencyCurve.from_dict(doc, source=str(p), default_id=p.stem)


def save_latency(path: str | Path, curve: LatencyCurve) -> Path:
    """Write a latency profile atomically (validated by re-parsing first; its implausible points are not warned of
    again: the curve's maker and every reader of the file say them). Returns the path."""
    d = curve.to_dict()
    LatencyCurve.from_dict(d, source=str(path), check_plausible=False)
    return atomic_write_text(path, document_text(path, d))
