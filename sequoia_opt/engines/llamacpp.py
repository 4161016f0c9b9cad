"""llama.cpp as a serving engine, through llama-cpp-python's low-level API (issue 20): its latency curve, its
speculative decoding (a chain), and the chain settings solved on its curve.

* :class:`LlamaCppModel` — one GGUF in one llama.cpp context: ``decode`` a ``llama_batch`` with logits for the
  positions asked for, ``seq_rm`` to drop KV cells (the ``llama_memory_seq_rm`` API).
* :func:`profile_latency` — T(n): one target ``llama_decode`` over n tokens after ``context`` cached tokens
  *with logits for all n positions* (verification reads them all), the draft's c(w) the same way, and the
  per-step overhead of a speculative step outside the two models' forwards; in the ``treeopt-latency/1``
  format with ``engine: {name: llama.cpp, version}``.
* :func:`generate` — greedy chain speculative decoding (draft-max N, draft-min M, draft-p-min P exactly as
  llama.cpp's ``common/speculative.cpp`` ``draft-simple`` applies them) and, with N = 0, plain decoding: the
  draft proposes up to N tokens one forward at a time, stopping early at a top-1 probability below P (over
  its top 10 logits, as llama.cpp's draft sampler has top_k 10); fewer than M drafted tokens are dropped; the
  target verifies [last token, drafts] in one batch with logits for each; the longest prefix equal to the
  target's argmax is accepted plus the target's next token; rejected KV cells are removed from both
  contexts. Greedy output is the target's own greedy output (Leviathan et al. 2023, section 2.3).
* :func:`measure_acceptance` — the greedy positional acceptance vector on llama.cpp's own logits, teacher-forced
  along the target's greedy output: the rank of the target's token among the draft's logits at each position.
* :func:`solve_chain` / :func:`chain_flags` — the hardware-aware chain (a tree of width 1, Sequoia DP with
  branching 1 and :func:`~sequoia_opt.solver.hardware.choose`), as ``llama-server`` / ``llama-cli`` flags.

Flags are those of the llama.cpp vendored by llama-cpp-python 0.3.36 (commit 0c1e570, 2026-10-01):
``--spec-type draft-simple --spec-draft-n-max N --spec-draft-n-min M --spec-draft-p-min P``; it removed the
older ``--draft-max`` / ``--draft-min`` (``arg_removed``), and a plain Llama draft GGUF needs ``--spec-type
draft-simple`` (the type is inferred only for MTP / DFlash drafts). Prompt lookup is ``--spec-type
ngram-simple --spec-ngram-simple-size-n N --spec-ngram-simple-size-m M``.
"""

from __future__ import annotations

import ctypes
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from . import EngineError, require_engine

ProgressFn = Callable[[str, int, int], None]

#: llama.cpp's draft sampler keeps the top 10 logits (common/speculative.cpp, draft-simple): P is read there.
DRAFT_TOP_K = 10

_LOG: list[str] = []  # llama.cpp's error lines of the current load (the callback below appends them)
_CALLBACK = None


