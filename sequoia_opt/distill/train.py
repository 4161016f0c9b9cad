"""The student and its training: architecture (:func:`student_config`), initialisation with the target's
embedding projected on its top principal directions (:func:`pca_embedding`, :func:`init_student`), the loss
(:func:`topk_kl` plus next-token cross-entropy, over a sampled vocabulary), the learning-rate schedule and the
AdamW loop (:func:`train_student`) with teacher-forced held-out KL / agreement (:func:`evaluate_labels`)."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from ..model.config import ModelConfig
from ..model.llama import Transformer
from .teacher import TeacherLabels


def student_config(*, vocab_size: int, dim: int, n_layers: int, n_heads: int, n_kv_heads: int,
                   intermediate_size: int, rope_theta: float, max_position_embeddings: int = 2048,
                   norm_eps: float = 1e-5, name: str = "treeopt-draft") -> ModelConfig:
    """The student's architecture: Llama blocks with a tied embedding (the head reuses it)."""
    return ModelConfig(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads,
                       n_kv_heads=n_kv_heads, intermediate_size=intermediate_size, norm_eps=norm_eps,
                       rope_theta=rope_theta, max_position_embeddings=max_position_embeddings,
                       tie_embeddings=True, name=name)


def pca_embedding(emb: torch.Tensor, dim: int) -> tuple[torch.Tensor, float]:
    """Project an embedding matrix (V, D) on its top ``dim`` principal directions.

    Rows are centred (the mean row adds the same logit to every token under a tied head, so nothing that
    decides a ranking is lost) and multiplied by the top ``dim`` eigenvectors of the (D, D) covariance.

    Returns:
        ((V, dim) float32 projected matrix, fraction of the centred variance it keeps).
    """
    if dim > emb.shape[1]:
        raise ValueError(f"cannot project {emb.shape[1]} columns on {dim} directions")
    e = emb.double()
    ec = e - e.mean(dim=0, keepdim=True)  # (V, D)
    cov = ec.T @ ec  # (D, D)
    evals, evecs = torch.linalg.eigh(cov)  # ascending
    top = evecs[:, -dim:].flip(-1)  # (D, dim), largest first
    kept = float(evals[-dim:].sum() / evals.sum().clamp_min(1e-30))
    return (ec @ top).float(), kept


