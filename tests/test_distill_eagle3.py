"""The EAGLE-3 head's training (``sequoia_opt.distill.eagle3``): training-time-test steps compute what drafting
computes at depth k + 1, the draft vocabulary from token frequency, the disjointness check, and a tiny training
run that learns."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from feature_heads import eagle3_config, eagle3_tensors, random_target, write_head  # noqa: E402

from sequoia_opt.distill.eagle3 import (TeacherFeatures, check_disjoint, choose_draft_vocab, init_head,  # noqa: E402
                                        teacher_continuation_features, teacher_features, train_head, ttt_forward,
                                        ttt_losses)
from sequoia_opt.model.config import ModelConfig  # noqa: E402
from sequoia_opt.model.head_checkpoints import load_eagle_head  # noqa: E402
from sequoia_opt.model.heads import EagleConfig  # noqa: E402


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    target = random_target()
    folder = write_head(tmp_path_factory.mktemp("e3") / "h", eagle3_config(ids=(0, 1, 2)), eagle3_tensors())
    return load_eagle_head(folder, "eagle3", target)[0]


def test_training_time_test_steps_are_what_drafting_computes(head):
    """Step k at item t equals the head run as drafting runs it: items 0..t with their true features (the
    committed prefix, its last item the root), then a chain of k drafted nodes, each on its parent's output."""
    g = torch.Generator().manual_seed(0)
    T = 9
    feats = torch.randn(1, T, 3, 64, generator=g)
    tokens = torch.randint(0, 257, (1, T), generator=g)
    with torch.no_grad():
        fused = head.fuse(feats)
        steps = list(ttt_forward(head, fused, tokens, 3))
        for t in (0, 3, 5):
            cache = head.new_cache(32)
            from sequoia_opt.attention import causal_tree_mask

            lg, out = head(tokens[:, 1: t + 2], fused[:, : t + 1], torch.arange(t + 1), cache=cache,
                           cache_slots=torch.arange(t + 1), prefix_len=0, tree_mask=causal_tree_mask(t + 1))
            h = out[:, -1:]
            assert torch.allclose(steps[0][0][0, t], lg[0, -1], atol=1e-4)
            for k in (1, 2):  # the chain's node k: token t + 1 + k at position t + k, attending the prefix + chain
                pos = torch.tensor([t + k])
                lg, h = head(tokens[:, t + 1 + k: t + 2 + k], h, pos, cache=cache, cache_slots=pos, prefix_len=t + k,
                             tree_mask=causal_tree_mask(1))
                assert torch.allclose(steps[k][0][0, t], lg[0, 0], atol=1e-4), (t, k)


def test_draft_vocabulary_and_losses():
    top1 = torch.tensor([[5, 5, 5, 9, 9, 2]])
    text = torch.tensor([[7, 7, 7, 7, 2, 5]])
    assert choose_draft_vocab(top1, text, 3, 10).tolist() == [2, 5, 9]  # top-1 counts first
    assert choose_draft_vocab(top1, text, 4, 10).tolist() == [2, 5, 7, 9]  # then the text's
    with pytest.raises(ValueError):
        choose_draft_vocab(top1, text, 11, 10)


def test_disjointness_is_checked(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "def spam(eggs):\n    return eggs\n"}) + "\n"
                 + json.dumps({"messages": [{"role": "user", "content": "Explain lists."}]}) + "\n")
    assert check_disjoint(["import os\n", "x = 1\n"], [f]) == {str(f): 2}
    with pytest.raises(ValueError, match="p.jsonl:1: prompt 1 of 2 occurs in the training text"):
        check_disjoint(["# a file\ndef spam(eggs):\n    return eggs\n\n"], [f])


