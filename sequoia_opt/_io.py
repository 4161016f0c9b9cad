"""Atomic file output: write to a temporary file in the destination folder, then rename over the target.

A crash, Ctrl-C or error mid-write leaves either the old file or nothing, never half a file. A symlink is
written through (its target is replaced, the link stays); a directory or device at the path is refused rather
than replaced. The new file gets the mode a plain ``open()`` would give it (``0o666`` less the umask), or the
mode of the file it replaces.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from .errors import OutputError


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder + ``os.replace``).

    Creates missing parent folders. Returns the final path.

    Raises:
        OutputError: the path is a directory, device or other non-regular file, or the OS refuses the
            write (one line naming the path and the reason).
    """
    path = _target(path)
    with atomic_output_path(path) as tmp:
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
        except OSError as err:
            raise OutputError(f"cannot write {path}: {err.strerror or err}") from None
    return path


def _target(path: str | os.PathLike) -> Path:
    """The file a write to ``path`` replaces: a symlink's target; a directory or device there is refused.

    Raises:
        OutputError: the path exists and is not a regular file.
    """
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    if path.exists() and not path.is_file():
        raise OutputError(f"cannot write {path}: it exists and is not a regular file")
    return path


def read_text_file(path: str | os.PathLike, *, error: type[Exception], what: str) -> str:
    """Read a UTF-8 text input file, turning failures into ``error`` with one line:
    ``cannot read <what> <path>: <reason>`` (missing, a directory, no permission) or
    ``<path>: not a UTF-8 text file (expected a <what>)`` (binary data)."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise error(f"cannot read {what} {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a UTF-8 text file (expected a {what})") from None


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically. See :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_output_path(path: str | os.PathLike):
    """For writers that open the file themselves (``gguf.GGUFWriter``): yield a temporary path in the
    destination folder; when the block finishes, rename it over ``path`` (atomically, with
    :func:`atomic_write_bytes`'s mode rules); when it raises, remove it and leave ``path`` as it was.

    Raises:
        OutputError: as :func:`atomic_write_bytes` (a directory in the way, the OS refusing the write).
    """
    path = _target(path)
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else _default_mode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as err:
        raise OutputError(f"cannot write {path}: {err.strerror or err}") from None
    try:
        yield Path(tmp)
        os.chmod(tmp, mode)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise OutputError(f"cannot write {path}: {err.strerror or err}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
