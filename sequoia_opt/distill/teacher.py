"""The teacher's side of distillation, computed once and cached: the target's top-k next-token ids and
log-probabilities over the training chunks (:func:`label_with_teacher`), and its own greedy continuations of
training prompts with its top-k at every position (:func:`teacher_continuations`). Both caches are resumable
(the CPU teacher forward is the bottleneck) and a larger run reuses a smaller one's rows."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..attention import causal_tree_mask
from ..model.llama import Transformer


@dataclass
class TeacherLabels:
    """Top-k teacher distribution at every position of every chunk.

    Attributes:
        ids: (n_chunks, chunk, k) int32 token ids, highest first.
        logp: (n_chunks, chunk, k) float16 log-probabilities (over the full vocabulary, not renormalised).
    """

    ids: torch.Tensor
    logp: torch.Tensor
    seconds: float = 0.0  # teacher wall time spent on these labels, cached runs included


def _top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's top-k of ``logits`` (..., V): ids (..., k) int32 and log-probabilities (..., k) float16
    (normalised over the full vocabulary), as :class:`TeacherLabels` stores them."""
    top = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    return top.indices.to(torch.int32), top.values.to(torch.float16)


def _cached_rows(cache_path: Path | None, *, k: int, key: str, head: torch.Tensor, width: int
                 ) -> tuple[dict | None, int, float]:
    """How much of a resumable label cache still applies: ``(saved, rows, seconds)``.

    The cache applies to its first ``rows`` rows when it has the same ``k``, its ``key`` tensor has ``width``
    columns and the first ``head.shape[1]`` columns of those rows equal ``head``'s first rows (the inputs the
    labels were computed from); ``seconds`` is its recorded teacher time prorated to those rows. ``(None, 0,
    0.0)`` without a usable cache."""
    if cache_path is None or not cache_path.exists():
        return None, 0, 0.0
    saved = torch.load(cache_path)
    m = min(int(saved["done"]), head.shape[0])
    if saved["k"] != k or saved[key].shape[1] != width or not torch.equal(saved[key][:m, :head.shape[1]], head[:m]):
        return None, 0, 0.0
    return saved, m, float(saved.get("seconds", 0.0)) * m / max(1, int(saved["done"]))


def _save_cache(cache_path: Path, payload: dict) -> None:
    """``torch.save`` to a temporary file next to ``cache_path``, then rename: an interrupted save leaves the
    previous cache intact."""
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache_path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, cache_path)


def label_with_teacher(teacher: Callable[[torch.Tensor], torch.Tensor], chunks: torch.Tensor, *, k: int,
                       cache_path: Path | None = None, log: Callable[[str], None] = print,
                       save_every: int = 25) -> TeacherLabels:
    """Run ``teacher`` (tokens (1, T) -> logits (1, T, V)) over each chunk under ``torch.inference_mode`` and
    keep the top-k. With ``cache_path``, partial results are saved every ``save_every`` chunks and a rerun
    resumes from them; a complete cache is returned without any teacher forward."""
    n, T = chunks.shape
    ids = torch.zeros(n, T, k, dtype=torch.int32)
    logp = torch.zeros(n, T, k, dtype=torch.float16)
    # chunks for a smaller --tokens are a prefix of those for a larger one: any labelled prefix is reused
    saved, done, prior_s = _cached_rows(cache_path, k=k, key="chunks", head=chunks, width=T)
    if saved is not None:
        ids[:done], logp[:done] = saved["ids"][:done], saved["logp"][:done]
        log(f"teacher cache {cache_path}: {done}/{n} chunks already labelled")
    t0 = time.perf_counter()
    start = done
    with torch.inference_mode():
        while done < n:
            ids[done], logp[done] = _top_k(teacher(chunks[done: done + 1])[0], k)  # (T, k) each
            done += 1
            if done % save_every == 0 or done == n:
                el = time.perf_counter() - t0
                if cache_path is not None:
                    _save_cache(cache_path, {"chunks": chunks, "k": k, "done": done, "ids": ids[:done],
                                             "logp": logp[:done], "seconds": el + prior_s})
                log(f"teacher: {done}/{n} chunks, {(done - start) * T / el:.0f} tokens/s, {el:.0f} s")
    return TeacherLabels(ids=ids, logp=logp, seconds=time.perf_counter() - t0 + prior_s)


