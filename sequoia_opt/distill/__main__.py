"""``python -m sequoia_opt.distill``: distil (or, with ``--evaluate``, re-measure) the demo draft model."""

from .cli import run_cli

raise SystemExit(run_cli())
