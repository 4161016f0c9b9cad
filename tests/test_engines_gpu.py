"""The GPU engines' profilers without the engines (issue 27, fix 9): every engine's named profiler exists, and
the random prompts are drawn below the model's own vocabulary (its tokenizer's), not below 32000."""

from __future__ import annotations

import json
import sys
import types

import pytest

from sequoia_opt.engines import ENGINES, EngineError, engine_profiler
from sequoia_opt.engines import gpu
from sequoia_opt.jobs.load import bundled_draft_path


def test_every_named_profiler_is_a_function_that_exists():
    named = {name: eng.profiler for name, eng in ENGINES.items() if eng.profiler is not None}
    assert set(named) == {"llama.cpp", "sglang", "vllm"}
    for name in named:
        assert callable(engine_profiler(name)), name
    assert engine_profiler("vllm") is gpu.profile_gpu and engine_profiler("treeopt") is None
    with pytest.raises(EngineError, match="unknown --engine"):
        engine_profiler("tgi")


def test_vocab_size_from_the_tokenizer(tmp_path):
    assert gpu.tokenizer_vocab_size("x", types.SimpleNamespace(vocab_size=128256)) == 128256
    assert gpu.tokenizer_vocab_size("x", [0] * 300) == 300  # no vocab_size: its length
    assert gpu.tokenizer_vocab_size(str(bundled_draft_path())) == 49152  # tokenizer.json of the bundled draft
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 151936}))
    assert gpu.tokenizer_vocab_size(str(tmp_path)) == 151936
    with pytest.raises(EngineError, match="vocabulary size"):
        gpu.tokenizer_vocab_size(str(tmp_path / "missing"))


def _run_calls(calls_at):
    call = calls_at(32)
    call(8)()


def test_vllm_and_sglang_prompts_stay_inside_a_small_vocabulary(monkeypatch):
    vocab = 500  # far below the 32000 the profilers used to assume
    sent = []

    class LLM:
        def __init__(self, **kw):
            pass

        def get_tokenizer(self):
            return types.SimpleNamespace(vocab_size=vocab)

        def generate(self, prompts, params, use_tqdm=False):
            for p in prompts:
                sent.append(p["prompt_token_ids"] if isinstance(p, dict) else p.prompt_token_ids)

    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.20.2"
    vllm.LLM = LLM
    vllm.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", None)  # an old release: prompts as dicts
    calls_at, info = gpu.vllm_calls("/models/small")
    _run_calls(calls_at)

    class Engine:
        def __init__(self, **kw):
            self.tokenizer_manager = types.SimpleNamespace(tokenizer=types.SimpleNamespace(vocab_size=vocab))

        def generate(self, input_ids, sampling_params, **kw):
            sent.append(input_ids)

    sgl = types.ModuleType("sglang")
    sgl.Engine = Engine
    monkeypatch.setitem(sys.modules, "sglang", sgl)
    calls_at, info = gpu.sglang_calls("/models/small")
    _run_calls(calls_at)
    assert len(sent) == 4 and all(len(ids) >= 9 for ids in sent)
    assert max(max(ids) for ids in sent) < vocab and min(min(ids) for ids in sent) >= 100


def _fake_vllm(monkeypatch, made):
    class LLM:
        def __init__(self, **kw):
            made.append(kw)

        def get_tokenizer(self):
            return types.SimpleNamespace(vocab_size=500)

        def generate(self, prompts, params, use_tqdm=False):
            pass

    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.33.0"
    vllm.LLM = LLM
    vllm.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", None)


def test_vllm_max_model_len_fits_the_sweep_and_the_model(monkeypatch, tmp_path):
    """vLLM refuses a max_model_len past the model's max_position_embeddings at load: a fixed 4096 failed every
    2048-token model (llama-68m, TinyLlama); a sweep past the model's context is refused before anything loads."""
    made = []
    _fake_vllm(monkeypatch, made)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 500, "max_position_embeddings": 2048}))
    curve = gpu.profile_gpu("vllm", str(tmp_path), contexts=[256], token_counts=[1, 2, 4], rounds=1, max_repeats=1,
                            device_name="test GPU")
    assert made[0]["max_model_len"] == 256 + 4 + 1 and curve.engine == "vllm"
    made.clear()
    with pytest.raises(EngineError, match="exceeds .* context of 2048 tokens"):
        gpu.profile_gpu("vllm", str(tmp_path), contexts=[2048], token_counts=[1, 2], rounds=1, max_repeats=1,
                        device_name="test GPU")
    assert made == []  # refused before the engine loaded the model
    # a scaled rope (YaRN x4 on a 2048-position config): the engine derives a longer context, so it judges the sweep
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 500, "max_position_embeddings": 2048,
                                                      "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}))
    gpu.profile_gpu("vllm", str(tmp_path), contexts=[2048], token_counts=[1, 2], rounds=1, max_repeats=1,
                    device_name="test GPU")
    assert made[0]["max_model_len"] == 2048 + 2 + 1


def test_gpu_engine_cli_passes_rounds_and_pairing_and_refuses_a_draft(monkeypatch, tmp_path):
    """--rounds and --unpaired were dropped on the way to the GPU profiler (it always ran 3 paired rounds), and
    --draft was ignored (the profile recorded no drafter's cost without a word)."""
    import torch
    from typer.testing import CliRunner

    from sequoia_opt.cli import app

    _fake_vllm(monkeypatch, [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    seen = {}

    def fake_profile(name, model, **kw):
        seen.update(kw)
        raise EngineError("stop here")

    monkeypatch.setattr(gpu, "profile_gpu", fake_profile)
    res = CliRunner().invoke(app, ["profile", "latency", "--engine", "vllm", "--target", str(tmp_path), "--rounds",
                                   "1", "--unpaired", "-o", str(tmp_path / "out.yaml")])
    assert res.exit_code == 2 and seen["rounds"] == 1 and seen["paired"] is False
    seen.clear()
    res = CliRunner().invoke(app, ["profile", "latency", "--engine", "vllm", "--target", str(tmp_path), "--draft",
                                   str(tmp_path), "-o", str(tmp_path / "out.yaml")])
    assert res.exit_code == 2 and "drop --draft" in res.output and seen == {}
    assert not (tmp_path / "out.yaml").exists()
    # treeopt's own drafter, thread and loop options change nothing in an engine's profile: refused, named
    for extra, named in ((["--max-draft-tokens", "8"], "drop --max-draft-tokens"),
                         (["--threads", "2"], "drop --threads"), (["--no-loop"], "drop --no-loop"),
                         (["--threads", "2", "--no-loop"], "drop --threads, --no-loop")):
        res = CliRunner().invoke(app, ["profile", "latency", "--engine", "sglang", "--target", str(tmp_path), *extra,
                                       "-o", str(tmp_path / "out.yaml")])
        assert res.exit_code == 2 and named in res.output and seen == {}, (extra, res.output)
        assert not (tmp_path / "out.yaml").exists()
