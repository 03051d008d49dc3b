"""Which topics and groups a request needs, and with which permission (RocketMQ's
``PlainAccessResource.parse``).

Groups are keyed by their retry topic (``%RETRY%<group>``), as RocketMQ keys them, so a group
and its retry topic share one permission.  A namespaced group ``ns%group`` keeps its namespace
in the key.
"""

from __future__ import annotations

from typing import Any

import orjson

from tidemq.errors import TidemqError
from tidemq.remoting.codes import RequestCode
from tidemq_acl.permission import PUB, SUB

RETRY_PREFIX = "%RETRY%"


def retry_topic(group: str) -> str:
    """The resource key of a consumer group."""
    return RETRY_PREFIX + group


def is_group_key(resource: str) -> bool:
    return resource.startswith(RETRY_PREFIX)


def describe(resource: str) -> str:
    """``group:G`` or ``topic:T`` for messages."""
    if is_group_key(resource):
        return f"group:{resource[len(RETRY_PREFIX) :]}"
    return f"topic:{resource}"


class ResourceParseError(TidemqError, ValueError):
    """A request whose resources cannot be read (a malformed heartbeat body...).

    Still a ValueError, for callers written before it joined the TidemqError tree.
    """


def _send(needed: dict[str, int], topic: str | None, group: str | None) -> None:
    if topic is not None and topic.startswith(RETRY_PREFIX):
        # A message sent back to a retry topic is the group's business: the group needs SUB.
        if group is not None:
            needed[retry_topic(group)] = SUB
    elif topic is not None:
        needed[topic] = PUB


_POP_CODES = frozenset(
    {
        RequestCode.POP_MESSAGE,
        RequestCode.ACK_MESSAGE,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
        RequestCode.NOTIFICATION,
        RequestCode.POLLING_INFO,
    }
)


def _pop(needed: dict[str, int], topic: Any, group: Any) -> None:
    if group is not None:
        needed[retry_topic(str(group))] = SUB
        for sep in ("_", "+"):  # an ack names the POP retry topic %RETRY%<group>_<topic>: check <topic>
            prefix = f"{retry_topic(str(group))}{sep}"
            if topic is not None and str(topic).startswith(prefix):
                topic = str(topic)[len(prefix) :]
    if topic is not None:
        needed[str(topic)] = SUB


def _json_body(request: Any) -> dict[str, Any]:
    try:
        data = orjson.loads(request.payload() or b"{}")
    except orjson.JSONDecodeError as exc:
        raise ResourceParseError(f"cannot read the request body: {exc}") from None
    if not isinstance(data, dict):
        raise ResourceParseError("the request body is not a JSON object")
    return data


def needed_resources(request: Any) -> dict[str, int]:
    """resource key -> permission the request needs (empty for requests on no resource)."""
    code = request.code
    f = request.ext_fields or {}
    needed: dict[str, int] = {}
    if code == RequestCode.SEND_MESSAGE:
        _send(needed, f.get("topic"), f.get("producerGroup"))
    elif code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        # RocketMQ 4.x checks SEND_MESSAGE_V2 only; a batch carries the same V2 header and
        # must not be a way around the topic's permission.
        _send(needed, f.get("b"), f.get("a"))
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        group = f.get("group")
        if group is not None:
            needed[retry_topic(group)] = SUB
        if f.get("originTopic") is not None:
            needed[f["originTopic"]] = PUB
    elif code in (RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE):
        if f.get("topic") is not None:
            needed[f["topic"]] = SUB
        if f.get("consumerGroup") is not None:
            needed[retry_topic(f["consumerGroup"])] = SUB
    elif code == RequestCode.QUERY_MESSAGE:
        if f.get("topic") is not None:
            needed[f["topic"]] = SUB
    elif code in _POP_CODES:  # RocketMQ 5 POP (issue 39): the topic and the group's retry topic
        _pop(needed, f.get("topic"), f.get("consumerGroup"))
    elif code in (RequestCode.BATCH_ACK_MESSAGE, RequestCode.QUERY_ASSIGNMENT):
        data = _json_body(request)
        entries = data.get("acks") if code == RequestCode.BATCH_ACK_MESSAGE else [data]
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict):
                _pop(needed, entry.get("t", entry.get("topic")), entry.get("c", entry.get("consumerGroup")))
    elif code == RequestCode.HEART_BEAT:
        data = _json_body(request)
        for consumer in data.get("consumerDataSet") or []:
            if not isinstance(consumer, dict):
                raise ResourceParseError("heartbeat consumerDataSet holds a non-object")
            if consumer.get("groupName") is not None:
                needed[retry_topic(str(consumer["groupName"]))] = SUB
            for sub in consumer.get("subscriptionDataSet") or []:
                if isinstance(sub, dict) and sub.get("topic") is not None:
                    needed[str(sub["topic"])] = SUB
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        if f.get("consumerGroup"):
            needed[retry_topic(f["consumerGroup"])] = SUB
    elif code in (RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.QUERY_CONSUMER_OFFSET):
        # RocketMQ 4.x checks updates only; reading a group's progress is checked the same way here.
        if f.get("consumerGroup") is not None:
            needed[retry_topic(f["consumerGroup"])] = SUB
        if f.get("topic") is not None:
            needed[f["topic"]] = SUB
    return needed
