"""The Spark ``tidemq`` streaming sink: exactly-once vs at-least-once, measured in one run.

Starts an in-process NameServer + broker, produces ``--messages`` messages to an input topic,
then for each delivery guarantee (alternating, ``--rounds`` times) runs a streaming query
``tidemq`` source -> ``tidemq`` sink to a fresh output topic with ``Trigger.AvailableNow`` and a
fresh checkpoint, and records:

* ``seconds``: wall time of the query from start to its end (includes Spark's fixed costs);
* ``add_batch_s``: the micro-batches' ``addBatch`` time from the query progress (read + write);
* ``broker_cpu_s``: this process's CPU time during the query (the broker runs here; the Spark
  driver's Python side is idle, its JVM and workers are other processes);
* ``rows_per_s`` and ``rows_per_broker_cpu_s``.

Prints one JSON object (medians per mode and their ratios, exactly-once / at-least-once) on
stdout; progress on stderr.

    python bench/spark_sink_bench.py [--messages 50000] [--body 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--body", type=int, default=256)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()

    from tidemq.broker import Broker
    from tidemq.client import AdminClient, BlockingProducer, LoopThread, Message, topic_fields
    from tidemq.config import NamesrvSettings, compose, parse_config
    from tidemq.namesrv import NameServer
    from tidemq.plugins import get_plugin_manager
    from tidemq.remoting.codes import RequestCode

    tmp = Path(tempfile.mkdtemp(prefix="tidemq-sink-bench-"))
    loop = LoopThread("bench-cluster")
    state: dict[str, Any] = {}

    async def start() -> None:
        ns = NameServer(
            NamesrvSettings(listen="127.0.0.1:0", data_dir=str(tmp / "ns")),
            get_plugin_manager().create("transport", "tcp"),
        )
        await ns.start()
        cfg = parse_config(
            {
                "broker": {
                    "name": "broker-bench",
                    "listen": "127.0.0.1:0",
                    "namesrv": [ns.address],
                    "data_dir": str(tmp / "b"),
                }
            }
        )
        broker = Broker(compose(cfg))
        await broker.start()
        state.update(ns=ns, broker=broker)

    async def create(topic: str) -> None:
        admin = AdminClient(state["ns"].address)
        try:
            fields = topic_fields(topic, args.queues, args.queues, 6)
            await admin.call(state["broker"].address, RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
        finally:
            await admin.close()

    loop.run(start(), 60)
    ns = str(state["ns"].address)
    loop.run(create("SinkBenchIn"), 30)
    body = os.urandom(args.body // 2).hex().encode()[: args.body]
    log(f"producing {args.messages} x {args.body} B")
    with BlockingProducer("sink-bench-producer", ns) as p:
        for i in range(0, args.messages, 256):
            p.send_batch(
                [Message("SinkBenchIn", body, keys=f"k{i + j}") for j in range(min(256, args.messages - i))]
            )

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import tidemq_spark

    spark = (
        SparkSession.builder.master(f"local[{args.cores}]")
        .appName("tidemq-sink-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidemq_spark.register(spark)

    def run(mode: str, n: int) -> dict[str, float]:
        out = f"SinkBench{mode.replace('-', '')}{n}"
        loop.run(create(out), 30)
        ckpt = tmp / f"ckpt-{mode}-{n}"
        src = (
            spark.readStream.format("tidemq")
            .option("namesrv", ns)
            .option("topic", "SinkBenchIn")
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("body", "keys")
        )
        cpu0, t0 = time.process_time(), time.perf_counter()
        query = (
            src.writeStream.format("tidemq")
            .option("namesrv", ns)
            .option("topic", out)
            .option("deliveryGuarantee", mode)
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        rows = sum(int(p["numInputRows"]) for p in query.recentProgress)
        add_batch = sum(int(p["durationMs"].get("addBatch", 0)) for p in query.recentProgress) / 1000
        if rows != args.messages:
            raise SystemExit(f"{mode}: the query read {rows} rows, expected {args.messages}")
        r = {
            "seconds": seconds,
            "add_batch_s": add_batch,
            "broker_cpu_s": cpu,
            "rows_per_s": rows / seconds,
            "rows_per_broker_cpu_s": rows / cpu,
        }
        log(
            f"{mode} round {n}: {rows} rows in {seconds:.1f} s (addBatch {add_batch:.1f} s), broker CPU {cpu:.1f} s"
        )
        return r

    modes = ("at-least-once", "exactly-once")
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    try:
        run("at-least-once", -1)  # warm-up: JVM, Python workers, routes
        for n in range(args.rounds):
            for mode in modes if n % 2 == 0 else reversed(modes):
                runs[mode].append(run(mode, n))
    finally:
        spark.stop()
        loop.run(state["broker"].stop(), 60)
        loop.run(state["ns"].stop(), 60)
        loop.stop()

    med = {m: {k: statistics.median(r[k] for r in runs[m]) for k in runs[m][0]} for m in modes}
    result = {
        "bench": "spark_sink_bench",
        "messages": args.messages,
        "body": args.body,
        "queues": args.queues,
        "cores": args.cores,
        "rounds": args.rounds,
        "runs": runs,
        "median": med,
        "ratio_exactly_once_vs_at_least_once": {
            k: med["exactly-once"][k] / med["at-least-once"][k]
            for k in ("rows_per_s", "rows_per_broker_cpu_s")
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
