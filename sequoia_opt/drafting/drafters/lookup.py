""":class:`PromptLookupDrafter`: candidates from earlier occurrences of the current suffix in the prompt and
the generated text (n-gram prompt lookup). No model, no cache, no probabilities; cost model ``"one-pass"``
(one lookup per node proposes every level, at a cost of about nothing next to a target forward).

Sources: "Prompt Lookup Decoding" (A. Saxena, 2023, github.com/apoorvumang/prompt-lookup-decoding); vLLM's
``ngram`` speculative method (its ``prompt_lookup_min`` / ``prompt_lookup_max`` settings, whose names this
drafter takes); llama.cpp's lookup decoding (an n-gram cache over the context). Those propose one chain
from the most recent longest match; this drafter proposes a tree: every node gets its own ranked
candidates, from its own context.

The rule. A node's context is the committed sequence ``state.seq`` (prompt, then emitted tokens; its last
token is the root) followed by the tokens of the node's ancestors below the root and the node itself (the
root path). For ``n = prompt_lookup_max`` down to ``prompt_lookup_min`` (only n <= the context's length), an
occurrence of the context's last n tokens is any earlier window ``context[j - n : j]`` equal to them with
``j < len(context)``: it is followed by the token ``context[j]`` (so the suffix itself, which nothing follows,
never counts; occurrences may overlap it). Each token t that follows an occurrence gets the key
``(m, c, r)``: m the longest n at which t follows an occurrence (the match length), c the number of
occurrences of that length t follows (the frequency), r the largest such j (the recency: most recent
first). Candidates are the distinct tokens sorted by key, largest first (longest match, then most frequent,
then most recent; r is unique per token of one length, so the order is total). A node with k children gets
the first k candidates in rank order. When fewer than k are found, the remaining ranks get fillers: the
smallest token ids ``0, 1, 2, ...`` not already among that node's candidates, in increasing order
(deterministic, and siblings stay distinct, as greedy verification assumes). A filler is an ordinary
token to the verifier: it is accepted only when the target agrees.

Cost. An index over ``state.seq`` maps every n-gram (``prompt_lookup_min <= n <= prompt_lookup_max``) to the
tokens that followed it, each with its count and its last position, so a node's lookup is one dictionary
read per n plus a sort of the distinct followers. It is built by :meth:`PromptLookupDrafter.prefill` and
extended by :meth:`PromptLookupDrafter.propose` with the tokens committed since (a row's ``seq`` only grows
within a generation; :meth:`reset` clears it; one index per row of a batch), O(max - min + 1) per new token: about 4 ms per 1000 tokens
with the defaults in CPython, and a 61-node tree over a 4000-token context is proposed in about 0.3 ms. The
tokens a node's root path adds are matched locally (at most the tree's depth windows per n), never added to
the index.
"""

from __future__ import annotations

import sys
from typing import Sequence

import torch

from ...decoding.state import DecodeState, DraftSettings, RowState
from ...decoding.step_tree import DraftOutput, TreeBuffers
from ...errors import DecodingError
from .base import Drafter

__all__ = ["PromptLookupDrafter", "NgramIndex", "UNLIMITED"]

#: The lookup drafter's context: it reads positions only through the committed tokens, so it sets no limit of
#: its own (the target's limits still apply).
UNLIMITED = sys.maxsize


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DecodingError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


