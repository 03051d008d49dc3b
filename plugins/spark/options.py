"""Options of the ``tidemq`` source and sink (modelled on Spark's Kafka connector) and offset JSON.

Offset JSON names each queue as ``"<broker name>:<queue id>"`` under its topic; values are
ConsumeQueue offsets (the next message to read), ``-2`` for earliest and ``-1`` for latest::

    {"TopicA": {"broker-a:0": 23, "broker-a:1": -2}, "TopicB": {"broker-b:0": -1}}

Queues a JSON does not name start at earliest (``startingOffsets``) or end at latest
(``endingOffsets``).  Streaming checkpoints store offsets in the same shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

from tidemq.errors import TidemqError
from tidemq.filter import EXPRESSION_SQL92, EXPRESSION_TAG

EARLIEST = -2
LATEST = -1
DEFAULT_GROUP = "tidemq-spark"
DEFAULT_PRODUCER_GROUP = "tidemq-spark-writer"


class TidemqSparkError(TidemqError):
    """A tidemq Spark source or sink was misconfigured or hit unreadable data (one-line message)."""


class DataLossError(TidemqSparkError):
    """Offsets the query needs were already cleaned from the broker (``failOnDataLoss``)."""


@attrs.frozen(order=True)
class QueueKey:
    """One queue of one topic on one broker (by broker name: addresses may change)."""

    topic: str
    broker: str
    queue_id: int

    @property
    def name(self) -> str:
        return f"{self.broker}:{self.queue_id}"


Offsets = dict[QueueKey, int]


def offsets_to_json(offsets: Mapping[QueueKey, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for key in sorted(offsets):
        out.setdefault(key.topic, {})[key.name] = int(offsets[key])
    return out


def parse_queue_name(topic: str, name: str, what: str) -> QueueKey:
    broker, sep, qid = str(name).rpartition(":")
    if not sep or not broker or not qid.isdigit():
        raise TidemqSparkError(f"{what}: queue {name!r} of topic {topic!r} is not '<broker name>:<queue id>'")
    return QueueKey(topic, broker, int(qid))


def offsets_from_json(data: Any, what: str) -> Offsets:
    """Parse offset JSON (a str or an already-decoded dict) into ``{QueueKey: offset}``."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise TidemqSparkError(f"{what} is neither earliest/latest nor JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TidemqSparkError(f'{what} JSON must be an object like {{"Topic": {{"broker-a:0": 5}}}}')
    out: Offsets = {}
    for topic, queues in data.items():
        if not isinstance(queues, dict):
            raise TidemqSparkError(f"{what}: topic {topic!r} must map queue names to offsets")
        for name, offset in queues.items():
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise TidemqSparkError(
                    f"{what}: offset of {topic} {name} must be an integer >= 0, -2 (earliest) or -1 (latest)"
                )
            out[parse_queue_name(topic, name, what)] = offset
    return out


