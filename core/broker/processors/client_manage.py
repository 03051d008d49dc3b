"""HEART_BEAT, UNREGISTER_CLIENT and CHECK_CLIENT_CONFIG (ClientManageProcessor)."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from tidemq.broker.clients import ClientChannel, SubscriptionData
from tidemq.broker.headers import PERM_READ, PERM_WRITE, Header, retry_topic
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

log = logging.getLogger(__name__)


class ClientManageProcessor:
    def __init__(self, broker: Any):
        self.broker = broker

    async def heartbeat(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        try:
            data = orjson.loads(request.payload() or b"{}")
            if not isinstance(data, dict):
                raise ValueError("the heartbeat body is not a JSON object")
        except (orjson.JSONDecodeError, ValueError) as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"malformed heartbeat body: {exc}")
        client_id = str(data.get("clientID", "") or conn.remote_address)
        channel = ClientChannel(conn, client_id, str(request.language), int(request.version or 0))
        b.watch_connection(conn)
        for cd in data.get("consumerDataSet") or []:
            group = str(cd.get("groupName", ""))
            if not group:
                continue
            group_cfg = b.groups.find_or_create(group)
            if group_cfg is not None:
                # Consumers subscribe to their retry topic: it must exist in the route they look up.
                b.topics.create_in_send_back(
                    retry_topic(group), group_cfg.retry_queue_nums, PERM_READ | PERM_WRITE
                )
            subs = [
                SubscriptionData.from_json(s)
                for s in cd.get("subscriptionDataSet") or []
                if isinstance(s, dict)
            ]
            changed = b.consumers.register(
                group,
                ClientChannel(conn, client_id, channel.language, channel.version),
                str(cd.get("consumeType", "CONSUME_PASSIVELY")),
                str(cd.get("messageModel", "CLUSTERING")),
                str(cd.get("consumeFromWhere", "CONSUME_FROM_LAST_OFFSET")),
                subs,
            )
            if changed:
                log.info(
                    "consumer group %s changed: %s joined from %s", group, client_id, conn.remote_address
                )
                b.notify_consumer_ids_changed(group)
        for pd in data.get("producerDataSet") or []:
            group = str(pd.get("groupName", ""))
            if group:
                b.producers.register(group, ClientChannel(conn, client_id, channel.language, channel.version))
        return request.reply(ResponseCode.SUCCESS)

    async def unregister(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        h = Header(request.ext_fields, "UNREGISTER_CLIENT")
        producer_group = h.str("producerGroup", "")
        consumer_group = h.str("consumerGroup", "")
        if producer_group:
            b.producers.unregister(producer_group, conn)
        if consumer_group and b.consumers.unregister(consumer_group, conn):
            log.info("consumer %s left group %s", h.str("clientID", conn.remote_address), consumer_group)
            b.notify_consumer_ids_changed(consumer_group)
        return request.reply(ResponseCode.SUCCESS)

    async def check_client_config(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
        try:
            data = orjson.loads(request.payload() or b"{}")
        except orjson.JSONDecodeError as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"malformed body: {exc}")
        data = data if isinstance(data, dict) else {}
        # CheckClientRequestBody {clientId, group, subscriptionData{subString, expressionType...}}.
        sub = data.get("subscriptionData") if isinstance(data.get("subscriptionData"), dict) else data
        expression_type = str(sub.get("expressionType") or "TAG")
        expression = str(sub.get("subString") or "")
        if expression_type == "TAG":
            return request.reply(ResponseCode.SUCCESS)
        if not self.broker.settings.enable_property_filter:
            return request.reply(
                ResponseCode.SYSTEM_ERROR,
                f"The broker does not support consumer to filter message by {expression_type}",
            )
        factory = self.broker.filters.get(expression_type)
        if factory is None:
            return request.reply(
                ResponseCode.SYSTEM_ERROR,
                f"expression type {expression_type} is not supported by this broker",
            )
        try:
            factory.compile(expression)
        except ValueError as exc:
            return request.reply(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        return request.reply(ResponseCode.SUCCESS)


def register(broker: Any) -> None:
    p = ClientManageProcessor(broker)
    broker.register_handler(RequestCode.HEART_BEAT, p.heartbeat)
    broker.register_handler(RequestCode.UNREGISTER_CLIENT, p.unregister)
    broker.register_handler(RequestCode.CHECK_CLIENT_CONFIG, p.check_client_config)
