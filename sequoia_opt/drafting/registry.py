"""The registries: every drafter kind and every drafting policy by name. The CLI, the profilers, the jobs and
the engines read them; nothing else switches on a drafter's name.

A drafter kind (:class:`DrafterKind`) says how ``--draft NAME[:ARG]`` parses into a :class:`DrafterSpec`, how
the spec is checked against the target's config before any weights load, its label in profiles and reports,
its cost model, whether it loads a checkpoint of its own, how to build one drafter per decoder, and what one
unit of its cost is for the latency profiler (:class:`CostProbe`). A policy kind (:class:`PolicyKind`) says
how ``treeopt run --policy NAME[:ARG]`` builds a policy around one fresh drafter and the run's tree.

A new drafter is one file in ``drafters/`` and one :func:`register_drafter` call; a new policy is one file in
``policies/`` and one :func:`register_policy` call. Outside the package the file that calls them is a plugin,
imported before any command runs (:func:`load_plugins`): a module named in ``TREEOPT_PLUGINS`` (comma
separated; a ``.py`` path or an importable name) or an entry point of the group ``treeopt.plugins``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import TreeoptError
from ..model.loaders import bundled_draft_path, is_bundled_copy, model_label
from ..tree import Tree
from .drafters import Drafter, LayerSkipDrafter, ModelDrafter, PromptLookupDrafter
from .drafters.base import CostModel
from .policies import (AdaptiveSchedulePolicy, ChainPolicy, DynamicPolicy, PlanAdapter, SchedulePolicy,
                       StaticTreePolicy)

__all__ = ["DrafterSpec", "DrafterKind", "CostProbe", "PolicyKind", "DRAFTERS", "POLICIES", "register_drafter",
           "register_policy", "policy_kind", "parse_policy", "load_plugins", "drafter_kind", "no_argument",
           "parse_drafter_spec", "check_drafter", "refuse_a_head_as_a_draft_model", "drafter_slug", "LOOKUP_DEFAULT",
           "DRAFTER_KEYWORDS", "plugin_kinds"]

#: The lookup drafter's n-gram sizes when ``--draft lookup`` gives none (vLLM's ``ngram`` method takes both
#: ``prompt_lookup_min`` and ``prompt_lookup_max``; 1..3 matches prompt lookup decoding's usual setting).
LOOKUP_DEFAULT = (1, 3)


@dataclass(frozen=True)
class DrafterSpec:
    """Which drafter to use, as parsed from ``--draft`` (:func:`parse_drafter_spec`), before any model loads.

    Attributes:
        kind: the registry name (:data:`DRAFTERS`): ``"model"`` (a draft checkpoint), ``"self"`` (the target's
            first L layers), ``"lookup"`` (n-gram prompt lookup), or a registered one.
        path: the checkpoint (HF folder or .gguf) of a kind that loads one; None = the bundled demo draft.
        options: the kind's own settings (``num_layers`` for ``self``, ``lookup_min`` / ``lookup_max`` for
            ``lookup``), as its parser made them.
    """

    kind: str
    path: Path | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def option(self, name: str, default: Any = None) -> Any:
        """The kind's option ``name`` as its parser stored it in :attr:`options`, ``default`` when absent."""
        return self.options.get(name, default)

    @property
    def num_layers(self) -> int | None:
        """L of a layer-skip drafter (None for other kinds)."""
        return self.options.get("num_layers")

    @property
    def lookup_min(self) -> int:
        """The shortest suffix a ``lookup`` drafter matches, tokens (:data:`LOOKUP_DEFAULT`'s 1 unless given)."""
        return self.options.get("lookup_min", LOOKUP_DEFAULT[0])

    @property
    def lookup_max(self) -> int:
        """The longest suffix a ``lookup`` drafter matches, tokens (:data:`LOOKUP_DEFAULT`'s 3 unless given)."""
        return self.options.get("lookup_max", LOOKUP_DEFAULT[1])

    @property
    def entry(self) -> "DrafterKind":
        """The registry entry of :attr:`kind` (:func:`drafter_kind`; raises TreeoptError for an unknown kind)."""
        return drafter_kind(self.kind)

    @property
    def cost_model(self) -> str:
        """How the solver charges this drafter: ``"per-level"`` or ``"one-pass"``."""
        return self.entry.cost_model

    @property
    def label(self) -> str:
        """The drafter's name in profiles, trees and reports (``treeopt-smollm2-draft``, ``self:6``,
        ``lookup:1-3``)."""
        return self.entry.label(self)

    @property
    def checkpoint(self) -> Path | None:
        """The checkpoint a kind that loads one reads: ``path``, else the kind's bundled default (the demo draft
        for ``model``); None for kinds without a checkpoint."""
        entry = self.entry
        if not entry.loads_model:
            return None
        if self.path is not None:
            return self.path
        return entry.default_path() if entry.default_path is not None else bundled_draft_path()

    @property
    def spec(self) -> str:
        """The ``--draft`` text that gives this drafter back (a path for a checkpoint; ``eagle3:PATH`` for a
        feature head)."""
        if self.entry.loads_model:
            return str(self.checkpoint) if self.kind == "model" else f"{self.kind}:{self.checkpoint}"
        return self.label

    def __hash__(self) -> int:
        return hash((self.kind, self.path, tuple(sorted(self.options.items()))))


@dataclass(frozen=True)
class CostProbe:
    """One unit of a drafter's cost, as the latency profiler times it (c(w) in the drafter's cost model): a
    forward of ``model`` (its first ``num_layers`` blocks, then norm and LM head, when given) over w tokens, or
    (``model`` None) one proposal of a w-node chain by a fresh drafter from ``make`` (a one-pass drafter without
    a model)."""

    label: str
    model: Any = None
    num_layers: int | None = None
    make: Callable[[], Drafter] | None = None


