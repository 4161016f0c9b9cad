"""Plans in each engine's current settings (issue 29), against the rules read in each engine's own code at a named
release (sequoia_opt/plan_exports.py says where): what every engine would run at every batch size equals the
plan's setting there, every rule of its validator is encoded and broken once, and a release that does not take
the setting is refused in one line. The static-tree exports say which releases still take trees."""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml

from sequoia_opt import exports
from sequoia_opt.dynamic import DynamicSetting
from sequoia_opt.plan_exports import (PlanExportError, check_sglang_tiers, check_trtllm_schedule,
                                      check_vllm_schedule, export_plan, sglang_steps, trtllm_draft_len,
                                      vllm_draft_len)
from sequoia_opt.solver.schedule import SpecSetting
from sequoia_opt.tree import Tree

C = SpecSetting.chain
N = SpecSetting.none()
PLANS = {
    "falling": [(1, 3, C(4)), (4, 15, C(2)), (16, 64, N)],
    "all-speculate": [(1, 1, C(5)), (2, 8, C(3)), (9, 128, C(1))],
    "none": [(1, 256, N)],
    "one": [(1, 32, C(3))],
}


def _want(ranges, b, past="last"):
    for lo, hi, s in ranges:
        if lo <= b <= hi:
            return s.draft_tokens
    return ranges[-1][2].draft_tokens if past == "last" else 0


# ---------------------------------------------------------------------------------------------- vLLM
@pytest.mark.parametrize("name", ["falling", "all-speculate", "one"])
def test_vllm_runs_the_plan_at_every_batch_size(name):
    ranges = PLANS[name]
    e = export_plan(ranges, "vllm", method="eagle3", model="m")
    cfg = json.loads(e.text)
    assert cfg["method"] == "eagle3" and cfg["model"] == "m"
    sched = check_vllm_schedule(cfg["num_speculative_tokens_per_batch_size"])
    assert cfg["num_speculative_tokens"] == max(s.draft_tokens for *_, s in ranges) > 0
    for b in range(1, 300):
        assert vllm_draft_len(sched, cfg["num_speculative_tokens"], b) == _want(ranges, b)
    assert "0.24.0 to 0.33.0" in e.releases


def test_vllm_lookup_fills_gaps_and_clips_as_vllm_does():
    sched = [(1, 4, 5), (9, 16, 2)]  # a gap 5..8 carries the previous K; K clipped to num_speculative_tokens
    assert [vllm_draft_len(sched, 3, b) for b in (1, 4, 6, 9, 40)] == [3, 3, 3, 2, 2]


@pytest.mark.parametrize("sched,msg", [
    ([], "non-empty list"),
    ([[1, 4]], "three integers"),
    ([[1, 4, 2.0]], "three integers"),
    ([[0, 4, 2]], "must be positive"),
    ([[1, 4, 2], [6, 5, 1]], "start must be <= end"),
    ([[1, 4, -1]], "K must be >= 0"),
    ([[1, 4, 2], [4, 8, 1]], "non-overlapping"),
    ([[2, 4, 2]], "first batch-size range must start at 1"),
])
def test_vllm_validator_rules(sched, msg):
    with pytest.raises(PlanExportError, match=msg):
        check_vllm_schedule(sched)


def test_vllm_releases_methods_shapes_and_ngram():
    with pytest.raises(PlanExportError, match=r"vLLM 0.23.0 has no num_speculative_tokens_per_batch_size .*: upgrade, "
                                              r"or run one K for every batch size \(the plan's own per batch size are "
                                              r"4, 2, 0\)"):
        export_plan(PLANS["falling"], "vllm", release="0.23.0")
    assert export_plan(PLANS["falling"], "vllm", release="0.24.0", model="JackFram/llama-68m").warnings == ()
    assert export_plan(PLANS["falling"], "vllm", release="0.24.0").warnings == (  # vLLM would load the placeholder
        "the config names the drafter <your draft model>: pass --model with the checkpoint vLLM loads (a Hugging "
        "Face id or a path), or edit the file",)
    assert "newer than the last release checked" in export_plan(PLANS["falling"], "vllm", release="0.40.1").warnings[0]
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in export_plan(PLANS["falling"], "vllm", method="suffix").warnings[0]
    ng = json.loads(export_plan(PLANS["one"], "vllm", method="ngram", lookup=(2, 4)).text)
    assert (ng["prompt_lookup_min"], ng["prompt_lookup_max"]) == (2, 4) and "model" not in ng
    with pytest.raises(PlanExportError, match="vLLM takes a draft length per batch size"):
        export_plan([(1, 4, SpecSetting.static_tree(Tree.from_choices([[0], [1]])))], "vllm")
    e = export_plan(PLANS["none"], "vllm")
    assert e.data == {} and "without --speculative-config" in e.text


