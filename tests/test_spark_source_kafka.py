"""Kafka's streaming options of ``format("tidemq")`` through real streaming queries (issue 26).

Slow: its own ``local[2]`` SparkSession and broker (the fixtures of ``test_spark_source``), and
queries that wait on purpose (``maxTriggerDelay``).
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from typing import Any

import pytest

from tidemq_spark.environment import spark_problem

_PROBLEM = spark_problem()
if _PROBLEM is not None:
    pytest.skip(_PROBLEM, allow_module_level=True)

import test_spark_source  # noqa: E402
from test_spark_source import BROKER, Cluster, unique  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(300)]

#: The source tests' module-scoped fixtures: one broker and one SparkSession for this module too.
cluster = test_spark_source.cluster
spark = test_spark_source.spark


def test_min_offsets_per_trigger_waits_for_max_trigger_delay(spark: Any, cluster: Cluster) -> None:
    topic = unique("SparkMinRows")
    cluster.create_topic(topic, queues=2)
    cluster.produce(topic, 10)
    name = f"minrows_{topic}"
    q = (
        spark.readStream.format("tidemq")
        .option("namesrv", cluster.ns)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("minOffsetsPerTrigger", "30")
        .option("maxTriggerDelay", "4s")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    t0 = time.monotonic()
    try:

        def count() -> int:
            assert q.exception() is None, q.exception()
            return int(spark.sql(f"select count(*) from {name}").collect()[0][0])

        # Spark runs batch 0 as soon as the source has an initial offset; the source ends it at the
        # start (10 < 30), so batch 0 is empty and the 10 rows come in a later batch once
        # maxTriggerDelay has passed, with nothing produced in between.  Without
        # minOffsetsPerTrigger batch 0 reads them.
        deadline = t0 + 180

        def progress() -> list[tuple[int, int, str]]:
            return [(p["batchId"], p["numInputRows"], p["timestamp"]) for p in q.recentProgress]

        while not any(rows for _, rows, _ in progress()) and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.1)
        released = time.monotonic()
        assert count() == 10
        first = progress()
        assert first[0][:2] == (0, 0), first  # held back
        assert [rows for _, rows, _ in first if rows] == [10], first  # released by the delay alone
        stamps = [datetime.fromisoformat(ts.replace("Z", "+00:00")) for _, rows, ts in first]
        held = (stamps[[rows for _, rows, _ in first].index(10)] - stamps[0]).total_seconds()
        assert held >= 3.5, first  # the delay clock starts at batch 0's trigger: >= 4 s minus clock skew
        waited = released - t0
        batches = len([p for p in q.recentProgress if p["numInputRows"] > 0])
        cluster.produce(topic, 40, start=10)  # >= 30 at once: the next trigger takes them
        t1 = time.monotonic()
        while count() < 50 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert count() == 50
        logging.getLogger(__name__).info(
            "minOffsetsPerTrigger: first rows %.1f s after start (batches %s), second %.1f s after the produce",
            waited,
            first,
            time.monotonic() - t1,
        )
        assert len([p for p in q.recentProgress if p["numInputRows"] > 0]) == batches + 1
    finally:
        q.stop()
    assert q.exception() is None


def test_lag_metrics_from_progress_and_listener(spark: Any, cluster: Cluster, caplog: Any) -> None:
    from tidemq_spark.client import TidemqSession
    from tidemq_spark.lag import LagListener, offsets_behind_latest
    from tidemq_spark.options import QueueKey

    topic = unique("SparkLag")
    cluster.create_topic(topic, queues=2)
    cluster.produce(topic, 60)
    with TidemqSession(cluster.ns) as s:
        broker_max = {f"{BROKER}:{i}": s.max_offset(QueueKey(topic, BROKER, i)) for i in range(2)}
    listener = LagListener()
    spark.streams.addListener(listener)
    try:
        with caplog.at_level(logging.INFO, logger="tidemq_spark.lag"):
            q = (
                spark.readStream.format("tidemq")
                .option("namesrv", cluster.ns)
                .option("subscribe", topic)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", "20")
                .load()
                .writeStream.format("noop")
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination(120)
            assert q.exception() is None
            progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
            assert len(progress) == 3
            deadline = time.monotonic() + 20
            while caplog.text.count(f"query {q.id} batch") < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        spark.streams.removeListener(listener)
    for p in progress:
        src = p["sources"][0]
        latest, end = src["latestOffset"], src["endOffset"]
        latest = json.loads(latest) if isinstance(latest, str) else latest
        end = json.loads(end) if isinstance(end, str) else end
        assert latest[topic] == broker_max  # reportLatestOffset fills the progress' latestOffset
        behind = [broker_max[k] - end[topic][k] for k in broker_max]
        want = {
            "minOffsetsBehindLatest": min(behind),
            "maxOffsetsBehindLatest": max(behind),
            "avgOffsetsBehindLatest": sum(behind) / 2,
        }
        assert offsets_behind_latest(src) == want
        line = (
            f"query {q.id} batch {p['batchId']}: offsets behind latest min {min(behind)} "
            f"max {max(behind)} avg {sum(behind) / 2:.1f}"
        )
        assert line in caplog.text
    assert offsets_behind_latest(progress[0]["sources"][0])["avgOffsetsBehindLatest"] == 20.0  # 40 of 60 left
    assert listener.lag(q.id) == {
        "minOffsetsBehindLatest": 0,
        "maxOffsetsBehindLatest": 0,
        "avgOffsetsBehindLatest": 0.0,
    }
