"""Atomic file output: write to a temporary file in the destination folder, then rename over the target.

A crash, Ctrl-C or error mid-write leaves either the old file or nothing, never half a file. A symlink is
written through (its target is replaced, the link stays); a directory or device at the path is refused rather
than replaced. The new file gets the mode a plain ``open()`` would give it (``0o666`` less the umask), or the
mode of the file it replaces.

Run outputs (``results/<run-id>.json`` and ``.csv``) never replace anything: :func:`new_run_id` makes ids
that two runs in one second do not share, and :func:`create_files` creates a run's files together under
names that must not exist yet.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import os
import re
import secrets
import signal
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

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


def check_lookup(path: str | os.PathLike, what: str) -> None:
    """Refuse a path the OS cannot look up (OutputError ``"{what}: <reason>"``): a name past the file system's limit
    (255 bytes), a loop of symbolic links. pathlib raises the first (a traceback) and takes the second for a missing
    path, which failed only when the output was written, after the measuring. A missing path passes."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as err:
        raise OutputError(f"{what}: {err.strerror or err}") from None


def _target(path: str | os.PathLike) -> Path:
    """The file a write to ``path`` replaces: a symlink's target; a directory or device there is refused.

    Raises:
        OutputError: the path exists and is not a regular file, or the OS cannot look it up (a name longer than
            the file system takes, a loop of symbolic links).
    """
    path = Path(path)
    check_lookup(path, f"cannot write {path}")  # one line, not pathlib's traceback
    if path.is_symlink():
        path = path.resolve()
    if path.exists() and not path.is_file():
        raise OutputError(f"cannot write {path}: it exists and is not a regular file")
    return path


#: The most bytes of the final name a temporary file's name carries (``.<name>.<random>.tmp``): a name near the
#: file system's limit (255 bytes) made a temporary name past it, and a path the OS takes was refused.
_TMP_NAME_BYTES = 100


def _tmp_prefix(name: str) -> str:
    """``.<name>.`` for a temporary file's name, ``name`` cut to :data:`_TMP_NAME_BYTES` bytes of UTF-8 (on a
    character boundary) so that the temporary name fits wherever the final one does."""
    cut = name.encode("utf-8", "surrogateescape")[:_TMP_NAME_BYTES].decode("utf-8", "ignore")
    return f".{cut}."


#: The largest text input read, in bytes (1 GiB): every treeopt input (prompts, profiles, tables, trees) is far
#: smaller; past it the file is a device or a mistake (``--prompts /dev/zero`` read until memory ran out).
MAX_TEXT_BYTES = 1 << 30


def read_text_file(path: str | os.PathLike, *, error: type[Exception], what: str) -> str:
    """Read a UTF-8 text input file (a byte-order mark at its start skipped), turning failures into ``error``
    with one line:
    ``cannot read <what> <path>: <reason>`` (missing, a directory, no permission),
    ``<path>: not a UTF-8 text file (expected a <what>)`` (binary data, a NUL byte among it) or
    ``<path>: larger than ... bytes`` (:data:`MAX_TEXT_BYTES`; a pipe or ``/dev/stdin`` is read as a file is)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TEXT_BYTES + 1)
        if len(data) > MAX_TEXT_BYTES:
            raise error(f"{path}: larger than {MAX_TEXT_BYTES:,} bytes, past any {what}")
        if b"\x00" in data:  # valid UTF-8, but no text file holds a NUL byte: binary data (UTF-16 text too)
            raise UnicodeDecodeError("utf-8", data, data.index(b"\x00"), data.index(b"\x00") + 1, "NUL byte")
        return data.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")  # as read_text's newlines
    except OSError as err:
        raise error(f"cannot read {what} {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        # the byte's place in the file: utf-8-sig counts from after a byte-order mark
        at = err.start + (3 if err.reason != "NUL byte" and data.startswith(b"\xef\xbb\xbf") else 0)
        why = (f"a NUL byte at byte {at}: binary data or UTF-16, not text" if err.reason == "NUL byte"
               else f"not valid UTF-8 at byte {at}")
        raise error(f"{path}: not a UTF-8 text file ({why}; expected {with_article(what)})") from None


def with_article(noun: str) -> str:
    """``noun`` after "a" or "an" as its first letter asks (a vowel: "an acceptance profile"), for messages."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def warn_unknown_keys(doc: Mapping[str, Any], known: Sequence[str], source: str) -> None:
    """One :class:`~sequoia_opt.errors.ProfileWarning` per key of a file's mapping ``doc`` that its format does not
    read (``known``), naming the closest known key when one is near (``difflib``): a misspelt optional key
    (``acceptence_by_depth``, ``min_gian``) was ignored without a word, and the file solved as if it were absent.

    Warned, not refused: a file written by a newer treeopt or by another tool may carry keys this version does
    not read. ``source`` names the file and, for a nested mapping, its place (``"plan.yaml: ranges[2]"``).
    """
    import difflib
    import warnings

    from .errors import ProfileWarning

    for key in doc:
        if key in known:
            continue
        near = difflib.get_close_matches(str(key), [str(k) for k in known], n=1, cutoff=0.75)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        warnings.warn(f"{source}: unknown key {str(key)!r}{hint}: ignored", ProfileWarning, stacklevel=3)