def _install_log(llama_cpp: Any) -> None:
    """Route llama.cpp's log through one callback that keeps error lines (to name why a GGUF is refused) and
    prints nothing else."""
    global _CALLBACK
    if _CALLBACK is not None:
        return

    @llama_cpp.llama_log_callback
    def _cb(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:  # noqa: ARG001
        if level in (3, 4):  # GGML_LOG_LEVEL_ERROR: 4 in this ggml (NONE, DEBUG, INFO, WARN, ERROR), 3 in older ones
            _LOG.append(text.decode("utf-8", "replace").strip())

    _CALLBACK = _cb
    llama_cpp.llama_log_set(_cb, ctypes.c_void_p(0))


def engine_info() -> dict[str, str]:
    """``{"name": "llama.cpp", "version": <llama-cpp-python version>, "system": <llama.cpp's CPU features>}``
    for a profile's ``engine`` key. Raises EngineError when llama-cpp-python is not installed."""
    llama_cpp = require_engine("llama.cpp")
    info = {"name": "llama.cpp", "version": f"llama-cpp-python {llama_cpp.__version__}"}
    try:
        info["system"] = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    except Exception:  # noqa: BLE001 - informational only
        pass
    return info


class LlamaCppModel:
    """One GGUF model in one llama.cpp context (batch 1 sequence unless ``n_seq_max``), CPU threads given.

    Args:
        path: the ``.gguf`` file.
        n_ctx: KV cache size in tokens (context + the largest batch).
        n_threads: threads for single-token and batched decodes (both ``n_threads`` and ``n_threads_batch``).
        n_batch: most tokens one :meth:`decode` takes (default ``min(n_ctx, 512)``).
        n_seq_max: sequences the context holds (1 for a chain).
        kv_type: the KV cache's element type, ``"f16"`` (llama.cpp's default, what a server runs) or ``"f32"``.
        flash_attn: llama.cpp's flash attention; ``None`` lets llama.cpp choose (its default, "auto"). Its CPU
            kernel rounds queries to f16, so with ``kv_type="f32"`` and ``flash_attn=False`` the logits of an F32
            GGUF match a float32 reference to ~1e-5; with the defaults, to ~3e-3.

    Raises:
        EngineError: llama-cpp-python missing, or llama.cpp refusing the file (its error message, one line).
    """

    def __init__(self, path: str | Path, *, n_ctx: int = 2048, n_threads: int = 2, n_batch: int | None = None,
                 n_seq_max: int = 1, kv_type: str = "f16", flash_attn: bool | None = None) -> None:
        if kv_type not in ("f16", "f32"):
            raise EngineError(f"kv_type must be 'f16' or 'f32', got {kv_type!r}")
        self._lib = lib = require_engine("llama.cpp")
        _install_log(lib)
        lib.llama_backend_init()
        self.path = Path(path)
        if not self.path.is_file():
            raise EngineError(f"GGUF file not found: {self.path}")
        _LOG.clear()
        mparams = lib.llama_model_default_params()
        self._model = lib.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            raise EngineError(f"llama.cpp refuses {self.path}: {_why()}")
        self.n_batch = int(n_batch or min(n_ctx, 512))
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = int(n_ctx)
        cparams.n_batch = cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = int(n_seq_max)
        cparams.n_threads = cparams.n_threads_batch = int(n_threads)
        cparams.no_perf = True
        cparams.type_k = cparams.type_v = lib.GGML_TYPE_F32 if kv_type == "f32" else lib.GGML_TYPE_F16
        if flash_attn is not None:
            cparams.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                       else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lib.llama_model_free(self._model)
            raise EngineError(f"llama.cpp cannot make a context for {self.path}: {_why()}")
        self.n_ctx = int(lib.llama_n_ctx(self._ctx))
        self.n_threads = int(n_threads)
        self.n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model)))
        self._mem = lib.llama_get_memory(self._ctx)
        self._batch = lib.llama_batch_init(self.n_batch, 0, max(1, int(n_seq_max)))

    # -------------------------------------------------------------- forwards
    def decode(self, tokens: Sequence[int], start: int, *, logits: bool | Sequence[bool] = True,
               seq_ids: Sequence[Sequence[int]] | None = None, positions: Sequence[int] | None = None) -> None:
        """One ``llama_decode`` over ``tokens`` at positions ``start, start + 1, ...`` (or ``positions``) of
        sequence 0 (or ``seq_ids[i]``), with logits for every token (``logits=True``), the last only
        (``False``), or per token. Read them with :meth:`logits`.

        Raises:
            EngineError: more tokens than ``n_batch``, or llama.cpp's decode failing (its return code).
        """
        n = len(tokens)
        if n == 0 or n > self.n_batch:
            raise EngineError(f"a llama.cpp batch holds 1..{self.n_batch} tokens, got {n}")
        b = self._batch
        b.n_tokens = n
        for i, t in enumerate(tokens):
            b.token[i] = int(t)
            b.pos[i] = int(positions[i]) if positions is not None else start + i
            ids = seq_ids[i] if seq_ids is not None else (0,)
            b.n_seq_id[i] = len(ids)
            for j, s in enumerate(ids):
                b.seq_id[i][j] = int(s)
            b.logits[i] = int(bool(logits if isinstance(logits, bool) else logits[i]) or
                              (logits is False and i == n - 1))
        rc = self._lib.llama_decode(self._ctx, b)
        if rc != 0:
            raise EngineError(f"llama_decode returned {rc} ({self.path.name}, {n} tokens at position {start}; "
                              f"context {self.n_ctx} tokens)")

    def logits(self, rows: int) -> np.ndarray:
        """(rows, n_vocab) float32 view of the last decode's logits, in batch order of the tokens that asked
        for them (valid until the next decode)."""
        ptr = self._lib.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab))

    def synchronize(self) -> None:
        self._lib.llama_synchronize(self._ctx)

    def seq_rm(self, p0: int, p1: int = -1, seq: int = 0) -> None:
        """Remove sequence ``seq``'s KV cells at positions [p0, p1) (p1 = -1: to the end)."""
        if not self._lib.llama_memory_seq_rm(self._mem, seq, int(p0), int(p1)):
            raise EngineError(f"llama.cpp could not remove KV cells [{p0}, {p1}) of sequence {seq}")

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        """llama.cpp's own tokenization of ``text`` with the GGUF's tokenizer (special tokens in the text
        parsed as such; BOS added only with ``add_special`` and the file's ``add_bos_token``)."""
        lib = self._lib
        raw = text.encode("utf-8")
        vocab = lib.llama_model_get_vocab(self._model)
        buf = (lib.llama_token * (len(raw) + 8))()
        n = lib.llama_tokenize(vocab, raw, len(raw), buf, len(buf), add_special, True)
        if n < 0:
            raise EngineError(f"llama.cpp could not tokenize {len(raw)} bytes (needs {-n} tokens)")
        return [int(buf[i]) for i in range(n)]

    def clear(self) -> None:
        """Empty the KV cache."""
        self._lib.llama_memory_clear(self._mem, True)

    def prefill(self, tokens: Sequence[int]) -> None:
        """Decode ``tokens`` from position 0 in ``n_batch`` chunks, logits for the last token only."""
        for s in range(0, len(tokens), self.n_batch):
            chunk = tokens[s: s + self.n_batch]
            self.decode(chunk, s, logits=False)

    def close(self) -> None:
        lib = self._lib
        if getattr(self, "_ctx", None):
            lib.llama_batch_free(self._batch)
            lib.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            lib.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "LlamaCppModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # noqa: D105
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _why() -> str:
    """llama.cpp's reason for the last failure: its first error line, without the function-name prefixes
    (``llama_model_load: error loading model: cannot find tokenizer merges in model file`` -> the reason)."""
    lines = [ln for ln in _LOG if "error" in ln.lower() or "fail" in ln.lower()] or [ln for ln in _LOG if ln]
    if not lines:
        return "no reason given (see llama.cpp's log)"
    line = lines[0]
    for prefix in ("llama_model_load: ", "error loading model: ", "llama_model_load_from_file_impl: "):
        line = line.split(prefix, 1)[1] if prefix in line else line
    return line


