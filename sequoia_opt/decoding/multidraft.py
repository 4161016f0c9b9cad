"""Speculative decoding where a drafting policy grows each step's tree from several drafters
(:mod:`~sequoia_opt.decoding.policies`: the TreeGraft shared tree, SpecInfer's merge), batch size 1.

The loop is :class:`~sequoia_opt.decoding.SpeculativeDecoder`'s, in the same named steps: draft (the
policy's :class:`~sequoia_opt.decoding.policies.StepTree`), verify (one target forward over its n nodes at
slots ``L + i``, positions ``L + depth[i]``, with the ancestor mask after the unmasked prefix), accept
(greedy: :func:`~sequoia_opt.decoding.sampling.verify_greedy`; sampling: per node, its candidate groups
against the distributions they were drawn from, :func:`~sequoia_opt.decoding.sampling.verify_groups_node`),
commit (the target cache's :meth:`~sequoia_opt.model.ModelKVCache.compact`, then the policy commits the path
to every drafter).

Near the end of the context or the cache: a step whose largest possible tree would not fit
(:meth:`DraftingPolicy.last_full_root`) is root-only (a plain decoding step; no drafter is asked), which is
exact; a static tree's graded clipping (:class:`~sequoia_opt.decoding.SpeculativeDecoder`) is not done here.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from ..attention import TreeMask, resolve_backend
from ..errors import DecodingError
from ..model import Transformer
from .core import DEFAULT_MAX_LEN, cached_forward, check_request, run_causal_chunk, verify_error
from .drafters import DraftSettings
from .policies.base import DraftingPolicy, StepTree
from .sampling import (Acceptance, NodeVisit, argmax_tokens, process_logits, sample_categorical, verify_greedy,
                       verify_groups_node)
from .speculative import DecodeState
from .stats import Clock, GenerationResult, StepStats

__all__ = ["MultiDraftDecoder"]


class MultiDraftDecoder:
    """Tree speculative decoding with a multi-drafter :class:`~sequoia_opt.decoding.policies.DraftingPolicy`,
    exact verification, batch size 1 (module docstring). The public API is
    :class:`~sequoia_opt.decoding.SpeculativeDecoder`'s: :meth:`check`, :meth:`generate`, :meth:`start`,
    :meth:`step`, the ``generator`` attribute.

    Args:
        target: the model whose output is preserved.
        policy: the drafting policy (its drafters share the target's vocabulary and device).
        temperature, top_p, generator, eos_ids, backend: as :class:`~sequoia_opt.decoding.SpeculativeDecoder`.
        max_len: slots of each preallocated KV cache; default ``min(context, 4096) + policy.max_size``.

    Raises:
        DecodingError: a drafter with another vocabulary or device, a bad temperature / top_p,
            ``max_len < 1``, a drafter already bound to another decoder.
    """

    def __init__(self, target: Transformer, policy: DraftingPolicy, *, temperature: float = 0.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None, eos_ids: Iterable[int] = (), backend: str = "auto",
                 max_len: int | None = None) -> None:
        V = target.config.vocab_size
        if len(policy.names) != len(policy.drafters):  # zip below would skip the unnamed drafters' checks
            raise DecodingError(f"the policy names {len(policy.names)} drafter(s) "
                                f"({', '.join(map(str, policy.names))}) but has {len(policy.drafters)}: one name per "
                                "drafter")
        for name, d in zip(policy.names, policy.drafters):
            if d.vocab_size != V:
                raise DecodingError(f"drafter {name!r} has a vocabulary of {d.vocab_size} tokens but the target "
                                    f"{V}; every drafter must share the target's tokenizer")
            if d.device != target.device:
                raise DecodingError(f"drafter {name!r} is on {d.device} but the target on {target.device}")
        try:
            process_logits(torch.zeros(1), temperature, top_p)
        except ValueError as err:
            raise DecodingError(str(err)) from None
        self.context = target.config.max_position_embeddings
        self.max_len = int(max_len if max_len is not None else min(self.context, DEFAULT_MAX_LEN) + policy.max_size)
        if self.max_len < 1:
            raise DecodingError(f"max_len must be >= 1 (one slot for a root-only step), got {self.max_len}")
        self.target_model, self.policy = target, policy
        self.vocab_size, self.device = V, target.device
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
                                       tree_depth=policy.max_depth, target=target, target_cache=self.target_cache)
        policy.bind(self._settings)
        self._last_full = policy.last_full_root(self.context, self.max_len)
        self._masks: dict[int, TreeMask] = {}
        self._clock = Clock(self.device)

    @property
    def generator(self) -> torch.Generator:
        return self._settings.generator

    @generator.setter
    def generator(self, generator: torch.Generator) -> None:
        self._settings.generator = generator

    def check(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Validate a request before any forward (what plain decoding with the same ``max_len`` refuses).

        Raises:
            DecodingError: empty prompt, an id outside the vocabulary, ``max_new_tokens < 0``, or a request that
                does not fit the target's context or the cache.
        """
        return check_request(prompt_ids, max_new_tokens, self.target_model, max_len=self.max_len, role="target")

    @torch.inference_mode()
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> GenerationResult:
        """Decode up to ``max_new_tokens`` new tokens after ``prompt_ids`` (see
        :meth:`~sequoia_opt.decoding.SpeculativeDecoder.generate`)."""
        state = self.start(prompt_ids, max_new_tokens)
        while not state.finished:
            self.step(state)
        return state.result

    @torch.inference_mode()
    def start(self, prompt_ids: Sequence[int], max_new_tokens: int) -> DecodeState:
        """Check the request, prefill the target with ``prompt[:-1]`` and every drafter with the prompt."""
        prompt = self.check(prompt_ids, max_new_tokens)
        M = int(max_new_tokens)
        result = GenerationResult(tokens=[], prompt_len=len(prompt))
        self.policy.reset()
        state = DecodeState(seq=list(prompt), cached=len(prompt) - 1, max_new_tokens=M, result=result)
        if M == 0:
            state.finished, result.stop_reason = True, "empty"
            return state
        t0 = self._clock.now()
        if len(prompt) > 1:
            run_causal_chunk(self.target_model, self.target_cache, prompt[:-1], 0, self.backend, self._masks)
        self.policy.prefill(prompt, will_draft=len(prompt) - 1 <= self._last_full)
        result.prefill_ms = self._clock.now() - t0
        return state

    @torch.inference_mode()
    def step(self, state: DecodeState) -> StepStats:
        """One draft / verify / accept / commit step; appends its :class:`StepStats` to the result."""
        if state.finished:
            raise DecodingError("this generation has already finished")
        clock = self._clock
        t0 = clock.now()
        tree = self.draft(state)
        t1 = clock.now()
        logits = self.verify(state, tree)
        t2 = clock.now()
        acc = self.accept(tree, logits)
        emitted = self.commit(state, tree, acc)
        t3 = clock.now()
        self.policy.observe(acc.accepted_nodes)
        k = len(self.policy.drafters)
        root_only = tree.n == 1 and not any(self.policy.drafter_calls)
        stats = StepStats(tokens=tuple(emitted), accepted_len=len(emitted), accepted_nodes=acc.accepted_nodes,
                          accepted_ranks=tuple(tree.children[tree.parent[i]].index(i) for i in acc.path[1:]),
                          visits=acc.visits, draft_ms=t1 - t0, verify_ms=t2 - t1, bookkeeping_ms=t3 - t2,
                          tree_size=tree.n, tree_depth=tree.tree_depth,
                          accepted_drafters=tuple(tree.source[i] for i in acc.path[1:]),
                          drafter_ms=tuple([0.0] * k if root_only else self.policy.drafter_ms),
                          drafter_calls=tuple([0] * k if root_only else self.policy.drafter_calls))
        state.result.steps.append(stats)
        return stats

    @torch.inference_mode()
    def draft(self, state: DecodeState) -> StepTree:
        """The policy's tree, or the root alone when the largest tree would not fit (module docstring)."""
        if state.cached > self._last_full:
            if state.cached > min(self.context - 1, self.max_len - 1):
                raise DecodingError(f"no room for the next token at slot / position {state.cached} (a state check() "
                                    "would have refused)")
            self.policy.drafter_calls = [0] * len(self.policy.drafters)
            return StepTree(state.root)
        return self.policy.draft(state)

    @torch.inference_mode()
    def verify(self, state: DecodeState, tree: StepTree) -> torch.Tensor:
        """One target forward over the tree's n nodes; returns (n, V) logits."""
        L = state.cached
        tokens = torch.tensor(tree.tokens, dtype=torch.int64, device=self.device)  # (n,)
        depth = torch.tensor(tree.depth, dtype=torch.int64, device=self.device)  # (n,)
        slots = torch.arange(L, L + tree.n, dtype=torch.int64, device=self.device)  # (n,)
        return cached_forward(self.target_model, self.target_cache, tokens, depth + L, slots, L,
                              tree.tree_mask(self.device), self.backend)

    @torch.inference_mode()
    def accept(self, tree: StepTree, target_logits: torch.Tensor) -> Acceptance:
        """The accepted path and the bonus token: greedy, the target's argmax walk; sampling, per node its
        candidate groups in order (:func:`verify_groups_node`), then the bonus from p (or the residual)."""
        node, depth, path, visits = 0, 0, [0], []
        try:
            if self.greedy:
                return verify_greedy(argmax_tokens(target_logits), tree.tokens, tree.children)
            while True:
                p = process_logits(target_logits[node], self.temperature, self.top_p)  # (V,)
                ch = tree.children[node]
                if not ch:
                    bonus = int(sample_categorical(p, self.generator).item())
                    break
                hit, tok = verify_groups_node(p, tree.groups[node], self.generator)
                if hit is None:
                    visits.append(NodeVisit(depth, len(ch), None))
                    bonus = tok
                    break
                child = tree.group_children[node][hit[0]][hit[1]]
                visits.append(NodeVisit(depth, len(ch), ch.index(child)))
                node = child
                path.append(node)
                depth += 1
        except ValueError as err:
            k = getattr(err, "drafter", None)  # a DraftDistributionError names its group's drafter
            raise verify_error(err, self.target_model, None if self.greedy else node, depth,
                               None if k is None else self.policy.names[k]) from None
        tokens = tuple(tree.tokens[i] for i in path[1:]) + (bonus,)
        return Acceptance(tuple(path), tokens, tuple(visits))

    @torch.inference_mode()
    def commit(self, state: DecodeState, tree: StepTree, acc: Acceptance) -> list[int]:
        """Emit the accepted tokens and the bonus (stop rules applied); unless generation stops, compact the
        accepted path in the target cache and commit it to every drafter through the policy."""
        emitted = state.emit(acc.tokens, self.eos_ids)
        if state.finished:
            return emitted
        L = state.cached
        src = torch.tensor(acc.path, dtype=torch.int64, device=self.device) + L  # (A,)
        self.target_cache.compact(src, L)
        self.policy.commit(L, acc.path, tree if any(self.policy.drafter_calls) or tree.n > 1 else None)
        state.cached = L + len(acc.path)
        return emitted
