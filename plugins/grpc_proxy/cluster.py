"""The gRPC service's :class:`~tidemq_transport_grpc.backend.Backend` over remoting: a NameServer and
the broker groups it routes to (RocketMQ 5's proxy in *cluster mode*).

Routes come from the NameServers through tidemq's client runtime (:class:`tidemq.client.ClientInstance`:
cached, refreshed every ``route_refresh_s``, one connection per broker).  Writes go to a group's
master; a send picks the topic's writable queues in turn, skipping for a while a broker group that
did not answer, and tries another group when one fails (a FIFO message keeps its one queue).
Pulls and offsets go to the group the queue names (its master, a slave while the master is down).
A transaction's END_TRANSACTION goes to the broker whose address its transaction id carries (the
half message's offset id).  Each v5 client publishing for a group is registered with the brokers
as a producer of it under its own client id (:mod:`.clients`), so their CHECK_TRANSACTION_STATE
requests reach the proxy's connection; each is handed to one of the group's streams as a
``RecoverOrphanedTransactionCommand``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from tidemq.broker.services import DONE, Outcome, Status
from tidemq.broker.services.transactions import TransactionCheck
from tidemq.client import (
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    BrokerError,
    ClientAPI,
    ClientError,
    PullStatus,
    TopicRoute,
)
from tidemq.message import MessageExt, create_message_id, decode_message_id, properties_to_string
from tidemq.mqjson import loads as json_loads
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.errors import RemotingError
from tidemq.topic_attributes import message_type_of, topic_message_type, type_conflict
from tidemq.transport import Connection
from tidemq_transport_grpc.api import (
    DEFAULT_TOPIC,
    PRODUCER_GROUP_PREFIX,
    BackendUnavailable,
    OffsetPolicy,
    Outgoing,
    Pulled,
    QueueLayout,
    Stored,
    StreamPeer,
    fifo_queue,
)

from .clients import ProxyInstance

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Sends that a broker answered as stored (the replica or the disk may lag: the client is told).
_STORED: dict[int, Status] = {
    ResponseCode.SUCCESS: Status.SUCCESS,
    ResponseCode.FLUSH_DISK_TIMEOUT: Status.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: Status.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: Status.SLAVE_NOT_AVAILABLE,
}
#: Refusals another broker group may not give: the send is tried there.
_TRY_ELSEWHERE = {ResponseCode.SYSTEM_BUSY, ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.NO_PERMISSION}
_PULLED = {
    PullStatus.FOUND: Status.SUCCESS,
    PullStatus.NO_NEW_MSG: Status.PULL_NOT_FOUND,
    PullStatus.NO_MATCHED_MSG: Status.PULL_RETRY_IMMEDIATELY,
    PullStatus.OFFSET_ILLEGAL: Status.PULL_OFFSET_MOVED,
}
#: RocketMQ's permission bit of writable queues (PermName).
PERM_WRITE = 0x2
#: Broker groups tried for one send (RocketMQ's producer: 1 + 2 retries).
SEND_ATTEMPTS = 3
#: A topic a broker's cached topic table lacks is asked for again after this long, seconds.
_ATTRIBUTES_RETRY_S = 1.0
#: How long a broker group that did not answer is passed over by sends, seconds.
DOWN_S = 10.0


def status_of(code: int) -> Status:
    """A broker's response code as a service status (codes the services never give: SYSTEM_ERROR)."""
    try:
        return Status(code)
    except ValueError:
        return Status.SYSTEM_ERROR


def refusal(exc: BrokerError) -> Outcome:
    return Outcome(status_of(exc.code), exc.remark or f"broker {exc.broker} answered code {exc.code}")


