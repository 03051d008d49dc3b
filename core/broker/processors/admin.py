"""Operator and client queries (AdminBrokerProcessor): topics, offsets, statistics.

TopicStatsTable and ConsumeStats are keyed by MessageQueue objects, written as fastjson does
(:mod:`tidemq.mqjson`), so that Java's tools read them.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import math
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from tidemq import __version__
from tidemq.broker.clients import ClientChannel
from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import DEFAULT_TOPIC, Header, kv
from tidemq.broker.lanes import lane_counts
from tidemq.broker.processors.answers import answer
from tidemq.broker.services import BrokerServices
from tidemq.broker.services.admin import TopicConsumeStats
from tidemq.broker.services.readable import ReadableQueues
from tidemq.broker.services.status import Outcome
from tidemq.broker.topics import TopicConfig
from tidemq.errors import TidemqError
from tidemq.message import iter_messages
from tidemq.mqjson import dumps as mq_dumps
from tidemq.names import check_stored_topic_name, check_topic_name
from tidemq.perm import PERM_READ, PERM_WRITE
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import DEFAULT_VERSION, RemotingCommand
from tidemq.replication import MasterAware, RoleAware
from tidemq.store import store_introspection
from tidemq.topic_attributes import TopicAttributeError, alter_attributes, parse_modification
from tidemq.transport import Connection


class AdminProcessor:
    def __init__(self, broker: BrokerContext, services: BrokerServices):
        self.broker = broker
        self.admin = services.admin

    # ------------------------------------------------------------------ offsets of queues
    async def max_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "GET_MAX_OFFSET")
        return request.reply(
            ResponseCode.SUCCESS, None, kv(offset=self.admin.max_offset(h.str("topic"), h.int("queueId")))
        )

    async def min_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "GET_MIN_OFFSET")
        return request.reply(
            ResponseCode.SUCCESS, None, kv(offset=self.admin.min_offset(h.str("topic"), h.int("queueId")))
        )

    async def search_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "SEARCH_OFFSET_BY_TIMESTAMP")
        # RocketMQ 5's boundaryType (BoundaryType.getType: "upper" in any case is UPPER, anything
        # else or nothing LOWER); older clients do not send it.
        upper = h.str("boundaryType", "LOWER").lower() == "upper"
        offset = self.admin.offset_by_time(h.str("topic"), h.int("queueId"), h.int("timestamp"), upper)
        return request.reply(ResponseCode.SUCCESS, None, kv(offset=offset))

    async def earliest_store_time(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "GET_EARLIEST_MSG_STORETIME")
        ts = self.admin.earliest_store_time(h.str("topic"), h.int("queueId"))
        return request.reply(ResponseCode.SUCCESS, None, kv(timestamp=ts))

    # ------------------------------------------------------------------ topics
    async def update_topic(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        h = Header(request.ext_fields, "UPDATE_AND_CREATE_TOPIC")
        topic = h.str("topic")
        problem = check_topic_name(topic)
        if problem:
            return request.reply(ResponseCode.SYSTEM_ERROR, problem)
        if topic == b.settings.cluster:
            return request.reply(
                ResponseCode.SYSTEM_ERROR,
                f"the topic[{topic}] is conflict with system reserved words (the cluster name).",
            )
        read, write = h.int("readQueueNums", 16), h.int("writeQueueNums", 16)
        perm = h.int("perm", PERM_READ | PERM_WRITE)
        if read <= 0 or write <= 0 or read > 1024 or write > 1024:
            return request.reply(
                ResponseCode.SYSTEM_ERROR,
                f"queue numbers must be within 1..1024, got read={read} write={write}",
            )
        if perm & ~0xF:
            return request.reply(
                ResponseCode.SYSTEM_ERROR, f"perm {perm} is not a combination of 1, 2, 4 and 8"
            )
        current = b.topics.get(topic)
        try:  # RocketMQ 5's attributes (+message.type=FIFO): applied to the topic's current ones
            attributes = alter_attributes(
                current is None,
                current.attributes if current is not None else {},
                parse_modification(h.str("attributes", "")),
            )
        except TopicAttributeError as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, str(exc))
        cfg = TopicConfig(
            topic,
            read,
            write,
            perm,
            h.str("topicFilterType", "SINGLE_TAG"),
            h.int("topicSysFlag", 0),
            h.bool("order", False),
            attributes,
        )
        b.topics.update(cfg)
        await asyncio.to_thread(b.topics.persist)  # an operator's change is on disk when answered
        await b.registrar.register_all()
        return request.reply(ResponseCode.SUCCESS)

    async def delete_topic(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        topic = Header(request.ext_fields, "DELETE_TOPIC_IN_BROKER").str("topic")
        problem = check_stored_topic_name(topic)
        if problem:  # the name becomes a directory to remove: nothing else may be touched
            return request.reply(ResponseCode.SYSTEM_ERROR, problem)
        if topic == DEFAULT_TOPIC:
            return request.reply(
                ResponseCode.SYSTEM_ERROR, f"the topic[{topic}] is a system topic and cannot be deleted"
            )
        b.topics.delete(topic)
        b.offsets.remove_topic(topic)
        b.stats.remove_topic(topic)
        b.store.delete_topics([topic])
        await asyncio.to_thread(b.topics.persist)
        await b.registrar.register_all()
        return request.reply(ResponseCode.SUCCESS)

    async def all_topic_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(self.broker.topics.serialize()))

    async def all_consumer_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(self.broker.offsets.serialize()))

    # ------------------------------------------------------------------ statistics
    async def runtime_info(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        table = runtime_table(b)
        table.update({k: str(v) for k, v in self.admin.pop_figures().items()})  # POP (issue 39)
        table.update(self.admin.timer_figures())  # RocketMQ 5's timer keys (issue 36)
        table.update(self.admin.flush_figures())  # the flush policy's rounds (flushRounds...)
        for endpoint, figures in b.endpoint_figures.items():  # the gRPC endpoint's counters
            for figure, value in figures().items():
                table[endpoint + "".join(w.capitalize() for w in figure.split("_"))] = str(value)
        table.update(b.dedup.figures())  # the duplicate window (issue 37)
        for figure, count in lane_counts().items():  # the compiled request lanes (issue 38)
            table["lane" + "".join(w.capitalize() for w in figure.split("_"))] = str(count)
        # HA (issue 7): replication plugins may add their state (role, slave lag in bytes).
        if isinstance(b.replication, MasterAware):
            table.update(b.replication.runtime_info())
        if isinstance(b.replication, RoleAware):  # controller mode (issue 25): the epoch served in
            table["controllerEpoch"] = str(b.replication.current_epoch())
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps({"table": table}))

    async def topic_stats(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        topic = Header(request.ext_fields, "GET_TOPIC_STATS_INFO").str("topic")
        stats = self.admin.topic_stats(topic)
        if isinstance(stats, Outcome):
            return answer(request, stats)
        table = {
            mq: {
                "lastUpdateTimestamp": q.last_update_timestamp,
                "maxOffset": q.max_offset,
                "minOffset": q.min_offset,
            }
            for mq, q in stats.items()
        }
        # TopicStatsTable: fastjson's map keyed by the MessageQueue object (see tidemq.mqjson).
        return request.reply(ResponseCode.SUCCESS, body=mq_dumps({"offsetTable": table}))

    async def consume_stats(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "GET_CONSUME_STATS")
        stats = self.admin.consume_stats(h.str("consumerGroup"), h.str("topic", ""))
        table = {mq: offsets for s in stats for mq, offsets in offset_table(s).items()}
        tps = sum(s.tps for s in stats)
        # An unknown group gets an empty table, as from RocketMQ (its tools say "not found").
        return request.reply(
            ResponseCode.SUCCESS,
            body=mq_dumps({"consumeTps": tps, "offsetTable": table}),
        )

    async def consumer_connections(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        group = Header(request.ext_fields, "GET_CONSUMER_CONNECTION_LIST").str("consumerGroup")
        info = self.admin.consumer_group(group)
        if isinstance(info, Outcome):
            return answer(request, info)
        body = {
            "connectionSet": [connection_json(ch) for ch in info.channels.values()],
            "subscriptionTable": {t: s.to_json() for t, s in info.subscriptions.items()},
            "consumeType": info.consume_type,
            "messageModel": info.message_model,
            "consumeFromWhere": info.consume_from_where,
        }
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(body))


# ---------------------------------------------------------------------- shared with monitoring.py
def connection_json(ch: ClientChannel) -> dict[str, Any]:
    """A client connection as RocketMQ's Connection body (language as the enum's name)."""
    return {
        "clientAddr": ch.address,
        "clientId": ch.client_id,
        "language": ch.language or "OTHER",
        "version": ch.version,
    }


def offset_table(stats: TopicConsumeStats) -> dict[MessageQueue, dict[str, int]]:
    """A topic's ConsumeStats offset table as RocketMQ's OffsetWrapper maps (with RocketMQ 5's
    ``pullOffset`` and ``inflightMsgCount`` for a queue the group pops, issue 39)."""
    table: dict[MessageQueue, dict[str, int]] = {}
    for mq, q in stats.queues.items():
        table[mq] = entry = {
            "brokerOffset": q.broker_offset,
            "consumerOffset": q.consumer_offset,
            "lastTimestamp": q.last_timestamp,
        }
        if q.pull_offset is not None:
            entry["pullOffset"] = q.pull_offset
            entry["inflightMsgCount"] = q.inflight_msg_count
    return table


def _human_bytes(n: int) -> str:
    """MixAll.humanReadableByteCount(n, false): ``"12.3 GiB"``."""
    if n < 1024:
        return f"{n} B"
    exp = min(int(math.log(n) / math.log(1024)), 6)
    return f"{n / 1024**exp:.1f} {'KMGTPE'[exp - 1]}iB"


def _disk_ratio(path: Path) -> str:
    """Used fraction of the disk holding ``path`` (UtilAll.getDiskPartitionSpaceUsedPercent), -1 if absent."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return "-1.0"
    return repr((usage.total - usage.free) / usage.total) if usage.total else "-1.0"


