"""The per-batch latency profile (treeopt-latency-batch/1), solve --batch and its plan file, profile latency
--batch on the tiny pair, and the bad inputs (batch < 1, a batch size the profile did not measure, --offload
without CUDA)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import make_pair  # noqa: E402

from sequoia_opt.cli import app  # noqa: E402
from sequoia_opt.errors import ProfileError  # noqa: E402
from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve, save_latency  # noqa: E402
from sequoia_opt.profiles.batch import (BatchLatencyProfile, load_batch_latency, parse_batches,  # noqa: E402
                                        save_batch_latency)
from sequoia_opt.solver import choose  # noqa: E402
from sequoia_opt.solver.batch import choose_per_batch, load_plan, tree_for_batch  # noqa: E402

runner = CliRunner()
P = [0.55, 0.15, 0.07, 0.04, 0.02, 0.01]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def gpu_like(b: int) -> LatencyCurve:
    """A GPU-like T(b, n): flat while b x n <= 64 tokens, then linear in the tokens fed (compute-bound);
    the draft's c(b, w) the same shape at a tenth of the cost."""
    def t(tokens: int) -> float:
        return 10.0 + 0.25 * max(0, tokens - 64)

    ns = [1, 2, 4, 8, 16, 32, 64]
    return LatencyCurve.synthetic({n: t(b * n) for n in ns}, {n: t(b * n) / 10 for n in ns},
                                  step_overhead_ms=0.2, id=f"gpu-like@batch{b}")


@pytest.fixture()
def profile() -> BatchLatencyProfile:
    return BatchLatencyProfile(id="gpu-like", curves={b: gpu_like(b) for b in (1, 4, 16, 64)})


def test_tree_shrinks_with_batch_and_total_throughput_is_b_times_per_sequence(profile):
    chs = choose_per_batch(P, profile, [1, 4, 16, 64], 64, 10)
    sizes = [c.tree.size for c in chs]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]  # smaller trees at larger batches
    assert chs[-1].tree.size <= 2  # at b = 64 every extra node costs 64 tokens of compute
    for c in chs:
        alone = choose(P, profile.curve(c.batch), 64, 10)
        assert c.tree == alone.tree and c.tokens_per_s_per_sequence == pytest.approx(alone.tokens_per_s)
        assert c.tokens_per_s_total == pytest.approx(c.batch * alone.tokens_per_s)
        assert c.tokens_per_s_per_sequence >= c.plain_tokens_per_s_per_sequence - 1e-9


def test_batch_profile_round_trip_and_old_profile_is_batch_one(tmp_path, profile):
    path = save_batch_latency(tmp_path / "b.yaml", profile)
    back = load_batch_latency(path)
    assert back.batches == [1, 4, 16, 64]
    assert back.curve(16).target_ms(8) == pytest.approx(profile.curve(16).target_ms(8))
    assert back.curve(4).step_overhead_ms == pytest.approx(0.2)
    old = save_latency(tmp_path / "old.yaml", gpu_like(1))
    one = load_batch_latency(old)
    assert one.batches == [1] and one.curve(1).target_ms(4) == pytest.approx(10.0)
    with pytest.raises(ProfileError, match="measured at batch sizes 1, not 4"):
        one.curve(4)
    with pytest.raises(ProfileError, match="integer >= 1"):
        back.curve(0)
    doc = yaml.safe_load(path.read_text())
    doc["batches"][1]["batch"] = 1
    with pytest.raises(ProfileError, match="batch 1 is given twice"):
        BatchLatencyProfile.from_dict(doc)
    with pytest.raises(ProfileError, match="below 1"):
        parse_batches("1,0")
    with pytest.raises(ProfileError, match="not an integer"):
        parse_batches("1,x")
    for typo in ("1,,8", "1,2,", ",4"):  # a lost number is one line, not the batch sizes that are left
        with pytest.raises(ProfileError, match="has an empty item"):
            parse_batches(typo)
    with pytest.raises(ProfileError, match="at least one batch size"):
        parse_batches(" ")
    assert parse_batches(" 8, 1 ,2,2") == [1, 2, 8]


