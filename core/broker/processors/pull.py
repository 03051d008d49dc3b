"""PULL_MESSAGE with long polling and tag filtering (PullMessageProcessor + PullRequestHoldService).

A pull that finds nothing and carries the suspend flag is held until a message arrives in its queue
or its suspend timeout passes; the response body is the store's record buffers, unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import time

from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import Header, kv
from tidemq.filter import EXPRESSION_TAG, MessageFilter, SelectsEverything
from tidemq.observe import ConsumeContext
from tidemq.perm import is_readable
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.store import GetResult, GetStatus
from tidemq.transport import Connection

log = logging.getLogger(__name__)

# PullSysFlag
FLAG_COMMIT_OFFSET = 1
FLAG_SUSPEND = 2
FLAG_SUBSCRIPTION = 4
FLAG_CLASS_FILTER = 8

MAX_FILTER_CACHE = 1024


class PullProcessor:
    def __init__(self, broker: BrokerContext):
        self.broker = broker
        # (type, expression) -> what the store gets: None for a subscription that matches every
        # message ("*"), so the store does not decode each record's properties to ask (that
        # decode was most of a pull's cost).  Cached, isinstance included: against a runtime
        # Protocol it cost ~6 % of a pull.
        self._filters: dict[tuple[str, str], MessageFilter | None] = {}

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

    async def pull(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        b = self.broker
        h = Header(request.ext_fields, "PULL_MESSAGE")
        group = h.str("consumerGroup")
        topic = h.str("topic")
        queue_id = h.int("queueId")
        offset = h.int("queueOffset")
        max_nums = max(1, min(h.int("maxMsgNums", 32), 1024))
        sys_flag = h.int("sysFlag", 0)
        commit_offset = h.int("commitOffset", -1)
        # Capped: a peer asking for hours would pin its request (and its memory) that long.
        suspend_ms = min(max(h.int("suspendTimeoutMillis", 0), 0), b.settings.max_suspend_ms)
        has_suspend = bool(sys_flag & FLAG_SUSPEND)

        group_cfg = b.groups.find_or_create(group)
        if group_cfg is None:
            return request.reply(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist"
            )
        if not group_cfg.consume_enable:
            return request.reply(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        cfg = b.topics.get(topic)
        if cfg is None:
            return request.reply(
                ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
            )
        if not is_readable(cfg.perm):
            return request.reply(
                ResponseCode.NO_PERMISSION,
                f"the topic[{topic}] pulling message is forbidden (perm {cfg.perm})",
            )
        if queue_id < 0 or queue_id >= cfg.read_queue_nums:
            return request.reply(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:[{cfg.read_queue_nums}]",
            )
        if sys_flag & FLAG_SUBSCRIPTION:
            expression_type = h.str("expressionType", EXPRESSION_TAG) or EXPRESSION_TAG
            expression = h.str("subscription", "*")
        else:
            sub = b.consumers.find_subscription(group, topic)
            if sub is None:
                return request.reply(
                    ResponseCode.SUBSCRIPTION_NOT_EXIST,
                    f"the consumer's subscription not exist, group: {group}",
                )
            if sub.sub_version < h.int("subVersion", 0):
                return request.reply(
                    ResponseCode.SUBSCRIPTION_NOT_LATEST,
                    f"the consumer's subscription not latest, group: {group}",
                )
            expression_type, expression = sub.expression_type, sub.sub_string
        if expression_type != EXPRESSION_TAG and not b.settings.enable_property_filter:
            # RocketMQ's enablePropertyFilter = false: every non-TAG expression type is refused.
            return request.reply(
                ResponseCode.SYSTEM_ERROR,
                f"The broker does not support consumer to filter message by {expression_type}",
            )
        try:
            store_filter = self.store_filter(expression_type, expression)
        except (ValueError, LookupError) as exc:
            shown = expression if len(expression) <= 100 else expression[:97] + "..."
            return request.reply(  # quoted short and on one line: it may be a megabyte of anything
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"parse the consumer's subscription[{shown!r}] failed: {exc}",
            )

        # Commit the offset the consumer reports before holding, so a held pull never delays it.
        if has_suspend and sys_flag & FLAG_COMMIT_OFFSET and commit_offset >= 0 and b.is_master:
            b.offsets.commit(group, topic, queue_id, commit_offset)
            b.stats.on_commit(group, topic, queue_id)

        # As on the send path: a context and two hook calls only when a plugin listens.
        hooks = b.hooks
        ctx: ConsumeContext | None = None
        if hooks.tidemq_before_consume.get_hookimpls() or hooks.tidemq_after_consume.get_hookimpls():
            ctx = ConsumeContext(
                consumer_group=group,
                topic=topic,
                queue_id=queue_id,
                queue_offset=offset,
                client_address=conn.remote_address,
            )
            hooks.tidemq_before_consume(context=ctx)
        start = time.perf_counter()
        deadline = time.monotonic() + (
            suspend_ms / 1000.0 if has_suspend and b.settings.long_polling else 0.0
        )
        if has_suspend and not b.settings.long_polling:
            deadline = time.monotonic() + b.settings.short_polling_ms / 1000.0
        while True:
            result: GetResult = b.store.get_message(group, topic, queue_id, offset, max_nums, store_filter)
            code = _pull_code(result, offset)
            remaining = deadline - time.monotonic()
            if code != ResponseCode.PULL_NOT_FOUND or remaining <= 0 or not has_suspend:
                break
            if b.store.get_max_offset_in_queue(topic, queue_id) > offset:
                break  # indexed but not readable (removed data): answer now rather than spin on wake-ups
            hold = b.hold
            assert hold is not None  # created before the server starts: no pull arrives before it
            if hold.held_by(conn) >= b.settings.max_held_pulls_per_connection:
                # RocketMQ's clients retry a SYSTEM_BUSY pull after a pause, not at once.
                return request.reply(
                    ResponseCode.SYSTEM_BUSY,
                    f"[PULL_HOLD_LIMIT] {b.settings.max_held_pulls_per_connection} pulls of this "
                    "connection are held already; try again later",
                )
            if b.settings.long_polling:
                await hold.wait(topic, queue_id, offset, remaining, conn)
            else:
                await asyncio.sleep(remaining)
            if conn.closed:
                return None  # nobody to answer: the held pull ends with its connection
            if not b.running:
                result = b.store.get_message(group, topic, queue_id, offset, max_nums, store_filter)
                code = _pull_code(result, offset)
                break

        if ctx is not None:
            ctx.status = ResponseCode(code).name
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
        fields = kv(
            suggestWhichBrokerId=suggest,
            nextBeginOffset=result.next_begin_offset,
            minOffset=result.min_offset,
            maxOffset=result.max_offset,
        )
        if code == ResponseCode.SUCCESS:
            return request.reply(code, None, fields, body_parts=result.wire_parts)
        return request.reply(code, result.status.value, fields)


def _pull_code(result: GetResult, offset: int) -> int:
    """RocketMQ's mapping of GetMessageStatus to pull response codes."""
    s = result.status
    if s is GetStatus.FOUND:
        return ResponseCode.SUCCESS if result.buffers else ResponseCode.PULL_RETRY_IMMEDIATELY
    if s in (GetStatus.MESSAGE_WAS_REMOVING, GetStatus.NO_MATCHED_MESSAGE):
        return ResponseCode.PULL_RETRY_IMMEDIATELY
    if s in (GetStatus.NO_MATCHED_LOGIC_QUEUE, GetStatus.NO_MESSAGE_IN_QUEUE):
        return ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
    if s in (GetStatus.OFFSET_FOUND_NULL, GetStatus.OFFSET_OVERFLOW_ONE):
        return ResponseCode.PULL_NOT_FOUND
    if s in (GetStatus.OFFSET_OVERFLOW_BADLY, GetStatus.OFFSET_TOO_SMALL):
        return ResponseCode.PULL_OFFSET_MOVED
    return ResponseCode.PULL_NOT_FOUND


def register(register: ProcessorRegister) -> None:
    register.add(RequestCode.PULL_MESSAGE, PullProcessor(register.context).pull)
