"""Speculation plans (:mod:`sequoia_opt.solver.schedule`) in each engine's current settings, each naming the
releases that take it. The rules each export obeys were read in the engine's own code at a named release (the
constants below say where); the tests encode them (``tests/test_plan_exports.py``).

``vllm`` — ``--speculative-config`` with ``method``, ``num_speculative_tokens`` (the longest K) and
    ``num_speculative_tokens_per_batch_size``: ``[[start, end, K], ...]``, inclusive ranges. Rules of
    ``validate_and_normalize_dynamic_sd_schedule`` (``vllm/v1/spec_decode/dynamic/utils.py``, identical in the
    0.24.0 and 0.33.0 wheels; 0.23.0 has no such field): entries of three integers, start and end >= 1,
    start <= end, K >= 0, ranges sorted and non-overlapping, the first starting at 1; a gap carries the previous
    K and the last K extends past the last end (``build_dynamic_sd_schedule_lookup``); every K is clipped to
    ``num_speculative_tokens``, which must be > 0 (``Field(gt=0)`` in ``vllm/config/speculative.py``). Model
    Runner V1 keeps the schedule for the ``ngram``, ``eagle``, ``eagle3``, ``mtp``, ``draft_model`` and
    ``dflash`` methods only (``_maybe_disable_dynamic_sd_for_v1`` in ``vllm/config/vllm.py``). Chains only: vLLM
    verifies no tree since 0.21.0 (:data:`sequoia_opt.exports.VLLM_TREE_RELEASES`).
``tensorrt-llm`` — the LLM API's ``speculative_config`` (``extra_llm_api_options`` YAML) with ``max_draft_len``
    and ``draft_len_schedule``. From 1.3.0rc8, the first release after NVIDIA/TensorRT-LLM#10860 (merged
    2026-03-13), a key is the *last* batch size of its range and batch sizes past the largest key draft nothing
    (``get_draft_len_for_batch_size`` in ``tensorrt_llm/_torch/speculative/utils.py``); the validator
    (``DecodingBaseConfig.validate_draft_len_schedule_and_sort`` in ``tensorrt_llm/llmapi/llm_args.py``) wants
    keys >= 1, lengths >= 0, the smallest key's length equal to ``max_draft_len`` and none longer, and no
    ``max_concurrency`` beside it. The 1.2 releases read keys as range *starts* (#8194: the largest key <= the
    batch size; ``1`` must be a key, mapping to ``max_draft_len``), and only for NGram and two-model
    draft/target. Older releases have no ``draft_len_schedule``. An EAGLE envelope exports as the EAGLE-3 dynamic
    tree (``use_dynamic_tree``, ``dynamic_tree_max_topK``, ``max_total_draft_tokens`` in
    ``[max_draft_len, topK * max_draft_len]``, ``EagleDecodingConfig.validate_eagle_config``), one per server,
    with ``max_concurrency`` where the plan stops speculating. The wheels live on NVIDIA's index, which this
    machine cannot reach: the rules come from the public source.
``sglang`` — per batch-size tiers of ``--speculative-adaptive --speculative-adaptive-config FILE``: a JSON file
    ``{"<first batch size of the tier>": {"candidate_steps": [K]}, ...}`` (``adaptive_spec_params.py``,
    ``_load_adaptive_config``: integer-string keys, a non-empty list of non-negative integers; a batch size uses
    the tier with the largest key <= it). One candidate per tier pins its steps (the EMA has nowhere to move).
    Tiers arrived in 0.5.13 (0.5.11 and 0.5.12 have one adaptive slot), step 0 (no speculation in a tier) in
    0.5.14; checked to 0.5.23. Adaptive runs EAGLE / EAGLE3 with ``--speculative-eagle-topk 1`` only
    (``adaptive_unsupported_reason``), ``--speculative-num-steps`` must be one of the candidate steps and
    ``--speculative-num-draft-tokens`` becomes steps + 1 (``_init_adaptive_speculative_params`` in
    ``arg_groups/speculative_hook.py``); ``--max-running-requests`` names the plan's last batch size where that is
    past 48 or given by ``--max-batch`` (unset, a speculating server caps it at 48, past which no tier is reached);
    a plan ending below 48 without ``--max-batch`` leaves the cap to SGLang, with a warning, rather than throttle the
    server to the largest batch measured. Anything else (a draft model, n-grams, an envelope with topk > 1) runs
    one static setting per server: the export lists the flags per batch range.
``llama.cpp`` — ``llama-server -np B`` (B slots: the batch) with ``--spec-type draft-simple --spec-draft-n-max K
    --spec-draft-n-min 0 --spec-draft-p-min 0``, or ``--spec-type ngram-simple --spec-ngram-simple-size-n N
    --spec-ngram-simple-size-m K --spec-draft-n-max K`` for n-grams (n-max pinned: llama.cpp trims an n-gram draft
    to it); one setting per server, so one line per batch range (flags of
    the llama.cpp vendored by llama-cpp-python 0.3.36, commit 0c1e570: ``common/arg.cpp``; ``--spec-draft-n-max``
    must be >= 0, the n-gram sizes in 1..1024, ``-np`` non-zero).
``treeopt`` — the ``treeopt-schedule/1`` file itself (``treeopt run --policy schedule:FILE``).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml
from packaging.version import InvalidVersion, Version

from ._io import safe_load_yaml
from .errors import TreeoptError
from .exports import lookup_flags
from .solver.schedule import Plan, Schedule, SpecSetting, check_ranges, guard_rules

__all__ = ["PLAN_ENGINES", "EngineSettings", "PlanExportError", "export_plan", "check_settings_name",
           "check_vllm_schedule", "check_trtllm_schedule", "check_sglang_tiers", "check_llamacpp_release",
           "check_llamacpp_slots",
           "trtllm_draft_len", "vllm_draft_len", "sglang_steps", "looks_like_engine_settings",
           "VLLM_SCHEDULE_RELEASES", "TRTLLM_UPPER_KEY_RELEASE", "TRTLLM_LOWER_KEY_RELEASE", "TRTLLM_DYNAMIC_TREE_LINES",
           "TRTLLM_LAST_CHECKED_LINE", "SGLANG_TIER_RELEASES",
           "SGLANG_ZERO_STEP_RELEASE", "LLAMACPP_RELEASE", "LLAMACPP_COMMIT", "SGLANG_DEFAULT_ENVELOPE",
           "LLAMACPP_DEFAULT_DRAFT", "VLLM_GENERATOR_KS", "guard_notes", "ACCEPTANCE_LENGTH_SOURCE"]

PLAN_ENGINES = ("vllm", "tensorrt-llm", "sglang", "llama.cpp", "treeopt")

#: First vLLM release with ``num_speculative_tokens_per_batch_size`` (0.23.0's wheel has none) and the last
#: release whose wheel was checked (the validator is the same in both).
VLLM_SCHEDULE_RELEASES = ("0.24.0", "0.33.0")
#: Methods Model Runner V1 keeps a schedule for (``_maybe_disable_dynamic_sd_for_v1``, vLLM 0.33.0).
VLLM_V1_SCHEDULE_METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft_model", "dflash")
#: Every ``method`` vLLM's ``SpeculativeConfig`` names (0.33.0), besides model-specific MTP names (``*_mtp``).
VLLM_METHODS = VLLM_V1_SCHEDULE_METHODS + ("medusa", "mlp_speculator", "suffix")
#: The Ks vLLM's ``generate_config.py`` times at each batch size (its per-batch-size rule: the best of them).
VLLM_GENERATOR_KS = (1, 3, 5)

#: The first TensorRT-LLM release after #10860 (keys are the last batch size of a range; 0 past the largest).
TRTLLM_UPPER_KEY_RELEASE = "1.3.0rc8"
#: The first release line whose ``draft_len_schedule`` reads keys as range starts (#8194).
TRTLLM_LOWER_KEY_RELEASE = "1.2.0"
#: The release lines whose EAGLE-3 dynamic tree (``use_dynamic_tree``) was checked (their API references), the
#: first of them the earliest an envelope export names.
TRTLLM_DYNAMIC_TREE_LINES = ("1.3", "1.4")
#: The last release line checked for every TensorRT-LLM export (its API reference; #10860's draft_len_schedule is in
#: it): a release past it is exported with a warning, as vLLM's and SGLang's are.
TRTLLM_LAST_CHECKED_LINE = "1.4"

#: SGLang: per-batch-size adaptive tiers from 0.5.13, checked to 0.5.23; a tier of step 0 from 0.5.14.
SGLANG_TIER_RELEASES = ("0.5.13", "0.5.23")
SGLANG_ZERO_STEP_RELEASE = "0.5.14"
#: SGLang's automatic (steps, topk, num_draft_tokens) for Llama targets with EAGLE (``_auto_choose_speculative_params``).
SGLANG_DEFAULT_ENVELOPE = (5, 4, 8)

#: The llama.cpp whose flags the export writes, and its default ``--spec-draft-n-max`` (``common/common.h``).
LLAMACPP_RELEASE = "llama.cpp 0c1e570 (vendored by llama-cpp-python 0.3.36)"
#: The commit the llama.cpp flags were read at, and the pull requests that gave them their spelling: builds
#: before ggml-org/llama.cpp#22397 (2026-04-27) spell ``--draft-max`` / ``--draft-min``, before #22964
#: (2026-05-12) ``--spec-type`` has no ``draft-simple``. llama.cpp names releases by build number (``bNNNN``),
#: which these pull requests do not give, so a ``--release`` other than the checked commit is refused.
LLAMACPP_COMMIT = "0c1e570"
LLAMACPP_SPELLING_PRS = ("ggml-org/llama.cpp#22397", "ggml-org/llama.cpp#22964")
LLAMACPP_DEFAULT_DRAFT = 3
#: The most sequences a llama.cpp context holds (``LLAMA_MAX_SEQ``, ``src/llama-cparams.h``): ``llama-server -np``
#: past it does not start (the vendored library refuses such a context: "n_seq_max must be <= 256").
LLAMACPP_MAX_SEQ = 256


#: Where each engine reports the mean acceptance length (tokens per step per request: accepted drafts + 1), what
#: a plan's guard rule (:func:`~sequoia_opt.solver.schedule.guard_rules`) is read against.
ACCEPTANCE_LENGTH_SOURCE = {
    "vllm": "1 + vllm:spec_decode_num_accepted_tokens / vllm:spec_decode_num_drafts (its Prometheus counters)",
    "sglang": "the accept length of its decode log lines",
    "tensorrt-llm": "its accepted draft tokens per iteration + 1",
    "llama.cpp": "1 + accepted draft tokens per speculative step of a slot",
    "treeopt": "tokens_per_step_untruncated (accepted nodes + 1 per step, in treeopt run's JSON; run --adapt "
               "guards it itself)",
}


def guard_notes(plan: Plan, engine: str) -> list[str]:
    """The plan's guard (:func:`~sequoia_opt.solver.schedule.guard_rules`) as one line per speculating range, read
    against ``engine``'s own acceptance-length figure (:data:`ACCEPTANCE_LENGTH_SOURCE`). No engine takes such a
    rule as a setting (SGLang's adaptive mode follows an EMA of it, without the profile's interval), so it is
    printed for the operator or a watchdog; ``treeopt run --adapt`` applies it itself. Empty for a plan
    without predictions or speculation."""
    rules = guard_rules(plan) if isinstance(plan, Plan) else []
    if not rules:
        return []
    src = ACCEPTANCE_LENGTH_SOURCE.get(engine, "the engine's mean acceptance length")
    out = [f"guard (watch {src}, over as many requests as the acceptance profile measured):"]
    for g in rules:
        shift = tail = ""
        # a step emits at least one token: a floor at 1.00 (as printed) or under is never crossed, so no rule; both
        # figures compared as printed (a near-tie must not print "1.24 ... below 1.24" in the wrong order)
        floor, even = round(g.interval_low, 2), round(g.break_even, 2)
        if not math.isfinite(g.break_even):
            out.append(f"  batch {g.lo}-{g.hi} ({g.setting}): predicted {g.expected_tokens_per_step:.2f} tokens/step; "
                       "no break-even (the plan's plain step has no finite cost)")
            continue
        if g.reads_interval and floor > max(even, 1.0):  # the traffic shifts before the setting loses
            shift = (f"below {g.interval_low:.2f} the traffic is not what was profiled (re-run treeopt tune on a "
                     f"sample of it); ")
        elif g.reads_interval and floor > 1.0:  # the profile's spread reaches under break-even: a close call
            tail = (f"; the profile's interval between prompts reaches down to {g.interval_low:.2f}, under it: a "
                    f"close call (profile more prompts of the traffic)")
        at = f" at batch {g.break_even_batch}" if g.break_even_batch not in (None, g.lo) and g.lo != g.hi else ""
        loses = (f"below {g.break_even:.2f} this setting is slower than plain decoding{at} (stop speculating in this "
                 f"range)" if even > 1.0 else
                 f"its step is predicted to cost no more than a plain one ({g.break_even:.2f} tokens/step would break "
                 "even), so it beats plain decoding at any acceptance: check the latency profile, a forward over "
                 "more tokens rarely costs less than one over a single token")
        out.append(f"  batch {g.lo}-{g.hi} ({g.setting}): predicted {g.expected_tokens_per_step:.2f} tokens/step; "
                   f"{shift}{loses}{tail}")
    if not any(g.reads_interval for g in rules):
        out.append(f"  (no interval between prompts behind this plan ({rules[0].interval_method}): profile "
                   "acceptance with per-prompt counts for the re-profile line)")
    return out


class PlanExportError(TreeoptError):
    """A plan an engine (or the release asked for) does not take, or a malformed schedule for it."""


@dataclass(frozen=True)
class EngineSettings:
    """A plan in one engine's settings.

    Attributes:
        engine: one of :data:`PLAN_ENGINES`.  release: the release asked for (None: the newest checked).
        text: what to give the engine (JSON / YAML / flags), ending with a newline.
        data: the same as a mapping (for ``--json`` and tests).
        releases: the releases that take it, in words.  checked: where its rules were read.
        command: how to start the engine with it.
        notes / warnings: one line each.
        extra_files: file name -> content, files the settings refer to, written beside them (SGLang's
            ``adaptive.json``).
        nothing_to_set_reason: where speculation pays at no batch size and the engine runs without a speculative
            setting, why and what to do instead (``text`` is then this line as a comment, not a file the engine
            reads); empty otherwise. :attr:`nothing_to_set` says which.
    """

    engine: str
    release: str | None
    text: str
    data: Any
    releases: str
    checked: str
    command: str
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    extra_files: dict[str, str] = field(default_factory=dict)
    nothing_to_set_reason: str = ""

    @property
    def nothing_to_set(self) -> bool:
        """Speculation pays at no batch size: the engine runs without a speculative setting, nothing to write."""
        return bool(self.nothing_to_set_reason)


def _version(text: str, engine: str) -> Version:
    """``text`` as a release of ``engine`` (vLLM, TensorRT-LLM, SGLang; a tune --engine key is also taken).

    Raises:
        PlanExportError: not a version, in one line with an example of that engine's.
    """
    example = {"vllm": VLLM_SCHEDULE_RELEASES[-1], "tensorrt-llm": TRTLLM_UPPER_KEY_RELEASE,
               "sglang": SGLANG_TIER_RELEASES[-1]}.get(engine.lower(), VLLM_SCHEDULE_RELEASES[-1])
    try:
        return Version(str(text).lstrip("v"))
    except InvalidVersion:
        raise PlanExportError(f"--release {text!r} is not a {engine} version (e.g. {example})") from None


def _ranges(plan: Plan | Schedule | Sequence[tuple[int, int, SpecSetting]]) -> list[tuple[int, int, SpecSetting]]:
    if isinstance(plan, Plan):
        out = [(r.lo, r.hi, r.setting) for r in plan.ranges]
    elif isinstance(plan, Schedule):
        out = list(plan.ranges)
    else:
        out = [(int(lo), int(hi), s) for lo, hi, s in plan]
    try:
        check_ranges(out)
    except TreeoptError as err:
        raise PlanExportError(str(err)) from None
    return out


def _chains_only(ranges: Sequence[tuple[int, int, SpecSetting]], engine: str, why: str) -> None:
    for lo, hi, s in ranges:
        if s.shape not in ("none", "chain"):
            raise PlanExportError(f"{engine} takes a draft length per batch size ({why}); batch sizes {lo}-{hi} "
                                  f"want {s.label}: solve chains (--shape chain)")


def _json_rows(doc: dict[str, Any]) -> str:
    """JSON with one key per line and a list of lists kept one entry per line (a schedule reads as a table)."""
    lines = []
    for k, v in doc.items():
        if isinstance(v, list) and v and all(isinstance(x, list) for x in v):
            inner = ",\n".join("    " + json.dumps(x) for x in v)
            lines.append(f"  {json.dumps(k)}: [\n{inner}\n  ]")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


# ---------------------------------------------------------------------------------------------- vLLM
def check_vllm_schedule(schedule: Any) -> list[tuple[int, int, int]]:
    """vLLM's rules for ``num_speculative_tokens_per_batch_size`` (module docstring). Returns the entries sorted.

    Raises:
        PlanExportError: the first rule broken, in one line.
    """
    if not isinstance(schedule, list) or not schedule:
        raise PlanExportError("num_speculative_tokens_per_batch_size must be a non-empty list of [start, end, K]")
    out = []
    for e in schedule:
        if not isinstance(e, (list, tuple)) or len(e) != 3 or any(isinstance(x, bool) or not isinstance(x, int)
                                                                   for x in e):
            raise PlanExportError(f"num_speculative_tokens_per_batch_size entry {e!r} must be three integers "
                                  "[start, end, K]")
        lo, hi, k = e
        if lo <= 0 or hi <= 0:
            raise PlanExportError(f"batch-size range ({lo}, {hi}) must be positive")
        if lo > hi:
            raise PlanExportError(f"batch-size range start must be <= end, got ({lo}, {hi})")
        if k < 0:
            raise PlanExportError(f"K must be >= 0, got {k} for ({lo}, {hi})")
        out.append((lo, hi, k))
    out.sort()
    prev = 0
    for lo, hi, _ in out:
        if lo <= prev:
            raise PlanExportError("batch-size ranges must be non-overlapping and sorted")
        prev = hi
    if out[0][0] != 1:
        raise PlanExportError("the first batch-size range must start at 1")
    return out


def vllm_draft_len(schedule: Sequence[Sequence[int]], num_speculative_tokens: int, batch: int) -> int:
    """The K vLLM runs at ``batch`` under a valid schedule: the range holding it, a gap's previous K, past the
    last range its K; clipped to ``num_speculative_tokens`` (``build_dynamic_sd_schedule_lookup``)."""
    k = None
    for lo, hi, kk in sorted(schedule):
        if lo > batch:
            break
        k = kk
    return min(int(num_speculative_tokens), int(k))


def best_single_draft_length(plan: Plan) -> tuple[int, float] | None:
    """For an engine release that takes one draft length for every batch size: the K among every batch size's
    candidates whose worst batch size runs closest to its own best tokens/s (max-min, as TensorRT-LLM's rule is
    chosen: :func:`~sequoia_opt.solver.schedule.first_is_longest_choice`), and that worst fraction. None for a plan
    without scored chain candidates (a given schedule's ranges)."""
    rows = getattr(plan, "rows", None)
    if not rows:
        return None
    rates = []
    for r in rows:
        by_k = {c.setting.draft_tokens: c.tokens_per_s_per_request for c in r.candidates
                if c.setting.shape in ("none", "chain")}
        if not by_k:
            return None
        rates.append(by_k)
    common = set.intersection(*(set(x) for x in rates))
    if not common:
        return None
    scored = [(min(x[k] / max(x.values()) for x in rates), -k, k) for k in sorted(common)]
    worst, _, k = max(scored)
    return k, worst


def _export_vllm(ranges, release, method, model, lookup, single=None, max_batch=None):
    _chains_only(ranges, "vLLM", "vLLM verifies chains only (no trees) since 0.21.0, with "
                 "num_speculative_tokens_per_batch_size from 0.24.0")
    first, last = VLLM_SCHEDULE_RELEASES
    warnings = []
    if release is not None:
        v = _version(release, "vLLM")
        if v < Version(first):
            one = ("run without speculation (of one K for every batch size, K = 0 runs closest to each batch size's "
                   f"best: {100 * single[1]:.0f} % of it at worst)" if single is not None and single[0] == 0 else
                   f"run one K for every batch size: {single[0]} (of the plan's candidates the one whose worst batch "
                   f"size runs closest to its best: {100 * single[1]:.0f} % of it)" if single is not None else
                   "run one K for every batch size (the plan's own per batch size are "
                   f"{', '.join(str(x.draft_tokens) for *_, x in ranges)})")
            raise PlanExportError(f"vLLM {release} has no num_speculative_tokens_per_batch_size (added in {first}; "
                                  f"0.23.0's wheel has none): upgrade, or {one}")
        if v > Version(last):
            warnings.append(f"vLLM {release} is newer than the last release checked ({last}): check its "
                            "vllm/v1/spec_decode/dynamic/utils.py still takes [start, end, K] entries")
    method = method or "draft_model"  # vLLM's own spelling: 'EAGLE3' / 'NGram' / 'STANDALONE' as its names
    method = method.lower() if method.lower().endswith("_mtp") else method_key(method)
    if method not in VLLM_METHODS and not method.endswith("_mtp"):
        raise PlanExportError(f"vLLM has no speculative method {method!r}: use one of {', '.join(VLLM_METHODS)} "
                              "(or a model's *_mtp)")
    if method not in VLLM_V1_SCHEDULE_METHODS:
        warnings.append(f"Model Runner V1 drops the schedule for method {method!r} (it keeps "
                        f"{', '.join(VLLM_V1_SCHEDULE_METHODS)}): run with VLLM_USE_V2_MODEL_RUNNER=1")
    kmax = max(s.draft_tokens for *_, s in ranges)
    releases = f"vLLM {first} to {last} (checked in both wheels)"
    checked = "vllm/v1/spec_decode/dynamic/utils.py and vllm/config/speculative.py of the 0.24.0 and 0.33.0 wheels"
    if kmax == 0:
        return _nothing_to_set("run vLLM without --speculative-config", releases, checked, "vllm serve MODEL",
                               warnings)
    sched = [[lo, hi, s.draft_tokens] for lo, hi, s in ranges]
    check_vllm_schedule(sched)
    doc: dict[str, Any] = {"method": method}
    if method == "ngram":
        lo_n, hi_n = lookup or (1, 3)
        doc.update(prompt_lookup_min=int(lo_n), prompt_lookup_max=int(hi_n))
    elif model is not None or method_key(method) != "mtp":  # MTP runs the target's own layers
        doc["model"] = model or _placeholder("<your draft model>", "vLLM", warnings)
    doc.update(num_speculative_tokens=kmax, num_speculative_tokens_per_batch_size=sched)
    hi, k_last = ranges[-1][1], ranges[-1][2].draft_tokens
    notes = []
    if max_batch is None and k_last > 0:  # vLLM's own tuner saw K collapse throughput past a batch size (#49548)
        warnings.append(f"past batch {hi} vLLM keeps K = {k_last} (the last range's), which nothing measured there "
                        "predicts: speculation's lead shrinks as the batch grows; measure T(b, n) up to your "
                        "--max-num-seqs, or pass --max-batch")
    else:
        notes.append(f"past batch {hi} vLLM keeps K = {k_last} (the last range's)")
    text = _json_rows(doc)
    return dict(text=text, data=doc, releases=releases, checked=checked,
                command=f"vllm serve MODEL --speculative-config {shlex.quote(json.dumps(doc, separators=(',', ':')))}",
                notes=tuple(notes), warnings=tuple(warnings))


# ---------------------------------------------------------------------------------------------- TensorRT-LLM
def check_trtllm_schedule(schedule: Any, max_draft_len: int | None, *, lower_keys: bool = False) -> dict[int, int]:
    """TensorRT-LLM's rules for ``draft_len_schedule`` (module docstring): keys >= 1, lengths >= 0, the smallest
    key's length equal to ``max_draft_len``, none longer; with ``lower_keys`` (1.2) key 1 must be there.
    Returns the schedule sorted by key.

    Raises:
        PlanExportError: the first rule broken, in one line.
    """
    if not isinstance(schedule, dict) or not schedule:
        raise PlanExportError("draft_len_schedule must be a non-empty mapping of batch size -> draft length")
    for b, k in schedule.items():
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise PlanExportError(f"draft_len_schedule: batch size threshold must be >= 1, got {b!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise PlanExportError(f"draft_len_schedule: draft length must be >= 0, got {k!r}")
    if lower_keys and 1 not in schedule:
        raise PlanExportError("draft_len_schedule must include batch_size=1 (TensorRT-LLM 1.2)")
    smallest = min(schedule)
    if max_draft_len is not None:
        if schedule[smallest] != max_draft_len:
            raise PlanExportError(f"draft_len_schedule[{smallest}] must equal max_draft_len ({max_draft_len}): the "
                                  f"smallest key carries the longest draft, got {schedule[smallest]}")
        longer = [(b, k) for b, k in schedule.items() if k > max_draft_len]
        if longer:
            raise PlanExportError(f"draft_len_schedule: draft length {longer[0][1]} at batch size {longer[0][0]} "
                                  f"exceeds max_draft_len {max_draft_len}")
    return dict(sorted(schedule.items()))


def trtllm_draft_len(schedule: dict[int, int], batch: int, *, lower_keys: bool = False) -> int:
    """The draft length TensorRT-LLM runs at ``batch``: from 1.3.0rc8 the first key >= it (0 past the largest);
    in 1.2 the largest key <= it."""
    keys = sorted(schedule)
    if lower_keys:
        return schedule[max(k for k in keys if k <= batch)]
    for k in keys:
        if k >= batch:
            return schedule[k]
    return 0


def _nothing_to_set(what: str, releases: str, checked: str, command: str, warnings: list[str]) -> dict[str, Any]:
    """An export's fields where speculation pays at no batch size: a one-line comment saying ``what`` to do (the
    engine runs without a speculative setting), nothing to write (:attr:`EngineSettings.nothing_to_set`)."""
    reason = f"speculation pays at no batch size: {what}"
    return dict(text=f"# {reason}\n", data={}, releases=releases, checked=checked, command=command,
                notes=("speculation pays at no batch size the profile measured",), warnings=tuple(warnings),
                nothing_to_set_reason=reason)


#: The engines' own method names (SGLang's algorithms, TensorRT-LLM's decoding types) as vLLM's.
_ENGINE_NAMES = {"standalone": "draft_model", "draft_target": "draft_model", "nextn": "mtp"}


def method_key(method: str | None) -> str | None:
    """A method name as vLLM's (lower case; ``STANDALONE`` / ``Draft_Target`` -> ``draft_model``, ``NEXTN`` and
    ``*_mtp`` -> ``mtp``, ``NGRAM`` / ``NGram`` -> ``ngram``, ``Eagle3`` -> ``eagle3``); None stays None."""
    if method is None:
        return None
    key = str(method).lower()
    return "mtp" if key.endswith("_mtp") else _ENGINE_NAMES.get(key, key)


def _placeholder(text: str, engine: str, warnings: list[str]) -> str:
    """``text``, a stand-in for the drafter's checkpoint the engine would try to load, with a warning saying what
    to pass (``warnings`` is appended to)."""
    warnings.append(f"the config names the drafter {text}: pass --model with the checkpoint {engine} loads (a Hugging "
                    "Face id or a path), or edit the file")
    return text


def _export_trtllm(ranges, release, method, model, lookup, max_batch):
    lower = False
    warnings: list[str] = []
    envelope = any(s.shape == "envelope" for *_, s in ranges)
    if release is not None:
        v = _version(release, "TensorRT-LLM")
        first, last = TRTLLM_DYNAMIC_TREE_LINES
        if envelope and v < Version(f"{first}.0rc0"):
            raise PlanExportError(f"TensorRT-LLM {release} is not known to take an EAGLE-3 dynamic tree "
                                  f"(use_dynamic_tree: checked in the {first} and {last} API references): upgrade, or "
                                  "export a chain plan (--shape chain)")
        major, minor = Version(TRTLLM_LAST_CHECKED_LINE).release[:2]
        if v >= Version(f"{major}.{minor + 1}.0rc0"):  # the next line's first candidate
            warnings.append(f"TensorRT-LLM {release} is newer than the last release line checked "
                            f"({TRTLLM_LAST_CHECKED_LINE}): check its speculative_config fields")
        if v < Version(f"{TRTLLM_LOWER_KEY_RELEASE}rc0"):
            raise PlanExportError(f"TensorRT-LLM {release} is not known to take draft_len_schedule (it arrived with "
                                  f"#8194 in the {TRTLLM_LOWER_KEY_RELEASE} line): run one max_draft_len, or upgrade")
        if v < Version(TRTLLM_LOWER_KEY_RELEASE):  # 1.2.0rcN sorts below 1.2.0: refused as if from 1.1 before
            warnings.append(f"TensorRT-LLM {release}: draft_len_schedule arrived (#8194) during the "
                            f"{TRTLLM_LOWER_KEY_RELEASE} release candidates; check that this one's speculative_config "
                            "has it (the 1.2.0 release does)")
        lower = v < Version(TRTLLM_UPPER_KEY_RELEASE)
    if (method or "").lower() == "medusa":
        raise PlanExportError("TensorRT-LLM takes no draft_len_schedule for Medusa: its Medusa heads ran in the "
                              "TensorRT backend, removed with its choice lists (NVIDIA/TensorRT-LLM#15918), and the "
                              "schedule is read by the PyTorch backend's NGram / Draft_Target / Eagle3 / MTP; "
                              "export for vLLM (method medusa)")
    trt_names = {"draft_model": "Draft_Target", "ngram": "NGram", "eagle3": "Eagle3", "eagle": "Eagle3", "mtp": "MTP"}
    key = method or "draft_model"
    decoding = trt_names.get(method_key(key))  # vLLM's name or TensorRT-LLM's own, any case
    if method_key(key) == "eagle":
        warnings.append("method eagle is written as decoding_type Eagle3, the EAGLE head TensorRT-LLM's PyTorch "
                        "backend runs: an EAGLE-1/2 checkpoint does not load as one (export for vLLM or SGLang, "
                        "which run EAGLE-1/2 heads)")
    if decoding is None:
        raise PlanExportError(f"TensorRT-LLM has no draft_len_schedule decoding type for method {method!r}: use one of "
                              f"{', '.join(trt_names)} (or its own {', '.join(sorted(set(trt_names.values())))})")
    # the file is written for one key convention: its header names the releases that read it so
    releases = (f"TensorRT-LLM {TRTLLM_LOWER_KEY_RELEASE} and later, before {TRTLLM_UPPER_KEY_RELEASE} (keys start "
                f"their ranges; from {TRTLLM_UPPER_KEY_RELEASE} they end them: export without --release for those)"
                if lower else
                f"TensorRT-LLM {TRTLLM_UPPER_KEY_RELEASE} and later (keys end their ranges; releases before it, 1.2.x "
                "and the first 1.3.0 candidates, read keys as range starts: export with --release and the release "
                "you run for those)")
    checked = ("NVIDIA/TensorRT-LLM source after #10860: llmapi/llm_args.py validate_draft_len_schedule_and_sort, "
               "_torch/speculative/utils.py get_draft_len_for_batch_size; 1.2's #8194 validator")
    if envelope:  # no draft_len_schedule keys: the releases are the dynamic tree's
        first, last = TRTLLM_DYNAMIC_TREE_LINES
        return _export_trtllm_envelope(ranges, f"TensorRT-LLM {first} and {last} (the EAGLE-3 dynamic tree, as their "
                                       "API references give it)", checked, warnings, model)
    _chains_only(ranges, "TensorRT-LLM", "draft_len_schedule")
    ks = [s.draft_tokens for *_, s in ranges]
    if max(ks) == 0:
        return _nothing_to_set("leave speculative_config out", releases, checked, "trtllm-serve MODEL", warnings)
    if ks[0] != max(ks):
        raise PlanExportError(f"TensorRT-LLM needs the smallest batch size to draft the most (draft_len_schedule's "
                              f"smallest key carries max_draft_len), but this plan drafts {ks[0]} at batch 1 and "
                              f"{max(ks)} later: solve for the engine (treeopt tune --engine tensorrt-llm)")
    notes = []
    if lower:
        sched = {lo: s.draft_tokens for lo, _, s in ranges}
        notes.append(f"TensorRT-LLM {release} reads keys as range starts and applies the schedule to NGram and "
                     "two-model draft/target only")
        if decoding not in ("NGram", "Draft_Target") and len(set(ks)) > 1:  # a file it would run as another plan
            raise PlanExportError(f"TensorRT-LLM {release} ignores draft_len_schedule for {decoding}: it would draft "
                                  f"max_draft_len = {ks[0]} at every batch size, not this plan ({len(set(ks))} draft "
                                  f"lengths); the schedule applies to {decoding} from {TRTLLM_UPPER_KEY_RELEASE}: "
                                  f"export for that release (drop --release), or solve one K for every batch size")
    else:
        keep = list(ranges)
        while keep and keep[-1][2].draft_tokens == 0:
            keep.pop()  # past the largest key TensorRT-LLM drafts nothing: trailing plain ranges are implicit
        sched = {hi: s.draft_tokens for _, hi, s in keep}
        if len(keep) == len(ranges):
            last = keep[-1][1]
            if max_batch is not None and max_batch > last:
                sched[max_batch] = sched.pop(last)
                last = max_batch
            notes.append(f"past batch {last} TensorRT-LLM drafts nothing (its implicit 0)" + (
                "" if max_batch is not None else ": pass --max-batch with your max_batch_size to extend the last "
                                                 "range"))
    cfg: dict[str, Any] = {"decoding_type": decoding, "max_draft_len": ks[0]}
    if decoding == "NGram":
        cfg["max_matching_ngram_size"] = int((lookup or (1, 3))[1])
    elif decoding != "MTP":
        cfg["speculative_model"] = model or _placeholder("<your draft checkpoint>", "TensorRT-LLM", warnings)
    cfg["draft_len_schedule"] = sched
    check_trtllm_schedule(sched, ks[0], lower_keys=lower)
    doc = {"speculative_config": cfg}
    return dict(text=yaml.safe_dump(doc, sort_keys=False), data=doc, releases=releases, checked=checked,
                command="trtllm-serve MODEL --extra_llm_api_options THIS.yaml", notes=tuple(notes),
                warnings=tuple(warnings))


def trtllm_takes_envelope(steps: int, topk: int, draft_tokens: int) -> bool:
    """TensorRT-LLM's rule for an EAGLE-3 dynamic tree: ``max_draft_len`` (steps) <= ``max_total_draft_tokens``
    (``draft_tokens``, the root excluded) <= ``dynamic_tree_max_topK`` x ``max_draft_len``."""
    return steps <= draft_tokens <= topk * steps


def _export_trtllm_envelope(ranges, releases, checked, warnings, model=None):
    spec = [(lo, hi, s) for lo, hi, s in ranges if s.speculates]
    for lo, hi, s in ranges:
        if s.shape not in ("none", "envelope"):
            raise PlanExportError(f"batch sizes {lo}-{hi} want {s.label}: an EAGLE-3 plan exports envelopes (or none)")
    lo, hi, s = spec[0]
    others = {x.label for *_, x in spec if x != s}
    if others:
        raise PlanExportError(f"TensorRT-LLM runs one EAGLE-3 dynamic tree per server; the plan wants {s.label} at "
                              f"{lo}-{hi} and {', '.join(sorted(others))} elsewhere: solve one envelope for every "
                              "batch size, or export per-range configs to run separate servers")
    total = s.draft_tokens
    if not trtllm_takes_envelope(s.steps, s.topk, total):
        raise PlanExportError(f"max_total_draft_tokens {total} must lie in [max_draft_len {s.steps}, "
                              f"dynamic_tree_max_topK * max_draft_len {s.topk * s.steps}]")
    cfg = {"decoding_type": "Eagle3", "max_draft_len": s.steps,
           "speculative_model": model or _placeholder("<your EAGLE-3 checkpoint>", "TensorRT-LLM", warnings),
           "use_dynamic_tree": True, "dynamic_tree_max_topK": s.topk, "max_total_draft_tokens": total}
    notes = ["max_total_draft_tokens excludes the root (the envelope's draft tokens - 1)"]
    last_spec = spec[-1][1]
    gap = next(((lo, hi) for lo, hi, x in ranges if not x.speculates and lo < last_spec), None)
    if gap is not None:  # max_concurrency turns speculation off above one batch size, never below or between
        raise PlanExportError(f"the plan does not speculate at batch sizes {gap[0]}-{gap[1]} but does at {last_spec}: "
                              "TensorRT-LLM's max_concurrency only turns speculation off above a batch size")
    if last_spec < ranges[-1][1]:
        cfg["max_concurrency"] = last_spec
        notes.append(f"speculation off above batch {last_spec} (max_concurrency)")
    doc = {"speculative_config": cfg}
    return dict(text=yaml.safe_dump(doc, sort_keys=False), data=doc, releases=releases,
                checked=checked + "; EagleDecodingConfig.validate_eagle_config",
                command="trtllm-serve MODEL --extra_llm_api_options THIS.yaml", notes=tuple(notes),
                warnings=tuple(warnings))


# ---------------------------------------------------------------------------------------------- SGLang
def check_sglang_tiers(cfg: Any, *, allow_zero: bool = True) -> dict[int, list[int]]:
    """SGLang's rules for an adaptive config (module docstring). Returns tier -> candidate steps.
    ``allow_zero``: whether a tier may hold 0 steps (no speculation); the export passes False for the releases
    that refuse it (module docstring).

    Raises:
        PlanExportError: the first rule broken, in one line.
    """
    if not isinstance(cfg, dict):
        raise PlanExportError("the adaptive config must be a JSON object")
    tiers = {}
    for key, entry in cfg.items():
        if not str(key).isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        low = 0 if allow_zero else 1
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and not isinstance(s, bool)
                                                                and s >= low for s in steps):
            what = "non-negative" if allow_zero else "positive"
            raise PlanExportError(f"BS {key}: candidate_steps must be a list of {what} ints, got {steps!r}")
        tiers[int(key)] = list(steps)
    if not tiers:
        raise PlanExportError("the adaptive config needs at least one integer-string batch-size key")
    return dict(sorted(tiers.items()))


def sglang_steps(tiers: dict[int, list[int]], batch: int) -> list[int]:
    """The candidate steps SGLang routes ``batch`` to: the tier with the largest key <= it (the smallest tier
    below every key)."""
    keys = sorted(tiers)
    below = [k for k in keys if k <= batch]
    return tiers[below[-1] if below else keys[0]]


#: vLLM's method names -> SGLang's ``--speculative-algorithm`` (its ``SpeculativeAlgorithm``: EAGLE, EAGLE3,
#: STANDALONE, NGRAM; MTP layers run as EAGLE, its NEXTN alias; no Medusa).
SGLANG_ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "draft_model": "STANDALONE", "ngram": "NGRAM",
                     "mtp": "EAGLE", "nextn": "EAGLE"}


