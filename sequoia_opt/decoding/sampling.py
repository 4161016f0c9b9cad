"""Logit processing, sampling, and the exact per-node verifiers (greedy and speculative sampling).

Everything here is a pure function on explicit tensors, so each rule can be tested on its own:

* :func:`process_logits` turns logits into the distribution decoding samples from (temperature, then top-p).
  The target and the draft go through the same function, and so does the autoregressive baseline.
* :func:`sample_without_replacement` draws the k candidates a node proposes (ordered: the first is a sample
  from q, the second a sample from q without the first, ...).
* :func:`verify_sampling_node` / :func:`verify_sampling_batch` implement multi-candidate speculative sampling
  with the residual rule (Sequoia, Chen et al. 2024, Algorithm 2; SpecInfer, Miao et al. 2024, section 4,
  "multi-step speculative sampling"): the emitted token is distributed exactly as p.
* :func:`verify_point_mass_node` / :func:`verify_point_mass_batch` are the same rule for candidates proposed
  without a distribution (a drafter with ``has_probs`` False, e.g. prompt lookup): each candidate is
  verified as a point mass, accepted with the current residual's probability of its token.
* :func:`verify_greedy` walks a tree under greedy verification: the emitted tokens are exactly the target's
  greedy continuation.

Randomness always comes from an explicit ``torch.Generator``; random numbers are drawn on the generator's
device and moved to the data's device, so a CPU generator works with CUDA tensors too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = [
    "GREEDY_LIMIT_TEMPERATURE",
    "prompt_seed",
    "argmax_tokens",
    "process_logits",
    "sample_categorical",
    "sample_without_replacement",
    "verify_sampling_node",
    "verify_sampling_batch",
    "verify_point_mass_node",
    "verify_point_mass_batch",
    "verify_greedy",
    "verify_groups_node",
    "CandidateGroup",
    "sample_excluding",
    "Acceptance",
    "NodeVisit",
]


# Temperatures in (0, GREEDY_LIMIT_TEMPERATURE) give the T -> 0 limit directly (see process_logits). The
# threshold is the smallest normal float32, 2**-126 (about 1.18e-38): below it float32 holds T only as a
# subnormal (flushed to zero on devices that flush denormals, then (logits - max) / T is 0 / 0 = NaN at the
# argmax) or, below about 1.4e-45, not at all (1e-300 rounds to 0). Skipping the division there changes
# nothing visible: a token trailing the maximum by delta weighs exp(-delta / T) against it, under float32's
# resolution (6e-8) once delta > 17 T, i.e. delta > 2e-37 at the threshold; two distinct float32 logits are
# that close only when both are smaller than about 1e-30 in magnitude.
GREEDY_LIMIT_TEMPERATURE = float(torch.finfo(torch.float32).tiny)
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _check_row_max(top: torch.Tensor, what: str) -> None:
    """Raise ValueError unless every row maximum in ``top`` is finite: NaN propagates through the max and
    +inf is the max, so this one reduction over the row maxima finds NaN, +inf and all -inf rows."""
    if not bool(torch.isfinite(top).all()):
        raise ValueError(f"the logits hold NaN or +inf (or a row is all -inf): there is no {what} (a numerical "
                         "overflow in the model?)")


def argmax_tokens(logits: torch.Tensor) -> list[int]:
    """The greedy token of every row, as ints: ``logits.argmax(-1)``, refusing non-finite logits.

    Args:
        logits: (N, V) or (V,) logits of any float dtype.

    Returns:
        N ints (one for a (V,) input).

    Raises:
        ValueError: a row with NaN or +inf, or all -inf.
    """
    top, idx = logits.reshape(-1, logits.shape[-1]).max(-1)  # (N,), (N,)
    # the row maxima checked in Python: NaN propagates through the max and +inf is the max (one transfer, where
    # torch.isfinite(top).all() costs three more ops on every plain decoding step)
    if not all(math.isfinite(v) for v in top.tolist()):
        raise ValueError("the logits hold NaN or +inf (or a row is all -inf): there is no greedy token (a numerical "
                         "overflow in the model?)")
    return idx.tolist()


def process_logits(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The distribution to sample from: ``softmax(logits / temperature)`` restricted to the top-p nucleus.

    Computed as ``softmax((logits - rowmax) / temperature)`` in float32, so no finite temperature overflows
    (``logits / T`` did for tiny T: inf - inf = NaN, and every token became the last id): the argmax set's
    scaled logits are exactly 0 and every other one is negative or -inf. As T -> 0 this tends to the uniform
    distribution over the tokens tied at the maximum (one-hot of the argmax when there is no tie).
    Temperatures in ``(0, GREEDY_LIMIT_TEMPERATURE)`` (2**-126, about 1.18e-38, the smallest normal float32)
    give that limit directly, because float32 cannot hold such a T reliably (subnormal, or 0 below about
    1.4e-45, and the division would make NaN); the limit is the float32 softmax at such a T whenever the
    logits trailing the maximum trail it by more than ~2e-37 (see the comment at the threshold). Top-p then
    applies as usual. Temperatures above the largest float32 (3.4e38) are computed as 3.4e38.

    Args:
        logits: (..., V) logits of any float dtype; -inf marks an impossible token.
        temperature: >= 0, finite. ``0`` means greedy: the one-hot distribution of the argmax (the first
            index among ties, like ``argmax``).
        top_p: in (0, 1]. Keep the smallest set of highest-probability tokens whose mass reaches ``top_p``
            (the most likely token is always kept), zero the rest, renormalise (Holtzman et al. 2020).
            ``1`` keeps every token.

    Returns:
        (..., V) float32 probabilities, each row finite, non-negative and summing to 1.

    Raises:
        ValueError: a negative, infinite or NaN temperature, a ``top_p`` outside (0, 1], or logits with NaN
            or +inf (or a row that is all -inf).
    """
    if not temperature >= 0 or temperature == float("inf"):  # also catches NaN
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    logits = logits.float()
    top = logits.amax(-1, keepdim=True)  # (..., 1)
    _check_row_max(top, "distribution to sample from")
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    shifted = logits - top  # (..., V) <= 0; exactly 0 on the tied argmax set
    if temperature < GREEDY_LIMIT_TEMPERATURE:
        tied = (shifted == 0).float()  # the T -> 0 limit
        probs = tied / tied.sum(-1, keepdim=True)
    else:
        probs = torch.softmax(shifted / min(float(temperature), _FLOAT32_MAX), dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)  # (..., V)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token in sorted order
        keep_sorted = before < top_p
        keep_sorted[..., 0] = True
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def _check_weights(p: torch.Tensor, total: torch.Tensor, what: str) -> None:
    """Refuse (N, V) sampling weights ``p`` with row totals ``total`` (N, 1) unless every entry is >= 0
    (False for NaN) and every total finite and > 0: one fused check, one device sync. Raises ValueError."""
    ok = (p >= 0).all() & torch.isfinite(total).all() & (total > 0).all()
    if not bool(ok):
        raise ValueError(f"{what} needs rows of finite, non-negative weights that are not all zero; got a row "
                         "with NaN, inf, a negative entry or no mass")


