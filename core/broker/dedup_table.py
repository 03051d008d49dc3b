"""The duplicate window's key table: 64-bit key hashes (:data:`key_hash`) to the send that stored
them (issue 37).

:class:`HashTable` here is the Python reference (a dict keyed by the hash);
``tidemq.broker._dedup_table`` (``core/broker/_dedup_table.pyx``) is the compiled one, picked when
built: two flat arrays probed in C, no Python object per key, so a window of 500 000 keys costs
~40 bytes a key instead of ~150 and one memory probe per key instead of a dict's insert, resize
and delete.  Keys are kept as their hashes only: two different keys with one 64-bit hash would be
taken for one (about 1 in 10^8 over a full window), and a hit is only a duplicate when the body
matches the first copy's too (``DuplicateWindow.same_body``), so a false hit stores nothing wrong.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

from tidemq.extensions import compiled_twin
from tidemq.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK

__all__ = [
    "COMPILED",
    "CompiledHashTable",
    "HashTable",
    "SentFields",
    "WindowFields",
    "admit_run",
    "batch_keys",
    "hashes_of",
    "key_hash",
    "py_key_hash",
    "trim",
    "untrack",
]


class _PySentFields:
    """The Python reference of the compiled ``SentFields``: a send's record's fields, as slots
    (``tidemq.broker.dedup_sent.Sent`` adds the methods)."""

    __slots__ = (
        "deadline",
        "end",
        "handle",
        "hashes",
        "live",
        "msg_id",
        "nbytes",
        "queue_id",
        "queue_offset",
        "send",
        "step",
        "topic",
        "window",
    )

    deadline: float
    window: Any
    send: Any
    msg_id: str
    handle: str | None
    queue_id: int
    queue_offset: int
    step: int
    end: int

    hashes: array[int]

    @property
    def answered(self) -> bool:
        """Whether the answer is kept (its message ids set)."""
        return bool(self.msg_id)

    @property
    def nkeys(self) -> int:
        """The send's keys (one a message)."""
        return len(self.hashes)

    def keep_hashes(self, hashes: array[int]) -> None:
        """The record's keys are ``hashes`` (in message order): kept here (the compiled record
        keeps their number, its table the hashes)."""
        self.hashes = hashes

    def index_of(self, h: int) -> int:
        """The position of key hash ``h`` among the send's keys (ValueError when not one)."""
        return self.hashes.index(h)

    @property
    def packed(self) -> int:
        """How many message ids are kept as numbers: none here (the compiled record packs them;
        its ``msg_id`` and ``id_at`` give the same text, tests/test_dedup_ring.py)."""
        return 0

    def id_at(self, pos: int) -> str:
        """Message ``pos``'s id (the whole ``msg_id`` when it has no id ``pos``)."""
        ids = self.msg_id.split(",")
        return ids[pos] if 0 <= pos < len(ids) else self.msg_id

    def stored(self, send: Any, result: Any) -> None:
        """The first send's outcome is known (``send``'s fields are set): keep its answer, or
        forget the keys (``window.forget``) when it was not stored.  Called by the put's
        outcome, on the loop, once per send."""
        if self.send is None:
            return
        self.send = None
        if result is None or send.status not in STORED_CODES:
            self.window.forget(self)
            return
        self.msg_id = send.msg_id
        self.handle = send.recall_handle
        self.queue_id = send.queue_id
        self.queue_offset = send.queue_offset
        flag = send.msgs[0].sys_flag & TRANSACTION_TYPE_MASK
        self.step = 0 if flag in (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE) else 1
        self.end = result.wrote_offset + result.wrote_bytes


#: The statuses (response codes) a first send may end with and still be stored: SUCCESS,
#: FLUSH_DISK_TIMEOUT, SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT.  As plain codes: this module is
#: imported by :mod:`tidemq.broker.services.send`, so it imports nothing of that package.
STORED_CODES = frozenset((0, 10, 11, 12))


class _PyWindowFields:
    """The Python reference of the compiled ``WindowFields``: the window's run check as
    ``DuplicateWindow.admit_run_py`` (``tidemq.broker.dedup.DuplicateWindow`` adds the rest)."""

    def configure_run(self, sent_type: Any, per_key: int, per_send: int, name: str, max_length: int) -> None:
        """The compiled run's record type and constants (the reference reads its own)."""

    def admit_run(self, sends: Any, config_of: Callable[[str], object]) -> bool:
        """See ``DuplicateWindow.admit_run_py``; False while a rebuild runs."""
        window: Any = self
        if window.epoch_source is not None:
            window._follow_epoch()
        if window._rebuilding is not None:
            return False
        return bool(window.admit_run_py(sends, config_of, window._clock()))


