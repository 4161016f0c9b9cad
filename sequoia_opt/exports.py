"""Tree exports for serving engines, and imports of the choice lists people use today.

A :class:`~sequoia_opt.tree.Tree` is stored as ``treeopt-tree/1`` YAML (``parent`` / ``rank`` per node). This
module turns it into what other engines take, and reads their choice lists back. Formats (``fmt``):

``yaml``
    ``treeopt-tree/1`` YAML, exactly :func:`sequoia_opt.tree.tree_to_yaml`.
``json``
    The same document as JSON (``format``, ``metadata``, ``nodes``) plus a ``derived`` mapping (size, depth,
    level widths, choice list, expected tokens per step when an acceptance vector is given). ``derived`` is
    recomputed from ``nodes`` and ignored on import: the nodes are the only truth.
``medusa`` / ``tensorrt-llm``
    The choice list ``[[0], [0, 0], [1]]``: one rank path per non-root node, breadth-first, as a Python / JSON
    literal on one line. It is what Medusa's ``medusa_choices`` holds
    (https://github.com/FasterDecoding/Medusa, ``medusa/model/medusa_choices.py``; ``generate_medusa_buffers``
    in ``medusa/model/utils.py`` sorts it by ``(len, path)``, the same order as here) and what TensorRT-LLM's
    ``examples/run.py --medusa_choices="[[0], [0, 0], ...]"`` and the LLM API's
    ``MedusaDecodingConfig(medusa_choices=...)`` take (``examples/medusa/README.md`` in NVIDIA/TensorRT-LLM).
    Medusa needs depth <= the number of Medusa heads and every rank < the heads' top-k (``TOPK = 10`` in
    Medusa's ``utils.py``); TensorRT-LLM also needs the number of choices <= the engine's ``max_draft_len``.
``vllm``
    A ``--speculative-config`` JSON fragment: ``{"num_speculative_tokens": n - 1,
    "speculative_token_tree": "[(0,), (1,), (0, 0), ...]"}``. vLLM's ``SpeculativeConfig.speculative_token_tree``
    (``vllm/config/speculative.py``) is a *string* holding a Python literal list of rank-path tuples, parsed
    with ``ast.literal_eval`` and sorted by ``(len, path)``; vLLM's tests build it with
    ``num_speculative_tokens == len(tree)``. Its EAGLE proposer (``vllm/v1/spec_decode/eagle.py``,
    ``propose_tree``, added in vllm-project/vllm#20401) drafts one level at a time with a *single* child count
    per level, ``child_drafts_per_level[l] = drafts[l] // drafts[l - 1]``, taking the top-k draft tokens of
    every parent. The tree it drafts is therefore always the full tree with per-level branching
    ``(k_1, k_2, ...)``; give it any other shape and the drafted tokens no longer match the tree attention mask
    built from the list (``_prepare_tree_attn_bias`` in ``vllm/v1/attention/backends/tree_attn.py``). So
    only *level-uniform* trees export as they are; any other tree is projected first
    (:func:`project_level_uniform` with ``max_depth`` = the input's depth, so the projection needs no more
    draft forwards than the input) and the export says how many expected tokens per step that costs. The
    tree path runs only with an EAGLE-family method and the ``TREE_ATTN`` attention backend; merge the
    fragment with your ``method`` and ``model``. Upstream still called tree drafting incomplete
    (vllm-project/vllm#37396), then removed it: **only vLLM 0.10.1 to 0.20.2 accept this export**. 0.10.1 is
    the first release with the ``TREE_ATTN`` backend (0.10.0 has the config field but no backend), and
    vllm-project/vllm#42121 (May 2026) removed both the backend and ``speculative_token_tree``, so 0.21.0 and
    later reject it (checked in each release's wheel: ``vllm/v1/attention/backends/tree_attn.py`` and the
    field in ``vllm/config``). Later releases verify a chain: solve one with ``--max-branching 1`` and give
    vLLM its length as ``num_speculative_tokens``.
``sglang``
    SGLang does not take a tree: its EAGLE worker rebuilds one every step from the draft's scores, shaped by
    ``--speculative-num-steps`` (draft depth), ``--speculative-eagle-topk`` (children per expanded node, and
    nodes expanded per level) and ``--speculative-num-draft-tokens`` (tokens verified per step *including*
    the root: SGLang's docs say that with ``topk = 1`` it is adjusted to ``num_steps + 1``; see
    ``docs/advanced_features/speculative_decoding.md`` in sgl-project/sglang). The export maps a tree to
    ``steps = depth``, ``topk = max branching``, ``num_draft_tokens = n`` (capped at
    ``1 + topk + (steps - 1) * topk**2``, the number of candidates SGLang's beam produces), as JSON holding
    the server arguments and the flags string. It is the closest setting, not the same tree. For a feature
    head (``methods``) it names the algorithm and ``--speculative-draft-model-path``, a stand-in for the head's
    checkpoint (SGLang's EAGLE and EAGLE3 load the head from it), with a warning to replace it.

Exports are deterministic: the same tree gives the same text. Use :func:`export` for the text plus notes
(caveats, projection loss) a CLI can print; :func:`export_tree` for the text alone.
"""

from __future__ import annotations

import ast
import datetime as _dt
import json
import math
import numbers
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
import yaml

from ._io import check_numbers, load_json, read_text_file, safe_load_yaml, yaml_error_text
from .errors import EngineError, TreeoptError, TreeValidationError
from .solver.chains import ChainSetting
from .tree import TREE_FORMAT, Tree, TreeMetadata, tree_from_yaml, tree_to_yaml

EXPORT_FORMATS: tuple[str, ...] = ("yaml", "json", "medusa", "tensorrt-llm", "vllm", "sglang")
"""Every ``fmt`` :func:`export_tree` accepts."""

FORMAT_SUFFIXES: dict[str, str] = {
    "yaml": ".yaml",
    "json": ".json",
    "medusa": ".txt",
    "tensorrt-llm": ".txt",
    "vllm": ".json",
    "sglang": ".json",
}
"""A conventional file suffix for each format (the choice lists are plain literals, hence ``.txt``)."""

MEDUSA_TOPK = 10
"""Candidates per Medusa head in Medusa's reference code (``TOPK = 10`` in ``medusa/model/utils.py``)."""

VLLM_TREE_RELEASES = ("0.10.1", "0.20.2")
"""The first and last vLLM releases that accept ``speculative_token_tree`` (checked in the wheels: the
``TREE_ATTN`` backend arrived in 0.10.1; vllm-project/vllm#42121 removed it and the field, from 0.21.0)."""

