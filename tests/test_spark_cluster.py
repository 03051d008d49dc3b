"""The ``tidemq`` data source on a real multi-node Spark standalone cluster (issue 26).

A Spark master and two workers (``bin/spark-class`` from the pyspark package; each worker its own
process with one core, so each runs one executor) and a tidemq NameServer with two brokers
(``tidemq namesrv`` / ``tidemq broker`` subprocesses) serve the module.  The driver is this test
process.  Rows are tagged on the executors with the worker that ran their partition (see
:func:`spark_cluster_support.where_am_i`), which shows the source's partitions ran on both
workers.  Everything started is stopped at the end, even after a failure, and checked gone.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq_spark.environment import spark_problem

_PROBLEM = spark_problem()
if _PROBLEM is not None:
    pytest.skip(_PROBLEM, allow_module_level=True)

from spark_cluster_support import (  # noqa: E402
    WHERE_AM_I,
    ClusterStartError,
    SparkStandalone,
    TidemqCluster,
    where_am_i,
)

from tidemq.client import BlockingProducer, Message  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "spark_cluster.py"
ORDERS, RESULTS, STREAMED = "TestOrders", "TestResults", "TestStreamed"
QUEUES = 4  # per broker: 8 source partitions over 2 executors
MESSAGES = 4000
BROKERS = ("broker-a", "broker-b")
WORKERS = ("worker-1", "worker-2")


class Clusters:
    """The module's Spark standalone cluster and tidemq cluster."""

    def __init__(self, root: Path) -> None:
        self.spark = SparkStandalone(root / "spark", workers=len(WORKERS))
        self.mq = TidemqCluster(root / "tidemq", BROKERS)

    def start(self) -> None:
        # Started side by side: the JVMs take most of the time, the brokers a few seconds.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            # The workers are not waited for: they boot while the driver JVM starts (the `spark`
            # fixture), which then waits for them.
            futures: list[concurrent.futures.Future[Any]] = [
                pool.submit(self.spark.start, wait=False),
                pool.submit(self.mq.start),
            ]
            errors = [f.exception() for f in futures]
        for error in errors:
            if error is not None:
                self.stop()
                raise error

    def stop(self) -> None:
        self.spark.stop()
        self.mq.stop()


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    c = Clusters(tmp_path_factory.mktemp("standalone"))
    c.start()
    try:
        yield c
    finally:
        c.stop()
        left = {"spark": c.spark.leftovers(), "tidemq": c.mq.leftovers()}
        assert left == {"spark": [], "tidemq": []}, f"processes still running after stop: {left}"


@pytest.fixture(scope="module")
def produced(clusters: Clusters) -> dict[str, str]:
    """MESSAGES orders over both brokers' queues: body -> the broker it went to."""
    mq = clusters.mq
    for topic in (ORDERS, RESULTS, STREAMED):
        mq.create_topic(topic, QUEUES)
    sent: dict[str, str] = {}
    with BlockingProducer("cluster-test-producer", mq.namesrv) as producer:
        for start in range(0, MESSAGES, 50):  # one batch per request; the producer rotates queues
            batch = [Message(ORDERS, f"order-{i}".encode(), tags="Order") for i in range(start, start + 50)]
            result = producer.send_batch(batch)
            sent.update(dict.fromkeys((m.body.decode() for m in batch), result.queue.broker_name))
    assert set(Counter(sent.values())) == set(BROKERS), Counter(sent.values())
    return sent


def wait_for_executors(spark: Any, clusters: Clusters, count: int, timeout: float = 180.0) -> None:
    """Jobs start only once every worker's executor registered: else one executor may run them all."""
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while len(tracker.getExecutorInfos()) < count + 1:  # the driver is listed too
        if time.monotonic() > deadline:
            raise ClusterStartError(
                f"{len(tracker.getExecutorInfos()) - 1} of {count} executors registered in {timeout:.0f} s; "
                f"master status: {clusters.spark.status()}; worker logs:\n"
                + "\n".join(f"--- {p.name}:\n{p.tail(1500)}" for p in clusters.spark.procs[1:])
            )
        time.sleep(0.2)


@pytest.fixture(scope="class")
def spark(clusters: Clusters) -> Iterator[Any]:
    """A driver (this process) on the standalone master: one 1-core executor on each worker."""
    from pyspark.sql import SparkSession

    import tidemq_spark

    # The driver plans the data source, and executors run Python functions, with $PYSPARK_PYTHON.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master(clusters.spark.master_url)
        .appName("tidemq-spark-cluster-test")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", str(len(WORKERS)))
        .config("spark.executor.memory", "512m")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    try:
        session.sparkContext.setLogLevel("ERROR")
        tidemq_spark.register(session)
        clusters.spark.wait_workers()
        wait_for_executors(session, clusters, len(WORKERS))
        yield session
    finally:
        session.stop()


def tagged(df: Any) -> Any:
    """``df`` with the partition, worker and executor that produced each row."""
    from pyspark.sql import functions as F

    # Evaluated in the task that scans the partition (no shuffle in between).
    where = F.udf(where_am_i(), WHERE_AM_I, useArrow=False).asNondeterministic()
    return df.select("broker", "queue_id", "queue_offset", "body", where("queue_id").alias("ran")).select(
        "broker", "queue_id", "queue_offset", "body", "ran.*"
    )


