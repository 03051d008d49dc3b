"""Consumer group settings (SubscriptionGroupManager), persisted in ``config/subscriptionGroup.json``."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import attrs

from tidemq.broker.topics import DataVersion
from tidemq.jsonfile import read_json, write_json

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
    }

    def to_json(self) -> dict[str, Any]:
        return {j: getattr(self, a) for a, j in self._JSON.items()}

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

    def load(self) -> None:
        data = read_json(self.path) or {}
        self.data_version = DataVersion.from_dict(data.get("dataVersion") or {})
        for name, cfg in (data.get("subscriptionGroupTable") or {}).items():
            self._table[name] = SubscriptionGroupConfig.from_json({"groupName": name, **cfg})

    def persist(self) -> None:
        with self._lock:
            data = {
                "subscriptionGroupTable": {n: c.to_json() for n, c in self._table.items()},
                "dataVersion": self.data_version.to_dict(),
            }
        write_json(self.path, data)

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self._table.get(group)

    def all(self) -> dict[str, SubscriptionGroupConfig]:
        return dict(self._table)

    def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        cfg = self._table.get(group)
        if cfg is not None or not self.auto_create:
            return cfg
        with self._lock:
            cfg = self._table.setdefault(
                group, SubscriptionGroupConfig(group, retry_max_times=self.retry_max_times)
            )
            self.data_version = self.data_version.next_version()
        log.info("subscription group created: %s", group)
        self.persist()
        return cfg

    def update(self, cfg: SubscriptionGroupConfig) -> None:
        with self._lock:
            self._table[cfg.group_name] = cfg
            self.data_version = self.data_version.next_version()
        self.persist()

    def delete(self, group: str) -> bool:
        with self._lock:
            removed = self._table.pop(group, None)
            self.data_version = self.data_version.next_version()
        self.persist()
        return removed is not None
