"""``python -m sequoia_opt.distill``: distil (or, with ``--evaluate``, re-measure) the demo draft model. SIGTERM
unwinds as Ctrl-C does (:func:`sequoia_opt._entry.install_sigterm`): one line, exit 143, no temporary file left."""

from .._entry import install_sigterm
from .cli import run_cli

install_sigterm()
raise SystemExit(run_cli())