# ---------------------------------------------------------------------------------------------- TensorRT-LLM
@pytest.mark.parametrize("name", ["falling", "all-speculate", "one"])
def test_trtllm_runs_the_plan_at_every_batch_size(name):
    ranges = [(lo, hi, s) for lo, hi, s in PLANS[name]]
    if name == "all-speculate":
        ranges = [(1, 1, C(5)), (2, 8, C(3)), (9, 128, C(1))]
    e = export_plan(ranges, "tensorrt-llm", max_batch=512)
    cfg = yaml.safe_load(e.text)["speculative_config"]
    sched = check_trtllm_schedule(cfg["draft_len_schedule"], cfg["max_draft_len"])
    for b in range(1, 600):
        want = _want(ranges, b, past="zero")
        if ranges[-1][2].draft_tokens and ranges[-1][1] < b <= 512:
            want = ranges[-1][2].draft_tokens  # --max-batch extended the last range
        assert trtllm_draft_len(sched, b) == want, b
    assert cfg["decoding_type"] == "Draft_Target" and cfg["max_draft_len"] == ranges[0][2].draft_tokens
    if ranges[-1][2].draft_tokens:  # --max-batch given: the note does not ask for it again
        assert "past batch 512 TensorRT-LLM drafts nothing (its implicit 0)" in e.notes


def test_trtllm_12_reads_keys_as_range_starts():
    ranges = PLANS["falling"]
    cfg = yaml.safe_load(export_plan(ranges, "tensorrt-llm", release="1.2.1").text)["speculative_config"]
    sched = check_trtllm_schedule(cfg["draft_len_schedule"], cfg["max_draft_len"], lower_keys=True)
    assert sched == {1: 4, 4: 2, 16: 0}
    for b in range(1, 100):
        assert trtllm_draft_len(sched, b, lower_keys=True) == _want(ranges, b)
    with pytest.raises(PlanExportError, match="not known to take draft_len_schedule"):
        export_plan(ranges, "tensorrt-llm", release="1.1.0")
    # a 1.2.0 release candidate sorts below 1.2.0 and was refused with a message naming its own line: written as
    # 1.2 reads it, with a warning that the schedule arrived during those candidates
    rc = export_plan(ranges, "tensorrt-llm", release="1.2.0rc6", method="ngram")
    assert yaml.safe_load(rc.text)["speculative_config"]["draft_len_schedule"] == {1: 4, 4: 2, 16: 0}
    assert any("arrived (#8194) during the 1.2.0 release candidates" in w for w in rc.warnings)
    assert not any("release candidates" in w for w in export_plan(ranges, "tensorrt-llm", release="1.2.0").warnings)
    # 1.2 applies the schedule to NGram and Draft_Target only: an Eagle3 / MTP plan of several Ks is refused (the
    # file ran max_draft_len at every batch size; it was written with a warning, exit 0); one K everywhere is written
    assert not export_plan(ranges, "tensorrt-llm", release="1.2.1", method="ngram").warnings
    for method, name in (("eagle3", "Eagle3"), ("mtp", "MTP")):
        with pytest.raises(PlanExportError, match=re.escape(
                f"TensorRT-LLM 1.2.1 ignores draft_len_schedule for {name}: it would draft max_draft_len = 4 at every "
                f"batch size, not this plan (3 draft lengths); the schedule applies to {name} from 1.3.0rc8")):
            export_plan(ranges, "tensorrt-llm", release="1.2.1", method=method, model="m")
        one = export_plan([(1, 64, SpecSetting.chain(3))], "tensorrt-llm", release="1.2.1", method=method, model="m")
        assert one.data["speculative_config"]["max_draft_len"] == 3 and not one.warnings
    # each file's header names the releases that read its keys as written (a 1.2 file is not for 1.3.0rc8+)
    old, new = export_plan(ranges, "tensorrt-llm", release="1.2.1"), export_plan(ranges, "tensorrt-llm")
    assert old.text.splitlines()[0].startswith("# for TensorRT-LLM 1.2.0 and later, before 1.3.0rc8 (keys start their "
                                               "ranges")
    assert new.text.splitlines()[0].startswith("# for TensorRT-LLM 1.3.0rc8 and later (keys end their ranges")
    rc7 = export_plan(ranges, "tensorrt-llm", release="1.3.0rc7")  # a 1.3.0 candidate before the change: 1.2's keys
    assert rc7.text.splitlines()[0] == old.text.splitlines()[0] and rc7.data == old.data


