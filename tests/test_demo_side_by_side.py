"""``run_demo`` on a tiny pair (fast): beside the draft model, the lookup and (opt-in) self:L drafters are
profiled, each gets its own hardware-aware tree, and all run in one call against one plain baseline; the
"drafters side by side" table has a row per drafter whose tree is the solver's choice on that drafter's written
profiles; the same trees then run on the shipped chat prompts, rendered with the target's chat template."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import byte_tokenizer, noisy_copy, tiny_config  # noqa: E402

from sequoia_opt.jobs.demo import DemoSettings, run_demo  # noqa: E402
from sequoia_opt.errors import TreeoptError  # noqa: E402
from sequoia_opt.prompts import PromptFileError, demo_prompts_path, encode_prompts, load_prompts  # noqa: E402
from sequoia_opt.profiling.layers import default_layer_grid  # noqa: E402
from sequoia_opt.model import Transformer  # noqa: E402
from sequoia_opt.model.hf import save_hf_checkpoint  # noqa: E402
from sequoia_opt.profiles import load_acceptance, load_latency  # noqa: E402
from sequoia_opt.solver import choose  # noqa: E402
from sequoia_opt.tree import load_tree  # noqa: E402

SETTINGS = dict(max_tokens=8, max_draft_tokens=8, context=16, latency_repeats=5, latency_rounds=1, width=3,
                acc_depth=2, acc_prompts=2, acc_new_tokens=8, max_depth=4, num_prompts=2, max_new_tokens=8,
                extra_width=2, extra_depth=2, lookup_prompts=2, lookup_new_tokens=8, lookup_depth=3, self_prompts=1,
                self_new_tokens=8, self_layers="auto", chat_prompts=2, chat_new_tokens=6)
# a chat template without special tokens (the byte-level tokenizer has none but EOS)
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo on a 2-layer byte-level pair whose context holds the demo prompts (up to ~840 bytes)."""
    root = tmp_path_factory.mktemp("demo")
    torch.manual_seed(0)
    target = Transformer(tiny_config().with_(max_position_embeddings=1024))
    with torch.no_grad():
        for name, p in target.named_parameters():
            p.fill_(1.0) if "norm" in name else p.normal_(0.0, 0.3)
    target.eval()
    tok = byte_tokenizer()
    tok.chat_template = TEMPLATE
    save_hf_checkpoint(target, tok, root / "target")
    save_hf_checkpoint(noisy_copy(target, 0.05, 1), tok, root / "draft")
    out = root / "out"
    result = run_demo(target=root / "target", draft=str(root / "draft"), settings=DemoSettings(**SETTINGS),
                      out_dir=out)
    return result, out


def test_the_demo_sweeps_three_layer_counts_only_when_asked():
    assert default_layer_grid(30, count=3) == [10, 19, 29]
    assert default_layer_grid(2, count=3) == [1] and default_layer_grid(3, count=3) == [1, 2]
    assert DemoSettings().self_layers is None and DemoSettings().layer_grid(30) == []
    assert DemoSettings(self_layers="auto").layer_grid(30) == [10, 19, 29]
    assert DemoSettings(self_layers=(12, 3, 12)).layer_grid(30) == [3, 12]
    assert DemoSettings(self_layers="auto").layer_grid(1) == []
    with pytest.raises(TreeoptError, match=r"self:L needs L in 1..29 \(the target has 30 layers\), got \[30\]"):
        DemoSettings(self_layers=(3, 30)).layer_grid(30)
    with pytest.raises(TreeoptError, match="'auto' or L values"):
        DemoSettings(self_layers="all").layer_grid(30)


def test_the_default_latency_grid_is_dense_to_8_and_stops_at_32():
    from sequoia_opt.profiling.timing import token_grid

    s = DemoSettings()
    assert token_grid(s.max_tokens, dense_up_to=s.dense_tokens) == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 31,
                                                                     32]
    assert (s.latency_rounds, s.latency_repeats, s.latency_paired, s.latency_warmup) == (3, 5, True, 1)
    assert (s.width, s.acc_depth) == (4, 4)
    # the samples the intervals come from are kept: 24 x 32 acceptance, 6 x 64 run
    assert (s.acc_prompts, s.acc_new_tokens, s.num_prompts, s.max_new_tokens) == (24, 32, 6, 64)


