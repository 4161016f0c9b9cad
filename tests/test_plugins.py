"""The one-loop promise: a new drafter is one file and a registry line, a new policy is one file and a registry
line, and both run through ``treeopt run`` unchanged. The two files here are written outside the package (as a
user's plugins, named in TREEOPT_PLUGINS), taken verbatim from docs/drafters.md's example; the loop, the CLI and
the jobs know nothing of them."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import make_pair, random_model  # noqa: E402

from sequoia_opt.cli import app  # noqa: E402
from sequoia_opt.decoding import Decoder, autoregressive_generate  # noqa: E402
from sequoia_opt.drafting import registry  # noqa: E402
from sequoia_opt.errors import TreeoptError  # noqa: E402
from sequoia_opt.tree import Tree, save_tree  # noqa: E402

def _docs_block(first_line: str) -> str:
    """The ```python block of docs/drafters.md that begins with ``first_line``: the plugins below are the docs'
    own example, as written there (a tryout found the example's placeholder body crashed when copied)."""
    text = (Path(__file__).parents[1] / "docs" / "drafters.md").read_text(encoding="utf-8")
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"docs/drafters.md has no python block beginning {first_line!r}")


# A drafter of one's own (proposes, at every node, the node's own token and the ids after it: right whenever the
# text repeats a token; no model, no cache, no probabilities) and a policy of one's own (each row's tree is the
# --tree cut to depth 1 or 2 by the parity of the row's length, so rows of one batch verify trees of different
# sizes in one forward): the docs' example files.
TOY_DRAFTER = _docs_block("# my_drafter.py")
TOY_POLICY = _docs_block("# my_policy.py")


@pytest.fixture()
def plugins(tmp_path, monkeypatch):
    d, p = tmp_path / "toy_drafter.py", tmp_path / "toy_policy.py"
    d.write_text(TOY_DRAFTER)
    p.write_text(TOY_POLICY)
    monkeypatch.setenv("TREEOPT_PLUGINS", f"{d},{p}")
    before_d, before_p = dict(registry.DRAFTERS), dict(registry.POLICIES)
    yield d, p
    # leave the registries as they were for the other tests
    registry.DRAFTERS.clear()
    registry.DRAFTERS.update(before_d)
    registry.POLICIES.clear()
    registry.POLICIES.update(before_p)
    registry._PLUGINS_LOADED.difference_update({str(d), str(p)})


def test_a_toy_drafter_and_policy_run_through_treeopt_run_unchanged(tmp_path, plugins):
    target, _, prompts = make_pair(tmp_path)
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.from_choices([[0], [1], [0, 0], [1, 0]]))
    r = CliRunner().invoke(app, ["run", "--tree", str(tree), "--target", str(target), "--draft", "repeat",
                                 "--policy", "alternating", "--prompts", str(prompts), "--num-prompts", "2",
                                 "--max-new-tokens", "12", "--results-dir", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    by = {s["tree"]: s for s in doc["summaries"]}
    toy = by["t (alternating)"]
    assert toy["mismatches"] == 0 and toy["new_tokens"] == by["plain"]["new_tokens"] == 24
    rows = [x for x in doc["rows"] if x["tree"] == "t (alternating)"]
    assert all(x["matches_plain"] for x in rows)
    assert "repeat" in registry.DRAFTERS and "alternating" in registry.POLICIES
    r = CliRunner().invoke(app, ["run", "--tree", str(tree), "--target", str(target), "--draft", "repeat:3",
                                 "--prompts", str(prompts), "--results-dir", str(tmp_path / "bad")])
    assert r.exit_code == 2 and "--draft repeat:3: drafter 'repeat' takes no argument" in r.output
    assert not (tmp_path / "bad").exists()


def test_per_row_trees_of_different_sizes_in_one_batch_equal_plain(plugins):
    """The toy policy gives rows of one batch trees of different sizes (its depth follows each row's own length):
    one forward verifies them all, and every row equals its plain greedy decoding alone."""
    registry.load_plugins()
    target = random_model(0, std=0.3)
    drafter = registry.DRAFTERS["repeat"].build(None, target, None)
    policy = registry.POLICIES["alternating"].build(drafter, Tree.from_choices([[0], [1], [0, 0], [1, 0]]), {})
    prompts = [[5, 5, 5, 5], [1, 2, 3], list(range(30, 50)), [7]]
    dec = Decoder(target, policy, max_batch=4, max_len=128)
    state = dec.start_batch(prompts, 16)
    sizes = set()
    while not state.finished:
        step = dec.step(state)
        sizes.add(tuple(s.tree_size for s in step.rows))
    assert any(len(set(s)) > 1 for s in sizes)  # some step verified trees of different sizes together
    assert len(state.results) == len(prompts)
    for p, res in zip(prompts, state.results):
        assert res.tokens == autoregressive_generate(target, p, 16).tokens
    assert drafter.proposals > 0


def test_a_plugin_that_fails_to_import_is_one_line(tmp_path, monkeypatch):
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(TreeoptError, match=r"plugin .*bad.py.* could not be loaded: RuntimeError: no GPU here"):
        registry.load_plugins(str(bad))
    monkeypatch.setenv("TREEOPT_PLUGINS", str(tmp_path / "missing.py"))
    r = CliRunner().invoke(app, ["run", "--tree", "x.yaml"])
    assert r.exit_code == 2 and "could not be loaded" in r.output and "Traceback" not in r.output


def test_a_kind_registered_with_another_cost_model_than_its_drafter_is_refused(plugins):
    """``has_probs`` and ``cost_model`` are said twice, by the registry kind and by the drafter class; the solver
    prices and the dynamic policies trust the kind's word, so a kind whose drafter says otherwise is refused."""
    from dataclasses import replace

    from sequoia_opt.jobs.load import ModelPair

    registry.load_plugins()
    target = random_model(0)
    good = registry.DRAFTERS["repeat"]
    spec = registry.parse_drafter_spec("repeat")
    assert ModelPair(target, None, None, "t", "repeat", spec).new_drafter().cost_model == "one-pass"
    registry.DRAFTERS["repeat"] = replace(good, has_probs=True)
    with pytest.raises(TreeoptError, match="'repeat' is registered with has_probs=True but builds a RepeatDrafter "
                                           "with has_probs=False"):
        ModelPair(target, None, None, "t", "repeat", spec).new_drafter()
    registry.DRAFTERS["repeat"] = replace(good, cost_model="per-level")
    with pytest.raises(TreeoptError, match="cost_model='per-level' but builds a RepeatDrafter"):
        ModelPair(target, None, None, "t", "repeat", spec).new_drafter()


def test_the_kinds_plugins_register_are_in_the_commands_help(plugins):
    """--draft and --policy help named the bundled kinds only; a plugin's kind now appears there with its
    summary (plugins load before click builds the subcommand's help)."""
    def flowing(args: list[str]) -> str:  # the help's description column as one line (its wrapping undone)
        out = CliRunner().invoke(app, args).output
        return " ".join(" ".join(ln.strip(" \u2502") for ln in out.splitlines()).split())

    run_help = flowing(["run", "--help"])
    assert "Registered by plugins: repeat (repeat the last token)." in run_help
    assert "Registered by plugins: alternating (depth 1 or 2 by the row's length)." in run_help
    assert "Registered by plugins: repeat (repeat the last token)." in flowing(["profile", "acceptance", "--help"])
    assert [k.name for k in registry.plugin_kinds()[0]] == ["repeat"]


def test_without_plugins_the_help_lists_none():
    assert registry.plugin_kinds() == ([], [])
    assert "Registered by plugins" not in CliRunner().invoke(app, ["run", "--help"]).output


def test_a_plugin_that_fails_after_registering_is_reported_by_its_own_cause(tmp_path, monkeypatch):
    """The CLI loads the plugins twice (for a command's help, then in the root callback); a plugin that registered
    a kind and then failed was run again, and the error named its second run's "already registered" instead of
    the real cause. A failed plugin now leaves no kind registered."""
    bad = tmp_path / "half_plugin.py"
    bad.write_text("from dataclasses import replace\n"
                   "from sequoia_opt.drafting.registry import DRAFTERS, register_drafter\n"
                   "register_drafter(replace(DRAFTERS['lookup'], name='half', summary='half a plugin'))\n"
                   "import no_such_module_of_a_plugin\n")
    monkeypatch.setenv("TREEOPT_PLUGINS", str(bad))
    before = dict(registry.DRAFTERS)
    r = CliRunner().invoke(app, ["run", "--help"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        f"error: plugin '{bad}' (TREEOPT_PLUGINS) could not be loaded: ModuleNotFoundError: No module named "
        "'no_such_module_of_a_plugin'"]
    assert registry.DRAFTERS == before
