"""SimpleConsumer over remoting POP (RocketMQ 5's SimpleConsumer, tidemq's flavour).

No queue ownership: :meth:`SimpleConsumer.receive` POPs messages from every broker of the topic,
each stays invisible to the group for ``invisible_duration`` seconds; :meth:`~SimpleConsumer.ack`
acknowledges one, :meth:`~SimpleConsumer.change_invisible_duration` extends (or shortens) its
invisibility.  A message not acknowledged in time is delivered again, to any consumer of the group.

    async with SimpleConsumer("G", "127.0.0.1:9876", subscriptions={"T": "*"}) as consumer:
        for msg in await consumer.receive(16, invisible_duration=30):
            handle(msg.body)
            await consumer.ack(msg)
"""

from __future__ import annotations

import base64
import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import orjson

from tidemq.client.errors import BrokerError, ClientError, NoRouteError
from tidemq.client.instance import ClientInstance
from tidemq.message import MessageExt, iter_messages
from tidemq.pop_header import parse_info, retry_mark
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

#: RocketMQ 5 POP answers when nothing was found.
_NOT_FOUND = (ResponseCode.PULL_NOT_FOUND, 210, 209)  # PULL_NOT_FOUND, POLLING_TIMEOUT, POLLING_FULL


@attrs.define
class ReceivedMessage:
    """A popped message and what acknowledging it takes."""

    message: MessageExt
    topic: str  # the topic subscribed to (a redelivered message is stored in the group's retry topic)
    handle: str  # RocketMQ's extraInfo (the receipt handle)
    broker_name: str
    broker_addr: str

    @property
    def body(self) -> bytes:
        return self.message.body

    @property
    def tags(self) -> str | None:
        return self.message.tags

    @property
    def keys(self) -> list[str]:
        return self.message.keys

    @property
    def properties(self) -> dict[str, str]:
        return self.message.properties

    @property
    def reconsume_times(self) -> int:
        """Deliveries before this one (0 at the first)."""
        return self.message.reconsume_times

    @property
    def message_id(self) -> str:
        return self.message.uniq_key or self.message.msg_id

    @property
    def stored_topic(self) -> str:
        return self.message.topic

    @property
    def queue_id(self) -> int:
        return self.message.queue_id

    @property
    def queue_offset(self) -> int:
        return self.message.queue_offset


