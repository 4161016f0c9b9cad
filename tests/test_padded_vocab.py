"""A draft model whose embedding is padded to another size than its target's, both sharing one tokenizer (the
Qwen2.5 case: 0.5B-3B have 151936 rows, 7B-72B 152064): fitted to the target's size, never proposing a
padding id, exact."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import byte_tokenizer, make_pair, other_tokenizer, random_model  # noqa: E402

from sequoia_opt.cli import app  # noqa: E402
from sequoia_opt.errors import CheckpointError  # noqa: E402
from sequoia_opt.jobs.load import load_pair  # noqa: E402
from sequoia_opt.model import Transformer  # noqa: E402
from sequoia_opt.model.hf import save_hf_checkpoint  # noqa: E402
from sequoia_opt.model.loaders import (check_draft_vocabulary, load_checkpoint, load_model_config,  # noqa: E402
                                      load_tokenizer)
from sequoia_opt.tree import Tree, save_tree  # noqa: E402

runner = CliRunner()


def resized(model: Transformer, vocab: int, seed: int = 7) -> Transformer:
    """``model`` with an embedding and LM head of ``vocab`` rows: its own rows first, random rows after (a
    checkpoint's padding rows hold whatever training left there)."""
    torch.manual_seed(seed)
    out = Transformer(model.config.with_(vocab_size=vocab, tie_embeddings=False))
    sd = model.state_dict()
    own = model.config.vocab_size
    with torch.no_grad():
        for name, p in out.named_parameters():
            src = sd[name]
            if name in ("embed_tokens.weight", "lm_head.weight"):
                p.normal_(0.0, 0.3)
                k = min(own, vocab)
                p[:k] = src[:k]
            else:
                p.copy_(src)
    return out.eval()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("padded")
    target, draft, prompts = make_pair(root)
    dmodel, tok = load_checkpoint(draft)
    padded = root / "draft-300"
    save_hf_checkpoint(resized(dmodel, 300), tok, padded)
    tmodel, _ = load_checkpoint(target)
    wide_target = root / "target-300"  # a target padded further than its draft
    save_hf_checkpoint(resized(tmodel, 300, seed=8), tok, wide_target)
    return {"root": root, "target": target, "draft": draft, "prompts": prompts, "padded": padded,
            "wide_target": wide_target}


def test_fit_vocab_truncates_and_pads_the_logits():
    m = random_model(1, vocab=300)
    tokens = torch.tensor([[3, 250, 7, 120]])
    want = m(tokens)  # (1, 4, 300)

    cut = resized(m, 300)
    cut.fit_vocab(257)
    assert cut.config.vocab_size == 257 and cut.embed_tokens.weight.shape == (257, m.config.dim)
    got = cut(tokens)
    assert got.shape == (1, 4, 257)
    torch.testing.assert_close(got, want[..., :257])

    small = random_model(2, vocab=257)
    ref = small(tokens)
    small.fit_vocab(300)
    got = small(tokens)
    assert got.shape == (1, 4, 300) and small.config.vocab_size == 300 and not small.config.tie_embeddings
    torch.testing.assert_close(got[..., :257], ref)
    assert torch.isneginf(got[..., 257:]).all()
    assert torch.softmax(got, -1)[..., 257:].sum().item() == 0.0  # a padding id gets no probability
    beyond = small(torch.tensor([[3, 299]]))  # an id past the checkpoint's rows is looked up, not out of range
    assert beyond.shape == (1, 2, 300) and torch.isfinite(beyond[..., :257]).all()

    tied = Transformer(small.config.with_(vocab_size=257, tie_embeddings=True))
    tied.fit_vocab(300)  # a tied head keeps reading the embedding's storage: no second (V, dim) copy
    assert tied.lm_head.weight.data_ptr() == tied.embed_tokens.weight.data_ptr()
    assert tied.lm_head.weight.shape == (257, m.config.dim) and tied.embed_tokens.weight.shape == (300, m.config.dim)
    with pytest.raises(ValueError, match="already called"):
        small.fit_vocab(257)
    with pytest.raises(ValueError, match="positive integer"):
        random_model(3).fit_vocab(0)
    same = random_model(3)
    same.fit_vocab(257)  # the same size: nothing changes
    assert same.padded_logits == 0 and same.config.vocab_size == 257


def test_check_draft_vocabulary(pair):
    tcfg, dcfg = load_model_config(pair["target"]), load_model_config(pair["padded"])
    tok = load_tokenizer(pair["target"])
    assert (tcfg.vocab_size, dcfg.vocab_size, tok.vocab_size) == (257, 300, 257)
    check_draft_vocabulary(tok, load_tokenizer(pair["padded"]), target_name="t", draft_name="d")
    # a token list padded or extended past the other's (a GGUF's [PAD151936] ...): the shared ids agree
    extended = byte_tokenizer(extra=("[PAD257]", "[PAD258]"))
    assert tok.first_difference(extended) is None and extended.first_difference(tok) is None
    check_draft_vocabulary(tok, extended, target_name="t", draft_name="d")
    check_draft_vocabulary(extended, tok, target_name="t", draft_name="d")
    other = other_tokenizer()
    assert tok.first_difference(other) == 0
    with pytest.raises(CheckpointError, match=r"mismatched tokenizers: target t \(257 tokens\) and draft d \(257 "
                                              r"tokens\) differ at id 0 \('!' against 'Ń'\)"):
        check_draft_vocabulary(tok, other, target_name="t", draft_name="d")
    with pytest.raises(CheckpointError, match=r"the tokenizer of target t has 257 tokens but draft d's embedding only "
                                              r"200 rows: the draft could not read the target's tokens past id 199"):
        check_draft_vocabulary(tok, tok, target_name="t", draft_name="d", draft_rows=200)
    check_draft_vocabulary(tok, tok, target_name="t", draft_name="d", draft_rows=257)
    swapped = byte_tokenizer(extra=("<|a|>", "<|b|>"))
    later = byte_tokenizer(extra=("<|a|>", "<|c|>"))
    assert swapped.first_difference(later) == 258


def test_a_padded_draft_loads_fitted_to_the_target(pair):
    p = load_pair(pair["target"], str(pair["padded"]), device=torch.device("cpu"), dtype=torch.float32)
    assert p.draft.config.vocab_size == 257 and p.draft.lm_head.weight.shape[0] == 257
    q = load_pair(pair["wide_target"], str(pair["draft"]), device=torch.device("cpu"), dtype=torch.float32)
    assert q.draft.config.vocab_size == 300 and q.draft.padded_logits == 43


def _run(target, draft, prompts, tree, out, *extra):
    r = runner.invoke(app, [str(a) for a in ("run", "--tree", tree, "--target", target, "--draft", draft,
                                              "--prompts", prompts, "--num-prompts", "3", "--max-new-tokens",
                                              "12", "--results-dir", out, "--json", *extra)])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_a_padded_draft_decodes_exactly_with_its_own_proposals(pair, tmp_path):
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.from_choices([[0], [1], [0, 0], [0, 0, 0]]))
    base = _run(pair["target"], pair["draft"], pair["prompts"], tree, tmp_path / "a")
    padded = _run(pair["target"], pair["padded"], pair["prompts"], tree, tmp_path / "b")
    assert base["greedy_ok"] is True and padded["greedy_ok"] is True
    b, p = base["summaries"][1], padded["summaries"][1]
    assert p["mismatches"] == 0
    # the padding rows are cut, so the padded draft proposes what the unpadded one does, step for step
    assert p["tokens_per_step"] == pytest.approx(b["tokens_per_step"]) and b["tokens_per_step"] > 1.0

    wide = _run(pair["wide_target"], pair["draft"], pair["prompts"], tree, tmp_path / "c")
    assert wide["greedy_ok"] is True and wide["summaries"][1]["mismatches"] == 0


