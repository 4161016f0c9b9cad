"""A correctness check for a loaded checkpoint that needs no other framework: perplexity on ordinary text.

A correctly loaded small instruct model scores ordinary English prose in the tens at most; a wrong rotary
layout (Q/K permutation not undone), a wrong norm epsilon or a transposed weight sends it into the
hundreds or thousands.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from ..errors import DecodingError
from .llama import Transformer


@torch.inference_mode()
def perplexity(model: Transformer, token_ids: Sequence[int] | torch.Tensor) -> float:
    """exp(mean negative log-likelihood) of tokens ``1..T-1``, each predicted from the tokens before it, in
    one causal forward without a KV cache (log-softmax in float32).

    Args:
        model: the model (its device and dtype are used).
        token_ids: (T,) token ids, T >= 2 and at most ``config.max_position_embeddings + 1`` (the forward reads
            tokens ``0..T-2``, at positions below the context; the last token is only predicted).

    Returns:
        the perplexity (1.0 is a perfect predictor; the vocabulary size is a uniform guess).

    Raises:
        DecodingError: fewer than 2 tokens, more than the context length + 1, or an id outside the vocabulary.
    """
    ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
    T = ids.numel()
    c = model.config
    if T < 2:
        raise DecodingError(f"perplexity needs at least 2 tokens, got {T}")
    if T - 1 > c.max_position_embeddings:  # the forward runs over the first T - 1 tokens only
        raise DecodingError(f"{T} tokens exceed the model's context of {c.max_position_embeddings} (+ 1: the last "
                            "token is only predicted)")
    if int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size:
        raise DecodingError(f"token ids must lie in [0, {c.vocab_size})")
    ids = ids.to(model.device)
    logits = model(ids[None, :-1])[0]  # (T-1, vocab)
    nll = F.cross_entropy(logits.float(), ids[1:], reduction="mean")
    return math.exp(float(nll))
