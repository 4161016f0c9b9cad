"""``treeopt tune``: from nothing to an engine's speculation settings per batch size, as a library function.

For the engine and drafter asked, :func:`tune` runs what is missing of profile -> solve -> export and says what it
reused, measured or was given:

1. the latency per batch size, T(b, n), c(b, w) and the overhead (``treeopt-latency-batch/1``): llama.cpp and
   treeopt's own decoder are measured on this machine when no saved profile was timed at the batch sizes, context,
   draft lengths and thread count asked (:func:`~sequoia_opt.engines.llamacpp.profile_latency_batch`,
   :func:`~sequoia_opt.profiling.batch.profile_batches`); a GPU engine takes its profile (``treeopt profile latency
   --engine sglang|vllm``, batch 1 only) or a user's T(b, n) table (CSV,
   :func:`~sequoia_opt.profiles.batch.load_batch_table`);
2. the drafter's acceptance: a profile given, or a saved one that measured the prompts asked (:func:`_acceptance`;
   a user's profile is never replaced), else measured along the target's
   greedy output, the drafter teacher-forced (treeopt: :func:`~sequoia_opt.profiling.acceptance.chain_traces`;
   llama.cpp: its logits), per-depth acceptance from the runs of agreement (:func:`acceptance_from_traces`); a
   drafter that cannot be teacher-forced (a feature head) is measured by the decoder's own verifier
   (:func:`~sequoia_opt.profiling.acceptance.measure_acceptance`); an EAGLE envelope takes a calibration profile;
3. the plan (:func:`~sequoia_opt.solver.schedule.solve_plan`) and the engine's settings
   (:func:`~sequoia_opt.plan_exports.export_plan`), with the command that checks it.

Every check that needs no model runs first (:func:`check_options`): a bad option is refused in one line before
anything is measured or written.
"""

from __future__ import annotations

import os
import shlex
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .._io import safe_load_yaml, with_article
from ..errors import ProfileError, TreeoptError
from ..profiles.checks import differing_weights, weights_mismatch

__all__ = ["TUNE_ENGINES", "GPU_ENGINES", "TUNE_SHAPES", "ANSWER_END_CUT_ENGINES", "DEFAULT_BATCHES", "MAX_REFINE",
           "TuneOptions",
           "TuneResult", "check_options", "tune", "acceptance_from_traces", "lookup_traces", "measure_chain_acceptance",
           "peer_ranges", "refine_plan",
           "short_traces_note", "token_grid"]

TUNE_ENGINES = ("vllm", "sglang", "tensorrt-llm", "llama.cpp", "treeopt")
GPU_ENGINES = ("vllm", "sglang", "tensorrt-llm")
#: ``--shape``: a draft length per batch size, an EAGLE envelope per batch size, a static tree per batch size
TUNE_SHAPES = ("chain", "envelope", "tree")
#: why each engine but treeopt's decoder takes no static tree per batch size (``--shape tree``)
TREE_REFUSALS = {
    "vllm": "vLLM takes a draft length per batch size (its static trees were removed in May 2026, PR #42121): "
            "--shape chain; one static tree for an older release: treeopt solve --format vllm",
    "tensorrt-llm": "TensorRT-LLM takes a draft_len_schedule or one EAGLE-3 dynamic tree (eagle_choices was removed, "
                    "PR #18210): --shape chain or envelope; one static tree for an older release: treeopt solve "
                    "--format tensorrt-llm",
    "sglang": "SGLang grows its EAGLE tree inside an envelope (steps / topk / draft tokens): --shape envelope, or "
              "--shape chain",
    "llama.cpp": "llama.cpp drafts one sequence (--spec-draft-n-max): --shape chain",
}
#: c(b, w) widths timed for ``--shape tree`` with a per-level drafter (a level of w nodes is one forward over w
#: tokens; the solver prices no width past the widest timed, so these bound the trees' level widths)
TREE_WIDTHS = (1, 2, 3, 4, 6, 8)
#: engines that draft no deeper than a request can still emit (treeopt's decoder: StaticTreePolicy.step_depth_for;
#: llama-server: server_slot::get_n_draft_max, n_remaining - 1): with --output-tokens and chains replayed on
#: traces their plans price a batch of one's cheaper last steps (solve_plan's answer_end_cut); the others' are
#: priced at whole steps
ANSWER_END_CUT_ENGINES = ("treeopt", "llama.cpp")
DEFAULT_BATCHES = (1, 2, 4, 8, 16)
#: The longest chain a plan considers when neither the user nor the profile says less.
DEFAULT_MAX_DRAFT = 8
#: The most rounds of ``--refine``: 8 places a switch between batch sizes 256 apart to within one.
MAX_REFINE = 8

ProgressFn = Callable[[str, int, int], None]


def token_grid(k: int) -> list[int]:
    """The tokens per request T(b, n) is measured at for chains up to K: 1..5, then sparser up to K + 1 (the
    solver interpolates between them, never past the last)."""
    return sorted({n for n in (1, 2, 3, 4, 5, 7, 9, 12, 17, 25, 33) if n <= k + 1} | {k + 1})


@dataclass
class TuneOptions:
    """What ``treeopt tune`` was asked (CLI options, module docstring).

    Attributes:
        engine: one of :data:`TUNE_ENGINES`.  target: the target checkpoint (None: the demo target).
        draft: the drafter (``--draft``: a checkpoint, ``lookup[:MIN-MAX]``; None: the bundled draft).
        batches: batch sizes to solve (None: every batch size the given ``latency`` measured, else
            :data:`DEFAULT_BATCHES`).  latency: a batch latency profile, a latency profile or a T(b, n) CSV.
        acceptance / calibration: profiles (chains / EAGLE envelopes).  shape: ``chain`` or ``envelope``.
        max_draft: the longest chain (None: what the profile measured, at most :data:`DEFAULT_MAX_DRAFT`, or with
            ``plan`` what the profile measured).
        context: context length (tokens) the latency is measured and read at (llama.cpp and treeopt; a GPU engine's
            profile is read at its smallest context).
        release / method / model: the engine release, drafting method and draft checkpoint named in the export.
        max_batch: the engine's largest batch (the last range ends there).
        prompts / num_prompts / max_new_tokens: what the acceptance is measured on.
        threads: CPU threads for measuring.  rounds: timing rounds.
        acceptance_model: auto | replay | positional | by-depth (:class:`~sequoia_opt.solver.schedule.ChainValue`).
        min_gain: speculate only where the predicted lead over plain decoding exceeds this fraction
            (:func:`~sequoia_opt.solver.schedule.solve_plan`).
        output_tokens: the requests' typical answer length (tokens); the plan's rates are over answers that long
            (:func:`~sequoia_opt.solver.schedule.solve_plan`); None: the steady state of long answers.
        profiles_dir: where measured profiles are written and looked for.
        plan: a ``treeopt-schedule/1`` file to predict and export instead of solving one.
        refine: rounds of bisection on the batch size (:func:`~sequoia_opt.solver.schedule.switch_midpoints`):
            where two neighbouring batch sizes solved choose different settings, T(b, n) is timed at their
            midpoint and the plan solved again, each round halving the spans nobody timed (llama.cpp and treeopt,
            whose latency tune measures; a given profile gets a note naming the batch sizes to time). 0: off.
        rows: how treeopt's decoder's T(b, n) rows are timed (:data:`ROW_LAYOUTS`): ``spread``, at contexts spread as
            a batch of the requests' would be (:func:`~sequoia_opt.profiling.batch.row_contexts`: mean ``context``;
            its padded cache attends over the longest row), or ``uniform``, every row at ``context``.
        request_lengths: the requests' prompt lengths (tokens) ``spread`` draws from, with answers of
            ``output_tokens`` (else ``max_new_tokens``) tokens; None: the acceptance prompts' (``prompts``).
    """

    engine: str
    target: Path | None = None
    draft: str | None = None
    batches: Sequence[int] | None = None
    latency: Path | None = None
    acceptance: Path | None = None
    calibration: Path | None = None
    shape: str = "chain"
    max_draft: int | None = None
    context: int = 128
    release: str | None = None
    method: str | None = None
    model: str | None = None
    max_batch: int | None = None
    prompts: Path | None = None
    num_prompts: int = 8
    max_new_tokens: int = 48
    threads: int = 1
    rounds: int = 2
    acceptance_model: str = "auto"
    min_gain: float = 0.0
    output_tokens: int | None = None
    profiles_dir: Path = Path("profiles")
    plan: Path | None = None
    refine: int = 1
    rows: str = "spread"
    request_lengths: Sequence[int] | None = None
    #: the given ``latency`` file as read by :func:`check_options` (read once; not an option)
    given_latency: Any = field(default=None, repr=False, compare=False)
    #: the contexts the requests' steps read, which ``rows="spread"`` spreads a batch's rows by (set where
    #: treeopt's decoder is timed, :func:`_treeopt_inputs`; not an option)
    requests: Any = field(default=None, init=False, repr=False, compare=False)
    #: the batch sizes of the latency table (or the default grid) past ``max_batch``, left out by
    #: :func:`check_options` when ``batches`` is not given (not an option)
    left_out_batches: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)


@dataclass
class TuneResult:
    """What :func:`tune` produced.

    Attributes:
        plan: the :class:`~sequoia_opt.solver.schedule.Plan`.  schedule: its ``treeopt-schedule/1`` document.
        settings: the engine's :class:`~sequoia_opt.plan_exports.EngineSettings` (None for ``treeopt``).
        profiles: per input (latency, acceptance, calibration), what was done: given, reused or measured, and
            its path.  peers: per peer rule, its predicted total tokens/s per batch size.
        check: the command that checks the plan.  notes: one line each (the engine's own warnings are in
            ``settings.warnings``).  warnings: what may make the settings wrong for what is served (a
            ``--method`` of another drafter kind than the one measured).
    """

    plan: Any
    schedule: dict[str, Any]
    settings: Any
    profiles: dict[str, str]
    peers: dict[str, dict[int, float]]
    check: str
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


#: how ``treeopt tune --engine treeopt`` times the rows of a batch (:attr:`TuneOptions.rows`)
ROW_LAYOUTS = ("spread", "uniform")


def _engine(name: str) -> str:
    key = str(name).strip().lower()
    key = {"trtllm": "tensorrt-llm", "tensorrt_llm": "tensorrt-llm", "llamacpp": "llama.cpp",
           "llama-cpp": "llama.cpp"}.get(key, key)
    if key not in TUNE_ENGINES:
        raise TreeoptError(f"--engine {name!r}: choose one of {', '.join(TUNE_ENGINES)}")
    return key


def given_plan_ranges(ranges: Sequence[tuple[int, int, Any]], max_batch: int | None, name: str,
                      notes: list[str]) -> list[tuple[int, int, Any]]:
    """A given plan's ranges ``(lo, hi, setting)`` with its last range ending at ``max_batch`` (the engine's
    largest batch, as a solved plan's does; a note in ``notes`` says so); unchanged without ``max_batch``.

    Raises:
        TreeoptError: the plan's last range ends past ``max_batch`` (the engine never runs those batch sizes:
            the exports' largest key or ``-np`` would name one it cannot run).
    """
    out = [tuple(r) for r in ranges]
    if max_batch is None:
        return out
    lo, end, st = out[-1]
    if end > max_batch:
        raise TreeoptError(f"{name}: its last range ends at batch {end}, past --max-batch {max_batch} (the engine's "
                           "largest batch): raise --max-batch or cut the plan's last range")
    if end < max_batch:
        out[-1] = (lo, max_batch, st)
        notes.append(f"{name}'s last range ({lo}-{end}: {st.label}) extended to --max-batch {max_batch}, as a "
                     "solved plan's is")
    return out


