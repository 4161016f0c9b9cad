"""Does the EAGLE-3 head draft as well as it trained? Its step-0 agreement through the trainer's path
(``sequoia_opt.distill.eagle3.evaluate_continuations``: teacher-forced, every position) against its depth-1 p_1
through the decoder (``measure_acceptance`` with a chain of 1: the positions where a step starts), on the same
prompts and the target's own greedy continuations.

A head whose decoder p_1 fell far below its trainer agreement on the same text would lose something in drafting
(features, positions, its KV cache); equal figures say a gap to the training log's agreement is the prompts'.

    python benchmarks/head_agreement_check.py --prompts 16 --gen-tokens 32     # ~3 min on 2 CPU cores

Prints the two figures; writes nothing.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16, help="profile / held-out code prompts used (the first N)")
    ap.add_argument("--prompt-tokens", type=int, default=96, help="each prompt's last tokens (the trainer's length)")
    ap.add_argument("--gen-tokens", type=int, default=32, help="greedy continuation tokens per prompt")
    args = ap.parse_args(argv)
    if min(args.prompts, args.prompt_tokens, args.gen_tokens) < 1:
        print("error: --prompts, --prompt-tokens and --gen-tokens must be at least 1", file=sys.stderr)
        return 2

    import sequoia_opt
    from sequoia_opt.distill.eagle3 import default_aux_layers, evaluate_continuations, teacher_continuation_features
    from sequoia_opt.jobs.load import load_drafters
    from sequoia_opt.model.head_checkpoints import load_eagle_head
    from sequoia_opt.profiling.acceptance import measure_acceptance
    from sequoia_opt.prompts import demo_prompts_path, encode_prompts, load_prompts

    (pair,) = load_drafters(None, ["eagle3"], device=torch.device("cpu"), dtype=torch.float32)
    target, P, G = pair.target, args.prompt_tokens, args.gen_tokens
    repo = Path(__file__).resolve().parents[1]
    texts = load_prompts(demo_prompts_path("profile")) + load_prompts(repo / "benchmarks" / "data" / "code-heldout.jsonl")
    ids = [x[-P:] for x in encode_prompts(texts, pair.tokenizer, model=pair.target_name) if len(x) >= P][: args.prompts]
    layers = tuple(i + 1 for i in default_aux_layers(target.config.n_layers))
    data = teacher_continuation_features(target, torch.tensor(ids, dtype=torch.int64), gen_tokens=G,
                                         hidden_layers=layers, k=16, batch=len(ids), log=lambda _: None)
    head, draft_ids = load_eagle_head(Path(sequoia_opt.__file__).parent / "data" / "eagle3", "eagle3", target)
    index = torch.full((target.config.vocab_size,), -1, dtype=torch.int64)
    index[draft_ids] = torch.arange(draft_ids.numel())
    agree = evaluate_continuations(head.float(), data, P, index, steps=1)["agreement"][0]
    counts = measure_acceptance(target, pair.new_drafter, ids, width=1, depth=1, max_new_tokens=G)
    c = counts.by_depth[1]
    print(f"{len(ids)} prompts x {G} tokens: trainer-path step-0 agreement {agree:.3f}; decoder depth-1 p_1 "
          f"{c[0] / c.sum():.3f} over {int(c.sum())} step starts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
