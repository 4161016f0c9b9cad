"""SentencePiece GGUF vocabularies (``tokenizer.ggml.model = "llama"``: Llama 2, Mistral v0.1, TinyLlama, CodeLlama)
rebuilt as llama.cpp tokenizes them, compared token for token with llama-cpp-python 0.3.x."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from test_loaders_gguf import gguf_name, randomize, tiny_config  # noqa: E402

from sequoia_opt.cli import app  # noqa: E402
from sequoia_opt.model import Transformer  # noqa: E402
from sequoia_opt.model.gguf_loader import open_gguf, permute_qk, tokenizer_from_gguf  # noqa: E402
from sequoia_opt.errors import CheckpointError  # noqa: E402
from sequoia_opt.model.tokenizer import spm_pieces, spm_tokenizer_from_vocab  # noqa: E402

#: merged tokens (normal, score -position unless tied) of the tiny vocabulary: "ab", "bc", "ca" tie (-5, leftmost
#: pair wins), "<s" + ">" joins into the control token "<s>" (as llama.cpp's merge finds any token), "世界" joins two
#: characters of which "界" is no token
MERGED = ["▁t", "he", "▁the", "in", "▁a", "er", "▁th", "▁▁", "▁▁▁▁", "ing", "▁in", "12", "123", "ab", "bc", "ca",
          "▁hello", "ll", "llo", "hel", "lo", "世界", "▁w", "or", "ld", "▁world", "▁▁▁", "<s", "s>", "▁x"]
TIED = {"ab": -5.0, "bc": -5.0, "ca": -5.0}
CHARS = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:;()<>/|_[]é世"


def spm_vocab() -> tuple[list[str], list[int], list[float]]:
    """(tokens, types, scores): <unk> <s> </s>, the 256 byte tokens, two control and one user-defined token, the
    merged tokens, then single characters (no newline, tab, emoji or "界": those fall back to bytes)."""
    toks, types, scores = ["<unk>", "<s>", "</s>"], [2, 3, 3], [0.0, 0.0, 0.0]
    toks += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    scores += [0.0] * 256
    for t, ty in (("<|im_start|>", 3), ("<|im_end|>", 3), ("[USR]", 4)):
        toks.append(t)
        types.append(ty)
        scores.append(0.0)
    for i, t in enumerate(MERGED):
        toks.append(t)
        types.append(1)
        scores.append(TIED.get(t, -float(i)))
    for i, c in enumerate(CHARS):
        toks.append(c)
        types.append(1)
        scores.append(-100.0 - i)
    return toks, types, scores


def write_spm_gguf(path, *, add_space_prefix: bool | None = None, add_bos: bool | None = None,
                   special_ids: bool = True, template: str | None = None, model=None):
    """A llama GGUF with the tiny SentencePiece vocabulary: metadata only (the hyperparameters llama.cpp's
    ``vocab_only`` load reads), or ``model``'s weights (F32, Q/K rows permuted as llama.cpp's converter does);
    None writes no key (llama.cpp's default applies), ``special_ids`` False writes no BOS / EOS id."""
    toks, types, scores = spm_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    c = model.config if model is not None else None
    w.add_block_count(c.n_layers if c else 1)
    w.add_context_length(c.max_position_embeddings if c else 64)
    w.add_embedding_length(c.dim if c else 16)
    w.add_feed_forward_length(c.intermediate_size if c else 32)
    w.add_head_count(c.n_heads if c else 2)
    w.add_head_count_kv(c.n_kv_heads if c else 2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(c.head_dim if c else 8)
    if c:
        w.add_rope_freq_base(c.rope_theta)
        for name, t in model.state_dict().items():
            if name == "lm_head.weight" and c.tie_embeddings:
                continue
            arr = t.detach().float().numpy().copy()
            if ".q_proj." in name:
                arr = permute_qk(arr, c.n_heads)
            elif ".k_proj." in name:
                arr = permute_qk(arr, c.n_kv_heads)
            w.add_tensor(gguf_name(name), arr.astype(np.float32))
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_scores(scores)
    if special_ids:
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


TEXTS = [
    "the hello world", "hello", " the", "the ", "  two  spaces ", "   ", " ", "a\nb\tc", "line one\nline two\n",
    "\n\nthe", "\ttab", "12345 123 12", "0.5, 3.14!", "abc", "cab", "xabcab", "世界 世 界", "😀 é", "émoji 😀😀",
    "日本語のテキスト", "Hello World", "the  the   the    the", "in ing ring thin", "it's (a) test: yes/no",
    "a<s", "a<s b", "[USR]the", "x[USR] [USR]", "Привет мир", "mixed 世界😀 and\r\nCRLF", "    indent",
]
SPECIAL_TEXTS = ["<|im_start|>hi<|im_end|>x", "<s>the</s>", "</s> a", "<s>the", "</s>", "x<|im_end|>\n<|im_start|>the", "<unk>a"]


def _llama(path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(str(path), vocab_only=True, verbose=False)


def test_spm_pieces_merge_the_best_scored_pair_first_and_leftmost_on_ties():
    s = {"ab": -5.0, "bc": -5.0, "ca": -5.0, "▁a": -4.0}
    assert spm_pieces("abc", s) == ["ab", "c"]  # ab and bc tie: the leftmost...
    assert spm_pieces("cab", s) == ["ca", "b"]  # ...so ca, left of ab, wins though a merge list would rank it last
    assert spm_pieces("▁abc", s) == ["▁a", "bc"]  # the best score first wherever it is
    assert spm_pieces("abc", {**s, "abc": -9.0}) == ["abc"]  # a joined pair joins on, whatever its score
    assert spm_pieces("xyz", {"yz": -1.0, "xyz": -2.0}) == ["xyz"]  # "xy" is no token: x + yz
    assert spm_pieces("", s) == []


def test_spm_gguf_encodes_as_llama_cpp_hard_coded(tmp_path):
    """The values llama-cpp-python 0.3.36 gives (``tokenize(text.encode(), add_bos=True, special=False)``)."""
    tok = tokenizer_from_gguf(open_gguf(write_spm_gguf(tmp_path / "v.gguf")))
    toks = spm_vocab()[0]
    names = lambda text: [toks[i] for i in tok.encode(text)]  # noqa: E731
    assert names("the hello world") == ["<s>", "▁the", "▁", "he", "llo", "▁w", "or", "ld"]
    assert names(" the") == ["<s>", "▁", "▁the"]
    assert names("") == ["<s>"]
    assert names("a\nb\tc") == ["<s>", "▁a", "<0x0A>", "b", "<0x09>", "c"]
    assert names("世界 世 界") == ["<s>", "▁", "世界", "▁", "世", "▁", "<0xE7>", "<0x95>", "<0x8C>"]
    assert names("<|im_start|>hi<|im_end|>x") == ["<s>", "<|im_start|>", "▁", "h", "i", "<|im_end|>", "▁x"]
    assert names("[USR]the") == ["<s>", "[USR]", "▁the"]
    assert tok.bos_id == 1 and tok.eos_id == 2 and tok.eos_ids == {2, toks.index("<|im_end|>")}


@pytest.mark.parametrize("space, bos", [(None, None), (False, None), (True, False)])
def test_spm_gguf_encodes_token_for_token_as_llama_cpp(tmp_path, space, bos):
    path = write_spm_gguf(tmp_path / "v.gguf", add_space_prefix=space, add_bos=bos)
    llm = _llama(path)
    tok = tokenizer_from_gguf(open_gguf(path))
    for text in TEXTS:  # no control token in these: treeopt's "always parse specials" reads them as llama.cpp's off
        assert tok.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=False), text
    for text in SPECIAL_TEXTS:
        assert tok.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True), text


def test_spm_gguf_decodes_as_llama_cpp_and_round_trips(tmp_path):
    import ctypes

    path = write_spm_gguf(tmp_path / "v.gguf")
    llm = _llama(path)
    import llama_cpp

    def unparsed(ids):  # llama.cpp's own llama_detokenize, special tokens written (unparse_special)
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_detokenize(llm._model.vocab, (llama_cpp.llama_token * len(ids))(*ids), len(ids), buf,
                                       4096, False, True)
        return buf.raw[:n].decode()

    tok = tokenizer_from_gguf(open_gguf(path))
    for text in TEXTS + SPECIAL_TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids, skip_special=True) == llm.detokenize(ids).decode(), text  # BOS and its space dropped
        assert tok.decode(ids) == unparsed(ids), text
        assert tok.decode(ids[1:]) == unparsed(ids[1:]), text
        if text in TEXTS and "<s" not in text and "[USR]" not in text:  # as llama.cpp: a merged "<s>" decodes to
            # nothing, a space follows a user-defined token
            assert tok.decode(ids, skip_special=True) == text


