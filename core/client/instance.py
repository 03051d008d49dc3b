"""The shared client runtime (RocketMQ's MQClientInstance).

One :class:`ClientInstance` holds the transport client, the topic-route cache (refreshed every
30 s from the NameServers), the broker address table and the heartbeat loop.  Producers and
consumers register with it; by default each creates its own instance, or several may share one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from tidemq import mqjson
from tidemq.client.api import ClientAPI
from tidemq.client.consumer_types import HoldsOffsets, ReportsRunningInfo, SpeaksForClients
from tidemq.client.credentials import SessionCredentials, SigningRemoting, make_credentials
from tidemq.client.diagnostics import version_desc
from tidemq.client.errors import ClientError
from tidemq.client.request_reply import receive_reply
from tidemq.client.route import TopicRoute
from tidemq.errors import CorruptDataError
from tidemq.message import Prop, decode_message, local_ip
from tidemq.plugins import PluginManager, get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import DEFAULT_VERSION, RemotingCommand
from tidemq.transport import Connection

log = logging.getLogger(__name__)

_instance_seq = itertools.count(1)

#: Broker-relayed operator requests (RocketMQ's ClientRemotingProcessor), and those whose header
#: names the group ``group`` rather than ``consumerGroup``.
_OPERATOR_CODES = frozenset(
    {
        RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
        RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT,
        RequestCode.GET_CONSUMER_RUNNING_INFO,
        RequestCode.CONSUME_MESSAGE_DIRECTLY,
    }
)
_GROUP_CODES = frozenset(
    {RequestCode.RESET_CONSUMER_CLIENT_OFFSET, RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT}
)


class Member(Protocol):
    """A producer or consumer registered with an instance."""

    group: str

    def heartbeat_data(self) -> dict[str, Any]: ...

    def topics(self) -> set[str]: ...


def split_namesrv(namesrv: str | Sequence[str]) -> list[str]:
    """``"a:9876;b:9876"`` or a list -> a list of addresses."""
    if isinstance(namesrv, str):
        return [a.strip() for a in namesrv.replace(",", ";").split(";") if a.strip()]
    return [a.strip() for a in namesrv if a.strip()]


async def run_every(
    interval: float, fn: Callable[[], Awaitable[Any]], what: str, first_delay: float | None = None
) -> None:
    """Call ``fn`` every ``interval`` seconds until cancelled; failures are logged, not fatal."""
    await asyncio.sleep(interval if first_delay is None else first_delay)
    while True:
        try:
            await fn()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s failed: %s", what, exc)
        await asyncio.sleep(interval)


class ClientInstance:
    """Routes, broker addresses, heartbeats and server-initiated requests for one client id."""

    def __init__(
        self,
        namesrv: str | Sequence[str],
        *,
        instance_name: str | None = None,
        transport: str = "tcp",
        timeout: float = 3.0,
        route_refresh_s: float = 30.0,
        heartbeat_s: float = 30.0,
        manager: PluginManager | None = None,
        ip: str | None = None,
        credentials: SessionCredentials | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        transport_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.manager = manager or get_plugin_manager()
        #: ACL credentials: when set, every request is signed (RocketMQ's AclClientRPCHook).
        self.credentials = make_credentials(credentials, access_key, secret_key)
        #: Options of the transport plugin (its ``[transport.<name>]`` keys: tls, tls_cafile...).
        self.transport_options = dict(transport_options or {})
        self.ip = ip or local_ip()
        #: Whether the name was chosen by the user (stable across restarts, unlike the pid default).
        self.named = bool(instance_name)
        self.instance_name = instance_name or f"{os.getpid()}#{next(_instance_seq)}"
        self.client_id = f"{self.ip}@{self.instance_name}"
        self.route_refresh_s = route_refresh_s
        self.heartbeat_s = heartbeat_s
        self._namesrv = split_namesrv(namesrv)
        self._transport_name = transport
        self._timeout = timeout
        self.api: ClientAPI | None = None
        self.routes: dict[str, TopicRoute] = {}
        #: broker name -> broker id -> address
        self.broker_addrs: dict[str, dict[int, str]] = {}
        self.producers: dict[str, Member] = {}
        self.consumers: dict[str, Member] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._route_locks: dict[str, asyncio.Lock] = {}
        self._remoting: Any = None
        self._users = 0
        self.started = False
        #: HA read failover (issue 7): broker address -> monotonic time until which it is skipped.
        self._down_until: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Connect the transport and start the route and heartbeat loops (idempotent, counted)."""
        self._users += 1
        if self.started:
            return
        transport = self.manager.create("transport", self._transport_name, options=self.transport_options)
        self._remoting = transport.client(handler=self._handle_server_request)
        if self.credentials is not None:
            self._remoting = SigningRemoting(self._remoting, self.credentials)
        self.api = ClientAPI(self._remoting, self._namesrv, self._timeout)
        self._tasks = [
            asyncio.create_task(run_every(self.route_refresh_s, self.refresh_routes, "route refresh")),
            asyncio.create_task(run_every(self.heartbeat_s, self.send_heartbeats, "heartbeat")),
        ]
        self.started = True
        log.info("client instance %s started (NameServers %s)", self.client_id, ";".join(self._namesrv))

    async def stop(self) -> None:
        """Stop when the last user leaves: cancel loops and close connections."""
        self._users = max(0, self._users - 1)
        if not self.started or self._users > 0:
            return
        self.started = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._remoting is not None:
            await self._remoting.close()
        log.info("client instance %s stopped", self.client_id)

    def require_api(self) -> ClientAPI:
        if self.api is None:
            raise ClientError("client is not started; call 'await start()' first")
        return self.api

    # ------------------------------------------------------------------ members
    def register_producer(self, member: Member) -> None:
        if member.group in self.producers and self.producers[member.group] is not member:
            raise ClientError(
                f"producer group {member.group!r} is already registered in client {self.client_id}"
            )
        self.producers[member.group] = member

    def register_consumer(self, member: Member) -> None:
        if member.group in self.consumers and self.consumers[member.group] is not member:
            raise ClientError(
                f"consumer group {member.group!r} is already registered in client {self.client_id}"
            )
        self.consumers[member.group] = member

    def unregister(self, member: Member) -> None:
        if self.producers.get(member.group) is member:
            del self.producers[member.group]
        if self.consumers.get(member.group) is member:
            del self.consumers[member.group]

    # ------------------------------------------------------------------ routes
    async def get_route(self, topic: str, *, refresh: bool = False) -> TopicRoute | None:
        """The cached route, fetched from the NameServers when missing or when ``refresh``."""
        route = self.routes.get(topic)
        if route is not None and not refresh:
            return route
        lock = self._route_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            if not refresh and topic in self.routes:
                return self.routes[topic]
            route = await self.require_api().get_route(topic)
            if route is None:
                return self.routes.get(topic) if not refresh else None
            self._learn(route)
            return route

    def _learn(self, route: TopicRoute) -> None:
        self.routes[route.topic] = route
        known = set(self.master_addresses())
        for bd in route.broker_datas:
            self.broker_addrs[bd.broker_name] = dict(bd.broker_addrs)
        if set(self.master_addresses()) - known and (self.producers or self.consumers) and self.started:
            # A broker we never told about our groups: heartbeat now, not in up to 30 s.
            task = asyncio.get_running_loop().create_task(self.send_heartbeats())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def refresh_routes(self) -> None:
        topics = set(self.routes)
        for member in [*self.producers.values(), *self.consumers.values()]:
            topics |= member.topics()
        for topic in sorted(topics):
            try:
                await self.get_route(topic, refresh=True)
            except Exception as exc:
                log.warning("route refresh of %s failed: %s", topic, exc)

    def broker_address(self, broker_name: str, prefer_id: int = 0, *, master_only: bool = True) -> str | None:
        addrs = self.broker_addrs.get(broker_name) or {}
        if master_only:
            return addrs.get(0)
        return addrs.get(prefer_id) or addrs.get(0) or next(iter(addrs.values()), None)

    # ---- HA read failover (issue 7) -------------------------------------------------------
    def read_address(self, broker_name: str, prefer_id: int = 0) -> str | None:
        """Where to pull/read a queue of ``broker_name``: the preferred broker id, else the master,
        else a slave; addresses marked down (:meth:`mark_down`) are skipped while others exist."""
        addrs = self.broker_addrs.get(broker_name) or {}
        now = time.monotonic()
        for bid in [prefer_id, *sorted(i for i in addrs if i != prefer_id)]:
            addr = addrs.get(bid)
            if addr and self._down_until.get(addr, 0.0) <= now:
                return addr
        return addrs.get(prefer_id) or addrs.get(0) or next(iter(addrs.values()), None)

    def mark_down(self, addr: str, seconds: float = 10.0) -> None:
        """``addr`` did not answer: read from the broker's other replicas for ``seconds``."""
        self._down_until[addr] = time.monotonic() + seconds

    def master_addresses(self) -> list[str]:
        return sorted({a[0] for a in self.broker_addrs.values() if 0 in a})

    # ------------------------------------------------------------------ heartbeats
    def heartbeat_data(self) -> dict[str, Any]:
        return {
            "clientID": self.client_id,
            "producerDataSet": [{"groupName": g} for g in self.producers],
            "consumerDataSet": [m.heartbeat_data() for m in self.consumers.values()],
        }

    async def send_heartbeats(self) -> None:
        """HEART_BEAT to every master broker the instance knows (RocketMQ's sendHeartbeatToAllBroker)."""
        if not self.producers and not self.consumers:
            return
        data = self.heartbeat_data()
        api = self.require_api()

        async def one(addr: str) -> None:
            try:
                await api.heartbeat(addr, data)
            except Exception as exc:
                log.warning("heartbeat to %s failed: %s", addr, exc)

        # HA (issue 7): consumers also heartbeat to slaves (as RocketMQ does), so a slave can
        # answer consumer-id lookups and serve the group while the master is down.
        addrs = self.all_addresses() if self.consumers else self.master_addresses()
        await asyncio.gather(*(one(a) for a in addrs))

    def all_addresses(self) -> list[str]:
        """Every known broker address, masters and slaves."""
        return sorted({a for addrs in self.broker_addrs.values() for a in addrs.values()})

    async def unregister_everywhere(
        self, producer_group: str = "", consumer_group: str = "", timeout: float = 1.0
    ) -> None:
        """UNREGISTER_CLIENT on every master, in parallel; a dead broker costs at most ``timeout``."""
        api = self.require_api()

        async def one(addr: str) -> None:
            try:
                await asyncio.wait_for(
                    api.unregister_client(addr, self.client_id, producer_group, consumer_group), timeout
                )
            except Exception as exc:
                log.info("unregister from %s failed: %s", addr, exc)

        await asyncio.gather(*(one(a) for a in self.master_addresses()))

    # ------------------------------------------------------------------ broker -> client
    def _check_transaction_state(self, conn: Connection, request: RemotingCommand) -> None:
        """Hand a broker's transaction check to the producer of the message's group (oneway)."""
        try:
            msg = decode_message(request.body or b"")
        except CorruptDataError as exc:
            log.warning("CHECK_TRANSACTION_STATE with an unreadable message: %s", exc)
            return
        group = msg.properties.get(Prop.PRODUCER_GROUP, "")
        producer = self.producers.get(group)
        if producer is None or not hasattr(producer, "check_transaction_state"):
            log.info(
                "CHECK_TRANSACTION_STATE for group %r, which no transactional producer here serves", group
            )
            return
        producer.check_transaction_state(str(conn.remote_address), dict(request.ext_fields or {}), msg)

    async def operator_request(self, request: RemotingCommand) -> RemotingCommand | None:
        """220, 221, 307, 309: an operator's request the broker relays to this client's consumers.
        Answered as rocketmq-client-java answers them; bad input gets SYSTEM_ERROR, never a crash.
        Called by the connection's request dispatch; a subclass that serves other clients' consumers
        (the gRPC proxy's :class:`ProxyInstance`) overrides it and calls this for the rest."""
        fields = request.ext_fields or {}
        code = request.code
        group = fields.get("group" if code in _GROUP_CODES else "consumerGroup", "")
        consumer: Any = self.consumers.get(group)
        try:
            if code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
                table = mqjson.mq_map(mqjson.loads(request.body).get("offsetTable"), "offset")
                table = {mq: int(v) for mq, v in table.items()}
                if consumer is not None and hasattr(consumer, "reset_offset"):
                    await consumer.reset_offset(fields.get("topic", ""), table)
                else:
                    log.info(
                        "RESET_CONSUMER_CLIENT_OFFSET for group %r, which no consumer here serves", group
                    )
                return None if request.is_oneway else request.reply()
            if consumer is None:
                return request.reply(
                    ResponseCode.SYSTEM_ERROR, f"The Consumer Group <{group}> not exist in this consumer"
                )
            if code == RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT:
                # A consumer without an offset table of its own (POP) has nothing to report: an
                # empty table, as RocketMQ's MQClientInstance.getConsumerStatus answers for it.
                topic = fields.get("topic", "")
                status = consumer.consumer_status(topic) if isinstance(consumer, HoldsOffsets) else {}
                body = mqjson.dumps({"consumerTable": {}, "messageQueueTable": status})
                return request.reply(body=body)
            if code == RequestCode.GET_CONSUMER_RUNNING_INFO:
                jstack = str(fields.get("jstackEnable", "")).lower() == "true"
                if isinstance(consumer, SpeaksForClients):  # a member for several clients: the one named
                    client_id = fields.get("clientId", "")
                    own = consumer.running_info_of(client_id, jstack)
                    if own is None:
                        return request.reply(
                            ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online"
                        )
                    return request.reply(body=mqjson.dumps(own))
                if not isinstance(consumer, ReportsRunningInfo):
                    return request.reply(
                        ResponseCode.SYSTEM_ERROR,
                        f"GET_CONSUMER_RUNNING_INFO: the consumer of group <{group}> reports no running info",
                    )
                info = consumer.running_info(jstack)
                info["properties"].update(
                    PROP_NAMESERVER_ADDR="".join(f"{a};" for a in self._namesrv),
                    PROP_CONSUME_TYPE=consumer.heartbeat_data().get("consumeType", ""),
                    PROP_CLIENT_VERSION=version_desc(DEFAULT_VERSION),
                )
                return request.reply(body=mqjson.dumps(info))
            # CONSUME_MESSAGE_DIRECTLY: push consumers only, as in RocketMQ.
            if not hasattr(consumer, "consume_message_directly"):
                return request.reply(
                    ResponseCode.SYSTEM_ERROR, f"The Consumer Group <{group}> not exist in this consumer"
                )
            msg = decode_message(request.body or b"")
            result = await consumer.consume_message_directly(msg, fields.get("brokerName", ""))
            return request.reply(body=mqjson.dumps(result))
        except (mqjson.MQJsonError, CorruptDataError, ValueError, AttributeError) as exc:
            log.warning("%s from the broker could not be served: %s", RequestCode(code).name, exc)
            if request.is_oneway:
                return None
            return request.reply(ResponseCode.SYSTEM_ERROR, f"{RequestCode(code).name}: {exc}")

    async def _handle_server_request(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand | None:
        if request.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            group = (request.ext_fields or {}).get("consumerGroup", "")
            consumer = self.consumers.get(group)
            if consumer is not None and hasattr(consumer, "request_rebalance"):
                log.info("consumer ids of group %s changed; rebalancing", group)
                consumer.request_rebalance()
            return None if request.is_oneway else request.reply()
        if request.code == RequestCode.CHECK_TRANSACTION_STATE:
            self._check_transaction_state(conn, request)
            return None
        if request.code in _OPERATOR_CODES:
            return await self.operator_request(request)
        if request.code == RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT:
            return receive_reply(request)  # a reply to one of this process's requests
        if request.is_oneway:
            return None
        return request.reply(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            remark=f"request code {request.code} not supported by tidemq client",
        )
