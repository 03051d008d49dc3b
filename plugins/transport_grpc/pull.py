"""The v5 pull consumer's RPCs: PullMessage, UpdateOffset, GetOffset, QueryOffset.

Over the broker's published store and offset table (``BrokerContext.store``/``offsets``), no
remoting frame.  A pull that finds nothing waits up to its ``long_polling_timeout`` (within its
deadline) for a message; it answers its status, the messages found, then the next offset, as
RocketMQ's proxy streams them.  Messages are converted back to
``apache.rocketmq.v2.Message`` with the v5 client's id (``UNIQ_KEY``) as their id.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

from tidemq.context import BrokerContext
from tidemq.message import MessageExt, Prop, decode_message

from .broker_calls import TIMER_DELIVER_MS

#: What a pull of a v5 client may ask at most in one call (RocketMQ's proxy caps it the same way).
MAX_BATCH = 32
#: RocketMQ's own property keys (MessageConst): not handed to v5 clients as user properties.
_SYSTEM_KEYS = frozenset(
    value for name, value in vars(Prop).items() if name.isupper() and isinstance(value, str)
) | {TIMER_DELIVER_MS}


def _host(host: tuple[str, int]) -> str:
    return f"{host[0]}:{host[1]}"


def to_v5(pb: ModuleType, msg: MessageExt) -> Any:
    """A stored message as the v5 clients see it."""
    props = msg.properties
    system = pb.SystemProperties(
        keys=msg.keys,
        message_id=msg.uniq_key or msg.msg_id,
        body_digest=pb.Digest(type=pb.CRC32, checksum=f"{zlib.crc32(msg.body):08X}"),
        body_encoding=pb.IDENTITY,
        born_host=_host(msg.born_host),
        store_host=_host(msg.store_host),
        queue_id=msg.queue_id,
        queue_offset=msg.queue_offset,
        delivery_attempt=msg.reconsume_times + 1,
    )
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
    else:
        system.message_type = pb.NORMAL
    user = {k: v for k, v in props.items() if k not in _SYSTEM_KEYS}
    return pb.Message(
        topic=pb.Resource(name=msg.topic), user_properties=user, system_properties=system, body=msg.body
    )


def _tags(pb: ModuleType, expression: Any) -> tuple[frozenset[str] | None, str | None]:
    """The tags a filter expression accepts (None: all), or the problem with it."""
    if expression.type == pb.SQL:
        return None, "SQL92 filters are not served on gRPC pulls yet; filter by TAG"
    text = expression.expression.strip()
    if not text or text == "*":
        return None, None
    return frozenset(t.strip() for t in text.split("||") if t.strip()), None


#: Get statuses of a pull that reached the end of the queue: long polling waits on them.
_NOTHING_YET = frozenset(
    ("OFFSET_OVERFLOW_ONE", "NO_MESSAGE_IN_QUEUE", "NO_MATCHED_LOGIC_QUEUE", "OFFSET_FOUND_NULL")
)
#: Longest a pull is held, seconds, whatever it asks.
MAX_POLL_S = 30.0


class PullRpcs:
    def __init__(self, broker: BrokerContext, pb: ModuleType) -> None:
        self.broker = broker
        self.pb = pb

    def _status(self, code: int, message: str = "") -> Any:
        return self.pb.Status(code=code, message=message or self.pb.Code.Name(code))

    @staticmethod
    def _poll_seconds(request: Any, context: Any) -> float:
        """How long a pull may wait: its long_polling_timeout, within the call's deadline."""
        if not request.HasField("long_polling_timeout"):
            return 0.0
        wait = min(request.long_polling_timeout.ToMilliseconds() / 1000, MAX_POLL_S)
        remaining = context.time_remaining()
        if remaining is not None:
            wait = min(wait, remaining - 0.2)  # answer before the client gives up
        return wait

    async def PullMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        pb = self.pb
        queue = request.message_queue
        topic, qid, group = queue.topic.name, queue.id, request.group.name
        tags, problem = _tags(pb, request.filter_expression)
        if problem is not None:
            yield pb.PullMessageResponse(status=self._status(pb.ILLEGAL_FILTER_EXPRESSION, problem))
            return
        if not group:
            yield pb.PullMessageResponse(status=self._status(pb.ILLEGAL_CONSUMER_GROUP, "group is required"))
            return
        if self.broker.topics.get(topic) is None:
            yield pb.PullMessageResponse(status=self._status(pb.TOPIC_NOT_FOUND, f"topic {topic} not found"))
            return
        batch = min(max(request.batch_size, 1), MAX_BATCH)
        got = self.broker.store.get_message(group, topic, qid, request.offset, batch)
        hold = self.broker.hold
        wait = self._poll_seconds(request, context)
        if got.status.value in _NOTHING_YET and hold is not None and wait > 0:
            # Long polling: a pull that found nothing waits for the queue to grow (or its time out,
            # or the client's deadline: gRPC cancels the wait with the call).
            if await hold.wait(topic, qid, request.offset, wait):
                got = self.broker.store.get_message(group, topic, qid, request.offset, batch)
        messages = [decode_message(bytes(buf)) for buf in got.buffers]
        if tags is not None:
            messages = [m for m in messages if (m.tags or "") in tags]
        status = got.status.value
        if messages:
            yield pb.PullMessageResponse(status=self._status(pb.OK))
        elif status in ("OFFSET_OVERFLOW_BADLY", "OFFSET_TOO_SMALL"):
            yield pb.PullMessageResponse(status=self._status(pb.ILLEGAL_OFFSET, status))
        else:
            yield pb.PullMessageResponse(status=self._status(pb.MESSAGE_NOT_FOUND, "no new message"))
        for msg in messages:
            yield pb.PullMessageResponse(message=to_v5(pb, msg))
        yield pb.PullMessageResponse(next_offset=got.next_begin_offset)
        if messages:
            self.broker.stats.on_get(group, topic, len(messages), sum(len(m.body) for m in messages))

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        pb = self.pb
        queue = request.message_queue
        if not request.group.name:
            return pb.UpdateOffsetResponse(
                status=self._status(pb.ILLEGAL_CONSUMER_GROUP, "group is required")
            )
        if request.offset < 0:
            return pb.UpdateOffsetResponse(status=self._status(pb.ILLEGAL_OFFSET, "offset must be >= 0"))
        self.broker.offsets.commit(request.group.name, queue.topic.name, queue.id, request.offset)
        return pb.UpdateOffsetResponse(status=self._status(pb.OK))

    async def GetOffset(self, request: Any, context: Any) -> Any:
        pb = self.pb
        queue = request.message_queue
        offset = self.broker.offsets.query(request.group.name, queue.topic.name, queue.id)
        if offset < 0:
            return pb.GetOffsetResponse(
                status=self._status(pb.OFFSET_NOT_FOUND, "the group has no offset here")
            )
        return pb.GetOffsetResponse(status=self._status(pb.OK), offset=offset)

    async def QueryOffset(self, request: Any, context: Any) -> Any:
        pb = self.pb
        queue = request.message_queue
        store = self.broker.store
        topic, qid = queue.topic.name, queue.id
        policy = request.query_offset_policy
        if policy == pb.BEGINNING:
            offset = store.get_min_offset_in_queue(topic, qid)
        elif policy == pb.END:
            offset = store.get_max_offset_in_queue(topic, qid)
        else:
            if not request.HasField("timestamp"):
                return pb.QueryOffsetResponse(
                    status=self._status(pb.BAD_REQUEST, "TIMESTAMP needs a timestamp")
                )
            offset = store.get_offset_by_time(topic, qid, request.timestamp.ToMilliseconds())
        return pb.QueryOffsetResponse(status=self._status(pb.OK), offset=offset)
