"""treeopt: a hardware-aware optimizer for tree-based speculative decoding.

The package is layered; data flows one way (see DESIGN.md)::

    cli -> profiling / solver / decoding -> model -> attention

``tree`` (topology as data) and ``errors`` / ``_io`` are leaves every layer may import.
"""

__version__ = "0.1.0"
