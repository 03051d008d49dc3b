"""Options of ``spark.read`` / ``spark.readStream`` ``.format("tidemq")`` (Kafka's names where the concept is the same)."""

from __future__ import annotations

import re
from collections.abc import Mapping

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
)


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
    client: ClientOptions = ClientOptions()

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
            client=ClientOptions.parse(options),
        )


def _offsets_option(options: Mapping[str, str], key: str, default: str) -> str | Offsets:
    raw = options.get(key)
    if raw is None or not str(raw).strip():
        return default
    value = str(raw).strip()
    if value.lower() in ("earliest", "latest", "committed"):
        return value.lower()
    return offsets_from_json(value, f"option {key}")