@dataclass(frozen=True)
class DrafterKind:
    """A drafter kind in the registry (module docstring).

    Attributes:
        name: the ``--draft`` keyword.  summary: one line for help texts.  cost_model: how the solver charges it.
        parse: ``(argument after "name:" or None, whole --draft text) -> options``; raises TreeoptError naming
            the problem.
        label: ``spec -> label`` for profiles and reports.
        check: ``(spec, target ModelConfig) -> None``, before weights load; raises TreeoptError.
        build: ``(spec, target Transformer, its loaded draft model or None) -> Drafter``, a fresh one per
            decoder.
        probe: ``(spec, target, draft model or None, make) -> CostProbe``.
        loads_model: it loads a checkpoint of its own beside the target (``spec.path``).
        has_probs: its candidates come with draft distributions (dynamic trees and calibration need them).
        engine_methods: per serving engine, the name of this drafter's speculative method there (vLLM's
            ``speculative_config.method``, llama.cpp's ``--spec-type``), for the exports; absent: the engine has
            no such method.
        load: ``(spec, target Transformer) -> what build takes as its draft``, for a kind whose checkpoint is
            not a draft :class:`~sequoia_opt.model.Transformer` (a feature head); None: a draft model, loaded by
            ``jobs.load`` (``load_checkpoint``, tokenizers compared).
        default_path: ``() -> Path`` of the checkpoint ``--draft NAME`` without ``:PATH`` names (the bundled
            one); None: a path is required (``model``'s default is the bundled draft, as ``--draft`` omitted).
        reads_features: it reads the target's hidden states (a feature head): only the bundled torch target
            can serve it, and it needs no tokenizer of its own.
    """

    name: str
    summary: str
    cost_model: CostModel
    parse: Callable[[str | None, str], dict[str, Any]]
    label: Callable[[DrafterSpec], str]
    build: Callable[[DrafterSpec, Any, Any], Drafter]
    probe: Callable[[DrafterSpec, Any, Any, Callable[[], Drafter]], CostProbe]
    check: Callable[[DrafterSpec, Any], None] = lambda spec, config: None
    loads_model: bool = False
    has_probs: bool = True
    engine_methods: Mapping[str, str] = field(default_factory=dict)
    load: Callable[[DrafterSpec, Any], Any] | None = None
    default_path: Callable[[], Path] | None = None
    reads_features: bool = False