class SimpleConsumer:
    """Receive, ack and change invisibility over POP; ``subscriptions`` maps topic -> tag expression."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] = "127.0.0.1:9876",
        *,
        subscriptions: Mapping[str, str] | None = None,
        expression_type: str = "TAG",
        invisible_duration: float = 30.0,
        await_duration: float = 5.0,
        consume_from: str = "last",
        instance: ClientInstance | None = None,
        **instance_options: Any,
    ) -> None:
        if not group:
            raise ClientError("consumer group must not be empty")
        if consume_from not in ("last", "first"):
            raise ClientError(f"consume_from = {consume_from!r}; choices: last, first")
        self.group = group
        self.subscriptions: dict[str, str] = dict(subscriptions or {})
        self.expression_type = expression_type
        self.invisible_duration = invisible_duration
        self.await_duration = await_duration
        self.init_mode = 1 if consume_from == "last" else 0  # RocketMQ's ConsumeInitMode MAX / MIN
        self.instance = instance or ClientInstance(namesrv, **instance_options)
        self._turn = itertools.count()
        self._started = False

    async def start(self) -> None:
        if self._started:
            return
        await self.instance.start()
        self._started = True

    async def shutdown(self) -> None:
        if self._started:
            self._started = False
            await self.instance.stop()

    async def __aenter__(self) -> SimpleConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self.subscriptions[topic] = expression

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)

    # ------------------------------------------------------------------ receive
    async def receive(
        self,
        max_messages: int = 16,
        invisible_duration: float | None = None,
        await_duration: float | None = None,
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` (1..32) messages of one subscribed topic; [] when none came in
        ``await_duration`` seconds."""
        if not self._started:
            raise ClientError("consumer is not started; call 'await consumer.start()' first")
        if not self.subscriptions:
            raise ClientError("no subscription: call subscribe(topic) first")
        invisible = self.invisible_duration if invisible_duration is None else invisible_duration
        wait = self.await_duration if await_duration is None else await_duration
        topics = sorted(self.subscriptions)
        topic = topics[next(self._turn) % len(topics)]
        route = await self.instance.get_route(topic)
        if route is None:
            raise NoRouteError(f"no route for topic {topic!r}")
        names = sorted({q.broker_name for q in route.queue_datas if q.read_queue_nums > 0 and q.perm & 4})
        if not names:
            raise NoRouteError(f"topic {topic!r} has no readable queue")
        start = next(self._turn)
        refreshed = False
        for i in range(len(names)):
            name = names[(start + i) % len(names)]
            addr = self.instance.broker_address(name)
            if addr is None and not refreshed:
                # No master in the cached route: a failover is under way or just happened; the
                # NameServers know the new master before the periodic refresh asks them.
                refreshed = True
                await self.instance.get_route(topic, refresh=True)
                addr = self.instance.broker_address(name)
            if addr is None:
                continue
            # Only the last broker tried waits: the others are asked without long polling.
            poll = wait if i == len(names) - 1 else 0
            got = await self._pop(addr, name, topic, max_messages, invisible, poll)
            if got:
                return got
        return []

    async def _pop(
        self, addr: str, broker_name: str, topic: str, max_messages: int, invisible: float, poll: float
    ) -> list[ReceivedMessage]:
        fields = {
            "consumerGroup": self.group,
            "topic": topic,
            "queueId": -1,
            "maxMsgNums": max_messages,
            "invisibleTime": int(invisible * 1000),
            "pollTime": int(poll * 1000),
            "bornTime": int(time.time() * 1000),
            "initMode": self.init_mode,
            "expType": self.expression_type,
            "exp": self.subscriptions.get(topic, "*"),
            "order": False,
        }
        api = self.instance.require_api()
        req = RemotingCommand.request(RequestCode.POP_MESSAGE, fields)
        resp = await api.invoke(addr, req, timeout=poll + api.timeout)
        if resp.code in _NOT_FOUND:
            return []
        if resp.code != ResponseCode.SUCCESS:
            raise BrokerError(resp.code, resp.remark, addr)
        ext = resp.ext_fields or {}
        pop_time, invisible_ms, rqid = ext.get("popTime"), ext.get("invisibleTime"), ext.get("reviveQid")
        starts = parse_info(ext.get("startOffsetInfo"), skip_malformed=True)
        counts = parse_info(ext.get("orderCountInfo"), skip_malformed=True)
        out = []
        for msg in iter_messages(resp.payload() or b""):
            key = f"{retry_mark(msg.topic)}@{msg.queue_id}"
            handle = (
                f"{starts.get(key, msg.queue_offset)} {pop_time} {invisible_ms} {rqid} {retry_mark(msg.topic)} "
                f"{broker_name} {msg.queue_id} {msg.queue_offset}"
            )
            if key in counts and int(counts[key]) > 0:
                msg.reconsume_times = int(counts[key])
            out.append(ReceivedMessage(msg, topic, handle, broker_name, addr))
        return out

    # ------------------------------------------------------------------ ack
    async def ack(self, message: ReceivedMessage) -> None:
        """Acknowledge ``message``; :class:`BrokerError` when its handle is no longer in flight
        (its invisibility ran out and it went to another delivery, or it was acknowledged already)."""
        fields = {
            "consumerGroup": self.group,
            "topic": message.stored_topic,
            "queueId": message.queue_id,
            "extraInfo": message.handle,
            "offset": message.queue_offset,
        }
        api = self.instance.require_api()
        resp = await api.invoke(message.broker_addr, RemotingCommand.request(RequestCode.ACK_MESSAGE, fields))
        if resp.code != ResponseCode.SUCCESS:
            raise BrokerError(resp.code, resp.remark, message.broker_addr)

    async def ack_many(self, messages: Sequence[ReceivedMessage]) -> int:
        """Acknowledge ``messages`` with one BATCH_ACK_MESSAGE per broker; how many the brokers took.

        :class:`BrokerError` when a broker refused some (its remark counts them); the others are
        acknowledged all the same.
        """
        by_broker: dict[str, dict[tuple[str, ...], list[ReceivedMessage]]] = {}
        for m in messages:
            p = m.handle.split(" ")
            key = (m.stored_topic, p[0], p[1], p[2], p[3], p[4], str(m.queue_id))
            by_broker.setdefault(m.broker_addr, {}).setdefault(key, []).append(m)
        api = self.instance.require_api()
        done = 0
        for addr, groups in by_broker.items():
            acks: list[dict[str, Any]] = []
            counts: list[int] = []
            for (_stored, start, pop_time, invisible, rqid, mark, qid), msgs in groups.items():
                bits = 0
                for m in msgs:
                    bits |= 1 << (m.queue_offset - int(start))
                acks.append(
                    {
                        "c": self.group,
                        "t": msgs[0].topic,
                        "r": mark,
                        "q": int(qid),
                        "so": int(start),
                        "rq": int(rqid),
                        "pt": int(pop_time),
                        "it": int(invisible),
                        "b": base64.b64encode(bits.to_bytes((bits.bit_length() + 7) // 8, "little")).decode(),
                    }
                )
                counts.append(len(msgs))
            for i in range(0, len(acks), 1024):
                body = orjson.dumps(
                    {
                        "brokerName": next(iter(groups.values()))[0].broker_name,
                        "acks": acks[i : i + 1024],
                    }
                )
                resp = await api.invoke(
                    addr, RemotingCommand.request(RequestCode.BATCH_ACK_MESSAGE, {}, body)
                )
                if resp.code != ResponseCode.SUCCESS:
                    raise BrokerError(resp.code, resp.remark, addr)
                done += sum(counts[i : i + 1024])
        return done

    async def change_invisible_duration(self, message: ReceivedMessage, seconds: float) -> ReceivedMessage:
        """Make ``message`` invisible ``seconds`` from now; returns it with its new handle (the old
        one no longer acknowledges it)."""
        fields = {
            "consumerGroup": self.group,
            "topic": message.stored_topic,
            "queueId": message.queue_id,
            "extraInfo": message.handle,
            "offset": message.queue_offset,
            "invisibleTime": int(seconds * 1000),
        }
        api = self.instance.require_api()
        req = RemotingCommand.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, fields)
        resp = await api.invoke(message.broker_addr, req)
        if resp.code != ResponseCode.SUCCESS:
            raise BrokerError(resp.code, resp.remark, message.broker_addr)
        ext = resp.ext_fields or {}
        handle = (
            f"{message.queue_offset} {ext.get('popTime')} {ext.get('invisibleTime')} {ext.get('reviveQid')} "
            f"{retry_mark(message.stored_topic)} {message.broker_name} {message.queue_id} {message.queue_offset}"
        )
        message.handle = handle
        return message
