"""What the RPCs of ``apache.rocketmq.v2.MessagingService`` need of the brokers behind them.

:class:`Backend` is that seam: a topic's queue layout, a send, the end of a transaction, the
producers a Telemetry stream registers (so transaction checks reach it), pulls and offsets.
:class:`LocalBackend` is the broker of this process (RocketMQ 5's *local mode*: the broker's
services layer, no remoting frames); ``tidemq proxy`` (the grpc_proxy plugin) implements the same
Protocol over remoting to a NameServer and its broker groups (*cluster mode*).

Refusals are :class:`~tidemq.broker.services.Outcome` values (RocketMQ's response codes), mapped
to ``apache.rocketmq.v2.Code`` in one table (:func:`.messages.code_of`).  A backend that cannot
reach a broker at all raises :class:`BackendUnavailable` (the client gets gRPC UNAVAILABLE).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

import attrs

from tidemq.broker.dedup import WindowRebuilding
from tidemq.broker.services import BrokerServices, Outcome, Send, Status
from tidemq.message import MessageExt, decode_message_id, iter_messages, properties_to_string
from tidemq.transport import Connection

from .peer import StreamPeer

#: The template topic a 4.x producer's first send names (AUTO_CREATE_TOPIC_KEY_TOPIC): no one sends to it.
DEFAULT_TOPIC = "TBW102"
#: Where QueryOffset starts: the queue's first message, its end, or the first at a time.
OffsetPolicy = Literal["BEGINNING", "END", "TIMESTAMP"]


class BackendUnavailable(Exception):
    """No broker (or NameServer) could be reached for the request: gRPC UNAVAILABLE to the client."""


@attrs.frozen
class QueueLayout:
    """One broker group's queues of a topic (its share of a QueryRoute answer)."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    #: RocketMQ's permission bits (PermName: 4 read, 2 write).
    perm: int
    #: The topic's RocketMQ 5 attributes there (``message.type``...: tidemq.topic_attributes).
    attributes: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Outgoing:
    """One message as the RPC layer hands it to a backend to store."""

    topic: str
    body: bytes
    #: Every property: the user's and RocketMQ's (tag, keys, UNIQ_KEY, sharding key, timer...).
    properties: dict[str, str]
    sys_flag: int
    born_timestamp: int
    #: The producer group (a transaction's half message names one; else empty).
    producer_group: str = ""
    #: A FIFO message's group: all messages of a group go to one queue.
    message_group: str | None = None
    #: Refuse a message the topic's ``message.type`` does not take (RocketMQ 5's proxy's
    #: enableTopicMessageTypeCheck): :attr:`Stored.type_conflict`.
    check_type: bool = False


@attrs.frozen
class Stored:
    """What became of one :class:`Outgoing`."""

    outcome: Outcome
    #: The offset message id (where it is stored: the broker's address and commit-log offset).
    offset_msg_id: str = ""
    queue_offset: int = -1
    #: A timer message's recall handle (RecallMessage names it), else empty.
    recall_handle: str = ""
    #: Refused because the topic's ``message.type`` does not take it (``outcome.remark`` says why).
    type_conflict: bool = False


@attrs.frozen
class Pulled:
    """A pull's answer: its status (SUCCESS, PULL_NOT_FOUND, PULL_OFFSET_MOVED...), the messages
    and where the next pull starts."""

    outcome: Outcome
    messages: Sequence[MessageExt] = ()
    next_offset: int = 0