def _rand(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Uniform [0, 1) float32 numbers drawn on the generator's device, returned on ``device``."""
    return torch.rand(shape, generator=generator, device=generator.device).to(device)


def _exponentials(shape: tuple[int, ...], generator: torch.Generator | Sequence[torch.Generator],
                  device: torch.device) -> torch.Tensor:
    """Exp(1) float32 numbers of ``shape`` (N, ...), on ``device``. One generator draws them all; a sequence of G
    generators splits the N rows into G equal consecutive blocks, block g drawn from generator g alone (each
    on its generator's device), so a block's numbers do not depend on the other blocks.

    Raises:
        ValueError: an empty sequence, or N not a multiple of its length.
    """
    gens = [generator] if isinstance(generator, torch.Generator) else list(generator)
    if not gens or shape[0] % len(gens):
        raise ValueError(f"{len(gens)} generators cannot split {shape[0]} rows into equal blocks")
    block = (shape[0] // len(gens),) + tuple(shape[1:])
    return torch.cat([torch.empty(block, device=g.device).exponential_(generator=g).to(device) for g in gens])


def sample_categorical(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One sample per row.

    Args:
        probs: (N, V) or (V,) non-negative weights (rows need not be normalised, must not be all zero).
        generator: the random source.

    Returns:
        (N,) int64 token ids (a 0-d tensor for a (V,) input), on ``probs``' device.

    Raises:
        ValueError: a row with NaN, inf, a negative weight, or all zeros.
    """
    squeeze = probs.dim() == 1
    p = probs.reshape(1, -1) if squeeze else probs
    # inverse CDF: one uniform per row; clamp guards the last bin against float round-off
    cdf = p.float().cumsum(-1)  # (N, V)
    _check_weights(p, cdf[:, -1:], "sample_categorical")
    u = _rand((p.shape[0], 1), generator, p.device) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u, right=True).clamp_(max=p.shape[-1] - 1).squeeze(-1)  # (N,)
    # a zero-probability bin is hit only when round-off puts u * total at or past the total (right=True never
    # lands inside a run of zero bins): the inverse CDF's value there is the last token with mass, not the argmax
    bad = p.gather(-1, idx.unsqueeze(-1)).squeeze(-1) <= 0
    if bool(bad.any()):
        last = (p > 0).cumsum(-1).argmax(-1)  # (N,) the first index reaching the count of positive bins
        idx = torch.where(bad, last, idx)
    return idx[0] if squeeze else idx


def sample_without_replacement(probs: torch.Tensor, k: int,
                               generator: torch.Generator | Sequence[torch.Generator]) -> torch.Tensor:
    """k ordered samples without replacement per row (the exponential race / Gumbel-top-k trick).

    The first column is a sample from ``probs``, the second a sample from ``probs`` with the first removed and
    renormalised, and so on (Plackett-Luce order), which is what the residual verifier assumes.

    Args:
        probs: (N, V) non-negative weights.
        k: samples per row, ``1 <= k <= V``.
        generator: the random source; or G generators, one per block of N / G consecutive rows (a batch's
            rows of nodes, each batch row drawn from its own generator: the same samples alone or batched).

    Returns:
        (N, k) int64 distinct token ids per row. When a row has fewer than k tokens of positive probability,
        the trailing columns hold zero-probability tokens (padding); the verifiers never accept those.

    Raises:
        ValueError: a row with NaN, inf, a negative weight, or all zeros; generators that do not split N.
    """
    _check_weights(probs, probs.float().sum(-1, keepdim=True), "sample_without_replacement")
    e = _exponentials(tuple(probs.shape), generator, probs.device)
    keys = probs.float() / e  # (N, V); a token of weight w wins the race first with probability w / sum
    return keys.topk(k, dim=-1).indices


def sample_excluding(q: torch.Tensor, k: int, exclude: Sequence[int], generator: torch.Generator
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """k ordered samples without replacement from q with the tokens ``exclude`` removed: what a drafter grafts
    next to candidates other drafters already proposed at the node (TreeGraft's recovered candidates).

    Args:
        q: (V,) float a drafter's distribution at the node.
        k: how many candidates, ``0 <= k <= V - len(set(exclude))``.
        exclude: token ids already proposed at the node (never returned).
        generator: the random source (one exponential race, as :func:`sample_without_replacement`).

    Returns:
        ``(tokens, q_cond)``: (k,) int64 distinct tokens not in ``exclude`` (when fewer than k have mass, the
        rest are zero-mass tokens, which verification skips), and (V,) float32 the distribution they were
        drawn from: q with ``exclude`` zeroed and renormalised (all zeros when q has no mass left).
    """
    q_cond = q.float().clone()
    ex = torch.as_tensor(list(exclude), dtype=torch.int64, device=q.device)
    if ex.numel():
        q_cond[ex] = 0.0
    mass = q_cond.sum()
    if float(mass) > 0:
        q_cond = q_cond / mass
    e = _exponentials(tuple(q_cond.shape), generator, q.device)
    keys = q_cond / e  # (V,)
    if ex.numel():
        keys[ex] = -1.0  # below every other key (>= 0): never picked
    return keys.topk(k).indices, q_cond


def verify_sampling_batch(
    p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-candidate speculative sampling at one node, for N independent rows at once.

    For each candidate x in rank order (Sequoia Algorithm 2; SpecInfer section 4): accept x with probability
    ``min(1, p(x) / q(x))``; on rejection ``p <- normalize(max(p - q, 0))`` and ``q <- q`` with x removed,
    renormalised. A candidate with ``q(x) == 0`` (padding from :func:`sample_without_replacement`) is
    skipped. When every candidate is rejected, the token is sampled from the final residual p. If the
    candidates are ordered samples without replacement from q, the returned token is distributed exactly as p.

    Args:
        p: (N, V) target distribution (float, rows sum to 1).
        q: (N, V) draft distribution the candidates were sampled from.
        candidates: (N, k) int64 candidate tokens in rank order (k may be 0).
        generator: the random source (fresh uniforms are drawn for every candidate of every row).

    Returns:
        ``(accepted, token)``: (N,) int64 rank of the accepted candidate or -1 when all were rejected, and
        (N,) int64 the emitted token (the accepted candidate, or the residual sample).

    Raises:
        ValueError: a row of q, or of p or a residual of p (checked where the token is sampled, by
            :func:`sample_categorical`), with NaN, inf, a negative entry or no mass.
    """
    p = p.float().clone()
    q = q.float().clone()
    _check_weights(q, q.sum(1, keepdim=True), "verify_sampling_batch's draft distribution q")
    N, k = candidates.shape
    device = p.device
    accepted = torch.full((N,), -1, dtype=torch.int64, device=device)
    token = torch.zeros(N, dtype=torch.int64, device=device)
    done = torch.zeros(N, dtype=torch.bool, device=device)
    for j in range(k):
        x = candidates[:, j : j + 1]  # (N, 1)
        px, qx = p.gather(1, x).squeeze(1), q.gather(1, x).squeeze(1)  # (N,)
        u = _rand((N,), generator, device)
        live = ~done & (qx > 0)
        acc = live & (u * qx < px)  # u < p/q without dividing; never accepts p(x) == 0
        accepted = torch.where(acc, torch.full_like(accepted, j), accepted)
        token = torch.where(acc, x.squeeze(1), token)
        done = done | acc
        rej = (live & ~acc).unsqueeze(1)  # (N, 1)
        residual = (p - q).clamp_(min=0)
        mass = residual.sum(1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p)  # p == q: nothing to correct
        p = torch.where(rej, residual, p)
        q_rm = q.scatter(1, x, 0.0)
        q_mass = q_rm.sum(1, keepdim=True)
        q_rm = torch.where(q_mass > 0, q_rm / q_mass.clamp(min=1e-30), q_rm)
        q = torch.where(rej, q_rm, q)
    bonus = sample_categorical(p, generator)
    token = torch.where(done, token, bonus)
    return accepted, token


def verify_sampling_node(
    p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator
) -> tuple[int | None, int]:
    """One node of :func:`verify_sampling_batch` (Sequoia Algorithm 2), with plain Python results.

    Args:
        p: (V,) target distribution at the node (after :func:`process_logits`).
        q: (V,) draft distribution the node's children were sampled from.
        candidates: (k,) int64 the children's tokens in rank order.
        generator: the random source.

    Returns:
        ``(rank, token)``: the rank of the accepted child (None when all were rejected) and the emitted token
        (the accepted child's token, or a sample from the final residual).
    """
    acc, tok = verify_sampling_batch(p.reshape(1, -1), q.reshape(1, -1), candidates.reshape(1, -1), generator)
    a = int(acc.item())
    return (None if a < 0 else a), int(tok.item())


def verify_point_mass_batch(
    p: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-candidate speculative sampling at one node when the candidates have no draft distribution,
    for N independent rows at once: each candidate is verified as a point mass.

    The rule is :func:`verify_sampling_batch` (Sequoia Algorithm 2; SpecInfer section 4) with q = one-hot(x)
    for candidate x: accept x with probability ``min(1, p(x) / q(x)) = p(x)``, p being the current residual;
    on rejection the residual ``normalize(max(p - q, 0))`` is p with ``p(x)`` set to 0, renormalised. When
    every candidate is rejected the token is sampled from the final residual.

    Why the emitted token is distributed as p, whatever the candidates (as long as they do not depend on
    this call's random numbers): by induction on k. For k = 0 the token is a sample of p. For k >= 1 and
    first candidate x: the token is x with probability p(x); otherwise (probability 1 - p(x)) the rule
    continues with the residual p' = p(. | not x) and the other k - 1 candidates, so by induction it emits
    y != x with probability (1 - p(x)) * p'(y) = p(y). A candidate with p(x) = 0 (outside the top-p nucleus,
    or repeated) is never accepted and leaves the residual unchanged; one with p(x) = 1 is always accepted.

    Args:
        p: (N, V) target distribution (float, rows sum to 1; unnormalised rows are read as normalised).
        candidates: (N, k) int64 candidate tokens in rank order (k may be 0).
        generator: the random source: one (N, k) draw of uniforms, then one uniform per row for the residual
            sample (drawn even for rows that accepted a candidate, so the number of draws is fixed).

    Returns:
        ``(accepted, token)``: (N,) int64 rank of the accepted candidate or -1 when all were rejected, and
        (N,) int64 the emitted token (the accepted candidate, or the residual sample).

    Raises:
        ValueError: a row of p with NaN, inf, a negative entry or no mass (:func:`sample_categorical`).
    """
    p = p.float().clone()  # (N, V) the residual, unnormalised
    N, k = candidates.shape
    device = p.device
    accepted = torch.full((N,), -1, dtype=torch.int64, device=device)
    token = torch.zeros(N, dtype=torch.int64, device=device)
    done = torch.zeros(N, dtype=torch.bool, device=device)
    u = _rand((N, k), generator, device)  # (N, k)
    for j in range(k):
        x = candidates[:, j : j + 1]  # (N, 1)
        px = p.gather(1, x).squeeze(1)  # (N,) the residual's weight of x
        mass = p.sum(1)  # (N,) the residual's total weight
        acc = ~done & (u[:, j] * mass < px)  # u < p(x) / mass without dividing; never accepts p(x) == 0
        accepted = torch.where(acc, torch.full_like(accepted, j), accepted)
        token = torch.where(acc, x.squeeze(1), token)
        done = done | acc
        p = p.scatter(1, x, torch.where(done, px, torch.zeros_like(px)).unsqueeze(1))  # rejected: p(x) = 0
    bonus = sample_categorical(p, generator)
    token = torch.where(done, token, bonus)
    return accepted, token


def verify_point_mass_node(
    p: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator
) -> tuple[int | None, int]:
    """One node of :func:`verify_point_mass_batch` (point-mass verification), with plain Python results.

    Args:
        p: (V,) target distribution at the node (after :func:`process_logits`).
        candidates: (k,) int64 the children's tokens in rank order (proposed without a distribution).
        generator: the random source.

    Returns:
        ``(rank, token)``: the rank of the accepted child (None when all were rejected) and the emitted token
        (the accepted child's token, or a sample from the final residual: p without the rejected children).
    """
    acc, tok = verify_point_mass_batch(p.reshape(1, -1), candidates.reshape(1, -1), generator)
    a = int(acc.item())
    return (None if a < 0 else a), int(tok.item())


@dataclass(frozen=True)
class CandidateGroup:
    """The candidates one drafter proposed at a node of a shared tree, with the distribution they were drawn
    from (for :func:`verify_groups_node`).

    Attributes:
        q: (V,) float the distribution the candidates are ordered samples without replacement from (for
            candidates chosen after other drafters' candidates at the same node, q with those tokens removed
            and renormalised: the distribution they were really drawn from); None: point masses (a drafter
            without probabilities, or greedy decoding).
        tokens: (k,) int64 the candidates in rank order.
        drafter: index of the drafter that proposed them (for reports).
    """

    q: torch.Tensor | None
    tokens: torch.Tensor
    drafter: int = 0


def verify_groups_node(
    p: torch.Tensor, groups: Sequence[CandidateGroup], generator: torch.Generator
) -> tuple[tuple[int, int] | None, int]:
    """Speculative sampling at one node whose candidates come from several drafters (SpecInfer, Miao et al.
    2024, section 4, multi-step speculative sampling; Sequoia Algorithm 2 within a group).

    The groups are tried in order, and within a group the candidates in rank order, against one residual r
    (initially p). A candidate x of a group with distribution q (q updated within the group: a rejected
    candidate is removed from q and q renormalised) is accepted with probability ``min(1, r(x) / q(x))``;
    on rejection ``r <- normalize(max(r - q, 0))``. A candidate with ``q(x) == 0`` is skipped. A point-mass
    group (``q`` None) accepts x with probability ``r(x)`` and on rejection sets ``r(x) = 0`` (renormalised),
    :func:`verify_point_mass_batch`'s rule. When every candidate is rejected the token is sampled from r.

    Why exact: each trial maps a residual r to a token distributed as r, provided the candidate was drawn
    from the trial's q independently of the verifier's random numbers (for a point mass: any fixed
    candidate), which holds for candidates drawn before verification from distributions that depend only
    on the tree (a strong drafter's candidates drawn from its q with a light drafter's tokens removed
    included). Chaining trials keeps the property (the induction of :func:`verify_point_mass_batch`), so
    the emitted token is distributed exactly as p.

    Args:
        p: (V,) target distribution at the node (after :func:`process_logits`).
        groups: the node's :class:`CandidateGroup` s in trial order (light drafter first).
        generator: the random source.

    Returns:
        ``((group, rank), token)`` for an accepted candidate, or ``(None, token)`` with a sample of the final
        residual.

    Raises:
        ValueError: a q with NaN, inf, a negative entry or no mass, or a p / residual
            :func:`sample_categorical` refuses.
    """
    r = p.float().clone()  # (V,) the residual, normalised
    device = r.device
    for gi, g in enumerate(groups):
        k = int(g.tokens.shape[0])
        if k == 0:
            continue
        toks = g.tokens.tolist()
        u = _rand((k,), generator, device).tolist()
        if g.q is None:
            for j, x in enumerate(toks):
                rx = float(r[x])
                mass = float(r.sum())
                if u[j] * mass < rx:
                    return (gi, j), x
                r[x] = 0.0
            continue
        q = g.q.float().clone()
        _check_weights(q.reshape(1, -1), q.sum().reshape(1, 1), "verify_groups_node's draft distribution q")
        for j, x in enumerate(toks):
            qx, rx = float(q[x]), float(r[x]) / max(float(r.sum()), 1e-30)
            if qx <= 0:
                continue
            if u[j] * qx < rx:
                return (gi, j), x
            r = r / r.sum().clamp(min=1e-30)
            res = (r - q).clamp_(min=0)
            mass = res.sum()
            if float(mass) > 0:
                r = res / mass
            q[x] = 0.0
            q_mass = q.sum()
            if float(q_mass) > 0:
                q = q / q_mass
    return None, int(sample_categorical(r / r.sum().clamp(min=1e-30), generator).item())


@dataclass(frozen=True)
class NodeVisit:
    """One verification trial: a node on the accepted path that has children.

    Attributes:
        depth: the node's depth (0 = root); its children sit at ``depth + 1``.
        num_children: how many candidates it proposed (the k of this trial).
        accepted_rank: rank of the accepted child, or None when every child was rejected.
    """

    depth: int
    num_children: int
    accepted_rank: int | None


@dataclass(frozen=True)
class Acceptance:
    """What verification (greedy or sampling) accepted in one tree.

    Attributes:
        path: node indices from the root (0) to the last accepted node, in depth order.
        tokens: the tokens to emit: the accepted nodes' tokens (root excluded) then the bonus token.
        visits: one :class:`NodeVisit` per node on the path that has children (a verification trial).
    """

    path: tuple[int, ...]
    tokens: tuple[int, ...]
    visits: tuple[NodeVisit, ...]

    @property
    def bonus(self) -> int:
        """The token the target adds after the last accepted node (the next root)."""
        return self.tokens[-1]

    @property
    def accepted_nodes(self) -> int:
        """Speculated nodes accepted (root and bonus excluded)."""
        return len(self.path) - 1


def verify_greedy(
    target_argmax: Sequence[int], tree_tokens: Sequence[int], children: Sequence[Sequence[int]]
) -> Acceptance:
    """Greedy tree verification (SpecInfer section 4, greedy case; Medusa's typical-acceptance with T = 0).

    Walk from the root; at node v accept the child whose token equals the target's argmax at v (children
    carry distinct tokens, so at most one matches); stop when none does or at a leaf. The bonus token is the
    target's argmax at the last accepted node. The accepted tokens plus the bonus are exactly the target's
    greedy continuation.

    Args:
        target_argmax: (n,) the target's argmax token at every tree node.
        tree_tokens: (n,) the tree's tokens (node 0 is the root).
        children: per node, its children's indices in rank order (``Tree.children``).

    Returns:
        An :class:`Acceptance`.
    """
    node, path, visits, depth = 0, [0], [], 0
    while children[node]:
        want = target_argmax[node]
        hit = None
        for r, c in enumerate(children[node]):
            if tree_tokens[c] == want:
                hit = r
                break
        visits.append(NodeVisit(depth, len(children[node]), hit))
        if hit is None:
            break
        node = children[node][hit]
        path.append(node)
        depth += 1
    tokens = tuple(int(tree_tokens[i]) for i in path[1:]) + (int(target_argmax[node]),)
    return Acceptance(tuple(path), tokens, tuple(visits))


def prompt_seed(seed: int, i: int) -> int:
    """The sampling seed of prompt ``i`` of a run seeded with ``seed``: ``seed + i``, wrapped into
    ``torch.Generator.manual_seed``'s range (-2^63 .. 2^64 - 1) past its top (``--seed 2^64 - 1`` with two prompts
    raised 'Overflow when unpacking long long' at the second prompt)."""
    s = int(seed) + int(i)
    return s - 2**64 if s > 2**64 - 1 else s

