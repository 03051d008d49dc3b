"""The broker's :class:`tidemq.replication.MetadataSink`: a slave's copy of its master's metadata.

Replication plugins write topics, consumer offsets, delay offsets and subscription groups through
this narrow interface instead of reaching into the broker's managers; names from the master are
checked here like names from any other peer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tidemq.broker.subscriptions import SubscriptionGroupConfig
from tidemq.names import check_group_name, check_stored_topic_name
from tidemq.remoting.protocol import DataVersion, TopicConfig

if TYPE_CHECKING:
    from tidemq.context import BrokerContext

log = logging.getLogger(__name__)


def _valid(problem: str | None, what: str, name: str) -> bool:
    if problem:
        log.warning("metadata from the master: %s %r skipped: %s", what, name[:200], problem)
        return False
    return True


class BrokerMetadataSink:
    """Applies the master's metadata to one broker's tables (each persisted)."""

    def __init__(self, broker: BrokerContext) -> None:
        self._broker = broker

    def topic_data_version(self) -> dict[str, Any]:
        return self._broker.topics.data_version.to_dict()

    def apply_topic_configs(self, body: dict[str, Any]) -> int:
        topics = self._broker.topics
        table: Mapping[str, Any] = body.get("topicConfigTable") or {}
        wanted = {
            name: TopicConfig.from_dict({"topicName": name, **cfg})
            for name, cfg in table.items()
            if _valid(check_stored_topic_name(name), "topic", name)
        }
        current = topics.all()
        for name, cfg in wanted.items():
            if current.get(name) != cfg:
                topics.update(cfg)
        for name in set(current) - set(wanted):
            topics.delete(name)
        topics.data_version = DataVersion.from_dict(body.get("dataVersion") or {})
        topics.persist()
        return len(wanted)

    def apply_consumer_offsets(self, body: dict[str, Any]) -> None:
        offsets = self._broker.offsets
        for key, queues in (body.get("offsetTable") or {}).items():
            topic, sep, group = key.partition("@")
            if not sep or not _valid(
                check_stored_topic_name(topic) or check_group_name(group), "offsets", key
            ):
                continue
            for qid, off in queues.items():
                offsets.commit(group, topic, int(qid), int(off))
        offsets.persist()

    def apply_delay_offsets(self, body: dict[str, Any]) -> None:
        schedule = self._broker.schedule
        for level, offset in (body.get("offsetTable") or {}).items():
            schedule.offsets[int(level)] = int(offset)
        schedule.persist(force=True)

    def apply_subscription_groups(self, body: dict[str, Any]) -> None:
        groups = self._broker.groups
        current = groups.all()
        for name, cfg in (body.get("subscriptionGroupTable") or {}).items():
            if not _valid(check_group_name(name), "group", name):
                continue
            wanted = SubscriptionGroupConfig.from_json({"groupName": name, **cfg})
            if current.get(name) != wanted:
                groups.update(wanted)
        # RocketMQ's slave replaces its table: a group deleted on the master goes here too.
        for name in set(current) - set(body.get("subscriptionGroupTable") or {}):
            groups.delete(name)

    def adopt_store_topics(self) -> list[str]:
        topics = self._broker.topics
        adopted = []
        for name, queue_ids in self._broker.store.topics().items():
            if topics.get(name) is None and queue_ids:
                n = max(queue_ids) + 1
                topics.update(TopicConfig(name, n, n))
                adopted.append(name)
        return adopted