class Backend(Protocol):
    """The brokers as the gRPC service sees them; one instance per endpoint."""

    #: A consumer's attempts before its message goes to the dead-letter queue (Settings).
    max_reconsume_times: int

    async def route(self, topic: str) -> list[QueueLayout] | Outcome:
        """The topic's queues per broker group (created first where the broker auto-creates
        topics), or the refusal (TOPIC_NOT_FOUND...).  The name was checked by the caller."""
        ...

    async def send(self, peer: Connection, message: Outgoing) -> Stored:
        """Store one message (on the message group's queue for a FIFO message)."""
        ...

    async def send_many(self, peer: Connection, messages: Sequence[Outgoing]) -> list[Stored]:
        """Store the messages of one SendMessage, in order: one answer each, as :meth:`send`
        gives them; a broker's backend awaits their durability together (one flush round)."""
        ...

    async def end_transaction(
        self,
        peer_address: str,
        producer_group: str,
        offset_msg_id: str,
        tran_state_offset: int,
        resolution: int,
        from_check: bool,
        message_id: str,
    ) -> Outcome:
        """Commit, roll back (``resolution``: MessageSysFlag's transaction type) or leave pending
        the half message ``offset_msg_id`` names."""
        ...

    def register_producers(self, peer: StreamPeer, client_id: str, groups: Sequence[str]) -> None:
        """``peer`` (a Telemetry stream) produces for ``groups``: the brokers' transaction checks
        of their half messages go to it (``peer.check_transaction``).  Called again to refresh."""
        ...

    def unregister_producers(self, peer: StreamPeer, client_id: str, groups: Sequence[str]) -> None:
        """``peer`` no longer produces for ``groups``."""
        ...

    async def pull(
        self,
        peer: Connection,
        group: str,
        topic: str,
        broker_name: str,
        queue_id: int,
        offset: int,
        batch: int,
        wait_ms: int,
        subscription: tuple[str, str],
    ) -> Pulled | Outcome | None:
        """Up to ``batch`` messages of a queue from ``offset``, held up to ``wait_ms`` when there
        are none; None when the call ended while it was held."""
        ...

    async def commit_offset(
        self, group: str, topic: str, broker_name: str, queue_id: int, offset: int
    ) -> Outcome:
        """Store ``group``'s consume offset of a queue."""
        ...

    async def committed_offset(self, group: str, topic: str, broker_name: str, queue_id: int) -> int:
        """``group``'s committed offset of a queue, -1 when it has none."""
        ...

    async def queue_offset(
        self, topic: str, broker_name: str, queue_id: int, policy: OffsetPolicy, timestamp_ms: int
    ) -> int | Outcome:
        """A queue's first offset, its end, or the offset of its first message at ``timestamp_ms``."""
        ...


def fifo_queue(message_group: str, queue_count: int) -> int:
    """The queue of a message group among ``queue_count`` (stable across restarts and processes)."""
    return zlib.crc32(message_group.encode()) % max(queue_count, 1)