def rate_limit(begin: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Cap the total offsets of a micro-batch at ``max_rows``, shared in proportion to each queue's backlog."""
    backlog = {k: end[k] - begin.get(k, 0) for k in end}
    total = sum(v for v in backlog.values() if v > 0)
    if total <= max_rows:
        return end
    out = dict(end)
    budget = max_rows
    for k in sorted(backlog):
        lag = backlog[k]
        if lag <= 0:
            continue
        take = min(lag, max(1, max_rows * lag // total), budget)
        out[k] = begin.get(k, 0) + take
        budget -= take
    return out


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise TidemqSparkError(f"option {key} = {raw!r} is not true or false")


def _int(options: Mapping[str, str], key: str, default: int | None, minimum: int = 0) -> int | None:
    raw = options.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise TidemqSparkError(f"option {key} = {raw!r} is not an integer") from None
    if value < minimum:
        raise TidemqSparkError(f"option {key} = {value} must be >= {minimum}")
    return value


def _require(options: Mapping[str, str], key: str, where: str) -> str:
    value = options.get(key)
    if value is None or not str(value).strip():
        raise TidemqSparkError(f"{where} needs option {key!r}")
    return str(value).strip()


@attrs.frozen
class SourceOptions:
    """Parsed options of ``spark.read`` / ``spark.readStream`` ``.format("tidemq")``."""

    namesrv: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    starting: str | Offsets = "earliest"
    ending: str | Offsets = "latest"
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    consumer_group: str = DEFAULT_GROUP
    commit_offsets: bool = False
    filter: str = "*"
    filter_type: str = EXPRESSION_TAG
    pull_batch_size: int = 256
    max_records_per_partition: int | None = None
    timeout_s: float = 10.0

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        where = "spark.readStream.format('tidemq')" if streaming else "spark.read.format('tidemq')"
        namesrv = _require(options, "namesrv", where)
        topic, pattern = options.get("topic"), options.get("topicPattern")
        if bool(topic) == bool(pattern):
            raise TidemqSparkError(f"{where} needs exactly one of the options 'topic' and 'topicPattern'")
        topics: tuple[str, ...] = ()
        if topic:
            topics = tuple(dict.fromkeys(t.strip() for t in str(topic).split(",") if t.strip()))
            if not topics:
                raise TidemqSparkError(f"option topic = {topic!r} names no topic")
        if pattern:
            try:
                re.compile(str(pattern))
            except re.error as exc:
                raise TidemqSparkError(f"option topicPattern = {pattern!r} is not a regex: {exc}") from None
        starting = _offsets_option(options, "startingOffsets", "latest" if streaming else "earliest")
        if starting == "committed" and "consumerGroup" not in options:
            raise TidemqSparkError("startingOffsets = committed needs option 'consumerGroup'")
        if streaming and options.get("endingOffsets") is not None:
            raise TidemqSparkError("option endingOffsets is for batch reads only; streams have no end")
        if streaming and options.get("endingTimestamp") is not None:
            raise TidemqSparkError("option endingTimestamp is for batch reads only; streams have no end")
        ending = _offsets_option(options, "endingOffsets", "latest")
        if ending in ("earliest", "committed"):
            raise TidemqSparkError(f"endingOffsets = {ending} is not allowed; use latest or JSON")
        if isinstance(ending, dict) and any(v == EARLIEST for v in ending.values()):
            raise TidemqSparkError("endingOffsets JSON may not use -2 (earliest)")
        filter_type = str(options.get("filterType") or EXPRESSION_TAG).strip().upper()
        if filter_type not in (EXPRESSION_TAG, EXPRESSION_SQL92):
            raise TidemqSparkError(f"option filterType = {filter_type!r}; choices: TAG, SQL92")
        pull_batch = _int(options, "pullBatchSize", 256, 1)
        assert pull_batch is not None
        if pull_batch > 1024:
            raise TidemqSparkError(f"option pullBatchSize = {pull_batch} must be <= 1024")
        timeout_ms = _int(options, "timeoutMs", 10_000, 1)
        assert timeout_ms is not None
        return cls(
            namesrv=namesrv,
            topics=topics,
            topic_pattern=str(pattern) if pattern else None,
            starting=starting,
            ending=ending,
            starting_timestamp=_int(options, "startingTimestamp", None),
            ending_timestamp=_int(options, "endingTimestamp", None),
            max_offsets_per_trigger=_int(options, "maxOffsetsPerTrigger", None, 1),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            consumer_group=str(options.get("consumerGroup") or DEFAULT_GROUP),
            commit_offsets=bool(options.get("consumerGroup")),
            filter=str(options.get("filter") or "*").strip() or "*",
            filter_type=filter_type,
            pull_batch_size=pull_batch,
            max_records_per_partition=_int(options, "maxRecordsPerPartition", None, 1),
            timeout_s=timeout_ms / 1000.0,
        )


def _offsets_option(options: Mapping[str, str], key: str, default: str) -> str | Offsets:
    raw = options.get(key)
    if raw is None or not str(raw).strip():
        return default
    value = str(raw).strip()
    if value.lower() in ("earliest", "latest", "committed"):
        return value.lower()
    return offsets_from_json(value, f"option {key}")


@attrs.frozen
class SinkOptions:
    """Parsed options of ``df.write`` / ``df.writeStream`` ``.format("tidemq")``."""

    namesrv: str
    topic: str | None = None
    producer_group: str = DEFAULT_PRODUCER_GROUP
    batch_size: int = 128
    max_batch_bytes: int = 1024 * 1024
    max_in_flight: int = 4
    timeout_s: float = 10.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        where = "df.write.format('tidemq')"
        timeout_ms = _int(options, "timeoutMs", 10_000, 1)
        batch = _int(options, "batchSize", 128, 1)
        max_bytes = _int(options, "maxBatchBytes", 1024 * 1024, 1024)
        in_flight = _int(options, "maxInFlight", 4, 1)
        assert timeout_ms is not None and batch is not None and max_bytes is not None
        assert in_flight is not None
        if max_bytes > 4 * 1024 * 1024:
            raise TidemqSparkError(f"option maxBatchBytes = {max_bytes} is over the broker's 4 MiB limit")
        return cls(
            namesrv=_require(options, "namesrv", where),
            topic=(str(options["topic"]).strip() or None) if options.get("topic") else None,
            producer_group=str(options.get("producerGroup") or DEFAULT_PRODUCER_GROUP),
            batch_size=batch,
            max_batch_bytes=max_bytes,
            max_in_flight=in_flight,
            timeout_s=timeout_ms / 1000.0,
        )
