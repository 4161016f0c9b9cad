"""Profiles: versioned YAML schemas, validation, loading and atomic saving, one module per format.

* ``acceptance.py`` (``treeopt-acceptance/1``), ``pair.py`` (``treeopt-acceptance-pair/1``), ``latency.py``
  (``treeopt-latency/1``), ``batch.py`` (``treeopt-latency-batch/1``), ``calibration.py`` (``treeopt-calibration/1``);
  ``common.py`` what they share, ``checks.py`` the cross-checks of the profiles one command is given.

Two files feed the solver. Every figure carries its unit in its key name (``_ms`` for milliseconds,
``tokens`` for token counts); a key with another time unit (``_s``, ``_us``, ``_ns``) is refused rather than
guessed. Any problem raises :class:`~sequoia_opt.errors.ProfileError` with one line naming the file, the key
and the problem.

Acceptance profile, ``format: treeopt-acceptance/1`` (Sequoia, Chen et al. 2024, section 3.1)::

    format: treeopt-acceptance/1
    id: llama2-7b_jf68m_greedy        # optional; defaults to the file stem
    example: false                    # optional; true for illustrative, not measured, data
    source: "how the numbers were obtained"   # optional free text
    measured:                         # what was measured (all optional except mode)
      target: meta-llama/Llama-2-7b-hf
      draft: JackFram/llama-68m
      mode: greedy                    # greedy | sampling
      temperature: 0.0
      top_p: 1.0
      width: 8                        # K, candidates proposed per node while measuring
      num_samples: 2000
      date: "2025-01-01T00:00:00+00:00"
      device: NVIDIA H100 80GB HBM3
      dtype: float16
      prompts: data/prompts.jsonl
    acceptance: [0.62, 0.12, ...]     # K entries, p_k = P(the k-th candidate is the accepted one); sum <= 1
    counts: [1240, 240, ..., 310]     # optional; K + 1 integers: times candidate k was accepted, then the
                                      # times all K were rejected. acceptance must equal counts / sum(counts).
    acceptance_by_depth:              # optional; depth (1 = children of the root) -> K-entry vector
      1: [...]
    counts_by_prompt:                 # optional; per prompt, per depth 1..D, its K + 1 counts (they sum to
      - [[...], [...], ...]           # counts): intervals between prompts (sequoia_opt.solver.intervals)

Latency profile, ``format: treeopt-latency/1``::

    format: treeopt-latency/1
    id: h100_llama2-7b_fp16           # optional; defaults to the file stem
    example: false
    source: "..."
    device: {name: NVIDIA H100 80GB HBM3, torch_version: 2.3.0, driver_version: "550.54", dtype: float16,
             threads: 1}
    model:
      target: meta-llama/Llama-2-7b-hf
      target_shape: {n_layers: 32, d_model: 4096, n_heads: 32}   # free-form mapping
      draft: JackFram/llama-68m
      draft_shape: {...}
      random_weights: false           # true when timed with random weights of the right shape
    engine: {name: llama.cpp, version: 0.3.36}   # optional; what ran the forwards (absent: treeopt's decoder)
    step_overhead_ms: 0.4             # fixed per-step cost (sampling, acceptance, commit), >= 0
    curves:                           # one entry per context length, increasing context_tokens
      - context_tokens: 512
        target:                       # one target forward over `tokens` new tokens at this context
          tokens: [1, 2, 4, 8, 16, 32, 64, 128]          # strictly increasing, >= 1
          target_forward_ms: [20.1, 20.2, ...]           # median per row
          target_forward_spread_ms: [0.2, ...]           # optional; p90 - p10 of the timed repeats
        draft:                        # one draft forward over `tokens` tokens at this context
          cost_model: per-level       # optional, default per-level; the same in every curve (see below)
          tokens: [1, 2, 4, ...]
          draft_forward_ms: [1.1, ...]
          draft_forward_spread_ms: [...]                 # optional
        loop:                         # optional: the decoding loop's own step, timed as the runner runs it
          policy: static              # static | chain: the policy whose steps were timed
          tokens: [1, 2, 4, 8, ...]   # tree sizes n, from 1 (plain decoding)
          verify_ms: [21.0, ...]      # the loop's verify part (target forward + logits to acceptance)
          bookkeeping_ms: [0.3, ...]  # accept + emit + commit + observe
          draft_extra_ms: 0.1         # per draft forward, the loop's draft time beyond c(w)
          draft_step_extra_ms: 0.7    # optional (default 0): once per step that drafts, its first forward's
                                      # reload of the draft's weights after the target ran

With a ``loop`` (:mod:`sequoia_opt.profiling.steps`, issue 31) the solver charges a step verify_ms(n) +
bookkeeping_ms(n) + sum of (c(w) + draft_extra_ms) over its draft forwards + draft_step_extra_ms (when it drafts),
and plain decoding verify_ms(1) + bookkeeping_ms(1); without one (every profile written before it existed),
T(n) + sum c(w) + step_overhead_ms.

The draft table's ``cost_model`` is how the solver charges the drafter per step (the drafter's own
:attr:`~sequoia_opt.drafting.drafters.Drafter.cost_model`; DESIGN.md, "Drafters and drafting policies"):
``per-level`` (one draft forward per tree level over that level's width w, c(w): a draft model, self
layer-skip) or ``one-pass`` (one forward proposes every level: Medusa heads, block diffusion drafters such
as DFlash; c is read at the number of speculated tokens, see :func:`~sequoia_opt.solver.hardware.step_cost`).
A profile without the key reads as ``per-level`` (every profile written before the key existed); another
value, or different values in different curves, is refused. Saving always writes it.

``engine`` names what ran the forwards (issue 20): a mapping with a non-empty ``name`` (``treeopt``, ``llama.cpp``,
``sglang``, ``vllm``) and free-form details (``version``, ...). A profile without it was measured on treeopt's
bundled decoder, and is saved without it; :func:`sequoia_opt.engines.engine_mismatch` warns when a profile of one
engine solves for another.

:class:`LatencyCurve` interpolates linearly between measured token counts and between context lengths and
refuses (``ProfileError``) to extrapolate past the measured range.

Acceptance pair profile, ``format: treeopt-acceptance-pair/1`` (:class:`PairAcceptanceProfile`): a light and
a strong drafter measured together for grafted trees (issue 16), per depth one count vector of the outcomes
(light rank r, strong conditional rank r, none); see the class for the layout.
"""

