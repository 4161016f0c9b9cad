"""Speculation plans measured the way engines use them (issue 29): at each batch size every fixed draft length K
in 0..8 and the plan's choice on the same prompts, and a stream of requests whose concurrency rises 1 -> 16 -> 1
served with the plan against every fixed K; the peers' rules side by side on the same measurements.

One run = one engine (treeopt's own decoder, or llama.cpp with parallel sequences through its batch API) and one
workload with its drafter:

* ``eval`` — the demo's held-out code prompts (``sequoia_opt/data/prompts/eval.jsonl``, cut to their last
  ``--max-prompt-tokens``), drafted by the bundled draft model;
* ``edit`` — editing requests whose answers copy long runs of the prompt (``benchmarks/data/edit-eval.jsonl``,
  ``benchmarks/make_edit_prompts.py``), drafted by n-grams (prompt lookup).

Or your own traffic: ``--requests FILE`` (the requests served; a sample the profile did not see) and
``--profile-file FILE`` (what ``tune`` profiled on), with ``--plan`` the plan ``treeopt tune`` wrote (the check
command it prints).

Steps, in one machine state: ``treeopt tune`` measures T(b, n), c(b, w), the overhead per batch size and the
drafter's acceptance (on ``--profile-prompts`` of the workload's *profile* prompts, never the eval ones, each
answered to ``--profile-new-tokens``: by default the requests' own length, as a user profiles on the traffic they
serve; the first tokens of an answer accept differently from later ones; ``--extra-profile-prompts
benchmarks/data/code-heldout.jsonl`` pools 99 more code prompts of the same kind after them, so that
``--profile-prompts 131`` reads the acceptance on four times the prompts: at 32 the profile's own error between
prompt sets is as large as the 10 % the prediction is judged by) and solves the plan, timing T(b, n) at the
midpoint where two neighbouring ``--batches`` choose different K (``--refine``, tune's default 1 round: on 1, 2, 4,
8, 16 that is 3 and 12 for the demo pair; those batch sizes are measured below like the others, the peers' rules
still choosing over ``--batches`` as their sweeps do); then for each batch size b, ``--rounds`` rounds serve
max(16, 2 b) eval requests at a steady concurrency of b with every fixed K
(continuous batching: a finished row's slot takes the next request; only the steps with b live rows are timed, as a
server at concurrency b runs them; the rate is the steady state's, :func:`steady_rate`); then the stream
(``--stream-requests`` requests of ``--stream-tokens`` tokens;
``--stream-shape``: ``ramp``, after step s the batch is refilled up to min(P, s + 1) live rows while requests
remain, P the ``--stream-peak`` (16), so most of its tokens are served at P rows; ``triangle``, the i-th request of
N (0-based) joins once fewer than ``1 + round((P - 1) (1 - |2 i / (N - 1) - 1|))`` rows are live, so the
concurrency climbs 1 -> P over the first half of the requests and falls back over the second, and every level
admits about the same number of requests (:func:`stream_concurrency`)) with every fixed K, the plan and vLLM's
rule, in ``--stream-rounds`` rounds (default ``--rounds``), each serving the requests in its own order (the
given order in the first round, then shuffled per round, the same for every setting of the round: the few requests
that arrive first and leave last run alone or nearly, a sixth of the stream's time on a triangle of 64 requests,
and in one fixed order those four or five requests' own acceptance decided a comparison of two settings that
differ only there; the tokens are compared in request order). Within a round the settings run in lockstep,
``--block-steps`` steps each in turn (in the given order in the first round, then shuffled per round:
:func:`round_order`), so every setting is timed in the same seconds of this VM's drifting speed. Greedy output is
checked token for token: every run against plain decoding of the same requests. Decode time excludes
prefill (the first rows' and the joiners'); the stream's wall time includes the joiners'.

Peers, on the same measurements: vLLM's ``generate_config.py`` rule (at each batch size the best *measured* of K in
{1, 3, 5}), SGLang's default EAGLE envelope (5, 4, 8) as a chain of its 5 steps, llama.cpp's default draft length
(3, ``common/common.h``), and the batch-1 best K (measured) everywhere.

    flock /tmp/treeopt-bench.lock python benchmarks/schedules.py --engine llama.cpp --workload edit
    flock /tmp/treeopt-bench.lock python benchmarks/schedules.py --engine treeopt --workload eval

Sizes: the defaults (K 0..8 at batch 1, 2, 4, 8, 16, 16 new tokens, max(16, 2 b) requests per batch size, 3 rounds;
a stream of 40 requests x 12 tokens) reach 16 live rows and give each K three rounds. Why three: every round builds
fresh decoders, and a decoder instance keeps its speed (the 2-token chain step's ratio to plain ranged 1.07-1.24
over 10 rounds at batch 1, sd 0.047; ``round_rel_se`` in ``sequoia_opt/profiling/steps.py``), so two rounds leave
each K's rate 3-4 % from its mean, as wide as the gaps between K = 1..5 at batch 1. Why 40 requests: with 20 x 8
the stream was 18 steps long and never passed 11 live rows. Why at least 16 requests at every batch size: with 4 at
batch 1 (two editing functions) the rate measured was those two functions', not the workload's that the plan is
predicted for; now batch sizes 1-8 serve the same 16 requests, and 16 serves 32. With nothing else running,
``--engine llama.cpp --workload eval --stream-requests 20 --stream-tokens 8`` took 58 min (``tune`` 17, timing the
loop's step at every batch size with the draft GGUF; batch 16 alone 17); ``--engine treeopt --workload eval
--turnovers 2 --stream-requests 20 --stream-tokens 8`` took 41 min (``tune`` 22, its loop timed to 2 %). The editing answers copy the function after a short
preamble, so 16 tokens understate what n-grams accept (``--new 48`` matches the profile's 48, at 3x the time).

The plan re-ranked during the run (``plan-live``, :class:`~sequoia_opt.drafting.policies.AdaptiveSchedulePolicy`):
beside the fixed K, every batch size and the stream also run the plan whose ranges are re-ranked every
``--live-every`` steps from the acceptance the served requests show (each round starts it afresh from the plan
and the profile's prior, so its learning is paid inside the timed steps); its regret and stream figures are
reported beside the static plan's (``--no-live`` skips it).

Where the plan's error comes from (treeopt's decoder): the served requests are teacher-forced and the plan re-solved
from their own acceptance with the run's latency profile (:func:`served_acceptance`); ``--reanalyze RUN.json``
does it for a finished run.

Writes ``results/schedules/<date>-<engine>-<workload>.json`` (and the run's profiles and plan beside it) and
prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from sequoia_opt._io import atomic_write_text, create_files, new_run_id
from sequoia_opt.errors import ProfileError
from sequoia_opt.decoding import Decoder
from sequoia_opt.drafting.drafters.lookup import PromptLookupDrafter
from sequoia_opt.drafting.policies import AdaptiveSchedulePolicy, PlanAdapter, SchedulePolicy, StaticTreePolicy
from sequoia_opt.drafting.policies.adaptive import DEFAULT_EVERY, DEFAULT_WINDOW
from sequoia_opt.jobs.tune import TuneOptions, tune
from sequoia_opt.plan_exports import LLAMACPP_DEFAULT_DRAFT, SGLANG_DEFAULT_ENVELOPE, VLLM_GENERATOR_KS
from sequoia_opt.profiles.batch import parse_batches
from sequoia_opt.profiling.batch import request_contexts, row_contexts
from sequoia_opt.prompts import PromptFileError, demo_prompts_path, encode_prompts, load_prompts
from sequoia_opt.solver.schedule import save_schedule
from sequoia_opt.tree import Tree, now_iso

ROOT = Path(__file__).resolve().parents[1]
LIVE = "plan-live"  # the plan re-ranked during the run from the live acceptance (AdaptiveSchedulePolicy)
WORKLOADS = {"eval": (ROOT / "sequoia_opt/data/prompts/eval.jsonl", ROOT / "sequoia_opt/data/prompts/profile.jsonl", None),
             "edit": (ROOT / "benchmarks/data/edit-eval.jsonl", ROOT / "benchmarks/data/edit-profile.jsonl", "lookup")}


# ---------------------------------------------------------------------------------------------- engines
class Engine:
    """Makes a decoder for b rows with a fixed chain, a plan, or none; one per (engine, drafter)."""

    def __init__(self, name: str, draft: str | None, threads: int, max_len: int, target: str | None = None) -> None:
        self.name, self.lookup, self.max_len = name, draft == "lookup", max_len
        if name == "treeopt":
            from sequoia_opt.jobs.load import load_pair

            self.pair = load_pair(target, draft, device=torch.device("cpu"), dtype=torch.float32)
            self.tokenizer = self.pair.tokenizer
            self.vocab = self.pair.vocab_size
        else:
            import tempfile

            from sequoia_opt.engines.llamacpp import resolve_pair

            work = Path(tempfile.mkdtemp(prefix="treeopt-sched-"))
            self.gguf = resolve_pair(target, None if self.lookup else draft, work, need_draft=not self.lookup)
            from sequoia_opt.model.gguf_loader import open_gguf, tokenizer_from_gguf

            self.tokenizer = tokenizer_from_gguf(open_gguf(self.gguf.target))  # the GGUF's own, no weights
            self.vocab = self.tokenizer.vocab_size
            self.threads = threads
            self._ctx: dict[int, Any] = {}

    def _contexts(self, rows: int, slot: int = 0):
        """llama.cpp contexts of ``rows`` sequences (a KV cache per sequence), made once per (row count, slot): the
        settings of one lockstep comparison each need their own (a context's cache holds one decoder's rows)."""
        from sequoia_opt.engines.llamacpp import LlamaCppModel

        if (rows, slot) not in self._ctx:
            cfg = dict(n_ctx=self.max_len * rows, n_threads=self.threads, n_seq_max=rows, kv_unified=False)
            tm = LlamaCppModel(self.gguf.target, **cfg)
            dm = None if self.lookup else LlamaCppModel(self.gguf.draft, **cfg)
            self._ctx[rows, slot] = (tm, dm)
        return self._ctx[rows, slot]

    def release(self) -> None:
        """Drop the llama.cpp contexts made so far (each batch size's set is used once)."""
        if self.name != "treeopt":
            self._ctx.clear()

    def drafter(self, rows: int, slot: int = 0):
        if self.lookup:
            return PromptLookupDrafter(self.vocab)
        if self.name == "treeopt":
            return self.pair.new_drafter()
        from sequoia_opt.engines.llamacpp import LlamaCppDrafter

        tm, dm = self._contexts(rows, slot)
        return LlamaCppDrafter(dm, tm.n_vocab)

    def decoder(self, rows: int, k: int | None = None, ranges: list[tuple[int, int, int]] | None = None,
                slot: int = 0, live: Any = None) -> Decoder:
        """A decoder of up to ``rows`` rows drafting a fixed chain of ``k`` (0: plain decoding), the plan's
        ``ranges`` (live rows lo..hi -> K), or the plan re-ranked from the live acceptance (``live``: a function
        returning a fresh :class:`PlanAdapter`); ``slot`` keeps the decoders of one lockstep comparison apart."""
        if live is not None:
            policy = AdaptiveSchedulePolicy(self.drafter(rows, slot), live())
        elif ranges is not None:
            policy = SchedulePolicy(self.drafter(rows, slot), [(lo, hi, Tree.chain(kk + 1)) for lo, hi, kk in ranges])
            if all(kk == 0 for *_, kk in ranges):
                policy = None
        else:
            policy = StaticTreePolicy(self.drafter(rows, slot), Tree.chain(k + 1)) if k else None
        if self.name == "treeopt":
            return Decoder(self.pair.target, policy, max_batch=rows, max_len=self.max_len)
        from sequoia_opt.engines.llamacpp import LlamaCppTarget

        return Decoder(LlamaCppTarget(self._contexts(rows, slot)[0], max_batch=rows), policy, max_batch=rows)


# ---------------------------------------------------------------------------------------------- runs
class Served:
    """One setting serving its requests by continuous batching, advanced a block of steps at a time so that the
    settings of one comparison run in lockstep (:func:`lockstep`).

    After step s the batch is refilled while requests wait: the next request joins while fewer than
    ``concurrency(s, a)`` rows are live, ``a`` the requests admitted before it (a finished row's
    slot takes the next request between two steps, :meth:`Decoder.join`, as vLLM, SGLang and llama-server run
    requests). ``timed_rows``: only the steps with that many live rows are timed and counted (a steady
    concurrency; the ramp-down after the last join, the slowest requests' tail, is what a server at that
    concurrency never runs); None: every step, and ``ms`` is the setting's own wall time (its steps and joins)
    less prefill.
    """

    def __init__(self, dec: Decoder, prompts: list[list[int]], new: int, concurrency, timed_rows: int | None):
        self.dec, self.prompts, self.new = dec, prompts, new
        self.concurrency, self.timed_rows = concurrency, timed_rows
        self.state = None
        self.waiting = list(range(len(prompts)))
        self.s = self.steps = self.emitted = 0
        self.ms = self.wall_ms = 0.0
        self.step_log: list[tuple[int, float, int]] = []  # per step: live rows, ms, tokens emitted
        self.frontiers: list[int] = []  # per timed step on treeopt's decoder: the slots its forwards attend over

    @property
    def done(self) -> bool:
        return self.state is not None and not self.waiting and self.state.finished

    def _next(self, count: int) -> list[list[int]]:
        """The next ``count`` waiting requests (fewer when fewer wait), taken off the queue."""
        take, self.waiting = self.waiting[:count], self.waiting[count:]
        return [self.prompts[i] for i in take]

    def advance(self, steps: int) -> None:
        """Up to ``steps`` steps (fewer when the requests run out)."""
        for _ in range(steps):
            if self.done:
                return
            t0 = time.perf_counter()
            if self.state is None:
                self.state = self.dec.start_batch(self._next(self.concurrency(self.s, 0)), self.new)
            admitted = len(self.prompts) - len(self.waiting)
            room = 0  # the next requests that find fewer live rows than their own target, joining together
            while room < len(self.waiting) and self.state.batch + room < self.concurrency(self.s, admitted + room):
                room += 1
            if room > 0:
                self.dec.join(self.state, self._next(room), self.new)
            if not self.state.finished:
                rows = getattr(getattr(self.dec, "face", None), "rows", None)  # treeopt's padded row cache
                frontier = getattr(rows, "frontier", None)  # before the step (a repack inside it would lower it)
                st = self.dec.step(self.state)
                self.step_log.append((st.batch, st.total_ms, sum(st.emitted)))
                if self.timed_rows is None or st.batch == self.timed_rows:
                    if frontier is not None:
                        self.frontiers.append(int(frontier))
                    self.ms += st.total_ms
                    self.steps += 1
                    self.emitted += sum(st.emitted)
            self.s += 1
            self.wall_ms += (time.perf_counter() - t0) * 1e3

    def result(self) -> dict:
        """Tokens per request (request order), the steps each request was live in (``request_steps``), the timed
        ms, steps and tokens, the live rows per step."""
        ms = self.ms if self.timed_rows is not None else self.wall_ms - self.state.prefill_ms
        return {"tokens": [r.tokens for r in self.state.results], "ms": ms, "steps": self.steps,
                "request_steps": [len(r.steps) for r in self.state.results],
                "emitted": self.emitted if self.timed_rows is not None else
                sum(len(r.tokens) for r in self.state.results),
                "wall_ms": self.wall_ms, "live": [b for b, _, _ in self.step_log],
                "frontier_mean": statistics.fmean(self.frontiers) if self.frontiers else None,
                "step_log": self.step_log,
                **({"adaptation": self.dec.policy.adapter.report()}
                   if isinstance(self.dec.policy, AdaptiveSchedulePolicy) else {})}


def steady_rate(run: dict, b: int) -> tuple[float, float]:
    """A setting's total tokens/s and tokens per step (all rows) at a steady concurrency of ``b`` from one
    :func:`run_batch` run: ``b x (sum of the requests' tokens / sum of their steps)`` tokens per step over the
    mean ms of the steps with b live rows.

    Why not the timed steps' own tokens over their ms (``window``, what runs before 2026-12-07 12:40 reported).
    A server at concurrency b serves request after request in every row slot; a slot's rate is then the
    renewal-reward rate, a request's tokens over its steps taken over many requests (E[tokens] / E[steps]). The
    timed window of a run is short: it ends when the queue is empty and a row leaves, about two requests per slot
    at ``--turnovers 2``, so its rows' rates are averaged side by side, and the mean of the requests' rates
    (tokens_i / steps_i) exceeds E[tokens] / E[steps] (Jensen's inequality; the slow requests' steps are the ones
    left in the untimed tail). The excess grows with b (fewer requests per slot in the window) and with K (the
    requests' rates spread more): eval run 2026-12-07 10:35, draft model, per-row tokens per step at K = 2 1.77 at
    b = 1 (the window is every step there, so both ways agree) and 1.88 at b = 16, at K = 8 2.02 and 2.26, on the
    same prompts under greedy decoding, whose accepted lengths do not depend on b. A request's steps are counted
    whole, the untimed tail included (greedy: the same steps at any b, as the request's tokens are); the step's
    ms is the timed steps' mean (their cost does depend on b). For a setting that drafts the same at any number of
    rows (a fixed K); the live plan changes K with the rows left in the tail and keeps :func:`window_rate`.

    Returns:
        (tokens/s over all rows, tokens per step over all rows).
    """
    per_row = sum(len(t) for t in run["tokens"]) / max(1, sum(run["request_steps"]))
    step_ms = run["ms"] / max(1, run["steps"])
    return 1000.0 * b * per_row / step_ms, b * per_row


def window_rate(run: dict) -> float:
    """The timed window's own tokens over its ms (tokens/s): :func:`steady_rate` says why it is not the rate."""
    return 1000.0 * run["emitted"] / run["ms"]


def by_range(runs: list[dict], ranges: list[tuple[int, int, int]]) -> dict[str, dict]:
    """A setting's stream steps split by the plan's ranges of live rows: per range ``"lo-hi"`` the median over
    rounds of its steps' tokens/s (tokens over the steps' own ms, joins excluded), and of its steps and tokens. Where a
    plan wins or loses the stream against a fixed K (the stream is short and most of it ramps, so one range's loss
    shows in the total)."""
    out = {}
    for lo, hi, _ in ranges:
        parts = [[(ms, tok) for b, ms, tok in r.get("step_log", []) if lo <= b <= hi] for r in runs]
        ms = [sum(m for m, _ in p) for p in parts]
        tok = [sum(t for _, t in p) for p in parts]
        tps = [1000.0 * t / m for t, m in zip(tok, ms) if m > 0]
        out[f"{lo}-{hi}"] = {"tokens_per_s": med(tps) if tps else None, "steps": med([float(len(p)) for p in parts]),
                             "tokens": med([float(t) for t in tok])}
    return out


def by_live_rows(runs: list[dict]) -> dict[str, dict]:
    """A setting's stream steps by the number of live rows b, pooled over its rounds: per b (a string key) the steps
    per round, tokens per step (all rows), ms per step (joins excluded) and tokens/s. Beside the plan's own
    per-batch prediction and the steady-concurrency rows, this says at which b a near-tie in the stream was won or
    lost, and whether a stream step at b costs and yields what a steady batch of b does (the stream's last rows are
    the requests that took the most steps: a selection that lowers their tokens per step)."""
    out: dict[str, dict] = {}
    for b in sorted({b for r in runs for b, _, _ in r.get("step_log", [])}):
        steps = [(ms, tok) for r in runs for bb, ms, tok in r.get("step_log", []) if bb == b]
        ms, tok = sum(m for m, _ in steps), sum(t for _, t in steps)
        out[str(b)] = {"steps_per_round": len(steps) / max(1, len(runs)), "tokens_per_step": tok / len(steps),
                       "ms_per_step": ms / len(steps), "tokens_per_s": 1000.0 * tok / ms if ms > 0 else None}
    return out


def pooled_and_paired(rounds: dict[str, list[tuple[float, float]]], of: str = "plan") -> dict[str, dict]:
    """Per setting, its stream rounds pooled (every token over every ms: ``1000 x sum tokens / sum ms``, tok/s) and
    the median over rounds of ``of``'s rate over the setting's in the same round (a ratio). ``rounds``: per setting
    the (tokens, ms) of each round, rounds in the same order for every setting.

    Why. Each stream round serves the requests in its own order (:func:`run_stream`'s ``arrival``), and the orders
    move every setting's rate together by 10 % (2026-12-05 19:37: 164-180 tok/s); a median of each setting's own
    rates compares figures from different rounds, so different orders. Pooled, every setting has served the same
    requests in the same orders; paired, each ratio is taken within one order.

    Raises:
        ValueError: ``of`` missing, or settings with different numbers of rounds.
    """
    if of not in rounds:
        raise ValueError(f"no setting {of!r} among {sorted(rounds)}")
    n = {len(v) for v in rounds.values()}
    if len(n) != 1:
        raise ValueError(f"every setting needs the same rounds; got {sorted(n)}")
    rate = lambda t, m: 1000.0 * t / m  # noqa: E731
    out = {}
    for name, rs in rounds.items():
        out[name] = {"tokens_per_s_pooled": rate(sum(t for t, _ in rs), sum(m for _, m in rs)),
                     f"{of}_over_this_paired": med([rate(*a) / rate(*b) for a, b in zip(rounds[of], rs)])}
    return out


def round_order(names: list, r: int) -> list:
    """The order the settings of lockstep round ``r`` step in: the given order in round 0, then a shuffle seeded
    by the round (the same in every run). Runs before 2026-12-05 17:05 rotated the order, which keeps every setting
    behind the same neighbour in every round; the first step of a block runs after the neighbour's block has taken
    the caches (that step ran about 2 ms slower than the block's others at 16 rows on this VM), so whatever a
    setting's first steps pay for its neighbour, it paid in every round."""
    if r == 0:
        return list(names)
    out = list(names)
    random.Random(r).shuffle(out)
    return out


def lockstep(served: list[Served], block: int) -> None:
    """Advance every setting ``block`` steps in turn until all have served their requests.

    This VM's speed moves by tens of percent over tens of seconds; a setting timed alone, minutes after another,
    is timed at another speed, and the comparison (the regret, the speedup) carries the drift. In lockstep every
    setting is timed in the same seconds. Blocks of a few steps rather than single ones: a server steps one
    decoder many times in a row (its weights and caches stay warm), and single alternated steps read the
    speculative step a few percent cheaper against plain (:data:`sequoia_opt.profiling.steps.CHECK_BLOCK_STEPS`).
    """
    while not all(x.done for x in served):
        for x in served:
            x.advance(block)


def run_batch(eng: Engine, b: int, ks: list[Any], prompts: list[list[int]], new: int, block: int,
              extra: dict[str, dict] | None = None) -> dict[Any, dict]:
    """The requests served at a steady concurrency of b with every fixed K in ``ks`` (and each named setting of
    ``extra``: decoder keywords), in lockstep (in that order, a name of ``extra`` in ``ks`` taking its place);
    per setting: tokens per request, decode ms of the steps with b live rows (prefill and joins excluded), their
    steps and tokens."""
    extra = extra or {}
    served = {k: Served(eng.decoder(b, **(extra[k] if k in extra else {"k": k}), slot=i), prompts, new,
                        lambda s, a: b, b) for i, k in enumerate(ks)}
    lockstep(list(served.values()), block)
    return {k: x.result() for k, x in served.items()}


STREAM_SHAPES = ("ramp", "triangle")


def stream_concurrency(shape: str, peak: int, requests: int):
    """The stream's target of live rows, a function of the step s and the requests admitted so far a (what
    :class:`Served` takes): ``ramp``, ``min(peak, s + 1)`` (one more row each step, then the peak until the
    requests run out); ``triangle``, ``1 + round((peak - 1) (1 - |2 a / (N - 1) - 1|))`` for N requests (the
    concurrency climbs to the peak over the first half of the requests and falls back over the second, so each
    level admits about the same number of them (the peak, one point of the triangle, about half as many), and
    every setting meets the same levels with the same requests; N >= 3 to rise at all).

    Raises:
        ValueError: an unknown shape, a peak or a request count under 1.
    """
    if shape not in STREAM_SHAPES:
        raise ValueError(f"stream shape {shape!r}: one of {', '.join(STREAM_SHAPES)}")
    if peak < 1 or requests < 1:
        raise ValueError("a stream needs a peak and a request count of at least 1")
    if shape == "ramp":
        return lambda s, a: min(peak, s + 1)
    last = max(1, requests - 1)
    return lambda s, a: 1 + round((peak - 1) * (1.0 - abs(2.0 * min(a, last) / last - 1.0)))


def run_stream(eng: Engine, prompts: list[list[int]], new: int, peak: int, settings: dict[str, dict],
               block: int, shape: str = "ramp", arrival: list[int] | None = None) -> dict[str, dict]:
    """The stream (module docstring; ``shape``, :func:`stream_concurrency`) served with every setting
    (``{"k": K}`` or ``{"ranges": [...]}``) in lockstep: per setting its own wall ms (steps and joins, prefill
    excluded), tokens per request (in the order of ``prompts``), the live rows per step. ``arrival``: the order the
    requests arrive in, a permutation of their indices (default: as given), the same for every setting."""
    arrival = list(range(len(prompts))) if arrival is None else list(arrival)
    if sorted(arrival) != list(range(len(prompts))):
        raise ValueError(f"arrival must order the {len(prompts)} requests, each once")
    queue = [prompts[i] for i in arrival]
    served = {n: Served(eng.decoder(peak, slot=i, **st), queue, new, stream_concurrency(shape, peak, len(prompts)),
                        None)
              for i, (n, st) in enumerate(settings.items())}
    lockstep(list(served.values()), block)
    out = {n: x.result() for n, x in served.items()}
    for res in out.values():  # back to the requests' own order
        res["tokens"] = [t for _, t in sorted(zip(arrival, res["tokens"]), key=lambda x: x[0])]
    return out


def request_ids(eng: Engine, requests: Path, max_prompt_tokens: int | None, need: int) -> list[list[int]]:
    """The requests' prompts encoded by the target's tokenizer (llama.cpp's GGUF tokenizer is the same
    vocabulary), cut to their last ``max_prompt_tokens`` (None: whole), repeated in order up to ``need``."""
    ids = encode_prompts(load_prompts(requests), eng.tokenizer)
    if max_prompt_tokens:
        ids = [p[-max_prompt_tokens:] for p in ids]
    return [ids[i % len(ids)] for i in range(need)]


def reanalyze(path: Path, threads: int) -> None:
    """:func:`served_acceptance` for a finished run of treeopt's decoder: written beside its profiles
    (``<run>/served-acceptance.json``) and printed. Runs from before ``max_prompt_tokens`` was recorded cut the
    eval prompts to 96."""
    doc = json.loads(path.read_text())
    if doc["engine"] != "treeopt":
        raise SystemExit(f"{path}: only runs of treeopt's decoder are decomposed (this one ran {doc['engine']})")
    run_dir = path.with_suffix("")
    eng = Engine("treeopt", doc["drafter"], threads, 512, doc.get("target"))
    cut = doc.get("max_prompt_tokens", 96 if doc["workload"] == "eval" else None)
    ids = request_ids(eng, ROOT / doc["prompts"], cut, max(r["prompts"] for r in doc["rows"]))
    sa = served_acceptance(doc, run_dir, eng, ids)
    sa["source"] = rel(path.resolve())
    atomic_write_text(run_dir / "served-acceptance.json", json.dumps(sa, indent=1) + "\n")
    print(f"{rel(path.resolve())}: plan {doc['plan']['ranges']}")
    print_served(sa)
    print(f"wrote {rel((run_dir / 'served-acceptance.json').resolve())}")


def served_acceptance(doc: dict, run_dir: Path, eng: Engine, ids: list[list[int]]) -> dict:
    """Where the plan's error comes from: the acceptance of the profile prompts against the served requests'
    own, and the cost model with the served acceptance (treeopt's decoder only).

    The served requests are teacher-forced once (:func:`~sequoia_opt.profiling.acceptance.chain_traces`, their
    greedy answers of ``new_tokens``; the decoder replays them step for step). Per batch size b, on the requests
    served there and the run's own latency profile: G(K) of the profile prompts (what the plan was solved from)
    and of the served requests; the plan re-solved from the served requests' traces (the *oracle* plan: the same
    solver and cost model, told the acceptance it would meet), its K, regret against the measured best and its
    predicted tokens/s against the measured. What is left in the oracle's regret and error is the cost model's
    and the machine's; the rest of the plan's is the acceptance of one prompt set read as another's. Runs of
    llama.cpp are not decomposed (its quantized target's greedy answers are not treeopt's float32 ones).
    """
    import glob

    from sequoia_opt.jobs.tune import acceptance_from_traces
    from sequoia_opt.profiles import load_acceptance
    from sequoia_opt.profiles.batch import load_batch_latency
    from sequoia_opt.profiling.acceptance import chain_traces
    from sequoia_opt.solver.schedule import ChainValue, SpecSetting, predict_ranges, solve_plan

    pair = eng.pair
    ks = doc["ks"]
    K = max(ks)
    need = max(r["prompts"] for r in doc["rows"])
    uniq = {tuple(p) for p in ids[:need]}
    traces = chain_traces(pair.target, pair.new_drafter, [list(p) for p in uniq], max_new_tokens=doc["new_tokens"],
                          eos_ids=sorted(pair.tokenizer.eos_ids))
    trace_of = dict(zip(uniq, traces, strict=True))
    profile = load_batch_latency(glob.glob(str(run_dir / "profiles" / "*" / "*latency-batch.yaml"))[0])
    acc = load_acceptance(glob.glob(str(run_dir / "profiles" / "*" / "acceptance*.yaml"))[0])
    ctx, out = doc["context_tokens"], doc["output_tokens"]
    setting = lambda k: SpecSetting.chain(k) if k else SpecSetting.none()  # noqa: E731
    prof_value = ChainValue(acc, K)

    def per_step(v: ChainValue, k: int) -> float:  # tokens per step and row over the answers (no step costs in it)
        return v.g[k] * (v.length_factor(setting(k), out) if k and out else 1.0)

    rows = []
    for r in doc["rows"]:
        b = r["batch"]
        served = acceptance_from_traces([trace_of[tuple(p)] for p in ids[: r["prompts"]]], profile_id="served",
                                        target_name=pair.target_name, draft_name=pair.draft_name, max_depth=K,
                                        source="the served requests", max_new_tokens=doc["new_tokens"])
        value = ChainValue(served, K)
        # solved at 1 and b (a plan starts at one live request); the oracle is its choice at b
        oracle = next(x for x in solve_plan(value, profile, sorted({1, b}), context=ctx, output_tokens=out,
                                            answer_end_cut=True).rows
                      if x.batch == b).best
        ko = oracle.setting.draft_tokens
        meas = {int(k): v for k, v in r["by_k"].items()}
        best = max(v["tokens_per_s_total"] for v in meas.values())
        g = {}
        for k in ks:
            pp = predict_ranges([(1, b, setting(k))], prof_value, profile, [b], context=ctx, output_tokens=out,
                                answer_end_cut=True)[0]  # treeopt's decoder cuts an answer's last steps
            g[str(k)] = {"profile": per_step(prof_value, k), "served": per_step(value, k),
                    "measured": meas[k]["tokens_per_step"] / b,
                    # the mean step over the answers: at batch 1 their last steps draft less (cut_step_costs)
                    "predicted_step_ms": pp.cost.cost_ms * per_step(prof_value, k) / (pp.cost.expected_tokens
                                                                                      * pp.length_factor),
                    "measured_step_ms": 1000.0 * meas[k]["tokens_per_step"] / meas[k]["tokens_per_s_total"]}
        pk, gp = r["plan_k"], g[str(r["plan_k"])]
        rows.append({"batch": b, "requests": r["prompts"], "tokens_per_step_per_row": g,
                     "plan_k": pk, "plan_tokens_per_step_error": gp["profile"] / gp["measured"] - 1,
                     "plan_step_ms_error": gp["predicted_step_ms"] / gp["measured_step_ms"] - 1,
                     "oracle_k": ko, "oracle_regret": (best - meas[ko]["tokens_per_s_total"]) / best,
                     "oracle_predicted_tokens_per_s_total": oracle.tokens_per_s_total,
                     "oracle_prediction_error": oracle.tokens_per_s_total / meas[ko]["tokens_per_s_total"] - 1})
    return {"method": "the served requests teacher-forced (greedy, chain_traces); the plan re-solved from them with "
                      "the run's latency profile", "rows": rows,
            "max_oracle_regret": max(x["oracle_regret"] for x in rows),
            "max_oracle_prediction_error": max(abs(x["oracle_prediction_error"]) for x in rows)}


def print_served(sa: dict) -> None:
    print("batch | plan K: tokens/step/row profile / served / measured, step ms predicted / measured | oracle K, "
          "regret, prediction error")
    for x in sa["rows"]:
        g = x["tokens_per_step_per_row"][str(x["plan_k"])]
        print(f"{x['batch']} | K={x['plan_k']}: {g['profile']:.3f} / {g['served']:.3f} / {g['measured']:.3f} "
              f"({100 * x['plan_tokens_per_step_error']:+.1f} %), {g['predicted_step_ms']:.1f} / "
              f"{g['measured_step_ms']:.1f} ms ({100 * x['plan_step_ms_error']:+.1f} %) | K={x['oracle_k']}, "
              f"{100 * x['oracle_regret']:.1f} %, {100 * x['oracle_prediction_error']:+.1f} %")


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def med(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (one line and exit 2 on a bad one: a missing file, a count below 1, neither
    ``--workload`` nor ``--requests``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("treeopt", "llama.cpp"))
    ap.add_argument("--workload", choices=tuple(WORKLOADS),
                    help="eval or edit; or give --requests (and --profile-file) for your own traffic")
    ap.add_argument("--requests", type=Path, default=None,
                    help="the requests to serve, a prompts file (default: the workload's eval prompts); a sample of "
                         "your traffic the profile did not see")
    ap.add_argument("--profile-file", type=Path, default=None,
                    help="the prompts tune measures acceptance on (default: the workload's profile prompts; without "
                         "a workload, the demo's)")
    ap.add_argument("--target", default=None, help="the target checkpoint (default: the demo target)")
    ap.add_argument("--draft", default=None, help="the drafter (default: the workload's: draft model / lookup)")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--ks", default="0,1,2,3,4,5,6,7,8")
    ap.add_argument("--new", type=int, default=16, help="new tokens per request at fixed batch sizes")
    ap.add_argument("--output-tokens", type=int, default=None,
                    help="the answer length tune solves for (default: --new, the requests' own length)")
    ap.add_argument("--min-prompts", type=int, default=16,
                    help="requests per batch size: at least this many (the same first ones at every batch size)")
    ap.add_argument("--turnovers", type=int, default=2,
                    help="requests per batch size: at least b x this (each row slot serves this many requests)")
    ap.add_argument("--max-prompt-tokens", type=int, default=None,
                    help="requests are cut to their last N tokens (default: 96 for the eval workload, else whole)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block-steps", type=int, default=4,
                    help="the settings compared run in lockstep, this many steps each in turn")
    ap.add_argument("--stream-rounds", type=int, default=None,
                    help="rounds of the stream (default --rounds); each serves the requests in its own order")
    ap.add_argument("--stream-requests", type=int, default=40)
    ap.add_argument("--stream-tokens", type=int, default=12)
    ap.add_argument("--stream-peak", type=int, default=16)
    ap.add_argument("--stream-shape", choices=STREAM_SHAPES, default="ramp",
                    help="ramp: one more row each step up to the peak, held while requests remain; triangle: the "
                         "concurrency climbs to the peak over the first half of the requests and falls back")
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--no-live", action="store_true",
                    help="skip the plan re-ranked from the live acceptance (treeopt's decoder: plan-live)")
    ap.add_argument("--live-every", type=int, default=DEFAULT_EVERY, help="plan-live: steps between re-rankings")
    ap.add_argument("--live-window", type=int, default=DEFAULT_WINDOW,
                    help="plan-live: steps its acceptance estimate remembers")
    ap.add_argument("--profile-rounds", type=int, default=2)
    ap.add_argument("--profile-prompts", type=int, default=32,
                    help="profile prompts tune measures acceptance on (the workload's profile file has 32 / 24)")
    ap.add_argument("--extra-profile-prompts", type=Path, action="append", default=[],
                    help="more prompts of the served kind, pooled after the profile file (repeatable); tune measures "
                         "the first --profile-prompts of the pool (a larger pool narrows the profile's own error)")
    ap.add_argument("--profile-new-tokens", type=int, default=None,
                    help="answer tokens per profile prompt (default: --new, the length the requests are served to)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profiles-from", type=Path, default=None,
                    help="an earlier run's profiles/ folder, copied into this run's and reused by tune where they cover "
                         "it (same machine: the plan is that run's; the rounds and the stream are measured anew)")
    ap.add_argument("--plan", type=Path, default=None, help="a treeopt-schedule/1 plan (default: tune solves one)")
    ap.add_argument("--refine", type=int, default=None,
                    help="tune's --refine (default: tune's): the batch sizes it times between --batches, where the "
                         "plan switches, are measured here too (every K), the peers' rules still reading --batches")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "results/schedules")
    ap.add_argument("--markdown", type=Path, nargs="+", default=None,
                    help="print the markdown tables of these results files (no run)")
    ap.add_argument("--goals", type=Path, nargs="+", default=None,
                    help="print issue 29's goals of these results files as one markdown table, a run a line (no run)")
    ap.add_argument("--reanalyze", type=Path, nargs="+", default=None,
                    help="decompose these finished runs' errors (served_acceptance; treeopt's decoder only; no run)")
    args = ap.parse_args(argv)
    if args.reanalyze or args.markdown or args.goals:
        for path in (args.reanalyze or []) + (args.markdown or []) + (args.goals or []):
            if not path.is_file():
                ap.error(f"{path}: no such results file")
        return args
    if args.engine is None or (args.workload is None and args.requests is None):
        ap.error("--engine and --workload (or --requests FILE) are required (or --markdown / --reanalyze FILE...)")
    for name in ("requests", "profile_file", "plan"):
        path = getattr(args, name)
        if path is not None and not path.is_file():
            ap.error(f"--{name.replace('_', '-')} {path}: no such file")
    try:  # a bad pool file: one line, before the models load; main pools what is read here
        args.extra_pool = [p for path in args.extra_profile_prompts for p in load_prompts(path)]
    except PromptFileError as err:
        ap.error(f"--extra-profile-prompts: {err}")
    if args.max_prompt_tokens is not None and args.max_prompt_tokens < 1:
        ap.error("--max-prompt-tokens must be at least 1")
    if args.profiles_from is not None and not args.profiles_from.is_dir():
        ap.error(f"--profiles-from {args.profiles_from}: not a folder")
    for name in ("new", "turnovers", "rounds", "stream_rounds", "min_prompts", "block_steps", "profile_prompts",
                 "profile_new_tokens", "live_every", "live_window"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    if args.reanalyze:
        torch.set_num_threads(args.threads)
        for path in args.reanalyze:
            reanalyze(path, args.threads)
        return
    if args.markdown:
        for path in args.markdown:
            print(markdown(json.loads(path.read_text()), rel(path.resolve())))
        return
    if args.goals:
        print(goals_table([(rel(p.resolve()), json.loads(p.read_text())) for p in args.goals]))
        return
    torch.set_num_threads(args.threads)
    t_start = time.time()
    batches = parse_batches(args.batches)
    ks = [int(x) for x in args.ks.split(",")]
    workload = args.workload or "custom"
    eval_file, profile_file, default_draft = WORKLOADS.get(workload, (None, demo_prompts_path("profile"), None))
    eval_file, profile_file = args.requests or eval_file, args.profile_file or profile_file
    draft = args.draft or default_draft
    cut = args.max_prompt_tokens or (96 if workload == "eval" and args.requests is None else None)
    stamp = new_run_id(None)  # unique: two runs started in one second never share a folder or a record
    run_dir = args.out_dir / f"{stamp}-{args.engine}-{workload}"
    run_dir.mkdir(parents=True)

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:7.1f} s] {msg}", file=sys.stderr, flush=True)

    # the prompts, encoded by the target's tokenizer (llama.cpp's GGUF tokenizer is the same vocabulary)
    max_len = 512
    eng = Engine(args.engine, draft, args.threads, max_len, args.target)
    requests_at = lambda b: max(args.min_prompts, args.turnovers * b)  # noqa: E731
    need = max(max(requests_at(b) for b in batches), args.stream_requests if not args.no_stream else 0)
    ids = request_ids(eng, eval_file, cut, need)
    # T(b, n) is timed and read at the context the served steps decode at, as benchmarks/llamacpp.py does: the
    # prompts' mean tokens plus half the answer (a step of a request's j-th token reads its prompt and j - 1
    # tokens). At the prompts' median (96) the profile's steps read 8 fewer slots than the served steps' mean,
    # and the prediction came out 1-2 % fast at batch 16 on that alone (T(16, 1) 44.5 ms at 96, 45.8 at 112)
    prompt_tokens = statistics.fmean(len(p) for p in ids)
    context = int(round(prompt_tokens + args.new / 2))

    # treeopt's decoder: T(b, n) timed on rows spread as a batch of these requests would be (row_contexts)
    spread = request_contexts([len(p) for p in ids], args.output_tokens or args.new) if args.engine == "treeopt" \
        else None

    profile_files = [profile_file, *args.extra_profile_prompts]
    if args.extra_profile_prompts:  # tune reads one file: the pool, in order, written into the run's folder
        pool = load_prompts(profile_file) + args.extra_pool
        profile_file = run_dir / "profile-prompts.jsonl"
        atomic_write_text(profile_file, "".join(json.dumps({"messages": list(p.messages)} if p.is_chat
                                                           else {"prompt": p.text}) + "\n" for p in pool))

    # 1. profile -> solve, in this machine state (what treeopt tune does; --profiles-from: an earlier run's profiles)
    if args.profiles_from is not None:
        import shutil

        shutil.copytree(args.profiles_from, run_dir / "profiles", dirs_exist_ok=True)
    log(f"tune: profile T(b, n) at batch sizes {batches} (context {context}), acceptance on {profile_file.name}")
    res = tune(TuneOptions(engine=args.engine, target=args.target, draft=draft, batches=batches, context=context,
                           max_draft=max(ks),
                           prompts=profile_file, num_prompts=args.profile_prompts,
                           max_new_tokens=args.profile_new_tokens or args.new, threads=args.threads,
                           rounds=args.profile_rounds, profiles_dir=run_dir / "profiles", plan=args.plan,
                           output_tokens=args.output_tokens or args.new,
                           # a batch's rows spread as the served prompts' (treeopt's padded cache, TuneOptions.rows)
                           request_lengths=[len(p) for p in ids] if spread is not None else None,
                           **({} if args.refine is None else {"refine": args.refine})),
               progress=lambda what, done, total: None)
    plan = res.plan
    save_schedule(run_dir / "plan.yaml", res.schedule)
    plan_k = {r.batch: r.best.setting.draft_tokens for r in plan.rows}
    ranges = [(r.lo, r.hi, r.setting.draft_tokens) for r in plan.ranges]
    predicted = {r.batch: {c.setting.draft_tokens: c.tokens_per_s_total for c in r.candidates} for r in plan.rows}
    # the batch sizes tune --refine timed where the plan switches: measured like the others; the peers' rules
    # choose over --batches only, as their sweeps would (a batch size between two takes the lower one's K)
    refined = sorted(set(plan_k) - set(batches))
    measured_batches = sorted(set(plan_k) | set(batches))
    log(f"plan: {', '.join(f'{lo}-{hi}: K={k}' for lo, hi, k in ranges)}"
        + (f" (batch sizes {refined} timed by --refine)" if refined else "") + f"; {res.profiles}")
    live = None  # a fresh adapter per decoder: each round's plan-live starts from the plan and the profile's prior
    if not args.no_live and plan.shape == "chain":
        kw = {"every": args.live_every, "window": args.live_window}
        if args.plan is not None:  # a given plan: its file's by_batch holds every K it was solved among
            from sequoia_opt.solver.schedule import load_schedule

            doc = load_schedule(args.plan).doc
            live = lambda: PlanAdapter.of_document(doc, str(args.plan), **kw)  # noqa: E731
        else:
            live = lambda: PlanAdapter.of_plan(plan, **kw)  # noqa: E731
        try:
            live()  # a plan it cannot re-rank (a given --plan scores only its own settings) says so now
        except ProfileError as err:
            log(f"plan-live skipped: {err}")
            live = None

    # 2. every fixed K at every batch size, interleaved rounds
    rows = []
    for b in measured_batches:
        prompts = ids[: requests_at(b)]
        runs: dict[int, list[dict]] = {k: [] for k in ks}
        live_runs: list[dict] = []  # the plan re-ranked from the live acceptance (AdaptiveSchedulePolicy)
        names = ks + ([LIVE] if live else [])
        for r in range(args.rounds):
            order = round_order(names, r)
            for k, res_k in run_batch(eng, b, order, prompts, args.new, args.block_steps,
                                      extra={LIVE: {"live": live}} if live else None).items():
                (live_runs if k == LIVE else runs[k]).append(res_k)
            log(f"batch {b} round {r + 1}/{args.rounds}")
        eng.release()
        plain = runs[0][0]["tokens"] if 0 in runs else None
        per_k = {}
        for k in ks:
            tps = [steady_rate(x, b)[0] for x in runs[k]]
            window = [window_rate(x) for x in runs[k]]
            per_k[k] = {"tokens_per_s_total": med(tps), "tokens_per_s_total_rounds": tps,
                        "tokens_per_step": steady_rate(runs[k][0], b)[1],
                        "tokens_per_s_window": med(window), "tokens_per_s_window_rounds": window,
                        "tokens_per_step_window": runs[k][0]["emitted"] / max(1, runs[k][0]["steps"]),
                        # row steps: each request's steps, summed over the requests (the untimed tail included)
                        "row_steps": sum(runs[k][0]["request_steps"]),
                        "steps": runs[k][0]["steps"], "emitted": runs[k][0]["emitted"],
                        "greedy_equal_plain": plain is None or all(x["tokens"] == plain for x in runs[k]),
                        "predicted_tokens_per_s_total": predicted.get(b, {}).get(k),
                        # the slots the served steps attended over (treeopt: the longest row and the holes past it)
                        "frontier_mean": runs[k][0].get("frontier_mean")}
        best_k = max(ks, key=lambda k: per_k[k]["tokens_per_s_total"])
        best = per_k[best_k]["tokens_per_s_total"]
        pk = plan_k.get(b)
        chosen = per_k.get(pk, {}).get("tokens_per_s_total")
        pred = predicted.get(b, {}).get(pk)
        # the speedup over plain decoding measured in the same rounds: its error is the model's, free of the
        # machine's speed moving between the profile and these rounds (which moves both rates alike)
        pred0, meas0 = predicted.get(b, {}).get(0), per_k.get(0, {}).get("tokens_per_s_total")
        sp_pred = None if pred is None or not pred0 else pred / pred0
        sp_meas = None if chosen is None or not meas0 else chosen / meas0
        live_row = None
        if live_runs:
            # like for like with the fixed K's windows: the live plan drafts the K of the rows left in the untimed
            # tail, so its requests' steps are not all the setting's at b, and steady_rate does not apply
            tps = [window_rate(x) for x in live_runs]
            best_window = max(per_k[k]["tokens_per_s_window"] for k in ks)
            live_row = {"tokens_per_s_total": med(tps), "tokens_per_s_total_rounds": tps, "rate": "window",
                        "regret": (best_window - med(tps)) / best_window,
                        "greedy_equal_plain": plain is None or all(x["tokens"] == plain for x in live_runs),
                        "final_ranges": [x["adaptation"]["final_ranges"] for x in live_runs],
                        "resolves": [sum(e["changed"] for e in x["adaptation"]["resolves"]) for x in live_runs]}
        rows.append({"batch": b, "refined": b in refined, "prompts": len(prompts), "by_k": per_k,
                     # the rows' contexts T(b, n) was timed at (tune's rows="spread"; None: every row at context)
                     "profile_row_contexts": row_contexts(context, b, spread) if spread is not None else None,
                     "best_measured_k": best_k,
                     "plan_live": live_row,
                     "plan_k": pk, "plan_tokens_per_s_total": chosen,
                     "regret": None if chosen is None else (best - chosen) / best,
                     "plan_predicted_tokens_per_s_total": pred,
                     "prediction_error": None if chosen is None or pred is None else (pred - chosen) / chosen,
                     "plain_prediction_error": None if not meas0 or pred0 is None else (pred0 - meas0) / meas0,
                     "plan_predicted_speedup": sp_pred, "plan_measured_speedup": sp_meas,
                     "speedup_prediction_error": None if sp_pred is None or not sp_meas
                     else (sp_pred - sp_meas) / sp_meas})
    by_b = {r["batch"]: r for r in rows}
    def measured_k(k: int) -> int:
        """The longest measured K not past k (a peer's K outside a trimmed --ks runs as the nearest one below)."""
        return max((x for x in ks if x <= k), default=min(ks))

    meas = lambda b, k: by_b[b]["by_k"][k]["tokens_per_s_total"]  # noqa: E731
    batch1_best = by_b[batches[0]]["best_measured_k"]
    vllm_ks = sorted({measured_k(k) for k in VLLM_GENERATOR_KS})
    vllm_rule = {b: max(vllm_ks, key=lambda k: meas(b, k)) for b in batches}
    peers_fixed = {"vllm-generator": vllm_rule,
                   "sglang-default": {b: measured_k(SGLANG_DEFAULT_ENVELOPE[0]) for b in batches},
                   "llama.cpp-default": {b: measured_k(LLAMACPP_DEFAULT_DRAFT) for b in batches},
                   "batch1-best": {b: batch1_best for b in batches}}
    grid_of = lambda b: max(g for g in batches if g <= b)  # noqa: E731 (the measured --batches size a rule reads)
    for r in rows:
        b = r["batch"]
        r["peers"] = {name: {"k": rule[grid_of(b)], "tokens_per_s_total": meas(b, rule[grid_of(b)])}
                      for name, rule in peers_fixed.items()}

    # 3. the stream: every fixed K, the plan, vLLM's rule (as ranges over the measured batch sizes)
    stream = None
    if not args.no_stream:
        sp = ids[: args.stream_requests]
        last = max(plan.ranges[-1].hi, args.stream_peak)
        vr = [(1 if i == 0 else b, (batches[i + 1] - 1) if i + 1 < len(batches) else last, vllm_rule[b])
              for i, b in enumerate(batches)]
        # from 1 live row (a plan solved from --batches 2,... starts at 2) to the stream's peak
        plan_ranges = [(1 if i == 0 else lo, hi if i + 1 < len(ranges) else last, k)
                       for i, (lo, hi, k) in enumerate(ranges)]
        settings: dict[str, dict] = {f"K={k}": {"k": k} for k in ks}
        settings["plan"] = {"ranges": plan_ranges}
        if live:
            settings[LIVE] = {"live": live}
        settings["vllm-generator"] = {"ranges": vr}
        sruns: dict[str, list[dict]] = {n: [] for n in settings}
        names = list(settings)
        # a rule that drafts the same K as an earlier setting at every live-row count is the same decoder: it is run
        # once and shares those runs (two runs of one decoder differ by this VM's noise alone, up to 9 %)
        k_by_rows = {n: (n,) if "live" in st else
                     tuple(st["k"] if "k" in st else next(k for lo, hi, k in st["ranges"] if lo <= b <= hi)
                           for b in range(1, args.stream_peak + 1)) for n, st in settings.items()}
        same_as = {n: next(m for m in names if k_by_rows[m] == k_by_rows[n]) for n in names}
        runs_of = [n for n in names if same_as[n] == n]
        stream_rounds = args.stream_rounds or args.rounds
        orders = []
        for r in range(stream_rounds):
            order = round_order(runs_of, r)
            arrival = round_order(list(range(len(sp))), r)  # the requests' order: the same for every setting
            orders.append(arrival)
            for n, res_n in run_stream(eng, sp, args.stream_tokens, args.stream_peak, {n: settings[n] for n in order},
                                       args.block_steps, args.stream_shape, arrival).items():
                sruns[n].append(res_n)
            log(f"stream round {r + 1}/{stream_rounds}")
        eng.release()
        for n in names:
            sruns[n] = sruns[same_as[n]]
        ref = sruns["K=0"][0]["tokens"] if "K=0" in sruns else None
        stream = {"requests": len(sp), "tokens_per_request": args.stream_tokens, "peak": args.stream_peak,
                  "shape": args.stream_shape, "rounds": stream_rounds, "arrival_orders": orders,
                  "live_rows_plan": sruns["plan"][0]["live"], "settings": {}}
        for n in names:
            tps = [1000.0 * x["emitted"] / x["ms"] for x in sruns[n]]
            wall = [1000.0 * x["emitted"] / x["wall_ms"] for x in sruns[n]]
            stream["settings"][n] = {"tokens_per_s_total": med(tps), "rounds": tps,
                                     **({"same_decoder_as": same_as[n]} if same_as[n] != n else {}),
                                     "tokens_per_s_total_with_prefill": med(wall),
                                     "greedy_equal_plain": ref is None or all(x["tokens"] == ref for x in sruns[n]),
                                     "by_plan_range": by_range(sruns[n], plan_ranges),
                                     "by_live_rows": by_live_rows(sruns[n]),
                                     **({"adaptation": [x["adaptation"] for x in sruns[n]]} if n == LIVE else {}),
                                     **({"ranges": settings[n]["ranges"]} if "ranges" in settings[n] else {})}
        for n, v in pooled_and_paired({n: [(x["emitted"], x["ms"]) for x in sruns[n]] for n in names}).items():
            stream["settings"][n].update(v)
        st = stream["settings"]
        peer_of = {"sglang-default": f"K={measured_k(SGLANG_DEFAULT_ENVELOPE[0])}",
                   "llama.cpp-default": f"K={measured_k(LLAMACPP_DEFAULT_DRAFT)}", "batch1-best": f"K={batch1_best}",
                   "vllm-generator": "vllm-generator"}
        stream["peers"] = {peer: st[n]["tokens_per_s_total"] for peer, n in peer_of.items()}
        stream["peers_pooled"] = {peer: st[n]["tokens_per_s_pooled"] for peer, n in peer_of.items()}
        stream["plan_over_peers_paired"] = {peer: st[n]["plan_over_this_paired"] for peer, n in peer_of.items()}

    # 4. the goals
    regrets = [r["regret"] for r in rows if r["regret"] is not None]
    errors = [abs(r["prediction_error"]) for r in rows if r["prediction_error"] is not None]
    sp_errors = [abs(r["speedup_prediction_error"]) for r in rows if r["speedup_prediction_error"] is not None]
    goals = {"max_regret": max(regrets) if regrets else None,
             "regret_le_3pct_everywhere": bool(regrets) and max(regrets) <= 0.03,
             "max_prediction_error": max(errors) if errors else None,
             "prediction_within_10pct_everywhere": bool(errors) and max(errors) <= 0.10,
             "max_speedup_prediction_error": max(sp_errors) if sp_errors else None,
             "greedy_equal_everywhere": all(v["greedy_equal_plain"] for r in rows for v in r["by_k"].values())
             and (stream is None or all(v["greedy_equal_plain"] for v in stream["settings"].values())),
             "speculation_stops_paying_above": plan.stops_paying_above}
    live_rows = [r["plan_live"] for r in rows if r.get("plan_live")]
    if live_rows:
        goals.update(live_max_regret=max(x["regret"] for x in live_rows),
                     live_regret_le_3pct_everywhere=max(x["regret"] for x in live_rows) <= 0.03,
                     greedy_equal_everywhere=goals["greedy_equal_everywhere"]
                     and all(x["greedy_equal_plain"] for x in live_rows))
    if stream is not None and LIVE in stream["settings"]:
        st = stream["settings"]
        p = st[LIVE]["tokens_per_s_total"]
        fixed = {n: v["tokens_per_s_total"] for n, v in st.items() if n.startswith("K=")}
        goals.update(stream_live_tokens_per_s=p, stream_live_vs_best_fixed=p / max(fixed.values()),
                     stream_live_ge_every_fixed=all(p >= v for v in fixed.values()),
                     stream_live_ge_every_peer=all(p >= v for v in stream["peers"].values()))
    if stream is not None:
        st = stream["settings"]
        p = st["plan"]["tokens_per_s_total"]
        fixed = {n: v["tokens_per_s_total"] for n, v in st.items() if n.startswith("K=")}
        goals.update(stream_plan_tokens_per_s=p, stream_best_fixed=max(fixed, key=fixed.get),
                     stream_plan_vs_best_fixed=p / max(fixed.values()),
                     stream_plan_ge_every_fixed=all(p >= v for v in fixed.values()),
                     stream_plan_ge_every_peer=all(p >= v for v in stream["peers"].values()))
        # the same comparisons over the rounds pooled and paired by round (pooled_and_paired says why)
        pp = st["plan"]["tokens_per_s_pooled"]
        fixed_pp = {n: v["tokens_per_s_pooled"] for n, v in st.items() if n.startswith("K=")}
        paired = {n: v["plan_over_this_paired"] for n, v in st.items() if n.startswith("K=")}
        goals.update(stream_plan_vs_best_fixed_pooled=pp / max(fixed_pp.values()),
                     stream_plan_ge_every_fixed_pooled=all(pp >= v for v in fixed_pp.values()),
                     stream_plan_ge_every_peer_pooled=all(pp >= v for v in stream["peers_pooled"].values()),
                     stream_plan_over_fixed_paired_min=min(paired.values()),
                     stream_plan_over_peers_paired=stream["plan_over_peers_paired"])
    doc = {"benchmark": "benchmarks/schedules.py", "date": now_iso(), "engine": args.engine,
           "workload": workload, "target": args.target, "drafter": draft, "prompts": rel(eval_file),
           "profile_prompts": rel(profile_file), "profile_pool": [rel(Path(f).resolve()) for f in profile_files],
           "threads": args.threads,
           "rounds": args.rounds, "new_tokens": args.new, "output_tokens": args.output_tokens or args.new,
           "turnovers": args.turnovers, "profile_num_prompts": args.profile_prompts,
           "profile_new_tokens": args.profile_new_tokens or args.new,
           "measurement": "steady concurrency (continuous batching, b rows live); settings in lockstep; "
                          "rate: b x the requests' tokens over their steps, over the mean ms of a step with b rows "
                          "(steady_rate; tokens_per_s_window: the timed steps' own)",
           "block_steps": args.block_steps,
           "context_tokens": context, "prompt_tokens_mean": round(prompt_tokens, 1), "batches": batches,
           "refined_batches": refined, "ks": ks,
           "profiles": res.profiles, "profiles_from": None if args.profiles_from is None else rel(args.profiles_from),
           "plan": {"ranges": [list(x) for x in ranges],
                                              "stops_paying_above": plan.stops_paying_above,
                                              "file": rel(run_dir / "plan.yaml")},
           "max_prompt_tokens": cut, "rows": rows, "stream": stream,
           "served_acceptance": None, "goals": goals, "load_average_at_end": list(os.getloadavg()),
           "command": "flock /tmp/treeopt-bench.lock python " + " ".join(sys.argv), "wall_s": time.time() - t_start}
    # the measurements are written before the analysis below: an analysis that fails loses nothing measured
    (out,) = create_files({args.out_dir / f"{stamp}-{args.engine}-{workload}.json": json.dumps(doc, indent=1) + "\n"})
    print_tables(doc)

    # 5. where the plan's error comes from (treeopt's decoder): the served requests' own acceptance
    if args.engine == "treeopt":
        log("the served requests teacher-forced: their own acceptance, the oracle plan")
        try:
            served = served_acceptance(doc, run_dir, eng, ids)
        except Exception as err:  # noqa: BLE001 (the run's measurements are written: say so and keep them)
            log(f"the served-acceptance analysis failed ({type(err).__name__}: {err}); the measurements are in "
                f"{rel(out)}: rerun it with --reanalyze {rel(out)}")
        else:
            doc["served_acceptance"] = served
            goals.update(oracle_max_regret=served["max_oracle_regret"],
                         oracle_max_prediction_error=served["max_oracle_prediction_error"])
            atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
            print_served(served)
    print(f"wrote {out}")