def check_options(opts: TuneOptions) -> TuneOptions:
    """Every check that needs no model (one line each), and the options normalised. Returns them.

    Raises:
        TreeoptError (its subclasses ProfileError, SolverError, PlanExportError among them), one line each: an
            unknown engine or shape; a GPU engine without a latency profile or table or without an acceptance
            (calibration) profile; an envelope without a calibration profile; a batch size < 1; ``max_draft`` < 1;
            ``max_batch`` < 1, or below the largest of a given ``batches`` (without ``batches`` the latency table's
            or the default grid's batch sizes past it are left out, kept in ``left_out_batches``); ``context`` < 0
            or ``num_prompts`` / ``max_new_tokens`` / ``threads`` / ``rounds`` < 1; ``refine`` outside
            0..:data:`MAX_REFINE`; a missing file, or a ``latency`` file no loader takes (read once, kept as
            ``given_latency``); a ``plan`` file with overlapping or missing ranges; a release the engine's export
            refuses on its face (not a version); ``min_gain`` outside [0, 1) (the solver's [0, 10): 5 meant
            as 5 % is refused here); ``calibration`` without
            ``--shape envelope``, or ``acceptance`` with it; an envelope for TensorRT-LLM with a ``method`` other
            than EAGLE-3's;
            ``output_tokens`` < 1; an unknown ``acceptance_model``, or ``replay`` with nothing to replay; ``rows`` not
            one of :data:`ROW_LAYOUTS`, or it (not at its default) where treeopt's decoder is not timed; empty or
            negative ``request_lengths``; a bad or
            unsupported ``draft``; a measuring option where nothing it shapes is measured
            (:func:`_check_nothing_measured`).
    """
    from ..jobs.load import parse_drafter_spec
    from ..plan_exports import _version, check_llamacpp_release, check_llamacpp_slots
    from ..solver.schedule import check_chain_acceptance_model, check_min_gain, check_output_tokens

    opts.engine = _engine(opts.engine)
    if opts.shape not in TUNE_SHAPES:
        raise TreeoptError(f"--shape {opts.shape!r}: choose chain (a draft length per batch size), envelope "
                           "(EAGLE steps / topk / draft tokens, valued by a calibration profile) or tree (a static "
                           "tree per batch size: treeopt's decoder)")
    if opts.shape == "envelope" and opts.engine in ("vllm", "llama.cpp", "treeopt"):  # first: no file fixes it
        raise TreeoptError(f"{opts.engine} takes a draft length per batch size, not an EAGLE envelope: --shape chain")
    if opts.shape == "tree" and opts.engine != "treeopt":
        raise TreeoptError(f"--shape tree: {TREE_REFUSALS[opts.engine]}")
    if opts.shape == "tree" and opts.acceptance_model not in ("auto", "positional"):
        raise TreeoptError(f"--acceptance-model {opts.acceptance_model}: --shape tree values trees by the positional "
                           "acceptance (p_k of the k-th ranked candidate); drop it or pass positional")
    if opts.shape == "envelope" and opts.engine == "tensorrt-llm" and opts.method is not None and \
            opts.method.strip().lower() not in ("eagle3", "eagle"):
        raise TreeoptError(f"--method {opts.method}: TensorRT-LLM's envelope is its EAGLE-3 dynamic tree "
                           "(decoding_type Eagle3); drop --method, or --shape chain for a draft length per batch size")
    if opts.shape == "envelope" and opts.calibration is None:
        raise TreeoptError("--shape envelope values EAGLE envelopes by a calibration profile: pass --calibration "
                           "(treeopt profile acceptance --calibration)")
    for name, path in (("--latency", opts.latency), ("--acceptance", opts.acceptance),
                       ("--calibration", opts.calibration), ("--prompts", opts.prompts)):
        if path is not None and not Path(path).is_file():
            raise TreeoptError(f"{name} {path}: " + ("a folder, not a file" if Path(path).is_dir() else "no such file"))
    if opts.shape == "envelope" and opts.acceptance is not None:  # priced nothing, yet named in the plan's provenance
        raise TreeoptError("--acceptance prices chains; --shape envelope values EAGLE envelopes by --calibration "
                           "alone: drop --acceptance")
    if opts.calibration is not None and opts.shape != "envelope":  # it was read by nothing, without a word
        raise TreeoptError("--calibration values EAGLE envelopes (steps / topk / draft tokens): add --shape envelope, "
                           "or drop it for a draft length per batch size (--acceptance)")
    for name, value, low in (("--context", opts.context, 0), ("--num-prompts", opts.num_prompts, 1),
                             ("--max-new-tokens", opts.max_new_tokens, 1), ("--threads", opts.threads, 1),
                             ("--rounds", opts.rounds, 1)):
        if value < low:  # the option named (one line listing all five did not say which)
            raise TreeoptError(f"{name} must be at least {low}, got {value}")
    if opts.rows not in ROW_LAYOUTS:
        raise TreeoptError(f"--rows {opts.rows!r}: spread (the rows of a batch at contexts spread as the prompts' "
                           "lengths) or uniform (every row at --context)")
    if opts.request_lengths is not None and (not opts.request_lengths or min(opts.request_lengths) < 0):
        raise TreeoptError("request lengths must be a non-empty list of token counts >= 0")
    if isinstance(opts.refine, bool) or not isinstance(opts.refine, int) or not 0 <= opts.refine <= MAX_REFINE:
        raise TreeoptError(f"--refine {opts.refine}: rounds of bisection between batch sizes, 0..{MAX_REFINE} "
                           f"(each halves the span a switch may lie in; {MAX_REFINE} places it within 1 of "
                           f"{2 ** MAX_REFINE} batch sizes)")
    if opts.latency is not None and opts.given_latency is None:  # read once (the CLI checks, then tune checks
        # again): a file none of the loaders takes is one line before any work
        opts.given_latency = load_given_latency(Path(opts.latency), opts.context)
    from ..profiles.common import MAX_TOKENS

    if opts.max_batch is not None and opts.max_batch < 1:  # said "is below the largest batch size asked (256)"
        raise TreeoptError(f"--max-batch must be at least 1 (the engine's largest batch size), got {opts.max_batch}")
    if opts.max_batch is not None and opts.max_batch > MAX_TOKENS:
        raise TreeoptError(f"--max-batch {opts.max_batch}: at most {MAX_TOKENS:,}")
    batches_given = opts.batches is not None
    if opts.batches is None:  # a given T(b, n): every batch size it measured; measured here: the default grid
        opts.batches = list(opts.given_latency.batches) if opts.given_latency is not None else list(DEFAULT_BATCHES)
        if opts.max_batch is not None:  # the engine never runs the larger ones: neither solved nor measured
            opts.left_out_batches = tuple(b for b in opts.batches if b > opts.max_batch)
            opts.batches = [b for b in opts.batches if b <= opts.max_batch]
    if any(int(b) < 1 for b in opts.batches) or not opts.batches:
        raise TreeoptError("--batches takes batch sizes >= 1, e.g. 1,2,4,8,16")
    opts.batches = sorted({int(b) for b in opts.batches})
    if opts.plan is None:  # a given plan brings its own ranges from 1
        from ..profiles.batch import check_starts_at_one

        bs = ",".join(map(str, opts.batches))
        check_starts_at_one(opts.batches, f"--batches {bs}" if opts.given_latency is None or batches_given
                            else f"the latency table {opts.latency} (batch sizes {bs})")
    if opts.max_draft is not None and opts.max_draft < 1:
        raise TreeoptError(f"--max-draft must be at least 1, got {opts.max_draft}")
    if opts.max_batch is not None and opts.max_batch < max(opts.batches):  # only a given --batches gets here
        raise TreeoptError(f"--max-batch {opts.max_batch} is below the largest of --batches ({max(opts.batches)}): "
                           "drop the batch sizes past it, or leave --batches out to solve those up to --max-batch")
    if opts.plan is not None:
        from ..solver.schedule import load_schedule

        load_schedule(opts.plan)  # overlapping or missing ranges: one line, before anything is measured
    if opts.prompts is not None:
        from ..prompts import load_prompts

        load_prompts(opts.prompts, limit=opts.num_prompts)  # an empty or malformed file: before the timing
    if opts.target is not None and not Path(opts.target).exists():  # a GGUF file or a checkpoint folder
        raise TreeoptError(f"--target {opts.target}: no such file or folder")
    if opts.engine in GPU_ENGINES:
        if opts.latency is None:
            raise TreeoptError(f"--engine {opts.engine} runs on a GPU: pass its latency with --latency (treeopt profile "
                               "latency --engine sglang|vllm on the GPU, or a T(b, n) table: batch,tokens,target_ms,...)")
        if opts.shape == "chain" and opts.acceptance is None:
            raise TreeoptError(f"--engine {opts.engine}: pass the drafter's acceptance profile with --acceptance (treeopt "
                               "profile acceptance, or the engine's per-position acceptance)")
        if opts.release is not None:
            _version(opts.release, opts.engine)
    elif opts.engine == "llama.cpp":
        check_llamacpp_release(opts.release)  # before minutes of measuring
        check_llamacpp_slots(max([*opts.batches, opts.max_batch or 1]))  # the last range's -np
    elif opts.release is not None and opts.engine == "treeopt":
        raise TreeoptError("--release names an engine release; treeopt's schedule has none")
    _check_nothing_measured(opts)
    if opts.method is not None:  # case is the exports' to normalise; spaces around a name are nobody's
        opts.method = opts.method.strip()
        if not opts.method:  # it was read as "not given": the drafter measured's method
            raise TreeoptError("--method is blank: name the engine's drafting method (draft_model, ngram, eagle, "
                               "eagle3, mtp), or drop --method for the drafter measured")
        from ..plan_exports import VLLM_METHODS, method_key

        if opts.engine == "treeopt" and method_key(opts.method) not in VLLM_METHODS:  # the engines' exports refuse it
            raise TreeoptError(f"--method {opts.method!r} is no drafting method in vLLM's names: one of "
                               f"{', '.join(VLLM_METHODS)}")
    if opts.model is not None and not str(opts.model).strip():  # it was written into the engine's config as is
        raise TreeoptError("--model is blank: name the drafter checkpoint the engine loads (a path or a hub id), "
                           "or drop --model")
    if opts.model is not None and any(not ch.isprintable() for ch in opts.model):  # a newline split the command
        raise TreeoptError(f"--model {opts.model!r} holds a control character (a newline?): name one path or hub id")
    if opts.model is not None and opts.model.startswith("-"):  # SGLang and llama.cpp would read it as an option
        raise TreeoptError(f"--model {opts.model!r} starts with '-', which the engine reads as an option: write a path "
                           f"as ./{opts.model}")
    check_min_gain(opts.min_gain)
    if opts.min_gain >= 1.0:  # 5 meant as 5 %: a 500 % bar kept plain everywhere and -o removed the last plan
        raise TreeoptError(f"--min-gain {opts.min_gain}: a fraction of plain decoding's tokens/s (0.05 is 5 %); a lead "
                           "of 100 % or more is not a bar a plan takes here")
    check_output_tokens(opts.output_tokens)
    check_chain_acceptance_model(opts.acceptance_model)
    spec = parse_drafter_spec(opts.draft)  # a bad --draft fails here
    from ..drafting.registry import refuse_a_head_as_a_draft_model

    refuse_a_head_as_a_draft_model(spec)  # a head's folder would be exported as a draft model
    if opts.engine == "llama.cpp" and not spec.entry.loads_model and spec.kind != "lookup":
        raise TreeoptError(f"--draft {spec.label}: llama.cpp drafts with a draft model or n-grams (lookup)")
    if opts.acceptance_model == "replay" and opts.shape == "chain":  # before minutes of measuring
        if opts.acceptance is not None:
            from ..profiles import load_acceptance

            if not load_acceptance(opts.acceptance).chain_traces:
                raise TreeoptError(f"--acceptance-model replay: {opts.acceptance} has no chain_traces (treeopt profile "
                                   "acceptance --chains measures them)")
        elif spec.entry.reads_features:
            raise TreeoptError(f"--acceptance-model replay: --draft {spec.label} reads the target's features and "
                               "cannot be teacher-forced, so no chain traces can be measured for it")
    return opts


def _check_nothing_measured(opts: TuneOptions) -> None:
    """Refuse the options that only shape a measurement tune will not make (they were taken and changed nothing):
    ``num_prompts`` / ``max_new_tokens`` where the acceptance is given, ``rounds`` where the latency is, and with a GPU
    engine (which measures nothing here) those and ``prompts`` / ``threads`` too; ``rows`` but where treeopt's decoder
    is timed. An option at its default passes.

    Raises:
        TreeoptError: one line naming the options and why nothing reads them.
    """
    default = TuneOptions(engine=opts.engine)
    gpu = opts.engine in GPU_ENGINES
    shaped = (("--num-prompts", "num_prompts", gpu or opts.acceptance is not None),
              ("--max-new-tokens", "max_new_tokens", gpu or opts.acceptance is not None),
              ("--rounds", "rounds", gpu or opts.latency is not None),
              ("--prompts", "prompts", gpu), ("--threads", "threads", gpu))
    if opts.rows != default.rows and (opts.engine != "treeopt" or opts.latency is not None):
        raise TreeoptError("--rows shapes how treeopt's decoder's T(b, n) is timed, and "
                           + (f"--engine {opts.engine} does not time it" if opts.engine != "treeopt"
                              else "what --latency gives is read instead") + ": drop --rows")
    idle = [flag for flag, name, unused in shaped if unused and getattr(opts, name) != getattr(default, name)]
    if not idle:
        return
    given = " and ".join(dict.fromkeys("--latency" if f == "--rounds" else "--acceptance" for f in idle))
    why = (f"--engine {opts.engine} measures nothing here (it reads the profiles given)" if gpu
           else f"what {given} give{'s' if ' and ' not in given else ''} is read instead")
    raise TreeoptError(f"{', '.join(idle)} shape{'s' if len(idle) == 1 else ''} what tune measures, and {why}: "
                       f"drop {', '.join(idle)}")


