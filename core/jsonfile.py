"""Durable small files: atomic replace (write temp, fsync, rename, fsync the directory)."""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import orjson

from tidemq.errors import CorruptDataError
from tidemq.threads import name_this_thread

log = logging.getLogger(__name__)

#: A string literal (kept as is) or a bare integer object key such as fastjson writes for a
#: ``Map<Integer, Long>``: ``{"offsetTable":{"T@g":{0:250,1:250}}}`` in RocketMQ's
#: consumerOffset.json and delayOffset.json, or ``{"brokerAddrs":{0:"127.0.0.1:10911"}}`` in a
#: route body.  The closing quote is optional: an unterminated string is one match, where a
#: search again from every later quote made ``"\"\"\"...`` cost quadratic time (peers send these).
_STRING_OR_BARE_INT_KEY = re.compile(rb'"(?:[^"\\]|\\.)*"?|(?<=[{,])(\s*)(-?\d+)(?=\s*:)')


def _quote_key(m: re.Match[bytes]) -> bytes:
    if m.group(2) is None:
        return m.group(0)  # a string literal: ``{"topic":"a,1:b"}`` stays as it is
    return m.group(1) + b'"' + m.group(2) + b'"'


def quote_bare_int_keys(data: bytes) -> bytes:
    """fastjson's JSON with its bare integer object keys quoted (``{0:1}`` -> ``{"0":1}``).

    The one fix for what Java brokers, NameServers and RocketMQ's files write; string contents
    are never touched.  Used by :func:`read_json`, :func:`tidemq.remoting.protocol.loads` and
    :func:`tidemq.client.route.loads_lenient` after a strict parse failed.
    """
    return _STRING_OR_BARE_INT_KEY.sub(_quote_key, data)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new file.

    The file keeps its mode across the replacement (a 0600 ACL file stays 0600, whatever the
    umask); a new file gets ``mode`` (default: 0666 less the umask).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    try:
        keep: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        keep = mode
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if keep is not None else 0o666)
        with open(fd, "wb") as fh:
            if keep is not None:
                os.fchmod(fh.fileno(), keep)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        # Disk full and the like: the old file stays whole; do not leave a partial temp file
        # holding the space a retry will need.
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json(path: str | os.PathLike[str], value: Any) -> None:
    """Atomically write ``value`` as pretty JSON (RocketMQ's config files are human-read)."""
    atomic_write_bytes(path, orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


def read_json(path: str | os.PathLike[str], default: Any = None) -> Any:
    """Read a JSON file written by :func:`write_json`; ``default`` when it does not exist.

    A leftover ``.bak``/``.tmp`` is never read: :func:`atomic_write_bytes` makes the rename the
    commit point, so the target is always whole.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return default
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        # A file RocketMQ (fastjson) wrote: integer keys without quotes.
        return orjson.loads(quote_bare_int_keys(data))
    except orjson.JSONDecodeError as exc:
        # Only disk damage gets here (writes are atomic): say which file, never start half-configured.
        raise CorruptDataError(f"{path} is not valid JSON ({exc}); restore it or move it away") from exc


def read_offset_table(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """The ``offsetTable`` object of ``path`` (consumerOffset.json, delayOffset.json), ``{}`` if absent.

    A file of another shape is a :class:`CorruptDataError` naming it: read as empty, the next
    save would overwrite every recorded offset.
    """
    data = read_json(path, {})
    table = data.get("offsetTable") if isinstance(data, dict) else data
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise CorruptDataError(
            f"{path} does not hold {what} (offsetTable is a {type(table).__name__}); restore it or move it away"
        )
    return table


class CoalescedJsonWriter:
    """Writes a table's JSON file off the caller's thread, many changes in one write.

    Metadata changes arrive on the event loop (an auto-created group or topic per request); one
    atomic write each (fsync of the file and the directory) stalled every client: 2 000 new groups
    cost 4-11 s of loop time.  :meth:`request` only marks the table dirty; a daemon thread waits
    ``delay_s`` for more changes, takes ``snapshot()`` and writes it.  :meth:`flush` writes now
    (at shutdown, or before answering a request that must be durable).  A failed write (a full
    disk) is logged and retried; the thread never ends while the writer is open.

    :meth:`request` returns the change's ticket; :meth:`when_written` a future resolved once the
    file holds it (failed with the error of the write that should have written it), for a caller
    that must not answer before a change is on disk but must not block its thread either.
    """

    RETRY_S = 1.0

    def __init__(self, path: Path, snapshot: Callable[[], Any], *, delay_s: float = 0.05):
        self.path = Path(path)
        self._snapshot = snapshot
        self._delay_s = delay_s
        self._requested = 0  # change counter
        self._written = 0  # change counter covered by the file on disk
        self._wake = threading.Event()
        self._write_lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._failing = False
        self._waiters: list[tuple[int, Future[None]]] = []
        self._waiters_lock = threading.Lock()

    @property
    def pending(self) -> bool:
        """Changes not yet on disk."""
        return self._written < self._requested

    def request(self) -> int:
        """Note a change; it reaches the file within ``delay_s`` (plus the write itself).  Returns
        the change's ticket (for :meth:`written` and :meth:`when_written`)."""
        self._requested += 1
        ticket = self._requested
        if self._closed:
            return ticket
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"tidemq-persist-{self.path.name}", daemon=True
            )
            self._thread.start()
        self._wake.set()
        return ticket

    def written(self, ticket: int) -> bool:
        """Whether the file holds the change of ``ticket``."""
        return self._written >= ticket

    def when_written(self, ticket: int) -> Future[None]:
        """A future resolved once the file holds the change of ``ticket`` (at once if it does),
        failed with the OSError of a write that should have written it."""
        future: Future[None] = Future()
        with self._waiters_lock:
            if self._written < ticket:
                self._waiters.append((ticket, future))
                return future
        future.set_result(None)
        return future

    def _wake_waiters(self, upto: int, exc: BaseException | None = None) -> None:
        """Resolve the waiters of tickets up to ``upto`` (failed with ``exc`` when given)."""
        with self._waiters_lock:
            if not self._waiters:
                return
            done = [(t, f) for t, f in self._waiters if t <= upto]
            self._waiters = [(t, f) for t, f in self._waiters if t > upto]
        for _, future in done:
            if exc is None:
                future.set_result(None)
            else:
                future.set_exception(exc)

    def flush(self, force: bool = False) -> bool:
        """Write now if anything changed (or ``force``); True when written.  Raises OSError on failure."""
        with self._write_lock:
            target = self._requested
            if self._written >= target and not force:
                return False
            try:
                write_json(self.path, self._snapshot())
            except OSError as exc:
                self._wake_waiters(target, exc)  # their callers answer now; the change stays pending
                raise
            with self._waiters_lock:
                self._written = max(self._written, target)
            self._wake_waiters(target)
            return True

    def close(self) -> None:
        """Stop the thread and write what is pending (errors propagate: the caller decides)."""
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.flush()

    def _run(self) -> None:
        name_this_thread(f"persist-{self.path.stem}")  # "tidemq-persist-" alone: all alike
        while not self._closed:
            self._wake.wait()
            if self._closed:
                return
            self._wake.clear()
            time.sleep(self._delay_s)  # gather the changes of a burst into one write
            try:
                self.flush()
                if self._failing:
                    log.warning("%s written again", self.path)
                self._failing = False
            except Exception as exc:  # a full disk: keep the change pending and retry
                if not self._failing:
                    log.error("cannot write %s (will retry every %.0f s): %s", self.path, self.RETRY_S, exc)
                self._failing = True
                self._wake.set()
                time.sleep(self.RETRY_S)
