"""What the console shows and does, as requests to the cluster (RocketMQ's MQAdminExt calls).

Every page is built from these coroutines; each speaks the RocketMQ 4.x admin protocol through
:class:`tidemq.client.admin.AdminClient`, so the console works against RocketMQ brokers too.
Bodies keyed by MessageQueue (fastjson's form) are read with :mod:`tidemq.mqjson`.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from tidemq.client import AdminClient, AdminError, topic_fields
from tidemq.message import MessageExt, decode_message_id, iter_messages
from tidemq.mqjson import loads as mq_loads
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.trace import DEFAULT_TRACE_TOPIC
from tidemq.trace.view import MessageTrace, NoTraceTopicError, query_trace

#: Topics RocketMQ creates for itself (hidden unless asked for).
SYSTEM_PREFIXES = ("%RETRY%", "%DLQ%", "rmq_sys_", "RMQ_SYS_", "SCHEDULE_TOPIC", "TBW102", "BenchmarkTest", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC")  # fmt: skip
#: The console's own consumer group name when it reads messages (never commits offsets).
TOOLS_GROUP = "TOOLS_CONSUMER"


def is_system_topic(topic: str, clusters: set[str], brokers: set[str]) -> bool:
    return topic.startswith(SYSTEM_PREFIXES) or topic in clusters or topic in brokers


@attrs.frozen
class BrokerRow:
    cluster: str
    name: str
    broker_id: int
    address: str
    info: dict[str, str]

    def get(self, key: str, default: str = "-") -> str:
        return self.info.get(key, default)


@attrs.frozen
class QueueRow:
    broker: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update: int


@attrs.frozen
class GroupQueueRow:
    topic: str
    broker: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    last_timestamp: int
    #: POP groups (RocketMQ 5): the queue's pop offset (-1: not popped) and its popped, unacknowledged messages.
    pop_offset: int = -1
    in_flight: int = 0

    @property
    def lag(self) -> int:
        return max(0, self.broker_offset - self.consumer_offset)


def _mq(key: Any) -> MessageQueue | None:
    if isinstance(key, MessageQueue):
        return key
    if isinstance(key, dict):
        return MessageQueue(
            str(key.get("topic", "")), str(key.get("brokerName", "")), int(key.get("queueId", 0))
        )
    return None


def _offset_entries(table: Any) -> list[tuple[MessageQueue, dict[str, Any]]]:
    """``offsetTable`` in RocketMQ's map form, or the list form older tidemq brokers sent."""
    out: list[tuple[MessageQueue, dict[str, Any]]] = []
    if isinstance(table, dict):
        for key, value in table.items():
            mq = _mq(key)
            if mq is not None and isinstance(value, dict):
                out.append((mq, value))
    elif isinstance(table, list):
        for entry in table:
            if isinstance(entry, dict):
                mq = _mq(entry.get("messageQueue") or entry.get("mq"))
                if mq is not None:
                    out.append((mq, entry))
    return out


