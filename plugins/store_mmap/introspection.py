"""The ``mmap`` store's figures (:class:`tidemq.store.StoreIntrospection`), read from its services.

Admin requests, runtime info and metrics read these instead of the store's attributes; the store
class takes them as a mixin, so they stay out of the facade (:mod:`.store`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidemq.flush import FlushPolicy, FlushStatistics

if TYPE_CHECKING:
    from .cleanup import CleanService
    from .commitlog import CommitLog
    from .reput import ConsumeQueueTable, Reput


class MmapIntrospection:
    """:class:`tidemq.store.StoreIntrospection` over the store's commit log, reput, queues and cleaner."""

    commitlog: CommitLog
    reput: Reput
    cqs: ConsumeQueueTable
    cleaner: CleanService
    flush_policy: FlushPolicy

    def dispatched_offset(self) -> int:
        """Where the reput service is: records before it are in the consume queues."""
        return self.reput.reput_from

    def flushed_offset(self) -> int:
        return self.commitlog.flushed_where

    def queue_entry(self, topic: str, queue_id: int, index: int) -> tuple[int, int, int] | None:
        """The entry as it is on disk (QUERY_CONSUME_QUEUE shows what the queue file holds)."""
        entry = self.cqs.entry(topic, queue_id, index)
        return None if entry is None else (int(entry[0]), int(entry[1]), int(entry[2]))

    def clean_expired_queues(self) -> int:
        return self.cleaner.clean_expired_queues()

    def flush_statistics(self) -> FlushStatistics | None:
        policy = self.flush_policy
        return policy if isinstance(policy, FlushStatistics) else None