# ---------------------------------------------------------------------------------------------- acceptance
def acceptance_from_traces(traces: Sequence[Sequence[tuple[int, float, bool]]], *, profile_id: str,
                           target_name: str, draft_name: str, max_depth: int, source: str,
                           prompts_file: str | None = None, max_new_tokens: int | None = None):
    """An acceptance profile for chains from teacher-forced traces (per prompt and continuation position:
    the drafter's top-1 token, its probability, whether the target's token equals it), by depth: a chain step
    may start at every position t, and depth d's p_1 is the fraction of starts whose tokens t .. t + d - 2 were
    all accepted that accept token t + d - 1 too (the runs of agreement an n-gram or a draft model has, which a
    single pooled p_1 misses). The pooled vector (``p_1`` = depth 1) carries its counts for the intervals.

    Returns:
        an :class:`~sequoia_opt.profiles.AcceptanceProfile` with ``acceptance_by_depth`` 1..``max_depth`` (a
        depth with fewer than 30 trials repeats the one above), ``positional_consistent`` False when the
        depths differ beyond the 95 % intervals, per-prompt depth-1 counts (two traces or more), and the traces'
        agreements themselves (``chain_traces``: a chain replays on them,
        :func:`~sequoia_opt.solver.chains.replay_counts`).
        An empty trace (a continuation that ended at once) counts as no prompt.

    Raises:
        ProfileError: no trace positions.
    """
    from ..profiles import AcceptanceProfile
    from ..profiles.common import wilson_interval

    traces = [t for t in traces if len(t)]

    hits = np.zeros(max_depth + 1, dtype=np.int64)
    trials = np.zeros(max_depth + 1, dtype=np.int64)
    per_prompt = []  # (1, 2) per prompt: its depth-1 hits and misses (every position is a depth-1 trial)
    for trace in traces:
        ok = [bool(x[2]) for x in trace]
        per_prompt.append([[sum(ok), len(ok) - sum(ok)]])
        for t in range(len(ok)):
            for d in range(1, max_depth + 1):
                if t + d - 1 >= len(ok):
                    break
                trials[d] += 1
                if not ok[t + d - 1]:
                    break
                hits[d] += 1
    if trials[1] == 0:
        raise ProfileError("no trace positions to measure acceptance on")
    p1 = hits[1] / trials[1]
    by_depth, last = {}, p1
    lo1, hi1 = wilson_interval(hits[1], trials[1])
    consistent = True
    for d in range(1, max_depth + 1):
        if trials[d] >= 30:
            last = hits[d] / trials[d]
            lo, hi = wilson_interval(hits[d], trials[d])
            consistent = consistent and not (hi < lo1 or lo > hi1)
        by_depth[d] = np.array([last])
    measured = {"target": target_name, "draft": draft_name, "mode": "greedy", "temperature": 0.0, "top_p": 1.0,
                "width": 1, "num_samples": int(trials[1]), "positional_consistent": bool(consistent),
                "depth_trials": {int(d): int(trials[d]) for d in range(1, max_depth + 1)}}
    if prompts_file:
        measured["prompts"] = prompts_file
    if max_new_tokens:
        measured["max_new_tokens"] = int(max_new_tokens)
    # per prompt, the depth-1 trials only: every stored count is a depth-1 trial (the per-depth vectors are
    # conditional rates derived from the same positions), so the intervals between prompts follow p_1's spread
    measured["num_prompts"] = len(per_prompt)
    return AcceptanceProfile(id=profile_id, acceptance=np.array([p1]),
                             counts=np.array([hits[1], trials[1] - hits[1]], dtype=np.int64), measured=measured,
                             by_depth=by_depth, source=source,
                             prompt_counts=np.asarray(per_prompt, dtype=np.int64) if len(per_prompt) >= 2 else None,
                             chain_traces=["".join("1" if x[2] else "0" for x in t) for t in traces] or None)


def lookup_traces(prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], vocab_size: int,
                  lookup_min: int, lookup_max: int) -> list[list[tuple[int, float, bool]]]:
    """Teacher-forced traces of prompt lookup along the target's greedy continuations (llama.cpp's tokens): at
    every position, the n-gram drafter's top candidate after the committed text
    (:meth:`~sequoia_opt.drafting.drafters.PromptLookupDrafter.teacher_forced`), its confidence, and whether
    the target's token equals it."""
    from ..drafting.drafters.lookup import PromptLookupDrafter
    from ..profiling.acceptance import teacher_forced_trace

    drafter = PromptLookupDrafter(vocab_size, prompt_lookup_min=lookup_min, prompt_lookup_max=lookup_max)
    return [teacher_forced_trace(drafter, p, cont) for p, cont in zip(prompts, continuations)]


def measure_chain_acceptance(pair: Any, prompts: Sequence[Sequence[int]], *, prompts_file: str, max_new_tokens: int,
                             max_depth: int, command: str, backend: str = "auto", progress: ProgressFn | None = None):
    """A pair's chain profile on treeopt's decoder: the drafter teacher-forced along the target's greedy output
    (:func:`~sequoia_opt.profiling.acceptance.chain_traces`), as :func:`acceptance_from_traces` (id
    ``<pair>_greedy_chains``; ``command`` names what measured it; ``backend``: the decoder's attention backend).
    None when the drafter cannot be teacher-forced."""
    from ..profiling.acceptance import chain_traces

    traces = chain_traces(pair.target, pair.new_drafter, prompts, max_new_tokens=max_new_tokens,
                          eos_ids=sorted(pair.tokenizer.eos_ids), backend=backend, progress=progress)
    if traces is None:
        return None
    return acceptance_from_traces(traces, profile_id=f"{pair.slug}_greedy_chains", target_name=pair.target_name,
                                  draft_name=pair.draft_name, max_depth=max_depth, prompts_file=prompts_file,
                                  max_new_tokens=max_new_tokens,
                                  source=f"measured by {command} (the drafter teacher-forced on the target's greedy "
                                         "output)")


def short_traces_note(value: Any) -> str:
    """One line for a replayed :class:`~sequoia_opt.solver.schedule.ChainValue` whose traces are too short to show
    some K's steady state (``value.whole_answer_ks``)."""
    ks = value.whole_answer_ks
    return (f"chains of K >= {ks[0]}: most traced answers have no room for K drafts, so their tokens per step are "
            "whole answers' (end steps included); profile longer answers (--max-new-tokens) for their steady state")


# ---------------------------------------------------------------------------------------------- peers
def peer_ranges(plan: Any, value: Any, profile: Any, batches: Sequence[int], *,
                context: int | None = None) -> dict[str, list[tuple[int, int, Any]]]:
    """The peers' rules as schedules over ``batches`` (every K clipped to what the value model prices):
    vLLM's ``generate_config.py`` (at each batch size the best of K in {1, 3, 5}, here by prediction over the
    plan's answer length, ``plan.output_tokens``), SGLang's default EAGLE envelope (5, 4, 8) as a chain of its 5
    steps, llama.cpp's default draft length (3), and the plan's batch-1 K everywhere."""
    from ..plan_exports import LLAMACPP_DEFAULT_DRAFT, SGLANG_DEFAULT_ENVELOPE, VLLM_GENERATOR_KS
    from ..solver.schedule import SpecSetting, predict_ranges

    top = value.max_draft
    clip = lambda k: SpecSetting.chain(min(int(k), top))  # noqa: E731
    bs = sorted(batches)
    last = max(plan.ranges[-1].hi, bs[-1])  # a given plan may end below the batch sizes it is predicted at

    def over(settings: dict[int, Any]) -> list[tuple[int, int, Any]]:
        out = []
        for i, b in enumerate(bs):
            hi = bs[i + 1] - 1 if i + 1 < len(bs) else last
            out.append((1 if i == 0 else b, hi, settings[b]))
        return out

    vllm = {}
    for b in bs:  # every K priced alike: over the plan's answer length (a given plan's rows score only its own)
        scored = [(predict_ranges([(1, b, s)], value, profile, [b], context=context, output_tokens=plan.output_tokens,
                                  answer_end_cut=plan.answer_end_cut)[0].tokens_per_s_per_request, -k, s)
                  for k, s in ((k, clip(k)) for k in VLLM_GENERATOR_KS)]
        vllm[b] = max(scored, key=lambda x: (x[0], x[1]))[2]
    k1 = plan.own_best_first.setting.draft_tokens  # batch 1's own, not the one TensorRT-LLM's rule may move it to
    return {"vllm-generator": over(vllm),
            "sglang-default": [(1, last, clip(SGLANG_DEFAULT_ENVELOPE[0]))],
            "llama.cpp-default": [(1, last, clip(LLAMACPP_DEFAULT_DRAFT))],
            "batch1-best": [(1, last, clip(k1))]}


# ---------------------------------------------------------------------------------------------- the job
def _covers(profile: Any, batches: Sequence[int], k: int, context: int | None) -> bool:
    try:
        return all(profile.curve(b).max_target_tokens(context) >= k + 1 for b in batches)
    except ProfileError:
        return False


def load_given_latency(path: Path, context: int | None = None) -> Any:
    """A ``--latency`` file as a :class:`~sequoia_opt.profiles.batch.BatchLatencyProfile`: a T(b, n) CSV table (read
    at ``context``), a ``treeopt-latency-batch/1`` profile, or a latency profile (batch 1).

    Raises:
        ProfileError: a file none of these loaders takes (the last one's line).
    """
    from ..profiles import load_latency
    from ..profiles import LATENCY_FORMAT
    from ..profiles.batch import BATCH_LATENCY_FORMAT, BatchLatencyProfile, load_batch_latency, load_batch_table

    if path.suffix.lower() == ".csv" or _looks_like_table(path):  # a table saved as .txt is still a table
        return load_batch_table(path, context=context)
    try:
        return load_batch_latency(path)
    except ProfileError:
        fmt = _format_of(path)
        if fmt == BATCH_LATENCY_FORMAT:  # a batch profile with a bad field: that field's line
            raise
        if isinstance(fmt, str) and fmt.startswith("treeopt-") and fmt != LATENCY_FORMAT:  # another kind of file
            raise ProfileError(f"{path} is a {fmt} file: -l takes a T(b, n) CSV table, a {BATCH_LATENCY_FORMAT} "
                               f"or a {LATENCY_FORMAT} profile") from None
        return BatchLatencyProfile.from_latency(load_latency(path))


def _looks_like_table(path: Path) -> bool:
    """Whether ``path``'s first line past comments and blank lines starts a T(b, n) table's header
    (``batch,tokens,``), whatever the file's name."""
    from itertools import islice

    from ..profiles.common import starts_like_table

    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            return starts_like_table(islice(f, 1000))  # the header is near the top; a long file need not be read
    except OSError:
        return False


def _format_of(path: Path) -> Any:
    """The ``format`` a YAML / JSON document declares (None when it cannot be read as a mapping)."""
    import yaml

    try:
        doc = safe_load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return doc.get("format") if isinstance(doc, dict) else None


