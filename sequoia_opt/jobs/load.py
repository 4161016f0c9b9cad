"""Loading what a job runs: the target (its linears tuned for this machine on a CPU), its drafters as the registry
builds them (:class:`ModelPair`, :func:`load_pair`, :func:`load_drafters`: every check that needs no weights
first), devices and dtypes from their names, and the default places profiles are written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..drafting.registry import (CostProbe, DrafterSpec, check_drafter,  # noqa: F401
                                drafter_slug, parse_drafter_spec)
from ..errors import TreeoptError
from ..model import Transformer
from ..model.loaders import (bundled_draft_path, default_draft_path, default_target_path, load_checkpoint,  # noqa: F401
                            model_label)
from ..model.tokenizer import Tokenizer

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


def default_acceptance_path(target_label: str, drafter: DrafterSpec, mode: str = "greedy") -> Path:
    """Where ``treeopt profile acceptance`` writes a drafter's acceptance profile without ``-o``:
    ``profiles/<target>__<drafter slug>/acceptance-<mode>.yaml`` (relative to the working directory), mode
    ``greedy`` or ``sampling-t<T>-p<P>``."""
    return Path("profiles") / pair_slug(target_label, drafter.label) / f"acceptance-{mode}.yaml"


def default_chain_acceptance_path(target_label: str, drafter: DrafterSpec) -> Path:
    """Where ``treeopt profile acceptance --chains`` and ``treeopt tune --engine treeopt`` keep a drafter's chain
    profile (teacher-forced traces): ``acceptance-greedy-chains.yaml`` beside :func:`default_acceptance_path`'s
    greedy file, never in it (a chain profile has no ranks past the first)."""
    return default_acceptance_path(target_label, drafter).with_name("acceptance-greedy-chains.yaml")


def precision_suffix(dtype: Any = "float32", weights: str = "float32") -> str:
    """The part of a latency profile's default file name that says its precision: ``""`` for float32 compute
    and weights, else ``-<dtype>`` and / or ``-<weights>`` (``-bfloat16``, ``-int8``, ``-bfloat16-int8``).
    Another precision is another curve, so it gets its own file (:func:`default_latency_path`)."""
    names = (str(dtype).removeprefix("torch."), str(weights))
    return "".join(f"-{p}" for p in dict.fromkeys(names) if p != "float32")


def default_latency_path(target_label: str, drafter: DrafterSpec, device_slug: str, precision: str = "") -> Path:
    """Where ``treeopt profile latency`` writes a drafter's latency profile without ``-o``:
    ``profiles/<device slug>/<target>__<drafter slug><precision>-latency.yaml`` (the draft checkpoint's name,
    ``self-L6``, ``lookup-1-3``; ``precision`` from :func:`precision_suffix`, empty for float32), so two drafters,
    or two precisions of one, never share a file."""
    dpart = f"__{drafter_slug(drafter.label)}"
    return Path("profiles") / device_slug / f"{target_label}{dpart}{precision}-latency.yaml"


def default_pair_acceptance_path(target_label: str, light: DrafterSpec, strong: DrafterSpec,
                                 mode: str = "greedy") -> Path:
    """Where ``treeopt profile graft`` writes the pair profile of a light and a strong drafter without
    ``--out-dir``: ``profiles/<target>__<light slug>+<strong slug>/acceptance-pair-<mode>.yaml`` (relative to
    the working directory; mode ``greedy`` or ``sampling-t<T>-p<P>``, as :func:`default_acceptance_path`).
    The folder also holds the pair's default scheduler file (``treeopt profile scheduler``)."""
    folder = f"{pair_slug(target_label, light.label)}+{drafter_slug(strong.label)}"
    return Path("profiles") / folder / f"acceptance-pair-{mode}.yaml"


def weights_record(target_path: Path | None, spec: DrafterSpec | None) -> dict[str, dict[str, str]]:
    """What an acceptance profile records of the weights it was measured with, as ``measured.weights``:
    ``{"target": {"path", "fingerprint"}, "draft": {...}}`` (:func:`~sequoia_opt.model.loaders.weights_fingerprint`;
    ``path`` resolved). ``draft`` only for a drafter with a checkpoint of its own (a draft model, a feature head):
    ``self:L`` runs the target's weights, lookup none. Profiles are filed by checkpoint name
    (:func:`default_acceptance_path`), so this is what tells two checkpoints of one name apart on read
    (:func:`~sequoia_opt.profiles.checks.weights_mismatch`). Reads about 1 MiB per weight file; loads nothing.

    Raises:
        CheckpointError: a checkpoint that does not exist or holds no weight file.
    """
    out = {"target": weights_entry(Path(target_path) if target_path else default_target_path())}
    if spec is not None and spec.entry.loads_model:
        out["draft"] = weights_entry(Path(spec.checkpoint))
    return out