def test_spm_gguf_defaults_where_the_file_is_silent(tmp_path):
    path = write_spm_gguf(tmp_path / "v.gguf", special_ids=False, template="{{ bos_token }}{{ messages[0]['content'] }}")
    tok = tokenizer_from_gguf(open_gguf(path))
    assert (tok.bos_id, tok.eos_id) == (1, 2)  # llama.cpp's SPM defaults
    assert tok.encode("the") == [1, spm_vocab()[0].index("▁the")]
    assert tok.encode_chat([{"role": "user", "content": "the"}]) == [1, spm_vocab()[0].index("▁the")]
    if pytest.importorskip("llama_cpp"):
        llm = _llama(path)
        assert (llm.token_bos(), llm.token_eos()) == (1, 2)


def test_run_on_a_sentencepiece_gguf_pair_is_greedy_exact(tmp_path):
    """treeopt run -t spm.gguf --draft spm-draft.gguf: refused before ('unsupported GGUF tokenizer model llama');
    now the bundled decoder runs it, tree decoding token for token equal to plain, the prompts tokenized as
    llama.cpp tokenizes them."""
    n = len(spm_vocab()[0])
    target = randomize(Transformer(tiny_config(vocab_size=n)), 0)
    draft = Transformer(tiny_config(vocab_size=n))
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in draft.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    t_path = write_spm_gguf(tmp_path / "t.gguf", model=target)
    d_path = write_spm_gguf(tmp_path / "d.gguf", model=draft)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["the hello world", "世界 😀 in ing"]))
    (tmp_path / "chain.json").write_text(json.dumps([[0], [0, 0], [0, 0, 0]]))
    r = CliRunner().invoke(app, ["run", "--tree", str(tmp_path / "chain.json"), "-t", str(t_path), "--draft",
                                 str(d_path), "--prompts", str(prompts), "--max-new-tokens", "12",
                                 "--results-dir", str(tmp_path / "res"), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is True
    assert [s["new_tokens"] for s in doc["summaries"]] == [24, 24]


def write_hostile_spm_gguf(path, *, tokens=None, types="keep", scores="keep", bos=1, extra=()):
    """The metadata-only tiny SPM GGUF with one key replaced: ``tokens`` / ``types`` / ``scores`` a list (written
    with the element type numpy gives it) or None (no key; "keep": the tiny vocabulary's), ``bos`` an id written
    as uint32, ``extra`` (key, value, GGUFValueType) written as given."""
    toks, ty0, s0 = spm_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    for add, v in ((w.add_block_count, 1), (w.add_context_length, 64), (w.add_embedding_length, 16),
                   (w.add_feed_forward_length, 32), (w.add_head_count, 2), (w.add_head_count_kv, 2),
                   (w.add_layer_norm_rms_eps, 1e-5), (w.add_rope_dimension_count, 8)):
        add(v)
    w.add_tokenizer_model("llama")
    w.add_array("tokenizer.ggml.tokens", toks if tokens is None else tokens)
    for key, value, kept in (("token_type", types, ty0), ("scores", scores, s0)):
        if value is not None:
            w.add_array(f"tokenizer.ggml.{key}", kept if value == "keep" else value)
    w.add_uint32("tokenizer.ggml.bos_token_id", bos)
    for key, value, vtype in extra:
        w.add_key_value(key, value, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


_N = len(spm_vocab()[0])
_S = spm_vocab()[2]
_NO_BYTES = [i for i, t in enumerate(spm_vocab()[0]) if not t.startswith("<0x")]
HOSTILE = {  # case -> (writer arguments, the key named, what the one line says)
    "int scores": (dict(scores=[int(s) for s in _S]), "tokenizer.ggml.scores", "array of int32"),
    "string scores": (dict(scores=["a"] * _N), "tokenizer.ggml.scores", "array of string"),
    "NaN score": (dict(scores=[float("nan")] + _S[1:]), "tokenizer.ggml.scores", "NaN"),
    "short scores": (dict(scores=_S[:-1]), "tokenizer.ggml.scores", f"{_N - 1} entries for {_N} tokens"),
    "short token_type": (dict(types=spm_vocab()[1][:-1]), "tokenizer.ggml.token_type", "entries"),
    "float token_type": (dict(types=[float(t) for t in spm_vocab()[1]]), "tokenizer.ggml.token_type", "float32"),
    "BOS out of range": (dict(bos=_N + 5), "tokenizer.ggml.bos_token_id", f"= {_N + 5} is outside"),
    "EOS out of range": (dict(extra=[("tokenizer.ggml.eos_token_id", _N, gguf.GGUFValueType.UINT32)]),
                         "tokenizer.ggml.eos_token_id", "outside"),
    "EOT a string": (dict(extra=[("tokenizer.ggml.eot_token_id", "x", gguf.GGUFValueType.STRING)]),
                     "tokenizer.ggml.eot_token_id", "uint32"),
    "EOS an int32": (dict(extra=[("tokenizer.ggml.eos_token_id", -1, gguf.GGUFValueType.INT32)]),
                     "tokenizer.ggml.eos_token_id", "got int32"),
    "repeated token": (dict(tokens=spm_vocab()[0][:-1] + ["é"]), "tokenizer.ggml.tokens", "repeats the token 'é'"),
    "no byte tokens": (dict(tokens=[spm_vocab()[0][i] for i in _NO_BYTES], types=[spm_vocab()[1][i] for i in _NO_BYTES],
                            scores=[_S[i] for i in _NO_BYTES]), "tokenizer.ggml.tokens", "<0x00>"),
    "int tokens": (dict(tokens=list(range(_N))), "tokenizer.ggml.tokens", "array of strings"),
    "add_space_prefix a string": (dict(extra=[("tokenizer.ggml.add_space_prefix", "false", gguf.GGUFValueType.STRING)]),
                                  "tokenizer.ggml.add_space_prefix", "must be a bool"),
    "add_bos_token a uint32": (dict(extra=[("tokenizer.ggml.add_bos_token", 0, gguf.GGUFValueType.UINT32)]),
                               "tokenizer.ggml.add_bos_token", "must be a bool"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_spm_gguf_is_one_error_line_naming_the_key(tmp_path, case):
    """Each was a traceback (IndexError, ValueError, TypeError), a message naming no key, or a silent tokenization
    llama.cpp does not make: bool("false") is True, int scores (llama.cpp reinterprets their bytes as float32),
    a short token-type list, a vocabulary without byte tokens encoding "界" as <unk> where llama.cpp aborts."""
    kwargs, key, says = HOSTILE[case]
    path = write_hostile_spm_gguf(tmp_path / "bad.gguf", **kwargs)
    with pytest.raises(CheckpointError) as err:
        tokenizer_from_gguf(open_gguf(path))
    assert key in str(err.value) and says in str(err.value), str(err.value)


def test_hostile_spm_gguf_run_exits_2_naming_file_and_key(tmp_path):
    path = write_hostile_spm_gguf(tmp_path / "bad.gguf", bos=_N + 5)
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "the"}) + "\n")
    (tmp_path / "chain.json").write_text("[[0]]")
    r = CliRunner().invoke(app, ["run", "-t", str(path), "--tree", str(tmp_path / "chain.json"), "--prompts",
                                 str(tmp_path / "p.jsonl")])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines() == [f"error: {path}: GGUF tokenizer.ggml.bos_token_id = {_N + 5} is outside "
                                              f"the {_N} tokens"]


def test_spm_tokenizer_from_vocab_refuses_a_special_id_outside_the_tokens():
    toks, types, scores = spm_vocab()
    for bos in (len(toks), -1):  # IndexError before; -1 silently made the last token BOS
        with pytest.raises(CheckpointError, match="BOS id"):
            spm_tokenizer_from_vocab(toks, scores, token_types=types, bos_id=bos)


def test_export_draft_of_a_sentencepiece_gguf_is_one_line_naming_sentencepiece(tmp_path):
    """It said "cannot name this tokenizer's pre-tokenizer (None) for llama.cpp": true of the BPE writer, no word of
    why. Now one line, exit 2, naming the SentencePiece vocabulary; nothing written."""
    n = len(spm_vocab()[0])
    src = write_spm_gguf(tmp_path / "t.gguf", model=randomize(Transformer(tiny_config(vocab_size=n)), 0))
    out = tmp_path / "out.gguf"
    r = CliRunner().invoke(app, ["export-draft", "--draft", str(src), "--gguf", str(out), "--no-check"])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines() == [
        "error: the tokenizer is SentencePiece (GGUF tokenizer.ggml.model 'llama'); the GGUF writer writes byte-level "
        "BPE ('gpt2') vocabularies only: use a SentencePiece .gguf draft as is"]
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["t.gguf"]