def _latency(opts: TuneOptions, done: dict[str, str], default: Path | None,
             measure: Callable[[Sequence[int]], Any] | None,
             weights: dict | None = None) -> tuple[Any, Callable[[Sequence[int]], Any] | None]:
    """The batch latency profile: given; or reused from ``default`` (where ``treeopt profile latency --batch``
    writes too) or from tune's own file beside it (:func:`tune_latency_file`: one per ``--shape``) when it fits
    (:func:`_latency_misfit`); or,
    when one of them fits at some of ``opts.batches`` and lacks only the others (another ``--batches``), reused
    there and only the missing batch sizes timed (each batch size's settings are chosen from its own T(b, n), so
    sizes timed at different times do not bias each other's choice); else timed by ``measure(batches)`` and saved
    at ``default``, or beside it when that holds a profile tune did not write (its source names ``treeopt tune``;
    a user's measurement is never replaced) and always for trees.

    ``weights`` (:func:`~sequoia_opt.jobs.load.weights_record` of the pair in use): recorded in what is timed
    (``model.weights``), and a saved profile that recorded other weights does not fit (profiles are filed by the
    checkpoints' names; another draft of the same file name is another curve).

    Returns ``(profile, more)``: ``more(batches)`` times the batch sizes the profile lacks at ``opts.context`` (for
    ``--refine``), saves the profile with them (tune's own file: a reused user's profile is never rewritten) and
    returns it; None for a given profile, which nothing here can extend.
    """
    from dataclasses import replace

    from ..profiles.batch import load_batch_latency, save_batch_latency

    want_k = opts.max_draft or DEFAULT_MAX_DRAFT
    if weights and measure is not None:
        timed = measure

        def measure(batches: Sequence[int]) -> Any:  # the weights timed, recorded with every curve
            prof = timed(batches)
            curves = {b: replace(c, model={**c.model, "weights": weights}) for b, c in prof.curves.items()}
            return replace(prof, curves=curves, model={**prof.model, "weights": weights})
    if opts.latency is not None:
        p = Path(opts.latency)
        prof = opts.given_latency  # read by check_options, which tune runs first
        missing = [b for b in opts.batches if b not in prof.batches]
        if missing:  # a batch size the profile or table lacks: one line, exit 2
            raise ProfileError(f"{p} has no T(b, n) at batch size {missing[0]} (it has {','.join(map(str, prof.batches))}): "
                               "measure it, or pass --batches among those (the default: all of them)")
        done["latency"] = f"given: {p}"
        return prof, None
    assert default is not None and measure is not None
    tune_wrote = lambda x: "treeopt tune" in str(x.source or "")  # noqa: E731
    own = tune_latency_file(default, opts.shape)
    prof, out, why = _saved_profile(default, load_batch_latency,
                                    lambda x: _latency_misfit(x, opts, want_k, weights=weights), tune_wrote,
                                    own=own, always_own=opts.shape == "tree")
    lacking: list[int] = []
    if prof is None:  # one that fits at some of --batches: reused there, the others timed by `more` below
        part = _partial_latency(default, opts, want_k, weights, own)
        if part is not None:
            prof, out, have = part
            lacking = [b for b in opts.batches if b not in have]
    # a profile at the default path that this shape's tune does not write (a user's; for trees, any): reused, and
    # what `more` times goes to tune's own file beside it
    users = prof is not None and out == default and (not tune_wrote(prof) or opts.shape == "tree")
    if prof is not None:
        done["latency"] = f"reused: {out}"
        if users:
            out = own

    def saved() -> Any:
        """What the file at ``out`` holds (tune's own: never a user's file); None when there is none or it is
        unreadable (timed anew and rewritten)."""
        try:
            return load_batch_latency(out) if out.is_file() else None
        except ProfileError:
            return None

    def save(p: Any, old: Any) -> None:
        """``p`` into ``out``, keeping what ``old`` (:func:`saved`, read once by the caller) holds that ``p`` does not
        replace (:meth:`~sequoia_opt.profiles.batch.BatchLatencyProfile.keeping`): another --context's curves and
        other batch sizes stay cached."""
        other = old is not None and differing_weights(old.model, weights)  # another draft's curves are not kept
        save_batch_latency(out, p if old is None or other else p.keeping(old))

    if prof is None:
        prof = measure(opts.batches)
        save(prof, saved())
        done["latency"] = f"measured: {out}{why}"
    held = [prof]

    def lacks(p: Any, b: int) -> bool:
        return b not in p.curves or opts.context not in p.curve(b).contexts

    def more(batches: Sequence[int], why: str = "where the plan switches (--refine)") -> Any:
        have = held[0]
        need = sorted({int(b) for b in batches if lacks(have, b)})
        file = saved() if need else None  # read once: the sizes to reuse, and what the save must keep
        # tune's own file beside a reused user's profile: its curves that still fit, each batch size on its own
        # (earlier --batches or --refine)
        own = {b: c for b, c in file.curves.items() if not _latency_misfit(file, opts, want_k, [b], weights)} \
            if users and file is not None else {}
        kept = [b for b in need if b in own]
        if kept:
            have = replace(have, curves={**have.curves, **{b: own[b] for b in kept}})
            done["latency"] += f"; {batch_sizes_text(kept)} read from {out}"
            need = [b for b in need if b not in kept]
        if need:
            extra = measure(need)
            bs = ",".join(map(str, need))
            have = replace(have, curves={**have.curves, **extra.curves},
                           source=f"{have.source or ''}; batch sizes {bs} timed after by treeopt tune, {why}")
            done["latency"] += f"; {batch_sizes_text(need)} timed {why}, saved: {out}"
            save(have, file)
        held[0] = have
        return have

    if lacking:
        prof = more(lacking, "as --batches asks (not in the saved profile)")
    return prof, more


def _partial_latency(path: Path, opts: TuneOptions, want_k: int, weights: dict | None,
                     own: Path) -> tuple[Any, Path, list[int]] | None:
    """The saved batch profile at ``path`` or tune's own beside it (``own``: :func:`tune_latency_file`) that fits
    (:func:`_latency_misfit`) at the most of ``opts.batches`` it has: ``(profile, its path, those batch sizes)``,
    or None when neither fits at any."""
    from ..profiles.batch import load_batch_latency

    best = None
    for candidate in (path, own):
        if not candidate.is_file():
            continue
        try:
            prof = load_batch_latency(candidate)
        except ProfileError:  # only tune's own file gets here unreadable (_saved_profile raised for the other)
            continue
        have = [b for b in opts.batches if b in prof.curves]
        fits = have and not _latency_misfit(prof, opts, want_k, have, weights)
        if fits and (best is None or len(have) > len(best[2])):
            best = (prof, candidate, have)
    return best


def _saved_profile(path: Path, load: Callable[[Path], Any], misfit: Callable[[Any], str],
                   tune_wrote: Callable[[Any], bool], own: Path | None = None,
                   always_own: bool = False) -> tuple[Any, Path, str]:
    """tune's rule for a saved profile (latency or acceptance): the one at ``path`` (where ``treeopt profile``
    writes it too), else tune's own beside it (``own``, default ``<name>.tune.yaml``), whichever ``misfit`` passes
    ('' = fits). Returns ``(profile, its path, '')`` for one that fits; else ``(None, where to write the new one, why
    the saved ones did not fit)``, the new one going to ``own`` when ``path`` holds a profile tune did not write (a
    user's measurement is never replaced) or when ``always_own``. A saved profile's load warnings are shown only
    when it is the one used (a user's profile that did not fit was warned about while tune read its own)."""
    import warnings

    own = path.with_suffix(".tune.yaml") if own is None else own
    why, keep = "", always_own
    for candidate in (path, own):
        if candidate.is_file():
            try:
                with warnings.catch_warnings(record=True) as said:  # a file's own warnings count if it is used
                    warnings.simplefilter("always")
                    prof = load(candidate)
            except ProfileError as err:  # tune's own file is its cache: unreadable, it is measured anew
                if candidate != own:
                    raise
                why = why or f" (the one saved at {candidate} is unreadable: {err})"
                continue
            miss = misfit(prof)
            if not miss:
                for w in said:  # the profile the plan is solved from: what its loader said is shown
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
                return prof, candidate, ""
            why = why or f" (the one saved at {candidate} {miss})"
            keep = keep or (candidate == path and not tune_wrote(prof))
    return None, own if keep else path, why


def _latency_misfit(prof: Any, opts: TuneOptions, want_k: int, batches: Sequence[int] | None = None,
                    weights: dict | None = None) -> str:
    """Why a saved batch profile cannot stand for the one ``opts`` would measure ('' when it can): it must have
    timed every batch size (``batches``, default ``opts.batches``) at ``opts.context`` itself (tune times that one
    context; another is a different curve, read by interpolation nowhere), up to K = ``want_k``, with
    ``opts.threads`` threads, and the ``weights`` in use where it recorded its own."""
    batches = opts.batches if batches is None else batches
    other = weights_mismatch(prof.model, weights)
    if other:
        return f"was timed with other weights: {other[0]}"
    if opts.engine == "treeopt":  # tune times float32 on treeopt's decoder: another precision is another curve
        dev = prof.device or {}
        precision = dev.get("dtype"), (dev.get("linear") or {}).get("precision")
        other_p = next((str(p) for p in precision if p not in (None, "float32")), None)
        if other_p is not None:
            return f"was timed in {other_p}, not float32"
    threads = (prof.device or {}).get("threads")
    if threads is not None and int(threads) != opts.threads:
        return f"was timed with {threads} threads, not {opts.threads}"
    for b in batches:
        if b not in prof.curves:
            return f"has no batch size {b}"
        if opts.context not in prof.curve(b).contexts:
            return f"was timed at context {', '.join(map(str, prof.curve(b).contexts))}, not {opts.context}"
        if opts.engine == "treeopt":  # rows spread another way (other prompts, --rows): another curve
            from ..profiling.batch import row_contexts

            have = prof.curve(b).row_contexts(opts.context) or [opts.context] * b
            want = row_contexts(opts.context, b, opts.requests)
            uniform = [opts.context] * b
            if have != want and want == uniform:
                return f"timed its {b} rows spread ({have[0]}-{have[-1]}), not every row at {opts.context} (--rows)"
            if have != want and have == uniform:
                return f"timed every row at {opts.context}, not spread as these prompts' batch ({want[0]}-{want[-1]}) " \
                       "(--rows)"
            if have != want:  # both spread, by other prompts: the first row that differs (both ascending)
                i = next((i for i, (x, y) in enumerate(zip(have, want)) if x != y), min(len(have), len(want)) - 1)
                return (f"timed row {i + 1} of its {b} at context {have[i]}, where these prompts' batch has "
                        f"{want[i]} (--rows)")
    if not _covers(prof, batches, want_k, opts.context):
        return f"stops short of K = {want_k}"
    loops = {prof.curve(b).loop_policy_at(opts.context) for b in batches} - {None}  # the context read, not another
    own = "chain" if opts.shape == "chain" else "static"  # the loop tune times for this shape (_treeopt_inputs)
    if opts.engine == "treeopt" and loops and loops != {own}:  # a chain's loop extras priced a tree, or back
        return f"timed the {', '.join(sorted(loops))} loop, not the {own} loop --shape {opts.shape} runs"
    if opts.shape == "tree":  # a chain's profile timed levels of 1-2 tokens: the trees would be cut to width 2
        wide = tree_widths(want_k)[-1]
        narrow = [b for b in batches if prof.curve(b).cost_model == "per-level"
                  and prof.curve(b).max_draft_tokens(opts.context) < wide]
        if narrow:
            return f"timed draft levels up to {prof.curve(narrow[0]).max_draft_tokens(opts.context)} tokens, not {wide}"
    return ""


def tune_latency_file(default: Path, shape: str) -> Path:
    """tune's own batch latency file beside ``default`` (where ``treeopt profile latency --batch`` writes) for
    ``--shape``: ``<name>.tune.yaml`` for chains (written at ``default`` itself when that holds no user's profile),
    ``<name>.trees.tune.yaml`` for trees, always. Each shape times its own loop probes (:func:`_latency_misfit`), so
    one file per shape lets ``--shape chain`` and ``--shape tree`` on one pair each reuse its own profile instead of
    re-timing over the other's."""
    return default.with_suffix(".trees.tune.yaml" if shape == "tree" else ".tune.yaml")


def tree_widths(max_draft: int) -> list[int]:
    """The c(b, w) widths ``--shape tree`` times for trees of up to ``max_draft`` drafted tokens per row: those of
    :data:`TREE_WIDTHS` that fit, and ``max_draft`` when it is below the widest."""
    return sorted({w for w in TREE_WIDTHS if w <= max_draft} | {min(max_draft, TREE_WIDTHS[-1])})