def greedy_continue(target: Transformer, seqs: torch.Tensor, prompt_len: int, *,
                    hidden_layers: tuple[int, ...] | None = None):
    """The target's plain greedy continuation of a batch of prompts on its static KV cache, one forward at a time:
    the prompt ``seqs[:, :P]`` in one prefill, then one token per forward, each the argmax of the logits before it,
    written into ``seqs[:, P:]`` in place (G = ``seqs.shape[1] - P`` tokens).

    Args:
        seqs: (b, P + G) int64, the prompts in the first ``prompt_len`` = P columns (a view is filled in place).
        hidden_layers: as :meth:`~sequoia_opt.model.Transformer.forward` takes them (None: logits only).

    Yields:
        per forward ``(cols, logits, hidden)``: the slice of positions it covered (``0:P``, then ``P + i``),
        logits (b, t, V) (position j predicts token j + 1) and hidden (b, t, len(hidden_layers), H) or None. The
        last forward reads token P + G - 1, so every position of ``seqs`` gets its logits.

    Call it under ``torch.inference_mode``.
    """
    b, T = seqs.shape
    P = prompt_len
    cache = target.new_cache(T, batch=b)

    def forward(cols: slice, mask):
        pos = torch.arange(cols.start, cols.stop)
        out = target(seqs[:, cols], pos, cache=cache, cache_slots=pos, prefix_len=cols.start, tree_mask=mask,
                     hidden_layers=hidden_layers)
        return out if hidden_layers is not None else (out, None)

    cols = slice(0, P)
    logits, hidden = forward(cols, causal_tree_mask(P))  # (b, P, V)
    yield cols, logits, hidden
    one = causal_tree_mask(1)
    for i in range(P, T):
        seqs[:, i] = logits[:, -1].argmax(-1)
        cols = slice(i, i + 1)
        logits, hidden = forward(cols, one)  # (b, 1, V)
        yield cols, logits, hidden


def teacher_continuations(teacher: Transformer, prompts: torch.Tensor, *, gen_tokens: int, k: int, batch: int,
                          cache_path: Path | None = None, log: Callable[[str], None] = print
                          ) -> tuple[torch.Tensor, TeacherLabels]:
    """Sequence-level distillation data: the teacher's own greedy continuation of each prompt, with its top-k
    at every position (Kim & Rush 2016, sequence-level KD; DistillSpec, Zhou et al. 2024, sec. 3: a draft
    trained on the target's generations agrees more with what the target generates when verified).

    A greedy continuation is where tree speculative decoding spends its time and where the draft's agreement
    is measured; the teacher-forced labels of :func:`label_with_teacher` only cover human-written text, which
    misses the target's own habits (it repeats lines and patterns of its prompt far more than code does).

    Args:
        teacher: the target, run with its static KV cache in batches of ``batch`` prompts.
        prompts: (N, P) int64 prompt tokens (one length; see :func:`continuation_prompts`).
        gen_tokens: G, greedy tokens generated per prompt (EOS is not special: the labels stay valid).
        k: teacher top-k kept per position.
        cache_path: finished batches are saved there and a rerun with the same prompts resumes.

    Returns:
        ``(seqs, labels)``: seqs (N, P + G) int64, prompt then continuation; labels as
        :class:`TeacherLabels` (N, P + G, k): position j holds the teacher's top-k for token j + 1.
    """
    N, P = prompts.shape
    T = P + gen_tokens
    seqs = torch.zeros(N, T, dtype=torch.int64)
    seqs[:, :P] = prompts
    ids = torch.zeros(N, T, k, dtype=torch.int32)
    logp = torch.zeros(N, T, k, dtype=torch.float16)
    saved, done, prior_s = _cached_rows(cache_path, k=k, key="seqs", head=prompts, width=T)
    if saved is not None:
        seqs[:done], ids[:done], logp[:done] = saved["seqs"][:done], saved["ids"][:done], saved["logp"][:done]
        log(f"continuation cache {cache_path}: {done}/{N} prompts already continued")
    t0 = time.perf_counter()
    start = done

    def keep(rows: slice, cols: slice, logits: torch.Tensor) -> None:
        ids[rows, cols], logp[rows, cols] = _top_k(logits, k)  # (b, t, k) each

    with torch.inference_mode():
        while done < N:
            rows = slice(done, min(N, done + batch))
            for cols, logits, _ in greedy_continue(teacher, seqs[rows], P):  # fills seqs[rows, P:]
                keep(rows, cols, logits)
            done = rows.stop
            el = time.perf_counter() - t0
            if cache_path is not None:
                _save_cache(cache_path, {"seqs": seqs[:done], "k": k, "done": done, "ids": ids[:done],
                                         "logp": logp[:done], "seconds": el + prior_s})
            log(f"continuations: {done}/{N} prompts, {(done - start) * gen_tokens / el:.0f} generated tokens/s, "
                f"{el:.0f} s")
    return seqs, TeacherLabels(ids=ids, logp=logp, seconds=time.perf_counter() - t0 + prior_s)
