"""The RocketMQ 5 clients behind the proxy, registered with the brokers each under its own client id.

As RocketMQ 5's proxy does, every gRPC client is a client of the brokers: a HEART_BEAT per client
carries its client id, its producer groups and its consumer groups with their subscriptions, and
the command's language and version are the client's (from its Settings' user agent).  So the
brokers' ``consumerConnection``, ``producerConnection``, ``consumerProgress``, console and
metrics list the v5 clients themselves, not one proxy.  A client's registrations end with an
UNREGISTER_CLIENT under its id (NotifyClientTermination, or its Telemetry stream's end).  All of
them travel on the proxy's one connection per broker (the brokers key members by connection and
client id).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import attrs
import orjson

from tidemq.client import ClientInstance, version_desc
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import DEFAULT_VERSION, RemotingCommand
from tidemq_transport_grpc.api import agent_of, language_code

log = logging.getLogger(__name__)

#: How long one UNREGISTER_CLIENT may take, seconds.
_UNREGISTER_S = 1.0


@attrs.define
class ProxyClient:
    """One v5 client as the brokers see it."""

    client_id: str
    language: str = "OTHER"
    version: int = DEFAULT_VERSION
    #: When the proxy first saw it (its running info's PROP_CONSUMER_START_TIMESTAMP).
    started_ms: int = attrs.field(factory=lambda: int(time.time() * 1000))
    producer_groups: set[str] = attrs.field(factory=set)
    #: consumer group -> its heartbeat entry (consumeType, subscriptionDataSet...)
    consumers: dict[str, dict[str, Any]] = attrs.field(factory=dict)

    def heartbeat_data(self) -> dict[str, Any]:
        return {
            "clientID": self.client_id,
            "producerDataSet": [{"groupName": g} for g in sorted(self.producer_groups)],
            "consumerDataSet": list(self.consumers.values()),
        }


class ProxyClients:
    """Every v5 client's registrations, heartbeated to the brokers under its own client id."""

    def __init__(self, instance: ClientInstance) -> None:
        self.instance = instance
        self.clients: dict[str, ProxyClient] = {}
        #: The client's Settings as last answered (set by the server: MessagingService.clients.get),
        #: for its user agent.
        self.settings_of: Callable[[str], Any] = lambda _client_id: None
        self._tasks: set[asyncio.Task[Any]] = set()

    def _client(self, client_id: str) -> ProxyClient:
        client = self.clients.get(client_id)
        if client is None:
            client = self.clients[client_id] = ProxyClient(client_id)
        self._agent(client)
        return client

    def _agent(self, client: ProxyClient) -> None:
        """The client's language and version from its Settings' user agent (once it has some)."""
        settings = self.settings_of(client.client_id)
        if settings is not None and settings.HasField("user_agent"):
            agent = agent_of(settings)
            client.language, client.version = agent.language, agent.version

    # ------------------------------------------------------------------ registrations
    def add_producers(self, client_id: str, groups: list[str]) -> bool:
        """Whether a group is new to the client (the caller tells the brokers now, not at the
        next heartbeat: :meth:`heartbeat_of`)."""
        client = self._client(client_id)
        new = set(groups) - client.producer_groups
        client.producer_groups.update(groups)
        return bool(new)

    def remove_producers(self, client_id: str, groups: list[str]) -> None:
        client = self.clients.get(client_id)
        if client is None:
            return
        for group in groups:
            if group in client.producer_groups:
                client.producer_groups.discard(group)
                self._spawn(self.unregister(client_id, producer_group=group))
        self._forget_if_idle(client)

    def add_consumer(self, client_id: str, language: str, group: str, data: dict[str, Any]) -> bool:
        """Whether the group is new to the client (as :meth:`add_producers`)."""
        client = self._client(client_id)
        if client.language == "OTHER":
            client.language = language_code(language)
        new = group not in client.consumers
        client.consumers[group] = data
        return new

    def running_info(self, client_id: str, group: str) -> dict[str, Any] | None:
        """ConsumerRunningInfo of one v5 client of ``group`` (GET_CONSUMER_RUNNING_INFO a broker
        relays for it), as itself: its version, its subscriptions; None when it is not one of the
        group's clients here.  A v5 client reports no queues (POP); its thread stacks, when asked,
        are added by :meth:`ProxyConsumer.running_info_with_stack`."""
        client = self.clients.get(client_id)
        data = None if client is None else client.consumers.get(group)
        if client is None or data is None:
            return None
        api = self.instance.api
        properties = {
            "consumerGroup": group,
            "messageModel": data.get("messageModel", "CLUSTERING"),
            "clientIP": client_id.split("@", 1)[0],
            "language": client.language,
            "PROP_CONSUMER_START_TIMESTAMP": client.started_ms,
            "PROP_CONSUME_TYPE": data.get("consumeType", "CONSUME_PASSIVELY"),
            "PROP_CLIENT_VERSION": version_desc(client.version),
            "PROP_NAMESERVER_ADDR": "".join(f"{a};" for a in (api.namesrv if api is not None else [])),
        }
        return {
            "mqTable": {},
            "properties": {k: str(v) for k, v in sorted(properties.items())},
            "statusTable": {},
            "subscriptionSet": sorted(
                data.get("subscriptionDataSet") or [], key=lambda s: str(s.get("topic"))
            ),
        }

    def remove_consumer(self, client_id: str, group: str) -> None:
        client = self.clients.get(client_id)
        if client is None or client.consumers.pop(group, None) is None:
            return
        self._spawn(self.unregister(client_id, consumer_group=group))
        self._forget_if_idle(client)

    def _forget_if_idle(self, client: ProxyClient) -> None:
        if not client.producer_groups and not client.consumers:
            self.clients.pop(client.client_id, None)

    # ------------------------------------------------------------------ to the brokers
    async def send_heartbeats(self) -> None:
        """Every client's HEART_BEAT to the brokers (the proxy's heartbeat loop, every heartbeat_s)."""
        await asyncio.gather(*(self.heartbeat(c) for c in list(self.clients.values())))

    async def heartbeat_of(self, client_id: str) -> None:
        client = self.clients.get(client_id)
        if client is not None:
            await self.heartbeat(client)

    async def heartbeat(self, client: ProxyClient) -> None:
        """``client``'s HEART_BEAT to every master (and, for a consumer, every slave: as the
        clients do, so a slave can serve the group while its master is down)."""
        api = self.instance.api
        if api is None:
            return
        self._agent(client)
        body = orjson.dumps(client.heartbeat_data())
        addrs = self.instance.all_addresses() if client.consumers else self.instance.master_addresses()

        async def one(addr: str) -> None:
            request = RemotingCommand.request(RequestCode.HEART_BEAT, {}, body)
            request.language, request.version = client.language, client.version
            try:
                response = await api.invoke(addr, request)
            except Exception as exc:
                log.info("heartbeat of client %s to %s failed: %s", client.client_id, addr, exc)
                return
            if response.code != ResponseCode.SUCCESS:
                log.warning(
                    "heartbeat of client %s refused by %s: %s", client.client_id, addr, response.remark
                )

        await asyncio.gather(*(one(a) for a in addrs))

    async def unregister(self, client_id: str, producer_group: str = "", consumer_group: str = "") -> None:
        """UNREGISTER_CLIENT of ``client_id`` on every broker, in parallel."""
        api = self.instance.api
        if api is None:
            return

        async def one(addr: str) -> None:
            try:
                await asyncio.wait_for(
                    api.unregister_client(addr, client_id, producer_group, consumer_group), _UNREGISTER_S
                )
            except Exception as exc:
                log.info("unregister of client %s from %s failed: %s", client_id, addr, exc)

        await asyncio.gather(*(one(a) for a in self.instance.all_addresses()))

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class ProxyInstance(ClientInstance):
    """The proxy's client of the brokers: its heartbeats are its v5 clients' (:class:`ProxyClients`),
    each under the client's own id; routes, connections and transaction checks as any client's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clients = ProxyClients(self)

    async def send_heartbeats(self) -> None:
        await self.clients.send_heartbeats()

    async def operator_request(self, request: RemotingCommand) -> RemotingCommand | None:
        # CONSUME_MESSAGE_DIRECTLY names one v5 client: its group's ProxyConsumer hands it to that
        # client's Telemetry stream (VerifyMessageCommand), as RocketMQ 5's proxy does.
        # GET_CONSUMER_RUNNING_INFO with jstackEnable: the client's stacks from its stream
        # (PrintThreadStackTraceCommand), added to what the proxy knows of it.
        fields = request.ext_fields or {}
        consumer = self.consumers.get(fields.get("consumerGroup", ""))
        if request.code == RequestCode.CONSUME_MESSAGE_DIRECTLY:
            directly = getattr(consumer, "consume_directly_of", None)
            if directly is not None:
                answer: RemotingCommand = await directly(fields.get("clientId", ""), request)
                return answer
        if (
            request.code == RequestCode.GET_CONSUMER_RUNNING_INFO
            and str(fields.get("jstackEnable", "")).lower() == "true"
        ):
            with_stack = getattr(consumer, "running_info_with_stack", None)
            if with_stack is not None:
                stacked: RemotingCommand = await with_stack(fields.get("clientId", ""), request)
                return stacked
        return await super().operator_request(request)
