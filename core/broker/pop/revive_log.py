"""The POP revive log in the commit log: ``rmq_sys_REVIVE_LOG_<cluster>``, replicated with it.

RocketMQ keeps POP checkpoints and acks as messages of this system topic, so a slave holds them
too and a new master revives what the old one had in flight.  tidemq does the same with the
journal's records (:mod:`tidemq.broker.pop.journal`): each operation's records are the body of one
message of queue 0, put before the answer leaves (the store appends synchronously: a SIGKILL loses
nothing a client saw; replication carries it to the slaves like any message).

*Snapshots.* Replay starts at the last complete snapshot, not at the beginning of the topic: every
:data:`SNAPSHOT_BYTES` of records (or :data:`SNAPSHOT_S` seconds, so the commit log's retention
never deletes the snapshot replay starts from) the master writes the live state (open checkpoints,
their ack bits, the pop offsets) as messages whose body starts with ``S <seq> <i> <n>``, chunk
``i`` of ``n``, put in one go (nothing interleaves).  Once every chunk is confirmed (readable:
in controller mode the in-sync set holds it, :mod:`tidemq.broker.confirmed`) it commits the first
chunk's queue offset as the consumer offset of :data:`SNAPSHOT_GROUP`, which slaves copy with the
other offsets (RocketMQ 5's revive service likewise reads, and checkpoints, only what its bounded
dispatch made readable).  Committed earlier, a failover could cut the snapshot the copied offset
names, and the new master would replay from its oldest record instead.  Replay from an older
offset is still right: a complete snapshot replaces the state built so far; an incomplete one (a
crash while writing it) is ignored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from tidemq.broker.pop.journal import Replayed, apply_records
from tidemq.errors import CorruptDataError
from tidemq.message import MessageInner, decode_message
from tidemq.store import GetStatus, PutResult, store_introspection

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext

log = logging.getLogger(__name__)

#: The consumer group whose offset on the revive topic is where the last full snapshot starts.
SNAPSHOT_GROUP = "CID_RMQ_SYS_REVIVE_LOG"
#: The group name replay reads the store with (store statistics only).
READ_GROUP = "CID_RMQ_SYS_REVIVE"
SNAPSHOT_BYTES = 16 << 20
SNAPSHOT_S = 3600.0
CHUNK_BYTES = 512 << 10  # snapshot records per message body
READ_BATCH = 32


def revive_topic(cluster: str) -> str:
    """RocketMQ's name: ``rmq_sys_REVIVE_LOG_<cluster>``."""
    return f"rmq_sys_REVIVE_LOG_{cluster}"


class ReviveLogError(OSError):
    """The store refused a revive-log record (disk full, store stopped): nothing was taken."""


