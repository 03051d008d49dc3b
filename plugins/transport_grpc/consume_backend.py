"""The v5 consumers' :class:`~.consume_types.ConsumeBackend` inside a broker's process (RocketMQ 5's
local mode): over its services layer, not remoting frames."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs

from tidemq.broker.clients import SubscriptionData
from tidemq.broker.services import BrokerServices
from tidemq.broker.services.clients import ConsumerRegistration
from tidemq.broker.services.pop import PopError
from tidemq.message import decode_message
from tidemq.pop_header import retry_mark
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import DEFAULT_VERSION, RemotingCommand
from tidemq.transport import Connection

from .consume_types import (
    Assigned,
    ConsumeRefused,
    Delivered,
    GroupPolicy,
    ReceiptHandle,
    Subscribed,
    decode_receipt_handle,
    refused,
    retry_topic,
)
from .peer import StreamPeer
from .running import tags_of

log = logging.getLogger(__name__)

#: ConsumeInitMode: where a group that never consumed a queue starts.
_INIT_MIN, _INIT_MAX = 0, 1
#: The invisibility a message is given while it is forwarded to the dead-letter queue (it comes
#: back after it, should the forward fail half-way).
_FORWARD_HOLD_MS = 30_000


class BrokerConsumeBackend:
    """:class:`ConsumeBackend` inside a broker's process, over its services layer: the POP engine
    (``services.pop``), the consumer send-back to ``%DLQ%`` (``services.send.send_back``) and the
    timer engine's recall (``services.timers``)."""

    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        self.pop = services.pop
        self.broker = services.send.broker
        self.broker_name = self.broker.settings.name

    # ------------------------------------------------------------------ receive
    async def receive(
        self,
        group: str,
        topic: str,
        batch_size: int,
        invisible_ms: int,
        poll_ms: int,
        expression_type: str,
        expression: str,
        fifo: bool,
        closed: Callable[[], bool],
    ) -> list[Delivered]:
        try:
            result = await self.pop.pop(
                group,
                topic,
                -1,
                batch_size,
                invisible_ms,
                poll_ms,
                self._init_mode(topic),
                expression_type,
                expression,
                fifo,
                closed=closed,
            )
        except PopError as exc:
            raise refused(exc.code, exc.remark) from None
        # The checkpoint is in the revive log: flushed and on a slave as the broker's flush mode
        # and role require before the client sees the messages (as the remoting POP answers).
        await self.pop.durable()
        out: list[Delivered] = []
        for batch in result.batches:
            for offset, record in zip(batch.offsets, batch.buffers, strict=True):
                msg = decode_message(bytes(record))
                handle = ReceiptHandle(
                    batch.start,
                    result.pop_time,
                    result.invisible_ms,
                    result.revive_qid,
                    retry_mark(batch.topic),
                    self.broker_name,
                    batch.queue_id,
                    offset,
                    msg.commit_log_offset,
                )
                attempt = max(msg.reconsume_times, batch.attempt) + 1
                out.append(Delivered(msg, topic, handle.encode(), attempt, result.invisible_ms))
        return out

    def _init_mode(self, topic: str) -> int:
        """RocketMQ's proxy pops with ConsumeInitMode.MAX, but its broker starts a new group at
        the first message while the queue still holds it from offset 0 in memory
        (initPopOffsetByCheckMsgInMem): here, while no queue of the topic has lost a message."""
        cfg = self.broker.topics.get(topic)
        store = self.broker.store
        if cfg is not None and all(
            store.get_min_offset_in_queue(topic, q) <= 0 for q in range(cfg.read_queue_nums)
        ):
            return _INIT_MIN
        return _INIT_MAX

    # ------------------------------------------------------------------ settle
    def _stored(self, group: str, topic: str, handle: ReceiptHandle) -> str:
        """The topic the handle's message is stored in (the topic, or the group's retry topic)."""
        if handle.broker_name != self.broker_name:
            raise ConsumeRefused(
                "INVALID_RECEIPT_HANDLE", f"the receipt handle names broker {handle.broker_name!r}"
            )
        return retry_topic(topic, group, handle.retry)

    async def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        handle = decode_receipt_handle(receipt_handle)
        stored = self._stored(group, topic, handle)
        try:
            self.pop.ack(group, stored, handle.queue_id, handle.offset, handle.extra_info())
        except PopError as exc:
            raise refused(exc.code, exc.remark, handle=True) from None
        await self.pop.durable()  # an answered ack survives a failover

    async def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        handle = decode_receipt_handle(receipt_handle)
        stored = self._stored(group, topic, handle)
        try:
            pop_time, invisible, revive_qid = self.pop.change_invisible(
                group, stored, handle.queue_id, handle.offset, handle.extra_info(), invisible_ms
            )
        except PopError as exc:
            raise refused(exc.code, exc.remark, handle=True) from None
        await self.pop.durable()
        # The new checkpoint holds the one message: it starts at the message's offset.
        return attrs.evolve(
            handle, start=handle.offset, pop_time=pop_time, invisible_ms=invisible, revive_qid=revive_qid
        ).encode()

    async def forward_to_dlq(
        self, group: str, topic: str, receipt_handle: str, message_id: str, max_attempts: int
    ) -> None:
        handle = decode_receipt_handle(receipt_handle)
        stored = self._stored(group, topic, handle)
        # Hold the message first: that proves the handle is in flight for this group (a forged
        # one names no message) and keeps it from being redelivered while it is copied.
        held = await self.change_invisible(group, topic, receipt_handle, _FORWARD_HOLD_MS)
        read = self.broker.store.get_message(group, stored, handle.queue_id, handle.offset, 1)
        if not read.buffers or read.queue_offsets[0] != handle.offset:
            raise ConsumeRefused(
                "INTERNAL_SERVER_ERROR", f"{stored}:{handle.queue_id}@{handle.offset} is gone"
            )
        msg = decode_message(bytes(read.buffers[0]))
        # CONSUMER_SEND_MSG_BACK with delay level -1: straight to %DLQ%<group>, as RocketMQ's proxy.
        done = await self.services.send.send_back(
            group, msg.commit_log_offset, -1, max_attempts, message_id or msg.uniq_key or msg.msg_id
        )
        if not done.ok:
            raise refused(int(done.status), done.remark or "forward to the dead-letter queue failed")
        await self.ack(group, topic, held)

    # ------------------------------------------------------------------ assignment, recall
    async def query_assignment(self, topic: str, group: str, client_id: str) -> list[Assigned]:
        try:
            cfg = self.pop.check_topic(topic, -1, any_queue=True)
            self.pop.check_group(group)
        except PopError as exc:
            raise refused(exc.code, exc.remark) from None
        if cfg.read_queue_nums <= 0:
            return []
        return [Assigned(self.broker_name, -1, cfg.perm)]

    async def recall(self, topic: str, recall_handle: str) -> str:
        request = RemotingCommand.request(
            RequestCode.RECALL_MESSAGE, {"topic": topic, "recallHandle": recall_handle, "producerGroup": ""}
        )
        response = await self.services.timers.recall_message(None, request)
        if response.code != ResponseCode.SUCCESS:
            raise refused(response.code, response.remark or "recall failed")
        return str((response.ext_fields or {}).get("msgId", ""))

    # ------------------------------------------------------------------ groups
    async def group_policy(self, group: str) -> GroupPolicy:
        cfg = self.broker.groups.find_or_create(group)
        if cfg is None:
            return GroupPolicy(False, self.broker.settings.max_reconsume_times + 1)
        return GroupPolicy(bool(cfg.consume_message_orderly), int(cfg.retry_max_times) + 1)

    async def register_consumer(
        self,
        peer: Connection,
        client_id: str,
        language: str,
        group: str,
        subscriptions: list[Subscribed],
        consume_type: str = "CONSUME_PASSIVELY",
    ) -> None:
        version = int(time.time() * 1000)
        subs = [
            SubscriptionData(
                topic=s.topic,
                sub_string=s.expression,
                tags_set=tags_of(s),
                sub_version=version,
                expression_type=s.expression_type,
            )
            for s in subscriptions
        ]
        registration = ConsumerRegistration(
            group, consume_type, "CLUSTERING", "CONSUME_FROM_LAST_OFFSET", subs
        )
        version = peer.agent.version if isinstance(peer, StreamPeer) else DEFAULT_VERSION
        self.services.clients.heartbeat(peer, client_id, language, version, [registration], [])
