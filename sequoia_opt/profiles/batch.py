"""Latency per batch size: ``format: treeopt-latency-batch/1``, one ``treeopt-latency/1`` curve set per batch b.

At batch b one decoding step runs the draft over b rows of w tokens per level and the target over b rows of n
tree tokens, so the solver needs T(b, n), c(b, w) and the per-step overhead at each b (Sequoia, Chen et al.
2024, section 4.2: the hardware-aware budget depends on how verification time grows with the tokens fed; at
batch b they are b x n). Each batch's entry holds exactly the body of a latency profile and is read by
:meth:`LatencyCurve.from_dict`, so interpolation in n and context, the no-extrapolation rule and the cost
models are the ones batch 1 uses::

    format: treeopt-latency-batch/1
    id: cpu_SmolLM2__draft_float32_batch
    source: measured by treeopt profile latency --batch 1,2,4,8 (...)
    date: ...
    device: {...}                  # as treeopt-latency/1
    model: {...}
    engine: {name: llama.cpp, ...} # optional, as treeopt-latency/1: what ran the forwards (absent: treeopt's decoder)
    batches:
      - batch: 1
        step_overhead_ms: 0.8      # the batched decoder's accept + commit at this batch
        curves:                    # as treeopt-latency/1: T(b, n) per row count n, c(b, w)
          - context_tokens: 256
            target: {tokens: [1, 2, 4, ...], target_forward_ms: [...]}
            draft: {cost_model: per-level, tokens: [...], draft_forward_ms: [...]}
      - batch: 4
        ...

Token counts are per sequence (a forward at batch b over n tokens feeds b x n). A ``treeopt-latency/1``
profile still loads here, as the curve of batch 1 only (:func:`load_batch_latency`); batch sizes that were not
measured are refused (no interpolation or extrapolation across b).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from .._io import atomic_write_text, document_text, warn_unknown_keys
from ..errors import ProfileError, ProfileWarning
from .common import (IMPLAUSIBLE_FRACTION, LATENCY_FORMAT, MAX_MS, MAX_TOKENS, MICROSECONDS_SUSPECT_MS,
                     SECONDS_SUSPECT_MS, _check_format, _load_yaml, check_integer, table_lines)
from .latency import LatencyCurve

BATCH_LATENCY_FORMAT = "treeopt-latency-batch/1"

#: the top-level keys of a batch latency profile, and of one entry of its ``batches`` (others are warned of)
BATCH_LATENCY_KEYS = ("format", "id", "source", "date", "device", "model", "engine", "batches")
BATCH_ENTRY_KEYS = ("batch", "step_overhead_ms", "curves")

__all__ = ["BATCH_LATENCY_FORMAT", "BatchLatencyProfile", "load_batch_latency", "save_batch_latency",
           "parse_batches", "check_starts_at_one", "load_batch_table"]


def parse_batches(text: str, option: str = "--batch") -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (sorted, unique). Raises ProfileError for an empty list, an empty item
    (``1,,8``: a batch size lost in typing, or an unset shell variable, is not read as "no batch size there"), a
    non-integer or a batch size < 1."""
    if not str(text).strip():
        raise ProfileError(f"{option} needs at least one batch size, e.g. 1,2,4,8")
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            raise ProfileError(f"{option} {text!r} has an empty item: give batch sizes like 1,2,4,8, one between "
                               "each pair of commas")
        try:
            b = int(part)
        except ValueError:
            raise ProfileError(f"{option} takes batch sizes like 1,2,4,8; {part!r} is not an integer") from None
        if b < 1:
            raise ProfileError(f"{option}: batch size {b} is below 1 (a batch holds at least one sequence)")
        out.append(b)
    return sorted(set(out))


def check_starts_at_one(batches: Sequence[int], where: str) -> None:
    """Raise ProfileError (one line naming ``where``: the option or table the batch sizes came from) unless the
    ascending ``batches`` start at 1: a plan's first range starts at one live request, so its setting is solved
    there."""
    if batches[0] != 1:
        raise ProfileError(f"{where} lacks batch size 1: a plan's first range starts at one live request, so its "
                           "setting must be solved there (measure T(1, n) and include 1)")


