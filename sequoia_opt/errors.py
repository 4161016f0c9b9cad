"""Exceptions with messages meant for users: the CLI prints ``str(err)`` as one line and exits non-zero."""


class TreeoptError(ValueError):
    """Base class for every user-facing error raised by treeopt."""


class TreeValidationError(TreeoptError):
    """A tree (from YAML, a choice list or code) violates the topology rules of :mod:`sequoia_opt.tree`."""


class ProfileError(TreeoptError):
    """A latency or acceptance profile has a wrong schema, wrong units or values out of range."""


class SolverError(TreeoptError):
    """The solver was given inputs it cannot work with (bad acceptance vector, budget, depth, ...)."""


class CheckpointError(TreeoptError):
    """A checkpoint cannot be loaded: a missing or unexpected tensor, a shape mismatch, unknown format."""


class DecodingError(TreeoptError):
    """Decoding was asked to do something impossible (tree wider than the vocabulary, cache overflow, ...)."""


class OutputError(TreeoptError):
    """An output file cannot be written (a directory or device in the way, no permission, a missing disk)."""


class EngineError(TreeoptError):
    """An engine is not installed, refuses a model, or cannot do what was asked (one line for the CLI)."""


class ProfileWarning(UserWarning):
    """A file that loads but looks wrong: a profile whose figures are implausible (a latency curve far below T(1)
    for larger n), or a profile, plan, tree or scheduler holding a key its format does not read (a misspelling,
    :func:`sequoia_opt._io.warn_unknown_keys`). The CLI prints each as one ``warning:`` line on stderr."""