def print_tables(doc: dict) -> None:
    ks = doc["ks"]
    print(f"\n{doc['engine']} / {doc['workload']} ({doc['drafter'] or 'draft model'}): plan "
          f"{doc['plan']['ranges']}, stops paying above {doc['plan']['stops_paying_above']}")
    print("batch | " + " | ".join(f"K={k}" for k in ks) + " | best | plan K | regret | predicted | error | speedup")
    for r in doc["rows"]:
        cells = [f"{r['by_k'][str(k) if isinstance(next(iter(r['by_k'])), str) else k]['tokens_per_s_total']:.1f}"
                 for k in ks]
        print(f"{r['batch']} | " + " | ".join(cells) + f" | K={r['best_measured_k']} | {r['plan_k']} | "
              f"{100 * (r['regret'] or 0):.1f}% | {r['plan_predicted_tokens_per_s_total'] or 0:.1f} | "
              f"{100 * (r['prediction_error'] or 0):+.1f}% | {_speedups(r)}{_live(r)}")
    if doc["stream"]:
        st = doc["stream"]["settings"]
        print("stream total tok/s: " + ", ".join(f"{n} {v['tokens_per_s_total']:.1f}" for n, v in st.items()))
        if "by_plan_range" in st["plan"]:
            for rng in st["plan"]["by_plan_range"]:
                print(f"stream, live rows {rng}, tok/s of those steps: " + ", ".join(
                    f"{n} {v['by_plan_range'][rng]['tokens_per_s'] or 0:.1f}" for n, v in st.items()))
    print("goals: " + json.dumps(doc["goals"]))