@dataclass(frozen=True)
class BatchLatencyProfile:
    """The latency model per batch size.

    Attributes:
        id: profile id.
        curves: batch size -> :class:`LatencyCurve` (T(b, n) per row count n in ms, c(b, w) in ms, the
            step overhead at b in ms); ids are ``"{id}@batch{b}"``.
        device / model: metadata mappings as stored (shared by every batch).
        source, date: how and when it was measured.
    """

    id: str
    curves: dict[int, LatencyCurve]
    device: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    date: str | None = None

    @property
    def batches(self) -> list[int]:
        """The batch sizes measured, ascending."""
        return sorted(self.curves)

    def curve(self, batch: int) -> LatencyCurve:
        """The curve measured at ``batch``. Raises ProfileError for b < 1 or a batch size not measured."""
        if isinstance(batch, bool) or int(batch) != batch or batch < 1:
            raise ProfileError(f"batch size must be an integer >= 1, got {batch!r}")
        if batch not in self.curves:
            fix = ("add its rows to the table" if str(self.source or "").startswith("a T(b, n) table")
                   else f"profile it: treeopt profile latency --batch "
                        f"{','.join(map(str, sorted({*self.batches, int(batch)})))}")
            raise ProfileError(f"latency profile {self.id!r} was measured at batch sizes "
                               f"{','.join(map(str, self.batches))}, not {batch}; {fix}")
        return self.curves[batch]

    @classmethod
    def from_latency(cls, curve: LatencyCurve) -> "BatchLatencyProfile":
        """A batch-1-only profile from a ``treeopt-latency/1`` curve."""
        return cls(id=curve.id, curves={1: curve}, device=dict(curve.device), model=dict(curve.model),
                   source=curve.source)

    def keeping(self, older: "BatchLatencyProfile") -> "BatchLatencyProfile":
        """This profile with what ``older`` (a saved one of the same pair) measured that this one did not: its
        curves at the batch sizes this one lacks, and at each batch size both have, its curves at the contexts
        this one lacks (another ``--context``). Where both timed a context, this one's tables stand; a merged
        batch size takes this one's ``step_overhead_ms``. ``older`` is ignored when it was timed with other threads
        (``device.threads``) and a batch size's curves are not merged across draft cost models.

        Raises:
            ProfileError: the merged document does not validate (not expected from two valid profiles).
        """
        mine, theirs = (self.device or {}).get("threads"), (older.device or {}).get("threads")
        if mine is not None and theirs is not None and int(mine) != int(theirs):
            return self
        curves = dict(older.curves)
        for b, new in self.curves.items():
            old = older.curves.get(b)
            if old is None or old.cost_model != new.cost_model:
                curves[b] = new
                continue
            doc = new.to_dict()
            have = {int(e["context_tokens"]) for e in doc["curves"]}
            doc["curves"] = sorted(doc["curves"] + [e for e in old.to_dict()["curves"]
                                                    if int(e["context_tokens"]) not in have],
                                   key=lambda e: int(e["context_tokens"]))
            curves[b] = LatencyCurve.from_dict(doc, source=f"{self.id}@batch{b}", default_id=new.id,
                                               check_plausible=False)
        return BatchLatencyProfile(id=self.id, curves=curves, device=dict(self.device), model=dict(self.model),
                                   source=self.source, date=self.date)

    def to_dict(self) -> dict[str, Any]:
        """The ``treeopt-latency-batch/1`` file mapping (:meth:`from_dict` reads it back): ``id``, ``source`` and
        ``date`` when set, the device, model (and engine, when one timed it) of the smallest batch's curve, and per
        batch size b its ``step_overhead_ms`` (ms) and its curves (T(n) and c(w) tables in ms)."""
        d: dict[str, Any] = {"format": BATCH_LATENCY_FORMAT, "id": self.id}
        if self.source:
            d["source"] = self.source
        if self.date:
            d["date"] = self.date
        first = self.curves[self.batches[0]].to_dict()
        d["device"], d["model"] = first["device"], first["model"]
        if "engine" in first:  # the engine that timed every batch size (absent: treeopt's decoder)
            d["engine"] = first["engine"]
        d["batches"] = [{"batch": b, "step_overhead_ms": float(self.curves[b].step_overhead_ms),
                         "curves": self.curves[b].to_dict()["curves"]} for b in self.batches]
        return d

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *, source: str = "batch latency profile",
                  default_id: str = "latency-batch", table: bool = False) -> "BatchLatencyProfile":
        """Validate a parsed ``treeopt-latency-batch/1`` mapping (or a ``treeopt-latency/1`` one: batch 1).
        ``table``: the mapping was built from a user's T(b, n) table (:func:`load_batch_table`), whose messages
        name a batch size, not an entry of a list the user never wrote. Raises ProfileError with one line."""
        if doc.get("format") == LATENCY_FORMAT:
            return cls.from_latency(LatencyCurve.from_dict(doc, source=source, default_id=default_id))
        _check_format(doc, BATCH_LATENCY_FORMAT, source)
        warn_unknown_keys(doc, BATCH_LATENCY_KEYS, source)
        pid = doc.get("id", default_id)
        if not isinstance(pid, str) or not pid:
            raise ProfileError(f"{source}: 'id' must be a non-empty string")
        entries = doc.get("batches")
        if not isinstance(entries, list) or not entries:
            raise ProfileError(f"{source}: 'batches' must be a non-empty list (one entry per batch size)")
        curves: dict[int, LatencyCurve] = {}
        for i, e in enumerate(entries):
            where = f"{source}: batches[{i}]"
            if not isinstance(e, dict):
                raise ProfileError(f"{where} must be a mapping")
            warn_unknown_keys(e, BATCH_ENTRY_KEYS, where)
            b = e.get("batch")
            b = check_integer(b, f"{where}.batch", low=1, high=MAX_TOKENS)
            if table:
                where = f"{source}: batch {b}"
            if b in curves:
                raise ProfileError(f"{where}: batch {b} is given twice")
            body = {"format": LATENCY_FORMAT, "id": f"{pid}@batch{b}", "device": doc.get("device") or {},
                    "model": doc.get("model") or {}, "source": doc.get("source"), "engine": doc.get("engine"),
                    "step_overhead_ms": e.get("step_overhead_ms"), "curves": e.get("curves")}
            if "step_overhead_ms" not in e:
                raise ProfileError(f"{where}: missing key 'step_overhead_ms'")
            curves[b] = LatencyCurve.from_dict(body, source=where, default_id=body["id"])
            for c in curves[b].contexts:  # the rows a spread batch was timed on: one per row
                rows = curves[b].row_contexts(int(c))
                if rows is not None and len(rows) != b:
                    raise ProfileError(f"{where}: row_context_tokens at context {int(c)} lists {len(rows)} rows, "
                                       f"not {b}")
        for msg in implausible_batches(curves):
            warnings.warn(f"{source}: {msg}", ProfileWarning, stacklevel=2)
        return cls(id=pid, curves=curves, device=dict(doc.get("device") or {}), model=dict(doc.get("model") or {}),
                   source=doc.get("source"), date=doc.get("date"))