def _positive_int(text: str, what: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TreeoptError(f"--draft {spec!r}: {what} must be an integer, got {text!r}") from None
    if value < 1:
        raise TreeoptError(f"--draft {spec!r}: {what} must be at least 1, got {value}")
    return value


# ---------------------------------------------------------------------------------------------- the bundled kinds
def _parse_self(arg: str | None, text: str) -> dict[str, Any]:
    if not arg:
        raise TreeoptError(f"--draft {text!r}: the layer-skip drafter needs L, the number of the target's "
                           "first layers it runs: --draft self:L (L in 1..n_layers-1; treeopt profile layers "
                           "measures which L is best on this device)")
    return {"num_layers": _positive_int(arg, "L in self:L", text)}


def _check_self(spec: DrafterSpec, config: Any) -> None:
    n = config.n_layers
    if n < 2:
        raise TreeoptError(f"--draft self:{spec.num_layers}: the target has 1 layer, and a layer-skip drafter runs "
                           "fewer layers than the target: it needs a target of at least 2")
    if not 1 <= int(spec.num_layers) <= n - 1:
        raise TreeoptError(f"--draft self:{spec.num_layers}: L must be in 1..{n - 1} (the target has {n} "
                           "layers; L = n_layers would be the target itself)")


def _parse_lookup(arg: str | None, text: str) -> dict[str, Any]:
    lo, hi = LOOKUP_DEFAULT
    if arg is not None:
        parts = arg.split("-")
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
    return {"lookup_min": lo, "lookup_max": hi}


def _check_model(spec: DrafterSpec, config: Any) -> None:
    """A draft model's config against the target's: its folder holds one (or the bundled draft is
    installed). Vocabulary sizes may differ (an embedding padded to another size: Qwen2.5 0.5B-3B against
    7B-72B); the loader compares the tokenizers and fits the draft's vocabulary to the target's
    (:func:`~sequoia_opt.jobs.load.load_drafters`, :meth:`~sequoia_opt.model.llama.Transformer.fit_vocab`)."""
    from ..model.loaders import load_model_config

    path = spec.path if spec.path is not None else bundled_draft_path()
    if spec.path is None and not (path / "config.json").is_file():
        raise TreeoptError(f"the bundled draft model is missing from {path} (pass --draft PATH)")
    load_model_config(path)


def _lookup(spec: DrafterSpec, target: Any) -> PromptLookupDrafter:
    return PromptLookupDrafter(target.config.vocab_size, prompt_lookup_min=spec.lookup_min,
                               prompt_lookup_max=spec.lookup_max, device=target.device)


#: Registry: drafter kind name -> :class:`DrafterKind`.
DRAFTERS: dict[str, DrafterKind] = {}


def no_argument(name: str) -> Callable[[str | None, str], dict[str, Any]]:
    """The ``parse`` of a drafter kind that takes no argument: ``--draft NAME`` gives no options, and
    ``--draft NAME:ARG`` is refused (TreeoptError, one line) instead of running as plain ``NAME``."""
    def parse(arg: str | None, text: str) -> dict[str, Any]:
        if arg:
            raise TreeoptError(f"--draft {text}: drafter {name!r} takes no argument (write --draft {name})")
        return {}
    return parse


def register_drafter(kind: DrafterKind) -> DrafterKind:
    """Add a drafter kind (``--draft NAME[:ARG]`` then parses into it everywhere). Raises ValueError when the
    name is taken."""
    if kind.name in DRAFTERS:
        raise ValueError(f"a drafter kind named {kind.name!r} is already registered")
    DRAFTERS[kind.name] = kind
    return kind


register_drafter(DrafterKind(
    "model", "a separate draft model (HF folder or .gguf): --draft PATH or model:PATH", "per-level",
    parse=lambda arg, text: {}, label=lambda s: model_label(s.path if s.path is not None else bundled_draft_path()),
    build=lambda spec, target, draft: ModelDrafter(draft), check=_check_model, loads_model=True,
    engine_methods={"vllm": "draft_model", "llama.cpp": "draft-simple", "sglang": "STANDALONE"},
    probe=lambda spec, target, draft, make: CostProbe("draft", model=draft)))
register_drafter(DrafterKind(
    "self", "the target's own first L layers (self-speculative layer skip): --draft self:L", "per-level",
    parse=_parse_self, label=lambda s: f"self:{s.num_layers}", check=_check_self,
    build=lambda spec, target, draft: LayerSkipDrafter(target, int(spec.num_layers)),
    probe=lambda spec, target, draft, make: CostProbe(f"self:{spec.num_layers} draft", model=target,
                                                      num_layers=int(spec.num_layers))))
register_drafter(DrafterKind(
    "lookup", "n-gram prompt lookup: --draft lookup, lookup:MAX or lookup:MIN-MAX", "one-pass",
    parse=_parse_lookup, label=lambda s: f"lookup:{s.lookup_min}-{s.lookup_max}",
    build=lambda spec, target, draft: _lookup(spec, target), has_probs=False,
    engine_methods={"vllm": "ngram", "llama.cpp": "ngram-simple", "sglang": "NGRAM"},
    probe=lambda spec, target, draft, make: CostProbe("lookup draft", make=make)))


# ---------------------------------------------------------------------------------------------- feature heads
def _bundled_eagle3() -> Path:
    from importlib import resources

    return Path(str(resources.files("sequoia_opt") / "data" / "eagle3"))


def _check_head(kind: str) -> Callable[[DrafterSpec, Any], None]:
    def check(spec: DrafterSpec, config: Any) -> None:
        from ..model.head_checkpoints import check_eagle_head, read_medusa_config

        path = spec.checkpoint
        if kind == "medusa":
            read_medusa_config(path, config)
        else:
            check_eagle_head(path, kind, config)
    return check


def _load_head(kind: str) -> Callable[[DrafterSpec, Any], Any]:
    def load(spec: DrafterSpec, target: Any) -> Any:
        """The head's weights against ``target``, its linears tuned for this CPU as a draft model's are
        (:func:`~sequoia_opt.model.tuned_linear.tune_linears`: a head's forward runs over 1..w rows, where
        the default GEMM of a 2-row input took 2-4x its 1-row GEMV on the 2-core EPYC, 2026-12-06)."""
        from ..model.head_checkpoints import load_eagle_head, load_medusa_heads
        from ..model.tuned_linear import tune_linears

        loaded = (load_medusa_heads(spec.checkpoint, target) if kind == "medusa"
                  else load_eagle_head(spec.checkpoint, kind, target))
        tune_linears(loaded if kind == "medusa" else loaded[0])  # None off a CPU float32 head: nothing done
        return loaded
    return load


def _build_head(kind: str) -> Callable[[DrafterSpec, Any, Any], Drafter]:
    def build(spec: DrafterSpec, target: Any, loaded: Any) -> Drafter:
        from .drafters.eagle import EagleDrafter
        from .drafters.medusa import MedusaDrafter

        c = target.config
        if loaded is None:  # a caller that did not load it (a plugin, a test): load now
            loaded = _load_head(kind)(spec, target)
        if kind == "medusa":
            return MedusaDrafter(loaded, c.n_layers, context=c.max_position_embeddings)
        head, draft_ids = loaded
        return EagleDrafter(head, c.n_layers, draft_ids, context=c.max_position_embeddings)
    return build


def _probe_head(kind: str) -> Callable[[DrafterSpec, Any, Any, Callable[[], Drafter]], CostProbe]:
    def probe(spec: DrafterSpec, target: Any, loaded: Any, make: Callable[[], Drafter]) -> CostProbe:
        from .drafters.eagle import EagleLevelProbe
        from .drafters.medusa import MedusaPassProbe

        if loaded is None:
            loaded = _load_head(kind)(spec, target)
        if kind == "medusa":
            return CostProbe(f"{spec.label} heads", model=MedusaPassProbe(loaded, target))
        return CostProbe(f"{spec.label} level", model=EagleLevelProbe(loaded[0], target))
    return probe


def _head_label(kind: str) -> Callable[[DrafterSpec], str]:
    def label(spec: DrafterSpec) -> str:
        path = Path(spec.checkpoint).resolve()
        bundled = kind == "eagle3" and is_bundled_copy(path, _bundled_eagle3())
        return f"{kind}:{'treeopt-smollm2-eagle3' if bundled else path.name}"
    return label


register_drafter(DrafterKind(
    "eagle3", "an EAGLE-3 head on the target's low / middle / high features: --draft eagle3:PATH (eagle3 alone: the "
    "head shipped for the demo pair)", "per-level", parse=lambda arg, text: {}, label=_head_label("eagle3"),
    build=_build_head("eagle3"), probe=_probe_head("eagle3"), check=_check_head("eagle3"), loads_model=True,
    load=_load_head("eagle3"), default_path=_bundled_eagle3, reads_features=True,
    engine_methods={"vllm": "eagle3", "sglang": "EAGLE3", "tensorrt-llm": "Eagle3", "llama.cpp": "draft-eagle3"}))
register_drafter(DrafterKind(
    "eagle", "an EAGLE-1/2 head on the target's last hidden state: --draft eagle:PATH", "per-level",
    parse=lambda arg, text: {}, label=_head_label("eagle"), build=_build_head("eagle"), probe=_probe_head("eagle"),
    check=_check_head("eagle"), loads_model=True, load=_load_head("eagle"), reads_features=True,
    engine_methods={"vllm": "eagle", "sglang": "EAGLE"}))
register_drafter(DrafterKind(
    "medusa", "Medusa heads on the target's last hidden state (head k proposes depth k + 1): --draft medusa:PATH",
    "one-pass", parse=lambda arg, text: {}, label=_head_label("medusa"), build=_build_head("medusa"),
    probe=_probe_head("medusa"), check=_check_head("medusa"), loads_model=True, load=_load_head("medusa"),
    reads_features=True, engine_methods={"vllm": "medusa", "tensorrt-llm": "Medusa"}))

#: The keywords of :func:`parse_drafter_spec` (anything else is a checkpoint path).
DRAFTER_KEYWORDS = tuple(DRAFTERS)

@dataclass(frozen=True)
class PolicyKind:
    """A drafting policy in the registry, as ``treeopt run --policy NAME[:ARG]`` builds it.

    Attributes:
        name: the ``--policy`` keyword.  summary: one line for help texts.
        parse: ``(argument after "name:" or None) -> options``, before anything loads; raises TreeoptError.
        build: ``(a fresh drafter, the run's tree, options) -> DraftingPolicy``, one per decoder.
        policy: the :class:`~sequoia_opt.decoding.policy.DraftingPolicy` class it builds.
        own_tree: for a policy that brings its own trees (a plan): ``options -> (name, tree)``, the row's name and
            the largest tree it runs one request at a time (``treeopt run`` serves batch 1: a plan's batch-1
            range), so ``treeopt run`` needs no ``--tree`` for it, and refuses one; None: the policy runs the
            ``--tree`` files.
    """

    name: str
    summary: str
    parse: Callable[[str | None], dict[str, Any]]
    build: Callable[[Drafter, Any, Mapping[str, Any]], Any]
    policy: type
    own_tree: Callable[[Mapping[str, Any]], tuple[str, Any]] | None = None


def _parse_none(name: str) -> Callable[[str | None], dict[str, Any]]:
    def parse(arg: str | None) -> dict[str, Any]:
        if arg:
            raise TreeoptError(f"--policy {name} takes no argument, got {name}:{arg}")
        return {}
    return parse


def _parse_chain(arg: str | None) -> dict[str, Any]:
    """``chain`` (the tree's depth as draft-max) or ``chain:N[,MIN[,PMIN]]``."""
    if not arg:
        return {}
    parts = [x.strip() for x in arg.split(",")]
    try:
        if len(parts) > 3:
            raise ValueError
        out: dict[str, Any] = {"n_max": int(parts[0])}
        if len(parts) > 1:
            out["n_min"] = int(parts[1])
        if len(parts) > 2:
            out["p_min"] = float(parts[2])
    except ValueError:
        raise TreeoptError(f"--policy chain:{arg}: write chain:N[,MIN[,PMIN]] (draft-max, draft-min, draft-p-min)") \
            from None
    if out["n_max"] < 1 or out.get("n_min", 0) < 0 or not 0.0 <= out.get("p_min", 0.0) <= 1.0:
        raise TreeoptError(f"--policy chain:{arg}: draft-max >= 1, draft-min >= 0, draft-p-min in [0, 1]")
    if out.get("n_min", 0) > out["n_max"]:  # every step would draft fewer than draft-min: plain decoding
        raise TreeoptError(f"--policy chain:{arg}: draft-min {out['n_min']} above draft-max {out['n_max']}: no step "
                           "would draft")
    return out


def _parse_dynamic(arg: str | None) -> dict[str, Any]:
    from ..dynamic import parse_setting

    try:
        return {"setting": parse_setting(arg or "")}
    except ValueError as err:
        raise TreeoptError(f"--policy dynamic:{arg or ''}: {err}") from None


#: Registry: ``--policy`` name -> :class:`PolicyKind` (the policies a run builds around one drafter and its tree;
#: the adaptive, graft and merge policies need profiles or two drafters and have their own ``run`` options).
POLICIES: dict[str, PolicyKind] = {}


def register_policy(kind: PolicyKind) -> PolicyKind:
    """Add a policy kind (``treeopt run --policy NAME[:ARG]`` then builds it). Raises ValueError when the name is
    taken."""
    if kind.name in POLICIES:
        raise ValueError(f"a policy kind named {kind.name!r} is already registered")
    POLICIES[kind.name] = kind
    return kind


register_policy(PolicyKind("static", "the tree of --tree every step (Sequoia)", _parse_none("static"),
                           lambda drafter, tree, o: StaticTreePolicy(drafter, tree), StaticTreePolicy))
register_policy(PolicyKind(
    "chain", "a chain grown token by token with llama.cpp's rule: chain[:N[,MIN[,PMIN]]] (draft-max, draft-min, "
    "draft-p-min; default draft-max: the tree's depth)", _parse_chain,
    lambda drafter, tree, o: ChainPolicy(drafter, o.get("n_max", max(1, tree.tree_depth)), o.get("n_min", 0),
                                         o.get("p_min", 0.0)), ChainPolicy))
register_policy(PolicyKind(
    "dynamic", "a tree chosen each step from the drafter's scores: dynamic:POLICY:steps=S,topk=K,budget=N",
    _parse_dynamic, lambda drafter, tree, o: DynamicPolicy(drafter, o["setting"]), DynamicPolicy))


def _parse_schedule(arg: str | None) -> dict[str, Any]:
    """``schedule:FILE``: a ``treeopt-schedule/1`` file (``treeopt tune -o``; chains, static trees or none) or a
    ``treeopt-batch-trees/1`` file (``treeopt solve --batch -o``; a tree per batch range)."""
    from ..solver.schedule import load_plan_trees

    if not arg:
        raise TreeoptError("--policy schedule:FILE needs a treeopt-schedule/1 file (treeopt tune -o FILE) or a "
                           "treeopt-batch-trees/1 file (treeopt solve --batch -o FILE)")
    ranges, doc, sched = load_plan_trees(arg)
    if sched is None:  # solve --batch's plan: its batch-1 entry's figures, where it solved batch 1 and states them
        first = (doc.get("entries") or [{}])[0]  # (a hand-written entry may leave them out: checked, not required)
        g, speedup = first.get("expected_tokens_per_step"), first.get("speedup")
        batch1 = {"expected_tokens_per_step": float(g), "predicted_speedup": float(speedup)} \
            if first.get("batch") == 1 and _positive_numbers(g, speedup) else {}
        return {"ranges": ranges, "source": arg, "solved_for": {}, "batch1": batch1}
    return {"ranges": ranges, "source": arg, "solved_for": _solved_for(doc, arg),
            "batch1": _batch1_prediction(doc, sched.ranges[0][2].label if sched.ranges else None)}


def _positive_numbers(*xs: Any) -> bool:
    """Whether every one of ``xs`` is a number (not a bool) above 0: a plan's figure a run may be held to."""
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in xs)