class LocalBackend:
    """The broker of this process, through its services layer (the remoting processors' layer)."""

    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        self.broker = services.send.broker
        self.max_reconsume_times = self.broker.settings.max_reconsume_times

    async def route(self, topic: str) -> list[QueueLayout] | Outcome:
        checked = self.services.send.check_topic(
            topic, DEFAULT_TOPIC, self.broker.settings.default_topic_queues, 0, 0
        )
        if isinstance(checked, Outcome):
            if self.broker.is_master:
                return checked
            cfg = self.broker.topics.get(topic)  # a slave routes the topics it has (it takes no sends)
            if cfg is None:
                return Outcome(Status.TOPIC_NOT_EXIST, f"topic {topic} not found")
        else:
            cfg = checked
        return [
            QueueLayout(
                self.broker.settings.name,
                cfg.read_queue_nums,
                cfg.write_queue_nums,
                cfg.perm,
                dict(cfg.attributes),
            )
        ]

    async def send(self, peer: Connection, message: Outgoing) -> Stored:
        window = self.broker.dedup
        if not window.serving() and not await window.wait_rebuilt():
            # The duplicate window is rebuilt (at start, after a promotion): as the remoting path,
            # the send waits for it (REBUILD_WAIT_S), then is SERVICE_NOT_AVAILABLE, a status the
            # v5 clients send again (HA_NOT_AVAILABLE), never an exception (INTERNAL).
            return Stored(Outcome(Status.SERVICE_NOT_AVAILABLE, _REBUILDING))
        try:
            return await self._send(peer, message)
        except WindowRebuilding as exc:  # a rebuild began between the check and the put
            return Stored(Outcome(Status.SERVICE_NOT_AVAILABLE, str(exc)))

    async def send_many(self, peer: Connection, messages: Sequence[Outgoing]) -> list[Stored]:
        """Store several messages of one request: each prepared (checked, hooked) in order, then
        all put in one call (one put per topic and queue) and their puts and replicas awaited
        together, so under sync flush they share a flush round instead of one round each.  The
        answers are per message, as :meth:`send` gives them one by one."""
        window = self.broker.dedup
        if not window.serving() and not await window.wait_rebuilt():
            return [Stored(Outcome(Status.SERVICE_NOT_AVAILABLE, _REBUILDING)) for _ in messages]
        sends = self.services.send
        prepared: list[Send | Stored] = []
        for message in messages:
            try:
                prepared.append(self._prepare(peer, message))
            except WindowRebuilding as exc:  # a rebuild began between the check and this message
                prepared.append(Stored(Outcome(Status.SERVICE_NOT_AVAILABLE, str(exc))))
        pending = [item for item in prepared if isinstance(item, Send)]
        if pending:
            sends.put(pending)  # one put per destination, in order
            done = [False] * len(pending)
            sends.settled_many(pending, done)
            for send, ready in zip(pending, done, strict=True):
                if not ready:  # the first awaits the round; the others are settled by then
                    await sends.settle(send)
        return [item if isinstance(item, Stored) else _stored(item) for item in prepared]

    async def _send(self, peer: Connection, message: Outgoing) -> Stored:
        prepared = self._prepare(peer, message)
        if isinstance(prepared, Stored):
            return prepared
        send = prepared
        sends = self.services.send
        sends.put_one(send)
        if not sends.settled(send):
            await sends.settle(send)
        return _stored(send)

    def _prepare(self, peer: Connection, message: Outgoing) -> Send | Stored:
        """``message`` checked and prepared: the send to store, or the answer that ends it here."""
        sends = self.services.send
        cfg = sends.check_topic(
            message.topic, DEFAULT_TOPIC, self.broker.settings.default_topic_queues, 0, message.sys_flag
        )
        if isinstance(cfg, Outcome):
            return Stored(cfg)
        if message.check_type:
            conflict = sends.check_message_type(cfg, message.properties)
            if conflict is not None:
                return Stored(conflict, type_conflict=True)
        queue_id = -1  # the send service picks one
        if message.message_group is not None:
            queue_id = fifo_queue(message.message_group, cfg.write_queue_nums)
        send = sends.prepare(
            peer,
            message.producer_group,
            message.topic,
            queue_id,
            message.sys_flag,
            DEFAULT_TOPIC,
            self.broker.settings.default_topic_queues,
            properties_to_string(message.properties),
            0,
            -1,
            0,
            message.born_timestamp,
            message.body,
        )
        if isinstance(send, Outcome):
            return Stored(send)
        return send

    async def end_transaction(
        self,
        peer_address: str,
        producer_group: str,
        offset_msg_id: str,
        tran_state_offset: int,
        resolution: int,
        from_check: bool,
        message_id: str,
    ) -> Outcome:
        commit_log_offset = decode_message_id(offset_msg_id)[1]
        return await self.services.transactions.end(
            peer_address,
            producer_group,
            tran_state_offset,
            commit_log_offset,
            resolution,
            from_check,
            message_id,
        )

    def register_producers(self, peer: StreamPeer, client_id: str, groups: Sequence[str]) -> None:
        agent = peer.agent  # the client's own language and version, as RocketMQ 5's proxy registers it
        self.services.clients.heartbeat(peer, client_id, agent.language, agent.version, [], list(groups))

    def unregister_producers(self, peer: StreamPeer, client_id: str, groups: Sequence[str]) -> None:
        for group in groups:
            self.services.clients.unregister(peer, client_id, group, "")

    async def pull(
        self,
        peer: Connection,
        group: str,
        topic: str,
        broker_name: str,
        queue_id: int,
        offset: int,
        batch: int,
        wait_ms: int,
        subscription: tuple[str, str],
    ) -> Pulled | Outcome | None:
        result = await self.services.pull.pull(
            peer,
            group,
            topic,
            queue_id,
            offset,
            batch,
            _FLAG_SUSPEND if wait_ms > 0 else 0,
            -1,
            max(wait_ms, 0),
            0,
            subscription,
        )
        if result is None or isinstance(result, Outcome):
            return result
        messages = [m for part in result.body for m in iter_messages(part)]
        return Pulled(Outcome(result.status, result.remark), messages, result.next_begin_offset)

    async def commit_offset(
        self, group: str, topic: str, broker_name: str, queue_id: int, offset: int
    ) -> Outcome:
        return self.services.offsets.commit(group, topic, queue_id, offset)

    async def committed_offset(self, group: str, topic: str, broker_name: str, queue_id: int) -> int:
        # The committed offset only (RocketMQ 5's proxy asks with setZeroIfNotFound = false, not
        # OffsetService.query's first-start rule): where a new group starts is the client's
        # consume-from choice, made with QueryOffset.
        return self.broker.offsets.query(group, topic, queue_id)

    async def queue_offset(
        self, topic: str, broker_name: str, queue_id: int, policy: OffsetPolicy, timestamp_ms: int
    ) -> int | Outcome:
        store = self.broker.store
        if policy == "BEGINNING":
            return store.get_min_offset_in_queue(topic, queue_id)
        # END and TIMESTAMP stop at the confirm offset (RocketMQ 5 searches dispatched queues).
        if policy == "END":
            return self.services.admin.max_offset(topic, queue_id)
        return self.services.admin.offset_by_time(topic, queue_id, timestamp_ms)


def _stored(send: Send) -> Stored:
    """A settled send's answer."""
    return Stored(Outcome(send.status, send.remark), send.msg_id, send.queue_offset, send.recall_handle or "")


#: A send's answer while the duplicate window is rebuilt (as the remoting path's).
_REBUILDING = "the duplicate window is being rebuilt; send again"
#: RocketMQ's PullSysFlag: hold the pull until a message arrives (or the suspend time passes).
_FLAG_SUSPEND = 2