def implausible_batches(curves: Mapping[int, LatencyCurve]) -> list[str]:
    """One line per pair of neighbouring batch sizes where the larger one's target forward over n tokens takes less
    than :data:`~sequoia_opt.profiles.common.IMPLAUSIBLE_FRACTION` of the smaller one's at the same n and context
    (more rows in less than half the time: a typo, swapped rows, other load while profiling), naming the first such
    n. Empty for a plausible profile."""
    out = []
    bs = sorted(curves)
    for b1, b2 in zip(bs, bs[1:]):
        c1, c2 = curves[b1], curves[b2]
        for ctx in sorted(set(c1.contexts.tolist()) & set(c2.contexts.tolist())):
            (n1, t1), (n2, t2) = c1.target_points(int(ctx)), c2.target_points(int(ctx))
            ms1 = dict(zip(n1.tolist(), t1.tolist()))
            low = [(n, m, ms1[n]) for n, m in zip(n2.tolist(), t2.tolist())
                   if n in ms1 and m < IMPLAUSIBLE_FRACTION * ms1[n]]
            if low:
                n, m, m1 = low[0]
                at = f" at context {int(ctx)}" if len(c2.contexts) > 1 else ""
                more = f" and at {len(low) - 1} more token counts" if len(low) > 1 else ""
                out.append(f"batch {b2}: T({int(n)}) = {m:.4g} ms{at} is below {IMPLAUSIBLE_FRACTION:g} x batch "
                           f"{b1}'s ({m1:.4g} ms){more}: more rows in less than half the time is implausible (a typo, "
                           "swapped rows, other load while profiling?); correct or re-measure it before trusting what "
                           "is solved from it")
                break
    return out


def load_batch_latency(path: str | Path) -> BatchLatencyProfile:
    """Read a ``treeopt-latency-batch/1`` file, or a ``treeopt-latency/1`` one as batch 1 only. Raises
    ProfileError (also when the file is missing)."""
    doc, p = _load_yaml(path, "latency")
    return BatchLatencyProfile.from_dict(doc, source=str(p), default_id=p.stem)


def save_batch_latency(path: str | Path, profile: BatchLatencyProfile) -> Path:
    """Write atomically, validated by re-parsing first. Returns the path."""
    d = profile.to_dict()
    BatchLatencyProfile.from_dict(d, source=str(path))
    return atomic_write_text(path, document_text(path, d))


#: The columns of a user's T(b, n) table (:func:`load_batch_table`); the last three are optional.
TABLE_COLUMNS = ("batch", "tokens", "target_ms", "draft_ms", "overhead_ms")


