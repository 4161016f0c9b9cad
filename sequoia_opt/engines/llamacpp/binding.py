"""llama.cpp through llama-cpp-python's low-level API: one GGUF in one llama.cpp context.

:class:`LlamaCppModel` decodes a ``llama_batch`` with logits for the positions asked for, at given positions
and sequence ids, and removes, keeps or copies KV cells by sequence (the ``llama_memory_seq_*`` API). The rest of
the engine builds on it: ``target.py`` (llama.cpp as the loop's target face and as a drafter), ``decode.py``
(generation through the one loop), ``profile.py`` (T(n), c(w), acceptance on llama.cpp's logits),
``models.py`` (the GGUF files a run uses).

Flags are those of the llama.cpp vendored by llama-cpp-python 0.3.36 (commit 0c1e570, 2026-10-01):
``--spec-type draft-simple --spec-draft-n-max N --spec-draft-n-min M --spec-draft-p-min P``; it removed the
older ``--draft-max`` / ``--draft-min`` (``arg_removed``), and a plain Llama draft GGUF needs ``--spec-type
draft-simple`` (the type is inferred only for MTP / DFlash drafts). Prompt lookup is ``--spec-type
ngram-simple --spec-ngram-simple-size-n N --spec-ngram-simple-size-m M``.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...errors import EngineError
from .. import require_engine

__all__ = ["LlamaCppModel", "engine_info", "check_gguf", "server_prompt_ids", "DRAFT_TOP_K", "top1", "use_extra_bufts",
           "EXTRA_BUFTS_ENV"]

DRAFT_TOP_K = 10

#: ``TREEOPT_LLAMACPP_EXTRA_BUFTS``: ``1`` / ``0`` force llama.cpp's extra weight buffer types (repacked weights:
#: AMX, CPU_REPACK) on or off; unset, they are on except on a CPU that advertises AMX (:func:`use_extra_bufts`).
EXTRA_BUFTS_ENV = "TREEOPT_LLAMACPP_EXTRA_BUFTS"

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

@functools.cache
def _cpu_has_amx() -> bool:
    from ...device import cpu_flags

    flags = cpu_flags() or frozenset()
    return "amx_int8" in flags or "amx_tile" in flags


def use_extra_bufts() -> bool:
    """Whether models load with llama.cpp's extra weight buffer types (``llama_model_params.use_extra_bufts``:
    weights repacked for AMX or the CPU's SIMD kernels; llama.cpp's default is on).

    Off on a CPU that advertises AMX unless ``TREEOPT_LLAMACPP_EXTRA_BUFTS=1``: on a 2-core Xeon VM with AMX
    (llama-cpp-python 0.3.36 built here, GGML native), the AMX buffer took the demo target's Q4_1 weights and the
    first ``llama_decode`` died of a segmentation fault, killing the process; with the plain CPU buffers it decodes
    (the same output; repacking is a speed choice, not a numerical one). ``TREEOPT_LLAMACPP_EXTRA_BUFTS=0`` turns
    them off anywhere.
    """
    import os

    env = os.environ.get(EXTRA_BUFTS_ENV, "").strip()
    if env in ("0", "1"):
        return env == "1"
    return not _cpu_has_amx()


def _model_params(lib: Any) -> Any:
    """llama.cpp's default model parameters, with the extra buffer types as :func:`use_extra_bufts` says."""
    params = lib.llama_model_default_params()
    params.use_extra_bufts = use_extra_bufts()
    return params