class ReviveLog:
    """Appends records to the revive topic and replays them (on the master only)."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self.topic = revive_topic(broker.settings.cluster)
        #: Record bytes written since the last snapshot (the size replay reads).
        self.size = 0
        #: The put of the last record (its flush), and the commit-log end it reached.
        self.pending: Future[PutResult] | None = None
        self.last_end = 0
        self._seq = 0
        self._snapshot_at = time.monotonic()
        #: The last snapshot written and not confirmed yet: its first chunk's queue offset, the
        #: queue offset past its last chunk, and the last chunk's put.
        self._unconfirmed: tuple[int, int, Future[PutResult]] | None = None

    # ------------------------------------------------------------------ writes
    def append(self, data: bytes) -> None:
        """Put ``data`` (whole records) as one message; raises :class:`ReviveLogError` when refused.

        The store appends (and makes the record readable) before this returns; :attr:`pending`
        resolves once it is flushed as the store's flush mode says.
        """
        b = self.broker
        fut = b.store.put_message(
            MessageInner(self.topic, data, 0, born_host=b.store_host, store_host=b.store_host)
        )
        if fut.done():
            result = fut.result()
            if not result.ok:
                raise ReviveLogError(
                    f"the store refused a revive-log record: {result.status.name} {result.error}"
                )
            self.last_end = result.wrote_offset + result.wrote_bytes
        else:
            fut.add_done_callback(self._note_end)
        self.pending = fut
        self.size += len(data)

    def _note_end(self, fut: Future[PutResult]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            r = fut.result()
            if r.ok:
                self.last_end = max(self.last_end, r.wrote_offset + r.wrote_bytes)

    def snapshot_due(self) -> bool:
        return self.size > SNAPSHOT_BYTES or (
            self.size > 0 and time.monotonic() - self._snapshot_at > SNAPSHOT_S
        )

    def snapshot(self, records: Iterable[bytes], last_id: int) -> None:
        """Write the live state as a snapshot (``last_id``: the highest checkpoint id handed out);
        replay starts at it from now on."""
        chunks: list[list[bytes]] = [[]]
        size = 0
        for rec in records:
            if size + len(rec) > CHUNK_BYTES and chunks[-1]:
                chunks.append([])
                size = 0
            chunks[-1].append(rec)
            size += len(rec)
        self._seq += 1
        seq = f"{time.time_ns()}-{self._seq}"
        start = self.broker.store.get_max_offset_in_queue(self.topic, 0)
        n = len(chunks)
        for i, chunk in enumerate(chunks):
            self.append(f"S {seq} {i} {n} {last_id}\n".encode() + b"".join(chunk))
        self.size = 0
        self._snapshot_at = time.monotonic()
        assert self.pending is not None
        self._unconfirmed = (start, start + n, self.pending)
        self.confirm_snapshot()

    def confirm_snapshot(self) -> bool:
        """Name the last snapshot as where replay starts (the :data:`SNAPSHOT_GROUP` offset) once
        all of it is confirmed; True when it did now.  Called after :meth:`snapshot` and at every
        revive round (the confirm offset moves with the slaves' acknowledgements)."""
        unconfirmed = self._unconfirmed
        if unconfirmed is None:
            return False
        start, end, put = unconfirmed
        if not put.done():
            return False  # flushed as the flush mode requires first
        if put.cancelled() or put.exception() is not None or not put.result().ok:
            self._unconfirmed = None  # not all written: replay keeps starting at the older one
            log.warning("pop revive log: snapshot at %s:0@%d not complete; not named", self.topic, start)
            return False
        limit = self.broker.read_bound.limit(self.topic, 0)
        if limit is not None and limit < end:
            return False  # a failover could still cut it
        self._unconfirmed = None
        try:
            self.broker.offsets.commit(SNAPSHOT_GROUP, self.topic, 0, start)
        except ValueError:
            pass
        return True

    def forget_snapshot(self) -> None:
        """This broker no longer writes the revive log (a slave now): the new master names its own."""
        self._unconfirmed = None

    # ------------------------------------------------------------------ replay
    def caught_up(self) -> bool:
        """The store has indexed every record it holds (a promoted slave's last copied ones too)."""
        info = store_introspection(self.broker.store)
        if info is None:
            return True
        return info.dispatched_offset() >= self.broker.store.get_max_phy_offset()

    def replay(self) -> Replayed:
        """The state the records hold, from the last snapshot the offsets name to the end."""
        store = self.broker.store
        self.size = 0
        start = self.broker.offsets.query(SNAPSHOT_GROUP, self.topic, 0)
        low = store.get_min_offset_in_queue(self.topic, 0)
        off = start if start >= low else low
        end = store.get_max_offset_in_queue(self.topic, 0)
        if off > low and not self._snapshot_starts_at(off, end):
            # The offset slaves copied names a snapshot this log does not hold (whole): a failover
            # cut it (written past the confirm offset).  Every complete snapshot replaces the state built
            # before it, so replaying from the oldest record kept is right, only longer.
            log.warning(
                "pop revive log: no snapshot at %s:0@%d (cut by a failover?); replaying from %d",
                self.topic,
                off,
                low,
            )
            off = low
        reader = _Reader()
        while off < end:
            res = store.get_message(READ_GROUP, self.topic, 0, off, READ_BATCH)
            if res.status is GetStatus.OFFSET_TOO_SMALL:
                off = res.next_begin_offset
                continue
            if not res.buffers:
                if res.next_begin_offset <= off:
                    log.error(
                        "pop revive log: nothing readable at %s:0@%d of %d; replay stops",
                        self.topic,
                        off,
                        end,
                    )
                    break
                off = res.next_begin_offset
                continue
            for buf in res.buffers:
                try:
                    body = decode_message(buf).body
                except CorruptDataError as exc:
                    log.error("pop revive log: unreadable record skipped: %s", exc)
                    reader.state.skipped += 1
                    continue
                self.size += len(body)
                reader.feed(body)
            off = res.next_begin_offset
        state = reader.finish()
        state.prune()
        if state.skipped:
            log.warning("pop revive log %s: %d unreadable records skipped", self.topic, state.skipped)
        return state

    def _snapshot_starts_at(self, off: int, end: int) -> bool:
        """Whether a complete snapshot starts at queue offset ``off`` (its chunks follow each other:
        a snapshot is put in one go)."""
        seq, n, i = b"", 1, 0
        while i < n:
            if off + i >= end:
                return False
            res = self.broker.store.get_message(READ_GROUP, self.topic, 0, off + i, 1)
            if not res.buffers or res.queue_offsets[0] != off + i:
                return False
            try:
                head = decode_message(res.buffers[0]).body.partition(b"\n")[0].split(b" ")
                if len(head) != 5 or head[0] != b"S" or int(head[2]) != i:
                    return False
                if i == 0:
                    seq, n = head[1], int(head[3])
                elif head[1] != seq:
                    return False
            except (CorruptDataError, ValueError):
                return False
            i += 1
        return True


class _Reader:
    """Applies message bodies in order; a complete snapshot replaces the state built so far."""

    def __init__(self) -> None:
        self.state = Replayed()
        self._shadow: Replayed | None = None
        self._seq = ""
        self._next = 0

    def feed(self, body: bytes) -> None:
        if body.startswith(b"S "):
            head, _, records = body.partition(b"\n")
            try:
                _, seq, i_s, n_s, last_s = head.decode().split(" ")
                i, n, last_id = int(i_s), int(n_s), int(last_s)
            except (ValueError, UnicodeDecodeError):
                self.state.skipped += 1
                return
            if i == 0:
                self._shadow, self._seq, self._next = Replayed(), seq, 0
            if self._shadow is None or seq != self._seq or i != self._next:
                self._shadow = None  # a chunk out of place: that snapshot is not taken
                return
            apply_records(self._shadow, records)
            self._next += 1
            if self._next == n:
                shadow = self._shadow
                shadow.last_id = max(shadow.last_id, self.state.last_id, last_id)
                shadow.skipped += self.state.skipped
                self.state, self._shadow = shadow, None
            return
        self._shadow = None  # a snapshot interrupted (by a crash): the state before it stands
        apply_records(self.state, body)

    def finish(self) -> Replayed:
        return self.state