def _acceptance(opts: TuneOptions, path: Path, done: dict[str, str], measure: Callable[[], Any],
                weights: dict | None = None, files: dict[str, Path] | None = None) -> Any:
    """The acceptance profile: given; or reused from ``path`` (where ``treeopt profile acceptance`` writes it too) or
    from tune's own file beside it (``<name>.tune.yaml``) when it measured the prompts asked (:func:`_prompts_misfit`)
    with these ``weights`` (:func:`~sequoia_opt.jobs.load.weights_record`; profiles are filed by checkpoint name, and
    another checkpoint of the same name is another drafter); else measured by ``measure()`` and saved (its weights
    recorded) at ``path``, or beside it when ``path`` holds a profile tune did not write (a user's measurement is
    never replaced). ``files``: where the file used is recorded (``files["acceptance"]``), when given."""
    from ..profiles import load_acceptance, save_acceptance, weights_mismatch

    files = {} if files is None else files
    from ..prompts import demo_prompts_path

    if opts.acceptance is not None:
        done["acceptance"] = f"given: {opts.acceptance}"
        files["acceptance"] = Path(opts.acceptance)
        return load_acceptance(opts.acceptance)
    request = {"prompts": str(Path(opts.prompts or demo_prompts_path("profile")).resolve()),
               "num_prompts": opts.num_prompts, "max_new_tokens": opts.max_new_tokens,
               "max_depth": opts.max_draft or DEFAULT_MAX_DRAFT}

    def misfit(x: Any) -> str:
        other = weights_mismatch(x.measured, weights)
        if other:
            return f"was measured with other weights: {other[0]}"
        if opts.shape == "tree" and x.width < 2:  # a chain's profile: every tree would be a chain
            return "ranked one candidate per position, and a tree needs its k-th ranked candidates"
        return _prompts_misfit(x.measured, request)

    acc, out, why = _saved_profile(path, load_acceptance, misfit, lambda x: "tune_request" in x.measured)
    if acc is not None:
        done["acceptance"] = f"reused: {out}"
        files["acceptance"] = out
        return acc
    acc = measure()
    acc.measured["tune_request"] = request
    if weights:
        acc.measured["weights"] = weights
    save_acceptance(out, acc)
    done["acceptance"] = f"measured: {out}{why}"
    files["acceptance"] = out
    return acc


def _prompts_misfit(measured: dict[str, Any], request: dict[str, Any]) -> str:
    """Why a saved acceptance profile does not hold the prompts tune is asked to measure ('' when it does): one tune
    wrote must have the same ``tune_request`` (prompts file, count, answer length, depth); one ``treeopt profile
    acceptance`` wrote, the same prompts file and answer length (its count and depth are the user's choice)."""
    saved = measured.get("tune_request")
    if isinstance(saved, dict):
        diff = [f"{k} {saved.get(k)}" for k in request if saved.get(k) != request[k]]
        return f"measured {', '.join(diff)}" if diff else ""
    prompts, tokens = measured.get("prompts"), measured.get("max_new_tokens")
    if prompts is None or str(Path(str(prompts)).resolve()) != request["prompts"]:
        return f"measured the prompts of {prompts}"
    if tokens != request["max_new_tokens"]:
        return f"measured max_new_tokens {tokens}"
    return ""


def tune(opts: TuneOptions, progress: ProgressFn | None = None) -> TuneResult:
    """Profile what is missing, solve the plan and export it (module docstring). Writes measured profiles under
    ``opts.profiles_dir``; writes no output file (the CLI does, last); a draft model converted to a GGUF for
    llama.cpp lives in a temporary folder removed before it returns.

    Raises:
        TreeoptError: as :func:`check_options`; ProfileError: a batch size the latency profile or table lacks, a
            draft length past what it measured; SolverError: an acceptance model the profile cannot serve (e.g.
            ``by-depth`` without per-depth vectors); PlanExportError: an engine release that does not take the
            plan; EngineError: llama.cpp missing or refusing a GGUF; DecodingError: as the decoder, while measuring.
    """
    with ExitStack() as stack:  # what lives while tune measures (llama.cpp's draft GGUF), gone when it returns
        return _tune(opts, progress, stack)


def _tune(opts: TuneOptions, progress: ProgressFn | None, stack: ExitStack) -> TuneResult:
    """:func:`tune`'s body; ``stack`` holds what must live until it returns."""
    from ..jobs.load import parse_drafter_spec
    from ..plan_exports import export_plan, guard_notes, method_key
    from ..solver.schedule import (ChainValue, EnvelopeValue, load_schedule, max_draft_measured,
                                   plan_document, plan_from_ranges, predict_ranges, solve_one_setting_plan, solve_plan,
                                   switch_midpoints)

    opts = check_options(opts)
    spec = parse_drafter_spec(opts.draft)
    done: dict[str, str] = {}
    notes: list[str] = []
    if opts.left_out_batches:
        notes.append(f"{batch_sizes_text(opts.left_out_batches)} of "
                     + ("the latency table" if opts.given_latency is not None else "the default grid")
                     + f" left out: past --max-batch {opts.max_batch}")
    if opts.engine == "llama.cpp":
        profile, acc, labels, more = _llamacpp_inputs(opts, spec, done, progress, stack)
    elif opts.engine == "treeopt":
        profile, acc, labels, more = _treeopt_inputs(opts, spec, done, progress)
    else:
        profile, acc, labels, more = _given_inputs(opts, spec, done, progress)
    ctx = None if opts.engine in GPU_ENGINES else opts.context
    if ctx is not None:  # a profile measured at shorter contexts than --context: say which option and value fit
        largest = min(max(profile.curve(b).contexts) for b in opts.batches)
        if ctx > largest:
            raise TreeoptError(f"--context {ctx}: the latency profile {profile.id!r} measured contexts up to {largest} "
                               f"tokens; pass --context {largest} (or measure it at {ctx})")
    warnings = falling_cost_warnings(profile, opts.batches, ctx)
    if opts.engine in GPU_ENGINES and not str(profile.source or "").startswith("a T(b, n) table"):
        from ..engines import engine_mismatch  # a table names no engine: it is the user's own measurement

        w = engine_mismatch(profile.curve(opts.batches[0]), opts.engine, what=f"--engine {opts.engine}")
        if w:
            warnings.append(w)
    measured = getattr(acc, "measured", None) or {}
    undrafted, steps = measured.get("undrafted_steps") or 0, measured.get("steps") or 0
    if steps and undrafted >= 0.05 * steps:  # measured here or given: its positions past the draft's context
        warnings.append(f"the acceptance profile {acc.id!r}: {undrafted} of {steps} steps ({undrafted / steps:.0%}) "
                        "drafted nothing (the draft's context ended before its requests): it holds the acceptance "
                        "of the positions the draft reached only")
    if getattr(acc, "example", False):  # as solve says it, for every engine
        warnings.append(f"acceptance profile {acc.id!r} is EXAMPLE data, not a measurement")
    if opts.acceptance is not None and (opts.engine == "treeopt" or opts.target is not None or
                                        opts.draft is not None and spec.path is not None):
        warnings += [w for w in _pair_warnings(opts, spec, acc, labels) if w not in warnings]
    if opts.shape == "envelope":
        from ..profiles.calibration import calibration_warnings, load_calibration
        from ..solver.dynamic import setting_grid

        cal = load_calibration(opts.calibration)
        warnings += calibration_warnings(cal)  # too few calibrated bins: as solve --dynamic says it
        grid = setting_grid(cal, policies=("eagle",))
        top = max_draft_measured(profile, opts.batches, ctx) + 1  # the most tokens every batch's curve prices
        fits = [s for s in grid if s.budget <= top]
        if not fits:
            raise TreeoptError(f"the latency profile measured T(b, n) up to n = {top} tokens at every batch size, "
                               f"and the smallest EAGLE envelope verifies {min(s.budget for s in grid)}: measure "
                               "larger n (or tune chains: --shape chain)")
        if len(fits) < len(grid):
            notes.append(f"EAGLE envelopes verifying up to {top} tokens (root included), as far as the latency "
                         f"profile measured T(b, n): {len(grid) - len(fits)} larger ones were not scored")
        if opts.engine == "tensorrt-llm":  # its rule: max_draft_len <= max_total_draft_tokens <= topK * max_draft_len
            from ..plan_exports import trtllm_takes_envelope

            kept = [s for s in fits if trtllm_takes_envelope(s.steps, s.topk, s.budget - 1)]
            if not kept:
                raise TreeoptError("no EAGLE envelope of the calibration profile within the measured T(b, n) meets "
                                   "TensorRT-LLM's rule (max_draft_len <= max_total_draft_tokens <= "
                                   "dynamic_tree_max_topK * max_draft_len)")
            if len(kept) < len(fits):
                notes.append(f"{len(fits) - len(kept)} envelopes left out: TensorRT-LLM's rule refuses them "
                             "(max_draft_len <= max_total_draft_tokens <= dynamic_tree_max_topK * max_draft_len)")
            fits = kept
        value = EnvelopeValue(cal, fits)
        if opts.draft is None and labels.get("drafter") is None:  # the drafter the envelopes were calibrated on
            labels["drafter"] = (getattr(cal, "measured", None) or {}).get("draft")
        done["calibration"] = f"given: {opts.calibration}"
    elif opts.shape == "tree":
        value = _tree_value(opts, profile, acc, ctx, notes)
    else:
        top, k = _draft_limit(opts, profile, ctx)
        if opts.max_draft is None and opts.plan is None and top < DEFAULT_MAX_DRAFT:
            tops = {b: profile.curve(b).max_target_tokens(ctx) for b in opts.batches}
            short = [b for b, t in tops.items() if t == top + 1]
            further = {b: t for b, t in tops.items() if t > top + 1}
            # batch 1 cannot be left out (a plan starts there): then only measuring it further helps
            fix = ("measure T(b, n) further there" if 1 in short else
                   "drop the short sizes from --batches, or measure them further")
            notes.append(f"chains up to K = {k}: the latency profile measured T(b, n) up to n = {top + 1}"
                         + (f" at {batch_sizes_text(short)}, and every batch size is solved over the same K "
                            f"(measured further at {batch_sizes_text(sorted(further))}: up to n = "
                            f"{max(further.values())}; to score longer chains there, {fix})" if further else ""))
        limit = getattr(acc, "depth_limit", None)
        if limit is not None and k > limit:  # Medusa's K heads: a longer chain is cut every step
            notes.append(f"chains up to K = {limit}, not {k}: acceptance profile {acc.id!r} measured a drafter that "
                         f"proposes depths 1..{limit} only (Medusa's {limit} heads)")
            k = limit
        value = ChainValue(acc, k, acceptance_model=opts.acceptance_model)
        notes.append(f"chains valued with the {value.model_used} acceptance model (--acceptance-model "
                     f"{opts.acceptance_model})")
        # a hand-written profile: the agreement of its depths was never tested, so auto keeps the positional model
        if value.model_used == "positional" and opts.acceptance_model == "auto" and \
                len(getattr(acc, "by_depth", {})) >= 2 and getattr(acc, "positional_consistent", False) is None:
            warnings.append(f"acceptance profile {acc.id!r} has per-depth vectors but does not record whether they "
                            "agree (measured.positional_consistent): they are not used; pass --acceptance-model "
                            "by-depth to value chains with them")
        if value.whole_answer_ks:
            notes.append(short_traces_note(value))
    prov = {"latency_profile": profile.id, "acceptance_profile": getattr(acc, "id", None),
            "calibration_profile": str(opts.calibration) if opts.calibration else None,
            "target": labels.get("target"), "batches": list(opts.batches)}
    measured = getattr(acc, "measured", None) or {}  # what run compares with its own (tree_mismatch_warnings)
    prov.update({"temperature": measured.get("temperature"), "weights": measured.get("weights") or None})
    timed_on = profile.device or {}
    if opts.engine == "treeopt" and timed_on.get("type", "cpu") == "cpu":  # run warns at other CPU threads
        prov["threads"] = timed_on.get("threads")
    prov = {k: v for k, v in prov.items() if v is not None}
    # priced cut only where the traces say which answers ran to the cap: one that ends at an EOS the engine could
    # not see coming pays whole steps (the replay knows which; a positional or per-depth profile does not)
    cut = opts.engine in ANSWER_END_CUT_ENGINES and getattr(value, "model_used", None) == "replay"
    timed: list[int] = []  # batch sizes --refine timed besides opts.batches
    if opts.plan is not None:
        sched = load_schedule(opts.plan, profile=profile, context=ctx)  # K past the profile: one line
        warnings.extend(given_plan_warnings(sched.doc, opts.engine, str(opts.plan)))
        solved_for = sched.doc.get("drafter")
        if opts.draft is not None and solved_for and _drafter_label(str(solved_for)) != spec.label:
            warnings.append(f"{opts.plan} was solved for drafter {solved_for}, but --draft is {spec.label}: its "
                            "settings are that drafter's (run warns the same); tune without --plan to solve for this "
                            "one")
        for lo, hi, st in sched.ranges:  # a setting this value model cannot price: named by file, range, option
            if st.speculates and st.shape != value.shape:
                hint = (" (--shape envelope --calibration FILE values envelopes)" if st.shape == "envelope"
                        else " (--shape chain values chains)" if st.shape == "chain"
                        else " (--shape tree values static trees: treeopt's decoder)")
                raise TreeoptError(f"{opts.plan}: batch sizes {lo}-{hi} run {st.label}, {with_article(st.shape)}, but "
                                   f"tune values {value.shape}s here{hint}")
            if st.shape == "chain" and st.draft_tokens > value.max_draft:
                heads = getattr(acc, "depth_limit", None)
                fix = (f"the drafter proposes depths 1..{heads} only (Medusa's {heads} heads): solve the plan for it"
                       if heads is not None and value.max_draft >= heads else
                       "raise --max-draft, or measure longer chains")
                raise TreeoptError(f"{opts.plan}: batch sizes {lo}-{hi} run K = {st.draft_tokens}, past the chains "
                                   f"valued here (K <= {value.max_draft}: {fix})")
            if st.shape == "tree" and st.draft_tokens + 1 > value.budget:
                raise TreeoptError(f"{opts.plan}: batch sizes {lo}-{hi} run {st.label}, {st.draft_tokens + 1} nodes, "
                                   f"past the trees valued here (at most {value.budget}: raise --max-draft, or "
                                   "measure T(b, n) further)")
        ranges = given_plan_ranges(sched.ranges, opts.max_batch, str(opts.plan), notes)
        reach = ranges[-1][1]  # the batch sizes past the given plan are not predicted (a note says which)
        prov["batches"] = [b for b in prov["batches"] if b <= reach]
        plan = plan_from_ranges(ranges, value, profile, opts.batches, context=ctx,
                                output_tokens=opts.output_tokens, answer_end_cut=cut,
                                provenance={**prov, "given_plan": str(opts.plan)})
        done["plan"] = f"given: {opts.plan}"
    elif opts.engine == "tensorrt-llm" and opts.shape == "envelope":  # one dynamic tree per server
        plan = solve_one_setting_plan(value, profile, opts.batches, context=ctx, max_batch=opts.max_batch,
                                      min_gain=opts.min_gain, output_tokens=opts.output_tokens, answer_end_cut=cut,
                                      provenance=prov)
    else:
        def solve(prof: Any, batches: Sequence[int]) -> Any:
            return solve_plan(value, prof, batches, context=ctx, first_is_longest=opts.engine == "tensorrt-llm",
                              min_gain=opts.min_gain, output_tokens=opts.output_tokens, answer_end_cut=cut,
                              max_batch=opts.max_batch, provenance={**prov, "batches": list(batches)})

        plan = solve(profile, opts.batches)
        if more is not None and opts.refine:
            plan, profile, timed = refine_plan(plan, profile, solve, more, opts.refine)
        if timed:
            plan.provenance["refined_batches"] = timed
            notes.append(f"{batch_sizes_text(timed)} solved besides --batches, where neighbouring batch sizes chose "
                         f"different settings (--refine {opts.refine}; timed now or read from an earlier run's: see "
                         "the latency profile's line)")
            warnings += [w for w in falling_cost_warnings(profile, timed, ctx) if w not in warnings]
        if switch_midpoints(plan):
            notes.append(_unplaced_switches(plan, profile, measured_here=more is not None))
    notes.extend(plan.notes)
    notes.extend(guard_notes(plan, opts.engine))
    doc = plan_document(plan, engine=opts.engine, drafter=labels.get("drafter"))
    measured_label = measured.get("draft")  # the acceptance profile's drafter (read above)
    if opts.engine in GPU_ENGINES and opts.draft is not None and measured_label:
        other = measured_drafter(measured_label)
        if other.kind != spec.kind or (spec.kind == "lookup" and other.label != spec.label):
            warnings.append(f"--draft {spec.label}, but the acceptance profile measured {measured_label}: the plan "
                            "is priced on that drafter's acceptance; measure the drafter you serve")
    served = served_drafter(opts, spec, labels.get("drafter"))
    if opts.engine in GPU_ENGINES and not served.entry.engine_methods:  # layer skip: no engine serves it
        who = spec.label if opts.draft is not None else labels.get("drafter")
        warnings.append(f"{opts.engine} serves no {served.kind} drafter ({who}): the export runs --method "
                        f"{opts.method or 'draft_model'} priced on {who}'s acceptance; measure the drafter the engine "
                        "serves")
    # a given plan's method, unless --method or --draft says which drafter is served now
    given = sched.doc.get("method") if opts.plan is not None and opts.method is None and opts.draft is None else None
    method, method_warnings = engine_method(opts.method or given, served, labels.get("drafter"),
                                            origin="--method" if given is None else f"{opts.plan}'s method")
    warnings.extend(method_warnings)
    key = method_key(method)
    if key is not None:  # vLLM's name (--method EAGLE3 is stored as eagle3); a --plan of this file exports with it
        doc["method"] = key
    given_doc = sched.doc if given is not None else {}  # that plan's drafter settings go with its method
    if key != "ngram" and served.kind != "lookup" and _drafting_is_free(profile, ctx):
        warnings.append(f"latency profile {profile.id!r} prices drafting at 0 ms at every batch size (a T(b, n) table "
                        f"without draft_ms), but {method or served.label} runs a drafter: the plan over-speculates; "
                        "add the drafter's c(b, w) as draft_ms (0 is right for n-gram drafting only)")
    elif (key == "ngram" or served.kind == "lookup") and opts.engine in GPU_ENGINES and \
            not _drafting_is_free(profile, ctx):
        warnings.append(f"latency profile {profile.id!r} charges a drafter's c(b, w) (draft_ms), but n-gram drafting "
                        f"runs no model on {opts.engine}: the plan under-speculates if that is a draft model's cost; "
                        "give a table without draft_ms (0) or with the n-gram matcher's own cost")
    lookup = (served.lookup_min, served.lookup_max) if served.kind == "lookup" else None
    if lookup is None and key == "ngram" and isinstance(given_doc.get("lookup"), list) and \
            len(given_doc["lookup"]) == 2:
        lookup = tuple(int(n) for n in given_doc["lookup"])
    model = opts.model or (str(given_doc["draft_model"]) if given_doc.get("draft_model") else None)
    gguf = served.path if opts.draft is not None and served.kind == "model" else None  # a profile's label: no file
    if model is None and opts.engine == "llama.cpp" and gguf is not None and str(gguf).lower().endswith(".gguf"):
        model = os.path.abspath(gguf)  # the draft GGUF tune measured is llama-server's -md (model:X.gguf too);
        # absolute: the command runs from anywhere, and a name starting with '-' is no option
    if model is None and opts.engine in GPU_ENGINES and opts.draft is not None and served.path is not None \
            and key != "ngram" and not str(served.path).lower().endswith(".gguf"):  # a folder the engine can load
        model = os.path.abspath(served.path)
        notes.append(f"the draft checkpoint named is --draft's, {shlex.quote(model)}, as this machine has it: pass "
                     "--model with the path (or Hugging Face id) the engine's machine loads")
    if opts.model is not None and key == "ngram" and opts.engine in GPU_ENGINES:
        warnings.append(f"--model {opts.model} is not used: n-gram drafting ({method}) loads no drafter checkpoint")
    if lookup is not None:
        doc["lookup"] = list(lookup)  # n-gram sizes
    if model is not None:
        doc["draft_model"] = model  # the drafter checkpoint the engine loads (--model)
    settings = None
    if opts.engine != "treeopt":
        target = os.path.abspath(opts.target) if opts.engine == "llama.cpp" and opts.target is not None and \
            str(opts.target).lower().endswith(".gguf") else None  # the GGUF tune measured is llama-server's -m
        settings = export_plan(plan, opts.engine, release=opts.release, method=method,
                               model=model, lookup=lookup, max_batch=opts.max_batch, target=target)
        doc["engine_settings"] = settings.data
        name = str(labels.get("drafter") or "").partition(":")[2] if served.entry.reads_features else \
            str(labels.get("drafter") or "") if served.kind == "model" else ""
        if model is None and name and any("<your" in w for w in settings.warnings):  # the name the profile gives
            where = ((measured.get("weights") or {}).get("draft") or {}).get("path")  # what it read (weights_record)
            notes.append(f"the profile measured {measured.get('draft') or labels.get('drafter')}" + (
                f", read from {where}: --model {shlex.quote(str(where))} where the engine's machine has it there, "
                "else its Hugging Face id" if where else
                f": --model {shlex.quote(name)} if that is the checkpoint's Hugging Face id or path"))
        doc["engine_releases"] = settings.releases
    peers = {}
    if opts.shape == "chain":
        # the peers' rules pick over the batch sizes asked (as their sweeps do), predicted wherever the plan is
        for name, ranges in peer_ranges(plan, value, profile, opts.batches, context=ctx).items():
            peers[name] = {p.batch: p.tokens_per_s_total
                           for p in predict_ranges(ranges, value, profile, sorted({*opts.batches, *timed}), context=ctx,
                                                   output_tokens=opts.output_tokens, answer_end_cut=cut)}
    return TuneResult(plan, doc, settings, done, peers, _check_command(opts, [r.batch for r in plan.rows],
                                                                          labels.get("acceptance_file")), notes,
                      warnings)


