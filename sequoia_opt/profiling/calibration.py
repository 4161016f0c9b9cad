"""Measure a drafter's calibration: record wide draft trees and the target's verdict on every node
(:mod:`sequoia_opt.profiles.calibration` says what is recorded and why it gives each candidate's acceptance)."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from ..profiles.calibration import CalibrationProfile, RecordedStep
from ..decoding import Decoder, StepView
from ..decoding.forward import check_each_prompt
from ..decoding.sampling import argmax_tokens, process_logits, prompt_seed
from ..drafting.drafters import Drafter
from ..drafting.policies import DynamicPolicy
from ..dynamic import DynamicSetting, max_candidates
from ..model import Transformer
from ..tree import now_iso

__all__ = ["measure_calibration", "build_calibration_profile", "recording_setting", "MAX_RECORDING_NODES"]

#: The most nodes a recording tree may have (one target forward verifies them all each step).
MAX_RECORDING_NODES = 1024


def recording_setting(steps: int, topk: int) -> DynamicSetting:
    """The recording tree: EAGLE-2 of ``steps`` levels and ``topk`` children, every grown node verified.

    Raises:
        ValueError: steps or topk < 1, or a tree of more than :data:`MAX_RECORDING_NODES` nodes.
    """
    n = max_candidates(DynamicSetting("eagle", steps, topk, 2))
    if n > MAX_RECORDING_NODES:
        raise ValueError(f"a recording tree of {steps} levels of top-{topk} has {n} nodes (1 + k + (steps - 1) k^2); "
                         f"at most {MAX_RECORDING_NODES} are verified in one forward: lower --calibration-steps or "
                         "--calibration-topk")
    return DynamicSetting("eagle", steps, topk, n)


@torch.inference_mode()
def measure_calibration(target: Transformer, new_drafter: Callable[[], Drafter], prompts: Sequence[Sequence[int]], *,
                        steps: int = 5, topk: int = 6, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                        max_new_tokens: int = 64, eos_ids: Iterable[int] = (), backend: str = "auto",
                        progress: Callable[[str, int, int], None] | None = None) -> list[RecordedStep]:
    """Decode every prompt with a wide EAGLE-2 tree (``steps`` levels, ``topk`` children and frontier, every
    grown node verified) and record, per step, the tree and each node's acceptance given its parent.

    Args:
        target: the target model.
        new_drafter: makes the drafter (one per call; it binds to this decoder).
        prompts: token ids per prompt (each at least one token).
        steps, topk: the recording tree (``1 + topk + (steps - 1) topk^2`` nodes verified per step).
        temperature, top_p: the decoding mode (greedy acceptance is the target's argmax; sampling, its p).
        seed: the decoder's random seed (per prompt ``seed + i``: :func:`~sequoia_opt.decoding.sampling.prompt_seed`).
        max_new_tokens: tokens generated per prompt.

    Returns:
        One :class:`~sequoia_opt.profiles.calibration.RecordedStep` per step that drafted (root-only steps near the end of
        the context are skipped).

    Raises:
        DecodingError: a drafter without draft probabilities, a prompt past the target's context.
        ValueError: steps or topk < 1, or a recording tree of more than :data:`MAX_RECORDING_NODES` nodes.
    """
    policy = _RecordingPolicy(new_drafter(), recording_setting(steps, topk), temperature, top_p)
    longest = max(len(p) for p in prompts)
    dec = Decoder(target, policy, temperature=temperature, top_p=top_p, eos_ids=eos_ids, backend=backend,
                  max_len=min(target.config.max_position_embeddings, longest + max_new_tokens) + policy.max_size)
    check_each_prompt(prompts, lambda p: dec.check(p, max_new_tokens))  # before the first forward pass
    for i, p in enumerate(prompts):
        dec.generator = torch.Generator(device=target.device).manual_seed(prompt_seed(seed, i))
        dec.generate(p, max_new_tokens)
        if progress:
            progress(f"prompt {i + 1}/{len(prompts)}", i + 1, len(prompts))
    return policy.recorded


class _RecordingPolicy(DynamicPolicy):
    """The recording tree's dynamic policy: each step that drafted is recorded when the loop shows it the step
    (:meth:`observe`: the tree verified and the target's logits over it). Every step grows the whole recording
    tree, to the answer's last token."""

    def __init__(self, drafter: Drafter, setting, temperature: float, top_p: float) -> None:
        super().__init__(drafter, setting, cut_at_answer_end=False)
        self.temperature, self.top_p = temperature, top_p
        self.recorded: list[RecordedStep] = []

    def observe(self, state, step: StepView) -> None:
        tree, logits = step.trees[0], step.logits[0]
        if tree.n > 1:
            self.recorded.append(_record(self, tree, logits, self.temperature, self.top_p))


def _record(policy: DynamicPolicy, tree, logits: torch.Tensor, temperature: float, top_p: float) -> RecordedStep:
    cand, sel = policy.last_tree, policy.last_selected  # sel[j]: the candidate node that step node j is
    n = tree.n
    step_of = {c: j for j, c in enumerate(sel)}
    accept = np.ones(n)
    if temperature == 0:
        top = argmax_tokens(logits)
        for j in range(1, n):
            accept[j] = float(top[tree.parent[j]] == tree.token_list[j])
    else:
        p = process_logits(logits, temperature, top_p)  # (n, V)
        rows = torch.tensor(tree.parent[1:]), torch.tensor(tree.token_list[1:])
        accept[1:] = p[rows].double().cpu().numpy()
    ent = np.full(n, math.nan)
    for c, h in cand.entropy.items():
        if c in step_of:
            ent[step_of[c]] = h
    return RecordedStep(parent=np.asarray(tree.parent, dtype=np.int64),
                        prob=np.asarray([cand.prob[c] for c in sel], dtype=np.float64),
                        rank=np.asarray([cand.rank[c] for c in sel], dtype=np.int64), accept=accept, entropy=ent)


def build_calibration_profile(steps: list[RecordedStep], *, profile_id: str, target_name: str, draft_name: str,
                              temperature: float, top_p: float, recording_steps: int, recording_topk: int,
                              **measured) -> CalibrationProfile:
    """Wrap recorded steps in a :class:`~sequoia_opt.profiles.calibration.CalibrationProfile` with what was measured."""
    meta = {"target": target_name, "draft": draft_name, "temperature": float(temperature), "top_p": float(top_p),
            "recording": {"steps": int(recording_steps), "topk": int(recording_topk)},
            "draft_probability": ("the draft's softmax at temperature 1" if temperature == 0 else
                                  "the draft's q at the sampling temperature and top-p"),
            "date": now_iso(), **measured}
    return CalibrationProfile(profile_id, meta, steps)
