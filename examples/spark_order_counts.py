"""Example pipeline: order events -> per-minute counts per tag -> a results topic and Parquet.

    python examples/spark_order_counts.py                       # starts its own NameServer + broker
    python examples/spark_order_counts.py --namesrv 127.0.0.1:9876 --out /tmp/order-counts

Reads topic ``OrderEvents`` (tags = event kind: Created / Paid / Shipped) with the ``tidemq``
Spark source, counts events per store-time minute and tag, writes the counts as JSON messages to
``OrderCounts`` and as Parquet to ``--out``, then reads the results topic back and prints it.
Without ``--namesrv`` it starts a NameServer and broker in-process and produces sample orders.
Needs the ``spark`` extra (``pip install -e '.[spark]'``) and Java 17; it checks both first.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from local_cluster import start_cluster, stop_cluster


def produce_orders(namesrv: str, count: int) -> None:
    from tidemq.client import BlockingProducer, Message

    kinds = ["Created", "Paid", "Shipped"]
    with BlockingProducer("example-orders", namesrv) as p:
        for i in range(0, count, 50):
            batch = [
                Message(
                    "OrderEvents",
                    f'{{"order": {i + j}, "amount": {random.randint(5, 500)}}}'.encode(),
                    tags=random.choice(kinds),
                    keys=f"order-{i + j}",
                    properties={"region": random.choice(["eu", "us"])},
                )
                for j in range(min(50, count - i))
            ]
            p.send_batch(batch)


def wait_route(namesrv: str, topic: str) -> None:
    from tidemq_spark.client import TidemqSession

    deadline = time.monotonic() + 20
    with TidemqSession(namesrv) as s:
        while True:
            try:
                if s.queues(topic):
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description="order events -> per-minute counts per tag")
    ap.add_argument("--namesrv", help="an existing NameServer (default: start one in-process)")
    ap.add_argument("--orders", type=int, default=2000, help="sample orders to produce")
    ap.add_argument("--out", default=None, help="Parquet output directory")
    args = ap.parse_args()

    # Before any work: without pyspark or Java the run used to start a cluster, send the orders,
    # then fail and leave its data directory behind.
    from tidemq_spark.environment import spark_problem

    problem = spark_problem()
    if problem is not None:
        sys.exit(f"spark_order_counts.py: {problem}")

    tmp = Path(tempfile.mkdtemp(prefix="tidemq-example-"))
    out = args.out or str(tmp / "order-counts.parquet")
    loop = None
    namesrv = args.namesrv
    if namesrv is None:
        loop, namesrv = start_cluster(tmp, store={"commitlog_file_size": 16 * 1024 * 1024})
        print(f"started NameServer {namesrv} and broker-a in {tmp}", file=sys.stderr)
    try:
        produce_orders(namesrv, args.orders)  # topics are auto-created by the broker
        wait_route(namesrv, "OrderEvents")
        run_pipeline(namesrv, out)
    finally:
        if loop is not None:
            stop_cluster(loop)


def run_pipeline(namesrv: str, out: str) -> None:
    """Count OrderEvents per minute and tag; write OrderCounts and Parquet; print the results."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import tidemq_spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tidemq-order-counts")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidemq_spark.register(spark)
    try:
        events = (
            spark.read.format("tidemq")
            .option("namesrv", namesrv)
            .option("topic", "OrderEvents")
            .option("startingOffsets", "earliest")
            .load()
        )
        counts = (
            events.groupBy(F.window("store_timestamp", "1 minute").alias("w"), "tags")
            .count()
            .select(F.col("w.start").alias("minute"), F.col("tags").alias("kind"), "count")
            .orderBy("minute", "kind")
        )
        counts.write.mode("overwrite").parquet(out)
        (
            counts.select(
                F.lit("OrderCounts").alias("topic"),
                F.col("kind").alias("tags"),
                F.to_json(F.struct("minute", "kind", "count")).alias("body"),
            )
            .write.format("tidemq")
            .option("namesrv", namesrv)
            .mode("append")
            .save()
        )
        wait_route(namesrv, "OrderCounts")
        results = (
            spark.read.format("tidemq")
            .option("namesrv", namesrv)
            .option("topic", "OrderCounts")
            .load()
            .selectExpr("tags", "cast(body as string) as body")
            .orderBy("body")
        )
        results.show(truncate=False)
        print(f"Parquet: {out} ({spark.read.parquet(out).count()} rows)")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
