"""Example pipeline: orders in, per-minute totals per region out, exactly once across a crash.

    python examples/spark_exactly_once_orders.py                  # starts its own NameServer + broker
    python examples/spark_exactly_once_orders.py --namesrv 127.0.0.1:9876 --orders 5000

1. Produces ``--orders`` JSON orders (``{"order", "region", "amount", "ts"}``, event times over
   ten minutes) to topic ``Orders``.
2. Runs a Spark streaming query in a child process: the ``tidemq`` source (a few hundred orders
   per micro-batch), a one-minute event-time window per region with a 30-second watermark
   (append mode: a window's total is emitted once, when the watermark passes it), written to
   topic ``OrderTotals`` by the sink with ``deliveryGuarantee = exactly-once``.
3. Kills that driver with SIGKILL in the middle (after two committed micro-batches), restarts it
   from the same checkpoint, and lets it finish.
4. Reads ``OrderTotals`` and checks every (window, region) total against the orders sent: each
   present exactly once, with the right count and sum.

Without ``--namesrv`` it starts a NameServer and broker in-process (transaction checks every
2 seconds, so half messages of the killed run are resolved while you watch).  Needs the
``spark`` extra (``pip install -e '.[spark]'``) and Java 17.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from local_cluster import start_cluster, stop_cluster

BASE_MS = 1_700_000_040_000  # a minute boundary: windows are [BASE + k min, BASE + (k+1) min)
REGIONS = ("eu", "us", "apac")
#: Checks every 2 s, so the killed run's half messages are resolved while you watch.
TRANSACTION_CHECKS = {
    "transaction_check_interval_s": 2.0,
    "transaction_timeout_s": 2.0,
    "transaction_check_max": 500,
}


def produce_orders(namesrv: str, count: int) -> dict[tuple[int, str], tuple[int, int]]:
    """Send the orders; the expected (count, amount sum) per (window start ms, region)."""
    from tidemq.client import BlockingProducer, Message

    rng = random.Random(26)
    expected: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    span = 10 * 60_000
    with BlockingProducer("example-orders", namesrv) as p:
        batch = []
        for i in range(count):
            ts = BASE_MS + span * i // count
            region, amount = rng.choice(REGIONS), rng.randint(5, 500)
            window = BASE_MS + (ts - BASE_MS) // 60_000 * 60_000
            expected[(window, region)][0] += 1
            expected[(window, region)][1] += amount
            body = json.dumps({"order": i, "region": region, "amount": amount, "ts": ts}).encode()
            batch.append(Message("Orders", body, keys=f"order-{i}", tags=region))
            if len(batch) == 100:
                p.send_batch(batch)
                batch = []
        # One late-enough order moves the watermark past the last window, so every window closes.
        batch.append(
            Message(
                "Orders",
                json.dumps(
                    {"order": -1, "region": "eu", "amount": 0, "ts": BASE_MS + span + 5 * 60_000}
                ).encode(),
            )
        )
        p.send_batch(batch)
    return {k: (v[0], v[1]) for k, v in expected.items()}


def read_totals(namesrv: str) -> list[dict[str, Any]]:
    from tidemq_spark.client import TidemqSession

    out: list[dict[str, Any]] = []
    with TidemqSession(namesrv) as s:
        try:
            queues = s.queues("OrderTotals")
        except Exception:
            return out
        for key in queues:
            for msgs in s.read_range(key, s.min_offset(key), s.max_offset(key), group="example-check"):
                out.extend(json.loads(m.body) for m in msgs)
    return out


def driver(namesrv: str, checkpoint: str) -> None:
    """The streaming query (runs in a child process so the example can kill it)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import tidemq_spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tidemq-exactly-once-orders")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidemq_spark.register(spark)
    order = "order INT, region STRING, amount INT, ts LONG"
    orders = (
        spark.readStream.format("tidemq")
        .option("namesrv", namesrv)
        .option("subscribe", "Orders")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "400")
        .load()
        .select(F.from_json(F.col("body").cast("string"), order).alias("o"))
        .select("o.*")
        .withColumn("event_time", F.timestamp_millis("ts"))
    )
    totals = (
        orders.withWatermark("event_time", "30 seconds")
        .groupBy(F.window("event_time", "1 minute").alias("w"), "region")
        .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount"))
        .select(
            F.col("region").alias("tags"),
            F.concat_ws("/", F.unix_millis(F.col("w.start")).cast("string"), "region").alias("keys"),
            F.to_json(
                F.struct(F.unix_millis(F.col("w.start")).alias("window"), "region", "orders", "amount")
            ).alias("body"),
        )
    )
    query = (
        totals.writeStream.format("tidemq")
        .outputMode("append")
        .option("namesrv", namesrv)
        .option("topic", "OrderTotals")
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    query.awaitTermination()


def run_driver(namesrv: str, checkpoint: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--driver", "--namesrv", namesrv, "--checkpoint", str(checkpoint)],
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # one process group: the kill reaches the JVM and its workers too
    )


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([n for n in os.listdir(commits) if n.isdigit()]) if commits.is_dir() else 0


def main() -> None:
    ap = argparse.ArgumentParser(description="orders -> per-minute totals per region, exactly once")
    ap.add_argument("--namesrv", help="an existing NameServer (default: start one in-process)")
    ap.add_argument("--orders", type=int, default=3000)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for every total")
    ap.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.driver:
        driver(args.namesrv, args.checkpoint)
        return

    from tidemq_spark.environment import spark_problem

    problem = spark_problem()
    if problem is not None:
        sys.exit(f"spark_exactly_once_orders.py: {problem}")

    tmp = Path(tempfile.mkdtemp(prefix="tidemq-eo-example-"))
    checkpoint, log = tmp / "checkpoint", tmp / "driver.log"
    loop, namesrv = (None, args.namesrv) if args.namesrv else start_cluster(tmp, broker=TRANSACTION_CHECKS)
    print(f"NameServer {namesrv}; checkpoint and driver log in {tmp}")
    child = None
    try:
        expected = produce_orders(namesrv, args.orders)
        print(f"sent {args.orders} orders: {len(expected)} (window, region) totals expected")
        child = run_driver(namesrv, checkpoint, log)
        deadline = time.monotonic() + args.timeout
        while committed_batches(checkpoint) < 2:
            if child.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the driver stopped or stalled before two micro-batches; see {log}")
            time.sleep(0.5)
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        print(f"killed the driver after {committed_batches(checkpoint)} committed micro-batches; restarting")
        child = run_driver(namesrv, checkpoint, log)
        while True:
            totals = read_totals(namesrv)
            if len(totals) >= len(expected) or time.monotonic() > deadline or child.poll() is not None:
                break
            time.sleep(2)
        time.sleep(5)  # a few check-back rounds more: a duplicate would show up now
        totals = read_totals(namesrv)
    finally:
        if child is not None and child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        if loop is not None:
            stop_cluster(loop)

    seen = Counter((t["window"], t["region"]) for t in totals)
    got = {(t["window"], t["region"]): (t["orders"], t["amount"]) for t in totals}
    dupes = [k for k, n in seen.items() if n > 1]
    missing = sorted(set(expected) - set(got))
    wrong = sorted(k for k in expected if k in got and got[k] != expected[k])
    print(f"OrderTotals: {len(totals)} messages for {len(expected)} expected totals")
    if dupes or missing or wrong:
        sys.exit(
            f"NOT exactly once: {len(dupes)} duplicated, {len(missing)} missing, {len(wrong)} wrong; see {log}"
        )
    print("exactly once: every (window, region) total present once, with the right count and sum")


if __name__ == "__main__":
    main()