def _sglang_draft(algo: str, model: str | None, warnings: list[str], lookup: tuple[int, int] | None = None, *,
                  mtp: bool = False) -> str:
    """`` --speculative-draft-model-path MODEL`` for the algorithms that load a drafter (a placeholder, with a
    warning, when ``model`` is None; for MTP layers only when given: SGLang finds the target's own); for NGRAM the
    n-gram sizes measured (``lookup``: its match window, SGLang's ``speculative_ngram_{min,max}_match_window_size``),
    nothing when unknown. (NGRAM's topk is set apart, :func:`_sglang_topk`.)"""
    if mtp and model is None:
        return ""
    if algo == "NGRAM":
        return ("" if lookup is None else f" --speculative-ngram-min-match-window-size {int(lookup[0])} "
                f"--speculative-ngram-max-match-window-size {int(lookup[1])}")
    path = shlex.quote(model) if model else _placeholder("<your draft model>", "SGLang", warnings)
    return f" --speculative-draft-model-path {path}"


def _sglang_topk(algo: str, topk: int) -> str:
    """The flags that make SGLang draft ``topk`` candidates a step: ``--speculative-eagle-topk``, and for NGRAM
    ``--speculative-ngram-max-bfs-breadth`` too, which SGLang copies over ``speculative_eagle_topk`` (``ServerArgs``
    post-init; default 10: without it a chain of K would run as a BFS tree of the same K + 1 tokens)."""
    return (f"--speculative-ngram-max-bfs-breadth {int(topk)} " if algo == "NGRAM" else "") + \
        f"--speculative-eagle-topk {int(topk)}"


