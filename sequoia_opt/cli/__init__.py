"""The ``treeopt`` command line: a thin layer over the library (typer + rich), one module per command group.

* :mod:`.common` — the typer ``app``, one-line error handling, the shared option types, progress display.
* :mod:`.render` — the one renderer (rich tables or ``--json``) every command prints through.
* :mod:`.profile_latency` (``profile latency``, ``profile linear``), :mod:`.profile_acceptance`,
  :mod:`.profile_layers`, :mod:`.profile_graft` (``profile graft``, ``profile scheduler``), :mod:`.solve`, :mod:`.run`,
  :mod:`.plot`, :mod:`.demo`, :mod:`.tune` — the commands; importing them registers them on ``app``.

Adding a command: see :mod:`.common`.
"""

# OpenMP threads sleep between parallel regions unless the user set the policy (sequoia_opt.omp says why: spinning
# beside other jobs made one forward 3-8x slower, and on an idle machine it misled the profiler's paired timing).
# The runtime reads the variable when torch loads it, so this runs before any torch import (sequoia_opt/__init__.py
# imports nothing).
from ..omp import apply_default  # noqa: E402

apply_default()

# importing a command module registers its commands on ``app``; this order is the order of ``treeopt --help``
from . import solve  # noqa: F401  # isort: skip
from . import profile_latency, profile_acceptance, profile_layers, profile_graft  # noqa: F401  # isort: skip
from . import run  # noqa: F401  # isort: skip
from . import plot  # noqa: F401  # isort: skip
from . import demo  # noqa: F401  # isort: skip
from . import engine  # noqa: F401  # isort: skip
from . import tune  # noqa: F401  # isort: skip
from .common import app, handle_errors
from .render import draw_tree, render

__all__ = ["app", "render", "draw_tree", "handle_errors"]