def test_demo_runs_every_drafter_side_by_side(demo):
    result, out = demo
    assert result.greedy_ok
    rows = result.drafters
    assert [r.drafter for r in rows] == ["draft", "lookup:1-3", "self:1"]
    assert [r.cost_model for r in rows] == ["per-level", "one-pass", "per-level"]
    assert all(r.equals_plain is True and r.mismatches == 0 for r in rows)
    # one plain baseline; every drafter's tree and the baselines on the same prompts, in one run
    names = [s.tree for s in result.run.summaries]
    assert names[:4] == ["plain", "solved (this CPU)", "lookup:1-3", "self:1"]
    assert names[4:] == [n for n in names[4:] if n.startswith(("best chain", "best k-ary", "solved (GPU-like"))]
    plain = result.run.summaries[0]
    # a baseline that is the solved tree itself runs once, under the solved tree's name (a note says so)
    dropped = [n for n in result.report.notes if "is the solved tree itself: it runs once, as 'solved (this CPU)'" in n]
    for family in ("best chain", "best k-ary"):
        assert sum(n.startswith(family) for n in names) + sum(n.startswith(family) for n in dropped) == 1
    assert len(names) == 7 - len(dropped) and 0 < plain.new_tokens <= 2 * 8  # (a random target may emit EOS early)
    assert all(s.new_tokens == plain.new_tokens for s in result.run.summaries)
    files = {"draft": ("acceptance.yaml", "latency.yaml", "tree.yaml", 3),
             "lookup:1-3": ("acceptance-lookup-1-3.yaml", "latency-lookup-1-3.yaml", "tree-lookup-1-3.yaml", 2),
             "self:1": ("acceptance-self-L1.yaml", "latency-self-L1.yaml", "tree-self-L1.yaml", 2)}
    for r in rows:
        a, lat, t, width = files[r.drafter]
        acc, curve = load_acceptance(out / a), load_latency(out / lat)
        assert acc.measured["draft"] == r.drafter == curve.model["draft"]
        assert curve.cost_model == r.cost_model and acc.width == width
        solver = choose(acc.acceptance, curve, 8, 4, width, context=16)
        tree, meta = load_tree(out / t)
        want = solver
        if "rechosen_from" in meta.extra:  # the solver's tree's step, timed again, missed: the ladder's best kept
            was, checked = meta.extra["rechosen_from"], meta.extra["checked_trees"]
            assert (was["nodes"], was["level_widths"]) == (solver.tree.size, list(solver.tree.level_widths))
            assert checked[0] == was and len(checked) == 1 + len(solver.smaller)
            want = solver.with_candidate(next(c for c in solver.smaller if c.level_widths == tree.level_widths))
            kept = next(r for r in checked if r["level_widths"] == list(tree.level_widths))
            assert kept["checked_speedup"] == max(r["checked_speedup"] for r in checked)
            assert kept["checked_speedup"] == pytest.approx(meta.predicted_speedup, rel=1e-5)
        assert tree.choices() == want.tree.choices()
        assert (r.nodes, r.depth, r.level_widths) == (want.tree.size, want.tree.tree_depth,
                                                      list(want.tree.level_widths))
        assert r.predicted_tokens_per_step == pytest.approx(want.expected_tokens)
        s = next(x for x in result.run.summaries if x.tree == r.tree)  # the file's figure over the run's generations
        assert s.predicted_speedup_steady == pytest.approx(meta.predicted_speedup)
        assert r.predicted_speedup == s.predicted_speedup
        gens = sum(1 for x in result.run.rows if x.tree == r.tree and x.steps > 0)
        want_run = meta.predicted_speedup * s.new_tokens / (s.new_tokens + gens * meta.extra["end_overshoot_tokens"])
        assert r.predicted_speedup == pytest.approx(want_run)
        if want.tree.size == 1:  # the root alone (plain decoding): nothing to time again
            assert "step_check" not in meta.extra and meta.predicted_speedup == pytest.approx(want.speedup) == 1.0
        else:  # the solver's figure is kept; the predicted speedup is the chosen step's, timed after the choice
            assert meta.extra["solver_predicted_speedup"] == pytest.approx(want.speedup)
            chk = meta.extra["step_check"]
            assert chk["tree_size"] == want.tree.size and 0 < chk["steps"] <= 2 * 12
            assert meta.predicted_speedup == pytest.approx(want.expected_tokens * chk["plain_ms"] / chk["step_ms"],
                                                           rel=1e-3)
        assert r.c1_over_t1 == pytest.approx(curve.draft_ms(1, 16) / curve.target_ms(1, 16))
        s = next(x for x in result.run.summaries if x.tree == r.tree)
        assert (r.tokens_per_step, r.speedup, r.tokens_per_s) == (s.tokens_per_step, s.speedup, s.tokens_per_s)
    assert load_acceptance(out / "acceptance-lookup-1-3.yaml").measured["num_prompts"] == 2
    assert load_acceptance(out / "acceptance-self-L1.yaml").measured["num_prompts"] == 1


