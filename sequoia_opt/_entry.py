"""The ``treeopt`` console script (and ``python -m sequoia_opt``): the CLI of :mod:`sequoia_opt.cli`, loaded
inside a guard so that Ctrl-C while it loads (torch takes seconds to import) is one line and exit 130, as it is
once a command runs (:func:`sequoia_opt.cli.common.handle_errors`), not a traceback through the imports."""

from __future__ import annotations

import sys


def main() -> None:
    """Load the CLI and run it (``sys.argv``). Exit 130 on Ctrl-C before the command starts."""
    try:
        from .cli import app
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: no output file was written\n")
        raise SystemExit(130) from None
    app(prog_name="treeopt")
