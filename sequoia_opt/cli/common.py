"""What every ``treeopt`` command shares: the typer app, the one-line error handling, the option types, the
progress display, and the checks run before any model is loaded.

Adding a command: in the module of its command group, write a function decorated with ``@app.command()`` (or
the group's typer) and ``@handle_errors``, take the option types defined here (``AcceptanceOpt``,
``LatencyOpt``, ``BudgetOpt``, ...), do the work with library calls, build a :class:`~sequoia_opt.report.Report`
and pass it to :func:`~sequoia_opt.cli.render.render`. User errors are :class:`~sequoia_opt.errors.TreeoptError`:
``handle_errors`` prints them as one red line on stderr and exits with code 2, without a traceback; typer's
own usage errors (a malformed option value, an unknown option) get the same one line and exit code 2. Output
files are written last, atomically, so a failure leaves no file behind.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import torch
import typer
import typer.core
from rich.console import Console
from typing_extensions import Annotated

from .. import __version__
from .._io import check_lookup
from ..errors import TreeoptError
from ..exports import EXPORT_FORMATS
from ..tree import TreeMetadata
_err = Console(stderr=True, highlight=False, emoji=False)  # a path or flag is shown as typed (a:smile:b)
# the click typer runs on: its vendored copy since typer 0.2x, the click package before
_click = getattr(typer.core, "_click", None) or importlib.import_module("click")


def _print_error(msg: str) -> None:
    """The one-line error format of every command: ``error: <first line of msg>`` in red on stderr."""
    from rich.markup import escape

    line = msg.splitlines()[0] if msg.strip() else "unknown error"  # escaped: "pip install 'x[extra]'" is not markup
    _err.print(f"[bold red]error:[/] {escape(line)}", markup=True, soft_wrap=True, highlight=False)


def unwrap_help(text: str | None) -> str | None:
    """A command's docstring as its help should flow: the line breaks inside a paragraph (the source's wrapping
    at 120 columns) joined with spaces, so the terminal wraps it at its own width. typer's rich mode keeps
    them, which drew every command of ``treeopt --help`` as ragged half-lines at 100 columns. Paragraphs stay
    apart; one that starts with click's ``\\b`` marker, or holds an indented or bulleted line, is kept as
    written (a table, a command, a list)."""
    if not text:
        return text
    import inspect

    out = []
    for par in inspect.cleandoc(text).split("\n\n"):
        lines = par.split("\n")
        keep = par.startswith("\b") or any(ln.startswith((" ", "- ", "* ")) for ln in lines[1:])
        out.append(par if keep else " ".join(ln.strip() for ln in lines))
    return "\n\n".join(out)


def _plugin_help(cmd: Any) -> None:
    """Add the drafter and policy kinds plugins registered to a command's ``--draft`` / ``--policy`` help, each
    with its summary (the options' text names the bundled kinds only; a kind of one's own was in no help).
    Plugins load here, before the root callback would load them, because click resolves the subcommand first; one
    that fails to import is left for the callback to report."""
    from ..drafting.registry import load_plugins, plugin_kinds

    with contextlib.suppress(TreeoptError):
        load_plugins()
    drafters, policies = plugin_kinds()
    for param in cmd.params:
        kinds = drafters if "--draft" in param.opts else policies if "--policy" in param.opts else []
        if kinds and param.help:
            listed = "; ".join(f"{k.name} ({k.summary.rstrip('.')})" for k in kinds)
            param.help = f"{param.help.rstrip()} Registered by plugins: {listed}."


class _FlowingHelp(typer.core.TyperGroup):
    """A command group whose commands' help flows to the terminal's width (:func:`unwrap_help`), in the
    group's list of commands and on each command's own ``--help``, which also lists the kinds plugins
    registered (:func:`_plugin_help`)."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:  # noqa: D102
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None and not getattr(cmd, "_treeopt_unwrapped", False):
            cmd.help = unwrap_help(cmd.help)
            _plugin_help(cmd)
            cmd._treeopt_unwrapped = True
        return cmd