@pytest.mark.parametrize("engine,method,msg", [
    ("vllm", "bogus", "vLLM has no speculative method 'bogus'"),
    ("tensorrt-llm", "bogus", "TensorRT-LLM has no draft_len_schedule decoding type for method 'bogus'"),
    ("sglang", "bogus", "SGLang has no speculative algorithm for method 'bogus'"),
])
def test_an_unknown_method_is_refused(engine, method, msg):
    with pytest.raises(PlanExportError, match=msg):
        export_plan(PLANS["falling"], engine, method=method)
    assert export_plan(PLANS["falling"], "vllm", method="qwen3_next_mtp").data["method"] == "qwen3_next_mtp"
    assert export_plan(PLANS["falling"], "tensorrt-llm", method="Eagle3").data["speculative_config"][
        "decoding_type"] == "Eagle3"


@pytest.mark.parametrize("sched,mdl,msg", [
    ({}, 3, "non-empty mapping"),
    ({0: 3}, 3, "threshold must be >= 1"),
    ({4: -1}, 3, "draft length must be >= 0"),
    ({4: 2, 8: 1}, 3, r"draft_len_schedule\[4\] must equal max_draft_len \(3\)"),
    ({4: 3, 8: 4}, 3, "exceeds max_draft_len 3"),
])
def test_trtllm_validator_rules(sched, mdl, msg):
    with pytest.raises(PlanExportError, match=msg):
        check_trtllm_schedule(sched, mdl)
    with pytest.raises(PlanExportError, match="must include batch_size=1"):
        check_trtllm_schedule({4: 3}, 3, lower_keys=True)


def test_trtllm_refuses_a_rising_plan_and_exports_envelopes():
    with pytest.raises(PlanExportError, match="smallest batch size to draft the most"):
        export_plan([(1, 1, C(1)), (2, 8, C(3))], "tensorrt-llm")
    env = SpecSetting.envelope(DynamicSetting("eagle", 4, 4, 16))
    cfg = yaml.safe_load(export_plan([(1, 8, env), (9, 64, N)], "tensorrt-llm").text)["speculative_config"]
    assert cfg == {"decoding_type": "Eagle3", "max_draft_len": 4, "speculative_model": "<your EAGLE-3 checkpoint>",
                   "use_dynamic_tree": True, "dynamic_tree_max_topK": 4, "max_total_draft_tokens": 15,
                   "max_concurrency": 8}
    assert cfg["max_draft_len"] <= cfg["max_total_draft_tokens"] <= cfg["dynamic_tree_max_topK"] * cfg["max_draft_len"]
    other = SpecSetting.envelope(DynamicSetting("eagle", 2, 2, 4))
    with pytest.raises(PlanExportError, match="one EAGLE-3 dynamic tree per server"):
        export_plan([(1, 8, env), (9, 64, other)], "tensorrt-llm")
    # speculation off in a middle range was exported as speculating there (max_concurrency only cuts the top)
    for ranges, gap in (([(1, 3, env), (4, 7, N), (8, 16, env)], "4-7 but does at 16"),
                        ([(1, 1, N), (2, 8, env)], "1-1 but does at 8")):
        with pytest.raises(PlanExportError, match=f"does not speculate at batch sizes {gap}"):
            export_plan(ranges, "tensorrt-llm")
    whole = yaml.safe_load(export_plan([(1, 64, env)], "tensorrt-llm").text)["speculative_config"]
    assert "max_concurrency" not in whole
    too_many = SpecSetting("envelope", 20, 4, 2)  # 21 draft tokens > topK * steps = 8
    with pytest.raises(PlanExportError, match=r"must lie in \[max_draft_len 4, dynamic_tree_max_topK"):
        export_plan([(1, 8, too_many)], "tensorrt-llm")


# ---------------------------------------------------------------------------------------------- SGLang
@pytest.mark.parametrize("name", ["falling", "all-speculate", "one"])
def test_sglang_tiers_route_every_batch_size_to_the_plan(name):
    ranges = PLANS[name]
    e = export_plan(ranges, "sglang", method="eagle3")
    tiers = check_sglang_tiers(json.loads(e.extra_files["adaptive.json"]))
    for b in range(1, 300):
        assert sglang_steps(tiers, b) == [_want(ranges, b)]
    flags = e.data["cli_flags"]
    steps = int(flags.split("--speculative-num-steps ")[1].split()[0])
    assert "--speculative-eagle-topk 1" in flags and any(steps in v for v in tiers.values())  # a candidate step
    assert f"--speculative-num-draft-tokens {steps + 1}" in flags