_INT64_MAX = 2**63 - 1


def check_numbers(doc, source: str, error: type[Exception]) -> None:
    """Refuse a parsed file (YAML / JSON: nested dicts and lists) holding a number no field of any treeopt
    format takes: an infinity or NaN (YAML's ``.inf`` / ``.nan``, JSON's ``Infinity`` / ``NaN``), or an integer
    outside int64 (1e30 written as an integer). Every loader calls it before reading fields, so such a
    value fails as one line naming the file and the key, never as an OverflowError deep in numpy; each
    format then checks its own fields' ranges.

    YAML aliases are walked once each: a node shared by several keys (an anchor, as ``yaml.safe_dump`` writes
    an object held twice) is checked at its first key, so a file of nested aliases (``a: &a [x, x]``, ``b: &b
    [*a, *a]``, ...) costs its size in the file, not its size expanded; an alias inside its own anchor (``a: &a
    [*a]``) is refused, where walking it would never end.

    Raises:
        error: ``"<source>: <key path> is inf (a file holds finite numbers)"``, ``"... does not fit a 64-bit
            integer"`` or ``"... refers to itself ..."``.
    """
    import math

    stack: list[tuple[Any, str, bool]] = [(doc, "", False)]
    open_ids: set[int] = set()  # the containers on the path walked now: reaching one again is a loop
    checked: set[int] = set()
    while stack:
        x, where, leaving = stack.pop()
        if leaving:
            open_ids.discard(id(x))
            checked.add(id(x))
            continue
        if isinstance(x, (dict, list)):
            if id(x) in open_ids:
                raise error(f"{source}: {where or 'the value'} refers to itself (a YAML alias inside its own anchor)")
            if id(x) in checked:
                continue
            open_ids.add(id(x))
            stack.append((x, where, True))
        if isinstance(x, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k), False) for k, v in x.items())
        elif isinstance(x, list):
            stack.extend((v, f"{where}[{i}]", False) for i, v in enumerate(x))
        elif isinstance(x, float) and not math.isfinite(x):
            raise error(f"{source}: {where or 'the value'} is {x} (a file holds finite numbers)")
        elif isinstance(x, int) and not isinstance(x, bool) and not -_INT64_MAX - 1 <= x <= _INT64_MAX:
            raise error(f"{source}: {where or 'the value'} = {x} does not fit a 64-bit integer")


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically. See :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def document_text(path: str | os.PathLike, doc: Mapping[str, Any]) -> str:
    """A treeopt document's file text (profile, plan, schedule): JSON (indented) where ``path`` ends in ``.json``
    (any case), else YAML (PyYAML's C dumper where it is built: large profiles); every loader reads both."""
    if str(path).lower().endswith(".json"):
        import json

        return json.dumps(doc, indent=2) + "\n"
    import yaml

    Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(dict(doc), Dumper=Dumper, sort_keys=False, default_flow_style=None)