SGLANG_SPEC_MAX_RUNNING = 48
"""SGLang's ``--max-running-requests`` for a speculating server that leaves it unset (``ServerArgs``'s speculative
handling: "Max running requests is reset to 48 for speculative decoding")."""


def _sglang_cap(hi: int, last: bool, max_batch: int | None, warnings: list[str]) -> str:
    """The ``--max-running-requests`` flag of a speculating line ending at batch ``hi`` ('' for none). A range
    below the last caps the line at its end (the line of the batch size a server serves, as llama.cpp's ``-np``);
    the last range caps where the engine's largest batch is known (``--max-batch``) or where SGLang's own cap for
    speculating servers (:data:`SGLANG_SPEC_MAX_RUNNING`) would stop short of it. Otherwise it is left to SGLang,
    with a warning that the batch sizes past ``hi`` run the last setting unpredicted: a cap at the largest batch
    size a T(b, n) table happened to hold throttled the server below SGLang's default."""
    if not last or max_batch is not None or hi > SGLANG_SPEC_MAX_RUNNING:
        return f" --max-running-requests {hi}"
    if hi < SGLANG_SPEC_MAX_RUNNING:
        warnings.append(f"the plan ends at batch {hi}; SGLang admits up to {SGLANG_SPEC_MAX_RUNNING} requests when "
                        "speculating (its default --max-running-requests), and batch sizes past the plan run its last "
                        "setting, not predicted here: measure T(b, n) further, or pass --max-batch with your "
                        "--max-running-requests")
    return ""