def _live(r: dict) -> str:
    """The plan re-ranked during the run: its tok/s, regret and final ranges per round ('' when not run)."""
    x = r.get("plan_live")
    if not x:
        return ""
    ends = [",".join(f"{lo}-{hi}:K={k}" for lo, hi, k in f) for f in x["final_ranges"]]
    ends_text = (f"{ends[0]} in every round" if len(ends) > 1 and len(set(ends)) == 1 else
                 "; ".join(ends) + (" (per round)" if len(ends) > 1 else ""))
    return f" | live {x['tokens_per_s_total']:.1f} ({100 * x['regret']:.1f} %, ends {ends_text})"


def _stops(above: int | None) -> str:
    if above == 0:
        return "speculation pays at no batch size"
    return "speculation pays up to the largest batch size" if above is None else \
        f"speculation stops paying above batch {above}"


def _speedups(r: dict) -> str:
    if r.get("plan_predicted_speedup") is None or r.get("plan_measured_speedup") is None:
        return "-"  # a results file from before the column, or no K = 0 run
    return (f"{r['plan_predicted_speedup']:.2f}x / {r['plan_measured_speedup']:.2f}x "
            f"({100 * r['speedup_prediction_error']:+.1f} %)")


def _steady(doc: dict) -> bool:
    """Whether a record's rates at a steady concurrency are :func:`steady_rate`'s (runs from 2026-12-07 12:40)."""
    return any("tokens_per_s_window" in v for r in doc["rows"] for v in r["by_k"].values())


