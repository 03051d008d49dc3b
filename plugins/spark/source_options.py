"""Options of ``spark.read`` / ``spark.readStream`` ``.format("tidemq")`` (Kafka's names where the concept is the same).

Kafka's option names are primary (``subscribe``, ``subscribePattern``, ``assign``, ...); tidemq's
older names stay as aliases (``topic``, ``topicPattern``, ``timeoutMs``, ``consumerGroup``).
Names are case-insensitive, as Spark's options are.  Parsing imports no PySpark.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from tidemq.filter import EXPRESSION_SQL92, EXPRESSION_TAG

from .client_options import ClientOptions
from .options import (
    DEFAULT_GROUP,
    EARLIEST,
    Offsets,
    TidemqSparkError,
    _bool,
    _int,
    _require,
    offsets_from_json,
    parse_queue_name,
)

log = logging.getLogger(__name__)

#: Kafka's default ``maxTriggerDelay``.
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
STRATEGIES = ("error", "latest")

#: Every option the source reads (Kafka name first, then tidemq's alias), lower-cased.
KNOWN_OPTIONS = frozenset(
    name.lower()
    for name in (
        "namesrv",
        "subscribe",
        "topic",
        "subscribePattern",
        "topicPattern",
        "assign",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "endingTimestamp",
        "startingOffsetsByTimestamp",
        "endingOffsetsByTimestamp",
        "startingOffsetsByTimestampStrategy",
        "maxOffsetsPerTrigger",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "minPartitions",
        "maxRecordsPerPartition",
        "failOnDataLoss",
        "consumerGroup",
        "kafka.group.id",
        "groupIdPrefix",
        "filter",
        "filterType",
        "pullBatchSize",
        "timeoutMs",
        "kafkaConsumer.pollTimeoutMs",
        "fetchOffset.numRetries",
        "fetchOffset.retryIntervalMs",
        "includeHeaders",
        "path",  # Spark adds it for load(path)
    )
)

#: Option names already warned about in this process (one warning per name, not per query).
_warned: set[str] = set()

_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {
    None: 1,
    "ms": 1,
    "s": 1000,
    "sec": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}


@attrs.frozen(order=True)
class AssignedQueue:
    """One entry of ``assign``: a queue id on one broker, or (``broker`` None) on every broker of the route."""

    topic: str
    broker: str | None
    queue_id: int


@attrs.frozen
class SourceOptions:
    """Parsed options of ``spark.read`` / ``spark.readStream`` ``.format("tidemq")``."""

    namesrv: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    assign: tuple[AssignedQueue, ...] | None = None
    starting: str | Offsets = "earliest"
    ending: str | Offsets = "latest"
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    starting_by_timestamp: Offsets = attrs.field(factory=dict)
    ending_by_timestamp: Offsets = attrs.field(factory=dict)
    timestamp_strategy: str = "error"
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    consumer_group: str = DEFAULT_GROUP
    commit_offsets: bool = False
    filter: str = "*"
    filter_type: str = EXPRESSION_TAG
    pull_batch_size: int = 256
    max_records_per_partition: int | None = None
    timeout_s: float = 10.0
    include_headers: bool = False
    fetch_offset_retries: int = 3
    fetch_offset_retry_interval_ms: int = 1000
    client: ClientOptions = ClientOptions()

    @property
    def assigned_topics(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a.topic for a in self.assign or ()))

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        where = "spark.readStream.format('tidemq')" if streaming else "spark.read.format('tidemq')"
        opts = _CaseInsensitive(options)
        warn_unknown(opts)
        namesrv = _require(opts, "namesrv", where)
        topic = _aliased(opts, "subscribe", "topic")
        pattern = _aliased(opts, "subscribePattern", "topicPattern")
        assign_raw = opts.get("assign")
        given = [
            n for n, v in (("subscribe", topic), ("subscribePattern", pattern), ("assign", assign_raw)) if v
        ]
        if len(given) != 1:
            raise TidemqSparkError(
                f"{where} needs exactly one of the options 'subscribe' (alias 'topic'), "
                f"'subscribePattern' (alias 'topicPattern') and 'assign'; got {given or 'none'}"
            )
        topics: tuple[str, ...] = ()
        if topic:
            topics = tuple(dict.fromkeys(t.strip() for t in str(topic).split(",") if t.strip()))
            if not topics:
                raise TidemqSparkError(f"option subscribe = {topic!r} names no topic")
        if pattern:
            try:
                re.compile(str(pattern))
            except re.error as exc:
                raise TidemqSparkError(
                    f"option subscribePattern = {pattern!r} is not a regex: {exc}"
                ) from None
        assign = parse_assign(str(assign_raw)) if assign_raw else None

        group = _aliased(opts, "kafka.group.id", "consumerGroup")
        prefix = opts.get("groupIdPrefix")
        if prefix is not None and not str(prefix).strip():
            raise TidemqSparkError("option groupIdPrefix is empty")
        starting = _offsets_option(opts, "startingOffsets", "latest" if streaming else "earliest")
        if starting == "committed" and not group:
            raise TidemqSparkError(
                "startingOffsets = committed needs option 'consumerGroup' (or 'kafka.group.id')"
            )
        for batch_only in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if streaming and opts.get(batch_only) is not None:
                raise TidemqSparkError(f"option {batch_only} is for batch reads only; streams have no end")
        ending = _offsets_option(opts, "endingOffsets", "latest")
        if ending in ("earliest", "committed"):
            raise TidemqSparkError(f"endingOffsets = {ending} is not allowed; use latest or JSON")
        if isinstance(ending, dict) and any(v == EARLIEST for v in ending.values()):
            raise TidemqSparkError("endingOffsets JSON may not use -2 (earliest)")
        strategy = str(opts.get("startingOffsetsByTimestampStrategy") or "error").strip().lower()
        if strategy not in STRATEGIES:
            raise TidemqSparkError(
                f"option startingOffsetsByTimestampStrategy = {strategy!r}; choices: error, latest"
            )

        max_rows = _int(opts, "maxOffsetsPerTrigger", None, 1)
        min_rows = _int(opts, "minOffsetsPerTrigger", None, 1)
        delay_raw = opts.get("maxTriggerDelay")
        for stream_only, value in (("minOffsetsPerTrigger", min_rows), ("maxTriggerDelay", delay_raw)):
            if not streaming and value is not None:
                raise TidemqSparkError(f"option {stream_only} is for streaming reads only")
        if min_rows is not None and max_rows is not None and min_rows > max_rows:
            raise TidemqSparkError(
                f"option minOffsetsPerTrigger = {min_rows} is above maxOffsetsPerTrigger = {max_rows}"
            )
        delay_ms = DEFAULT_MAX_TRIGGER_DELAY_MS if delay_raw is None else parse_duration_ms(delay_raw)

        filter_type = str(opts.get("filterType") or EXPRESSION_TAG).strip().upper()
        if filter_type not in (EXPRESSION_TAG, EXPRESSION_SQL92):
            raise TidemqSparkError(f"option filterType = {filter_type!r}; choices: TAG, SQL92")
        pull_batch = _int(opts, "pullBatchSize", 256, 1)
        assert pull_batch is not None
        if pull_batch > 1024:
            raise TidemqSparkError(f"option pullBatchSize = {pull_batch} must be <= 1024")
        _aliased(opts, "kafkaConsumer.pollTimeoutMs", "timeoutMs")  # both given: they must agree
        timeout_name = (
            "kafkaConsumer.pollTimeoutMs" if opts.get("kafkaConsumer.pollTimeoutMs") else "timeoutMs"
        )
        timeout_ms = _int(opts, timeout_name, 10_000, 1)
        retries = _int(opts, "fetchOffset.numRetries", 3, 0)
        interval = _int(opts, "fetchOffset.retryIntervalMs", 1000, 0)
        assert timeout_ms is not None and retries is not None and interval is not None
        if group:
            consumer_group = str(group).strip()
        elif prefix is not None:
            consumer_group = f"{str(prefix).strip()}-{uuid.uuid4()}"
        else:
            consumer_group = DEFAULT_GROUP
        return cls(
            namesrv=namesrv,
            topics=topics,
            topic_pattern=str(pattern) if pattern else None,
            assign=assign,
            starting=starting,
            ending=ending,
            starting_timestamp=_int(opts, "startingTimestamp", None),
            ending_timestamp=_int(opts, "endingTimestamp", None),
            starting_by_timestamp=_timestamps_option(opts, "startingOffsetsByTimestamp"),
            ending_by_timestamp=_timestamps_option(opts, "endingOffsetsByTimestamp"),
            timestamp_strategy=strategy,
            max_offsets_per_trigger=max_rows,
            min_offsets_per_trigger=min_rows,
            max_trigger_delay_ms=delay_ms,
            min_partitions=_int(opts, "minPartitions", None, 1),
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            consumer_group=consumer_group,
            commit_offsets=bool(group),
            filter=str(opts.get("filter") or "*").strip() or "*",
            filter_type=filter_type,
            pull_batch_size=pull_batch,
            max_records_per_partition=_int(opts, "maxRecordsPerPartition", None, 1),
            timeout_s=timeout_ms / 1000.0,
            include_headers=_bool(options, "includeHeaders", False),
            fetch_offset_retries=retries,
            fetch_offset_retry_interval_ms=interval,
            client=ClientOptions.parse(options),
        )


class _CaseInsensitive(Mapping[str, str]):
    """Options by lower-cased name (Spark hands a CaseInsensitiveDict; tests and callers may not)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._data = {str(k).lower(): v for k, v in options.items()}
        self._names = {str(k).lower(): str(k) for k in options}

    def __getitem__(self, key: str) -> str:
        return self._data[key.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names.values())

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: str, default: Any = None) -> Any:
        return self._data.get(key.lower(), default)