def _export_sglang(ranges, release, method, model=None, lookup=None, max_batch=None):
    key = (method or "draft_model").lower()  # as vLLM's and TensorRT-LLM's exports: a draft model is STANDALONE
    mtp = method_key(key) == "mtp"  # the target's own MTP layers: no drafter checkpoint
    algos = set(SGLANG_ALGORITHMS.values())
    algo = SGLANG_ALGORITHMS.get(method_key(key), key.upper() if key.upper() in algos else None)  # vLLM's or SGLang's
    if algo is None:
        raise PlanExportError(f"SGLang has no speculative algorithm for method {method!r} (it runs "
                              f"{', '.join(sorted(algos))}); export for vLLM"
                              + (" (method medusa)" if key == "medusa" else ""))
    first, last = SGLANG_TIER_RELEASES
    v = _version(release, "SGLang") if release is not None else Version(last)
    warnings = []
    if release is not None and v > Version(last):
        warnings.append(f"SGLang {release} is newer than the last release checked ({last})")
    releases = f"SGLang {first} to {last} (tiers; a tier of 0 steps from {SGLANG_ZERO_STEP_RELEASE})"
    checked = ("sglang/srt/speculative/adaptive_spec_params.py and srt/arg_groups/speculative_hook.py of the "
               "0.5.13, 0.5.14, 0.5.15 and 0.5.23 wheels")
    adaptive_ok = algo in ("EAGLE", "EAGLE3") and all(s.shape in ("none", "chain") or (s.shape == "envelope" and
                                                                                          s.topk == 1)
                                                       for *_, s in ranges)
    if adaptive_ok and v >= Version(first):
        ks = [s.steps if s.speculates else 0 for *_, s in ranges]
        if max(ks) == 0:  # before the tiers' rules: a plan without speculation sets no tier at all
            return _nothing_to_set("run SGLang without --speculative-algorithm", releases, checked,
                                   "python -m sglang.launch_server --model-path MODEL", warnings)
        zero_ok = v >= Version(SGLANG_ZERO_STEP_RELEASE)
        if 0 in ks and not zero_ok:
            raise PlanExportError(f"SGLang {release} takes positive candidate steps only (a tier of 0, no "
                                  f"speculation, arrived in {SGLANG_ZERO_STEP_RELEASE}); this plan stops "
                                  "speculating in some ranges")
        cfg = {str(lo): {"candidate_steps": [k]} for (lo, _, _), k in zip(ranges, ks)}
        check_sglang_tiers(cfg, allow_zero=zero_ok)
        if 0 in ks:  # the releases that take this file: 0.5.13 refuses its tier of 0 steps
            releases = f"SGLang {SGLANG_ZERO_STEP_RELEASE} to {last} (tiers, one of 0 steps: no speculation there)"
        start = ks[0] if ks[0] > 0 else max(ks)
        # the server's cap (_sglang_cap): EAGLE's ServerArgs caps an unset one at 48, past which no tier is reached
        flags = (f"--speculative-algorithm {algo}{_sglang_draft(algo, model, warnings, mtp=mtp)} "
                 "--speculative-eagle-topk 1 "
                 f"--speculative-num-steps {start} --speculative-num-draft-tokens {start + 1}"
                 f"{_sglang_cap(ranges[-1][1], True, max_batch, warnings)} --speculative-adaptive "
                 "--speculative-adaptive-config adaptive.json")
        doc = {"adaptive_config": cfg, "cli_flags": flags}
        notes = ("one candidate step per tier pins the tier's steps (the EMA has nowhere to move)",
                 "SGLang pads the batch size to its next CUDA-graph batch size before routing to a tier: a range "
                 "whose last batch size is not captured runs its top batch sizes with the next tier's steps; "
                 "capture every range's last batch size ("
                 + ", ".join(str(hi) for _, hi, _ in ranges[:-1]) + ") among --cuda-graph-bs")
        if len(ranges) == 1:
            notes = notes[:1]
        return dict(text=json.dumps(doc, indent=2) + "\n", data=doc, releases=releases, checked=checked,
                    command=f"python -m sglang.launch_server --model-path MODEL {flags}", notes=notes,
                    warnings=tuple(warnings), extra_files={"adaptive.json": json.dumps(cfg, indent=2) + "\n"})
    if not any(s.speculates for *_, s in ranges):
        return _nothing_to_set("run SGLang without --speculative-algorithm", f"SGLang up to {last}", checked,
                               "python -m sglang.launch_server --model-path MODEL", warnings)
    why = (f"SGLang {release} has no per-batch-size tiers (from {first})" if v < Version(first)
           else f"SGLang's adaptive mode runs EAGLE/EAGLE3 chains (topk 1); {algo} with this plan runs one setting")
    lines = []
    draft = _sglang_draft(algo, model, warnings, lookup, mtp=mtp)
    for i, (lo, hi, s) in enumerate(ranges):
        if not s.speculates:
            flag = "(no --speculative-algorithm)"
        elif s.shape == "envelope":
            flag = (f"--speculative-algorithm {algo}{draft} --speculative-num-steps {s.steps} "
                    f"{_sglang_topk(algo, s.topk)} --speculative-num-draft-tokens {s.draft_tokens + 1}")
        elif s.shape == "chain":
            flag = (f"--speculative-algorithm {algo}{draft} --speculative-num-steps {s.steps} "
                    f"{_sglang_topk(algo, 1)} --speculative-num-draft-tokens {s.steps + 1}")
        else:
            raise PlanExportError(f"SGLang takes no static tree; batch sizes {lo}-{hi} want {s.label}")
        if s.speculates:  # the line's own cap, as llama.cpp's -np (_sglang_cap)
            flag += _sglang_cap(hi, i == len(ranges) - 1, max_batch, warnings)
        lines.append({"batch_range": [lo, hi], "cli_flags": flag})
    doc = {"per_range": lines, "note": why + ": start the server with the line of the batch size it serves "
           "(each speculating line caps its requests at the range's end, --max-running-requests)"}
    return dict(text=json.dumps(doc, indent=2) + "\n", data=doc, releases=f"SGLang up to {last} (one static setting)",
                checked=checked, command="python -m sglang.launch_server --model-path MODEL <cli_flags>",
                notes=(why,), warnings=tuple(warnings))


