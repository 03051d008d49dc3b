"""The v5 consumers' :class:`~tidemq_transport_grpc.consume_types.ConsumeBackend` over remoting: the
brokers' POP codes (POP_MESSAGE 200050, ACK_MESSAGE 200051, CHANGE_MESSAGE_INVISIBLETIME 200053),
CONSUMER_SEND_MSG_BACK to the dead-letter queue and RECALL_MESSAGE, to the broker group a queue
(or a receipt handle, or a recall handle) names.

A receive asks the topic's readable groups in turn, each without waiting but the last (which
long-polls), as RocketMQ's proxy pops with queue -1 per broker.  The receipt handle names its
broker group, so its ack and its changes of invisibility go back there.  Each consumer registers
with the brokers under its own client id (:mod:`.clients`: a heartbeat per client with its
group and subscriptions), so the groups' connections and progress show the v5 clients.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from tidemq.client import BrokerError, ClientAPI, HoldsOffsets, SpeaksForClients
from tidemq.message import iter_messages
from tidemq.mqjson import dumps as mqjson_dumps
from tidemq.mqjson import loads as json_loads
from tidemq.pop_header import parse_info, retry_mark
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.errors import RemotingError
from tidemq.transport import Connection
from tidemq_transport_grpc.api import (
    Assigned,
    BackendUnavailable,
    ConsumeRefused,
    Delivered,
    GroupPolicy,
    ReceiptHandle,
    Subscribed,
    consumer_data,
    decode_receipt_handle,
    refused,
    retry_topic,
)

from .clients import ProxyClients
from .cluster import ClusterBackend

log = logging.getLogger(__name__)

#: RocketMQ's permission bit of readable queues (PermName).
PERM_READ = 0x4
#: POP answers when nothing was found: PULL_NOT_FOUND, POLLING_TIMEOUT, POLLING_FULL.
_NOT_FOUND = (ResponseCode.PULL_NOT_FOUND, 210, 209)
#: ConsumeInitMode: where a group that never consumed a queue starts.
_INIT_MIN, _INIT_MAX = 0, 1
#: The invisibility a message gets while it is forwarded to the dead-letter queue.
_FORWARD_HOLD_MS = 30_000
#: How long a broker's answers about groups and queue heads are reused, seconds.
_CACHE_S = 30.0


#: How long the proxy waits for a client's VerifyMessageResult: under the broker's 10 s wait for
#: the proxy, so the admin gets the proxy's CONSUME_MSG_TIMEOUT, not the broker's.
DIRECTLY_TIMEOUT_S = 9.0
#: How long the proxy waits for a client's ThreadStackTrace (consumerStatus -s) before it answers
#: without the stacks: RocketMQ 5's proxy's grpcProxyRelayRequestTimeoutInSeconds (5), under the
#: broker's 10 s wait for the proxy.
STACK_TIMEOUT_S = 5.0


class ProxyConsumer:
    """A v5 consumer group as the proxy's client registers it with the brokers (heartbeats)."""

    def __init__(self, group: str, clients: ProxyClients | None = None) -> None:
        self.group = group
        #: stream id -> (the stream, its subscriptions)
        self.streams: dict[int, tuple[Any, list[Subscribed]]] = {}
        self.clients = clients

    def running_info_of(self, client_id: str, with_jstack: bool) -> dict[str, Any] | None:
        """GET_CONSUMER_RUNNING_INFO a broker relays for one of the group's clients: answered
        for that client (:meth:`ProxyClients.running_info`), not for the group; None when the
        proxy has no such client of the group."""
        return None if self.clients is None else self.clients.running_info(client_id, self.group)

    def consumer_status(self, topic: str) -> dict[MessageQueue, int]:
        """GET_CONSUMER_STATUS_FROM_CLIENT (mqadmin's ``getConsumerStatus``, a reset of offsets by
        time) a broker relays for each v5 client of the group: an empty table, for every client.

        What a 4.x client reports is its own offset table (RocketMQ's ``cloneOffsetTable``), the
        positions it pulled from and will commit.  A v5 consumer has none: it POPs (the proxy asks
        every readable broker group with queue -1, QueryAssignment hands out no queue of its own),
        and the brokers keep the group's consume offsets, which ``consumerProgress`` shows.  The
        proxy could only echo those back, as if the client held them; RocketMQ's
        ``MQClientInstance.getConsumerStatus`` answers an empty table for a consumer that holds no
        offsets, and so does the proxy (the request names no client, so each is answered alike)."""
        return {}

    async def consume_directly_of(self, client_id: str, request: RemotingCommand) -> RemotingCommand:
        """CONSUME_MESSAGE_DIRECTLY a broker relays for one of the group's clients: to that
        client's Telemetry stream as a VerifyMessageCommand (``StreamPeer.verify_message``, as
        in a broker's process), answered within the broker's own wait for the proxy."""
        for peer, _subs in self.streams.values():
            if getattr(peer, "client_id", None) != client_id or not hasattr(peer, "verify_message"):
                continue
            try:
                answer: RemotingCommand = await peer.verify_message(request, DIRECTLY_TIMEOUT_S)
                return answer
            except TimeoutError:
                return request.reply(
                    ResponseCode.CONSUME_MSG_TIMEOUT,
                    f"consumer <{self.group}> <{client_id}> Timeout: no answer",
                )
            except Exception as exc:  # the stream ended, a message that does not decode
                return request.reply(
                    ResponseCode.SYSTEM_ERROR,
                    f"invoke consumer <{self.group}> <{client_id}> Exception: {exc}",
                )
        return request.reply(
            ResponseCode.SYSTEM_ERROR, f"The Consumer <{self.group}> <{client_id}> not online"
        )

    async def running_info_with_stack(self, client_id: str, request: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_RUNNING_INFO with ``jstackEnable`` for one of the group's clients: its
        running info (:meth:`running_info_of`) with the stacks its Telemetry stream gives back
        (``StreamPeer.print_stack``, within the broker's wait for the proxy); none when it does
        not answer in time; SYSTEM_ERROR at once when its stream ends meanwhile."""
        info = self.running_info_of(client_id, True)
        peer = next(
            (p for p, _subs in self.streams.values() if getattr(p, "client_id", None) == client_id),
            None,
        )
        if info is None or peer is None or not hasattr(peer, "print_stack"):
            return request.reply(
                ResponseCode.SYSTEM_ERROR, f"The Consumer <{self.group}> <{client_id}> not online"
            )
        try:
            stack = await peer.print_stack(STACK_TIMEOUT_S)
        except Exception as exc:  # the stream ended, or its client reads none of it
            return request.reply(
                ResponseCode.SYSTEM_ERROR, f"invoke consumer <{self.group}> <{client_id}> Exception: {exc}"
            )
        if stack is not None:
            info["jstack"] = stack
        return request.reply(body=mqjson_dumps(info))

    def heartbeat_data(self) -> dict[str, Any]:
        subscriptions: dict[str, Subscribed] = {}
        for _stream, subs in self.streams.values():
            subscriptions.update((s.topic, s) for s in subs)
        return consumer_data(self.group, list(subscriptions.values()))

    def topics(self) -> set[str]:
        return {s.topic for _stream, subs in self.streams.values() for s in subs}


if TYPE_CHECKING:  # what the client instance dispatches a broker's requests for this group on

    def _conforms(consumer: ProxyConsumer) -> tuple[SpeaksForClients, HoldsOffsets]:
        return consumer, consumer


class RemotingConsumeBackend:
    """:class:`ConsumeBackend` over the brokers a :class:`ClusterBackend` reaches."""

    def __init__(self, cluster: ClusterBackend) -> None:
        self.cluster = cluster
        self.instance = cluster.instance
        self.consumers: dict[str, ProxyConsumer] = {}
        self._turn = 0
        #: (broker address, topic) -> (until, whether every queue still starts at 0)
        self._heads: dict[tuple[str, str], tuple[float, bool]] = {}
        #: broker address -> (until, subscriptionGroupTable)
        self._groups: dict[str, tuple[float, dict[str, Any]]] = {}

    @property
    def api(self) -> ClientAPI:
        return self.instance.require_api()

    async def _invoke(
        self, addr: str, broker_name: str, request: RemotingCommand, timeout: float | None = None
    ) -> Any:
        try:
            return await self.api.invoke(addr, request, timeout)
        except RemotingError as exc:
            self.cluster.mark_down(broker_name, addr)
            raise BackendUnavailable(f"broker {broker_name} at {addr} is unreachable: {exc}") from exc

    async def _readable(self, topic: str) -> list[tuple[str, int]]:
        """(broker name, perm) of the groups with readable queues of ``topic``."""
        route = await self.cluster.topic_route(topic)
        if route is None:
            raise ConsumeRefused(
                "TOPIC_NOT_FOUND", f"topic {topic} not found (create it on the cluster first)"
            )
        return sorted(
            {
                (q.broker_name, q.perm)
                for q in route.queue_datas
                if q.read_queue_nums > 0 and q.perm & PERM_READ
            }
        )

    async def _address(self, topic: str, broker_name: str) -> str:
        addr = await self.cluster.address_of(topic, broker_name)
        if addr is None:
            raise ConsumeRefused(
                "INVALID_RECEIPT_HANDLE", f"no broker group {broker_name!r} serves topic {topic}"
            )
        return addr

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
        brokers = [name for name, _perm in await self._readable(topic)]
        if not brokers:
            return []
        self._turn += 1
        failures = []
        for i in range(len(brokers)):
            name = brokers[(self._turn + i) % len(brokers)]
            addr = self.instance.read_address(name)
            if addr is None or closed():
                continue
            poll = poll_ms if i == len(brokers) - 1 else 0  # only the last group asked waits
            try:
                got = await self._pop(
                    addr,
                    name,
                    group,
                    topic,
                    batch_size,
                    invisible_ms,
                    poll,
                    expression_type,
                    expression,
                    fifo,
                )
            except BackendUnavailable as exc:
                failures.append(str(exc))
                continue
            if got:
                return got
        if failures and len(failures) == len(brokers):
            raise BackendUnavailable("; ".join(failures))
        return []

    async def _init_mode(self, addr: str, name: str, topic: str) -> int:
        """As the local backend: a new group starts at a queue's first message while no queue of
        the topic on that broker has lost one (RocketMQ's broker checks its memory the same way)."""
        now = time.monotonic()
        cached = self._heads.get((addr, topic))
        if cached is None or cached[0] < now:
            route = await self.cluster.topic_route(topic)
            queues = (
                next((q.read_queue_nums for q in route.queue_datas if q.broker_name == name), 0)
                if route
                else 0
            )
            whole = True
            for qid in range(queues):
                try:
                    if await self.api.get_min_offset(addr, MessageQueue(topic, name, qid)) > 0:
                        whole = False
                        break
                except (BrokerError, RemotingError):
                    whole = False
                    break
            cached = self._heads[(addr, topic)] = (now + _CACHE_S, whole)
        return _INIT_MIN if cached[1] else _INIT_MAX

    async def _pop(
        self,
        addr: str,
        name: str,
        group: str,
        topic: str,
        batch_size: int,
        invisible_ms: int,
        poll_ms: int,
        expression_type: str,
        expression: str,
        fifo: bool,
    ) -> list[Delivered]:
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": "-1",
            "maxMsgNums": str(batch_size),
            "invisibleTime": str(invisible_ms),
            "pollTime": str(poll_ms),
            "bornTime": str(int(time.time() * 1000)),
            "initMode": str(await self._init_mode(addr, name, topic)),
            "expType": expression_type,
            "exp": expression or "*",
            "order": "true" if fifo else "false",
        }
        request = RemotingCommand.request(RequestCode.POP_MESSAGE, fields)
        resp = await self._invoke(addr, name, request, self.cluster.timeout + poll_ms / 1000)
        if resp.code in _NOT_FOUND:
            return []
        if resp.code != ResponseCode.SUCCESS:
            raise refused(resp.code, resp.remark or f"code {resp.code}")
        ext = resp.ext_fields or {}
        pop_time = int(ext.get("popTime", 0))
        invisible = int(ext.get("invisibleTime", invisible_ms))
        revive_qid = int(ext.get("reviveQid", 0))
        starts = parse_info(ext.get("startOffsetInfo"), skip_malformed=True)
        counts = parse_info(ext.get("orderCountInfo"), skip_malformed=True)
        out = []
        for msg in iter_messages(resp.payload() or b""):
            mark = retry_mark(msg.topic)
            key = f"{mark}@{msg.queue_id}"
            handle = ReceiptHandle(
                int(starts.get(key, msg.queue_offset)),
                pop_time,
                invisible,
                revive_qid,
                mark,
                name,
                msg.queue_id,
                msg.queue_offset,
                msg.commit_log_offset,
            )
            attempt = max(msg.reconsume_times, int(counts.get(key, 0))) + 1
            out.append(Delivered(msg, topic, handle.encode(), attempt, invisible))
        return out

    # ------------------------------------------------------------------ settle
    async def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        handle = decode_receipt_handle(receipt_handle)
        addr = await self._address(topic, handle.broker_name)
        fields = {
            "consumerGroup": group,
            "topic": retry_topic(topic, group, handle.retry),
            "queueId": str(handle.queue_id),
            "extraInfo": handle.extra_info(),
            "offset": str(handle.offset),
        }
        resp = await self._invoke(
            addr, handle.broker_name, RemotingCommand.request(RequestCode.ACK_MESSAGE, fields)
        )
        if resp.code != ResponseCode.SUCCESS:
            raise refused(resp.code, resp.remark or f"code {resp.code}", handle=True)

    async def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        handle = decode_receipt_handle(receipt_handle)
        addr = await self._address(topic, handle.broker_name)
        fields = {
            "consumerGroup": group,
            "topic": retry_topic(topic, group, handle.retry),
            "queueId": str(handle.queue_id),
            "extraInfo": handle.extra_info(),
            "offset": str(handle.offset),
            "invisibleTime": str(invisible_ms),
        }
        request = RemotingCommand.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, fields)
        resp = await self._invoke(addr, handle.broker_name, request)
        if resp.code != ResponseCode.SUCCESS:
            raise refused(resp.code, resp.remark or f"code {resp.code}", handle=True)
        ext = resp.ext_fields or {}
        # The new checkpoint holds the one message: it starts at the message's offset.
        return attrs.evolve(
            handle,
            start=handle.offset,
            pop_time=int(ext.get("popTime", handle.pop_time)),
            invisible_ms=int(ext.get("invisibleTime", invisible_ms)),
            revive_qid=int(ext.get("reviveQid", handle.revive_qid)),
        ).encode()

    async def forward_to_dlq(
        self, group: str, topic: str, receipt_handle: str, message_id: str, max_attempts: int
    ) -> None:
        handle = decode_receipt_handle(receipt_handle)
        # Hold it first: proves the handle is in flight for the group, keeps it from being
        # redelivered while it is copied.
        held = await self.change_invisible(group, topic, receipt_handle, _FORWARD_HOLD_MS)
        addr = await self._address(topic, handle.broker_name)
        try:
            # Delay level -1: straight to %DLQ%<group>, as RocketMQ's proxy forwards.
            await self.api.send_back(
                addr,
                group=group,
                commit_log_offset=handle.commit_log_offset,
                delay_level=-1,
                origin_msg_id=message_id,
                origin_topic=topic,
                max_reconsume_times=max_attempts,
            )
        except BrokerError as exc:
            raise refused(exc.code, exc.remark or "forward to the dead-letter queue failed") from None
        except RemotingError as exc:
            raise BackendUnavailable(f"broker {handle.broker_name} at {addr} is unreachable: {exc}") from exc
        await self.ack(group, topic, held)

    # ------------------------------------------------------------------ assignment, recall
    async def query_assignment(self, topic: str, group: str, client_id: str) -> list[Assigned]:
        return [Assigned(name, -1, perm) for name, perm in await self._readable(topic)]

    async def recall(self, topic: str, recall_handle: str) -> str:
        names = [name for name, _perm in await self._readable(topic)]
        named = _recall_broker(recall_handle)
        if named is not None:
            names = [named]
        fields = {"topic": topic, "recallHandle": recall_handle, "producerGroup": ""}
        last: ConsumeRefused | None = None
        for name in names:
            addr = await self.cluster.address_of(topic, name, master=True)
            if addr is None:
                continue
            resp = await self._invoke(addr, name, RemotingCommand.request(RequestCode.RECALL_MESSAGE, fields))
            if resp.code == ResponseCode.SUCCESS:
                return str((resp.ext_fields or {}).get("msgId", ""))
            last = refused(resp.code, resp.remark or "recall failed")
        raise last or ConsumeRefused("BAD_REQUEST", f"no broker group of topic {topic} holds that message")

    # ------------------------------------------------------------------ groups
    async def group_policy(self, group: str) -> GroupPolicy:
        default = GroupPolicy(False, self.cluster.max_reconsume_times + 1)
        addrs = self.instance.master_addresses()
        if not addrs:
            return default
        addr = addrs[0]
        now = time.monotonic()
        cached = self._groups.get(addr)
        if cached is None or cached[0] < now:
            table: dict[str, Any] = {}
            try:
                resp = await self.api.invoke(
                    addr, RemotingCommand.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {})
                )
                if resp.code == ResponseCode.SUCCESS and resp.body:
                    table = dict(json_loads(resp.body).get("subscriptionGroupTable") or {})
            except (RemotingError, ValueError) as exc:
                log.info("subscription groups of %s unavailable: %s", addr, exc)
            cached = self._groups[addr] = (now + _CACHE_S, table)
        cfg = cached[1].get(group)
        if not isinstance(cfg, dict):
            return default
        return GroupPolicy(bool(cfg.get("consumeMessageOrderly")), int(cfg.get("retryMaxTimes", 16)) + 1)

    async def register_consumer(
        self,
        peer: Connection,
        client_id: str,
        language: str,
        group: str,
        subscriptions: list[Subscribed],
        consume_type: str = "CONSUME_PASSIVELY",
    ) -> None:
        consumer = self.consumers.get(group)
        new = consumer is None
        if consumer is None:
            consumer = self.consumers[group] = ProxyConsumer(group, self.instance.clients)
            self.instance.register_consumer(consumer)
        if id(peer) not in consumer.streams:
            peer.add_close_callback(lambda p: self._drop(p, client_id, group))
            new = True
        consumer.streams[id(peer)] = (peer, list(subscriptions))
        # The client is registered with the brokers under its own id (its own heartbeat).
        data = consumer_data(group, list(subscriptions), consume_type)
        if self.instance.clients.add_consumer(client_id, language, group, data) or new:
            # Tell the brokers now, not at the next heartbeat.
            self.cluster.spawn(self._announce(client_id, [s.topic for s in subscriptions]))

    async def _announce(self, client_id: str, topics: list[str]) -> None:
        for topic in topics:  # learn the topics' brokers first (a NameServer down: the next heartbeat)
            try:
                await self.cluster.topic_route(topic)
            except BackendUnavailable as exc:
                log.info("route of %s unavailable: %s", topic, exc)
        await self.instance.clients.heartbeat_of(client_id)

    def _drop(self, peer: Any, client_id: str, group: str) -> None:
        self.instance.clients.remove_consumer(client_id, group)
        consumer = self.consumers.get(group)
        if consumer is None:
            return
        consumer.streams.pop(id(peer), None)
        if not consumer.streams:
            del self.consumers[group]
            self.instance.unregister(consumer)


def _recall_broker(recall_handle: str) -> str | None:
    """The broker name a recall handle carries (``v1 topic brokerName timestamp id``, base64)."""
    try:
        parts = base64.urlsafe_b64decode(recall_handle.encode()).decode().split(" ")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return parts[2] if len(parts) == 5 else None
