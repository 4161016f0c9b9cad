"""Exceptions with messages meant for users: the CLI prints ``str(err)`` as one line and exits non-zero."""


class TreeoptError(ValueError):
    """Base class for every user-facing error raised by treeopt."""


class TreeValidationError(TreeoptError):
    """A tree (from YAML, a choice list or code) violates the topology rules of :mod:`sequoia_opt.tree`."""


class MultiDrafterTreeError(TreeValidationError):
    """A single-drafter reader was given a multi-drafter (grafted, ``treeopt-tree/2``) tree: a valid tree that
    the multi-drafter path reads (:func:`sequoia_opt.tree.load_drafter_tree`)."""


class ProfileError(TreeoptError):
    """A latency or acceptance profile has a wrong schema, wrong units or values out of range."""


class SolverError(TreeoptError):
    """The solver was given inputs it cannot work with (bad acceptance vector, budget, depth, ...)."""


class CheckpointError(TreeoptError):
    """A checkpoint cannot be loaded: a missing or unexpected tensor, a shape mismatch, unknown format."""


class DecodingError(TreeoptError):
    """Decoding was asked to do something impossible (tree wider than the vocabulary, cache overflow, ...)."""


class PromptError(DecodingError):
    """One prompt of a list cannot be decoded (past the context with its answer, a token outside the vocabulary),
    found when every request is checked before the first timed forward. The message reads ``prompt 3 of 8 (600
    tokens): <why>``; a caller that knows where the prompt came from prefixes its ``path:line``
    (:meth:`located`).

    Attributes:
        index: the prompt's 0-based index in the list.  total: the list's length.  tokens: its length (tokens).
    """

    def __init__(self, index: int, total: int, tokens: int, why: str, where: str | None = None) -> None:
        super().__init__((f"{where}: " if where else "") + f"prompt {index + 1} of {total} ({tokens} tokens): {why}")
        self.index, self.total, self.tokens, self.why = int(index), int(total), int(tokens), str(why)

    def located(self, where: str) -> "PromptError":
        """The same refusal, prefixed by where the prompt came from (``path:line``, or the file)."""
        return PromptError(self.index, self.total, self.tokens, self.why, where)


class OutputError(TreeoptError):
    """An output file cannot be written (a directory or device in the way, no permission, a missing disk)."""


class EngineError(TreeoptError):
    """An engine is not installed, refuses a model, or cannot do what was asked (one line for the CLI)."""


class EngineNotInstalled(EngineError):
    """The package that drives an engine is not installed (its message names the install command)."""


class ProfileWarning(UserWarning):
    """A file that loads but looks wrong: a profile whose figures are implausible (a latency curve far below T(1)
    for larger n), or a profile, plan, tree or scheduler holding a key its format does not read (a misspelling,
    :func:`sequoia_opt._io.warn_unknown_keys`); or a leftover a command removed from its output folder (a run's CSV
    without its JSON). The CLI prints each as one ``warning:`` line on stderr."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a job scheduler's stop, ``timeout``) raised as an exception in the main thread, as Ctrl-C
    raises KeyboardInterrupt: the same unwinding (temporary files removed, held renames finished), then one line
    and exit ``128 + signum`` (143). The ``treeopt`` entry point installs the handler
    (:func:`sequoia_opt._entry.main`); a library caller keeps the default (the process ends at once)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def stop_exit_code(err: BaseException) -> int:
    """The exit status of a command stopped by ``err``: ``128 + signum`` for :class:`Terminated` (143 for SIGTERM),
    130 (128 + SIGINT) for Ctrl-C, as a shell reports a process a signal ended."""
    return 128 + err.signum if isinstance(err, Terminated) else 130


def stop_word(err: BaseException) -> str:
    """``"terminated"`` (SIGTERM) or ``"interrupted"`` (Ctrl-C): the first word of the line a stopped command prints."""
    return "terminated" if isinstance(err, Terminated) else "interrupted"