def _paired_min(g: dict) -> str:
    """The plan over the weakest fixed K and the weakest peer rule, each the median of the per-round ratios (records
    from 2026-12-05 19:37 keep them; ``-`` before)."""
    fixed, peers = g.get("stream_plan_over_fixed_paired_min"), g.get("stream_plan_over_peers_paired")
    if fixed is None:
        return "-"
    return f"{fixed:.3f}, " + (f"{min(peers.values()):.3f}" if peers else "-")


def goals_table(records: list[tuple[str, dict]]) -> str:
    """Issue 29's goals for each record (``(source, doc)``), one markdown row per run in the given order: the
    largest regret against the best fixed K measured at a batch size, the largest tokens/s prediction error, greedy
    equality, the stream's plan over the best fixed K and whether it is at or above every peer rule (medians of
    each setting's rounds), the same paired by round (:func:`pooled_and_paired`; the smallest ratio over the fixed Ks
    and over the peers), the rate each record reads (:func:`steady_rate` or the timed window) and whether every
    goal is met in that run. A goal a record did not measure (no stream) reads "-" and does not count as met."""
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f} %"

    out = ["| run | engine, workload | max regret (<= 3 %) | max prediction error (<= 10 %) | greedy equal | stream "
           "plan / best fixed K (>= 1) | stream >= every peer | stream paired by round: plan / every fixed K, / every "
           "peer (min) | rate | every goal |", "| --- " * 10 + "|"]
    for source, doc in records:
        g = doc.get("goals", {})
        stream = g.get("stream_plan_vs_best_fixed")
        met = [g.get(k) for k in ("regret_le_3pct_everywhere", "prediction_within_10pct_everywhere",
                                  "greedy_equal_everywhere", "stream_plan_ge_every_fixed", "stream_plan_ge_every_peer")]
        out.append(f"| `{source}` | {doc.get('engine')}, {doc.get('workload')} | {pct(g.get('max_regret'))} | "
                   f"{pct(g.get('max_prediction_error'))} | {'yes' if g.get('greedy_equal_everywhere') else 'no'} | "
                   + ("-" if stream is None else f"{stream:.3f}") + " | "
                   + {True: "yes", False: "no", None: "-"}[g.get("stream_plan_ge_every_peer")] + " | "
                   + _paired_min(g) + " | "
                   + ("steady" if _steady(doc) else "window")
                   + f" | {'**yes**' if all(m is True for m in met) else 'no'} |")
    return "\n".join(out)