def _batch1_prediction(doc: Mapping[str, Any], served: str | None = None) -> dict[str, Any]:
    """The first range's prediction at batch 1 (what ``treeopt run`` serves: one request at a time), as a tree
    file's steady-state figures: ``expected_tokens_per_step`` and ``predicted_speedup`` (the plan's speedup over
    its answer length, divided by its ``length_factor``); empty when the plan predicts no batch 1. ``served``: the
    label of the setting the first range runs (``chain:3``); where its ``predicted`` block names another (a range's
    setting edited by hand, the block left as solved), the figures are that setting's among the plan's batch-1
    candidates, and empty where it has none: a run is never held to another setting's prediction. For a chain of
    K whose shorter chains the plan also priced at batch 1 (``by_batch`` candidates), ``extra`` holds what a tree
    file records for ``run`` to predict its own answer lengths: ``node_rates`` (position k's rate, G(k) - G(k - 1)
    over G(k - 1) - G(k - 2); where the chains were measured each on its own and those do not make one chain's
    rates, the one rate whose chain of K has the plan's G(K)) and ``depth_step_ms`` (chain:k's step for k = 0 ..
    K; :func:`~sequoia_opt.jobs.run.answer_factor`)."""
    ranges = doc.get("ranges") if isinstance(doc.get("ranges"), list) else []
    pred = ranges[0].get("predicted") if ranges and isinstance(ranges[0], Mapping) else None
    if not isinstance(pred, Mapping) or pred.get("batch") != 1:
        return {}
    if served is not None and str(pred.get("setting")) != served:
        pred = _batch1_candidates(doc).get(served)
        if pred is None:
            return {}
    g, speedup, lf = pred.get("expected_tokens_per_step"), pred.get("speedup"), pred.get("length_factor", 1.0)
    if not _positive_numbers(g, speedup, lf):
        return {}
    out: dict[str, Any] = {"expected_tokens_per_step": float(g), "predicted_speedup": float(speedup) / float(lf)}
    extra = _chain_run_checks(doc, pred)
    if extra:
        out["extra"] = extra
    return out


