"""Chat templates: a conversation (``[{"role": ..., "content": ...}, ...]``) rendered into the text an instruct
model was trained on, with the model's own Jinja template.

Where the template comes from: a GGUF's ``tokenizer.chat_template`` metadata (llama.cpp's converter copies it
from the Hugging Face checkpoint), or a Hugging Face folder's ``chat_template.jinja`` file, else the
``chat_template`` key of its ``tokenizer_config.json`` (a string, or a list of ``{"name", "template"}`` entries
of which ``"default"`` is used).

How it is rendered: as Hugging Face transformers' ``apply_chat_template`` renders it (transformers
``utils/chat_template_utils.py``; llama.cpp's server renders the same templates with its own Jinja engine):

* a Jinja2 ``ImmutableSandboxedEnvironment`` (a template cannot touch Python objects beyond the data it is
  given) with ``trim_blocks`` and ``lstrip_blocks``, and the ``loopcontrols`` extension (``break``/``continue``);
* the globals templates call: ``raise_exception(message)`` (a template refusing a conversation) and
  ``strftime_now(format)``; a ``tojson`` filter that does not HTML-escape; the ``{% generation %}`` block
  (transformers' assistant-mask marker) renders its body;
* the variables: ``messages``, ``add_generation_prompt`` (True: the text ends where the assistant's reply
  starts), ``tools`` and ``documents`` (None), and the special tokens as strings (``bos_token``,
  ``eos_token``), as transformers passes its ``special_tokens_map``.

The rendered text already holds the special tokens the template writes (``<|im_start|>``, a BOS), so it is
encoded without adding special tokens again (transformers: ``add_special_tokens=False``).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Mapping, Sequence

from ..errors import TreeoptError

#: Message roles a prompt file may use (what chat templates of Llama-family instruct models know).
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


class ChatTemplateError(TreeoptError):
    """A chat template that does not parse, or that refuses a conversation (``raise_exception``)."""


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    """``tojson`` as chat templates expect it: plain ``json.dumps`` (Jinja's own filter HTML-escapes)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_chat_template(source: str):
    """The compiled ``jinja2.Template`` for a chat template's source (cached: a run renders one template many
    times).

    Raises:
        ChatTemplateError: the source is not a valid Jinja template (with jinja2's message and line).
    """
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}``: renders its body (transformers marks the assistant's
        tokens with it for training masks; rendering a prompt needs only the text)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise ChatTemplateError(f"the chat template does not parse (line {err.lineno}): {err.message}") from None


def render_chat(source: str, messages: Sequence[Mapping[str, Any]], *, bos_token: str | None = None,
                eos_token: str | None = None, add_generation_prompt: bool = True) -> str:
    """Render ``messages`` with the chat template ``source`` (see the module docstring for the environment
    and the variables it gets).

    Args:
        source: the template (Jinja).
        messages: the conversation, each a mapping with ``role`` and ``content`` strings.
        bos_token, eos_token: the special tokens' strings (None: not defined for the template, as
            transformers leaves a token the tokenizer lacks).
        add_generation_prompt: end with the assistant turn's header, so the model's next tokens are its reply.

    Returns:
        The rendered text.

    Raises:
        ChatTemplateError: the template does not parse, refuses the conversation (its ``raise_exception``
            message), or fails while rendering (jinja2's or Python's message).
    """
    template = compile_chat_template(source)
    context: dict[str, Any] = {"messages": [dict(m) for m in messages], "tools": None, "documents": None,
                               "add_generation_prompt": add_generation_prompt}
    if bos_token is not None:
        context["bos_token"] = bos_token
    if eos_token is not None:
        context["eos_token"] = eos_token
    try:
        return template.render(**context)
    except ChatTemplateError:
        raise
    except Exception as err:  # jinja2.TemplateError (raise_exception, sandbox, undefined) or a Python error
        raise ChatTemplateError(f"the chat template refuses the conversation: {err}") from None
