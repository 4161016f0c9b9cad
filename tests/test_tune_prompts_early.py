"""`treeopt tune --engine treeopt` refuses prompts its target cannot read before it times anything."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import make_pair  # noqa: E402

from sequoia_opt.cli import app  # noqa: E402

runner = CliRunner()


def test_tune_refuses_chat_prompts_of_a_target_without_a_chat_template_before_timing(tmp_path):
    # a chat line for a target with no chat template: the prompts are encoded after load, before T(b, n) is timed
    # (it used to time every batch size, write the latency profile, and only then fail on the prompts)
    tdir, _, _ = make_pair(tmp_path)
    prompts = tmp_path / "chat.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    profiles = tmp_path / "profiles"
    res = runner.invoke(app, ["tune", "--engine", "treeopt", "--target", str(tdir), "--draft", "lookup",
                              "--prompts", str(prompts), "--batches", "1,2", "--max-draft", "2", "--rounds", "1",
                              "--profiles-dir", str(profiles)])
    assert res.exit_code == 2, res.output
    assert "holds chat prompts ('messages') but target has no chat template" in res.output
    assert "Traceback" not in res.output
    assert not profiles.exists() or not any(p.is_file() for p in profiles.rglob("*")), \
        sorted(map(str, profiles.rglob("*")))
