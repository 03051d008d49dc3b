"""What crosses between ``apache.rocketmq.v2`` and the broker's services: stored messages as v5
clients see them, a service :class:`~tidemq.broker.services.Status` as a v5 ``Code``, and the
transaction id a v5 producer hands back to end its transaction."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from tidemq.broker.services import Status
from tidemq.message import MessageExt, Prop
from tidemq.topic_attributes import TopicMessageType, accepted_types, topic_message_type

#: RocketMQ 5's property for a message delivered at a time (the timer engine reads it).
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
#: RocketMQ's own property keys (MessageConst): not handed to v5 clients as user properties.
_SYSTEM_KEYS = frozenset(
    value for name, value in vars(Prop).items() if name.isupper() and isinstance(value, str)
) | {TIMER_DELIVER_MS}
#: Prefix of the producer group a v5 producer of a topic is registered as.  A v5 producer names
#: no group: the transaction check of a topic's half message goes to a producer of that topic,
#: as RocketMQ 5's proxy routes it.
PRODUCER_GROUP_PREFIX = "GRPC_PRODUCER_"


def producer_group(topic: str) -> str:
    return PRODUCER_GROUP_PREFIX + topic


def transaction_id(offset_msg_id: str, tran_state_offset: int) -> str:
    """What a v5 producer gets for a half message and gives back in EndTransaction: the half
    message's offset id and its queue offset (no state on the broker: it survives a restart)."""
    return f"{offset_msg_id}:{tran_state_offset}"


def parse_transaction_id(value: str) -> tuple[str, int] | None:
    """``(offset message id, queue offset)`` of :func:`transaction_id`, None when it is not one."""
    msg_id, _, offset = value.rpartition(":")
    if not msg_id or not offset.isdigit():
        return None
    return msg_id, int(offset)


#: Service status -> the apache.rocketmq.v2.Code name RocketMQ's proxy answers with.
_CODES = {
    Status.SUCCESS: "OK",
    Status.SYSTEM_ERROR: "INTERNAL_SERVER_ERROR",
    Status.SYSTEM_BUSY: "TOO_MANY_REQUESTS",
    Status.FLUSH_DISK_TIMEOUT: "MASTER_PERSISTENCE_TIMEOUT",
    Status.FLUSH_SLAVE_TIMEOUT: "SLAVE_PERSISTENCE_TIMEOUT",
    Status.SLAVE_NOT_AVAILABLE: "HA_NOT_AVAILABLE",
    Status.SERVICE_NOT_AVAILABLE: "HA_NOT_AVAILABLE",
    Status.MESSAGE_ILLEGAL: "BAD_REQUEST",
    Status.NO_PERMISSION: "FORBIDDEN",
    Status.TOPIC_NOT_EXIST: "TOPIC_NOT_FOUND",
    Status.PULL_NOT_FOUND: "MESSAGE_NOT_FOUND",
    Status.PULL_RETRY_IMMEDIATELY: "MESSAGE_NOT_FOUND",
    Status.PULL_OFFSET_MOVED: "ILLEGAL_OFFSET",
    Status.QUERY_NOT_FOUND: "OFFSET_NOT_FOUND",
    Status.SUBSCRIPTION_PARSE_FAILED: "ILLEGAL_FILTER_EXPRESSION",
    Status.SUBSCRIPTION_NOT_EXIST: "ILLEGAL_FILTER_EXPRESSION",
    Status.SUBSCRIPTION_NOT_LATEST: "ILLEGAL_FILTER_EXPRESSION",
    Status.SUBSCRIPTION_GROUP_NOT_EXIST: "CONSUMER_GROUP_NOT_FOUND",
    Status.CONSUMER_NOT_ONLINE: "BAD_REQUEST",
}


def code_of(pb: ModuleType, status: Status, remark: str | None) -> int:
    """The v5 ``Code`` of a service status (a message too large to store: its own codes)."""
    if status is Status.MESSAGE_ILLEGAL and remark:
        if "propert" in remark.lower():
            return int(pb.MESSAGE_PROPERTIES_TOO_LARGE)
        if "size" in remark.lower() or "large" in remark.lower():
            return int(pb.MESSAGE_BODY_TOO_LARGE)
    return int(getattr(pb, _CODES.get(status, "INTERNAL_SERVER_ERROR")))


def accepted_message_types(pb: ModuleType, attributes: Mapping[str, str]) -> list[int]:
    """QueryRoute's ``accept_message_types`` of a topic of these attributes: its ``message.type``
    (NORMAL without one; MIXED takes every type), as RocketMQ 5's proxy announces them."""
    return [
        int(getattr(pb, "MESSAGE_TYPE_UNSPECIFIED" if t is TopicMessageType.UNSPECIFIED else t.value))
        for t in accepted_types(topic_message_type(attributes))
    ]


def _host(host: tuple[str, int]) -> str:
    return f"{host[0]}:{host[1]}"


def to_v5(pb: ModuleType, msg: MessageExt) -> Any:
    """A stored message as the v5 clients see it."""
    out = pb.Message()
    fill_v5(pb, msg, out)
    return out


def fill_v5(pb: ModuleType, msg: MessageExt, out: Any) -> None:
    """:func:`to_v5` into ``out``, an empty ``pb.Message`` (one inside a response: no copy of the
    message and its body per delivery)."""
    props = msg.properties
    out.topic.name = msg.topic
    system = out.system_properties
    if msg.keys:
        system.keys.extend(msg.keys)
    system.message_id = msg.uniq_key or msg.msg_id
    digest = system.body_digest
    digest.type = pb.CRC32
    digest.checksum = f"{zlib.crc32(msg.body):08X}"
    system.body_encoding = pb.IDENTITY
    system.born_host = _host(msg.born_host)
    system.store_host = _host(msg.store_host)
    system.queue_id = msg.queue_id
    system.queue_offset = msg.queue_offset
    system.delivery_attempt = msg.reconsume_times + 1
    system.born_timestamp.FromMilliseconds(msg.born_timestamp)
    system.store_timestamp.FromMilliseconds(msg.store_timestamp)
    if msg.tags:
        system.tag = msg.tags
    group = props.get(Prop.SHARDING_KEY)
    if group:
        system.message_group = group
        system.message_type = pb.FIFO
    elif TIMER_DELIVER_MS in props:
        system.message_type = pb.DELAY
        system.delivery_timestamp.FromMilliseconds(int(props[TIMER_DELIVER_MS]))
    elif props.get(Prop.TRANSACTION_PREPARED, "").lower() == "true":
        system.message_type = pb.TRANSACTION
    else:
        system.message_type = pb.NORMAL
    user = out.user_properties
    for k, v in props.items():
        if k not in _SYSTEM_KEYS:
            user[k] = v
    out.body = msg.body
