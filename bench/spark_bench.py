"""Rows/s through the Spark ``tidemq`` source vs tidemq's raw client pull of the same messages.

Starts an in-process NameServer + broker (mmap store, temp dir), produces ``--messages`` messages
over ``--queues`` queues, then measures in one run:

* ``raw_pull``: tidemq's client API (``ClientAPI.pull`` + ``prepare``: every message decoded into a
  ``MessageExt``, bodies decompressed) pulling every queue from earliest to latest, one queue after
  another in this process;
* ``spark_read``: ``spark.read.format("tidemq")`` materialized with the ``noop`` sink (``local[N]``);
* ``spark_store_read``: ``spark.read.format("tidemq-store")`` over the broker's CommitLog files,
  with the files' page cache warm (as the broker left them) and dropped (``_cold``);
* ``disk``: the sequential read bandwidth of the same bytes (each file's written extent, 1 MiB
  reads), cold (page cache dropped for the file with ``POSIX_FADV_DONTNEED`` before each timed
  read) and warm.  ``store_vs_disk`` is the cold store read over the cold disk read: the same
  bytes from the same device under the same cache state; warm is memory bandwidth, reported beside.

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


def written_extents(commitlog: Path) -> list[tuple[str, int]]:
    """Each CommitLog file and how many of its bytes hold records (the reader's bytes)."""
    import struct

    head = struct.Struct(">iI")
    out = []
    for f in sorted(commitlog.iterdir()):
        with open(f, "rb") as fh:
            data = fh.read()
        pos = 0
        while pos + 8 <= len(data):
            total, magic = head.unpack_from(data, pos)
            if total <= 0 or magic == 0xCBD43194:  # preallocated tail or the BLANK filler
                break
            pos += total
        out.append((str(f), pos))
    return out


def drop_cache(extents: list[tuple[str, int]]) -> None:
    """Evict the files from the page cache (written back first: only clean pages can go)."""
    for path, _ in extents:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def sequential_read(extents: list[tuple[str, int]]) -> int:
    """Read each file's extent front to back in 1 MiB reads."""
    buf = memoryview(bytearray(1 << 20))
    total = 0
    for path, size in extents:
        fd = os.open(path, os.O_RDONLY)
        try:
            left = size
            while left > 0:
                n = os.readv(fd, [buf[: min(len(buf), left)]])
                if not n:
                    break
                total += n
                left -= n
        finally:
            os.close(fd)
    return total


def raw_client_pull(ns: str, topic: str) -> int:
    """Every message of ``topic`` through tidemq's client: ``ClientAPI.pull`` + ``prepare``.

    The client's own pull and decode (a ``MessageExt`` per message), as a tidemq consumer does,
    not tidemq_spark's read path; one queue after another.
    """
    from tidemq.client import PULL_FLAG_SUBSCRIPTION, Subscription, prepare
    from tidemq.queues import MessageQueue
    from tidemq_spark.client import TidemqSession

    count = 0
    with TidemqSession(ns) as s:
        sub = Subscription.build(topic, "*")
        for key in s.queues(topic):
            end, offset, addr = s.max_offset(key), 0, s.address(key)
            mq = MessageQueue(key.topic, key.broker, key.queue_id)
            while offset < end:
                result = s.run(
                    s.api.pull(
                        addr,
                        group="bench",
                        mq=mq,
                        offset=offset,
                        max_nums=min(1024, end - offset),
                        sys_flag=PULL_FLAG_SUBSCRIPTION,
                        commit_offset=0,
                        suspend_ms=0,
                        subscription=sub.expression,
                        sub_version=sub.version,
                        expression_type=sub.expression_type,
                        timeout=10.0,
                    )
                )
                count += len(prepare(result.messages, sub))
                offset = max(result.next_begin_offset, offset + 1)
    return count


def raw_pull_in_process(ns: str, topic: str, repeat: int) -> tuple[float, int]:
    """:func:`raw_client_pull` in a process of its own (as Spark's executors are): best seconds, count."""
    import subprocess

    out = subprocess.run(
        [sys.executable, __file__, "--raw-pull-only", ns, topic, "--repeat", str(repeat)],
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(out.stdout)
    return float(result["seconds"]), int(result["count"])


def replay_source() -> Any:
    """``format("tidemq-bench-replay")``: Spark's floor for these rows.

    Each partition yields one ready-made Arrow batch of the sources' schema (the first records of
    the store, built once) over and over: what remains is Spark's own cost of taking Arrow
    batches from a Python data source, the part no decoder can remove.
    """
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from tidemq_spark.commitlog import list_files, read_batches
    from tidemq_spark.schema import BatchBuilder, arrow_schema, spark_schema
    from tidemq_spark.source import ARROW_BATCH_ROWS

    class Reader(DataSourceReader):
        def __init__(self, options: Any) -> None:
            self.path = options["path"]
            self.rows = int(options.get("rows", "0"))
            self.parts = int(options.get("partitions", "1"))

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(self.parts)]

        def read(self, partition: Any) -> Any:
            builder = BatchBuilder(arrow_schema(), "bench-a")
            first = list_files(self.path)[0]
            batch = next(iter(read_batches(first, builder, rows=ARROW_BATCH_ROWS)))
            left = self.rows // self.parts + (partition.value < self.rows % self.parts)
            while left > 0:
                out = batch if left >= batch.num_rows else batch.slice(0, left)
                left -= out.num_rows
                yield out

    class Replay(DataSource):
        @classmethod
        def name(cls) -> str:
            return "tidemq-bench-replay"

        def schema(self) -> Any:
            return spark_schema()

        def reader(self, schema: Any) -> Any:
            return Reader(self.options)

    return Replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--body", type=int, default=256)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="timed runs of each reader (best is kept)")
    ap.add_argument("--raw-pull-only", nargs=2, metavar=("NAMESRV", "TOPIC"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.raw_pull_only:  # the child of raw_pull_in_process
        times, n = [], 0
        for _ in range(args.repeat):
            t = time.perf_counter()
            n = raw_client_pull(*args.raw_pull_only)
            times.append(time.perf_counter() - t)
        print(json.dumps({"seconds": min(times), "count": n}))
        return

    from tidemq.broker import Broker
    from tidemq.client import (
        BlockingProducer,
        LoopThread,
        Message,
    )
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
            return raw_client_pull(ns, topic)

        def best(fn: Any, before: Any = None) -> tuple[float, int]:
            """The best of ``--repeat`` timed runs of ``fn``; ``before`` runs untimed first."""
            times, n = [], 0
            for _ in range(args.repeat):
                if before is not None:
                    before()
                t = time.perf_counter()
                n = fn()
                times.append(time.perf_counter() - t)
            return min(times), n

        def executor_read() -> int:
            # What a Spark task of the tidemq source does, without Spark: pull, build Arrow batches.
            from tidemq_spark.schema import BatchBuilder, arrow_schema
            from tidemq_spark.source import ARROW_BATCH_ROWS

            count = 0
            with TidemqSession(ns) as s:
                for key in s.queues(topic):
                    builder = BatchBuilder(arrow_schema(), key.broker)
                    for pulled in s.read_range(key, 0, s.max_offset(key), group="bench", batch=1024):
                        builder.add_all(pulled)
                        if len(builder) >= ARROW_BATCH_ROWS:
                            count += builder.flush().num_rows
                    count += builder.flush().num_rows if len(builder) else 0
            return count

        raw_s, raw_n = best(raw_pull)
        log(f"raw pull: {raw_n} in {raw_s:.2f}s")
        raw_proc_s, raw_proc_n = raw_pull_in_process(ns, topic, args.repeat)
        assert raw_proc_n == raw_n, (raw_proc_n, raw_n)
        log(f"raw pull, client in its own process: {raw_n} in {raw_proc_s:.2f}s")
        exec_s, exec_n = best(executor_read)
        assert exec_n == raw_n, (exec_n, raw_n)
        log(f"executor read path without Spark: {exec_n} in {exec_s:.2f}s")

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
        spark.dataSource.register(replay_source())

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

        live_count = (
            spark.read.format("tidemq")
            .option("namesrv", ns)
            .option("topic", topic)
            .option("pullBatchSize", "1024")
            .load()
            .count()
        )
        store_count = (
            spark.read.format("tidemq-store").option("topic", topic).load(str(tmp / "broker")).count()
        )
        assert live_count == raw_n == store_count == args.messages, (live_count, raw_n, store_count)
        spark_s, _ = best(spark_read)
        log(f"spark read: {raw_n} in {spark_s:.2f}s")

        def floor_read() -> int:
            df = (
                spark.read.format("tidemq-bench-replay")
                .option("rows", str(raw_n))
                .option("partitions", str(args.queues))
                .load(str(tmp / "broker"))
            )
            df.write.format("noop").mode("overwrite").save()
            return raw_n

        floor_s, _ = best(floor_read)
        log(f"spark reading ready-made Arrow batches of the same rows: {raw_n} in {floor_s:.2f}s")
        empty_s, _ = best(
            lambda: (
                spark.read.format("tidemq-bench-replay")
                .option("rows", "0")
                .load(str(tmp / "broker"))
                .write.format("noop")
                .mode("overwrite")
                .save()
            )
        )
        log(f"spark query over no rows: {empty_s:.2f}s")
        # The broker maps its CommitLog files: while it runs, their pages cannot leave the cache.
        loop.run(stop())
        state["stopped"] = True
        extents = written_extents(tmp / "broker" / "commitlog")  # after the stop: it tidies files
        store_bytes = sum(n for _, n in extents)
        store_s, _ = best(store_read)
        log(f"spark store read: {raw_n} in {store_s:.2f}s")
        store_cold_s, _ = best(store_read, lambda: drop_cache(extents))
        log(f"spark store read, page cache dropped: {raw_n} in {store_cold_s:.2f}s")
        spark.stop()
        disk_cold_s, _ = best(lambda: sequential_read(extents), lambda: drop_cache(extents))
        disk_warm_s, _ = best(lambda: sequential_read(extents))
        log(f"disk: {store_bytes / 1e6:.1f} MB in {disk_cold_s:.3f}s cold, {disk_warm_s:.3f}s warm")
    finally:
        if not state.get("stopped"):
            loop.run(stop())
        loop.stop()

    raw_rate = raw_n / raw_s
    mb = store_bytes / 1e6
    from tidemq_spark.schema import native_description

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
                "spark_read_vs_raw_pull": round((raw_n / spark_s) / raw_rate, 3),
                "raw_pull_own_process_rows_per_s": round(raw_n / raw_proc_s),
                "spark_vs_raw_own_process": round(raw_proc_s / spark_s, 3),
                "spark_floor_rows_per_s": round(raw_n / floor_s),
                "spark_empty_query_s": round(empty_s, 3),
                "executor_read_rows_per_s": round(raw_n / exec_s),
                "executor_vs_raw": round(raw_s / exec_s, 3),
                "store_bytes": store_bytes,
                "disk_MBps": round(mb / disk_cold_s, 1),
                "disk_cold_MBps": round(mb / disk_cold_s, 1),
                "disk_warm_MBps": round(mb / disk_warm_s, 1),
                "spark_store_read_MBps": round(mb / store_cold_s, 1),
                "spark_store_read_cold_MBps": round(mb / store_cold_s, 1),
                "spark_store_read_warm_MBps": round(mb / store_s, 1),
                "store_vs_disk": round(disk_cold_s / store_cold_s, 3),
                "store_warm_vs_disk_warm": round(disk_warm_s / store_s, 3),
                "ratio_basis": "store_vs_disk = cold store read / cold disk read (page cache dropped for both)",
                "column_builder": native_description(),
            }
        )
    )


if __name__ == "__main__":
    main()