def _pair_warnings(opts: TuneOptions, spec: Any, acc: Any, labels: Mapping[str, Any]) -> list[str]:
    """Warnings where the acceptance profile given (-a) measured another pair than the one this run names: the pair
    loaded (treeopt's engine; ``labels``), or, for a GPU engine (nothing loaded), the -t / --draft checkpoints
    given, by name and by their weights' fingerprints (a copy under another folder name is the same model, another
    checkpoint under the profiled one's name is not; a folder with no weight file is compared by name)."""
    from ..errors import CheckpointError
    from ..profiles import measured_differs, warn_on_mismatch, weights_mismatch
    from ..profiles.checks import same_weights
    from .load import model_label, weights_entry

    measured = getattr(acc, "measured", None) or {}
    named = {"target": labels.get("target"), "draft": labels.get("drafter")}
    weights: dict[str, Any] = {}
    if opts.engine in GPU_ENGINES:
        named = {"target": model_label(Path(opts.target)) if opts.target is not None else measured.get("target"),
                 "draft": labels.get("drafter") if spec.path is not None else measured.get("draft")}
        for role, path in (("target", opts.target), ("draft", spec.checkpoint if spec.path else None)):
            if path is None:
                continue
            try:
                weights[role] = weights_entry(Path(path))
            except CheckpointError:  # no weight file: a config for the engine's machine
                pass
    out = warn_on_mismatch(acceptance=acc, target=named["target"], draft=named["draft"], weights=weights or None)
    if weights_mismatch(measured, weights) or any(
            measured_differs(role, measured.get(role), named[role]) and not same_weights(measured, weights, role)
            for role in ("target", "draft")):
        fix = ("drop -a to measure this pair's acceptance" if opts.engine in ("treeopt", "llama.cpp") else
               "profile this pair's acceptance (treeopt profile acceptance) and pass it as -a")
        out.append(f"the plan is for the pair {'loaded' if opts.engine == 'treeopt' else 'named'} here (--target / "
                   f"--draft) but priced on the acceptance of the pair the profile measured: {fix}")
    return out


def _tree_value(opts: TuneOptions, profile: Any, acc: Any, ctx: int | None, notes: list[str]) -> Any:
    """``--shape tree``: the :class:`~sequoia_opt.solver.schedule.TreeValue` of the hardware-aware tree per batch
    size, its budget the most tokens every batch size's curve measured (at most ``--max-draft`` + 1; without it, 9
    nodes, or all the curves measured for a ``--plan``), its branching the candidates the acceptance profile ranked.

    Raises:
        TreeoptError: an acceptance profile of one candidate per position (a chain's: every tree would be a chain),
            a profile that measured T(b, n) at n = 1 only, a ``--max-draft`` past what it measured.
    """
    from ..solver.schedule import TreeValue

    width = acc.width
    if width < 2:  # only a given one gets here: a saved one of width 1 is measured anew (_acceptance's misfit)
        raise TreeoptError(f"--shape tree: acceptance profile {acc.id!r} ranked one candidate per position (a chain's "
                           "profile): a tree needs the acceptance of its k-th ranked candidates; measure it with "
                           "treeopt profile acceptance --width 4 (or drop -a: tune measures it)")
    _, k = _draft_limit(opts, profile, ctx)
    # max_depth: at most Medusa's K heads
    value = TreeValue(acc, budget=k + 1, max_depth=acc.capped_depth(k), max_branching=min(width, 16))
    notes.append(f"trees of up to {k + 1} nodes (root included) valued positionally: p_1..p_{width} of the "
                 f"{width} ranked candidates the acceptance profile measured")
    return value


