"""A tiny target/draft pair saved as real Hugging Face checkpoints (byte-level BPE tokenizer, random weights),
for end-to-end tests of the profilers, ``treeopt run`` and the CLI. Not a test module itself."""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
import torch

from sequoia_opt.model import ModelConfig, Transformer
from sequoia_opt.model.hf import save_hf_checkpoint
from sequoia_opt.model.tokenizer import bpe_tokenizer_from_vocab

EOS = "<|endoftext|>"


def byte_tokenizer(extra: tuple[str, ...] = ()):
    """256 byte tokens + EOS (+ ``extra`` tokens), no merges: every byte is one token."""
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tokens = alphabet + [EOS, *extra]
    types = [6] * len(alphabet) + [3] * (1 + len(extra))
    return bpe_tokenizer_from_vocab(tokens, [], token_types=types, pre="default", eos_id=len(alphabet))


def tiny_config(vocab: int = 257) -> ModelConfig:
    return ModelConfig.preset("tiny").with_(vocab_size=vocab, name="tiny")


def random_model(seed: int, std: float = 0.3, vocab: int = 257) -> Transformer:
    torch.manual_seed(seed)
    m = Transformer(tiny_config(vocab))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)
    return m.eval()


def noisy_copy(model: Transformer, noise: float, seed: int) -> Transformer:
    """A draft that agrees with ``model`` often but not always: its weights plus Gaussian noise."""
    torch.manual_seed(seed)
    d = Transformer(model.config)
    d.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name, p in d.named_parameters():
            if "norm" not in name:
                p.add_(noise * p.std() * torch.randn_like(p))
    return d.eval()


PROMPTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "import os\nimport sys\n\nfor name in os.listdir('.'):",
    "class Point:\n    def __init__(self, x, y):",
    "Once upon a time, in a land far away,",
    "while True:\n    line = input()",
]


def make_pair(root: Path, *, noise: float = 0.05, seed: int = 0) -> tuple[Path, Path, Path]:
    """Write target/, draft/ HF checkpoints and prompts.jsonl under ``root``; return their paths."""
    tok = byte_tokenizer()
    target = random_model(seed)
    draft = noisy_copy(target, noise, seed + 1)
    tdir, ddir = root / "target", root / "draft"
    save_hf_checkpoint(target, tok, tdir)
    save_hf_checkpoint(draft, tok, ddir)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return tdir, ddir, prompts