def read(spark: Any, clusters: Clusters, topic: str) -> Any:
    return spark.read.format("tidemq").option("namesrv", clusters.mq.namesrv).option("topic", topic).load()


class TestOnTheCluster:
    def test_batch_read_runs_partitions_on_both_workers(
        self, spark: Any, clusters: Clusters, produced: dict[str, str]
    ) -> None:
        rows = tagged(read(spark, clusters, ORDERS)).collect()

        # Every message exactly once, each from the broker it was sent to.
        bodies = Counter(r.body.decode() for r in rows)
        assert len(rows) == MESSAGES and set(bodies) == set(produced) and max(bodies.values()) == 1
        assert {r.body.decode(): r.broker for r in rows} == produced
        assert len({(r.broker, r.queue_id, r.queue_offset) for r in rows}) == MESSAGES

        # One partition per queue; each ran on one executor of one worker; both workers ran some.
        ran_on = {(r.partition, r.worker, r.executor) for r in rows}
        partitions = Counter(p for p, _, _ in ran_on)
        assert sorted(partitions) == list(range(QUEUES * len(BROKERS))) and set(partitions.values()) == {1}
        per_worker = Counter(w for _, w, _ in ran_on)
        assert set(per_worker) == set(WORKERS), f"partitions per worker: {per_worker}"
        executors = {w: {e for _, w2, e in ran_on if w2 == w} for w in WORKERS}
        assert all(len(e) == 1 for e in executors.values()) and executors["worker-1"] != executors["worker-2"]
        # Separate processes: no Python worker pid is shared between the two workers' rows.
        pids = {w: {r.pid for r in rows if r.worker == w} for w in WORKERS}
        assert not pids["worker-1"] & pids["worker-2"], pids

    def test_write_from_both_workers_to_both_brokers(
        self, spark: Any, clusters: Clusters, produced: dict[str, str]
    ) -> None:
        from pyspark.sql import functions as F

        (
            tagged(read(spark, clusters, ORDERS))
            .select(
                F.lit(RESULTS).alias("topic"),
                F.concat(F.lit("done-"), F.col("body").cast("string")).alias("body"),
                F.col("worker").alias("tags"),  # which worker wrote the row
            )
            .write.format("tidemq")
            .option("namesrv", clusters.mq.namesrv)
            # Each task's producer rotates over the queues from the first one (broker-a's queue
            # 0): with 128-message batches a 500-row task would only fill broker-a's 4 queues.
            .option("batchSize", "50")
            .mode("append")
            .save()
        )
        back = (
            read(spark, clusters, RESULTS)
            .selectExpr("broker", "tags", "cast(body as string) as body")
            .collect()
        )
        assert sorted(r.body for r in back) == sorted(f"done-{b}" for b in produced)
        assert set(Counter(r.broker for r in back)) == set(BROKERS), Counter(r.broker for r in back)
        assert set(Counter(r.tags for r in back)) == set(WORKERS), Counter(r.tags for r in back)

    def test_streaming_available_now(
        self, spark: Any, clusters: Clusters, produced: dict[str, str], tmp_path: Path
    ) -> None:
        query = (
            tagged(
                spark.readStream.format("tidemq")
                .option("namesrv", clusters.mq.namesrv)
                .option("topic", ORDERS)
                .option("startingOffsets", "earliest")
                .load()
            )
            .selectExpr(f"'{STREAMED}' as topic", "body", "worker as tags")
            .writeStream.format("tidemq")
            .option("namesrv", clusters.mq.namesrv)
            .option("batchSize", "50")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(240), "the AvailableNow query did not finish in 240 s"
        finally:
            query.stop()
        assert query.exception() is None
        back = read(spark, clusters, STREAMED).selectExpr("broker", "tags", "body").collect()
        assert sorted(r.body.decode() for r in back) == sorted(produced)
        assert set(Counter(r.broker for r in back)) == set(BROKERS)
        assert set(Counter(r.tags for r in back)) == set(WORKERS)

    def test_example_job(self, spark: Any, clusters: Clusters) -> None:
        """``examples/spark_cluster.py``'s topic setup, producer and job, on this session.

        In-process: the example as a subprocess would be a second application, which waits for
        the workers' cores until this one ends and then starts its own driver and executors
        (two more minutes on a busy 2-core machine).
        """
        spec = importlib.util.spec_from_file_location("spark_cluster_example", EXAMPLE)
        assert spec is not None and spec.loader is not None
        example = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = example  # dataclasses look their module up there
        try:
            spec.loader.exec_module(example)
        finally:
            del sys.modules[spec.name]

        namesrv = clusters.mq.namesrv
        for topic in (example.ORDERS, example.RESULTS):
            example.create_topic(namesrv, topic, queues=QUEUES)  # on every broker, no -b
        example.produce_orders(namesrv, 600, "runA")
        example.produce_orders(namesrv, 100, "runB")  # another run's orders: filtered out
        summary = example.run_job(spark, namesrv, "runA")
        assert sum(summary.orders.values()) == 600 and set(summary.orders) == set(BROKERS), summary
        assert summary.partitions == QUEUES * len(BROKERS)
        assert set(summary.workers) == set(WORKERS), summary
        assert sum(summary.results.values()) == 600 and set(summary.results) == set(BROKERS), summary
        assert summary.lines()[1].startswith("partitions per worker: worker-1 ")