def test_a_batch_profile_keeps_the_engine_it_was_measured_on(tmp_path, profile):
    """A batch profile timed on llama.cpp (``treeopt tune --engine llama.cpp``: every curve's ``engine``) still names
    llama.cpp after a save and a load; it read as treeopt's decoder, so ``tune --engine vllm`` named the wrong
    engine in its warning and ``keeping`` merged it as treeopt's."""
    from sequoia_opt.engines import engine_mismatch

    engine = {"name": "llama.cpp", "version": "0.3.36"}
    curves = {b: dataclasses.replace(c, engine_info=dict(engine)) for b, c in profile.curves.items()}
    timed = dataclasses.replace(profile, curves=curves)
    for name in ("b.yaml", "b.json"):
        path = save_batch_latency(tmp_path / name, timed)
        assert (yaml.safe_load(path.read_text()) if name.endswith("yaml") else json.loads(path.read_text()))[
            "engine"] == engine
        back = load_batch_latency(path)
        assert [back.curve(b).engine for b in back.batches] == ["llama.cpp"] * 4
        assert back.curve(4).engine_info == engine
        assert "'llama.cpp'" in engine_mismatch(back.curve(1), "vllm", what="--engine vllm")
    assert "engine" not in profile.to_dict()  # treeopt's decoder: no key, as in a latency profile