from .acceptance import AcceptanceProfile, load_acceptance, save_acceptance
from .checks import measured_differs, same_device, warn_on_mismatch, weights_mismatch
from .common import (ACCEPTANCE_FORMAT, DRAFT_COST_MODELS, IMPLAUSIBLE_FRACTION, IMPLAUSIBLE_GROWTH, LATENCY_FORMAT,
                     MAX_COUNT, MAX_MS, MAX_TOKENS, PAIR_ACCEPTANCE_FORMAT, SUM_TOLERANCE, check_integer,
                     validate_acceptance, wilson_interval)
from .latency import LatencyCurve, check_cost_model, load_latency, save_latency
from .pair import PAIR_MIN_TRIALS, PairAcceptanceProfile, load_pair_acceptance, save_pair_acceptance

__all__ = ["AcceptanceProfile", "load_acceptance", "save_acceptance", "PairAcceptanceProfile", "load_pair_acceptance",
           "save_pair_acceptance", "PAIR_MIN_TRIALS", "LatencyCurve", "load_latency", "save_latency",
           "check_cost_model", "warn_on_mismatch", "weights_mismatch", "measured_differs", "same_device", "validate_acceptance",
           "wilson_interval", "check_integer", "ACCEPTANCE_FORMAT", "LATENCY_FORMAT", "PAIR_ACCEPTANCE_FORMAT",
           "SUM_TOLERANCE", "DRAFT_COST_MODELS", "MAX_COUNT", "MAX_TOKENS", "MAX_MS", "IMPLAUSIBLE_FRACTION",
           "IMPLAUSIBLE_GROWTH"]