def check_gguf(path: str | Path) -> None:
    """Load ``path`` in llama.cpp (metadata and memory-mapped weights, no context) and release it: refuse early, in one line
    with llama.cpp's own message, a GGUF it will not run. Raises EngineError."""
    lib = require_engine("llama.cpp")
    _install_log(lib)
    lib.llama_backend_init()
    path = Path(path)
    if not path.is_file():
        raise EngineError(f"GGUF file not found: {path}")
    _LOG.clear()
    params = lib.llama_model_default_params()
    model = lib.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise EngineError(f"llama.cpp refuses {path}: {_why()}")
    lib.llama_model_free(model)


# ---------------------------------------------------------------------------------------------- decoding
@dataclass
class ChainSetting:
    """llama.cpp's speculative settings for a draft model (``--spec-draft-n-max/-n-min/-p-min``).

    Attributes:
        n_max: draft tokens per step at most (0: no speculation, plain decoding).
        n_min: a step that drafted fewer is run without them.
        p_min: drafting stops at a draft top-1 probability (over its top 10 logits) below this.
    """

    n_max: int
    n_min: int = 0
    p_min: float = 0.0


@dataclass
class Step:
    """One decoding step: tokens drafted and accepted, the ms spent in each part."""

    drafted: int
    accepted: int
    emitted: int
    draft_ms: float
    verify_ms: float
    bookkeeping_ms: float


@dataclass
class Generation:
    """A greedy generation: the new tokens and every step."""

    tokens: list[int]
    steps: list[Step] = field(default_factory=list)
    wall_ms: float = 0.0

    @property
    def tokens_per_step(self) -> float:
        return len(self.tokens) / max(1, len(self.steps))


def _top1(row: np.ndarray) -> tuple[int, float]:
    """The argmax of a logit row and its probability among the row's top :data:`DRAFT_TOP_K` logits."""
    k = min(DRAFT_TOP_K, row.size)
    top = np.argpartition(row, -k)[-k:]
    vals = row[top].astype(np.float64)
    best = int(top[int(np.argmax(vals))])
    e = np.exp(vals - vals.max())
    return best, float(1.0 / e.sum())


def generate(target: LlamaCppModel, prompt: Sequence[int], max_new_tokens: int, *,
             draft: LlamaCppModel | None = None, setting: ChainSetting | None = None,
             eos_ids: Iterable[int] = ()) -> Generation:
    """Greedy decoding of ``max_new_tokens`` after ``prompt`` on llama.cpp: plain (no draft or ``n_max`` 0,
    one target decode per token) or chain speculative decoding (module docstring). Stops after an EOS id.

    Both contexts are cleared first. Draft forwards: the first of a step covers the committed tokens the draft
    has not seen (the last step's bonus token, and its last draft when every draft was accepted), then one
    token per drafted token, as many as the draft needs to propose ``n_max`` tokens.

    Raises:
        EngineError: prompt + tokens past a context, an empty prompt.
    """
    setting = setting or ChainSetting(0)
    spec = draft is not None and setting.n_max > 0
    if not prompt:
        raise EngineError("the prompt is empty")
    need = len(prompt) + max_new_tokens + setting.n_max + 1
    for m in (target, draft) if spec else (target,):
        if need > m.n_ctx:
            raise EngineError(f"{len(prompt)} prompt + {max_new_tokens} new + {setting.n_max + 1} verified tokens "
                              f"exceed {m.path.name}'s context of {m.n_ctx} tokens")
    eos = set(int(i) for i in eos_ids)
    t_start = time.perf_counter()
    target.clear()
    seq = [int(t) for t in prompt]
    target.prefill(seq[:-1]) if len(seq) > 1 else None
    n_past = len(seq) - 1  # target KV holds seq[:n_past]; seq[-1] is the root of the next step
    d_past = 0
    if spec:
        draft.clear()
    out: list[int] = []
    steps: list[Step] = []
    while len(out) < max_new_tokens:
        t0 = time.perf_counter()
        drafts: list[int] = []
        draft_ms = 0.0
        if spec:
            room = min(setting.n_max, max_new_tokens - len(out) - 1)
            if room > 0:
                td = time.perf_counter()
                pending = seq[d_past:]
                draft.decode(pending, d_past, logits=False)
                d_past = len(seq)
                while True:
                    tok, prob = _top1(draft.logits(1)[0])
                    if prob < setting.p_min:
                        break
                    drafts.append(tok)
                    if len(drafts) >= room:
                        break
                    draft.decode([tok], d_past, logits=False)
                    d_past += 1
                draft_ms = (time.perf_counter() - td) * 1e3
                if len(drafts) < setting.n_min:
                    drafts = []
        tv = time.perf_counter()
        target.decode([seq[-1]] + drafts, n_past, logits=True)
        rows = target.logits(len(drafts) + 1)
        verify_ms = (time.perf_counter() - tv) * 1e3  # the decode and reading its logits are the forward
        best = rows.argmax(axis=1)
        j = 0
        while j < len(drafts) and drafts[j] == int(best[j]):
            j += 1
        new = drafts[:j] + [int(best[j])]
        if len(drafts) > j:  # rejected drafts' KV cells: the target's beyond root + accepted, the draft's likewise
            target.seq_rm(n_past + j + 1)
        n_past += j + 1
        if spec and d_past > n_past:
            draft.seq_rm(n_past)
            d_past = n_past
        stop = False
        for t in new:
            out.append(t)
            seq.append(t)
            if t in eos or len(out) >= max_new_tokens:
                stop = True
                break
        total = (time.perf_counter() - t0) * 1e3
        steps.append(Step(len(drafts), j, len(new), draft_ms, verify_ms, max(0.0, total - draft_ms - verify_ms)))
        if stop:
            break
    return Generation(out, steps, (time.perf_counter() - t_start) * 1e3)


