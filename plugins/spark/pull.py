"""Pulling one queue's ConsumeQueue offset range on an executor (PULL_MESSAGE, no heartbeat or rebalance)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from tidemq.client import PULL_FLAG_SUBSCRIPTION, BrokerError, PullResult, PullStatus, Subscription, prepare
from tidemq.message import MessageExt
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import ResponseCode
from tidemq.remoting.errors import RemotingConnectError

from .client import TidemqSession
from .options import DataLossError, QueueKey, TidemqSparkError

log = logging.getLogger(__name__)


def _pull(
    session: TidemqSession,
    addr: str,
    key: QueueKey,
    group: str,
    offset: int,
    max_nums: int,
    sub: Subscription,
) -> PullResult:
    return session.run(
        session.api.pull(
            addr,
            group=group,
            mq=MessageQueue(key.topic, key.broker, key.queue_id),
            offset=offset,
            max_nums=max_nums,
            sys_flag=PULL_FLAG_SUBSCRIPTION,
            commit_offset=0,
            suspend_ms=0,
            subscription=sub.expression,
            sub_version=sub.version,
            expression_type=sub.expression_type,
            timeout=session.timeout_s,
        )
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
) -> Iterator[list[MessageExt]]:
    """Messages of ``key`` with ConsumeQueue offsets in ``[start, end)``, pull by pull.

    Offsets the broker already cleaned (or no longer has) raise :class:`DataLossError`, or are
    skipped with a warning when ``fail_on_data_loss`` is false.
    """
    sub = Subscription.build(key.topic, expression, expression_type)
    addr = address or session.address(key)
    offset = start
    retried = False
    while offset < end:
        try:
            result = _pull(session, addr, key, group, offset, min(batch, end - offset), sub)
        except RemotingConnectError:
            if retried:
                raise
            retried = True  # the broker may have moved: ask the NameServer once
            addr = session._refresh_address(key)
            continue
        except BrokerError as exc:
            if exc.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED:
                raise TidemqSparkError(
                    f"the broker rejected filter {expression!r} ({expression_type}): {exc.remark}"
                ) from None
            raise
        status = result.status
        if status is PullStatus.FOUND:
            msgs = [m for m in prepare(result.messages, sub) if m.queue_offset < end]
            if msgs:
                yield msgs
            offset = max(result.next_begin_offset, offset + 1)
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


def _data_loss(key: QueueKey, start: int, end: int, fail: bool) -> None:
    what = f"offsets [{start}, {end}) of {key.topic} {key.name} are no longer on the broker"
    if fail:
        raise DataLossError(f"{what}; set failOnDataLoss=false to skip them with a warning")
    log.warning("%s; skipped (failOnDataLoss=false)", what)
