"""Drafters: the proposers a :class:`~sequoia_opt.decoding.SpeculativeDecoder` asks for tree candidates.

The protocol is :class:`Drafter` (``base.py``): ``bind`` (take the decoder's settings, allocate a cache),
``max_root_for_depth`` (its context / cache limits, for the decoder's clipping near the end), ``reset`` and
``prefill`` (per generation), ``propose`` (a step's ranked candidates, with the draft distributions q where it
has them) and ``commit`` (the accepted path, into its own cache and ``cached`` count). It declares its
``cost_model`` (``"per-level"`` or ``"one-pass"``) and whether it has probabilities (``has_probs``).

Implementations, one file each:

* ``model.py`` — :class:`ModelDrafter`, a separate draft model run once per tree level (``"per-level"``).
* ``lookup.py`` — :class:`PromptLookupDrafter`, n-gram prompt lookup over the prompt and the generated text
  (no model, no cache, no probabilities: sampling verifies its candidates as point masses; ``"one-pass"``).
* ``layer_skip.py`` — :class:`LayerSkipDrafter`, registry name ``"self"``: the target's own first L layers +
  final norm + LM head, sharing its weights and (for those layers) its KV cache (``"per-level"``).

A new drafter is one new file and a registry line: implement :class:`Drafter` in ``drafters/<name>.py``
and add ``"<name>": <Class>`` to :data:`DRAFTERS`. Nothing else changes: the decoder takes any
:class:`Drafter` instance as its ``draft`` argument.
"""

from __future__ import annotations

from typing import Callable

from .base import CostModel, DraftOutput, Drafter, DraftSettings, root_tree
from .layer_skip import LayerSkipDrafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter

__all__ = ["Drafter", "DraftOutput", "DraftSettings", "CostModel", "ModelDrafter", "PromptLookupDrafter",
           "LayerSkipDrafter", "DRAFTERS", "drafter_factory", "root_tree"]

#: Registry: drafter name -> factory (the class; its constructor's arguments are the drafter's own).
DRAFTERS: dict[str, Callable[..., Drafter]] = {
    "model": ModelDrafter,
    "lookup": PromptLookupDrafter,
    "self": LayerSkipDrafter,  # LayerSkipDrafter(target, num_layers): --draft self:L
}


def drafter_factory(draft: object) -> Callable[[], object]:
    """A function making one proposer per :class:`~sequoia_opt.decoding.SpeculativeDecoder` (a drafter is
    bound to one decoder), from what a caller passes as ``draft``:

    * a draft :class:`~sequoia_opt.model.Transformer`: returned as it is each time (each decoder wraps it in
      its own :class:`ModelDrafter`, with its own cache; the weights are shared);
    * a zero-argument callable returning a Transformer or a fresh :class:`Drafter` (e.g.
      ``ModelPair.new_drafter``, ``lambda: PromptLookupDrafter(V)``): used as it is;
    * a :class:`Drafter` instance: returned once; a second call raises, since it can serve one decoder only.

    Raises:
        TypeError: ``draft`` is none of these.
        DecodingError: (from the returned function) a Drafter instance asked for twice.
    """
    from ...errors import DecodingError
    from ...model import Transformer

    if isinstance(draft, Transformer):
        return lambda: draft
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
        return draft
    raise TypeError(f"draft must be a Transformer, a Drafter or a function making one, got {type(draft).__name__}")