def engine_info() -> dict[str, str]:
    """``{"name": "llama.cpp", "version": <llama-cpp-python version>, "extra_bufts": "on" | "off"
    (:func:`use_extra_bufts`), "system": <llama.cpp's CPU features>}`` for a profile's ``engine`` key. Raises
    EngineError when llama-cpp-python is not installed."""
    llama_cpp = require_engine("llama.cpp")
    info = {"name": "llama.cpp", "version": f"llama-cpp-python {llama_cpp.__version__}",
            "extra_bufts": "on" if use_extra_bufts() else "off"}
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
        n_seq_max: sequences the context holds (1 for a chain; a tree of P leaves needs P + 1).
        kv_unified: one KV cache shared by all sequences (a cell may then belong to several: what a tree's
            paths need); default: unified when ``n_seq_max > 1``.
        kv_type: the KV cache's element type, ``"f16"`` (llama.cpp's default, what a server runs) or ``"f32"``.
            The weights load with llama.cpp's extra buffer types as :func:`use_extra_bufts` says.
        flash_attn: llama.cpp's flash attention; ``None`` lets llama.cpp choose (its default, "auto"). Its CPU
            kernel rounds queries to f16, so with ``kv_type="f32"`` and ``flash_attn=False`` the logits of an F32
            GGUF match a float32 reference to ~1e-5; with the defaults, to ~3e-3.

    Raises:
        EngineError: llama-cpp-python missing, or llama.cpp refusing the file (its error message, one line).
    """

    def __init__(self, path: str | Path, *, n_ctx: int = 2048, n_threads: int = 2, n_batch: int | None = None,
                 n_seq_max: int = 1, kv_type: str = "f16", flash_attn: bool | None = None,
                 kv_unified: bool | None = None) -> None:
        if kv_type not in ("f16", "f32"):
            raise EngineError(f"kv_type must be 'f16' or 'f32', got {kv_type!r}")
        self._lib = lib = require_engine("llama.cpp")
        _install_log(lib)
        lib.llama_backend_init()
        self.path = Path(path)
        if not self.path.is_file():
            raise EngineError(f"GGUF file not found: {self.path}")
        _LOG.clear()
        self._model = lib.llama_model_load_from_file(str(self.path).encode(), _model_params(lib))
        if not self._model:
            raise EngineError(f"llama.cpp refuses {self.path}: {_why()}")
        self.n_batch = int(n_batch or min(n_ctx, 512))
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = int(n_ctx)
        cparams.n_batch = cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = int(n_seq_max)
        cparams.kv_unified = bool(n_seq_max > 1 if kv_unified is None else kv_unified)
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
        self.n_seq_max = int(n_seq_max)
        self.kv_unified = bool(cparams.kv_unified)
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
        """Wait for the context's queued computation (``llama_synchronize``): call before reading a wall clock, since
        ``llama_decode`` may return before a GPU backend finishes."""
        self._lib.llama_synchronize(self._ctx)

    def seq_rm(self, p0: int, p1: int = -1, seq: int = 0) -> None:
        """Remove sequence ``seq``'s KV cells at positions [p0, p1) (p1 = -1: to the end).

        Raises:
            EngineError: llama.cpp refuses (a partial removal its cache cannot do).
        """
        if not self._lib.llama_memory_seq_rm(self._mem, seq, int(p0), int(p1)):
            raise EngineError(f"llama.cpp could not remove KV cells [{p0}, {p1}) of sequence {seq}")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Add sequence ``dst`` to the cells of sequence ``src`` at positions [p0, p1) (-1: all)."""
        self._lib.llama_memory_seq_cp(self._mem, int(src), int(dst), int(p0), int(p1))

    def seq_keep(self, seq: int) -> None:
        """Remove every cell not in sequence ``seq``; the kept cells belong to ``seq`` alone."""
        self._lib.llama_memory_seq_keep(self._mem, int(seq))

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        """llama.cpp's own tokenization of ``text`` with the GGUF's tokenizer (special tokens in the text
        parsed as such; BOS added only with ``add_special`` and the file's ``add_bos_token``).

        Raises:
            EngineError: llama.cpp's tokenizer fails.
        """
        lib = self._lib
        raw = text.encode("utf-8")
        vocab = lib.llama_model_get_vocab(self._model)
        buf = (lib.llama_token * (len(raw) + 8))()
        n = lib.llama_tokenize(vocab, raw, len(raw), buf, len(buf), add_special, True)
        if n < 0:
            raise EngineError(f"llama.cpp could not tokenize {len(raw)} bytes (needs {-n} tokens)")
        return [int(buf[i]) for i in range(n)]

    def token_text(self, token: int) -> str:
        """The text llama.cpp writes for ``token`` with special tokens rendered (``token_to_piece(special=True)``:
        what llama-server puts in a chat template's ``bos_token`` / ``eos_token``); invalid UTF-8 replaced."""
        lib = self._lib
        vocab = lib.llama_model_get_vocab(self._model)
        buf = ctypes.create_string_buffer(64)
        n = lib.llama_token_to_piece(vocab, int(token), buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lib.llama_token_to_piece(vocab, int(token), buf, len(buf), 0, True)
        return buf.raw[:n].decode("utf-8", errors="replace")

    def special_texts(self) -> tuple[str, str]:
        """``(bos, eos)``: the BOS and EOS text llama-server renders a chat template with (:meth:`token_text`; ``""``
        for a vocabulary without that token, as llama.cpp's ``common_chat_templates_init``)."""
        lib = self._lib
        vocab = lib.llama_model_get_vocab(self._model)
        ids = (int(lib.llama_vocab_bos(vocab)), int(lib.llama_vocab_eos(vocab)))
        bos, eos = ("" if i < 0 else self.token_text(i) for i in ids)
        return bos, eos

    def tokenize_prompt(self, text: str, *, chat: bool = False) -> list[int]:
        """A prompt's token ids as llama-server makes them: the text tokenized with special tokens added and parsed
        (``add_special = parse_special = true``: BOS first where the GGUF's ``add_bos_token`` says so, EOS last
        where ``add_eos_token`` does). ``chat``: ``text`` is a chat template's rendering (with the BOS / EOS text
        of :meth:`special_texts`), whose leading BOS text (trailing EOS text) is first dropped where BOS (EOS) is
        added, as ``common_chat_template_direct_apply`` does: one BOS either way, whether the template writes it
        or not.

        Raises:
            EngineError: llama.cpp's tokenizer fails.
        """
        lib = self._lib
        vocab = lib.llama_model_get_vocab(self._model)
        if chat:
            bos, eos = self.special_texts()
            if lib.llama_vocab_get_add_bos(vocab) and text.startswith(bos):
                text = text[len(bos):]
            if lib.llama_vocab_get_add_eos(vocab) and eos and text.endswith(eos):
                text = text[:len(text) - len(eos)]
        return self.tokenize(text, add_special=True)

    def eog_ids(self) -> list[int]:
        """The token ids llama.cpp ends a generation at (its end-of-generation set: EOS, EOT, ``<|im_end|>``, ...,
        what llama-server stops at), ascending."""
        lib = self._lib
        vocab = lib.llama_model_get_vocab(self._model)
        return [t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(vocab, t)]

    def clear(self) -> None:
        """Empty the KV cache."""
        self._lib.llama_memory_clear(self._mem, True)

    def prefill(self, tokens: Sequence[int], seq: int = 0) -> None:
        """Decode ``tokens`` from position 0 of sequence ``seq`` in ``n_batch`` chunks, logits for the last token
        only."""
        for s in range(0, len(tokens), self.n_batch):
            chunk = tokens[s: s + self.n_batch]
            self.decode(chunk, s, logits=False, seq_ids=None if seq == 0 else [[seq]] * len(chunk))

    @property
    def seq_cells(self) -> int:
        """KV cells one sequence can hold: ``n_ctx``, or ``n_ctx / n_seq_max`` with a KV cache per sequence
        (llama.cpp's ``n_ctx_seq`` when ``kv_unified`` is off)."""
        return self.n_ctx if self.kv_unified else self.n_ctx // max(1, self.n_seq_max)

    def close(self) -> None:
        """Free the batch, the context and the model (idempotent; also run by ``with`` and on garbage collection).
        The object is unusable afterwards."""
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


def server_prompt_ids(path: str | Path, prompts: Sequence[Any], *, model: str) -> list[list[int]]:
    """Token ids of each prompt as llama-server gives the GGUF ``path`` them: a raw prompt's text, a chat prompt
    rendered with the file's chat template (``bos_token`` / ``eos_token`` the text llama.cpp writes for its BOS /
    EOS ids), both through :meth:`LlamaCppModel.tokenize_prompt` (BOS where the file's ``add_bos_token`` says so,
    whether the template writes it or not). Any vocabulary llama.cpp runs (SentencePiece too).

    Args:
        path: the target's ``.gguf`` file.
        prompts: :class:`~sequoia_opt.prompts.Prompt` objects (from :func:`~sequoia_opt.prompts.load_prompts`).
        model: the model's name, for error messages.

    Raises:
        CheckpointError: the file's chat template or BOS / EOS ids unreadable (naming ``path``).
        PromptFileError: as :func:`~sequoia_opt.prompts.prompt_texts`.
        EngineError: llama.cpp refusing the file or failing to tokenize.
    """
    from ...errors import CheckpointError
    from ...model.gguf_loader import GGUFChat, gguf_chat, open_gguf
    from ...prompts import prompt_texts

    template = None
    if any(p.is_chat for p in prompts):
        try:
            template = gguf_chat(open_gguf(path)).chat_template
        except CheckpointError as err:  # name the file: a command reads two GGUFs
            raise CheckpointError(f"{path}: {err}") from None
    with LlamaCppModel(path, n_ctx=64, n_threads=1) as tk:
        chat = GGUFChat(template, *tk.special_texts())
        texts = prompt_texts(prompts, chat, model=model)
        return [tk.tokenize_prompt(t, chat=p.is_chat) for p, t in zip(prompts, texts)]


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
    model = lib.llama_model_load_from_file(str(path).encode(), _model_params(lib))
    if not model:
        raise EngineError(f"llama.cpp refuses {path}: {_why()}")
    lib.llama_model_free(model)

def top1(row: np.ndarray) -> tuple[int, float]:
    """The argmax of a logit row (``row``: (n_vocab,) logits) and its probability among the row's top
    :data:`DRAFT_TOP_K` logits (llama.cpp's draft-p-min reads it so): ``(token id, probability)``."""
    k = min(DRAFT_TOP_K, row.size)
    top = np.argpartition(row, -k)[-k:]
    vals = row[top].astype(np.float64)
    best = int(top[int(np.argmax(vals))])
    e = np.exp(vals - vals.max())
    return best, float(1.0 / e.sum())