def test_demo_report_has_the_side_by_side_table_and_the_sweep(demo):
    result, out = demo
    tables = {title.split(":")[0]: (cols, body) for title, cols, body in result.report.tables}
    cols, body = tables["drafters side by side"]
    assert cols[0] == "drafter" and cols[-1] == "= plain" and "c(1)/T(1)" in cols
    assert [row[0] for row in body] == ["draft", "lookup:1-3", "self:1"]
    assert [row[-1] for row in body] == ["yes", "yes", "yes"]
    assert [row[cols.index("nodes")] for row in body] == [r.nodes for r in result.drafters]
    assert [row[cols.index("acc. model")] for row in body] == [r.acceptance_model for r in result.drafters]
    cols, body = tables["self"]
    assert [row[0] for row in body] == [1] and body[0][-1] == "<-"
    assert result.report.summary["drafters compared"] == "draft, lookup:1-3, self:1"
    assert any("the draft model on 2 x 8 (K = 3, depth 2), lookup on 2 x 8 (K = 2, depth 3) and self:L on 1 x 8 per "
               "L (K = 2, depth 2); K is also their trees' max branching" in n
               and n.endswith("; fewer for the extra drafters, to keep the demo short") for n in result.report.notes)
    assert [d["drafter"] for d in result.report.data["drafters"]] == ["draft", "lookup:1-3", "self:1"]
    import json

    assert [d["drafter"] for d in json.loads(Path(result.files["run_json"]).read_text())["drafters"]] == \
        ["draft", "lookup:1-3", "self:1"]


def test_demo_runs_the_same_trees_on_chat_prompts(demo):
    result, out = demo
    chat = result.chat
    assert chat is not None and chat.greedy_ok and result.greedy_ok
    # the same drafters, the same trees (solved on the code profile), one plain baseline on the chat prompts
    assert [r.drafter for r in chat.rows] == ["draft", "lookup:1-3", "self:1"]
    assert [(r.nodes, r.level_widths) for r in chat.rows] == [(r.nodes, r.level_widths) for r in result.drafters]
    assert [r.predicted_tokens_per_step for r in chat.rows] == [r.predicted_tokens_per_step for r in result.drafters]
    assert chat.run.settings["prompts"] == "sequoia_opt/data/prompts/chat.jsonl"
    assert [s.tree for s in chat.run.summaries] == ["plain", "solved (this CPU)", "lookup:1-3", "self:1"]
    assert all(0 < s.new_tokens <= 2 * 6 for s in chat.run.summaries)
    # the prompts the chat run decoded are the conversations rendered with the target's template
    from sequoia_opt.model.hf import load_hf_tokenizer

    tok = load_hf_tokenizer(out.parent / "target")
    conv = load_prompts(demo_prompts_path("chat"), limit=2)
    want = encode_prompts(conv, tok)
    assert tok.decode(want[0]) == "".join(f"{m['role']}: {m['content']}\n" for m in conv[0].messages) + "assistant: "
    assert [r["prompt_tokens"] for r in chat.run.to_dict()["rows"] if r["tree"] == "plain"] == [len(w) for w in want]
    tables = {title.split(" (")[0]: (cols, body) for title, cols, body in result.report.tables}
    cols, body = tables["chat prompts"]
    assert [row[0] for row in body] == ["draft", "lookup:1-3", "self:1"]
    assert Path(result.files["chat_run_json"]).parent == out / "chat"
    assert [d["drafter"] for d in result.report.data["chat"]["drafters"]] == ["draft", "lookup:1-3", "self:1"]


def test_demo_refuses_chat_prompts_for_a_target_without_a_template(tmp_path):
    torch.manual_seed(0)
    target = Transformer(tiny_config().with_(max_position_embeddings=1024)).eval()
    save_hf_checkpoint(target, byte_tokenizer(), tmp_path / "target")
    save_hf_checkpoint(noisy_copy(target, 0.05, 1), byte_tokenizer(), tmp_path / "draft")
    with pytest.raises(PromptFileError, match="chat.jsonl holds chat prompts .'messages'. but target has no chat "
                                              "template"):
        run_demo(target=tmp_path / "target", draft=str(tmp_path / "draft"), settings=DemoSettings(**SETTINGS),
                 out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_demo_cli_refuses_bad_self_layers_before_loading_models(tmp_path):
    from typer.testing import CliRunner

    from sequoia_opt.cli import app

    r = CliRunner().invoke(app, ["demo", "--self-layers", "6,x", "--out-dir", str(tmp_path / "out")])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--self-layers takes 'auto' or L values like 6,12,24, got '6,x'" in lines[0]
    assert not (tmp_path / "out").exists()