def test_solve_batch_cli_table_and_plan(tmp_path, profile):
    lat = save_batch_latency(tmp_path / "b.yaml", profile)
    acc = tmp_path / "acc.yaml"
    acc.write_text(yaml.safe_dump(AcceptanceProfile(id="acc", acceptance=P).to_dict()))
    plan = tmp_path / "plan.json"
    r = invoke("solve", "-a", acc, "-l", lat, "--batch", "1,4,16,64", "--budget", "64", "--max-depth", "10",
               "-o", plan, "--format", "sglang", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(plan.read_text())
    assert [e["batch_range"] for e in doc["entries"]] == [[1, 3], [4, 15], [16, 63], [64, 64]]
    chs = choose_per_batch(P, profile, [1, 4, 16, 64], 64, 10)
    for e, c in zip(doc["entries"], chs):
        assert e["nodes"] == c.tree.size and e["tokens_per_s_total"] == pytest.approx(c.tokens_per_s_total)
        if c.tree.size > 1:
            assert e["engine"]["sglang"]["speculative_num_steps"] == c.tree.tree_depth
    ranges = load_plan(plan)
    assert tree_for_batch(ranges, 7) == chs[1].tree and tree_for_batch(ranges, 1) == chs[0].tree
    with pytest.raises(ProfileError, match="covers batch 65"):
        tree_for_batch(ranges, 65)
    r = invoke("solve", "-a", acc, "-l", lat, "--batch", "1,8")
    assert r.exit_code == 2 and "not 8" in r.output and r.output.count("\n") <= 2
    r = invoke("solve", "-a", acc, "-l", lat, "--batch", "0")
    assert r.exit_code == 2 and "below 1" in r.output
    r = invoke("solve", "-a", acc, "--batch", "1")
    assert r.exit_code == 2 and "pass --latency" in r.output
    r = invoke("solve", "-a", acc, "-l", lat, "--batch", "1", "--format", "yaml")
    assert r.exit_code == 2 and "engine format" in r.output


def test_solve_batch_with_an_engine_format_warns_as_one_tree_does_and_prints_the_settings(tmp_path, profile):
    """A tryout: ``solve --batch --format vllm`` wrote speculative_token_tree per batch size with no word that only
    vLLM 0.10.1-0.20.2 take it (one tree's export says so), and without -o printed no setting at all (--format's
    help: the export goes to stdout). Each warning is said once, the settings per batch range go to stdout."""
    lat = save_batch_latency(tmp_path / "b.yaml", profile)
    acc = tmp_path / "acc.yaml"
    acc.write_text(yaml.safe_dump(AcceptanceProfile(id="acc", acceptance=P).to_dict()))
    r = invoke("solve", "-a", acc, "-l", lat, "--batch", "1,4,16", "--budget", "16", "--format", "vllm")
    assert r.exit_code == 0, r.output
    settings = yaml.safe_load(r.stdout)
    from sequoia_opt.solver.hardware import SINGLE_DEFAULTS

    chs = choose_per_batch(P, profile, [1, 4, 16], 16, SINGLE_DEFAULTS["max_depth"],
                           SINGLE_DEFAULTS["max_branching"])
    assert [x["batch_range"] for x in settings] == [[1, 3], [4, 15], [16, 16]]
    for x, c in zip(settings, chs):
        assert x["vllm"]["num_speculative_tokens"] == c.tree.size - 1
    assert "only vLLM 0.10.1 to 0.20.2 accept speculative_token_tree" not in r.stdout
    assert r.stderr.count("only vLLM 0.10.1 to 0.20.2 accept speculative_token_tree") == 1
    r = invoke("solve", "-a", acc, "-l", lat, "--batch", "1,4", "--format", "tensorrt-llm", "-o", tmp_path / "p.yaml",
               "--json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and sum("1.4.0rc1 and later have no eagle_choices" in w for w in doc["warnings"]) == 1
    # a tree's own line (its head count) says which batch sizes it is about, where the trees differ
    heads = {}
    for e in doc["entries"]:
        if e["nodes"] > 1:
            heads.setdefault(f"{e['nodes'] - 1} choices, depth {e['depth']}: needs at least {e['depth']} Medusa heads",
                             []).append(e["batch"])
    said = [n for n in doc["notes"] if "Medusa heads" in n]
    assert len(heads) == 2  # batch 1 and 4 choose different trees here
    assert len(said) == len(heads) and all(
        (f"batch {', '.join(map(str, bs))}: {line}" if len(heads) > 1 else line) in " ".join(said)
        for line, bs in heads.items())


def test_profile_latency_batch_on_the_tiny_pair(tmp_path):
    target, draft, _ = make_pair(tmp_path)
    out = tmp_path / "lb.yaml"
    r = invoke("profile", "latency", "--target", target, "--draft", draft, "--context", "8", "--max-tokens", "3",
               "--max-draft-tokens", "2", "--max-repeats", "2", "--rounds", "1", "--batch", "1,3", "-o", out,
               "--json")
    assert r.exit_code == 0, r.output
    prof = load_batch_latency(out)
    assert prof.batches == [1, 3]
    for b in (1, 3):
        c = prof.curve(b)
        assert list(c.target_tokens()) == [1, 2, 3] and c.max_draft_tokens() == 2
        assert all(c.target_ms(n) > 0 for n in (1, 2, 3)) and c.step_overhead_ms > 0
    assert "batch sizes 1,3" in prof.source
    att = prof.device["attention"]  # every batch size's calls, per model (a CPU: the reference, nothing refused)
    assert att["target"]["backend"] == att["draft"]["backend"] == "torch" and att["target"]["refused"] == {}
    assert att["target"]["calls"]["torch"] > 0 and att["draft"]["calls"]["torch"] > 0
    # a profile without batch 1 is written (it was measured) and said to be one solve --batch and tune refuse
    r = invoke("profile", "latency", "--target", target, "--draft", draft, "--context", "8", "--max-tokens", "2",
               "--max-draft-tokens", "2", "--max-repeats", "2", "--rounds", "1", "--batch", "2", "-o",
               tmp_path / "b2.yaml", "--json")
    assert r.exit_code == 0 and load_batch_latency(tmp_path / "b2.yaml").batches == [2], r.output
    assert any(w.startswith("batch size 1 is not in --batch 2: a plan starts at batch 1")
               for w in json.loads(r.stdout)["warnings"])
    for args, msg in ((["--batch", "0"], "below 1"), (["--batch", "2", "--draft", "lookup"], "draft model"),
                      (["--batch", "2", "--draft", "eagle3"], "--draft eagle3 is not one"),  # wrote c(b, w) = 0 ms
                      (["--offload"], "not CUDA"), (["--batch", "2", "--offload"], "give one")):
        r = invoke("profile", "latency", "--target", target, *args)
        assert r.exit_code == 2 and msg in r.output, (args, r.output)


def test_a_default_profile_path_that_cannot_be_written_is_refused_before_any_timing(tmp_path, monkeypatch):
    """Without -o, profile latency (batch 1 and --batch) and profile acceptance found out that profiles/ could not
    hold their file only after minutes of measuring. Now one line, exit 2, before any forward."""
    import sequoia_opt.profiling.acceptance as acceptance
    import sequoia_opt.profiling.batch as batch
    import sequoia_opt.profiling.latency as latency

    target, draft, prompts = make_pair(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles").write_text("a file where the profiles folder should be")
    for mod, name in ((latency, "profile_model"), (batch, "model_sweep"), (acceptance, "measure_acceptance")):
        monkeypatch.setattr(mod, name, lambda *a, **k: pytest.fail("measured before the output was checked"))
    for args in (["latency", "--context", "8", "--max-tokens", "3", "--max-draft-tokens", "2"],
                 ["latency", "--context", "8", "--max-tokens", "3", "--max-draft-tokens", "2", "--batch", "1,2"],
                 ["acceptance", "--prompts", prompts, "--num-prompts", "1", "--max-new-tokens", "4"]):
        r = invoke("profile", *args, "--target", target, "--draft", draft)
        assert r.exit_code == 2, (args, r.output)
        errors = [ln for ln in r.output.splitlines() if ln.startswith("error:")]  # (a kernel-tuning note may precede)
        assert len(errors) == 1 and errors[0].startswith("error: cannot write profiles/") and \
            errors[0].endswith("profiles is not a folder"), (args, r.output)


def test_a_latency_profile_at_another_precision_keeps_its_own_id_and_default_file(tmp_path, monkeypatch):
    """A tryout's --weights int8 profile took the float32 one's id and default file, replacing it without a word
    (trees record the profile by that id). Another precision is another curve: its own id and file."""
    target, draft, _ = make_pair(tmp_path)
    monkeypatch.chdir(tmp_path)
    common = ["profile", "latency", "-t", target, "--draft", draft, "--context", "8", "--max-tokens", "2",
              "--max-draft-tokens", "2", "--max-repeats", "2", "--rounds", "1"]
    ids = {}
    for weights in ("float32", "int8"):
        r = invoke(*common, "--weights", weights)
        assert r.exit_code == 0, r.output
    for path in sorted((tmp_path / "profiles").rglob("*-latency.yaml")):
        ids[path.name] = yaml.safe_load(path.read_text())["id"]
    assert len(ids) == 2 and sorted(ids) == ["target__draft-int8-latency.yaml", "target__draft-latency.yaml"]
    assert ids["target__draft-int8-latency.yaml"] == ids["target__draft-latency.yaml"] + "_int8"


def test_a_batch_profile_at_another_precision_is_not_where_tune_reads_float32(tmp_path, monkeypatch):
    """profile latency --batch --dtype bfloat16 (or --weights int8) wrote target__draft-latency-batch.yaml, the
    file tune --engine treeopt reads and reused as its float32 T(b, n) (a review): its own file and id now, and
    tune refuses a batch profile of another precision at its default path."""
    from sequoia_opt.jobs.tune import TuneOptions, _latency_misfit
    from sequoia_opt.profiles.batch import load_batch_latency

    target, draft, _ = make_pair(tmp_path)
    monkeypatch.chdir(tmp_path)
    r = invoke("profile", "latency", "-t", target, "--draft", draft, "--context", "8", "--max-tokens", "2",
               "--max-draft-tokens", "2", "--max-repeats", "2", "--rounds", "1", "--batch", "1,2", "--weights", "int8")
    assert r.exit_code == 0, r.output
    [path] = (tmp_path / "profiles").rglob("*latency-batch.yaml")
    assert path.name == "target__draft-int8-latency-batch.yaml"
    prof = load_batch_latency(path)
    assert prof.id.endswith("_target__draft_float32_int8_batch"), prof.id
    opts = TuneOptions(engine="treeopt", batches=[1, 2], context=8, max_draft=1)
    import dataclasses

    bf16 = dataclasses.replace(prof, device={**prof.device, "dtype": "bfloat16"})
    assert _latency_misfit(bf16, opts, 1) == "was timed in bfloat16, not float32"