class ProducerGroup:
    """The producer group of one topic's v5 producers, as the proxy's client registers it with the
    brokers: their transaction checks of its half messages arrive here, and go to one of the
    Telemetry streams that publish for it."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.streams: dict[int, StreamPeer] = {}
        self._turn = itertools.count()

    def heartbeat_data(self) -> dict[str, Any]:
        return {"groupName": self.group}

    def topics(self) -> set[str]:
        return (
            {self.group[len(PRODUCER_GROUP_PREFIX) :]}
            if self.group.startswith(PRODUCER_GROUP_PREFIX)
            else set()
        )

    def check_transaction_state(self, broker_addr: str, fields: dict[str, str], msg: MessageExt) -> None:
        """A broker's CHECK_TRANSACTION_STATE: to a stream of the group (each in turn)."""
        live = [s for s in self.streams.values() if not s.closed]
        if not live:
            log.info(
                "transaction check of group %s from %s: no v5 producer connected", self.group, broker_addr
            )
            return
        stream = live[next(self._turn) % len(live)]
        try:
            commit_log_offset = int(fields.get("commitLogOffset") or msg.commit_log_offset)
            tran_state_offset = int(fields.get("tranStateTableOffset") or msg.queue_offset)
        except ValueError:
            log.warning("transaction check from %s with bad offsets: %s", broker_addr, fields)
            return
        offset_msg_id = fields.get("offsetMsgId") or create_message_id(msg.store_host, commit_log_offset)
        check = TransactionCheck(
            producer_group=self.group,
            message=msg,
            tran_state_offset=tran_state_offset,
            commit_log_offset=commit_log_offset,
            offset_msg_id=offset_msg_id,
            transaction_id=fields.get("transactionId", msg.uniq_key or ""),
        )
        task = asyncio.get_running_loop().create_task(stream.check_transaction(check))
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)


_BACKGROUND: set[asyncio.Task[Any]] = set()