def init_student(config: ModelConfig, *, seed: int, embedding: torch.Tensor | None = None) -> Transformer:
    """A float32 student on CPU: linear weights N(0, 0.02) (output projections scaled by 1/sqrt(2 n_layers),
    GPT-2 style), norms 1, embedding from ``embedding`` (V, dim) when given."""
    g = torch.Generator().manual_seed(seed)
    model = Transformer(config, device="cpu", dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.fill_(1.0)
            elif name == "embed_tokens.weight":
                if embedding is not None:
                    p.copy_(embedding)
                else:
                    p.normal_(0.0, 0.02, generator=g)
            else:
                std = 0.02 / math.sqrt(2 * config.n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) \
                    else 0.02
                p.normal_(0.0, std, generator=g)
    return model


def topk_kl(student_logits: torch.Tensor, t_ids: torch.Tensor, t_logp: torch.Tensor) -> torch.Tensor:
    """Mean KL(p || q) from the renormalised top-k teacher distribution p to the student's full softmax q.

    Args:
        student_logits: (N, V) student logits.
        t_ids: (N, k) teacher top-k token ids.
        t_logp: (N, k) teacher log-probabilities of those ids (any normalisation; renormalised here).

    ``sum_k p_k (log p_k - log q_k)`` is >= 0 (q sums to at most 1 over the k ids) and is 0 exactly when the
    student puts the teacher's renormalised mass on the k ids and nothing elsewhere.
    """
    logq = torch.log_softmax(student_logits.float(), dim=-1).gather(-1, t_ids.long())  # (N, k)
    logp = torch.log_softmax(t_logp.float(), dim=-1)  # (N, k) renormalised
    return (logp.exp() * (logp - logq)).sum(-1).mean()


def student_hidden(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """(B, T, dim) final-norm hidden states of a plain causal forward (no cache): :meth:`Transformer.forward`
    without the LM head, so training can score a subset of the vocabulary. The head is
    ``hidden @ embed_tokens.weight.T`` (tied)."""
    T = tokens.shape[1]
    pos = torch.arange(T, device=tokens.device).float().unsqueeze(0)  # (1, T)
    angles = pos.unsqueeze(-1) * model.inv_freq  # (1, T, D/2)
    cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)  # (1, 1, T, D/2)
    x = model.embed_tokens(tokens)  # (B, T, dim)
    for layer in model.layers:
        x = layer(x, cos, sin, None, None, 0, None, "torch")
    return model.norm(x)


def sampled_vocab(t_ids: torch.Tensor, targets: torch.Tensor, *, vocab_size: int, n_random: int,
                  generator: torch.Generator) -> torch.Tensor:
    """Sorted unique token ids scored in one training step: every teacher top-k id (N, k), every real next
    token, and ``n_random`` uniformly drawn ids (so that, over many steps, every token's logit is pushed
    down somewhere)."""
    rand = torch.randint(0, vocab_size, (n_random,), generator=generator)
    return torch.unique(torch.cat([t_ids.reshape(-1).long(), targets.reshape(-1), rand]))


def scheduled_lr(opt: torch.optim.Optimizer, step: int, *, steps: int, lr: float, warmup: int, t0: float,
                 max_seconds: float | None) -> float:
    """Set and return the learning rate of ``step`` (:func:`lr_at`). With a time limit, the schedule follows
    whichever of steps or wall time since ``t0`` is further along, so the learning rate has decayed when the
    limit stops the run."""
    sched = step if max_seconds is None else max(step, int(steps * (time.perf_counter() - t0) / max_seconds))
    cur = lr_at(min(sched, steps - 1), steps=steps, lr=lr, warmup=warmup)
    for group in opt.param_groups:
        group["lr"] = cur
    return cur


def lr_at(step: int, *, steps: int, lr: float, warmup: int, final_frac: float = 0.1) -> float:
    """Linear warm-up then cosine decay to ``final_frac * lr``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


@dataclass
class TrainResult:
    """What a training run logged: one row per logging step (step, tokens, learning rate, losses and held-out
    figures), the wall time in seconds and the tokens seen (draft model distillation and EAGLE-3 heads alike)."""

    rows: list[dict]
    wall_s: float
    tokens_seen: int
    stopped_by: str = ""  # "" (every step asked ran), "time limit" or "Ctrl-C" (the weights trained so far are kept)


@contextlib.contextmanager
def stop_on_ctrl_c(log: Callable[[str], None] = print) -> Iterator[dict]:
    """Within a training loop, the first Ctrl-C asks it to stop after the step it is in, as the time limit does, so
    the weights trained so far are evaluated and saved (``stop["requested"]`` turns True; a training run is minutes
    to an hour on a CPU, and a KeyboardInterrupt in the optimizer's step would leave some tensors updated and
    others not); a second Ctrl-C interrupts at once (nothing saved). Off the main thread signals cannot be caught,
    and where SIGINT is ignored (a job a shell script starts with ``&``) or handled outside Python, it is left so: only
    the flag is given."""
    stop = {"requested": False}
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is None or previous is signal.SIG_IGN:
        yield stop
        return

    def ask(signum: int, frame: object) -> None:
        stop["requested"] = True
        signal.signal(signal.SIGINT, previous)  # the next Ctrl-C interrupts at once
        log("Ctrl-C: stopping after this step; the weights trained so far will be evaluated and saved "
            "(Ctrl-C again to abandon them)")

    signal.signal(signal.SIGINT, ask)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_reason(stop: dict, t0: float, max_seconds: float | None) -> str:
    """Why a training loop stops after this step: ``"Ctrl-C"`` (:func:`stop_on_ctrl_c`'s flag), ``"time limit"``
    (``max_seconds`` past ``t0``, a ``time.perf_counter()`` reading), or ``""`` (go on): both trainers' test, one
    place. :func:`stop_line` is what they log when it is not empty."""
    if stop["requested"]:
        return "Ctrl-C"
    return "time limit" if max_seconds is not None and time.perf_counter() - t0 > max_seconds else ""


def stop_line(step: int, reason: str, max_seconds: float | None) -> str:
    """The log line of a training stopped after ``step`` for ``reason`` (:func:`stop_reason`)."""
    return f"stopping at step {step}: " + (reason if reason == "Ctrl-C" else f"past the {max_seconds:.0f} s time limit")


def evaluate_labels(model: Transformer, chunks: torch.Tensor, labels: TeacherLabels) -> dict[str, float]:
    """Top-k KL and top-1 agreement (student argmax == teacher argmax) of ``model`` on labelled chunks."""
    kl_sum, agree, n = 0.0, 0, 0
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        for i in range(chunks.shape[0]):
            logits = model(chunks[i: i + 1])[0]  # (T, V)
            kl_sum += float(topk_kl(logits, labels.ids[i], labels.logp[i])) * logits.shape[0]
            agree += int((logits.argmax(-1) == labels.ids[i, :, 0].long()).sum())
            n += logits.shape[0]
    model.train(was_training)
    return {"kl": kl_sum / n, "agreement": agree / n}


def _batch_loss(model: Transformer, x: torch.Tensor, t_ids: torch.Tensor, t_logp: torch.Tensor, *,
                n_random: int | None, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Top-k KL over the first ``t_ids.shape[0]`` flattened positions of ``x`` (B, T) (the labelled rows come
    first), next-token CE over all of ``x``, and the student's top-1 agreement with the teacher on the
    labelled positions (within the sampled vocabulary when ``n_random`` is set). Returns ``(kl, ce, agree)``."""
    nl = t_ids.shape[0]
    T = x.shape[1]
    nxt = x[:, 1:].reshape(-1)  # (B*(T-1),) real next tokens
    if n_random is None:
        logits = model(x)  # (B, T, V)
        flat = logits.view(-1, logits.shape[-1])[:nl]  # (nl, V)
        kl = topk_kl(flat, t_ids, t_logp)
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), nxt)
        top1 = t_ids[:, 0]
    else:
        # sampled softmax: score only the ids this batch needs plus random negatives
        vocab = sampled_vocab(t_ids, nxt, vocab_size=model.config.vocab_size, n_random=n_random,
                              generator=generator)  # (U,) sorted
        h = student_hidden(model, x)  # (B, T, dim)
        scores = h.view(-1, h.shape[-1]) @ model.embed_tokens.weight[vocab].T  # (B*T, U)
        flat = scores[:nl]
        kl = topk_kl(flat, torch.searchsorted(vocab, t_ids), t_logp)
        ce = F.cross_entropy(scores.view(x.shape[0], T, -1)[:, :-1].reshape(-1, vocab.numel()),
                             torch.searchsorted(vocab, nxt))
        top1 = torch.searchsorted(vocab, t_ids[:, 0].contiguous())
    with torch.no_grad():
        agree = float((flat.argmax(-1) == top1).float().mean())
    return kl, ce, agree


