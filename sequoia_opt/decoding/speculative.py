"""Tree speculative decoding: a drafter proposes a token tree, the target verifies it in one forward, a path
is accepted exactly, and the target and the drafter commit it to their caches (Sequoia, Chen et al. 2024;
SpecInfer, Miao et al. 2024; Medusa, Cai et al. 2024 for the tree buffers).

The proposer is a :class:`~sequoia_opt.decoding.drafters.Drafter` (``decoding/drafters/``): a draft
:class:`Transformer` passed as ``draft`` is wrapped in a :class:`~sequoia_opt.decoding.drafters.ModelDrafter`
(a draft model run once per tree level, with its own cache), any other drafter is passed as it is. The
decoder owns the tree, its clipping near the end, the target and its cache, verification, acceptance and
the stop rules; the drafter owns its candidates, their distributions and its cache.

State between steps (batch size 1): the committed tokens ``x_0 .. x_L``; the target cache holds
``x_0 .. x_{L-1}`` at slots ``0 .. L-1``; ``x_L`` (the last committed token, not cached) is the ROOT of the
next tree. Node i of the tree is written at slot ``L + i`` at position ``L + depth[i]``. The prefill feeds the
prompt minus its last token; the last prompt token is the first root.

Near the end. A step whose whole tree would not fit uses the tree clipped to its first d + 1 levels instead
(the first ``level_slices[d].stop`` nodes: levels are contiguous in breadth-first order), with the largest d
such that the target writes slots up to ``L + n_d - 1`` and positions up to ``L + d`` (inside its cache and its
``max_position_embeddings``) and the drafter can propose that tree (its limit,
:meth:`Drafter.max_root_for_depth`: for the draft model, which processes levels ``0 .. d-1``, positions up to
``L + d - 1`` and slots up to ``L + num_drafted_d - 1`` inside its own context and cache). Clipped nodes only
fed tokens that the context or ``max_new_tokens`` cuts off anyway, so output is unchanged. At ``d = 0`` (e.g.
once the root's position is past a shorter draft context) the step is root-only: no drafter call, the
target's one-token forward, i.e. a plain decoding step. The clipped buffers are compiled once per depth, on
first use, and kept by the decoder; the limits per depth are computed once (per tree:
:meth:`SpeculativeDecoder.set_tree` compiles a new tree between steps), so an unclipped step costs one
integer comparison.

One step, in named methods:

1. :meth:`SpeculativeDecoder.draft` — unless the step is root-only, :meth:`Drafter.propose` fills the step's
   tree: each node's children (k from the topology, assigned by rank) are the drafter's top-k tokens
   (greedy) or k samples without replacement from its q (sampling), with q returned for verification.
2. :meth:`SpeculativeDecoder.verify` — one target forward over all n nodes with the ancestor mask.
3. :meth:`SpeculativeDecoder.accept` — the accepted path: :func:`verify_greedy`, or per node
   :func:`verify_sampling_node` (Sequoia Algorithm 2) against the drafter's q, or, for a drafter without
   probabilities (:attr:`Drafter.has_probs` False), :func:`verify_point_mass_node` (the same rule with each
   candidate a point mass).
4. :meth:`SpeculativeDecoder.commit` — emit the accepted tokens plus the bonus token (stop rules applied),
   then move the accepted path's slots (scattered in breadth-first order) to consecutive slots after the
   prefix in the target cache with :meth:`ModelKVCache.compact`, and :meth:`Drafter.commit` the path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from ..attention import TreeMask, resolve_backend
from ..errors import DecodingError
from ..model import ModelKVCache, Transformer
from ..tree import Tree
from .buffers import TreeBuffers
from .core import (DEFAULT_MAX_LEN, cached_forward, check_request, describe_model, run_causal_chunk, truncate,
                   verify_error)
from .drafters import DraftOutput, Drafter, DraftSettings, ModelDrafter, root_tree
from .sampling import (Acceptance, NodeVisit, argmax_tokens, process_logits, sample_categorical, verify_greedy,
                       verify_point_mass_node, verify_sampling_node)
from .stats import Clock, GenerationResult, StepStats

__all__ = ["SpeculativeDecoder", "DecodeState", "DraftOutput"]


def _check_tree_width(tree: Tree, vocab_size: int) -> None:
    """Refuse a tree with a node of more children than the vocabulary has tokens (DecodingError)."""
    if tree.max_branching_used > vocab_size:
        raise DecodingError(
            f"the tree has a node with {tree.max_branching_used} children but the vocabulary has only "
            f"{vocab_size} tokens: a node cannot propose more distinct candidates than that")


@dataclass
class DecodeState:
    """The decoding state of one generation (batch size 1).

    Attributes:
        seq: every committed token, prompt then emitted tokens; ``seq[-1]`` is the root of the next tree.
        cached: L, the number of committed tokens in the target cache (slots ``[0, L)``); ``len(seq) == L + 1``.
        max_new_tokens: the generation's budget of new tokens.
        result: the :class:`GenerationResult` being filled (``result.tokens`` are the new tokens so far).
        finished: True once a stop rule fired.
        drafter: the decoder's :class:`Drafter` (it owns its cache and count).
        draft_cached: (read-only) committed tokens in the drafter's cache, its :attr:`Drafter.cached`.
    """

    seq: list[int]
    cached: int
    max_new_tokens: int
    result: GenerationResult
    finished: bool = False
    drafter: Drafter | None = field(default=None, repr=False, compare=False)

    @property
    def root(self) -> int:
        return self.seq[-1]

    def emit(self, tokens: Sequence[int], eos_ids: frozenset[int]) -> list[int]:
        """Emit a step's tokens (accepted nodes, then the bonus) after the stop rules (:func:`truncate`: the
        first EOS, ``max_new_tokens``) into ``result.tokens`` and ``seq``; on a stop set ``finished`` and the
        result's ``stop_reason``. Returns the tokens emitted."""
        result = self.result
        emitted, stop = truncate(tokens, self.max_new_tokens - len(result.tokens), eos_ids)
        result.tokens.extend(emitted)
        self.seq.extend(emitted)
        if stop is not None:
            self.finished, result.stop_reason = True, stop
        return emitted

    @property
    def draft_cached(self) -> int:
        """Committed tokens in the drafter's cache (slots ``[0, draft_cached)``), ``<= L``; 0 without a
        drafter cache. The drafter's own count (:attr:`Drafter.cached`)."""
        return self.drafter.cached if self.drafter is not None else 0