def _batch1_candidates(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """A plan's batch-1 figures by setting label (``by_batch``'s candidates, and plain decoding as ``none``);
    empty where the plan has no batch-1 row."""
    row = next((r for r in doc.get("by_batch") or [] if isinstance(r, Mapping) and r.get("batch") == 1), None) or {}
    cands = {str(c.get("setting")): c for c in row.get("candidates") or [] if isinstance(c, Mapping)}
    if isinstance(row.get("plain"), Mapping):
        cands.setdefault("none", row["plain"])
    return cands


def _chain_run_checks(doc: Mapping[str, Any], pred: Mapping[str, Any]) -> dict[str, Any]:
    """``node_rates`` and ``depth_step_ms`` of the batch-1 chain ``pred`` from the plan's batch-1 candidates (every
    chain:k, k <= K, and none); empty where one is missing, the first range's setting is not ``pred``'s chain, a
    figure is not a number, or the candidates' G(K) is not the prediction's (a hand-edited plan: its own steady
    figures are shown then)."""
    setting = str(pred.get("setting", ""))
    if not setting.startswith("chain:"):
        return {}
    try:
        K = int(setting.split(":", 1)[1])
    except ValueError:
        return {}
    first = (doc.get("ranges") or [{}])[0]
    shape = first.get("setting") if isinstance(first, Mapping) else None
    if not isinstance(shape, Mapping) or shape.get("shape") != "chain" or shape.get("draft_tokens") != K:
        return {}
    cands = _batch1_candidates(doc)
    if not 1 <= K < len(cands):  # every chain:k and none priced, K + 1 of them (no loop over a typed K)
        return {}

    def number(x: Any) -> float | None:
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None

    names = ["none"] + [f"chain:{k}" for k in range(1, K + 1)]
    g = [number(cands[n].get("expected_tokens_per_step")) if n in cands else None for n in names]
    ms = [number(cands[n].get("step_ms")) if n in cands else None for n in names]
    if any(x is None for x in g + ms) or not all(m > 0 for m in ms) or not 1.0 <= g[-1] <= K + 1 \
            or abs(g[-1] - float(pred.get("expected_tokens_per_step") or 0)) > 1e-3 * g[-1]:
        return {}
    reach = [b - a for a, b in zip(g, g[1:])]  # P(position k accepted), k = 1 .. K
    if all(0 <= r <= q <= 1 for r, q in zip(reach, [1.0] + reach)):
        rates = [r / q if q > 0 else 0.0 for r, q in zip(reach, [1.0] + reach)]
    else:  # each chain measured on its own (a plan from traces): one rate a with 1 + a + .. + a^K = G(K)
        from ..solver.generation import chain_rate

        rates = [chain_rate(g[-1], K)] * K
    return {"node_rates": [round(r, 6) for r in rates], "depth_step_ms": ms}


def _plan_name(source: str, kind: str) -> str:
    return f"{Path(source).stem} ({kind})"


def _solved_for(doc: Mapping[str, Any], source: str = "the plan") -> dict[str, Any]:
    """What a plan file says it was solved for, as a tree file's ``profiled_*`` metadata (``target``, ``draft``,
    ``engine``, the acceptance's ``temperature``, the CPU ``threads`` its latency was timed with and the
    checkpoints' ``weights`` where tune recorded them): ``treeopt run`` warns when the loaded pair, its weights, its
    decoder, its temperature or its threads is another (:func:`~sequoia_opt.jobs.entries.tree_mismatch_warnings`).

    Raises:
        TreeoptError: a ``threads`` that is no whole number >= 1 (``source`` names the file)."""
    keys = (("target", "target"), ("draft", "drafter"), ("engine", "engine"))
    out: dict[str, Any] = {f"profiled_{k}": str(doc[field]) for k, field in keys if doc.get(field) not in (None, "")}
    if isinstance(doc.get("temperature"), (int, float)) and not isinstance(doc.get("temperature"), bool):
        out["profiled_temperature"] = float(doc["temperature"])
    threads = doc.get("threads")
    if threads is not None:  # tune writes a whole count >= 1; anything else is a hand edit gone wrong
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise TreeoptError(f"{source}: threads = {threads!r}: the CPU threads the plan's latency was timed with "
                               "must be a whole number >= 1 (or leave the key out)")
        out["profiled_threads"] = threads
    if isinstance(doc.get("weights"), Mapping):
        out["profiled_weights"] = dict(doc["weights"])
    return out


register_policy(PolicyKind(
    "schedule", "a speculation plan: the chain (or tree) of the batch range holding the live rows, "
    "schedule:FILE (treeopt tune -o FILE)", _parse_schedule,
    lambda drafter, tree, o: SchedulePolicy(drafter, o["ranges"]), SchedulePolicy,
    own_tree=lambda o: (_plan_name(o["source"], "schedule"), o["ranges"][0][2])))  # batch 1's: what run serves


_LIVE_KEYS = {"every": "every", "window": "window", "prior-weight": "prior_weight"}


def _parse_adaptive_schedule(arg: str | None) -> dict[str, Any]:
    """``adaptive-schedule:FILE[,every=N][,window=W][,prior-weight=X]``: a chain plan (``treeopt tune --schedule
    FILE``, with its ``by_batch`` candidates) re-ranked during the run from the live acceptance, every N steps (16)
    from the last W steps' trials (64), the plan's acceptance worth X pseudo-trials per depth (8)."""
    from ..solver.schedule import load_schedule

    if not arg:
        raise TreeoptError("--policy adaptive-schedule:FILE needs a treeopt-schedule/1 file with its by_batch "
                           "candidates (treeopt tune --schedule FILE)")
    parts = arg.split(",")
    cut = len(parts)  # options are the trailing KEY=VALUE parts; the path may hold commas itself
    while cut > 1 and parts[cut - 1].partition("=")[0].strip() in _LIVE_KEYS:
        cut -= 1
    path, rest = ",".join(parts[:cut]), parts[cut:]
    if cut > 1 and "=" in parts[cut - 1] and not Path(path).exists():
        raise TreeoptError(f"--policy adaptive-schedule:{arg}: {parts[cut - 1]!r} is not every=N (>= 1), window=W "
                           "(>= 1) or prior-weight=X (>= 0)")
    kw: dict[str, Any] = {}
    for item in rest:
        key, _, value = item.partition("=")
        name = _LIVE_KEYS.get(key.strip())
        try:
            num = float(value) if name == "prior_weight" else int(value)
        except ValueError:
            num = None
        if name is None or num is None or (num < 1 if name != "prior_weight" else not 0 <= num < float("inf")):
            raise TreeoptError(f"--policy adaptive-schedule:{arg}: {item!r} is not every=N (>= 1), window=W (>= 1) "
                               "or prior-weight=X (>= 0)")
        if name in kw:  # as --dynamic refuses a key given twice: which one would hold?
            raise TreeoptError(f"--policy adaptive-schedule:{arg}: gives {key.strip()} twice")
        kw[name] = num
    sched = load_schedule(path)
    adapter = PlanAdapter.of_document(sched.doc, path, **kw)  # refused here, before anything loads
    return {"doc": sched.doc, "source": path, "live": kw, "longest": max(adapter.ks),
            "solved_for": _solved_for(sched.doc, path)}


register_policy(PolicyKind(
    "adaptive-schedule", "a chain plan re-ranked during the run from the acceptance the requests show, "
    "adaptive-schedule:FILE[,every=N][,window=W][,prior-weight=X] (treeopt tune --schedule FILE)",
    _parse_adaptive_schedule,
    lambda drafter, tree, o: AdaptiveSchedulePolicy(drafter, PlanAdapter.of_document(o["doc"], o["source"],
                                                                                     **o.get("live", {}))),
    AdaptiveSchedulePolicy,
    own_tree=lambda o: (_plan_name(o["source"], "adaptive-schedule"), Tree.chain(o["longest"] + 1))))


def policy_kind(name: str) -> PolicyKind:
    """The registered policy kind ``name``. Raises TreeoptError naming the known kinds."""
    try:
        return POLICIES[name]
    except KeyError:
        raise TreeoptError(f"unknown --policy {name!r}; known: {', '.join(POLICIES)}") from None


def parse_policy(text: str | None) -> tuple[PolicyKind, dict[str, Any]]:
    """``--policy NAME[:ARG]`` -> (its kind, its options); None is ``static``. Nothing is loaded.

    Raises:
        TreeoptError: an unknown name, or the kind's own argument errors.
    """
    if text is not None and not text.strip():  # --policy '' ran the static tree without a word
        raise TreeoptError(f"--policy is empty: name one of {', '.join(sorted(POLICIES))} (default: static)")
    head, sep, rest = (text or "static").partition(":")
    kind = policy_kind(head.strip().lower())
    return kind, kind.parse(rest.strip() if sep else None)


_PLUGINS_LOADED: set[str] = set()


def _forget_kinds_since(drafters: dict[str, DrafterKind], policies: dict[str, PolicyKind]) -> None:
    """Put the registries back as they were (a failed plugin's kinds removed, in place: callers hold them)."""
    for now, before in ((DRAFTERS, drafters), (POLICIES, policies)):
        now.clear()
        now.update(before)


def _import_plugin_file_or_module(name: str) -> None:
    """Import one ``TREEOPT_PLUGINS`` entry: a ``.py`` path, or an importable module name."""
    import importlib
    import importlib.util
    import sys

    if not name.endswith(".py"):
        importlib.import_module(name)
        return
    path = Path(name).expanduser()
    spec = importlib.util.spec_from_file_location(f"treeopt_plugin_{path.stem}", path)
    if spec is None or not path.is_file():
        raise ImportError(f"no such file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


@functools.lru_cache(maxsize=1)
def _plugin_entry_points() -> tuple[Any, ...]:
    """The installed ``treeopt.plugins`` entry points, read once per process (a scan of every installed
    distribution's metadata, about 8 ms; the CLI asks for the plugins up to three times per command)."""
    from importlib.metadata import entry_points

    return tuple(entry_points(group="treeopt.plugins"))


def load_plugins(names: str | None = None) -> list[str]:
    """Import the plugins (module docstring): the modules in ``names`` (default: the ``TREEOPT_PLUGINS``
    environment variable, comma separated; ``.py`` paths or importable names) and the entry points of the group
    ``treeopt.plugins``. Each one registers its drafters and policies when imported; a plugin is imported once.
    A plugin that fails leaves no kind registered: loading it again (the CLI loads the plugins for a command's help,
    then in its root callback) fails with the same cause, not with "already registered" for the kinds its first
    run added before the failure.

    Returns:
        The plugins imported by this call.

    Raises:
        TreeoptError: a plugin that cannot be imported (its name and the reason, one line).
    """
    import os

    wanted = [x.strip() for x in (os.environ.get("TREEOPT_PLUGINS", "") if names is None else names).split(",")
              if x.strip()]
    plugins = [(name, f"plugin {name!r} (TREEOPT_PLUGINS)", functools.partial(_import_plugin_file_or_module, name))
               for name in wanted]
    plugins += [(ep.name, f"plugin {ep.name!r} (entry point {ep.value})", ep.load) for ep in _plugin_entry_points()]
    done = []
    for name, what, load in plugins:
        if name in _PLUGINS_LOADED:
            continue
        kinds = dict(DRAFTERS), dict(POLICIES)
        try:
            load()
        except Exception as err:  # a plugin's own failure, whatever it is, is reported as the plugin's
            _forget_kinds_since(*kinds)
            raise TreeoptError(f"{what} could not be loaded: {type(err).__name__}: {err}") from None
        _PLUGINS_LOADED.add(name)
        done.append(name)
    return done


def drafter_kind(name: str) -> DrafterKind:
    """The registered kind ``name``. Raises TreeoptError naming the known kinds."""
    try:
        return DRAFTERS[name]
    except KeyError:
        raise TreeoptError(f"unknown drafter kind {name!r}; known: {', '.join(DRAFTERS)}") from None


def head_engine_methods(label: str | None) -> Mapping[str, str] | None:
    """The engine methods of the feature-head drafter a profile names by its label (``eagle3:NAME``,
    ``eagle:NAME``, ``medusa:NAME``: the kind before the colon), for the engine exports of a tree or dynamic
    setting solved on that profile; None for any other drafter (a draft model, lookup, self:L) or none named.
    A feature head is served as the engine's own method (vLLM ``method: eagle3``, SGLang ``--speculative-algorithm
    EAGLE3``, ...), so its export must name it; other drafters keep the exports' defaults."""
    kind = DRAFTERS.get(str(label or "").partition(":")[0])
    return kind.engine_methods if kind is not None and kind.reads_features else None


def drafter_slug(label: str) -> str:
    """A drafter label as a file-name part: ``self:6`` -> ``self-L6``, ``lookup:1-3`` -> ``lookup-1-3``."""
    head, sep, rest = label.partition(":")
    if not sep:
        return label
    return f"{head}-L{rest}" if head == "self" else f"{head}-{rest}"


def parse_drafter_spec(spec: str | Path | DrafterSpec | None) -> DrafterSpec:
    """Parse ``--draft``: ``PATH`` | ``model:PATH`` | ``NAME`` | ``NAME:ARG`` of a registered kind (``self:L``,
    ``lookup``, ``lookup:MAX``, ``lookup:MIN-MAX``). Nothing is loaded; a checkpoint path must exist.

    None (or ``""``) is the bundled demo draft model. The range of L in ``self:L`` (1..n_layers - 1) is checked
    against the target's config by :func:`check_drafter`.

    Raises:
        TreeoptError: one line naming the problem: an unknown keyword or a path that does not exist, a kind's
            own argument errors (``self`` without L, a size that is not an integer >= 1, MIN > MAX).
    """
    if isinstance(spec, DrafterSpec):
        return spec
    if spec is None or str(spec).strip() == "":
        return DrafterSpec("model")
    text = str(spec) if isinstance(spec, Path) else spec.strip()
    head, sep, rest = text.partition(":")
    key = head.strip().lower()
    kind = DRAFTERS.get(key)
    if kind is not None and not kind.loads_model:
        return DrafterSpec(key, options=kind.parse(rest.strip() if sep else None, text))
    if kind is not None and not sep and kind.default_path is not None:
        if not kind.default_path().is_dir():
            raise TreeoptError(f"--draft {key}: the bundled {key} checkpoint is missing from {kind.default_path()} "
                               f"(write --draft {key}:PATH)")
        return DrafterSpec(key)
    if kind is not None and (sep and not rest.strip() or not sep and kind.name != "model"):
        raise TreeoptError(f"--draft {text!r} names no checkpoint: write {key}:PATH")
    path = Path(rest if kind is not None and sep else text).expanduser()
    if not path.exists() and kind is not None:  # a known kind: only its checkpoint is missing
        raise TreeoptError(f"--draft {text!r}: {path} does not exist (the checkpoint folder of {key}:PATH)")
    if kind is not None and kind.reads_features and not path.is_dir():  # a head is a folder: config + weights
        raise TreeoptError(f"--draft {text!r}: {path} is a file; {key}:PATH takes the head's checkpoint folder "
                           "(config.json and its weights)")
    if not path.exists():
        with_path = [k for k in DRAFTERS if DRAFTERS[k].loads_model and k != "model"]
        raise TreeoptError(f"--draft {text!r} names nothing known: not an existing checkpoint (HF folder or "
                           f".gguf), nor one of {', '.join(k for k in DRAFTERS if not DRAFTERS[k].loads_model)}, "
                           f"nor KIND:PATH for {', '.join(with_path)}")
    return DrafterSpec(key if kind is not None else "model", path=path)


def check_drafter(spec: DrafterSpec, target_config: Any, target_path: str | Path | None = None) -> None:
    """Check a drafter against the target before any weights load: the kind's own check on the target's
    :class:`~sequoia_opt.model.ModelConfig` (L of ``self:L`` in 1..n_layers - 1; a draft checkpoint's config
    readable), and, with ``target_path``, a draft model's tokenizer against the target's
    (:func:`~sequoia_opt.model.loaders.check_draft_checkpoint`: one tokenizer; embeddings may be padded to
    different sizes).

    Raises:
        TreeoptError: naming the problem (CheckpointError when a config or tokenizer cannot be read, or the
            tokenizers differ).
    """
    refuse_a_head_as_a_draft_model(spec)
    spec.entry.check(spec, target_config)
    if target_path is not None and spec.entry.loads_model and spec.entry.load is None:
        from ..model.loaders import check_draft_checkpoint

        check_draft_checkpoint(target_path, spec.path if spec.path is not None else bundled_draft_path())


def refuse_a_head_as_a_draft_model(spec: DrafterSpec) -> None:
    """Raise TreeoptError when ``spec`` is a draft model (``--draft PATH``) whose folder holds a feature head
    (EAGLE-3, EAGLE-1/2 or Medusa): named by its ``config.json`` (architecture, ``medusa_num_heads``, EAGLE-3's
    ``draft_vocab_size`` / ``eagle_config``), or, where the config says ``LlamaForCausalLM`` as draft models' do,
    by its tensor names (:func:`_head_kind_in_weights`). Read as a draft model a head failed later on its tokenizer,
    its ``.bin`` weights or its missing layers, in lines that never named the ``--draft KIND:PATH`` spelling.
    Anything unreadable is left to the loader's checks."""
    import json

    from ..model.head_checkpoints import EAGLE3_ARCHITECTURES, MEDUSA_ARCHITECTURES

    if spec.kind != "model" or spec.path is None:  # a kind named, or the bundled draft model
        return
    path = Path(spec.path)
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(cfg, dict):
        return
    archs = cfg.get("architectures") if isinstance(cfg.get("architectures"), list) else []
    kind = ("eagle3" if any(a in EAGLE3_ARCHITECTURES for a in archs) or "draft_vocab_size" in cfg
            or "eagle_config" in cfg else
            "medusa" if "medusa_num_heads" in cfg or any(a in MEDUSA_ARCHITECTURES for a in archs) else
            "eagle" if "EagleLlamaForCausalLM" in archs else _head_kind_in_weights(path))
    if kind is not None:
        raise TreeoptError(f"--draft {path} holds a feature head ({kind}), not a draft model: pass --draft "
                           f"{kind}:{path}")


def _head_kind_in_weights(path: Path) -> str | None:
    """``"eagle3"`` when a folder's weights hold EAGLE-3's ``midlayer.*`` or ``d2t``, ``"eagle"`` when they hold
    EAGLE-1/2's ``fc.weight`` (no Llama draft model has either), else None. Only names are read: the
    safetensors headers, and the pickled structure (``data.pkl``) of a zip-format ``pytorch_model.bin``, scanned
    with :mod:`pickletools` (nothing is unpickled, no tensor data is read)."""
    import pickletools
    import zipfile

    from safetensors import safe_open

    names: set[str] = set()
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as handle:
                names.update(handle.keys())
        except Exception:  # noqa: BLE001 (safetensors' own errors): an unreadable file is the loader's to name
            continue
    bin_file = path / "pytorch_model.bin"
    try:
        if bin_file.is_file() and zipfile.is_zipfile(bin_file):
            with zipfile.ZipFile(bin_file) as archive:
                pkl = next((n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
                if pkl is not None:
                    names.update(arg for _, arg, _ in pickletools.genops(archive.read(pkl)) if isinstance(arg, str))
    except Exception:  # noqa: BLE001 (zipfile's, pickletools' own errors): the loader names them
        pass
    if "d2t" in names or any(n.startswith("midlayer.") for n in names):
        return "eagle3"
    return "eagle" if "fc.weight" in names else None


#: The kinds this package registers itself (the CLI's ``--draft`` / ``--policy`` help describes them in its own
#: words); any other was registered by a plugin (:func:`plugin_kinds`).
_BUNDLED = (frozenset(DRAFTERS), frozenset(POLICIES))


def plugin_kinds() -> tuple[list[DrafterKind], list[PolicyKind]]:
    """The drafter and policy kinds registered by plugins (:func:`load_plugins`), in registration order: what the
    CLI's ``--draft`` and ``--policy`` help lists beside the bundled kinds, each with its ``summary``."""
    return ([k for n, k in DRAFTERS.items() if n not in _BUNDLED[0]],
            [k for n, k in POLICIES.items() if n not in _BUNDLED[1]])