def test_sglang_releases_and_static_fallbacks():
    with pytest.raises(PlanExportError, match="a tier of 0, no speculation, arrived in 0.5.14"):
        export_plan(PLANS["falling"], "sglang", method="eagle3", release="0.5.13")
    assert "adaptive_config" in export_plan(PLANS["all-speculate"], "sglang", method="eagle3", release="0.5.13").data
    # a plan that never speculates has nothing for 0.5.13 to refuse: it runs without speculation (it was refused)
    plain = export_plan([(1, 64, N)], "sglang", method="eagle3", release="0.5.13")
    assert plain.nothing_to_set and plain.command == "python -m sglang.launch_server --model-path MODEL"
    old = export_plan(PLANS["falling"], "sglang", method="eagle3", release="0.5.12")
    assert "no per-batch-size tiers" in old.notes[0] and len(old.data["per_range"]) == 3
    standalone = export_plan(PLANS["falling"], "sglang", method="draft_model")
    assert standalone.data["per_range"][0]["cli_flags"].startswith("--speculative-algorithm STANDALONE")
    env = SpecSetting.envelope(DynamicSetting("eagle", 5, 4, 8))
    e = export_plan([(1, 8, env), (9, 64, N)], "sglang", method="eagle", model="yuhuili/EAGLE-LLaMA3-Instruct-8B")
    assert e.data["per_range"][0]["cli_flags"] == (
        "--speculative-algorithm EAGLE --speculative-draft-model-path yuhuili/EAGLE-LLaMA3-Instruct-8B "
        "--speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8 "
        "--max-running-requests 8") and e.warnings == ()
    # SGLang loads the drafter from --speculative-draft-model-path: without --model a placeholder, and a warning
    assert "--speculative-draft-model-path <your draft model> " in standalone.data["per_range"][0]["cli_flags"]
    assert standalone.warnings == ("the config names the drafter <your draft model>: pass --model with the checkpoint "
                                   "SGLang loads (a Hugging Face id or a path), or edit the file",)
    for engine in ("sglang", "vllm"):  # MTP runs the target's own layers: no checkpoint to name, no placeholder
        mtp = export_plan(PLANS["falling"], engine, method="mtp")
        assert "<your" not in mtp.text and mtp.warnings == (), (engine, mtp.text, mtp.warnings)
    ngram = export_plan(PLANS["falling"], "sglang", method="ngram", lookup=(2, 4))  # its match window: the sizes
    assert ngram.data["per_range"][0]["cli_flags"].startswith(
        "--speculative-algorithm NGRAM --speculative-ngram-min-match-window-size 2 "
        "--speculative-ngram-max-match-window-size 4 --speculative-num-steps") and ngram.warnings == ()
    for bad in ({"1": {"candidate_steps": []}}, {"1": {"candidate_steps": [-1]}}, {"x": {}}):
        with pytest.raises(PlanExportError):
            check_sglang_tiers(bad)
    with pytest.raises(PlanExportError, match="positive ints"):
        check_sglang_tiers({"1": {"candidate_steps": [0]}}, allow_zero=False)


def test_medusa_heads_export_for_vllm_only():
    """SGLang has no Medusa algorithm; TensorRT-LLM's Medusa ran in the TensorRT backend removed by #15918, and its
    draft_len_schedule is the PyTorch backend's: both refuse in one line naming vLLM; vLLM takes method medusa."""
    with pytest.raises(PlanExportError, match="SGLang has no speculative algorithm for method 'medusa'.*vLLM"):
        export_plan(PLANS["falling"], "sglang", method="medusa")
    with pytest.raises(PlanExportError, match="no draft_len_schedule for Medusa.*#15918.*vLLM"):
        export_plan(PLANS["falling"], "tensorrt-llm", method="medusa")
    v = export_plan(PLANS["falling"], "vllm", method="medusa")
    assert json.loads(v.text)["method"] == "medusa" and any("Model Runner V1 drops the schedule" in w for w in v.warnings)
    # SGLang's own algorithm names are accepted as methods too; MTP layers run as EAGLE
    assert export_plan(PLANS["falling"], "sglang", method="STANDALONE").data["per_range"][0]["cli_flags"].startswith(
        "--speculative-algorithm STANDALONE")
    for mtp in ("mtp", "NEXTN"):  # SGLang runs MTP layers as EAGLE (NEXTN is its alias)
        assert "--speculative-algorithm EAGLE " in export_plan(PLANS["falling"], "sglang", method=mtp).data["cli_flags"]


