"""perplexity() on a tiny random model: matches a hand computation; bad input is refused."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sequoia_opt.errors import DecodingError
from sequoia_opt.model import ModelConfig, Transformer
from sequoia_opt.model.eval import perplexity


def test_perplexity_matches_hand_computation():
    model = Transformer(ModelConfig.preset("tiny")).eval()
    ids = [3, 14, 15, 92, 65, 35, 89, 79]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids]))[0].double(), -1)
    nll = -sum(float(logp[t, ids[t + 1]]) for t in range(len(ids) - 1)) / (len(ids) - 1)
    assert perplexity(model, ids) == pytest.approx(math.exp(nll), rel=1e-5)
    assert perplexity(model, torch.tensor(ids)) == pytest.approx(math.exp(nll), rel=1e-5)


def test_perplexity_refuses_bad_input():
    model = Transformer(ModelConfig.preset("tiny"))
    with pytest.raises(DecodingError, match="at least 2"):
        perplexity(model, [1])
    with pytest.raises(DecodingError, match="vocabulary|\\[0, 256\\)"):
        perplexity(model, [1, 256])
    with pytest.raises(DecodingError, match="context"):
        perplexity(model, [1] * 514)


def test_perplexity_takes_context_plus_one_tokens():
    """T tokens need T - 1 positions (the last is only predicted): at a context of 16, 17 tokens are scored (they
    were refused), 18 are not."""
    model = Transformer(ModelConfig.preset("tiny").with_(max_position_embeddings=16)).eval()
    ids = [(7 * t + 3) % 256 for t in range(17)]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0].double(), -1)  # (16, V)
    nll = -sum(float(logp[t, ids[t + 1]]) for t in range(16)) / 16
    assert perplexity(model, ids) == pytest.approx(math.exp(nll), rel=1e-5)
    with pytest.raises(DecodingError, match="context of 16"):
        perplexity(model, ids + [1])


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 64, 65])
@pytest.mark.parametrize("bias", [False, True])
def test_tuned_linear_matches_f_linear_and_trains_through_f_linear(rows, bias, tmp_path, monkeypatch):
    from sequoia_opt.model.llama import Linear
    from sequoia_opt.model.tuned_linear import tune_linears

    monkeypatch.setenv("TREEOPT_CACHE_DIR", str(tmp_path))
    torch.manual_seed(rows)
    lin = Linear(48, 80, bias=bias)
    tune_linears(torch.nn.Sequential(lin), repeats=1)
    assert lin.dispatch is not None
    x = torch.randn(1, rows, 48)  # (B, T, in), as the decoder calls it
    with torch.inference_mode():
        y = lin(x)  # the tuned kernel of this row count
    assert y.shape == (1, rows, 80) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    lin(x).sum().backward()  # with gradients: F.linear (distillation trains through it)
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0