class _PyHashTable:
    """The Python reference: ``dict[int, object]`` with the compiled table's API."""

    __slots__ = ("_d",)

    def __init__(self, capacity: int = 64) -> None:
        self._d: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self._d)

    @property
    def capacity(self) -> int:
        return len(self._d)

    def get(self, h: int) -> Any:
        return self._d.get(h or 1)

    def put(self, h: int, value: Any) -> Any:
        d = self._d
        h = h or 1
        old = d.get(h)
        d[h] = value
        return old

    def put_many(self, hashes: array[int], value: Any) -> list[Any] | None:
        d = self._d
        replaced = None
        for h in hashes:
            h = h or 1
            old = d.get(h)
            if old is not None:
                if replaced is None:
                    replaced = []
                replaced.append(old)
            d[h] = value
        return replaced

    def any_of(self, hashes: array[int]) -> bool:
        d = self._d
        return any((h or 1) in d for h in hashes)

    @property
    def displaced(self) -> int:
        """Keys displaced from a full bucket: never here (the compiled table's buckets)."""
        return 0

    @property
    def flagged(self) -> int:
        """Buckets flagged as overflowed: none here (the compiled table's buckets)."""
        return 0

    def put_record(self, hashes: array[int], sent: Any) -> list[Any] | None:
        """:meth:`put_many` of a record under its keys' ``hashes`` (the record keeps them here;
        the compiled table keeps them for it)."""
        return self.put_many(hashes, sent)

    def remove_record(self, sent: Any) -> int:
        """Remove the keys still ``sent``'s (a send not stored, removed early); how many were."""
        return self.remove_many(sent.hashes, sent)

    def evict(self, sent: Any) -> int:
        """Remove the keys still ``sent``'s (the oldest send: the compiled table only advances its
        ring's tail); how many were."""
        return self.remove_many(sent.hashes, sent)

    def remove_many(self, hashes: array[int], value: Any) -> int:
        d = self._d
        removed = 0
        for h in hashes:
            h = h or 1
            if d.get(h) is value:
                del d[h]
                removed += 1
        return removed


def _py_hashes_of(keys: list[str], hasher: Callable[[str], int] = hash) -> array[int]:
    """The keys' 64-bit hashes, packed (what a :class:`~tidemq.broker.dedup.Sent` keeps)."""
    return array("q", map(hasher, keys))


_M64 = (1 << 64) - 1


def _mum(a: int, b: int) -> int:
    r = a * b
    return (r & _M64) ^ (r >> 64)


#: A run key's value bits that address it within its group (8 keys a group; the compiled
#: ``TIDEMQ_GROUP_SHIFT``).
GROUP_SHIFT = 3
_RUN_BIT = 1 << 63
_GROUP_LOW = (1 << GROUP_SHIFT) - 1
#: A hex digit's value and class (0x20 upper-case letter, 0x40 lower-case letter, 0 a digit).
_TAIL = {**{c: i for i, c in enumerate("0123456789")}, **{c: 0x20 | (10 + i) for i, c in enumerate("ABCDEF")}}
_TAIL.update({c: 0x40 | (10 + i) for i, c in enumerate("abcdef")})


def py_key_hash(key: str, secrets: list[int]) -> int:
    """The compiled ``key_hash`` in Python, given its process's ``secrets``
    (``_dedup_table.secrets_for_tests()``): the differential test's twin.  Not used to serve:
    the Python reference keys its tables by ``hash()`` (SipHash, keyed per process too), which
    is faster in Python; one process uses one of the two throughout.

    A key of 1-byte characters whose last 4 are hex digits of one case (a run key: see
    ``tidemq_window_hash``) is hashed as its group (stem, case, value >> ``GROUP_SHIFT``) with
    bit 63 set and the value's low bits last; any other whole, bit 63 clear."""
    top = max(map(ord, key), default=0)
    kind = 1 if top < 256 else 2 if top < 65536 else 4
    data = key.encode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind])
    if kind == 1 and 4 <= len(data) <= 4096:
        digits = [_TAIL.get(c, 0x80) for c in key[-4:]]
        every = digits[0] | digits[1] | digits[2] | digits[3]
        if not every & 0x80 and every & 0x60 != 0x60:
            v = 0
            for d in digits:
                v = (v << 4) | (d & 15)
            tag = (1 << 56) | (1 << 55) | (((every >> 6) & 1) << 54) | ((v >> GROUP_SHIFT) << 16)
            g = _py_wyhash(data[:-4], tag, secrets)
            h = ((g | _RUN_BIT) & ~_GROUP_LOW) | (v & _GROUP_LOW)
            return h - (1 << 64)
    h = _py_wyhash(data, kind << 56, secrets) & ~_RUN_BIT
    return h


