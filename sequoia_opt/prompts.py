"""Prompt files for profiling and evaluation.

Two formats:

* ``.jsonl``: one JSON object per line with a ``"prompt"`` (or ``"text"``) string; other keys are kept as
  metadata (e.g. ``"source"``). Blank lines are ignored.
* anything else: plain text, prompts separated by one or more blank lines.

The demo pair ships two disjoint sets under ``sequoia_opt/data/prompts/``: ``profile.jsonl`` (used to
measure acceptance) and ``eval.jsonl`` (what ``treeopt run`` evaluates on), so the acceptance vector is never
measured on the prompts the prediction is checked against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ._io import read_text_file
from .errors import TreeoptError


class PromptFileError(TreeoptError):
    """A prompt file is missing, empty or malformed."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text and whatever metadata the file gave (``source``, ...)."""

    text: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def load_prompts(path: str | Path, *, limit: int | None = None) -> list[Prompt]:
    """Read a prompt file (see module docstring). Returns at most ``limit`` prompts (all when None).

    Raises:
        PromptFileError: missing/unreadable file, invalid JSON on a line (with its line number), a line
            without a non-empty ``prompt`` string, or no prompts at all.
    """
    if limit is not None and limit < 1:
        raise PromptFileError(f"the number of prompts must be at least 1, got {limit}")
    path = Path(path)
    text = read_text_file(path, error=PromptFileError, what="prompt file")
    prompts: list[Prompt] = []
    if path.suffix == ".jsonl":
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise PromptFileError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
            if not isinstance(obj, dict):
                raise PromptFileError(f"{path}:{lineno}: expected a JSON object with a 'prompt' string")
            body = obj.get("prompt", obj.get("text"))
            if not isinstance(body, str) or not body.strip():
                raise PromptFileError(f"{path}:{lineno}: needs a non-empty 'prompt' string")
            prompts.append(Prompt(body, {k: v for k, v in obj.items() if k not in ("prompt", "text")}))
    else:
        for block in text.replace("\r\n", "\n").split("\n\n"):
            if block.strip():
                prompts.append(Prompt(block.strip("\n")))
    if not prompts:
        raise PromptFileError(f"prompt file {path} holds no prompts")
    return prompts[:limit] if limit is not None else prompts


def demo_prompts_path(split: str) -> Path:
    """Path of a shipped demo prompt set: ``split`` is ``"profile"`` or ``"eval"``.

    Raises PromptFileError for another split name.
    """
    if split not in ("profile", "eval"):
        raise PromptFileError(f"unknown prompt split {split!r}; the demo ships 'profile' and 'eval'")
    return Path(str(resources.files("sequoia_opt") / "data" / "prompts" / f"{split}.jsonl"))
