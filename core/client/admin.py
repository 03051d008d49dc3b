"""Admin requests to NameServers and brokers (the RPC side of RocketMQ's MQAdminExt).

:class:`AdminClient` sends one request at a time, signed when credentials are given, and turns a
refusal into an :class:`AdminError` naming the server and its answer.  The ``tidemq admin``
commands (:mod:`tidemq.admin`) are built on it; scripts and benchmarks use it directly.

    client = AdminClient("127.0.0.1:9876")
    try:
        masters = await client.masters()  # broker name -> master address
        route = await client.route("TopicA")
    finally:
        await client.close()
"""

from __future__ import annotations

import time
from typing import Any

from tidemq.client.credentials import SessionCredentials
from tidemq.client.instance import split_namesrv
from tidemq.client.route import TopicRoute, loads_lenient
from tidemq.errors import TidemqError
from tidemq.message import MessageExt, iter_messages
from tidemq.queues import BoundaryType
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

TIMEOUT_S = 5.0

__all__ = ["TIMEOUT_S", "AdminClient", "AdminError", "NoRouteError", "topic_fields"]


def topic_fields(
    topic: str,
    read_queues: int,
    write_queues: int,
    perm: int,
    sys_flag: int = 0,
    order: bool = False,
    attributes: str = "",
) -> dict[str, Any]:
    """UPDATE_AND_CREATE_TOPIC's header as mqadmin sends it (the TopicConfig's fields; RocketMQ
    5's ``attributes`` modification, ``+message.type=FIFO``, when given)."""
    fields: dict[str, Any] = {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": read_queues,
        "writeQueueNums": write_queues,
        "perm": perm,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": sys_flag,
        "order": order,
    }
    if attributes:
        fields["attributes"] = attributes
    return fields


class AdminError(TidemqError):
    """An admin request failed; the message names the server and its answer."""


class NoRouteError(AdminError):
    """The NameServers know no route for the topic (it does not exist, or no broker serves it)."""


