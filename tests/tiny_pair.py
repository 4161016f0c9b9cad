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


def other_tokenizer():
    """:func:`byte_tokenizer`'s tokens in reverse byte order: as many tokens, every id another byte (a draft with
    it is refused against a target with :func:`byte_tokenizer`)."""
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet(), reverse=True)
    return bpe_tokenizer_from_vocab(alphabet + [EOS], [], token_types=[6] * len(alphabet) + [3], pre="default",
                                    eos_id=len(alphabet))


def tiny_config(vocab: int = 257, layers: int | None = None) -> ModelConfig:
    cfg = ModelConfig.preset("tiny").with_(vocab_size=vocab, name="tiny")
    return cfg if layers is None else cfg.with_(n_layers=layers)


def random_model(seed: int, std: float = 0.3, vocab: int = 257, layers: int | None = None) -> Transformer:
    torch.manual_seed(seed)
    m = Transformer(tiny_config(vocab, layers))
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


def make_pair(root: Path, *, noise: float = 0.05, seed: int = 0, layers: int | None = None
              ) -> tuple[Path, Path, Path]:
    """Write target/, draft/ HF checkpoints and prompts.jsonl under ``root``; return their paths. ``layers``: the
    models' layer count (default the tiny preset's 2)."""
    tok = byte_tokenizer()
    target = random_model(seed, layers=layers)
    draft = noisy_copy(target, noise, seed + 1)
    tdir, ddir = root / "target", root / "draft"
    save_hf_checkpoint(target, tok, tdir)
    save_hf_checkpoint(draft, tok, ddir)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return tdir, ddir, prompts


# ---------------------------------------------------------------------------------------------- one step by hand
def draft_one(dec, state, tokens=None):
    """The loop's draft of a batch-of-one step (``dec.draft``), or, with ``tokens`` ((n,) tree tokens), the
    static policy's draft teacher-forced with them (the drafter still runs over them)."""
    with torch.inference_mode():  # as the loop runs it (the caches' row views were made in inference mode)
        if tokens is None:
            return dec.draft(state)[0]
        rooms = dec.face.room(state, dec.policy.max_size)
        return dec.policy.draft(state, rooms, forced_tokens=torch.as_tensor(tokens).reshape(1, -1))[0]


def verify_one(dec, state, tree):
    """The target's (n, V) logits over one row's tree: a StepTree, or (n,) tokens of the static policy's tree."""
    from sequoia_opt.decoding import StepTree

    if not isinstance(tree, StepTree):
        tree = StepTree.static(dec.policy.buffers, torch.as_tensor(tree))
    return dec.verify(state, [tree])[0]


def commit_one(dec, state, tree, acc):
    """Emit and commit one row's acceptance; returns the tokens emitted."""
    return dec.commit(state, [tree], [acc])[0]


def one_row_state(seq, max_new_tokens: int = 1):
    """A :class:`~sequoia_opt.decoding.DecodeState` of one row whose committed tokens are ``seq`` (its last token
    the root), as a drafter's ``propose`` reads it."""
    from sequoia_opt.decoding import DecodeState, GenerationResult, RowState

    r = GenerationResult(tokens=[], prompt_len=len(seq))
    return DecodeState(rows=[RowState(seq=list(seq), cached=len(seq) - 1, max_new_tokens=max_new_tokens, result=r)],
                       results=[r])