# ---------------------------------------------------------------------------------------------- llama.cpp
def test_llamacpp_one_line_per_range():
    e = export_plan(PLANS["falling"], "llama.cpp")
    assert [x["flags"] for x in e.data["per_range"]] == [
        "-np 3 --spec-type draft-simple --spec-draft-n-max 4 --spec-draft-n-min 0 --spec-draft-p-min 0",
        "-np 15 --spec-type draft-simple --spec-draft-n-max 2 --spec-draft-n-min 0 --spec-draft-p-min 0",
        "-np 64 --spec-type none"]
    # one n-gram size: the longest of the profiled lookup, as solve --format llama.cpp writes it (tune wrote the
    # shortest)
    ng = export_plan(PLANS["one"], "llama.cpp", method="ngram", lookup=(3, 5))
    # --spec-draft-n-max pinned: llama.cpp trims an n-gram draft to it (16 unless set)
    assert ng.data["per_range"][0]["flags"] == "-np 32 --spec-type ngram-simple --spec-ngram-simple-size-n 5 " \
                                               "--spec-ngram-simple-size-m 3 --spec-draft-n-max 3"
    long = export_plan(PLANS["one"], "llama.cpp", method="ngram", lookup=(1, 3))
    assert long.data["per_range"][0]["flags"].endswith("--spec-ngram-simple-size-m 3 --spec-draft-n-max 3")
    assert any("size-n 5, the longest of the profiled lookup 3-5" in n for n in ng.notes)
    assert "0c1e570" in e.releases and "-md" not in ng.text
    # the drafter named where one is loaded: --model, and no drafter on a line that does not speculate
    lines = e.text.splitlines()
    assert lines[2] == ("llama-server -m TARGET.gguf -md DRAFT.gguf -np 3 --spec-type draft-simple --spec-draft-n-max 4 "
                        "--spec-draft-n-min 0 --spec-draft-p-min 0")
    assert lines[-1] == "llama-server -m TARGET.gguf -np 64 --spec-type none"
    mine = export_plan(PLANS["falling"], "llama.cpp", model="/m/my draft.gguf")
    assert "-md '/m/my draft.gguf' -np 3" in mine.text and mine.command.startswith(
        "llama-server -m TARGET.gguf -md '/m/my draft.gguf'")
    assert mine.warnings == () and e.warnings == ()
    # a hub id, as vLLM's export takes it, is no file -md reads: said, and written as given
    hub = export_plan(PLANS["falling"], "llama.cpp", model="org/draft")
    assert "-md org/draft -np 3" in hub.text and len(hub.warnings) == 1
    assert hub.warnings[0].startswith("llama.cpp's -md takes a GGUF file, and --model org/draft names none")
    served = export_plan(PLANS["falling"], "llama.cpp", model="/m/d.gguf", target="/m/my target.gguf")  # tune's -t
    assert served.command.startswith("llama-server -m '/m/my target.gguf' -md /m/d.gguf")
    servers = served.text.splitlines()[2::2]
    assert len(servers) == 3 and all(x.startswith("llama-server -m '/m/my target.gguf' ") for x in servers)
    spaced = export_plan(PLANS["falling"], "llama.cpp", model="/m/my draft")  # the path as the command spells it
    assert spaced.warnings[0].startswith("llama.cpp's -md takes a GGUF file, and --model '/m/my draft' names none")
    assert export_plan(PLANS["one"], "llama.cpp", method="ngram", model="org/draft").warnings == ()  # no -md


@pytest.mark.parametrize("method, spec_type, sidecar", [("eagle3", "draft-eagle3", "-md EAGLE3_HEAD.gguf"),
                                                        ("mtp", "draft-mtp", "-md MTP_HEAD.gguf"),
                                                        ("draft_model", "draft-simple", "-md DRAFT.gguf")])
def test_llamacpp_names_the_spec_type_of_the_method(method, spec_type, sidecar):
    """--method eagle3 exported draft-simple flags with -md DRAFT.gguf: llama.cpp would have run the head as a
    plain draft model."""
    e = export_plan(PLANS["falling"], "llama.cpp", method=method)
    assert e.data["per_range"][0]["flags"] == (f"-np 3 --spec-type {spec_type} --spec-draft-n-max 4 "
                                               "--spec-draft-n-min 0 --spec-draft-p-min 0")
    assert f"llama-server -m TARGET.gguf {sidecar} -np 3 " in e.text and sidecar in e.command


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_llamacpp_refuses_methods_it_has_no_spec_type_for(method):
    with pytest.raises(PlanExportError, match=f"llama.cpp has no speculative type for method '{method}': "
                                              "draft_model \\(--spec-type draft-simple\\), eagle3"):
        export_plan(PLANS["falling"], "llama.cpp", method=method)


def test_unknown_engine_and_bad_ranges():
    with pytest.raises(PlanExportError, match="no engine export for 'mlc'"):
        export_plan(PLANS["one"], "mlc")
    with pytest.raises(PlanExportError, match="batch sizes 4..4 are in no range"):
        export_plan([(1, 3, C(2)), (5, 8, C(1))], "vllm")


# ---------------------------------------------------------------------------------------------- static trees
def test_static_tree_exports_name_the_releases_that_take_trees():
    tree = Tree.from_choices([[0], [1], [0, 0]])
    trt = exports.export(tree, "tensorrt-llm")
    assert any("1.4.0rc1" in w and "eagle_choices" in w for w in trt.warnings)
    assert any("#15918" in w for w in trt.warnings)
    assert any("0.21.0 and later reject" in w for w in exports.export(tree, "vllm").warnings)


