"""The bundled decoder's decoding loop: tree speculative decoding with exact verification, and the plain
autoregressive baseline it is compared with (batch size 1).

Layering: ``decoding`` uses ``model`` (Transformer, KV cache) and ``attention`` (masks), never the reverse.

* :class:`SpeculativeDecoder` — the loop, one step in named methods: draft (ask the drafter for the step's
  tree), verify (one target forward with tree attention), accept (the exact path: Sequoia Alg. 2, SpecInfer
  section 4), commit (the target's cache and the drafter's); Medusa-style tree buffers, clipped near the
  end of the context.
* ``drafters/`` — the proposers: the :class:`Drafter` protocol (candidates, draft probabilities where it has
  them, its own cache, its cost model and limits), :class:`ModelDrafter` (a separate draft model, one
  forward per tree level), :class:`PromptLookupDrafter` (n-gram prompt lookup, no model),
  :class:`LayerSkipDrafter` (the target's own first L layers, sharing its cache), and the registry
  :data:`DRAFTERS` (a new drafter is one new file and a registry line).
* ``policies/`` and :class:`MultiDraftDecoder` (``multidraft.py``) — several drafters in one tree: the graft
  policy (TreeGraft: a light drafter's part, a strong drafter's grafts when a scheduler calls it) and
  SpecInfer's merge, verified exactly with mixed provenance (:func:`verify_groups_node`).
* :class:`AdaptiveTreeDecoder` (``adaptive.py``) — the static loop with its tree re-solved every N steps from a
  running acceptance estimate (:class:`OnlineAcceptance`, :class:`TreeAdapter`; ``treeopt run --adapt``).
* :func:`autoregressive_generate` / :class:`AutoregressiveDecoder` — the baseline on the same forward path.
* :func:`process_logits`, :func:`argmax_tokens`, :func:`verify_greedy`, :func:`verify_sampling_node`,
  :func:`verify_point_mass_node` — the pure rules, testable alone; they raise ValueError on NaN / inf
  logits, which the decoders turn into DecodingError.
"""

from .autoregressive import AutoregressiveDecoder, autoregressive_generate
from .buffers import TreeBuffers
from .drafters import DRAFTERS, Drafter, DraftSettings, LayerSkipDrafter, ModelDrafter, PromptLookupDrafter
from .sampling import (GREEDY_LIMIT_TEMPERATURE, Acceptance, NodeVisit, argmax_tokens, process_logits,
                       sample_categorical, sample_without_replacement, verify_greedy, verify_point_mass_batch,
                       verify_point_mass_node, verify_sampling_batch, verify_sampling_node)
from .speculative import DecodeState, DraftOutput, SpeculativeDecoder
from .multidraft import MultiDraftDecoder  # noqa: E402 (after speculative: it builds on DecodeState)
from .adaptive import AdaptiveTreeDecoder, OnlineAcceptance, Resolve, TreeAdapter  # noqa: E402 (the same)
from .stats import GenerationResult, StepStats

__all__ = [
    "SpeculativeDecoder",
    "MultiDraftDecoder",
    "AdaptiveTreeDecoder",
    "OnlineAcceptance",
    "TreeAdapter",
    "Resolve",
    "DecodeState",
    "DraftOutput",
    "Drafter",
    "DraftSettings",
    "ModelDrafter",
    "PromptLookupDrafter",
    "LayerSkipDrafter",
    "DRAFTERS",
    "AutoregressiveDecoder",
    "autoregressive_generate",
    "TreeBuffers",
    "GenerationResult",
    "StepStats",
    "NodeVisit",
    "Acceptance",
    "process_logits",
    "GREEDY_LIMIT_TEMPERATURE",
    "argmax_tokens",
    "sample_categorical",
    "sample_without_replacement",
    "verify_greedy",
    "verify_sampling_node",
    "verify_sampling_batch",
    "verify_point_mass_node",
    "verify_point_mass_batch",
]
