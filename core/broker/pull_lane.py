"""The broker's end of the pull lane (issue 38): when a store's :class:`~tidemq.store.PullLane`
serves a PULL_MESSAGE.

A store may offer a pull lane (:func:`tidemq.store.pull_lane`); the mmap store offers the
compiled one (:mod:`tidemq._native._pull_lane`).  :class:`PullLaneEntry` takes it only where
nobody could see a difference from the Python handler (:meth:`PullService.pull
<tidemq.broker.services.pull.PullService.pull>`, which stays the reference and serves every
other pull):

* no plugin listens to ``tidemq_before_consume``/``tidemq_after_consume`` (checked per pull);
* the access check is done (the broker runs it before any handler, wrapped or not);
* the group exists and may consume, the topic is known and readable, the queue id is in range;
* the subscription (the pull's own, or the group's registered one of a recent enough version) is
  a TAG expression whose compiled filter matches everything or selects by tag (no SQL92, no class
  filter, no filter checking queue entries);
* the store's lane found records (nothing found goes the Python way, which may hold the pull
  until a message arrives, and so does anything the store's careful path must see).

A pull the lane takes has the Python handler's side effects (the offset commit a suspending pull
carries, the get statistics) and its answer, built by the same ``reply`` from the same figures:
equal bytes by construction (``tests/test_pull_lane.py`` checks it).  Nothing is changed before
the lane decides, so a declined pull is the handler's as if the lane were not there.
"""

from __future__ import annotations

from tidemq.broker.context import BrokerContext
from tidemq.broker.headers import kv
from tidemq.broker.services.pull import FLAG_COMMIT_OFFSET, FLAG_SUSPEND, MAX_PULL_NUMS, PullService
from tidemq.broker.services.status import Status
from tidemq.filter import EXPRESSION_TAG, queue_entry_check, tag_selection
from tidemq.perm import is_readable
from tidemq.plugins import Listeners
from tidemq.remoting.command import RemotingCommand
from tidemq.store import PullLane, pull_lane

#: Pulls the lane served and declined in this process (tests and benchmarks read them).
counters = {"served": 0, "declined": 0}


class PullLaneEntry:
    """The store's pull lane as the broker takes it (see the module docstring for when)."""

    __slots__ = ("_broker", "_lane", "_listened", "_service", "description")

    def __init__(self, broker: BrokerContext, service: PullService, lane: PullLane) -> None:
        self._broker = broker
        self._service = service
        self._lane = lane
        hooks = broker.hooks
        self._listened = Listeners(hooks.tidemq_before_consume, hooks.tidemq_after_consume)
        self.description = lane.description

    def serve(
        self,
        request: RemotingCommand,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        sys_flag: int,
        commit_offset: int,
        sub_version: int,
        subscription: tuple[str, str] | None,
    ) -> RemotingCommand | None:
        """The answer to a pull (its header read by the processor), or None: the handler serves it."""
        served = self._served(
            request,
            group,
            topic,
            queue_id,
            offset,
            max_nums,
            sys_flag,
            commit_offset,
            sub_version,
            subscription,
        )
        counters["declined" if served is None else "served"] += 1
        return served

    def _served(
        self,
        request: RemotingCommand,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        sys_flag: int,
        commit_offset: int,
        sub_version: int,
        subscription: tuple[str, str] | None,
    ) -> RemotingCommand | None:
        if self._listened():
            return None
        b = self._broker
        group_cfg = b.groups.find_or_create(group)
        if group_cfg is None or not group_cfg.consume_enable:
            return None
        cfg = b.topics.get(topic)
        if cfg is None or not is_readable(cfg.perm) or queue_id < 0 or queue_id >= cfg.read_queue_nums:
            return None
        if subscription is not None:
            expression_type, expression = subscription
        else:
            sub = b.consumers.find_subscription(group, topic)
            if sub is None or sub.sub_version < sub_version:
                return None
            expression_type, expression = sub.expression_type, sub.sub_string
        if expression_type != EXPRESSION_TAG:
            return None
        try:
            store_filter = self._service.store_filter(expression_type, expression)
        except (ValueError, LookupError):
            return None  # the handler answers SUBSCRIPTION_PARSE_FAILED
        tags = None
        if store_filter is not None:
            tags = tag_selection(store_filter)
            if tags is None or queue_entry_check(store_filter) is not None:
                return None
        count = max(1, min(max_nums, MAX_PULL_NUMS))
        # The confirm offset (controller SYNC masters): no record past it, a pull at it is held
        # by the handler; a lane answer that went past it (a tag filter skipping) is declined.
        limit = b.read_bound.limit(topic, queue_id) if b.read_bound.active else None
        if limit is not None:
            if offset >= limit:
                return None
            count = min(count, limit - offset)
        found = self._lane.pull(topic, queue_id, offset, count, tags)
        if found is None:
            return None
        max_offset = found.max_offset
        if limit is not None:
            if found.next_begin_offset > limit:
                return None
            max_offset = min(max_offset, limit)
        # The handler's side effects, in its order: the commit a suspending pull carries, then stats.
        if sys_flag & FLAG_SUSPEND and sys_flag & FLAG_COMMIT_OFFSET and commit_offset >= 0 and b.is_master:
            b.offsets.commit(group, topic, queue_id, commit_offset)
            b.stats.on_commit(group, topic, queue_id)
        b.stats.on_get(group, topic, found.message_count, found.total_size)
        suggest = 0
        if b.settings.slave_read_enable:
            suggest = (
                group_cfg.which_broker_when_consume_slowly
                if found.suggest_pulling_from_slave
                else group_cfg.broker_id
            )
        fields = kv(
            suggestWhichBrokerId=suggest,
            nextBeginOffset=found.next_begin_offset,
            minOffset=found.min_offset,
            maxOffset=max_offset,
        )
        return request.reply(Status.SUCCESS, None, fields, body_parts=found.wire)


def pull_lane_entry(broker: BrokerContext, service: PullService) -> PullLaneEntry | None:
    """The pull lane when the broker's store offers one."""
    lane = pull_lane(broker.store)
    return PullLaneEntry(broker, service, lane) if lane is not None else None