def test_llamacpp_release_is_the_checked_commit_or_refused():
    plan = PLANS["falling"]
    assert export_plan(plan, "llama.cpp", release="0c1e570").text == export_plan(plan, "llama.cpp").text
    assert "#22964" in export_plan(plan, "llama.cpp").releases
    for old in ("b4200", "b9530", "v0.3.1"):
        with pytest.raises(PlanExportError, match=f"llama.cpp {old} is not the build these flags were checked at"):
            export_plan(plan, "llama.cpp", release=old)


@pytest.mark.parametrize("engine,release", [("tensorrt-llm", "1.3.0rc8"), ("llama.cpp", "0c1e570")])
def test_exports_with_comments_name_their_releases_in_the_file(engine, release):
    e = export_plan(PLANS["falling"], engine)
    first = e.text.splitlines()[0]
    assert first == f"# for {e.releases}" and release in first
    if engine == "tensorrt-llm":
        assert yaml.safe_load(e.text) == e.data  # still the YAML the engine reads


@pytest.mark.parametrize("method,vllm,sglang,trtllm", [
    ("deepseek_mtp", "deepseek_mtp", "EAGLE", "MTP"),
    ("EAGLE3", "eagle3", "EAGLE3", "Eagle3"),
    ("NGram", "ngram", "NGRAM", "NGram"),
    ("STANDALONE", "draft_model", "STANDALONE", "Draft_Target"),
])
def test_one_method_name_reads_the_same_for_every_engine(method, vllm, sglang, trtllm):
    """A model's MTP name or an engine's own spelling worked for one export and was refused by the next (SGLang and
    TensorRT-LLM refused deepseek_mtp; vLLM and TensorRT-LLM refused EAGLE3): each engine now writes its own name."""
    ranges = [(1, 8, C(3)), (9, 64, N)]
    assert export_plan(ranges, "vllm", method=method, model="m").data["method"] == vllm
    assert f"--speculative-algorithm {sglang}" in export_plan(ranges, "sglang", method=method, model="m").text
    trt = export_plan(ranges, "tensorrt-llm", method=method, model="m")
    assert trt.data["speculative_config"]["decoding_type"] == trtllm and not trt.warnings


def test_trtllm_says_an_eagle_head_is_written_as_eagle3():
    e = export_plan([(1, 8, C(3)), (9, 64, N)], "tensorrt-llm", method="eagle", model="m")
    assert e.data["speculative_config"]["decoding_type"] == "Eagle3"
    assert e.warnings == ("method eagle is written as decoding_type Eagle3, the EAGLE head TensorRT-LLM's PyTorch "
                          "backend runs: an EAGLE-1/2 checkpoint does not load as one (export for vLLM or SGLang, "
                          "which run EAGLE-1/2 heads)",)


def test_trtllm_releases_an_envelope_names_and_the_ones_past_those_checked():
    """An envelope export named 'TensorRT-LLM 1.2.0 and later, before 1.3.0rc8 (keys start their ranges ...)' for a
    file with no draft_len_schedule keys, and took --release 1.2.0, before any dynamic tree was checked. It names the
    dynamic tree's release lines and refuses an earlier one; a release past the last line checked is exported with
    a warning, as the vLLM and SGLang exports do."""
    env = SpecSetting.envelope(DynamicSetting("eagle", 4, 4, 16))
    e = export_plan([(1, 8, env), (9, 64, N)], "tensorrt-llm", model="m")
    assert e.releases == "TensorRT-LLM 1.3 and 1.4 (the EAGLE-3 dynamic tree, as their API references give it)"
    assert e.text.splitlines()[0].startswith("# for TensorRT-LLM 1.3 and 1.4 (the EAGLE-3 dynamic tree")
    for release in ("1.2.0", "1.2.1"):
        with pytest.raises(PlanExportError, match=re.escape(f"TensorRT-LLM {release} is not known to take an EAGLE-3 "
                                                            "dynamic tree (use_dynamic_tree: checked in the 1.3 and "
                                                            "1.4 API references)")):
            export_plan([(1, 8, env), (9, 64, N)], "tensorrt-llm", model="m", release=release)
    assert not export_plan([(1, 8, env), (9, 64, N)], "tensorrt-llm", model="m", release="1.3.0rc2").warnings
    for ranges in ([(1, 8, env), (9, 64, N)], PLANS["falling"]):
        assert export_plan(ranges, "tensorrt-llm", model="m", release="1.5.0").warnings == (
            "TensorRT-LLM 1.5.0 is newer than the last release line checked (1.4): check its speculative_config "
            "fields",)
        assert not export_plan(ranges, "tensorrt-llm", model="m", release="1.4.2").warnings