class SpeculativeDecoder:
    """Tree speculative decoding with exact verification, batch size 1.

    The target and drafter caches are allocated once here and shared by every generation of this decoder, so
    run one generation at a time per decoder (a :class:`DecodeState` is valid until the next :meth:`start`).

    Args:
        target: the model whose output is preserved.
        draft: the proposer: a draft :class:`Transformer` (wrapped in a :class:`ModelDrafter`) or any
            :class:`Drafter` (bound to this decoder, so one decoder per drafter); must share the target's
            vocabulary and device (a draft model's dtype may differ).
        tree: the speculation topology (n nodes, depth D), compiled once into :class:`TreeBuffers`
            (:meth:`set_tree` replaces it between steps).
        temperature: 0 = greedy (children are the draft's top-k, output = the target's greedy decoding);
            > 0 = speculative sampling (output distributed as the target's temperature / top-p sampling).
        top_p: nucleus mass in (0, 1], applied to target and draft alike (:func:`process_logits`).
        generator: random source for sampling (drafting and verification); None makes a generator on the
            target's device seeded with 0. Randomness is fresh every step; the attribute ``generator`` may be
            replaced between generations.
        eos_ids: token ids (or one id) that stop generation (the first EOS is emitted, nothing after it).
        backend: attention backend ``"auto" | "torch" | "cuda"``, resolved once here.
        max_len: slots of each preallocated KV cache (target and drafter, reused across prompts); default
            ``min(context, 4096) + n`` where ``context`` is the target's ``max_position_embeddings`` (a
            128k-context model would otherwise allocate its whole context). Any ``max_len >= 1`` is
            accepted: where a whole tree does not fit the remaining slots the step's tree is clipped (see
            the module docstring); a request whose tokens do not fit is refused (:meth:`check`).

    Requests: exactly those plain decoding (:class:`AutoregressiveDecoder` with the target, the same
    ``max_len``) serves are served, with the same output under greedy decoding. A tree deeper than the
    context, or larger than ``max_len``, is accepted and clipped at every step where it does not fit
    (rather than refused: a clipped step is still exact). A draft with a shorter context than the target's
    is used while the tree's drafted levels fit its context; after that the steps are root-only.

    Attributes:
        context: the target's ``max_position_embeddings`` (what requests are checked against).
        drafter: the :class:`Drafter` proposing the candidates.
        draft_context: the drafter's context (a draft model's ``max_position_embeddings``).
        draft_model, draft_cache: the :class:`ModelDrafter`'s model and cache (None for other drafters; the
            cache is None too when the tree has depth 0).

    Raises:
        DecodingError: different vocabularies or devices, a node with more children than the vocabulary
            has tokens, ``max_len < 1``, a bad temperature / top_p, ``draft`` neither a :class:`Transformer`
            nor a :class:`Drafter`, a drafter already bound to another decoder.
    """

    def __init__(self, target: Transformer, draft: Transformer | Drafter, tree: Tree, *,
                 temperature: float = 0.0, top_p: float = 1.0, generator: torch.Generator | None = None,
                 eos_ids: Iterable[int] = (), backend: str = "auto", max_len: int | None = None) -> None:
        V = target.config.vocab_size
        if isinstance(draft, Transformer):
            drafter = ModelDrafter(draft)
        elif isinstance(draft, Drafter):
            drafter = draft
        else:
            raise DecodingError(f"draft must be a Transformer or a Drafter, got {type(draft).__name__}")
        if drafter.vocab_size != V:
            raise DecodingError(
                f"the draft's vocabulary ({drafter.vocab_size} tokens) differs from the target's ({V}); "
                "speculative decoding needs a draft that shares the target's tokenizer")
        if drafter.device != target.device:
            raise DecodingError(f"the draft is on {drafter.device} but the target on {target.device}")
        _check_tree_width(tree, V)
        try:
            process_logits(torch.zeros(1), temperature, top_p)
        except ValueError as err:
            raise DecodingError(str(err)) from None
        self.context = target.config.max_position_embeddings
        n = tree.size
        self.max_len = int(max_len if max_len is not None else min(self.context, DEFAULT_MAX_LEN) + n)
        if self.max_len < 1:
            raise DecodingError(f"max_len must be >= 1 (one slot for a root-only step), got {self.max_len}")
        self.target_model, self.drafter, self.tree = target, drafter, tree
        self.vocab_size = V
        self.device = target.device
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.greedy = self.temperature == 0
        self.eos_ids = frozenset([int(eos_ids)] if isinstance(eos_ids, int) else (int(t) for t in eos_ids))
        self.backend = resolve_backend(backend, self.device)
        if generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(0)
        self.target_cache = target.new_cache(self.max_len)
        self._settings = DraftSettings(device=self.device, max_len=self.max_len, backend=self.backend,
                                       temperature=self.temperature, top_p=self.top_p, generator=generator,
                                       tree_depth=tree.tree_depth, target=target,
                                       target_cache=self.target_cache)
        drafter.bind(self._settings)
        self._masks: dict[int, TreeMask] = {}
        self._clock = Clock(self.device)
        self._use_tree(tree)

    def _use_tree(self, tree: Tree) -> None:
        """Compile ``tree`` into :class:`TreeBuffers` and its clipping limits (the constructor, :meth:`set_tree`)."""
        self.tree = tree
        self.buffers = TreeBuffers.build(tree, self.device)
        # clipping near the end: per depth d, the largest L (root slot and position) at which the tree
        # clipped to depth d fits; non-increasing in d. The whole tree fits while L <= _full_until.
        self._last_root = tuple(self._last_root_for_depth(d) for d in range(tree.tree_depth + 1))
        self._full_until = self._last_root[-1]
        self._clipped: dict[int, TreeBuffers] = {tree.tree_depth: self.buffers}  # compiled on first use

    def set_tree(self, tree: Tree) -> None:
        """Replace the decoder's tree between steps (an adaptive decoder's re-solve,
        :class:`~sequoia_opt.decoding.adaptive.AdaptiveTreeDecoder`).

        The new tree is compiled into :class:`TreeBuffers`, its clipping limits per depth are computed again
        (:meth:`Drafter.max_root_for_depth` for each of its depths) and the old tree's clipped buffers are
        dropped. The caches stay as they are: ``max_len`` was fixed at construction (a tree larger than the
        slots left is clipped, as always; a decoder meant to swap trees allocates for the largest it allows).
        Between steps the caches hold exactly the committed tokens whatever tree was used, and every step's
        output is exact for any tree, so swapping trees never changes greedy output (nor the sampled
        distribution). Call it between :meth:`step` s only, never inside one.

        Raises:
            DecodingError: a node with more children than the vocabulary has tokens; a tree of depth >= 1 for a
                decoder made with a root-only tree (its drafter was bound for no drafting: a draft model
                allocated no cache).
        """
        _check_tree_width(tree, self.vocab_size)
        if tree.tree_depth > 0 and self._settings.tree_depth == 0:
            raise DecodingError("this decoder was made with a root-only tree, so its drafter allocated nothing to "
                                "draft with; make the decoder with a tree of depth >= 1 to swap in deeper trees")
        self._use_tree(tree)

    @property
    def generator(self) -> torch.Generator:
        """The random source of drafting and verification; may be replaced between generations (the
        drafter reads it from the shared :class:`DraftSettings`)."""
        return self._settings.generator

    @generator.setter
    def generator(self, generator: torch.Generator) -> None:
        self._settings.generator = generator

    @property
    def draft_context(self) -> int:
        """The drafter's context (positions it can see)."""
        return self.drafter.context

    @property
    def draft_model(self) -> Transformer | None:
        """The draft model of a :class:`ModelDrafter`; None for other drafters."""
        return self.drafter.model if isinstance(self.drafter, ModelDrafter) else None

    @property
    def draft_cache(self) -> ModelKVCache | None:
        """The KV cache of a :class:`ModelDrafter` (None when the tree has depth 0); None for other drafters."""
        return self.drafter.cache if isinstance(self.drafter, ModelDrafter) else None

    # ------------------------------------------------------------------ public API
    def check(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Validate a request before any forward pass; returns the prompt as ints.

        Raises:
            DecodingError: empty prompt, an id outside the vocabulary, ``max_new_tokens`` < 0, or a prompt +
                ``max_new_tokens`` that does not fit the target's context or ``max_len`` slots
                (:func:`~sequoia_opt.decoding.core.check_capacity`): exactly what plain decoding of the
                target with the same ``max_len`` refuses. The tree never causes a refusal (it is clipped).
        """
        return check_request(prompt_ids, max_new_tokens, self.target_model, max_len=self.max_len, role="target")

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> GenerationResult:
        """Decode up to ``max_new_tokens`` new tokens after ``prompt_ids``.

        Args:
            prompt_ids: the prompt's token ids (at least one).
            max_new_tokens: the most tokens to emit (>= 0); generation also stops after the first EOS.

        Returns:
            :class:`GenerationResult` with the new tokens and one :class:`StepStats` per tree step.

        Raises:
            DecodingError: as :meth:`check`, before any forward pass.
        """
        state = self.start(prompt_ids, max_new_tokens)
        while not state.finished:
            self.step(state)
        return state.result

    @torch.inference_mode()
    def start(self, prompt_ids: Sequence[int], max_new_tokens: int) -> DecodeState:
        """Check the request, then prefill: feed ``prompt[:-1]`` causally to the target, and the prompt to
        the drafter (:meth:`Drafter.reset`, :meth:`Drafter.prefill`).

        The last prompt token becomes the first root. The drafter is told whether the first step drafts
        (its tree depth is >= 1); otherwise no step of this generation does (the clipped depth never grows),
        and a draft model is not prefilled, so it never sees a position past its context. Returns the
        :class:`DecodeState`; ``finished`` is already True when ``max_new_tokens == 0``.
        """
        prompt = self.check(prompt_ids, max_new_tokens)
        M = int(max_new_tokens)
        result = GenerationResult(tokens=[], prompt_len=len(prompt))
        self.drafter.reset()
        state = DecodeState(seq=list(prompt), cached=len(prompt) - 1, max_new_tokens=M, result=result,
                            drafter=self.drafter)
        if M == 0:
            state.finished, result.stop_reason = True, "empty"
            return state
        t0 = self._clock.now()
        if len(prompt) > 1:
            run_causal_chunk(self.target_model, self.target_cache, prompt[:-1], 0, self.backend, self._masks)
        self.drafter.prefill(prompt, will_draft=self._step_depth(len(prompt) - 1) > 0)
        result.prefill_ms = self._clock.now() - t0
        return state

    @torch.inference_mode()
    def step(self, state: DecodeState) -> StepStats:
        """One draft / verify / accept / commit step; appends its :class:`StepStats` to the result."""
        if state.finished:
            raise DecodingError("this generation has already finished")
        clock = self._clock
        t0 = clock.now()
        drafted = self.draft(state)
        t1 = clock.now()
        logits = self.verify(state, drafted.tokens)
        t2 = clock.now()
        acc = self.accept(drafted, logits)
        emitted = self.commit(state, acc)
        t3 = clock.now()
        ranks = tuple(self.tree.rank[i] for i in acc.path[1:])
        stats = StepStats(tokens=tuple(emitted), accepted_len=len(emitted), accepted_nodes=acc.accepted_nodes,
                          accepted_ranks=ranks, visits=acc.visits, draft_ms=t1 - t0, verify_ms=t2 - t1,
                          bookkeeping_ms=t3 - t2, tree_size=int(drafted.tokens.shape[0]), tree_depth=drafted.depth)
        state.result.steps.append(stats)
        return stats

    # ------------------------------------------------------------------ the tree of a step
    def _last_root_for_depth(self, d: int) -> int:
        """The largest L (root slot and position) at which the tree clipped to depth d fits (may be < 0).

        Target: slots ``L .. L + n_d - 1`` and positions up to ``L + d``. Drafter (d >= 1): its own limit,
        :meth:`Drafter.max_root_for_depth` (a draft model: positions up to ``L + d - 1``, levels
        ``0 .. d-1``, and slots up to ``L + num_drafted_d - 1``).
        """
        last = min(self.context - 1 - d, self.target_cache.max_len - self.buffers.level_slices[d].stop)
        if d > 0:
            last = min(last, self.drafter.max_root_for_depth(d, self.buffers))
        return last

    def _step_depth(self, L: int) -> int:
        """Depth of the tree a step with L cached tokens uses: D while the whole tree fits, else the largest
        depth that fits (0: a root-only step). Raises DecodingError when not even the root fits (a request
        :meth:`check` refuses)."""
        if L <= self._full_until:  # the common case: one integer comparison
            return self.buffers.tree_depth
        for d in range(len(self._last_root) - 2, -1, -1):
            if L <= self._last_root[d]:
                return d
        raise DecodingError(
            f"no room for the next token at slot / position {L}: {describe_model(self.target_model, 'target')} "
            f"has max_position_embeddings = {self.context} and the KV cache max_len={self.max_len} slots "
            "(a state that check() would have refused)")

    def _buffers_at(self, depth: int) -> TreeBuffers:
        """The decoder's tree clipped to ``depth`` (itself at depth D), compiled once and memoised."""
        buf = self._clipped.get(depth)
        if buf is None:
            buf = self._clipped[depth] = self.buffers.clipped(depth)
        return buf

    def step_buffers(self, state: DecodeState) -> TreeBuffers:
        """The :class:`TreeBuffers` the next step from ``state`` uses: the decoder's whole tree, or near the
        end of the context / cache that tree clipped to the levels that fit (see the module docstring)."""
        L = state.cached
        if L <= self._full_until:
            return self.buffers
        return self._buffers_at(self._step_depth(L))

    # ------------------------------------------------------------------ the four named steps
    @torch.inference_mode()
    def draft(self, state: DecodeState, tokens: torch.Tensor | Sequence[int] | None = None) -> DraftOutput:
        """Grow the step's tree with the drafter (:meth:`Drafter.propose` over :meth:`step_buffers`; no call
        for a root-only step). A draft model runs d forwards: the catch-up chunk, then levels 1..d-1.

        Args:
            state: the decoding state; not modified (a draft model's cache is written at slots
                ``draft_cached .. L + num_drafted``, so drafting again from the same state redoes the same
                work).
            tokens: optional (n,) tree tokens to use instead of proposing them (teacher forcing, for tests
                and replays; ``tokens[0]`` must be the root; n is the step's tree size). The drafter still
                runs over them, so its cache ends up exactly as if it had proposed them.

        Returns:
            :class:`DraftOutput`: (n,) node tokens, when sampling the (n, V) draft distributions, the depth.

        Raises:
            DecodingError: forced tokens of the wrong shape or root; when sampling, draft logits with NaN or
                +inf (:func:`process_logits`).
        """
        buf = self.step_buffers(state)
        forced = None
        if tokens is not None:
            n = buf.n
            forced = torch.as_tensor(tokens, dtype=torch.int64).to(self.device).clone()
            if forced.shape != (n,) or int(forced[0]) != state.root:
                raise DecodingError(f"forced tree tokens must have shape ({n},) and start with the root "
                                    f"{state.root}")
        if buf.tree_depth == 0:
            return DraftOutput(root_tree(state.root, buf.n, self.device) if forced is None else forced, None, 0)
        return self.drafter.propose(state, buf, forced)

    @torch.inference_mode()
    def verify(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        """One target forward over the step's n tree tokens (slots ``L + i``, positions ``L + depth[i]``,
        the (n, n) ancestor mask after the unmasked prefix). Returns (n, V) target logits.

        Raises:
            DecodingError: ``tokens`` is not of the step's tree size n (:meth:`step_buffers`).
        """
        buf, L = self.step_buffers(state), state.cached
        if tokens.shape[0] != buf.n:
            raise DecodingError(f"this step's tree has {buf.n} nodes but {tokens.shape[0]} tokens were given")
        return cached_forward(self.target_model, self.target_cache, tokens, buf.depth + L, buf.node_index + L, L,
                              buf.tree_mask, self.backend)

    @torch.inference_mode()
    def accept(self, drafted: DraftOutput, target_logits: torch.Tensor) -> Acceptance:
        """Pick the accepted path and the bonus token.

        Greedy: :func:`verify_greedy` on the target's argmax. Sampling: from the root, at each node run
        :func:`verify_sampling_node` on ``p = process_logits(target)`` and the draft's ``q`` with the
        node's children as candidates (Sequoia Algorithm 2), or, when the drafter has no probabilities
        (``drafted.probs`` is None), :func:`verify_point_mass_node` on p (each child in rank order accepted
        with the residual's probability of its token, else removed from the residual); move to an accepted
        child, or stop with the residual sample; at a leaf the bonus is sampled from p there. The tree is the
        one drafted (``drafted.depth``: clipped near the end, where a clipped node is a leaf).

        Args:
            drafted: the :class:`DraftOutput` of this step.
            target_logits: (n, V) from :meth:`verify`.

        Raises:
            DecodingError: target logits with NaN or +inf where they are used (no token is made from them),
                or a draft distribution the residual rule cannot use.
        """
        depth_used = drafted.depth
        buf = self.buffers if depth_used == self.buffers.tree_depth else self._buffers_at(depth_used)
        children = buf.children
        tok_list = drafted.tokens.tolist()
        node, depth, path, visits = 0, 0, [0], []
        try:
            if self.greedy:
                return verify_greedy(argmax_tokens(target_logits), tok_list, children)
            while True:
                p = process_logits(target_logits[node], self.temperature, self.top_p)  # (V,)
                ch = children[node]
                if not ch:
                    bonus = int(sample_categorical(p, self.generator).item())
                    break
                cands = drafted.tokens[ch[0] : ch[-1] + 1]  # siblings are contiguous, in rank order
                if drafted.probs is None:  # a drafter without probabilities: point masses
                    r, tok = verify_point_mass_node(p, cands, self.generator)
                else:
                    r, tok = verify_sampling_node(p, drafted.probs[node], cands, self.generator)
                visits.append(NodeVisit(depth, len(ch), r))
                if r is None:
                    bonus = tok
                    break
                node = ch[r]
                path.append(node)
                depth += 1
        except ValueError as err:
            raise verify_error(err, self.target_model, None if self.greedy else node, depth,
                               type(self.drafter).__name__) from None
        tokens = tuple(tok_list[i] for i in path[1:]) + (bonus,)
        return Acceptance(tuple(path), tokens, tuple(visits))

    @torch.inference_mode()
    def commit(self, state: DecodeState, acc: Acceptance) -> list[int]:
        """Emit the accepted tokens plus the bonus (cut at the first EOS and at ``max_new_tokens``), then,
        unless generation stops, commit the accepted path to the target cache and the drafter.

        Target: slots ``L + path`` (root first) move to ``[L, L + len(path))``; the bonus becomes the new
        root, so L grows by ``len(path)``. Drafter: :meth:`Drafter.commit` with the step's depth; a draft
        model does the same, less a node on the step tree's last level (which it never processes), and
        after a root-only step leaves its cache as it is (it ran no forward, so ``draft_cached`` does not
        move).

        Returns:
            The tokens emitted this step.
        """
        emitted = state.emit(acc.tokens, self.eos_ids)
        if state.finished:
            return emitted
        L, path = state.cached, acc.path
        D = self._step_depth(L)  # the depth this step's tree had (state.cached has not moved yet)
        src = torch.tensor(path, dtype=torch.int64, device=self.device) + L  # (A,) scattered BFS slots
        self.target_cache.compact(src, L)
        self.drafter.commit(L, path, D, src)
        state.cached = L + len(path)
        return emitted