class _OneLineErrors(_FlowingHelp):
    """The root command group: typer's own usage errors (a malformed value such as ``--budget abc``, an
    unknown option, a missing required option) print one line and exit 2, like :func:`handle_errors` does
    for the library's errors, instead of the multi-line box typer draws. ``treeopt`` with no arguments and
    ``--help`` still print the help."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 (parses the options, prints --help)
        with _stops_are_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:  # noqa: D102 (a subcommand's options and --help, the command itself)
        with _stops_are_one_line():
            return super().invoke(ctx)

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:  # noqa: D102
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        with _stops_are_one_line(exit_now=True):  # a closed pipe or a stop anywhere below: its error lines too
            try:
                rv = super().main(*args, standalone_mode=False, **kwargs)
            except _click.exceptions.ClickException as err:
                if type(err).__name__ == "NoArgsIsHelpError":  # bare `treeopt` / `treeopt profile`: the help
                    err.show()
                    sys.exit(err.exit_code)
                ctx = getattr(err, "ctx", None)
                hint = f" (see '{ctx.command_path if ctx is not None else 'treeopt'} --help')"
                _print_error(err.format_message() + hint)
                sys.exit(err.exit_code)
            except typer.Abort:  # typer's public name for click's Abort (vendored or not)
                _err.print("aborted")
                sys.exit(1)
            # without standalone mode typer returns typer.Exit's code (an int) or the command's return value
            sys.exit(rv if isinstance(rv, int) else 0)


#: The exit status when standard output (or error) is a pipe its reader closed (``treeopt ... | head -1``): 128 +
#: SIGPIPE, what a shell reports for ``yes | head -1``'s writer, which the signal ends.
EXIT_PIPE_CLOSED = 141


def _silence_closed_streams() -> None:
    """Point standard output and error, where a write or flush fails (a pipe whose reader is gone), at
    ``/dev/null``: what is left in their buffers, and Python's own flush at exit, then go nowhere instead of a
    second BrokenPipeError ("Exception ignored ...", exit 120)."""
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            try:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, stream.fileno())
                os.close(null)
            except (OSError, ValueError, AttributeError):  # no file descriptor (a test's captured stream)
                pass


@contextlib.contextmanager
def _stops_are_one_line(exit_now: bool = False):
    """Around the root group's parsing and its subcommand: a closed output pipe ends the command quietly with
    :data:`EXIT_PIPE_CLOSED` (typer ended it with 1, the status of a failure, where ``grep -q`` or ``head`` had
    simply read enough), and Ctrl-C / SIGTERM landing outside :func:`handle_errors` (while options are parsed)
    prints its one line (typer exited 130 without a word). ``exit_now``: ``sys.exit`` rather than
    ``typer.Exit`` (outside typer's own handler)."""
    import errno

    from ..errors import stop_exit_code, stop_word

    try:
        yield
    except OSError as err:
        if err.errno != errno.EPIPE:
            raise
        _silence_closed_streams()
        if exit_now:
            sys.exit(EXIT_PIPE_CLOSED)
        raise typer.Exit(EXIT_PIPE_CLOSED) from None
    except KeyboardInterrupt as err:
        with contextlib.suppress(OSError):
            _err.print(f"[yellow]{stop_word(err)}:[/] no output file was written")
        if exit_now:
            sys.exit(stop_exit_code(err))
        raise typer.Exit(stop_exit_code(err)) from None


def _console_pipe_closed(self: Console) -> None:
    """rich's ``Console.on_broken_pipe`` for the CLI's consoles (the reports', stderr's, typer's --help): raise the
    BrokenPipeError for :func:`_stops_are_one_line` to end the command with :data:`EXIT_PIPE_CLOSED`, as every
    other write does. rich's own exits 1, the status of a failure, and points standard output at /dev/null even
    where standard error was the closed pipe."""
    import errno

    self.quiet = True
    raise BrokenPipeError(errno.EPIPE, "Broken pipe")


Console.on_broken_pipe = _console_pipe_closed  # type: ignore[method-assign]


def _help_width() -> None:
    """Draw --help 100 columns wide where no terminal says otherwise (a pipe, a file, CI: rich falls back to 80,
    where the option column leaves the help text too narrow for a CSV header or a list of formats, and rich
    cuts such a word off with an ellipsis). A terminal's own width, or TERMINAL_WIDTH, still wins."""
    import os

    from typer import rich_utils

    if rich_utils.MAX_WIDTH is None and not os.environ.get("COLUMNS") and not (sys.stdout and sys.stdout.isatty()):
        rich_utils.MAX_WIDTH = 100


_help_width()

app = typer.Typer(
    cls=_OneLineErrors,
    name="treeopt",
    help="Hardware-aware optimizer for tree-based speculative decoding (Sequoia-style).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

FORMATS = EXPORT_FORMATS  # the library's list: every format it exports, the CLI accepts

# ---------------------------------------------------------------------------------------------- shared options
AcceptanceOpt = Annotated[
    Path, typer.Option("--acceptance", "-a", help="Acceptance profile (treeopt-acceptance/1 YAML).")
]
LatencyOpt = Annotated[
    Optional[Path],
    typer.Option("--latency", "-l", help="Latency profile (treeopt-latency/1 YAML); enables the hardware-aware choice."),
]
BudgetOpt = Annotated[int, typer.Option("--budget", "-n", help="Largest tree size considered (nodes, root included).")]
MaxDepthOpt = Annotated[int, typer.Option("--max-depth", "-d", help="Depth limit D (the root is depth 0).")]
MaxBranchingOpt = Annotated[int, typer.Option("--max-branching", "-b", help="Most children per node B.")]
ContextOpt = Annotated[
    Optional[int], typer.Option("--context", help="Context length (tokens) to read latency at; default: smallest measured.")
]


def output_file(value: str) -> Path:
    """The ``parser`` of every option that names an output FILE (``-o``, ``--schedule``, ``--gguf``): the path as
    given, refused (typer.BadParameter: one line, exit 2, before anything runs) when it names a folder by its
    spelling: a trailing ``/`` or a last part ``.`` / ``..`` (``-o newf/``). pathlib drops a trailing slash and a
    trailing ``.``, so ``-o newf/`` for a folder that did not exist wrote a FILE named ``newf``; a folder that
    exists is refused by :func:`check_output` (``it is a folder``), which this matches."""
    import os

    seps = (os.sep, os.altsep) if os.altsep else (os.sep,)
    end = "/" if value.endswith(seps) else os.path.basename(value)
    if value not in ("/", ".", "..") and end in ("/", ".", ".."):  # '.' and '/' alone: check_output's own lines
        raise typer.BadParameter(f"{value} ends in {end!r}, which names a folder: give a file name")
    return Path(value)


OutputOpt = Annotated[Optional[Path], typer.Option("--output", "-o", parser=output_file,
                                                 help="Write the tree here (atomically; - prints it).")]
ProfileOutputOpt = Annotated[
    Optional[Path], typer.Option("--output", "-o", parser=output_file,
                                 help="Write the profile here (atomically); default under profiles/.")
]
FormatOpt = Annotated[Optional[str], typer.Option(
    "--format", "-f", help="Export format: " + ", ".join(FORMATS) + ", llama.cpp (llama.cpp's speculative flags: "
    "the best chain on the curve) (default with -o: json for a .json file, else yaml). Without -o the "
    "export is printed to stdout and the report goes to stderr.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]

F = TypeVar("F", bound=Callable[..., Any])

#: the warnings each running command's :func:`handle_errors` records, innermost last
_RECORDING: list[list] = []

#: Called once the outermost command has ended (returned, failed, or printed its stop line); the ``treeopt``
#: entry point sets it to :func:`sequoia_opt._entry.ignore_stops`. None in a library or test caller.
on_command_end: Callable[[], None] | None = None


def recorded_warnings() -> list[str]:
    """The distinct :class:`~sequoia_opt.errors.ProfileWarning` lines the running command raised so far (a file's
    unknown key, an implausible curve), for its ``--json`` document (:func:`~sequoia_opt.cli.render.render`): they
    went to stderr only, and a program reading the JSON never saw them."""
    from ..errors import ProfileWarning

    out: list[str] = []
    for w in _RECORDING[-1] if _RECORDING else []:
        if issubclass(w.category, ProfileWarning) and str(w.message) not in out:
            out.append(str(w.message))
    return out


def _command_ended() -> None:
    """Tell :data:`on_command_end` (where set) that the outermost command has ended."""
    if on_command_end is not None:
        on_command_end()


def handle_errors(fn: F) -> F:
    """Turn TreeoptError into one red line on stderr and exit code 2 (no traceback), Ctrl-C into one line and
    exit 130, SIGTERM (:class:`~sequoia_opt.errors.Terminated`) into one line and exit 143 (outputs are written
    atomically, last: nothing half-written stays, though a stop that lands after the write leaves the file,
    whole); print each distinct
    :class:`~sequoia_opt.errors.ProfileWarning` raised on the way as one ``warning:`` line on stderr."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import warnings

        from rich.markup import escape

        from ..errors import ProfileWarning, stop_exit_code, stop_word

        caught: list = []
        outermost = not _RECORDING  # a command another command runs ends inside it
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ProfileWarning)
                _RECORDING.append(caught)
                try:
                    return fn(*args, **kwargs)
                except TreeoptError as err:
                    _print_error(str(err) or err.__class__.__name__)
                    raise typer.Exit(2) from None
                except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM; may land after a file is in place: no claim
                    if outermost:  # now: a second stop would cut this line off (told once: not in finally)
                        outermost = False
                        _command_ended()
                    with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
                        _err.print(f"[yellow]{stop_word(err)}:[/] each output file is whole or absent (written "
                                   "atomically, last)")
                    raise typer.Exit(stop_exit_code(err)) from None
        finally:  # shown once the recorder is gone: inside it, showwarning records again, and the loop never ends
            if outermost:  # every output is written (or the command failed)
                _command_ended()
            if _RECORDING and _RECORDING[-1] is caught:
                _RECORDING.pop()
            shown: set[str] = set()
            for w in caught:
                if not issubclass(w.category, ProfileWarning):
                    warnings.showwarning(w.message, w.category, w.filename, w.lineno)
                elif str(w.message) not in shown:
                    shown.add(str(w.message))
                    _err.print(f"[yellow]warning:[/] {escape(str(w.message))}", markup=True, soft_wrap=True,
                               highlight=False)

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"treeopt {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """treeopt: profile -> solve -> run."""
    from ..drafting.registry import load_plugins

    try:
        load_plugins()  # TREEOPT_PLUGINS and the treeopt.plugins entry points: drafters and policies of one's own
    except TreeoptError as err:
        _print_error(str(err))
        raise typer.Exit(2) from None


# ---------------------------------------------------------------------------------------------- shared (models)
TargetOpt = Annotated[
    Optional[Path], typer.Option("--target", "-t", help="Target checkpoint: HF folder or .gguf (default: the demo target).")
]
DraftOpt = Annotated[
    Optional[str], typer.Option("--draft", help="Drafter: a draft checkpoint (HF folder or .gguf; default: the "
                                "bundled demo draft), self:L (the target's first L layers, layer skip), "
                                "lookup[:MIN-MAX] (n-gram prompt lookup over prompt and output), or a feature head "
                                "on the target's hidden states: eagle3[:PATH] (EAGLE-3; alone: the head shipped for "
                                "the demo pair), eagle:PATH (EAGLE-1/2), medusa:PATH.")
]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu | cuda | cuda:N")]
WeightsOpt = Annotated[str, typer.Option(
    "--weights", help="Target weight precision on a CPU: float32 (the checkpoint's weights) | int4 (also the "
    "weight-only int4 kernel on the GGUF's own Q4_0/Q4_1 blocks, exact) | int8 (per-channel int8, approximate). "
    "Every CPU float32 model's linears are tuned for this machine at load (cached).")]


CudaGraphsOpt = Annotated[bool, typer.Option(
    "--cuda-graphs", help="CUDA only: replay the target's and the draft model's cached forwards from CUDA graphs "
    "captured per shape (batch, tokens), as serving engines do; eager launches hide how T(n) grows on a GPU.")]


def check_cuda_graphs(enabled: bool, device: Any) -> None:
    """Refuse ``--cuda-graphs`` off CUDA before any model loads (TreeoptError: one line, exit 2)."""
    if enabled and torch.device(device).type != "cuda":
        raise TreeoptError(f"--cuda-graphs captures CUDA graphs: it needs --device cuda (got --device {device})")


def graphed(model: Any) -> Any:
    """``--cuda-graphs``: ``model`` wrapped in a :class:`~sequoia_opt.model.graphs.GraphedTransformer` when it is a
    treeopt Transformer (a drafter without a model of its own is returned as it is). Raises TreeoptError when it
    cannot be graphed (one line)."""
    from ..model import Transformer
    from ..model.graphs import cuda_graphs

    if not isinstance(model, Transformer):
        return model
    try:
        return cuda_graphs(model)
    except ValueError as err:
        raise TreeoptError(f"--cuda-graphs: {err}") from None


def set_torch_threads(threads: Optional[int]) -> None:
    """``--threads``: torch's CPU threads (None: torch's default). Raises TreeoptError below 1."""
    if threads is None:
        return
    if threads < 1:
        raise TreeoptError("--threads must be at least 1")
    torch.set_num_threads(threads)


def note(msg: str) -> None:
    """One informational line on stderr (``note: ...``), e.g. the first-load linear tuning."""
    from rich.markup import escape

    _err.print(f"[dim]note:[/] {escape(msg)}", markup=True, soft_wrap=True, highlight=False)


DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32 | bfloat16 | float16")]
BackendOpt = Annotated[str, typer.Option("--backend", help="Attention backend: auto | torch | cuda")]
PromptsOpt = Annotated[
    Optional[Path], typer.Option("--prompts", help="Prompt file: .jsonl, one object a line with 'prompt' (or 'text') "
                               "or chat 'messages'; a .json array of them; a .csv / .tsv with a 'prompt' (or "
                               "'text') column; or blank-line separated text.")
]
TemperatureOpt = Annotated[float, typer.Option("--temperature", help="0 = greedy; > 0 = sampling.")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus mass in (0, 1], applied to target and draft.")]


def _seed_in_range(value: int | None) -> int | None:
    """``--seed`` within torch.Generator.manual_seed's range (past it, a traceback after the models loaded), checked
    here rather than by typer's ``min`` / ``max``, whose 40-character range in the help's type column squeezed
    every option's description of ``treeopt run --help`` to 26 columns."""
    if value is not None and not -(2**63) <= value <= 2**64 - 1:
        bound = (f"less than or equal to {2**64 - 1}" if value > 0 else f"greater than or equal to {-(2**63)}")
        raise typer.BadParameter(f"Input should be {bound}")
    return value


SeedOpt = Annotated[int, typer.Option(
    "--seed", callback=_seed_in_range, help="Seed of the sampling generator (-2^63 .. 2^64 - 1).")]
TwoDraftsOpt = Annotated[
    Optional[list[str]], typer.Option(
        "--draft", help="The two drafters, given twice: the light (cheap) one first, then the strong one. Each a "
        "draft checkpoint (PATH or model:PATH, HF folder or .gguf), self:L, lookup[:MIN-MAX] or a feature head "
        "(eagle3[:PATH], eagle:PATH, medusa:PATH).")
]


@contextlib.contextmanager
def progress_bar():
    """Yield ``progress(what, done, total)``, which reports on stderr (so ``--json`` output on stdout stays
    clean and still shows progress).

    On a terminal: a rich progress bar with an estimate of time left. When stdout or stderr is not a
    terminal (output sent to a file or a pipe, a CI log), a bar would show nothing until the end, so each
    stage prints one plain line as it starts, with the time since the command began: a log shows progress
    as it happens. A stage is ``what`` up to its first ``,`` or ``:`` (e.g. ``target forward``,
    ``prompt 3/6``).
    """
    if not (sys.stdout.isatty() and sys.stderr.isatty()):
        t0 = time.perf_counter()
        started: set[str] = set()

        def line(what: str, done: int, total: int) -> None:
            key = what.split(",")[0].split(":")[0]
            if key not in started:
                started.add(key)
                print(f"[{time.perf_counter() - t0:7.1f} s] {key} ({done}/{total})", file=sys.stderr, flush=True)

        yield line
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), console=_err,
                  transient=True) as prog:
        tasks: dict[str, Any] = {}

        def update(what: str, done: int, total: int) -> None:
            key = what.split(",")[0].split(":")[0]
            if key not in tasks:
                tasks[key] = prog.add_task(what, total=total)
            prog.update(tasks[key], completed=done, total=total, description=what)

        yield update


def _check_run_options(backend: str, device: Any, temperature: float = 0.0, top_p: float = 1.0) -> None:
    """Refuse a bad backend, temperature or top-p before any model is loaded (TreeoptError, one line)."""
    from ..attention import resolve_backend
    from ..decoding import process_logits

    try:
        resolve_backend(backend, device)
        process_logits(torch.zeros(1), temperature, top_p)
    except (ValueError, RuntimeError) as err:
        raise TreeoptError(str(err)) from None


#: A sampling temperature below this is greedy decoding in all but name (:func:`setting_notes`).
NEAR_GREEDY = 0.01


def setting_notes(*, temperature: float, top_p: float, num_prompts: int | None, prompts_found: int,
                  prompts_file: Any) -> list[str]:
    """What a command did with a setting other than what was asked, one line each for the report (and its
    JSON): fewer prompts than ``--num-prompts`` asked for, a ``--top-p`` that greedy decoding ignores, a
    temperature so low that sampling is greedy decoding in all but name (below :data:`NEAR_GREEDY`: softmax(z / T)
    underflows to 0 in float32 for every logit more than ~87 T below the top one, so the draft's distribution is
    one-hot at almost every node and a node's candidates after the first carry no mass and are never accepted,
    where greedy verification accepts any sibling that is the target's argmax)."""
    notes = []
    if 0 < temperature < NEAR_GREEDY:
        notes.append(f"--temperature {temperature:g} is near greedy: the draft's probabilities underflow to one-hot "
                     f"(every logit more than {87 * temperature:.2g} below its top one is 0), so a node's candidates "
                     "after the first carry no mass and are never accepted; --temperature 0 decodes greedily with "
                     "the whole tree")
    if num_prompts is not None and prompts_found < num_prompts:
        notes.append(f"--num-prompts {num_prompts}: {prompts_file} holds "
                     + (f"{prompts_found} prompts; all of them were used" if prompts_found > 1 else
                        "1 prompt; it was used"))
    if temperature == 0 and top_p != 1.0:
        notes.append(f"--top-p {top_p:g} applies to sampling only: greedy decoding (--temperature 0) ignores it")
    return notes


def _csv_ints(text: str, what: str) -> list[int]:
    """``"128,512"`` -> ``[128, 512]`` (sorted, unique). Raises TreeoptError (one line naming ``what``) for a
    non-integer, an empty item (``128,,512``: a number lost in typing) or a negative value."""
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise TreeoptError(f"{what} must be comma-separated integers, got {text!r}"
                           + (" (an empty item)" if any(not x.strip() for x in text.split(",")) else "")) from None
    if not vals or any(v < 0 for v in vals):
        raise TreeoptError(f"{what} must list non-negative integers, got {text!r}")
    return sorted(set(vals))


def _load_tree_entry(path: Path):
    from ..jobs.run import TreeEntry
    from ..exports import load_any_tree

    tree, meta = load_any_tree(path)
    return TreeEntry(name=path.stem, tree=tree, metadata=meta or TreeMetadata())


def load_acceptance_width(path, width: Optional[int]):
    """The acceptance profile at ``path`` (:func:`~sequoia_opt.profiles.load_acceptance`), holding ``width``
    entries per node when ``--width`` gave one (None: any). Raises ProfileError as the loader, SolverError (one
    line) for another width."""
    from ..errors import SolverError
    from ..profiles import load_acceptance

    acc = load_acceptance(path)
    if width is not None and acc.width != width:
        raise SolverError(f"acceptance profile {acc.id!r} has {acc.width} entries but --width {width} was asked for")
    return acc


@contextlib.contextmanager
def located_prompts(texts, pfile):
    """A context that prefixes a :class:`~sequoia_opt.errors.PromptError` (``prompt 3 of 8 (600 tokens): ...``)
    raised inside it with where that prompt came from: ``texts[i].origin`` (``path:line`` of a .jsonl, .json or
    .csv), else the file ``pfile``. Other errors pass as they are.

    Args:
        texts: the :class:`~sequoia_opt.prompts.Prompt` s the measured token lists were encoded from, in order.
        pfile: their file (the demo's when the user named none).
    """
    from ..errors import PromptError

    try:
        yield
    except PromptError as err:
        i = err.index
        raise err.located(texts[i].origin if i < len(texts) and texts[i].origin else str(pfile)) from None


def mode_slug(temperature: float, top_p: float) -> str:
    """The acceptance mode in profile file names: ``greedy`` or ``sampling-t<T>-p<P>`` (what ``treeopt profile
    acceptance`` writes and ``run --compare-drafters`` looks for)."""
    return "greedy" if temperature == 0 else f"sampling-t{temperature:g}-p{top_p:g}"


def _two_drafters(drafts: Optional[list[str]], command: str):
    """Parse the two ``--draft`` of a multi-drafter command, light first (nothing is loaded).

    Returns:
        ``(light, strong)`` :class:`~sequoia_opt.jobs.load.DrafterSpec` s.

    Raises:
        TreeoptError: not exactly two, a bad spec, or the same drafter twice (one line).
    """
    from ..jobs.load import parse_drafter_spec

    n = len(drafts or [])
    if n != 2:
        raise TreeoptError(f"{command} takes exactly two --draft, the light drafter then the strong one (got {n})")
    light, strong = (parse_drafter_spec(d) for d in drafts)
    if light.label.strip().lower() == strong.label.strip().lower():
        raise TreeoptError(f"--draft {light.spec} is given twice (or both drafters are named {light.label!r}): a "
                           "light and a strong drafter are two different drafters")
    return light, strong


def _graft_tree_names(path: Path) -> Optional[tuple[str, ...]]:
    """The drafter names of a ``treeopt-tree/2`` file naming two or more drafters; None for any other file (a
    ``/1`` tree, a one-drafter ``/2`` tree, an export, or a file that does not parse: its reader says why)."""
    from ..errors import TreeValidationError
    from ..tree import load_drafter_tree

    try:
        dtree, _ = load_drafter_tree(path)
    except TreeValidationError:
        return None
    return dtree.names if len(dtree.names) > 1 else None


def _check_tree_readable(path: Path) -> None:
    """Raise the tree reader's own one-line error for a file that is no valid tree of any format run takes (a
    ``/1`` or ``/2`` tree, an export, a choice list). Used where the file's kind decides which check runs
    next, so that a missing, empty or corrupt file is reported as such and not as a mismatch of --draft count.

    Raises:
        TreeValidationError: the file cannot be read or holds no valid tree (a ``treeopt-tree/2`` file: the
            multi-drafter reader's reason; anything else: the single-drafter reader's).
    """
    from ..errors import TreeValidationError
    from ..exports import load_any_tree
    from ..tree import load_drafter_tree

    try:
        load_drafter_tree(path)
        return
    except TreeValidationError as e:
        v2_error = e
    try:
        load_any_tree(path)
    except TreeValidationError as e:
        try:
            declares_v2 = "treeopt-tree/2" in Path(path).read_text(errors="replace")
        except OSError:
            declares_v2 = False
        raise (v2_error if declares_v2 else e) from None


def _load_graft_tree(path: Path, light, strong):
    """Read a grafted tree (``treeopt-tree/2``, two drafters, light first) and check it against the two
    ``--draft`` before any model loads: its names must be the drafters' labels in order, and its plan one the
    graft policy runs (no light node under a strong one, siblings light first).

    Returns:
        ``(DrafterTree, TreeMetadata)``.

    Raises:
        TreeoptError: an unreadable or invalid tree, another number of drafters, other drafters or another
            order, a plan the graft policy refuses (one line naming the file).
    """
    from ..drafting.policies import check_graft_plan
    from ..errors import DecodingError
    from ..tree import load_drafter_tree

    dtree, meta = load_drafter_tree(path)
    names = dtree.names
    if len(names) != 2:
        raise TreeoptError(f"tree {path} names {len(names)} drafter(s) ({', '.join(names)}); a grafted tree names "
                           "two, the light then the strong (treeopt solve --pair-acceptance writes one)")
    given = (light.label, strong.label)
    if any(a.strip().lower() != b.strip().lower() for a, b in zip(names, given)):
        raise TreeoptError(f"tree {path} was solved for light {names[0]!r} and strong {names[1]!r}, but --draft "
                           f"gives {given[0]!r} then {given[1]!r}: pass the tree's drafters, light first")
    try:
        check_graft_plan(dtree.tree, dtree.drafter)
    except DecodingError as err:
        raise TreeoptError(f"tree {path}: {err}") from None
    return dtree, meta


def _check_writable(path: Path) -> None:
    """Refuse, before any measuring, an output path that cannot become a file: a directory (or device) at
    the path, a file where one of its folders should be, or a folder this user cannot write into (OutputError,
    one line). A symbolic link is checked as the file it names: the writers write through it."""
    from ..errors import OutputError

    import os

    if str(path) == "-":  # not standard output: the report is printed there already
        raise OutputError("cannot write '-': give a file name (the report is printed on standard output; --json "
                          "prints it as one JSON document)")
    if str(path) in ("", "."):  # typer reads -o '' as the current folder
        raise OutputError("an output path is empty or '.' (the current folder): give a file name")
    check_lookup(path, f"cannot write {path}")
    if path.is_symlink():  # written through (the file it names is replaced, the link stays): check that file's folder
        path = Path(os.path.realpath(path))
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a folder (give a file name in it)")
    if path.exists() and not path.is_file():
        raise OutputError(f"cannot write {path}: it exists and is not a regular file")
    folder = _existing_folder_above(path, f"cannot write {path}")
    if folder is not None and not os.access(folder, os.W_OK | os.X_OK):  # a read-only folder or file system
        raise OutputError(f"cannot write {path}: {_unwritable(folder)}")
    if folder is not None:
        _probe_folder(folder, f"cannot write {path}")


def _probe_folder(folder: Path, what: str) -> None:
    """Make and remove a file in ``folder``: what ``os.access`` cannot tell (root on a read-only mount, /proc,
    /sys). Raises OutputError ``"{what}: a file cannot be made in {folder} (reason)"``."""
    import os
    import tempfile

    from .._io import _signals_deferred
    from ..errors import OutputError

    try:
        with _signals_deferred():  # a stop between the make and the unlink left the probe behind
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".treeopt-probe-")
            os.close(fd)
            os.unlink(probe)
    except OSError as err:
        raise OutputError(f"{what}: a file cannot be made in {folder} ({err.strerror or err})") from None


