"""llama.cpp as a serving engine and as a target of the one loop, through llama-cpp-python's low-level API.

* ``binding.py`` — :class:`LlamaCppModel`: one GGUF in one llama.cpp context (batches, logits, KV cells).
* ``target.py`` — :class:`LlamaCppTarget` (the loop's target face: verifies chains and trees, commits with
  ``llama_memory_seq_*``) and :class:`LlamaCppDrafter` (a draft GGUF growing a chain).
* ``decode.py`` — :func:`generate` (plain or chain speculative decoding through the loop), :func:`run_settings`.
* ``profile.py`` — :func:`profile_latency` (T(n), c(w), overhead), :func:`profile_latency_batch` (T(b, n) per
  batch size), :func:`measure_acceptance`.
* ``models.py`` — :func:`resolve_pair` (the GGUF files of a run).

The chain settings themselves (:class:`~sequoia_opt.solver.chains.ChainSetting`, solving, replay) live in
:mod:`sequoia_opt.solver.chains`, their flags in :mod:`sequoia_opt.exports`; they are re-exported here.
"""

from ...exports import chain_flags, lookup_flags, parse_setting_file
from ...solver.chains import (ChainChoice, ChainSetting, chain_cost, predict_chain, predict_replay, replay_chain,
                             solve_chain)
from .binding import DRAFT_TOP_K, LlamaCppModel, check_gguf, engine_info, server_prompt_ids, top1
from .decode import Generation, SettingRun, Step, generate, run_settings
from .models import GgufPair, check_llamacpp_drafter, resolve_pair
from .profile import (batch_calls, forward_calls, measure_acceptance, measure_batch_overhead, measure_step_overhead,
                      profile_latency, profile_latency_batch)
from .target import LlamaCppDrafter, LlamaCppTarget

__all__ = ["LlamaCppModel", "LlamaCppTarget", "LlamaCppDrafter", "check_gguf", "engine_info", "server_prompt_ids",
           "DRAFT_TOP_K", "top1",
           "Step", "Generation", "generate", "SettingRun", "run_settings", "GgufPair", "resolve_pair",
           "check_llamacpp_drafter",
           "forward_calls", "batch_calls", "measure_acceptance", "measure_batch_overhead", "measure_step_overhead",
           "profile_latency", "profile_latency_batch", "ChainSetting",
           "ChainChoice", "chain_cost", "predict_chain", "predict_replay", "replay_chain", "solve_chain",
           "chain_flags", "lookup_flags", "parse_setting_file"]
