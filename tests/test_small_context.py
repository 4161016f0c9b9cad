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
