"""Consumer group settings (SubscriptionGroupManager), persisted in ``config/subscriptionGroup.json``."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import attrs

from tidemq.broker.topics import DataVersion
from tidemq.jsonfile import CoalescedJsonWriter, read_json
from tidemq.names import InvalidNameError, check_group_name

log = logging.getLogger(__name__)


@attrs.define
class SubscriptionGroupConfig:
    """One consumer group (RocketMQ's SubscriptionGroupConfig)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    #: RocketMQ 5: POP delivers a queue's next messages only once the previous ones are acknowledged
    #: (FIFO, issue 39).  Written only when true, so 4.x tools see the 4.x shape.
    consume_message_orderly: bool = False

    _JSON = {
        "group_name": "groupName",
        "consume_enable": "consumeEnable",
        "consume_from_min_enable": "consumeFromMinEnable",
        "consume_broadcast_enable": "consumeBroadcastEnable",
        "retry_queue_nums": "retryQueueNums",
        "retry_max_times": "retryMaxTimes",
        "broker_id": "brokerId",
        "which_broker_when_consume_slowly": "whichBrokerWhenConsumeSlowly",
        "notify_consumer_ids_changed_enable": "notifyConsumerIdsChangedEnable",
        "consume_message_orderly": "consumeMessageOrderly",
    }

    def to_json(self) -> dict[str, Any]:
        out = {j: getattr(self, a) for a, j in self._JSON.items()}
        if not self.consume_message_orderly:
            del out["consumeMessageOrderly"]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SubscriptionGroupConfig:
        return cls(**{a: data[j] for a, j in cls._JSON.items() if j in data})


class SubscriptionGroupManager:
    """Group table; groups are created on first use when ``auto_create`` is on."""

    def __init__(self, path: Path, *, auto_create: bool, retry_max_times: int):
        self.path = path
        self.auto_create = auto_create
        self.retry_max_times = retry_max_times
        self.data_version = DataVersion()
        self._table: dict[str, SubscriptionGroupConfig] = {}
        self._lock = threading.Lock()
        self._writer = CoalescedJsonWriter(path, self.serialize)

    def load(self) -> None:
        data = read_json(self.path) or {}
        self.data_version = DataVersion.from_dict(data.get("dataVersion") or {})
        for name, cfg in (data.get("subscriptionGroupTable") or {}).items():
            problem = check_group_name(name)
            if problem:  # written by hand or by an older tidemq: never let it name a retry topic
                log.error("%s: group %r ignored: %s", self.path, name[:200], problem)
                continue
            self._table[name] = SubscriptionGroupConfig.from_json({"groupName": name, **cfg})

    def serialize(self) -> dict[str, Any]:
        """RocketMQ's SubscriptionGroupWrapper (the file, and GET_ALL_SUBSCRIPTIONGROUP_CONFIG)."""
        with self._lock:
            return {
                "subscriptionGroupTable": {n: c.to_json() for n, c in self._table.items()},
                "dataVersion": self.data_version.to_dict(),
            }

    def persist(self) -> None:
        """Write the file now (blocking: not on the event loop)."""
        self._writer.flush(force=True)

    def close(self) -> None:
        """Stop the background writer and write what is pending."""
        self._writer.close()

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self._table.get(group)

    def all(self) -> dict[str, SubscriptionGroupConfig]:
        return dict(self._table)

    def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        cfg = self._table.get(group)
        if cfg is not None or not self.auto_create:
            return cfg
        _require_group(group)
        with self._lock:
            cfg = self._table.setdefault(
                group, SubscriptionGroupConfig(group, retry_max_times=self.retry_max_times)
            )
            self.data_version = self.data_version.next_version()
        log.info("subscription group created: %s", group)
        self._writer.request()  # off the loop; 2 000 new groups are a few writes, not 2 000
        return cfg

    def update(self, cfg: SubscriptionGroupConfig) -> None:
        _require_group(cfg.group_name)
        with self._lock:
            self._table[cfg.group_name] = cfg
            self.data_version = self.data_version.next_version()
        self._writer.request()

    def delete(self, group: str) -> bool:
        with self._lock:
            removed = self._table.pop(group, None)
            self.data_version = self.data_version.next_version()
        self._writer.request()
        return removed is not None


def _require_group(group: str) -> None:
    """Refuse a name no group may have (the table's own check, behind the processors')."""
    problem = check_group_name(group)
    if problem:
        raise InvalidNameError(problem)
