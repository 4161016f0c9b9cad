"""Device-tuned linears (sequoia_opt.model.tuned_linear): every kernel against F.linear at odd sizes, the int4
kernel on a GGUF's own Q4_0 / Q4_1 blocks, the choice rule, the on-disk plan, and tree decoding with tuned
linears equal to plain decoding with the same tuned linears."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(Path(__file__).parent))
import test_loaders_gguf as tlg  # noqa: E402

from sequoia_opt.drafting import SpeculativeDecoder  # noqa: E402
from sequoia_opt.decoding import autoregressive_generate  # noqa: E402
from sequoia_opt.errors import TreeoptError  # noqa: E402
from sequoia_opt.model import ModelConfig, Transformer  # noqa: E402
from sequoia_opt.model.gguf_loader import gguf_int4_blocks, load_gguf  # noqa: E402
from sequoia_opt.model.loaders import tune_loaded_model  # noqa: E402
from sequoia_opt.model.tuned_linear import (KERNELS, ROW_BUCKETS, Int4Blocks, LinearDispatch, bucket_of,  # noqa: E402
                                            candidates, choose, linear_record, time_kernels, tune_linears,
                                            tuning_of, untune)
from sequoia_opt.tree import Tree  # noqa: E402

ROWS = [1, 3, 7, 65, 130]  # inside, between and past the buckets


def _blocks(out_f: int, in_f: int, seed: int) -> Int4Blocks:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out_f, in_f), dtype=torch.uint8, generator=g)
    scale = torch.rand(out_f, in_f // 32, generator=g) * 0.05 + 0.01
    zero = torch.randn(out_f, in_f // 32, generator=g) * 0.1
    return Int4Blocks(q, scale, zero)


@pytest.mark.parametrize("name", [k for k, v in KERNELS.items() if v.available() and k != "int8"])
@pytest.mark.parametrize("out_f,in_f", [(37, 96), (53, 64), (130, 160)])
@pytest.mark.parametrize("bias", [False, True])
def test_every_kernel_equals_f_linear_at_odd_sizes(name, out_f, in_f, bias):
    if not KERNELS[name].fits(out_f, in_f):  # torch's int4 packing: out % 16, in % 32
        assert name == "int4" and name not in candidates("int4", True, (out_f, in_f))
        out_f = 16 * (out_f // 16 + 1)
    blocks = _blocks(out_f, in_f, out_f)
    w = blocks.dequantize()  # the int4 kernel's weight; the float kernels get the same values
    b = torch.randn(out_f) if bias else None
    d = LinearDispatch((name,) * len(ROW_BUCKETS), {name: KERNELS[name].prepare(w, blocks)}, out_f)
    for rows in ROWS:
        x = torch.randn(1, rows, in_f)  # (B, T, in), as the decoder calls it
        y = d(x, b)
        assert y.shape == (1, rows, out_f) and y.is_contiguous()
        torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-4, atol=1e-4)


def test_int8_kernel_is_per_channel_rounding_of_the_weight():
    torch.manual_seed(0)
    w = torch.randn(45, 96)
    state = KERNELS["int8"].prepare(w, None)
    q, scale = state
    assert q.dtype == torch.int8 and scale.shape == (45,)
    w8 = q.float() * scale[:, None]  # the weight the kernel multiplies by
    assert (w8 - w).abs().max() <= scale.max() / 2 + 1e-6  # round to nearest: half a step at most
    for rows in ROWS:
        x = torch.randn(rows, 96)
        torch.testing.assert_close(KERNELS["int8"].run(x, state), x @ w8.t(), rtol=1e-4, atol=1e-4)


def test_bucket_of_and_candidates():
    assert [bucket_of(r) for r in (1, 2, 3, 4, 5, 64, 65, 128, 4096)] == [0, 1, 2, 2, 3, 6, 7, 7, 7]
    assert candidates("float32", True)[0] == "linear" and "int4" not in candidates("float32", True)
    assert "int4" in candidates("int4", True) and "int4" not in candidates("int4", False)
    assert candidates("int8", False) == ("int8",)  # never mixed with float kernels: plain and tree run one weight
    with pytest.raises(TreeoptError, match="int4, int8"):
        candidates("fp8", False)


def test_choose_keeps_linear_unless_a_kernel_is_clearly_faster():
    t = {b: {"linear": 1.0, "w_xt": 0.99, "onednn": 2.0} for b in ROW_BUCKETS}
    t[4] = {"linear": 1.0, "w_xt": 0.5, "onednn": 0.6}
    t[128] = {"linear": 1.0, "w_xt": 1.2, "onednn": 0.9}
    picks = choose(t)
    assert picks == ("linear", "linear", "w_xt", "linear", "linear", "linear", "linear", "onednn")
    assert choose({b: {"int8": 3.0} for b in ROW_BUCKETS}) == ("int8",) * len(ROW_BUCKETS)


def test_time_kernels_reports_every_kernel_at_every_row_count():
    out = time_kernels(24, 32, ["linear", "x_wt"], rows=(1, 5), repeats=2)
    assert set(out) == {1, 5}
    assert all(set(v) == {"linear", "x_wt"} and all(ms > 0 for ms in v.values()) for v in out.values())


def _tiny(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.preset("tiny"), dtype=torch.float32).eval()


def test_tune_linears_plans_every_shape_caches_it_and_keeps_the_output(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEOPT_CACHE_DIR", str(tmp_path))
    model = _tiny()
    tokens = torch.randint(0, 256, (1, 9))
    with torch.inference_mode():
        ref = model(tokens)
    lines: list[str] = []
    rep = tune_linears(model, log=lines.append, repeats=2)
    shapes = {f"{m.out_features}x{m.in_features}" for m in model.modules() if hasattr(m, "dispatch")}
    assert set(rep.choices) == shapes == set(rep.tuned_shapes)
    assert all(list(v) == [str(b) for b in ROW_BUCKETS] for v in rep.choices.values())
    assert len(lines) == 1 and str(tmp_path) in lines[0]
    cached = json.loads(Path(rep.cache).read_text())
    assert cached["key"]["precision"] == "float32" and set(cached["choices"]) == shapes
    assert tuning_of(model) == rep.choices
    assert linear_record(model)["precision"] == "float32"
    with torch.inference_mode():
        torch.testing.assert_close(model(tokens), ref, rtol=1e-4, atol=1e-4)
    # a second model of the same shapes reads the plan: nothing is timed again
    again = tune_linears(_tiny(1), log=lines.append)
    assert again.tuned_shapes == [] and again.choices == rep.choices and len(lines) == 1
    untune(model)
    assert tuning_of(model) is None and linear_record(model) is None


def test_a_forward_with_gradients_runs_f_linear(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEOPT_CACHE_DIR", str(tmp_path))
    model = _tiny()
    tune_linears(model, repeats=1)
    for lin in (m for m in model.modules() if getattr(m, "dispatch", None) is not None):
        lin.dispatch = LinearDispatch(("int8",) * len(ROW_BUCKETS), {"int8": KERNELS["int8"].prepare(
            lin.weight.detach(), None)}, lin.out_features)  # a kernel whose output differs from F.linear's
    x = torch.randint(0, 256, (1, 5))
    out = model(x)  # gradients enabled: F.linear, differentiable
    out.sum().backward()
    assert model.layers[0].mlp.up_proj.weight.grad is not None
    model.zero_grad()
    with torch.no_grad():
        tuned = model(x)
    assert (tuned - out.detach()).abs().max() > 0  # the int8 kernel ran here, not F.linear


def test_not_a_cpu_float32_model_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEOPT_CACHE_DIR", str(tmp_path))
    model = Transformer(ModelConfig.preset("tiny"), dtype=torch.bfloat16)
    assert tune_linears(model) is None and tuning_of(model) is None
    assert not list(tmp_path.iterdir())


def _q4_types(name: str):
    """Q4_1 for the MLP of layer 0 and attention, Q4_0 for the MLP of layer 1, Q8_0 embeddings, F32 norms."""
    if name.endswith("norm.weight"):
        return Q.F32
    if "embed" in name or "lm_head" in name:
        return Q.Q8_0
    return Q.Q4_0 if "layers.1.mlp" in name else Q.Q4_1


def test_gguf_int4_blocks_are_the_loaded_weights_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(tlg, "qtype_for", _q4_types)
    torch.manual_seed(3)
    src = tlg.randomize(Transformer(tlg.tiny_config()), 3)
    tlg.write_gguf(tmp_path / "q4.gguf", src)
    model, _ = load_gguf(tmp_path / "q4.gguf")
    blocks = gguf_int4_blocks(tmp_path / "q4.gguf")
    params = dict(model.named_parameters())
    linears = {n for n in params if n.endswith("proj.weight")}
    assert set(blocks) == linears  # every Q4 linear; the Q8_0 embedding and F32 norms are left out
    for name, b in blocks.items():  # un-permuted like the loader's Q/K rows, equal to the last bit
        assert torch.equal(b.dequantize(), params[name].detach()), name
        assert int(b.q.max()) <= 15


def test_int4_weights_tune_with_the_blocks_and_decode_like_plain(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tlg, "qtype_for", _q4_types)
    src = tlg.randomize(Transformer(tlg.tiny_config()), 4)
    path = tmp_path / "q4.gguf"
    tlg.write_gguf(path, src)
    model, _ = load_gguf(path)
    prompt = [5, 9, 17, 3]
    rep = tune_loaded_model(model, path, weights="int4")
    assert rep.precision == "int4" and linear_record(model)["precision"] == "int4"
    assert set(linear_record(model)["kernels"]) == set(rep.choices)  # ":int4" shapes, whichever kernel won
    assert {s for s in rep.choices if s.endswith(":int4")} == {f"{m.out_features}x{m.in_features}:int4"
                                                             for n, m in model.named_modules()
                                                             if n.endswith("proj")}
    # force the int4 kernel everywhere it may run, then greedy tree decoding must equal plain decoding
    blocks = gguf_int4_blocks(path)
    for name, lin in model.named_modules():
        if f"{name}.weight" in blocks:
            lin.dispatch = LinearDispatch(("int4",) * len(ROW_BUCKETS), {"int4": KERNELS["int4"].prepare(
                lin.weight.detach(), blocks[f"{name}.weight"])}, lin.out_features)
    plain = autoregressive_generate(model, prompt, 16).tokens
    tree = Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    got = SpeculativeDecoder(model, model, tree).generate(prompt, 16).tokens
    assert got == plain


def test_int4_without_blocks_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEOPT_CACHE_DIR", str(tmp_path))
    lines: list[str] = []
    rep = tune_loaded_model(_tiny(), None, weights="int4", log=lines.append)
    assert any("no Q4_0/Q4_1" in s for s in lines)
    assert not any(s.endswith(":int4") for s in rep.choices)
    with pytest.raises(TreeoptError, match="weight precision"):
        tune_loaded_model(_tiny(), None, weights="q4")


@pytest.mark.parametrize("weights", ["float32", "int8"])
def test_tuned_tree_decoding_equals_tuned_plain_decoding(tmp_path, monkeypatch, weights):
    monkeypatch.setenv("TREEOPT_CACHE_DIR", str(tmp_path))
    target = _tiny(0)
    draft = _tiny(0)
    with torch.no_grad():  # a draft that agrees partly
        for p in draft.parameters():
            p.add_(0.2 * p.std() * torch.randn_like(p))
    tune_loaded_model(target, None, weights=weights)
    tune_loaded_model(draft, None)
    tree = Tree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]])
    for prompt in ([1], [5, 17, 3, 200, 9], list(range(40, 61))):
        plain = autoregressive_generate(target, prompt, 24).tokens
        assert SpeculativeDecoder(target, draft, tree).generate(prompt, 24).tokens == plain


def test_cli_refuses_an_unknown_weight_precision():
    from typer.testing import CliRunner

    from sequoia_opt.cli import app

    res = CliRunner().invoke(app, ["run", "--weights", "fp8", "--tree", "nonexistent.yaml"])
    assert res.exit_code == 2
    assert "weight precision 'fp8'" in res.output and len(res.output.strip().splitlines()) == 1


def test_cli_profile_linear_shows_the_plan_and_retunes(tmp_path, monkeypatch):
    from typer.testing import CliRunner
    from tiny_pair import make_pair

    from sequoia_opt.cli import app

    monkeypatch.setenv("TREEOPT_CACHE_DIR", str(tmp_path / "cache"))
    tdir, _, _ = make_pair(tmp_path)
    runner = CliRunner()
    first = runner.invoke(app, ["profile", "linear", "--target", str(tdir), "--json"])
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    shapes = set(doc["choices"])
    assert shapes and set(doc["tuned_shapes"]) == shapes and set(doc["timings_ms"]) == shapes
    for shape, per_bucket in doc["timings_ms"].items():  # the kept kernel is the fastest or within MIN_GAIN
        for b, times in per_bucket.items():
            kept = doc["choices"][shape][b]
            assert times[kept] == min(times.values()) or kept == "linear"
    again = runner.invoke(app, ["profile", "linear", "--target", str(tdir), "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["tuned_shapes"] == []  # read from the plan
    assert json.loads(again.stdout)["choices"] == doc["choices"]
    retuned = runner.invoke(app, ["profile", "linear", "--target", str(tdir), "--retune", "--json"])
    assert retuned.exit_code == 0 and set(json.loads(retuned.stdout)["tuned_shapes"]) == shapes
    bad = runner.invoke(app, ["profile", "linear", "--target", str(tdir), "--weights", "int2"])
    assert bad.exit_code == 2 and "weight precision 'int2'" in bad.output


def test_two_tunings_at_once_keep_both_plans_and_a_retune_keeps_other_shapes(tmp_path, monkeypatch):
    """Two processes tuning at once (two models' loads) each wrote back the plan they read before timing: the
    last write dropped the other's shapes. Deterministic interleaving: model B is tuned and saved while model A
    is being timed; A's save must merge, not replace. A retune of A (use_cache=False) keeps B's shapes too."""
    import dataclasses

    import sequoia_opt.model.tuned_linear as tl

    monkeypatch.setenv("TREEOPT_CACHE_DIR", str(tmp_path))
    a = Transformer(ModelConfig.preset("tiny"), dtype=torch.float32).eval()
    cfg = ModelConfig.preset("tiny")
    b = Transformer(dataclasses.replace(cfg, dim=cfg.dim * 2, intermediate_size=cfg.intermediate_size * 3,
                                        vocab_size=cfg.vocab_size * 2), dtype=torch.float32).eval()
    shapes = {m: {f"{x.out_features}x{x.in_features}" for x in m.modules() if hasattr(x, "dispatch")}
              for m in (a, b)}
    assert shapes[b] - shapes[a]  # shapes only B has: the ones a lost write drops
    real = tl.time_kernels
    during: list[bool] = []

    def timing(out_f, in_f, names, **kw):
        if not during:  # A's first shape: B is tuned and saved meanwhile
            during.append(True)
            tune_linears(b, repeats=1)
        return real(out_f, in_f, names, **kw)

    monkeypatch.setattr(tl, "time_kernels", timing)
    rep = tune_linears(a, repeats=1)
    on_disk = set(json.loads(Path(rep.cache).read_text())["choices"])
    assert shapes[a] | shapes[b] <= on_disk and during
    monkeypatch.setattr(tl, "time_kernels", real)
    assert set(tune_linears(a, repeats=1, use_cache=False).tuned_shapes) == shapes[a]
    assert shapes[a] | shapes[b] <= set(json.loads(Path(rep.cache).read_text())["choices"])
    assert tune_linears(b, repeats=1).tuned_shapes == []  # B's plan was kept: nothing timed again
