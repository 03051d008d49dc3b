"""Which topics and groups a request needs, and with which permission (RocketMQ's
``PlainAccessResource.parse``).

Groups are keyed by their retry topic (``%RETRY%<group>``), as RocketMQ keys them, so a group
and its retry topic share one permission.  A namespaced group ``ns%group`` keeps its namespace
in the key.
"""

from __future__ import annotations

from collections.abc import Callable
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


#: Finds the topic of the message stored at a commit-log offset (None when there is none there).
StoredTopic = Callable[[int], "str | None"]

#: Codes that name a stored message by its commit-log offset -> (the offset's header field, the
#: permission needed on that message's topic).  RocketMQ checks nothing (VIEW_MESSAGE_BY_ID,
#: END_TRANSACTION) or only the header's group and origin topic (CONSUMER_SEND_MSG_BACK), so any
#: signed account could read any topic by offset, or commit another producer's half message.
STORED_MESSAGE_CODES: dict[int, tuple[str, int]] = {
    RequestCode.VIEW_MESSAGE_BY_ID: ("offset", SUB),
    RequestCode.CONSUMER_SEND_MSG_BACK: ("offset", SUB),
    RequestCode.END_TRANSACTION: ("commitLogOffset", PUB),
}


def _stored(needed: dict[str, int], code: int, fields: Any, stored_topic: StoredTopic) -> None:
    """The permission on the topic of the message the request names (a retry topic keys its group)."""
    field, perm = STORED_MESSAGE_CODES[code]
    text = fields.get(field)
    if text is None:
        return  # the processor answers the missing field
    try:
        offset = int(text)
    except ValueError:
        raise ResourceParseError(f"{field} = {text!r} is not an integer") from None
    if offset < 0:
        return
    topic = stored_topic(offset)
    if topic is not None:
        needed[topic] = needed.get(topic, 0) | perm


def _lock_batch(needed: dict[str, int], request: Any) -> None:
    data = _json_body(request)
    group = data.get("consumerGroup")
    if group is not None:
        needed[retry_topic(str(group))] = SUB
    mqs = data.get("mqSet") or []
    if not isinstance(mqs, list):
        raise ResourceParseError("mqSet is not a list")
    for mq in mqs:
        if not isinstance(mq, dict):
            raise ResourceParseError("mqSet holds a non-object")
        if mq.get("topic") is not None:
            needed[str(mq["topic"])] = SUB


#: Codes whose needed resources :func:`needed_resources` reads from these header fields alone
#: (no body, no stored message): what a request lane's access check keys its decisions by
#: (:mod:`tidemq_acl.lane`).  Keep in step with the branches below (a test checks they read no other).
HEADER_ONLY_FIELDS: dict[int, tuple[str, ...]] = {
    RequestCode.SEND_MESSAGE: ("topic", "producerGroup"),
    RequestCode.SEND_MESSAGE_V2: ("b", "a"),
    RequestCode.SEND_BATCH_MESSAGE: ("b", "a"),
    RequestCode.PULL_MESSAGE: ("topic", "consumerGroup"),
    RequestCode.LITE_PULL_MESSAGE: ("topic", "consumerGroup"),
}


def needed_resources(request: Any, stored_topic: StoredTopic | None = None) -> dict[str, int]:
    """resource key -> permission the request needs (empty for requests on no resource).

    ``stored_topic`` reads the stored message of :data:`STORED_MESSAGE_CODES`; without it those
    requests are checked on their header only (the validator then asks for an admin account).
    """
    code = request.code
    f = request.ext_fields or {}
    needed: dict[str, int] = {}
    if stored_topic is not None and code in STORED_MESSAGE_CODES:
        _stored(needed, code, f, stored_topic)
    if code == RequestCode.SEND_MESSAGE:
        _send(needed, f.get("topic"), f.get("producerGroup"))
    elif code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        # RocketMQ 4.x checks SEND_MESSAGE_V2 only; a batch carries the same V2 header and
        # must not be a way around the topic's permission.
        _send(needed, f.get("b"), f.get("a"))
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        group = f.get("group")
        if group is not None:
            needed[retry_topic(group)] = needed.get(retry_topic(group), 0) | SUB
        if f.get("originTopic") is not None:
            needed[f["originTopic"]] = needed.get(f["originTopic"], 0) | PUB
    elif code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        _lock_batch(needed, request)
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