def test_a_target_padded_past_its_draft_samples(pair, tmp_path):
    # the draft's q is (n, 300) with 0 past its 257 rows (test_fit_vocab_truncates_and_pads_the_logits): a NaN
    # in it would fail the run
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.chain(3))
    doc = _run(pair["wide_target"], pair["draft"], pair["prompts"], tree, tmp_path / "s", "--temperature", "1.0",
               "--seed", "3")
    s = doc["summaries"][1]
    assert s["tokens_per_step"] >= 1.0 and s["steps"] > 0


def test_run_refuses_a_draft_with_another_tokenizer_before_weights_load(pair, tmp_path, monkeypatch):
    other = tmp_path / "other"
    save_hf_checkpoint(random_model(3), other_tokenizer(), other)
    import sequoia_opt.jobs.load as load

    def no_weights(*a, **k):
        raise AssertionError("weights loaded")

    monkeypatch.setattr(load, "load_checkpoint", no_weights)  # the tokenizers are compared before
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.chain(2))
    r = runner.invoke(app, [str(a) for a in ("run", "--tree", tree, "--target", pair["target"], "--draft", other,
                                              "--prompts", pair["prompts"], "--results-dir", tmp_path / "res")])
    assert r.exit_code == 2 and "mismatched tokenizers: target target (257 tokens" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "res").exists()


def test_run_threads_sets_the_forwards_threads(pair, tmp_path):
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.chain(2))
    before = torch.get_num_threads()
    try:
        doc = _run(pair["target"], pair["padded"], pair["prompts"], tree, tmp_path / "r", "--threads", "1")
        assert doc["settings"]["threads"] == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_draft_tokenizer_past_its_embedding_is_refused_before_weights_load(pair, tmp_path, monkeypatch):
    small = tmp_path / "small"
    save_hf_checkpoint(random_model(3), byte_tokenizer(), small)
    byte_tokenizer(extra=("<|a|>", "<|b|>")).save(small / "tokenizer.json")  # 259 tokens, 257 rows
    import sequoia_opt.jobs.load as load

    def no_weights(*a, **k):
        raise AssertionError("weights loaded")

    monkeypatch.setattr(load, "load_checkpoint", no_weights)
    with pytest.raises(CheckpointError, match=r"small: tokenizer has 259 tokens but the embedding only 257"):
        load_pair(pair["target"], str(small), device=torch.device("cpu"), dtype=torch.float32)


def test_load_tokenizer_is_kept_per_file_version(tmp_path):
    ckpt = tmp_path / "m"
    save_hf_checkpoint(random_model(3), byte_tokenizer(), ckpt)
    first = load_tokenizer(ckpt)
    assert load_tokenizer(ckpt) is first  # a pair checked before each weights load reads the file once
    byte_tokenizer(extra=("<|a|>",)).save(ckpt / "tokenizer.json")  # a new file version is read again
    again = load_tokenizer(ckpt)
    assert again is not first and again.vocab_size == 258 and first.vocab_size == 257
