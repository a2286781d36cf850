"""The run directory: created, locked against a second trainer, its filesystem errors named.

One writer per workdir is an advisory ``fcntl.flock`` on the workdir directory itself
(standard library, no new dependency): no file can be deleted or replaced under it, and the
kernel drops it when its process dies, kill -9 included, so a crashed run never leaves the
workdir locked. ``<workdir>/layoutlab.lock`` holds the liveness record (pid, host, start
time, and once released when), so the refusal can name the holder and a takeover of a killed
run's record is said. The record is opened without following a link and must be a regular
file with no other name, so no file outside the run is ever written through it. Where the
filesystem cannot flock a directory (some network mounts) the lock file is flocked instead,
and where it has no flock at all the record alone decides: a live pid on this host, or any
pid on another host, holds the workdir until its record says released; a dead pid on this
host is a stale lock and is taken over.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import stat
import sys
import time
from pathlib import Path

__all__ = ["LOCK_FILE", "WorkdirError", "WorkdirLock", "filesystem_error", "make_workdir"]

LOCK_FILE = "layoutlab.lock"
# EBADF: NFS turns flock into a POSIX lock, which an exclusive lock needs a writable file for.
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF)


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


def _proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), which tells a live process
    from a later one given the same pid; None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, start=None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    return start is None or _proc_start(pid) in (None, start)


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    kinds = [(stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
             (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")]  # fmt: skip
    return next((word for test, word in kinds if test(mode)), "a device")


def _open_record(path: Path, write: bool) -> int:
    """The lock file opened without following a link at ``path`` and checked to be a regular
    file with no other name, so writing the record cannot reach a file outside the run; a
    ``WorkdirError`` otherwise. O_NONBLOCK: opening a named pipe must not wait for a writer."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    flags |= os.O_RDWR | os.O_CREAT if write else os.O_RDONLY
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        try:
            what = _kind(os.lstat(path).st_mode)
        except OSError:
            what = None
        if what is not None and e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise _not_a_lock_file(path, what) from None
        raise
    st = os.fstat(fd)
    what = _kind(st.st_mode) or ("a hard link to another file" if st.st_nlink > 1 else None)
    if what is not None:
        os.close(fd)
        raise _not_a_lock_file(path, what)
    return fd


def _not_a_lock_file(path: Path, what: str) -> WorkdirError:
    return WorkdirError(
        f"{path} is {what}, not the lock file layoutlab writes its pid into; move it out of "
        "the workdir (layoutlab makes its own) and rerun."
    )


def _read_record(fd: int) -> dict:
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return owner if isinstance(owner, dict) else {}
    except (OSError, ValueError):
        return {}


def _flock(fd: int) -> bool:
    """Takes an exclusive flock on ``fd``; False where the filesystem has none. Raises
    ``BlockingIOError`` while another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise
    except OSError as e:
        if e.errno not in _NO_FLOCK:
            raise
        return False
    return True


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class WorkdirLock:
    """Held while a run writes ``workdir``; a second trainer gets a ``WorkdirError``."""

    def __init__(self, workdir: str | os.PathLike):
        self.workdir = Path(workdir)
        self.path = self.workdir / LOCK_FILE
        self._fd: int | None = None
        self._dir_fd: int | None = None
        self._record: dict = {}

    def _refuse(self, owner: dict) -> WorkdirError:
        if "pid" in owner:
            who = f"pid {owner['pid']} on {owner.get('host', '?')}, lock {self.path}"
        else:  # deleted or emptied under it: the workdir's flock still holds
            who = f"its record {self.path} is gone or unreadable"
        return WorkdirError(
            f"{self.workdir} is in use by another layoutlab run ({who}); "
            "wait for it to finish or stop it, or choose another --workdir."
        )

    def _holder(self) -> dict:
        """The record of the run that holds the workdir, as far as it can be read."""
        try:
            fd = _open_record(self.path, write=False)
        except (OSError, WorkdirError):
            return {}
        try:
            return _read_record(fd)
        finally:
            os.close(fd)

    def _lock_directory(self) -> int | None:
        """The workdir's own descriptor, flocked; None where its filesystem has no flock."""
        try:
            fd = os.open(self.workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise filesystem_error(e, self.workdir) or e from None
        try:
            if _flock(fd):
                return fd
        except BlockingIOError:
            os.close(fd)
            raise self._refuse(self._holder()) from None
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return None

    def acquire(self) -> WorkdirLock:
        host = socket.gethostname()
        dir_fd = self._lock_directory()
        fd = None
        try:
            try:
                fd = _open_record(self.path, write=True)
            except OSError as e:
                raise filesystem_error(e, self.workdir) or e from None
            owner = _read_record(fd)
            if dir_fd is None:
                self._lock_record(fd, owner, host)
            # The record must be the file at the path now, not one unlinked or replaced
            # since it was opened: the next run reads the path.
            st, now = os.fstat(fd), os.lstat(self.path)
            if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
                raise WorkdirError(
                    f"{self.path} was replaced while layoutlab was locking it; make sure no "
                    "other program writes there, then rerun."
                )
            self._note_takeover(owner, host, flocked=dir_fd is not None)
            record = {"pid": os.getpid(), "host": host, "started": _now(),
                      "proc_start": _proc_start(os.getpid())}  # fmt: skip
            data = json.dumps(record).encode()
            try:
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))  # a regular file of the run (_open_record)
            except OSError as e:
                raise filesystem_error(e, self.workdir) or e from None
        except BaseException:
            for held in (fd, dir_fd):
                if held is not None:
                    os.close(held)
            raise
        self._fd, self._dir_fd, self._record = fd, dir_fd, record
        return self

    def _lock_record(self, fd: int, owner: dict, host: str) -> None:
        """Where the workdir cannot be flocked: the lock file, else the record alone."""
        try:
            if _flock(fd):
                return
        except BlockingIOError:
            raise self._refuse(owner) from None
        pid = owner.get("pid")
        if isinstance(pid, int) and not owner.get("released"):
            if owner.get("host") != host or _alive(pid, owner.get("proc_start")):
                raise self._refuse(owner)

    def _note_takeover(self, owner: dict, host: str, flocked: bool) -> None:
        pid = owner.get("pid")
        if not isinstance(pid, int) or owner.get("released"):
            return
        if owner.get("host") == host and not _alive(pid, owner.get("proc_start")):
            why = "which is no longer running"
        elif flocked and owner.get("host") != host:
            why = f"on {owner.get('host', '?')}, which no longer holds the workdir"
        else:
            return
        print(f"note: {self.path} was left by pid {pid}, {why}; taking it over.", file=sys.stderr)

    def release(self) -> None:
        """Marks the record released and unlocks. Nothing is truncated: the released record
        is the held one plus a field, so it overwrites every byte of it; the file stays
        (unlinking a locked file races)."""
        if self._fd is None:
            return
        try:
            os.pwrite(self._fd, json.dumps({**self._record, "released": _now()}).encode(), 0)
        except OSError:
            pass  # a full or read-only disk must not hide the run's own error
        os.close(self._fd)
        if self._dir_fd is not None:
            os.close(self._dir_fd)  # drops the workdir's flock
        self._fd = self._dir_fd = None

    def __enter__(self) -> WorkdirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