def _draft_limit(opts: TuneOptions, profile: Any, ctx: int | None) -> tuple[int, int]:
    """``(top, k)`` for chains and trees: ``top`` the most drafted tokens every batch size's T(b, n) prices (its
    largest n - 1), ``k`` the most a setting drafts here (``--max-draft``; a given plan is priced as far as the
    profile measured, so a plan solved with ``--max-draft 14`` is predicted again without it; else ``top``, at most
    :data:`DEFAULT_MAX_DRAFT`).

    Raises:
        TreeoptError: T(b, n) measured at n = 1 only ("speculation pays nowhere" would be a verdict on nothing, and
            remove a working setting); ProfileError: a ``--max-draft`` past what the profile measured (checked
            before the DP is sized for it: --max-draft 20000 would ask 800M table entries).
    """
    from ..solver.schedule import check_draft_measured, max_draft_measured

    top = max_draft_measured(profile, opts.batches, ctx)
    if top < 1:
        raise TreeoptError(f"latency profile {profile.id!r} measured T(b, n) at n = 1 only (at some batch size): "
                           f"a {opts.shape} of K drafts is verified in T(b, K + 1), so no {opts.shape} can be priced; "
                           f"measure n = 1 up to the longest draft + 1 (1..{DEFAULT_MAX_DRAFT + 1}) at every batch size")
    if opts.max_draft is not None:
        check_draft_measured(opts.max_draft, profile, opts.batches, ctx)
    k = opts.max_draft if opts.max_draft is not None else top if opts.plan is not None else min(DEFAULT_MAX_DRAFT, top)
    return top, k


def refine_plan(plan: Any, profile: Any, solve: Callable[[Any, Sequence[int]], Any],
                more: Callable[[Sequence[int]], Any], rounds: int) -> tuple[Any, Any, list[int]]:
    """Bisect the plan's switches on the batch size (``tune --refine``): up to ``rounds`` times, time T(b, n) at
    :func:`~sequoia_opt.solver.schedule.switch_midpoints` (``more(batches)`` -> the profile with them) and solve
    again over every batch size timed (``solve(profile, batches)`` -> a plan). Stops early when every switch lies
    between consecutive batch sizes. A switch between a and b with b - a = 2^r is placed exactly in r rounds when
    the best setting changes once between them.

    Returns ``(plan, profile, the batch sizes timed here, ascending)``. Raises what ``more`` and ``solve`` raise
    (the profiler's and :func:`~sequoia_opt.solver.schedule.solve_plan`'s errors).
    """
    from ..solver.schedule import switch_midpoints

    timed: list[int] = []
    for _ in range(rounds):
        mids = switch_midpoints(plan)
        if not mids:
            break
        profile = more(mids)
        timed += mids
        plan = solve(profile, sorted({*(r.batch for r in plan.rows), *mids}))
    return plan, profile, sorted(timed)


def batch_sizes_text(bs: Sequence[int]) -> str:
    """``batch size 3`` / ``batch sizes 3, 12``."""
    return f"batch size{'s' if len(bs) > 1 else ''} {', '.join(map(str, bs))}"


def _unplaced_switches(plan: Any, profile: Any, *, measured_here: bool) -> str:
    """One note naming the switches of ``plan`` that no solved batch size between them placed
    (:func:`~sequoia_opt.solver.schedule.unplaced_switches`) and how to place them: ``--refine`` (tune times them),
    a batch size the profile already has between the two (add it to ``--batches``), else the midpoint to add to a
    given profile or table."""
    from ..solver.schedule import unplaced_switches

    spans, in_profile, to_time = [], [], []
    for lo, hi in unplaced_switches(plan):
        between = (f"batch size {lo.batch + 1} runs" if hi.batch - lo.batch == 2
                   else f"batch sizes {lo.batch + 1}-{hi.batch - 1} run")
        spans.append(f"{between} batch {lo.batch}'s {lo.best.setting.label}, {hi.batch} runs {hi.best.setting.label}")
        mid = (lo.batch + hi.batch) // 2
        have = [b for b in profile.batches if lo.batch < b < hi.batch]
        if have:  # the profile measured one between: the nearest the midpoint
            in_profile.append(min(have, key=lambda b: (abs(b - mid), b)))
        else:
            to_time.append(mid)
    how = []
    if in_profile:
        how.append(f"add {','.join(map(str, in_profile))} to --batches: the latency profile has "
                   f"{'them' if len(in_profile) > 1 else 'it'}")
    if to_time:
        how.append(f"--refine with more rounds, or add {','.join(map(str, to_time))} to --batches" if measured_here
                   else f"add {batch_sizes_text(to_time)} to the latency profile or table")
    return (f"switches not placed: {'; '.join(spans)}; the best setting changes somewhere between, and T(b, n) "
            f"there was not solved ({'; '.join(how)})")


def given_plan_warnings(doc: Mapping[str, Any], engine: str, name: str) -> list[str]:
    """One line when a given plan (``tune --plan``) was solved under a rule of another engine than ``engine``, which
    it keeps when exported as it is: TensorRT-LLM's (no batch size drafts more than the smallest, ``first_is_longest``;
    a dynamic tree, one envelope for every batch size). Such a plan is valid for ``engine`` but may be worse than one
    solved for it. A plan of another engine without such a rule (a vLLM chain plan given to SGLang) says nothing:
    its ranges are the same settings there."""
    solved_for = doc.get("engine")
    if solved_for == engine or solved_for != "tensorrt-llm":
        return []
    rule = ("no batch size drafts more than the smallest" if doc.get("first_is_longest") else
            "one dynamic tree for every batch size" if doc.get("shape") == "envelope" else None)
    if rule is None:
        return []
    return [f"{name} was solved for tensorrt-llm under its rule ({rule}), which {engine} does not have: re-solve it "
            f"for {engine} (tune --engine {engine} without --plan) to choose per batch size from what it runs"]


def falling_cost_warnings(profile: Any, batches: Sequence[int], context: int | None, drop: float = 0.1) -> list[str]:
    """One line per batch size whose verify cost T(b, n) falls more than ``drop`` below T(b, 1) at some n > 1: a
    forward over more tokens costs at least as much as over one, so such a table is mis-measured (timer noise, a
    warm-up in the first row) or mis-typed (swapped columns), and the plan would draft as far as the table lets it
    for free. A fall below ``IMPLAUSIBLE_FRACTION`` x T(b, 1) is left to the profile loader's own warning
    (:meth:`~sequoia_opt.profiles.latency.LatencyCurve.implausible_points`). ``profile``: a batch latency profile;
    ``context``: tokens of context, as the plan reads the curves (None: the smallest measured); ``drop``: a
    fraction of T(b, 1)."""
    from ..profiles import IMPLAUSIBLE_FRACTION

    out = []
    for b in batches:
        curve = profile.curve(b)
        t1 = curve.target_ms(1, context)  # the table the plan reads (context None: the smallest measured)
        top = curve.max_target_tokens(context)  # two contexts' tables mixed: n up to the shorter grid's end
        low = min(((float(curve.target_ms(n, context)), int(n)) for n in curve.target_tokens(context)
                   if 1 < n <= top), default=None)
        if low is not None and IMPLAUSIBLE_FRACTION * t1 <= low[0] < (1 - drop) * t1:  # below: the loader warns
            out.append(f"latency profile {profile.id!r}, batch {b}: T(b, n = {low[1]}) = {low[0]:.3g} ms is below "
                       f"T(b, 1) = {t1:.3g} ms; a forward over more tokens does not cost less, so check the "
                       "measurement (the plan trusts it)")
    return out


def served_drafter(opts: TuneOptions, spec: Any, measured: str | None) -> Any:
    """The drafter the engine will serve, as a :class:`~sequoia_opt.drafting.registry.DrafterSpec`: ``--draft``'s,
    or, for a GPU engine given only an acceptance profile (``--draft`` unset), the drafter that profile measured
    (its label: ``lookup:1-3``, ``eagle3:NAME``, ``self:6``; a path is a draft model). Nothing is loaded."""
    if opts.draft is not None or not measured:
        return spec
    return measured_drafter(measured)


def _drafter_label(label: str) -> str:
    """A file's drafter label as ``--draft`` would name it (``lookup`` -> ``lookup:1-3``); the label itself where it
    names no drafter treeopt parses."""
    try:
        return measured_drafter(label).label
    except TreeoptError:
        return label


def measured_drafter(measured: str) -> Any:
    """The :class:`~sequoia_opt.drafting.registry.DrafterSpec` of a profile's drafter label (``lookup:1-3``,
    ``eagle3:NAME``, ``self:6``; a path is a draft model). Nothing is loaded.

    Raises:
        TreeoptError: a lookup label out of range (as ``--draft`` would be), naming the profile's field."""
    from ..drafting.registry import DRAFTERS, DrafterSpec, parse_drafter_spec

    head, _, arg = str(measured).partition(":")
    if head == "lookup":
        try:
            return parse_drafter_spec(measured)
        except TreeoptError as err:  # the profile's label, not a --draft the user typed
            why = str(err).split(": ", 1)[-1]
            raise TreeoptError(f"the acceptance profile's measured.draft {measured!r}: {why}") from None
    if head in DRAFTERS and head != "model":
        return DrafterSpec(head)  # its kind is all the export needs (a head's checkpoint is the engine's)
    return DrafterSpec("model", Path(arg if head == "model" else measured))


def _drafting_is_free(profile: Any, context: int | None) -> bool:
    """Whether ``profile`` charges nothing for drafting at any batch size it measured (c(b, w) = 0 at the smallest
    and the largest w: the costs are >= 0 and a table either has the column or not): what a T(b, n) table without
    a draft_ms column reads as."""
    try:
        return all(c.draft_ms(1, context) == 0 and c.draft_ms(c.max_draft_tokens(context), context) == 0
                   for c in (profile.curve(b) for b in profile.batches))
    except ProfileError:  # no draft curve at all: not a table that left the column out
        return False


def engine_method(method: str | None, served: Any, measured: str | None,
                  origin: str = "--method") -> tuple[str | None, list[str]]:
    """vLLM's ``method`` name for the export (each export maps it to its engine's own) and a warning where
    ``--method`` names another kind of drafter than the one whose acceptance the plan is priced on.

    A draft model is ``draft_model`` (SGLang ``STANDALONE``, TensorRT-LLM ``Draft_Target``), lookup ``ngram``, a
    feature head its engines' own method (``eagle3``, ``eagle``, ``medusa``): the kind's ``engine_methods``.
    A kind no engine serves (``self:L``) leaves the choice to ``--method`` (None: the export's default).
    ``origin`` names where ``method`` came from, for the warning (``--method``, or a given plan file).
    """
    from ..plan_exports import method_key

    own = served.entry.engine_methods.get("vllm")
    if method is None:
        return own, []
    if own is not None and method_key(method) != own:  # another kind, or another head (an EAGLE-3 head as medusa)
        who = measured or served.label
        return method, [f"{origin} {method}, but the plan is priced on the acceptance of {who} (served as {own}): "
                        f"the drafter the engine serves accepts differently; measure that drafter's acceptance, or "
                        f"pass --method {own}"]
    return method, []


def _check_command(opts: TuneOptions, batches: Sequence[int], acceptance_file: Path | None = None) -> str:
    """The command that checks the plan on this machine (llama.cpp, treeopt: a benchmark of this checkout) or on the
    GPU (the engine's own benchmark), ``PLAN.yaml`` / ``OUT`` / ``HELD_OUT_REQUESTS.jsonl`` standing for files the
    CLI names. ``acceptance_file``: the acceptance profile the plan was priced on (a tree plan's check predicts
    with it; default ``opts.acceptance``)."""
    bs = ",".join(map(str, batches))
    if opts.engine in ("llama.cpp", "treeopt"):
        draft = "".join(f" {flag} {shlex.quote(str(v))}" for flag, v in (("--target", opts.target),
                                                                           ("--draft", opts.draft)) if v)
        if opts.shape == "tree":  # the plan's trees against plain batched decoding, at each batch size
            acc = acceptance_file if acceptance_file is not None else opts.acceptance
            given = f" --acceptance {shlex.quote(str(acc))}" if acc is not None else ""
            served = "" if opts.prompts is None else " --prompts HELD_OUT_REQUESTS.jsonl"
            return (f"python benchmarks/batch.py{draft}{given} --plan PLAN.yaml --batches {bs}{served} --threads "
                    f"{opts.threads} --context {opts.context} --out results/batch/tree-plan.json")
        # the demo's profile prompts: the benchmark's eval workload (its requests are held out from them); a user's:
        # a sample of their traffic the profile did not see
        served = (" --workload eval" if opts.prompts is None
                  else f" --profile-file {opts.prompts} --requests HELD_OUT_REQUESTS.jsonl")
        return (f"python benchmarks/schedules.py --engine {opts.engine}{draft} --plan PLAN.yaml --batches {bs}{served}"
                f" --threads {opts.threads}")
    return {"vllm": "on the GPU, per range: vllm bench throughput --model MODEL --speculative-config \"$(cat OUT)\" "
                    "--max-num-seqs B (and each fixed K beside it)",
            "sglang": "on the GPU: python -m sglang.bench_offline_throughput --model-path MODEL <cli_flags> at each "
                      "--max-running-requests B (and each fixed --speculative-num-steps beside it)",
            "tensorrt-llm": "on the GPU: trtllm-bench --model MODEL throughput --extra_llm_api_options OUT at each "
                            "--concurrency B (and each fixed max_draft_len beside it)"}[opts.engine]


