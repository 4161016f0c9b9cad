"""The ``treeopt`` console script (and ``python -m sequoia_opt``): the CLI of :mod:`sequoia_opt.cli`, loaded
inside a guard so that Ctrl-C while it loads (torch takes seconds to import) is one line and exit 130, as it is
once a command runs (:func:`sequoia_opt.cli.common.handle_errors`), not a traceback through the imports.
SIGTERM is turned into :class:`~sequoia_opt.errors.Terminated` (a KeyboardInterrupt) first: a ``kill`` unwinds as
Ctrl-C does (no temporary file left behind) and ends with one line and exit 143 instead of a silent death."""

from __future__ import annotations

import signal
import sys

from .errors import Terminated, stop_exit_code, stop_word


def _raise_terminated(signum: int, _frame: object) -> None:
    raise Terminated(signum)


def install_sigterm() -> None:
    """SIGTERM raises :class:`~sequoia_opt.errors.Terminated` in the main thread, where no handler of the caller's
    own is installed (its default, SIG_DFL: ending the process at once mid-write)."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_terminated)


def main() -> None:
    """Load the CLI and run it (``sys.argv``). Exit 130 on Ctrl-C (143 on SIGTERM) before the command starts."""
    install_sigterm()
    try:
        from .cli import app
    except KeyboardInterrupt as err:
        sys.stderr.write(f"{stop_word(err)}: no output file was written\n")
        raise SystemExit(stop_exit_code(err)) from None
    app(prog_name="treeopt")