class ClusterOps:
    """The console's view of one cluster, through its NameServers."""

    def __init__(self, client: AdminClient) -> None:
        self.client = client

    # ------------------------------------------------------------------ cluster
    async def brokers(self) -> list[BrokerRow]:
        info = await self.client.cluster_info()
        clusters = info.get("clusterAddrTable") or {}
        cluster_of = {name: c for c, names in clusters.items() for name in names or []}
        rows = []
        for name, bd in sorted((info.get("brokerAddrTable") or {}).items()):
            for bid, addr in sorted(((int(k), v) for k, v in (bd.get("brokerAddrs") or {}).items())):
                try:
                    resp = await self.client.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
                    table = mq_loads(resp.body or b"{}").get("table") or {}
                except AdminError as exc:
                    table = {"error": str(exc)}
                rows.append(BrokerRow(cluster_of.get(name, bd.get("cluster", "")), name, bid, addr, table))
        return rows

    async def producers(self, brokers: list[BrokerRow]) -> list[dict[str, Any]]:
        """The producers connected to the masters (GET_ALL_PRODUCER_INFO), 4.x and RocketMQ 5
        (gRPC, language ``GRPC``, group ``GRPC_PRODUCER_<topic>``) alike: one row per connection."""
        rows = []
        for b in brokers:
            if b.broker_id != 0 or "error" in b.info:
                continue
            try:
                resp = await self.client.call(b.address, RequestCode.GET_ALL_PRODUCER_INFO)
                table = mq_loads(resp.body or b"{}").get("data") or {}
            except AdminError:
                continue  # an account without admin rights: the page shows none
            for group, infos in sorted(table.items()):
                for info in infos if isinstance(infos, list) else []:
                    rows.append({"broker": b.name, "group": group, **info})
        return rows

    async def names(self) -> tuple[set[str], set[str]]:
        info = await self.client.cluster_info()
        return set(info.get("clusterAddrTable") or {}), set(info.get("brokerAddrTable") or {})

    # ------------------------------------------------------------------ topics
    async def topics(self, include_system: bool = False) -> list[str]:
        resp = await self.client.namesrv_call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        topics = sorted(mq_loads(resp.body or b"{}").get("topicList") or [])
        if include_system:
            return topics
        clusters, brokers = await self.names()
        return [t for t in topics if not is_system_topic(t, clusters, brokers)]

    async def topic_queues(self, topic: str) -> list[QueueRow]:
        route = await self.client.route(topic)
        rows = []
        for addr in route.addresses().values():
            resp = await self.client.call(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
            for mq, off in _offset_entries(mq_loads(resp.body or b"{}").get("offsetTable")):
                rows.append(
                    QueueRow(
                        mq.broker_name,
                        mq.queue_id,
                        int(off.get("minOffset", 0)),
                        int(off.get("maxOffset", 0)),
                        int(off.get("lastUpdateTimestamp", 0)),
                    )
                )
        return sorted(rows, key=lambda r: (r.broker, r.queue_id))

    async def scheduled(self) -> dict[str, dict[str, int]]:
        """Timer messages waiting, topic -> {broker name: count}, from each master's
        GET_TIMER_METRICS (RocketMQ 5; a broker without a timer or not answering is left out)."""
        out: dict[str, dict[str, int]] = {}
        for name, addr in sorted((await self.client.masters()).items()):
            try:
                counts = await self.client.timer_metrics(addr)
            except AdminError:
                continue
            for topic, n in (counts or {}).items():
                out.setdefault(topic, {})[name] = n
        return out

    async def create_topic(self, topic: str, queues: int, perm: int) -> list[str]:
        """UPDATE_AND_CREATE_TOPIC on every master; returns the brokers it went to."""
        masters = await self.client.masters()
        if not masters:
            raise AdminError("no master broker is registered with the NameServer")
        for addr in masters.values():
            await self.client.call(
                addr,
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                topic_fields(topic, queues, queues, perm),
            )
        return sorted(masters)

    async def delete_topic(self, topic: str) -> None:
        for addr in (await self.client.masters()).values():
            await self.client.call(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        await self.client.namesrv_call(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic})

    # ------------------------------------------------------------------ consumer groups
    async def groups(self) -> list[str]:
        names: set[str] = set()
        for addr in (await self.client.masters()).values():
            resp = await self.client.call(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
            names.update((mq_loads(resp.body or b"{}").get("subscriptionGroupTable") or {}).keys())
        return sorted(n for n in names if not n.startswith(("CID_RMQ_SYS_", "TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_", "CID_ONS", "CID_ONSAPI")))  # fmt: skip

    async def group_queues(self, group: str) -> tuple[list[GroupQueueRow], float]:
        rows: list[GroupQueueRow] = []
        tps = 0.0
        for addr in (await self.client.masters()).values():
            resp = await self.client.call(addr, RequestCode.GET_CONSUME_STATS, {"consumerGroup": group})
            body = mq_loads(resp.body or b"{}")
            tps += float(body.get("consumeTps") or 0)
            for mq, off in _offset_entries(body.get("offsetTable")):
                rows.append(
                    GroupQueueRow(
                        mq.topic,
                        mq.broker_name,
                        mq.queue_id,
                        int(off.get("brokerOffset", 0)),
                        int(off.get("consumerOffset", 0)),
                        int(off.get("lastTimestamp", 0)),
                        int(off["pullOffset"]) if off.get("pullOffset") is not None else -1,
                        int(off.get("inflightMsgCount") or 0),
                    )
                )
        return sorted(rows, key=lambda r: (r.topic, r.broker, r.queue_id)), tps

    async def group_clients(self, group: str) -> dict[str, Any]:
        """GET_CONSUMER_CONNECTION_LIST from the first master that knows the group online."""
        for addr in (await self.client.masters()).values():
            resp = await self.client.call(
                addr,
                RequestCode.GET_CONSUMER_CONNECTION_LIST,
                {"consumerGroup": group},
                ok=(ResponseCode.SUCCESS, ResponseCode.CONSUMER_NOT_ONLINE),
            )
            if resp.code == ResponseCode.SUCCESS:
                return mq_loads(resp.body or b"{}")
        return {}

    async def reset_offset(self, group: str, topic: str, timestamp_ms: int) -> int:
        """Move ``group`` on ``topic`` to the first message stored at or after ``timestamp_ms``.

        INVOKE_BROKER_TO_RESET_OFFSET when the group's clients are online (they reset themselves);
        when none is, every queue's committed offset is set directly (mqadmin's fallback).
        Returns how many queues moved.
        """
        moved = 0
        route = await self.client.route(topic)
        for addr in route.addresses().values():
            resp = await self.client.call(
                addr,
                RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                {"topic": topic, "group": group, "timestamp": timestamp_ms, "isForce": True},
                ok=(
                    ResponseCode.SUCCESS,
                    ResponseCode.CONSUMER_NOT_ONLINE,
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                ),
            )
            if resp.code == ResponseCode.SUCCESS:
                table = mq_loads(resp.body or b"{}").get("offsetTable") or {}
                moved += len(table)
                continue
            # Offline group (or an older broker): write each queue's offset ourselves.
            resp = await self.client.call(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
            for mq, _ in _offset_entries(mq_loads(resp.body or b"{}").get("offsetTable")):
                found = await self.client.call(
                    addr,
                    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                    {"topic": topic, "queueId": mq.queue_id, "timestamp": timestamp_ms},
                )
                offset = int((found.ext_fields or {}).get("offset", 0))
                await self.client.call(
                    addr,
                    RequestCode.UPDATE_CONSUMER_OFFSET,
                    {"consumerGroup": group, "topic": topic, "queueId": mq.queue_id, "commitOffset": offset},
                )
                moved += 1
        return moved

    # ------------------------------------------------------------------ messages
    async def by_key(self, topic: str, key: str) -> list[MessageExt]:
        return await self.client.query_messages(topic, key)

    async def by_id(self, msg_id: str, topic: str = "") -> MessageExt | None:
        try:
            (host, port), offset = decode_message_id(msg_id)
        except ValueError:
            if not topic:
                raise AdminError(f"{msg_id!r} is a producer's unique id: give its topic too") from None
            found = [
                m
                for m in await self.client.query_messages(topic, msg_id, unique=True)
                if m.uniq_key == msg_id
            ]
            return found[0] if found else None
        addr = f"{host}:{port}"
        resp = await self.client.call(
            addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset}, ok=(0, ResponseCode.SYSTEM_ERROR)
        )
        if resp.code != ResponseCode.SUCCESS:
            return None
        msgs = list(iter_messages(resp.payload()))
        return msgs[0] if msgs else None

    async def by_time(self, topic: str, begin_ms: int, end_ms: int, limit: int = 64) -> list[MessageExt]:
        """Messages stored in ``[begin_ms, end_ms]``, oldest first per queue, at most ``limit``."""
        out: list[MessageExt] = []
        route = await self.client.route(topic)
        for addr in route.addresses().values():
            resp = await self.client.call(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
            for mq, off in _offset_entries(mq_loads(resp.body or b"{}").get("offsetTable")):
                found = await self.client.call(
                    addr,
                    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                    {"topic": topic, "queueId": mq.queue_id, "timestamp": begin_ms},
                )
                offset = int((found.ext_fields or {}).get("offset", 0))
                top = int(off.get("maxOffset", 0))
                while offset < top and len(out) < limit:
                    batch = await self._pull(addr, topic, mq.queue_id, offset, min(32, limit - len(out)))
                    if not batch:
                        break
                    for m in batch:
                        if m.store_timestamp > end_ms:
                            offset = top
                            break
                        if m.store_timestamp >= begin_ms:
                            out.append(m)
                    else:
                        offset = batch[-1].queue_offset + 1
        return sorted(out, key=lambda m: m.store_timestamp)[:limit]

    async def _pull(self, addr: str, topic: str, queue_id: int, offset: int, count: int) -> list[MessageExt]:
        resp = await self.client.call(
            addr,
            RequestCode.PULL_MESSAGE,
            {
                "consumerGroup": TOOLS_GROUP,
                "topic": topic,
                "queueId": queue_id,
                "queueOffset": offset,
                "maxMsgNums": count,
                "sysFlag": 4,  # subscription given here; no commit
                "commitOffset": 0,
                "suspendTimeoutMillis": 0,
                "subscription": "*",
                "subVersion": 0,
                "expressionType": "TAG",
            },
            ok=(
                ResponseCode.SUCCESS,
                ResponseCode.PULL_NOT_FOUND,
                ResponseCode.PULL_OFFSET_MOVED,
                ResponseCode.PULL_RETRY_IMMEDIATELY,
            ),  # fmt: skip
        )
        if resp.code != ResponseCode.SUCCESS:
            return []
        return list(iter_messages(resp.payload()))

    async def trace(self, msg_id: str, trace_topic: str = "") -> MessageTrace | None:
        """The message's trace (mqadmin queryMsgTraceById's view); None: no such trace topic."""
        try:
            return await query_trace(self.client, msg_id, trace_topic or DEFAULT_TRACE_TOPIC)
        except NoTraceTopicError:
            return None

    # ------------------------------------------------------------------ live figures
    async def live(self, also_group: str = "") -> dict[str, Any]:
        """Put/get TPS per broker and lag per group (and ``also_group``'s), for the console's charts."""
        brokers = {}
        for row in await self.brokers():
            if row.broker_id != 0:
                continue
            brokers[row.name] = {
                "put_tps": _first_float(row.get("putTps", "0")),
                "get_tps": _first_float(row.get("getTransferedTps", "0")),
            }
        lags = {}
        groups = await self.groups()
        if also_group and also_group not in groups:
            groups.append(also_group)
        for group in groups:
            rows, _ = await self.group_queues(group)
            lags[group] = sum(r.lag for r in rows)
        return {"time": int(time.time() * 1000), "brokers": brokers, "lag": lags}


def _first_float(text: str) -> float:
    try:
        return float(str(text).split()[0])
    except (ValueError, IndexError):
        return 0.0
