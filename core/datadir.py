"""One process per data directory: an exclusive lock on ``<data dir>/lock``, as RocketMQ's store root has.

A second broker started on a directory in use opened the live store, ran abnormal recovery on it
and deleted the first broker's abort file.  :func:`lock_data_dir` takes ``flock(LOCK_EX)`` on the
``lock`` file and writes the holder's pid and role into it; a second process is refused with one
line naming the directory and that process.  The kernel releases the lock when the process ends,
however it ends, so a SIGKILLed broker never leaves a stale lock behind.

Within one process the lock is counted: the broker and its store both hold it on the same
directory, and it is released when the last of them lets go.

The directory holds every message: it is created private to its owner (``0700``, ``[broker]
data_dir_mode``) when locked (a wider one holding files is logged with the fix), and a serving ``tidemq`` process creates its files without group or
other bits (:func:`files_umask`: ``0600`` files under ``0700``), as PostgreSQL and Redis do.
Under the usual umask (022) the commit log was readable by every local user.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import threading
from pathlib import Path

from tidemq.errors import TidemqError

log = logging.getLogger(__name__)

LOCK_FILE = "lock"
#: The data directory's default mode: only its owner may enter it.
DATA_DIR_MODE = 0o700

_held: dict[Path, tuple[int, int]] = {}  # lock file -> (fd, holders in this process)
_guard = threading.Lock()


class DataDirInUseError(TidemqError):
    """Another process holds the data directory's lock."""


def _holder_text(fd: int) -> str:
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "another process"


def holder(data_dir: str | os.PathLike[str]) -> str | None:
    """Who holds ``data_dir``'s lock (``"pid 1234 (tidemq broker ...)"``), or None when nobody does.

    Read-only tools (``tidemq store verify``) use this to say they look at a live store.
    """
    path = Path(data_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        with _guard:
            if path.resolve() in _held:
                return f"pid {os.getpid()} (this process)"
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder_text(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class DataDirLock:
    """A held lock; :meth:`release` once (or use it as a context manager)."""

    def __init__(self, path: Path):
        self.path = path
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        with _guard:
            fd, count = _held[self.path]
            if count > 1:
                _held[self.path] = (fd, count - 1)
                return
            del _held[self.path]
        os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def check_dir_mode(mode: int, option: str = "[broker] data_dir_mode") -> None:
    """ValueError unless ``mode`` is a directory mode its owner can use (0o700..0o777)."""
    if not 0 <= mode <= 0o777 or mode & 0o700 != 0o700:
        raise ValueError(
            f"{option} = {mode:#o} must give the owner rwx, within 0o700..0o777 (e.g. 0o700, 0o750)"
        )


def files_umask(dir_mode: int = DATA_DIR_MODE) -> int:
    """The umask that creates directories with ``dir_mode`` and files without more: 0o077 for 0o700
    (0600 files), 0o027 for 0o750 (0640 files)."""
    return 0o777 & ~dir_mode


def make_private(root: Path, mode: int = DATA_DIR_MODE) -> None:
    """Create ``root`` with ``mode``, or narrow an existing one that grants more (never widens).

    Only an empty directory is narrowed; one already holding files gets a warning naming the
    ``chmod`` to run: a ``data_dir`` mistakenly naming ``/var/lib`` must not be chmodded.
    """
    root.mkdir(parents=True, exist_ok=True, mode=mode)
    try:
        st = root.stat()
        current = st.st_mode & 0o777
        if not current & ~mode:
            return
        if not any(root.iterdir()) and not st.st_mode & stat.S_ISVTX and st.st_uid == os.getuid():
            os.chmod(root, current & mode)
            log.info("data directory %s: mode %04o narrowed to %04o", root, current, current & mode)
            return
        log.warning(
            "data directory %s is mode %04o: other users may read what is stored there; chmod %04o %s",
            root,
            current,
            current & mode,
            root,
        )
    except OSError as exc:  # not ours to change (a shared mount): the lock still protects it
        log.warning("cannot make data directory %s private: %s", root, exc)


def lock_data_dir(
    data_dir: str | os.PathLike[str], what: str = "tidemq", *, mode: int = DATA_DIR_MODE
) -> DataDirLock:
    """Take ``data_dir``'s lock (creating the directory with ``mode``), or raise :class:`DataDirInUseError`."""
    root = Path(data_dir).expanduser()
    make_private(root, mode)
    path = (root / LOCK_FILE).resolve()
    with _guard:
        held = _held.get(path)
        if held is not None:
            _held[path] = (held[0], held[1] + 1)
            return DataDirLock(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _holder_text(fd)
            os.close(fd)
            raise DataDirInUseError(
                f"data directory {root} is in use by {who}; stop it or choose another data_dir"
            ) from None
        except OSError:
            os.close(fd)
            raise
        try:
            text = f"pid {os.getpid()} ({what})\n".encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, text, 0)
        except OSError as exc:  # a full disk: the lock holds all the same, only the note is lost
            log.warning("cannot write the holder into %s: %s", path, exc)
        _held[path] = (fd, 1)
    return DataDirLock(path)


__all__ = [
    "DATA_DIR_MODE",
    "LOCK_FILE",
    "DataDirInUseError",
    "DataDirLock",
    "check_dir_mode",
    "files_umask",
    "holder",
    "lock_data_dir",
    "make_private",
]
