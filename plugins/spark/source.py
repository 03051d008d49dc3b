"""The live ``tidemq`` source: batch and micro-batch readers over ConsumeQueue offset ranges.

Driver-side objects (readers planning partitions, stream readers tracking offsets) talk to the
NameServer and brokers through :class:`~tidemq_spark.client.TidemqSession`; partitions are plain
dataclasses (queue, broker address, offset range) pickled to the executors, whose ``read`` pulls
the range with tidemq's client API and yields Arrow record batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from tidemq.client import ClientError
from tidemq.remoting.errors import RemotingConnectError, RemotingTimeoutError

from .client import TidemqSession
from .options import (
    EARLIEST,
    LATEST,
    Offsets,
    QueueKey,
    TidemqSparkError,
    offsets_from_json,
    offsets_to_json,
    rate_limit,
)
from .schema import BatchBuilder, arrow_schema
from .source_options import SourceOptions

# ``unused-ignore`` in the fallbacks' ignores: without pyspark installed mypy sees Any there and
# the ignore is unused; the type check passes with and without the spark extra.
try:  # PySpark >= 4.2: admission control (maxOffsetsPerTrigger) and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - older PySpark 4.x
    ReadAllAvailable = ReadMaxRows = ReadLimit = None  # type: ignore[assignment,misc,unused-ignore]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


try:  # PySpark >= 4.3: minOffsetsPerTrigger as the engine's read limit
    from pyspark.sql.streaming.datasource import ReadMinRows
except ImportError:  # pragma: no cover - PySpark 4.0-4.2: the option alone carries it
    ReadMinRows = None  # type: ignore[assignment,misc,unused-ignore]


log = logging.getLogger(__name__)
T = TypeVar("T")

#: Rows per Arrow batch handed to Spark.
ARROW_BATCH_ROWS = 4096

Range = tuple[QueueKey, int, int]


def split_ranges(ranges: Sequence[Range], max_records: int | None, min_partitions: int | None) -> list[Range]:
    """Kafka's partition planning: cut ranges at ``max_records``, then, while there are fewer than
    ``min_partitions`` pieces, cut each piece into a share of ``min_partitions`` proportional to its size.
    """
    pieces: list[Range] = []
    for key, start, end in ranges:
        if end <= start:
            continue
        step = max_records or (end - start)
        pieces.extend((key, s, min(s + step, end)) for s in range(start, end, step))
    if not min_partitions or len(pieces) >= min_partitions:
        return pieces
    total = sum(e - s for _, s, e in pieces)
    out: list[Range] = []
    for key, start, end in pieces:
        size = end - start
        # round half up like Kafka; never more parts than offsets, never none
        parts = min(size, max(1, int(size * min_partitions / total + 0.5)))
        pos = start
        for i in range(parts):
            n = (end - pos) // (parts - i)  # the last part takes the rounding remainder
            out.append((key, pos, pos + n))
            pos += n
    return out


def _retryable(exc: BaseException) -> bool:
    # ClientError itself (not its subclasses) is "no NameServer answered": a connect problem
    return (
        isinstance(exc, (RemotingConnectError, RemotingTimeoutError, TimeoutError))
        or type(exc) is ClientError
    )


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One Spark partition: ConsumeQueue offsets ``[start, end)`` of one queue."""

    topic: str
    broker: str
    queue_id: int
    address: str
    start: int
    end: int

    @property
    def key(self) -> QueueKey:
        return QueueKey(self.topic, self.broker, self.queue_id)


