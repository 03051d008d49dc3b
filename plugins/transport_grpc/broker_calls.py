"""The broker operations the gRPC service calls, over the published :class:`BrokerContext`.

Plain values in, a typed outcome out; no remoting frame is built.  This is the one module to move
onto ``tidemq.broker.services`` (issue 35) once that layer is on main: its send then brings the
send hooks, the duplicate window and transactions.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import time
import zlib
from concurrent.futures import Future
from types import ModuleType
from typing import Any, TypeVar

import attrs

from tidemq.context import BrokerContext
from tidemq.message import MessageInner, Prop
from tidemq.names import check_topic_name
from tidemq.replication import ReplicaStatus
from tidemq.store import PutStatus

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The template topic a 4.x producer's first send names (AUTO_CREATE_TOPIC_KEY_TOPIC): no one sends to it.
DEFAULT_TOPIC = "TBW102"
#: RocketMQ's permission bits of a topic (PermName).
PERM_READ = 0x4
PERM_WRITE = 0x2
#: RocketMQ 5's property for a message delivered at a time (the timer engine reads it).
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"


@attrs.frozen
class SendOutcome:
    code: int  # an apache.rocketmq.v2.Code value
    message: str = ""
    queue_offset: int = -1
    queue_id: int = -1


def route_topic(broker: BrokerContext, topic: str) -> tuple[Any, str | None]:
    """``(topic config, None)``, ``(None, problem)`` for a bad name, ``(None, None)`` when absent.

    A topic missing is created as a 4.x producer's first send creates it, when the broker allows it.
    """
    problem = check_topic_name(topic)
    if problem:
        return None, problem
    if topic == DEFAULT_TOPIC:
        return None, f"the topic[{topic}] is conflict with system reserved words."
    cfg = broker.topics.get(topic)
    if cfg is None:
        cfg = broker.topics.create_in_send(topic, DEFAULT_TOPIC, broker.settings.default_topic_queues)
    return cfg, None


def born_address(address: str) -> tuple[str, int]:
    """The born host of a message: the client's report (an IP, no port) or gRPC's peer
    (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``); what is not an IP address becomes 127.0.0.1."""
    if address.startswith(("ipv4:", "ipv6:")):
        address = address[5:]
    candidates: list[tuple[str, int]] = [(address.strip("[]"), 0)]
    host, _, port = address.rpartition(":")
    if host and port.isdigit():
        candidates.append((host.strip("[]"), int(port)))
    for ip, number in candidates:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            continue
        return ip, number
    return "127.0.0.1", 0


async def send(
    broker: BrokerContext,
    topic: str,
    body: bytes,
    properties: dict[str, str],
    *,
    message_id: str,
    tag: str | None,
    keys: list[str],
    message_group: str | None,
    delivery_ms: int | None,
    born_ms: int,
    born_host: str,
    codes: ModuleType,
) -> SendOutcome:
    """Store one message; ``codes`` is the protobuf module (its ``Code`` values)."""
    pb = codes
    if not broker.is_master:
        return SendOutcome(
            pb.HA_NOT_AVAILABLE, f"the broker[{broker.settings.name}] is a slave and takes no messages"
        )
    cfg, problem = route_topic(broker, topic)
    if cfg is None:
        if problem is not None:
            return SendOutcome(pb.ILLEGAL_TOPIC, problem)
        return SendOutcome(pb.TOPIC_NOT_FOUND, f"topic[{topic}] not exist, apply first please!")
    if not cfg.perm & PERM_WRITE:
        return SendOutcome(pb.FORBIDDEN, f"the topic[{topic}] sending message is forbidden (perm {cfg.perm})")
    queues = max(cfg.write_queue_nums, 1)
    if message_group:
        # FIFO: one message group, one queue (stable across restarts and processes).
        queue_id = zlib.crc32(message_group.encode()) % queues
        properties[Prop.SHARDING_KEY] = message_group
    else:
        queue_id = random.randrange(queues)
    if tag:
        properties[Prop.TAGS] = tag
    if keys:
        properties[Prop.KEYS] = " ".join(keys)
    if message_id:
        properties[Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = message_id  # the client's id is the message's
    if delivery_ms is not None:
        properties[TIMER_DELIVER_MS] = str(delivery_ms)
    properties[Prop.CLUSTER] = broker.settings.cluster
    msg = MessageInner(
        topic,
        body,
        queue_id,
        0,
        properties,
        0,
        born_ms or int(time.time() * 1000),
        born_address(born_host),
        broker.store_host,
        0,
    )
    started = time.perf_counter()
    try:
        result = await _settled(broker.store.put_message(msg))
    except Exception as exc:
        log.exception("store refused a gRPC message for %s", topic)
        return SendOutcome(pb.INTERNAL_SERVER_ERROR, f"store error: {exc}")
    status = result.status
    if status is not PutStatus.PUT_OK:
        code = getattr(pb, _PUT_CODES.get(status.value, "INTERNAL_SERVER_ERROR"))
        return SendOutcome(code, f"{status.value} {result.error}".strip())
    stats = broker.stats
    stats.on_put(topic, 1, result.wrote_bytes)
    stats.put_seconds.observe(time.perf_counter() - started)
    replica = await _settled(broker.replication.wait_for_replicas(result.wrote_offset + result.wrote_bytes))
    if replica != ReplicaStatus.PUT_OK:
        code = (
            pb.HA_NOT_AVAILABLE
            if replica != ReplicaStatus.FLUSH_SLAVE_TIMEOUT
            else pb.SLAVE_PERSISTENCE_TIMEOUT
        )
        return SendOutcome(code, str(replica), result.queue_offset, queue_id)
    return SendOutcome(pb.OK, "", result.queue_offset, queue_id)


async def _settled(future: Future[T]) -> T:
    """A store or replica future's result; without a trip through the loop when it is done
    already (an asynchronous flush: nearly every put)."""
    if future.done():
        return future.result()
    return await asyncio.wrap_future(future)


#: PutStatus -> the apache.rocketmq.v2.Code name RocketMQ's proxy answers with.
_PUT_CODES = {
    "FLUSH_DISK_TIMEOUT": "MASTER_PERSISTENCE_TIMEOUT",
    "FLUSH_SLAVE_TIMEOUT": "SLAVE_PERSISTENCE_TIMEOUT",
    "SLAVE_NOT_AVAILABLE": "HA_NOT_AVAILABLE",
    "MESSAGE_ILLEGAL": "MESSAGE_BODY_TOO_LARGE",
    "PROPERTIES_SIZE_EXCEEDED": "MESSAGE_PROPERTIES_TOO_LARGE",
    "OS_PAGECACHE_BUSY": "TOO_MANY_REQUESTS",
}