class NgramIndex:
    """One sequence's n-gram index (module docstring: the ranking rule and its cost).

    Args:
        vocab_size: V (fillers are the smallest ids not already proposed).
        lo, hi: the shortest and longest suffix matched (tokens).
    """

    def __init__(self, vocab_size: int, lo: int, hi: int) -> None:
        self.vocab_size, self.prompt_lookup_min, self.prompt_lookup_max = vocab_size, lo, hi
        self._seq: list[int] = []  # the committed tokens indexed so far
        # n-gram -> {following token: [count, last position of that token]}
        self._index: dict[tuple[int, ...], dict[int, list[int]]] = {}

    def reset(self) -> None:
        """Forget every indexed token and n-gram (a new generation starts from an empty index)."""
        self._seq = []
        self._index = {}

    def ranked(self, seq: Sequence[int], path: Sequence[int], k: int) -> tuple[list[int], float]:
        """The k ranked candidates after the context ``seq + path`` (the module docstring's rule), and the
        lookup's confidence there.

        Args:
            seq: the committed tokens; the index is first extended to them (they must extend what it holds,
                as ``state.seq`` does within a generation; otherwise it is rebuilt).
            path: the root path's tokens below the root (empty for the root).
            k: how many candidates, ``0 <= k <= vocab_size``.

        Returns:
            ``(tokens, confidence)``: k distinct token ids (the found candidates by rank, then fillers), and
            the top follower's share of the followers' count at the longest matched suffix, in [0, 1] (0 when
            no suffix matches).

        Raises:
            DecodingError: ``k`` outside ``[0, vocab_size]`` (no k distinct ids to propose).
        """
        if not 0 <= k <= self.vocab_size:
            raise DecodingError(f"cannot propose {k} distinct candidates from a vocabulary of {self.vocab_size}")
        self._extend(seq)
        S, P = len(self._seq), len(path)
        total = S + P
        picked: list[int] = []
        seen: set[int] = set()
        confidence = None
        for n in range(min(self.prompt_lookup_max, total), self.prompt_lookup_min - 1, -1):
            if len(picked) >= k:
                break
            suffix = tuple(self._at(total - n + i, path) for i in range(n))
            stats = self._index.get(suffix)
            local: dict[int, list[int]] = {}
            for j in range(max(S, n), total):  # occurrences followed by a token of the path
                if all(self._at(j - n + i, path) == suffix[i] for i in range(n)):
                    t = path[j - S]
                    if t in local:
                        local[t][0] += 1
                        local[t][1] = j
                    else:
                        local[t] = [1, j]
            if local:
                merged = {t: list(v) for t, v in stats.items()} if stats else {}
                for t, (c, r) in local.items():
                    if t in merged:
                        merged[t][0] += c
                        merged[t][1] = r  # local positions come after every indexed one
                    else:
                        merged[t] = [c, r]
                stats = merged
            if not stats:
                continue
            if confidence is None:
                counts = [c for c, _ in stats.values()]
                confidence = max(counts) / sum(counts)
            for t in sorted(stats, key=lambda t: (stats[t][0], stats[t][1]), reverse=True):
                if t not in seen:
                    seen.add(t)
                    picked.append(t)
                    if len(picked) == k:
                        break
        filler = 0
        while len(picked) < k:
            if filler not in seen:
                seen.add(filler)
                picked.append(filler)
            filler += 1
        return picked[:k], (confidence or 0.0)

    def _at(self, i: int, path: Sequence[int]) -> int:
        """Token i of the context ``self._seq + path``."""
        S = len(self._seq)
        return self._seq[i] if i < S else path[i - S]

    def _extend(self, seq: Sequence[int]) -> None:
        """Take the tokens of ``seq`` past the indexed ones into the index (rebuild if ``seq`` does not extend
        what is indexed: a cheap check of the length and the last indexed token)."""
        S = len(self._seq)
        if len(seq) < S or (S and seq[S - 1] != self._seq[-1]):
            self.reset()
            S = 0
        if len(seq) == S:
            return
        self._seq.extend(int(t) for t in seq[S:])
        s, lo, hi = self._seq, self.prompt_lookup_min, self.prompt_lookup_max
        for j in range(max(S, 1), len(s)):  # j: a follower position; the n-gram s[j-n:j] precedes it
            t = s[j]
            for n in range(lo, min(hi, j) + 1):
                followers = self._index.setdefault(tuple(s[j - n : j]), {})
                st = followers.get(t)
                if st is None:
                    followers[t] = [1, j]
                else:
                    st[0] += 1
                    st[1] = j


