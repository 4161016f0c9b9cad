"""Serving engines whose latency curve treeopt can measure, so a tree or chain is solved on the curve of the
engine that will serve it (issue 20).

The bundled decoder (``treeopt``) is the default engine: a latency profile without an ``engine`` key was
measured on it. The others are measured through their own Python APIs, installed as optional extras:

* ``llama.cpp`` (:mod:`.llamacpp`, through ``llama-cpp-python``): T(n) with logits for all n positions, the draft
  GGUF's c(w), the per-step overhead of a speculative step; a chain runner (its speculative decoding verifies
  a chain) and the chain's ``--spec-draft-*`` settings.
* ``sglang`` / ``vllm`` (:mod:`.gpu`): T(n) through their offline Python APIs on a CUDA GPU.

A new engine is a module here and one :data:`ENGINES` line. Nothing here imports an engine's package until a
command needs it (:func:`require_engine`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from ..errors import EngineError, EngineNotInstalled  # noqa: F401 (re-exported: engines raise them)

#: What a latency profile without an ``engine`` key was measured on: treeopt's bundled decoder.
DEFAULT_ENGINE = "treeopt"

@dataclass(frozen=True)
class Engine:
    """One serving engine.

    Attributes:
        name: the name ``--engine`` takes and a profile's ``engine.name`` records.
        module: the Python package it is driven through (None: treeopt itself).
        install: the command that installs it (printed when it is missing).
        profiler: ``"module:function"`` of its latency profiler in this package (None: none yet);
            :func:`engine_profiler` resolves it.
    """

    name: str
    module: str | None
    install: str
    profiler: str | None = None


ENGINES: dict[str, Engine] = {
    "treeopt": Engine("treeopt", None, "pip install sequoia_opt"),
    "llama.cpp": Engine("llama.cpp", "llama_cpp", "pip install 'sequoia_opt[llamacpp]'  (llama-cpp-python; "
                        "builds llama.cpp from source, ~5 min on 2 cores)", "llamacpp:profile_latency"),
    "sglang": Engine("sglang", "sglang", "pip install 'sglang[all]'  (needs a CUDA GPU)", "gpu:profile_gpu"),
    "vllm": Engine("vllm", "vllm", "pip install vllm  (needs a CUDA GPU)", "gpu:profile_gpu"),
}

_ALIASES = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "llama_cpp": "llama.cpp", "bundled": "treeopt"}

#: The engine that serves each ``treeopt solve --format`` (yaml / json trees run on treeopt's own decoder).
FORMAT_ENGINES: dict[str, str] = {"yaml": "treeopt", "json": "treeopt", "medusa": "medusa",
                                  "tensorrt-llm": "tensorrt-llm", "vllm": "vllm", "sglang": "sglang",
                                  "llama.cpp": "llama.cpp"}


def engine_name(name: str) -> str:
    """The canonical engine name (``llamacpp`` and ``llama-cpp`` are ``llama.cpp``).

    Raises:
        EngineError: an unknown engine, naming the known ones.
    """
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in ENGINES:
        raise EngineError(f"unknown --engine {name!r}; choose one of {', '.join(ENGINES)}")
    return key


def require_engine(name: str) -> Any:
    """Import and return the Python package that drives engine ``name`` (None for ``treeopt``).

    Raises:
        EngineError: the engine is unknown; :class:`~sequoia_opt.errors.EngineNotInstalled` (an EngineError): its
            package is not installed, one line with the install command.
    """
    eng = ENGINES[engine_name(name)]
    if eng.module is None:
        return None
    try:
        return importlib.import_module(eng.module)
    except ImportError as err:
        why = "" if isinstance(err, ModuleNotFoundError) and err.name == eng.module else f" ({err})"
        raise EngineNotInstalled(f"engine {eng.name} is not installed{why}: {eng.install}") from None


def engine_profiler(name: str) -> Any:
    """The latency profiler function :attr:`Engine.profiler` names for engine ``name`` (imports its module in this
    package, which imports no engine package at import time; None when the engine has none).

    Raises:
        EngineError: an unknown engine.
    """
    eng = ENGINES[engine_name(name)]
    if eng.profiler is None:
        return None
    module, func = eng.profiler.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), func)


def profile_engine(curve: Any) -> str:
    """The engine a :class:`~sequoia_opt.profiles.LatencyCurve` was measured on (``treeopt`` when unnamed)."""
    return getattr(curve, "engine", None) or DEFAULT_ENGINE


def engine_mismatch(curve: Any, engine: str, *, what: str) -> str | None:
    """A warning (one line) when latency profile ``curve`` was measured on another engine than ``engine``,
    the one ``what`` (e.g. ``"--format llama.cpp"``) solves for, naming both; None when they agree.

    A tree is only as good as the curve it was solved on: T(n) / T(1) has another shape on every engine
    (llama.cpp's T(8) is 3.3 T(1) on a CPU where treeopt's decoder has 2.0; issue 20)."""
    have = profile_engine(curve)
    if have == engine:
        return None
    hint = (f"; measure it: treeopt profile latency --engine {engine}" if ENGINES.get(engine) is not None
            and ENGINES[engine].profiler is not None else
            "; treeopt has no profiler for it, so the prediction is of the profiled engine")
    served = _SERVED_BY.get(engine, f"engine {engine!r}")
    return (f"latency profile {curve.id!r} was measured on engine {have!r}, but {what} solves for {served}: T(n) "
            f"has another shape there{hint}")


#: What serves a format that is no engine of :data:`ENGINES`, as warnings name it.
_SERVED_BY = {"medusa": "Medusa's own decoder (FasterDecoding/Medusa, medusa_choices)"}
