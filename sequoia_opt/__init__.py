"""treeopt: a hardware-aware optimizer for tree-based speculative decoding.

The package is layered; data flows one way (README, "How the pieces fit")::

    cli -> profiling / solver / decoding -> model -> attention

``tree`` (topology as data) and ``errors`` / ``_io`` are leaves every layer may import. ``distill`` (how
the demo draft was trained) stands apart: nothing in the optimizer imports it.
"""

__version__ = "0.1.0"