TRTLLM_MAX_RANK = 15
"""Largest rank TensorRT-LLM's C++ runtime takes: ``computePrefix`` in
``cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp`` keys a node by its rank path packed 4 bits
per level into a 64-bit prefix, so a rank of 16 or more does not fit its 4 bits (the runtime refuses it;
without that check it would collide with another node's key)."""

TRTLLM_MAX_DEPTH = 16
"""Deepest choice path that 64-bit prefix holds (64 bits / 4 bits per level)."""

TRTLLM_TREE_RELEASES = "up to the 1.3 release candidates"
"""The TensorRT-LLM releases that take a choice list: ``eagle_choices`` (EAGLE, deprecated in 1.3: "will be removed
in release 1.4") is in the LLM API reference of 1.3.0rc27 and gone from 1.4.0rc1's (NVIDIA/TensorRT-LLM#18210);
``medusa_choices`` needs the legacy TensorRT backend (``MedusaDecodingConfig`` supports no PyTorch backend),
removed by #15918. Later releases take a draft length per batch size instead (:mod:`sequoia_opt.plan_exports`)."""


class ExportError(TreeoptError):
    """An export was asked for something it cannot do: an unknown format, a tree the engine cannot take
    (e.g. a root-only tree), or a malformed acceptance vector."""


@dataclass(frozen=True)
class Export:
    """One export: the text to write, the tree it describes, and what a user should be told.

    Attributes:
        fmt: the format name (one of :data:`EXPORT_FORMATS`).
        text: the exported text, ending with a newline.
        tree: the tree the text describes; for ``vllm`` the level-uniform projection when the input tree was
            not level-uniform, else the input tree.
        lost_tokens: expected tokens per step lost by projecting to a level-uniform tree (``vllm`` only):
            ``G(input) - G(exported)``, 0.0 when no projection was needed, None when a projection was made
            without an acceptance vector (the loss is then unknown). None for the other formats.
        notes: one-line caveats for the user (engine limits, projection, "closest setting" for SGLang); a
            projection note starts with ``"projected: lost X tokens/step"`` (or ``gained`` / ``unknown``).
        projected: True when the exported tree is a level-uniform projection of a different input tree.
        warnings: one-line problems the engine will have with this text as it is (a TensorRT-LLM rank past
            :data:`TRTLLM_MAX_RANK`, a vLLM release that no longer reads ``speculative_token_tree``).
    """

    fmt: str
    text: str
    tree: Tree
    lost_tokens: float | None = None
    notes: tuple[str, ...] = ()
    projected: bool = False
    warnings: tuple[str, ...] = ()


class Projection(NamedTuple):
    """Result of :func:`project_level_uniform`; unpacks as ``tree, lost_tokens``."""

    tree: Tree
    lost_tokens: float | None


# ---------------------------------------------------------------------------------------------- public API


def export_tree(
    tree: Tree,
    fmt: str,
    metadata: TreeMetadata | None = None,
    acceptance: Sequence[float] | None = None,
) -> str:
    """The text of ``tree`` in format ``fmt`` (see the module docstring). Same as ``export(...).text``.

    Raises:
        ExportError: unknown ``fmt``, a root-only tree for an engine format, or a malformed ``acceptance``.
    """
    return export(tree, fmt, metadata=metadata, acceptance=acceptance).text


def export(
    tree: Tree,
    fmt: str,
    metadata: TreeMetadata | None = None,
    acceptance: Sequence[float] | None = None,
    methods: Mapping[str, str] | None = None,
) -> Export:
    """Export ``tree`` as ``fmt`` and return the text with notes for the user (see :class:`Export`).

    Args:
        tree: the tree to export.
        fmt: one of :data:`EXPORT_FORMATS` (case-insensitive; ``trtllm`` / ``tensorrt_llm`` also accepted).
        metadata: written by ``yaml`` and ``json``; the engine formats have no place for it.
        acceptance: positional acceptance vector ``p_1..p_K``; used by ``json`` (derived expected tokens) and
            by ``vllm`` (to choose the best level-uniform projection and report the tokens lost).
        methods: the drafter's method per engine when the engine serves it as its own method (a feature
            head: :func:`~sequoia_opt.drafting.registry.head_engine_methods`): vLLM's ``method`` and SGLang's
            ``--speculative-algorithm`` are written, TensorRT-LLM's note names its decoding config, and an engine
            without that method is warned about. None: the drafter is the user's to name (as before).

    Raises:
        ExportError: unknown ``fmt``, a root-only tree for an engine format (medusa, tensorrt-llm, vllm, sglang),
            or a malformed ``acceptance`` (not numbers, empty, NaN or infinity).
    """
    key = normalise_format(fmt)
    p = None if acceptance is None else _check_acceptance(acceptance)
    if key in ("medusa", "tensorrt-llm", "vllm", "sglang") and tree.size < 2:
        raise ExportError(
            f"{key} export: the tree has only the root (no speculated token); run the engine without "
            "speculative decoding instead"
        )
    if key == "yaml":
        return Export(key, tree_to_yaml(tree, metadata), tree)
    if key == "json":
        return Export(key, _json_text(tree, metadata, p), tree)
    if key == "medusa":
        return Export(key, choices_literal(tree) + "\n", tree, notes=_medusa_notes(tree))
    if key == "tensorrt-llm":
        return Export(key, choices_literal(tree) + "\n", tree, notes=_trtllm_notes(tree, methods),
                      warnings=_trtllm_warnings(tree) + _no_method("tensorrt-llm", methods))
    if key == "vllm":
        return _export_vllm(tree, p, methods)
    return _export_sglang(tree, methods)


def _no_method(engine: str, methods: Mapping[str, str] | None) -> tuple[str, ...]:
    """A warning when a feature head's ``methods`` name none for ``engine`` (it cannot serve that head)."""
    if methods is None or engine in methods:
        return ()
    return (f"{engine} has no speculative method for this drafter (it serves it as {', '.join(sorted(methods))} "
            "only): the setting is the tree's, the engine cannot run it with this head",)


def choices_literal(tree: Tree, *, tuples: bool = False) -> str:
    """The choice list as a one-line literal: ``[[0], [0, 0], [1]]`` (Medusa / TensorRT-LLM, also valid JSON),
    or with ``tuples=True`` ``[(0,), (0, 0), (1,)]`` (vLLM's ``speculative_token_tree``). Breadth-first order,
    which is the ``(len, path)`` order Medusa and vLLM sort into."""
    paths = tree.choices()
    if tuples:
        return "[" + ", ".join(str(tuple(c)) for c in paths) + "]"
    return "[" + ", ".join("[" + ", ".join(str(r) for r in c) + "]" for c in paths) + "]"