def _earliest_message_time(b: BrokerContext) -> int:
    """Store time of the first message of the commit log (getEarliestMessageTime), -1 if none."""
    data = b.store.look_message_by_offset(b.store.get_min_phy_offset())
    if not data:
        return -1
    try:
        return next(iter_messages(data)).store_timestamp
    except (StopIteration, ValueError, TidemqError):
        return -1


def _dispatch_behind(b: BrokerContext) -> int:
    """RocketMQ 5's dispatchBehindBytes: the confirm offset (the commit log's end without a
    bound) minus the dispatched offset (``ReadableQueues.dispatch_behind``)."""
    return ReadableQueues(b).dispatch_behind()


def _unflushed(b: BrokerContext) -> int:
    """Commit-log bytes written but not flushed yet (0 for stores that do not say)."""
    store = store_introspection(b.store)
    return 0 if store is None else max(b.store.get_max_phy_offset() - store.flushed_offset(), 0)


def _package_version() -> str:
    try:
        return importlib.metadata.version("tidemq")
    except importlib.metadata.PackageNotFoundError:
        return __version__


def runtime_table(b: BrokerContext) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO's table with RocketMQ 4.9's keys (prepareRuntimeInfo and the store's).

    tidemq has one event loop where RocketMQ has thread pools: their queue sizes and head wait
    times are 0.  Every key rocketmq-exporter parses is present (it fails on a missing one).
    """
    s = b.stats
    uptime = int(time.time() - s.started_at)
    days, rest = divmod(uptime, 86400)
    put_calls = max(s.broker_put.calls, 1)
    data_dir = Path(b.data_dir)
    commitlog_dir = data_dir / "commitlog"
    table = {
        "brokerVersionDesc": f"tidemq {_package_version()}",
        "brokerVersion": str(DEFAULT_VERSION),
        "brokerName": b.settings.name,
        "brokerAddr": b.address,
        "brokerRole": b.role,
        "bootTimestamp": str(int(s.started_at * 1000)),
        "runtime": f"[ {days} days, {rest // 3600} hours, {rest % 3600 // 60} minutes, {rest % 60} seconds ]",
        "msgPutTotalYesterdayMorning": str(s.put_total_yesterday_morning),
        "msgPutTotalTodayMorning": str(s.put_total_today_morning),
        "msgPutTotalTodayNow": str(s.put_count),
        "msgGetTotalYesterdayMorning": str(s.get_total_yesterday_morning),
        "msgGetTotalTodayMorning": str(s.get_total_today_morning),
        "msgGetTotalTodayNow": str(s.get_count),
        "putMessageTimesTotal": str(put_calls),
        "putMessageSizeTotal": str(s.put_bytes),
        "putMessageAverageSize": repr(s.put_bytes / put_calls),
        "putTps": s.broker_tps(1),
        "getTransferedTps": s.broker_tps(2),
        "getFoundTps": s.broker_tps(3),
        "getMissTps": s.broker_tps(4),
        "getTotalTps": s.broker_tps(3, 4),
        "commitLogMinOffset": str(b.store.get_min_phy_offset()),
        "commitLogMaxOffset": str(b.store.get_max_phy_offset()),
        "commitLogDiskRatio": _disk_ratio(commitlog_dir if commitlog_dir.exists() else data_dir),
        "consumeQueueDiskRatio": _disk_ratio(data_dir),
        "earliestMessageTimeStamp": str(_earliest_message_time(b)),
        "startAcceptSendRequestTimeStamp": "0",
        "dispatchBehindBytes": str(_dispatch_behind(b)),
        "remainHowManyDataToFlush": _human_bytes(_unflushed(b)),
        # Not measured by tidemq (RocketMQ's values when nothing was recorded).
        "putMessageDistributeTime": "null",
        "putMessageEntireTimeMax": "0",
        "getMessageEntireTimeMax": "0",
        "dispatchMaxBuffer": "0",
        "pageCacheLockTimeMills": "0",
        "remainTransientStoreBufferNumbs": str(2**31 - 1),  # no transient store pool
        "topicCount": str(len(b.topics.all())),
        "consumerGroupCount": str(len(b.consumers.groups)),
        "producerGroupCount": str(len(b.producers.groups)),
        "pullRequestsHeld": str(b.hold.waiting if b.hold else 0),
    }
    for pool in ("send", "pull", "query"):
        table[f"{pool}ThreadPoolQueueSize"] = "0"
        table[f"{pool}ThreadPoolQueueCapacity"] = "0"
        table[f"{pool}ThreadPoolQueueHeadWaitTimeMills"] = "0"
    table["EndTransactionQueueSize"] = "0"
    table["EndTransactionThreadPoolQueueCapacity"] = "0"
    try:
        usage = shutil.disk_usage(data_dir)
    except OSError:
        pass
    else:
        table["commitLogDirCapacity"] = (
            f"Total : {_human_bytes(usage.total)}, Free : {_human_bytes(usage.free)}."
        )
    return table


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    p = AdminProcessor(register.context, services)
    register.add(RequestCode.GET_MAX_OFFSET, p.max_offset)
    register.add(RequestCode.GET_MIN_OFFSET, p.min_offset)
    register.add(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, p.search_offset)
    register.add(RequestCode.GET_EARLIEST_MSG_STORETIME, p.earliest_store_time)
    register.add(RequestCode.UPDATE_AND_CREATE_TOPIC, p.update_topic)
    register.add(RequestCode.DELETE_TOPIC_IN_BROKER, p.delete_topic)
    register.add(RequestCode.GET_ALL_TOPIC_CONFIG, p.all_topic_config)
    register.add(RequestCode.GET_ALL_CONSUMER_OFFSET, p.all_consumer_offset)
    register.add(RequestCode.GET_BROKER_RUNTIME_INFO, p.runtime_info)
    register.add(RequestCode.GET_TOPIC_STATS_INFO, p.topic_stats)
    register.add(RequestCode.GET_CONSUME_STATS, p.consume_stats)
    register.add(RequestCode.GET_CONSUMER_CONNECTION_LIST, p.consumer_connections)