class _RangeReader:
    """What batch and stream readers share: planning ranges and pulling them on executors."""

    opts: SourceOptions

    def _read_range(self, part: QueueRange) -> Iterator[Any]:
        o = self.opts
        builder = BatchBuilder(arrow_schema(o.include_headers), part.broker)
        with TidemqSession(o.namesrv, o.timeout_s, o.client) as session:
            for msgs in session.read_range(
                part.key,
                part.start,
                part.end,
                group=o.consumer_group,
                expression=o.filter,
                expression_type=o.filter_type,
                batch=o.pull_batch_size,
                fail_on_data_loss=o.fail_on_data_loss,
                address=part.address,
            ):
                builder.add_all(msgs)
                if len(builder) >= ARROW_BATCH_ROWS:
                    yield builder.flush()
        if len(builder):
            yield builder.flush()

    def _fetch(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (an offset or route lookup), retried on connect errors and timeouts
        ``fetchOffset.numRetries`` times, ``fetchOffset.retryIntervalMs`` apart."""
        retries = self.opts.fetch_offset_retries
        attempt = 0
        while True:
            try:
                return fn(*args)
            except Exception as exc:
                if not _retryable(exc):
                    raise
                attempt += 1
                name = getattr(fn, "__name__", "lookup")
                if attempt > retries:
                    raise TidemqSparkError(
                        f"{name} failed after {attempt} attempts (fetchOffset.numRetries = {retries}): {exc}"
                    ) from exc
                log.warning("%s failed (%s); retry %d of %d", name, exc, attempt, retries)
                time.sleep(self.opts.fetch_offset_retry_interval_ms / 1000.0)

    def _plan(self, session: TidemqSession, ranges: Sequence[Range]) -> list[QueueRange]:
        o = self.opts
        out = []
        for key, start, end in split_ranges(ranges, o.max_records_per_partition, o.min_partitions):
            addr = self._fetch(session.address, key)
            out.append(QueueRange(key.topic, key.broker, key.queue_id, addr, start, end))
        return out

    def _topics(self, session: TidemqSession) -> list[str]:
        topics = session.resolve_topics(self.opts.topics, self.opts.topic_pattern)
        if not topics and self.opts.topic_pattern is None:
            raise TidemqSparkError("no topic to read")
        return topics

    def _all_queues(self, session: TidemqSession) -> list[QueueKey]:
        if self.opts.assign is None:
            return [q for t in self._topics(session) for q in self._fetch(session.queues, t)]
        out: set[QueueKey] = set()
        for topic in self.opts.assigned_topics:
            have = self._fetch(session.queues, topic)
            for a in (a for a in self.opts.assign if a.topic == topic):
                match = [k for k in have if k.queue_id == a.queue_id and a.broker in (None, k.broker)]
                if not match:
                    names = ", ".join(k.name for k in sorted(have)) or "none"
                    raise TidemqSparkError(
                        f"option assign names queue {a.broker or '*'}:{a.queue_id} of topic {topic!r}, "
                        f"which the topic route does not have (it has {names})"
                    )
                out.update(match)
        return sorted(out)

    def _resolve(self, session: TidemqSession, key: QueueKey, spec: str | Offsets, default: int) -> int:
        """A start/end offsets spec for one queue as a concrete offset."""
        if spec == "committed":
            committed = self._fetch(session.committed_offset, key, self.opts.consumer_group)
            return committed if committed >= 0 else self._fetch(session.min_offset, key)
        if isinstance(spec, dict):
            value = spec.get(key, default)
        else:
            value = EARLIEST if spec == "earliest" else LATEST
        if value == EARLIEST:
            return self._fetch(session.min_offset, key)
        if value == LATEST:
            return self._fetch(session.max_offset, key)
        return value

    def _start(self, session: TidemqSession, key: QueueKey) -> int:
        """Kafka's precedence: startingTimestamp, then startingOffsetsByTimestamp, then startingOffsets."""
        o = self.opts
        ts = o.starting_timestamp if o.starting_timestamp is not None else o.starting_by_timestamp.get(key)
        if ts is None:
            return self._resolve(session, key, o.starting, EARLIEST)
        # tidemq's broker answers the max offset for a timestamp after the queue's last message
        found = self._fetch(session.search_offset, key, ts)
        if o.timestamp_strategy == "error" and found >= self._fetch(session.max_offset, key):
            raise TidemqSparkError(
                f"{key.topic} {key.name} has no message at or after timestamp {ts}; "
                "set startingOffsetsByTimestampStrategy=latest to start such queues at the latest offset"
            )
        return found

    def _end(self, session: TidemqSession, key: QueueKey) -> int:
        """endingTimestamp, then endingOffsetsByTimestamp, then endingOffsets; no match means latest (Kafka)."""
        o = self.opts
        ts = o.ending_timestamp if o.ending_timestamp is not None else o.ending_by_timestamp.get(key)
        if ts is None:
            return self._resolve(session, key, o.ending, LATEST)
        return self._fetch(session.search_offset, key, ts)

    def _check_named(self, queues: Sequence[QueueKey], *, ending: bool) -> None:
        o = self.opts
        named: list[tuple[str, Any]] = [
            ("startingOffsets", o.starting),
            ("startingOffsetsByTimestamp", o.starting_by_timestamp),
        ]
        if ending:
            named += [("endingOffsets", o.ending), ("endingOffsetsByTimestamp", o.ending_by_timestamp)]
        for what, spec in named:
            if isinstance(spec, dict):
                unknown = sorted(set(spec) - set(queues))
                if unknown:
                    k = unknown[0]
                    raise TidemqSparkError(
                        f"{what} names queue {k.name} of topic {k.topic!r}, which the query does not read "
                        "(not in the topic route, or not assigned)"
                    )


class TidemqBatchReader(_RangeReader, DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        o = self.opts
        ranges: list[Range] = []
        with TidemqSession(o.namesrv, o.timeout_s, o.client) as session:
            queues = self._all_queues(session)
            self._check_named(queues, ending=True)
            for key in queues:
                start = self._start(session, key)
                end = self._end(session, key)
                if end < start:
                    raise TidemqSparkError(
                        f"ending offset {end} of {key.topic} {key.name} is before its starting offset {start}"
                    )
                ranges.append((key, start, end))
            out = self._plan(session, ranges)
        log.info("tidemq batch read: %d partitions, %d offsets", len(out), sum(p.end - p.start for p in out))
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, QueueRange):  # Spark reads one placeholder when planning found none
            return iter(())
        return self._read_range(partition)


class TidemqStreamReader(_RangeReader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch source: offsets are ``{topic: {"broker:queueId": next offset}}``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._session: TidemqSession | None = None
        self._target: Offsets | None = None
        self._last_end: Offsets | None = None
        self._reported: Offsets | None = None  # latest offsets seen by the last latestOffset()
        self._last_trigger: float | None = None  # monotonic time of the last micro-batch (maxTriggerDelay)

    def __getstate__(self) -> dict[str, Any]:
        # The reader is pickled to executors for read(); the driver's connection stays behind.
        state = dict(self.__dict__)
        state["_session"] = None
        return state

    @property
    def session(self) -> TidemqSession:
        if self._session is None:
            self._session = TidemqSession(self.opts.namesrv, self.opts.timeout_s, self.opts.client)
        return self._session

    def _latest(self) -> Offsets:
        return {k: self._fetch(self.session.max_offset, k) for k in self._all_queues(self.session)}

    def initialOffset(self) -> dict:
        queues = self._all_queues(self.session)
        self._check_named(queues, ending=False)
        return offsets_to_json({k: self._start(self.session, k) for k in queues})

    def getDefaultReadLimit(self) -> Any:
        """The engine's read limit: ReadMinRows (min), else ReadMaxRows (max), else ReadAllAvailable.

        PySpark has no CompositeReadLimit, so when both options are set the limit carries the
        minimum and ``latestOffset`` takes the maximum from the options (as Kafka's composite does).
        """
        o = self.opts
        if ReadMinRows is not None and o.min_offsets_per_trigger:
            return ReadMinRows(o.min_offsets_per_trigger)
        if ReadMaxRows is not None and o.max_offsets_per_trigger:
            return ReadMaxRows(o.max_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def _limits(self, limit: Any) -> tuple[int | None, int | None]:
        """(min rows, max rows) for a read limit the engine passed to ``latestOffset``."""
        o = self.opts
        if limit is None or limit == self.getDefaultReadLimit():  # ours: every admission option applies
            return o.min_offsets_per_trigger, o.max_offsets_per_trigger
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            return None, limit.max_rows
        if ReadMinRows is not None and isinstance(limit, ReadMinRows):
            return limit.min_rows, None
        return None, None  # ReadAllAvailable (e.g. Trigger.Once): the options do not apply

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        if start is None:  # PySpark < 4.2 calls latestOffset() without arguments
            begin = (
                self._last_end
                if self._last_end is not None
                else offsets_from_json(self.initialOffset(), "start")
            )
        else:
            begin = offsets_from_json(start, "start offset")
        min_rows, max_rows = self._limits(limit)
        latest = self._latest()
        self._reported = latest
        if self._target is not None:
            latest = {k: min(v, self._target.get(k, begin.get(k, 0))) for k, v in latest.items()}
            min_rows = None  # Trigger.AvailableNow ignores minOffsetsPerTrigger, as Kafka does
        end = dict(begin)
        for k, v in latest.items():
            end[k] = max(v, begin.get(k, 0))  # new queues start at 0; offsets never go back
        if min_rows and self._wait_for_more(begin, end, min_rows):
            return offsets_to_json(begin)
        if max_rows:
            end = rate_limit(begin, end, max_rows)
        return offsets_to_json(end)

    def _wait_for_more(self, begin: Offsets, end: Offsets, min_rows: int) -> bool:
        """True while fewer than ``min_rows`` offsets are new and ``maxTriggerDelay`` has not passed
        since the last micro-batch (or the query's start)."""
        now = time.monotonic()
        if self._last_trigger is None:
            self._last_trigger = now
        new = sum(max(0, v - begin.get(k, 0)) for k, v in end.items())
        waited_ms = (now - self._last_trigger) * 1000.0
        if new == 0:  # no micro-batch either way; the clock keeps running from the last one
            return False
        if new < min_rows and waited_ms < self.opts.max_trigger_delay_ms:
            log.debug("%d new offsets < minOffsetsPerTrigger %d; waited %.0f ms", new, min_rows, waited_ms)
            return True
        self._last_trigger = now
        return False

    def reportLatestOffset(self) -> dict | None:
        """The latest offsets of every queue read (PySpark >= 4.2 shows them as the progress' latestOffset)."""
        latest = self._reported if self._reported is not None else self._latest()
        return offsets_to_json(latest)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = offsets_from_json(start, "start offset")
        stop = offsets_from_json(end, "end offset")
        self._last_end = stop
        return self._plan(self.session, [(k, begin.get(k, 0), stop[k]) for k in sorted(stop)])

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, QueueRange):  # Spark reads one placeholder when planning found none
            return iter(())
        return self._read_range(partition)

    def commit(self, end: dict) -> None:
        stop = offsets_from_json(end, "committed offset")
        self._last_end = stop
        if not self.opts.commit_offsets:
            return
        for key, offset in stop.items():
            try:
                self.session.commit_offset(key, self.opts.consumer_group, offset)
            except Exception as exc:  # the checkpoint is the source of truth; the group offset is advisory
                log.warning(
                    "committing %s %s = %d for group %s failed: %s",
                    key.topic,
                    key.name,
                    offset,
                    self.opts.consumer_group,
                    exc,
                )

    def stop(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