# ---------------------------------------------------------------------------------------------- level-uniform


def level_branching(tree: Tree) -> tuple[int, ...] | None:
    """Per-level branching ``(k_1, .., k_D)`` when ``tree`` is level-uniform, else None.

    A tree is level-uniform when every node at depth ``l - 1`` has the same number ``k_l`` of children, for
    every level ``l = 1..D`` (D = tree depth); it is then the full tree with level widths
    ``k_1, k_1 k_2, ...``. A root-only tree is level-uniform with ``()``.
    """
    branching = []
    for sl in tree.level_slices[:-1]:
        counts = {len(tree.children[i]) for i in range(sl.start, sl.stop)}
        if len(counts) != 1:
            return None
        branching.append(counts.pop())
    return tuple(branching)


def is_level_uniform(tree: Tree) -> bool:
    """True when every node at a given depth has the same number of children (what vLLM can draft)."""
    return level_branching(tree) is not None


def level_uniform_tree(branching: Sequence[int]) -> Tree:
    """The full tree where every node at depth ``l - 1`` has ``branching[l - 1]`` children (ranks 0..k-1).

    ``level_uniform_tree([2, 1])`` is the root, two children, and one child under each: 5 nodes.
    ``level_uniform_tree([])`` is the root alone. Raises ExportError for a branching below 1.
    """
    parent, rank = [-1], [0]
    level = [0]
    for k in branching:
        k = int(k)
        if k < 1:
            raise ExportError(f"level branching must be >= 1, got {list(branching)}")
        nxt = []
        for v in level:
            for r in range(k):
                nxt.append(len(parent))
                parent.append(v)
                rank.append(r)
        level = nxt
    return Tree(parent=parent, rank=rank)


