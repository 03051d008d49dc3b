"""HEART_BEAT, UNREGISTER_CLIENT and CHECK_CLIENT_CONFIG (ClientManageProcessor)."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from tidemq.broker.clients import ClientChannel, SubscriptionData
from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import Header, retry_topic
from tidemq.names import check_group_name, check_stored_topic_name
from tidemq.perm import PERM_READ, PERM_WRITE
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection

log = logging.getLogger(__name__)


class ClientManageProcessor:
    def __init__(self, broker: BrokerContext):
        self.broker = broker

    async def heartbeat(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        try:
            data = orjson.loads(request.payload() or b"{}")
            consumers, producers = _heartbeat_entries(data)
        except (orjson.JSONDecodeError, ValueError) as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"malformed heartbeat body: {exc}")
        client_id = str(data.get("clientID", "") or conn.remote_address)
        channel = ClientChannel(conn, client_id, str(request.language), int(request.version or 0))
        b.watch_connection(conn)
        for cd, group, subs in consumers:
            group_cfg = b.groups.find_or_create(group)
            if group_cfg is not None:
                # Consumers subscribe to their retry topic: it must exist in the route they look up.
                b.topics.create_in_send_back(
                    retry_topic(group), group_cfg.retry_queue_nums, PERM_READ | PERM_WRITE
                )
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
        for group in producers:
            b.producers.register(group, ClientChannel(conn, client_id, channel.language, channel.version))
        return request.reply(ResponseCode.SUCCESS)

    async def unregister(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
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

    async def check_client_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        try:
            data = orjson.loads(request.payload() or b"{}")
        except orjson.JSONDecodeError as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"malformed body: {exc}")
        data = data if isinstance(data, dict) else {}
        # CheckClientRequestBody {clientId, group, subscriptionData{subString, expressionType...}}.
        nested = data.get("subscriptionData")
        sub: dict[str, Any] = nested if isinstance(nested, dict) else data
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


def _objects(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = data.get(key) or []
    if not isinstance(items, list):
        raise ValueError(f"{key} is a {type(items).__name__}, not a list")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"{key}[{i}] is a {type(item).__name__}, not an object")
    return items


def _heartbeat_entries(
    data: Any,
) -> tuple[list[tuple[dict[str, Any], str, list[SubscriptionData]]], list[str]]:
    """The consumer entries (with their group and subscriptions) and producer groups of a HEART_BEAT.

    Everything is checked before anything is registered: a body that is wrong anywhere changes
    nothing, and the answer names the field (ValueError).
    """
    if not isinstance(data, dict):
        raise ValueError(f"the body is a JSON {type(data).__name__}, not an object")
    consumers = []
    for i, cd in enumerate(_objects(data, "consumerDataSet")):
        group = cd.get("groupName", "")
        if group in ("", None):
            continue
        problem = check_group_name(group)
        if problem:
            raise ValueError(f"consumerDataSet[{i}]: {problem}")
        try:
            subs = [SubscriptionData.from_json(s) for s in _objects(cd, "subscriptionDataSet")]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"consumerDataSet[{i}].subscriptionDataSet: {exc}") from None
        for sub in subs:
            problem = check_stored_topic_name(sub.topic)
            if problem:
                raise ValueError(f"consumerDataSet[{i}].subscriptionDataSet: {problem}")
        consumers.append((cd, group, subs))
    producers = []
    for i, pd in enumerate(_objects(data, "producerDataSet")):
        group = pd.get("groupName", "")
        if group in ("", None):
            continue
        problem = check_group_name(group)
        if problem:
            raise ValueError(f"producerDataSet[{i}]: {problem}")
        producers.append(group)
    return consumers, producers


def register(register: ProcessorRegister) -> None:
    p = ClientManageProcessor(register.context)
    register.add(RequestCode.HEART_BEAT, p.heartbeat)
    register.add(RequestCode.UNREGISTER_CLIENT, p.unregister)
    register.add(RequestCode.CHECK_CLIENT_CONFIG, p.check_client_config)
