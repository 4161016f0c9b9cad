"""Prompt files for profiling and evaluation.

Two formats:

* ``.jsonl``: one JSON object per line, either a raw-text prompt, ``{"prompt": "..."}`` (or ``"text"``), or a
  chat prompt, ``{"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}``, rendered
  with the target's own chat template (:mod:`sequoia_opt.model.chat_template`) and ending where the
  assistant's reply starts. Other keys are kept as metadata (e.g. ``"source"``). Blank lines are ignored.
* ``.json``: one JSON array whose items are prompt strings or objects as on a ``.jsonl`` line.
* ``.csv`` / ``.tsv``: a header row naming a ``prompt`` (or ``text``) column, one raw-text prompt per row (a
  quoted field may span lines); the other columns are kept as metadata. A row whose every field is blank (an empty
  line, a spreadsheet's empty row, a lone ``""``) is skipped; a row with its prompt blank and another field filled
  is refused.
* anything else: plain text, prompts separated by one or more blank lines (a line of spaces or tabs is blank).

A UTF-8 byte-order mark at the start of a file is skipped (editors on Windows write one).

:func:`encode_prompts` turns prompts into token ids for a target (raw text encoded as is, chat prompts
rendered first); every command that reads a prompt file goes through it.

The demo pair ships three disjoint sets under ``sequoia_opt/data/prompts/``: ``profile.jsonl`` (Python
source, used to measure acceptance), ``eval.jsonl`` (Python source, what ``treeopt run`` evaluates on) and
``chat.jsonl`` (chat prompts: instructions about code, written for this project), so the acceptance vector
is never measured on the prompts the prediction is checked against.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from ._io import load_json, read_text_file
from .errors import TreeoptError

#: The shipped demo prompt sets (:func:`demo_prompts_path`).
DEMO_SPLITS: tuple[str, ...] = ("profile", "eval", "chat")


class PromptFileError(TreeoptError):
    """A prompt file is missing, empty or malformed."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: raw ``text``, or a conversation ``messages`` (each ``{"role": str, "content": str}``;
    ``text`` is then empty: the text depends on the target's chat template, see :func:`encode_prompts`), and
    whatever metadata the file gave (``source``, ...). ``origin`` is ``path:line`` for a JSONL prompt."""

    text: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    messages: tuple[dict[str, str], ...] | None = field(default=None, hash=False)
    origin: str | None = field(default=None, compare=False)

    @property
    def is_chat(self) -> bool:
        """True for a chat prompt (``messages``)."""
        return self.messages is not None


def _parse_messages(value: Any, where: str) -> tuple[dict[str, str], ...]:
    """A JSONL line's ``messages``: a non-empty list of ``{"role": str, "content": str}`` objects.

    Raises:
        PromptFileError: any other shape, naming the line and the message.
    """
    if not isinstance(value, list) or not value:
        raise PromptFileError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise PromptFileError(f"{where}: message {i} must be an object with 'role' and 'content'")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role.strip():
            raise PromptFileError(f"{where}: message {i} needs a non-empty 'role' string")
        if not isinstance(content, str):
            raise PromptFileError(f"{where}: message {i} ({role}) needs a 'content' string "
                                  f"(got {type(content).__name__}; text only)")
        out.append({**m, "role": role, "content": content})
    return tuple(out)


#: The roles chat templates render (OpenAI's chat format and the tool roles of Llama 3 / Qwen templates).
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer", "ipython", "function")


def _prompt(obj: Any, where: str, *, in_array: bool = False) -> Prompt:
    """One prompt object of a ``.jsonl`` line or a ``.json`` array item (module docstring); ``where`` names it.

    Raises:
        PromptFileError: not an object, both 'prompt' (or 'text') and 'messages', both 'prompt' and 'text', no
            non-empty prompt string, malformed messages.
    """
    if not isinstance(obj, dict):
        hint = ("a prompt string or " if in_array else "") + "a JSON object with a 'prompt' string or 'messages'"
        if isinstance(obj, list) and not in_array:
            hint += " (a JSON array of prompts is a .json file)"
        raise PromptFileError(f"{where}: expected {hint}")
    meta = {k: v for k, v in obj.items() if k not in ("prompt", "text", "messages")}
    unit = "an item" if in_array else "a line"
    if "messages" in obj:
        if "prompt" in obj or "text" in obj:
            raise PromptFileError(f"{where}: {unit} holds a 'prompt' or 'messages', not both")
        messages = _parse_messages(obj["messages"], where)
        for m in messages:
            _check_unicode(m["content"], where)
        return Prompt("", meta, messages, where)
    if "prompt" in obj and "text" in obj:  # 'text' is another name for 'prompt': which one is meant?
        raise PromptFileError(f"{where}: {unit} holds a 'prompt' or a 'text' (the same field), not both")
    body = obj.get("prompt", obj.get("text"))
    if not isinstance(body, str) or not body.strip():
        got = "" if body is None else f" (got {body!r}: " + (
            "whitespace only)" if isinstance(body, str) and body else "empty)" if body == "" else "not a string)")
        raise PromptFileError(f"{where}: needs a 'prompt' (or 'text') string with something besides whitespace, "
                              f"or 'messages'{got}")
    _check_unicode(body, where)
    return Prompt(body, meta, origin=where)


def _check_unicode(text: str, where: str) -> None:
    """Refuse a string that is not text (JSON's ``\\ud800``, a lone surrogate, decodes to a str that no tokenizer
    takes; the tokenizer raised a TypeError after the models had loaded)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise PromptFileError(f"{where}: the prompt holds {text[err.start:err.end]!r} at character {err.start}, a "
                              "lone UTF-16 surrogate (an escape such as \\ud800 without its pair): not text") from None


