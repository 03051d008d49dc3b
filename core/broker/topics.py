"""Topic configurations (TopicConfigManager), persisted in ``config/topics.json``."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import attrs

from tidemq.broker.headers import DEFAULT_TOPIC
from tidemq.jsonfile import CoalescedJsonWriter, read_json
from tidemq.names import InvalidNameError, check_stored_topic_name
from tidemq.perm import PERM_INHERIT, PERM_READ, PERM_WRITE, is_inherited
from tidemq.remoting.protocol import DataVersion, TopicConfig

__all__ = ["SYSTEM_TOPICS", "DataVersion", "TopicConfig", "TopicConfigManager"]

#: RocketMQ 4.9's TopicValidator.SYSTEM_TOPIC_SET before a broker adds its own names.
SYSTEM_TOPICS: frozenset[str] = frozenset(
    {
        DEFAULT_TOPIC,
        "SCHEDULE_TOPIC_XXXX",
        "BenchmarkTest",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    }
)
#: RocketMQ's MixAll.REPLY_TOPIC_POSTFIX: ``<cluster>_REPLY_TOPIC`` is a system topic too.
REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"
#: How long a send to a topic it created waits for ``topics.json`` before it is answered anyway
#: (FLUSH_DISK_TIMEOUT: stored, not yet durable).
CREATION_WRITE_TIMEOUT_S = 5.0
#: Wait before the write of a creation: a burst of creations in one write, the first send's
#: answer not held long.
_WRITE_DELAY_S = 0.005

log = logging.getLogger(__name__)


class TopicConfigManager:
    """The broker's topic table; every change is written atomically and reported to ``on_change``."""

    def __init__(self, path: Path, *, auto_create_topic: bool, default_queue_nums: int, default_perm: int):
        self.path = path
        self.auto_create_topic = auto_create_topic
        self.default_queue_nums = default_queue_nums
        self.default_perm = default_perm
        self.data_version = DataVersion()
        self._table: dict[str, TopicConfig] = {}
        self._lock = threading.Lock()
        #: called after a change; the broker re-registers with the NameServers.
        self.on_change: Callable[[], None] = lambda: None
        self._writer = CoalescedJsonWriter(path, self.serialize_locked, delay_s=_WRITE_DELAY_S)
        #: Topics created on first use (a send, a send-back) whose creation is not on disk yet:
        #: topic -> the writer's ticket.  Empty nearly always: the send path tests it per send.
        self.unwritten: dict[str, int] = {}
        self._last_created = 0  # the ticket of the latest creation
        #: The cluster and broker names once :meth:`add_system_topics` ran (system topics too).
        self._own_names: tuple[str, ...] = ()

    # ------------------------------------------------------------------ persistence
    def load(self) -> None:
        data = read_json(self.path)
        if data:
            self.data_version = DataVersion.from_dict(data.get("dataVersion") or {})
            for name, cfg in (data.get("topicConfigTable") or {}).items():
                problem = check_stored_topic_name(name)
                if problem:  # written by hand or by an older tidemq: never let it become a path
                    log.error("%s: topic %r ignored: %s", self.path, name[:200], problem)
                    continue
                self._table[name] = TopicConfig.from_dict({"topicName": name, **cfg})
        # The template topic a producer's first send names exists only when auto-creation is on,
        # and carries PERM_INHERIT so the topics made from it inherit its read/write permission.
        if self.auto_create_topic:
            if DEFAULT_TOPIC not in self._table:
                self._table[DEFAULT_TOPIC] = TopicConfig(
                    DEFAULT_TOPIC,
                    self.default_queue_nums,
                    self.default_queue_nums,
                    PERM_INHERIT | self.default_perm,
                )
        else:
            self._table.pop(DEFAULT_TOPIC, None)

    def add_system_topics(
        self,
        cluster: str,
        broker_name: str,
        *,
        cluster_topic_enable: bool,
        broker_topic_enable: bool,
        trace_topic: str = "",
    ) -> None:
        """The broker's own system topics (TopicConfigManager's constructor in RocketMQ 4.9).

        The cluster-name and broker-name topics always exist; they are readable and writable
        (mqadmin ``clusterRT`` and ``sendMsgStatus`` send to them) when ``clusterTopicEnable`` /
        ``brokerTopicEnable`` are on, else they carry PERM_INHERIT alone.  ``<cluster>_REPLY_TOPIC``
        (request-reply) always exists with 1 queue, and ``trace_topic`` (``traceTopicEnable``'s
        ``msgTraceTopicName``) with 1 queue when given.  Called again when a switch changes at run time.
        """
        wanted = []
        reply_topic = f"{cluster}_{REPLY_TOPIC_POSTFIX}"
        for topic, enabled, queues, inherit in (
            (cluster, cluster_topic_enable, 16, PERM_INHERIT),
            (broker_name, broker_topic_enable, 1, PERM_INHERIT),
            (reply_topic, True, 1, 0),
            *(((trace_topic, True, 1, 0),) if trace_topic else ()),
        ):
            problem = check_stored_topic_name(topic)
            if problem:  # a cluster name no topic may have: RocketMQ would accept it, we cannot store it
                log.warning("no system topic for %r: %s", topic, problem)
                continue
            perm = inherit | (PERM_READ | PERM_WRITE if enabled else 0)
            wanted.append(TopicConfig(topic, queues, queues, perm))
        self._own_names = (cluster, broker_name, reply_topic, *((trace_topic,) if trace_topic else ()))
        changed = False
        with self._lock:
            for cfg in wanted:
                old = self._table.get(cfg.topic_name)
                if old is None or old.perm != cfg.perm:
                    # Queue numbers an operator changed are kept; only the permission follows the switch.
                    if old is not None:
                        cfg = attrs.evolve(old, perm=cfg.perm)
                    self._table[cfg.topic_name] = cfg
                    changed = True
        if changed:
            self._changed()

    def system_topics(self) -> set[str]:
        """RocketMQ's TopicValidator.getSystemTopicSet as this broker has it (GET_SYSTEM_TOPIC_LIST_FROM_BROKER)."""
        return set(SYSTEM_TOPICS) | set(self._own_names)

    def set_auto_create_topic(self, enabled: bool) -> None:
        """Add or remove the TBW102 template (``autoCreateTopicEnable`` changed at run time)."""
        with self._lock:
            self.auto_create_topic = enabled
            present = DEFAULT_TOPIC in self._table
            if enabled and not present:
                self._table[DEFAULT_TOPIC] = TopicConfig(
                    DEFAULT_TOPIC,
                    self.default_queue_nums,
                    self.default_queue_nums,
                    PERM_INHERIT | self.default_perm,
                )
            elif not enabled and present:
                del self._table[DEFAULT_TOPIC]
            else:
                return
        self._changed()

    def persist(self) -> None:
        """Write the file now (blocking: not on the event loop)."""
        self._writer.flush(force=True)

    def close(self) -> None:
        """Stop the background writer and write what is pending."""
        self._writer.close()

    def serialize_locked(self) -> dict[str, Any]:
        with self._lock:
            return self.serialize()

    def serialize(self) -> dict[str, Any]:
        """RocketMQ's TopicConfigSerializeWrapper (also the REGISTER_BROKER body part)."""
        return {
            "topicConfigTable": {name: cfg.to_dict() for name, cfg in self._table.items()},
            "dataVersion": self.data_version.to_dict(),
        }

    def _changed(self, created: str | None = None) -> None:
        self.data_version = self.data_version.next_version()
        ticket = self._writer.request()  # written off the loop, a burst of changes in one write
        if created is not None:
            self.unwritten[created] = self._last_created = ticket
        try:
            self.on_change()
        except Exception:
            log.exception("topic change listener failed")

    def when_written(self, *topics: str) -> Future[None] | None:
        """A future resolved once the creation of ``topics`` (those created on first use) is in
        ``topics.json``, failed with the write's OSError; None when it is there already.

        A send to a topic it created is answered only then (RocketMQ persists the table in
        createTopicInSendMessageMethod before the send goes on): a SIGKILL after the answer must
        not leave the message under a topic the restarted broker does not have.
        """
        unwritten = self.unwritten
        if unwritten and self._writer.written(self._last_created):
            unwritten.clear()  # all on disk: sends stop asking (the dict is tested per send)
            return None
        ticket = 0
        for topic in topics:
            t = unwritten.get(topic)
            if t is None:
                continue
            if self._writer.written(t):
                unwritten.pop(topic, None)  # written meanwhile: forgotten lazily, here
            else:
                ticket = max(ticket, t)
        return self._writer.when_written(ticket) if ticket else None

    async def written(self, *topics: str) -> str | None:
        """Waits until the creation of ``topics`` is in ``topics.json`` (:meth:`when_written`):
        None once it is, else why not (the write failed, or took over
        :data:`CREATION_WRITE_TIMEOUT_S`); the caller answers then, as a flush that timed out."""
        future = self.when_written(*topics)
        if future is None:
            return None
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[str | None] = loop.create_future()

        def answer(problem: str | None) -> None:
            if not waiter.done():
                waiter.set_result(problem)

        def done(f: Future[None]) -> None:  # on the writer's thread
            exc = f.exception()
            problem = None if exc is None else str(exc)
            try:
                loop.call_soon_threadsafe(answer, problem)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

        # Not asyncio.timeout: a send may be settled by a coroutine the transport drives, no task.
        timer = loop.call_later(
            CREATION_WRITE_TIMEOUT_S, answer, f"not written within {CREATION_WRITE_TIMEOUT_S:g} s"
        )
        future.add_done_callback(done)
        try:
            problem = await waiter
        finally:
            timer.cancel()
        if problem is None:
            return None
        return f"a topic created for this message is not in {self.path.name} yet: {problem}"

    # ------------------------------------------------------------------ queries
    def get(self, topic: str) -> TopicConfig | None:
        return self._table.get(topic)

    def all(self) -> dict[str, TopicConfig]:
        return dict(self._table)

    # ------------------------------------------------------------------ changes
    def update(self, config: TopicConfig) -> None:
        _require_topic(config.topic_name)
        with self._lock:
            self._table[config.topic_name] = config
        log.info("topic config updated: %s", config)
        self._changed()

    def delete(self, topic: str) -> bool:
        with self._lock:
            removed = self._table.pop(topic, None)
        if removed is None:
            return False
        log.info("topic deleted: %s", topic)
        self._changed()
        return True

    def create_in_send(
        self, topic: str, default_topic: str, client_queue_nums: int, sys_flag: int = 0
    ) -> TopicConfig | None:
        """Create ``topic`` from the template a producer named, or None when that is not allowed."""
        existing = self._table.get(topic)
        if existing is not None:
            return existing
        _require_topic(topic)
        template = self._table.get(default_topic)
        if template is None or not is_inherited(template.perm):
            return None
        queue_nums = (
            min(client_queue_nums, template.write_queue_nums)
            if client_queue_nums > 0
            else template.write_queue_nums
        )
        queue_nums = max(queue_nums, 1)
        cfg = TopicConfig(
            topic, queue_nums, queue_nums, template.perm & ~PERM_INHERIT, topic_sys_flag=sys_flag
        )
        with self._lock:
            cfg = self._table.setdefault(topic, cfg)
        log.info("topic %s auto-created from %s: %s", topic, default_topic, cfg)
        self._changed(created=topic)
        return cfg

    def create_in_send_back(self, topic: str, queue_nums: int, perm: int, sys_flag: int = 0) -> TopicConfig:
        """Create a retry or dead-letter topic on first use (createTopicInSendMessageBackMethod)."""
        existing = self._table.get(topic)
        if existing is not None:
            return existing
        _require_topic(topic)
        cfg = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=sys_flag)
        with self._lock:
            cfg = self._table.setdefault(topic, cfg)
        log.info("topic %s created: %s", topic, cfg)
        self._changed(created=topic)
        return cfg


def _require_topic(topic: str) -> None:
    """Refuse a name no topic may have (the table's own check, behind the processors')."""
    problem = check_stored_topic_name(topic)
    if problem:
        raise InvalidNameError(problem)
