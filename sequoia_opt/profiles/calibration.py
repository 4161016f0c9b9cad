"""The calibration profile: how well a drafter's draft probability predicts acceptance, and the draft trees
it was measured on (``format: treeopt-calibration/1``).

A dynamic tree (:mod:`sequoia_opt.dynamic`) is chosen from draft probabilities, so its value model is not a
positional acceptance vector but a *calibration*: the probability that a candidate is accepted (given its
parent was reached) as a function of its draft probability q. Measured on recorded steps
(:func:`~sequoia_opt.profiling.calibration.measure_calibration`): each step the drafter grows a wide EAGLE-2
tree (``recording.steps`` levels, ``recording.topk`` children per node and frontier width), and the target
verifies every node of it in one forward, which gives, for every candidate, the target's probability of that
token at its parent: its acceptance given the parent is reached (greedy: 1 when it is the target's argmax,
else 0; sampling: the target's p of it, since the verifier emits a token distributed as p and accepts a
candidate exactly when it emits that token).

The tables are *reach-weighted*: a candidate counts with the probability that its parent is reached (the
product of the acceptances on the parent's root path; greedy: 1 when the parent is on the target's own path,
else 0). That makes ``acceptance`` the conditional the issue asks for, P(accepted | parent reached), measured
on the contexts a tree's value really multiplies; an unweighted pool also counts children of rejected
candidates, whose prefix the target never continues, and under-predicted tokens/step by 4 % on the demo pair
(the recorded acceptances themselves: 1.84; unweighted calibration: 1.77; reach-weighted: 1.85).

YAML::

    format: treeopt-calibration/1
    id: smollm2-135m__draft_greedy
    measured: {target: ..., draft: ..., device: cpu, dtype: float32, temperature: 0.0, top_p: 1.0,
               prompts_file: ..., num_prompts: 20, max_new_tokens: 64, seed: 0, date: ...,
               recording: {steps: 5, topk: 6}, draft_probability: "softmax at temperature 1"}
    ece: 0.041                       # expected calibration error over the bins, reach-weighted (derived)
    candidates: 28150                # non-root nodes of all recorded steps (derived)
    bins:                            # the reliability table (derived from steps; checked on load)
      - {low: 0.0, high: 0.02, count: 4148, reached: 535.0, accepted: 11.8, mean_draft_prob: 0.011,
         acceptance: 0.022, ci_low: 0.012, ci_high: 0.038}
      ...
    by_rank: [{rank: 0, count: ..., accepted: ..., mean_draft_prob: ..., acceptance: ...}, ...]
    by_depth: [{depth: 1, ...}, ...]
    steps:                           # the recorded draft trees, one per decoding step, creation order
      - {parent: [-1, 0, 0, 1, ...], prob: [1.0, 0.71, ...], rank: [0, 0, 1, 0, ...],
         accept: [1.0, 1.0, 0.0, ...], entropy: [1.93, 0.88, null, ...]}   # null: a node not expanded

The bins, ranks and depths are views of ``steps`` (``count`` adds up to ``candidates`` and ``reached`` to the
same total in each); the file stores
them for readers and the loader refuses a file whose tables disagree with its steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .._io import atomic_write_text, document_text, warn_unknown_keys
from ..errors import ProfileError, SolverError
from .checks import weights_mismatch
from .common import MAX_TOKENS, _check_format, _check_sampling, _load_yaml, check_integer, wilson_interval

__all__ = ["CALIBRATION_FORMAT", "DEFAULT_EDGES", "RecordedStep", "CalibrationProfile", "load_calibration",
           "save_calibration"]

CALIBRATION_FORMAT = "treeopt-calibration/1"

#: the top-level keys of a calibration profile (others are warned of: a misspelt key was ignored)
CALIBRATION_KEYS = ("format", "id", "measured", "ece", "candidates", "edges", "bins", "by_rank", "by_depth", "steps")

#: Bin edges of the reliability table over the draft probability (finer where most candidates are).
DEFAULT_EDGES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

#: Bins with fewer candidates than this are left out of the calibration curve (:meth:`acceptance_of`).
MIN_BIN_COUNT = 10


@dataclass
class RecordedStep:
    """One recorded draft tree (n nodes, creation order, the root first).

    Attributes:
        parent: (n,) int parent index (-1 for the root).
        prob: (n,) float the draft probability of the node's token under its parent (1 for the root).
        rank: (n,) int the node's rank among its parent's candidates (0 = best).
        accept: (n,) float its acceptance given the parent is reached (the target's probability of its token
            there; greedy 0 or 1; the root 1).
        entropy: (n,) float the draft entropy (nats) at nodes the drafter ran over; NaN elsewhere.
    """

    parent: np.ndarray
    prob: np.ndarray
    rank: np.ndarray
    accept: np.ndarray
    entropy: np.ndarray
    _children: list[list[int]] | None = field(default=None, repr=False)
    _depth: np.ndarray | None = field(default=None, repr=False)
    _reach: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # the precision the file keeps, so that a profile's tables are the same before and after a round trip
        self.prob, self.accept = np.round(self.prob, 6), np.round(self.accept, 6)
        self.entropy = np.round(self.entropy, 4)
        n = len(self.parent)
        for name in ("prob", "rank", "accept", "entropy"):
            if len(getattr(self, name)) != n:
                raise ProfileError(f"a recorded step has {n} parents but {len(getattr(self, name))} {name} values")
        if n == 0 or self.parent[0] != -1 or any(not 0 <= int(p) < i for i, p in enumerate(self.parent[1:], 1)):
            raise ProfileError("a recorded step's parents must list the root first (-1) and every parent before "
                               "its children")
        if not (np.all((self.prob >= 0) & (self.prob <= 1)) and np.all((self.accept >= 0) & (self.accept <= 1))):
            raise ProfileError("a recorded step's prob and accept values must be probabilities in [0, 1]")

    @property
    def n(self) -> int:
        """Nodes in the recorded tree, root included."""
        return len(self.parent)

    @property
    def children(self) -> list[list[int]]:
        """Per node its children, by rank."""
        if self._children is None:
            ch: list[list[int]] = [[] for _ in range(self.n)]
            for i in range(1, self.n):
                ch[int(self.parent[i])].append(i)
            self._children = [sorted(c, key=lambda i: int(self.rank[i])) for c in ch]
        return self._children

    @property
    def reach(self) -> np.ndarray:
        """(n,) the probability that each node is reached: the product of ``accept`` along its root path (the
        root 1; greedy 0 or 1: the node is on the target's own path)."""
        if self._reach is None:
            r = np.ones(self.n)
            for i in range(1, self.n):
                r[i] = r[int(self.parent[i])] * self.accept[i]
            self._reach = r
        return self._reach

    @property
    def depth(self) -> np.ndarray:
        """(n,) int64 each node's depth (0 for the root), computed once from ``parent``."""
        if self._depth is None:
            d = np.zeros(self.n, dtype=np.int64)
            for i in range(1, self.n):
                d[i] = d[int(self.parent[i])] + 1
            self._depth = d
        return self._depth

    def to_dict(self) -> dict[str, Any]:
        """The file's step mapping (:meth:`from_dict` reads it back): parent and rank as ints, prob and accept rounded
        to 6 decimals, entropy (nats) to 4, null where the drafter did not run."""
        return {"parent": [int(x) for x in self.parent], "prob": [round(float(x), 6) for x in self.prob],
                "rank": [int(x) for x in self.rank], "accept": [round(float(x), 6) for x in self.accept],
                "entropy": [None if math.isnan(x) else round(float(x), 4) for x in self.entropy]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "RecordedStep":
        """From a file's step mapping: parent and rank lists of integers (-1 .. 2**31 - 1), prob, accept and
        entropy lists of finite numbers (entropy null where the drafter did not run). Raises ProfileError
        naming ``where`` and the entry."""
        lists = {}
        for key in ("parent", "prob", "rank", "accept", "entropy"):
            v = d.get(key)
            if not isinstance(v, list):
                raise ProfileError(f"{where}: a recorded step needs parent, prob, rank, accept and entropy lists "
                                   f"(missing or not a list: {key})")
            lists[key] = v
        ints = {}
        for k in ("parent", "rank"):
            v, low = lists[k], -1 if k == "parent" else 0
            if v and not (all(type(x) is int for x in v) and low <= min(v) and max(v) <= MAX_TOKENS):
                for i, x in enumerate(v):  # name the first entry out of range
                    check_integer(x, f"{where}.{k}[{i}]", low=low, high=MAX_TOKENS)
            ints[k] = v
        floats = {}
        for k in ("prob", "accept", "entropy"):
            v = [float("nan") if x is None and k == "entropy" else x for x in lists[k]]
            if not all(type(x) in (int, float) for x in v):
                i = next(i for i, x in enumerate(v) if type(x) not in (int, float))
                raise ProfileError(f"{where}.{k}[{i}] = {v[i]!r} must be a finite number")
            arr = np.asarray(v, dtype=np.float64)
            bad = ~np.isfinite(arr)
            if k == "entropy":  # null (NaN here) where the drafter did not run
                bad &= np.asarray([x is not None for x in lists[k]], dtype=bool)
            if bad.any():
                i = int(np.argmax(bad))
                raise ProfileError(f"{where}.{k}[{i}] = {lists[k][i]!r} must be a finite number")
            if k == "entropy" and (arr < 0).any():  # an entropy is never negative
                i = int(np.argmax(arr < 0))
                raise ProfileError(f"{where}.entropy[{i}] = {lists[k][i]!r} must be >= 0 (nats)")
            floats[k] = arr
        try:
            return cls(np.asarray(ints["parent"], dtype=np.int64), floats["prob"],
                       np.asarray(ints["rank"], dtype=np.int64), floats["accept"], floats["entropy"])
        except ProfileError as err:
            raise ProfileError(f"{where}: {err}") from None


def _table(key: np.ndarray, prob: np.ndarray, acc: np.ndarray, weight: np.ndarray, labels: Sequence[Any],
           name: str) -> list[dict]:
    """One row per label (``key == i`` for the i-th), its label under ``name`` first; empty rows are kept for
    bins and left out otherwise (a rank no candidate had is not a row, and the next rank keeps its label).

    ``count``: recorded candidates; ``reached``: the sum of their parents' reach probabilities (greedy: the
    candidates whose parent is on the target's own path); ``accepted``, ``mean_draft_prob`` and
    ``acceptance`` are reach-weighted, so ``acceptance`` is P(accepted | parent reached)."""
    rows = []
    # only the keys present, for all but bins: a file's rank may be any int up to 2**31 - 1, and a loop over
    # range(max rank + 1) would run for hours on one such entry before leaving the empty ranks out anyway
    for i in range(len(labels)) if name == "bin" else np.unique(key).tolist():
        lab = labels[i]
        m = key == i
        n = int(m.sum())
        if n == 0:  # an empty bin
            rows.append({name: lab, "count": 0, "reached": 0.0, "accepted": 0.0})
            continue
        w = float(weight[m].sum())
        a = float((weight[m] * acc[m]).sum())
        row = {name: lab, "count": n, "reached": round(w, 4), "accepted": round(a, 4)}
        if w > 0:
            lo, hi = wilson_interval(a, w)
            row.update(mean_draft_prob=round(float((weight[m] * prob[m]).sum()) / w, 6), acceptance=round(a / w, 6),
                       ci_low=round(lo, 6), ci_high=round(hi, 6))
        rows.append(row)
    return rows


@dataclass
class CalibrationProfile:
    """Reliability of a drafter's draft probability as a predictor of acceptance, with the recorded draft
    trees (module docstring).

    Attributes:
        id: profile id.
        measured: what was measured (target, draft, device, dtype, temperature, top_p, recording, ...).
        steps: the recorded draft trees (fixed once the profile is made: its tables are gathered from them once).
        edges: bin edges over the draft probability, from 0 to 1.

    Raises:
        ProfileError: no steps, or edges that are not increasing from 0 to 1.
    """

    id: str
    measured: dict[str, Any]
    steps: list[RecordedStep]
    edges: tuple[float, ...] = DEFAULT_EDGES
    _curve: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)
    _cand: dict[str, np.ndarray] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            e = np.asarray(self.edges, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise ProfileError(f"calibration bin edges must be numbers rising from 0 to 1, got {list(self.edges)}") from None
        if e.ndim != 1 or len(e) < 2 or e[0] != 0.0 or e[-1] != 1.0 or np.any(np.diff(e) <= 0):
            raise ProfileError(f"calibration bin edges must rise from 0 to 1, got {list(self.edges)}")
        if not self.steps:
            raise ProfileError(f"calibration profile {self.id!r} has no recorded steps")
        self.edges = tuple(float(x) for x in e)

    # ------------------------------------------------------------------ views
    def candidates(self) -> dict[str, np.ndarray]:
        """Every non-root node of every step: ``prob``, ``accept``, ``rank``, ``depth`` and ``weight`` (its
        parent's reach probability, :attr:`RecordedStep.reach`) arrays, same length."""
        if self._cand is None:  # every table and the curve read these: gathered once
            cat = lambda f: np.concatenate([f(s)[1:] for s in self.steps])  # noqa: E731
            self._cand = {"prob": cat(lambda s: s.prob), "accept": cat(lambda s: s.accept),
                          "rank": cat(lambda s: s.rank), "depth": cat(lambda s: s.depth),
                          "weight": cat(lambda s: s.reach[s.parent])}
        return self._cand

    @property
    def temperature(self) -> float:
        """The sampling temperature the steps were recorded at (``measured.temperature``; 0 = greedy when absent)."""
        return float(self.measured.get("temperature", 0.0))

    @property
    def recording(self) -> dict[str, int]:
        """The recording tree's ``steps`` (levels) and ``topk`` (children per node): what ``measured.recording``
        says, else what the recorded trees show."""
        r = self.measured.get("recording") or {}
        return {"steps": int(r.get("steps", max(int(s.depth.max()) for s in self.steps))),
                "topk": int(r.get("topk", max(len(c) for s in self.steps for c in s.children)))}

    def calibrated_bins(self) -> int:
        """How many bins the calibration curve uses (at least :data:`MIN_BIN_COUNT` reached candidates); a
        curve of fewer than 3 predicts little (the CLI warns)."""
        return sum(1 for r in self.bins() if r["reached"] >= MIN_BIN_COUNT)

    def _check_recording(self, source: str) -> None:
        r = self.measured.get("recording")
        if r is None:
            return
        if not isinstance(r, Mapping) or "steps" not in r or "topk" not in r:
            raise ProfileError(f"{source}: measured.recording must give integer steps and topk, got {r!r}")
        steps = check_integer(r["steps"], f"{source}: measured.recording.steps", low=1, high=MAX_TOKENS)
        topk = check_integer(r["topk"], f"{source}: measured.recording.topk", low=1, high=MAX_TOKENS)
        depth = max(int(s.depth.max()) for s in self.steps)
        kids = max(len(c) for s in self.steps for c in s.children)
        if depth != steps or kids > topk:
            raise ProfileError(f"{source}: measured.recording says {steps} levels of top-{topk}, but the recorded "
                               f"trees are {depth} levels deep with up to {kids} children per node")

    def _bin_index(self, prob: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(np.asarray(self.edges), prob, side="right") - 1, 0, len(self.edges) - 2)

    def bins(self) -> list[dict[str, Any]]:
        """The reliability table: per draft-probability bin its count, expected accepted count, mean draft
        probability, acceptance and 95 % Wilson interval."""
        c = self.candidates()
        rows = _table(self._bin_index(c["prob"]), c["prob"], c["accept"], c["weight"], range(len(self.edges) - 1),
                      "bin")
        out = []
        for r in rows:
            i = r.pop("bin")
            out.append({"low": self.edges[i], "high": self.edges[i + 1], **r})
        return out

    def by_rank(self) -> list[dict[str, Any]]:
        """The reliability table by candidate rank (0 = the drafter's best): one row per rank some candidate had,
        with its count, reached and accepted mass, reach-weighted mean draft probability, acceptance
        P(accepted | parent reached) and 95 % Wilson interval (``ci_low`` / ``ci_high``)."""
        c = self.candidates()
        return _table(c["rank"], c["prob"], c["accept"], c["weight"], range(int(c["rank"].max()) + 1), "rank")

    def by_depth(self) -> list[dict[str, Any]]:
        """The reliability table by candidate depth (1 = the root's children), rows as :meth:`by_rank`'s."""
        c = self.candidates()
        return _table(c["depth"] - 1, c["prob"], c["accept"], c["weight"], range(1, int(c["depth"].max()) + 1),
                      "depth")

    def ece(self) -> float:
        """Expected calibration error over reached candidates: sum over bins of (reached / total reached)
        |acceptance - mean draft probability| (0 when no candidate was reached)."""
        rows = [r for r in self.bins() if r["reached"] > 0]
        total = sum(r["reached"] for r in rows)
        return float(sum(r["reached"] / total * abs(r["acceptance"] - r["mean_draft_prob"]) for r in rows)) if total else 0.0

    def acceptance_of(self, prob: np.ndarray | float) -> np.ndarray:
        """The calibrated acceptance of candidates with draft probability ``prob``: linear interpolation
        between the (mean draft probability, acceptance) points of bins with at least
        :data:`MIN_BIN_COUNT` reached candidates (reach-weighted: the acceptance of a candidate whose parent is
        reached, which is what a tree's value multiplies along a path), anchored at (0, 0) and held flat past the last point."""
        if self._curve is None:
            rows = [r for r in self.bins() if r["reached"] >= MIN_BIN_COUNT]
            self._curve = (np.array([0.0] + [r["mean_draft_prob"] for r in rows]),
                           np.array([0.0] + [r["acceptance"] for r in rows]))
        return np.interp(np.asarray(prob, dtype=np.float64), *self._curve)

    # ------------------------------------------------------------------ file
    def to_dict(self) -> dict[str, Any]:
        """The ``treeopt-calibration/1`` file mapping: ``id``, ``measured``, the ECE, the candidate count, the bin
        edges, the tables (:meth:`bins`, :meth:`by_rank`, :meth:`by_depth`) and every recorded step;
        :meth:`from_dict` checks the tables against the steps."""
        c = self.candidates()
        return {"format": CALIBRATION_FORMAT, "id": self.id, "measured": dict(self.measured),
                "ece": round(self.ece(), 6), "candidates": int(len(c["prob"])), "edges": list(self.edges),
                "bins": self.bins(), "by_rank": self.by_rank(), "by_depth": self.by_depth(),
                "steps": [s.to_dict() for s in self.steps]}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *, source: str = "calibration profile",
                  default_id: str = "calibration") -> "CalibrationProfile":
        """Parse and validate (the stored tables must be the ones the steps give).

        Raises:
            ProfileError: another format or version, a bad step, tables that disagree with the steps.
        """
        _check_format(doc, CALIBRATION_FORMAT, source)
        warn_unknown_keys(doc, CALIBRATION_KEYS, source)
        raw = doc.get("steps")
        if not isinstance(raw, list) or not raw:
            raise ProfileError(f"{source}: 'steps' must be a non-empty list of recorded draft trees")
        steps = [RecordedStep.from_dict(s if isinstance(s, dict) else {}, f"{source}: steps[{i}]")
                 for i, s in enumerate(raw)]
        measured = doc.get("measured")
        if not isinstance(measured, dict) or not measured.get("target") or not measured.get("draft"):
            raise ProfileError(f"{source}: 'measured' must be a mapping naming the target and the draft (the pair "
                               "checks read them)")
        _check_sampling(measured, source)  # read as floats by every mode check
        edges = doc.get("edges", DEFAULT_EDGES)
        if not isinstance(edges, (list, tuple)):
            raise ProfileError(f"{source}: 'edges' must be a list of bin edges rising from 0 to 1, got {edges!r}")
        try:
            prof = cls(str(doc.get("id", default_id)), dict(measured), steps, tuple(edges))
        except ProfileError as err:
            raise ProfileError(f"{source}: {err}") from None
        prof._check_recording(source)
        for key, what, rows in (("bins", "the reliability table", prof.bins), ("by_rank", "by_rank", prof.by_rank),
                                ("by_depth", "by_depth", prof.by_depth)):
            stored = doc.get(key)
            if stored is None:
                continue
            have = [_count(r) for r in stored] if isinstance(stored, list) else stored
            want = [r["count"] for r in rows()]
            if have != want:
                raise ProfileError(f"{source}: {what}'s counts {have} do not match the recorded steps' {want}; the "
                                   "file was edited or cut")
        return prof


def _count(row: Any) -> Any:
    """A stored table row's count as an int (what it was, when it is none: the mismatch message shows it)."""
    c = row.get("count") if isinstance(row, dict) else None
    return int(c) if isinstance(c, (int, float)) and not isinstance(c, bool) and float(c).is_integer() else c


def load_calibration(path: str | Path) -> CalibrationProfile:
    """Read and validate a ``treeopt-calibration/1`` YAML file. Raises ProfileError (also if missing)."""
    doc, p = _load_yaml(path, "calibration")
    return CalibrationProfile.from_dict(doc, source=str(p), default_id=p.stem)


def save_calibration(path: str | Path, profile: CalibrationProfile) -> Path:
    """Write a calibration profile atomically. Returns the path."""
    return atomic_write_text(path, document_text(path, profile.to_dict()))


def same_pair(cal: Any, curve: Any, acc: Any = None, run: tuple[str, str] | None = None,
              weights: dict | None = None) -> None:
    """Refuse a calibration profile of another model pair than the latency profile's, the acceptance
    profile's (``acc``) or the run's (``run``: its target and draft names): one line, exit 2. A model the
    calibration recorded with the fingerprint of the run's ``weights`` (:func:`~sequoia_opt.jobs.load.weights_record`)
    is the run's under another folder name (a copy), not another model."""
    from .checks import same_weights

    others = [("the latency profile's", {"target": curve.model.get("target"), "draft": curve.model.get("draft")})]
    if acc is not None:
        others.append(("the acceptance profile's", acc.measured))
    if run is not None:
        others.append(("this run's", {"target": run[0], "draft": run[1]}))
    for label, other in others:
        for key in ("target", "draft"):
            if label == "this run's" and same_weights(cal.measured, weights, key):
                continue
            a, b = cal.measured.get(key), other.get(key)
            if a is not None and b is not None and str(a).lower() != str(b).lower():
                raise SolverError(f"the calibration profile {cal.id!r} is of {key} {a!r} but {label} {key} is "
                                  f"{b!r}: profiles of another pair predict nothing here")


def calibration_warnings(cal: Any, *, temperature: float | None = None, acc: Any = None,
                         weights: dict | None = None, top_p: float | None = None) -> list[str]:
    """What makes a calibration profile's predictions doubtful here: too few calibrated bins, another decoding
    mode than the run's (``temperature``) or the static tree's acceptance profile (``acc``), another nucleus mass
    than the run's (``top_p``, where both sample: the nucleus cuts both models' distributions), or other weights
    than the run's (``weights``, :func:`~sequoia_opt.jobs.load.weights_record`: another checkpoint of the same
    name)."""
    out = []
    k = cal.calibrated_bins()
    if k < 3:
        out.append(f"calibration profile {cal.id!r} has only {k} bin(s) with enough reached candidates: its predictions "
                   "are not meaningful (record more prompts or tokens)")
    mode = lambda t: "greedy" if float(t or 0) == 0 else f"sampling at temperature {float(t):g}"  # noqa: E731
    if temperature is not None and mode(temperature) != mode(cal.temperature):
        out.append(f"calibration profile {cal.id!r} was recorded in {mode(cal.temperature)} mode, this run decodes in "
                   f"{mode(temperature)} mode")
    recorded_p = cal.measured.get("top_p")
    if top_p is not None and recorded_p is not None and float(temperature or 0) > 0 and cal.temperature > 0 \
            and float(top_p) != float(recorded_p):
        out.append(f"calibration profile {cal.id!r} was recorded with top-p {float(recorded_p):g}, this run samples "
                   f"with top-p {float(top_p):g}")
    if acc is not None and mode(acc.measured.get("temperature")) != mode(cal.temperature):
        out.append(f"the calibration profile is {mode(cal.temperature)}, the acceptance profile "
                   f"{mode(acc.measured.get('temperature'))}: the static row is another decoding mode")
    out += [f"calibration profile {cal.id!r} was recorded with other weights: {w}"
            for w in weights_mismatch(cal.measured, weights)]
    return out