def load_prompts(path: str | Path, *, limit: int | None = None) -> list[Prompt]:
    """Read a prompt file (see module docstring). Returns at most ``limit`` prompts (all when None).

    Raises:
        PromptFileError: missing/unreadable file, invalid JSON on a line (with its line number), a line (or a
            ``.json`` array item) without a non-empty ``prompt`` string or a well-formed ``messages`` list, a line
            with both, a ``.json`` file that is not an array, or no prompts at all.
    """
    if limit is not None and limit < 1:
        raise PromptFileError(f"the number of prompts must be at least 1, got {limit}")
    path = Path(path)
    text = read_text_file(path, error=PromptFileError, what="prompt file")
    prompts: list[Prompt] = []
    suffix = path.suffix.lower()  # prompts.JSONL as prompts.jsonl
    if suffix == ".jsonl":
        # lines end at "\n" alone (read_text_file made every line end one): str.splitlines also breaks at
        # U+2028, U+0085 and other characters a JSON string holds raw (json.dumps(..., ensure_ascii=False))
        for lineno, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                obj = load_json(line)
            except ValueError as err:  # JSONDecodeError, or an integer past Python's 4300 digits
                raise PromptFileError(f"{path}:{lineno}: not valid JSON ({getattr(err, 'msg', err)})") from None
            prompts.append(_prompt(obj, f"{path}:{lineno}"))
    elif suffix == ".json":  # one JSON array: each item a string or an object as a .jsonl line
        try:
            doc = load_json(text)
        except json.JSONDecodeError as err:
            hint = " (one JSON object per line is a .jsonl file)" if err.msg == "Extra data" else ""
            raise PromptFileError(f"{path}:{err.lineno}: not valid JSON ({err.msg}){hint}") from None
        except ValueError as err:  # an integer past Python's 4300 digits
            raise PromptFileError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(doc, list):
            raise PromptFileError(f"{path}: expected a JSON array of prompts (strings, or objects with a 'prompt' "
                                  "string or 'messages'); one object per line is a .jsonl file")
        prompts = [_prompt({"prompt": obj} if isinstance(obj, str) else obj, f"{path}[{i}]", in_array=True)
                   for i, obj in enumerate(doc)]
    elif suffix in (".csv", ".tsv"):  # a spreadsheet's export: read by its header, not as one text prompt
        prompts = _table_prompts(text, path, "\t" if suffix == ".tsv" else ",")
    else:  # a blank line holds nothing but spaces or tabs (an editor's indentation left on it is still blank)
        for block in re.split(r"\n(?:[ \t]*\n)+", "\n" + text):  # "\n" first: blank lines at its start too
            if block.strip():
                prompts.append(Prompt(block.strip("\n")))
    if not prompts:
        raise PromptFileError(f"prompt file {path} holds no prompts")
    prompts = prompts[:limit] if limit is not None else prompts
    _warn_unknown_roles(prompts, path)
    _warn_repeats(prompts, path)
    return prompts


