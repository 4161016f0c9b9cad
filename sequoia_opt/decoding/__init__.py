"""The bundled decoder's exact decoding loop, and nothing else: no drafter, no policy, no solver is imported
here (they plug in through :class:`DraftingPolicy` and :class:`TargetFace`).

Layering: ``drafting`` (drafters, policies, registry) and ``engines`` use ``decoding``; ``decoding`` uses
``model`` (Transformer, KV cache) and ``attention`` (masks), never the reverse.

* :class:`Decoder` (``loop.py``) — the one loop, batch-native (a batch of one is one row): draft (the policy's
  :class:`StepTree` per row, clipped to the row's :class:`Room`), verify (one target forward with tree
  attention), accept (exact: greedy, or per node the verifier of the distribution each candidate group came
  from), commit (emit with the stop rules, the target's KV compaction, the policy's drafters), observe. No
  policy = plain decoding.
* ``step_tree.py`` — :class:`StepTree` (one tree type for static and grown trees), :class:`TreeBuffers` (a
  static tree compiled once), :class:`DraftOutput`.
* ``policy.py`` — the :class:`DraftingPolicy` protocol.  ``target.py`` — the :class:`TargetFace` protocol and
  :class:`TransformerTarget`.  ``rows.py`` — a cache laid out for rows of different lengths.
* ``state.py`` — :class:`DecodeState`, :class:`RowState` (the only stop rules: :meth:`RowState.emit`),
  :class:`DraftSettings`.  ``stats.py`` — per-step statistics and results.
* ``sampling.py`` — :func:`process_logits`, :func:`argmax_tokens`, :func:`verify_greedy`,
  :func:`verify_sampling_node`, :func:`verify_point_mass_node`, :func:`verify_groups_node`: the pure rules,
  testable alone; they raise ValueError on NaN / inf logits, which the loop turns into DecodingError.
"""

from .forward import check_request
from .loop import DEFAULT_MAX_LEN, AutoregressiveDecoder, Decoder, autoregressive_generate, plain_decoder
from .policy import DraftingPolicy, StepView
from .sampling import (GREEDY_LIMIT_TEMPERATURE, Acceptance, CandidateGroup, NodeVisit, argmax_tokens, process_logits,
                       sample_categorical, sample_without_replacement, verify_greedy, verify_groups_node,
                       verify_point_mass_batch, verify_point_mass_node, verify_sampling_batch, verify_sampling_node)
from .state import DecodeState, DraftSettings, RowState
from .stats import BatchResult, BatchStep, GenerationResult, StepStats
from .step_tree import DraftOutput, Room, StepTree, TreeBuffers, ancestor_matrix
from .target import TargetFace, TransformerTarget

__all__ = [
    "Decoder", "DEFAULT_MAX_LEN", "plain_decoder", "AutoregressiveDecoder", "autoregressive_generate", "DraftingPolicy", "StepView", "TargetFace", "TransformerTarget", "DecodeState",
    "RowState", "DraftSettings", "StepTree", "TreeBuffers", "DraftOutput", "Room", "ancestor_matrix",
    "GenerationResult", "StepStats", "BatchResult", "BatchStep", "NodeVisit", "Acceptance", "CandidateGroup",
    "check_request", "process_logits", "GREEDY_LIMIT_TEMPERATURE", "argmax_tokens", "sample_categorical",
    "sample_without_replacement", "verify_greedy", "verify_sampling_node", "verify_sampling_batch",
    "verify_point_mass_node", "verify_point_mass_batch", "verify_groups_node",
]
