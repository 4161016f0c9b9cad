"""Acceptance profiling: the positional acceptance vector p_1..p_K of a draft/target pair, measured with the
decoder's own verifier so the solver and the decoder agree on what "accepted" means.

Sequoia (Chen et al. 2024), section 3.1: p_k is the probability that the k-th candidate a node proposes is
the one the verifier accepts (unconditionally; ``1 - sum p_k`` is the chance all K are rejected). Greedy mode:
candidates are the draft's top-K and the accepted one equals the target's argmax. Sampling mode: candidates
are K draft samples without replacement, tried in rank order with the residual rule (Sequoia Algorithm 2).

How it is measured: the decoder runs a *measurement tree*, a rank-0 spine of depth D where every spine node
proposes K children. Each spine node the accepted path reaches is one trial (a ``NodeVisit``): which of its K
candidates was accepted, or none. Counts over all trials give p and its per-entry confidence interval; the
same counts split by depth test Sequoia's positional assumption (that p does not depend on depth). Near the
end of a context the decoder clips the tree to the levels that fit: a clipped spine node is a leaf there,
proposes nothing and is no trial (not a rejection), so clipped steps only contribute fewer trials.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..decoding import Decoder
from ..decoding.forward import check_each_prompt
from ..drafting.drafters import Drafter, drafter_factory
from ..drafting.policies import StaticTreePolicy
from ..errors import DecodingError
from ..model import Transformer
from ..profiles import ACCEPTANCE_FORMAT, AcceptanceProfile
from ..tree import Tree, now_iso

ProgressFn = Callable[[str, int, int], None]


def measurement_tree(width: int, depth: int) -> Tree:
    """A rank-0 spine of ``depth`` levels where every spine node has ``width`` children.

    Size ``1 + width * depth``. Raises :class:`~sequoia_opt.errors.TreeValidationError` for width or depth
    below 1.
    """
    from ..errors import TreeValidationError

    if width < 1 or depth < 1:
        raise TreeValidationError(f"a measurement tree needs width >= 1 and depth >= 1, got {width}, {depth}")
    return Tree.from_choices([[0] * d + [r] for d in range(depth) for r in range(width)])


@dataclass
class AcceptanceCounts:
    """Trial outcomes. ``counts[k]`` for k < K: candidate of rank k accepted; ``counts[K]``: all rejected.

    Attributes:
        width: K.
        counts: (K + 1,) int64 over all depths.
        by_depth: depth of the proposed children (1 = the root's children) -> (K + 1,) counts.
        by_prompt: per prompt (in the order :meth:`start_prompt` was called), depth -> (K + 1,) counts: the
            same trials split by prompt, what an interval between prompts needs (tokens of one prompt are
            correlated; :mod:`sequoia_opt.solver.intervals`). Empty when no prompt was started.
        steps: decoding steps run; tokens: tokens emitted (for tokens per step).
        undrafted_steps: steps whose tree was clipped to the root alone (no trial: the drafter was not asked),
            near the end of the target's context or of the drafter's, whichever is shorter.
        drafter_context: the drafter's context in tokens (its ``max_position_embeddings``; None when it has no
            limit, n-gram lookup).
    """

    width: int
    counts: np.ndarray
    by_depth: dict[int, np.ndarray] = field(default_factory=dict)
    steps: int = 0
    tokens: int = 0
    by_prompt: list[dict[int, np.ndarray]] = field(default_factory=list)
    undrafted_steps: int = 0
    drafter_context: int | None = None

    @classmethod
    def empty(cls, width: int) -> "AcceptanceCounts":
        return cls(width=width, counts=np.zeros(width + 1, dtype=np.int64))

    def start_prompt(self) -> None:
        """The trials that follow belong to a new prompt (:attr:`by_prompt`)."""
        self.by_prompt.append({})

    def add_visit(self, depth: int, accepted_rank: int | None) -> None:
        """Record one trial at a node of ``depth`` (its children sit at ``depth + 1``), in the current prompt's
        counts too when one was started."""
        k = self.width if accepted_rank is None else int(accepted_rank)
        self.counts[k] += 1
        for table in (self.by_depth, *self.by_prompt[-1:]):
            row = table.setdefault(depth + 1, np.zeros(self.width + 1, dtype=np.int64))
            row[k] += 1

    def prompt_counts(self, depth: int | None = None) -> np.ndarray | None:
        """(P, D, K + 1) int64: per prompt, per depth 1..D of the proposed children, the outcome counts (D: the
        deepest depth any prompt reached, or ``depth`` when larger); None when no prompt was started."""
        if not self.by_prompt:
            return None
        D = max([d for t in self.by_prompt for d in t] + [depth or 1])
        out = np.zeros((len(self.by_prompt), D, self.width + 1), dtype=np.int64)
        for i, t in enumerate(self.by_prompt):
            for d, c in t.items():
                out[i, d - 1] = c
        return out

    @property
    def trials(self) -> int:
        return int(self.counts.sum())

    def coverage_warning(self, threshold: float = 0.05) -> str | None:
        """One line when at least ``threshold`` of the steps drafted nothing (:attr:`undrafted_steps`): the
        profile then holds the acceptance of the positions the drafter reached only, and serving the pair would
        decode the others plainly; None otherwise."""
        if self.steps == 0 or self.undrafted_steps < threshold * self.steps:
            return None
        ctx = (f"the drafter's context is {self.drafter_context} tokens" if self.drafter_context is not None
               else "the target's context")
        return (f"{self.undrafted_steps} of {self.steps} steps ({self.undrafted_steps / self.steps:.0%}) drafted "
                f"nothing: the measurement tree did not fit ({ctx}); these positions are not in the profile, and a "
                "pair served on such requests decodes them plainly (use prompts + --max-new-tokens within the "
                "drafter's context, or a drafter with a longer one)")

    def vector(self) -> np.ndarray:
        """(K,) float64 p_k = counts[k] / trials. Raises ValueError with no trials."""
        if self.trials == 0:
            raise ValueError("no verification trials were recorded (no steps ran)")
        return self.counts[:-1] / self.trials

    def depth_vectors(self, min_trials: int = 1) -> dict[int, np.ndarray]:
        """depth -> (K,) vector, for depths with at least ``min_trials`` trials."""
        return {d: c[:-1] / c.sum() for d, c in sorted(self.by_depth.items()) if c.sum() >= min_trials}


def positional_check(counts: AcceptanceCounts, z: float = 1.96, min_trials: int = 30) -> list[dict]:
    """How far Sequoia's positional assumption holds: per depth, the depth's p_1 and acceptance mass
    (sum p_k) against the pooled values, with a normal-approximation z score for the difference in
    acceptance mass. Depths with fewer than ``min_trials`` trials are left out.

    Returns rows ``{depth, trials, p1, mass, pooled_mass, z, consistent}``; ``consistent`` is ``|z| <= z``.
    """
    pooled = counts.vector()
    pooled_mass = float(pooled.sum())
    rows = []
    for d, c in sorted(counts.by_depth.items()):
        n = int(c.sum())
        if n < min_trials:
            continue
        mass = float(c[:-1].sum() / n)
        se = np.sqrt(max(pooled_mass * (1 - pooled_mass), 1e-12) / n)
        zscore = (mass - pooled_mass) / se
        rows.append({"depth": d, "trials": n, "p1": float(c[0] / n), "mass": mass, "pooled_mass": pooled_mass,
                     "z": float(zscore), "consistent": bool(abs(zscore) <= z)})
    return rows


@torch.inference_mode()
def measure_acceptance(
    target: Transformer,
    draft: Transformer | Drafter | Callable[[], Transformer | Drafter],
    prompts: Sequence[Sequence[int]],
    *,
    width: int,
    depth: int = 4,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 64,
    eos_ids: Sequence[int] = (),
    backend: str = "auto",
    progress: ProgressFn | None = None,
) -> AcceptanceCounts:
    """Run the decoder with :func:`measurement_tree` over ``prompts`` (token ids) and count the trials.

    Args:
        target: the target model.
        draft: the proposer (same vocabulary, same device): a draft Transformer, a
            :class:`~sequoia_opt.drafting.drafters.Drafter` instance, or a function making one (called once).
        prompts: token id lists.
        width: K candidates per node; depth: spine depth D of the measurement tree.
        temperature, top_p: 0 = greedy verification; > 0 = sampling with the residual rule.
        seed: seeds the decoder's generator (sampling draws).
        max_new_tokens: tokens generated per prompt.

    Returns:
        :class:`AcceptanceCounts` over all prompts.

    Raises:
        DecodingError: as :class:`~sequoia_opt.decoding.loop.Decoder` (vocabulary mismatch, overflow, ...),
            before decoding; no trial at all (the measurement tree fit at no position: a drafter whose context
            is shorter than the prompts; a feature head given 1-token prompts and one new token each), after it.
    """
    tree = measurement_tree(width, depth)
    gen = torch.Generator(device=target.device)
    gen.manual_seed(seed)
    drafter = drafter_factory(draft)()
    # the measurement tree is measured whole at every step, to the answer's last token
    decoder = Decoder(target, StaticTreePolicy(drafter, tree, cut_at_answer_end=False), temperature=temperature,
                      top_p=top_p, generator=gen, eos_ids=eos_ids, backend=backend)
    check_each_prompt(prompts, lambda p: decoder.check(p, max_new_tokens))  # before the first forward pass
    context = getattr(drafter, "context", None)
    counts = AcceptanceCounts.empty(width)
    counts.drafter_context = context if isinstance(context, int) and context < 2 ** 31 else None
    shortest = min((len(p) for p in prompts), default=0)

    def no_trial(steps: str) -> DecodingError:
        fits = counts.drafter_context is None or shortest - 1 <= counts.drafter_context - depth
        # a feature head whose context fits: not the cause; its first steps are (no hidden state yet)
        if steps and fits and getattr(drafter, "reads_target_features", False):
            return DecodingError(f"no acceptance trial{steps}: the feature head drafted nothing at any of them (the "
                                 f"shortest prompt is {shortest} tokens, and a feature head drafts from a prompt's "
                                 "second token on: the target has given it no hidden state before): use longer "
                                 "prompts or more --max-new-tokens")
        ctx = (f"the drafter's context is {counts.drafter_context} tokens" if counts.drafter_context is not None
               else "the context left no room")
        return DecodingError(f"no acceptance trial{steps}: the measurement tree (depth {depth}) fits at no position "
                             f"({ctx}; the shortest prompt is {shortest} tokens): use shorter prompts, or a drafter "
                             "with a longer context")

    if counts.drafter_context is not None and prompts and shortest >= counts.drafter_context:
        raise no_trial("")  # the drafter cannot read any prompt: known before the first forward
    for i, p in enumerate(prompts):
        counts.start_prompt()
        result = decoder.generate(p, max_new_tokens)
        for step in result.steps:
            counts.steps += 1
            counts.tokens += step.accepted_len
            counts.undrafted_steps += step.tree_size == 1
            for visit in step.visits:
                if visit.num_children == width:
                    counts.add_visit(visit.depth, visit.accepted_rank)
        if progress:
            progress(f"acceptance, prompt {i + 1}/{len(prompts)}", i + 1, len(prompts))
    if counts.trials == 0 and counts.steps > 0:
        raise no_trial(f" in {counts.steps} steps")
    return counts


Trace = list[tuple[int, float, bool]]


def can_teacher_force(drafter: Drafter) -> bool:
    """Whether ``drafter`` implements :meth:`~sequoia_opt.drafting.drafters.Drafter.teacher_forced` (a feature
    head does not: it needs the target's hidden states)."""
    return type(drafter).teacher_forced is not Drafter.teacher_forced


def teacher_forced_trace(drafter: Drafter, prompt: Sequence[int], continuation: Sequence[int]) -> Trace:
    """One prompt's trace: per token of ``continuation``, ``(the drafter's teacher-forced guess, its probability,
    whether it equals the token)``.

    Raises:
        DecodingError: the drafter returned a guess count other than ``len(continuation)`` (a short trace would
            replay as a shorter answer without a word).
    """
    guesses = drafter.teacher_forced(prompt, continuation)
    if len(guesses) != len(continuation):
        raise DecodingError(f"{type(drafter).__name__}.teacher_forced returned {len(guesses)} guesses for "
                            f"{len(continuation)} tokens")
    return [(tok, q, tok == int(t)) for (tok, q), t in zip(guesses, continuation)]


def chain_traces(target: Transformer, draft: Transformer | Drafter | Callable[[], Transformer | Drafter],
                 prompts: Sequence[Sequence[int]], *, max_new_tokens: int, eos_ids: Sequence[int] = (),
                 backend: str = "auto", progress: ProgressFn | None = None) -> list[Trace] | None:
    """Teacher-forced traces for greedy chains: per prompt, the target's greedy continuation (plain decoding
    through the decoder, :func:`~sequoia_opt.decoding.loop.plain_decoder`) and at each of its positions the
    drafter's top-1 guess after the tokens before it (:meth:`~sequoia_opt.drafting.drafters.Drafter.teacher_forced`),
    its probability, and whether it equals the target's token.

    Why not the measurement tree (:func:`measure_acceptance`): there a step starts right after the last one's
    rejection, so its depth-1 trials are the positions after a miss, where a drafter agrees least (demo pair,
    32 profile prompts x 16 tokens: 0.43 at depth 1 against 0.48 over every position). A chain of K starts after
    K accepted drafts as often as after a miss; along the traces every start is seen, and replaying a chain on
    them (:func:`~sequoia_opt.solver.chains.replay_chain`) is exactly what greedy decoding does.

    Args:
        target: the target model.  draft: the drafter (as :func:`measure_acceptance`).
        prompts: token id lists.  max_new_tokens: continuation tokens per prompt (stops early at an EOS id).

    Returns:
        one trace per prompt: ``(drafted token, its probability, equal to the target's)`` per continuation
        token; None when the drafter cannot be teacher-forced (a feature head).

    Raises:
        DecodingError: as :meth:`~sequoia_opt.decoding.loop.Decoder.check` (a prompt too long for the context),
            before any forward.
    """
    from ..decoding.loop import plain_decoder

    drafter = drafter_factory(draft)()
    if not can_teacher_force(drafter):
        return None
    plain = plain_decoder(target, eos_ids=eos_ids, backend=backend)
    check_each_prompt(prompts, lambda p: plain.check(p, max_new_tokens))  # before the first forward pass
    out: list[Trace] = []
    for i, p in enumerate(prompts):
        out.append(teacher_forced_trace(drafter, p, plain.generate(p, max_new_tokens).tokens))
        if progress:
            progress(f"chain traces, prompt {i + 1}/{len(prompts)}", i + 1, len(prompts))
    return out


def _positional_flag(counts: AcceptanceCounts) -> dict:
    """``{"positional_consistent": bool}`` when at least two depths had enough trials to test the positional
    assumption (:func:`positional_check`), else ``{}``."""
    rows = positional_check(counts)
    return {"positional_consistent": all(r["consistent"] for r in rows)} if len(rows) >= 2 else {}


def record_depth_limit(profile: Any, drafter: Any) -> Any:
    """Write the drafter's depth limit (:attr:`~sequoia_opt.drafting.drafters.Drafter.depth_limit`: Medusa's K
    heads propose depths 1..K) into ``profile.measured["draft_depth_limit"]``, where it has one, so that what is
    solved from the profile (solve, tune, run --compare-drafters and --adapt, plot) stops there. Returns
    ``profile``."""
    limit = getattr(drafter, "depth_limit", None)
    if limit is not None:
        profile.measured["draft_depth_limit"] = int(limit)
    return profile


def build_acceptance_profile(
    counts: AcceptanceCounts,
    *,
    profile_id: str,
    target_name: str,
    draft_name: str,
    temperature: float,
    top_p: float,
    depth: int,
    device: str,
    dtype: str,
    prompts_file: str,
    num_prompts: int,
    max_new_tokens: int,
    seed: int,
    draft_cost_model: str | None = None,
    command: str = "treeopt profile acceptance",
) -> AcceptanceProfile:
    """Assemble a validated ``treeopt-acceptance/1`` :class:`AcceptanceProfile` from measured counts.

    Per-prompt counts (``counts_by_prompt``, :meth:`AcceptanceCounts.prompt_counts`) are stored when the counts
    were kept by prompt, for intervals between prompts (:mod:`sequoia_opt.solver.intervals`).
    Per-depth vectors are stored for depths with at least 30 trials, and ``measured.positional_consistent``
    says whether they agree with the pooled vector (:func:`positional_check`, when two depths or more could
    be tested): ``treeopt solve``'s ``auto`` acceptance model solves with the per-depth vectors when not. ``draft_name`` names the drafter (a
    checkpoint label, ``self:L`` or ``lookup:MIN-MAX``); ``draft_cost_model`` (``per-level`` / ``one-pass``),
    when given, is stored as ``measured.draft_cost_model``; ``command`` is named in ``source`` as what
    measured it.
    """
    doc = {
        "format": ACCEPTANCE_FORMAT,
        "id": profile_id,
        "source": (f"measured by {command}: decoder verifier on a rank-0 spine of depth "
                   f"{depth} with {counts.width} candidates per spine node"),
        "measured": {
            "target": target_name, "draft": draft_name,
            **({"draft_cost_model": draft_cost_model} if draft_cost_model else {}),
            "mode": "greedy" if temperature == 0 else "sampling",
            "temperature": float(temperature), "top_p": float(top_p), "width": counts.width,
            "num_samples": counts.trials, "date": now_iso(), "device": device, "dtype": dtype,
            "prompts": prompts_file, "num_prompts": num_prompts, "max_new_tokens": max_new_tokens,
            "seed": seed, "steps": counts.steps,
            "tokens_per_step": round(counts.tokens / counts.steps, 4) if counts.steps else None,
            **({"undrafted_steps": counts.undrafted_steps} if counts.undrafted_steps else {}),
            **_positional_flag(counts),
        },
        "acceptance": [float(x) for x in counts.vector()],
        "counts": [int(x) for x in counts.counts],
        "acceptance_by_depth": {int(d): [float(x) for x in v]
                                for d, v in counts.depth_vectors(min_trials=30).items()},
    }
    per_prompt = counts.prompt_counts(depth)
    if per_prompt is not None:
        doc["counts_by_prompt"] = per_prompt.tolist()
    return AcceptanceProfile.from_dict(doc, source=f"acceptance profile {profile_id!r}", default_id=profile_id)
