"""Rows/s through the Spark ``tidemq`` source vs tidemq's raw client pull of the same messages.

Starts an in-process NameServer + broker (mmap store, temp dir), produces ``--messages`` messages
over ``--queues`` queues, then measures in one run:

* ``raw_pull``: tidemq's client API pulling every queue from earliest to latest (decode included),
  one queue after another in this process;
* ``spark_read``: ``spark.read.format("tidemq")`` materialized with the ``noop`` sink (``local[N]``);
* ``spark_store_read``: ``spark.read.format("tidemq-store")`` over the broker's CommitLog files.

Prints one JSON object on stdout; the ratios compare rates measured in the same run.

    python bench/spark_bench.py [--messages 20000] [--body 256] [--queues 4] [--cores 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--body", type=int, default=256)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="timed runs of each reader (best is kept)")
    args = ap.parse_args()

    from tidemq.broker import Broker
    from tidemq.client import BlockingProducer, LoopThread, Message
    from tidemq.config import NamesrvSettings, compose, parse_config
    from tidemq.namesrv import NameServer
    from tidemq.plugins import get_plugin_manager
    from tidemq.remoting.codes import RequestCode
    from tidemq.remoting.command import RemotingCommand
    from tidemq_spark.client import TidemqSession

    tmp = Path(tempfile.mkdtemp(prefix="tidemq-spark-bench-"))
    loop = LoopThread("bench-cluster")
    state: dict[str, Any] = {}

    async def start() -> None:
        transport = get_plugin_manager().create("transport", "tcp")
        ns = NameServer(NamesrvSettings(listen="127.0.0.1:0", data_dir=str(tmp / "ns")), transport)
        await ns.start()
        cfg = parse_config(
            {
                "broker": {
                    "name": "bench-a",
                    "listen": "127.0.0.1:0",
                    "namesrv": [ns.address],
                    "data_dir": str(tmp / "broker"),
                },
                "store": {"mmap": {"commitlog_file_size": 16 * 1024 * 1024}},
            }
        )
        broker = Broker(compose(cfg))
        await broker.start()
        client = transport.client()
        fields = {
            "topic": "SparkBench",
            "readQueueNums": str(args.queues),
            "writeQueueNums": str(args.queues),
        }
        fields |= {
            "perm": "6",
            "defaultTopic": "TBW102",
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
        }
        await client.invoke(
            broker.address, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields), 5.0
        )
        await client.close()
        state.update(ns=ns, broker=broker)

    async def stop() -> None:
        await state["broker"].stop()
        await state["ns"].stop()

    loop.run(start())
    ns = state["ns"].address
    topic = "SparkBench"
    try:
        with TidemqSession(ns) as s:
            deadline = time.monotonic() + 20
            while True:
                try:
                    if len(s.queues(topic)) == args.queues:
                        break
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("topic route did not appear")
                time.sleep(0.1)

        log(f"producing {args.messages} messages of {args.body} bytes")
        body = os.urandom(args.body // 2).hex().encode()[: args.body]
        t0 = time.perf_counter()
        with BlockingProducer("bench-pg", ns, compress_over=1 << 30) as p:
            for i in range(0, args.messages, 100):
                n = min(100, args.messages - i)
                p.send_batch([Message(topic, body, tags="T", keys=f"k{i + j}") for j in range(n)])
        produce_s = time.perf_counter() - t0

        def raw_pull() -> int:
            count = 0
            with TidemqSession(ns) as s:
                for key in s.queues(topic):
                    end = s.max_offset(key)
                    for msgs in s.read_range(key, 0, end, group="bench", batch=1024):
                        count += len(msgs)
            return count

        def best(fn: Any) -> tuple[float, int]:
            times, n = [], 0
            for _ in range(args.repeat):
                t = time.perf_counter()
                n = fn()
                times.append(time.perf_counter() - t)
            return min(times), n

        raw_s, raw_n = best(raw_pull)
        log(f"raw pull: {raw_n} in {raw_s:.2f}s")

        os.environ["PYSPARK_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession

        import tidemq_spark

        spark = (
            SparkSession.builder.master(f"local[{args.cores}]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(args.cores))
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        tidemq_spark.register(spark)

        def spark_read() -> int:
            df = (
                spark.read.format("tidemq")
                .option("namesrv", ns)
                .option("topic", topic)
                .option("pullBatchSize", "1024")
                .load()
            )
            df.write.format("noop").mode("overwrite").save()
            return raw_n  # the noop sink counts nothing; the equality is checked once below

        def store_read() -> int:
            df = spark.read.format("tidemq-store").option("topic", topic).load(str(tmp / "broker"))
            df.write.format("noop").mode("overwrite").save()
            return raw_n

        live_count = spark.read.format("tidemq").option("namesrv", ns).option("topic", topic).load().count()
        store_count = (
            spark.read.format("tidemq-store").option("topic", topic).load(str(tmp / "broker")).count()
        )
        assert live_count == raw_n == store_count == args.messages, (live_count, raw_n, store_count)
        spark_s, _ = best(spark_read)
        log(f"spark read: {raw_n} in {spark_s:.2f}s")
        store_s, _ = best(store_read)
        log(f"spark store read: {raw_n} in {store_s:.2f}s")
        spark.stop()
    finally:
        loop.run(stop())
        loop.stop()

    raw_rate = raw_n / raw_s
    print(
        json.dumps(
            {
                "messages": args.messages,
                "body_bytes": args.body,
                "queues": args.queues,
                "spark_cores": args.cores,
                "produce_msgs_per_s": round(args.messages / produce_s),
                "raw_pull_rows_per_s": round(raw_rate),
                "spark_read_rows_per_s": round(raw_n / spark_s),
                "spark_store_read_rows_per_s": round(raw_n / store_s),
                "spark_vs_raw": round((raw_n / spark_s) / raw_rate, 3),
                "store_vs_raw": round((raw_n / store_s) / raw_rate, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