def test_disjointness_reads_prompts_as_every_command_does(tmp_path):
    """check_disjoint split lines at U+2028 (a JSON string holds it raw) and read only 'prompt', so a 'text'
    prompt was checked as empty and passed whatever the training text held."""
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"text": "def spam(eggs):\n    return eggs\n"}) + "\n"
                 + json.dumps({"prompt": "a\u2028b"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert check_disjoint(["import os\n"], [f]) == {str(f): 2}
    with pytest.raises(ValueError, match="p.jsonl:1: prompt 1 of 2 occurs"):
        check_disjoint(["def spam(eggs):\n    return eggs\n"], [f])
    with pytest.raises(ValueError, match="p.jsonl:2: prompt 2 of 2 occurs"):
        check_disjoint(["xa\u2028by"], [f])


def _tiny_head_and_teacher(rows: int):
    """A random target's teacher features on ``rows`` x 32 tokens of a 40-token alphabet (learnable in a few
    hundred steps), its draft vocabulary and index, and a fresh EAGLE-3 head on three of its layers."""
    target = random_target()
    chunks = torch.randint(0, 40, (rows, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, h = target(chunks, hidden_layers=(1, 2, 3))
    top = torch.log_softmax(logits, -1).topk(4, -1)
    data = TeacherFeatures(chunks, h.half(), top.indices.int(), top.values.half())
    ids = choose_draft_vocab(top.indices[..., 0], chunks, 60, 257)
    index = torch.full((257,), -1, dtype=torch.int64)
    index[ids] = torch.arange(len(ids))
    layer = ModelConfig(vocab_size=len(ids), dim=64, n_layers=1, n_heads=4, n_kv_heads=2, intermediate_size=96,
                        max_position_embeddings=512)
    return chunks, data, index, init_head(EagleConfig("eagle3", layer, 257, 64, (0, 1, 2)), target, ids, seed=0)


@pytest.mark.parametrize("bf16", [False, True])
def test_a_tiny_head_learns_the_targets_next_tokens(bf16):
    chunks, data, index, head = _tiny_head_and_teacher(6)
    with torch.no_grad():
        before, _, _ = ttt_losses(head, data.feats.float(), chunks, data.ids, data.logp, index, steps=2)
    tr = train_head(head, data, index, steps=150, batch=3, window=32, lr=3e-3, warmup=10, ttt_steps=2,
                    step_decay=0.8, feature_weight=0.1, seed=0, log=lambda m: None, log_every=50, bf16=bf16)
    with torch.no_grad():
        after, agree, _ = ttt_losses(head, data.feats.float(), chunks, data.ids, data.logp, index, steps=2)
    assert all(a < 0.6 * b for a, b in zip(after, before)), (before, after)
    assert agree[0] > 0.5 and tr.tokens_seen == 150 * 3 * 32


def test_a_first_ctrl_c_stops_the_head_training_and_keeps_the_head():
    """As the draft's trainer: the first Ctrl-C ends the training after the step in flight, the head trained so
    far is returned (and main evaluates and writes it, its log saying stopped_by: Ctrl-C)."""
    import os
    import signal

    chunks, data, index, head = _tiny_head_and_teacher(4)

    def log(msg: str) -> None:
        if msg.startswith("step=2 "):
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever launched pytest (a background
    try:  # job's SIGINT is ignored, and stays ignored while training)
        tr = train_head(head, data, index, steps=100, batch=2, window=16, lr=3e-3, warmup=1, ttt_steps=2,
                        step_decay=0.8, feature_weight=0.1, seed=0, log=log, log_every=1)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert tr.stopped_by == "Ctrl-C" and [r["step"] for r in tr.rows] == [1, 2, 3]
    assert tr.tokens_seen == 3 * 2 * 16 and not head.training


def test_teacher_features_in_bf16_are_close_and_the_cache_resumes(tmp_path):
    """The bfloat16 teacher's features and top-k are the float32 teacher's within bf16 rounding; the cache written
    on the way (every max(save_every, n // 8) chunks, and at the end) gives the same rows to a rerun."""
    target = random_target()
    chunks = torch.randint(0, 257, (16, 24), generator=torch.Generator().manual_seed(2))
    full = teacher_features(target, chunks, hidden_layers=(1, 2, 3), k=4, log=lambda m: None)
    half = teacher_features(target, chunks, hidden_layers=(1, 2, 3), k=4, log=lambda m: None, bf16=True,
                            cache_path=tmp_path / "c.pt", save_every=1)
    rel = (half.feats.float() - full.feats.float()).norm(dim=-1) / full.feats.float().norm(dim=-1)
    assert 0 < float(rel.mean()) < 0.03 and float(rel.max()) < 0.2
    assert float((half.ids[..., 0] == full.ids[..., 0]).float().mean()) > 0.9
    saves = []
    again = teacher_features(target, chunks, hidden_layers=(1, 2, 3), k=4, log=saves.append, bf16=True,
                             cache_path=tmp_path / "c.pt")
    assert torch.equal(again.feats, half.feats) and torch.equal(again.ids, half.ids)
    assert saves == [f"teacher feature cache {tmp_path / 'c.pt'}: 16/16 chunks already done"]


def test_continuation_features_are_the_targets_greedy_text_with_its_one_pass_features(tmp_path):
    """The continuation is the target's plain greedy decoding (each token the argmax of a full uncached forward
    over the sequence so far), and the features and top-k kept while generating equal one uncached forward over
    the finished sequence (as :func:`teacher_features` labels text); a rerun resumes from the cache."""
    target = random_target()
    prompts = torch.randint(0, 257, (5, 7), generator=torch.Generator().manual_seed(3))
    got = teacher_continuation_features(target, prompts, gen_tokens=6, hidden_layers=(1, 2, 3), k=4, batch=2,
                                        log=lambda m: None, cache_path=tmp_path / "c.pt")
    assert got.chunks.shape == (5, 13) and torch.equal(got.chunks[:, :7], prompts)
    with torch.no_grad():
        seq = prompts.clone()
        for _ in range(6):
            seq = torch.cat([seq, target(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert torch.equal(got.chunks, seq)
        want = teacher_features(target, seq, hidden_layers=(1, 2, 3), k=4, log=lambda m: None)
    assert torch.allclose(got.feats.float(), want.feats.float(), rtol=2e-3, atol=2e-2)  # float16 storage
    assert float((got.ids == want.ids).float().mean()) > 0.99
    assert torch.allclose(got.logp.float(), want.logp.float(), atol=2e-2)
    said = []
    again = teacher_continuation_features(target, prompts, gen_tokens=6, hidden_layers=(1, 2, 3), k=4, batch=2,
                                          log=said.append, cache_path=tmp_path / "c.pt")
    assert torch.equal(again.chunks, got.chunks) and torch.equal(again.feats, got.feats)
    assert said == [f"continuation feature cache {tmp_path / 'c.pt'}: 5/5 prompts already continued"]
    with pytest.raises(ValueError, match="gen_tokens and batch must be >= 1"):
        teacher_continuation_features(target, prompts, gen_tokens=0, hidden_layers=(1, 2, 3), k=4, batch=2)


def test_score_from_counts_only_the_items_that_predict_generated_tokens(head):
    """``score_from`` = P scores step k's item t only where it predicts token t + 1 + k >= P: the agreement is
    the mean over exactly those items (checked against the unscored logits' argmax), the loss their mean CE."""
    g = torch.Generator().manual_seed(4)
    T, P = 10, 6
    feats = torch.randn(1, T, 3, 64, generator=g)
    tokens = torch.randint(0, 257, (1, T), generator=g)
    t_ids = torch.randint(0, 257, (1, T, 3), generator=g).int()
    t_logp = torch.log_softmax(torch.randn(1, T, 3, generator=g), -1).half()
    index = torch.arange(257)  # every target id in the draft vocabulary (the fixture's head: 257 ids)
    with torch.no_grad():
        logits = [lg for lg, _ in ttt_forward(head, head.fuse(feats), tokens, 2)]
        _, agree, _ = ttt_losses(head, feats, tokens, t_ids, t_logp, index, steps=2, score_from=P)
    for k in (0, 1):
        items = [t for t in range(T) if P <= t + 1 + k <= T - 1]  # k=0: 5..8; k=1: 4..7
        want = sum(int(logits[k][0, t].argmax()) == int(t_ids[0, t + 1 + k, 0]) for t in items) / len(items)
        assert agree[k] == pytest.approx(want)


def test_bfloat16_units_are_read_from_the_cpu_flags(tmp_path):
    from sequoia_opt.distill.eagle3 import cpu_has_bf16_units

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n")
    assert cpu_has_bf16_units(info) is False  # AVX-512 alone: bfloat16 is emulated
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n")
    assert cpu_has_bf16_units(info) is True
    info.write_text("flags : fpu amx_bf16 amx_tile\n")
    assert cpu_has_bf16_units(info) is True
    assert cpu_has_bf16_units(tmp_path / "absent") is None  # not Linux: unknown, no warning


@pytest.mark.parametrize("args, message", [
    (["--cont-prompts", "4", "--cont-prompt-tokens", "2000"], "error: --cont-prompt-tokens 2000: at most 1024"),
    (["--cont-prompts", "4", "--cont-tokens", "0"], "error: --cont-prompts and --val-cont-prompts must be >= 0; "
                                                    "--cont-prompt-tokens, --cont-tokens and --gen-batch >= 1"),
    (["--val-cont-prompts", "-1"], "error: --cont-prompts and --val-cont-prompts must be >= 0"),
    (["--seed", "-3"], "error: --seed -3: must be in 0 .. 4294967295"),
    # a tryout's sizes that raised a traceback (or divided by zero, or trained a head of another shape) after the
    # teacher pass
    (["--top", "0"], "error: --top must be >= 1, got 0"),
    (["--chunk", "0"], "error: --chunk must be >= 1, got 0"),
    (["--eval-every", "0"], "error: --eval-every must be >= 1, got 0"),
    (["--tokens", "0"], "error: --tokens must be >= 1, got 0"),
    (["--head-dim", "0"], "error: --head-dim must be >= 1, got 0"),
    (["--threads", "-1"], "error: --threads must be >= 0, got -1"),
    (["--heads", "3", "--kv-heads", "2"], "error: --heads 3 is not a multiple of --kv-heads 2"),
    (["--lr", "0"], "error: --lr must be a number > 0, got 0.0"),
    (["--max-train-minutes", "nan"], "error: --max-train-minutes must be a number > 0, got nan"),
    (["--init-from", "/nonexistent/head"], "error: --init-from /nonexistent/head: not a saved folder"),
])
def test_bad_settings_are_refused_before_the_target_loads(args, message, tmp_path, capsys, monkeypatch):
    import sequoia_opt.model.loaders as loaders
    from sequoia_opt.distill.eagle3 import main

    monkeypatch.setattr(loaders, "load_checkpoint", lambda *a, **k: pytest.fail("the target was loaded"))
    assert main(args + ["--out", str(tmp_path / "h")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "h").exists()


def test_a_file_at_out_a_small_target_and_a_foreign_init_from_are_refused_before_the_weights(tmp_path, capsys,
                                                                                                   monkeypatch):
    """An --out that is a file failed at its mkdir after the training; a 2-layer target had no three distinct layers
    to fuse and failed after the data; an --init-from that is not an EAGLE-3 head failed after the teacher pass."""
    import sequoia_opt.model.loaders as loaders
    from sequoia_opt.distill.eagle3 import run_cli
    from tiny_pair import make_pair

    monkeypatch.setattr(loaders, "load_checkpoint", lambda *a, **k: pytest.fail("the target was loaded"))
    target, draft, _ = make_pair(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("x")
    for args, message in ((["--out", str(afile)], f"error: --out {afile} is a file"),
                          (["--out", str(tmp_path / "h"), "--target", str(target)],
                           f"error: --target {target} has 2 layers: an EAGLE-3 head fuses three distinct layers"),
                          (["--out", str(tmp_path / "h"), "--init-from", str(draft)],
                           "config.json: architectures = ['LlamaForCausalLM'] is not an EAGLE-3 head")):
        assert run_cli(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "h").exists() and afile.read_text() == "x"


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    import sequoia_opt.distill.cli as dcli
    import sequoia_opt.distill.eagle3 as e3

    def interrupted(argv=None):
        raise KeyboardInterrupt

    for module in (e3, dcli):
        monkeypatch.setattr(module, "main", interrupted)
        assert module.run_cli([]) == 130
        err = capsys.readouterr().err
        assert err.startswith("interrupted: no ") and err.count("\n") == 1, err


def test_out_is_required(capsys):
    """No default folder: a training run must not replace the shipped head by accident."""
    from sequoia_opt.distill.eagle3 import main

    with pytest.raises(SystemExit) as exc:
        main(["--steps", "10"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the following arguments are required: --out") and err.count("\n") == 1, err


def test_cpu_flags_are_the_first_flags_line(tmp_path):
    from sequoia_opt.device import cpu_flags

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2\nprocessor\t: 1\nflags\t\t: fpu avx2\n")
    assert cpu_flags(info) == {"fpu", "avx2"}
    info.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")  # Arm
    assert cpu_flags(info) == {"fp", "asimd", "bf16"}
    info.write_text("processor\t: 0\n")
    assert cpu_flags(info) == frozenset()
    assert cpu_flags(tmp_path / "absent") is None


def test_sigterm_is_one_terminated_line_and_exit_143(monkeypatch, capsys):
    """The trainers' entry points turn SIGTERM into Terminated (a KeyboardInterrupt), as treeopt's does: they said
    'interrupted' and exited 130 for it, or died silently where no handler was installed."""
    import signal

    import sequoia_opt.distill.cli as dcli
    import sequoia_opt.distill.eagle3 as e3
    from sequoia_opt.errors import Terminated

    def terminated(argv=None):
        raise Terminated(signal.SIGTERM)

    for module in (e3, dcli):
        monkeypatch.setattr(module, "main", terminated)
        assert module.run_cli([]) == 143
        err = capsys.readouterr().err
        assert err.startswith("terminated: no ") and err.count("\n") == 1, err


def _target8(folder: Path) -> Path:
    """A tiny 8-layer HF target (byte tokenizer): an EAGLE-3 head fuses three distinct layers of it."""
    from tiny_pair import byte_tokenizer
    from sequoia_opt.model.hf import save_hf_checkpoint

    cfg = ModelConfig(vocab_size=257, dim=64, n_layers=8, n_heads=4, n_kv_heads=2, intermediate_size=128,
                      max_position_embeddings=512, name="tiny8")
    save_hf_checkpoint(random_target(cfg), byte_tokenizer(), folder)
    return folder


def test_a_small_corpus_or_training_text_holding_an_eval_prompt_is_one_line_and_exit_2(tmp_path, capsys):
    """A training file holding a prompt the project evaluates on raised check_disjoint's ValueError as a traceback;
    an empty --stdlib or one without a chunk of held-out text did the same (the empty one after the target
    loaded). Nothing may be written to --out."""
    from sequoia_opt.distill.cli import DEFAULT_PACKAGE_DATA
    from sequoia_opt.distill.eagle3 import run_cli
    from sequoia_opt.prompts import load_prompts

    target = _target8(tmp_path / "t8")
    big = lambda i: "".join(f"def f{i}_{j}(x):\n    return x + {j}\n" for j in range(80))  # noqa: E731
    clean, leaky, short = tmp_path / "clean", tmp_path / "leaky", tmp_path / "short"
    for folder in (clean, leaky, short):
        folder.mkdir()
    for i in range(18):  # --n-prompts 1: 9 eval and 9 profile files of >= 2000 bytes
        (clean / f"m{i}.py").write_text(big(i))
        (leaky / f"m{i}.py").write_text(big(i))
    for i in range(4):  # training files (under 2000 bytes)
        (clean / f"t{i}.py").write_text(f"y{i} = 2\n" * 150)
        (leaky / f"t{i}.py").write_text(f"y{i} = 2\n" * 150)
    prompt = load_prompts(DEFAULT_PACKAGE_DATA / "prompts" / "eval.jsonl")[0].text
    for i in range(4):  # whichever training files the chunks take
        (leaky / f"t{i}.py").write_text(f"# {i}\n" + prompt[:1900])
    (short / "a.py").write_text("z = 3\n" * 50)
    common = ["--target", str(target), "--cache-dir", str(tmp_path / "cache"), "--tokens", "128", "--val-tokens",
              "128", "--chunk", "64", "--max-per-file", "256", "--steps", "1", "--n-prompts", "1", "--threads", "1",
              "--draft-vocab", "64", "--out", str(tmp_path / "h")]
    for stdlib, message in ((tmp_path / "empty", "no .py sources there"),
                            (short, "the eval split: not enough text for one chunk of 64 tokens"),
                            (leaky, "eval.jsonl:1: prompt 1 of ")):
        assert run_cli(common + ["--stdlib", str(stdlib)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --stdlib {stdlib}: ") and message in err and err.count("\n") == 1, err
        assert not (tmp_path / "h").exists()
    assert run_cli(common + ["--stdlib", str(clean), "--tokens", "10"]) == 2
    assert capsys.readouterr().err == "error: --tokens 10 is less than one --chunk of 64 tokens\n"
    assert not (tmp_path / "h").exists()
    # the user's own eval prompts (--eval-prompts) are checked as the package's are: text every training file holds
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"prompt": "nothing like it"}) + "\n" + json.dumps({"text": "= 2\ny"}) + "\n")
    assert run_cli(common + ["--stdlib", str(clean), "--eval-prompts", str(mine)]) == 2
    err = capsys.readouterr().err
    assert f"{mine}:2: prompt 2 of 2 occurs in the training text" in err and err.count("\n") == 1, err
    assert not (tmp_path / "h").exists()
    missing = tmp_path / "nope.jsonl"  # unreadable: one line before the target's weights load
    assert run_cli(common + ["--stdlib", str(clean), "--eval-prompts", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and err.count("\n") == 1 and not (tmp_path / "h").exists(), err


def test_a_draft_vocabulary_larger_than_the_targets_is_refused_before_the_weights(tmp_path, capsys, monkeypatch):
    """The default --draft-vocab 3072 against a target of 257 tokens ended in choose_draft_vocab's ValueError
    traceback after the teacher pass."""
    import sequoia_opt.model.loaders as loaders
    from sequoia_opt.distill.eagle3 import run_cli

    target = _target8(tmp_path / "t8")
    monkeypatch.setattr(loaders, "load_checkpoint", lambda *a, **k: pytest.fail("the target was loaded"))
    assert run_cli(["--target", str(target), "--out", str(tmp_path / "h"), "--stdlib", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("error: --draft-vocab 3072 is larger than the target's vocabulary of 257 "
                                       "tokens\n")
    assert not (tmp_path / "h").exists()


def test_an_init_from_head_fusing_other_layers_is_refused_before_the_weights(tmp_path, capsys, monkeypatch):
    """A head for this target's sizes that fuses other layers than the engines' defaults was refused only after
    the whole teacher pass."""
    import sequoia_opt.model.loaders as loaders
    from feature_heads import write_eagle3
    from sequoia_opt.distill.eagle3 import run_cli

    target = _target8(tmp_path / "t8")
    head = write_eagle3(tmp_path / "head", ids=(0, 2, 5))
    monkeypatch.setattr(loaders, "load_checkpoint", lambda *a, **k: pytest.fail("the target was loaded"))
    assert run_cli(["--target", str(target), "--out", str(tmp_path / "h"), "--stdlib", str(tmp_path),
                    "--init-from", str(head)]) == 2
    assert capsys.readouterr().err == f"error: --init-from {head} fuses layers [0, 2, 5], not [1, 3, 4]\n"
    assert not (tmp_path / "h").exists()


def test_an_init_from_heads_weights_are_checked_before_the_teacher_pass(tmp_path, capsys, monkeypatch):
    """--init-from checked config.json only; a head missing a tensor (or with a d2t outside the vocabulary) was
    refused after the teacher's forwards over the whole training set (hours on a real target)."""
    import sequoia_opt.model.loaders as loaders
    from feature_heads import eagle3_config, eagle3_tensors, write_head
    from sequoia_opt.distill.eagle3 import run_cli

    target = _target8(tmp_path / "t8")
    tensors = eagle3_tensors()
    tensors.pop("midlayer.mlp.up_proj.weight")
    head = write_head(tmp_path / "head", eagle3_config(ids=(1, 3, 4)), tensors)
    monkeypatch.setattr(loaders, "load_checkpoint", lambda *a, **k: pytest.fail("the target was loaded"))
    assert run_cli(["--target", str(target), "--out", str(tmp_path / "h"), "--stdlib", str(tmp_path),
                    "--init-from", str(head)]) == 2
    weights = head / "model.safetensors"
    assert capsys.readouterr().err == f"error: {weights}: missing tensor midlayer.mlp.up_proj.weight\n"
    assert not (tmp_path / "h").exists()
