"""The run directory: created, locked against a second trainer, its filesystem errors named.

The lock is ``fcntl.flock`` on ``<workdir>/layoutlab.lock`` (standard library, no new
dependency; ``filelock`` is only present here as a dependency of other packages). The kernel
drops a flock when its process dies, kill -9 included, so a crashed run never leaves the
workdir locked; the file records the owner's pid and host so the error can name them. Where
the filesystem has no flock (some network mounts) the record alone decides: a live pid on
this host, or any pid on another host, holds the workdir; a dead pid on this host is a stale
lock and is taken over.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import sys
from pathlib import Path

__all__ = ["LOCK_FILE", "WorkdirError", "WorkdirLock", "filesystem_error", "make_workdir"]

LOCK_FILE = "layoutlab.lock"
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class WorkdirError(ValueError):
    """The workdir cannot be used: in use by another run, or the filesystem refused."""


# tensorstore (under orbax) reports a failed write as a ValueError with the errno inside.
_TENSORSTORE_OS_ERROR = re.compile(r"os_error_code='?(\d+)")
_QUOTED_PATH = re.compile(r'"(/[^"]*)"')


def _tensorstore_oserror(exc: BaseException) -> OSError | None:
    message = str(exc)
    code = _TENSORSTORE_OS_ERROR.search(message)
    if code is None:
        return None
    path = _QUOTED_PATH.search(message)
    # Name the checkpoint step, not orbax's temporary directory inside it.
    where = path and re.sub(r"\.orbax-checkpoint-tmp.*$", "", path.group(1))
    return OSError(int(code.group(1)), os.strerror(int(code.group(1))), where)


def _find_oserror(exc: BaseException | None) -> OSError | None:
    """The first ``OSError`` in ``exc``'s cause/context chain (orbax wraps them)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        if (found := _tensorstore_oserror(exc)) is not None:
            return found
        seen.add(id(exc))
        if isinstance(exc, BaseExceptionGroup):
            found = [e for e in map(_find_oserror, exc.exceptions) if e is not None]
            if found:
                return found[0]
        exc = exc.__cause__ or exc.__context__
    return None


_FIXES = {
    errno.ENOSPC: "no space left on its device; free space there (delete old runs or lower "
    "keep_checkpoints) or choose a --workdir on another disk, then rerun with --resume",
    errno.EDQUOT: "the disk quota is exceeded; free space or choose a --workdir elsewhere, "
    "then rerun with --resume",
    errno.EROFS: "it is on a read-only filesystem; choose a --workdir on a writable one",
    errno.EACCES: "permission denied; fix its permissions or choose another --workdir",
    errno.EPERM: "operation not permitted; fix its permissions or choose another --workdir",
    errno.EEXIST: "it exists and is not a directory; move that file or choose another --workdir",
    errno.ENOTDIR: "a part of the path is a file, not a directory; choose another --workdir",
    errno.EISDIR: "a directory is in the way of a file layoutlab writes; move it away",
}


def filesystem_error(exc: BaseException, workdir: str | os.PathLike) -> WorkdirError | None:
    """A one-line ``WorkdirError`` naming the path and the fix when ``exc`` is (or wraps) a
    filesystem error, else None."""
    err = _find_oserror(exc)
    if err is None or (err.errno not in _FIXES and not err.filename):
        return None
    path = err.filename or workdir
    fix = _FIXES.get(err.errno, f"{err.strerror or err}; check the workdir {workdir}")
    return WorkdirError(f"Cannot write {path}: {fix}.")


def make_workdir(workdir: Path, create: bool = True) -> None:
    """Creates ``workdir``; with ``create=False`` (a resume) it must exist already."""
    if workdir.exists() and not workdir.is_dir():
        raise WorkdirError(f"Cannot use {workdir}: {_FIXES[errno.EEXIST]}.")
    if not create and not workdir.is_dir():
        raise WorkdirError(
            f"Nothing to resume: {workdir} does not exist; check the path, or start a new run "
            "there without --resume (resume=False)."
        )
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise filesystem_error(e, workdir) from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _read_owner(path: Path) -> dict:
    try:
        owner = json.loads(path.read_text() or "{}")
        return owner if isinstance(owner, dict) else {}
    except (OSError, ValueError):
        return {}


class WorkdirLock:
    """Held while a run writes ``workdir``; a second trainer gets a ``WorkdirError``."""

    def __init__(self, workdir: str | os.PathLike):
        self.workdir = Path(workdir)
        self.path = self.workdir / LOCK_FILE
        self._fd: int | None = None

    def _refuse(self, owner: dict) -> WorkdirError:
        who = f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}"
        return WorkdirError(
            f"{self.workdir} is in use by another layoutlab run ({who}, lock {self.path}); "
            "wait for it to finish or stop it, or choose another --workdir."
        )

    def acquire(self) -> WorkdirLock:
        host = socket.gethostname()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise filesystem_error(e, self.workdir) or e from None
        owner = _read_owner(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._refuse(owner) from None
        except OSError as e:
            if e.errno not in _NO_FLOCK:
                os.close(fd)
                raise
            pid = owner.get("pid")
            if isinstance(pid, int) and (owner.get("host") != host or _alive(pid)):
                os.close(fd)
                raise self._refuse(owner) from None
        pid = owner.get("pid")
        if isinstance(pid, int) and owner.get("host") == host and not _alive(pid):
            print(
                f"note: {self.path} was left by pid {pid}, which is no longer running; "
                "taking it over.",
                file=sys.stderr,
            )
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": host}).encode(), 0)
        except OSError as e:
            os.close(fd)
            raise filesystem_error(e, self.workdir) or e from None
        self._fd = fd
        return self

    def release(self) -> None:
        """Clears the record and unlocks; the file stays (unlinking a flocked file races)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass  # a full or read-only disk must not hide the run's own error
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