def markdown(doc: dict, source: str) -> str:
    """A results file as the docs' tables: measured tok/s per K and the plan per batch size, then the stream."""
    ks = doc["ks"]
    g = doc["goals"]
    out = [f"**{doc['engine']}, {doc['workload']} workload ({doc['drafter'] or 'draft model'})**: plan "
           + ", ".join(f"{lo}-{hi}: K={k}" for lo, hi, k in doc["plan"]["ranges"])
           + "; " + _stops(doc["plan"]["stops_paying_above"]) + " "
           f"(`{source}`, {doc['rounds']} rounds, medians; "
           + ("tok/s: the steady rate, each request counted whole" if _steady(doc) else
              "tok/s: the timed window's own, a run before the steady rate") + ")", "",
           "| batch | " + " | ".join(f"K={k}" for k in ks) + " | best K | plan K | regret | predicted | error "
           "| speedup predicted / measured | plan-live (regret, final ranges per round) |",
           "| --- " * (len(ks) + 8) + "|"]
    for r in doc["rows"]:
        by_k = {int(k): v for k, v in r["by_k"].items()}
        cells = [f"**{by_k[k]['tokens_per_s_total']:.1f}**" if k == r["plan_k"] else
                 f"{by_k[k]['tokens_per_s_total']:.1f}" for k in ks]
        out.append(f"| {r['batch']}{' (refine)' if r.get('refined') else ''} | " + " | ".join(cells) + f" | {r['best_measured_k']} | {r['plan_k']} | "
                   f"{100 * (r['regret'] or 0):.1f} % | {r['plan_predicted_tokens_per_s_total'] or 0:.1f} | "
                   f"{100 * (r['prediction_error'] or 0):+.1f} % | {_speedups(r)} | {_live(r)[3:] or '-'} |")
    if doc["stream"]:
        st = doc["stream"]
        fixed = {n: v["tokens_per_s_total"] for n, v in st["settings"].items() if n.startswith("K=")}
        best = max(fixed, key=fixed.get)
        out += ["", f"Stream 1 -> {st['peak']} -> 1 ({st.get('shape', 'ramp')}, {st['requests']} requests x "
                f"{st['tokens_per_request']} tokens), total tok/s: "
                f"plan {st['settings']['plan']['tokens_per_s_total']:.1f}; "
                + (f"plan-live {st['settings'][LIVE]['tokens_per_s_total']:.1f}; " if LIVE in st["settings"] else "")
                + f"best fixed "
                f"{best} {fixed[best]:.1f}; K=0 {fixed.get('K=0', 0):.1f}; "
                + "; ".join(f"{n} {v:.1f}" for n, v in st["peers"].items())]
        if "peers_pooled" in st:
            fp = {n: v["tokens_per_s_pooled"] for n, v in st["settings"].items() if n.startswith("K=")}
            bp = max(fp, key=fp.get)
            out += ["", f"The stream's {st.get('rounds', '?')} rounds pooled (every token over every ms), tok/s: plan "
                    f"{st['settings']['plan']['tokens_per_s_pooled']:.1f}; best fixed {bp} {fp[bp]:.1f}; "
                    + "; ".join(f"{n} {v:.1f}" for n, v in st["peers_pooled"].items())
                    + ". The plan over each, paired by round (median of the per-round ratios): "
                    + "; ".join(f"{n} {v['plan_over_this_paired']:.3f}" for n, v in st["settings"].items()
                                if n != "plan")]
        if "by_plan_range" in st["settings"]["plan"]:
            plan_by = st["settings"]["plan"]["by_plan_range"]
            out += ["", "Stream steps by the plan's ranges of live rows (tok/s of those steps, joins excluded): "
                    + "; ".join(f"{rng}: plan {v['tokens_per_s'] or 0:.1f}, {best} "
                                f"{st['settings'][best]['by_plan_range'][rng]['tokens_per_s'] or 0:.1f}"
                                for rng, v in plan_by.items())]
        if "by_live_rows" in st["settings"]["plan"]:
            best_k = int(best.split("=")[1])
            differ = [b for lo, hi, k in doc["plan"]["ranges"] if k != best_k for b in range(lo, hi + 1)]
            plan_b, best_b = st["settings"]["plan"]["by_live_rows"], st["settings"][best]["by_live_rows"]
            cells = [f"{b}: plan {plan_b[str(b)]['tokens_per_s']:.1f} ({plan_b[str(b)]['tokens_per_step']:.2f}), "
                     f"{best} {best_b[str(b)]['tokens_per_s']:.1f} ({best_b[str(b)]['tokens_per_step']:.2f})"
                     for b in differ if str(b) in plan_b and str(b) in best_b]
            if cells:
                out += ["", f"Stream steps at the live rows where the plan's K is not {best}, pooled over rounds "
                        "(tok/s, tokens per step): " + "; ".join(cells)]
    out += ["", "Goals: max regret {:.1f} % (<= 3 %: {}); max prediction error {:.1f} % (<= 10 %: {}); greedy "
            "equal everywhere: {}{}".format(
                100 * (g["max_regret"] or 0), g["regret_le_3pct_everywhere"], 100 * (g["max_prediction_error"] or 0),
                g["prediction_within_10pct_everywhere"], g["greedy_equal_everywhere"],
                "" if "stream_plan_vs_best_fixed" not in g else
                "; stream plan / best fixed {:.3f}, >= every fixed K: {}, >= every peer: {}".format(
                    g["stream_plan_vs_best_fixed"], g["stream_plan_ge_every_fixed"], g["stream_plan_ge_every_peer"])),
            ""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
