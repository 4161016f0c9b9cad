"""The tokenizer a model pair shares: a thin wrapper over a Hugging Face ``tokenizers.Tokenizer``.

It adds what decoding needs and ``tokenizer.json`` does not carry: the BOS id, the set of ids that end
generation (EOS plus end-of-turn tokens such as ``<|im_end|>``), the model's chat template (rendered by
:mod:`.chat_template`), a cheap :meth:`Tokenizer.fingerprint` (a label of the vocabulary), and
:meth:`Tokenizer.first_difference`, by which a draft whose tokenizer is not the target's is refused before any
weights load.

Sources: Hugging Face ``tokenizers`` (BPE model, ByteLevel pre-tokenizer/decoder); the HF
``tokenizer_config.json`` convention for ``bos_token`` / ``eos_token``; llama.cpp's ``llm_tokenizer_spm``
(``llama-vocab.cpp``) for the SentencePiece merge of :func:`spm_pieces`, checked against llama-cpp-python 0.3.36.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
from pathlib import Path
from typing import Iterable

import tokenizers

from .._io import atomic_write_text, read_json_object, read_text_file
from ..errors import CheckpointError

#: Token strings that end a turn or a document in common Llama-family vocabularies; any present in a
#: vocabulary join :attr:`Tokenizer.eos_ids` (Qwen2/SmolLM ChatML, Llama 3, Llama 2 / Mistral, Gemma-style).
END_TOKEN_NAMES: tuple[str, ...] = (
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>", "<end_of_turn>",
    "<|end|>",
)
#: BOS candidates, tried in order when nothing names the BOS token explicitly.
BOS_TOKEN_NAMES: tuple[str, ...] = ("<|begin_of_text|>", "<s>", "<|startoftext|>")

_CONFIG_NAME = "tokenizer_config.json"
_TEMPLATE_FILE = "chat_template.jinja"


def _token_content(value) -> str | None:
    """A token from ``tokenizer_config.json``: a string, or an AddedToken dict ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _config_chat_template(value, where: Path) -> str | None:
    """``tokenizer_config.json``'s ``chat_template``: a string, or a list of ``{"name", "template"}`` entries
    (transformers' named templates) of which ``"default"`` is the one used. None when absent.

    Raises:
        CheckpointError: any other shape, or a list without a ``"default"`` entry.
    """
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, list):
        named = {e.get("name"): e.get("template") for e in value if isinstance(e, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
        raise CheckpointError(f"{where}: chat_template lists templates {sorted(map(str, named))} but none named "
                              "'default'")
    raise CheckpointError(f"{where}: chat_template must be a string or a list of named templates, "
                          f"got {type(value).__name__}")


class Tokenizer:
    """Text <-> token ids for one vocabulary.

    Args:
        tok: the wrapped ``tokenizers.Tokenizer`` (its post-processor decides whether BOS is prepended).
        bos_id: the BOS id, or None when the vocabulary has none.
        eos_ids: ids that end generation; when None, inferred as every token of :data:`END_TOKEN_NAMES`
            present in the vocabulary. ``eos_id`` (the primary one) is always included.
        eos_id: the primary EOS id (what a writer stores as ``eos_token``); default: the smallest of
            ``eos_ids``.
        chat_template: the model's chat template (Jinja source), or None when it has none.

    Raises:
        CheckpointError: an id outside the vocabulary.
    """

    def __init__(self, tok: tokenizers.Tokenizer, *, bos_id: int | None = None,
                 eos_ids: Iterable[int] | None = None, eos_id: int | None = None,
                 chat_template: str | None = None) -> None:
        self._tok = tok
        n = self.vocab_size
        if eos_ids is None:
            eos_ids = [i for i in (tok.token_to_id(t) for t in END_TOKEN_NAMES) if i is not None]
        ids = set(int(i) for i in eos_ids)
        if eos_id is not None:
            ids.add(int(eos_id))
        for i in ids | ({bos_id} if bos_id is not None else set()):
            if not 0 <= i < n:
                raise CheckpointError(f"special token id {i} is outside the vocabulary of {n} tokens")
        self.bos_id: int | None = None if bos_id is None else int(bos_id)
        self.eos_ids: frozenset[int] = frozenset(ids)
        self.eos_id: int | None = int(eos_id) if eos_id is not None else (min(ids) if ids else None)
        self.chat_template: str | None = chat_template or None

    # -- text <-> ids -------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids for ``text``. Special tokens written in the text (``<|im_start|>``) map to their single
        ids; BOS is prepended only when the tokenizer's post-processor says so (Llama 3 does, SmolLM2 not)."""
        return list(self._tok.encode(text, add_special_tokens=True).ids)

    def render_chat(self, messages, *, add_generation_prompt: bool = True) -> str:
        """The text of a conversation (a list of ``{"role", "content"}`` mappings) in this model's chat
        template, as transformers' ``apply_chat_template(..., tokenize=False)`` renders it (BOS and EOS as
        ``bos_token`` / ``eos_token``; see :mod:`.chat_template`).

        Raises:
            ChatTemplateError: the model has no chat template, or the template does not parse or refuses the
                conversation.
        """
        from .chat_template import ChatTemplateError, render_chat

        if self.chat_template is None:
            raise ChatTemplateError("the model has no chat template (no tokenizer.chat_template in its GGUF, no "
                                    "chat_template in its tokenizer_config.json)")
        return render_chat(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                           bos_token=None if self.bos_id is None else self.id_to_token(self.bos_id),
                           eos_token=None if self.eos_id is None else self.id_to_token(self.eos_id))

    def encode_chat(self, messages, *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of :meth:`render_chat`'s text, encoded without adding special tokens (the template
        writes the ones the model expects; transformers encodes with ``add_special_tokens=False``).

        Raises:
            ChatTemplateError: as :meth:`render_chat`.
        """
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt)
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text for ``ids``; special tokens are kept unless ``skip_special``."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        """The id of one token string (vocabulary form, e.g. ``"Ġthe"``), or None."""
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        """The token string of id ``i`` (vocabulary form, e.g. ``"Ġthe"``), or None when ``i`` is not in
        the vocabulary."""
        return self._tok.id_to_token(int(i))

    @property
    def vocab_size(self) -> int:
        """Tokens in the vocabulary, added/special tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    def fingerprint(self) -> str:
        """16 hex digits of SHA-256 over the vocabulary (every ``(id, token)`` pair, in id order).

        Two tokenizers with the same fingerprint map every id to the same token string (a pair is compared by
        :meth:`first_difference`, which lets one vocabulary extend the other); pre-tokenization and special-token
        ids are not part of it.
        """
        vocab = self._tok.get_vocab(with_added_tokens=True)
        items = sorted((i, t) for t, i in vocab.items())
        h = hashlib.sha256(json.dumps(items, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        return h.hexdigest()[:16]

    def first_difference(self, other: "Tokenizer") -> int | None:
        """The first id below both vocabulary sizes that the two tokenizers map to different token strings, or
        None when they agree on every such id (what a draft must share with its target: a padded or extended
        vocabulary differs only past the shorter one; llama.cpp's ``common_speculative_are_compatible`` compares
        the same range)."""
        mine, theirs = self._tok.get_vocab(with_added_tokens=True), other._tok.get_vocab(with_added_tokens=True)
        n = min(self.vocab_size, other.vocab_size)
        a, b = [None] * n, [None] * n
        for t, i in mine.items():
            if i < n:
                a[i] = t
        for t, i in theirs.items():
            if i < n:
                b[i] = t
        return next((i for i in range(n) if a[i] != b[i]), None)

    # -- files --------------------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike, *, bos_id: int | None = None,
                  eos_ids: Iterable[int] | None = None) -> "Tokenizer":
        """Read a ``tokenizer.json``; BOS/EOS come from the arguments, else from a ``tokenizer_config.json``
        next to it (HF keys ``bos_token``, ``eos_token``, and treeopt's ``eos_tokens`` list), else from
        :data:`BOS_TOKEN_NAMES` / :data:`END_TOKEN_NAMES`. The chat template comes from a
        ``chat_template.jinja`` next to it, else from ``tokenizer_config.json``'s ``chat_template`` (as
        transformers reads them).

        Raises:
            CheckpointError: a missing or unreadable file, a ``chat_template`` of another shape.
        """
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"tokenizer file not found: {path}")
        try:
            tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises plain Exception
            raise CheckpointError(f"cannot read tokenizer {path}: {err}") from None
        conf: dict = {}
        conf_path = path.with_name(_CONFIG_NAME)
        if conf_path.is_file():  # a byte-order mark skipped, a list refused (conf.get below)
            conf = read_json_object(conf_path, error=CheckpointError)
        eos_id = None
        if bos_id is None:
            if "bos_token" in conf:  # named, or explicitly null (no BOS)
                name = _token_content(conf["bos_token"])
                bos_id = tok.token_to_id(name) if name else None
            else:
                bos_id = next((i for i in map(tok.token_to_id, BOS_TOKEN_NAMES) if i is not None), None)
        name = _token_content(conf.get("eos_token"))
        if name:
            eos_id = tok.token_to_id(name)
        if eos_ids is None:
            names = [n for n in (_token_content(v) for v in conf.get("eos_tokens", [])) if n]
            if names:
                eos_ids = [i for i in map(tok.token_to_id, names) if i is not None]
        template_path = path.with_name(_TEMPLATE_FILE)
        if template_path.is_file():
            template = read_text_file(template_path, error=CheckpointError, what="chat template")
        else:
            template = _config_chat_template(conf.get("chat_template"), conf_path)
        return cls(tok, bos_id=bos_id, eos_ids=eos_ids, eos_id=eos_id, chat_template=template)

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``tokenizer.json`` to ``path`` and ``tokenizer_config.json`` (``bos_token``, ``eos_token``,
        ``eos_tokens``, ``chat_template`` when the model has one) next to it, each atomically. Returns
        ``path``."""
        path = Path(path)
        atomic_write_text(path, self._tok.to_str(pretty=False))
        conf = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None if self.bos_id is None else self.id_to_token(self.bos_id),
            "eos_token": None if self.eos_id is None else self.id_to_token(self.eos_id),
            "eos_tokens": [self.id_to_token(i) for i in sorted(self.eos_ids)],
        }
        if self.chat_template is not None:
            conf["chat_template"] = self.chat_template
        atomic_write_text(path.with_name(_CONFIG_NAME), json.dumps(conf, indent=2, ensure_ascii=False) + "\n")
        return path

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
                f"eos_ids={sorted(self.eos_ids)}, fingerprint={self.fingerprint()})")


# -- byte-level BPE from a token list (GGUF ``tokenizer.ggml.model == "gpt2"``) -------------------------------

_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

#: llama.cpp's ``LLAMA_VOCAB_PRE_TYPE_DEFAULT`` regexes (``llama-vocab.cpp``), applied one after the other, each
#: splitting the pieces the previous left: what llama.cpp runs for ``tokenizer.ggml.pre = "default"`` and for a
#: file without the key. Not GPT-2's: punctuation runs split first, contractions lose their leading space.
_DEFAULT_PATTERNS = (r"[\p{P}\$\+<=>\^~\|]+",
                     r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
                     r"\p{N}+", r"[0-9][0-9][0-9]")

#: ``tokenizer.ggml.pre`` values understood, grouped as llama.cpp's ``llama-vocab.cpp`` groups their regexes.
PRE_TOKENIZERS: dict[str, str] = {
    "default": "default",
    **{k: "gpt2" for k in ("gpt2", "gpt-2")},
    # llama.cpp: \p{N} split first, then the GPT-2 regex == HF Digits(individual_digits) + ByteLevel
    **{k: "digits+gpt2" for k in ("smollm", "starcoder", "refact", "codeshell", "command-r")},
    **{k: "llama3" for k in ("llama-bpe", "llama3", "smaug-bpe")},
    **{k: "qwen2" for k in ("qwen2", "deepseek-r1-qwen")},
}


def _pre_tokenizer(kind: str):
    pt = tokenizers.pre_tokenizers
    if kind == "gpt2":
        return pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if kind == "default":
        return pt.Sequence([pt.Split(tokenizers.Regex(p), behavior="isolated", invert=False) for p in _DEFAULT_PATTERNS]
                           + [pt.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    if kind == "digits+gpt2":  # SmolLM / StarCoder tokenizer.json: Sequence[Digits(individual), ByteLevel]
        return pt.Sequence([pt.Digits(individual_digits=True),
                            pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    pattern = {"llama3": _LLAMA3_PATTERN, "qwen2": _QWEN2_PATTERN}[kind]
    return pt.Sequence([pt.Split(tokenizers.Regex(pattern), behavior="isolated", invert=False),
                        pt.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])


def _checked_vocab(tokens: list[str], bos_id: int | None, eos_id: int | None) -> dict[str, int]:
    """``{token: id}`` of ``tokens``, after refusing a BOS / EOS id outside them (before anything indexes them: an
    IndexError, or -1 silently the last token) and a token string that repeats. Raises CheckpointError naming the
    id or the token."""
    for what, i in (("BOS", bos_id), ("EOS", eos_id)):
        if i is not None and not 0 <= i < len(tokens):
            raise CheckpointError(f"{what} id {i} is outside the vocabulary of {len(tokens)} tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        seen: set[str] = set()
        dup = next(t for t in tokens if t in seen or seen.add(t))
        raise CheckpointError(f"tokenizer vocabulary repeats the token {dup!r}")
    return vocab


def _eos_set(vocab: dict[str, int], eos_ids: Iterable[int] | None) -> set[int]:
    """The ids that end a generation: ``eos_ids`` and every :data:`END_TOKEN_NAMES` token of ``vocab``."""
    ids = set(int(i) for i in (eos_ids or ()))
    ids.update(i for i in (vocab.get(t) for t in END_TOKEN_NAMES) if i is not None)
    return ids


def _special_template(tokens: list[str], bos_id: int | None, eos_id: int | None, add_bos: bool,
                      add_eos: bool) -> "tokenizers.processors.TemplateProcessing | None":
    """The post-processor putting BOS in front (``add_bos``) and EOS behind (``add_eos``) each sequence, or None
    when neither is asked. Raises CheckpointError for one asked without its id."""
    for wanted, i, what in ((add_bos, bos_id, "BOS"), (add_eos, eos_id, "EOS")):
        if wanted and i is None:
            raise CheckpointError(f"the tokenizer asks for a {what} token but names none")
    if not (add_bos or add_eos):
        return None
    head = f"{tokens[bos_id]} " if add_bos else ""
    tail = f" {tokens[eos_id]}" if add_eos else ""
    marks = sorted({(tokens[i], i) for wanted, i in ((add_bos, bos_id), (add_eos, eos_id)) if wanted})
    return tokenizers.processors.TemplateProcessing(single=f"{head}$A{tail}", pair=f"{head}$A{tail} {head}$B{tail}",
                                                    special_tokens=marks)


def _add_typed_tokens(tok: "tokenizers.Tokenizer", tokens: list[str], token_types: list[int], *,
                      special_types: tuple[int, ...]) -> None:
    """Add a GGUF vocabulary's whole-match tokens to ``tok``: those of ``special_types`` (GGUF token types: 2
    unknown, 3 control) as special tokens (dropped by ``decode(skip_special=True)``), user-defined ones (type 4)
    as plain added tokens; each matched whole in text, never split by the model."""
    special = [tokenizers.AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(token_types) if t in special_types]
    user = [tokenizers.AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(token_types) if t == 4]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)


def bpe_tokenizer_from_vocab(
    tokens: list[str],
    merges: list[str],
    *,
    token_types: list[int] | None = None,
    pre: str = "default",
    bos_id: int | None = None,
    eos_id: int | None = None,
    eos_ids: Iterable[int] | None = None,
    add_bos: bool = False,
    add_eos: bool = False,
    chat_template: str | None = None,
) -> Tokenizer:
    """Rebuild a byte-level BPE tokenizer (GPT-2 family) from a token list and merge rules.

    Args:
        tokens: token strings in id order, in byte-level form (``"Ġthe"``), as GGUF ``tokenizer.ggml.tokens``.
        merges: ``"left right"`` merge rules in priority order (GGUF ``tokenizer.ggml.merges``).
        token_types: GGUF token types per id (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
            6 byte); control and user-defined tokens become added tokens matched whole in text (control ones
            special, i.e. dropped by ``decode(skip_special=True)``).
        pre: GGUF ``tokenizer.ggml.pre``; see :data:`PRE_TOKENIZERS`.
        bos_id, eos_id, eos_ids: special ids (see :class:`Tokenizer`); EOS also gains every
            :data:`END_TOKEN_NAMES` token present.
        add_bos: prepend BOS on encode (GGUF ``tokenizer.ggml.add_bos_token``).
        add_eos: append EOS on encode (GGUF ``tokenizer.ggml.add_eos_token``; llama.cpp appends it to a BPE
            vocabulary's prompts too).
        chat_template: the model's chat template (GGUF ``tokenizer.chat_template``), or None.

    Raises:
        CheckpointError: unknown ``pre``, duplicate token strings, a malformed merge or one whose parts or result
            are not in the vocabulary, a BOS / EOS id outside the tokens, or ``add_bos`` / ``add_eos`` without
            its id.
    """
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(f"unsupported tokenizer pre-tokenizer {pre!r} (tokenizer.ggml.pre); treeopt knows "
                              f"{', '.join(sorted(PRE_TOKENIZERS))}")
    vocab = _checked_vocab(tokens, bos_id, eos_id)
    pairs = []
    for m in merges:
        parts = m.split(" ")
        if len(parts) != 2:
            raise CheckpointError(f"malformed BPE merge {m!r} (expected 'left right')")
        missing = next((t for t in (parts[0], parts[1], parts[0] + parts[1]) if t not in vocab), None)
        if missing is not None:  # the tokenizers library panics on a merge result outside the vocabulary
            raise CheckpointError(f"BPE merge {m!r} names {missing!r}, which is not in the tokenizer vocabulary")
        pairs.append((parts[0], parts[1]))
    kind = PRE_TOKENIZERS[pre]
    # Llama 3 takes a pre-token found whole in the vocabulary as is (HF "ignore_merges": true; llama.cpp
    # tokenizer_ignore_merges for llama-bpe)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                                                     ignore_merges=kind == "llama3"))
    tok.pre_tokenizer = _pre_tokenizer(kind)
    tok.decoder = tokenizers.decoders.ByteLevel()
    if token_types is not None:
        _add_typed_tokens(tok, tokens, token_types, special_types=(3,))
    tok.post_processor = _special_template(tokens, bos_id, eos_id, add_bos, add_eos) or \
        tokenizers.processors.ByteLevel(trim_offsets=False)
    ids = _eos_set(vocab, eos_ids)
    return Tokenizer(tok, bos_id=bos_id, eos_ids=ids, eos_id=eos_id, chat_template=chat_template)


# -- SentencePiece from a token list (GGUF ``tokenizer.ggml.model == "llama"``) -------------------------------------

def spm_pieces(text: str, scores: dict[str, float]) -> list[str]:
    """llama.cpp's SentencePiece merge (``llm_tokenizer_spm_session::tokenize``) of one escaped text (spaces
    already ``"▁"``): start from its characters, repeatedly join the adjacent pair whose concatenation is a
    token of the highest score (ties: the leftmost pair) until no pair joins.

    Args:
        text: the text, whitespace escaped (and space-prefixed) as llama.cpp escapes it.
        scores: token string -> score (GGUF ``tokenizer.ggml.scores``) for every token of the vocabulary, of any
            type (llama.cpp joins into any token its ``text_to_token`` finds).

    Returns:
        The pieces, in order, concatenating to ``text``: each a token of ``scores`` or a single character that
        is none (llama.cpp writes that one as its UTF-8 byte tokens).
    """
    n = len(text)
    start, size = list(range(n)), [1] * n
    prev, nxt = list(range(-1, n - 1)), list(range(1, n + 1))
    if n:
        nxt[-1] = -1
    heap: list[tuple[float, int, int, int]] = []

    def add(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        piece = text[start[left]:start[left] + size[left] + size[right]]
        score = scores.get(piece)
        if score is not None:  # llama.cpp's queue: highest score first, then the leftmost pair
            heapq.heappush(heap, (-score, left, right, len(piece)))

    for i in range(1, n):
        add(i - 1, i)
    while heap:
        _, left, right, length = heapq.heappop(heap)
        if size[left] == 0 or size[right] == 0 or size[left] + size[right] != length:
            continue  # one side already joined another symbol (sizes only grow, so this check is exact)
        size[left] += size[right]
        size[right] = 0
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        add(prev[left], left)
        add(left, nxt[left])
    return [text[start[i]:start[i] + size[i]] for i in range(n) if size[i]]


class _SpmPieces:
    """A ``tokenizers`` custom pre-tokenizer cutting each normalized text into :func:`spm_pieces`."""

    def __init__(self, scores: dict[str, float]):
        self.scores = scores

    def _split(self, _i, normalized):
        out, at = [], 0
        for piece in spm_pieces(str(normalized), self.scores):
            out.append(normalized[at:at + len(piece)])
            at += len(piece)
        return out

    def pre_tokenize(self, pretok) -> None:
        pretok.split(self._split)


class SpmTokenizer(Tokenizer):
    """A :class:`Tokenizer` whose :meth:`encode` / :meth:`encode_chat` run llama.cpp's SentencePiece merge
    (:func:`spm_pieces`) exactly; :attr:`backend` is the serializable Hugging Face rendition of the same
    vocabulary (``BPE`` with merges derived from the scores, as transformers converts a Llama GGUF), whose own
    ``encode`` can differ from llama.cpp where two overlapping pairs tie in score. Built by
    :func:`spm_tokenizer_from_vocab`."""

    def __init__(self, tok: tokenizers.Tokenizer, encoder: tokenizers.Tokenizer, **kw) -> None:
        super().__init__(tok, **kw)
        self._encoder = encoder

    def encode(self, text: str) -> list[int]:
        """Token ids for ``text`` as llama.cpp's ``llama_tokenize(..., add_special=True, parse_special=True)``:
        control, unknown and user-defined tokens written in the text map to their single ids, every other run
        of text is space-prefixed (``add_space_prefix``), escaped and merged; BOS prepended when the file asks."""
        return list(self._encoder.encode(text, add_special_tokens=True).ids)

    def encode_chat(self, messages, *, add_generation_prompt: bool = True) -> list[int]:
        """As :meth:`Tokenizer.encode_chat`, merged as :meth:`encode` merges (no BOS / EOS added).

        Raises:
            ChatTemplateError: as :meth:`Tokenizer.render_chat`.
        """
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt)
        return list(self._encoder.encode(text, add_special_tokens=False).ids)


def spm_tokenizer_from_vocab(
    tokens: list[str],
    scores: list[float],
    *,
    token_types: list[int] | None = None,
    add_space_prefix: bool = True,
    bos_id: int | None = 1,
    eos_id: int | None = 2,
    eos_ids: Iterable[int] | None = None,
    add_bos: bool = True,
    add_eos: bool = False,
    chat_template: str | None = None,
) -> SpmTokenizer:
    """Rebuild a SentencePiece tokenizer (Llama 2, Mistral v0.1, TinyLlama, CodeLlama) as llama.cpp's SPM
    tokenizer runs it: text -> a space in front (``add_space_prefix``) -> spaces as ``"▁"`` -> the
    highest-score merge of :func:`spm_pieces` -> a character that is no token as its byte tokens ``<0xXX>``
    (``<unk>`` where the vocabulary lacks one; llama.cpp aborts there, and the GGUF loader refuses such a
    vocabulary) -> BOS in front (``add_bos``), EOS behind (``add_eos``). Decoding writes byte tokens as bytes
    and ``"▁"`` as a space, and drops the first space of the text where ``add_space_prefix`` put it (after a
    skipped BOS too, as llama-cpp-python's ``detokenize``).

    Args:
        tokens: token strings in id order (GGUF ``tokenizer.ggml.tokens``).
        scores: a score per token (``tokenizer.ggml.scores``); higher merges first.
        token_types: GGUF token types per id (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
            6 byte); control and unknown tokens become special added tokens matched whole in text, user-defined
            ones plain added tokens (llama.cpp's ``parse_special`` partition; as :func:`bpe_tokenizer_from_vocab`).
        add_space_prefix: GGUF ``tokenizer.ggml.add_space_prefix`` (llama.cpp's default: true).
        bos_id, eos_id, eos_ids: special ids (see :class:`Tokenizer`; llama.cpp's SPM defaults 1 and 2); EOS
            also gains every :data:`END_TOKEN_NAMES` token present.
        add_bos, add_eos: GGUF ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` (llama.cpp's SPM defaults:
            true, false).
        chat_template: the model's chat template (GGUF ``tokenizer.chat_template``), or None.

    Raises:
        CheckpointError: as many scores as tokens missing, duplicate token strings, a BOS / EOS id outside the
            tokens, or ``add_bos`` / ``add_eos`` without its id.
    """
    if len(scores) != len(tokens):
        raise CheckpointError(f"tokenizer has {len(tokens)} tokens but {len(scores)} scores")
    vocab = _checked_vocab(tokens, bos_id, eos_id)
    score = {t: float(s) for t, s in zip(tokens, scores)}
    # transformers' GGUF / SentencePiece conversion: every split of a token into two tokens is a merge, ranked by
    # the joined token's score
    merges = sorted(((score[t], vocab[t], t[:k], t[k:]) for t in tokens for k in range(1, len(t))
                     if t[:k] in vocab and t[k:] in vocab), key=lambda m: (-m[0], m[1]))
    unk = next((tokens[i] for i, t in enumerate(token_types or ()) if t == 2), None)

    template = _special_template(tokens, bos_id, eos_id, add_bos, add_eos)

    def build(encoder: bool) -> tokenizers.Tokenizer:
        model = tokenizers.models.BPE(vocab=vocab, merges=[] if encoder else [(a, b) for _, _, a, b in merges],
                                      unk_token=unk, fuse_unk=True, byte_fallback=True, ignore_merges=encoder)
        tok = tokenizers.Tokenizer(model)
        norm = [tokenizers.normalizers.Replace(" ", "▁")]
        if add_space_prefix:
            norm.insert(0, tokenizers.normalizers.Prepend("▁"))
        tok.normalizer = tokenizers.normalizers.Sequence(norm)
        if encoder:  # each piece of spm_pieces is one token (found whole: ignore_merges) or one character
            tok.pre_tokenizer = tokenizers.pre_tokenizers.PreTokenizer.custom(_SpmPieces(score))
        dec = [tokenizers.decoders.Replace("▁", " "), tokenizers.decoders.ByteFallback(),
               tokenizers.decoders.Fuse()]
        if add_space_prefix:
            dec.append(tokenizers.decoders.Strip(" ", 1, 0))
        tok.decoder = tokenizers.decoders.Sequence(dec)
        if token_types is not None:
            _add_typed_tokens(tok, tokens, token_types, special_types=(2, 3))
        if template is not None:
            tok.post_processor = template
        return tok

    ids = _eos_set(vocab, eos_ids)
    return SpmTokenizer(build(False), build(True), bos_id=bos_id, eos_ids=ids, eos_id=eos_id,
                        chat_template=chat_template)
