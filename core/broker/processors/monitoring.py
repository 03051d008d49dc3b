"""Broker statistics for monitoring tools: 315, 317, 300, 204, 328.

Bodies as RocketMQ 4.9's AdminBrokerProcessor sends them: BrokerStatsData, ConsumeStatsList,
GroupList, ProducerConnection and ProducerTableInfo (fastjson field names; MessageQueue-keyed
maps through :mod:`tidemq.mqjson`).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from tidemq.broker.clients import ClientChannel
from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import Header
from tidemq.broker.processors.admin import connection_json, offset_table
from tidemq.broker.processors.answers import answer
from tidemq.broker.services import BrokerServices
from tidemq.broker.services.status import Outcome
from tidemq.mqjson import dumps as mq_dumps
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection


def _wall_ms(monotonic_s: float) -> int:
    """A ``time.monotonic()`` instant as a wall-clock ms timestamp."""
    return int((time.time() - (time.monotonic() - monotonic_s)) * 1000)


def producer_info(ch: ClientChannel) -> dict[str, Any]:
    """ProducerInfo: one producer connection with its last heartbeat."""
    return {
        "clientId": ch.client_id,
        "language": ch.language or "OTHER",
        "lastUpdateTimestamp": _wall_ms(ch.last_update),
        "remoteIP": ch.address,
        "version": ch.version,
    }


class MonitoringProcessor:
    def __init__(self, broker: BrokerContext, services: BrokerServices):
        self.broker = broker
        self.admin = services.admin

    async def view_stats(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """VIEW_BROKER_STATS_DATA: minute, hour and day figures of one stats item."""
        h = Header(request.ext_fields, "VIEW_BROKER_STATS_DATA")
        name, key = h.str("statsName"), h.str("statsKey")
        snaps = self.admin.stats_snapshots(name, key)
        if isinstance(snaps, Outcome):
            return answer(request, snaps)
        body = {
            "statsDay": snaps["day"].to_json(),
            "statsHour": snaps["hour"].to_json(),
            "statsMinute": snaps["minute"].to_json(),
        }
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(body))

    async def broker_consume_stats(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """GET_BROKER_CONSUME_STATS: every subscription group's ConsumeStats per topic."""
        h = Header(request.ext_fields, "GET_BROKER_CONSUME_STATS")
        per_group = []
        total_diff = 0
        for group, stats in self.admin.broker_consume_stats(h.bool("isOrder", False)):
            per_group.append({group: [{"consumeTps": s.tps, "offsetTable": offset_table(s)} for s in stats]})
            total_diff += sum(s.diff for s in stats)
        body = {"brokerAddr": self.broker.address, "consumeStatsList": per_group, "totalDiff": total_diff}
        return request.reply(ResponseCode.SUCCESS, body=mq_dumps(body))

    async def topic_consume_by_who(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """QUERY_TOPIC_CONSUME_BY_WHO: groups subscribed to the topic, or with offsets in it."""
        topic = Header(request.ext_fields, "QUERY_TOPIC_CONSUME_BY_WHO").str("topic")
        return request.reply(
            ResponseCode.SUCCESS, body=orjson.dumps({"groupList": self.admin.topic_consumed_by(topic)})
        )

    async def producer_connections(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """GET_PRODUCER_CONNECTION_LIST: the connections of one producer group."""
        group = Header(request.ext_fields, "GET_PRODUCER_CONNECTION_LIST").str("producerGroup")
        channels = self.admin.producer_group(group)
        if isinstance(channels, Outcome):
            return answer(request, channels)
        body = {"connectionSet": [connection_json(ch) for ch in channels]}
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(body))

    async def all_producers(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """GET_ALL_PRODUCER_INFO (4.9.4): every producer group's connections."""
        table = self.admin.producers()
        body = {"data": {group: [producer_info(ch) for ch in chs] for group, chs in sorted(table.items())}}
        return request.reply(ResponseCode.SUCCESS, body=orjson.dumps(body))


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    """Add this module's handlers."""
    broker = register.context
    # BROKER_PUT_NUMS / BROKER_GET_NUMS are keyed by the cluster name, as in RocketMQ.
    broker.stats.cluster = broker.settings.cluster
    p = MonitoringProcessor(broker, services)
    register.add(RequestCode.VIEW_BROKER_STATS_DATA, p.view_stats)
    register.add(RequestCode.GET_BROKER_CONSUME_STATS, p.broker_consume_stats)
    register.add(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, p.topic_consume_by_who)
    register.add(RequestCode.GET_PRODUCER_CONNECTION_LIST, p.producer_connections)
    register.add(RequestCode.GET_ALL_PRODUCER_INFO, p.all_producers)
