"""Stored messages by key and by commit-log offset (QUERY_MESSAGE, VIEW_MESSAGE_BY_ID).

Under a confirm offset (controller mode) a query by key finds only confirmed records, as RocketMQ
5's index holds only what its dispatch reached; a view by commit-log offset shows any stored
record, as RocketMQ's ``lookMessageByOffset`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from tidemq.broker.context import BrokerContext
from tidemq.broker.services.readable import ReadableQueues
from tidemq.broker.services.status import Outcome, Status
from tidemq.errors import CorruptDataError
from tidemq.message import decode_message

MAX_QUERY_NUM = 64  # defaultQueryMaxNum of RocketMQ's MessageStoreConfig
#: Index look-ups one query makes at most (each asks twice as many candidates as the last).
QUERY_ROUNDS = 4


@attrs.frozen(slots=True)
class KeyQueryResult:
    """The records whose key (or unique key) matched, and how far the key index had got."""

    status: Status  # SUCCESS, or QUERY_NOT_FOUND when no record matched
    records: tuple[bytes, ...]
    index_last_update_timestamp: int
    #: Where the key index has got (its newest record's commit-log offset), at most the confirm
    #: offset under one (controller mode).
    index_last_update_phy_offset: int


class MessageService:
    """Finds stored messages for operators and clients."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self.queues = ReadableQueues(broker)

    def query(
        self, topic: str, key: str, max_num: int, begin: int, end: int, unique: bool
    ) -> KeyQueryResult | Outcome:
        """Up to ``max_num`` (at most :data:`MAX_QUERY_NUM`) records of ``topic`` stored between
        ``begin`` and ``end`` (ms) whose key, or unique key, is ``key``."""
        b = self.broker
        if unique:
            max_num = MAX_QUERY_NUM
        max_num = max(1, min(max_num, MAX_QUERY_NUM))
        if b.index is None:
            return Outcome(Status.SYSTEM_ERROR, "this broker runs without a key index")
        confirm = self.queues.confirm_offset()
        ask = max_num
        for _ in range(QUERY_ROUNDS):
            result = b.index.query(topic, key, ask, begin, end)
            parts = self._matching(topic, key, result.phy_offsets, max_num, confirm)
            # Candidates skipped (hash collisions, records past the confirm offset) ate into a full
            # page: ask the index for more, as RocketMQ's index never held the unconfirmed ones.
            if len(parts) >= max_num or len(result.phy_offsets) < ask:
                break
            ask *= 2
        indexed_upto, indexed_time = result.last_update_phy_offset, result.last_update_timestamp
        if confirm is not None and indexed_upto >= confirm:
            # RocketMQ 5's index stops where its dispatch does, before the confirm offset: the
            # header names the newest confirmed record, not an unconfirmed one (before session 13
            # it showed the index's own end).
            indexed_upto, indexed_time = self.queues.last_readable_record(confirm)
        return KeyQueryResult(
            Status.SUCCESS if parts else Status.QUERY_NOT_FOUND,
            tuple(parts),
            indexed_time,
            indexed_upto,
        )

    def _matching(
        self, topic: str, key: str, offsets: Sequence[int], max_num: int, confirm: int | None
    ) -> list[bytes]:
        """Up to ``max_num`` confirmed records at ``offsets`` of ``topic`` whose key is ``key``."""
        store = self.broker.store
        parts: list[bytes] = []
        for phy in offsets:
            if not self.queues.record_readable(phy, confirm):
                continue  # stored, not yet held by the in-sync set (RocketMQ has not indexed it)
            raw = store.look_message_by_offset(phy)
            if raw is None:
                continue
            try:
                msg = decode_message(raw, with_body=False)
            except CorruptDataError:
                continue
            # The index hashes keys, so candidates are re-checked against the real key.
            if msg.topic != topic or (key not in msg.keys and msg.uniq_key != key):
                continue
            parts.append(bytes(raw))
            if len(parts) >= max_num:
                break
        return parts

    def view(self, offset: int) -> bytes | Outcome:
        """The record at commit-log ``offset``, confirmed or not (RocketMQ's lookMessageByOffset)."""
        raw = self.broker.store.look_message_by_offset(offset) if offset >= 0 else None
        if raw is None:
            return Outcome(Status.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return bytes(raw)