def _py_wyhash(data: bytes, tag: int, secrets: list[int]) -> int:
    n = len(data)
    s0, s1, s2, s3 = secrets
    state = s0 ^ n ^ tag
    while n > 16:
        a, b = int.from_bytes(data[:8], "little"), int.from_bytes(data[8:16], "little")
        state = _mum(a ^ s1, b ^ state)
        data, n = data[16:], n - 16
    last = data.ljust(16, b"\0")
    state = _mum(int.from_bytes(last[:8], "little") ^ s1, int.from_bytes(last[8:], "little") ^ state)
    return _mum(state ^ s2, s3)


def _py_batch_keys(
    msgs: list[Any], name: str, max_length: int, hasher: Callable[[str], int] = hash
) -> tuple[list[str], array[int], int] | None:
    """The batch's keys (property ``name`` of each message), their hashes and the index of the
    first message repeating an earlier key (-1: none); None when a message has no usable key
    (absent, empty, longer than ``max_length``).  ``hasher``: the key hash (the compiled one's
    Python twin in the differential test)."""
    keys = [m.properties.get(name) for m in msgs]
    for key in keys:
        if type(key) is not str or not 0 < len(key) <= max_length:
            return None
    repeated = -1
    if len(set(keys)) != len(keys):
        seen: set[str] = set()
        for i, key in enumerate(keys):
            if key in seen:
                repeated = i
                break
            seen.add(key)
    return keys, _py_hashes_of(keys, hasher), repeated


#: ``admit_run(sends, settings, tables, order, sent_type, window, now, max_entries, per_key,
#: per_send, name, max_length)``: the duplicate window over one run of sends in one compiled call
#: (see ``_dedup_table.pyx``); None when not built (``DuplicateWindow.admit_run`` has the Python
#: reference, which it uses then, under ``TIDEMQ_NO_EXTENSIONS=1``, and for content keys).
admit_run: Any
#: The compiled table's type (None when not built): ``admit_run`` works on its tables only.
CompiledHashTable: Any
#: ``trim(order, tables, now, max_entries, max_bytes, entries, nbytes, per_key, per_send) ->
#: (entries, nbytes, evicted)``: the window's eviction in one compiled call (None when not built).
trim: Any


def _py_untrack(o: Any) -> Any:
    return o  # pure Python cannot untrack an object: the reference leaves it to the collector


#: ``key_hash(key) -> int``: a key's 64-bit hash in the window, what every table of this process
#: is keyed by (compiled: a hash keyed by per-process secrets, see ``_dedup_table.pyx``; the
#: Python reference: ``hash()``).  ``hashes_of(keys) -> array("q")``: the keys' hashes, packed.
key_hash: Any
hashes_of: Any

#: ``untrack(obj) -> obj``: ``obj`` untracked by the cycle collector (a record's hash array).
untrack: Any

#: ``Sent.stored``'s body in C, a capsule the compiled send lane calls (None: call ``stored``).
STORED_C: Any

_compiled = compiled_twin("tidemq.broker._dedup_table")
if _compiled is None:  # not built, or TIDEMQ_NO_EXTENSIONS=1: the Python reference
    HashTable: Any = _PyHashTable
    SentFields: Any = _PySentFields
    WindowFields: Any = _PyWindowFields
    batch_keys = _py_batch_keys
    key_hash = hash
    hashes_of = _py_hashes_of
    trim = None
    untrack = _py_untrack
    admit_run = None
    CompiledHashTable = None
    STORED_C = None
    COMPILED = False
else:
    HashTable = _compiled.HashTable
    SentFields = _compiled.SentFields
    WindowFields = _compiled.WindowFields
    batch_keys = _compiled.batch_keys
    key_hash = _compiled.key_hash
    hashes_of = _compiled.hashes_of
    trim = _compiled.trim
    untrack = _compiled.untrack
    admit_run = _compiled.admit_run
    CompiledHashTable = _compiled.HashTable
    STORED_C = getattr(_compiled, "STORED_C", None)
    COMPILED = True