_INT_COLUMNS = ("batch", "tokens")
_OPTIONAL_COLUMNS = ("draft_ms", "overhead_ms")


def _plain_number(text: str, *, integer: bool) -> bool:
    """Whether a table cell reads as :func:`load_batch_table` takes it: ASCII, no ``_`` (``int`` reads 7_5 as 75,
    and full-width digits as digits), an int (``integer``) or a float."""
    if not text.isascii() or "_" in text:
        return False
    try:
        int(text) if integer else float(text)
    except ValueError:
        return False
    return True


def load_batch_table(path: str | Path, *, context: int = 0, profile_id: str | None = None) -> BatchLatencyProfile:
    """A user's T(b, n) table (CSV, or tab-separated, a header line, one row per measured (batch, tokens) pair) as a
    :class:`BatchLatencyProfile`, for engines treeopt does not profile here (an engine's own benchmark on a GPU)::

        batch,tokens,target_ms,draft_ms,overhead_ms
        1,1,7.9,0.6,0.3          # one target forward over 1 token per request at batch 1: 7.9 ms
        1,4,8.4,0.6,0.3          # draft_ms: c(b, w) at w = tokens (optional, 0 when absent: n-grams)
        8,1,9.1,0.7,0.4          # overhead_ms: the engine's per-step cost at that batch (optional, 0)

    Token counts are per request (a forward at batch b over n tokens feeds b x n). Every batch size must list the
    same token counts, and the overhead must be one number per batch size. A table whose fastest target forward is
    below :data:`~sequoia_opt.profiles.common.SECONDS_SUSPECT_MS` warns (:class:`~sequoia_opt.errors.ProfileWarning`):
    times typed in seconds; one above :data:`~sequoia_opt.profiles.common.MICROSECONDS_SUSPECT_MS` warns too: times
    typed in microseconds.

    Raises:
        ProfileError: a missing file, an unknown, missing or repeated column, a value that is not a positive
            number, a (batch, tokens) pair twice, a batch size missing token counts another has (one line each).
    """
    import csv

    from .._io import read_text_file

    p = Path(path)
    text = read_text_file(p, error=ProfileError, what="T(b, n) table").removeprefix("\ufeff")  # a spreadsheet's BOM
    rows, line_of = [], []  # one row per line (a numeric table has no quoted line breaks): errors name file lines
    lines = list(table_lines(text.splitlines()))
    # tab-separated (a spreadsheet's other export) where the header holds tabs and no comma
    sep = "\t" if lines and "\t" in lines[0][1] and "," not in lines[0][1] else ","
    for i, ln in lines:
        try:
            rows.append(next(csv.reader([ln], delimiter=sep), []))
        except csv.Error as err:  # a field past the csv module's limit, a stray quote
            raise ProfileError(f"{p}: line {i} is not a CSV row ({err})") from None
        line_of.append(i)
    if not rows:
        raise ProfileError(f"{p}: empty T(b, n) table (header batch,tokens,target_ms[,draft_ms][,overhead_ms])")
    head = [h.strip() for h in rows[0]]
    unknown = [h for h in head if h not in TABLE_COLUMNS]
    if unknown or head[:3] != list(TABLE_COLUMNS[:3]):
        import difflib

        hint = ""
        if unknown:
            near = difflib.get_close_matches(unknown[0].lower(), TABLE_COLUMNS, n=1, cutoff=0.6)
            hint = f" (unknown column {unknown[0]!r}" + (f": did you mean {near[0]!r}?)" if near else ")")
        raise ProfileError(f"{p}: the header must start batch,tokens,target_ms (then draft_ms, overhead_ms), got "
                           f"{','.join(head)}{hint}")
    twice = sorted({h for h in head if head.count(h) > 1})
    if twice:
        raise ProfileError(f"{p}: the header names {twice[0]} twice (one column each: "
                           f"{', '.join(TABLE_COLUMNS)})")
    table: dict[int, dict[int, tuple[float, float]]] = {}
    overhead: dict[int, float] = {}
    first_line: dict[tuple[int, int], int] = {}  # (batch, tokens) -> the line that gave it
    for i, r in zip(line_of[1:], rows[1:]):
        if len(r) != len(head):
            raise ProfileError(f"{p}: line {i} has {len(r)} values, the header {len(head)}")
        rec = dict(zip(head, (x.split("#")[0].strip() for x in r)))
        bad = next(((c, v) for c, v in rec.items()  # an optional ms column may be left empty (0)
                    if not (v == "" and c in _OPTIONAL_COLUMNS) and not _plain_number(v, integer=c in _INT_COLUMNS)),
                   None)
        if bad is not None:
            raise ProfileError(f"{p}: line {i}: batch and tokens must be integers and the ms columns numbers "
                               f"(ASCII: 12, 10.5, 1e1); {bad[0]} is {bad[1]!r}")
        b, n = int(rec["batch"]), int(rec["tokens"])
        t = float(rec["target_ms"])
        d = float(rec.get("draft_ms") or 0.0)
        o = float(rec.get("overhead_ms") or 0.0)
        if b < 1 or n < 1 or not t > 0 or d < 0 or o < 0 or not all(map(math.isfinite, (t, d, o))):
            col, rule = next((c, r) for c, ok, r in (
                ("batch", b >= 1, "an integer >= 1"), ("tokens", n >= 1, "an integer >= 1"),
                ("target_ms", t > 0 and math.isfinite(t), "a number > 0"),
                ("draft_ms", d >= 0 and math.isfinite(d), "a number >= 0"),
                ("overhead_ms", o >= 0 and math.isfinite(o), "a number >= 0")) if not ok)
            raise ProfileError(f"{p}: line {i}: {col} is {rec[col]!r} (must be {rule})")
        if max(b, n) > MAX_TOKENS or max(t, d, o) > MAX_MS:  # named by line and column, as a table is read
            col = "batch" if b > MAX_TOKENS else "tokens" if n > MAX_TOKENS else \
                next(c for c, v in zip(TABLE_COLUMNS[2:], (t, d, o)) if v > MAX_MS)
            limit = MAX_TOKENS if col in ("batch", "tokens") else f"{MAX_MS:g} ms"
            raise ProfileError(f"{p}: line {i}: {col} {rec[col]} is out of range (at most {limit})")
        if n in table.setdefault(b, {}):
            raise ProfileError(f"{p}: line {i}: batch {b}, tokens {n} is given twice (first at line "
                               f"{first_line[b, n]})")
        if b in overhead and overhead[b] != o:
            raise ProfileError(f"{p}: line {i}: batch {b} gives two overheads ({overhead[b]} and {o} ms): one per "
                               "batch size")
        table[b][n], overhead[b], first_line[b, n] = (t, d), o, i
    if not table:
        raise ProfileError(f"{p}: the T(b, n) table has a header and no rows")
    first = min(table)
    grid = sorted(table[first])
    if grid[0] != 1:
        raise ProfileError(f"{p}: the table has no tokens = 1 rows: plain decoding's step is T(b, 1), which every "
                           "prediction is compared with (add a row per batch size with tokens 1)")
    for b in sorted(table):
        missing = sorted(set(table[first]) - set(table[b]))
        extra = sorted(set(table[b]) - set(table[first]))
        if missing or extra:
            n = (missing or extra)[0]
            who = (b, first) if missing else (first, b)
            raise ProfileError(f"{p}: batch {who[0]} lacks tokens {n}, which batch {who[1]} has: every batch size "
                               "must list the same token counts")
    fastest = min(t for row in table.values() for t, _ in row.values())
    if fastest < SECONDS_SUSPECT_MS:  # the plan is scale-free; the tokens/s it prints are not
        warnings.warn(f"{p}: the fastest target_ms is {fastest:.4g} ms, below {SECONDS_SUSPECT_MS:g} ms: are the "
                      "times in seconds? the ms columns take milliseconds (x 1000), else every predicted tokens/s "
                      "is 1000x high", ProfileWarning, stacklevel=2)
    if fastest > MICROSECONDS_SUSPECT_MS:
        warnings.warn(f"{p}: the fastest target_ms is {fastest:,.1f} ms, above {MICROSECONDS_SUSPECT_MS:,.0f} ms: are "
                      "the times in microseconds? the ms columns take milliseconds (/ 1000), else every predicted "
                      "tokens/s is 1000x low (ignore this for a large model on a CPU)", ProfileWarning, stacklevel=2)
    pid = profile_id or p.stem
    doc = {"format": BATCH_LATENCY_FORMAT, "id": pid, "source": f"a T(b, n) table: {p.name}",
           "device": {"name": "from the table"}, "model": {}, "batches": []}
    for b in sorted(table):
        doc["batches"].append({"batch": b, "step_overhead_ms": overhead[b], "curves": [{
            "context_tokens": int(context),
            "target": {"tokens": grid, "target_forward_ms": [table[b][n][0] for n in grid]},
            "draft": {"tokens": grid, "draft_forward_ms": [table[b][n][1] for n in grid]}}]})
    return BatchLatencyProfile.from_dict(doc, source=str(p), default_id=pid, table=True)
