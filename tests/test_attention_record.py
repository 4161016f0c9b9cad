"""No silent fallback (issue 27, fix 4): the attention backend every call ran, and why the kernel was refused, are
recorded while a profile measures; the choice itself on a CUDA device is simulated (the kernel's availability and
support are the module's own functions, replaced here)."""

from __future__ import annotations

import types

import pytest
import torch

from sequoia_opt.attention import (BackendRecord, RowPrefix, TreeMask, choose_backend, cuda, record_backends,
                                   tree_attention)


def _qkv(D=16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, 4, 3, D, generator=g), torch.randn(1, 2, 10, D, generator=g),
            torch.randn(1, 2, 10, D, generator=g))


def test_record_counts_the_backend_of_every_call_and_the_refusals():
    q, k, v = _qkv()
    mask = TreeMask.from_dense(torch.ones(3, 3, dtype=torch.bool).tril())
    with record_backends() as rec:
        tree_attention(q, k, v, 4, mask, backend="torch")
        tree_attention(q, k, v, 4, mask)  # auto on a CPU: the reference, nothing refused
        rows = RowPrefix(4, torch.ones(1, 4, dtype=torch.bool))
        with record_backends() as inner:  # nested: the inner block records its own calls only
            tree_attention(q, k, v, rows, mask)
        tree_attention(q, k, v, rows, mask, backend="torch")
    assert rec.as_dict() == {"backend": "torch", "calls": {"torch": 3}, "refused": {}}
    assert inner.as_dict() == {"backend": "torch", "calls": {"torch": 1}, "refused": {}}
    tree_attention(q, k, v, 4, mask)  # outside any block: nothing recorded, nothing fails
    assert rec.ran["torch"] == 3
    assert BackendRecord().backend is None


def test_choice_on_a_cuda_device(monkeypatch):
    q = types.SimpleNamespace(device=torch.device("cuda"))
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    monkeypatch.setattr(cuda, "unavailable_reason", lambda: "RuntimeError: error building extension")
    assert choose_backend("auto", q, None, None) == ("torch", "RuntimeError: error building extension")
    assert choose_backend("torch", q, None, None) == ("torch", None)
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "unsupported_reason", lambda q, k, v: "head_dim 32, the kernel takes 64 or 128")
    assert choose_backend("auto", q, None, None) == ("torch", "head_dim 32, the kernel takes 64 or 128")
    assert choose_backend("cuda", q, None, None) == ("cuda", None)  # asked for: its own errors say why not
    monkeypatch.setattr(cuda, "unsupported_reason", lambda q, k, v: None)
    assert choose_backend("auto", q, None, None) == ("cuda", None)
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        choose_backend("cuda", types.SimpleNamespace(device=torch.device("cpu")), None, None)
    rec = BackendRecord()
    rec.note("cuda")
    rec.note("torch", "head_dim 32")
    assert rec.as_dict() == {"backend": "mixed", "calls": {"cuda": 1, "torch": 1}, "refused": {"cuda: head_dim 32": 1}}
