"""Example: the ``tidemq`` Spark source and sink on a Spark standalone cluster and two brokers.

    python examples/spark_cluster.py              # starts everything itself in a temp directory
    python examples/spark_cluster.py --master spark://10.0.0.5:7077 --namesrv 10.0.0.5:9876

Without ``--master`` it starts a Spark standalone master and two workers (one core each, every
one its own JVM, from the ``bin/spark-class`` launcher pyspark ships); without ``--namesrv`` a
tidemq NameServer and two brokers (``broker-a``, ``broker-b``) as subprocesses.  It creates
``ClusterOrders`` and ``ClusterResults`` on every broker, sends ``--messages`` orders, reads them
with the driver on the cluster (one Spark partition per broker queue, spread over the workers'
executors), tags each row with the worker that read it, writes one result per order back to
``ClusterResults`` (keyed by order: the ``key`` column spreads them over both brokers' queues)
and reads those back.  Messages carry a per-run tag, and the reads filter on it, so reruns on
the same brokers count only their own.  It prints rows per broker and partitions per worker,
then stops what it started.

With an existing cluster: every worker must run a Python with tidemq and pyarrow installed (the
driver sets ``spark.pyspark.python`` to its own interpreter path; override with ``--python``) and
reach the brokers' addresses as the NameServer lists them.  A worker is named by its work
directory (``--work-dir`` / ``SPARK_WORKER_DIR``): give workers on one host distinct ones.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ORDERS, RESULTS = "ClusterOrders", "ClusterResults"


def start_clusters(stack: ExitStack, tmp: Path, master: str | None, namesrv: str | None) -> tuple[str, str]:
    """Start what was not given; ``stack`` stops it.  Returns (master URL, NameServer address)."""
    if master is None or namesrv is None:
        # The launchers the tests use (tests/spark_cluster_support.py): subprocesses, free
        # loopback ports, logs under tmp, a failure naming the process with its log tail.
        sys.path.insert(0, str(ROOT / "tests"))
        from spark_cluster_support import SparkStandalone, TidemqCluster
    if namesrv is None:
        mq = stack.enter_context(TidemqCluster(tmp / "tidemq", ("broker-a", "broker-b")))
        namesrv = mq.namesrv
        print(f"started NameServer {namesrv} and brokers {mq.brokers}", file=sys.stderr)
    if master is None:
        spark_cluster = stack.enter_context(SparkStandalone(tmp / "spark", workers=2))
        master = spark_cluster.master_url
        print(f"started Spark master {master} and 2 workers under {tmp / 'spark'}", file=sys.stderr)
    return master, namesrv


def create_topic(namesrv: str, topic: str, queues: int) -> None:
    """``tidemq admin updateTopic`` without ``-b``: the topic on every master broker."""
    argv = [sys.executable, "-m", "tidemq", "admin", "updateTopic", "-t", topic, "-n", namesrv]
    subprocess.run(argv + ["-r", str(queues), "-w", str(queues)], check=True, capture_output=True)
    from tidemq_spark.client import TidemqSession

    deadline = time.monotonic() + 60
    with TidemqSession(namesrv) as s:
        while True:
            try:
                brokers = sorted({q.broker for q in s.queues(topic)})
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    print(f"topic {topic}: {queues} queues on each of {', '.join(brokers)}", file=sys.stderr)


def produce_orders(namesrv: str, count: int, run: str) -> None:
    """``count`` orders tagged with this run's id (the job reads only this run's orders)."""
    from tidemq.client import BlockingProducer, Message

    with BlockingProducer("example-cluster-orders", namesrv) as p:
        for i in range(0, count, 50):  # one batch per request: the producer rotates over all queues
            n = min(50, count - i)
            p.send_batch([Message(ORDERS, f"order-{i + j}".encode(), tags=run) for j in range(n)])


def connect(master: str, python: str) -> Any:
    """A driver on ``master`` with one 1-core executor per worker (two), once both are up."""
    from pyspark.sql import SparkSession

    import tidemq_spark

    # PySpark runs Python with $PYSPARK_PYTHON: the driver's data source planning and, shipped
    # with each Python function, the executors' workers (the conf covers the rest).
    os.environ["PYSPARK_PYTHON"] = python
    builder = SparkSession.builder
    if master.startswith(("spark://127.0.0.1:", "spark://localhost:")):
        builder = builder.config("spark.driver.host", "127.0.0.1")  # a loopback-only cluster
    spark = (
        builder.master(master)
        .appName("tidemq-spark-cluster-example")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.executor.memory", "512m")
        .config("spark.pyspark.python", python)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidemq_spark.register(spark)
    # Plan jobs once both executors are up: else the first one may run every partition.
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + 180
    while len(tracker.getExecutorInfos()) < 3 and time.monotonic() < deadline:  # 2 + the driver
        time.sleep(0.2)
    return spark


@dataclass
class Summary:
    orders: Counter[str]  # rows read per broker
    partitions: int
    workers: Counter[str]  # partitions per worker
    results: Counter[str]  # results read back per broker

    def lines(self) -> list[str]:
        return [
            f"orders read: {sum(self.orders.values())} ({_counts(self.orders)}) in {self.partitions} partitions",
            f"partitions per worker: {_counts(self.workers)}",
            f"results read back: {sum(self.results.values())} ({_counts(self.results)})",
        ]


def run_job(spark: Any, namesrv: str, run: str) -> Summary:
    """Read this run's orders on the executors, tag each with its worker, write one result each."""
    from pyspark.sql import functions as F

    def where_am_i(_: Any) -> tuple[int, str]:
        """On the executor reading the row: (Spark partition, worker).  An executor runs in
        ``<worker work dir>/<app id>/<executor id>``; its Python workers inherit that directory."""
        import os

        from pyspark import TaskContext

        ctx = TaskContext.get()  # set in every task
        return (ctx.partitionId() if ctx else -1), Path(os.getcwd()).parent.parent.name

    def read(topic: str) -> Any:
        return (
            spark.read.format("tidemq")
            .option("namesrv", namesrv)
            .option("topic", topic)
            .option("filter", run)  # this run's messages only (a tag filter, applied by the brokers)
            .load()
        )

    where = F.udf(where_am_i, "struct<partition: int, worker: string>", useArrow=False).asNondeterministic()
    orders = read(ORDERS).select("broker", "body", where("queue_id").alias("ran"))
    rows = orders.select("broker", "body", "ran.*").cache()  # read once: counted, then written
    per_broker = Counter({r.broker: r["count"] for r in rows.groupBy("broker").count().collect()})
    ran = {(r.partition, r.worker) for r in rows.select("partition", "worker").distinct().collect()}

    # One result per order, written from the executors.  The `key` column (Kafka's) picks the
    # queue by the order's hash: each order's results stay in order on one queue, and the orders
    # spread over every queue of both brokers.
    results = rows.select(
        F.lit(RESULTS).alias("topic"),
        F.lit(run).alias("tags"),
        F.col("body").cast("string").alias("key"),
        F.to_json(F.struct(F.col("body").cast("string").alias("order"), "broker", "worker")).alias("body"),
    )
    results.write.format("tidemq").option("namesrv", namesrv).mode("append").save()
    rows.unpersist()
    back = Counter({r.broker: r["count"] for r in read(RESULTS).groupBy("broker").count().collect()})
    return Summary(per_broker, len(ran), Counter(worker for _, worker in ran), back)


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description="tidemq source and sink on a Spark standalone cluster")
    ap.add_argument("--master", help="spark://HOST:PORT of a running master (default: start one + 2 workers)")
    ap.add_argument("--namesrv", help="an existing NameServer (default: start one + 2 brokers)")
    ap.add_argument("--messages", type=int, default=2000, help="orders to send")
    ap.add_argument("--python", default=sys.executable, help="the workers' Python (spark.pyspark.python)")
    args = ap.parse_args()

    from tidemq_spark.environment import spark_problem

    problem = spark_problem()
    if problem is not None:
        sys.exit(f"spark_cluster.py: {problem}")

    run = f"run{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:  # stops what was started, also on an error or Ctrl-C
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tidemq-spark-cluster-")))
        master, namesrv = start_clusters(stack, tmp, args.master, args.namesrv)
        for topic in (ORDERS, RESULTS):
            create_topic(namesrv, topic, queues=4)
        produce_orders(namesrv, args.messages, run)
        spark = connect(master, args.python)
        try:
            print("\n".join(run_job(spark, namesrv, run).lines()))
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
