"""HEART_BEAT, UNREGISTER_CLIENT and CHECK_CLIENT_CONFIG (ClientManageProcessor): the remoting codec
over :class:`~tidemq.broker.services.clients.ClientService` (the heartbeat body is read and checked here)."""

from __future__ import annotations

import logging
from typing import Any

import orjson

from tidemq.broker.clients import SubscriptionData
from tidemq.broker.context import ProcessorRegister
from tidemq.broker.headers import Header
from tidemq.broker.processors.answers import answer
from tidemq.broker.services import BrokerServices
from tidemq.broker.services.clients import ClientService, ConsumerRegistration
from tidemq.names import check_group_name, check_stored_topic_name
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection

log = logging.getLogger(__name__)


class ClientManageProcessor:
    def __init__(self, service: ClientService):
        self.service = service

    async def heartbeat(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        try:
            data = orjson.loads(request.payload() or b"{}")
            consumers, producers = _heartbeat_entries(data)
        except (orjson.JSONDecodeError, ValueError) as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"malformed heartbeat body: {exc}")
        client_id = str(data.get("clientID", "") or conn.remote_address)
        registrations = [
            ConsumerRegistration(
                group,
                str(cd.get("consumeType", "CONSUME_PASSIVELY")),
                str(cd.get("messageModel", "CLUSTERING")),
                str(cd.get("consumeFromWhere", "CONSUME_FROM_LAST_OFFSET")),
                subs,
            )
            for cd, group, subs in consumers
        ]
        outcome = self.service.heartbeat(
            conn, client_id, str(request.language), int(request.version or 0), registrations, producers
        )
        return answer(request, outcome)

    async def unregister(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "UNREGISTER_CLIENT")
        outcome = self.service.unregister(
            conn, h.str("clientID", ""), h.str("producerGroup", ""), h.str("consumerGroup", "")
        )
        return answer(request, outcome)

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
        return answer(request, self.service.check_subscription(expression_type, expression))


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


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    p = ClientManageProcessor(services.clients)
    register.add(RequestCode.HEART_BEAT, p.heartbeat)
    register.add(RequestCode.UNREGISTER_CLIENT, p.unregister)
    register.add(RequestCode.CHECK_CLIENT_CONFIG, p.check_client_config)
