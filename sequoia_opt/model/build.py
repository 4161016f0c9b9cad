"""Strict weight assignment shared by the Hugging Face (:mod:`.hf`) and GGUF (:mod:`.gguf_loader`) loaders:
the tensor names and shapes a checkpoint must provide, the check against them, and building the model from a
checkpoint's tensors.

Strict means: the set of tensor names a checkpoint provides must equal the set the model has, and every shape
must match; otherwise :class:`~sequoia_opt.errors.CheckpointError` names the offending tensors, raised after
reading only the checkpoint's headers and before any weight is copied or any forward pass runs. There is no
``strict=False`` path.

A leaf below both format modules (it imports only :mod:`.config` and :mod:`.llama`), so that imports run one way:
:mod:`.loaders` -> :mod:`.hf` / :mod:`.gguf_loader` -> this module -> :mod:`.config` / :mod:`.llama`.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

from ..errors import CheckpointError
from .config import ModelConfig
from .llama import Transformer, rope_inv_freq


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
        RuntimeError: the model has a buffer other than ``inv_freq`` that this loader does not re-derive (a
            programming error in :mod:`.llama`, never a bad checkpoint).
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
