"""What a POP request must name: a group that may consume, a readable topic and queue, an
invisible time in range; the group's retry topic and compiled filters."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidemq.broker.pop.handle import retry_topic_v1
from tidemq.broker.pop.results import INVALID_PARAMETER, MAX_INVISIBLE_MS, MIN_INVISIBLE_MS, PopError
from tidemq.filter import MessageFilter, SelectsEverything
from tidemq.perm import PERM_READ, PERM_WRITE, is_readable
from tidemq.remoting.codes import ResponseCode

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext


class Checks:
    def __init__(self, broker: BrokerContext, serving: Callable[[], bool], wake: Callable[[], None]) -> None:
        self.broker = broker
        self._serving = serving  # False while a new master rebuilds its state from the revive log
        self._wake = wake  # the revive task, which takes over as soon as it runs
        self._filters: dict[tuple[str, str], MessageFilter | None] = {}

    def check_group(self, group: str) -> Any:
        if not self.broker.is_master:
            # the state lives on the master; a slave's pops and acks would not reach it
            raise PopError(ResponseCode.NO_PERMISSION, "POP is served by the master; this broker is a slave")
        if not self._serving():
            self._wake()
            raise PopError(
                ResponseCode.SYSTEM_BUSY, "this broker just became master and is reading its POP revive log"
            )
        cfg = self.broker.groups.find_or_create(group)
        if cfg is None:
            raise PopError(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist"
            )
        if not cfg.consume_enable:
            raise PopError(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        return cfg

    def check_topic(self, topic: str, queue_id: int, *, any_queue: bool) -> Any:
        cfg = self.broker.topics.get(topic)
        if cfg is None:
            raise PopError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not is_readable(cfg.perm):
            raise PopError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] peeking message is forbidden")
        if not (any_queue and queue_id == -1) and not 0 <= queue_id < cfg.read_queue_nums:
            raise PopError(
                INVALID_PARAMETER,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:[{cfg.read_queue_nums}]",
            )
        return cfg

    @staticmethod
    def check_invisible(invisible_ms: int) -> None:
        if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            raise PopError(
                INVALID_PARAMETER,
                f"invisibleTime {invisible_ms} ms is out of range [{MIN_INVISIBLE_MS}, {MAX_INVISIBLE_MS}]",
            )

    def retry_config(self, group: str, topic: str) -> Any:
        """The group's POP retry topic, None while it has none.  Made again when the store holds
        messages for it but the table lost it (a crash before the topic table was written)."""
        retry = retry_topic_v1(topic, group)
        cfg = self.broker.topics.get(retry)
        if cfg is None and self.broker.store.get_max_offset_in_queue(retry, 0) > 0:
            cfg = self.broker.topics.create_in_send_back(retry, 1, PERM_READ | PERM_WRITE)
        return cfg

    def is_orderly(self, group: str) -> bool:
        cfg = self.broker.groups.get(group)
        return bool(getattr(cfg, "consume_message_orderly", False))

    def store_filter(self, expression_type: str, expression: str) -> MessageFilter | None:
        key = (expression_type, expression)
        if key in self._filters:
            return self._filters[key]
        factory = self.broker.filters.get(expression_type)
        if factory is None:
            raise LookupError(f"expression type {expression_type!r} is not installed")
        flt: MessageFilter | None = factory.compile(expression)
        if isinstance(flt, SelectsEverything) and flt.matches_all:
            flt = None
        if len(self._filters) > 1024:
            self._filters.clear()
        self._filters[key] = flt
        return flt