class ClusterBackend:
    """The brokers a NameServer routes to, over remoting."""

    def __init__(
        self,
        namesrv: Sequence[str],
        *,
        timeout: float = 3.0,
        route_refresh_s: float = 30.0,
        heartbeat_s: float = 30.0,
        max_reconsume_times: int = 16,
        credentials: tuple[str, str | None] | None = None,
    ) -> None:
        access_key, secret_key = credentials or (None, None)
        self.instance = ProxyInstance(
            list(namesrv),
            instance_name=f"grpc-proxy-{os.getpid()}",
            timeout=timeout,
            route_refresh_s=route_refresh_s,
            heartbeat_s=heartbeat_s,
            access_key=access_key,
            secret_key=secret_key,
        )
        self.timeout = timeout
        self.max_reconsume_times = max_reconsume_times
        self.groups: dict[str, ProducerGroup] = {}
        self.route_refresh_s = route_refresh_s
        #: broker address -> (until, when asked, topic -> its attributes, the topics it has)
        self._attributes: dict[str, tuple[float, float, dict[str, dict[str, str]], set[str]]] = {}
        #: broker name -> monotonic time until which sends pass it over
        self._down: dict[str, float] = {}
        self._turn = itertools.count()

    async def start(self) -> None:
        await self.instance.start()

    async def stop(self) -> None:
        for task in list(_BACKGROUND):
            task.cancel()
        self.instance.clients.close()
        await self.instance.stop()

    @property
    def api(self) -> ClientAPI:
        return self.instance.require_api()

    # ------------------------------------------------------------------ routes
    async def _route(self, topic: str, refresh: bool = False) -> TopicRoute | Outcome:
        try:
            route = await self.instance.get_route(topic, refresh=refresh)
        except ClientError as exc:
            raise BackendUnavailable(f"no NameServer answered: {exc}") from exc
        except RemotingError as exc:
            raise BackendUnavailable(f"the NameServer is unreachable: {exc}") from exc
        if route is None or not route.queue_datas:
            return Outcome(
                Status.TOPIC_NOT_EXIST, f"topic {topic} not found (create it on the cluster first)"
            )
        return route

    async def route(self, topic: str) -> list[QueueLayout] | Outcome:
        route = await self._route(topic)
        if isinstance(route, Outcome):
            return route
        layouts = []
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            brokers = route.broker(qd.broker_name)
            if brokers is None or not brokers.broker_addrs:
                continue
            perm = qd.perm
            if brokers.master_address is None:  # a group without its master takes no writes
                perm &= ~PERM_WRITE
            attributes = await self._topic_attributes(brokers.address(), topic)
            layouts.append(
                QueueLayout(qd.broker_name, qd.read_queue_nums, qd.write_queue_nums, perm, attributes)
            )
        if not layouts:
            return Outcome(Status.TOPIC_NOT_EXIST, f"no broker serves topic {topic}")
        return layouts

    async def _topic_attributes(self, addr: str | None, topic: str) -> dict[str, str]:
        """``topic``'s RocketMQ 5 attributes on the broker at ``addr`` (its GET_ALL_TOPIC_CONFIG,
        cached ``route_refresh_s``, asked again at most every second for a topic it lacked;
        empty when the broker does not answer it: no ``message.type``)."""
        if addr is None:
            return {}
        now = time.monotonic()
        cached = self._attributes.get(addr)
        if cached is not None:
            until, asked, known, topics = cached
            # Fresh, and the topic was in it or it was asked just now (a topic created since
            # is asked for again, at most every second).
            if until > now and (topic in topics or asked + _ATTRIBUTES_RETRY_S > now):
                return known.get(topic, {})
        table: dict[str, dict[str, str]] = {}
        names: set[str] = set()
        try:
            resp = await self.api.invoke(addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG, {}))
            if resp.code == ResponseCode.SUCCESS and resp.body:
                for name, cfg in (json_loads(resp.body).get("topicConfigTable") or {}).items():
                    names.add(str(name))
                    found = cfg.get("attributes") if isinstance(cfg, dict) else None
                    if isinstance(found, dict) and found:
                        table[str(name)] = {str(k): str(v) for k, v in found.items()}
        except (RemotingError, ValueError, AttributeError) as exc:
            log.info("topic attributes of %s unavailable: %s", addr, exc)
        self._attributes[addr] = (now + self.route_refresh_s, now, table, names)
        return table.get(topic, {})

    async def _type_conflict(self, route: TopicRoute, message: Outgoing) -> str | None:
        """Why the topic's ``message.type`` does not take ``message`` (RocketMQ 5's proxy checks
        it; retry and dead-letter topics are not checked), None when it does."""
        if message.topic.startswith(("%RETRY%", "%DLQ%")):
            return None
        attributes: dict[str, str] = {}
        for brokers in route.broker_datas:
            attributes = await self._topic_attributes(brokers.address(), message.topic)
            if attributes:
                break
        return type_conflict(topic_message_type(attributes), message_type_of(message.properties))

    def _is_down(self, broker_name: str) -> bool:
        return self._down.get(broker_name, 0.0) > time.monotonic()

    def mark_down(self, broker_name: str, addr: str) -> None:
        self._down[broker_name] = time.monotonic() + DOWN_S
        self.instance.mark_down(addr, DOWN_S)

    # ------------------------------------------------------------------ sends
    def _choose(self, queues: list[MessageQueue], message: Outgoing, tried: set[str]) -> MessageQueue | None:
        if message.message_group is not None:
            return queues[fifo_queue(message.message_group, len(queues))] if not tried else None
        fresh = [q for q in queues if q.broker_name not in tried]
        if not fresh:
            return None
        up = [q for q in fresh if not self._is_down(q.broker_name)] or fresh
        return up[next(self._turn) % len(up)]

    async def send(self, peer: Connection, message: Outgoing) -> Stored:
        route = await self._route(message.topic)
        if isinstance(route, Outcome):
            return Stored(route)
        if message.check_type:
            conflict = await self._type_conflict(route, message)
            if conflict is not None:
                return Stored(Outcome(Status.MESSAGE_ILLEGAL, conflict), type_conflict=True)
        queues = route.publish_queues(message.topic)
        if not queues:
            return Stored(
                Outcome(Status.NO_PERMISSION, f"no broker takes messages of topic {message.topic} now")
            )
        group = message.producer_group or PRODUCER_GROUP_PREFIX + message.topic
        properties = properties_to_string(message.properties)
        tried: set[str] = set()
        failures: list[str] = []
        last: Stored | None = None
        for _ in range(SEND_ATTEMPTS):
            mq = self._choose(queues, message, tried)
            if mq is None:
                break
            tried.add(mq.broker_name)
            addr = route.addresses().get(mq.broker_name)
            if addr is None:
                continue
            header = {
                "producerGroup": group,
                "topic": message.topic,
                "defaultTopic": DEFAULT_TOPIC,
                "defaultTopicQueueNums": 4,
                "queueId": mq.queue_id,
                "sysFlag": message.sys_flag,
                "bornTimestamp": message.born_timestamp,
                "properties": properties,
            }
            try:
                resp = await self.api.send(addr, header, message.body)
            except RemotingError as exc:
                self.mark_down(mq.broker_name, addr)
                # The route may be stale (a group gone or moved): refresh it for the next sends.
                self.spawn(self.instance.get_route(message.topic, refresh=True))
                failures.append(f"{mq.broker_name} ({addr}): {exc}")
                log.info(
                    "send to %s at %s failed, trying another broker group: %s", mq.broker_name, addr, exc
                )
                continue
            assert resp is not None
            fields = resp.ext_fields or {}
            if resp.code in _STORED:
                return Stored(
                    Outcome(_STORED[resp.code], resp.remark if resp.code else None),
                    fields.get("msgId", ""),
                    int(fields.get("queueOffset", -1)),
                    fields.get("recallHandle", ""),
                )
            last = Stored(Outcome(status_of(resp.code), resp.remark or f"code {resp.code}"))
            if resp.code not in _TRY_ELSEWHERE:
                return last
        if last is not None:
            return last
        raise BackendUnavailable(f"no broker group of topic {message.topic} answered: {'; '.join(failures)}")

    # ------------------------------------------------------------------ transactions
    async def send_many(self, peer: Connection, messages: Sequence[Outgoing]) -> list[Stored]:
        """One by one, in order (each may go to another broker group, with its own retries)."""
        return [await self.send(peer, message) for message in messages]

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
        (host, port), commit_log_offset = decode_message_id(offset_msg_id)
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # where the half message is
        fields = {
            "producerGroup": producer_group,
            "tranStateTableOffset": str(tran_state_offset),
            "commitLogOffset": str(commit_log_offset),
            "commitOrRollback": str(resolution),
            "fromTransactionCheck": "true" if from_check else "false",
            "msgId": message_id,
            "transactionId": message_id,
        }
        request = RemotingCommand.request(RequestCode.END_TRANSACTION, fields)
        try:
            resp = await self.api.invoke(addr, request)
        except RemotingError as exc:
            raise BackendUnavailable(
                f"the broker {addr} holding the transaction is unreachable: {exc}"
            ) from exc
        if resp.code != ResponseCode.SUCCESS:
            return Outcome(status_of(resp.code), resp.remark or f"code {resp.code}")
        return DONE

    def register_producers(self, peer: StreamPeer, client_id: str, groups: Sequence[str]) -> None:
        added = []
        joined = False
        for name in groups:
            group = self.groups.get(name)
            if group is None:
                group = self.groups[name] = ProducerGroup(name)
                self.instance.register_producer(group)
                added.append(name)
            if id(peer) not in group.streams:
                group.streams[id(peer)] = peer
                joined = True
        if joined:  # the stream's end takes it out of its groups
            peer.add_close_callback(self._on_close(client_id, list(groups)))
        # The client is registered with the brokers under its own id (its own heartbeat).
        if self.instance.clients.add_producers(client_id, list(groups)):
            # Learn the topics' brokers and tell them now, not at the next heartbeat.
            self.spawn(self._announce(client_id, list(groups)))

    def _on_close(self, client_id: str, groups: list[str]) -> Callable[[Any], None]:
        def closed(peer: Any) -> None:
            self.unregister_producers(peer, client_id, groups)

        return closed

    async def _announce(self, client_id: str, groups: list[str]) -> None:
        for name in groups:
            for topic in self.groups[name].topics() if name in self.groups else ():
                try:
                    await self.instance.get_route(topic)
                except Exception as exc:
                    log.info("route of %s unavailable: %s", topic, exc)
        await self.instance.clients.heartbeat_of(client_id)

    def unregister_producers(self, peer: StreamPeer, client_id: str, groups: Sequence[str]) -> None:
        for name in groups:
            group = self.groups.get(name)
            if group is None:
                continue
            group.streams.pop(id(peer), None)
            if not group.streams:
                del self.groups[name]
                self.instance.unregister(group)
        self.instance.clients.remove_producers(client_id, list(groups))

    def spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        """Run ``work`` in the background (registrations the client need not wait for)."""

        async def run() -> None:
            try:
                await work
            except Exception as exc:
                log.info("background registration work failed: %s", exc)

        def done(task: asyncio.Task[None]) -> None:
            _BACKGROUND.discard(task)
            work.close()  # cancelled before it started (the proxy stopping): no "never awaited"

        task = asyncio.get_running_loop().create_task(run())
        _BACKGROUND.add(task)
        task.add_done_callback(done)

    # ------------------------------------------------------------------ pulls and offsets
    async def topic_route(self, topic: str) -> TopicRoute | None:
        """The topic's route (cached), None when no NameServer knows it."""
        route = await self._route(topic)
        return None if isinstance(route, Outcome) else route

    async def address_of(self, topic: str, broker_name: str, *, master: bool = False) -> str | None:
        """Where to reach ``broker_name`` for ``topic``: its master, else (for reads) a slave
        while the master does not answer; None when the group serves no such topic."""

        def known() -> str | None:
            if master:
                return self.instance.broker_address(broker_name)
            return self.instance.read_address(broker_name)

        addr = known()
        if addr is None:
            route = await self._route(topic, refresh=True)
            if isinstance(route, Outcome):
                return None
            addr = known()
        return addr

    async def _address(self, topic: str, broker_name: str) -> str | Outcome:
        addr = await self.address_of(topic, broker_name)
        if addr is None:
            return Outcome(Status.TOPIC_NOT_EXIST, f"no broker group {broker_name!r} serves topic {topic}")
        return addr

    async def _call(self, topic: str, broker_name: str, call: Callable[[str], Awaitable[T]]) -> T | Outcome:
        addr = await self._address(topic, broker_name)
        if isinstance(addr, Outcome):
            return addr
        try:
            return await call(addr)
        except BrokerError as exc:
            return refusal(exc)
        except RemotingError as exc:
            self.mark_down(broker_name, addr)
            raise BackendUnavailable(f"broker {broker_name} at {addr} is unreachable: {exc}") from exc

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
        expression_type, expression = subscription
        mq = MessageQueue(topic, broker_name, queue_id)

        async def pull(addr: str) -> Pulled:
            result = await self.api.pull(
                addr,
                group=group,
                mq=mq,
                offset=offset,
                max_nums=batch,
                sys_flag=PULL_FLAG_SUBSCRIPTION | (PULL_FLAG_SUSPEND if wait_ms > 0 else 0),
                commit_offset=0,
                suspend_ms=wait_ms,
                subscription=expression,
                sub_version=0,
                expression_type=expression_type,
                timeout=self.timeout + wait_ms / 1000,
            )
            return Pulled(Outcome(_PULLED[result.status]), result.messages, result.next_begin_offset)

        return await self._call(topic, broker_name, pull)

    async def commit_offset(
        self, group: str, topic: str, broker_name: str, queue_id: int, offset: int
    ) -> Outcome:
        mq = MessageQueue(topic, broker_name, queue_id)

        async def commit(addr: str) -> Outcome:
            await self.api.update_consumer_offset(addr, group, mq, offset)
            return DONE

        return await self._call(topic, broker_name, commit)

    async def committed_offset(self, group: str, topic: str, broker_name: str, queue_id: int) -> int:
        fields = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": str(queue_id),
            "setZeroIfNotFound": "false",  # the committed offset only, as RocketMQ 5's proxy asks
        }

        async def query(addr: str) -> int:
            request = RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, fields)
            resp = await self.api.invoke(addr, request)
            if resp.code != ResponseCode.SUCCESS:
                return -1
            return int((resp.ext_fields or {}).get("offset", -1))

        found = await self._call(topic, broker_name, query)
        return -1 if isinstance(found, Outcome) else found

    async def queue_offset(
        self, topic: str, broker_name: str, queue_id: int, policy: OffsetPolicy, timestamp_ms: int
    ) -> int | Outcome:
        mq = MessageQueue(topic, broker_name, queue_id)
        if policy == "BEGINNING":
            return await self._call(topic, broker_name, lambda addr: self.api.get_min_offset(addr, mq))
        if policy == "END":
            return await self._call(topic, broker_name, lambda addr: self.api.get_max_offset(addr, mq))
        return await self._call(
            topic, broker_name, lambda addr: self.api.search_offset(addr, mq, timestamp_ms)
        )