# ---------------------------------------------------------------------------------------------- profiling
def _filled(model: LlamaCppModel, context: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    model.clear()
    if context:
        model.prefill(rng.integers(0, model.n_vocab, context).tolist())


def forward_calls(model: LlamaCppModel, *, seed: int = 0) -> Callable[[int], Callable[[int], Callable[[], None]]]:
    """``calls_at(context)`` for :func:`~sequoia_opt.profiling.latency.engine_timers`: fills ``model``'s KV
    cache with ``context`` random tokens and returns ``call(n)``, a closure running one ``llama_decode`` over
    n random tokens at positions ``context..context + n - 1`` with logits for all n, then removing their cells."""
    rng = np.random.default_rng(seed)

    def calls_at(ctx: int) -> Callable[[int], Callable[[], None]]:
        _filled(model, ctx, seed)

        def call(n: int) -> Callable[[], None]:
            toks = rng.integers(0, model.n_vocab, n).tolist()

            def run() -> None:
                model.decode(toks, ctx, logits=True)
                model.synchronize()
                model.seq_rm(ctx)

            return run

        return call

    return calls_at


def measure_step_overhead(target: LlamaCppModel, draft: LlamaCppModel, *, n_max: int = 4, prompt_len: int = 32,
                          steps: int = 24, seed: int = 0) -> float:
    """The per-step cost of a chain speculative step outside the two models' forwards (ms): argmax of the
    verified rows, the acceptance test, ``seq_rm`` of both contexts, the batches' filling, stop checks; the
    median of :attr:`Step.bookkeeping_ms` over ``steps`` steps of :func:`generate` on a random prompt."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, target.n_vocab, prompt_len).tolist()
    gen = generate(target, prompt, steps * (n_max + 1), draft=draft, setting=ChainSetting(n_max))
    return float(statistics.median(s.bookkeeping_ms for s in gen.steps[:steps])) if gen.steps else 0.0


def _file_type(path: Path) -> str:
    from ..model.gguf_loader import _field, open_gguf

    from gguf import LlamaFileType

    ft = _field(open_gguf(path), "general.file_type", None)
    try:
        return LlamaFileType(int(ft)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):
        return "unknown"


def profile_latency(target_path: Path, draft_path: Path | None, *, contexts: Sequence[int],
                    token_counts: Sequence[int], draft_token_counts: Sequence[int], n_threads: int = 2,
                    rounds: int = 3, paired: bool = True, max_repeats: int = 30, progress: ProgressFn | None = None,
                    target_name: str | None = None, draft_name: str | None = None):
    """The llama.cpp latency profile of a target GGUF and a draft GGUF (``treeopt-latency/1`` with ``engine``):
    T(n) and c(w) with logits for every position (:func:`forward_calls`, timed by
    :func:`~sequoia_opt.profiling.latency.sweep_grid` with its rounds and pairing against n = 1), and the
    per-step overhead (:func:`measure_step_overhead`). ``draft_path`` None records no draft (0 ms).

    Returns:
        the validated :class:`~sequoia_opt.profiles.LatencyCurve`.

    Raises:
        EngineError: llama-cpp-python missing, a GGUF llama.cpp refuses, a context + n past a model's context.
    """
    import torch

    from ..model.loaders import load_model_config
    from ..profiling.device import cpu_name, device_slug
    from ..profiling.latency import build_latency_profile, engine_timers, method_text, sweep_grid

    tcfg = load_model_config(target_path)
    dcfg = load_model_config(draft_path) if draft_path is not None else None
    widest = max(max(token_counts), max(draft_token_counts))
    for cfg, path in ((tcfg, target_path), (dcfg, draft_path)):
        if cfg is not None and max(contexts) + widest > cfg.max_position_embeddings:
            raise EngineError(f"context {max(contexts)} + {widest} tokens exceeds {Path(path).name}'s context of "
                              f"{cfg.max_position_embeddings} tokens")
    n_ctx = max(max(contexts) + widest + 8, 256)  # 256: what measure_step_overhead's run needs
    kw = dict(min_repeats=min(5, max_repeats), max_repeats=max_repeats)
    with LlamaCppModel(target_path, n_ctx=n_ctx, n_threads=n_threads) as tm:
        ttables = sweep_grid(engine_timers(forward_calls(tm), "cpu", **kw), token_counts, contexts, what="target",
                             progress=progress, rounds=rounds, paired=paired)
        dtables, overhead = None, 0.0
        if draft_path is not None:
            with LlamaCppModel(draft_path, n_ctx=n_ctx, n_threads=n_threads) as dm:
                dtables = sweep_grid(engine_timers(forward_calls(dm, seed=1), "cpu", **kw), draft_token_counts,
                                     contexts, what="draft", progress=progress, rounds=rounds, paired=paired)
                overhead = measure_step_overhead(tm, dm)
    tname = target_name or Path(target_path).stem
    dname = draft_name or (Path(draft_path).stem if draft_path is not None else None)
    slug = device_slug("cpu")
    device_meta = {"name": cpu_name(), "type": "cpu", "dtype": _file_type(Path(target_path)),
                   "draft_dtype": _file_type(Path(draft_path)) if draft_path is not None else None,
                   "threads": n_threads}
    pid = f"{slug}_{tname}" + (f"__{dname}" if dname else "") + "_llama.cpp"
    return build_latency_profile(
        target_tables=ttables, draft_tables=dtables, step_overhead_ms=overhead, device="cpu", dtype=torch.float32,
        target_name=tname, target_config=tcfg, draft_name=dname, draft_config=dcfg, random_weights=False,
        profile_id=pid, method=method_text(rounds, paired, token_counts) + "; llama_decode with logits for every "
        "position", command="treeopt profile latency --engine llama.cpp", engine=engine_info(),
        device_meta=device_meta)


# ---------------------------------------------------------------------------------------------- acceptance
def measure_acceptance(target: LlamaCppModel, draft: LlamaCppModel, prompts: Sequence[Sequence[int]],
                       max_new_tokens: int, *, width: int = 8, eos_ids: Iterable[int] = (),
                       progress: ProgressFn | None = None) -> tuple[np.ndarray, list[list[tuple[int, float, bool]]]]:
    """Greedy acceptance of ``draft`` for ``target`` on llama.cpp's logits (Sequoia section 3.1, greedy: the
    accepted candidate is the target's argmax): for each prompt the target's greedy continuation
    (:func:`generate`, plain), then one draft decode over prompt + continuation with logits at every
    continuation position; the target's token's rank among the draft's logits is one trial.

    Returns:
        ``(counts, traces)``: counts (width + 1,) int64, ``counts[k]`` the trials whose target token was the
        draft's rank-k candidate, ``counts[width]`` none of the top ``width``; traces, per prompt and
        continuation position, (draft top-1 token, its probability among the draft's top 10 logits, whether
        it equals the target's token), what a chain's draft-p-min rule reads.

    Raises:
        EngineError: as :func:`generate`.
    """
    counts = np.zeros(width + 1, dtype=np.int64)
    traces = []
    for i, ids in enumerate(prompts):
        cont = generate(target, ids, max_new_tokens, eos_ids=eos_ids).tokens
        full = list(ids) + cont
        draft.clear()
        first = len(ids) - 1  # the logits at position p predict token p + 1
        if first > 0:
            draft.prefill(full[:first])
        rows_tokens = full[first: len(full) - 1]
        trace = []
        for s in range(0, len(rows_tokens), draft.n_batch):
            chunk = rows_tokens[s: s + draft.n_batch]
            draft.decode(chunk, first + s, logits=True)
            rows = draft.logits(len(chunk))
            for r in range(len(chunk)):
                want = full[first + s + r + 1]
                row = rows[r]
                rank = int((row > row[want]).sum())
                counts[min(rank, width)] += 1
                tok, prob = _top1(row)
                trace.append((tok, prob, tok == want))
        traces.append(trace)
        if progress:
            progress("llama.cpp acceptance", i + 1, len(prompts))
    return counts, traces


def replay_chain(traces: Sequence[Sequence[tuple[int, float, bool]]], setting: ChainSetting) -> tuple[float, float, float]:
    """What a chain setting does on recorded traces (:func:`measure_acceptance`), replaying llama.cpp's rule:
    from each position the draft proposes while its top-1 probability is at least ``p_min``, at most ``n_max``
    (fewer than ``n_min``: none); the accepted prefix and the target's token are emitted and the next step
    starts after them. Returns (tokens per step, drafted tokens per step, draft forwards per step)."""
    steps = tokens = drafted = forwards = 0
    for k, j, f in _replay_steps(traces, setting):
        steps += 1
        tokens += j + 1
        drafted += k
        forwards += f
    return tokens / max(1, steps), drafted / max(1, steps), forwards / max(1, steps)


def _replay_steps(traces: Sequence[Sequence[tuple[int, float, bool]]], setting: ChainSetting):
    """Per replayed step (:func:`replay_chain`): (tokens drafted and verified, tokens accepted, draft forwards)."""
    for trace in traces:
        t = 0
        while t < len(trace):
            room = min(setting.n_max, len(trace) - t - 1)  # as generate: the last token is the target's
            k = 0
            while k < room and trace[t + k][1] >= setting.p_min:
                k += 1
            f = 0 if room <= 0 else (k if k == room else k + 1)
            if k < setting.n_min:
                k = 0
            j = 0
            while j < k and trace[t + j][2]:
                j += 1
            yield k, j, f
            t += j + 1


def predict_replay(traces: Sequence[Sequence[tuple[int, float, bool]]], setting: ChainSetting, curve: Any,
                   context: int | None = None):
    """Predicted :class:`~sequoia_opt.solver.hardware.StepCost` of any chain setting (draft-p-min and draft-min
    included) from recorded traces: each replayed step (:func:`replay_chain`) costs its draft forwards at c(1)
    and T(drafted + 1) on ``curve``; the mean step goes through the cost model's
    :func:`~sequoia_opt.solver.hardware.cost_of_step`. The acceptance is the traces' own (runs of agreement
    included), not a positional vector's."""
    from ..solver.hardware import cost_of_step

    n = tok = 0
    draft = target = 0.0
    c1 = curve.draft_ms(1, context)
    for k, j, f in _replay_steps(traces, setting):
        n += 1
        tok += j + 1
        draft += f * c1
        target += curve.target_ms(k + 1, context)
    return cost_of_step(tok / max(1, n), draft / max(1, n), target / max(1, n), curve, context)


# ---------------------------------------------------------------------------------------------- solving
@dataclass
class ChainChoice:
    """The chain solved for llama.cpp: its setting, the predicted step, and every length scored."""

    setting: ChainSetting
    expected_tokens: float
    cost_ms: float
    tokens_per_s: float
    speedup: float
    plain_ms_per_token: float
    by_length: list[dict[str, float]]
    acceptance_model: str


def chain_cost(n: int, g: float, curve: Any, context: int | None = None):
    """:class:`~sequoia_opt.solver.hardware.StepCost` of a chain of n drafted tokens with G tokens per step:
    n draft forwards of 1 token (per-level, every level but the last: the chain's n + 1 nodes), T(n + 1)."""
    from ..solver.hardware import step_cost

    return step_cost([1] * (n + 1), g, curve, context)


def solve_chain(acceptance: Any, curve: Any, *, max_draft: int = 16, context: int | None = None,
                acceptance_model: str = "auto") -> ChainChoice:
    """The chain with the most predicted tokens per second on ``curve``: Sequoia's DP with branching 1 (a chain
    is a tree of width 1) under the profile's acceptance model, through the hardware-aware
    :func:`~sequoia_opt.solver.hardware.choose`, draft lengths 0..``max_draft`` (clamped to the curve's
    largest measured target count - 1). Draft-min 0 and draft-p-min 0: a fixed-length chain, the setting
    this cost model values exactly.

    Raises:
        SolverError / ProfileError: as :func:`~sequoia_opt.solver.hardware.choose`.
    """
    from ..solver import choose
    from ..solver.depth import solve_profile

    budget = max(1, min(max_draft + 1, curve.max_target_tokens(context)))
    sol, model_used = solve_profile(acceptance, budget, max(1, budget - 1), 1, acceptance_model)
    ch = choose(acceptance.acceptance, curve, budget, max(1, budget - 1), 1, context=context, solution=sol, top=budget)
    rows = []
    for n in range(0, budget):
        g = float(sol.table[n + 1, max(1, n)]) if n > 0 else 1.0
        c = chain_cost(n, g, curve, context)
        rows.append({"draft_max": n, "expected_tokens_per_step": g, "cost_ms": c.cost_ms,
                     "tokens_per_s": c.tokens_per_s, "speedup": c.speedup})
    n_best = ch.tree.size - 1
    return ChainChoice(ChainSetting(n_best, 0, 0.0), ch.expected_tokens, ch.cost_ms, ch.tokens_per_s, ch.speedup,
                       ch.plain_ms_per_token, rows, model_used)


def chain_flags(setting: ChainSetting) -> str:
    """The setting as llama.cpp's ``llama-server`` / ``llama-cli`` flags (the draft itself is ``-md DRAFT.gguf``);
    a setting of no speculation is ``--spec-type none``."""
    if setting.n_max == 0:
        return "--spec-type none"
    return (f"--spec-type draft-simple --spec-draft-n-max {setting.n_max} --spec-draft-n-min {setting.n_min} "
            f"--spec-draft-p-min {setting.p_min:g}")


def lookup_flags(min_n: int, n_max: int) -> str:
    """Prompt lookup (n-gram) as llama.cpp's ``ngram-simple``: match an n-gram of ``min_n`` tokens, draft the
    ``n_max`` tokens that followed it."""
    return f"--spec-type ngram-simple --spec-ngram-simple-size-n {min_n} --spec-ngram-simple-size-m {n_max}"


# ---------------------------------------------------------------------------------------------- models, runs
@dataclass
class GgufPair:
    """The target and draft GGUF files llama.cpp runs, with the labels profiles name them by."""

    target: Path
    target_label: str
    draft: Path | None
    draft_label: str | None
    notes: list[str] = field(default_factory=list)


def resolve_pair(target: Path | None, draft: str | None, workdir: Path, *, need_draft: bool = True) -> GgufPair:
    """The GGUF files for ``--target`` / ``--draft`` (defaults: the demo target; the bundled draft). A draft
    that is a Hugging Face folder (the bundled one included) is written as an F16 GGUF into ``workdir`` first
    (:func:`~sequoia_opt.model.gguf_writer.write_gguf`, named by its label so profiles still match). Both
    configs are checked (vocabulary sizes equal) before any weights load.

    Raises:
        EngineError / TreeoptError: a target that is not a GGUF, a drafter llama.cpp does not run here
            (``self:L``; prompt lookup has its own flags), a vocabulary mismatch.
    """
    from ..model.loaders import load_checkpoint, load_model_config
    from ..pipeline import check_drafter, default_target_path, model_label, parse_drafter_spec

    tpath = Path(target) if target is not None else default_target_path()
    if tpath.suffix.lower() != ".gguf" or not tpath.is_file():
        raise EngineError(f"--engine llama.cpp runs GGUF files: {tpath} is not one (convert a Hugging Face model "
                          "with llama.cpp's convert_hf_to_gguf.py; a draft with treeopt export-draft --gguf)")
    check_gguf(tpath)  # llama.cpp's own refusal first, in its words
    tcfg = load_model_config(tpath)
    out = GgufPair(tpath, model_label(tpath), None, None)
    if not need_draft and draft is None:
        return out
    spec = parse_drafter_spec(draft)
    if spec.kind != "model":
        raise EngineError(f"--draft {spec.label}: llama.cpp's speculative decoding here runs a draft model (for "
                          "prompt lookup, solve --format llama.cpp on a lookup profile gives its ngram-simple flags)")
    check_drafter(spec, tcfg)
    from ..pipeline import default_draft_path

    dsrc = spec.path if spec.path is not None else default_draft_path()
    label = model_label(dsrc)
    if Path(dsrc).suffix.lower() == ".gguf":
        check_gguf(dsrc)
        out.draft, out.draft_label = Path(dsrc), label
        return out
    from ..model.gguf_writer import write_gguf

    model, tok = load_checkpoint(dsrc)
    gpath = Path(workdir) / f"{label}.gguf"
    write_gguf(gpath, model, tok, outtype="f16", name=label)
    out.draft, out.draft_label = gpath, label
    out.notes.append(f"draft {dsrc} written as an F16 GGUF for llama.cpp ({gpath.name}; keep one with treeopt "
                     "export-draft --gguf)")
    return out


@dataclass
class SettingRun:
    """One setting run on every prompt: totals, per-prompt rows, greedy equality with plain decoding."""

    name: str
    setting: ChainSetting
    tokens: int = 0
    steps: int = 0
    decode_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    bookkeeping_ms: float = 0.0
    equal: bool = True
    per_prompt_tokens_per_step: list[float] = field(default_factory=list)
    per_prompt_tokens_per_s: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 * self.tokens / self.decode_ms if self.decode_ms else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / max(1, self.steps)

    def add(self, gen: Generation) -> None:
        ms = sum(s.draft_ms + s.verify_ms + s.bookkeeping_ms for s in gen.steps)
        self.tokens += len(gen.tokens)
        self.steps += len(gen.steps)
        self.decode_ms += ms
        self.draft_ms += sum(s.draft_ms for s in gen.steps)
        self.verify_ms += sum(s.verify_ms for s in gen.steps)
        self.bookkeeping_ms += sum(s.bookkeeping_ms for s in gen.steps)
        self.per_prompt_tokens_per_step.append(gen.tokens_per_step)
        self.per_prompt_tokens_per_s.append(1000.0 * len(gen.tokens) / ms if ms else 0.0)


def run_settings(target: LlamaCppModel, draft: LlamaCppModel | None, prompts: Sequence[Sequence[int]],
                 settings: Sequence[tuple[str, ChainSetting]], max_new_tokens: int, *, eos_ids: Iterable[int] = (),
                 warmup: bool = True, progress: ProgressFn | None = None) -> tuple[SettingRun, list[SettingRun]]:
    """Plain decoding and every chain setting on the same prompts, prompt by prompt (plain, then each setting,
    so a machine that drifts slows all alike); decode time only (the prompt's prefill is not counted).
    Each setting's greedy tokens are compared with plain decoding's, token for token.

    Returns:
        ``(plain, runs)``.
    """
    eos = list(eos_ids)
    if warmup and prompts:
        generate(target, prompts[0], 4, draft=draft, setting=settings[0][1] if settings else None, eos_ids=eos)
    plain = SettingRun("plain", ChainSetting(0))
    runs = [SettingRun(name, s) for name, s in settings]
    total = len(prompts) * (1 + len(runs))
    done = 0
    for ids in prompts:
        ref = generate(target, ids, max_new_tokens, eos_ids=eos)
        plain.add(ref)
        done += 1
        if progress:
            progress("llama.cpp plain", done, total)
        for run in runs:
            gen = generate(target, ids, max_new_tokens, draft=draft, setting=run.setting, eos_ids=eos)
            run.add(gen)
            run.equal = run.equal and gen.tokens == ref.tokens
            done += 1
            if progress:
                progress(f"llama.cpp {run.name}", done, total)
    return plain, runs


#: The longest draft a llama.cpp setting file may ask for (tokens).
MAX_DRAFT = 2**31 - 1


def parse_setting_file(path: Path) -> ChainSetting:
    """A chain setting from a file: llama.cpp flags (what ``solve --format llama.cpp -o`` writes:
    ``--spec-draft-n-max N [--spec-draft-n-min M] [--spec-draft-p-min P]``, or the older ``--draft-max`` /
    ``--draft-min`` / ``--draft-p-min``), or a treeopt tree that is a chain (its depth is draft-max).

    Raises:
        EngineError: a file that is neither, a tree that branches, a negative or malformed value.
    """
    from .._io import read_text_file

    text = read_text_file(path, error=EngineError, what="llama.cpp setting")
    words = text.split()
    if any(w.startswith("--") for w in words):
        names = {"--spec-draft-n-max": "n_max", "--draft-max": "n_max", "--draft": "n_max",
                 "--spec-draft-n-min": "n_min", "--draft-min": "n_min",
                 "--spec-draft-p-min": "p_min", "--draft-p-min": "p_min"}
        vals: dict[str, float] = {}
        for i, w in enumerate(words):
            if w in names:
                if i + 1 >= len(words):
                    raise EngineError(f"{path}: {w} has no value")
                try:
                    vals[names[w]] = float(words[i + 1])
                except ValueError:
                    raise EngineError(f"{path}: {w} {words[i + 1]!r} is not a number") from None
                integer = names[w] != "p_min"
                v = vals[names[w]]
                if not math.isfinite(v) or (integer and (not v.is_integer() or not 0 <= v <= MAX_DRAFT)):
                    want = f"an integer in 0..{MAX_DRAFT}" if integer else "a number in [0, 1]"
                    raise EngineError(f"{path}: {w} {words[i + 1]} is out of range (must be {want})")
        if "n_max" not in vals and "--spec-type none" in " ".join(words):
            vals["n_max"] = 0
        if "n_max" not in vals:
            raise EngineError(f"{path}: no --spec-draft-n-max N (a llama.cpp draft-model setting; treeopt solve "
                              "--format llama.cpp -o writes one)")
        s = ChainSetting(int(vals["n_max"]), int(vals.get("n_min", 0)), float(vals.get("p_min", 0.0)))
    else:
        from ..errors import TreeValidationError
        from ..exports import load_any_tree

        try:
            tree, _ = load_any_tree(path)
        except TreeValidationError as err:
            raise EngineError(f"{path}: neither llama.cpp flags nor a tree ({err})") from None
        if any(w != 1 for w in tree.level_widths):
            raise EngineError(f"{path}: the tree has level widths {list(tree.level_widths)}; llama.cpp verifies a "
                              "chain (solve it with treeopt solve --format llama.cpp)")
        s = ChainSetting(tree.size - 1)
    if s.n_max < 0 or s.n_min < 0 or not 0.0 <= s.p_min <= 1.0:
        raise EngineError(f"{path}: draft-max and draft-min must be >= 0 and draft-p-min in [0, 1], got "
                          f"{s.n_max}, {s.n_min}, {s.p_min:g}")
    return s


def predict_chain(setting: ChainSetting, acceptance: Any, curve: Any, context: int | None = None,
                  acceptance_model: str = "auto"):
    """Predicted :class:`~sequoia_opt.solver.hardware.StepCost` of a fixed-length chain setting (p-min 0,
    draft-min at most draft-max) under ``acceptance`` and the acceptance model :func:`solve_chain` uses
    (:func:`~sequoia_opt.solver.depth.resolve_acceptance_model`): G = 1 + sum_j prod_{d <= j} p_1(d), p_1 the
    same at every depth (positional) or the profile's per-depth rows; None for a setting this model cannot
    value (p-min > 0)."""
    from ..solver.depth import resolve_acceptance_model

    if setting.p_min > 0:
        return None
    used = resolve_acceptance_model(acceptance, acceptance_model)
    rows = acceptance.depth_rows() if used == "by-depth" else acceptance.acceptance[None, :]
    g, reach = 1.0, 1.0
    for d in range(setting.n_max):
        reach *= float(rows[min(d, len(rows) - 1)][0])
        g += reach
    return chain_cost(setting.n_max, g, curve, context)