def warn_unknown(options: Mapping[str, str]) -> list[str]:
    """Warn once per process for each option name the source does not read (typo help); the names."""
    known = KNOWN_OPTIONS | {n.lower() for n in getattr(ClientOptions, "OPTION_NAMES", ())}
    unknown = []
    for name in options:
        low = str(name).lower()
        # kafka.* passthrough (security.protocol, sasl.*, ...) means nothing here and is ignored quietly
        if low in known or (low.startswith("kafka.") and low != "kafka.bootstrap.servers"):
            continue
        unknown.append(str(name))
        if low not in _warned:
            _warned.add(low)
            hint = " (use 'namesrv')" if low == "kafka.bootstrap.servers" else ""
            log.warning("format('tidemq') ignores unknown option %r%s", name, hint)
    return unknown


def _aliased(options: Mapping[str, str], kafka_name: str, alias: str) -> str | None:
    """The value of a Kafka-named option or its tidemq alias; both with different values is an error."""
    a, b = options.get(kafka_name), options.get(alias)
    a = str(a).strip() if a is not None and str(a).strip() else None
    b = str(b).strip() if b is not None and str(b).strip() else None
    if a is not None and b is not None and a != b:
        raise TidemqSparkError(
            f"options {kafka_name} = {a!r} and its alias {alias} = {b!r} disagree; give one"
        )
    return a if a is not None else b


