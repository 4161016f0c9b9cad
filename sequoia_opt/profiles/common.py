"""What every profile format shares: the format names, the bounds on numbers, the acceptance-vector check, the
Wilson interval, and the YAML reading and field helpers every loader uses (one line per problem, naming the file
and the key)."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import yaml

from .._io import check_numbers, load_json, read_text_file, safe_load_yaml, with_article, yaml_error_text
from ..errors import ProfileError, SolverError

ACCEPTANCE_FORMAT = "treeopt-acceptance/1"


LATENCY_FORMAT = "treeopt-latency/1"


#: A light and a strong drafter measured together (:class:`PairAcceptanceProfile`, issue 16).
PAIR_ACCEPTANCE_FORMAT = "treeopt-acceptance-pair/1"


#: The top-level keys each format reads or writes; any other is warned of by name (:func:`warn_unknown_keys`:
#: a misspelt optional key was ignored without a word). ``measured``, ``device``, ``model`` and ``engine`` are
#: provenance, free-form below their first level.
ACCEPTANCE_KEYS = ("format", "id", "example", "source", "measured", "acceptance", "counts", "acceptance_by_depth",
                   "counts_by_prompt", "chain_traces")
LATENCY_KEYS = ("format", "id", "example", "source", "date", "device", "model", "engine", "step_overhead_ms",
                "curves")
#: the keys of one entry of a latency profile's ``curves`` (one context length)
LATENCY_CURVE_KEYS = ("context_tokens", "target", "draft", "loop", "row_context_tokens")
PAIR_ACCEPTANCE_KEYS = ("format", "id", "example", "source", "drafters", "cost_models", "measured", "light_width",
                        "strong_width", "outcome_counts_by_depth")


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

#: the deepest depth a profile's per-depth rows may name: the solvers build one row per depth up to the deepest,
#: so a depth of 2**31 - 1 took minutes and gigabytes before any error (no tree treeopt solves is this deep)
MAX_PROFILE_DEPTH = 4096


#: The largest time a file may hold, in ms (1e9 ms, about 11.6 days: past it a figure is not a measurement).
MAX_MS = 1e9


#: A T(b, n) table whose fastest target forward is below this many ms reads as one typed in seconds (no LLM's
#: forward, graphs and engine scheduling included, runs in 50 microseconds): loading warns (a plan is the same on
#: a scaled table, its predicted tokens/s are 1000x off).
SECONDS_SUSPECT_MS = 0.05

#: A T(b, n) table whose fastest target forward (one token a request, the smallest batch) is above this many ms
#: reads as one typed in microseconds (a GPU step of 7 ms typed as 7000; only a large model on a CPU is that slow):
#: loading warns (every predicted tokens/s would be 1000x low).
MICROSECONDS_SUSPECT_MS = 2000.0

#: A forward over n > 1 tokens measured below this fraction of the one-token forward is implausible (more
#: work in less than half the time: noise, a machine under other load, a cache effect): loading warns.
IMPLAUSIBLE_FRACTION = 0.5

#: A target forward over n tokens measured above this factor times n / m x the one over the m < n tokens measured
#: before it is implausible: a forward's work grows at most about in proportion to its tokens (a point typed 10x
#: off, or one timed under other load): loading warns.
IMPLAUSIBLE_GROWTH = 2.0


# ---------------------------------------------------------------------------------------------- helpers
def validate_acceptance(acceptance: Any, *, error: type[Exception] = SolverError, what: str = "acceptance vector") -> np.ndarray:
    """Check a positional acceptance vector and return it as a ``(K,)`` float64 array.

    Raises ``error`` (default :class:`SolverError`) with one line when it is not a 1-D sequence of numbers,
    is empty, holds NaN / inf or a negative entry, or sums above ``1 + SUM_TOLERANCE`` (Sequoia section 3.1:
    the entries are probabilities of disjoint events).
    """
    if isinstance(acceptance, (str, bytes)) or isinstance(acceptance, Mapping):
        raise error(f"{what} must be a list of probabilities, got {type(acceptance).__name__}")
    if isinstance(acceptance, (list, tuple)) and any(isinstance(x, bool) for x in acceptance):  # numpy reads 1, 0
        raise error(f"{what} holds true / false where probabilities belong")
    if isinstance(acceptance, (list, tuple)) and any(isinstance(x, (str, bytes)) for x in acceptance):  # numpy reads '0.6'
        raise error(f"{what} holds text where probabilities belong (write 0.62, not '0.62')")
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


#: the two-sided 95 % quantile of the normal distribution (Student's t past 30 degrees of freedom)
Z975 = NormalDist().inv_cdf(0.975)


def wilson_interval(k: float, n: float, z: float = Z975) -> tuple[float, float]:
    """Wilson score interval (low, high) for a proportion of ``k`` successes in ``n`` trials, default 95 %
    (``k`` may be an expected count); (0, 1) when ``n`` is 0."""
    if n <= 0:
        return 0.0, 1.0
    phat, z2 = k / n, z * z
    centre = (phat + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(max(phat * (1 - phat), 0.0) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(centre - half, 0.0), min(centre + half, 1.0)


def table_lines(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    """The lines of a T(b, n) table that hold its header and rows, with their 1-based line numbers in the file:
    blank lines and ``#`` comments (indented ones too) are skipped
    (:func:`~sequoia_opt.profiles.batch.load_batch_table`)."""
    for i, line in enumerate(lines, start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            yield i, line


def starts_like_table(lines: Iterable[str]) -> bool:
    """Whether the first of :func:`table_lines` begins a T(b, n) table's header (``batch,tokens,``): a table is
    told by its header, whatever the file's name."""
    first = next(table_lines(lines), (0, ""))[1]
    return first.replace(" ", "").replace("\t", ",").startswith("batch,tokens,")  # comma- or tab-separated