def atomic_write_texts(files: Mapping[str | os.PathLike, str], remove: Sequence[str | os.PathLike] = (),
                       remove_if: Callable[[Path], bool] | None = None) -> list[Path]:
    """Write several files (UTF-8), replacing what is there: every temporary file is made and written in its
    destination folder before the first is renamed over its path, so a folder that refuses a file, or a failing
    write, leaves every path as it was (a failure in the renames themselves, after every write succeeded, can
    leave some replaced; Ctrl-C / SIGTERM are held until the last rename is done). ``remove``: files of the same
    unit that must no longer exist (an earlier run's engine settings that this run found nothing to set for),
    removed after the renames inside the same folder locks and signal hold, so another writer of the same paths
    never sees this unit's files beside its own; with ``remove_if``, only a file for which it answers True there
    (read under the locks: another writer's file made since a caller's own look is judged too). Returns the paths
    written, in the order given.

    Raises:
        OutputError: two entries for one path, a file of ``remove`` the OS refuses to remove, or as
            :func:`atomic_write_bytes` (one line naming the path).
    """
    paths = [_target(p) for p in files]
    if len({p.resolve() for p in paths}) < len(paths):
        raise OutputError(f"cannot write {', '.join(map(str, files))}: one path is named twice (each output needs "
                          "its own file)")
    gone = [Path(p) for p in remove]

    def remove_after_renames(exc_type, _exc, _tb) -> bool:
        if exc_type is None:
            for p in gone:
                if remove_if is not None and not (p.is_file() and remove_if(p)):
                    continue
                try:
                    p.unlink(missing_ok=True)
                except OSError as err:
                    raise OutputError(f"cannot remove {p}: {err.strerror or err}") from None
        return False

    with contextlib.ExitStack() as stack:
        stack.enter_context(_signals_deferred())  # exits last: no Ctrl-C between two renames
        lock = stack.enter_context(_folders_locked())  # released after the renames, which exit before it
        stack.push(remove_after_renames)  # after every rename (they exit first), before the locks are released
        tmps = [stack.enter_context(atomic_output_path(p)) for p in paths]  # all made before any is renamed
        for p, tmp, text in zip(paths, tmps, files.values()):
            try:
                tmp.write_bytes(text.encode("utf-8"))
            except OSError as err:
                raise OutputError(f"cannot write {p}: {err.strerror or err}") from None
        lock([p.parent for p in paths] + [p.parent for p in gone])
    return paths


@contextlib.contextmanager
def _folders_locked():
    """Yield ``lock(folders)``, which takes an exclusive advisory lock (``fcntl.flock``) on each folder, in one
    order (sorted by device and inode: two writers never wait on each other), held until the block ends, and
    returns whether every folder was locked. A
    multi-file write renames its files inside it: two writers of the same files (``treeopt tune -o A --schedule
    B`` twice at once) each rename all of theirs before the other renames any, so the files on disk are all one
    writer's, never A from one and B from the other; :func:`create_files` gives a unit its names inside it, so
    :func:`remove_uncommitted` never takes a unit being named for an orphan. A folder that cannot be locked (no
    ``fcntl``: Windows; a file system without ``flock``) is written unlocked, as before."""
    fds: list[int] = []

    def lock(folders: Sequence[Path]) -> bool:
        try:
            import fcntl
        except ImportError:  # Windows: no advisory locks; the files are written as before
            return False
        every = True
        keys = {}
        for d in folders:
            try:
                st = os.stat(d)
            except OSError:
                every = False
                continue
            keys[(st.st_dev, st.st_ino)] = d
        for key in sorted(keys):
            try:
                fd = os.open(keys[key], os.O_RDONLY)
            except OSError:
                every = False
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:  # a file system without flock (some network mounts): unlocked
                os.close(fd)
                every = False
                continue
            fds.append(fd)
        return every

    try:
        yield lock
    finally:
        for fd in reversed(fds):
            os.close(fd)  # closing the last descriptor of the open file releases its flock


