"""The cached forward every torch model call of the loop goes through (target and model drafters), prefill
chunks, and the request checks made before any forward.

Sharing them is the point: plain decoding and tree decoding run the same forward on the same cache layout, so a
speedup measures speculation, not a different code path.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..attention import TreeMask, causal_tree_mask
from ..errors import DecodingError, PromptError
from ..model import ModelKVCache, Transformer

DEFAULT_MAX_LEN = 4096  # default cache slots (plus the tree size) when a decoder is given no max_len


def check_each_prompt(prompts: Sequence[Sequence[int]], check: Callable[[Sequence[int]], object]) -> None:
    """Run ``check`` on every request before any timed work (a decoder's ``check``, the capacity checks); its
    DecodingError becomes a :class:`~sequoia_opt.errors.PromptError` naming the prompt ("prompt 3 of 8 (600
    tokens): ..."), which a caller that knows the prompt file locates (``path:line``).

    Raises:
        PromptError: the first prompt ``check`` refuses.
    """
    for i, p in enumerate(prompts):
        try:
            check(p)
        except DecodingError as err:
            raise PromptError(i, len(prompts), len(p), str(err)) from None


def check_prompt(prompt_ids: Sequence[int], vocab_size: int) -> list[int]:
    """The prompt as a list of ints. Raises :class:`DecodingError` when it is empty or holds an id outside
    ``[0, vocab_size)``."""
    try:
        ids = [int(t) for t in prompt_ids]
        fraction = next((t for t, i in zip(prompt_ids, ids) if isinstance(t, bool) or t != i), None)  # 3.5: not 3
    except (TypeError, ValueError) as err:
        raise DecodingError(f"prompt_ids must be a sequence of integer token ids ({err})") from None
    if fraction is not None:
        raise DecodingError(f"prompt token id {fraction!r} is not an integer")
    if not ids:
        raise DecodingError("the prompt is empty: decoding needs at least one token (e.g. a BOS token)")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise DecodingError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    return ids


def is_whole(value: object) -> bool:
    """Whether ``value`` is a whole number: a Python or numpy integer, or a float equal to one; not a bool, a
    string, None, infinity or anything ``int()`` refuses (those reached ``int()`` in the size checks and failed
    with a TypeError or OverflowError, or passed: True as one slot, 16.5 as 16)."""
    if isinstance(value, (bool, str, bytes)):
        return False
    try:
        return int(value) == value  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
        return False


def check_max_new_tokens(max_new_tokens: int) -> int:
    """``max_new_tokens`` as an int >= 0, else :class:`DecodingError`."""
    if not is_whole(max_new_tokens) or max_new_tokens < 0:
        raise DecodingError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    return int(max_new_tokens)


def describe_model(model: Transformer, role: str | None = None) -> str:
    """How messages name a model: ``"the target model 'name'"`` (``role`` None: ``"the model 'name'"``),
    without the quoted part when the config has no name."""
    name = getattr(model.config, "name", None)
    return f"the {role + ' ' if role else ''}model" + (f" {name!r}" if name else "")


def model_output_error(err: ValueError, model: Transformer, role: str | None = None) -> DecodingError:
    """The :class:`DecodingError` a decoder raises when the sampling rules refuse what ``model`` produced
    (NaN or inf logits, a distribution without mass): the rule's ValueError message, naming the model."""
    return DecodingError(f"{describe_model(model, role)} produced unusable output: {err}")


def check_capacity(prompt_len: int, max_new_tokens: int, *, cache_len: int, context: int,
                   model: str = "the model") -> None:
    """Refuse, before any forward pass, a generation that plain decoding could not serve either.

    With P prompt tokens and M new tokens the final sequence must fit the model's context,
    ``P + M <= context``, and the cache must hold every token but the last one: the last step feeds the
    token at slot / position ``P + M - 2``, so ``P + M - 1 <= cache_len``. Nothing else is refused: tree
    decoding needs no more, because near the end of the context or of the cache it clips its tree to the
    levels that fit (down to a root-only step, which is a plain decoding step; see
    :meth:`~sequoia_opt.decoding.step_tree.StepTree.within`). Plain and tree decoding are one loop checking
    against the target's context, so they refuse exactly the same requests.

    Args:
        prompt_len: P, tokens in the prompt (>= 1).
        max_new_tokens: M (>= 0); ``M == 0`` never overflows.
        cache_len: slots of the KV cache (the decoder's ``max_len``).
        context: the limiting model's ``max_position_embeddings``.
        model: that model as messages name it (:func:`describe_model`).

    Raises:
        DecodingError: naming the numbers that do not fit and the thing that limits: the model and its
            context (``max_position_embeddings``, or a smaller sliding window), or the cache and its
            ``max_len``. Only a cache overflow suggests a larger ``max_len`` (the decoders' argument); a context
            overflow suggests a shorter prompt or a smaller ``max_new_tokens``.
    """
    if max_new_tokens == 0:
        return
    P, M = prompt_len, max_new_tokens
    if P + M > context:
        fixes = [f"shorten the prompt to at most {context - M} tokens"] if M < context else []
        if P < context:
            fixes.append(f"ask for at most {context - P} new tokens")
        raise DecodingError(
            f"prompt ({P} tokens) + max_new_tokens ({M}) = {P + M} tokens exceed the model context: {model} "
            f"has a context of {context} tokens (max_position_embeddings, or the sliding attention window where "
            "smaller); "
            + (" or ".join(fixes) if fixes else f"shorten the prompt and ask for fewer than {context} new tokens"))
    need = P + M - 1
    if need > cache_len:
        raise DecodingError(
            f"the KV cache has {cache_len} slots (max_len={cache_len}) but this generation needs {need} "
            f"(prompt {P} + max_new_tokens {M} - 1: every token but the last is cached); pass max_len={need} "
            f"or more, or ask for at most {max(cache_len + 1 - P, 0)} new tokens")


def check_request(prompt_ids: Sequence[int], max_new_tokens: int, model: Transformer, *, max_len: int,
                  role: str | None = None) -> list[int]:
    """Every decoder's request check, before any forward pass: :func:`check_prompt` against the model's
    vocabulary, :func:`check_max_new_tokens`, and :func:`check_capacity` against its
    ``max_position_embeddings`` and ``max_len`` cache slots (``role`` names the model in messages). Returns the
    prompt as ints.

    Raises:
        DecodingError: as those checks.
    """
    prompt = check_prompt(prompt_ids, model.config.vocab_size)
    M = check_max_new_tokens(max_new_tokens)
    check_capacity(len(prompt), M, cache_len=max_len, context=model.config.max_position_embeddings,
                   model=describe_model(model, role))
    return prompt


def causal_mask(T: int, device: torch.device, memo: dict[int, TreeMask] | None = None) -> TreeMask:
    """A (T, T) lower-triangular :class:`TreeMask` (prefill chunks, plain decoding with T = 1), taken from
    / stored in the caller's ``memo`` dict when given and T is small (the per-step chunks; each decoder
    keeps its own dict, no module state; prefill masks are built each time so the dict stays small)."""
    if memo is None or T > 16:
        return causal_tree_mask(T, device=device)
    if T not in memo:
        memo[T] = causal_tree_mask(T, device=device)
    return memo[T]


def cached_forward(model: Transformer, cache: ModelKVCache, tokens: torch.Tensor, positions: torch.Tensor,
                   slots: torch.Tensor, prefix_len: int, mask: TreeMask, backend: str,
                   num_layers: int | None = None, hidden_layers: tuple[int, ...] | None = None):
    """The one forward every decoding call makes (batch 1).

    Args:
        model: the target or the draft.
        cache: its static cache.
        tokens: (T,) int64 token ids.
        positions: (T,) int64 rotary positions.
        slots: (T,) int64 cache slots the new keys / values go to.
        prefix_len: committed slots ``[0, prefix_len)`` every query sees unmasked.
        mask: (T, m) tree mask over slots ``[prefix_len, prefix_len + m)``.
        backend: resolved attention backend.
        num_layers: None (every layer) or the first k layers only (:meth:`Transformer.forward`; the
            layer-skip draft), writing K/V only for those layers.
        hidden_layers: None, or the layers whose hidden states are kept (:meth:`Transformer.forward`).

    Returns:
        (T, V) logits in the model's dtype; with ``hidden_layers``, ``(logits, hidden)``, hidden (T, k, dim).
    """
    if hidden_layers is not None:
        logits, hidden = model(tokens.unsqueeze(0), positions, cache=cache, cache_slots=slots, prefix_len=prefix_len,
                               tree_mask=mask, backend=backend, num_layers=num_layers, hidden_layers=hidden_layers)
        return logits[0], hidden[0]
    return model(tokens.unsqueeze(0), positions, cache=cache, cache_slots=slots, prefix_len=prefix_len,
                 tree_mask=mask, backend=backend, num_layers=num_layers)[0]


def run_causal_chunk(model: Transformer, cache: ModelKVCache, tokens: Sequence[int], start: int,
                     backend: str, memo: dict[int, TreeMask] | None = None,
                     num_layers: int | None = None, hidden_layers: tuple[int, ...] | None = None):
    """Feed ``tokens`` causally at slots / positions ``[start, start + T)`` after ``start`` cached tokens
    (through the first ``num_layers`` layers only when given, as :func:`cached_forward`).

    Used for the prefill and for the draft's catch-up chunk. Returns (T, V) logits (with ``hidden_layers``,
    ``(logits, hidden)`` as :func:`cached_forward`).
    """
    device = model.device
    T = len(tokens)
    idx = torch.arange(start, start + T, dtype=torch.int64, device=device)
    tok = torch.tensor(list(tokens), dtype=torch.int64, device=device)
    return cached_forward(model, cache, tok, idx, idx, start, causal_mask(T, device, memo), backend, num_layers,
                          hidden_layers)
