"""The v5 pull consumer's RPCs: PullMessage, UpdateOffset, GetOffset, QueryOffset.

Over the broker's :class:`~tidemq.broker.services.PullService` and
:class:`~tidemq.broker.services.OffsetService`, the services the remoting PULL_MESSAGE and
offset requests use: the same group and topic checks, filters, consume hooks, statistics and
long polling.  A pull that finds nothing waits up to its ``long_polling_timeout`` (within its
deadline) for a message; it answers its status, the messages found, then the next offset, as
RocketMQ's proxy streams them.  Messages are converted back to ``apache.rocketmq.v2.Message``
with the v5 client's id (``UNIQ_KEY``) as their id.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

from tidemq.broker.services import BrokerServices, Outcome, Status
from tidemq.message import iter_messages

from .messages import code_of, to_v5
from .peer import CallPeer

#: What a pull of a v5 client may ask at most in one call (RocketMQ's proxy caps it the same way).
MAX_BATCH = 32
#: Longest a pull is held, seconds, whatever it asks.
MAX_POLL_S = 30.0
#: RocketMQ's PullSysFlag: hold the pull until a message arrives (or the suspend time passes).
FLAG_SUSPEND = 2


def _subscription(pb: ModuleType, expression: Any) -> tuple[tuple[str, str], frozenset[str] | None]:
    """The (type, expression) the pull service filters by, and the exact tags a TAG filter
    accepts (None: all; the store matches tags by hash code, as a 4.x client re-checks them)."""
    text = expression.expression.strip() or "*"
    if expression.type == pb.SQL:
        return ("SQL92", text), None
    if text == "*":
        return ("TAG", "*"), None
    return ("TAG", text), frozenset(t.strip() for t in text.split("||") if t.strip())


class PullRpcs:
    def __init__(self, services: BrokerServices, pb: ModuleType) -> None:
        self.services = services
        self.broker = services.pull.broker
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
        if not group:
            yield pb.PullMessageResponse(status=self._status(pb.ILLEGAL_CONSUMER_GROUP, "group is required"))
            return
        subscription, tags = _subscription(pb, request.filter_expression)
        wait_ms = int(self._poll_seconds(request, context) * 1000)
        peer = CallPeer(context.peer())
        try:
            result = await self.services.pull.pull(
                peer,
                group,
                topic,
                qid,
                request.offset,
                min(max(request.batch_size, 1), MAX_BATCH),
                FLAG_SUSPEND if wait_ms > 0 else 0,
                -1,
                max(wait_ms, 0),
                0,
                subscription,
            )
        finally:
            peer.close()
        if result is None:  # the call ended while the pull was held: nobody to answer
            return
        if isinstance(result, Outcome):
            yield pb.PullMessageResponse(
                status=self._status(code_of(pb, result.status, result.remark), result.remark or "")
            )
            return
        messages = [m for part in result.body for m in iter_messages(part)]
        if tags is not None:
            messages = [m for m in messages if (m.tags or "") in tags]
        if messages:
            yield pb.PullMessageResponse(status=self._status(pb.OK))
        elif result.status is Status.PULL_OFFSET_MOVED:
            yield pb.PullMessageResponse(status=self._status(pb.ILLEGAL_OFFSET, result.remark or ""))
        else:
            yield pb.PullMessageResponse(status=self._status(pb.MESSAGE_NOT_FOUND, "no new message"))
        for msg in messages:
            yield pb.PullMessageResponse(message=to_v5(pb, msg))
        yield pb.PullMessageResponse(next_offset=result.next_begin_offset)

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        pb = self.pb
        queue = request.message_queue
        if not request.group.name:
            return pb.UpdateOffsetResponse(
                status=self._status(pb.ILLEGAL_CONSUMER_GROUP, "group is required")
            )
        if request.offset < 0:
            return pb.UpdateOffsetResponse(status=self._status(pb.ILLEGAL_OFFSET, "offset must be >= 0"))
        done = self.services.offsets.commit(request.group.name, queue.topic.name, queue.id, request.offset)
        return pb.UpdateOffsetResponse(status=self._status(code_of(pb, done.status, done.remark)))

    async def GetOffset(self, request: Any, context: Any) -> Any:
        pb = self.pb
        queue = request.message_queue
        # The committed offset only (RocketMQ 5's proxy asks with setZeroIfNotFound = false, not
        # OffsetService.query's first-start rule): where a new group starts is the client's
        # consume-from choice, made with QueryOffset.
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
