"""How good a draft is for its target: the cost of one cached draft forward against one target forward
(batch 1, timed alternately), and greedy top-1 agreement with the target's own greedy continuations of the eval
prompts (:func:`evaluate_pair` does both; ``--evaluate DIR`` runs it on a saved draft)."""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

import torch

from ..attention import causal_tree_mask
from ..model.llama import Transformer


def measure_forward_ms(model: Transformer, *, prefix_len: int, n_new: int, repeats: int = 30,
                       warmup: int = 3) -> float:
    """Median wall time (ms) of one cached forward of ``n_new`` tokens (a causal chain) after a prefix of
    ``prefix_len`` cached tokens, batch 1, in the model's dtype; warm-up runs excluded."""
    cache = model.new_cache(prefix_len + n_new)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        pre = torch.randint(0, model.config.vocab_size, (1, prefix_len), generator=g)
        model(pre, torch.arange(prefix_len), cache=cache, cache_slots=torch.arange(prefix_len), prefix_len=0,
              tree_mask=causal_tree_mask(prefix_len))
        new = torch.randint(0, model.config.vocab_size, (1, n_new), generator=g)
        pos = torch.arange(prefix_len, prefix_len + n_new)
        mask = causal_tree_mask(n_new)
        times = []
        for i in range(warmup + repeats):
            t = time.perf_counter()
            model(new, pos, cache=cache, cache_slots=pos, prefix_len=prefix_len, tree_mask=mask)
            if i >= warmup:
                times.append(time.perf_counter() - t)
    times.sort()
    return 1000 * times[len(times) // 2]


def measure_pair_ms(draft: Transformer, target: Transformer, *, prefix_len: int, n_new: int, repeats: int = 30,
                    warmup: int = 3) -> tuple[float, float]:
    """Median ms of one cached forward (as :func:`measure_forward_ms`) of the draft and of the target, timed
    alternately (draft, target, draft, ...) so that load from other processes on a shared CPU hits both alike."""
    setups = []
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for m in (draft, target):
            cache = m.new_cache(prefix_len + n_new)
            pre = torch.randint(0, m.config.vocab_size, (1, prefix_len), generator=g)
            m(pre, torch.arange(prefix_len), cache=cache, cache_slots=torch.arange(prefix_len), prefix_len=0,
              tree_mask=causal_tree_mask(prefix_len))
            setups.append((m, cache, torch.randint(0, m.config.vocab_size, (1, n_new), generator=g)))
        pos = torch.arange(prefix_len, prefix_len + n_new)
        mask = causal_tree_mask(n_new)
        times: list[list[float]] = [[], []]
        for i in range(warmup + repeats):
            for j, (m, cache, new) in enumerate(setups):
                t = time.perf_counter()
                m(new, pos, cache=cache, cache_slots=pos, prefix_len=prefix_len, tree_mask=mask)
                if i >= warmup:
                    times[j].append(time.perf_counter() - t)
    med = [1000 * sorted(ts)[len(ts) // 2] for ts in times]
    return med[0], med[1]


def greedy_generate(model: Transformer, prompt: list[int], max_new: int, eos_ids: Iterable[int]) -> list[int]:
    """Plain greedy decoding with the static KV cache; stops after an EOS id (included)."""
    eos = set(eos_ids)
    P = len(prompt)
    cache = model.new_cache(P + max_new)
    out: list[int] = []
    with torch.inference_mode():
        logits = model(torch.tensor([prompt]), torch.arange(P), cache=cache, cache_slots=torch.arange(P),
                       prefix_len=0, tree_mask=causal_tree_mask(P))
        one = causal_tree_mask(1)
        for i in range(max_new):
            tok = int(logits[0, -1].argmax())
            out.append(tok)
            if tok in eos or i == max_new - 1:
                break
            pos = torch.tensor([P + i])
            logits = model(torch.tensor([[tok]]), pos, cache=cache, cache_slots=pos, prefix_len=P + i,
                           tree_mask=one)
    return out


def greedy_agreement(draft: Transformer, prompts: Sequence[list[int]], continuations: Sequence[list[int]]
                     ) -> dict[str, float]:
    """Fraction of continuation positions where the draft's argmax (given the prompt and the target's own
    greedy continuation so far) equals the target's greedy token; also the mean length of the agreeing
    prefix of each continuation (what a greedy chain would accept, capped by the continuation length)."""
    agree, total, prefixes = 0, 0, []
    with torch.inference_mode():
        for p, c in zip(prompts, continuations):
            if not c:
                continue
            seq = torch.tensor([p + c[:-1]])  # (1, P + G - 1)
            pred = draft(seq)[0, len(p) - 1:].argmax(-1)  # (G,) the draft's guess for each continuation token
            hit = pred == torch.tensor(c)
            agree += int(hit.sum())
            total += len(c)
            miss = (~hit).nonzero()
            prefixes.append(int(miss[0]) if len(miss) else len(c))
    return {"agreement": agree / max(1, total), "positions": total,
            "mean_agreeing_prefix": sum(prefixes) / max(1, len(prefixes))}


def evaluate_pair(draft: Transformer, target: Transformer, tokenizer, prompts: Sequence[str], *,
                  gen_tokens: int, log: Callable[[str], None] = print, prefix_len: int = 128,
                  repeats: int = 30, continuations: Sequence[list[int]] | None = None) -> dict:
    """Cost ratio (cached forward at batch 1, ``n_new`` in 1 and 4, float32, medians) and greedy agreement on
    the target's greedy continuations of ``prompts`` (``continuations``, when given, are those: the target's
    ``gen_tokens`` greedy tokens per prompt, computed earlier)."""
    cost = {}
    for n_new in (1, 4):
        d, t = measure_pair_ms(draft, target, prefix_len=prefix_len, n_new=n_new, repeats=repeats)
        cost[f"n_new={n_new}"] = {"draft_ms": round(d, 3), "target_ms": round(t, 3), "ratio": round(d / t, 4)}
        log(f"cost n_new={n_new}: draft {d:.2f} ms, target {t:.2f} ms, ratio {d / t:.3f}")
    if gen_tokens <= 0:
        return {"cost": cost, "prefix_len": prefix_len, "repeats": repeats, "threads": torch.get_num_threads()}
    enc = [tokenizer.encode(p) for p in prompts]
    t0 = time.perf_counter()
    conts = list(continuations) if continuations is not None else \
        [greedy_generate(target, e, gen_tokens, tokenizer.eos_ids) for e in enc]
    gen_s = time.perf_counter() - t0
    agr = greedy_agreement(draft, enc, conts)
    log(f"greedy agreement on {len(prompts)} prompts x {gen_tokens} target tokens: {agr['agreement']:.4f} "
        f"(mean agreeing prefix {agr['mean_agreeing_prefix']:.2f}); target generation {gen_s:.0f} s")
    return {"cost": cost, "prefix_len": prefix_len, "repeats": repeats, "greedy": agr,
            "gen_tokens": gen_tokens, "n_prompts": len(prompts), "threads": torch.get_num_threads()}