def project_level_uniform(
    tree: Tree, acceptance: Sequence[float] | None = None, *, max_depth: int | None = None
) -> Projection:
    """Project ``tree`` onto the level-uniform trees vLLM can draft, with at most ``tree.size`` nodes.

    A level-uniform tree is returned unchanged with ``lost_tokens = 0.0``.

    With an acceptance vector ``p``: the level-uniform tree of at most ``n = tree.size`` nodes (and depth at
    most ``max_depth`` when given) maximising the expected tokens per step G, found exactly by a dynamic
    program over per-level branching factors. For branching ``(k_1..k_D)`` every level's paths factor, so
    ``G = 1 + sum_l prod_{i<=l} s(k_i)`` with ``s(k) = p_1 + .. + p_k``; the program is
    ``best(b, w) = max(0, max_k s(k) (1 + best(b - w k, w k)))`` over the remaining budget b and current
    width w. Ties go to fewer children per level, and a rank that is never accepted (past the last positive
    ``p_k``) is never added. ``lost_tokens = G(tree) - G(projection)``; it is >= 0 whenever
    ``tree`` is optimal for ``p`` among trees of its size (as the solver's trees are), and can be negative
    for a tree that is not (the projection may then beat it).

    Without an acceptance vector (loss unknown, ``lost_tokens = None``), a width-matching rule that keeps
    the tree's shape and size as closely as possible: level by level, the projected width is the largest
    multiple of the previous projected width that does not exceed the original level width (at least the
    previous width, i.e. ``k_l = max(1, w_l // W_{l-1})``), stopping at the first level that would take the
    total past n nodes or past the original depth.
    """
    if level_branching(tree) is not None and (max_depth is None or tree.tree_depth <= max_depth):
        return Projection(tree, 0.0)
    n = tree.size
    if acceptance is None:
        widths = tree.level_widths
        depth_limit = len(widths) - 1 if max_depth is None else min(len(widths) - 1, max_depth)
        branching: list[int] = []
        used, prev = 1, 1
        for level in range(1, depth_limit + 1):
            k = max(1, widths[level] // prev)
            if used + prev * k > n:
                break
            branching.append(k)
            prev *= k
            used += prev
        return Projection(level_uniform_tree(branching), None)
    p = _check_acceptance(acceptance)
    branching = _best_level_branching(p, n, max_depth)
    projected = level_uniform_tree(branching)
    return Projection(projected, tree.expected_tokens(p) - projected.expected_tokens(p))


def _best_level_branching(p: np.ndarray, n: int, max_depth: int | None) -> list[int]:
    """Exact DP for the best per-level branching with at most ``n`` nodes (root included) and at most
    ``max_depth`` levels; see :func:`project_level_uniform`."""
    budget = n - 1  # non-root nodes available
    positive = np.flatnonzero(p > 0)
    if budget < 1 or positive.size == 0 or (max_depth is not None and max_depth < 1):
        return []
    # s[k] = mass of the first k ranks. A rank beyond the last positive entry is never accepted, so a
    # level never needs more children than that.
    s = np.concatenate([[0.0], np.cumsum(p)])
    k_max = min(int(positive[-1]) + 1, budget)
    if max_depth is None or max_depth >= budget:
        return _dp_unlimited(s, k_max, budget)
    return _dp_depth_limited(s, k_max, budget, max_depth)


def _level_widths_reachable(k_max: int, budget: int) -> list[int]:
    """Every level width a level-uniform tree can have: products of factors <= k_max, at most budget."""
    seen, frontier = {1}, [1]
    while frontier:
        nxt = []
        for w in frontier:
            for k in range(2, k_max + 1):
                if w * k <= budget and w * k not in seen:
                    seen.add(w * k)
                    nxt.append(w * k)
        frontier = nxt
    return sorted(seen)


def _improve(row: np.ndarray, ch: np.ndarray, lo: int, hi: int, cand: np.ndarray, k: int) -> None:
    """``row[lo:hi] = max(row[lo:hi], cand)`` in place, recording ``k`` where ``cand`` is strictly better
    (relative tolerance, so ties keep the earlier choice)."""
    cur = row[lo:hi]
    better = cand > cur * (1.0 + 1e-12) + 1e-300
    row[lo:hi] = np.where(better, cand, cur)
    ch[lo:hi] = np.where(better, k, ch[lo:hi])


def _dp_unlimited(s: np.ndarray, k_max: int, budget: int) -> list[int]:
    # best[w, b]: the most expected tokens the levels below a level of width w can add (in units of that
    # level's path mass) with b nodes left. k >= 2 reads wider rows (filled first, w descending); k = 1
    # reads the same row b - w back, filled in blocks of w so each block reads a finished one.
    size = budget + 1
    best = np.zeros((size, size))
    choice = np.zeros((size, size), dtype=np.int32)
    for w in reversed(_level_widths_reachable(k_max, budget)):
        row, ch = best[w], choice[w]
        for k in range(2, min(k_max, budget // w) + 1):
            wk = w * k
            _improve(row, ch, wk, size, s[k] * (1.0 + best[wk, : size - wk]), k)
        if s[1] > 0:  # k = 1 wins ties, like the smallest k does in _dp_depth_limited
            for lo in range(w, size, w):
                hi = min(lo + w, size)
                cand, cur = s[1] * (1.0 + row[lo - w : hi - w]), row[lo:hi]
                take = cand >= cur * (1.0 - 1e-12)
                row[lo:hi] = np.where(take, cand, cur)
                ch[lo:hi] = np.where(take, 1, ch[lo:hi])
    out, b, w = [], budget, 1
    while w <= b and choice[w, b]:
        k = int(choice[w, b])
        out.append(k)
        b, w = b - w * k, w * k
    return out


def _dp_depth_limited(s: np.ndarray, k_max: int, budget: int, levels: int) -> list[int]:
    # best_d[w, b]: as in _dp_unlimited with at most d more levels; best_d reads only best_{d-1}.
    size = budget + 1
    prev = np.zeros((size, size))
    choice = np.zeros((levels, size, size), dtype=np.int8 if k_max < 128 else np.int32)
    widths = _level_widths_reachable(k_max, budget)
    for d in range(levels):
        cur = np.zeros((size, size))
        for w in widths:
            row, ch = cur[w], choice[d, w]
            for k in range(1, min(k_max, budget // w) + 1):
                wk = w * k
                _improve(row, ch, wk, size, s[k] * (1.0 + prev[wk, : size - wk]), k)
        prev = cur
    out, b, w = [], budget, 1
    for d in range(levels - 1, -1, -1):
        k = int(choice[d, w, b]) if w <= b else 0
        if not k:
            break
        out.append(k)
        b, w = b - w * k, w * k
    return out


# ---------------------------------------------------------------------------------------------- imports


def import_choices(text_or_list: Any, *, name: str | None = None, **limits: Any) -> Tree:
    """Build a tree from a Medusa / TensorRT-LLM choice list (or a vLLM ``speculative_token_tree``).

    Accepts a list/tuple of rank paths (``[[0], [0, 0], [1]]`` or ``[(0,), (0, 0), (1,)]``), or text holding
    one as a Python or JSON literal. The text may also be a Python file of assignments such as Medusa's
    ``medusa_choices.py`` (``vicuna_7b_stage2 = [[0], ...]``): pass ``name`` to pick one when there are
    several. Text is parsed with :func:`ast.literal_eval` only, never executed. The order of the paths does
    not matter; every prefix of a path must be listed, no path twice, no rank gap. ``limits`` (``max_depth``,
    ``max_branching``) go to :class:`Tree`.

    Raises:
        TreeValidationError: malformed text, a path that is not a list of non-negative integers, or an
            invalid tree (missing prefix, duplicate, rank gap, limits).
    """
    if isinstance(text_or_list, (bytes, bytearray)):
        text_or_list = text_or_list.decode("utf-8", errors="replace")
    value = _parse_choice_text(text_or_list, name) if isinstance(text_or_list, str) else text_or_list
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise TreeValidationError(
            f"a choice list must be a list of rank paths such as [[0], [0, 0], [1]], got {type(value).__name__}"
        )
    paths = []
    for c in value:
        if isinstance(c, np.ndarray):
            c = c.tolist()
        if not isinstance(c, (list, tuple)) or any(
            isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in c
        ):
            raise TreeValidationError(f"choice {c!r} is not a list of integer ranks")
        paths.append(tuple(c))
    return Tree.from_choices(paths, **limits)


def load_any_tree(path: str | Path) -> tuple[Tree, TreeMetadata]:
    """Read a tree from a ``treeopt-tree/1`` YAML file, a JSON export (``json`` or ``vllm``), or a choice-list
    file (a literal ``[[0], [0, 0], [1]]``, or a Python file with one ``name = [...]`` assignment).

    Returns the tree and its metadata; for an imported list the metadata says ``solver: import:medusa`` (or
    ``import:vllm``), with ``budget`` and ``max_depth`` set to the tree's size and depth.

    Raises:
        TreeValidationError: the file cannot be read, is none of these formats, or holds an invalid tree;
            :class:`~sequoia_opt.errors.MultiDrafterTreeError` for a grafted tree (read by
            :func:`~sequoia_opt.tree.load_drafter_tree`).
    """
    path = Path(path)
    text = read_text_file(path, error=TreeValidationError, what="tree file")
    source = str(path)
    stripped = text.lstrip()
    if not stripped:
        raise TreeValidationError(f"{source}: the file is empty")
    try:
        if stripped.startswith("{"):
            try:
                return _tree_from_mapping(load_json(text), None, source)
            except ValueError as err:
                if isinstance(err, TreeValidationError):
                    raise
                try:  # a YAML flow mapping is not JSON but is still a treeopt document
                    doc = safe_load_yaml(text)
                except yaml.YAMLError:
                    doc = None
                if not isinstance(doc, dict):
                    raise TreeValidationError(f"{source}: not valid JSON ({err})") from None
                return _tree_from_mapping(doc, text, source)
        if stripped.startswith(("[", "(")):
            return _imported(import_choices(text), "import:medusa")
        try:
            doc = safe_load_yaml(text)
        except yaml.YAMLError as err:
            doc = None
            first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")),
                         "")
            if re.match(r"[A-Za-z_][\w-]*\s*:", first):  # 'format: ...': a YAML document, broken
                raise TreeValidationError(f"not valid YAML ({yaml_error_text(err)})") from None
        if isinstance(doc, dict):
            return _tree_from_mapping(doc, text, source)
        try:
            return _imported(import_choices(text), "import:medusa")
        except TreeValidationError as err:
            raise TreeValidationError(
                f"not a treeopt-tree/1 YAML, a JSON export or a choice list ({err})"
            ) from None
    except TreeValidationError as err:  # its own type kept (MultiDrafterTreeError: the grafted-tree path reads it)
        msg = str(err)
        raise type(err)(msg if msg.startswith(source) else f"{source}: {msg}") from None


# ---------------------------------------------------------------------------------------------- internals


_ALIASES = {"trtllm": "tensorrt-llm", "tensorrt_llm": "tensorrt-llm", "trt-llm": "tensorrt-llm", "yml": "yaml"}


def normalise_format(fmt: str) -> str:
    """The canonical name of an export format (case-insensitive; ``trtllm``, ``tensorrt_llm``, ``trt-llm``
    and ``yml`` are aliases). Raises :class:`ExportError` naming the formats for an unknown one."""
    key = str(fmt).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in EXPORT_FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of: {', '.join(EXPORT_FORMATS)}")
    return key


def _check_acceptance(acceptance: Sequence[float]) -> np.ndarray:
    try:
        p = np.asarray(acceptance, dtype=np.float64)
    except (TypeError, ValueError):
        raise ExportError("the acceptance vector must be a list of numbers") from None
    if p.ndim != 1 or p.size == 0:
        raise ExportError("the acceptance vector must be a non-empty list of numbers")
    if not np.all(np.isfinite(p)):
        raise ExportError("the acceptance vector contains NaN or infinity")
    if np.any(p < 0):
        raise ExportError("the acceptance vector has a negative entry")
    if p.sum() > 1 + 1e-6:
        raise ExportError(f"the acceptance vector sums to {p.sum():.6g} > 1")
    return p


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (_dt.date, _dt.datetime)):
        return obj.isoformat()
    if isinstance(obj, np.generic):
        return obj.item()
    raise ExportError(f"metadata value {obj!r} ({type(obj).__name__}) cannot be written as JSON")


def _finite_or_none(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _json_text(tree: Tree, metadata: TreeMetadata | None, p: np.ndarray | None) -> str:
    meta = {k: _finite_or_none(v) for k, v in (metadata or TreeMetadata()).to_dict().items()}
    derived: dict[str, Any] = {
        "note": "derived from nodes, ignored on import",
        "size": tree.size,
        "depth": tree.tree_depth,
        "level_widths": list(tree.level_widths),
        "max_branching": tree.max_branching_used,
        "level_uniform": is_level_uniform(tree),
    }
    if p is not None:
        derived["expected_tokens_per_step"] = tree.expected_tokens(p)

    def dumps(v: Any, indent: int | None = None) -> str:
        return json.dumps(v, indent=indent, default=_json_default, allow_nan=False, ensure_ascii=False)

    def block(items: list[str], pad: str) -> str:
        return "[]" if not items else "[\n" + ",\n".join(pad + "  " + it for it in items) + "\n" + pad + "]"

    meta_text = dumps(meta, indent=2).replace("\n", "\n  ")
    nodes = [f'{{"parent": {p_}, "rank": {r}}}' for p_, r in zip(tree.parent, tree.rank)]
    derived_lines = [f"    {dumps(k)}: {dumps(v)}" for k, v in derived.items()]
    derived_lines.append(f'    "choices": {block([dumps(c) for c in tree.choices()], "    ")}')
    return (
        "{\n"
        f'  "format": {dumps(TREE_FORMAT)},\n'
        f'  "metadata": {meta_text},\n'
        f'  "nodes": {block(nodes, "  ")},\n'
        '  "derived": {\n' + ",\n".join(derived_lines) + "\n  }\n"
        "}\n"
    )


def _medusa_notes(tree: Tree) -> tuple[str, ...]:
    depth, top_rank = tree.tree_depth, max(tree.rank)
    notes = [f"{tree.size - 1} choices, depth {depth}: needs at least {depth} Medusa heads",
             "for Medusa's own code (FasterDecoding/Medusa: medusa_choices, as medusa/model/medusa_choices.py "
             "holds them); TensorRT-LLM took this list only " + TRTLLM_TREE_RELEASES + " (--format tensorrt-llm)"]
    if top_rank >= MEDUSA_TOPK:
        notes.append(
            f"rank {top_rank} >= {MEDUSA_TOPK}: Medusa's reference code takes the top {MEDUSA_TOPK} tokens per "
            "head, raise its TOPK"
        )
    return tuple(notes)


def _trtllm_notes(tree: Tree, methods: Mapping[str, str] | None = None) -> tuple[str, ...]:
    method = (methods or {}).get("tensorrt-llm")
    if method == "Eagle3":
        return (f"{tree.size - 1} choices, depth {tree.tree_depth}: EagleDecodingConfig(decoding_type Eagle3, "
                f"eagle_choices=..., max_draft_len >= {tree.tree_depth}) with your EAGLE-3 head's checkpoint",)
    return (f"{tree.size - 1} choices, depth {tree.tree_depth}: needs at least {tree.tree_depth} Medusa heads, "
            f"and max_draft_len >= {tree.size - 1} in the engine",)


def _trtllm_warnings(tree: Tree) -> tuple[str, ...]:
    """TensorRT-LLM's limits on a choice list (see :data:`TRTLLM_MAX_RANK`), one line each."""
    out = [f"only TensorRT-LLM {TRTLLM_TREE_RELEASES} take a choice list: 1.4.0rc1 and later have no eagle_choices "
           "(#18210), and medusa_choices needs the legacy TensorRT backend removed by #15918; for later releases "
           "give a draft length per batch size (treeopt tune --engine tensorrt-llm)"]
    top_rank = max(tree.rank)
    if top_rank > TRTLLM_MAX_RANK:
        wide = sum(1 for r in tree.rank[1:] if r > TRTLLM_MAX_RANK)
        out.append(
            f"rank {top_rank} > {TRTLLM_MAX_RANK} ({wide} nodes): TensorRT-LLM keys a node by its ranks packed "
            f"4 bits per level, so every rank must be <= {TRTLLM_MAX_RANK}; re-solve with --max-branching "
            f"{TRTLLM_MAX_RANK + 1}"
        )
    if tree.tree_depth > TRTLLM_MAX_DEPTH:
        out.append(
            f"depth {tree.tree_depth} > {TRTLLM_MAX_DEPTH}: TensorRT-LLM's 64-bit rank-path key holds at most "
            f"{TRTLLM_MAX_DEPTH} levels; re-solve with --max-depth {TRTLLM_MAX_DEPTH}"
        )
    return tuple(out)


def _export_vllm(tree: Tree, p: np.ndarray | None, methods: Mapping[str, str] | None = None) -> Export:
    notes = []
    method = (methods or {}).get("vllm")
    lost: float | None = 0.0
    out_tree = tree
    branching = level_branching(tree)
    if branching is None:
        out_tree, lost = project_level_uniform(tree, p, max_depth=tree.tree_depth)
        branching = level_branching(out_tree)
        if out_tree.size < 2:
            raise ExportError(
                "vllm export: no level-uniform tree with a speculated token fits (acceptance vector all zero)"
            )
        how = (
            f"lost {lost:.4f} tokens/step" if lost is not None and lost >= 0
            else f"gained {-lost:.4f} tokens/step (the input tree is not optimal for this acceptance vector)"
            if lost is not None
            else "tokens/step lost unknown (give an acceptance vector to choose the best projection)"
        )
        notes.append(
            f"projected: {how}; vLLM drafts level-uniform trees only, exported branching "
            f"{list(branching)} ({out_tree.size} nodes, depth {out_tree.tree_depth}; the input tree has "
            f"{tree.size} nodes, depth {tree.tree_depth})"
        )
    notes.append(
        ("merge into --speculative-config with an EAGLE-family method and model" if method is None else
         f"merge into --speculative-config with \"model\": your {method} head's checkpoint")
        + "; the tree path needs the TREE_ATTN attention backend"
    )
    first, last = VLLM_TREE_RELEASES
    warnings = (
        f"only vLLM {first} to {last} accept speculative_token_tree: vLLM removed tree drafting and its "
        "TREE_ATTN backend in May 2026 (vllm-project/vllm#42121), so 0.21.0 and later reject this setting",
    ) + _no_method("vllm", methods)
    if method is not None and method not in ("eagle", "eagle3"):
        warnings += (f"vLLM drafts trees with its EAGLE proposer only: method {method!r} proposes a chain",)
    doc = {
        **({"method": method} if method is not None else {}),
        "num_speculative_tokens": out_tree.size - 1,
        "speculative_token_tree": choices_literal(out_tree, tuples=True),
    }
    return Export(
        "vllm", json.dumps(doc, indent=2) + "\n", out_tree, lost_tokens=lost, notes=tuple(notes),
        projected=out_tree is not tree, warnings=warnings,
    )


def _export_sglang(tree: Tree, methods: Mapping[str, str] | None = None) -> Export:
    algo = (methods or {}).get("sglang")
    steps = tree.tree_depth
    topk = tree.max_branching_used
    capacity = 1 + topk + (steps - 1) * topk * topk
    num_draft_tokens = min(tree.size, capacity)
    notes = [
        "SGLang re-chooses its tree every step from the draft's scores: this is the closest setting, not the "
        "same tree"
    ]
    if num_draft_tokens < tree.size:
        notes.append(
            f"num_draft_tokens capped at {capacity} (SGLang's beam offers 1 + topk + (steps - 1) * topk^2 "
            f"candidates with steps {steps}, topk {topk}; the tree has {tree.size} nodes)"
        )
    head = _sglang_head_path(algo)
    flags = (
        (f"--speculative-algorithm {algo} --speculative-draft-model-path {head} " if algo else "")
        + f"--speculative-num-steps {steps} --speculative-eagle-topk {topk} "
        f"--speculative-num-draft-tokens {num_draft_tokens}"
    )
    doc = {
        **({"speculative_algorithm": algo, "speculative_draft_model_path": head} if algo else {}),
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": num_draft_tokens,
        "cli_flags": flags,
        "note": notes[0],
    }
    return Export("sglang", json.dumps(doc, indent=2) + "\n", tree, notes=tuple(notes),
                  warnings=_no_method("sglang", methods) + ((_sglang_head_warning(head),) if algo else ()))


def _sglang_head_path(algo: str | None) -> str:
    """The stand-in for the head's checkpoint in SGLang's ``--speculative-draft-model-path``, which its EAGLE and
    EAGLE3 algorithms load the head from (they have no other way to find it)."""
    return "<your EAGLE-3 head>" if algo == "EAGLE3" else "<your EAGLE head>"


def _sglang_head_warning(head: str) -> str:
    """The warning that goes with :func:`_sglang_head_path`'s stand-in, one line."""
    return (f"the flags name the head {head}: replace it with the head's checkpoint SGLang loads "
            "(--speculative-draft-model-path: a Hugging Face id or a path)")


def _parse_choice_text(text: str, name: str | None) -> Any:
    stripped = text.strip()
    if not stripped:
        raise TreeValidationError("empty choice list text")
    try:
        module = ast.parse(stripped, mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise TreeValidationError(f"choice list is not a Python/JSON literal ({err.__class__.__name__})") from None
    candidates: dict[str | None, ast.AST] = {}
    for stmt in module.body:
        if isinstance(stmt, ast.Expr):
            candidates[None] = stmt.value
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            candidates[stmt.targets[0].id] = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            candidates[stmt.target.id] = stmt.value
        else:
            raise TreeValidationError(
                "choice list text may hold only a literal or `name = [...]` assignments "
                f"(line {getattr(stmt, 'lineno', '?')})"
            )
    if name is not None:
        if name not in candidates:
            found = ", ".join(sorted(k for k in candidates if k)) or "none"
            raise TreeValidationError(f"no choice list named {name!r} (found: {found})")
        node = candidates[name]
    elif len(candidates) == 1:
        node = next(iter(candidates.values()))
    elif not candidates:
        raise TreeValidationError("no choice list found in the text")
    else:
        found = ", ".join(sorted(str(k) for k in candidates))
        raise TreeValidationError(f"several choice lists ({found}); pick one by name")
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        raise TreeValidationError("choice list is not a literal list of rank paths (no expressions allowed)") from None


def _imported(tree: Tree, solver: str) -> tuple[Tree, TreeMetadata]:
    return tree, TreeMetadata(budget=tree.size, max_depth=tree.tree_depth, solver=solver)


def _tree_from_mapping(doc: Any, yaml_text: str | None, source: str) -> tuple[Tree, TreeMetadata]:
    """A parsed JSON object or YAML mapping: a vLLM speculative config, or a treeopt-tree/1 document.
    ``yaml_text`` is the original text when it was YAML (read as is), None for JSON."""
    if not isinstance(doc, dict):
        raise TreeValidationError("expected a JSON object with 'format' and 'nodes'")
    if "speculative_token_tree" in doc:
        tree = import_choices(doc["speculative_token_tree"])
        n_spec = doc.get("num_speculative_tokens")
        if n_spec is not None and n_spec != tree.size - 1:
            raise TreeValidationError(
                f"num_speculative_tokens is {n_spec} but speculative_token_tree has {tree.size - 1} nodes"
            )
        return _imported(tree, "import:vllm")
    if "format" not in doc:
        raise TreeValidationError("no 'format' key: not a treeopt-tree/1 document or a vLLM speculative config")
    if yaml_text is not None:
        return tree_from_yaml(yaml_text, source=source)
    # JSON: the derived block is never truth; validate the rest exactly as the YAML reader does.
    core = {k: doc[k] for k in ("format", "metadata", "drafters", "nodes") if k in doc}
    return tree_from_yaml(yaml.safe_dump(core, sort_keys=False), source=source)


# ---------------------------------------------------------------------------------------------- dynamic settings
DYNAMIC_FORMAT = "treeopt-dynamic/1"
DYNAMIC_EXPORT_FORMATS: tuple[str, ...] = ("yaml", "json", "sglang", "tensorrt-llm")


def export_dynamic(setting: Any, fmt: str, *, predicted: dict[str, Any] | None = None,
                   provenance: dict[str, Any] | None = None, methods: Mapping[str, str] | None = None) -> Export:
    """Export a dynamic-tree setting (:class:`~sequoia_opt.dynamic.DynamicSetting`).

    Formats:

    ``yaml`` / ``json``
        ``treeopt-dynamic/1``: ``setting`` (policy, steps, topk, budget), ``predicted`` (tokens per step,
        tokens/s, speedup, ...) and ``provenance`` (the calibration and latency profile ids); ``treeopt run
        --dynamic FILE`` reads it.
    ``sglang``
        The EAGLE server arguments, as JSON with the flags string: ``--speculative-algorithm EAGLE
        --speculative-draft-model-path <your EAGLE head> --speculative-num-steps S --speculative-eagle-topk K
        --speculative-num-draft-tokens N`` (N counts the root, as treeopt's budget does). SGLang's worker expands
        the top-K frontier for S steps and keeps the N best by path probability: the ``eagle`` rule.
    ``tensorrt-llm``
        The LLM API's ``speculative_config`` for EAGLE-3 with a dynamic tree (``extra_llm_api_options`` YAML
        of ``trtllm-serve``; ``EagleDecodingConfig`` fields): ``decoding_type: Eagle3``, ``max_draft_len: S``,
        ``use_dynamic_tree: true``, ``dynamic_tree_max_topK: K``, ``max_total_draft_tokens: N - 1`` (TensorRT-LLM
        counts draft tokens without the root), and ``speculative_model`` left for the user. No
        ``eagle3_one_model``: the dynamic tree runs in the one-model worker (``Eagle3OneModelDynamicTreeWorker``),
        the default; the two-model path is deprecated (NVIDIA/TensorRT-LLM#11761) and the field is absent from the
        1.3.0rc27 and 1.4 API references, whose strict config refuses an unknown key.

    Both engines draft by EAGLE-2 re-ranking only: ``entropy`` and ``best-first`` settings have no engine
    setting (ExportError). vLLM has no dynamic tree; releases 0.10.1 to 0.20.2 take a static tree
    (:data:`VLLM_TREE_RELEASES`), later ones a chain.

    ``methods``: a feature head's methods per engine (:func:`~sequoia_opt.drafting.registry.head_engine_methods`):
    SGLang's algorithm is the head's (``EAGLE3`` for an EAGLE-3 head, ``EAGLE`` for EAGLE-1/2); an engine with
    no dynamic tree for that head (Medusa's heads, an EAGLE-1/2 head on TensorRT-LLM) is refused. None: SGLang's
    ``EAGLE`` and TensorRT-LLM's ``Eagle3``, the user's head to name.

    Raises:
        ExportError: an unknown format, or an engine format for a policy or a head the engine does not run.
    """
    key = _ALIASES.get(str(fmt).strip().lower(), str(fmt).strip().lower())
    if key not in DYNAMIC_EXPORT_FORMATS:  # not normalise_format: its list names static-tree formats too
        raise ExportError(f"a dynamic setting exports as {', '.join(DYNAMIC_EXPORT_FORMATS)}, not {fmt!r} "
                          "(vLLM and Medusa take static trees only)")
    s = setting
    stub = Tree.chain(min(s.steps, s.budget - 1) + 1)  # the Export's tree field: the setting's deepest path
    if key in ("yaml", "json"):
        doc = {"format": DYNAMIC_FORMAT, "setting": s.to_dict(), "predicted": predicted or {},
               "provenance": provenance or {}}
        text = (yaml.safe_dump(doc, sort_keys=False) if key == "yaml" else json.dumps(doc, indent=2) + "\n")
        return Export(key, text, stub)
    if s.policy != "eagle":
        raise ExportError(f"{key} drafts dynamic trees by EAGLE-2 re-ranking only; a {s.policy!r} setting has no "
                          f"{key} equivalent (export the best 'eagle' setting)")
    engine_method = (methods or {}).get(key)
    if methods is not None and engine_method not in (("EAGLE", "EAGLE3") if key == "sglang" else ("Eagle3",)):
        have = ", ".join(f"{e} {m}" for e, m in methods.items())
        raise ExportError(f"{key} has no dynamic tree for this drafter (served as {have}): export the static tree "
                          "(treeopt solve --format) instead")
    if key == "sglang":
        algo = engine_method or "EAGLE"
        head = _sglang_head_path(algo)
        flags = (f"--speculative-algorithm {algo} --speculative-draft-model-path {head} --speculative-num-steps "
                 f"{s.steps} --speculative-eagle-topk {s.topk} --speculative-num-draft-tokens {s.budget}")
        doc = {"speculative_algorithm": algo, "speculative_draft_model_path": head, "speculative_num_steps": s.steps,
               "speculative_eagle_topk": s.topk, "speculative_num_draft_tokens": s.budget, "cli_flags": flags}
        notes = ("--speculative-num-draft-tokens counts the root (treeopt's budget)",)
        if s.topk == 1 and s.budget != s.steps + 1:
            notes += (f"with topk 1 SGLang sets num_draft_tokens to num_steps + 1 = {s.steps + 1}",)
        return Export(key, json.dumps(doc, indent=2) + "\n", stub, notes=notes, warnings=(_sglang_head_warning(head),))
    # no eagle3_one_model: the dynamic tree runs in the one-model worker (the default), the two-model path is
    # deprecated and the field is gone from the 1.3.0rc27 and 1.4 API references (a strict model refuses it)
    doc = {"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": s.steps,
                                  "speculative_model": "<your EAGLE-3 draft checkpoint>",
                                  "use_dynamic_tree": True,
                                  "dynamic_tree_max_topK": s.topk, "max_total_draft_tokens": s.budget - 1}}
    return Export(key, yaml.safe_dump(doc, sort_keys=False), stub,
                  notes=("max_total_draft_tokens excludes the root (treeopt's budget - 1); set "
                         "speculative_model to your EAGLE-3 checkpoint",))


def load_dynamic_setting(path: str | Path) -> tuple[Any, dict[str, Any]]:
    """Read a ``treeopt-dynamic/1`` file (YAML or JSON): ``(setting, document)``.

    Raises:
        ExportError: unreadable, another format, or a bad setting.
    """
    from .dynamic import DynamicSetting

    text = read_text_file(Path(path), error=ExportError, what="dynamic setting")
    try:
        doc = safe_load_yaml(text)
    except yaml.YAMLError as err:
        raise ExportError(f"{path}: not valid YAML or JSON ({yaml_error_text(err)})") from None
    if doc is None:
        raise ExportError(f"{path}: the file is empty (expected a {DYNAMIC_FORMAT} setting, treeopt solve --dynamic -o)")
    if not isinstance(doc, dict) or doc.get("format") != DYNAMIC_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else f"a {type(doc).__name__}, not a mapping"
        raise ExportError(f"{path}: format is {got!r}, expected {DYNAMIC_FORMAT!r}")
    check_numbers(doc, str(path), ExportError)
    predicted = doc.get("predicted") or {}
    if not isinstance(predicted, dict):
        raise ExportError(f"{path}: 'predicted' must be a mapping")
    for key in ("tokens_per_step", "speedup", "tokens_per_s", "cost_ms"):  # what run --dynamic shows
        v = predicted.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            raise ExportError(f"{path}: predicted.{key} = {v!r} must be a number >= 0")
    try:
        return DynamicSetting.from_dict(doc.get("setting") or {}), doc
    except ValueError as err:
        raise ExportError(f"{path}: {err}") from None


# ---------------------------------------------------------------------------------------------- llama.cpp
def chain_flags(setting: ChainSetting) -> str:
    """The setting as llama.cpp's ``llama-server`` / ``llama-cli`` flags (the draft itself is ``-md DRAFT.gguf``);
    a setting of no speculation is ``--spec-type none``."""
    if setting.n_max == 0:
        return "--spec-type none"
    return (f"--spec-type draft-simple --spec-draft-n-max {setting.n_max} --spec-draft-n-min {setting.n_min} "
            f"--spec-draft-p-min {setting.p_min:g}")


def lookup_flags(size_n: int, n_max: int) -> str:
    """Prompt lookup (n-gram) as llama.cpp's ``ngram-simple``: match an n-gram of ``size_n`` tokens, draft the
    ``n_max`` tokens that followed it. ``--spec-draft-n-max`` is pinned to ``n_max`` too: llama.cpp trims an
    n-gram draft to the slot's draft n-max (``common_speculative_limit_result`` in ``common/speculative.cpp``),
    16 unless set, so a size-m past 16 alone drafted 16."""
    return (f"--spec-type ngram-simple --spec-ngram-simple-size-n {size_n} --spec-ngram-simple-size-m {n_max} "
            f"--spec-draft-n-max {n_max}")


#: The longest draft a llama.cpp setting file may ask for (tokens).
MAX_DRAFT = 2**31 - 1


def parse_setting_file(path: Path) -> ChainSetting:
    """A chain setting from a file: llama.cpp flags (what ``solve --format llama.cpp -o`` writes:
    ``--spec-draft-n-max N [--spec-draft-n-min M] [--spec-draft-p-min P]``, or the older ``--draft-max`` /
    ``--draft-min`` / ``--draft-p-min``), or a treeopt tree that is a chain (its depth is draft-max).

    Raises:
        EngineError: a file that is neither, a tree that branches, a negative or malformed value.
    """
    from ._io import read_text_file

    text = read_text_file(path, error=EngineError, what="llama.cpp setting")
    words = text.split()
    if any(w.startswith("--") for w in words):
        names = {"--spec-draft-n-max": "n_max", "--draft-max": "n_max", "--draft": "n_max",
                 "--spec-draft-n-min": "n_min", "--draft-min": "n_min",
                 "--spec-draft-p-min": "p_min", "--draft-p-min": "p_min"}
        vals: dict[str, float] = {}
        for i, w in enumerate(words):
            if w in names:
                if i + 1 >= len(words):
                    raise EngineError(f"{path}: {w} has no value")
                try:
                    vals[names[w]] = float(words[i + 1])
                except ValueError:
                    raise EngineError(f"{path}: {w} {words[i + 1]!r} is not a number") from None
                integer = names[w] != "p_min"
                v = vals[names[w]]
                if not math.isfinite(v) or (integer and (not v.is_integer() or not 0 <= v <= MAX_DRAFT)):
                    want = f"an integer in 0..{MAX_DRAFT}" if integer else "a number in [0, 1]"
                    raise EngineError(f"{path}: {w} {words[i + 1]} is out of range (must be {want})")
        if "n_max" not in vals and "--spec-type none" in " ".join(words):
            vals["n_max"] = 0
        if "n_max" not in vals:
            raise EngineError(f"{path}: no --spec-draft-n-max N (a llama.cpp draft-model setting; treeopt solve "
                              "--format llama.cpp -o writes one)")
        s = ChainSetting(int(vals["n_max"]), int(vals.get("n_min", 0)), float(vals.get("p_min", 0.0)))
    else:
        from .errors import TreeValidationError

        try:
            tree, _ = load_any_tree(path)
        except TreeValidationError as err:
            raise EngineError(f"{path}: neither llama.cpp flags nor a tree ({err})") from None
        if any(w != 1 for w in tree.level_widths):
            raise EngineError(f"{path}: the tree has level widths {list(tree.level_widths)}; llama.cpp verifies a "
                              "chain (solve it with treeopt solve --format llama.cpp)")
        s = ChainSetting(tree.size - 1)
    if s.n_max < 0 or s.n_min < 0 or not 0.0 <= s.p_min <= 1.0:
        raise EngineError(f"{path}: draft-max and draft-min must be >= 0 and draft-p-min in [0, 1], got "
                          f"{s.n_max}, {s.n_min}, {s.p_min:g}")
    return s
