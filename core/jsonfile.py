"""Durable small files: atomic replace (write temp, fsync, rename, fsync the directory)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import orjson

from tidemq.errors import CorruptDataError

#: A string literal (kept as is) or a bare integer object key such as fastjson writes for a
#: ``Map<Integer, Long>``: ``{"offsetTable":{"T@g":{0:250,1:250}}}`` in RocketMQ's
#: consumerOffset.json and delayOffset.json.
_STRING_OR_BARE_INT_KEY = re.compile(rb'"(?:[^"\\]|\\.)*"|(?<=[{,])(\s*)(-?\d+)(?=\s*:)')


def _quote_bare_keys(data: bytes) -> bytes:
    def sub(m: re.Match[bytes]) -> bytes:
        if m.group(2) is None:
            return m.group(0)
        return m.group(1) + b'"' + m.group(2) + b'"'

    return _STRING_OR_BARE_INT_KEY.sub(sub, data)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
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
        return orjson.loads(_quote_bare_keys(data))
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
