"""Drafters: the proposers a drafting policy asks for tree candidates.

The protocol is :class:`Drafter` (``base.py``): ``bind`` (take the decoder's settings, allocate a cache),
``limit`` (its context / cache limits for this step's tree), ``reset`` and ``prefill`` (per generation),
``propose`` (a static tree's ranked candidates for every live row, with the draft distributions q where it has
them), ``score_nodes`` (nodes of a shared tree a policy grows), ``commit`` (the accepted paths) and ``keep``
(rows that stay). It declares its ``cost_model`` (``"per-level"`` or ``"one-pass"``), whether it has
probabilities (``has_probs``) and how many rows it serves (``max_rows``).

Implementations, one file each:

* ``model.py`` — :class:`ModelDrafter`, a separate draft model run once per tree level (``"per-level"``).
* ``lookup.py`` — :class:`PromptLookupDrafter`, n-gram prompt lookup over the prompt and the generated text
  (no model, no cache, no probabilities: sampling verifies its candidates as point masses; ``"one-pass"``).
* ``layer_skip.py`` — :class:`LayerSkipDrafter`: the target's own first L layers + final norm + LM head,
  sharing its weights and (for those layers) its KV cache (``"per-level"``).
* ``eagle.py`` — :class:`EagleDrafter`, an EAGLE-3 or EAGLE-1/2 head on the target's own hidden states, which
  it asks of the target face (``"per-level"``).
* ``medusa.py`` — :class:`MedusaDrafter`, Medusa's heads on the target's last hidden state (``"one-pass"``).

A new drafter is one new file here and a registry line (:mod:`sequoia_opt.drafting.registry`).
"""

from __future__ import annotations

from typing import Callable

from .base import CostModel, Drafter
from .eagle import EagleDrafter
from .layer_skip import LayerSkipDrafter
from .lookup import PromptLookupDrafter
from .medusa import MedusaDrafter
from .model import ModelDrafter

__all__ = ["Drafter", "CostModel", "ModelDrafter", "PromptLookupDrafter", "LayerSkipDrafter", "EagleDrafter",
           "MedusaDrafter", "as_drafter", "drafter_factory"]


def as_drafter(draft: object) -> Drafter:
    """A :class:`Drafter` from what callers pass as a drafter: a draft
    :class:`~sequoia_opt.model.Transformer` is wrapped in a fresh :class:`ModelDrafter` (its own cache), a
    Drafter is returned as it is.

    Raises:
        DecodingError: neither.
    """
    from ...errors import DecodingError
    from ...model import Transformer

    if isinstance(draft, Transformer):
        return ModelDrafter(draft)
    if isinstance(draft, Drafter):
        return draft
    raise DecodingError(f"the draft must be a Transformer or a Drafter, got {type(draft).__name__}")


def drafter_factory(draft: object) -> Callable[[], Drafter]:
    """A function making one proposer per decoder (a drafter is bound to one decoder), from what a caller
    passes as ``draft``:

    * a draft :class:`~sequoia_opt.model.Transformer`: a fresh :class:`ModelDrafter` each time (its own
      cache; the weights are shared);
    * a zero-argument callable returning a Transformer or a fresh :class:`Drafter` (e.g.
      ``ModelPair.new_drafter``, ``lambda: PromptLookupDrafter(V)``): wrapped by :func:`as_drafter`;
    * a :class:`Drafter` instance: returned once; a second call raises, since it can serve one decoder only.

    Raises:
        TypeError: ``draft`` is none of these.
        DecodingError: (from the returned function) a Drafter instance asked for twice.
    """
    from ...errors import DecodingError
    from ...model import Transformer

    if isinstance(draft, Transformer):
        return lambda: ModelDrafter(draft)
    if isinstance(draft, Drafter):
        used = []

        def once() -> Drafter:
            if used:
                raise DecodingError(f"this {type(draft).__name__} can serve one decoder; pass a function making "
                                    "a fresh drafter (e.g. lambda: PromptLookupDrafter(V)) to run several")
            used.append(True)
            return draft

        return once
    if callable(draft):
        return lambda: as_drafter(draft())
    raise TypeError(f"draft must be a Transformer, a Drafter or a function making one, got {type(draft).__name__}")
