"""Kafka's source options of ``format("tidemq")``: parsing, planning and lag arithmetic, without Spark.

Each test names the feature it covers; the end-to-end runs against a broker are in
``tests/test_spark_source.py``.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import Any

import pytest

from tidemq_spark.options import QueueKey, TidemqSparkError
from tidemq_spark.source_options import (
    DEFAULT_MAX_TRIGGER_DELAY_MS,
    AssignedQueue,
    SourceOptions,
    _warned,
    parse_duration_ms,
)

NS = "127.0.0.1:9876"


def parse(streaming: bool = False, **options: str) -> SourceOptions:
    return SourceOptions.parse({"namesrv": NS, **options}, streaming=streaming)


# ---------------------------------------------------------------------------- subscribe / assign


def test_kafka_topic_names_with_aliases() -> None:
    assert parse(subscribe="A, B,A").topics == ("A", "B")
    assert parse(topic="A,B").topics == ("A", "B")
    assert parse(subscribe="A", topic="A").topics == ("A",)  # alias with the same value: fine
    assert parse(SUBSCRIBEPATTERN="Or.*").topic_pattern == "Or.*"  # names are case-insensitive
    assert parse(topicPattern="Or.*").topic_pattern == "Or.*"
    with pytest.raises(TidemqSparkError, match="subscribe = 'A' and its alias topic = 'B' disagree"):
        parse(subscribe="A", topic="B")
    with pytest.raises(TidemqSparkError, match="exactly one of .*got \\['subscribe', 'subscribePattern'\\]"):
        parse(subscribe="A", topicPattern="B.*")
    with pytest.raises(TidemqSparkError, match="exactly one of .*got \\['subscribe', 'assign'\\]"):
        parse(topic="A", assign='{"A": [0]}')
    with pytest.raises(TidemqSparkError, match="exactly one of .*got none"):
        parse()
    with pytest.raises(TidemqSparkError, match="subscribePattern = '\\(' is not a regex"):
        parse(subscribePattern="(")


def test_assign_json_both_forms_and_errors() -> None:
    got = parse(assign='{"T": ["broker-a:0", "broker-b:1", 2], "U": [0, 0]}')
    assert got.assign == (
        AssignedQueue("T", "broker-a", 0),
        AssignedQueue("T", "broker-b", 1),
        AssignedQueue("T", None, 2),
        AssignedQueue("U", None, 0),
    )
    assert got.assigned_topics == ("T", "U") and got.topics == () and got.topic_pattern is None
    for bad, msg in [
        ("[0]", "must be a JSON object"),
        ("{nope", "assign is not JSON"),
        ('{"T": []}', "non-empty list"),
        ('{"T": [-1]}', "neither '<broker>:<queue id>' nor a queue id"),
        ('{"T": ["broker-a"]}', "is not '<broker name>:<queue id>'"),
        ('{"T": [true]}', "neither"),
    ]:
        with pytest.raises(TidemqSparkError, match=msg):
            parse(assign=bad)


# ---------------------------------------------------------------------------- timestamps


def test_offsets_by_timestamp_and_strategy() -> None:
    o = parse(
        subscribe="T",
        startingOffsetsByTimestamp='{"T": {"b:0": 1700000000000}}',
        endingOffsetsByTimestamp='{"T": {"b:1": 1700000000001}}',
    )
    assert o.starting_by_timestamp == {QueueKey("T", "b", 0): 1700000000000}
    assert o.ending_by_timestamp == {QueueKey("T", "b", 1): 1700000000001}
    assert o.timestamp_strategy == "error"
    assert parse(subscribe="T", startingOffsetsByTimestampStrategy="LATEST").timestamp_strategy == "latest"
    with pytest.raises(
        TidemqSparkError, match="startingOffsetsByTimestampStrategy = 'none'; choices: error, latest"
    ):
        parse(subscribe="T", startingOffsetsByTimestampStrategy="none")
    with pytest.raises(TidemqSparkError, match="timestamp of T b:0 must be ms since the epoch"):
        parse(subscribe="T", startingOffsetsByTimestamp='{"T": {"b:0": -1}}')
    with pytest.raises(TidemqSparkError, match="startingOffsetsByTimestamp is not JSON"):
        parse(subscribe="T", startingOffsetsByTimestamp="earliest")
    with pytest.raises(TidemqSparkError, match="endingOffsetsByTimestamp is for batch reads only"):
        parse(True, subscribe="T", endingOffsetsByTimestamp='{"T": {"b:0": 1}}')


# ---------------------------------------------------------------------------- admission control


def test_min_offsets_and_trigger_delay() -> None:
    o = parse(
        True, subscribe="T", minOffsetsPerTrigger="100", maxOffsetsPerTrigger="500", maxTriggerDelay="30s"
    )
    assert (o.min_offsets_per_trigger, o.max_offsets_per_trigger, o.max_trigger_delay_ms) == (
        100,
        500,
        30_000,
    )
    assert parse(True, subscribe="T").max_trigger_delay_ms == DEFAULT_MAX_TRIGGER_DELAY_MS == 15 * 60_000
    assert [parse_duration_ms(v) for v in ("100ms", "30s", "5m", "5min", "2h", "1d", "250")] == [
        100,
        30_000,
        300_000,
        300_000,
        7_200_000,
        86_400_000,
        250,
    ]
    with pytest.raises(TidemqSparkError, match="maxTriggerDelay = '5 parsecs' is not a duration"):
        parse(True, subscribe="T", maxTriggerDelay="5 parsecs")
    with pytest.raises(
        TidemqSparkError, match="minOffsetsPerTrigger = 600 is above maxOffsetsPerTrigger = 500"
    ):
        parse(True, subscribe="T", minOffsetsPerTrigger="600", maxOffsetsPerTrigger="500")
    with pytest.raises(TidemqSparkError, match="minOffsetsPerTrigger is for streaming reads only"):
        parse(subscribe="T", minOffsetsPerTrigger="5")
    with pytest.raises(TidemqSparkError, match="minOffsetsPerTrigger = 0 must be >= 1"):
        parse(True, subscribe="T", minOffsetsPerTrigger="0")


# ---------------------------------------------------------------------------- partitions


def test_min_partitions_splits_in_proportion_and_composes_with_max_records() -> None:
    split_ranges = pytest.importorskip("tidemq_spark.source").split_ranges
    a, b, c = (QueueKey("T", "b", i) for i in range(3))
    assert parse(subscribe="T", minPartitions="8").min_partitions == 8
    with pytest.raises(TidemqSparkError, match="minPartitions = 0 must be >= 1"):
        parse(subscribe="T", minPartitions="0")

    # enough ranges already: unchanged (one per queue); empty ranges are dropped
    assert split_ranges([(a, 0, 10), (b, 0, 10), (c, 5, 5)], None, 2) == [(a, 0, 10), (b, 0, 10)]
    # 300 + 100 offsets over 8 partitions: 6 and 2 pieces, each contiguous and covering the range
    got = split_ranges([(a, 0, 300), (b, 100, 200)], None, 8)
    assert len(got) == 8
    assert [(s, e) for k, s, e in got if k == a] == [(i * 50, i * 50 + 50) for i in range(6)]
    assert [(s, e) for k, s, e in got if k == b] == [(100, 150), (150, 200)]
    # a small queue keeps one piece; a queue with fewer offsets than its share gets one piece per offset
    assert split_ranges([(a, 0, 2), (b, 0, 1000)], None, 10) == [(a, 0, 2)] + [
        (b, i * 100, i * 100 + 100) for i in range(10)
    ]
    assert split_ranges([(a, 0, 2), (b, 5, 7)], None, 10) == [(a, 0, 1), (a, 1, 2), (b, 5, 6), (b, 6, 7)]
    # maxRecordsPerPartition first (3 pieces), then minPartitions divides again
    got = split_ranges([(a, 0, 90)], 30, 6)
    assert got == [(a, i * 15, i * 15 + 15) for i in range(6)]
    assert split_ranges([(a, 0, 90)], 30, 2) == [(a, 0, 30), (a, 30, 60), (a, 60, 90)]


# ---------------------------------------------------------------------------- client options


def test_retries_timeouts_and_groups() -> None:
    o = parse(subscribe="T")
    assert (o.fetch_offset_retries, o.fetch_offset_retry_interval_ms, o.timeout_s) == (3, 1000, 10.0)
    o = parse(subscribe="T", **{"fetchOffset.numRetries": "5", "fetchOffset.retryIntervalMs": "20"})
    assert (o.fetch_offset_retries, o.fetch_offset_retry_interval_ms) == (5, 20)
    assert parse(subscribe="T", **{"kafkaConsumer.pollTimeoutMs": "2500"}).timeout_s == 2.5
    assert parse(subscribe="T", timeoutMs="1500").timeout_s == 1.5
    with pytest.raises(
        TidemqSparkError, match="pollTimeoutMs = '2500' and its alias timeoutMs = '10' disagree"
    ):
        parse(subscribe="T", timeoutMs="10", **{"kafkaConsumer.pollTimeoutMs": "2500"})
    with pytest.raises(TidemqSparkError, match="fetchOffset.numRetries = 'x' is not an integer"):
        parse(subscribe="T", **{"fetchOffset.numRetries": "x"})

    assert (parse(subscribe="T").consumer_group, parse(subscribe="T").commit_offsets) == (
        "tidemq-spark",
        False,
    )
    g = parse(subscribe="T", **{"kafka.group.id": "G1"})
    assert (g.consumer_group, g.commit_offsets) == ("G1", True)
    assert parse(subscribe="T", consumerGroup="G1", **{"kafka.group.id": "G1"}).consumer_group == "G1"
    with pytest.raises(
        TidemqSparkError, match="kafka.group.id = 'G1' and its alias consumerGroup = 'G2' disagree"
    ):
        parse(subscribe="T", consumerGroup="G2", **{"kafka.group.id": "G1"})
    p1, p2 = (parse(True, subscribe="T", groupIdPrefix="etl") for _ in range(2))
    assert p1.consumer_group.startswith("etl-") and len(p1.consumer_group) == len("etl-") + 36
    assert p1.consumer_group != p2.consumer_group and not p1.commit_offsets  # generated: nothing committed
    assert parse(subscribe="T", groupIdPrefix="etl", consumerGroup="G").consumer_group == "G"
    assert (
        parse(subscribe="T", startingOffsets="committed", **{"kafka.group.id": "G"}).starting == "committed"
    )


def test_offset_lookups_retry_connect_errors(caplog: Any) -> None:
    """fetchOffset.numRetries / retryIntervalMs around a real session whose NameServer is down."""
    reader_mod = pytest.importorskip("tidemq_spark.source")
    from tidemq_spark.client import TidemqSession

    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    opts = SourceOptions.parse(
        {
            "namesrv": dead,
            "subscribe": "T",
            "fetchOffset.numRetries": "2",
            "fetchOffset.retryIntervalMs": "150",
        },
        streaming=False,
    )
    reader = reader_mod.TidemqBatchReader(opts)
    with TidemqSession(dead, 1.0) as session, caplog.at_level(logging.WARNING):
        t0 = time.monotonic()
        with pytest.raises(
            TidemqSparkError, match="queues failed after 3 attempts \\(fetchOffset.numRetries = 2\\)"
        ):
            reader._all_queues(session)
        assert time.monotonic() - t0 >= 0.3  # two pauses of 150 ms
    assert "retry 2 of 2" in caplog.text


# ---------------------------------------------------------------------------- unknown options


def test_unknown_options_warn_once_and_kafka_only_options_are_quiet(caplog: Any) -> None:
    _warned.clear()
    kafka_only = {"includeHeaders": "true", "kafka.security.protocol": "SSL", "kafka.sasl.mechanism": "PLAIN"}
    with caplog.at_level(logging.WARNING, logger="tidemq_spark.source_options"):
        parse(subscribe="T", maxOffsetPerTrigger="5", **kafka_only)
        parse(subscribe="T", maxOffsetPerTrigger="5", **{"kafka.bootstrap.servers": "h:9092"})
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "format('tidemq') ignores unknown option 'maxOffsetPerTrigger'",
        "format('tidemq') ignores unknown option 'kafka.bootstrap.servers' (use 'namesrv')",
    ]


# ---------------------------------------------------------------------------- lag metrics


def test_offsets_behind_latest_from_progress_json_or_dicts() -> None:
    pytest.importorskip("pyspark")
    from tidemq_spark.lag import offsets_behind_latest, query_lag

    end = {"T": {"b:0": 10, "b:1": 30}, "U": {"b:0": 5}}
    latest = {"T": {"b:0": 40, "b:1": 30}, "U": {"b:0": 25}, "V": {"b:0": 3}}
    want = {"minOffsetsBehindLatest": 0, "maxOffsetsBehindLatest": 30, "avgOffsetsBehindLatest": 53 / 4}
    assert offsets_behind_latest({"endOffset": json.dumps(end), "latestOffset": json.dumps(latest)}) == want
    assert offsets_behind_latest({"endOffset": end, "latestOffset": latest}) == want

    class Progress:  # the attributes of pyspark's SourceProgress
        endOffset = json.dumps(end)
        latestOffset = None

    assert offsets_behind_latest(Progress()) == {}  # no reportLatestOffset: nothing to compute
    assert offsets_behind_latest({"endOffset": "5", "latestOffset": "7"}) == {}  # another source's shape
    assert query_lag([{"endOffset": end, "latestOffset": latest}, Progress()]) == want
