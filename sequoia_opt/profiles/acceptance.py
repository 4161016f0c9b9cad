"""The positional acceptance profile, ``treeopt-acceptance/1`` (the format: :mod:`sequoia_opt.profiles`): p_1..p_K
with their counts, per-depth vectors, per-prompt counts, intervals."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .._io import atomic_write_text, document_text, warn_unknown_keys
from ..errors import ProfileError
from .common import (ACCEPTANCE_FORMAT, ACCEPTANCE_KEYS, MAX_COUNT, MAX_PROFILE_DEPTH, MAX_TOKENS, _check_format,
                     Z975, _check_sampling, _depth_key, _flag, _load_yaml, _plain, check_integer, validate_acceptance)

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
        prompt_counts: (P, D, K + 1) int64 or None: per profile prompt, per depth 1..D of the proposed children,
            the outcome counts (``counts_by_prompt`` in the file; profiles written before it existed have none).
            Tokens of one prompt are correlated, so intervals for a new set of prompts resample prompts, not
            tokens (:mod:`sequoia_opt.solver.intervals`).
        chain_traces: None, or per profile prompt a string of ``1`` / ``0``, one per token of the target's greedy
            continuation: whether the drafter's top-1, teacher-forced on the tokens before it, equals the
            target's token (:func:`~sequoia_opt.profiling.acceptance.chain_traces`). A greedy chain of any
            length replays exactly on them (:func:`~sequoia_opt.solver.chains.replay_counts`); the file's
            ``chain_traces``.
    """

    id: str
    acceptance: np.ndarray
    counts: np.ndarray | None = None
    measured: dict[str, Any] = field(default_factory=dict)
    by_depth: dict[int, np.ndarray] = field(default_factory=dict)
    example: bool = False
    source: str | None = None
    prompt_counts: np.ndarray | None = None
    chain_traces: list[str] | None = None

    @property
    def num_prompts(self) -> int | None:
        """P, the prompts behind :attr:`prompt_counts` (None without them)."""
        return None if self.prompt_counts is None else int(self.prompt_counts.shape[0])

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

    @property
    def all_rejected(self) -> float:
        """The share of trials in which every candidate was rejected: ``counts[K] / sum(counts)`` where the profile
        keeps counts (exactly 0 when none was), else ``1 - sum(p)`` floored at 0 (a vector whose float sum rounds
        past 1 is not a negative share)."""
        if self.counts is not None and self.counts.sum() > 0:
            return float(self.counts[-1] / self.counts.sum())
        return max(0.0, 1.0 - float(self.acceptance.sum()))

    def confidence_interval(self, z: float = Z975) -> np.ndarray:
        """Wilson score interval for every ``p_k``: ``(K, 2)`` array of (low, high), default 95 %. It counts
        every trial as independent: the interval of these tokens, too narrow for a new set of prompts (their
        tokens are correlated within a prompt); :func:`~sequoia_opt.solver.intervals.acceptance_spreads` gives
        the interval between prompts.

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
    def depth_limit(self) -> int | None:
        """The deepest the measured drafter proposes (``measured.draft_depth_limit``, written by ``treeopt profile
        acceptance`` for Medusa's K heads: K; checked on load), None when it has no limit: the trees and chains
        solved for it stop there."""
        v = self.measured.get("draft_depth_limit")
        return None if v is None else int(v)

    def capped_depth(self, depth: int) -> int:
        """``depth`` (a solver's depth limit D), at most :attr:`depth_limit` where the drafter has one."""
        return depth if self.depth_limit is None else min(depth, self.depth_limit)

    @property
    def positional_consistent(self) -> bool | None:
        """Whether the acceptance mass of every measured depth agreed with the pooled one (the positional
        assumption, Sequoia section 3.1; ``measured.positional_consistent``, written by ``treeopt profile
        acceptance``); None when not recorded."""
        v = self.measured.get("positional_consistent")
        return None if v is None else bool(v)

    def to_dict(self) -> dict[str, Any]:
        """The ``treeopt-acceptance/1`` file mapping (:meth:`from_dict` reads it back): ``id``, ``measured``, the
        pooled ``acceptance`` vector (K floats) and, when present, ``counts`` (K + 1 ints), ``acceptance_by_depth``
        (depth -> K floats), ``counts_by_prompt`` ((P, D, K + 1) nested lists), ``chain_traces``, ``example`` and
        ``source``; plain Python types only."""
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
        if self.prompt_counts is not None:
            d["counts_by_prompt"] = self.prompt_counts.tolist()
        if self.chain_traces is not None:
            d["chain_traces"] = list(self.chain_traces)
        return d

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *, source: str = "acceptance profile", default_id: str = "acceptance") -> "AcceptanceProfile":
        """Validate a parsed ``treeopt-acceptance/1`` mapping. Raises ProfileError with one line."""
        _check_format(doc, ACCEPTANCE_FORMAT, source)
        warn_unknown_keys(doc, ACCEPTANCE_KEYS, source)
        if "acceptance" not in doc:
            raise ProfileError(f"{source}: missing key 'acceptance' (the K-entry vector p_1..p_K)")
        p = validate_acceptance(doc["acceptance"], error=ProfileError, what=f"{source}: 'acceptance'")
        measured = doc.get("measured") or {}
        if not isinstance(measured, dict):
            raise ProfileError(f"{source}: 'measured' must be a mapping")
        mode = measured.get("mode")
        if mode is not None and mode not in ("greedy", "sampling"):
            raise ProfileError(f"{source}: measured.mode is {mode!r}, expected 'greedy' or 'sampling'")
        _check_sampling(measured, source, extra=("tokens_per_step",))
        t = measured.get("temperature")
        if mode is not None and t is not None and (mode == "greedy") != (t == 0):
            raise ProfileError(f"{source}: measured.mode is {mode!r} but measured.temperature is {t}; greedy is "
                               "temperature 0 and sampling a temperature > 0")
        pc = measured.get("positional_consistent")
        if pc is not None and not isinstance(pc, (bool, np.bool_)):  # bool("false") is True: the solver's model turned on text
            raise ProfileError(f"{source}: measured.positional_consistent = {pc!r} must be true or false")
        for key in ("width", "num_samples", "num_prompts", "steps", "max_new_tokens"):
            v = measured.get(key)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ProfileError(f"{source}: measured.{key} = {v!r} must be a non-negative integer")
                check_integer(v, f"{source}: measured.{key}", high=MAX_TOKENS if key == "width" else MAX_COUNT)
        limit = measured.get("draft_depth_limit")  # the deepest the drafter proposes (Medusa's K heads)
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ProfileError(f"{source}: measured.draft_depth_limit = {limit!r} must be an integer >= 1 (the "
                                   "deepest the drafter proposes)")
            check_integer(limit, f"{source}: measured.draft_depth_limit", high=MAX_TOKENS)
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
            k = _depth_key(k)
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise ProfileError(f"{source}: acceptance_by_depth key {k!r} must be a depth >= 1")
            if k in by_depth:
                raise ProfileError(f"{source}: acceptance_by_depth names depth {k} twice")
            check_integer(k, f"{source}: acceptance_by_depth key", low=1, high=MAX_PROFILE_DEPTH)
            by_depth[k] = validate_acceptance(v, error=ProfileError, what=f"{source}: acceptance_by_depth[{k}]")
            if by_depth[k].size != p.size:
                raise ProfileError(f"{source}: acceptance_by_depth[{k}] has {by_depth[k].size} entries but "
                                   f"'acceptance' has {p.size}; every vector of a profile has K entries")
        pid = doc.get("id", default_id)
        if not isinstance(pid, str) or not pid:
            raise ProfileError(f"{source}: 'id' must be a non-empty string")
        prompt_counts = None
        if doc.get("counts_by_prompt") is not None:
            prompt_counts = _prompt_counts(doc["counts_by_prompt"], counts, by_depth, measured, p.size, source)
        return cls(
            id=pid,
            acceptance=p,
            counts=counts,
            measured=dict(measured),
            by_depth=by_depth,
            example=_flag(doc, "example", source),
            source=doc.get("source"),
            prompt_counts=prompt_counts,
            chain_traces=_chain_traces(doc["chain_traces"], p, counts, measured, source)
            if doc.get("chain_traces") is not None else None,
        )


def _chain_traces(raw: Any, p: np.ndarray, counts: np.ndarray | None, measured: Mapping[str, Any],
                  source: str) -> list[str]:
    """``chain_traces`` validated: a non-empty list of non-empty strings of ``0`` / ``1``, one per prompt
    (``measured.num_prompts`` when given), none longer than ``measured.max_new_tokens`` (when given); with a
    one-entry vector ``p``, its counts (when given) are the traces' (agreements, misses) and its p_1 their
    agreement rate (to 1e-3). Raises ProfileError with one line."""
    if not isinstance(raw, list) or not raw:
        raise ProfileError(f"{source}: 'chain_traces' must list, per prompt, a string of 0 and 1 (one per token)")
    for i, t in enumerate(raw):
        if not isinstance(t, str) or not t or set(t) - {"0", "1"}:
            raise ProfileError(f"{source}: chain_traces[{i}] must be a non-empty string of 0 and 1")
    if measured.get("num_prompts") is not None and measured["num_prompts"] != len(raw):
        raise ProfileError(f"{source}: measured.num_prompts is {measured['num_prompts']} but 'chain_traces' lists "
                           f"{len(raw)} prompts")
    longest = max(len(t) for t in raw)
    if isinstance(measured.get("max_new_tokens"), int) and longest > measured["max_new_tokens"]:
        raise ProfileError(f"{source}: a chain trace has {longest} tokens but measured.max_new_tokens is "
                           f"{measured['max_new_tokens']}")
    hits, total = sum(t.count("1") for t in raw), sum(len(t) for t in raw)
    if counts is not None and counts.size == 2 and [hits, total - hits] != counts.tolist():
        raise ProfileError(f"{source}: 'chain_traces' hold {hits} agreements in {total} tokens but 'counts' are "
                           f"{counts.tolist()}")
    if p.size == 1 and abs(float(p[0]) - hits / total) > 1e-3:
        raise ProfileError(f"{source}: 'chain_traces' agree at {hits / total:.4f} but 'acceptance' says "
                           f"{float(p[0]):.4f}")
    return list(raw)


def _prompt_counts(raw: Any, counts: np.ndarray | None, by_depth: dict[int, np.ndarray], measured: Mapping[str, Any],
                   K: int, source: str) -> np.ndarray:
    """``counts_by_prompt`` validated against the rest of the profile: (P, D, K + 1) non-negative integers whose
    sum over prompts and depths is ``counts`` and whose sum over prompts gives every stored per-depth vector up to
    depth D (deeper stored vectors have no per-prompt counts: their intervals repeat depth D's spread).
    Raises ProfileError with one line."""
    if counts is None:
        raise ProfileError(f"{source}: 'counts_by_prompt' needs 'counts' (their sum over prompts and depths)")
    if not isinstance(raw, list) or not raw:
        raise ProfileError(f"{source}: 'counts_by_prompt' must list, per prompt, per depth, K + 1 = {K + 1} counts")
    D = None
    for i, prompt in enumerate(raw):
        if not isinstance(prompt, list) or not prompt or (D is not None and len(prompt) != D):
            raise ProfileError(f"{source}: counts_by_prompt[{i}] must list one count vector per depth 1..D, the same "
                               "D for every prompt")
        D = len(prompt)
        check_integer(D, f"{source}: counts_by_prompt[{i}] depths", low=1, high=MAX_TOKENS)
        for d, row in enumerate(prompt):
            if not isinstance(row, list) or len(row) != K + 1:
                raise ProfileError(f"{source}: counts_by_prompt[{i}][{d}] must list K + 1 = {K + 1} integers")
            for c in row:
                check_integer(c, f"{source}: counts_by_prompt[{i}][{d}]")
    arr = np.asarray(raw, dtype=np.int64)  # (P, D, K + 1)
    total = arr.sum(axis=(0, 1))
    if not np.array_equal(total, counts):
        raise ProfileError(f"{source}: 'counts_by_prompt' sum to {total.tolist()} over prompts and depths, but "
                           f"'counts' is {counts.tolist()}; the two must agree")
    per_depth = arr.sum(axis=0)  # (D, K + 1)
    for d, v in by_depth.items():
        if d > D:  # per-prompt counts of the first D depths only (teacher-forced chain traces keep depth 1)
            continue
        n = per_depth[d - 1].sum()
        if n == 0 or np.max(np.abs(per_depth[d - 1, :-1] / n - v)) > 1e-3:
            raise ProfileError(f"{source}: acceptance_by_depth[{d}] disagrees with the sum of 'counts_by_prompt' at "
                               f"depth {d}")
    if measured.get("num_prompts") is not None and measured["num_prompts"] != arr.shape[0]:
        raise ProfileError(f"{source}: measured.num_prompts is {measured['num_prompts']} but 'counts_by_prompt' "
                           f"holds {arr.shape[0]} prompts; the two must agree")
    return arr


def load_acceptance(path: str | Path) -> AcceptanceProfile:
    """Read and validate a ``treeopt-acceptance/1`` YAML file. Raises ProfileError (also if missing)."""
    doc, p = _load_yaml(path, "acceptance")
    return AcceptanceProfile.from_dict(doc, source=str(p), default_id=p.stem)


def save_acceptance(path: str | Path, profile: AcceptanceProfile) -> Path:
    """Validate and write an acceptance profile atomically. Returns the path."""
    d = profile.to_dict()
    AcceptanceProfile.from_dict(d, source=str(path))
    return atomic_write_text(path, document_text(path, d))
