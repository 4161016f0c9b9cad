"""SGLang and vLLM latency profiles through their offline Python APIs, on a CUDA GPU (issue 20).

Neither engine exposes one forward of its model runner as a public call, so T(n) at context L is measured as
what the offline API does run: a request whose prompt is a cached prefix of L tokens (prefix caching: vLLM's
``enable_prefix_caching``, SGLang's radix cache; L a multiple of 16, the engines' block size, so every prefix
block is a cache hit) followed by n new tokens, generating one token. That is one forward over n tokens at
context L, with the engine's own kernels (paged attention, CUDA graphs where they apply), plus the engine's
per-request scheduling, which the per-step overhead absorbs (``T(1)`` against a decode step). SGLang is asked
for the logprobs of the n positions (``return_logprob``, ``logprob_start_len = L``), so its LM head runs over
all n as verification's does; vLLM computes the last position's logits (its ``prompt_logprobs`` turns prefix
caching off, which would time the whole prompt). The call blocks until the engine answers, so wall-clock time
(``time.perf_counter``) is the synchronised time; the engines run their own CUDA streams and (vLLM V1) process,
which CUDA events in this process would not see.

:func:`profile_gpu` assembles the ``treeopt-latency/1`` profile (``engine: {name, version}``) from any
``calls_at(context) -> call(n)`` (:func:`~sequoia_opt.profiling.latency.engine_timers`, the project's rounds and
pairing), so the code path is tested without a GPU on recorded timings; :func:`vllm_calls` and
:func:`sglang_calls` build the real ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from . import EngineError, require_engine

CallsAt = Callable[[int], Callable[[int], Callable[[], None]]]
#: The engines' KV block size: a prefix of a multiple of it is reused whole by prefix caching.
BLOCK = 16


def tokenizer_vocab_size(model: str, tokenizer: Any = None) -> int:
    """Token ids below this are valid prompt tokens for ``model``: the engine's own tokenizer's ``vocab_size``
    (``len`` when it has none) when given, else the model folder's ``tokenizer.json`` (read with
    ``tokenizers``), else its ``config.json`` ``vocab_size``. Random prompts are drawn below it (an id past the
    model's vocabulary is an engine error, and 32000 is past a small vocabulary and far below Llama 3's).

    Raises:
        EngineError: none of them gives a size.
    """
    if tokenizer is not None:
        size = getattr(tokenizer, "vocab_size", None)
        if size is None and hasattr(tokenizer, "__len__"):
            size = len(tokenizer)
        if isinstance(size, int) and size > 0:
            return size
    folder = Path(model)
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return int(Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size(with_added_tokens=False))
    if (folder / "config.json").is_file():
        from .._io import read_json_object

        size = read_json_object(folder / "config.json", error=EngineError).get("vocab_size")
        if isinstance(size, int) and size > 0:
            return size
    raise EngineError(f"cannot tell the vocabulary size of {model}: the engine gave no tokenizer and the folder has "
                      "no tokenizer.json or config.json")


def _check_contexts(contexts: Sequence[int]) -> None:
    bad = [c for c in contexts if c % BLOCK]
    if bad:
        raise EngineError(f"--context {bad[0]}: the GPU engines cache prefixes in blocks of {BLOCK} tokens; give "
                          f"multiples of {BLOCK} so the prefix is a cache hit")


def needed_length(contexts: Sequence[int], token_counts: Sequence[int]) -> int:
    """Tokens the longest timed request holds: the largest context, the most new tokens, the one generated token."""
    return max(contexts) + max(token_counts) + 1


def check_model_length(model: str, contexts: Sequence[int], token_counts: Sequence[int]) -> None:
    """Refuse, before the engine loads, a sweep longer than the model's ``config.json`` ``max_position_embeddings``
    (vLLM refuses a ``max_model_len`` past it at load, and a prompt past it at request time). Nothing is checked
    when the folder has no such field (a hub name the engine resolves), nor when the config scales its rope
    (``rope_scaling`` / ``rope_parameters``: the engines derive a longer context from it, each by its own rule, so
    they are left to judge).

    Raises:
        EngineError: the context plus the token count exceeds the model's positions (one line, the fix).
    """
    from .._io import read_json_object

    config = Path(model) / "config.json"
    doc = read_json_object(config, error=EngineError) if config.is_file() else {}
    scaled = any(isinstance(doc.get(k), dict) and doc[k].get("factor") not in (None, 1, 1.0)
                 for k in ("rope_scaling", "rope_parameters"))
    limit = None if scaled else doc.get("max_position_embeddings")
    need = needed_length(contexts, token_counts)
    if isinstance(limit, int) and not isinstance(limit, bool) and need > limit:
        raise EngineError(f"--context {max(contexts)} + {max(token_counts)} tokens + 1 generated exceeds {model}'s "
                          f"context of {limit} tokens (max_position_embeddings): lower --context or --max-tokens")


def vllm_calls(model: str, *, dtype: str = "bfloat16", max_len: int = 4096, seed: int = 0,
               gpu_memory_utilization: float = 0.5) -> tuple[CallsAt, dict[str, str]]:
    """``calls_at`` for vLLM's offline ``LLM`` (prefix caching on, greedy, one generated token) and its engine info.
    ``max_len`` is vLLM's ``max_model_len``: at most the model's ``max_position_embeddings`` (vLLM refuses more at
    load) and at least the longest request (:func:`needed_length`; :func:`profile_gpu` passes that).

    Raises:
        EngineError: vLLM not installed (the install command).
    """
    vllm = require_engine("vllm")
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype=dtype, enable_prefix_caching=True, max_model_len=max_len, seed=seed,
              gpu_memory_utilization=gpu_memory_utilization)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    vocab = tokenizer_vocab_size(model, llm.get_tokenizer() if hasattr(llm, "get_tokenizer") else None)
    rng = np.random.default_rng(seed)

    def prompt(ids: list[int]) -> Any:
        try:
            from vllm.inputs import TokensPrompt

            return TokensPrompt(prompt_token_ids=ids)
        except ImportError:  # older releases take a dict
            return {"prompt_token_ids": ids}

    def calls_at(ctx: int) -> Callable[[int], Callable[[], None]]:
        prefix = rng.integers(100, vocab, ctx).tolist()
        llm.generate([prompt(prefix + [101])], params, use_tqdm=False)  # fills the prefix cache

        def call(n: int) -> Callable[[], None]:
            def run() -> None:
                llm.generate([prompt(prefix + rng.integers(100, vocab, n).tolist())], params, use_tqdm=False)

            return run

        return call

    return calls_at, {"name": "vllm", "version": f"vllm {vllm.__version__}",
                      "method": "offline LLM.generate: cached prefix + n new tokens, 1 generated token"}


def sglang_calls(model: str, *, dtype: str = "bfloat16", seed: int = 0,
                 mem_fraction_static: float = 0.5) -> tuple[CallsAt, dict[str, str]]:
    """``calls_at`` for SGLang's offline ``Engine`` (radix cache on, greedy, one generated token, logprobs of the
    n new positions) and its engine info.

    Raises:
        EngineError: SGLang not installed (the install command).
    """
    sgl = require_engine("sglang")
    engine = sgl.Engine(model_path=model, dtype=dtype, random_seed=seed, mem_fraction_static=mem_fraction_static)
    rng = np.random.default_rng(seed)
    manager = getattr(engine, "tokenizer_manager", None)
    vocab = tokenizer_vocab_size(model, getattr(manager, "tokenizer", None))
    params = {"max_new_tokens": 1, "temperature": 0.0}

    def calls_at(ctx: int) -> Callable[[int], Callable[[], None]]:
        prefix = rng.integers(100, vocab, ctx).tolist()
        engine.generate(input_ids=prefix + [101], sampling_params=params)

        def call(n: int) -> Callable[[], None]:
            def run() -> None:
                engine.generate(input_ids=prefix + rng.integers(100, vocab, n).tolist(), sampling_params=params,
                                return_logprob=True, logprob_start_len=ctx)

            return run

        return call

    return calls_at, {"name": "sglang", "version": f"sglang {getattr(sgl, '__version__', '?')}",
                      "method": "offline Engine.generate: cached prefix + n new tokens (logprobs of all n), 1 "
                                "generated token"}


def profile_gpu(name: str, model: str, *, contexts: Sequence[int], token_counts: Sequence[int],
                calls_at: CallsAt | None = None, engine: dict[str, str] | None = None, rounds: int = 3,
                paired: bool = True, max_repeats: int = 30, dtype: str = "bfloat16", model_config: Any = None,
                device_name: str | None = None, progress: Any = None):
    """The latency profile of ``model`` on engine ``name`` (``sglang`` or ``vllm``): T(n) at each context by
    :func:`~sequoia_opt.profiling.latency.sweep_grid` over ``calls_at`` (default: the engine's own,
    :func:`sglang_calls` / :func:`vllm_calls`), wall-clock (module docstring). The draft table records 0 ms (the
    engines run their drafters inside the step; profile a draft model as its own target to get c(w)); the
    per-step overhead is 0 (the requests' scheduling is inside T(n)).

    Returns:
        the validated :class:`~sequoia_opt.profiles.LatencyCurve`, ``engine`` naming the engine.

    Raises:
        EngineError: the engine not installed, contexts that are not multiples of :data:`BLOCK`, a sweep longer than
            the model's context (:func:`check_model_length`).
    """
    import torch

    from ..model import ModelConfig
    from ..profiling.latency import build_latency_profile, engine_timers, method_text, sweep_grid

    _check_contexts(contexts)
    if calls_at is None:
        check_model_length(model, contexts, token_counts)
        if name == "vllm":  # max_model_len as long as the sweep needs: a fixed 4096 is past a 2048-token model's
            calls_at, engine = vllm_calls(model, dtype=dtype, max_len=needed_length(contexts, token_counts))
        else:
            calls_at, engine = sglang_calls(model, dtype=dtype)
    engine = dict(engine or {"name": name})
    tables = sweep_grid(engine_timers(calls_at, "cpu", min_repeats=min(5, max_repeats), max_repeats=max_repeats),
                        token_counts, contexts, what=f"{name} target", progress=progress, rounds=rounds,
                        paired=paired)
    if device_name is None:
        device_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    config = model_config or ModelConfig(vocab_size=1, dim=2, n_layers=1, n_heads=1, n_kv_heads=1,
                                         intermediate_size=1, name=Path(model).name)
    slug = "cuda-" + "".join(ch if ch.isalnum() else "-" for ch in device_name.lower()).strip("-")[:40]
    return build_latency_profile(
        target_tables=tables, draft_tables=None, step_overhead_ms=0.0, device="cpu", dtype=torch.float32,
        target_name=Path(model).name, target_config=config, draft_name=None, draft_config=None,
        random_weights=False, profile_id=f"{slug}_{Path(model).name}_{name}",
        method=method_text(rounds, paired, token_counts) + f"; {engine.get('method', 'offline API')}",
        command=f"treeopt profile latency --engine {name}", engine=engine,
        device_meta={"name": device_name, "type": "cuda", "dtype": dtype})
