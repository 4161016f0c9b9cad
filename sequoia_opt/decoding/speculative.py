"""Tree speculative decoding: draft a token tree level by level, verify it in one target forward, accept a
path exactly, compact both caches (Sequoia, Chen et al. 2024; SpecInfer, Miao et al. 2024; Medusa, Cai et
al. 2024 for the tree buffers).

State between steps (batch size 1): the committed tokens ``x_0 .. x_L``; the target cache holds
``x_0 .. x_{L-1}`` at slots ``0 .. L-1``; ``x_L`` (the last committed token, not cached) is the ROOT of the
next tree. Node i of the tree is written at slot ``L + i`` at position ``L + depth[i]``. The prefill feeds the
prompt minus its last token; the last prompt token is the first root.

Near the end. A step whose whole tree would not fit uses the tree clipped to its first d + 1 levels instead
(the first ``level_slices[d].stop`` nodes: levels are contiguous in breadth-first order), with the largest d
such that the target writes slots up to ``L + n_d - 1`` and positions up to ``L + d`` (inside its cache and its
``max_position_embeddings``) and the draft, which processes levels ``0 .. d-1``, sees positions up to
``L + d - 1`` and slots up to ``L + num_drafted_d - 1`` (inside its own context and cache). Clipped nodes only
fed tokens that the context or ``max_new_tokens`` cuts off anyway, so output is unchanged. At ``d = 0`` (e.g.
once the root's position is past a shorter draft context) the step is root-only: no draft forward, the
target's one-token forward, i.e. a plain decoding step. The clipped buffers are compiled once per depth, on
first use, and kept by the decoder.

One step, in named methods:

1. :meth:`SpeculativeDecoder.draft` — unless the step is root-only, the draft first catches up on committed
   tokens it has not cached yet, ending at the root, as one causal chunk (usually the root alone; the root
   plus the last accepted node when that node was on the step tree's last level, which the draft never
   processes). Its last logits give the root's children. Then one draft forward per level 1 .. d-1 (d the
   depth of the step's tree) over that level's nodes at their slots, each
   attending the prefix and its own ancestors; the k children of a node (k from the topology, assigned by
   rank) are the draft's top-k tokens (greedy) or k samples without replacement (sampling).
2. :meth:`SpeculativeDecoder.verify` — one target forward over all n nodes with the ancestor mask.
3. :meth:`SpeculativeDecoder.accept` — the accepted path: :func:`verify_greedy`, or per node
   :func:`verify_sampling_node` (Sequoia Algorithm 2).
4. :meth:`SpeculativeDecoder.commit` — emit the accepted tokens plus the bonus token (stop rules applied),
   then move the accepted path's slots (scattered in breadth-first order) to consecutive slots after the
   prefix in both caches with :meth:`ModelKVCache.compact`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from ..attention import TreeMask, resolve_backend
from ..errors import DecodingError
from ..model import Transformer
from ..tree import Tree
from .buffers import TreeBuffers
from .core import (DEFAULT_MAX_LEN, cached_forward, check_capacity, check_max_new_tokens, check_prompt,
                   describe_model, model_output_error, run_causal_chunk, truncate)
from .sampling import (Acceptance, NodeVisit, argmax_tokens, process_logits, sample_categorical,
                       sample_without_replacement, verify_greedy, verify_sampling_node)
from .stats import Clock, GenerationResult, StepStats

__all__ = ["SpeculativeDecoder", "DecodeState", "DraftOutput"]


@dataclass
class DecodeState:
    """The decoding state of one generation (batch size 1).

    Attributes:
        seq: every committed token, prompt then emitted tokens; ``seq[-1]`` is the root of the next tree.
        cached: L, the number of committed tokens in the target cache (slots ``[0, L)``); ``len(seq) == L + 1``.
        draft_cached: committed tokens in the draft cache (slots ``[0, draft_cached)``), ``<= L``.
        max_new_tokens: the generation's budget of new tokens.
        result: the :class:`GenerationResult` being filled (``result.tokens`` are the new tokens so far).
        finished: True once a stop rule fired.
    """

    seq: list[int]
    cached: int
    draft_cached: int
    max_new_tokens: int
    result: GenerationResult
    finished: bool = False

    @property
    def root(self) -> int:
        return self.seq[-1]


@dataclass
class DraftOutput:
    """The drafted tree.

    Attributes:
        tokens: (n,) int64 token of every node, breadth-first; ``tokens[0]`` is the root.
        probs: (n, V) float32 draft distribution at each node that has children (the q its children were
            sampled from); None for greedy decoding and for a root-only step. Rows of leaves are undefined.
        depth: the depth of the tree drafted this step: the decoder's tree depth D, or less when the step's
            tree was clipped near the end of the context or the cache (then n is that clipped tree's size).
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None
    depth: int


class SpeculativeDecoder:
    """Tree speculative decoding with exact verification, batch size 1.

    The target and draft caches are allocated once here and shared by every generation of this decoder, so
    run one generation at a time per decoder (a :class:`DecodeState` is valid until the next :meth:`start`).

    Args:
        target: the model whose output is preserved.
        draft: the proposer; must share the target's vocabulary and device (dtype may differ).
        tree: the speculation topology (n nodes, depth D), compiled once into :class:`TreeBuffers`.
        temperature: 0 = greedy (children are the draft's top-k, output = the target's greedy decoding);
            > 0 = speculative sampling (output distributed as the target's temperature / top-p sampling).
        top_p: nucleus mass in (0, 1], applied to target and draft alike (:func:`process_logits`).
        generator: random source for sampling (drafting and verification); None makes a generator on the
            target's device seeded with 0. Randomness is fresh every step; the attribute ``generator`` may be
            replaced between generations.
        eos_ids: token ids (or one id) that stop generation (the first EOS is emitted, nothing after it).
        backend: attention backend ``"auto" | "torch" | "cuda"``, resolved once here.
        max_len: slots of each preallocated KV cache (target and draft, reused across prompts); default
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
        draft_context: the draft's ``max_position_embeddings``.

    Raises:
        DecodingError: different vocabularies or devices, a node with more children than the vocabulary
            has tokens, ``max_len < 1``, a bad temperature / top_p.
    """

    def __init__(self, target: Transformer, draft: Transformer, tree: Tree, *, temperature: float = 0.0,
                 top_p: float = 1.0, generator: torch.Generator | None = None, eos_ids: Iterable[int] = (),
                 backend: str = "auto", max_len: int | None = None) -> None:
        V = target.config.vocab_size
        if draft.config.vocab_size != V:
            raise DecodingError(
                f"the draft's vocabulary ({draft.config.vocab_size} tokens) differs from the target's ({V}); "
                "speculative decoding needs a draft that shares the target's tokenizer")
        if draft.device != target.device:
            raise DecodingError(f"the draft is on {draft.device} but the target on {target.device}")
        if tree.max_branching_used > V:
            raise DecodingError(
                f"the tree has a node with {tree.max_branching_used} children but the vocabulary has only "
                f"{V} tokens: a node cannot propose more distinct candidates than that")
        try:
            process_logits(torch.zeros(1), temperature, top_p)
        except ValueError as err:
            raise DecodingError(str(err)) from None
        self.context = target.config.max_position_embeddings
        self.draft_context = draft.config.max_position_embeddings
        n = tree.size
        self.max_len = int(max_len if max_len is not None else min(self.context, DEFAULT_MAX_LEN) + n)
        if self.max_len < 1:
            raise DecodingError(f"max_len must be >= 1 (one slot for a root-only step), got {self.max_len}")
        self.target_model, self.draft_model, self.tree = target, draft, tree
        self.vocab_size = V
        self.device = target.device
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.greedy = self.temperature == 0
        self.eos_ids = frozenset([int(eos_ids)] if isinstance(eos_ids, int) else (int(t) for t in eos_ids))
        self.backend = resolve_backend(backend, self.device)
        if generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(0)
        self.generator = generator
        self.buffers = TreeBuffers.build(tree, self.device)
        self.target_cache = target.new_cache(self.max_len)
        self.draft_cache = draft.new_cache(self.max_len) if tree.tree_depth > 0 else None
        self._masks: dict[int, TreeMask] = {}
        self._clock = Clock(self.device)
        # clipping near the end: per depth d, the largest L (root slot and position) at which the tree
        # clipped to depth d fits; non-increasing in d. The whole tree fits while L <= _full_until.
        self._last_root = tuple(self._last_root_for_depth(d) for d in range(tree.tree_depth + 1))
        self._full_until = self._last_root[-1]
        self._clipped: dict[int, TreeBuffers] = {tree.tree_depth: self.buffers}  # compiled on first use

    # ------------------------------------------------------------------ public API
    def check(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Validate a request before any forward pass; returns the prompt as ints.

        Raises:
            DecodingError: empty prompt, an id outside the vocabulary, ``max_new_tokens`` < 0, or a prompt +
                ``max_new_tokens`` that does not fit the target's context or ``max_len`` slots
                (:func:`~sequoia_opt.decoding.core.check_capacity`): exactly what plain decoding of the
                target with the same ``max_len`` refuses. The tree never causes a refusal (it is clipped).
        """
        prompt = check_prompt(prompt_ids, self.vocab_size)
        M = check_max_new_tokens(max_new_tokens)
        check_capacity(len(prompt), M, cache_len=self.max_len, context=self.context,
                       model=describe_model(self.target_model, "target"))
        return prompt

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
        """Check the request, then prefill: feed ``prompt[:-1]`` causally to the target (and the draft).

        The last prompt token becomes the first root. The draft is prefilled only when the first step drafts
        (its tree depth is >= 1); otherwise no step of this generation does (the clipped depth never grows),
        and the draft never sees a position past its context. Returns the :class:`DecodeState`;
        ``finished`` is already True when ``max_new_tokens == 0``.
        """
        prompt = self.check(prompt_ids, max_new_tokens)
        M = int(max_new_tokens)
        result = GenerationResult(tokens=[], prompt_len=len(prompt))
        state = DecodeState(seq=list(prompt), cached=len(prompt) - 1, draft_cached=0, max_new_tokens=M,
                            result=result)
        if M == 0:
            state.finished, result.stop_reason = True, "empty"
            return state
        t0 = self._clock.now()
        if len(prompt) > 1:
            run_causal_chunk(self.target_model, self.target_cache, prompt[:-1], 0, self.backend, self._masks)
            if self.draft_cache is not None and self._step_depth(len(prompt) - 1) > 0:
                run_causal_chunk(self.draft_model, self.draft_cache, prompt[:-1], 0, self.backend, self._masks)
                state.draft_cached = len(prompt) - 1
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

        Target: slots ``L .. L + n_d - 1`` and positions up to ``L + d``. Draft (d >= 1): positions up to
        ``L + d - 1`` (levels ``0 .. d-1``) and slots up to ``L + num_drafted_d - 1``.
        """
        sl = self.buffers.level_slices[d]
        last = min(self.context - 1 - d, self.target_cache.max_len - sl.stop)
        if d > 0:
            last = min(last, self.draft_context - d, self.draft_cache.max_len - sl.start)
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
        """Grow the step's tree level by level with the draft (d forwards: the catch-up chunk, then levels
        1..d-1, where d is the depth of :meth:`step_buffers`; none for a root-only step).

        Args:
            state: the decoding state; not modified (the draft cache is written at slots ``draft_cached ..
                L + num_drafted``, so drafting again from the same state redoes the same work).
            tokens: optional (n,) tree tokens to use instead of proposing them (teacher forcing, for tests
                and replays; ``tokens[0]`` must be the root; n is the step's tree size). The draft still runs
                over them, so its cache ends up exactly as if it had proposed them.

        Returns:
            :class:`DraftOutput`: (n,) node tokens, when sampling the (n, V) draft distributions, the depth.

        Raises:
            DecodingError: forced tokens of the wrong shape or root; when sampling, draft logits with NaN or
                +inf (:func:`process_logits`).
        """
        buf, dev, L = self.step_buffers(state), self.device, state.cached
        n, D = buf.n, buf.tree_depth
        if tokens is None:
            out = torch.empty(n, dtype=torch.int64, device=dev)
            out[0] = state.root
        else:
            out = torch.as_tensor(tokens, dtype=torch.int64).to(dev).clone()
            if out.shape != (n,) or int(out[0]) != state.root:
                raise DecodingError(f"forced tree tokens must have shape ({n},) and start with the root "
                                    f"{state.root}")
        probs = None if (self.greedy or D == 0) else torch.empty(n, self.vocab_size, device=dev)
        if D == 0:
            return DraftOutput(out, probs, 0)
        # level 0: every committed token the draft has not cached yet, ending at the root (slot L)
        chunk = state.seq[state.draft_cached : L + 1]
        logits = run_causal_chunk(self.draft_model, self.draft_cache, chunk, state.draft_cached, self.backend,
                                  self._masks)[-1:]  # (1, V): the root's
        for d in range(D):
            sl = buf.level_slices[d]
            if d > 0:
                slots = buf.node_index[sl] + L  # (w_d,) level d's slots
                positions = buf.depth[sl] + L  # (w_d,) all = L + d
                # (w_d, e_d) mask: prefix unmasked, then each node's ancestors-or-self among levels <= d
                logits = cached_forward(self.draft_model, self.draft_cache, out[sl], positions, slots, L,
                                        buf.level_masks[d], self.backend)  # (w_d, V)
            k = buf.level_branching[d]
            q = None
            try:
                if probs is not None:
                    q = process_logits(logits, self.temperature, self.top_p)  # (w_d, V)
                    probs[sl] = q
                if tokens is not None:
                    continue
                if q is None:
                    # greedy: NaN draft logits only make bad candidates, which the target's check rejects
                    cand = logits.topk(k, dim=-1).indices  # (w_d, k) the draft's top-k, rank order
                else:
                    cand = sample_without_replacement(q, k, self.generator)  # (w_d, k) ordered samples
            except ValueError as err:
                raise model_output_error(err, self.draft_model, "draft") from None
            nxt = buf.level_slices[d + 1]
            out[nxt] = cand[buf.child_parent_local[d + 1], buf.child_rank[d + 1]]
        return DraftOutput(out, probs, D)

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
        node's children as candidates (Sequoia Algorithm 2); move to an accepted child, or stop with the
        residual sample; at a leaf the bonus is sampled from p there. The tree is the one drafted
        (``drafted.depth``: clipped near the end, where a clipped node is a leaf).

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
        try:
            if self.greedy:
                return verify_greedy(argmax_tokens(target_logits), tok_list, children)
            node, depth, path, visits = 0, 0, [0], []
            while True:
                p = process_logits(target_logits[node], self.temperature, self.top_p)  # (V,)
                ch = children[node]
                if not ch:
                    bonus = int(sample_categorical(p, self.generator).item())
                    break
                cands = drafted.tokens[ch[0] : ch[-1] + 1]  # siblings are contiguous, in rank order
                r, tok = verify_sampling_node(p, drafted.probs[node], cands, self.generator)
                visits.append(NodeVisit(depth, len(ch), r))
                if r is None:
                    bonus = tok
                    break
                node = ch[r]
                path.append(node)
                depth += 1
        except ValueError as err:
            raise model_output_error(err, self.target_model, "target") from None
        tokens = tuple(tok_list[i] for i in path[1:]) + (bonus,)
        return Acceptance(tuple(path), tokens, tuple(visits))

    @torch.inference_mode()
    def commit(self, state: DecodeState, acc: Acceptance) -> list[int]:
        """Emit the accepted tokens plus the bonus (cut at the first EOS and at ``max_new_tokens``), then,
        unless generation stops, compact both caches so the accepted path follows the prefix.

        Target: slots ``L + path`` (root first) move to ``[L, L + len(path))``; the bonus becomes the new
        root, so L grows by ``len(path)``. Draft: the same, less a node on the step tree's last level (which
        the draft never processes); after a root-only step the draft cache is left as it is (the draft ran
        no forward, so ``draft_cached`` does not move).

        Returns:
            The tokens emitted this step.
        """
        result = state.result
        emitted, stop = truncate(acc.tokens, state.max_new_tokens - len(result.tokens), self.eos_ids)
        result.tokens.extend(emitted)
        state.seq.extend(emitted)
        if stop is not None:
            state.finished, result.stop_reason = True, stop
            return emitted
        L, path = state.cached, acc.path
        D = self._step_depth(L)  # the depth this step's tree had (state.cached has not moved yet)
        src = torch.tensor(path, dtype=torch.int64, device=self.device) + L  # (A,) scattered BFS slots
        self.target_cache.compact(src, L)
        if self.draft_cache is not None and D > 0:
            m = len(path) if len(path) - 1 < D else len(path) - 1  # the draft skips the last level
            self.draft_cache.compact(src[:m], L)
            state.draft_cached = L + m
        state.cached = L + len(path)
        return emitted
