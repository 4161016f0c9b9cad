"""Device-tuned linear layers: the CPU forward path at the weights' streaming limit.

A target forward over a few tokens (1 row in plain decoding, 2..64 in tree verification) reads every weight
once, so physics allows T(8) close to T(1). Whether a CPU gets there depends on the GEMM kernel torch picks
for that shape, and the best kernel differs per machine, per weight shape and per row count. Measured on two
machines of one kind (fp32, 2 threads, 1536x576 weight, ms): an Intel Xeon ran 2 rows in 0.065 with
``F.linear`` and 0.20 with ``(W @ x.T).T``; an AMD EPYC ran the same 2 rows faster the other way round. No
fixed rule is right, so :func:`tune_linears` measures: for each distinct weight shape of a model and each
row-count bucket (:data:`ROW_BUCKETS`) it times every candidate kernel and keeps the fastest; the plan is
cached on disk per device, torch version, thread count, dtype and precision (:func:`cache_dir`), so only the
first load on a machine pays for it (seconds).

Kernels (:data:`KERNELS`; each computes ``y = x W^T (+ b)`` for x (rows, in), W (out, in), float32):

==========  ===========================================================================================
``linear``  ``F.linear(x, W)``: MKL's GEMV for one row, its GEMM (rows as the small side) otherwise.
``w_xt``    ``(W @ x^T)^T``: the GEMM with the output features on the long side.
``x_wt``    ``x @ W_t`` on a pre-transposed contiguous copy ``W_t`` (in, out).
``onednn``  oneDNN's inner product on a weight reordered once into its blocked layout
            (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``, the path torch.compile's
            CPU freezing pass uses); one packed copy serves every row count.
``int4``    torch's weight-only int4 kernel (``_weight_int4pack_mm_for_cpu``) on the checkpoint's own 4-bit
            blocks (GGUF Q4_0 / Q4_1: groups of 32 along the input, a scale d and an offset m per group,
            ``w = d q + m = d (q - 8) + (m + 8 d)``, which the kernel's (scale, zero) pair holds exactly).
            Opt-in: precision ``"int4"``.
``int8``    torch's weight-only int8 kernel (``_weight_int8pack_mm``) with one scale per output channel,
            rounded to nearest from the float weights (not exact). Opt-in: precision ``"int8"``.
==========  ===========================================================================================

Precisions (:data:`PRECISIONS`): ``"float32"`` (default; the float kernels, same weights, results equal to
``F.linear`` up to float32 summation order), ``"int4"`` (a linear whose checkpoint tensor is 4-bit blocks may
also run ``int4``, which holds those blocks exactly, so the tuner picks between it and the float kernels per
row count; every other linear keeps the float kernels), ``"int8"`` (every linear runs ``int8`` at every row
count: the weights change, so output can differ from the float model's, but plain and tree decoding run the
same weights).

Candidates are timed on random weights of the shape (a kernel's speed does not depend on the values),
cycling through enough copies to overflow the last-level cache, as a forward's stream of distinct layers
does; each bucket is timed at its largest row count, candidates interleaved, median of repeats. A candidate
must beat ``linear`` by :data:`MIN_GAIN` to replace it, so noise does not swap kernels for nothing.

Only CPU float32 models in inference are tuned: a forward with gradients enabled (distillation), on another
device or dtype, runs ``F.linear`` as before.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch
import torch.nn.functional as F

from .._io import atomic_write_text, folder_locked
from ..errors import CheckpointError, TreeoptError

#: Row-count buckets: a forward over r rows (tokens x batch) runs the kernel tuned for the smallest bucket
#: >= r (each bucket is timed at its own count); r > 128 (prefill) runs the 128 bucket's.
ROW_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)

#: The opt-in weight precisions; ``"float32"`` keeps the checkpoint's float weights.
PRECISIONS: tuple[str, ...] = ("float32", "int4", "int8")

#: A candidate replaces ``linear`` only when its median is at least this fraction faster.
MIN_GAIN: float = 0.03

#: Bumped when a kernel or the timing method changes, so cached plans are measured again.
TUNING_VERSION = 1

_GROUP = 32  # the int4 kernel's group size along the input: one GGUF Q4 block


@dataclass(frozen=True)
class Int4Blocks:
    """A weight as 4-bit groups along its input dimension: ``W[o, i] = scale[o, i // 32] * (q[o, i] - 8) +
    zero[o, i // 32]``.

    Attributes:
        q: (out, in) uint8 codes in 0..15.
        scale, zero: (out, in / 32) float32.
    """

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """(out, in) float32 weight."""
        s = self.scale.repeat_interleave(_GROUP, dim=1)
        z = self.zero.repeat_interleave(_GROUP, dim=1)
        return s * (self.q.float() - 8.0) + z


# ------------------------------------------------------------------------------------------------ kernels
def _onednn_available() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _int4_available() -> bool:
    return (hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")
            and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"))


def _int8_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int8pack_mm")


@dataclass(frozen=True)
class Kernel:
    """One way to compute ``x W^T``.

    Attributes:
        name: the key in plans and profiles.
        prepare: ``(weight (out, in) float32, blocks Int4Blocks | None) -> state`` (what the kernel keeps:
            the weight itself, a transposed copy, a packed copy).
        run: ``(x (rows, in) float32 contiguous, state) -> (rows, out)``.
        available: whether this torch build has the kernel.
        precision: the precision it belongs to.
        fits: ``(out, in) -> bool``, whether the kernel takes a weight of that shape (torch's int4 packing
            wants out % 16 == 0 and in % 32 == 0).
    """

    name: str
    prepare: Callable[[torch.Tensor, Int4Blocks | None], Any]
    run: Callable[[torch.Tensor, Any], torch.Tensor]
    available: Callable[[], bool]
    precision: str
    fits: Callable[[int, int], bool] = lambda out_f, in_f: True


def _prep_int4(weight: torch.Tensor, blocks: Int4Blocks | None):
    if blocks is None:
        raise TreeoptError("the int4 kernel needs the checkpoint's 4-bit blocks")
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(blocks.q.to(torch.int32).contiguous(), 2)
    scales_zeros = torch.stack([blocks.scale.t(), blocks.zero.t()], dim=-1).contiguous()  # (in/32, out, 2)
    return packed, scales_zeros


def _prep_int8(weight: torch.Tensor, blocks: Int4Blocks | None):
    scale = (weight.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)  # (out,)
    q = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()  # (out, in)
    return q, scale.contiguous()


KERNELS: dict[str, Kernel] = {k.name: k for k in (
    Kernel("linear", lambda w, b: w, lambda x, w: F.linear(x, w), lambda: True, "float32"),
    Kernel("w_xt", lambda w, b: w, lambda x, w: torch.mm(w, x.t()).t().contiguous(), lambda: True, "float32"),
    Kernel("x_wt", lambda w, b: w.t().contiguous(), lambda x, wt: torch.mm(x, wt), lambda: True, "float32"),
    Kernel("onednn", lambda w, b: torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), 8),
           lambda x, p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""), _onednn_available,
           "float32"),
    Kernel("int4", _prep_int4, lambda x, s: torch.ops.aten._weight_int4pack_mm_for_cpu(x, s[0], _GROUP, s[1]),
           _int4_available, "int4", lambda out_f, in_f: out_f % 16 == 0 and in_f % (2 * 16) == 0),
    Kernel("int8", _prep_int8, lambda x, s: torch.ops.aten._weight_int8pack_mm(x, s[0], s[1]),
           _int8_available, "int8"),
)}

_FLOAT_KERNELS = ("linear", "w_xt", "x_wt", "onednn")


def candidates(precision: str, has_blocks: bool, shape: tuple[int, int] | None = None) -> tuple[str, ...]:
    """The kernel names timed for one weight under ``precision`` (only those this torch build has, and that
    take a weight of ``shape`` (out, in) when given; ``linear`` when none is left).

    Raises:
        TreeoptError: an unknown precision.
    """
    check_precision(precision)
    if precision == "int8":  # the weights change: every row count must run them, or plain != tree decoding
        names: tuple[str, ...] = ("int8",)
    elif precision == "int4" and has_blocks:  # the blocks are exactly the float weight: either kernel may run
        names = _FLOAT_KERNELS + ("int4",)
    else:
        names = _FLOAT_KERNELS
    out = tuple(n for n in names if KERNELS[n].available() and (shape is None or KERNELS[n].fits(*shape)))
    return out or ("linear",)


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`. Raises TreeoptError (one line) otherwise."""
    if precision not in PRECISIONS:
        raise TreeoptError(f"weight precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return precision


def bucket_of(rows: int) -> int:
    """The index into :data:`ROW_BUCKETS` a forward over ``rows`` rows uses."""
    for i, b in enumerate(ROW_BUCKETS):
        if rows <= b:
            return i
    return len(ROW_BUCKETS) - 1


# ------------------------------------------------------------------------------------------------ dispatch
class LinearDispatch:
    """The tuned kernels of one linear layer: ``bucket -> kernel`` and each chosen kernel's state.

    Called as ``dispatch(x, bias)`` with x (..., in) float32 on the CPU; returns (..., out). Holds only the
    states its chosen kernels need (a transposed or packed copy costs the weight's size again).
    """

    __slots__ = ("choices", "_table", "_states", "out_features", "precision", "shape_key")

    def __init__(self, choices: tuple[str, ...], states: Mapping[str, Any], out_features: int, *,
                 precision: str = "float32", shape_key: str | None = None) -> None:
        self.choices = choices  # one kernel name per ROW_BUCKETS entry
        self._states = dict(states)
        self.out_features = out_features
        self.precision = precision  # what the layer was tuned under (int4 may still pick float kernels)
        self.shape_key = shape_key  # its plan's key, "<out>x<in>[:int4]"
        run = {name: KERNELS[name].run for name in set(choices)}
        # rows -> (run, state) for every rows <= the last bucket, so the hot path is one index
        self._table = [None] + [(run[choices[bucket_of(r)]], self._states[choices[bucket_of(r)]])
                                for r in range(1, ROW_BUCKETS[-1] + 1)]

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        in_features = x.shape[-1]
        rows = x.numel() // max(1, in_features)
        fn, state = self._table[min(rows, ROW_BUCKETS[-1])] if rows else self._table[1]
        y = fn(x.reshape(rows, in_features).contiguous(), state)  # (rows, out)
        if bias is not None:
            y = y + bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def state_bytes(self) -> int:
        """Bytes held beyond the layer's own weight (transposed / packed copies)."""
        total = 0
        for name, st in self._states.items():
            if name in ("linear", "w_xt"):
                continue
            for t in (st if isinstance(st, tuple) else (st,)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size() if t.layout == torch.strided else _mkldnn_bytes(t)
        return total


def _mkldnn_bytes(t: torch.Tensor) -> int:
    return int(math.prod(t.shape)) * t.element_size()


# ------------------------------------------------------------------------------------------------ timing
def _llc_bytes() -> int:
    """Last-level cache size in bytes (Linux sysfs), else 32 MiB."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    best = 0
    try:
        for idx in base.glob("index*"):
            size = (idx / "size").read_text().strip()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            best = max(best, int(size.rstrip("KMG")) * mult)
    except (OSError, ValueError):
        best = 0
    return best or (32 << 20)


def _random_blocks(out_f: int, in_f: int, gen: torch.Generator) -> Int4Blocks:
    q = torch.randint(0, 16, (out_f, in_f), dtype=torch.uint8, generator=gen)
    g = in_f // _GROUP
    return Int4Blocks(q, torch.rand(out_f, g, generator=gen) * 0.01, torch.rand(out_f, g, generator=gen) * 0.01)


def time_kernels(out_features: int, in_features: int, names: Iterable[str], *, rows: Iterable[int] = ROW_BUCKETS,
                 repeats: int = 7, seed: int = 0) -> dict[int, dict[str, float]]:
    """Median ms of one call of each kernel in ``names`` on a random (out, in) float32 weight, per row count.

    Each repeat calls every kernel (in an order rotated per repeat) over a ring of distinct weight copies
    large enough to overflow the last-level cache (at most 64 copies), so a layer's weights stream from
    memory as they do in a forward over a whole model. Warm-up calls are not counted.

    Returns:
        ``{rows: {kernel: ms}}``.
    """
    names = list(names)
    gen = torch.Generator().manual_seed(seed)
    weight_bytes = out_features * in_features * 4
    ring = max(1, min(64, math.ceil(2 * _llc_bytes() / max(1, weight_bytes))))
    states: dict[str, list[Any]] = {n: [] for n in names}
    for _ in range(ring):
        w = torch.randn(out_features, in_features, generator=gen) * 0.02
        blocks = _random_blocks(out_features, in_features, gen) if "int4" in names else None
        for n in names:
            states[n].append(KERNELS[n].prepare(w, blocks))
    out: dict[int, dict[str, float]] = {}
    with torch.inference_mode():
        for r in rows:
            x = torch.randn(r, in_features, generator=gen)
            samples: dict[str, list[float]] = {n: [] for n in names}
            for rep in range(repeats + 1):
                order = names[rep % len(names):] + names[:rep % len(names)]
                for n in order:
                    fn, sts = KERNELS[n].run, states[n]
                    t0 = time.perf_counter()
                    for st in sts:
                        fn(x, st)
                    dt = (time.perf_counter() - t0) * 1e3 / len(sts)
                    if rep:  # repeat 0 warms every kernel up
                        samples[n].append(dt)
            out[int(r)] = {n: statistics.median(v) for n, v in samples.items()}
    return out


def choose(timings: Mapping[int, Mapping[str, float]], min_gain: float = MIN_GAIN) -> tuple[str, ...]:
    """One kernel per :data:`ROW_BUCKETS` entry from :func:`time_kernels`' table: the fastest, unless it
    beats ``linear`` (when timed) by less than ``min_gain``."""
    picks = []
    for b in ROW_BUCKETS:
        row = timings[b]
        best = min(row, key=row.__getitem__)
        if "linear" in row and row[best] > (1.0 - min_gain) * row["linear"]:
            best = "linear"
        picks.append(best)
    return tuple(picks)


# ------------------------------------------------------------------------------------------------ cache
def cache_dir() -> Path:
    """Where tuning plans are kept: ``$TREEOPT_CACHE_DIR/linear`` or ``~/.cache/treeopt/linear``."""
    root = os.environ.get("TREEOPT_CACHE_DIR")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "treeopt"
    return base / "linear"


def _machine_key(precision: str) -> dict[str, Any]:
    from ..device import cpu_name

    return {"device": cpu_name(), "isa": _isa_digest(), "llc_bytes": _llc_bytes(), "torch": str(torch.__version__),
            "threads": torch.get_num_threads(), "dtype": "float32", "precision": precision,
            "version": TUNING_VERSION}


def _isa_digest() -> str:
    """A short digest of the CPU's instruction-set flags (/proc/cpuinfo), so two machines sold under one
    model name (a VM's generic "AMD EPYC") with different vector units do not share a plan."""
    from ..device import cpu_flags

    flags = cpu_flags()
    if flags is None:
        return ""
    return hashlib.sha1(" ".join(sorted(flags)).encode()).hexdigest()[:12]


def _cache_file(key: Mapping[str, Any]) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"{digest}.json"


def _read_cache(path: Path, key: Mapping[str, Any]) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """The cached plan (shape -> one kernel per bucket) and its timings (shape -> {bucket: {kernel: ms}}) for
    ``key``; empty when the file is missing, unreadable, of another key, or names a kernel this build lacks."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, {}
    if not isinstance(doc, dict) or doc.get("key") != dict(key) or not isinstance(doc.get("choices"), dict):
        return {}, {}
    ok = {}
    for shape, picks in doc["choices"].items():
        if (isinstance(picks, list) and len(picks) == len(ROW_BUCKETS)
                and all(isinstance(p, str) and p in KERNELS and KERNELS[p].available() for p in picks)):
            ok[shape] = picks
    timings = doc.get("timings_ms") if isinstance(doc.get("timings_ms"), dict) else {}
    return ok, {s: t for s, t in timings.items() if s in ok}


def _save_cache(path: Path, key: Mapping[str, Any], choices: Mapping[str, list[str]],
                timings: Mapping[str, Any]) -> None:
    """Add the shapes just timed (``choices``: shape -> one kernel per bucket; ``timings``: their ms) to the
    cached plan at ``path``: read again and merged under the cache folder's lock, then replaced atomically. Two
    processes tuning at once (two models' loads) each wrote the plan they had read before timing, and the
    last write dropped the other's shapes, timed again at the next load.

    Raises:
        OutputError: the cache file cannot be written (one line naming it).
    """
    with folder_locked(path.parent):
        merged, merged_timings = _read_cache(path, key)
        merged.update(choices)
        for s in choices:  # a shape timed again: its old timings go with its old choice
            merged_timings.pop(s, None)
        merged_timings.update(timings)
        atomic_write_text(path, json.dumps({"key": dict(key), "choices": merged, "timings_ms": merged_timings},
                                           indent=1, sort_keys=True))


# ------------------------------------------------------------------------------------------------ tuning
@dataclass
class TuningReport:
    """What :func:`tune_linears` chose, for profiles and results.

    Attributes:
        precision: the weight precision.
        choices: ``"<out>x<in>[:int4]" -> {bucket rows: kernel}`` (bucket rows as strings, YAML-friendly).
        timings_ms: ``"<out>x<in>[:int4]" -> {bucket rows: {kernel: median ms}}`` of the candidates timed
            for that shape (here or when the cached plan was made; empty for a shape with one candidate).
        tuned_shapes: shapes timed by this call (the others came from the cache).
        seconds: wall time of this call (timing included).
        extra_bytes: memory held by transposed / packed copies, bytes.
        cache: the cache file.
    """

    precision: str
    choices: dict[str, dict[str, str]]
    timings_ms: dict[str, dict[str, dict[str, float]]]
    tuned_shapes: list[str]
    seconds: float
    extra_bytes: int
    cache: str



def _linears(model: torch.nn.Module):
    from .llama import Linear

    return [(name, m) for name, m in model.named_modules() if isinstance(m, Linear)]


def tune_linears(model: torch.nn.Module, *, precision: str = "float32",
                 blocks: Mapping[str, Int4Blocks] | None = None, use_cache: bool = True,
                 log: Callable[[str], None] | None = None, repeats: int = 7) -> TuningReport | None:
    """Tune every :class:`~sequoia_opt.model.llama.Linear` of a CPU float32 ``model`` in place.

    Args:
        model: a :class:`~sequoia_opt.model.llama.Transformer` (or any module holding such layers), on the CPU
            in float32; on another device or dtype nothing is done and None is returned.
        precision: one of :data:`PRECISIONS`.
        blocks: parameter name (``layers.0.mlp.up_proj.weight``) -> its checkpoint's 4-bit blocks
            (:func:`~sequoia_opt.model.gguf_loader.gguf_int4_blocks`); used with ``precision="int4"``.
        use_cache: read and extend the on-disk plan (:func:`cache_dir`); False times everything again.
        log: called with one line when shapes are timed (they take seconds).
        repeats: timing repeats per bucket.

    Returns:
        the :class:`TuningReport`, or None when the model is not a CPU float32 model.

    Raises:
        TreeoptError: an unknown precision; CheckpointError: a block's shape does not match its weight.
    """
    check_precision(precision)
    layers = _linears(model)
    if not layers:
        return None
    w0 = layers[0][1].weight
    if w0.device.type != "cpu" or w0.dtype != torch.float32:
        return None
    t_start = time.perf_counter()
    blocks = dict(blocks or {}) if precision == "int4" else {}
    key = _machine_key(precision)
    path = _cache_file(key)
    cached, timings = _read_cache(path, key) if use_cache else ({}, {})
    shapes: dict[str, tuple[int, int, bool]] = {}
    for name, lin in layers:
        has = f"{name}.weight" in blocks
        if has:
            b = blocks[f"{name}.weight"]
            if tuple(b.q.shape) != tuple(lin.weight.shape) or b.scale.shape[1] * _GROUP != lin.weight.shape[1]:
                raise CheckpointError(f"{name}.weight: 4-bit blocks {tuple(b.q.shape)} do not match the weight "
                                      f"{tuple(lin.weight.shape)}")
        shapes[_shape_key(lin.out_features, lin.in_features, has)] = (lin.out_features, lin.in_features, has)
    todo = [s for s in shapes if s not in cached]
    if todo and log is not None:
        log(f"tuning CPU linear kernels for {len(todo)} weight shape(s) ({precision}); cached in {path}")
    for s in todo:
        out_f, in_f, has = shapes[s]
        names = candidates(precision, has, (out_f, in_f))
        if len(names) > 1:
            table = time_kernels(out_f, in_f, names, repeats=repeats)
            cached[s] = list(choose(table))
            timings[s] = {str(b): {k: round(v, 5) for k, v in table[b].items()} for b in ROW_BUCKETS}
        else:
            cached[s] = [names[0]] * len(ROW_BUCKETS)
            timings.pop(s, None)
    if todo:
        _save_cache(path, key, {s: cached[s] for s in todo}, {s: timings[s] for s in todo if s in timings})
    extra = 0
    seen: dict[int, LinearDispatch] = {}
    for name, lin in layers:
        has = f"{name}.weight" in blocks
        picks = tuple(cached[_shape_key(lin.out_features, lin.in_features, has)])
        wid = id(lin.weight)
        if wid in seen and seen[wid].choices == picks:  # tied weights share one dispatch and its copies
            lin.dispatch = seen[wid]
            continue
        with torch.no_grad():
            w = lin.weight.detach()
            states = {n: KERNELS[n].prepare(w, blocks.get(f"{name}.weight")) for n in set(picks)}
        lin.dispatch = seen[wid] = LinearDispatch(picks, states, lin.out_features, precision=precision,
                                                  shape_key=_shape_key(lin.out_features, lin.in_features, has))
        extra += lin.dispatch.state_bytes()
    choices = {s: {str(b): k for b, k in zip(ROW_BUCKETS, cached[s])} for s in sorted(shapes)}
    return TuningReport(precision, choices, {s: timings[s] for s in sorted(shapes) if s in timings}, todo,
                        time.perf_counter() - t_start, extra, str(path))


def _shape_key(out_f: int, in_f: int, int4: bool) -> str:
    return f"{out_f}x{in_f}" + (":int4" if int4 else "")


def untune(model: torch.nn.Module) -> None:
    """Drop every tuned kernel of ``model``: its linears run ``F.linear`` again (and free their copies)."""
    for _, lin in _linears(model):
        lin.dispatch = None


def tuning_of(model: torch.nn.Module) -> dict[str, dict[str, str]] | None:
    """``"<out>x<in>[:int4]" -> {bucket rows: kernel}`` of a tuned model (None when no linear is tuned)."""
    out: dict[str, dict[str, str]] = {}
    for _, lin in _linears(model):
        if lin.dispatch is not None:
            key = lin.dispatch.shape_key or _shape_key(lin.out_features, lin.in_features, "int4" in lin.dispatch.choices)
            out[key] = {str(b): k for b, k in zip(ROW_BUCKETS, lin.dispatch.choices)}
    return out or None


def linear_record(model: torch.nn.Module) -> dict[str, Any] | None:
    """What a latency profile records under ``device.linear`` about ``model``'s linears: the weight
    precision, the row buckets and ``"<out>x<in>[:int4]" -> {bucket rows: kernel}``; None when untuned
    (every linear runs ``F.linear``)."""
    kernels = tuning_of(model)
    if kernels is None:
        return None
    tuned = [m.dispatch for _, m in _linears(model) if m.dispatch is not None]
    precisions = {d.precision for d in tuned}
    precision = precisions.pop() if len(precisions) == 1 else "mixed"
    return {"precision": precision, "tuning_version": TUNING_VERSION, "row_buckets": list(ROW_BUCKETS),
            "kernels": kernels}
