"""Pulling one queue's ConsumeQueue offset range on an executor (PULL_MESSAGE, no heartbeat or rebalance)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterator
from typing import Any, cast

import attrs

from tidemq.client import PULL_FLAG_SUBSCRIPTION, BrokerError, PullStatus, Subscription, prepare
from tidemq.message import MessageExt, decode_message, iter_messages
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.errors import RemotingConnectError

from .client import TidemqSession
from .options import DataLossError, QueueKey, TidemqSparkError
from .schema import MODE_PULL, NEEDS_REFERENCE, BatchBuilder

log = logging.getLogger(__name__)

_STATUSES: dict[int, PullStatus] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


@attrs.frozen
class RawPull:
    """One PULL_MESSAGE answer with its records still encoded (the client's ``PullResult`` decodes)."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    payload: bytes


@attrs.frozen
class PulledRecords:
    """The records of one pull with queue offsets below ``end``, as the subscription filters them.

    Iterating decodes them into ``MessageExt`` (the client's decode and :func:`prepare`); a
    :class:`~tidemq_spark.schema.BatchBuilder` instead takes them straight from the bytes
    (:meth:`add_into`), handing only unusual records to that same reference.
    """

    payload: bytes
    end: int
    sub: Subscription

    def __iter__(self) -> Iterator[MessageExt]:
        end = self.end
        return iter([m for m in prepare(iter_messages(self.payload), self.sub) if m.queue_offset < end])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def add_into(self, builder: BatchBuilder) -> None:
        sub, payload, end = self.sub, self.payload, self.end
        # Subscription.accepts: only a TAG expression with tags filters on the client side.
        tags = tuple(t.encode() for t in sub.tags) if sub.tags and sub.expression_type == "TAG" else None
        pos, n = 0, len(payload)
        while pos < n:
            pos, code = builder.scan(payload, pos, mode=MODE_PULL, end_offset=end, tags=tags)
            if code != NEEDS_REFERENCE:
                break
            msg = decode_message(payload, pos)  # the client's error for a malformed record
            pos += msg.store_size
            for m in prepare([msg], sub):  # decompressed, or logged and skipped
                if m.queue_offset < end:
                    builder.add(m)


async def _pull(
    session: TidemqSession,
    addr: str,
    key: QueueKey,
    group: str,
    offset: int,
    max_nums: int,
    sub: Subscription,
) -> RawPull:
    # The client API's pull, minus its decode: the builder reads the records from the payload.
    fields = {
        "consumerGroup": group,
        "topic": key.topic,
        "queueId": str(key.queue_id),
        "queueOffset": str(offset),
        "maxMsgNums": str(max_nums),
        "sysFlag": str(PULL_FLAG_SUBSCRIPTION),
        "commitOffset": "0",
        "suspendTimeoutMillis": "0",
        "subscription": sub.expression,
        "subVersion": str(sub.version),
        "expressionType": sub.expression_type,
    }
    fields = {k: v for k, v in fields.items() if v is not None}  # as the client API sends them
    request = RemotingCommand.request(RequestCode.PULL_MESSAGE, fields)
    resp = await session.api.invoke(addr, request, session.timeout_s)
    status = _STATUSES.get(resp.code)
    if status is None:
        raise BrokerError(resp.code, resp.remark, addr)
    ext = resp.ext_fields or {}

    def number(name: str, default: int) -> int:
        value = ext.get(name)
        return int(value) if value not in (None, "") else default

    return RawPull(
        status,
        number("nextBeginOffset", offset),
        number("minOffset", 0),
        resp.payload() if status is PullStatus.FOUND else b"",
    )


def read_range(
    session: TidemqSession,
    key: QueueKey,
    start: int,
    end: int,
    *,
    group: str,
    expression: str = "*",
    expression_type: str = "TAG",
    batch: int = 256,
    fail_on_data_loss: bool = True,
    address: str | None = None,
) -> Iterator[PulledRecords]:
    """Messages of ``key`` with ConsumeQueue offsets in ``[start, end)``, pull by pull.

    Each pull comes as :class:`PulledRecords`: iterate it for ``MessageExt`` s, or hand it to
    ``BatchBuilder.add_all`` (which builds the columns from the bytes).

    Offsets the broker already cleaned (or no longer has) raise :class:`DataLossError`, or are
    skipped with a warning when ``fail_on_data_loss`` is false.
    """
    sub = Subscription.build(key.topic, expression, expression_type)
    addr = address or session.address(key)
    offset = start
    retried = False
    pending: asyncio.Task[RawPull] | None = None  # the pull of ``offset``, already sent
    try:
        while offset < end:
            pull: Any = pending or _pull(session, addr, key, group, offset, min(batch, end - offset), sub)
            pending = None
            try:
                result = _await(session, pull, expression, expression_type)
            except RemotingConnectError:
                if retried:
                    raise
                retried = True  # the broker may have moved: ask the NameServer once
                addr = session._refresh_address(key)
                continue
            status = result.status
            if status is PullStatus.FOUND:
                offset = max(result.next_begin_offset, offset + 1)
                if offset < end:  # sent now, the next pull is served while this one becomes rows
                    coro = _pull(session, addr, key, group, offset, min(batch, end - offset), sub)
                    pending = _send(session, coro)
                if result.payload:
                    yield PulledRecords(result.payload, end, sub)
            elif status is PullStatus.NO_MATCHED_MSG:
                offset = max(result.next_begin_offset, offset + 1)
            elif status is PullStatus.OFFSET_ILLEGAL:
                lost_to = result.next_begin_offset if result.next_begin_offset > offset else result.min_offset
                if lost_to <= offset:
                    lost_to = end  # queue gone or reset: nothing more to read
                _data_loss(key, offset, min(lost_to, end), fail_on_data_loss)
                offset = lost_to
            else:  # NO_NEW_MSG before the end: the broker has less than it once said
                _data_loss(key, offset, end, fail_on_data_loss)
                return
    finally:
        if pending is not None:
            _cancel(session, pending)


def _await(session: TidemqSession, pull: Any, expression: str, expression_type: str) -> RawPull:
    """The answer of a pull (a coroutine, or a task already sent)."""
    try:
        return cast(RawPull, session.run(pull))
    except BrokerError as exc:
        if exc.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED:
            raise TidemqSparkError(
                f"the broker rejected filter {expression!r} ({expression_type}): {exc.remark}"
            ) from None
        raise


def _send(session: TidemqSession, pull: Coroutine[Any, Any, RawPull]) -> asyncio.Task[RawPull]:
    """Start a pull without waiting for its answer: one turn of the loop puts the request out."""
    task = session.loop.create_task(pull)
    session.run(asyncio.sleep(0))
    return task


def _cancel(session: TidemqSession, task: asyncio.Task[RawPull]) -> None:
    """Drop a pull nobody will read (the reader stopped early)."""
    try:
        task.cancel()
        session.loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    except RuntimeError:  # the session's loop is already closed: nothing left to wait for
        pass


def _data_loss(key: QueueKey, start: int, end: int, fail: bool) -> None:
    what = f"offsets [{start}, {end}) of {key.topic} {key.name} are no longer on the broker"
    if fail:
        raise DataLossError(f"{what}; set failOnDataLoss=false to skip them with a warning")
    log.warning("%s; skipped (failOnDataLoss=false)", what)