def check_output(path: Optional[Path], inputs: dict[str, Any], flag: str = "-o") -> None:
    """:func:`_check_writable`, and refuse (OutputError, one line) an output ``path`` that is one of the
    command's ``inputs`` (option name -> the path given, None where not given; a file reached through a link or
    ``..`` too), or a file already inside an input folder (a checkpoint's ``config.json`` or weights; a drafter
    given as ``kind:PATH`` is its PATH): written over, the input would be lost. None: nothing to check."""
    from ..errors import OutputError

    if path is None:
        return
    _check_writable(path)
    out = Path(path).resolve()
    for name, given in inputs.items():
        if given is None or str(given) == "-":
            continue
        for one in (given if isinstance(given, (list, tuple)) else [given]):
            src = Path(one)
            if not src.exists() and isinstance(one, str) and ":" in one:  # a drafter spec: eagle3:PATH, model:PATH
                src = Path(one.split(":", 1)[1])
            if not src.exists():
                continue
            src = src.resolve()
            if out == src:
                raise OutputError(f"{flag} {path} is the {name} input: write the output to another path")
            if src.is_dir() and out.exists() and out.is_relative_to(src):
                raise OutputError(f"{flag} {path} is a file of the {name} input ({one}): written over, the checkpoint "
                                  "would be lost; write the output to another path")