def _warn_repeats(prompts: Sequence[Prompt], path: Path) -> None:
    """One :class:`~sequoia_opt.errors.ProfileWarning` when prompts repeat earlier ones: each is decoded as its
    own request, but the intervals between prompts (acceptance, tokens/step) take them as independent draws, so
    a file of copies reads as far surer than it is (3 copies: an interval of width 0)."""
    import warnings

    from .errors import ProfileWarning

    seen: dict[str, int] = {}
    repeats: list[tuple[int, int]] = []  # (index, index of its first copy)
    for i, p in enumerate(prompts):
        key = p.text if p.messages is None else json.dumps(p.messages, sort_keys=True)
        j = seen.setdefault(key, i)
        if j != i:
            repeats.append((i, j))
    if repeats:
        where = ", ".join(f"{prompts[i].origin or f'prompt {i + 1}'} (= {prompts[j].origin or f'prompt {j + 1}'})"
                          for i, j in repeats[:3]) + (", ..." if len(repeats) > 3 else "")
        warnings.warn(f"{path}: {len(repeats)} of {len(prompts)} prompts repeat earlier ones ({where}): each is "
                      "decoded again, and the intervals between prompts count the copies as independent prompts",
                      ProfileWarning, stacklevel=3)


def _warn_unknown_roles(prompts: Sequence[Prompt], path: Path) -> None:
    """One :class:`~sequoia_opt.errors.ProfileWarning` per role of the chat prompts that no chat template knows
    (:data:`CHAT_ROLES`): a template renders what it is given, a typo ("usr") included, and some refuse a role
    they do not know; refused here it would break templates with roles of their own."""
    import warnings

    from .errors import ProfileWarning

    unknown: dict[str, int] = {}
    for p in prompts:
        for m in p.messages or ():
            if m["role"] not in CHAT_ROLES:
                unknown[m["role"]] = unknown.get(m["role"], 0) + 1
    for role, n in unknown.items():
        warnings.warn(f"{path}: {n} message{'s' if n > 1 else ''} with the role {role!r}, none of the roles chat "
                      f"templates know ({', '.join(CHAT_ROLES)}): passed to the template as given (a template may "
                      "refuse it)", ProfileWarning, stacklevel=3)


def _table_prompts(text: str, path: Path, delimiter: str) -> list[Prompt]:
    """The prompts of a ``.csv`` / ``.tsv`` file (module docstring): each row's ``prompt`` (or ``text``) field, a
    row named ``path:<line>`` by the line it starts on.

    Raises:
        PromptFileError: a header without a ``prompt`` or ``text`` column (or with both), a malformed row (a stray
            quote, a field past the csv module's limit), a row with another number of fields than the header, an
            empty prompt field.
    """
    import csv
    import io

    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    rows: list[tuple[int, list[str]]] = []  # (the line a row starts on, its fields), blank rows skipped
    limit = csv.field_size_limit(max(csv.field_size_limit(), len(text)))  # a long prompt is one field, as in .jsonl
    try:
        while True:
            start = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as err:  # a stray or unclosed quote
                raise PromptFileError(f"{path}:{start}: not a {path.suffix[1:].upper()} row ({err})") from None
            if any(f.strip() for f in row):  # an empty or blank-looking line is no row
                rows.append((start, row))
    finally:
        csv.field_size_limit(limit)  # the module-wide limit as it was (T(b, n) tables keep theirs)
    if not rows:
        return []
    head = [h.strip().lower() for h in rows[0][1]]
    cols = [c for c in ("prompt", "text") if c in head]
    twice = sorted({h for h in head if h and head.count(h) > 1})
    if len(cols) != 1 or twice:
        got = ", ".join(repr(h) for h in head)
        other = {",": ";", "\t": ","}.get(delimiter)
        hint = (" (both: which one is the prompt?)" if len(cols) == 2 else
                f" (column {twice[0]!r} twice: which one is meant?)" if twice else
                f" (is it {other!r}-separated? {path.suffix} files are {delimiter!r}-separated)"
                if len(head) == 1 and other and other in head[0] else "")
        raise PromptFileError(f"{path}:{rows[0][0]}: the header needs one 'prompt' (or 'text') column, got {got}"
                              + hint)
    at = head.index(cols[0])
    prompts = []
    for line, row in rows[1:]:
        where = f"{path}:{line}"
        if len(row) != len(head):
            raise PromptFileError(f"{where}: {len(row)} field{'s' if len(row) != 1 else ''}, the header has "
                                  f"{len(head)}")
        body = row[at]
        if not body.strip():
            raise PromptFileError(f"{where}: the {cols[0]!r} field is empty or whitespace only")
        _check_unicode(body, where)
        meta = {h: v for h, v in zip(head, row) if h != cols[0] and h}
        prompts.append(Prompt(body, meta, origin=where))
    return prompts