# ---------------------------------------------------------------------------------------------- llama.cpp
def check_llamacpp_slots(batch: int) -> None:
    """Refuse a batch size past the slots llama-server can run (``-np`` at most :data:`LLAMACPP_MAX_SEQ`).

    Raises:
        PlanExportError: ``batch`` > :data:`LLAMACPP_MAX_SEQ`.
    """
    if batch > LLAMACPP_MAX_SEQ:
        raise PlanExportError(f"batch size {batch} would be llama-server -np {batch}: llama.cpp runs at most "
                              f"{LLAMACPP_MAX_SEQ} sequences (LLAMA_MAX_SEQ) and does not start with more; solve batch "
                              f"sizes up to {LLAMACPP_MAX_SEQ} (--batches, --max-batch)")


def check_llamacpp_release(release: str | None) -> None:
    """Refuse a llama.cpp ``release`` other than the commit the flags were read at (:data:`LLAMACPP_COMMIT`).

    Raises:
        PlanExportError: any other build (the flags' spelling changed twice in 2026; see
            :data:`LLAMACPP_SPELLING_PRS`).
    """
    if release is not None and not str(release).strip().lower().startswith(LLAMACPP_COMMIT):
        raise PlanExportError(
            f"llama.cpp {release} is not the build these flags were checked at ({LLAMACPP_COMMIT}); older builds "
            f"spell them differently ({LLAMACPP_SPELLING_PRS[0]}: --draft-max -> --spec-draft-n-max, "
            f"{LLAMACPP_SPELLING_PRS[1]}: --spec-type draft-simple): omit --release, or pass {LLAMACPP_COMMIT}")


