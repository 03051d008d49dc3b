"""Operator and client queries (AdminBrokerProcessor): topics, offsets, statistics.

Deviation from RocketMQ: TopicStatsTable and ConsumeStats are keyed by MessageQueue objects in
Java's fastjson output, which is not valid JSON; tidemq sends the same fields as a list of objects
(``{"topic", "brokerName", "queueId", ...}``).
"""

from __future__ import annotations

import asyncio
import time

import orjson

from tidemq import __version__
from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import DEFAULT_TOPIC, Header, kv
from tidemq.broker.topics import TopicConfig
from tidemq.names import check_stored_topic_name, check_topic_name
from tidemq.perm import PERM_READ, PERM_WRITE
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.replication import MasterAware
from tidemq.transport import Connection


class AdminProcessor:
    def __init__(self, broker: BrokerContext):
        self.broker = broker

    # ------------------------------------------------------------------ offsets of queues
    async def max_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "GET_MAX_OFFSET")
        return request.reply(
            ResponseCode.SUCCESS,
            None,
            kv(offset=self.broker.store.get_max_offset_in_queue(h.str("topic"), h.int("queueId"))),
        )

    async def min_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "GET_MIN_OFFSET")
        return request.reply(
            ResponseCode.SUCCESS,
            None,
            kv(offset=self.broker.store.get_min_offset_in_queue(h.str("topic"), h.int("queueId"))),
        )

    async def search_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "SEARCH_OFFSET_BY_TIMESTAMP")
        offset = self.broker.store.get_offset_by_time(h.str("topic"), h.int("queueId"), h.int("timestamp"))
        return request.reply(ResponseCode.SUCCESS, None, kv(offset=offset))

    async def earliest_store_time(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "GET_EARLIEST_MSG_STORETIME")
        topic, queue_id = h.str("topic"), h.int("queueId")
        store = self.broker.store
        ts = store.get_store_time(topic, queue_id, store.get_min_offset_in_queue(topic, queue_id))
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
        cfg = TopicConfig(
            topic,
            read,
            write,
            perm,
            h.str("topicFilterType", "SINGLE_TAG"),
            h.int("topicSysFlag", 0),
            h.bool("order", False),
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
        b.store.delete_topics([topic])
        await asyncio.to_thread(b.topics.persist)
        await b.registrar.register_all()
        return request.reply(ResponseCode.SUCCESS)

    async def all_topic_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(self.broker.topics.serialize()))

    async def all_consumer_offset(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(self.broker.offsets.serialize()))

    async def all_subscription_groups(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(self.broker.groups.serialize()))

    # ------------------------------------------------------------------ statistics
    async def runtime_info(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        uptime = time.time() - b.stats.started_at
        table = {
            "brokerVersionDesc": f"tidemq {__version__}",
            "brokerVersion": "399",
            "brokerName": b.settings.name,
            "brokerAddr": b.address,
            "brokerRole": b.settings.role,
            "runtime": f"[ {int(uptime // 86400)} days, {int(uptime % 86400 // 3600)} hours, {int(uptime % 3600 // 60)} minutes, {int(uptime % 60)} seconds ]",
            "msgPutTotalTodayNow": str(b.stats.put_count),
            "msgGetTotalTodayNow": str(b.stats.get_count),
            "putTps": f"{b.stats.put_count / max(uptime, 1e-9):.2f}",
            "getTransferedTps": f"{b.stats.get_count / max(uptime, 1e-9):.2f}",
            "commitLogMaxOffset": str(b.store.get_max_phy_offset()),
            "commitLogMinOffset": str(b.store.get_min_phy_offset()),
            "topicCount": str(len(b.topics.all())),
            "consumerGroupCount": str(len(b.consumers.groups)),
            "producerGroupCount": str(len(b.producers.groups)),
            "pullRequestsHeld": str(b.hold.waiting if b.hold else 0),
            "bootTimestamp": str(int(b.stats.started_at * 1000)),
        }
        # HA (issue 7): replication plugins may add their state (role, slave lag in bytes).
        if isinstance(b.replication, MasterAware):
            table.update(b.replication.runtime_info())
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps({"table": table}))

    async def topic_stats(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        topic = Header(request.ext_fields, "GET_TOPIC_STATS_INFO").str("topic")
        cfg = b.topics.get(topic)
        if cfg is None:
            return request.reply(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = b.store
        rows = []
        for qid in range(cfg.write_queue_nums):
            max_off = store.get_max_offset_in_queue(topic, qid)
            min_off = max(store.get_min_offset_in_queue(topic, qid), 0)
            last = store.get_store_time(topic, qid, max_off - 1) if max_off > 0 else 0
            rows.append(
                {
                    "topic": topic,
                    "brokerName": b.settings.name,
                    "queueId": qid,
                    "minOffset": min_off,
                    "maxOffset": max_off,
                    "lastUpdateTimestamp": max(last, 0),
                }
            )
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps({"offsetTable": rows}))

    async def consume_stats(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        h = Header(request.ext_fields, "GET_CONSUME_STATS")
        group = h.str("consumerGroup")
        only = h.str("topic", "")
        topics = {only} if only else b.offsets.topics_of_group(group)
        info = b.consumers.get(group)
        if not only and info is not None:
            topics |= set(info.subscriptions)
        rows = []
        for topic in sorted(topics):
            cfg = b.topics.get(topic)
            if cfg is None:
                continue
            committed = b.offsets.query_all(group, topic)
            for qid in range(cfg.write_queue_nums):
                broker_off = b.store.get_max_offset_in_queue(topic, qid)
                consumer_off = committed.get(qid, -1)
                last = 0
                if consumer_off > 0:
                    last = max(b.store.get_store_time(topic, qid, consumer_off - 1), 0)
                rows.append(
                    {
                        "topic": topic,
                        "brokerName": b.settings.name,
                        "queueId": qid,
                        "brokerOffset": broker_off,
                        "consumerOffset": consumer_off,
                        "lastTimestamp": last,
                    }
                )
        if not rows:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"group {group} consumes no topic on this broker")
        return request.reply(
            ResponseCode.SUCCESS, body=orjson.dumps({"offsetTable": rows, "consumeTps": 0.0})
        )

    async def consumer_connections(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        group = Header(request.ext_fields, "GET_CONSUMER_CONNECTION_LIST").str("consumerGroup")
        info = b.consumers.get(group)
        if info is None:
            return request.reply(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        body = {
            "connectionSet": [
                {
                    "clientId": ch.client_id,
                    "clientAddr": ch.address,
                    "language": ch.language,
                    "version": ch.version,
                }
                for ch in info.channels.values()
            ],
            "subscriptionTable": {t: s.to_json() for t, s in info.subscriptions.items()},
            "consumeType": info.consume_type,
            "messageModel": info.message_model,
            "consumeFromWhere": info.consume_from_where,
        }
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(body))


def register(register: ProcessorRegister) -> None:
    p = AdminProcessor(register.context)
    register.add(RequestCode.GET_MAX_OFFSET, p.max_offset)
    register.add(RequestCode.GET_MIN_OFFSET, p.min_offset)
    register.add(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, p.search_offset)
    register.add(RequestCode.GET_EARLIEST_MSG_STORETIME, p.earliest_store_time)
    register.add(RequestCode.UPDATE_AND_CREATE_TOPIC, p.update_topic)
    register.add(RequestCode.DELETE_TOPIC_IN_BROKER, p.delete_topic)
    register.add(RequestCode.GET_ALL_TOPIC_CONFIG, p.all_topic_config)
    register.add(RequestCode.GET_ALL_CONSUMER_OFFSET, p.all_consumer_offset)
    register.add(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, p.all_subscription_groups)
    register.add(RequestCode.GET_BROKER_RUNTIME_INFO, p.runtime_info)
    register.add(RequestCode.GET_TOPIC_STATS_INFO, p.topic_stats)
    register.add(RequestCode.GET_CONSUME_STATS, p.consume_stats)
    register.add(RequestCode.GET_CONSUMER_CONNECTION_LIST, p.consumer_connections)