def write_all(writes: Sequence[tuple[Path, Callable[[Path], Any]]]) -> list[Path]:
    """Write several output files as one unit through their own writers: each ``(path, write)`` in order
    (``write(path)`` writes ``path`` atomically: a ``save_*`` function); when one fails, the files already written
    are put back as they were (removed, or their old bytes restored) and the error is raised, so the set on disk
    is the old one or the new one, never a mix. Ctrl-C / SIGTERM are held until the last file is written (or put
    back). For texts, :func:`atomic_write_texts` writes every temporary file before the first rename; for new
    files that must never replace one, :func:`create_files`. Returns the paths in order.

    Raises:
        whatever a writer raises (OutputError for a refused path), after the put-back.
    """
    done: list[tuple[Path, Path | None]] = []  # (file, a hard link to its old bytes, or None: it had none)
    given: list[Path] = []
    with _signals_deferred():
        try:
            for path, write in writes:
                given.append(Path(path))
                file = _target(path)  # through a symlink, the file the writer replaces: the one kept and put back
                done.append((file, _keep_old(file)))  # before the write: a writer that fails midway is put back
                write(Path(path))
        except BaseException:
            for path, old in reversed(done):
                if old is None:
                    path.unlink(missing_ok=True)
                else:
                    os.replace(old, path)
            raise
        finally:
            for _, old in done:
                if old is not None and old.exists():
                    old.unlink()
    return given


def _keep_old(path: Path) -> Path | None:
    """A second name for ``path``'s old file in its folder (a hard link: no copy of a multi-GB checkpoint; a copy
    where the file system has no hard links), or None when there is none. Atomic writers replace the path by a
    rename, so the old bytes stay under this name until :func:`write_all` puts them back or removes it."""
    if not path.is_file():
        return None
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path.name), suffix=".old", dir=path.parent)
    os.close(fd)
    os.unlink(tmp)
    try:
        os.link(path, tmp)
    except OSError:
        import shutil

        shutil.copy2(path, tmp)
    return Path(tmp)