def test_sglang_adaptive_export_names_the_releases_that_take_its_tiers():
    """A plan that stops speculating writes a tier of 0 steps, which 0.5.13 refuses; the export named 'SGLang 0.5.13
    to 0.5.23' for it all the same."""
    stops = export_plan(PLANS["falling"], "sglang", method="eagle3", model="m")
    assert stops.data["adaptive_config"]["16"] == {"candidate_steps": [0]}
    assert stops.releases == "SGLang 0.5.14 to 0.5.23 (tiers, one of 0 steps: no speculation there)"
    with pytest.raises(PlanExportError, match="SGLang 0.5.13 takes positive candidate steps only"):
        export_plan(PLANS["falling"], "sglang", method="eagle3", model="m", release="0.5.13")
    keeps = export_plan([(1, 3, C(4)), (4, 64, C(2))], "sglang", method="eagle3", model="m")
    assert keeps.releases == "SGLang 0.5.13 to 0.5.23 (tiers; a tier of 0 steps from 0.5.14)"
    assert export_plan([(1, 3, C(4)), (4, 64, C(2))], "sglang", method="eagle3", model="m", release="0.5.13").data == \
        keeps.data


def test_an_old_vllm_release_is_told_the_single_draft_length_that_loses_least_not_the_longest():
    """Before per-batch-size draft lengths vLLM runs one K: the advice was the plan's longest K, which at the batch
    sizes where the plan stops speculating ran far below plain decoding (a tryout: 22418 against 47180 tok/s at
    batch 1024). It is now the K whose worst batch size runs closest to its own best, from the plan's candidates."""
    import numpy as np

    from sequoia_opt.plan_exports import best_single_draft_length
    from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve
    from sequoia_opt.profiles.batch import BatchLatencyProfile
    from sequoia_opt.solver.schedule import ChainValue, solve_plan

    def curve(per_token_ms, base_ms):  # flat at batch 1 (memory-bound), steep at 64 (compute-bound)
        return LatencyCurve.synthetic({n: base_ms + per_token_ms * (n - 1) for n in range(1, 10)}, {1: 1.0, 2: 1.2},
                                      step_overhead_ms=0.5)

    acc = AcceptanceProfile(id="acc", acceptance=np.array([0.7, 0.1, 0.05]), counts=np.array([700, 100, 50, 150]))
    plan = solve_plan(ChainValue(acc, 6), BatchLatencyProfile(id="p", curves={1: curve(0.1, 10.0), 8: curve(0.6, 11.0),
                                                                             64: curve(15.0, 14.0)}))
    rate = [{c.setting.draft_tokens: c.tokens_per_s_per_request for c in r.candidates} for r in plan.rows]
    worst = {k: min(x[k] / max(x.values()) for x in rate) for k in range(7)}
    k = max(worst, key=worst.get)
    assert max(r.best.setting.draft_tokens for r in plan.rows) > k  # not the longest
    assert best_single_draft_length(plan) == (k, pytest.approx(worst[k]))
    with pytest.raises(PlanExportError, match=rf"upgrade, or run one K for every batch size: {k} \(of the plan's "
                                              rf"candidates the one whose worst batch size runs closest to its best: "
                                              rf"{100 * worst[k]:.0f} % of it\)"):
        export_plan(plan, "vllm", release="0.23.0")
    assert best_single_draft_length(PLANS["falling"]) is None  # ranges alone: nothing scored
    # where one K for all would lose most at some batch size, K = 0 is said as what it is
    dear = solve_plan(ChainValue(acc, 6), BatchLatencyProfile(id="p", curves={1: curve(0.1, 10.0),
                                                                             64: curve(60.0, 14.0)}))
    k, worst = best_single_draft_length(dear)
    assert k == 0
    with pytest.raises(PlanExportError, match=rf"upgrade, or run without speculation \(of one K for every batch size, "
                                              rf"K = 0 runs closest to each batch size's best: {100 * worst:.0f} % "):
        export_plan(dear, "vllm", release="0.23.0")


def test_sglang_ngram_lines_pin_the_bfs_breadth_to_the_chain():
    """SGLang's NGRAM copies --speculative-ngram-max-bfs-breadth (default 10) over --speculative-eagle-topk in its
    ServerArgs post-init, so a chain of K needs that breadth at 1 too, or it runs as a BFS tree of K + 1 tokens."""
    ngram = export_plan(PLANS["falling"], "sglang", method="ngram")
    flags = [r["cli_flags"] for r in ngram.data["per_range"]]
    (lo0, hi0), (lo1, hi1) = (r["batch_range"] for r in ngram.data["per_range"][:2])
    assert flags[0] == ("--speculative-algorithm NGRAM --speculative-num-steps 4 --speculative-ngram-max-bfs-breadth 1 "
                        f"--speculative-eagle-topk 1 --speculative-num-draft-tokens 5 --max-running-requests {hi0}")
    assert flags[1].endswith("--speculative-ngram-max-bfs-breadth 1 --speculative-eagle-topk 1 "
                             f"--speculative-num-draft-tokens 3 --max-running-requests {hi1}")
    # and each line caps its own requests: NGRAM's ServerArgs caps an unset --max-running-requests at 48, which a
    # range past 48 would silently run under
    assert hi0 < hi1
    # the other algorithms have no such flag
    sa = export_plan(PLANS["falling"], "sglang", method="draft_model", model="m")
    assert "bfs" not in sa.text


