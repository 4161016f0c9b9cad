"""The pair profile of two drafters measured together, ``treeopt-acceptance-pair/1`` (a light and a strong
drafter: the strong drafter's acceptance beside the light's candidates; TreeGraft)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .._io import atomic_write_text, document_text, warn_unknown_keys
from ..errors import ProfileError
from .common import (MAX_PROFILE_DEPTH, MAX_TOKENS, PAIR_ACCEPTANCE_FORMAT, PAIR_ACCEPTANCE_KEYS, _check_format,
                     Z975, _depth_key, _flag, _load_yaml, _number, _plain, check_integer)
from .latency import check_cost_model

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
            if isinstance(d, str):  # JSON writes keys as strings: "1" beside 1 names one depth twice
                d = _depth_key(d)
                if d in counts:
                    raise ProfileError(f"{src}: outcome_counts_by_depth names depth {d} twice")
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
                raise ProfileError(f"{src}: outcome_counts_by_depth key {d!r} must be a depth >= 1")
            check_integer(d, f"{src}: outcome_counts_by_depth key", low=1, high=MAX_PROFILE_DEPTH)
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

    def confidence_interval(self, z: float = Z975, min_trials: int = PAIR_MIN_TRIALS) -> np.ndarray:
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
        """The ``treeopt-acceptance-pair/1`` file mapping of the class docstring (:meth:`from_dict` reads it back), in
        plain Python types; ``example`` and ``source`` only when set."""
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
        warn_unknown_keys(doc, PAIR_ACCEPTANCE_KEYS, source)
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
    return atomic_write_text(path, document_text(path, d))
