"""The GGUF files a llama.cpp run uses: the target, and the draft written as a GGUF when it is a Hugging Face
folder (the bundled draft included)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import EngineError
from .binding import check_gguf

__all__ = ["GgufPair", "resolve_pair", "check_llamacpp_drafter", "SPEC_VOCAB_MAX_SIZE_DIFFERENCE"]

#: the most embedding rows a draft and its target may differ by (llama.cpp's ``common/speculative.cpp``, the same
#: name there): a draft padded to another size, with tokenizers that agree on every id both have
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128


@dataclass
class GgufPair:
    """The target and draft GGUF files llama.cpp runs, with the labels profiles name them by."""

    target: Path
    target_label: str
    draft: Path | None
    draft_label: str | None
    notes: list[str] = field(default_factory=list)


def check_llamacpp_drafter(spec: Any) -> None:
    """Raise EngineError when the drafter ``spec`` (a parsed ``--draft``) is a feature head: it reads the target's
    hidden states, which llama.cpp's binding here does not return (checked before a tree file or GGUF is read)."""
    if spec.entry.reads_features:
        method = spec.entry.engine_methods.get("llama.cpp")
        raise EngineError(f"--draft {spec.label}: a feature head reads the target's hidden states, which llama.cpp's "
                          "binding here does not return; run it with treeopt's torch decoder"
                          + (f" (llama.cpp serves it itself with --spec-type {method})" if method else ""))


def resolve_pair(target: Path | None, draft: str | None, workdir: Path, *, need_draft: bool = True) -> GgufPair:
    """The GGUF files for ``--target`` / ``--draft`` (defaults: the demo target; the bundled draft). A draft
    that is a Hugging Face folder (the bundled one included) is written as an F16 GGUF into ``workdir`` first
    (:func:`~sequoia_opt.model.gguf_writer.write_gguf`, named by its label so profiles still match). Both
    configs are checked before any weights load: tokenizers that agree on every id both have, and embedding
    sizes at most :data:`SPEC_VOCAB_MAX_SIZE_DIFFERENCE` apart (the decoders then pass the target's size to
    :class:`~sequoia_opt.engines.llamacpp.target.LlamaCppDrafter`).

    Raises:
        EngineError / TreeoptError: a target that is not a GGUF, a drafter llama.cpp does not run here
            (``self:L``; prompt lookup has its own flags), a vocabulary mismatch.
    """
    from ...drafting.registry import check_drafter, parse_drafter_spec
    from ...model.loaders import (default_draft_path, default_target_path, load_checkpoint, load_model_config,
                                  model_label)

    tpath = Path(target) if target is not None else default_target_path()
    if tpath.suffix.lower() != ".gguf" or not tpath.is_file():
        raise EngineError(f"--engine llama.cpp runs GGUF files: {tpath} is not one (convert a Hugging Face model "
                          "with llama.cpp's convert_hf_to_gguf.py; a draft with treeopt export-draft --gguf)")
    check_gguf(tpath)  # llama.cpp's own refusal first, in its words
    tcfg = load_model_config(tpath)
    out = GgufPair(tpath, model_label(tpath), None, None)
    if not need_draft and draft is None:
        return out
    spec = parse_drafter_spec(draft)
    check_llamacpp_drafter(spec)
    if not spec.entry.loads_model:
        raise EngineError(f"--draft {spec.label}: llama.cpp's speculative decoding here runs a draft model (for "
                          "prompt lookup, solve --format llama.cpp on a lookup profile gives its ngram-simple flags)")
    check_drafter(spec, tcfg, tpath)
    dsrc = spec.path if spec.path is not None else default_draft_path()
    label = model_label(dsrc)
    dvocab = load_model_config(dsrc).vocab_size
    if abs(dvocab - tcfg.vocab_size) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        raise EngineError(f"--draft {spec.label} has vocab_size {dvocab} (its embedding rows), the target "
                          f"{tcfg.vocab_size}: llama.cpp's draft-simple takes sizes at most "
                          f"{SPEC_VOCAB_MAX_SIZE_DIFFERENCE} apart (treeopt's torch decoder fits any padding)")
    if dvocab != tcfg.vocab_size:
        out.notes.append(f"draft {spec.label} has {dvocab} embedding rows, the target {tcfg.vocab_size}: the "
                         "tokenizers agree, so the draft proposes among the ids both have")
    if Path(dsrc).suffix.lower() == ".gguf":
        check_gguf(dsrc)
        out.draft, out.draft_label = Path(dsrc), label
        return out
    from ...model.gguf_writer import write_gguf

    model, tok = load_checkpoint(dsrc)
    gpath = Path(workdir) / f"{label}.gguf"
    write_gguf(gpath, model, tok, outtype="f16", name=label)
    out.draft, out.draft_label = gpath, label
    out.notes.append(f"draft {dsrc} written as an F16 GGUF for llama.cpp ({gpath.name}; keep one with treeopt "
                     "export-draft --gguf)")
    return out
