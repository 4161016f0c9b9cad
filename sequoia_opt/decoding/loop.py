"""The decoding loop: one :class:`Decoder` for plain decoding and every speculative policy, any target face,
any batch size (a batch of one is one row).

Tree speculative decoding (Sequoia, Chen et al. 2024; SpecInfer, Miao et al. 2024; Medusa, Cai et al. 2024):
a drafting policy proposes a tree of candidates per row, the target verifies every row's tree in one forward
with tree attention, a path is accepted exactly, and the target and the policy's drafters commit it. With no
policy every tree is the root alone: plain autoregressive decoding, through the same forward, cache and stop
rules, so a speedup measures speculation and nothing else.

One step, in named methods:

1. :meth:`Decoder.draft` — the target face says each row's room (cache slots, positions:
   :class:`~sequoia_opt.decoding.step_tree.Room`); the policy grows one
   :class:`~sequoia_opt.decoding.step_tree.StepTree` per row; a tree past its room is clipped, exactly
   (:meth:`~sequoia_opt.decoding.step_tree.StepTree.within`; the only clipping there is).
2. :meth:`Decoder.verify` — one target forward over every row's tree (:meth:`TargetFace.verify`).
3. :meth:`Decoder.accept` — per row, the accepted path and the bonus token: greedy, the target's argmax walk
   (:func:`~sequoia_opt.decoding.sampling.verify_greedy`); sampling, at each node its candidate groups against
   the distributions they were drawn from (one group with q: Sequoia Algorithm 2,
   :func:`~sequoia_opt.decoding.sampling.verify_sampling_node`; a point-mass group:
   :func:`~sequoia_opt.decoding.sampling.verify_point_mass_node`; several groups: SpecInfer's multi-step
   speculative sampling, :func:`~sequoia_opt.decoding.sampling.verify_groups_node`).
4. :meth:`Decoder.commit` — emit (:meth:`RowState.emit`, the only stop rules), the target commits the
   paths (KV compaction, or llama.cpp's ``seq_rm``), the policy commits them to its drafters; then the
   policy observes the step and finished rows leave the batch.

Exactness: under greedy decoding every row's output is the target's greedy decoding of that prompt alone
(siblings carry distinct tokens; up to float summation order of batched GEMMs); under sampling each row's
output is distributed as the target's temperature / top-p sampling.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from ..attention import resolve_backend
from ..errors import DecodingError
from ..model import Transformer
from .forward import check_capacity, check_max_new_tokens, check_prompt, is_whole
from .policy import DraftingPolicy, StepView
from .sampling import (Acceptance, NodeVisit, argmax_tokens, process_logits, sample_categorical, verify_greedy,
                       verify_groups_node, verify_point_mass_node, verify_sampling_node)
from .state import DecodeState, DraftSettings, RowState, eos_set
from .stats import BatchResult, BatchStep, Clock, GenerationResult, StepStats
from .step_tree import StepTree, TreeBuffers, _ROOT_ONLY
from .target import TargetFace, TransformerTarget

__all__ = ["Decoder", "DEFAULT_MAX_LEN", "plain_decoder", "AutoregressiveDecoder", "autoregressive_generate",
           "keep_order"]

DEFAULT_MAX_LEN = 4096  # default cache slots (plus the largest tree) when a decoder is given no max_len


def keep_order(finished: Sequence[bool]) -> list[int]:
    """The batch's rows after finished ones leave: the new order as old row indices (row i of the new batch was
    row ``keep[i]``). A live row keeps its place; a finished row's place among the first K (K live rows) takes
    the last live row past K, as a server's slot table refills a freed slot, so only as many rows move as
    finished ones left holes (at most), not every row after the first that left.

    Why not keep them in order: every KV cache moves each row that changes place (its committed prefix, every
    layer), and in a stream of staggered requests a row leaves almost every step. Demo target at 16 rows of
    ~110 committed tokens on this 2-core CPU: 25-35 ms of bookkeeping in a step of ~180 ms when the rows after the
    leaver shifted up, about half the batch each time.

    Example: ``[False, True, False, False, True, False]`` -> ``[0, 5, 2, 3]``.
    """
    K = sum(1 for f in finished if not f)
    tail = [b for b in range(K, len(finished)) if not finished[b]]
    return [b if not finished[b] else tail.pop() for b in range(K)]


def _check_generator(generator: Any) -> None:
    """Raise DecodingError unless ``generator`` is a torch.Generator (an int seed passed as the generator failed
    inside the first sampled step, and greedy decoding never noticed). Any device: the sampling rules draw on the
    generator's device and move the numbers to the data's (:mod:`~sequoia_opt.decoding.sampling`)."""
    if not isinstance(generator, torch.Generator):
        raise DecodingError(f"generator must be a torch.Generator (seed one with .manual_seed), got "
                            f"{type(generator).__name__}")


def _check_number(name: str, value: Any) -> float:
    """``value`` as a float, or DecodingError naming ``name`` (a string, None or a bool reached the range checks'
    comparisons and failed there with a TypeError, or, for True, decoded at temperature 1)."""
    if isinstance(value, (bool, str, bytes)):
        raise DecodingError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float64
        raise DecodingError(f"{name} must be a number, got {value!r}") from None


class Decoder:
    """The one decoding loop (module docstring).

    Args:
        target: a :class:`~sequoia_opt.model.Transformer` (wrapped in a
            :class:`~sequoia_opt.decoding.target.TransformerTarget` with ``max_len`` slots, ``max_batch`` rows,
            ``backend``) or any :class:`TargetFace` (llama.cpp: ``sequoia_opt.engines.llamacpp``).
        policy: the drafting policy (``sequoia_opt.drafting.policies``), bound to this decoder (one decoder per
            policy); None = plain decoding.
        temperature: 0 = greedy (output = the target's greedy decoding); > 0 = speculative sampling (output
            distributed as the target's temperature / top-p sampling).
        top_p: nucleus mass in (0, 1], applied to the target and to model drafters alike.
        generator: random source for sampling; None = a generator on the target's device seeded with 0. It seeds
            every request's own generator (one seed drawn per request, in order, when the request starts or
            joins, unless the request brings its own ``seeds``), and each row drafts and verifies from its own
            alone: a row's tokens do not depend on which other requests share its batch while the steps' trees do
            not either (a static tree; a schedule or adaptive policy chooses its tree from the batch, so there a row
            is exact in distribution but draws differently; vLLM and SGLang seed per request too). The attribute
            ``generator`` may be replaced between generations.
        eos_ids: ids (or one id) that stop a row (its first EOS is emitted, nothing after it).
        backend: attention backend ``"auto" | "torch" | "cuda"`` of a Transformer target; with a face without
            a ``backend`` attribute, that of the policy's model drafters.
        max_len: KV cache slots per row of a Transformer target (and of model drafters); default
            ``min(context, 4096) + policy.max_size`` (``min(context, 4096)`` for plain decoding). Any
            ``max_len >= 1`` is accepted: trees are clipped where they do not fit. A :class:`TargetFace` has its
            own ``max_len``, which model drafters take too: leave it out (another value is refused).
        max_batch: the most prompts one generation decodes together (rows allocated).

    Requests: exactly those plain decoding with the same ``max_len`` serves (:meth:`check`); never refused
    because of the tree, which is clipped near the end of the context or the cache.

    Raises:
        DecodingError: a drafter with another vocabulary or device than the target, a bad temperature / top_p,
            ``max_len`` or ``max_batch`` below 1, a batch larger than the policy or the target face serves, a
            policy node wider than the face verifies, a face serving a batch without ``keep``, a ``max_len``
            other than a face's own, a drafter already bound to another decoder, a generator that is not a
            torch.Generator, ``eos_ids`` that are not token ids or lie outside the target's vocabulary, an
            attention backend that is unknown or absent here.
    """

    def __init__(self, target: Transformer | TargetFace, policy: DraftingPolicy | None = None, *,
                 temperature: float = 0.0, top_p: float = 1.0, generator: torch.Generator | None = None,
                 eos_ids: int | Iterable[int] = (), backend: str = "auto", max_len: int | None = None,
                 max_batch: int = 1) -> None:
        temperature, top_p = _check_number("temperature", temperature), _check_number("top_p", top_p)
        try:
            process_logits(torch.zeros(1), temperature, top_p)  # validates temperature and top_p
        except ValueError as err:
            raise DecodingError(str(err)) from None
        if not is_whole(max_batch) or max_batch < 1:
            raise DecodingError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if backend != "auto" and isinstance(target, (Transformer, TargetFace)):  # an unknown backend, or cuda
            try:                                                                   # where there is none, named
                resolve_backend(backend, target.device)
            except (ValueError, RuntimeError) as err:
                raise DecodingError(str(err)) from None
        if isinstance(target, Transformer):
            if max_len is None:
                context = target.config.max_position_embeddings
                max_len = min(context, DEFAULT_MAX_LEN) + (policy.max_size if policy is not None else 0)
            face: TargetFace = TransformerTarget(target, max_len=max_len, max_batch=max_batch, backend=backend)
        elif isinstance(target, TargetFace):
            if max_len is not None and max_len != target.max_len:  # it sizes a Transformer target's cache only
                raise DecodingError(f"max_len={max_len!r} sizes the cache of a Transformer target; {target.name} "
                                    f"has its own: max_len={target.max_len} (leave max_len out)")
            face = target
        else:
            raise DecodingError(f"target must be a Transformer or a TargetFace, got {type(target).__name__}")
        if max_batch > face.max_batch:
            raise DecodingError(f"{face.name} serves at most {face.max_batch} rows per step, not {max_batch}")
        if max_batch > 1 and type(face).keep is TargetFace.keep:  # a finished row would leave its cache row behind
            raise DecodingError(f"{face.name} does not implement keep(rows), which a batch needs (rows finish at "
                                f"different steps): implement it, or decode with max_batch=1, not {max_batch}")
        self.face, self.policy = face, policy
        self.max_batch = int(max_batch)
        self.vocab_size, self.device = face.vocab_size, face.device
        self.context, self.max_len = face.context, face.max_len
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.greedy = self.temperature == 0
        self.eos_ids = eos_set(eos_ids)
        outside = sorted(t for t in self.eos_ids if t >= self.vocab_size)
        if outside:  # never emitted, so never a stop: every row ran to max_new_tokens, silently
            raise DecodingError(f"eos_ids {outside} are outside {face.name}'s vocabulary [0, {self.vocab_size}): it "
                                "can never emit them, so no row would stop on them (a tokenizer of another model?)")
        if generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(0)
        _check_generator(generator)
        drafters_backend = getattr(face, "backend", None) or resolve_backend(backend, self.device)
        self._settings = DraftSettings(device=self.device, max_len=self.max_len, max_batch=self.max_batch,
                                       backend=drafters_backend, temperature=self.temperature,
                                       top_p=self.top_p, generator=generator,
                                       tree_depth=policy.max_depth if policy is not None else 0, target=face)
        self._want = 1
        if policy is not None:
            self._check_policy(policy)
            policy.bind(self._settings)
            self._want = max(1, int(policy.max_size))
        self._root = TreeBuffers.build(_ROOT_ONLY, self.device)
        self._clock = Clock(self.device)
        self._prefills = 0  # prefills so far: a state is served only by the decoder and prefill that made it

    def _check_policy(self, policy: DraftingPolicy) -> None:
        names = policy.names
        if not policy.drafters:  # nothing would be bound or prefilled: every drafter call fails or drafts nothing
            raise DecodingError(f"the {type(policy).__name__} lists no drafters: set its drafters (and names) in its "
                                "constructor; plain decoding is Decoder(target) with no policy")
        if len(names) != len(policy.drafters):  # zip below would skip the unnamed drafters' checks
            raise DecodingError(f"the policy names {len(names)} drafter(s) ({', '.join(map(str, names))}) but has "
                                f"{len(policy.drafters)}: one name per drafter")
        for name, d in zip(names, policy.drafters):
            V = getattr(d, "vocab_size", self.vocab_size)
            if V != self.vocab_size:
                raise DecodingError(f"drafter {name!r} has a vocabulary of {V} tokens but the target "
                                    f"{self.vocab_size}; every drafter must share the target's tokenizer (a draft "
                                    "model padded to another size: draft.fit_vocab(target.config.vocab_size) "
                                    "first)")
            dev = getattr(d, "device", self.device)
            if torch.device(dev) != self.device:
                raise DecodingError(f"drafter {name!r} is on {dev} but the target on {self.device}")
        if self.max_batch > policy.max_rows:
            raise DecodingError(f"the {type(policy).__name__} serves at most {policy.max_rows} row(s) per step, not "
                                f"a batch of {self.max_batch}")
        width = getattr(policy, "max_width", None)
        if self.face.max_width is not None and width is not None and width > self.face.max_width:
            raise DecodingError(f"{self.face.name} verifies trees of at most {self.face.max_width} children per "
                                f"node; this policy grows {width}")

    # ------------------------------------------------------------------ attributes
    @property
    def generator(self) -> torch.Generator:
        """The random source of drafting and verification; may be replaced between generations (drafters read
        it from the shared :class:`~sequoia_opt.decoding.state.DraftSettings`)."""
        return self._settings.generator

    @generator.setter
    def generator(self, generator: torch.Generator) -> None:
        _check_generator(generator)
        self._settings.generator = generator

    @property
    def target_model(self) -> Transformer | None:
        """The torch target model (None for another face)."""
        return getattr(self.face, "model", None) if isinstance(self.face, TransformerTarget) else None

    @property
    def target_cache(self):
        """The torch target's KV cache (all rows; None for another face)."""
        return self.face.cache if isinstance(self.face, TransformerTarget) else None

    # ------------------------------------------------------------------ requests
    def check(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Validate a request before any forward; returns the prompt as ints.

        Raises:
            DecodingError: empty prompt, an id outside the vocabulary, ``max_new_tokens`` < 0, or a prompt +
                ``max_new_tokens`` that does not fit the target's context or ``max_len`` slots
                (:func:`~sequoia_opt.decoding.forward.check_capacity`): what plain decoding refuses too.
        """
        prompt = check_prompt(prompt_ids, self.vocab_size)
        M = check_max_new_tokens(max_new_tokens)
        check_capacity(len(prompt), M, cache_len=self.max_len, context=self.context, model=self.face.name)
        return prompt

    def check_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """:meth:`check` for every prompt of a batch (at most ``max_batch``); messages name the prompt.

        Raises:
            DecodingError: no prompts, more than ``max_batch``, or a prompt :meth:`check` refuses.
        """
        prompts = list(prompts)
        if not prompts:
            raise DecodingError("the batch is empty: give at least one prompt")
        if len(prompts) > self.max_batch:
            raise DecodingError(f"a batch of {len(prompts)} prompts exceeds this decoder's max_batch="
                                f"{self.max_batch} rows")
        out = []
        for i, p in enumerate(prompts):
            try:
                out.append(self.check(p, max_new_tokens))
            except DecodingError as err:
                raise DecodingError(f"prompt {i} of {len(prompts)} (0-based) cannot be decoded in this batch: "
                                    f"{err}") from None
        return out

    # ------------------------------------------------------------------ generation
    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, seed: int | None = None) -> GenerationResult:
        """Decode up to ``max_new_tokens`` new tokens after one prompt (a batch of one).

        Args:
            seed: the request's sampling seed (the same tokens as the request decoded in a batch with the same
                seed, where the policy's trees do not depend on the batch: the ``generator`` argument above);
                None: one drawn from :attr:`generator`.

        Raises:
            DecodingError: as :meth:`check`, before any forward; a seed outside -2^63 .. 2^64 - 1; unusable model
                output (NaN / inf logits), naming the model or the drafter.
        """
        state = self.start(prompt_ids, max_new_tokens, seed)
        while not state.finished:
            self.step(state)
        return state.result

    @torch.inference_mode()
    def generate_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                       seeds: Sequence[int] | None = None) -> BatchResult:
        """Decode up to ``max_new_tokens`` new tokens after each prompt, all in one batch; each row stops on its
        own (EOS, ``max_new_tokens``) and leaves the batch. ``seeds``: one sampling seed per prompt (each row
        samples from its own generator: the tokens it would have decoded alone with that seed, where the policy's
        trees do not depend on the batch: the class's ``generator`` argument); None: drawn
        from :attr:`generator`, one per prompt in order.

        Returns:
            :class:`~sequoia_opt.decoding.stats.BatchResult`: per prompt, in order, its result; per step, a
            :class:`~sequoia_opt.decoding.stats.BatchStep`.
        """
        state = self.start_batch(prompts, max_new_tokens, seeds)
        while not state.finished:
            self.step(state)
        return BatchResult(state.results, state.steps, state.prefill_ms)

    @torch.inference_mode()
    def start(self, prompt_ids: Sequence[int], max_new_tokens: int, seed: int | None = None) -> DecodeState:
        """Check one request and prefill it (:meth:`start_batch` with a batch of one; ``seed`` as :meth:`generate`)."""
        prompt = self.check(prompt_ids, max_new_tokens)
        return self._start([prompt], int(max_new_tokens), self._seeds(1, None if seed is None else [seed]))

    @torch.inference_mode()
    def start_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    seeds: Sequence[int] | None = None) -> DecodeState:
        """Check every request, then prefill: the target takes ``prompt[:-1]`` of each row, the policy the
        prompts; the last prompt token of each row is its first root. ``seeds`` as :meth:`generate_batch`. The
        state is already finished when ``max_new_tokens == 0``."""
        checked = self.check_batch(prompts, max_new_tokens)
        return self._start(checked, int(max_new_tokens), self._seeds(len(checked), seeds))

    def _seeds(self, n: int, seeds: Sequence[int] | None) -> list[int]:
        """The sampling seeds of ``n`` requests: ``seeds`` checked (one per request, each within
        torch.Generator.manual_seed's range), or n drawn from :attr:`generator`. Raises DecodingError."""
        if seeds is None:
            drawn = torch.randint(0, 2**62, (n,), generator=self.generator, device=self.generator.device)
            return [int(v) for v in drawn.tolist()]
        seeds = list(seeds)
        if len(seeds) != n:
            raise DecodingError(f"{len(seeds)} seeds for {n} prompts: give one per prompt")
        for v in seeds:
            if not is_whole(v) or not -(2**63) <= int(v) <= 2**64 - 1:
                raise DecodingError(f"a seed must be an integer in -2^63 .. 2^64 - 1, got {v!r}")
        return [int(v) for v in seeds]

    def _row_generator(self, seed: int) -> torch.Generator:
        """A request's own random source: a generator on the decoder's generator's device seeded with ``seed``."""
        g = torch.Generator(device=self.generator.device)
        g.manual_seed(seed)
        return g

    def _start(self, prompts: list[list[int]], M: int, seeds: list[int]) -> DecodeState:
        results = [GenerationResult(tokens=[], prompt_len=len(p)) for p in prompts]
        rows = [RowState(seq=list(p), cached=len(p) - 1, max_new_tokens=M, result=r, index=i,
                         generator=self._row_generator(sd))
                for i, (p, r, sd) in enumerate(zip(prompts, results, seeds))]
        state = DecodeState(rows=rows, results=results)
        if M == 0:
            for r in results:
                r.stop_reason = "empty"
            state.rows = []
            return state
        t0 = self._clock.now()
        self._claim(state)
        if self.policy is not None:
            self.policy.reset()
        self.face.prefill(prompts)
        if self.policy is not None:
            self.policy.prefill(state)
        state.prefill_ms = self._clock.now() - t0
        for r in results:
            r.prefill_ms = state.prefill_ms
        return state

    @torch.inference_mode()
    def join(self, state: DecodeState, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             seeds: Sequence[int] | None = None) -> list[int]:
        """Requests join a running generation between two steps (continuous batching, as a server admits
        requests): each is checked as :meth:`check` does, the target face prefills it into a new row after the
        live ones (:meth:`TargetFace.join`), and the policy's drafters take it in
        (:meth:`~sequoia_opt.decoding.policy.DraftingPolicy.join`). A state whose rows all finished starts over
        with the joiners. Exact as a batch is: each row decodes as it would alone (``seeds`` as
        :meth:`generate_batch`: with the same seed, the tokens it would decode alone where the trees do not depend
        on the batch).

        Returns:
            the indices of the joiners' results in ``state.results``.

        Raises:
            DecodingError: as :meth:`check`; more live rows than ``max_batch``; a face or drafter that cannot take
                rows into a running batch; a live state this decoder's caches no longer hold, or another decoder's;
                seeds as :meth:`generate_batch` refuses.
        """
        new = [self.check(p, max_new_tokens) for p in prompts]
        if state.rows:
            self._check_owner(state)
        if state.batch + len(new) > self.max_batch:
            raise DecodingError(f"{state.batch} live rows and {len(new)} joining exceed this decoder's "
                                f"max_batch={self.max_batch} rows")
        M = int(max_new_tokens)
        row_seeds = self._seeds(len(new), seeds)
        first = len(state.results)
        results = [GenerationResult(tokens=[], prompt_len=len(p)) for p in new]
        state.results.extend(results)
        if M == 0:
            for r in results:
                r.stop_reason = "empty"
            return list(range(first, first + len(new)))
        rows = [RowState(seq=list(p), cached=len(p) - 1, max_new_tokens=M, result=r, index=first + j,
                         generator=self._row_generator(sd))
                for j, (p, r, sd) in enumerate(zip(new, results, row_seeds))]
        t0 = self._clock.now()
        if not state.rows:  # nothing live: the caches start over with the joiners
            self._claim(state)
            state.rows = rows
            if self.policy is not None:
                self.policy.reset()
            self.face.prefill(new)
            if self.policy is not None:
                self.policy.prefill(state)
        else:
            B = state.batch
            self.face.join(state, new)
            state.rows.extend(rows)
            if self.policy is not None:
                self.policy.join(state, list(range(B, B + len(rows))))
        ms = self._clock.now() - t0
        state.prefill_ms += ms
        for r in results:
            r.prefill_ms = ms
        return list(range(first, first + len(new)))

    @torch.inference_mode()
    def step(self, state: DecodeState) -> BatchStep:
        """One draft / verify / accept / commit step over the live rows; appends a
        :class:`~sequoia_opt.decoding.stats.StepStats` to each row's result and the
        :class:`~sequoia_opt.decoding.stats.BatchStep` to ``state.steps``.

        Raises:
            DecodingError: a finished generation; a state this decoder's caches no longer hold (it started another
                since) or another decoder's; a row without room for its root (a state :meth:`check` refuses);
                unusable model output.
        """
        if state.finished:
            raise DecodingError("this generation has already finished")
        self._check_owner(state)
        clock = self._clock
        t0 = clock.now()
        trees = self._draft(state)
        t1 = clock.now()
        logits = self.face.verify(state, trees)
        t2 = clock.now()
        accs = [self._accept(t, lg, self._settings.generator_of(r)) for r, t, lg in zip(state.rows, trees, logits)]
        rows = state.rows  # the list is replaced, never changed, when rows leave
        emitted = self._commit(state, trees, accs)
        if self.policy is not None:
            self.policy.observe(state, StepView(trees, logits, accs, emitted))
        if any(r.finished for r in rows):
            keep = keep_order([r.finished for r in rows])
            if keep:
                self.face.keep(keep)
                if self.policy is not None:
                    self.policy.keep(keep)
            state.rows = [rows[b] for b in keep]
        t3 = clock.now()
        pol = self.policy
        multi = pol is not None and pol.reports_drafters
        d_ms = tuple(pol.drafter_ms) if multi else ()
        d_calls = tuple(pol.drafter_calls) if multi else ()
        row_stats = []
        for row, tree, acc, em in zip(rows, trees, accs, emitted):
            path = acc.path
            row_stats.append(StepStats(
                tokens=tuple(em), accepted_len=len(em), accepted_nodes=len(path) - 1,
                accepted_ranks=tuple(tree.rank_of(i) for i in path[1:]), visits=acc.visits, draft_ms=t1 - t0,
                verify_ms=t2 - t1, bookkeeping_ms=t3 - t2, tree_size=tree.n, tree_depth=tree.tree_depth,
                accepted_drafters=tuple(tree.source_of(i) for i in path[1:]) if multi else (),
                drafter_ms=d_ms, drafter_calls=d_calls))
            row.result.steps.append(row_stats[-1])
        step = BatchStep(batch=len(rows), tree_size=max(t.n for t in trees),
                         tree_depth=max(t.tree_depth for t in trees), emitted=tuple(len(e) for e in emitted),
                         draft_ms=t1 - t0, verify_ms=t2 - t1, bookkeeping_ms=t3 - t2, rows=tuple(row_stats))
        state.steps.append(step)
        return step

    # ------------------------------------------------------------------ the four named steps
    @torch.inference_mode()
    def draft(self, state: DecodeState) -> list[StepTree]:
        """Each live row's tree for this step: the policy's (the root alone without a policy), clipped to the
        row's room (:meth:`~sequoia_opt.decoding.step_tree.StepTree.within`). Does not change ``state``
        (drafting again from the same state redoes the same work).

        Raises:
            DecodingError: a row without room for its root (a state :meth:`check` would have refused).
        """
        self._check_owner(state)
        return self._draft(state)

    def _claim(self, state: DecodeState) -> None:
        """The caches are about to hold ``state``'s rows: it is this decoder's live generation from now on."""
        self._prefills += 1
        state.owner = (self, self._prefills)

    def _check_owner(self, state: DecodeState) -> None:
        """Refuse a state whose rows are not in this decoder's caches (another decoder's, or one this decoder
        started before its latest start: its caches now hold that one)."""
        owner = state.owner
        if owner is None or owner[0] is not self:
            raise DecodingError("this state was started by another decoder: step it with the decoder that made it")
        if owner[1] != self._prefills:
            raise DecodingError("this decoder started another generation after this one, and its caches now hold "
                                "that one: a decoder serves one generation at a time (make a decoder per live "
                                "generation, or join requests into one batch)")

    def _draft(self, state: DecodeState) -> list[StepTree]:  # the step's own calls skip the inference-mode guard
        rooms = self.face.room(state, self._want)
        for row, room in zip(state.rows, rooms):
            if room.nodes < 1 or room.depth < 0:
                raise DecodingError(
                    f"no room for the next token at slot / position {row.cached}: {self.face.name} has a context of "
                    f"{self.context} positions and {self.max_len} cache slots (a state check() would have refused)")
        if self.policy is None:
            return [StepTree.static(self._root, torch.tensor([r.root], dtype=torch.int64, device=self.device))
                    for r in state.rows]
        trees = self.policy.draft(state, rooms)
        if len(trees) != len(rooms):
            raise DecodingError(f"the {type(self.policy).__name__} drafted {len(trees)} trees for {len(rooms)} rows")
        return [t.within(room) for t, room in zip(trees, rooms)]

    @torch.inference_mode()
    def verify(self, state: DecodeState, trees: Sequence[StepTree]) -> list[torch.Tensor]:
        """One target forward over every row's tree; per row (n_b, V) logits."""
        self._check_owner(state)
        return self.face.verify(state, trees)

    @torch.inference_mode()
    def accept(self, tree: StepTree, target_logits: torch.Tensor,
               generator: torch.Generator | None = None) -> Acceptance:
        """One row's accepted path and bonus token (module docstring, step 3).

        Args:
            tree: the row's verified tree.
            target_logits: (n, V) the target's logits over it.
            generator: the row's random source (its :attr:`RowState.generator`); None: :attr:`generator`.

        Raises:
            DecodingError: target logits with NaN or +inf where they are used (no token is made from them),
                naming the target; a candidate group's distribution the rule cannot use, naming the drafter,
                the node and its depth.
        """
        if generator is not None:
            _check_generator(generator)
        return self._accept(tree, target_logits, self.generator if generator is None else generator)

    def _accept(self, tree: StepTree, target_logits: torch.Tensor, gen: torch.Generator) -> Acceptance:
        try:
            if self.greedy:
                top = argmax_tokens(target_logits)
                if len(top) == 1:  # the root alone (plain decoding): its argmax is the token
                    return Acceptance((0,), (top[0],), ())
                return verify_greedy(top, tree.token_list, tree.children)
        except ValueError as err:
            raise DecodingError(f"{self.face.name} produced unusable output: {err}") from None
        node, depth, path, visits = 0, 0, [0], []
        while True:
            try:
                p = process_logits(target_logits[node], self.temperature, self.top_p)  # (V,)
            except ValueError as err:
                raise DecodingError(f"{self.face.name} produced unusable output: {err} (at tree node {node}, "
                                    f"depth {depth})") from None
            ch = tree.children[node]
            if not ch:
                bonus = int(sample_categorical(p, gen).item())
                break
            groups = tree.groups(node)
            try:
                if len(groups) == 1:
                    g = groups[0]
                    r, tok = (verify_sampling_node(p, g.q, g.tokens, gen) if g.q is not None
                              else verify_point_mass_node(p, g.tokens, gen))
                    hit = None if r is None else (0, r)
                else:
                    hit, tok = verify_groups_node(p, groups, gen)
            except ValueError as err:
                who = sorted({self._drafter_name(g.drafter) for g in groups})
                raise DecodingError(f"cannot verify tree node {node} (depth {depth}): the candidates of "
                                    f"{', '.join(who)} come with a distribution the residual rule cannot use "
                                    f"({err})") from None
            if hit is None:
                visits.append(NodeVisit(depth, len(ch), None))
                bonus = tok
                break
            child = tree.group_children(node)[hit[0]][hit[1]]
            visits.append(NodeVisit(depth, len(ch), ch.index(child)))
            node = child
            path.append(node)
            depth += 1
        toks = tree.token_list
        return Acceptance(tuple(path), tuple(toks[i] for i in path[1:]) + (bonus,), tuple(visits))

    def _drafter_name(self, k: int) -> str:
        names = self.policy.names if self.policy is not None else ()
        return f"drafter {names[k]!r}" if 0 <= k < len(names) else f"drafter {k}"

    @torch.inference_mode()
    def commit(self, state: DecodeState, trees: Sequence[StepTree], accs: Sequence[Acceptance]) -> list[list[int]]:
        """Emit each row's accepted tokens and bonus (the stop rules), commit the paths to the target and to the
        policy's drafters, and advance the rows (``cached`` grows by the path's length; the bonus is the next
        root). Returns the tokens each row emitted."""
        self._check_owner(state)
        return self._commit(state, trees, accs)

    def _commit(self, state: DecodeState, trees: Sequence[StepTree], accs: Sequence[Acceptance]) -> list[list[int]]:
        eos = self.eos_ids
        emitted = [row.emit(acc.tokens, eos) for row, acc in zip(state.rows, accs)]
        paths = [acc.path for acc in accs]
        self.face.commit(state, paths)
        if self.policy is not None:
            self.policy.commit(state, trees, paths)
        for row, path in zip(state.rows, paths):
            row.cached += len(path)
        return emitted


def plain_decoder(target: Transformer | TargetFace, **kwargs) -> Decoder:
    """Plain autoregressive decoding, the baseline every speedup is measured against: ``Decoder(target)`` (no
    policy: every step's tree is the root alone, one target forward per token through the same forward, cache
    and stop rules). Arguments as :class:`Decoder`."""
    return Decoder(target, None, **kwargs)


def AutoregressiveDecoder(model: Transformer, **kwargs) -> Decoder:  # noqa: N802 (a factory)
    """:func:`plain_decoder`; the name of earlier releases, kept one release."""
    return Decoder(model, None, **kwargs)


def autoregressive_generate(model: Transformer, prompt_ids: Sequence[int], max_new_tokens: int,
                            **kwargs) -> GenerationResult:
    """One-shot plain decoding (builds a decoder with just enough cache slots; keep a decoder instead when
    timing several prompts). Arguments and errors as :class:`Decoder` and :meth:`Decoder.generate`."""
    if kwargs.get("max_len") is None:  # just enough slots (the check still refuses what does not fit the context)
        kwargs["max_len"] = min(model.config.max_position_embeddings, len(prompt_ids) + max(int(max_new_tokens), 1))
    return Decoder(model, None, **kwargs).generate(prompt_ids, max_new_tokens)
