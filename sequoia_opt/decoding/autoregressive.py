"""Plain autoregressive decoding: the baseline speedups are measured against.

Same model, same static cache, same precision and the same forward as the tree decoder: one step is the
tree decoder's verification with a root-only tree (T = 1, ``causal_tree_mask(1)``, the root at slot L and
position L). Greedy (temperature 0) takes the argmax; sampling draws from :func:`process_logits` with the
same temperature / top-p processing the speculative decoder uses.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from ..attention import TreeMask, resolve_backend
from ..errors import DecodingError
from ..model import Transformer
from .core import (DEFAULT_MAX_LEN, cached_forward, causal_mask, check_request, model_output_error, run_causal_chunk,
                   truncate)
from .sampling import argmax_tokens, process_logits, sample_categorical
from .stats import Clock, GenerationResult, StepStats

__all__ = ["AutoregressiveDecoder", "autoregressive_generate"]


class AutoregressiveDecoder:
    """Plain decoding with a KV cache, batch size 1. The cache is allocated once and reused across prompts.

    Args:
        model: the model (its device and dtype are used as they are).
        temperature: 0 for greedy, else the sampling temperature.
        top_p: nucleus mass in (0, 1] (sampling only).
        generator: random source for sampling; None makes a generator on the model's device seeded with 0
            (runs are reproducible by default; pass your own to vary them).
        eos_ids: token ids (or one id) that end generation (the EOS itself is emitted).
        backend: attention backend ``"auto" | "torch" | "cuda"``, resolved once here.
        max_len: cache slots; default ``min(max_position_embeddings, 4096)``.

    Raises:
        DecodingError: a bad temperature / top_p, ``max_len`` < 1.
        ValueError: an unknown backend name.
    """

    def __init__(self, model: Transformer, *, temperature: float = 0.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None, eos_ids: Iterable[int] = (),
                 backend: str = "auto", max_len: int | None = None) -> None:
        try:
            process_logits(torch.zeros(1), temperature, top_p)  # validates temperature and top_p
        except ValueError as err:
            raise DecodingError(str(err)) from None
        self.model = model
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.eos_ids = frozenset([int(eos_ids)] if isinstance(eos_ids, int) else (int(t) for t in eos_ids))
        self.backend = resolve_backend(backend, model.device)
        self.max_len = int(max_len if max_len is not None
                           else min(model.config.max_position_embeddings, DEFAULT_MAX_LEN))
        if self.max_len < 1:
            raise DecodingError(f"max_len must be >= 1, got {self.max_len}")
        if generator is None:
            generator = torch.Generator(device=model.device)
            generator.manual_seed(0)
        self.generator = generator
        self.cache = model.new_cache(self.max_len)
        self._masks: dict[int, TreeMask] = {}
        self._clock = Clock(model.device)

    def check(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Validate inputs (before any forward). Returns the prompt as ints. Raises :class:`DecodingError`."""
        return check_request(prompt_ids, max_new_tokens, self.model, max_len=self.max_len)

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> GenerationResult:
        """Decode up to ``max_new_tokens`` tokens after ``prompt_ids`` (one target forward per token).

        Returns:
            :class:`GenerationResult`; every step emits one token (``accepted_len == 1``, ``draft_ms == 0``).

        Raises:
            DecodingError: empty prompt, an id outside the vocabulary, or a prompt + budget that would
                overflow the cache or the context — before any forward pass; logits with NaN or +inf
                during decoding (no token is made from them).
        """
        prompt = self.check(prompt_ids, max_new_tokens)
        M = int(max_new_tokens)
        result = GenerationResult(tokens=[], prompt_len=len(prompt))
        if M == 0:
            result.stop_reason = "empty"
            return result
        model, device, clock = self.model, self.model.device, self._clock
        t0 = clock.now()
        if len(prompt) > 1:
            run_causal_chunk(model, self.cache, prompt[:-1], 0, self.backend, self._masks)
        result.prefill_ms = clock.now() - t0
        L, root = len(prompt) - 1, prompt[-1]
        mask = causal_mask(1, device, self._masks)  # (1, 1): the root attends the prefix and itself
        while True:
            t0 = clock.now()
            pos = torch.tensor([L], dtype=torch.int64, device=device)
            tok = torch.tensor([root], dtype=torch.int64, device=device)
            logits = cached_forward(model, self.cache, tok, pos, pos, L, mask, self.backend)  # (1, V)
            t1 = clock.now()
            try:
                if self.temperature == 0:
                    nxt = argmax_tokens(logits[0])[0]
                else:
                    probs = process_logits(logits[0], self.temperature, self.top_p)
                    nxt = int(sample_categorical(probs, self.generator).item())
            except ValueError as err:  # NaN / inf logits never become a token
                raise model_output_error(err, model) from None
            emitted, stop = truncate([nxt], M - len(result.tokens), self.eos_ids)
            result.tokens.extend(emitted)
            t2 = clock.now()
            result.steps.append(StepStats(tokens=tuple(emitted), accepted_len=len(emitted), accepted_nodes=0,
                                          accepted_ranks=(), visits=(), draft_ms=0.0, verify_ms=t1 - t0,
                                          bookkeeping_ms=t2 - t1))
            if stop is not None:
                result.stop_reason = stop
                return result
            L, root = L + 1, nxt


def autoregressive_generate(model: Transformer, prompt_ids: Sequence[int], max_new_tokens: int, *,
                            temperature: float = 0.0, top_p: float = 1.0,
                            generator: torch.Generator | None = None, eos_ids: Iterable[int] = (),
                            backend: str = "auto", max_len: int | None = None) -> GenerationResult:
    """One-shot plain decoding (builds an :class:`AutoregressiveDecoder`, allocating its cache; keep a
    decoder instead when timing several prompts). Arguments and errors as there."""
    if max_len is None:  # just enough slots (the check inside still refuses what does not fit the context)
        max_len = min(model.config.max_position_embeddings, len(prompt_ids) + max(int(max_new_tokens), 1))
    dec = AutoregressiveDecoder(model, temperature=temperature, top_p=top_p, generator=generator,
                                eos_ids=eos_ids, backend=backend, max_len=max_len)
    return dec.generate(prompt_ids, max_new_tokens)
