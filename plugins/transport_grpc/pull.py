"""The v5 pull consumer's RPCs: PullMessage, UpdateOffset, GetOffset, QueryOffset.

Over the endpoint's :class:`~.backend.Backend`: in a broker, its
:class:`~tidemq.broker.services.PullService` and :class:`~tidemq.broker.services.OffsetService`,
the services the remoting PULL_MESSAGE and offset requests use (the same group and topic checks,
filters, consume hooks, statistics and long polling); in ``tidemq proxy``, those requests sent to
the broker group the queue names.  A pull that finds nothing waits up to its ``long_polling_timeout`` (within its
deadline) for a message; it answers its status, the messages found, then the next offset, as
RocketMQ's proxy streams them.  Messages are converted back to ``apache.rocketmq.v2.Message``
with the v5 client's id (``UNIQ_KEY``) as their id.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

from tidemq.broker.services import Outcome, Status

from .backend import Backend
from .messages import code_of, to_v5
from .peer import CallPeer

#: What a pull of a v5 client may ask at most in one call (RocketMQ's proxy caps it the same way).
MAX_BATCH = 32
#: Longest a pull is held, seconds, whatever it asks.
MAX_POLL_S = 30.0


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
    def __init__(self, backend: Backend, pb: ModuleType) -> None:
        self.backend = backend
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
            result = await self.backend.pull(
                peer,
                group,
                topic,
                queue.broker.name,
                qid,
                request.offset,
                min(max(request.batch_size, 1), MAX_BATCH),
                max(wait_ms, 0),
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
        messages = list(result.messages)
        if tags is not None:
            messages = [m for m in messages if (m.tags or "") in tags]
        if messages:
            yield pb.PullMessageResponse(status=self._status(pb.OK))
        elif result.outcome.status is Status.PULL_OFFSET_MOVED:
            yield pb.PullMessageResponse(status=self._status(pb.ILLEGAL_OFFSET, result.outcome.remark or ""))
        else:
            yield pb.PullMessageResponse(status=self._status(pb.MESSAGE_NOT_FOUND, "no new message"))
        for msg in messages:
            yield pb.PullMessageResponse(message=to_v5(pb, msg))
        yield pb.PullMessageResponse(next_offset=result.next_offset)

    async def UpdateOffset(self, request: Any, context: Any) -> Any:
        pb = self.pb
        queue = request.message_queue
        if not request.group.name:
            return pb.UpdateOffsetResponse(
                status=self._status(pb.ILLEGAL_CONSUMER_GROUP, "group is required")
            )
        if request.offset < 0:
            return pb.UpdateOffsetResponse(status=self._status(pb.ILLEGAL_OFFSET, "offset must be >= 0"))
        done = await self.backend.commit_offset(
            request.group.name, queue.topic.name, queue.broker.name, queue.id, request.offset
        )
        return pb.UpdateOffsetResponse(status=self._status(code_of(pb, done.status, done.remark)))

    async def GetOffset(self, request: Any, context: Any) -> Any:
        pb = self.pb
        queue = request.message_queue
        # The committed offset only: where a new group starts is the client's consume-from
        # choice, made with QueryOffset.
        offset = await self.backend.committed_offset(
            request.group.name, queue.topic.name, queue.broker.name, queue.id
        )
        if offset < 0:
            return pb.GetOffsetResponse(
                status=self._status(pb.OFFSET_NOT_FOUND, "the group has no offset here")
            )
        return pb.GetOffsetResponse(status=self._status(pb.OK), offset=offset)

    async def QueryOffset(self, request: Any, context: Any) -> Any:
        pb = self.pb
        queue = request.message_queue
        topic, qid = queue.topic.name, queue.id
        policy = request.query_offset_policy
        if policy == pb.BEGINNING:
            offset = await self.backend.queue_offset(topic, queue.broker.name, qid, "BEGINNING", 0)
        elif policy == pb.END:
            offset = await self.backend.queue_offset(topic, queue.broker.name, qid, "END", 0)
        else:
            if not request.HasField("timestamp"):
                return pb.QueryOffsetResponse(
                    status=self._status(pb.BAD_REQUEST, "TIMESTAMP needs a timestamp")
                )
            offset = await self.backend.queue_offset(
                topic, queue.broker.name, qid, "TIMESTAMP", request.timestamp.ToMilliseconds()
            )
        if isinstance(offset, Outcome):
            return pb.QueryOffsetResponse(
                status=self._status(code_of(pb, offset.status, offset.remark), offset.remark or "")
            )
        return pb.QueryOffsetResponse(status=self._status(pb.OK), offset=offset)