def weights_entry(path: Path) -> dict[str, str]:
    """One model's entry of :func:`weights_record`: ``{"path": resolved path, "fingerprint":
    weights_fingerprint(path)}``.

    Raises:
        CheckpointError: a checkpoint that does not exist or holds no weight file.
    """
    from ..model.loaders import weights_fingerprint

    return {"path": str(Path(path).resolve()), "fingerprint": weights_fingerprint(path)}


def check_default_profile(path: Path, weights: dict[str, dict[str, str]], option: str = "-o") -> None:
    """Refuse to write over the profile at a default path ``path`` (profiles are filed by checkpoint name) when it
    was measured with another checkpoint of that name: its recorded weights differ from ``weights``
    (:func:`weights_record`) and were read at another path. Re-profiling one checkpoint (the same path, retrained
    or not) replaces its profile as before; a file without recorded weights or that does not parse is not
    compared.

    Raises:
        TreeoptError: one line naming the file, the checkpoint it holds, and ``option`` to write elsewhere.
    """
    import yaml

    from .._io import safe_load_yaml
    from ..profiles.checks import differing_weights

    if not Path(path).is_file():
        return
    try:
        doc = safe_load_yaml(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return
    measured = doc.get("measured") if isinstance(doc, dict) else None
    if not differing_weights(measured, weights):
        return
    for role in ("draft", "target"):
        h, w = measured["weights"].get(role), weights.get(role)
        if isinstance(h, dict) and isinstance(w, dict) and h.get("fingerprint") != w.get("fingerprint") \
                and h.get("path") != w.get("path"):
            raise TreeoptError(f"{path} holds the profile of the {role} at {h.get('path')}, another checkpoint of "
                               f"the name {Path(str(w.get('path'))).name!r}: not replaced by one of {w.get('path')}; "
                               f"write this one elsewhere with {option} PATH (or remove that file)")


def pair_slug(target_label: str, drafter_label: str) -> str:
    """``<target>__<drafter slug>``: the folder of a pair's acceptance profiles and the stem of its ids."""
    return f"{target_label}__{drafter_slug(drafter_label)}"


@dataclass
class ModelPair:
    """A loaded target and its drafter (sharing one tokenizer).

    Attributes:
        target: the target model.
        draft: the draft model for a ``"model"`` drafter; what the kind's ``load`` returned for a feature head
            (an EAGLE head and its draft ids, Medusa heads); None for ``self`` and ``lookup``.
        tokenizer: the target's tokenizer.
        target_name, draft_name: labels for profiles and reports (``draft_name`` is :attr:`DrafterSpec.label`).
        drafter: the :class:`DrafterSpec`.  target_path: the target's checkpoint (None: the demo target).
    """

    target: Transformer
    draft: Any
    tokenizer: Tokenizer
    target_name: str
    draft_name: str
    drafter: DrafterSpec | None = None
    target_path: Path | None = None

    @property
    def spec(self) -> DrafterSpec:
        """The drafter's spec: :attr:`drafter`, or the bundled draft model's (``DrafterSpec("model")``) when None."""
        return self.drafter or DrafterSpec("model")

    @property
    def cost_model(self) -> str:
        """The drafter's cost model (``"per-level"`` or ``"one-pass"``)."""
        return self.spec.cost_model

    @property
    def draft_context(self) -> int | None:
        """A draft model's context in tokens (its config's ``max_position_embeddings``); None where the loaded
        drafter has no such config (self:L and lookup load none)."""
        ctx = getattr(getattr(self.draft, "config", None), "max_position_embeddings", None)
        return ctx if isinstance(ctx, int) else None

    @property
    def vocab_size(self) -> int:
        """V, the target's vocabulary size (its config's ``vocab_size``)."""
        return self.target.config.vocab_size

    @property
    def slug(self) -> str:
        """``<target>__<drafter>`` for default profile folders (``self:6`` -> ``self-L6``, ``lookup:1-3`` ->
        ``lookup-1-3``: no ``:`` in file names)."""
        return pair_slug(self.target_name, self.draft_name)

    @property
    def weights(self) -> dict[str, dict[str, str]]:
        """The pair's weights as profiles record them (:func:`weights_record`)."""
        return weights_record(self.target_path, self.spec)

    def new_drafter(self):
        """A fresh :class:`~sequoia_opt.drafting.drafters.Drafter` for one decoder (a drafter serves one), built
        by its registry kind (:mod:`sequoia_opt.drafting.registry`). Pass the method itself where a factory is
        taken (``run_trees``, ``measure_acceptance``).

        Raises:
            TreeoptError: the drafter built says another cost model or ``has_probs`` than its registry kind (the
                solver would price it, and the dynamic policies trust it, by the kind's word).
        """
        kind = self.spec.entry
        drafter = kind.build(self.spec, self.target, self.draft)
        for what, said, built in (("cost_model", kind.cost_model, getattr(drafter, "cost_model", None)),
                                  ("has_probs", kind.has_probs, getattr(drafter, "has_probs", None))):
            if said != built:
                raise TreeoptError(f"drafter kind {kind.name!r} is registered with {what}={said!r} but builds a "
                                   f"{type(drafter).__name__} with {what}={built!r}: make them agree")
        return drafter

    def cost_probe(self) -> CostProbe:
        """What one unit of this drafter's cost is, for the latency profiler (its registry kind says)."""
        return self.spec.entry.probe(self.spec, self.target, self.draft, self.new_drafter)


def load_target(target_path: Path | None, *, device: torch.device, dtype: torch.dtype, weights: str = "float32",
                log: Callable[[str], None] | None = None) -> tuple[Transformer, Tokenizer, str]:
    """Load the target (default: the demo target), its linears tuned for this machine on a CPU in float32
    (:func:`~sequoia_opt.model.loaders.tune_loaded_model`; ``weights``: ``float32`` | ``int4`` | ``int8``).
    Returns ``(model, tokenizer, label)``.

    Raises:
        CheckpointError: the checkpoint cannot be loaded; TreeoptError: the demo target is not installed, or
            an unknown ``weights``.
    """
    from ..model.loaders import tune_loaded_model
    from ..model.tuned_linear import check_precision

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
    the target's and the draft's configs and tokenizers (:func:`check_drafter`); only then are weights loaded.

    Raises:
        TreeoptError: a bad spec, L out of range; CheckpointError: a checkpoint cannot be loaded, or the
            tokenizers differ (:func:`~sequoia_opt.model.loaders.check_draft_vocabulary`), before any weights load.
    """
    return load_drafters(target_path, [draft], device=device, dtype=dtype, weights=weights, log=log)[0]


def _head_context(loaded: Any) -> int | None:
    """A loaded feature head's own context (tokens): an EAGLE head's (``(EagleHead, draft ids)``) ``config.json``
    ``max_position_embeddings``; None for Medusa's heads, which read positions through the target alone."""
    return int(loaded[0].config.layer.max_position_embeddings) if isinstance(loaded, tuple) else None


def load_drafters(target_path: Path | None, drafts: Sequence[str | Path | DrafterSpec | None], *,
                  device: torch.device, dtype: torch.dtype, weights: str = "float32",
                  log: Callable[[str], None] | None = None) -> list[ModelPair]:
    """Load the target once and every drafter of ``drafts``: one :class:`ModelPair` per entry, in order, all
    sharing the same target model and tokenizer (a ``"model"`` drafter's checkpoint is loaded once however
    often it is named). Each pair's ``new_drafter`` is that drafter's factory, ``draft_name`` its label,
    ``cost_model`` its cost model.

    Every check that needs no weights runs first, for every drafter: the specs (:func:`parse_drafter_spec`),
    then the target's and the drafts' configs and a draft model's tokenizer (:func:`check_drafter`); only then
    are weights loaded (the target first; a draft model whose embedding is padded to another size is fitted to
    the target's). On a CPU in float32 the target's and each
    draft model's linears are tuned for this machine (:func:`load_target`); ``weights`` applies to the target
    (a draft model keeps float32).

    Raises:
        TreeoptError: no drafter, a bad spec, L out of range; CheckpointError: a checkpoint cannot be loaded,
            or a draft's tokenizer differs from the target's, before any weights load.
    """
    from ..model.loaders import load_model_config, tune_loaded_model
    from ..model.tuned_linear import check_precision

    check_precision(weights)
    specs = [parse_drafter_spec(d) for d in drafts]
    if not specs:
        raise TreeoptError("no drafter to load")
    tp = Path(target_path) if target_path else default_target_path()
    tconfig = load_model_config(tp)
    for spec in specs:
        check_drafter(spec, tconfig, tp)
    target, ttok, tname = load_target(tp, device=device, dtype=dtype, weights=weights, log=log)
    models: dict[Any, Any] = {}
    pairs = []
    for spec in specs:
        if not spec.entry.loads_model:
            pairs.append(ModelPair(target, None, ttok, tname, spec.label, spec, tp))
            continue
        if spec.entry.load is not None:  # a feature head: the kind loads it against the target (no tokenizer)
            key = (spec.kind, Path(spec.checkpoint).resolve())
            if key not in models:
                models[key] = spec.entry.load(spec, target)
                own = _head_context(models[key])
                if log is not None and own is not None and own < target.config.max_position_embeddings:
                    log(f"{Path(spec.checkpoint) / 'config.json'}: max_position_embeddings = {own}, shorter than the "
                        f"target's {target.config.max_position_embeddings}: the head drafts nothing past position "
                        f"{own} (those steps decode plainly)")
            pairs.append(ModelPair(target, models[key], ttok, tname, spec.label, spec, tp))
            continue
        dp = spec.path if spec.path is not None else default_draft_path()
        key = Path(dp).resolve()
        if key not in models:
            draft_model, _ = load_checkpoint(dp, device=device, dtype=dtype)
            draft_model.fit_vocab(target.config.vocab_size)  # tokenizers compared by check_drafter
            tune_loaded_model(draft_model, dp, log=log)
            models[key] = draft_model
        pairs.append(ModelPair(target, models[key], ttok, tname, spec.label, spec, tp))
    return pairs
