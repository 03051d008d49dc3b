"""Connected producers and consumers (ProducerManager, ConsumerManager, RebalanceLockManager).

Clients announce themselves with HEART_BEAT every 30 s; a connection silent for the housekeeping
interval (120 s) or closed is dropped, and the consumer groups it belonged to are told to rebalance.
A group's members are keyed by (connection, client id): one connection may carry several clients
(``tidemq proxy`` registers each RocketMQ 5 client behind it with its own client id).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import attrs

from tidemq.queues import MessageQueue
from tidemq.transport import Connection


@attrs.define(eq=False)
class ClientChannel:
    """One client connection (ClientChannelInfo)."""

    conn: Connection
    client_id: str
    language: str = ""
    version: int = 0
    last_update: float = attrs.field(factory=time.monotonic)

    @property
    def address(self) -> str:
        return self.conn.remote_address


@attrs.define
class SubscriptionData:
    """One topic a consumer group subscribes to, as its heartbeat describes it."""

    topic: str
    sub_string: str = "*"
    tags_set: list[str] = attrs.field(factory=list)
    code_set: list[int] = attrs.field(factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SubscriptionData:
        return cls(
            topic=str(data.get("topic", "")),
            sub_string=str(data.get("subString", "*") or "*"),
            tags_set=[str(t) for t in data.get("tagsSet") or []],
            code_set=[int(c) for c in data.get("codeSet") or []],
            sub_version=int(data.get("subVersion", 0) or 0),
            expression_type=str(data.get("expressionType") or "TAG"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "subString": self.sub_string,
            "tagsSet": self.tags_set,
            "codeSet": self.code_set,
            "subVersion": self.sub_version,
            "expressionType": self.expression_type,
            "classFilterMode": False,
        }


@attrs.define
class ConsumerGroupInfo:
    """Connections and subscriptions of one consumer group."""

    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    #: (connection, client id) -> the member
    channels: dict[tuple[Any, str], ClientChannel] = attrs.field(factory=dict)
    subscriptions: dict[str, SubscriptionData] = attrs.field(factory=dict)
    last_update: float = attrs.field(factory=time.monotonic)

    def client_ids(self) -> list[str]:
        return sorted({ch.client_id for ch in self.channels.values()})


class _ClientIds:
    """The client ids registered on each connection (most carry one; a proxy's carries many), so
    that a connection's end or an unregister without a client id finds its members at once."""

    def __init__(self) -> None:
        self.by_conn: dict[Any, set[str]] = {}

    def add(self, conn: Any, client_id: str) -> None:
        self.by_conn.setdefault(conn, set()).add(client_id)

    def keys(self, conn: Any, client_id: str = "") -> list[tuple[Any, str]]:
        """The member keys of ``client_id`` on ``conn`` (every client of ``conn`` without one)."""
        if client_id:
            return [(conn, client_id)]
        return [(conn, cid) for cid in self.by_conn.get(conn, ())]

    def discard(self, conn: Any, client_id: str) -> None:
        ids = self.by_conn.get(conn)
        if ids is not None:
            ids.discard(client_id)
            if not ids:
                del self.by_conn[conn]


class ConsumerManager:
    """Consumer groups by name; methods return whether the group's membership changed."""

    def __init__(self) -> None:
        self.groups: dict[str, ConsumerGroupInfo] = {}
        self._ids = _ClientIds()

    def register(
        self,
        group: str,
        channel: ClientChannel,
        consume_type: str,
        message_model: str,
        consume_from_where: str,
        subscriptions: Iterable[SubscriptionData],
    ) -> bool:
        info = self.groups.get(group)
        if info is None:
            info = self.groups[group] = ConsumerGroupInfo(group)
        info.consume_type, info.message_model, info.consume_from_where = (
            consume_type,
            message_model,
            consume_from_where,
        )
        info.last_update = time.monotonic()
        key = (channel.conn, channel.client_id)
        existing = info.channels.get(key)
        changed = existing is None
        if existing is None:
            info.channels[key] = channel
            self._ids.add(channel.conn, channel.client_id)
        else:
            existing.last_update = time.monotonic()
        new_subs = {s.topic: s for s in subscriptions}
        if set(new_subs) != set(info.subscriptions):
            changed = True
        info.subscriptions = new_subs
        return changed

    def unregister(self, group: str, conn: Connection, client_id: str = "") -> bool:
        """Drop ``client_id`` of ``conn`` (every client of ``conn`` without one) from ``group``."""
        info = self.groups.get(group)
        if info is None:
            return False
        removed = False
        for key in self._ids.keys(conn, client_id):
            if info.channels.pop(key, None) is not None:
                removed = True
                # One client gone: forget its id once no group has it (a whole connection's
                # ids are forgotten with the connection).
                if client_id and not any(key in other.channels for other in self.groups.values()):
                    self._ids.discard(*key)
        if not info.channels:
            del self.groups[group]
        return removed

    def connection_closed(self, conn: Connection) -> list[str]:
        """Drop ``conn`` from every group; returns the groups that lost a member."""
        affected = []
        for group in list(self.groups):
            if self.unregister(group, conn):
                affected.append(group)
        self._ids.by_conn.pop(conn, None)
        return affected

    def scan_not_active(self, timeout_s: float) -> list[tuple[str, Any]]:
        """Drop channels whose last heartbeat is older than ``timeout_s``; returns (group, conn)."""
        now = time.monotonic()
        dropped = []
        for group, info in list(self.groups.items()):
            for ch in list(info.channels.values()):
                if now - ch.last_update > timeout_s:
                    dropped.append((group, ch.conn))
                    self.unregister(group, ch.conn, ch.client_id)
        return dropped

    def get(self, group: str) -> ConsumerGroupInfo | None:
        return self.groups.get(group)

    def find_subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self.groups.get(group)
        return info.subscriptions.get(topic) if info else None

    def groups_of_topic(self, topic: str) -> list[str]:
        return [g for g, info in self.groups.items() if topic in info.subscriptions]

    def find_channel(self, group: str, client_id: str) -> ClientChannel | None:
        """The live connection of ``client_id`` in ``group`` (findChannel), None when offline."""
        info = self.groups.get(group)
        if info is None:
            return None
        for ch in info.channels.values():
            if ch.client_id == client_id and not ch.conn.closed:
                return ch
        return None

    def live_channels(self, group: str) -> list[ClientChannel]:
        """The group's open connections, in client-id order."""
        info = self.groups.get(group)
        if info is None:
            return []
        return sorted((ch for ch in info.channels.values() if not ch.conn.closed), key=lambda c: c.client_id)


class ProducerManager:
    """Producer groups by name (kept for transaction checks and admin tools)."""

    def __init__(self) -> None:
        #: group -> (connection, client id) -> the producer
        self.groups: dict[str, dict[tuple[Any, str], ClientChannel]] = {}
        self._ids = _ClientIds()

    def register(self, group: str, channel: ClientChannel) -> None:
        channels = self.groups.setdefault(group, {})
        key = (channel.conn, channel.client_id)
        existing = channels.get(key)
        if existing is None:
            channels[key] = channel
            self._ids.add(channel.conn, channel.client_id)
        else:
            existing.last_update = time.monotonic()

    def unregister(self, group: str, conn: Connection, client_id: str = "") -> None:
        """Drop ``client_id`` of ``conn`` (every client of ``conn`` without one) from ``group``."""
        channels = self.groups.get(group)
        if channels is not None:
            for key in self._ids.keys(conn, client_id):
                if (
                    channels.pop(key, None) is not None
                    and client_id
                    and not any(key in other for other in self.groups.values())
                ):
                    self._ids.discard(*key)
            if not channels:
                del self.groups[group]

    def connection_closed(self, conn: Connection) -> None:
        for group in list(self.groups):
            self.unregister(group, conn)
        self._ids.by_conn.pop(conn, None)

    def channels(self, group: str) -> list[ClientChannel] | None:
        """The connections of producer ``group``, None when no producer of it is connected."""
        channels = self.groups.get(group)
        return None if channels is None else list(channels.values())

    def table(self) -> dict[str, list[ClientChannel]]:
        """Every producer group's connections (ProducerManager.getProducerTable)."""
        return {group: list(channels.values()) for group, channels in self.groups.items()}

    def scan_not_active(self, timeout_s: float) -> list[Any]:
        now = time.monotonic()
        dropped = []
        for group, channels in list(self.groups.items()):
            for ch in list(channels.values()):
                if now - ch.last_update > timeout_s:
                    dropped.append(ch.conn)
                    self.unregister(group, ch.conn, ch.client_id)
        return dropped


class RebalanceLockManager:
    """Queue locks of orderly consumers: one client per (group, queue), expiring after 60 s."""

    LOCK_MAX_LIVE_S = 60.0

    def __init__(self) -> None:
        self._locks: dict[str, dict[MessageQueue, tuple[str, float]]] = {}

    def _held(self, group: str, mq: MessageQueue, client_id: str, now: float) -> bool:
        entry = self._locks.get(group, {}).get(mq)
        return entry is not None and entry[0] == client_id and now - entry[1] <= self.LOCK_MAX_LIVE_S

    def try_lock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> list[MessageQueue]:
        """Lock (or renew) each queue still free or already this client's; returns the ones held."""
        now = time.monotonic()
        table = self._locks.setdefault(group, {})
        locked = []
        for mq in mqs:
            entry = table.get(mq)
            if entry is None or entry[0] == client_id or now - entry[1] > self.LOCK_MAX_LIVE_S:
                table[mq] = (client_id, now)
                locked.append(mq)
        return locked

    def unlock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> None:
        table = self._locks.get(group, {})
        for mq in mqs:
            entry = table.get(mq)
            if entry is not None and entry[0] == client_id:
                del table[mq]

    def owner(self, group: str, mq: MessageQueue) -> str | None:
        entry = self._locks.get(group, {}).get(mq)
        if entry is None or time.monotonic() - entry[1] > self.LOCK_MAX_LIVE_S:
            return None
        return entry[0]
