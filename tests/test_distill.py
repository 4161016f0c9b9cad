"""Fast tests of the draft-distillation pieces (no real teacher: a tiny random model stands in)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable

import pytest
import torch

from sequoia_opt.distill import (
    DEFAULT_PACKAGE_DATA,
    main,
    training_streams,
    TeacherLabels,
    collect_sources,
    continuation_prompts,
    continue_curve,
    greedy_agreement,
    greedy_generate,
    init_student,
    label_with_teacher,
    lr_at,
    make_prompt,
    pca_embedding,
    read_curve,
    sampled_vocab,
    split_files,
    stage_summary,
    student_config,
    student_hidden,
    teacher_continuations,
    token_chunks,
    topk_kl,
    train_student,
    write_card,
    write_curve,
)
from sequoia_opt.model import ModelConfig, Transformer


def _files(n: int) -> list[str]:
    return [f"pkg{i % 7}/mod{i}.py" for i in range(n)]


def test_split_is_disjoint_complete_and_seeded():
    files = _files(200)
    sizes = {f: (5000 if i % 3 else 100) for i, f in enumerate(files)}
    a = split_files(files, seed=0, n_profile=20, n_eval=25, sizes=sizes)
    b = split_files(list(reversed(files)), seed=0, n_profile=20, n_eval=25, sizes=sizes)
    c = split_files(files, seed=1, n_profile=20, n_eval=25, sizes=sizes)
    assert a == b  # deterministic under the seed, whatever the input order
    assert a != c
    tr, pr, ev = set(a["train"]), set(a["profile"]), set(a["eval"])
    assert not (tr & pr or tr & ev or pr & ev)
    assert tr | pr | ev == set(files)
    assert len(pr) == 20 and len(ev) == 25
    assert all(sizes[f] >= 2000 for f in pr | ev)  # prompt files are big enough to cut a prompt from


def test_collect_sources_skips_tests_and_small_files(tmp_path: Path):
    for rel, size in [("a.py", 500), ("pkg/b.py", 500), ("test/c.py", 500), ("pkg/tests/d.py", 500),
                      ("pkg/test_e.py", 500), ("tiny.py", 10), ("site-packages/x/y.py", 500), ("notes.txt", 500)]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x" * size)
    assert collect_sources(tmp_path) == ["a.py", "pkg/b.py"]


def test_make_prompt_token_window_and_whole_lines():
    text = "".join(f"line_{i} = {i} * 2\n" for i in range(400))
    enc = lambda s: s.split()  # one "token" per whitespace word
    p = make_prompt(text, enc, random.Random(0), min_tokens=30, max_tokens=60)
    assert p is not None and p.endswith("\n") and p in text
    assert 30 <= len(enc(p)) <= 60
    assert make_prompt("x\n", enc, random.Random(0), min_tokens=30, max_tokens=60) is None


def _numbered_files(root: Path) -> tuple[list[str], Callable[[str], list[int]]]:
    """Six files of 90 "tokens" each (file i holds the integers 100 i .. 100 i + 89) and their encoder."""
    files = []
    for i in range(6):
        (root / f"f{i}.py").write_text(" ".join(str(j) for j in range(i * 100, i * 100 + 90)))
        files.append(f"f{i}.py")
    return files, lambda s: [int(w) for w in s.split()]


def test_token_chunks_prefix_property(tmp_path: Path):
    files, enc = _numbered_files(tmp_path)
    small, _ = token_chunks(tmp_path, files, enc, sep_id=9999, n_tokens=64, chunk=16, max_per_file=50, seed=0)
    big, _ = token_chunks(tmp_path, files, enc, sep_id=9999, n_tokens=256, chunk=16, max_per_file=50, seed=0)
    assert small.shape == (4, 16)
    assert torch.equal(big[:4], small)  # labels of a smaller run are reused by a larger one


def test_training_streams_keep_labelled_prefix_and_take_whole_files(tmp_path: Path):
    files, enc = _numbered_files(tmp_path)
    kw = dict(sep_id=9999, tokens=64, chunk=16, max_per_file=50, seed=0)
    lab_a, extra_a, _ = training_streams(tmp_path, files, enc, ce_tokens=256, ce_max_per_file=None, **kw)
    lab_b, extra_b, used = training_streams(tmp_path, files, enc, ce_tokens=10_000, ce_max_per_file=1000, **kw)
    assert torch.equal(lab_a, lab_b)  # cached teacher labels stay valid
    assert lab_a.shape == (4, 16) and extra_a.shape == (12, 16)
    # whole files: 6 x (90 tokens + separator) = 546 tokens -> 34 chunks of 16, every token id present
    assert extra_b.shape == (34, 16)
    ids = set(extra_b.flatten().tolist())
    assert {0, 89, 500, 589} <= ids and sorted(used) == sorted(files)
    _, none, _ = training_streams(tmp_path, files, enc, ce_tokens=0, ce_max_per_file=1000, **kw)
    assert none is None


def test_pca_embedding_shape_and_variance_on_low_rank():
    g = torch.Generator().manual_seed(0)
    V, D, r = 2000, 96, 12
    emb = torch.randn(V, r, generator=g) @ torch.randn(r, D, generator=g) + 0.01 * torch.randn(V, D, generator=g)
    proj, kept = pca_embedding(emb, 16)
    assert proj.shape == (V, 16) and proj.dtype == torch.float32
    assert kept > 0.99
    # inner products between centred rows are preserved by the projection
    ec = emb - emb.mean(0)
    assert torch.allclose(proj[:50] @ proj[:50].T, ec[:50] @ ec[:50].T, rtol=1e-2, atol=0.5)
    _, kept4 = pca_embedding(emb, 4)
    assert kept4 < kept
    with pytest.raises(ValueError):
        pca_embedding(emb, D + 1)


def test_topk_kl_zero_at_teacher_positive_elsewhere():
    g = torch.Generator().manual_seed(0)
    N, V, k = 8, 50, 5
    t_ids = torch.stack([torch.randperm(V, generator=g)[:k] for _ in range(N)])  # (N, k)
    t_logits = torch.randn(N, k, generator=g)
    t_logp = torch.log_softmax(t_logits, -1) - 0.3  # unnormalised on purpose: renormalised inside
    # a student whose distribution is the renormalised teacher: all mass on the k ids
    student = torch.full((N, V), -1e4)
    student.scatter_(1, t_ids, t_logits)
    assert float(topk_kl(student, t_ids, t_logp)) == pytest.approx(0.0, abs=1e-5)
    assert float(topk_kl(torch.randn(N, V, generator=g), t_ids, t_logp)) > 0.1
    leaky = student.clone()
    leaky[leaky < -1e3] = -2.0  # same ratios on the k ids, some mass elsewhere
    assert float(topk_kl(leaky, t_ids, t_logp)) > 0


def test_sampled_vocab_covers_needed_ids():
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([[5, 7], [7, 9]])
    nxt = torch.tensor([3, 5])
    v = sampled_vocab(ids, nxt, vocab_size=100, n_random=10, generator=g)
    assert torch.all(v[1:] > v[:-1])
    assert {3, 5, 7, 9} <= set(v.tolist())


def test_student_hidden_matches_forward():
    cfg = ModelConfig.preset("tiny").with_(tie_embeddings=True)
    m = init_student(cfg, seed=0)
    x = torch.randint(0, cfg.vocab_size, (2, 9))
    with torch.no_grad():
        assert torch.allclose(student_hidden(m, x) @ m.embed_tokens.weight.T, m(x), atol=1e-5)


def test_lr_schedule():
    assert lr_at(0, steps=100, lr=1.0, warmup=10) == pytest.approx(0.1)
    assert lr_at(9, steps=100, lr=1.0, warmup=10) == pytest.approx(1.0)
    assert lr_at(99, steps=100, lr=1.0, warmup=10) == pytest.approx(0.1, abs=1e-3)


@pytest.mark.parametrize("n_random", [None, 16])
def test_short_training_on_tiny_teacher_reduces_loss(tmp_path: Path, n_random):
    torch.manual_seed(0)
    vocab = 64
    teacher = Transformer(ModelConfig.preset("tiny").with_(vocab_size=vocab), device="cpu").eval()
    chunks = torch.randint(0, vocab, (6, 24), generator=torch.Generator().manual_seed(1))
    labels = label_with_teacher(teacher, chunks, k=8, cache_path=tmp_path / "t.pt", log=lambda s: None)
    assert labels.ids.shape == (6, 24, 8) and labels.logp.dtype == torch.float16
    again = label_with_teacher(lambda x: pytest.fail("cache not used"), chunks[:4], k=8,
                               cache_path=tmp_path / "t.pt", log=lambda s: None)
    assert torch.equal(again.ids, labels.ids[:4])
    cfg = student_config(vocab_size=vocab, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=64,
                         rope_theta=10000.0)
    emb, _ = pca_embedding(teacher.embed_tokens.weight.detach(), 32)
    student = init_student(cfg, seed=0, embedding=emb)
    res = train_student(student, chunks, labels, steps=5, batch=2, lr=1e-2, seed=0, warmup=1, log_every=1,
                        eval_every=1, val=(chunks[:2], TeacherLabels(labels.ids[:2], labels.logp[:2])),
                        log=lambda s: None, n_random=n_random, extra=chunks, extra_batch=1)
    kls = [r["val_kl"] for r in res.rows]
    assert len(res.rows) == 5 and res.tokens_seen == 5 * 3 * 24
    assert kls[-1] < kls[0]


def test_a_first_ctrl_c_stops_the_training_after_its_step_and_keeps_the_weights(tmp_path: Path):
    """A 40-minute training lost everything on Ctrl-C; the first now stops it as the time limit does (the step in
    flight finishes, the model trained so far is returned and evaluated), the second would interrupt at once."""
    import os
    import signal

    torch.manual_seed(0)
    vocab = 64
    teacher = Transformer(ModelConfig.preset("tiny").with_(vocab_size=vocab), device="cpu").eval()
    chunks = torch.randint(0, vocab, (6, 24), generator=torch.Generator().manual_seed(1))
    labels = label_with_teacher(teacher, chunks, k=8, cache_path=tmp_path / "t.pt", log=lambda s: None)
    cfg = student_config(vocab_size=vocab, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=64,
                         rope_theta=10000.0)
    student = init_student(cfg, seed=0, embedding=pca_embedding(teacher.embed_tokens.weight.detach(), 32)[0])
    before = {k: v.clone() for k, v in student.state_dict().items()}
    lines: list[str] = []

    def log(msg: str) -> None:  # the user presses Ctrl-C while step 3 is logged
        lines.append(msg)
        if msg.startswith("step=3 "):
            os.kill(os.getpid(), signal.SIGINT)

    # Python's own Ctrl-C handler, whatever launched pytest (a background job's shell ignores SIGINT, and an
    # ignored SIGINT stays ignored while training: test_an_ignored_sigint_stays_ignored_while_training)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        res = train_student(student, chunks, labels, steps=50, batch=2, lr=1e-2, seed=0, warmup=1, log_every=1,
                            eval_every=10, val=(chunks[:2], TeacherLabels(labels.ids[:2], labels.logp[:2])), log=log)
        restored = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert res.stopped_by == "Ctrl-C" and [r["step"] for r in res.rows] == [1, 2, 3, 4]  # step 4 was in flight
    assert res.rows[-1]["val_kl"] != ""  # the last row is evaluated, as at the time limit
    assert any(ln.startswith("Ctrl-C: stopping after this step") for ln in lines)
    assert lines[-1] == "stopping at step 4: Ctrl-C"
    assert restored is signal.default_int_handler  # a second Ctrl-C interrupts as before
    assert any(not torch.equal(v, student.state_dict()[k]) for k, v in before.items())  # 4 steps' weights kept
    done = train_student(student, chunks, labels, steps=2, batch=2, lr=1e-2, seed=0, warmup=1, log=lambda s: None)
    assert done.stopped_by == "" and len(done.rows) == 1


def test_an_ignored_sigint_stays_ignored_while_training():
    """A job a shell script starts with '&' runs with SIGINT ignored (the script's Ctrl-C is not its own): the
    trainer's Ctrl-C handler replaced that, so such a Ctrl-C stopped its training. It is now left ignored."""
    import os
    import signal

    from sequoia_opt.distill.train import stop_on_ctrl_c

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stop_on_ctrl_c(lambda s: None) as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
        assert stop == {"requested": False} and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_greedy_agreement_of_a_model_with_itself_is_one():
    m = Transformer(ModelConfig.preset("tiny"), device="cpu").eval()
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    conts = [greedy_generate(m, p, 6, eos_ids=[]) for p in prompts]
    assert [len(c) for c in conts] == [6, 6]
    # the cached greedy decode agrees with the uncached forward
    res = greedy_agreement(m, prompts, conts)
    assert res["agreement"] == 1.0 and res["positions"] == 12 and res["mean_agreeing_prefix"] == 6


def _row(step: int, val: float | str = "") -> dict:
    return {"step": step, "tokens": 100 * step, "lr": 1e-3, "train_kl": 2.0 / step, "train_ce": 3.0 / step,
            "train_agreement": 0.1 * step, "cont_kl": 1.5 / step, "cont_agreement": 0.2 * step,
            "val_kl": "" if val == "" else 1.0, "val_agreement": val,
            "val_greedy_agreement": "" if val == "" else val + 0.1, "elapsed_s": 1.5 * step}


def test_curve_round_trip_and_continued_stage(tmp_path: Path):
    first = continue_curve([], [_row(1), _row(2, 0.25)])
    assert [r["stage"] for r in first] == [1, 1]
    write_curve(first, tmp_path)
    back = read_curve(tmp_path / "loss_curve.csv")
    assert back == first and (tmp_path / "loss_curve.png").stat().st_size > 0
    both = continue_curve(back, [_row(1), _row(3, 0.5)])
    assert [(r["step"], r["tokens"], r["elapsed_s"], r["stage"]) for r in both[2:]] == [(3, 300, 4.5, 2),
                                                                                        (5, 500, 7.5, 2)]
    assert both[-1]["val_agreement"] == 0.5 and both[:2] == back
    # a curve written before the stage and continuation columns existed reads as stage 1 with those empty
    (tmp_path / "old.csv").write_text("step,tokens,lr,train_kl,train_ce,train_agreement,val_kl,val_agreement,"
                                      "elapsed_s\n10,30720,0.001,6.5,8.2,0.02,,,9.87\n")
    assert read_curve(tmp_path / "old.csv")[0] == {"step": 10, "tokens": 30720, "lr": 0.001, "train_kl": 6.5,
                                                        "train_ce": 8.2, "train_agreement": 0.02, "cont_kl": "",
                                                        "cont_agreement": "", "val_kl": "", "val_agreement": "",
                                                        "val_greedy_agreement": "", "elapsed_s": 9.87, "stage": 1}
    # and is drawn together with a stage that logged them (series missing in a stage are left out there)
    write_curve(continue_curve(read_curve(tmp_path / "old.csv"), [_row(1, 0.5)]), tmp_path)
    assert read_curve(tmp_path / "loss_curve.csv")[1]["val_greedy_agreement"] == 0.6


def test_card_of_a_continued_run_lists_every_stage_in_order(tmp_path: Path):
    import json

    tlog = json.loads((DEFAULT_PACKAGE_DATA / "draft" / "training_log.json").read_text(encoding="utf-8"))
    one = dict(tlog, stages=[])
    write_card(tmp_path, one)
    single = (tmp_path / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "Stages:" not in single and single.count(tlog["command"]) == 1
    second = dict(tlog, command=tlog["command"] + " --init-from sequoia_opt/data/draft",
                  stages=[stage_summary(tlog)], train=dict(tlog["train"], tokens_seen=1000))
    write_card(tmp_path, second)
    card = (tmp_path / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "this checkpoint is stage 2" in card
    reproduce = card.split("the commands in this order):")[1].split("```")[1].strip().splitlines()
    assert reproduce == [tlog["command"], second["command"]]
    table = [ln for ln in card.splitlines() if ln.startswith("| 1 |") or ln.startswith("| 2 |")]
    assert len(table) == 2 and f"{tlog['train']['tokens_seen']:,}" in table[0] and "| 1,000 |" in table[1]
    assert f"{tlog['train']['tokens_seen'] + 1000:,} tokens seen" in card
    assert "Commands without `--out` ran when it defaulted" in card  # the shipped log's commands predate it
    third = dict(second, command=second["command"] + " --out /tmp/d", stages=[dict(s, command=s["command"] + " --out x")
                                                                              for s in second["stages"]])
    write_card(tmp_path, third)
    assert "Commands without" not in (tmp_path / "MODEL_CARD.md").read_text(encoding="utf-8")


def test_card_says_which_bars_are_missed_and_keeps_the_hand_written_notes(tmp_path: Path):
    import json

    tlog = json.loads((DEFAULT_PACKAGE_DATA / "draft" / "training_log.json").read_text(encoding="utf-8"))
    ev = tlog["evaluation"]
    missed = dict(tlog, bars={"cost_ratio_ok": True, "agreement_ok": False, "size_ok": True},
                  evaluation=dict(ev, greedy=dict(ev["greedy"], agreement=0.4321)),
                  timing=dict(tlog["timing"], train_s=600.0),
                  stages=[dict(stage_summary(tlog), timing={"train_s": 1200.0})])
    (tmp_path / "CARD_NOTES.md").write_text("## Why\n\nThe draft copies less than the target.\n", encoding="utf-8")
    write_card(tmp_path, missed)
    card = (tmp_path / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "- **Bars missed**: greedy agreement 0.432 against 0.5 (table below)." in card
    # the notes sit between the licence bullets and the architecture table, verbatim
    head, tail = card.split("## Architecture and size")
    assert "## Why\n\nThe draft copies less than the target.\n" in head and "## Why" not in tail
    assert "(30 min of student training on two CPU cores" in card and "All stages together: 30.0 min" in card
    met = dict(tlog, bars={"cost_ratio_ok": True, "agreement_ok": True, "size_ok": True})
    (tmp_path / "CARD_NOTES.md").unlink()
    write_card(tmp_path, met)
    card = (tmp_path / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "Bars missed" not in card and "## Why" not in card


def test_init_from_a_folder_without_a_checkpoint_fails_before_any_work(tmp_path: Path):
    with pytest.raises(SystemExit, match="not a saved draft"):
        main(["--init-from", str(tmp_path / "missing"), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_teacher_continuations_are_greedy_decodes_with_teacher_forced_labels(tmp_path: Path):
    torch.manual_seed(0)
    teacher = Transformer(ModelConfig.preset("tiny").with_(vocab_size=64), device="cpu").eval()
    prompts = torch.randint(0, 64, (5, 7), generator=torch.Generator().manual_seed(2))
    seqs, labels = teacher_continuations(teacher, prompts, gen_tokens=6, k=4, batch=2,
                                         cache_path=tmp_path / "c.pt", log=lambda s: None)
    assert seqs.shape == (5, 13) and labels.ids.shape == (5, 13, 4) and torch.equal(seqs[:, :7], prompts)
    for i in range(5):  # batched cached decode == one prompt at a time
        assert seqs[i, 7:].tolist() == greedy_generate(teacher, prompts[i].tolist(), 6, eos_ids=[])
    with torch.inference_mode():  # labels at every position == the teacher-forced top-k of the whole sequence
        lp = torch.log_softmax(teacher(seqs).float(), dim=-1).topk(4, dim=-1)
    assert torch.equal(labels.ids.long(), lp.indices)
    assert torch.allclose(labels.logp.float(), lp.values, atol=2e-2)
    assert torch.equal(labels.ids[:, 6:-1, 0].long(), seqs[:, 7:])  # the continuation is the top-1 label
    # a rerun over a prefix of the prompts reads the cache, no teacher forward
    again, lab2 = teacher_continuations(lambda *a, **k: pytest.fail("cache not used"), prompts[:4], gen_tokens=6,
                                        k=4, batch=2, cache_path=tmp_path / "c.pt", log=lambda s: None)
    assert torch.equal(again, seqs[:4]) and torch.equal(lab2.logp, labels.logp[:4])


def test_continuation_prompts_share_one_length_and_extend_with_n(tmp_path: Path):
    text = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(60))
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(text)

    def enc(s: str) -> list[int]:
        return [ord(c) for c in s]

    few = continuation_prompts(tmp_path, ["a.py", "b.py"], enc, n=3, prompt_tokens=40, seed=0)
    more = continuation_prompts(tmp_path, ["a.py", "b.py"], enc, n=7, prompt_tokens=40, seed=0)
    assert few.shape == (3, 40) and more.shape == (7, 40)  # more prompts than files: files are revisited
    assert torch.equal(more[:3], few)  # a larger n extends the same list (the continuation cache relies on it)
    assert all(row[-1] == ord("\n") for row in more.tolist())  # prompts end at a line end, like eval prompts
    with pytest.raises(ValueError, match="no file yields"):
        continuation_prompts(tmp_path, ["a.py"], enc, n=1, prompt_tokens=5000, seed=0)


def test_training_with_continuations_and_a_probe_logs_both(tmp_path: Path):
    torch.manual_seed(0)
    teacher = Transformer(ModelConfig.preset("tiny").with_(vocab_size=64), device="cpu").eval()
    chunks = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    labels = label_with_teacher(teacher, chunks, k=8, log=lambda s: None)
    cont = teacher_continuations(teacher, chunks[:, :6], gen_tokens=10, k=8, batch=4, log=lambda s: None)
    prompts = [c[:6].tolist() for c in chunks]
    conts = [s[6:].tolist() for s in cont[0]]
    cfg = student_config(vocab_size=64, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=64,
                         rope_theta=10000.0)
    student = init_student(cfg, seed=0)
    probes = []

    def probe(m):
        probes.append(greedy_agreement(m, prompts, conts)["agreement"])
        return probes[-1]

    res = train_student(student, chunks, labels, steps=40, batch=2, lr=2e-2, seed=0, warmup=1, log_every=10,
                        eval_every=20, log=lambda s: None, n_random=None, cont=cont, cont_batch=2, probe=probe)
    assert res.tokens_seen == 40 * (2 * 16 + 2 * 16)
    assert [r["val_greedy_agreement"] for r in res.rows] == ["", probes[0], "", probes[1]]
    assert all(isinstance(r["cont_kl"], float) and 0 <= r["cont_agreement"] <= 1 for r in res.rows)
    assert res.rows[-1]["cont_kl"] < res.rows[0]["cont_kl"]  # the continuation term is being trained
    assert student.training is False


@pytest.mark.parametrize("argv, message", [
    (["--cont-batch", "4"], "--cont-batch needs teacher continuations"),
    (["--cont-batch", "4", "--cont-prompts", "8", "--cont-tokens", "0"], "--cont-batch needs"),
    (["--cont-prompts", "-1"], "must be >= 0"),
    (["--gen-batch", "0"], "--gen-batch >= 1"),
    (["--cont-prompts", "8", "--cont-prompt-tokens", "5000"], "--cont-prompt-tokens 5000: at most 1024"),
    (["--seed", "-1"], r"--seed -1: must be in 0 \.\. 4294967295"),
    (["--seed", str(2**64)], "--seed 18446744073709551616: must be in 0"),
])
def test_bad_options_are_checked_before_any_model_loads(tmp_path: Path, argv, message):
    with pytest.raises(SystemExit, match=message):
        main(argv + ["--out", str(tmp_path / "d"), "--target", str(tmp_path / "missing.gguf")])
    assert not (tmp_path / "d").exists()


def test_distill_command_line_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    from sequoia_opt.distill.cli import run_cli

    for argv, message in ((["--evaluate", str(tmp_path / "nope")], "checkpoint not found"),
                          (["--init-from", str(tmp_path / "nope"), "--out", str(tmp_path / "o")], "not a saved draft"),
                          (["--cont-prompts", "-1", "--out", str(tmp_path / "o")], "must be >= 0"),
                          # a tryout's: an untrained draft saved, a card on 0 prompts, a reshape traceback after
                          # labelling, a traceback on threads
                          (["--steps", "0", "--out", str(tmp_path / "o")], "--steps must be >= 1, got 0"),
                          (["--n-prompts", "0", "--out", str(tmp_path / "o")], "--n-prompts must be >= 1, got 0"),
                          (["--batch", "0", "--out", str(tmp_path / "o")], "--batch must be >= 1, got 0"),
                          (["--threads", "-2", "--out", str(tmp_path / "o")], "--threads must be >= 0, got -2"),
                          (["--dim", "30", "--heads", "4", "--kv-heads", "2", "--out", str(tmp_path / "o")],
                           "--dim 30 is not a multiple of --heads 4")):
        assert run_cli(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert run_cli(["--steps", "10"]) == 2  # no --out: nothing may land in the installed package
    err = capsys.readouterr().err
    assert err.startswith("error: --out is required") and err.count("\n") == 1, err
    with pytest.raises(SystemExit) as exc:
        run_cli(["--steps", "abc"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: argument --steps: invalid int value: 'abc' (see 'python -m sequoia_opt.distill --help')\n"
    assert not (tmp_path / "o").exists()


def _small_run(tmp_path: Path, target: Path, stdlib: Path, *extra: str) -> list[str]:
    """A distillation command line on a tiny target that trains in seconds."""
    return ["--out", str(tmp_path / "o"), "--target", str(target), "--stdlib", str(stdlib),
            "--cache-dir", str(tmp_path / "cache"), "--tokens", "256", "--val-tokens", "128", "--chunk", "64",
            "--max-per-file", "256", "--steps", "2", "--batch", "2", "--eval-every", "1", "--n-prompts", "1",
            "--gen-tokens", "4", "--dim", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1",
            "--threads", "1", *extra]


def test_a_corpus_too_small_is_one_line_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """An empty --stdlib, or one whose files make no prompt or no chunk, ended in a ValueError traceback after
    the target loaded, with empty prompt sets already written to OUT/prompts; --tokens below one --chunk did the
    same after the prompts were written."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import make_pair
    from sequoia_opt.distill.cli import run_cli

    target, _, _ = make_pair(tmp_path)
    (tmp_path / "empty").mkdir()
    short = tmp_path / "short"
    short.mkdir()
    for i in range(3):  # over the 200-byte floor, under the 2000 bytes a prompt file needs
        (short / f"m{i}.py").write_text(f"x{i} = 1\n" * 60)
    prompts_only = tmp_path / "prompts_only"  # 18 files: all go to the profile and eval splits, none to train
    prompts_only.mkdir()
    for i in range(18):
        (prompts_only / f"m{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x + {j}\n" for j in range(80)))
    for stdlib, message in ((tmp_path / "empty", "no .py sources there"),
                            (tmp_path / "missing", "no .py sources there"),
                            (short, "no profile-split file yields a prompt"),
                            (prompts_only, "the train split (0 files): not enough text for one chunk of 64 tokens")):
        assert run_cli(_small_run(tmp_path, target, stdlib)) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --stdlib {stdlib}: {message}") and err.count("\n") == 1, err
        assert not (tmp_path / "o").exists()
    import sequoia_opt.model.loaders as loaders

    monkeypatch.setattr(loaders, "load_checkpoint", lambda *a, **k: pytest.fail("the target was loaded"))
    for flag in ("--tokens", "--val-tokens"):
        assert run_cli(_small_run(tmp_path, target, short, flag, "10")) == 2
        err = capsys.readouterr().err
        assert err == f"error: {flag} 10 is less than one --chunk of 64 tokens\n", err
        assert not (tmp_path / "o").exists()


def test_a_student_the_target_cannot_make_or_continue_is_refused_before_the_weights(tmp_path, capsys, monkeypatch):
    """Found after the whole teacher pass, with the prompt sets already written: the default --dim 160 against a
    narrower target (pca_embedding's ValueError traceback), an --init-from of another architecture (its message
    did not say what differs), and an --init-from with another tokenizer (accepted: trained on other ids)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import byte_tokenizer, make_pair, other_tokenizer
    import sequoia_opt.model.loaders as loaders
    from sequoia_opt.distill.cli import run_cli
    from sequoia_opt.model.hf import save_hf_checkpoint

    target, _, _ = make_pair(tmp_path)
    cfg = student_config(vocab_size=257, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=128,
                         rope_theta=10000.0)
    save_hf_checkpoint(init_student(cfg, seed=0), byte_tokenizer(), tmp_path / "d32")
    save_hf_checkpoint(init_student(cfg, seed=0), other_tokenizer(), tmp_path / "other")
    monkeypatch.setattr(loaders, "load_checkpoint", lambda *a, **k: pytest.fail("a checkpoint's weights loaded"))
    base = _small_run(tmp_path, target, tmp_path)
    for extra, message in (
            (["--dim", "160", "--intermediate", "640"],
             "--dim 160 is wider than the target's hidden size 64 (the PCA embedding init)"),
            (["--dim", "48", "--init-from", str(tmp_path / "d32")],
             f"--init-from {tmp_path / 'd32'} has another architecture than the one asked for: dim 32, not 48; "
             "intermediate_size 128, not 192"),
            (["--layers", "2", "--init-from", str(tmp_path / "d32")], "n_layers 1, not 2"),
            (["--intermediate", "128", "--init-from", str(tmp_path / "other")],
             f"--init-from {tmp_path / 'other'} has another tokenizer than the target {target} (token id 0 differs)")):
        assert run_cli(base + extra) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
        assert not (tmp_path / "o").exists()


def test_the_card_of_a_draft_for_another_target_names_it_and_its_evaluate_command_remeasures_it(tmp_path,
                                                                                                capsys):
    """With --target, the card still said "distilled from SmolLM2-135M-Instruct", gave the weights SmolLM2's
    Apache-2.0 licence, pointed at the package's prompt sets and reproduced its figures with `--evaluate
    sequoia_opt/data/draft` (the shipped draft against the demo target), and the log named SmolLM2 as target."""
    import json
    import shlex
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import make_pair
    from sequoia_opt.distill.cli import run_cli

    target, _, _ = make_pair(tmp_path)
    lib = tmp_path / "lib"
    lib.mkdir()
    for i in range(24):  # 18 prompt files (--n-prompts 1) and 6 training files
        (lib / f"m{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n" for j in range(60)))
    assert run_cli(_small_run(tmp_path, target, lib)) == 0
    capsys.readouterr()
    out = tmp_path / "o"
    card = (out / "MODEL_CARD.md").read_text(encoding="utf-8")
    tlog = json.loads((out / "training_log.json").read_text(encoding="utf-8"))
    assert tlog["target"]["name"] == "target" and tlog["target"]["demo"] is False
    assert card.startswith("# treeopt draft for target\n") and "SmolLM2" not in card and "Apache" not in card
    assert f"`{out}/prompts/profile.jsonl`" in card and "sequoia_opt/data" not in card
    line = next(ln for ln in card.splitlines() if ln.startswith("python -m sequoia_opt.distill --evaluate"))
    assert line == (f"python -m sequoia_opt.distill --evaluate {out} --target {target} --prompts-out {out}/prompts "
                    "--gen-tokens 4 --threads 1")
    assert run_cli(shlex.split(line)[3:]) == 0  # the card's own command re-measures this draft on these prompts
    printed = capsys.readouterr().out
    res = json.loads(printed[printed.index("\n{\n") + 1:])
    assert res["greedy"] == tlog["evaluation"]["greedy"] and res["n_prompts"] == tlog["evaluation"]["n_prompts"] == 1