def _unwritable(folder: Path) -> str:
    """Why ``folder`` takes no files: on a read-only file system (``statvfs``'s ``ST_RDONLY``), or this user may
    not write into it."""
    import os

    folder = Path(os.path.abspath(folder))  # '.' names no folder a user can find in the message
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"{folder} is on a read-only file system"
    except (OSError, AttributeError):  # no statvfs (Windows): say the common case
        pass
    return f"this user cannot write into {folder}"


def _existing_folder_above(path: Path, what: str) -> Optional[Path]:
    """The nearest folder above ``path`` that exists (None when none does); OutputError ``"<what>: <it> is not
    a folder"`` when that nearest existing path is a file."""
    from ..errors import OutputError

    for parent in Path(path).parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"{what}: {parent} is not a folder")
            return parent
    return None


def _check_results_dir(path: Path, option: str = "--results-dir") -> None:
    """Refuse, before any model loads, a results folder that cannot take new files: a file (or device) at
    the path or where one of its folders should be, or a folder this user cannot write (OutputError, one
    line naming ``option``)."""
    import os

    from ..errors import OutputError

    path = Path(path)
    check_lookup(path, f"{option} {path}")
    if path.is_symlink() and not path.exists():  # mkdir cannot make a folder through it: refused after the run
        raise OutputError(f"{option} {path}: a symbolic link to {os.readlink(path)}, which does not exist (make that "
                          "folder, or give another)")
    if path.exists():
        if not path.is_dir():
            raise OutputError(f"{option} {path}: it exists and is not a folder (results are written into a folder)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputError(f"{option} {path}: {_unwritable(path)}")
        _probe_folder(path, f"{option} {path}")
        return
    parent = _existing_folder_above(path, f"{option} {path}")
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {path}: cannot create it, {_unwritable(parent)}")
    if parent is not None:
        _probe_folder(parent, f"{option} {path}: cannot create it")


#: ``treeopt profile ...``: its commands live in one module each (cli/profile_*.py).
profile_app = typer.Typer(cls=_FlowingHelp, help="Measure the device (latency curve) and the model pair (acceptance "
                          "vector); find the best L of the self layer-skip drafter.", no_args_is_help=True)
app.add_typer(profile_app, name="profile")