def parse_duration_ms(raw: Any, name: str = "maxTriggerDelay") -> int:
    """``100ms``, ``30s``, ``5m``/``5min``, ``1h``, ``1d`` or plain milliseconds, as Spark's time strings."""
    m = _DURATION.match(str(raw))
    if not m:
        raise TidemqSparkError(f"option {name} = {raw!r} is not a duration like 100ms, 30s, 5m, 1h")
    unit = m.group(2).lower() if m.group(2) else None
    return int(m.group(1)) * _UNIT_MS[unit]


def parse_assign(raw: str) -> tuple[AssignedQueue, ...]:
    """``{"T": ["broker-a:0", "broker-b:1"]}`` or Kafka's ``{"T": [0, 1]}`` (those ids on every broker)."""
    example = '{"Topic": ["broker-a:0", "broker-b:1"]} or {"Topic": [0, 1]}'
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise TidemqSparkError(f"option assign is not JSON like {example}: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise TidemqSparkError(f"option assign must be a JSON object like {example}")
    out: list[AssignedQueue] = []
    for topic, queues in data.items():
        if not isinstance(queues, list) or not queues:
            raise TidemqSparkError(f"option assign: topic {topic!r} must map to a non-empty list of queues")
        for q in queues:
            if isinstance(q, int) and not isinstance(q, bool) and q >= 0:
                out.append(AssignedQueue(str(topic), None, q))
            elif isinstance(q, str):
                key = parse_queue_name(str(topic), q, "option assign")
                out.append(AssignedQueue(key.topic, key.broker, key.queue_id))
            else:
                raise TidemqSparkError(
                    f"option assign: queue {q!r} of topic {topic!r} is neither '<broker>:<queue id>' nor a queue id"
                )
    return tuple(dict.fromkeys(out))


def _timestamps_option(options: Mapping[str, str], key: str) -> Offsets:
    """``{"T": {"broker-a:0": 1700000000000}}``: a timestamp (ms since the epoch) per queue."""
    raw = options.get(key)
    if raw is None or not str(raw).strip():
        return {}
    try:
        data = json.loads(str(raw))
    except ValueError as exc:
        raise TidemqSparkError(
            f'option {key} is not JSON like {{"Topic": {{"broker-a:0": 1700000000000}}}}: {exc}'
        ) from None
    if not isinstance(data, dict):
        raise TidemqSparkError(
            f'option {key} must be a JSON object like {{"Topic": {{"broker-a:0": 1700000000000}}}}'
        )
    out: Offsets = {}
    for topic, queues in data.items():
        if not isinstance(queues, dict):
            raise TidemqSparkError(f"option {key}: topic {topic!r} must map queue names to timestamps")
        for name, ts in queues.items():
            if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
                raise TidemqSparkError(
                    f"option {key}: timestamp of {topic} {name} must be ms since the epoch (>= 0)"
                )
            out[parse_queue_name(str(topic), name, f"option {key}")] = ts
    return out


def _offsets_option(options: Mapping[str, str], key: str, default: str) -> str | Offsets:
    raw = options.get(key)
    if raw is None or not str(raw).strip():
        return default
    value = str(raw).strip()
    if value.lower() in ("earliest", "latest", "committed"):
        return value.lower()
    return offsets_from_json(value, f"option {key}")


__all__ = ["AssignedQueue", "SourceOptions", "parse_assign", "parse_duration_ms", "warn_unknown"]
