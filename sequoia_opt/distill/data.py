"""Training data for the draft: the Python standard library's own ``.py`` sources (PSF licence), split *by file*
into train / profile / eval; the profile and eval prompt sets (one code prefix per file, written as JSONL); the
token streams the student trains on; and the prompts the teacher continues for sequence-level distillation
(:func:`continuation_prompts`, continued by :func:`sequoia_opt.distill.teacher.teacher_continuations`)."""

from __future__ import annotations

import json
import os
import random
import sysconfig
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

from .._io import atomic_write_text

#: Directory names skipped when collecting standard-library sources: tests, third-party packages, data-like
#: modules (codec tables, pydoc topics), IDLE and demos, build configuration.
EXCLUDED_DIRS = frozenset({
    "test", "tests", "site-packages", "idlelib", "turtledemo", "encodings", "pydoc_data", "__pycache__",
    "lib-dynload", "ensurepip", "lib2to3", "__phello__",
})
DATA_LICENCE = "PSF-2.0 (Python Software Foundation License, the Python standard library's source)"


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


def stdlib_split(root: str | os.PathLike, *, seed: int, n_prompts: int) -> dict[str, list[str]]:
    """The ``.py`` sources under ``root`` (:func:`collect_sources`) split as both distillation commands split them
    (:func:`split_files`: ``n_prompts + 8`` eval and profile files of at least 2000 bytes, by size).

    Raises:
        ValueError: no source there (an empty or missing folder), one line naming ``--stdlib``: checked before the
            target loads, where the data steps failed after it.
    """
    root = Path(root)
    files = collect_sources(root)
    if not files:
        raise ValueError(f"--stdlib {root}: no .py sources there (files of at least 200 bytes, tests skipped)")
    sizes = {f: (root / f).stat().st_size for f in files}
    return split_files(files, seed=seed, n_profile=n_prompts + 8, n_eval=n_prompts + 8, sizes=sizes)


#: The longest continuation prompt the distillation commands make: :func:`make_prompt` re-encodes a growing window
#: line by line (quadratic in the window), and past this few standard-library files hold a window of whole lines
#: that long in their first half.
MAX_CONT_PROMPT_TOKENS = 1024
#: The largest ``--seed`` the distillation commands take: a non-negative 32-bit integer, so that every generator
#: seeded from it (``random.Random(seed + k)``, ``torch.manual_seed``) takes it and the cache names stay short.
MAX_SEED = 2**32 - 1


def setting_refusal(*, seed: int, cont_prompt_tokens: int) -> str | None:
    """The one-line refusal both distillation commands give a ``--seed`` outside 0 .. :data:`MAX_SEED` or a
    ``--cont-prompt-tokens`` past :data:`MAX_CONT_PROMPT_TOKENS` (checked before the target loads); None: both
    are fine."""
    if not 0 <= seed <= MAX_SEED:
        return f"--seed {seed}: must be in 0 .. {MAX_SEED}"
    if cont_prompt_tokens > MAX_CONT_PROMPT_TOKENS:  # whole lines from a file's first half: few files hold more
        return (f"--cont-prompt-tokens {cont_prompt_tokens}: at most {MAX_CONT_PROMPT_TOKENS} (prompts are whole "
                "lines of a file's first half)")
    return None


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
