"""The value model of a tree two drafters grow (a light and a strong drafter, TreeGraft): the conditional
acceptance vectors (:class:`GraftAcceptance`) and the expected tokens per step of a drafter tree under them
(:func:`graft_expected_tokens`). The model and why it is conditional: :mod:`sequoia_opt.solver.graft`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import SolverError
from ..profiles import SUM_TOLERANCE, validate_acceptance
from ..tree import DrafterTree

__all__ = ["DEFAULT_NAMES", "GraftAcceptance", "graft_expected_tokens", "deepen_conservatively"]


#: Default drafter names of a :class:`GraftAcceptance` (light first).
DEFAULT_NAMES = ("light", "strong")


# ---------------------------------------------------------------------------------------------- value model
def _rows(value: Any, what: str) -> np.ndarray:
    """(R, K) float64 from one vector (one row) or a list of per-depth vectors, each a valid acceptance
    vector (:func:`~sequoia_opt.profiles.validate_acceptance`). Raises SolverError."""
    if isinstance(value, (str, bytes, dict)):
        raise SolverError(f"{what} must be a vector or a list of per-depth vectors, got {type(value).__name__}")
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise SolverError(f"{what} must be a vector or a list of per-depth vectors of one length") from None
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise SolverError(f"{what} must be a vector or a list of per-depth vectors, got shape {arr.shape}")
    rows = [validate_acceptance(r, what=f"{what}, row {i} (children at depth {i + 1})") for i, r in enumerate(arr)]
    return np.ascontiguousarray(np.stack(rows), dtype=np.float64)


@dataclass(frozen=True, eq=False)
class GraftAcceptance:
    """The value model of a two-drafter grafted tree (module docstring).

    Attributes:
        light: (R0, K0) float64; row r = the light drafter's positional acceptance vector of children at
            depth r + 1 (deeper levels use the last row). A 1-D vector is one row.
        strong: a -> (R1, K1) float64: the strong drafter's acceptance vector of its conditional ranks at a
            node where the light proposed exactly ``a`` children (``a = 0``: the strong drafter alone, its
            own vector). Only the keys present are allowed plans; may be empty (light only).
        names: the two drafters' names, light first (tree labels and reports).

    Raises:
        SolverError: a row that is not an acceptance vector (empty, NaN, negative, sum > 1 +
            :data:`~sequoia_opt.profiles.SUM_TOLERANCE`), rows of different lengths, a key that is not an
            integer in ``0..K0`` (the light proposes at most K0 ranked children), or a key a for which the
            light's first a entries plus the strong row sum above 1 + the tolerance at some depth.
    """

    light: np.ndarray
    strong: dict[int, np.ndarray] = field(default_factory=dict)
    names: tuple[str, str] = DEFAULT_NAMES

    def __post_init__(self) -> None:
        light = _rows(self.light, "light acceptance")
        if not isinstance(self.strong, dict):
            raise SolverError(f"strong must map a (light children) -> per-depth vectors, got "
                              f"{type(self.strong).__name__}")
        K0 = light.shape[1]
        strong: dict[int, np.ndarray] = {}
        for a, v in self.strong.items():
            if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not 0 <= a <= K0:
                raise SolverError(f"strong key {a!r} must be an integer in 0..{K0}: the number of light children "
                                  f"(the light vector has K0 = {K0} ranks)")
            a = int(a)
            rows = _rows(v, f"strong acceptance given {a} light children")
            for r in range(max(rows.shape[0], light.shape[0])):
                lrow = light[min(r, light.shape[0] - 1)]
                srow = rows[min(r, rows.shape[0] - 1)]
                total = float(lrow[:a].sum() + srow.sum())
                if total > 1.0 + SUM_TOLERANCE:
                    raise SolverError(
                        f"at depth {r + 1}, the light's first {a} entries ({lrow[:a].sum():.6g}) plus the strong "
                        f"vector given {a} light children ({srow.sum():.6g}) sum to {total:.6g} > 1; they are "
                        "probabilities of disjoint events at one node")
            strong[a] = rows
        strong = dict(sorted(strong.items()))
        names = tuple(self.names)
        if len(names) != 2 or not all(isinstance(x, str) and x for x in names) or names[0] == names[1]:
            raise SolverError(f"names must be two distinct drafter names (light, strong), got {self.names!r}")
        object.__setattr__(self, "light", light)
        object.__setattr__(self, "strong", strong)
        object.__setattr__(self, "names", names)

    @property
    def keys(self) -> tuple[int, ...]:
        """The allowed light-children counts a next to a strong graft, ascending."""
        return tuple(sorted(self.strong))


def _strong_parent_counts(dtree: DrafterTree) -> list[int]:
    """For each node, how many light (drafter 0) children its parent has (0 for the root)."""
    light_children = [sum(1 for c in kids if dtree.drafter[c] == 0) for kids in dtree.tree.children]
    return [0] + [light_children[dtree.tree.parent[v]] for v in range(1, dtree.size)]


def graft_expected_tokens(dtree: DrafterTree, acc: GraftAcceptance) -> float:
    """G(dtree), expected tokens per step (tokens), under the conditional vectors (module docstring).

    Raises:
        SolverError: a tree with more than two drafters, a strong node next to ``a`` light siblings when
            ``acc.strong`` has no vector for that a, or a rank beyond its vector (light rank >= K0, strong
            conditional rank >= K1).
    """
    if dtree.num_drafters > 2:
        raise SolverError(f"the graft value model covers two drafters (light, strong); this tree names "
                          f"{dtree.num_drafters}")
    light = acc.light
    a_of = _strong_parent_counts(dtree)
    depth = dtree.tree.depth
    prob = np.ones(dtree.size)
    for v in range(1, dtree.size):
        row = int(depth[v]) - 1
        if dtree.drafter[v] == 0:
            r = dtree.tree.rank[v]
            if r >= light.shape[1]:
                raise SolverError(f"node {v}: light rank {r} is beyond the light vector's {light.shape[1]} ranks")
            w = light[min(row, light.shape[0] - 1), r]
        else:
            a, r = a_of[v], dtree.drafter_rank[v]
            q = acc.strong.get(a)
            if q is None:
                raise SolverError(f"node {v}: a strong candidate next to {a} light siblings, but the acceptance "
                                  f"model has strong vectors only for a in {list(acc.keys)}")
            if r >= q.shape[1]:
                raise SolverError(f"node {v}: strong conditional rank {r} is beyond the strong vector given {a} "
                                  f"light children ({q.shape[1]} ranks)")
            w = q[min(row, q.shape[0] - 1), r]
        prob[v] = prob[dtree.tree.parent[v]] * w
    return float(prob.sum())


def deepen_conservatively(acc: GraftAcceptance, depth: int) -> tuple[GraftAcceptance, list[dict[str, Any]]]:
    """The value model extended to ``depth`` rows without trusting what was not measured (issue 31): a vector
    measured to depth R < ``depth`` (R rows) values its depths R + 1 .. ``depth`` with the elementwise minimum of
    its measured rows, not its deepest row. A drafter whose accepted tokens come in runs (prompt lookup) accepts
    most at the bottom of the spine it was measured on, where a run has been going for R levels; grafted beside
    another drafter's candidate its runs start later, so the deepest measured row overstates a deeper level.
    The minimum is a lower bound of every measured row (and keeps every depth a valid model: it sums to no more
    than a measured row does).

    Returns:
        ``(model, notes)``: the extended :class:`GraftAcceptance` and, per vector that was extended, ``{"vector",
        "measured_depth", "text"}``: which drafter's, the depth it was measured to, and one line saying how the
        depths past it were valued (empty: nothing was extended).
    """
    notes: list[dict[str, Any]] = []

    def deepen(rows: np.ndarray, what: str) -> np.ndarray:
        R = rows.shape[0]
        if R >= depth:
            return rows
        low = rows.min(axis=0)
        notes.append({"vector": what, "measured_depth": int(R),
                      "text": f"{what} measured to depth {R}: depths {R + 1}..{depth} valued with the minimum of its "
                              f"measured rows (p_1 {low[0]:.3f}, where its deepest row says {rows[-1, 0]:.3f})"})
        return np.concatenate([rows, np.repeat(low[None, :], depth - R, axis=0)])

    light = deepen(acc.light, f"the light drafter {acc.names[0]!r}")
    strong = {a: deepen(q, f"the strong drafter {acc.names[1]!r}" + (" alone" if a == 0 else f" beside {a} light "
                                                                        "candidates"))
              for a, q in acc.strong.items()}
    return GraftAcceptance(light, strong, acc.names), notes