def _given_inputs(opts: TuneOptions, spec: Any, done: dict[str, str], progress: ProgressFn | None):
    """The T(b, n) and acceptance the user gave (a GPU engine's, or llama.cpp's with both given: nothing is
    measured, no model is loaded), labelled with the pair the acceptance profile measured (``--draft`` names the
    drafter's kind where given)."""
    profile, _ = _latency(opts, done, None, None)
    acc, labels = None, {"target": None, "drafter": spec.label if opts.draft is not None else None}
    if opts.acceptance is not None:
        acc = _acceptance(opts, Path(opts.acceptance), done, lambda: None)
        measured = getattr(acc, "measured", None) or {}
        labels = {"target": measured.get("target"),
                  "drafter": measured.get("draft") if opts.draft is None else spec.label}
    return profile, acc, labels, None


def _llamacpp_inputs(opts: TuneOptions, spec: Any, done: dict[str, str], progress: ProgressFn | None,
                     stack: ExitStack):
    """llama.cpp's T(b, n) and acceptance, measured here when missing; a draft model converted to a GGUF lives in a
    temporary folder ``stack`` removes (when tune returns: ``--refine`` times more batch sizes after the solve)."""
    import tempfile

    import torch

    from ..engines.llamacpp import resolve_pair

    if opts.latency is not None and opts.acceptance is not None:  # nothing to measure: llama.cpp need not load
        return _given_inputs(opts, spec, done, progress)
    torch.set_num_threads(1)  # torch only picks argmaxes here; llama.cpp runs the forwards on its own threads
    lookup = spec.kind == "lookup"
    work = stack.enter_context(tempfile.TemporaryDirectory(prefix="treeopt-tune-"))  # a draft model as a GGUF
    return _llamacpp_measured(opts, spec, done, progress, resolve_pair(
        opts.target, None if lookup else opts.draft, Path(work), need_draft=not lookup))


def _llamacpp_measured(opts: TuneOptions, spec: Any, done: dict[str, str], progress: ProgressFn | None, pair: Any):
    """:func:`_llamacpp_inputs` on a resolved pair of GGUFs."""
    from ..device import device_slug
    from ..engines.llamacpp import (LlamaCppModel, generate, measure_acceptance, profile_latency_batch,
                                    server_prompt_ids)
    from ..jobs.load import pair_slug, weights_record
    from ..prompts import demo_prompts_path, load_prompts

    lookup = spec.kind == "lookup"
    dlabel = spec.label if lookup else pair.draft_label
    slug = pair_slug(pair.target_label, dlabel)
    want_k = opts.max_draft or DEFAULT_MAX_DRAFT

    def measure(batches: Sequence[int]) -> Any:
        return profile_latency_batch(pair.target, None if lookup else pair.draft, batches,
                                     contexts=[opts.context], token_counts=token_grid(want_k),
                                     draft_token_counts=[1, 2], n_threads=opts.threads, rounds=opts.rounds,
                                     paired=True, max_repeats=10, max_seconds=3.0, progress=progress,
                                     target_name=pair.target_label, draft_name=dlabel,
                                     lookup=(spec.lookup_min, spec.lookup_max) if lookup else None)

    def measure_acc() -> Any:
        pfile = opts.prompts or demo_prompts_path("profile")
        plist = load_prompts(pfile, limit=opts.num_prompts)
        # raw and chat prompts tokenized by llama.cpp as llama-server does (server_prompt_ids): BOS where the file
        # adds it, chat prompts rendered with the GGUF's template, any vocabulary llama.cpp runs (SentencePiece too)
        ids = server_prompt_ids(pair.target, plist, model=pair.target_label)
        n_ctx = max(len(p) for p in ids) + opts.max_new_tokens + 8  # the longest prompt and its answer
        with LlamaCppModel(pair.target, n_ctx=n_ctx, n_threads=opts.threads) as tm:
            eos = tm.eog_ids()  # answers end where llama-server ends them: no acceptance measured past their end
            if lookup:
                conts = [generate(tm, p, opts.max_new_tokens, eos_ids=eos).tokens for p in ids]
                traces = lookup_traces(ids, conts, tm.n_vocab, spec.lookup_min, spec.lookup_max)
            else:
                with LlamaCppModel(pair.draft, n_ctx=n_ctx, n_threads=opts.threads) as dm:
                    _, traces = measure_acceptance(tm, dm, ids, opts.max_new_tokens, eos_ids=eos,
                                                   progress=progress)
        return acceptance_from_traces(traces, profile_id=f"{slug}_greedy_llama.cpp", target_name=pair.target_label,
                                      draft_name=dlabel, max_depth=want_k, prompts_file=str(pfile),
                                      max_new_tokens=opts.max_new_tokens,
                                      source="measured by treeopt tune --engine llama.cpp (teacher-forced on "
                                             "llama.cpp's greedy output)")

    default = opts.profiles_dir / device_slug("cpu") / f"{slug}-llama.cpp-latency-batch.yaml"
    weights = weights_record(opts.target, None if lookup else spec)  # the checkpoints named, not the GGUFs
    profile, more = _latency(opts, done, default, measure, weights)
    acc = _acceptance(opts, opts.profiles_dir / slug / "acceptance-greedy-llama.cpp-chains.yaml", done, measure_acc,
                      weights)
    return profile, acc, {"target": pair.target_label, "drafter": dlabel}, more


def check_batch_memory(config: Any, batch: int, positions: int, tokens: int, device: Any) -> None:
    """Refuse, before timing, a batch size whose forwards cannot fit in memory: ``batch`` rows of a KV cache of
    ``positions`` tokens (float32 keys and values of every layer) and the logits of ``tokens`` tokens per row
    (float32 over the vocabulary; the verifier keeps about three such arrays: logits, probabilities, a copy).
    ``--batches 1,100000`` timed for minutes, growing, before anything said so.

    Raises:
        TreeoptError: one line with the estimate and the free memory (:func:`~sequoia_opt.device.free_memory_bytes`).
    """
    from ..device import free_memory_bytes

    kv = 2 * config.n_layers * config.n_kv_heads * config.head_dim * 4 * positions
    need = batch * (kv + 3 * tokens * config.vocab_size * 4)
    free = free_memory_bytes(device)
    if free is not None and need > free:
        raise TreeoptError(f"--batches: timing batch size {batch} needs about {need / 2**30:.1f} GiB (a KV cache of "
                           f"{positions} tokens and the logits of {tokens} tokens per row), and {device} has "
                           f"{free / 2**30:.1f} GiB free: lower the largest batch size (or --context, --max-draft)")


def _treeopt_inputs(opts: TuneOptions, spec: Any, done: dict[str, str], progress: ProgressFn | None):
    """treeopt's T(b, n) (the batched decoder) and acceptance (its verifier), measured here when missing."""
    import torch

    from ..device import device_slug
    from ..jobs.load import default_acceptance_path, default_chain_acceptance_path, load_pair
    from ..profiling.acceptance import (build_acceptance_profile, can_teacher_force, measure_acceptance,
                                        record_depth_limit)
    from ..profiling.batch import profile_batches
    from ..profiling.latency import method_text
    from ..prompts import demo_prompts_path, encode_prompts, load_prompts

    torch.set_num_threads(opts.threads)
    dev = torch.device("cpu")
    pair = load_pair(opts.target, spec, device=dev, dtype=torch.float32)
    slug = pair.slug
    want_k = opts.max_draft or DEFAULT_MAX_DRAFT
    # encoded before any timing: prompts this target cannot read (chat lines without its chat template, a template
    # refusing a conversation) are one line, exit 2, not an error after minutes of T(b, n)
    pfile = opts.prompts or demo_prompts_path("profile")
    ids = encode_prompts(load_prompts(pfile, limit=opts.num_prompts), pair.tokenizer, model=pair.target_name)
    from ..profiling.batch import request_contexts, row_contexts

    # a batch's rows spread as the requests' contexts (the served prompts' lengths where given, else these prompts')
    lengths = opts.request_lengths if opts.request_lengths is not None else [len(x) for x in ids]
    opts.requests = request_contexts(lengths, opts.output_tokens or opts.max_new_tokens) \
        if opts.rows == "spread" else None

    def measure(batches: Sequence[int]) -> Any:
        grid = token_grid(want_k)
        from ..profiling.steps import check_loop_fits, loop_positions

        longest = row_contexts(opts.context, max(batches), opts.requests)[-1]  # a spread batch's longest row
        positions = pair.target.config.max_position_embeddings
        uniform_fits = loop_positions(opts.context, max(grid)) <= positions  # --rows uniform alone would do
        check_loop_fits(opts.context, max(grid), positions, model=pair.target_name,
                        fixes=f"--max-draft (chains up to K = {want_k} here)"
                        + (", or --rows uniform" if longest > opts.context and uniform_fits else ""), longest=longest)
        check_batch_memory(pair.target.config, max(batches), longest + max(grid), max(grid), dev)
        model = pair.spec.kind == "model"  # else c(b, w) on the drafter's cost probe (a head, self layer-skip)
        # a chain's pass drafts all K; a chain's level, one token; a tree's level, up to TREE_WIDTHS
        widths = grid if pair.cost_model == "one-pass" else tree_widths(want_k) if opts.shape == "tree" else [1, 2]
        return profile_batches(pair.target, pair.draft if model else None, batches, grid, widths, [opts.context],
                               target_name=pair.target_name, draft_name=pair.draft_name,
                               profile_id=f"{device_slug(dev)}_{slug}_float32_batch", device=dev, dtype=torch.float32,
                               method=method_text(opts.rounds, True, grid), progress=progress, rounds=opts.rounds,
                               paired=True, command="treeopt tune --engine treeopt", min_repeats=3, max_repeats=10,
                               max_seconds=3.0, loop="chain" if opts.shape == "chain" else "static",
                               loop_drafter=pair.new_drafter, draft_probe=None if model else pair.cost_probe(),
                               draft_cost_model=pair.cost_model, requests=opts.requests)

    chains = opts.shape == "chain" and can_teacher_force(pair.new_drafter())

    def measure_acc() -> Any:
        return record_depth_limit(measure_acc_counts(), pair.new_drafter())  # Medusa's heads: chains stop there

    def measure_acc_counts() -> Any:
        if chains:  # along the target's greedy output, every start seen (chain_traces)
            return measure_chain_acceptance(pair, ids, prompts_file=str(pfile), max_new_tokens=opts.max_new_tokens,
                                            max_depth=want_k, command="treeopt tune --engine treeopt",
                                            progress=progress)
        depth = min(want_k, 8)
        counts = measure_acceptance(pair.target, pair.new_drafter, ids, width=8, depth=depth,
                                    max_new_tokens=opts.max_new_tokens, eos_ids=sorted(pair.tokenizer.eos_ids),
                                    progress=progress)
        return build_acceptance_profile(
            counts, profile_id=f"{slug}_greedy", target_name=pair.target_name, draft_name=pair.draft_name,
            temperature=0.0, top_p=1.0, depth=depth, device="cpu", dtype="float32", prompts_file=str(pfile),
            num_prompts=len(ids), max_new_tokens=opts.max_new_tokens, seed=0, draft_cost_model=pair.cost_model,
            command="treeopt tune --engine treeopt")

    profile, more = _latency(opts, done, opts.profiles_dir / device_slug(dev) / f"{slug}-latency-batch.yaml", measure,
                             pair.weights)
    default = (default_chain_acceptance_path if chains else default_acceptance_path)(pair.target_name, pair.spec)
    files: dict[str, Path] = {}
    acc = _acceptance(opts, opts.profiles_dir / default.relative_to("profiles"), done, measure_acc, pair.weights,
                      files)
    # the file the plan was priced on: the check command reads the same one
    return profile, acc, {"target": pair.target_name, "drafter": pair.draft_name,
                          "acceptance_file": files["acceptance"]}, more
