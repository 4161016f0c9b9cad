"""``self:L`` sweeps: :func:`sweep_layers` measures acceptance and c(w) per L and keeps the L with the best
predicted speedup; ``treeopt profile layers`` does it on a checkpoint and writes the best L's profiles (or, on
bad input, one line, exit 2 and nothing)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import PROMPTS, byte_tokenizer, tiny_config  # noqa: E402

from sequoia_opt.cli import app  # noqa: E402
from sequoia_opt.drafting import LayerSkipDrafter  # noqa: E402
from sequoia_opt.errors import ProfileError, SolverError  # noqa: E402
from sequoia_opt.model import Transformer  # noqa: E402
from sequoia_opt.model.hf import save_hf_checkpoint  # noqa: E402
from sequoia_opt.model.loaders import load_checkpoint  # noqa: E402
from sequoia_opt.profiles import load_acceptance, load_latency  # noqa: E402
from sequoia_opt.profiling.acceptance import measure_acceptance  # noqa: E402
from sequoia_opt.profiling.latency import LatencyTable  # noqa: E402
from sequoia_opt.profiling.layers import check_layers, default_layer_grid, sweep_layers  # noqa: E402
from sequoia_opt.profiling.timing import Timing  # noqa: E402
from sequoia_opt.solver.hardware import score_tree  # noqa: E402

runner = CliRunner()
N_LAYERS = 4
FAST = {"min_repeats": 1, "max_repeats": 2, "warmup": 1}


def _target() -> Transformer:
    """A 4-layer tiny target whose blocks 1.. add little to the residual stream (o_proj, down_proj scaled by
    0.3): its first layers agree with it partly, so every L sees acceptances and rejections."""
    torch.manual_seed(0)
    m = Transformer(tiny_config().with_(n_layers=N_LAYERS))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.3)
        for block in m.layers[1:]:
            block.self_attn.o_proj.weight.mul_(0.3)
            block.mlp.down_proj.weight.mul_(0.3)
    return m.eval()


def _flat_tables(context: int = 16, ms: float = 50.0, top: int = 8) -> list[LatencyTable]:
    """Target tables with T(n) = ``ms`` for n = 1..top: a target so slow next to its drafts that trees pay
    off, and the predicted speedup ranks the L values by their acceptance."""
    return [LatencyTable(context, list(range(1, top + 1)), [Timing(ms, ms, ms, 1)] * top)]


@pytest.fixture(scope="module")
def target() -> Transformer:
    return _target()


@pytest.fixture(scope="module")
def prompt_ids() -> list[list[int]]:
    tok = byte_tokenizer()
    return [tok.encode(p) for p in PROMPTS[:3]]


SWEEP = dict(width=4, depth=3, max_new_tokens=16, draft_tokens=(1, 2, 4), budget=8, max_depth=4, max_branching=4,
             step_overhead_ms=0.5, **FAST)


# ---------------------------------------------------------------------------------------------- the grid


def test_default_layer_grid():
    assert default_layer_grid(30) == [5, 10, 15, 19, 24, 29]  # even spread, the top always n_layers - 1
    assert default_layer_grid(30, 3) == [10, 19, 29]
    assert default_layer_grid(4) == [1, 2, 3]  # count >= n_layers - 1: every L
    assert default_layer_grid(2) == [1]
    assert default_layer_grid(8, 3) == [2, 5, 7]
    for n in range(2, 40):
        for count in range(1, 8):
            g = default_layer_grid(n, count)
            assert g == sorted(set(g)) and g[-1] == n - 1 and g[0] >= 1 and len(g) == min(count, n - 1)
    with pytest.raises(ProfileError, match="at least 2 layers"):
        default_layer_grid(1)
    with pytest.raises(ProfileError, match="at least one L"):
        default_layer_grid(30, 0)


def test_check_layers():
    assert check_layers([3, 1, 3, np.int64(2)], 4) == [1, 2, 3]
    for bad, msg in (([], "is empty"), ([0], "L = 0: L must be in 1..3"), ([4], "L = 4: L must be in 1..3"),
                     ([2, "3"], "must hold integers"), ([True], "must hold integers")):
        with pytest.raises(ProfileError, match=msg):
            check_layers(bad, 4)


# ---------------------------------------------------------------------------------------------- the sweep


def test_sweep_measures_every_L_and_keeps_the_best(target, prompt_ids):
    tables = _flat_tables()
    sweep = sweep_layers(target, prompt_ids, target_tables=tables, layers=[3, 1, 2, 3], target_name="tiny4",
                         **SWEEP)
    assert [r.num_layers for r in sweep.rows] == [1, 2, 3]
    speedups = [r.predicted_speedup for r in sweep.rows]
    assert sweep.best is sweep.rows[int(np.argmax(speedups))]
    assert max(speedups) > 1.5  # a 50 ms target and sub-ms drafts: trees pay off
    assert len({round(s, 6) for s in speedups}) > 1  # the L values really differ
    for r in sweep.rows:
        L = r.num_layers
        # acceptance: exactly what an independent greedy measurement of self:L counts
        ref = measure_acceptance(target, LayerSkipDrafter(target, L), prompt_ids, width=4, depth=3, max_new_tokens=16)
        assert r.counts.trials > 0
        np.testing.assert_array_equal(r.counts.counts, ref.counts)
        assert r.counts.by_depth.keys() == ref.by_depth.keys()
        assert all(np.array_equal(r.counts.by_depth[d], ref.by_depth[d]) for d in ref.by_depth)
        assert (r.counts.steps, r.counts.tokens) == (ref.steps, ref.tokens)
        # c(w): timed at the tables' context over the widths asked for; the ratio reads the raw medians
        (dt,) = r.draft_tables
        assert dt.context == 16 and dt.tokens == [1, 2, 4] and all(t.median_ms > 0 for t in dt.timings)
        assert r.c1_over_T1 == pytest.approx(dt.timings[0].median_ms / 50.0, rel=1e-12)
        # the curve: the target tables + this draft, per-level, named self:L
        assert r.curve.cost_model == "per-level" and r.curve.model["draft"] == f"self:{L}"
        assert r.curve.id.endswith(f"_tiny4__self-L{L}_float32")
        assert r.curve.target_ms(3, 16) == 50.0
        assert r.curve.draft_ms(2, 16) == pytest.approx(dt.timings[1].median_ms, abs=1e-4)
        assert r.curve.source.startswith("measured by treeopt profile layers")
        # the choice: the solver's, read back through the cost model
        c = r.choice
        assert c is not None and 1 < c.tree.size <= 8 and c.tree.tree_depth <= 4
        assert r.expected_tokens == c.expected_tokens == pytest.approx(c.tree.expected_tokens(r.counts.vector()))
        assert r.predicted_speedup == c.speedup
        assert score_tree(c.tree, r.counts.vector(), r.curve, 16).speedup == pytest.approx(c.speedup)


def test_sweep_ties_go_to_the_smaller_L(target, prompt_ids):
    # T(n) grows so fast that no tree pays off: every L is plain decoding (speedup 1), and the cheapest wins
    steep = [LatencyTable(16, [1, 2, 3, 4], [Timing(1.0 * n ** 3, 1.0, 1.0, 1) for n in (1, 2, 3, 4)])]
    sweep = sweep_layers(target, prompt_ids[:1], target_tables=steep, layers=[2, 3],
                         **{**SWEEP, "budget": 4, "step_overhead_ms": 0.0, "max_new_tokens": 4})
    assert [round(r.predicted_speedup, 9) for r in sweep.rows] == [1.0, 1.0]
    assert sweep.best.num_layers == 2


@pytest.mark.parametrize("kwargs, error, message", [
    ({"layers": [0, 2]}, ProfileError, "L = 0: L must be in 1..3"),
    ({"layers": [N_LAYERS]}, ProfileError, "L = 4: L must be in 1..3"),
    ({"layers": []}, ProfileError, "is empty"),
    ({"budget": 9}, ProfileError, "budget 9 exceeds the largest target token count 8"),
    ({"budget": 0}, SolverError, "budget must be an integer >= 1"),
    ({"context": 32}, ProfileError, "not one of the target tables' contexts"),
    ({"draft_tokens": (2, 4)}, ProfileError, "must include 1"),
    ({"draft_tokens": (1, 600)}, ProfileError, "exceeds the target's context"),
    ({"width": 0}, ProfileError, "width must be at least 1"),
    ({"rounds": 0}, ProfileError, "rounds must be at least 1"),
])
def test_sweep_refuses_bad_inputs_before_measuring(target, prompt_ids, kwargs, error, message):
    calls = []
    with pytest.raises(error, match=message):
        sweep_layers(target, prompt_ids, target_tables=_flat_tables(),
                     progress=lambda *a: calls.append(a), **{**SWEEP, **kwargs})
    assert calls == []
    with pytest.raises(ProfileError, match="no prompts"):
        sweep_layers(target, [], target_tables=_flat_tables(), **SWEEP)
    with pytest.raises(ProfileError, match="did not measure one token"):
        sweep_layers(target, prompt_ids, target_tables=[LatencyTable(16, [2, 8], [Timing(1, 1, 1, 1)] * 2)],
                     **SWEEP)


# ---------------------------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("layers")
    save_hf_checkpoint(_target(), byte_tokenizer(), root / "target")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return root / "target", prompts


def _cli(target: Path, prompts: Path, out: Path, *extra: str):
    args = ["profile", "layers", "--target", target, "--prompts", prompts, "--num-prompts", "3", "-k", "4",
            "--depth", "3", "--max-new-tokens", "16", "--context", "16", "--max-tokens", "8",
            "--max-draft-tokens", "4", "--max-repeats", "2", "--rounds", "1", "--max-depth", "4",
            "--max-branching", "4", "--output-dir", out, *extra]
    return runner.invoke(app, [str(a) for a in args])


def test_a_bfloat16_sweep_writes_its_own_latency_file(checkpoint, tmp_path):
    """The bfloat16 curve went to the float32 default path (replacing that curve) while run --compare-drafters
    --dtype bfloat16 looked for target__self-L1-bfloat16-latency.yaml (a review)."""
    target, prompts = checkpoint
    out = tmp_path / "profiles"
    r = _cli(target, prompts, out, "--layers", "1", "--dtype", "bfloat16", "--json")
    assert r.exit_code == 0, r.output
    lat_path = Path(json.loads(r.stdout)["latency_profile"])
    assert lat_path.name == "target__self-L1-bfloat16-latency.yaml" and lat_path.parent.parent == out
    assert load_latency(lat_path).device["dtype"] == "bfloat16"


def test_cli_sweeps_and_writes_the_best_profiles(checkpoint, tmp_path):
    target, prompts = checkpoint
    out = tmp_path / "profiles"
    r = _cli(target, prompts, out, "--layers", "3,1", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rows = doc["rows"]
    assert [row["num_layers"] for row in rows] == [1, 3]
    best = doc["best"]
    assert best == max(rows, key=lambda row: (round(row["predicted_speedup"], 9), -row["num_layers"]))["num_layers"]
    assert [row["best"] for row in rows] == [row["num_layers"] == best for row in rows]
    assert doc["budget"] == 8 and sorted(map(int, doc["target_forward_ms"])) == list(range(1, 9))
    assert all(sorted(map(int, row["draft_forward_ms"])) == [1, 2, 4] for row in rows)
    acc_path, lat_path = Path(doc["acceptance_profile"]), Path(doc["latency_profile"])
    assert acc_path == out / f"target__self-L{best}" / "acceptance-greedy.yaml"
    assert lat_path.parent.parent == out and lat_path.name == f"target__self-L{best}-latency.yaml"
    # only the best L's two profiles are written
    assert sorted(p for p in out.rglob("*") if p.is_file()) == sorted([acc_path, lat_path])
    acc, lat = load_acceptance(acc_path), load_latency(lat_path)
    assert acc.measured["draft"] == f"self:{best}" and acc.measured["draft_cost_model"] == "per-level"
    assert acc.measured["mode"] == "greedy" and acc.width == 4 and acc.measured["num_prompts"] == 3
    assert lat.model["draft"] == f"self:{best}" and lat.cost_model == "per-level"
    assert list(lat.contexts) == [16] and lat.max_target_tokens() == 8 and lat.max_draft_tokens() == 4
    assert lat.source.startswith("measured by treeopt profile layers (1 round, each n timed alternately")
    # each row's counts: an independent greedy measurement of self:L on the same prompts
    model, tok = load_checkpoint(target, device="cpu", dtype=torch.float32)
    ids = [tok.encode(p) for p in PROMPTS[:3]]
    for row in rows:
        L = row["num_layers"]
        ref = measure_acceptance(model, LayerSkipDrafter(model, L), ids, width=4, depth=3, max_new_tokens=16,
                                 eos_ids=sorted(tok.eos_ids))
        assert row["counts"] == [int(x) for x in ref.counts]
        if L == best:
            assert list(acc.counts) == row["counts"]
    # the next commands the report gives work as written
    assert doc["next"][1].endswith(f"--draft self:{best} --tree tree-self-L{best}.yaml")
    solve = doc["next"][0].split()
    assert solve[:2] == ["treeopt", "solve"]
    tree = tmp_path / "tree.yaml"
    r = runner.invoke(app, solve[1:-2] + ["-o", str(tree)])  # the command, less its -o
    assert r.exit_code == 0, r.output
    assert tree.is_file()


def test_cli_says_when_no_L_beats_plain_decoding(checkpoint, tmp_path):
    # a budget of one node: every L's tree is the root alone (speedup 1), the tie goes to the smallest L
    target, prompts = checkpoint
    r = _cli(target, prompts, tmp_path / "profiles", "--layers", "2,1", "--budget", "1", "--max-new-tokens", "4",
             "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [row["tree_nodes"] for row in doc["rows"]] == [1, 1] and doc["best"] == 1
    assert doc["predicted_speedup"] == pytest.approx(1.0)
    assert any("no L swept is predicted to beat plain decoding" in w for w in doc["warnings"])
    assert Path(doc["acceptance_profile"]).is_file() and Path(doc["latency_profile"]).is_file()


@pytest.mark.parametrize("args, message", [
    (["--layers", "0,2"], "--layers has L = 0: L must be in 1..3"),
    (["--layers", "4"], "--layers has L = 4: L must be in 1..3 (the target has 4 layers"),
    (["--layers", ""], "--layers lists no L"),
    (["--layers", " , "], "--layers lists no L"),
    (["--layers", "a,2"], "--layers must be comma-separated integers"),
    (["--context", "-1"], "--context must be a number of tokens >= 0"),
    (["--context", "600"], "--context 600 + 8 tokens exceeds the target's context of 512"),
    (["--context", "1,2"], "Invalid value for '--context'"),
    (["--budget", "9"], "--budget 9 exceeds --max-tokens 8"),
    (["--width", "300"], "--width 300 asks for more candidates"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--device", "tpu"], "unknown device"),
])
def test_cli_bad_input_is_one_line_exit_2_nothing_written(checkpoint, tmp_path, args, message):
    target, prompts = checkpoint
    out = tmp_path / "profiles"
    r = _cli(target, prompts, out, *args)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert r.output.strip().count("\n") == 0  # one line
    assert not out.exists()


def test_cli_refuses_an_output_folder_that_is_a_file_before_measuring(checkpoint, tmp_path):
    target, prompts = checkpoint
    blocked = tmp_path / "file"
    blocked.write_text("not a folder\n")
    r = _cli(target, prompts, blocked, "--layers", "1")
    assert r.exit_code == 2 and "is not a folder" in r.output
    assert "target forward" not in r.output  # refused before anything was timed
    assert blocked.read_text() == "not a folder\n"