def test_sglang_leaves_its_own_cap_to_a_plan_that_ends_below_it_unless_max_batch_says_where():
    """A plan ending at 16 (a T(b, n) table up to 16) capped the server at 16 requests, below SGLang's own 48 for
    speculating servers: 3x less admission, unsaid. Unset there, with a warning that 17-48 run the last setting
    unpredicted; --max-batch names the cap; a range below the last still caps its line at its end."""
    plan = [(1, 4, SpecSetting.chain(3)), (5, 16, SpecSetting.chain(1))]
    e = export_plan(plan, "sglang", method="eagle3", model="m")
    assert "--max-running-requests" not in e.data["cli_flags"]
    assert any(w.startswith("the plan ends at batch 16; SGLang admits up to 48 requests when speculating")
               for w in e.warnings)
    # SGLang pads a batch to its next CUDA-graph size before it picks a tier: the note names the ends to capture
    assert any(n.endswith("capture every range's last batch size (4) among --cuda-graph-bs") for n in e.notes)
    given = export_plan(plan, "sglang", method="eagle3", model="m", max_batch=16)
    assert " --max-running-requests 16 --speculative-adaptive" in given.data["cli_flags"]
    assert not any("SGLang admits" in w for w in given.warnings)
    static = export_plan(plan, "sglang", method="draft_model", model="m")
    flags = [r["cli_flags"] for r in static.data["per_range"]]
    assert flags[0].endswith("--max-running-requests 4") and "--max-running-requests" not in flags[1]
    assert any("SGLang admits up to 48" in w for w in static.warnings)


def test_vllm_warns_where_it_keeps_a_speculating_k_past_the_plan():
    """vLLM keeps the last range's K at every larger batch; a plan still speculating at its largest measured batch
    size said so in a note only (a batch-1 table gave K = 5 at every batch size vLLM runs). Without --max-batch it is
    a warning; with it (the engine's largest batch) a note, as for a plan that ends on plain decoding."""
    plan = PLANS["all-speculate"]
    hi, k = plan[-1][1], plan[-1][2].draft_tokens
    assert (hi, k) == (128, 1)
    e = export_plan(plan, "vllm", method="eagle3", model="m")
    assert any(w.startswith(f"past batch {hi} vLLM keeps K = {k} (the last range's), which nothing measured there "
                            "predicts") for w in e.warnings), e.warnings
    assert not export_plan(PLANS["falling"], "vllm", method="eagle3", model="m").warnings  # ends on plain decoding
    given = export_plan(plan, "vllm", method="eagle3", model="m", max_batch=hi)
    assert f"past batch {hi} vLLM keeps K = {k} (the last range's)" in given.notes
    assert not any("vLLM keeps K" in w for w in given.warnings)


def test_start_commands_quote_a_draft_path_for_the_shell():
    """A draft model path with a space or a quote was pasted into vLLM's and SGLang's start commands as is: the shell
    split the path (SGLang) or ended vLLM's single-quoted JSON at the quote. Split back as the shell does, each
    command hands the engine the path and the JSON unchanged."""
    path = "/models/o'brien draft"
    v = export_plan(PLANS["all-speculate"], "vllm", method="draft_model", model=path)
    words = shlex.split(v.command)
    assert words[:4] == ["vllm", "serve", "MODEL", "--speculative-config"] and len(words) == 5
    assert json.loads(words[4]) == v.data and v.data["model"] == path
    s = export_plan(PLANS["all-speculate"], "sglang", method="eagle3", model=path)
    words = shlex.split(s.command)
    assert words[words.index("--speculative-draft-model-path") + 1] == path
    assert words[words.index("--speculative-algorithm") + 1] == "EAGLE3"


def test_sglang_adaptive_line_caps_its_requests_at_the_plans_last_batch_size():
    """SGLang's EAGLE / EAGLE3 ServerArgs caps an unset --max-running-requests at 48: the adaptive line of a plan up
    to batch 128 ran at most 48 requests, so its tiers past 48 were never reached (the static lines name their cap)."""
    e = export_plan(PLANS["all-speculate"], "sglang", method="eagle3", model="m")
    assert e.data["adaptive_config"]["9"] == {"candidate_steps": [1]}  # the tier of batch sizes 9-128
    assert e.data["cli_flags"] == ("--speculative-algorithm EAGLE3 --speculative-draft-model-path m "
                                   "--speculative-eagle-topk 1 --speculative-num-steps 5 "
                                   "--speculative-num-draft-tokens 6 --max-running-requests 128 --speculative-adaptive "
                                   "--speculative-adaptive-config adaptive.json")
    assert e.command.endswith(e.data["cli_flags"])