class PromptLookupDrafter(Drafter):
    """The n-gram prompt lookup drafter (see the module docstring for the ranking rule), one index per row.

    Args:
        vocab_size: V, the target's vocabulary size (candidates and fillers are ids in ``[0, V)``).
        prompt_lookup_min: the shortest suffix (in tokens) matched, >= 1 (vLLM's name).
        prompt_lookup_max: the longest suffix matched, >= ``prompt_lookup_min`` (vLLM's name).
        device: where the tree tokens are made; must be the target's device (pass ``target.device``).

    Attributes:
        context: :data:`UNLIMITED` (no positions limit of its own).
        cached: always 0: the drafter has no cache. Its n-gram indexes are not caches of the decoder's slots.
        indexed: how many tokens of row 0's committed sequence its index has taken in.

    Raises:
        DecodingError: a parameter that is not an integer (bools refused), ``vocab_size < 1``,
            ``prompt_lookup_min < 1``, or ``prompt_lookup_min > prompt_lookup_max``; each message names the
            parameter.
    """

    cost_model = "one-pass"
    has_probs = False
    max_rows = 1 << 30

    def __init__(self, vocab_size: int, *, prompt_lookup_min: int = 1, prompt_lookup_max: int = 3,
                 device: torch.device | str = "cpu") -> None:
        self.vocab_size = _check_int("vocab_size", vocab_size, 1)
        self.prompt_lookup_min = _check_int("prompt_lookup_min", prompt_lookup_min, 1)
        self.prompt_lookup_max = _check_int("prompt_lookup_max", prompt_lookup_max, 1)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise DecodingError(f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= prompt_lookup_max "
                                f"({self.prompt_lookup_max})")
        self.device = torch.device(device)
        self.context = UNLIMITED
        self.cached = 0
        self.settings: DraftSettings | None = None
        self._rows: list[NgramIndex] = [self._new_index()]

    def _new_index(self) -> NgramIndex:
        return NgramIndex(self.vocab_size, self.prompt_lookup_min, self.prompt_lookup_max)

    @property
    def indexed(self) -> int:
        """Committed tokens the first row's index holds (0 before any proposal): how far its index has caught up."""
        return len(self._rows[0]._seq) if self._rows else 0

    # ------------------------------------------------------------------ the protocol
    def bind(self, settings: DraftSettings) -> None:
        self._bind_once(settings)

    def reset(self) -> None:
        self._rows = [self._new_index()]

    def prefill(self, state: DecodeState) -> None:
        self._rows = [self._new_index() for _ in state.rows]
        for idx, r in zip(self._rows, state.rows):
            idx._extend(r.seq)

    def propose(self, state: DecodeState, buffers: TreeBuffers,
                forced_tokens: torch.Tensor | None = None) -> DraftOutput:
        D = buffers.tree_depth
        while len(self._rows) < len(state.rows):
            self._rows.append(self._new_index())
        for idx, r in zip(self._rows, state.rows):
            idx._extend(r.seq)
        if forced_tokens is not None:  # nothing to fill and no cache: the forced tree as it is
            return DraftOutput(forced_tokens, None, D)
        tokens, confs = [], []
        for idx, r in zip(self._rows, state.rows):
            toks = [r.root] + [0] * (buffers.n - 1)
            conf = [0.0] * buffers.n
            paths: list[list[int]] = [[]] * buffers.n  # per node: its root path's tokens below the root
            for node, ch in enumerate(buffers.children):  # breadth-first: a node's path is known before its own
                if not ch:
                    continue
                cands, conf[node] = idx.ranked(r.seq, paths[node], len(ch))
                for c, tok in zip(ch, cands):  # children are in rank order
                    toks[c] = tok
                    paths[c] = paths[node] + [tok]
            tokens.append(toks)
            confs.append(conf)
        want = self.settings is not None and self.settings.want_confidence
        confidence = torch.tensor(confs, device=self.device) if want else None
        return DraftOutput(torch.tensor(tokens, dtype=torch.int64, device=self.device), None, D, confidence)

    def teacher_forced(self, prompt: Sequence[int], continuation: Sequence[int]) -> list[tuple[int, float]]:
        """The n-gram rule's top candidate for each token of ``continuation`` after ``prompt`` and the tokens
        before it, with its match confidence (:meth:`Drafter.teacher_forced`; a fresh index, this drafter's rows
        untouched)."""
        idx, seq, out = self._new_index(), list(prompt), []
        for tok in continuation:
            idx._extend(seq)
            cands, conf = idx.ranked(seq, [], 1)
            out.append((int(cands[0]), float(conf)))
            seq.append(int(tok))
        return out

    def commit(self, state: DecodeState, paths: Sequence[Sequence[int]], step_depth: int) -> None:
        # no cache: the committed tokens reach the index through the row's seq at the next proposal
        pass

    def keep(self, rows: Sequence[int]) -> None:
        self._rows = [self._rows[b] for b in rows]

    def join(self, state: DecodeState, rows: Sequence[int]) -> None:
        for i in rows:
            idx = self._new_index()
            idx._extend(state.rows[i].seq)
            self._rows.append(idx)

    def score_nodes(self, row: RowState, tokens: torch.Tensor, depth: torch.Tensor, ancestors: torch.Tensor,
                    nodes: Sequence[int], first: bool) -> None:
        """No model and no cache: nothing to run (a shared-tree policy asks :meth:`ranked` per node)."""
        self._rows[0]._extend(row.seq)
        return None

    def candidates(self, seq: Sequence[int], path: Sequence[int], k: int) -> list[int]:
        """The k ranked candidates after the context ``seq + path`` (row 0's index; :meth:`ranked` without its
        confidence)."""
        return self.ranked(seq, path, k)[0]

    def ranked(self, seq: Sequence[int], path: Sequence[int], k: int) -> tuple[list[int], float]:
        """:meth:`NgramIndex.ranked` on row 0's index (a batch of one; a shared-tree policy's call)."""
        return self._rows[0].ranked(seq, path, k)
