"""Counters the admin tools read (GET_BROKER_RUNTIME_INFO, consumerProgress)."""

from __future__ import annotations

import time

import attrs


@attrs.define
class BrokerStats:
    """Message counts since start, and per-queue last commit times."""

    started_at: float = attrs.field(factory=time.time)
    put_count: int = 0
    put_bytes: int = 0
    get_count: int = 0
    get_bytes: int = 0
    #: (group, topic, queue id) -> ms timestamp of the last offset commit
    commit_times: dict[tuple[str, str, int], int] = attrs.field(factory=dict)

    def on_put(self, count: int, size: int) -> None:
        self.put_count += count
        self.put_bytes += size

    def on_get(self, count: int, size: int) -> None:
        self.get_count += count
        self.get_bytes += size

    def on_commit(self, group: str, topic: str, queue_id: int) -> None:
        self.commit_times[(group, topic, queue_id)] = int(time.time() * 1000)