#: ``--method`` (vLLM's names) -> llama.cpp's ``--spec-type`` for a drafter that drafts chains, as
#: ``common_speculative_type_from_name_map`` in ``common/speculative.cpp`` names them (read in the public source at
#: commit 001d906; draft-eagle3 and draft-mtp are named beside draft-simple, which #22964 introduced). Methods
#: llama.cpp has no type for (medusa, eagle-1/2) are refused.
LLAMACPP_SPEC_TYPES = {"draft_model": "draft-simple", "eagle3": "draft-eagle3", "mtp": "draft-mtp",
                       "ngram": "ngram-simple"}


def _export_llamacpp(ranges, release, method, lookup, model=None, target=None):
    check_llamacpp_release(release)
    method = method_key(method) or "draft_model"
    spec_type = LLAMACPP_SPEC_TYPES.get(method)
    if spec_type is None:
        raise PlanExportError(f"llama.cpp has no speculative type for method {method!r}: "
                              + ", ".join(f"{m} (--spec-type {t})" for m, t in LLAMACPP_SPEC_TYPES.items()))
    lines = []
    notes = ["llama-server runs one setting for all its slots: use the line of the -np you serve with"]
    for lo, hi, s in ranges:
        check_llamacpp_slots(hi)
        if s.shape not in ("none", "chain"):
            raise PlanExportError(f"llama.cpp verifies chains; batch sizes {lo}-{hi} want {s.label}")
        if not s.speculates:
            flags = "--spec-type none"
        elif method == "ngram":  # as solve --format llama.cpp: one size, the longest the profiled lookup tried first
            n = int((lookup or (1, 3))[1])
            if not 1 <= n <= 1024 or not 1 <= s.draft_tokens <= 1024:
                raise PlanExportError("llama.cpp's n-gram sizes must lie in 1..1024")
            flags = lookup_flags(n, s.draft_tokens)
        else:
            flags = (f"--spec-type {spec_type} --spec-draft-n-max {s.draft_tokens} --spec-draft-n-min 0 "
                     "--spec-draft-p-min 0")
        lines.append({"batch_range": [lo, hi], "np": hi, "flags": f"-np {hi} {flags}"})
    if method == "ngram" and lookup is not None and lookup[0] != lookup[1]:
        notes.append(f"llama.cpp's ngram-simple matches one n-gram size: size-n {int(lookup[1])}, the longest of the "
                     f"profiled lookup {lookup[0]}-{lookup[1]} (which falls back to shorter ones)")
    doc = {"per_range": lines}
    sidecar = {"draft-simple": "DRAFT.gguf", "draft-eagle3": "EAGLE3_HEAD.gguf", "draft-mtp": "MTP_HEAD.gguf"}.get(
        spec_type)
    warnings: tuple[str, ...] = ()
    if sidecar and model and not model.lower().endswith(".gguf"):  # -md reads a file, not a hub id
        warnings = (f"llama.cpp's -md takes a GGUF file, and --model {shlex.quote(model)} names none (a Hugging Face "
                    "id or a checkpoint folder?): convert it (treeopt export-draft, or llama.cpp's "
                    "convert_hf_to_gguf.py) and pass the .gguf",)
    sidecar = f" -md {shlex.quote(model) if model else sidecar}" if sidecar else ""
    served = shlex.quote(target) if target else "TARGET.gguf"
    # a line that does not speculate loads no drafter
    text = "\n".join(f"# batch {x['batch_range'][0]}-{x['batch_range'][1]}\nllama-server -m {served}"
                     f"{'' if x['flags'].endswith('--spec-type none') else sidecar} {x['flags']}" for x in lines) + "\n"
    return dict(text=text, data=doc, releases=(f"{LLAMACPP_RELEASE} and builds since {LLAMACPP_SPELLING_PRS[1]} "
                                               f"(2026-05-12); earlier builds spell --draft-max / --draft-min"),
                checked="common/arg.cpp, common/common.h and common/speculative.cpp of llama.cpp 0c1e570",
                command=f"llama-server -m {served}{sidecar} <flags of your -np>", notes=tuple(notes),
                warnings=warnings)