@contextlib.contextmanager
def atomic_output_path(path: str | os.PathLike):
    """For writers that open the file themselves (``gguf.GGUFWriter``): yield a temporary path in the
    destination folder; when the block finishes, rename it over ``path`` (atomically, with
    :func:`atomic_write_bytes`'s mode rules); when it raises, remove it and leave ``path`` as it was, and the
    folders it made for it too (a refused export left ``newdir/sub/`` behind).

    Raises:
        OutputError: as :func:`atomic_write_bytes` (a directory in the way, the OS refusing the write).
    """
    path = _target(path)
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else _default_mode()
    made = [d for d in (path.parent, *path.parent.parents) if not d.exists()]  # deepest first
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path.name), suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as err:
        raise OutputError(f"cannot write {path}: {err.strerror or err}") from None
    done = False
    try:
        yield Path(tmp)
        os.chmod(tmp, mode)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        done = True
    except OSError as err:
        raise OutputError(f"cannot write {path}: {err.strerror or err}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if not done:
            for d in made:  # only the folders made here, and only while empty
                try:
                    d.rmdir()
                except OSError:
                    break


#: The millisecond of the last id this process made, and the suffixes it gave in it (:func:`new_run_id`).
_ISSUED: tuple[str, set[str]] = ("", set())
_ISSUED_LOCK = threading.Lock()


def new_run_id(prefix: str | None = "run") -> str:
    """A run id no other run shares: ``<prefix>-<UTC time to the millisecond>Z-<6 random hex digits>``,
    e.g. ``run-20261201T094917.123Z-3fa2c1`` (sorts by time; 2**24 suffixes per millisecond); without the
    prefix for ``None`` (a benchmark's results folder). Within one process no two ids are equal (a suffix drawn
    twice in one millisecond is drawn again: by chance alone, 700 ids in one millisecond shared one 1.5 % of the
    time); across processes the random suffix separates them, and :func:`create_files` never replaces a name."""
    global _ISSUED
    with _ISSUED_LOCK:
        now = _dt.datetime.now(_dt.timezone.utc)
        ms = f"{now.strftime('%Y%m%dT%H%M%S')}.{now.microsecond // 1000:03d}Z"
        if _ISSUED[0] != ms:
            _ISSUED = (ms, set())
        suffix = secrets.token_hex(3)
        while suffix in _ISSUED[1]:
            suffix = secrets.token_hex(3)
        _ISSUED[1].add(suffix)
    stamp = f"{ms}-{suffix}"
    return f"{prefix}-{stamp}" if prefix else stamp


#: The stops :func:`_signals_deferred` holds: Ctrl-C, ``kill``, and a closed terminal (where the platform has it).
_HELD_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def _signals_deferred():
    """Hold SIGINT / SIGTERM / SIGHUP until the block ends (main thread only; elsewhere Python runs no handler),
    then deliver the first one that arrived to the handler that was installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {sig: signal.signal(sig, lambda s, _f: got.append(s)) for sig in _HELD_SIGNALS}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        if got:
            os.kill(os.getpid(), got[0])


def create_files(files: Mapping[str | os.PathLike, str | bytes]) -> list[Path]:
    """Create several new files as one unit, never replacing a file: each is written and synced under a
    temporary name in its folder, then all are given their names (``os.link``, which fails on a name that
    exists) with Ctrl-C / SIGTERM held until the last one has its name; when a name exists or a step fails,
    the names already given are removed, so either every file exists or none does.

    Args:
        files: path -> content (str is written as UTF-8), in commit order (give the record a reader looks
            for, e.g. a run's JSON, last).

    Returns:
        The paths, in the order given. When nothing is written, the folders it made are removed again (if empty).

    Raises:
        OutputError: a name that exists (``"... exists: a writer never replaces a file it did not create"``),
            a folder that cannot be made, or the OS refusing a write; one line naming the path.
    """
    paths = [Path(p) for p in files]
    for p in paths:
        if os.path.lexists(p):
            raise OutputError(f"cannot write {p}: it exists, and a run never replaces a file it did not create")
    tmps: list[str] = []
    made: list[Path] = []
    folders: list[Path] = []  # the folders this call made, outermost first: removed again when nothing is written
    done = False
    try:
        for p, data in zip(paths, files.values()):
            try:
                missing = [d for d in (p.parent, *p.parent.parents) if not os.path.lexists(d)]
                p.parent.mkdir(parents=True, exist_ok=True)
                folders += [d for d in reversed(missing) if d not in folders]
                fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(p.name), suffix=".tmp", dir=p.parent)
                tmps.append(tmp)
                with os.fdopen(fd, "wb") as f:
                    f.write(data.encode("utf-8") if isinstance(data, str) else data)
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, _default_mode())
            except OSError as err:
                raise OutputError(f"cannot write {p}: {err.strerror or err}") from None
        with _signals_deferred(), _folders_locked() as lock:
            lock([p.parent for p in paths])  # no orphan sweep (remove_uncommitted) sees this unit half-named
            try:
                for p, tmp in zip(paths, tmps):
                    _link_new(tmp, p)
                    made.append(p)
            except BaseException:
                for p in made:
                    with contextlib.suppress(OSError):
                        os.unlink(p)
                raise
        done = True
    finally:
        for tmp in tmps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if not done:  # a full disk left the results folder it made, empty
            for d in reversed(folders):
                with contextlib.suppress(OSError):
                    d.rmdir()  # only an empty folder goes: another writer's files keep theirs
    return paths


def create_run_record(folder: str | os.PathLike, doc: Mapping[str, Any], run_id: str | None = None) -> Path:
    """A benchmark run's record: ``doc`` as JSON (indent 1, a final newline) in a new file
    ``<folder>/<run_id>.json`` (default :func:`new_run_id` without a prefix), created by :func:`create_files`, so
    two runs never share or replace a record. Returns its path.

    Raises:
        OutputError: as :func:`create_files`.
    """
    import json

    path = Path(folder) / f"{new_run_id(None) if run_id is None else run_id}.json"
    create_files({path: json.dumps(doc, indent=1) + "\n"})
    return path


@contextlib.contextmanager
def folder_locked(folder: str | os.PathLike):
    """Hold an exclusive advisory lock (``fcntl.flock``) on ``folder``, made where missing, for the block: a
    read-modify-write of a file in it (a cache two processes extend) runs whole before another's starts. The
    lock :func:`atomic_write_texts` and :func:`create_files` take too. Where the folder cannot be made or
    locked (Windows, a file system without ``flock``), the block runs unlocked."""
    with contextlib.suppress(OSError):
        Path(folder).mkdir(parents=True, exist_ok=True)
    with _folders_locked() as lock:
        lock([Path(folder)])
        yield


#: A name :func:`new_run_id` makes (with or without its prefix): what :func:`remove_uncommitted` may remove.
RUN_ID_RE = re.compile(r"(?:[A-Za-z0-9_.]+-)?\d{8}T\d{6}\.\d{3}Z-[0-9a-f]{6}")


def remove_uncommitted(folder: str | os.PathLike, part: str, record: str) -> list[Path]:
    """Remove the orphans a killed :func:`create_files` left in ``folder``: a ``<run-id><part>`` file (e.g. a run's
    ``.csv``) whose ``<run-id><record>`` (its ``.json``, named last: the unit's commit) does not exist, and which is
    still a second name of its hidden temporary file (same inode: the kill came before the temporary was removed).
    A SIGKILL between the two names leaves the first alone, and a script reading ``results/*.csv`` took it for a
    run. A CSV whose JSON the user moved away, or a copy of one, shares no inode with a temporary and is kept. The
    unit's leftover temporaries (``.<run-id><part>.*.tmp``, ``.<run-id><record>.*.tmp``) go with it. Runs under
    :func:`_folders_locked`, which :func:`create_files` holds while it names a unit, so a run being saved at this
    moment is never taken for an orphan; where the folder cannot be locked, nothing is removed. Only names
    :func:`new_run_id` makes (:data:`RUN_ID_RE`) are looked at; a missing folder has none.

    Returns:
        The ``<run-id><part>`` files removed (not their temporaries).
    """
    import glob

    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    with _folders_locked() as lock:
        if not lock([folder]):
            return []
        for f in folder.iterdir():
            stem = f.name[:-len(part)] if f.name.endswith(part) else None
            if not (stem and RUN_ID_RE.fullmatch(stem) and f.is_file() and not f.is_symlink()
                    and not os.path.lexists(folder / (stem + record))):
                continue
            here = glob.escape(str(folder))
            tmps = [Path(t) for name in (f.name, stem + record)
                    for t in glob.glob(os.path.join(here, glob.escape(_tmp_prefix(name)) + "*.tmp"))]
            with contextlib.suppress(OSError):
                if any(t.name.startswith(_tmp_prefix(f.name)) and os.path.samefile(t, f) for t in tmps):
                    f.unlink()
                    removed.append(f)
                    for t in tmps:
                        t.unlink(missing_ok=True)
    return removed


def _link_new(tmp: str, path: Path) -> None:
    """Give the written file ``tmp`` the name ``path``, which must not exist (``os.link``; where the file
    system has no hard links, an exclusive create then a rename over that placeholder)."""
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        raise OutputError(f"cannot write {path}: it exists, and a run never replaces a file it did not "
                          "create") from None
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise OutputError(f"cannot write {path}: {err.strerror or err}") from None
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        raise OutputError(f"cannot write {path}: it exists, and a run never replaces a file it did not "
                          "create") from None
    except OSError as err:
        raise OutputError(f"cannot write {path}: {err.strerror or err}") from None
    try:
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise OutputError(f"cannot write {path}: {err.strerror or err}") from None


_STRICT_LOADER: Any = None


#: the deepest nesting of flow brackets (``[`` / ``{``) a YAML or JSON input may have: PyYAML's C parser overflows
#: the C stack near 30,000 levels and kills the process (exit 139, no message); ``json`` and PyYAML's Python parser
#: raise RecursionError near 1,000. No file of treeopt's nests past a few levels.
MAX_NESTING = 200

_BRACKETS = re.compile(r"[\[\]{}]")


def deep_nesting_at(text: str, limit: int = MAX_NESTING) -> int | None:
    """The offset in ``text`` where its bracket nesting first passes ``limit`` levels, or None. Quotes are not
    parsed: a bracket inside a string counts too, and unclosed ones add up over the file, which can only refuse a
    file sooner; :func:`safe_load_yaml` checks treeopt's own YAML files with it (profiles, trees, plans: no prose
    in them), never prompt text. Cost: one regular-expression pass, nothing when the text holds fewer brackets than
    ``limit``."""
    if text.count("[") + text.count("{") <= limit:
        return None
    depth = 0
    for m in _BRACKETS.finditer(text):
        if m.group() in "[{":
            depth += 1
            if depth > limit:
                return m.start()
        elif depth:
            depth -= 1
    return None


def read_json_object(path: Path, *, error: type[Exception], missing: str | None = None) -> dict[str, Any]:
    """The JSON object in the file ``path`` (a byte-order mark skipped; :func:`load_json`'s rules: too deep or a
    repeated key is bad JSON): a checkpoint's ``config.json``, a head's, a safetensors index. ``missing``: the message
    for a file that does not exist (default ``"<path>: not found"``).

    Raises:
        error: one line: missing, unreadable (a folder, no permission), not JSON, or not an object.
    """
    try:
        doc = load_json(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise error(missing or f"{path}: not found") from None
    except (OSError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        raise error(f"{path}: cannot be read as JSON ({err})") from None
    if not isinstance(doc, dict):
        raise error(f"{path}: a JSON object was expected, not {type(doc).__name__} {str(doc)[:40]}")
    return doc


def load_json(text: str) -> Any:
    """``json.loads`` that turns json's RecursionError on deep nesting into a ``json.JSONDecodeError`` (no caller's
    handler of bad JSON caught it) and refuses a key given twice in one object (json keeps the last without a word;
    :func:`safe_load_yaml` refuses it too).

    Raises:
        ValueError: ``json.JSONDecodeError`` for text that is not JSON, too deep, or repeats a key (its ``msg``
            says which); a plain ValueError for an integer past Python's 4300 digits."""
    import json

    def pairs(items: list) -> dict:
        out: dict = {}
        for k, v in items:
            if k in out:
                raise json.JSONDecodeError(f"key {k!r} is given twice", text, 0)
            out[k] = v
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except RecursionError:  # json's C scanner stops cleanly here (no pre-scan: brackets inside strings are text)
        raise json.JSONDecodeError("nested too deeply", text, 0) from None


def safe_load_yaml(text: str) -> Any:
    """``yaml.safe_load`` (PyYAML's C parser where it is built) that refuses a key given twice in one mapping:
    PyYAML keeps the last one, so a hand-edited file's first value was dropped without a word.

    Raises:
        yaml.YAMLError: the text is not YAML; for a repeated key a ``yaml.constructor.ConstructorError`` whose
            problem reads ``key 'acceptance' is given twice (line 4)``; brackets nested past :data:`MAX_NESTING`
            levels (``nested deeper than 200 levels``, before the parser runs).
    """
    global _STRICT_LOADER
    import yaml

    if _STRICT_LOADER is None:
        base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

        class StrictLoader(base):  # type: ignore[misc, valid-type]
            def construct_mapping(self, node: Any, deep: bool = False) -> Any:
                seen: set = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":  # '<<' merges may repeat by design
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        again = key in seen
                    except TypeError:  # an unhashable key: the base constructor names it
                        continue
                    if again:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key!r} is given twice (line {key_node.start_mark.line + 1})",
                            key_node.start_mark)
                    seen.add(key)
                return super().construct_mapping(node, deep=deep)

        _STRICT_LOADER = StrictLoader
    at = deep_nesting_at(text)
    if at is not None:  # before the C parser, which would overflow the stack and kill the process
        line = text.count("\n", 0, at)
        mark = yaml.error.Mark("<input>", at, line, at - (text.rfind("\n", 0, at) + 1), None, None)
        raise yaml.error.MarkedYAMLError(problem=f"nested deeper than {MAX_NESTING} levels", problem_mark=mark)
    return yaml.load(text, Loader=_STRICT_LOADER)


def yaml_error_text(err: Exception) -> str:
    """What a one-line message says of a YAML error: a repeated key's problem as :func:`safe_load_yaml` words it
    (``key 'acceptance' is given twice (line 3)``); else where and what PyYAML found (``line 3, column 1: expected
    the node content, but found '<stream end>'``; its own text spans lines and quotes the document), or the error's
    class when it names neither."""
    problem = " ".join(str(getattr(err, "problem", None) or "").split())
    if " is given twice " in problem:
        return problem
    mark = getattr(err, "problem_mark", None)
    at = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return ": ".join(x for x in (at, problem) if x) or err.__class__.__name__
