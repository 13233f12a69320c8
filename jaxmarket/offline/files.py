"""The offline package's file-system rules (docs/reliability.md, "Offline datasets").

Reading: every path a dataset names (the dataset directory, its own ``manifest.json``,
each chunk file) is checked *before anything is opened*: no NUL byte, every name within
the file system's ``PC_NAME_MAX`` and the whole path within ``PC_PATH_MAX``, no symlink
loop, nothing resolving outside the dataset directory, and a regular file (a FIFO or a
device would block or never end). :func:`path_problem` is the lexical half,
:func:`inside` the half that asks the file system (``stat``/``realpath``, no ``open``).

Writing: a storage ``OSError`` (disk full, read-only, permission; the errnos of
:data:`jaxmarket.train.rundir.STORAGE_ERRNOS`) while a dataset, an export or an offline
run directory is written becomes one :class:`~jaxmarket.train.rundir.StorageError` line
naming the path, the error and what was kept (:func:`storage_error`)."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from jaxmarket.train.rundir import STORAGE_ERRNOS, StorageError, describe_os_error, storage_cause

NAME_MAX, PATH_MAX = 255, 4096          # when pathconf cannot tell (POSIX minimums are lower)
SUFFIX_ROOM = 24                        # OUT.partial-<pid>, OUT.lock, FILE.tmp-<pid> beside OUT


def limits(path: str | Path) -> tuple[int, int]:
    """``(PC_NAME_MAX, PC_PATH_MAX)`` of the file system holding ``path`` (its nearest
    existing ancestor)."""
    p = Path(os.path.abspath(path))
    for q in (p, *p.parents):
        try:
            if os.path.isdir(q):
                return os.pathconf(q, "PC_NAME_MAX"), os.pathconf(q, "PC_PATH_MAX")
        except (OSError, ValueError):
            continue
    return NAME_MAX, PATH_MAX


def path_problem(path: str | Path, room: int = 0) -> str | None:
    """Why ``path`` cannot name a file (a NUL byte, an unencodable character, a name
    longer than ``PC_NAME_MAX - room`` bytes, a path of ``PC_PATH_MAX`` bytes or more),
    or None. Nothing is opened."""
    text = os.fspath(path)
    if "\0" in text:
        return "it holds a NUL byte"
    try:
        raw = os.fsencode(text)
    except UnicodeEncodeError:
        return "it holds a character that cannot be encoded as a file name"
    name_max, path_max = limits(text)
    for part in raw.split(b"/"):
        if len(part) > name_max - room:
            return (f"a name of {len(part)} bytes is longer than the file system allows "
                    f"({name_max - room}: PC_NAME_MAX {name_max}"
                    + (f" less {room} for a suffix" if room else "") + ")")
    whole = len(os.fsencode(os.path.abspath(text)))
    if whole >= path_max:
        return f"the path is {whole} bytes long, the file system allows {path_max - 1} (PC_PATH_MAX)"
    return None


def inside(base: Path, file: Path) -> tuple[Path, str | None, bool]:
    """``(real path, problem, exists)`` of ``file`` checked against the directory ``base``
    (already resolved): a symlink loop, a path resolving outside ``base`` (``it resolves to
    ...``) or something that is not a regular file is a problem; a missing file is not
    (``exists`` False: the reader says what is missing). Only ``stat`` and ``realpath``."""
    try:
        st = os.stat(file)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return file, "it is a symlink loop (or a chain of more than 40 symlinks)", False
        if err.errno == errno.ENAMETOOLONG:
            return file, "a symlink in it leads to a path longer than the file system allows", False
        st = None
    real = Path(os.path.realpath(file))
    if not real.is_relative_to(base):
        return real, f"it resolves to {real}", st is not None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, " \
               "socket or device)"
        return real, f"it is {kind}", True
    return real, None, st is not None


def storage_errno(err: BaseException) -> OSError | None:
    """The storage ``OSError`` behind ``err`` (:func:`jaxmarket.train.rundir.storage_cause`:
    itself or its cause/context chain), also when h5py reports it only in its message
    (``errno = 28``)."""
    found = storage_cause(err)
    seen = set()
    while found is None and err is not None and id(err) not in seen:
        seen.add(id(err))
        code = re.search(r"errno = (\d+)", str(err)) if isinstance(err, OSError) else None
        if code and int(code.group(1)) in STORAGE_ERRNOS:
            found = OSError(int(code.group(1)), os.strerror(int(code.group(1))), err.filename)
        err = err.__cause__ or err.__context__
    return found


def describe(err: OSError, path: str | Path | None = None) -> str:
    """``describe_os_error(err)``, naming ``path`` when the error itself names no file."""
    text = describe_os_error(err)
    return text if err.filename or path is None else f"{text}: {path}"


def storage_error(what: str, err: OSError, kept: str, then: str,
                  path: str | Path | None = None) -> StorageError:
    """``storage error while WHAT: ERROR: PATH; kept: KEPT; free space or fix the
    permissions, then THEN`` (one line)."""
    return StorageError(f"storage error while {what}: {describe(err, path)}; kept: {kept}; "
                        f"free space or fix the permissions, then {then}")


__all__ = ["describe", "inside", "limits", "path_problem", "storage_errno", "storage_error"]