def train_student(model: Transformer, chunks: torch.Tensor, labels: TeacherLabels, *, steps: int, batch: int,
                  lr: float, seed: int, ce_weight: float = 0.1, warmup: int = 30, weight_decay: float = 0.01,
                  clip: float = 1.0, log_every: int = 10, eval_every: int = 100,
                  val: tuple[torch.Tensor, TeacherLabels] | None = None,
                  log: Callable[[str], None] = print, max_seconds: float | None = None,
                  n_random: int | None = 2048, extra: torch.Tensor | None = None,
                  extra_batch: int = 0, cont: tuple[torch.Tensor, TeacherLabels] | None = None,
                  cont_batch: int = 0,
                  probe: Callable[[Transformer], float] | None = None) -> TrainResult:
    """AdamW on ``topk_kl + ce_weight * next-token CE`` over random batches of ``batch`` chunks.

    With ``n_random`` set, each step's softmax runs over :func:`sampled_vocab` (the batch's teacher top-k
    ids, its next tokens and ``n_random`` random ids) instead of the whole vocabulary: on a CPU the tied
    head dominates the cost, and code uses a small part of a 49k vocabulary. Train agreement is then
    measured within that subset; validation always uses the full head. ``n_random=None``: full softmax.

    ``extra`` (M, T) are unlabelled chunks of the same text: each step adds ``extra_batch`` of them, which
    contribute only to the cross-entropy term (cheap data where teacher labels are the bottleneck).

    ``cont`` is sequence-level KD data from :func:`teacher_continuations`, sequences (N, T2) with their
    labels: each step adds the same loss over ``cont_batch`` of them (a second forward, as T2 differs from
    T), logged as ``cont_kl`` / ``cont_agreement``.

    ``probe`` (model -> fraction) runs at every evaluation, logged as ``val_greedy_agreement`` (the caller
    passes the greedy agreement on the eval prompts' target continuations, the draft's bar).

    Returns the logged rows (step, tokens, lr, train KL/CE/agreement, validation KL/agreement when ``val``),
    the wall time and the tokens seen. Stops early (and says so in the log) past ``max_seconds``, or on Ctrl-C
    (:func:`stop_on_ctrl_c`: after the step it is in, the model trained so far returned).
    """
    g = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    model.train()
    n, T = chunks.shape
    use_cont = cont is not None and cont_batch > 0
    rows: list[dict] = []
    acc = {"kl": 0.0, "ce": 0.0, "agree": 0.0, "ckl": 0.0, "cagree": 0.0, "k": 0}
    t0 = time.perf_counter()
    tokens = 0
    stopped_by = ""
    with stop_on_ctrl_c(log) as stop:
        for step in range(steps):
            cur = scheduled_lr(opt, step, steps=steps, lr=lr, warmup=warmup, t0=t0, max_seconds=max_seconds)
            idx = torch.randint(0, n, (batch,), generator=g)
            x = chunks[idx]  # (B, T) labelled
            if extra is not None and extra_batch > 0:
                x = torch.cat([x, extra[torch.randint(0, extra.shape[0], (extra_batch,), generator=g)]])  # (B+E, T)
            kl, ce, agree = _batch_loss(model, x, labels.ids[idx].view(-1, labels.ids.shape[-1]).long(),
                                        labels.logp[idx].view(-1, labels.logp.shape[-1]), n_random=n_random,
                                        generator=g)
            loss = kl + ce_weight * ce
            tokens += x.numel()
            if use_cont:
                cseq, clab = cont
                cidx = torch.randint(0, cseq.shape[0], (cont_batch,), generator=g)
                cx = cseq[cidx]  # (C, T2)
                ckl, cce, cagree = _batch_loss(model, cx, clab.ids[cidx].view(-1, clab.ids.shape[-1]).long(),
                                               clab.logp[cidx].view(-1, clab.logp.shape[-1]), n_random=n_random,
                                               generator=g)
                loss = loss + ckl + ce_weight * cce
                tokens += cx.numel()
                acc["ckl"] += float(ckl.detach())
                acc["cagree"] += cagree
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            acc["agree"] += agree
            acc["kl"] += float(kl.detach())
            acc["ce"] += float(ce.detach())
            acc["k"] += 1
            last = step == steps - 1
            stopped_by = stop_reason(stop, t0, max_seconds)
            over = bool(stopped_by)
            if (step + 1) % log_every == 0 or last or over:
                row = {"step": step + 1, "tokens": tokens, "lr": cur, "train_kl": acc["kl"] / acc["k"],
                       "train_ce": acc["ce"] / acc["k"], "train_agreement": acc["agree"] / acc["k"],
                       "cont_kl": acc["ckl"] / acc["k"] if use_cont else "",
                       "cont_agreement": acc["cagree"] / acc["k"] if use_cont else "",
                       "val_kl": "", "val_agreement": "", "val_greedy_agreement": "",
                       "elapsed_s": round(time.perf_counter() - t0, 2)}
                acc = {"kl": 0.0, "ce": 0.0, "agree": 0.0, "ckl": 0.0, "cagree": 0.0, "k": 0}
                if (step + 1) % eval_every == 0 or last or over:
                    if val is not None:
                        v = evaluate_labels(model, *val)
                        row["val_kl"], row["val_agreement"] = v["kl"], v["agreement"]
                    if probe is not None:
                        row["val_greedy_agreement"] = probe(model)
                        model.train()
                rows.append(row)
                log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                             if v != ""))
            if over:
                log(stop_line(step + 1, stopped_by, max_seconds))
                break
    model.eval()
    return TrainResult(rows=rows, wall_s=time.perf_counter() - t0, tokens_seen=tokens, stopped_by=stopped_by)
