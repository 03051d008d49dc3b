"""Key index contract (role ``index``): lookups of messages by key and unique id."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

from tidemq.errors import CorruptDataError
from tidemq.message import MessageExt, decode_message, decode_message_id
from tidemq.store import DispatchRequest

if TYPE_CHECKING:
    from tidemq.store import MessageStore


@attrs.frozen
class QueryResult:
    """Commit-log offsets of candidate messages, newest first; the broker re-checks the key."""

    phy_offsets: tuple[int, ...]
    last_update_timestamp: int = 0
    last_update_phy_offset: int = 0


@runtime_checkable
class KeyIndex(Protocol):
    """Built from the store's dispatch, queried by QUERY_MESSAGE and admin tools."""

    def load(self, last_exit_ok: bool, checkpoint_timestamp_ms: int) -> None:
        """Open index files; after an abnormal stop drop those newer than the checkpoint."""

    def dispatch(self, request: DispatchRequest) -> None:
        """Index the KEYS and UNIQ_KEY of one stored message."""

    def query(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> QueryResult:
        """Offsets of messages whose key may be ``key`` within the time range (ms)."""

    def flush(self) -> int:
        """Flush index files; returns the store timestamp covered (for the checkpoint)."""

    def delete_expired(self, min_phy_offset: int) -> None:
        """Delete index files whose entries all lie below the commit log's minimum offset."""

    def shutdown(self) -> None: ...


@runtime_checkable
class RecoverableIndex(KeyIndex, Protocol):
    """An index the store can repair at load (the ``hash`` index is one)."""

    def truncate(self, phy_end: int) -> None:
        """Drop entries for records at or past ``phy_end`` (a crash lost the log's tail)."""

    def rebuild_from(self) -> int | None:
        """The log offset from which records must be indexed again (unreadable files), or None."""


@attrs.frozen
class IndexFileInfo:
    """One index file met by :meth:`VerifiableIndex.walk_files`, before its entries."""

    name: str
    #: Entries its header counts (for progress reports).
    entry_count: int = 0
    #: What is wrong with the file as a whole, each a full one-line message naming the file:
    #: what the index's recovery repairs or rebuilds at the next load.
    problems: tuple[str, ...] = ()


@attrs.frozen
class IndexFileEntry:
    """One entry read back from an index file by :meth:`VerifiableIndex.walk_files`."""

    file: str
    number: int
    key_hash: int
    phy_offset: int
    #: What is wrong with the entry itself (a full one-line message), "" when nothing.
    problem: str = ""


@runtime_checkable
class VerifiableIndex(KeyIndex, Protocol):
    """An index whose files an offline verifier can check (``tidemq store verify``).

    The index reads its own file layout; the verifier checks each entry against the commit log,
    so no plugin needs another's private format.
    """

    def walk_files(self) -> Iterator[IndexFileInfo | IndexFileEntry]:
        """Read the index files on disk read-only, without :meth:`load` (a live broker may be
        writing them): each file's :class:`IndexFileInfo`, then its entries."""

    def entry_matches(self, entry: IndexFileEntry, topic: str, keys: Sequence[str]) -> bool:
        """Whether ``entry`` may index one of ``keys`` of a message of ``topic``."""


# --------------------------------------------------------------------------- broker helpers
# Any index returns candidates; these turn them into the messages that really match, so a hash
# collision (or a stale entry) never reaches a client whichever index plugin is configured.

_MAX_QUERY_ROUNDS = 4


def has_key(msg: MessageExt, key: str) -> bool:
    """Whether ``key`` is one of the message's KEYS or its unique key (UNIQ_KEY)."""
    return key == msg.uniq_key or key in msg.keys


def matching_messages(
    store: MessageStore,
    topic: str,
    key: str,
    phy_offsets: tuple[int, ...] | list[int],
    *,
    max_num: int | None = None,
    begin_ts: int | None = None,
    end_ts: int | None = None,
) -> list[MessageExt]:
    """Read each candidate offset and keep the messages of ``topic`` that carry ``key``.

    Offsets the store no longer holds, or that do not start a record, are skipped.  ``begin_ts``
    and ``end_ts`` (ms, inclusive) re-check the exact store time: indexes may keep coarser times.
    """
    out: list[MessageExt] = []
    for offset in phy_offsets:
        if max_num is not None and len(out) >= max_num:
            break
        raw = store.look_message_by_offset(offset)
        if raw is None:
            continue
        try:
            msg = decode_message(raw, with_body=True)
        except CorruptDataError:
            continue
        if msg.topic != topic or not has_key(msg, key):
            continue
        if (begin_ts is not None and msg.store_timestamp < begin_ts) or (
            end_ts is not None and msg.store_timestamp > end_ts
        ):
            continue
        out.append(msg)
    return out


def query_messages(
    index: KeyIndex, store: MessageStore, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int
) -> tuple[list[MessageExt], QueryResult]:
    """QUERY_MESSAGE: up to ``max_num`` messages of ``topic`` with ``key``, newest first.

    Asks the index again for more candidates while collisions ate into ``max_num`` (a few rounds
    at most).  Returns the messages and the last index answer (its update time and offset go into
    the response header).
    """
    want = max(max_num, 0)
    ask = want
    result = QueryResult(())
    found: list[MessageExt] = []
    for _ in range(_MAX_QUERY_ROUNDS):
        result = index.query(topic, key, ask, begin_ts, end_ts)
        found = matching_messages(
            store, topic, key, result.phy_offsets, max_num=want, begin_ts=begin_ts, end_ts=end_ts
        )
        if len(found) >= want or len(result.phy_offsets) < ask:
            break
        ask *= 2
    return found, result


def look_message_by_unique_key(
    index: KeyIndex,
    store: MessageStore,
    topic: str,
    uniq_key: str,
    begin_ts: int = 0,
    end_ts: int = 2**63 - 1,
) -> MessageExt | None:
    """VIEW_MESSAGE by the client's unique message id (UNIQ_KEY): the newest match or ``None``."""
    found, _ = query_messages(index, store, topic, uniq_key, 1, begin_ts, end_ts)
    return found[0] if found else None


def look_message_by_id(store: MessageStore, msg_id: str) -> MessageExt | None:
    """VIEW_MESSAGE_BY_ID by an offset message id (store host + commit-log offset).

    ``None`` when the id is not an offset message id or no record starts at its offset.
    """
    try:
        _host, offset = decode_message_id(msg_id)
    except ValueError:
        return None
    raw = store.look_message_by_offset(offset)
    if raw is None:
        return None
    try:
        msg = decode_message(raw)
    except CorruptDataError:
        return None
    return msg if msg.commit_log_offset == offset else None


@runtime_checkable
class IndexBacklog(Protocol):
    """An index that indexes on its own thread and can say how far behind it is.

    Implemented by the ``hash`` index; read by the metrics exporter
    (``tidemq_index_backlog_messages``, ``tidemq_index_lag_seconds``).
    """

    def pending(self) -> tuple[int, float]:
        """Messages waiting for the index thread, and the age in seconds of the oldest."""
