"""The POP engine's memory: open checkpoints, pop offsets, FIFO queues, in-flight counts.

One :class:`~tidemq.broker.pop.journal.Checkpoint` per pop *batch* (its acks a bit mask), found by
id, by its handle's key ``(group, stored topic, queue, ckQueueOffset, popTime)`` and, for the
revive, through a deadline heap; in-flight counts kept per queue as checkpoints open, get acks and
retire, so figures never walk every checkpoint.  Every change that must survive a crash or a
failover is written to the revive log (:mod:`tidemq.broker.pop.revive_log`) by the caller first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from tidemq.broker.pop.handle import ORDER_REVIVE_QUEUE, RETRY_PREFIX, retry_topic_v1
from tidemq.broker.pop.journal import Checkpoint, Replayed, done_record, live_records, offset_record
from tidemq.broker.pop.results import INIT_MAX, now_ms
from tidemq.broker.pop.revive_log import ReviveLog

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext

QueueKey = tuple[str, str, int]  # (group, stored topic, queue id)
HandleKey = tuple[str, str, int, int, int]  # + (ckQueueOffset, popTime)


class CheckpointTable:
    def __init__(self, broker: BrokerContext, log: ReviveLog, wake: Callable[[], None]) -> None:
        self.broker = broker
        self.log = log
        self._wake = wake  # the revive task: a new earliest deadline
        self.cks: dict[int, Checkpoint] = {}
        self.by_key: dict[HandleKey, Checkpoint] = {}
        self.heap: list[tuple[int, int]] = []
        self.offsets: dict[QueueKey, int] = {}
        self.order: dict[QueueKey, set[int]] = {}  # FIFO queue -> its open checkpoints
        self.inflight: dict[QueueKey, int] = {}  # queue -> unacknowledged popped messages
        self.next_id = 1

    def install(self, state: Replayed) -> None:
        """Replace everything by a replayed state (start, or promotion to master)."""
        self.clear()
        self.offsets = dict(state.offsets)
        self.next_id = state.last_id + 1
        for ck in state.checkpoints.values():
            self.register(ck)

    def clear(self) -> None:
        self.cks.clear()
        self.by_key.clear()
        self.heap.clear()
        self.offsets.clear()
        self.order.clear()
        self.inflight.clear()

    def live_records(self) -> Iterator[bytes]:
        return live_records(self.offsets, list(self.cks.values()))

    def new_id(self) -> int:
        i = self.next_id
        self.next_id += 1
        return i

    # ------------------------------------------------------------------ bookkeeping
    def count(self, ck: Checkpoint, delta: int) -> None:
        key = (ck.group, ck.topic, ck.queue_id)
        n = self.inflight.get(key, 0) + delta
        if n > 0:
            self.inflight[key] = n
        else:
            self.inflight.pop(key, None)

    def register(self, ck: Checkpoint) -> None:
        self.cks[ck.id] = ck
        self.count(ck, len(ck.offsets) - ck.acked.bit_count())
        self.by_key[(ck.group, ck.topic, ck.queue_id, ck.start, ck.pop_time)] = ck
        heapq.heappush(self.heap, (ck.deadline, ck.id))
        if len(self.heap) > 2 * len(self.cks) + 4096:
            # Acknowledged checkpoints leave their entries behind until their deadline: with long
            # invisible times those would pile up, so the heap is rebuilt from the open ones.
            self.heap = [(c.deadline, c.id) for c in self.cks.values() if not c.done]
            heapq.heapify(self.heap)
        if ck.revive_qid == ORDER_REVIVE_QUEUE:
            self.order.setdefault((ck.group, ck.topic, ck.queue_id), set()).add(ck.id)
        if self.heap and self.heap[0][1] == ck.id:
            self._wake()

    def retire(self, ck: Checkpoint, record: bool = True) -> None:
        if id(self.cks.get(ck.id)) != id(ck):  # retired already (or a state rebuilt since)
            return
        if record:
            self.log.append(done_record(ck.id))
        del self.cks[ck.id]
        self.count(ck, ck.acked.bit_count() - len(ck.offsets))
        self.by_key.pop((ck.group, ck.topic, ck.queue_id, ck.start, ck.pop_time), None)
        if ck.revive_qid == ORDER_REVIVE_QUEUE:
            ids = self.order.get((ck.group, ck.topic, ck.queue_id))
            if ids is not None:
                ids.discard(ck.id)

    def offset(self, key: QueueKey, init_mode: int) -> int:
        """The queue's pop offset; a queue never popped starts at the group's consumer offset, else
        at its end (``INIT_MAX``, not for retry topics) or beginning."""
        off = self.offsets.get(key)
        if off is None:
            group, topic, qid = key
            off = self.broker.offsets.query(group, topic, qid)
            if off < 0:
                store = self.broker.store
                if init_mode == INIT_MAX and not topic.startswith(RETRY_PREFIX):
                    off = self.broker.read_bound.max_offset(topic, qid)  # confirmed end only
                else:
                    off = store.get_min_offset_in_queue(topic, qid)
            self.offsets[key] = off
        return off

    def set_offset(self, key: QueueKey, off: int, journal: bool = True) -> None:
        if self.offsets.get(key) == off:
            return
        if journal:
            self.log.append(offset_record(*key, off))
        self.offsets[key] = off
        self.commit_offset(key, off)

    def commit_offset(self, key: QueueKey, off: int) -> None:
        """The pop offset as the group's consumer offset too (``consumerProgress`` shows it)."""
        try:
            self.broker.offsets.commit(key[0], key[1], key[2], off)
        except ValueError:
            pass

    # ------------------------------------------------------------------ figures
    def next_order_expiry(self, group: str, topic: str) -> float:
        """Seconds until a FIFO checkpoint of the group's topic expires (a blocked queue frees up)."""
        now = now_ms()
        best = 3600.0
        for (g, t, _q), ids in self.order.items():
            if g == group and t == topic:
                for i in ids:
                    ck = self.cks.get(i)
                    if ck is not None and not ck.done:
                        best = min(best, max(ck.deadline - now, 0) / 1000 + 0.001)
        return best

    def in_flight(self, group: str | None = None, topic: str | None = None) -> int:
        """Popped, unacknowledged messages (of one group / topic, retry topics included)."""
        n = 0
        for (g, t, _q), count in self.inflight.items():
            if group is not None and g != group:
                continue
            if topic is not None and t != topic and t != retry_topic_v1(topic, g):
                continue
            n += count
        return n

    def in_flight_table(self) -> dict[tuple[str, str], int]:
        """(group, stored topic) -> popped, unacknowledged messages."""
        out: dict[tuple[str, str], int] = {}
        for (g, t, _q), count in self.inflight.items():
            out[(g, t)] = out.get((g, t), 0) + count
        return out

    def queue_progress(self, group: str, topic: str, queue_id: int) -> tuple[int, int] | None:
        """(pop offset, messages in flight) of a queue the group pops; None when it never popped it."""
        pulled = self.offsets.get((group, topic, queue_id))
        if pulled is None:
            return None
        return pulled, self.inflight.get((group, topic, queue_id), 0)

    def revive_backlog_ms(self) -> int:
        """How far past its deadline the oldest unrevived checkpoint is (0: revive is on time)."""
        now = now_ms()
        for _, ck_id in heapq.nsmallest(64, self.heap):
            ck = self.cks.get(ck_id)
            if ck is not None and not ck.done and ck.revive_qid != ORDER_REVIVE_QUEUE:
                return max(now - ck.deadline, 0)
        return 0