class AdminClient:
    """Requests to NameServers and brokers for the admin commands."""

    def __init__(
        self,
        namesrv: str,
        timeout: float = TIMEOUT_S,
        credentials: SessionCredentials | None = None,
        transport_options: dict[str, Any] | None = None,
    ):
        from tidemq.plugins import get_plugin_manager

        #: Sign every request for brokers with ACL.
        self.credentials = credentials

        self.namesrv = split_namesrv(namesrv)
        if not self.namesrv:
            raise AdminError("no NameServer address given (-n host:port)")
        self.timeout = timeout
        # transport_options: the tcp transport's keys (tls, tls_cafile...) for TLS clusters.
        self.remoting = get_plugin_manager().create("transport", "tcp", options=transport_options).client()

    async def close(self) -> None:
        await self.remoting.close()

    async def call(
        self,
        addr: str,
        code: int,
        fields: dict[str, Any] | None = None,
        body: bytes | None = None,
        ok: tuple[int, ...] = (0,),
    ) -> RemotingCommand:
        req = RemotingCommand.request(code, fields or {}, body)
        if self.credentials is not None:
            self.credentials.sign(req)
        try:
            resp = await self.remoting.invoke(addr, req, self.timeout)
        except Exception as exc:
            raise AdminError(f"{addr} did not answer {RequestCode(code).name}: {exc}") from exc
        if resp.code not in ok:
            raise AdminError(
                f"{addr} answered {RequestCode(code).name} with code {_code_name(resp.code)}: {resp.remark or ''}"
            )
        return resp

    async def namesrv_call(
        self, code: int, fields: dict[str, Any] | None = None, ok: tuple[int, ...] = (0,)
    ) -> RemotingCommand:
        last: Exception | None = None
        for addr in self.namesrv:
            try:
                return await self.call(addr, code, fields, ok=ok)
            except AdminError as exc:
                last = exc
        raise AdminError(str(last))

    async def route(self, topic: str) -> TopicRoute:
        resp = await self.namesrv_call(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, ok=(0, ResponseCode.TOPIC_NOT_EXIST)
        )
        if resp.code == ResponseCode.TOPIC_NOT_EXIST or not resp.body:
            raise NoRouteError(f"no route for topic {topic!r}: {resp.remark or 'the topic does not exist'}")
        return TopicRoute.from_json(topic, resp.body)

    async def cluster_info(self) -> dict[str, Any]:
        resp = await self.namesrv_call(RequestCode.GET_BROKER_CLUSTER_INFO)
        return loads_lenient(resp.body or b"{}")

    async def broker_addresses(self) -> set[str]:
        """Every broker address (masters and slaves) the NameServers know."""
        info = await self.cluster_info()
        return {
            str(addr)
            for bd in (info.get("brokerAddrTable") or {}).values()
            for addr in (bd.get("brokerAddrs") or {}).values()
        }

    async def masters(self, cluster: str | None = None) -> dict[str, str]:
        """broker name -> master address, of one cluster or all."""
        info = await self.cluster_info()
        names: set[str] | None = None
        if cluster:
            names = set((info.get("clusterAddrTable") or {}).get(cluster) or [])
            if not names:
                raise AdminError(f"cluster {cluster!r} is unknown to the NameServer")
        out = {}
        for name, bd in (info.get("brokerAddrTable") or {}).items():
            addrs = {int(k): v for k, v in (bd.get("brokerAddrs") or {}).items()}
            if 0 in addrs and (names is None or name in names):
                out[name] = addrs[0]
        return out

    async def search_offset(
        self,
        addr: str,
        topic: str,
        queue_id: int,
        timestamp_ms: int,
        boundary_type: BoundaryType = BoundaryType.LOWER,
    ) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP on the broker at ``addr`` (DefaultMQAdminExt.searchOffset):
        the offset of the queue at ``timestamp_ms``; of several messages stored at that time the
        first (LOWER, the default) or the last (UPPER)."""
        fields = {
            "topic": topic,
            "queueId": str(queue_id),
            "timestamp": str(timestamp_ms),
            "boundaryType": BoundaryType(boundary_type).value,
        }
        resp = await self.call(addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, fields)
        try:
            return int(resp.ext_fields["offset"])
        except (KeyError, ValueError):
            raise AdminError(f"{addr} answered SEARCH_OFFSET_BY_TIMESTAMP without an offset") from None

    async def timer_metrics(self, addr: str) -> dict[str, int] | None:
        """GET_TIMER_METRICS (RocketMQ 5): timer messages waiting per topic on one broker; None
        when the broker has no timer (a RocketMQ 4.x broker answers REQUEST_CODE_NOT_SUPPORTED)."""
        resp = await self.call(
            addr, RequestCode.GET_TIMER_METRICS, ok=(0, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
        )
        if resp.code != ResponseCode.SUCCESS:
            return None
        table = loads_lenient(resp.body or b"{}").get("timingCount") or {}
        return {str(topic): int((entry or {}).get("count", 0)) for topic, entry in table.items()}

    async def query_messages(self, topic: str, key: str, unique: bool = False) -> list[MessageExt]:
        """QUERY_MESSAGE on every broker of ``topic``: messages with ``key`` (or that unique id)."""
        route = await self.route(topic)
        out: list[MessageExt] = []
        fields = {
            "topic": topic,
            "key": key,
            "maxNum": 64,
            "beginTimestamp": 0,
            "endTimestamp": int(time.time() * 1000) + 60_000,
        }
        if unique:
            fields["_UNIQUE_KEY_QUERY"] = True
        for addr in route.addresses().values():
            resp = await self.call(
                addr, RequestCode.QUERY_MESSAGE, fields, ok=(0, ResponseCode.QUERY_NOT_FOUND)
            )
            if resp.code == ResponseCode.SUCCESS:
                out.extend(iter_messages(resp.payload()))
        return out


def _code_name(code: int) -> str:
    try:
        return f"{ResponseCode(code).name}({code})"
    except ValueError:
        return str(code)
