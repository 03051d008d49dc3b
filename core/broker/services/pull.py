"""Pulls with long polling and filtering (PullMessageProcessor + PullRequestHoldService).

A pull that finds nothing and carries the suspend flag is held until a message arrives in its
queue or its suspend timeout passes; the result's body is the store's record buffers, unchanged
(ready for ``writev``/``sendfile``).  This is the seam of a compiled pull lane: a store capability
that walks the consume queue in C replaces ``store.get_message`` below and fills the same
:class:`PullResult`.
"""

from __future__ import annotations

import asyncio
import logging
import time

import attrs

from tidemq.broker.context import BrokerContext
from tidemq.broker.services.status import Outcome, Status
from tidemq.filter import EXPRESSION_TAG, MessageFilter, SelectsEverything
from tidemq.observe import ConsumeContext
from tidemq.perm import is_readable
from tidemq.plugins import Listeners
from tidemq.store import GetResult, GetStatus
from tidemq.transport import Connection

log = logging.getLogger(__name__)

# PullSysFlag
FLAG_COMMIT_OFFSET = 1
FLAG_SUSPEND = 2
FLAG_SUBSCRIPTION = 4
FLAG_CLASS_FILTER = 8

MAX_FILTER_CACHE = 1024
#: A pull asks for at most this many messages (and at least one).
MAX_PULL_NUMS = 1024


@attrs.frozen(slots=True)
class PullResult:
    """What a pull found: the status, the queue's offsets and, on SUCCESS, the records."""

    status: Status
    #: The store's GetStatus name when nothing was found; None on SUCCESS.
    remark: str | None
    #: The broker id the consumer should pull from next (RocketMQ's suggestWhichBrokerId).
    suggest_broker_id: int
    next_begin_offset: int
    min_offset: int
    max_offset: int
    #: The records as the store holds them (byte chunks to write as they are), on SUCCESS; else ().
    body: tuple[bytes | memoryview, ...]


def pull_status(result: GetResult, offset: int) -> Status:
    """RocketMQ's mapping of GetMessageStatus to pull statuses."""
    s = result.status
    if s is GetStatus.FOUND:
        return Status.SUCCESS if result.buffers else Status.PULL_RETRY_IMMEDIATELY
    if s in (GetStatus.MESSAGE_WAS_REMOVING, GetStatus.NO_MATCHED_MESSAGE):
        return Status.PULL_RETRY_IMMEDIATELY
    if s in (GetStatus.NO_MATCHED_LOGIC_QUEUE, GetStatus.NO_MESSAGE_IN_QUEUE):
        return Status.PULL_OFFSET_MOVED if offset != 0 else Status.PULL_NOT_FOUND
    if s in (GetStatus.OFFSET_FOUND_NULL, GetStatus.OFFSET_OVERFLOW_ONE):
        return Status.PULL_NOT_FOUND
    if s in (GetStatus.OFFSET_OVERFLOW_BADLY, GetStatus.OFFSET_TOO_SMALL):
        return Status.PULL_OFFSET_MOVED
    return Status.PULL_NOT_FOUND