#: The command that writes each kind of file :func:`_load_yaml` reads (named where a table was given instead).
_WRITTEN_BY = {"latency": "treeopt profile latency", "acceptance": "treeopt profile acceptance",
               "calibration": "treeopt profile acceptance --calibration", "acceptance pair": "treeopt profile graft",
               "schedule": "treeopt tune --schedule"}


def _depth_key(key: Any) -> Any:
    """A per-depth mapping's key as the int depth when JSON wrote it as text (``"2"``: JSON's keys are always
    strings; ASCII digits only, at most 9 of them, so ``int`` cannot fail); any other key as it is, for the caller's
    own check to name."""
    return int(key) if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 9 else key


def _json_document(text: str) -> Any:
    """A JSON object's document, read by JSON's rules, or None when the text is not one (then it is read as YAML).
    YAML 1.1, which PyYAML reads, takes JSON's ``3e-05`` (no dot) for a string: a profile written by ``json.dumps``
    was refused ("must be a number, got '3e-05'")."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        doc = load_json(text)
    except ValueError:  # not JSON (a YAML flow mapping, or broken): YAML's reading names what is wrong
        return None
    return doc if isinstance(doc, dict) else None


def _load_yaml(path: str | Path, kind: str) -> tuple[dict[str, Any], Path]:
    path = Path(path)
    text = read_text_file(path, error=ProfileError, what=f"{kind} profile")
    try:
        doc = _json_document(text)
        if doc is None:
            doc = safe_load_yaml(text)
    except yaml.YAMLError as err:  # YAML reads JSON too: a .json file is named as what it is meant to be
        lang = "JSON" if path.suffix.lower() == ".json" else "YAML"
        raise ProfileError(f"{path}: not valid {lang} ({yaml_error_text(err)})") from None
    a_profile = with_article(f"{kind} profile")  # "an acceptance profile"
    if doc is None:
        what = "the file is empty" if not text.strip() else "the file holds only comments"
        raise ProfileError(f"{path}: {what} (expected {a_profile})")
    if not isinstance(doc, dict):
        if starts_like_table(text.splitlines()):  # a user's T(b, n) table where a profile belongs
            raise ProfileError(f"{path}: a T(b, n) table, not {a_profile}: treeopt tune and solve "
                               f"--batch read tables; here give {a_profile}"
                               + (f" ({_WRITTEN_BY[kind]} writes one)" if kind in _WRITTEN_BY else ""))
        raise ProfileError(f"{path}: {a_profile} must be a YAML mapping with a 'format' key")
    check_numbers(doc, str(path), ProfileError)
    return doc, path


def _check_format(doc: Mapping[str, Any], expected: str, src: str) -> None:
    fmt = doc.get("format")
    if fmt == expected:
        return
    family = expected.split("/")[0]
    if isinstance(fmt, str) and fmt.startswith(family + "/"):
        raise ProfileError(f"{src}: format version {fmt!r} is not supported; this version reads {expected!r}")
    if fmt is None:
        raise ProfileError(f"{src}: no 'format' key (expected format: {expected})")
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


def _check_sampling(measured: Mapping[str, Any], source: str, extra: tuple[str, ...] = ()) -> None:
    """``measured.temperature`` and ``measured.top_p`` (and the ``extra`` keys) as :func:`_number` reads a profile's
    numbers; top_p in (0, 1]. The acceptance and calibration profiles' one check. Raises ProfileError."""
    for key in ("temperature", "top_p", *extra):
        if measured.get(key) is not None:
            _number(measured[key], f"{source}: measured.{key}")
    top_p = measured.get("top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise ProfileError(f"{source}: measured.top_p = {top_p} must be in (0, 1]")


def check_integer(value: Any, where: str, *, low: int = 0, high: int = MAX_COUNT,
                  error: type[Exception] = ProfileError) -> int:
    """An integer in ``[low, high]`` from a file (bools, floats, inf and NaN refused: a count is written as an
    integer), as a Python int. The bounds keep every value inside int64 (:data:`MAX_COUNT`, :data:`MAX_TOKENS`).

    Raises:
        error (default ProfileError): not an integer, below ``low`` or above ``high``; one line naming ``where``
            and the range.
    """
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
