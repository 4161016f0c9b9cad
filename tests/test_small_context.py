"""Models with a short context (max_position_embeddings 64): the profilers' own timing decodes stay inside it, and
settings that cannot fit are refused in one line before anything is measured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import make_pair  # noqa: E402

from sequoia_opt.cli import app  # noqa: E402


def _short_pair(tmp_path, context=64):
    target, draft, prompts = make_pair(tmp_path)
    for d in (target, draft):
        cfg = json.loads((d / "config.json").read_text())
        cfg["max_position_embeddings"] = context
        (d / "config.json").write_text(json.dumps(cfg))
    return target, draft, prompts


def _latency(target, draft, out, context):
    return CliRunner().invoke(app, ["profile", "latency", "-t", str(target), "--draft", str(draft), "--context",
                                    str(context), "--max-tokens", "16", "--max-draft-tokens", "4", "--max-repeats", "3",
                                    "--rounds", "1", "-o", str(out)])


def test_the_loop_timing_fits_a_short_context(tmp_path):
    """context 30 + the loop's 12 steps + a 16-token tree = 58 positions of 64: measured (the tree decoders' room
    used to reach past the context: 'prompt (31 tokens) + max_new_tokens (43) exceed the model context')."""
    target, draft, _ = _short_pair(tmp_path)
    out = tmp_path / "lat.yaml"
    r = _latency(target, draft, out, 30)
    assert r.exit_code == 0, r.output
    doc = json.loads(json.dumps(__import__("yaml").safe_load(out.read_text())))
    loop = doc["curves"][0]["loop"]
    assert loop["tokens"][-1] == 16 and all(ms > 0 for ms in loop["verify_ms"])


def test_a_loop_past_the_context_is_refused_before_measuring(tmp_path):
    target, draft, _ = _short_pair(tmp_path)
    out = tmp_path / "lat.yaml"
    r = _latency(target, draft, out, 48)  # 48 + 1 + 2 + 8 + 1 + 16 = 76 > 64
    assert r.exit_code == 2
    line = r.output.strip().splitlines()[-1]
    assert ("decodes 76 positions, past the target model's context of 64 tokens: lower --context to 36 or --max-tokens" in line
            and "--no-loop" in line), r.output
    assert not out.exists()
    r = CliRunner().invoke(app, ["profile", "latency", "-t", str(target), "--draft", str(draft), "--context", "48",
                                 "--max-tokens", "16", "--max-draft-tokens", "4", "--max-repeats", "3", "--rounds", "1",
                                 "--no-loop", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "loop" not in __import__("yaml").safe_load(out.read_text())["curves"][0]


def test_runs_past_the_draft_context_are_counted_as_the_teacher_forced_guesses_are():
    """run's warning and profile acceptance --chains count the positions past a draft's context the same way:
    the token at position x is guessable while x <= context (a step rooted at L < context drafts), which is where
    teacher forcing gives a guess; run used to count one position more per prompt."""
    from types import SimpleNamespace

    from tiny_pair import random_model

    from sequoia_opt.cli.run import draft_context_warning
    from sequoia_opt.drafting.drafters.model import teacher_forced_top1

    draft = random_model(1)
    draft.config = draft.config.with_(max_position_embeddings=40)
    pair = SimpleNamespace(draft=draft, draft_context=40,
                           target=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=4096)))
    ids = [[5] * 30, [6] * 36, [7] * 12]  # past the context by 30 + 16 - 1 - 40 = 5, 11, and 0 of 16 positions
    M = 16
    unguessed = sum(g == (-1, 0.0) for p in ids for g in teacher_forced_top1(draft, p, [9] * M))
    assert unguessed == 5 + 11
    line = draft_context_warning(pair, ids, M)
    assert line is not None and f"{unguessed / (len(ids) * M):.0%} of the positions generated lie past it" in line
    assert draft_context_warning(pair, [[5] * 25], M) is None  # 25 + 16 - 1 = 40: every guess fits