class PullService:
    """Serves pulls (see the module docstring)."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        # (type, expression) -> what the store gets: None for a subscription that matches every
        # message ("*"), so the store does not decode each record's properties to ask (that
        # decode was most of a pull's cost).  Cached, isinstance included: against a runtime
        # Protocol it cost ~6 % of a pull.
        self._filters: dict[tuple[str, str], MessageFilter | None] = {}
        hooks = broker.hooks
        self._listened = Listeners(hooks.tidemq_before_consume, hooks.tidemq_after_consume)

    def store_filter(self, expression_type: str, expression: str) -> MessageFilter | None:
        """The compiled subscription for the store (cached: consumers repeat the same few)."""
        key = (expression_type, expression)
        try:
            return self._filters[key]
        except KeyError:
            pass
        factory = self.broker.filters.get(expression_type)
        if factory is None:
            raise LookupError(
                f"expression type {expression_type!r} is not installed; installed: {', '.join(sorted(self.broker.filters)) or 'none'}"
            )
        flt: MessageFilter | None = factory.compile(expression)
        if isinstance(flt, SelectsEverything) and flt.matches_all:
            flt = None
        if len(self._filters) >= MAX_FILTER_CACHE:
            self._filters.clear()
        self._filters[key] = flt
        return flt

    async def pull(
        self,
        peer: Connection,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        sys_flag: int,
        commit_offset: int,
        suspend_ms: int,
        sub_version: int,
        subscription: tuple[str, str] | None,
    ) -> PullResult | Outcome | None:
        """Up to ``max_nums`` messages of ``topic``/``queue_id`` from ``offset`` for ``group``.

        ``subscription`` is the (expression type, expression) the pull carries
        (FLAG_SUBSCRIPTION), None to use the one the group's heartbeat registered (of version
        ``sub_version`` at least).  A refusal is an :class:`Outcome`; None when the peer's
        connection closed while the pull was held (nobody to answer).
        """
        b = self.broker
        max_nums = max(1, min(max_nums, MAX_PULL_NUMS))
        # Capped: a peer asking for hours would pin its request (and its memory) that long.
        suspend_ms = min(max(suspend_ms, 0), b.settings.max_suspend_ms)
        has_suspend = bool(sys_flag & FLAG_SUSPEND)

        group_cfg = b.groups.find_or_create(group)
        if group_cfg is None:
            return Outcome(
                Status.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist"
            )
        if not group_cfg.consume_enable:
            return Outcome(Status.NO_PERMISSION, f"subscription group no permission, {group}")
        cfg = b.topics.get(topic)
        if cfg is None:
            return Outcome(Status.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not is_readable(cfg.perm):
            return Outcome(
                Status.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden (perm {cfg.perm})"
            )
        if queue_id < 0 or queue_id >= cfg.read_queue_nums:
            return Outcome(
                Status.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:[{cfg.read_queue_nums}]",
            )
        if subscription is not None:
            expression_type, expression = subscription
        else:
            sub = b.consumers.find_subscription(group, topic)
            if sub is None:
                return Outcome(
                    Status.SUBSCRIPTION_NOT_EXIST, f"the consumer's subscription not exist, group: {group}"
                )
            if sub.sub_version < sub_version:
                return Outcome(
                    Status.SUBSCRIPTION_NOT_LATEST, f"the consumer's subscription not latest, group: {group}"
                )
            expression_type, expression = sub.expression_type, sub.sub_string
        if expression_type != EXPRESSION_TAG and not b.settings.enable_property_filter:
            # RocketMQ's enablePropertyFilter = false: every non-TAG expression type is refused.
            return Outcome(
                Status.SYSTEM_ERROR,
                f"The broker does not support consumer to filter message by {expression_type}",
            )
        try:
            store_filter = self.store_filter(expression_type, expression)
        except (ValueError, LookupError) as exc:
            shown = expression if len(expression) <= 100 else expression[:97] + "..."
            return Outcome(  # quoted short and on one line: it may be a megabyte of anything
                Status.SUBSCRIPTION_PARSE_FAILED,
                f"parse the consumer's subscription[{shown!r}] failed: {exc}",
            )

        # Commit the offset the consumer reports before holding, so a held pull never delays it.
        if has_suspend and sys_flag & FLAG_COMMIT_OFFSET and commit_offset >= 0 and b.is_master:
            b.offsets.commit(group, topic, queue_id, commit_offset)
            b.stats.on_commit(group, topic, queue_id)

        # As on the send path: a context and two hook calls only when a plugin listens.
        hooks = b.hooks
        ctx: ConsumeContext | None = None
        if self._listened():
            ctx = ConsumeContext(
                consumer_group=group,
                topic=topic,
                queue_id=queue_id,
                queue_offset=offset,
                client_address=peer.remote_address,
            )
            hooks.tidemq_before_consume(context=ctx)
        start = time.perf_counter()
        deadline = time.monotonic() + (
            suspend_ms / 1000.0 if has_suspend and b.settings.long_polling else 0.0
        )
        if has_suspend and not b.settings.long_polling:
            deadline = time.monotonic() + b.settings.short_polling_ms / 1000.0
        # Reads stop at the confirm offset (controller SYNC masters: what the in-sync set holds);
        # a pull at that bound is held like one at the queue's end, and woken as the set acks.
        read = b.read_bound.get_message if b.read_bound.active else b.store.get_message
        max_offset = b.read_bound.max_offset if b.read_bound.active else b.store.get_max_offset_in_queue
        reread = False
        while True:
            result: GetResult = read(group, topic, queue_id, offset, max_nums, store_filter)
            status = pull_status(result, offset)
            remaining = deadline - time.monotonic()
            if status is not Status.PULL_NOT_FOUND or remaining <= 0 or not has_suspend:
                break
            if max_offset(topic, queue_id) > offset:
                if not reread:
                    # Readable since the read: a message arrived, or the confirm offset passed it
                    # (an acknowledgement between the read and here wakes no waiter: none yet).
                    reread = True
                    continue
                break  # indexed but not readable (removed data): answer now rather than spin on wake-ups
            hold = b.hold
            assert hold is not None  # created before the server starts: no pull arrives before it
            if hold.held_by(peer) >= b.settings.max_held_pulls_per_connection:
                # RocketMQ's clients retry a SYSTEM_BUSY pull after a pause, not at once.
                return Outcome(
                    Status.SYSTEM_BUSY,
                    f"[PULL_HOLD_LIMIT] {b.settings.max_held_pulls_per_connection} pulls of this "
                    "connection are held already; try again later",
                )
            if b.settings.long_polling:
                await hold.wait(topic, queue_id, offset, remaining, peer)
            else:
                await asyncio.sleep(remaining)
            if peer.closed:
                return None  # nobody to answer: the held pull ends with its connection
            if not b.running:
                result = read(group, topic, queue_id, offset, max_nums, store_filter)
                status = pull_status(result, offset)
                break

        if ctx is not None:
            ctx.status = status.name
            ctx.message_count = result.message_count
            ctx.elapsed_ms = (time.perf_counter() - start) * 1000
            hooks.tidemq_after_consume(context=ctx)
        b.stats.on_get(group, topic, result.message_count, result.total_size)
        # RocketMQ's rule (issue 7): with slaveReadEnable a backlog beyond the memory ratio sends the
        # group to whichBrokerWhenConsumeSlowly, otherwise to its brokerId; without it, the master.
        # A slave answers the same way, so consumers return to the master once it is back.
        suggest = 0
        if b.settings.slave_read_enable:
            suggest = (
                group_cfg.which_broker_when_consume_slowly
                if result.suggest_pulling_from_slave
                else group_cfg.broker_id
            )
        next_begin = result.next_begin_offset
        if status is Status.PULL_OFFSET_MOVED and not b.is_master:
            # RocketMQ's offsetCheckInSlave = false: a slave never moves a consumer's offset.  One
            # ahead of it read the master's newest messages (not copied here yet, or never: the
            # master died with them): pull again, from the master.  Moved to this slave's end or
            # to 0, the consumer would skip what the master sends next or re-read its queue.
            status, next_begin, suggest = Status.PULL_RETRY_IMMEDIATELY, offset, group_cfg.broker_id
        found = status is Status.SUCCESS
        return PullResult(
            status,
            None if found else result.status.value,
            suggest,
            next_begin,
            result.min_offset,
            result.max_offset,
            result.wire_parts if found else (),
        )
