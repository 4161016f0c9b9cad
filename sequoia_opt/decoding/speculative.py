"""Tree speculative decoding: draft a token tree level by level, verify it in one target forward, accept a
path exactly, compact both caches (Sequoia, Chen et al. 2024; SpecInfer, Miao et al. 2024; Medusa, Cai et
al. 2024 for the tree buffers).

State between steps (batch size 1): the committed tokens ``x_0 .. x_L``; the target cache holds
``x_0 .. x_{L-1}`` at slots ``0 .. L-1``; ``x_L`` (the last committed token, not cached) is the ROOT of the
next tree. Node i of the tree is written at slot ``L + i`` at position ``L + depth[i]``. The prefill feeds the
prompt minus its last token; the last prompt token is the first root.

One step, in named methods:

1. :meth:`SpeculativeDecoder.draft` — the draft first catches up on committed tokens it has not cached yet,
   ending at the root, as one causal chunk (usually the root alone; the root plus the last accepted node
   when that node was on the tree's last level, which the draft never processes). Its last logits give the
   root's children. Then one draft forward per level 1 .. D-1 over that level's nodes at their slots, each
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
                   run_causal_chunk, truncate)
from .sampling import (Acceptance, NodeVisit, process_logits, sample_categorical, sample_without_replacement,
                       verify_greedy, verify_sampling_node)
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
            sampled from); None for greedy decoding. Rows of leaves are undefined.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None


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
            ``min(context, 4096) + n`` where ``context`` is the smaller ``max_position_embeddings`` of the
            two models (a 128k-context model would otherwise allocate its whole context). A request that
            needs more slots is refused with a :class:`DecodingError` naming ``max_len``.

    Raises:
        DecodingError: different vocabularies or devices, a node with more children than the vocabulary
            has tokens, a tree deeper than the context, ``max_len`` smaller than the tree, a bad
            temperature / top_p.
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
        self.context = min(target.config.max_position_embeddings, draft.config.max_position_embeddings)
        if tree.tree_depth >= self.context:
            raise DecodingError(f"the tree has depth {tree.tree_depth} but the models have only "
                                f"{self.context} positions")
        n = tree.size
        self.max_len = int(max_len if max_len is not None else min(self.context, DEFAULT_MAX_LEN) + n)
        if self.max_len < n:
            raise DecodingError(f"max_len {self.max_len} cannot hold one tree of {n} nodes")
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

    # ------------------------------------------------------------------ public API
    def check(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Validate a request before any forward pass; returns the prompt as ints.

        Raises:
            DecodingError: empty prompt, an id outside the vocabulary, ``max_new_tokens`` < 0, or a prompt +
                ``max_new_tokens`` + tree that would overflow the cache or the context
                (see :func:`~sequoia_opt.decoding.core.check_capacity`).
        """
        prompt = check_prompt(prompt_ids, self.vocab_size)
        M = check_max_new_tokens(max_new_tokens)
        check_capacity(len(prompt), M, self.tree.size, self.tree.tree_depth, cache_len=self.max_len,
                       context=self.context)
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

        The last prompt token becomes the first root. Returns the :class:`DecodeState`; ``finished`` is
        already True when ``max_new_tokens == 0``.
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
            if self.draft_cache is not None:
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
                          bookkeeping_ms=t3 - t2)
        state.result.steps.append(stats)
        return stats

    # ------------------------------------------------------------------ the four named steps
    @torch.inference_mode()
    def draft(self, state: DecodeState, tokens: torch.Tensor | Sequence[int] | None = None) -> DraftOutput:
        """Grow the tree level by level with the draft (D forwards: the catch-up chunk, then levels 1..D-1).

        Args:
            state: the decoding state; not modified (the draft cache is written at slots ``draft_cached ..
                L + num_drafted``, so drafting again from the same state redoes the same work).
            tokens: optional (n,) tree tokens to use instead of proposing them (teacher forcing, for tests
                and replays; ``tokens[0]`` must be the root). The draft still runs over them, so its cache
                ends up exactly as if it had proposed them.

        Returns:
            :class:`DraftOutput`: (n,) node tokens and, when sampling, the (n, V) draft distributions.
        """
        buf, dev, L = self.buffers, self.device, state.cached
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
            return DraftOutput(out, probs)
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
            if probs is not None:
                q = process_logits(logits, self.temperature, self.top_p)  # (w_d, V)
                probs[sl] = q
            if tokens is not None:
                continue
            if q is None:
                cand = logits.topk(k, dim=-1).indices  # (w_d, k) the draft's top-k, rank order
            else:
                cand = sample_without_replacement(q, k, self.generator)  # (w_d, k) ordered samples
            nxt = buf.level_slices[d + 1]
            out[nxt] = cand[buf.child_parent_local[d + 1], buf.child_rank[d + 1]]
        return DraftOutput(out, probs)

    @torch.inference_mode()
    def verify(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor:
        """One target forward over the n tree tokens (slots ``L + i``, positions ``L + depth[i]``, the
        (n, n) ancestor mask after the unmasked prefix). Returns (n, V) target logits."""
        buf, L = self.buffers, state.cached
        return cached_forward(self.target_model, self.target_cache, tokens, buf.depth + L, buf.node_index + L, L,
                              buf.tree_mask, self.backend)

    @torch.inference_mode()
    def accept(self, drafted: DraftOutput, target_logits: torch.Tensor) -> Acceptance:
        """Pick the accepted path and the bonus token.

        Greedy: :func:`verify_greedy` on the target's argmax. Sampling: from the root, at each node run
        :func:`verify_sampling_node` on ``p = process_logits(target)`` and the draft's ``q`` with the
        node's children as candidates (Sequoia Algorithm 2); move to an accepted child, or stop with the
        residual sample; at a leaf the bonus is sampled from p there.

        Args:
            drafted: the :class:`DraftOutput` of this step.
            target_logits: (n, V) from :meth:`verify`.
        """
        children = self.buffers.children
        tok_list = drafted.tokens.tolist()
        if self.greedy:
            return verify_greedy(target_logits.argmax(-1).tolist(), tok_list, children)
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
        tokens = tuple(tok_list[i] for i in path[1:]) + (bonus,)
        return Acceptance(tuple(path), tokens, tuple(visits))

    @torch.inference_mode()
    def commit(self, state: DecodeState, acc: Acceptance) -> list[int]:
        """Emit the accepted tokens plus the bonus (cut at the first EOS and at ``max_new_tokens``), then,
        unless generation stops, compact both caches so the accepted path follows the prefix.

        Target: slots ``L + path`` (root first) move to ``[L, L + len(path))``; the bonus becomes the new
        root, so L grows by ``len(path)``. Draft: the same, less a last-level node it never processed.

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
        L, path, D = state.cached, acc.path, self.buffers.tree_depth
        src = torch.tensor(path, dtype=torch.int64, device=self.device) + L  # (A,) scattered BFS slots
        self.target_cache.compact(src, L)
        if self.draft_cache is not None:
            m = len(path) if len(path) - 1 < D else len(path) - 1  # the draft skips the last level
            self.draft_cache.compact(src[:m], L)
            state.draft_cached = L + m
        state.cached = L + len(path)
        return emitted