def encode_prompts(prompts: Sequence[Prompt], tokenizer, *, model: str = "the target") -> list[list[int]]:
    """Token ids for each prompt, for ``tokenizer``'s model: raw text with ``tokenizer.encode``; a chat
    prompt rendered with the model's chat template (``tokenizer.encode_chat``: the assistant turn opened,
    special tokens as the template writes them).

    Args:
        prompts: from :func:`load_prompts`.
        tokenizer: a :class:`~sequoia_opt.model.tokenizer.Tokenizer` (its ``chat_template`` is the model's).
        model: the model's name, for error messages.

    Returns:
        One list of token ids per prompt.

    Raises:
        PromptFileError: chat prompts for a model without a chat template, or a template that refuses a
            conversation (naming the prompt's file and line).
    """
    return _per_prompt(prompts, tokenizer, model, tokenizer.encode, tokenizer.encode_chat)


def prompt_texts(prompts: Sequence[Prompt], tokenizer, *, model: str = "the target") -> list[str]:
    """Each prompt's text for ``tokenizer``'s model: raw text as given; a chat prompt rendered with the model's
    chat template (``tokenizer.render_chat``: the assistant turn opened, BOS and control tokens written as text),
    for an engine that tokenizes text itself (llama.cpp, special tokens in the text parsed, as llama-server
    tokenizes a rendered chat).

    Args:
        prompts: from :func:`load_prompts`.
        tokenizer: a :class:`~sequoia_opt.model.tokenizer.Tokenizer` with the model's ``chat_template``, read only
            for chat prompts (None serves raw prompts alone).
        model: the model's name, for error messages.

    Returns:
        One string per prompt.

    Raises:
        PromptFileError: as :func:`encode_prompts`.
    """
    return _per_prompt(prompts, tokenizer, model, lambda text: text,
                       lambda m: tokenizer.render_chat(m))


def _per_prompt(prompts: Sequence[Prompt], tokenizer, model: str, raw, chat) -> list:
    """``raw(text)`` of each raw prompt and ``chat(messages)`` of each chat prompt, in order, after the refusals of
    :func:`encode_prompts` (a model without a chat template, a template refusing a conversation)."""
    from .model.chat_template import ChatTemplateError

    chats = [p for p in prompts if p.is_chat]
    if chats and getattr(tokenizer, "chat_template", None) is None:
        where = (chats[0].origin or "the prompts").rsplit(":", 1)[0]
        raise PromptFileError(f"{where} holds chat prompts ('messages') but {model} has no chat template "
                              "(tokenizer.chat_template in a GGUF, chat_template in tokenizer_config.json); give "
                              "raw 'prompt' lines")
    out = []
    for p in prompts:
        if not p.is_chat:
            out.append(raw(p.text))
            continue
        try:
            out.append(chat(p.messages))
        except ChatTemplateError as err:
            raise PromptFileError(f"{p.origin or 'chat prompt'}: {model}: {err}") from None
    return out


def recorded_prompts_path(recorded: str | Path | None) -> Path | None:
    """The prompt file a profile records (an acceptance profile's ``measured.prompts``) as a file on this machine:
    the recorded path where it exists, else the shipped demo set of the same name (a profile measured in another
    checkout, e.g. ``sequoia_opt/data/prompts/profile.jsonl``), else None (the user's file is not here).

    Never raises: a profile's prompts are looked for, not required.
    """
    if not recorded:
        return None
    path = Path(str(recorded))
    if path.is_file():
        return path
    if path.suffix == ".jsonl" and path.stem in DEMO_SPLITS and path.parent.parts[-3:] == ("sequoia_opt", "data",
                                                                                         "prompts"):
        shipped = demo_prompts_path(path.stem)
        return shipped if shipped.is_file() else None
    return None


def demo_prompts_path(split: str) -> Path:
    """Path of a shipped demo prompt set: ``split`` is one of :data:`DEMO_SPLITS` (``"profile"``, ``"eval"``:
    Python source; ``"chat"``: chat prompts about code).

    Raises PromptFileError for another split name.
    """
    if split not in DEMO_SPLITS:
        raise PromptFileError(f"unknown prompt split {split!r}; the demo ships " +
                              ", ".join(repr(s) for s in DEMO_SPLITS))
    return Path(str(resources.files("sequoia_opt") / "data" / "prompts" / f"{split}.jsonl"))
