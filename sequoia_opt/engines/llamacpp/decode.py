"""Generation on llama.cpp through the one loop, and runs of chain settings against plain decoding.

* :func:`generate` — greedy plain or chain speculative decoding on llama.cpp (draft-max N, draft-min M,
  draft-p-min P exactly as llama.cpp's ``common/speculative.cpp`` ``draft-simple`` applies them: the draft
  proposes up to N tokens one forward at a time, stopping early at a top-1 probability below P over its top 10
  logits; fewer than M drafted tokens are dropped; the target verifies [last token, drafts] in one batch with
  logits for each; the longest prefix equal to the target's argmax is accepted plus the target's next token;
  rejected KV cells are removed from both contexts). Greedy output is the target's own greedy output
  (Leviathan et al. 2023, section 2.3).
* :func:`run_settings` — plain decoding and every chain setting on the same prompts, greedy equality checked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ...decoding import Decoder
from ...drafting.policies import ChainPolicy
from ...solver.chains import ChainSetting
from .binding import LlamaCppModel
from .target import LlamaCppDrafter, LlamaCppTarget

__all__ = ["Step", "Generation", "generate", "SettingRun", "run_settings"]

ProgressFn = Callable[[str, int, int], None]


@dataclass
class Step:
    """One decoding step: tokens drafted and accepted, the ms spent in each part."""

    drafted: int
    accepted: int
    emitted: int
    draft_ms: float
    verify_ms: float
    bookkeeping_ms: float


@dataclass
class Generation:
    """A greedy generation: the new tokens and every step."""

    tokens: list[int]
    steps: list[Step] = field(default_factory=list)
    wall_ms: float = 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per target decode: tokens over ``max(1, steps)``."""
        return len(self.tokens) / max(1, len(self.steps))


def generate(target: LlamaCppModel, prompt: Sequence[int], max_new_tokens: int, *,
             draft: LlamaCppModel | None = None, setting: ChainSetting | None = None,
             eos_ids: Iterable[int] = ()) -> Generation:
    """Greedy decoding of ``max_new_tokens`` after ``prompt`` on llama.cpp, through the one loop
    (:class:`~sequoia_opt.decoding.loop.Decoder` with :class:`~sequoia_opt.engines.llamacpp.target.LlamaCppTarget`):
    plain (no draft, or ``n_max`` 0: one target decode per token) or chain speculative decoding with llama.cpp's
    draft-max / draft-min / draft-p-min rule (:class:`~sequoia_opt.drafting.policies.ChainPolicy` over a
    :class:`~sequoia_opt.engines.llamacpp.target.LlamaCppDrafter`). Stops after an EOS id; near the end of a
    context the chain is clipped, as every policy's tree is.

    Raises:
        DecodingError: an empty prompt, prompt + tokens past the target's context (as plain decoding).
    """
    setting = setting or ChainSetting(0)
    policy = None
    if draft is not None and setting.n_max > 0:
        policy = ChainPolicy(LlamaCppDrafter(draft, target.n_vocab), setting.n_max, setting.n_min, setting.p_min)
    dec = Decoder(LlamaCppTarget(target), policy, eos_ids=eos_ids)
    t0 = time.perf_counter()
    res = dec.generate(prompt, max_new_tokens)
    steps = [Step(s.tree_size - 1, s.accepted_nodes, s.accepted_len, s.draft_ms, s.verify_ms, s.bookkeeping_ms)
             for s in res.steps]
    return Generation(res.tokens, steps, (time.perf_counter() - t0) * 1e3)


@dataclass
class SettingRun:
    """One setting run on every prompt: totals, per-prompt rows, greedy equality with plain decoding."""

    name: str
    setting: ChainSetting
    tokens: int = 0
    steps: int = 0
    decode_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    bookkeeping_ms: float = 0.0
    equal: bool = True
    per_prompt_tokens_per_step: list[float] = field(default_factory=list)
    per_prompt_tokens_per_s: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Tokens over the summed step time (draft + verify + bookkeeping, prefill excluded), tokens/s; 0 before
        any run."""
        return 1000.0 * self.tokens / self.decode_ms if self.decode_ms else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens emitted per target decode over every prompt so far."""
        return self.tokens / max(1, self.steps)

    def add(self, gen: Generation) -> None:
        """Add one prompt's generation to the totals (tokens, steps, ms by part) and its own tokens/step and tokens/s
        to the per-prompt rows; does not compare it with plain decoding (:attr:`equal` is set by the caller)."""
        ms = sum(s.draft_ms + s.verify_ms + s.bookkeeping_ms for s in gen.steps)
        self.tokens += len(gen.tokens)
        self.steps += len(gen.steps)
        self.decode_ms += ms
        self.draft_ms += sum(s.draft_ms for s in gen.steps)
        self.verify_ms += sum(s.verify_ms for s in gen.steps)
        self.bookkeeping_ms += sum(s.bookkeeping_ms for s in gen.steps)
        self.per_prompt_tokens_per_step.append(gen.tokens_per_step)
        self.per_prompt_tokens_per_s.append(1000.0 * len(gen.tokens) / ms if ms else 0.0)


def run_settings(target: LlamaCppModel, draft: LlamaCppModel | None, prompts: Sequence[Sequence[int]],
                 settings: Sequence[tuple[str, ChainSetting]], max_new_tokens: int, *, eos_ids: Iterable[int] = (),
                 warmup: bool = True, progress: ProgressFn | None = None) -> tuple[SettingRun, list[SettingRun]]:
    """Plain decoding and every chain setting on the same prompts, prompt by prompt (plain, then each setting,
    so a machine that drifts slows all alike); decode time only (the prompt's prefill is not counted).
    Each setting's greedy tokens are compared with plain decoding's, token for token.

    Returns:
        ``(plain, runs)``.
    """
    eos = list(eos_ids)
    if warmup and prompts:
        generate(target, prompts[0], 4, draft=draft, setting=settings[0][1] if settings else None, eos_ids=eos)
    plain = SettingRun("plain", ChainSetting(0))
    runs = [SettingRun(name, s) for name, s in settings]
    total = len(prompts) * (1 + len(runs))
    done = 0
    for ids in prompts:
        ref = generate(target, ids, max_new_tokens, eos_ids=eos)
        plain.add(ref)
        done += 1
        if progress:
            progress("llama.cpp plain", done, total)
        for run in runs:
            gen = generate(target, ids, max_new_tokens, draft=draft, setting=run.setting, eos_ids=eos)
            run.add(gen)
            run.equal = run.equal and gen.tokens == ref.tokens
            done += 1
            if progress:
                progress(f"llama.cpp {run.name}", done, total)
    return plain, runs
