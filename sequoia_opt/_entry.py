"""The ``treeopt`` console script (and ``python -m sequoia_opt``): the CLI of :mod:`sequoia_opt.cli`, loaded
inside a guard so that Ctrl-C while it loads (torch takes seconds to import) is one line and exit 130, as it is
once a command runs (:func:`sequoia_opt.cli.common.handle_errors`), not a traceback through the imports.
SIGTERM and SIGHUP are turned into :class:`~sequoia_opt.errors.Terminated` (a KeyboardInterrupt) first: a ``kill``,
or a closed terminal or ssh session, unwinds as Ctrl-C does (no temporary file left behind) and ends with one line
and exit 143 (129) instead of a silent death. Once the command has ended (its outputs written, or its stop line
printed) later stops are ignored: a second Ctrl-C during the interpreter's exit printed a traceback, and one
landing after the outputs were written claimed they were not."""

from __future__ import annotations

import signal
import sys

from .errors import Terminated, stop_exit_code, stop_word


def _raise_terminated(signum: int, _frame: object) -> None:
    raise Terminated(signum)


#: The signals that stop a command as Ctrl-C does: SIGTERM (``kill``, ``timeout``, a job scheduler) and SIGHUP
#: (the terminal or the ssh session closed; its default ended the process mid-write, leaving temporary files).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def install_sigterm() -> None:
    """SIGTERM and SIGHUP (:data:`STOP_SIGNALS`) raise :class:`~sequoia_opt.errors.Terminated` in the main thread,
    where no handler of the caller's own is installed (their default, SIG_DFL: ending the process at once
    mid-write)."""
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _raise_terminated)


def ignore_stops() -> None:
    """Ignore Ctrl-C and :data:`STOP_SIGNALS` from now on: called once the command has ended (every output
    written, or the stop line printed), so a late or second stop neither interrupts the interpreter's exit (a
    traceback from an atexit hook) nor overrides the command's own exit status and line."""
    for sig in (signal.SIGINT, *STOP_SIGNALS):
        signal.signal(sig, signal.SIG_IGN)


def main() -> None:
    """Load the CLI and run it (``sys.argv``). Exit 130 on Ctrl-C (143 on SIGTERM, 129 on SIGHUP) before the
    command starts, while typer builds it too."""
    install_sigterm()
    try:
        from .cli import app
        from .cli import common

        common.on_command_end = ignore_stops
        app(prog_name="treeopt")
    except KeyboardInterrupt as err:
        # while the CLI loads, or in typer's own set-up (building the command from its functions) before the root
        # group's guard: no command has run. Later stops are ignored: a second would end the process before the line
        ignore_stops()
        sys.stderr.write(f"{stop_word(err)}: no output file was written\n")
        raise SystemExit(stop_exit_code(err)) from None