# ------------------------------------------------------------------------------ the name of tune -o's file
#: What ``tune -o`` writes for each engine, and the suffix that names it (treeopt's plan is written as -o's suffix
#: says: JSON for ``.json``, else YAML). SGLang's per-range flags and adaptive tiers are JSON alike.
SETTINGS_FILES: dict[str, tuple[str, str]] = {"vllm": ("JSON", ".json"), "sglang": ("JSON", ".json"),
                                              "tensorrt-llm": ("YAML", ".yaml"), "llama.cpp": ("command lines", ".sh")}


def check_settings_name(engine: str, path: Path) -> None:
    """Refuse an output name whose suffix says another format than ``engine``'s settings file holds
    (:data:`SETTINGS_FILES`): a ``.json`` file holding TensorRT-LLM's YAML (its comment line, then block YAML) or
    llama.cpp's command lines, a ``.yaml`` / ``.yml`` one holding command lines. JSON is YAML, so vLLM's or
    SGLang's JSON in a ``.yaml`` file reads as written. Called before anything is measured.

    Raises:
        PlanExportError: one line naming the file, what the engine's settings are and the suffix to use.
    """
    kind, good = SETTINGS_FILES.get(engine, (None, None))
    suffix = Path(path).suffix.lower()
    if kind is None or suffix == good:
        return
    if (suffix == ".json" and kind != "JSON") or (suffix in (".yaml", ".yml") and kind == "command lines"):
        raise PlanExportError(f"-o {path}: {engine}'s settings are {kind}, which a {suffix} file does not hold: "
                              f"name it {Path(path).with_suffix(good).name}")


# ------------------------------------------------------------------------------ settings files tune -o wrote
#: Every top-level key of a vLLM speculative config ``tune -o`` writes.
_VLLM_KEYS = frozenset({"method", "model", "num_speculative_tokens", "num_speculative_tokens_per_batch_size",
                        "prompt_lookup_min", "prompt_lookup_max"})


def looks_like_engine_settings(path: Path) -> bool:
    """Whether ``path`` holds engine settings in a shape ``tune -o`` writes, so that a plan without speculation may
    remove it: a vLLM speculative config (``num_speculative_tokens`` and only the keys the export writes), TensorRT-LLM
    extra options (``speculative_config`` alone, with a ``decoding_type``), SGLang's per-range flags or adaptive tiers.
    Any other file (a profile, a plan, another program's config that shares a key name, a typo's victim) is kept."""
    try:
        doc = safe_load_yaml(path.read_text(encoding="utf-8-sig"))  # YAML reads JSON too
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    if not isinstance(doc, dict) or not doc:
        return False
    keys = set(doc)
    if keys <= _VLLM_KEYS:
        return "num_speculative_tokens" in keys
    if keys == {"speculative_config"}:
        return isinstance(doc["speculative_config"], dict) and "decoding_type" in doc["speculative_config"]
    if keys <= {"per_range", "note"}:
        rows = doc.get("per_range")
        return isinstance(rows, list) and bool(rows) and all(
            isinstance(r, dict) and {"batch_range", "cli_flags"} <= set(r) for r in rows)
    if keys == {"adaptive_config", "cli_flags"}:
        return True
    return all(isinstance(v, dict) and "candidate_steps" in v for v in doc.values())


# ---------------------------------------------------------------------------------------------- entry point
def export_plan(plan: Plan | Schedule | Sequence[tuple[int, int, SpecSetting]], engine: str, *,
                release: str | None = None, method: str | None = None, model: str | None = None,
                lookup: tuple[int, int] | None = None, max_batch: int | None = None,
                target: str | None = None) -> EngineSettings:
    """A plan (or a schedule's ranges) as ``engine``'s settings (module docstring).

    Args:
        engine: one of :data:`PLAN_ENGINES` (``treeopt`` is the schedule file; use
            :func:`~sequoia_opt.solver.schedule.save_schedule`).
        release: the engine release to target (None: the newest checked); a release that does not take the
            setting is refused.
        method: the engine's drafting method (vLLM's ``method``: ``draft_model``, ``ngram``, ``eagle3``, ...).
        model: the draft checkpoint to name in the config.  lookup: (n-gram min, max) for n-gram methods.
        target: llama.cpp: the target GGUF llama-server's ``-m`` loads (None: the placeholder ``TARGET.gguf``); the
            GPU engines' settings name no target (their start command's ``MODEL``).
        max_batch: the engine's largest batch, given by the user (the plan's last range ends there): TensorRT-LLM's
            last key; SGLang's ``--max-running-requests`` (without it, a plan ending below SGLang's own cap of 48
            for speculating servers leaves the cap to SGLang, with a warning); for vLLM, without it a plan whose last
            range speculates warns that vLLM keeps that K past the plan, unpredicted.

    Raises:
        PlanExportError: an unknown engine, a release that does not take the setting, a plan the engine cannot
            run (a tree for vLLM, a rising draft length for TensorRT-LLM), malformed ranges.
    """
    key = str(engine).strip().lower()
    key = {"trtllm": "tensorrt-llm", "tensorrt_llm": "tensorrt-llm", "llamacpp": "llama.cpp",
           "llama-cpp": "llama.cpp", "llama_cpp": "llama.cpp"}.get(key, key)
    if key not in PLAN_ENGINES or key == "treeopt":
        raise PlanExportError(f"no engine export for {engine!r}; choose one of vllm, tensorrt-llm, sglang, llama.cpp")
    ranges = _ranges(plan)
    if key == "vllm":
        out = _export_vllm(ranges, release, method, model, lookup, best_single_draft_length(plan), max_batch)
    elif key == "tensorrt-llm":
        out = _export_trtllm(ranges, release, method, model, lookup, max_batch)
    elif key == "sglang":
        out = _export_sglang(ranges, release, method, model, lookup, max_batch)
    else:
        out = _export_llamacpp(ranges, release, method, lookup, model, target)
    if key in ("tensorrt-llm", "llama.cpp"):  # formats with comments carry their releases (JSON ones cannot)
        out["text"] = f"# for {out['releases']}\n" + out["text"]
    return EngineSettings(engine=key, release=release, **out)
