"""A Spark driver for the exactly-once sink tests: stream topic IN to topic OUT exactly once.

    python tests/spark_eo_driver.py NAMESRV IN OUT CHECKPOINT STOP_FILE

Runs until STOP_FILE exists (then stops the query cleanly); the tests kill it with SIGKILL to
play a driver crash, using the sink's pause hook (TIDEMQ_SPARK_EO_PAUSE_FILE) to pick the moment.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main() -> None:
    namesrv, src, dst, checkpoint, stop_file = sys.argv[1:6]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import tidemq_spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tidemq-eo-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidemq_spark.register(spark)
    rows = (
        spark.readStream.format("tidemq")
        .option("namesrv", namesrv)
        .option("topic", src)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "40")
        .load()
        .selectExpr("body", "keys")
    )
    query = (
        rows.writeStream.format("tidemq")
        .option("namesrv", namesrv)
        .option("topic", dst)
        .option("deliveryGuarantee", "exactly-once")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    print("driver: query started", flush=True)
    last = None
    while not Path(stop_file).exists():
        if not query.isActive:
            raise SystemExit(f"query died: {query.exception()}")
        progress = query.lastProgress
        if progress and progress["batchId"] != last:
            last = progress["batchId"]
            took = progress["durationMs"]
            print(
                f"driver: {time.strftime('%H:%M:%S')} batch {last} rows {progress['numInputRows']} ms {took}",
                flush=True,
            )
        time.sleep(0.2)
    query.stop()
    spark.stop()
    print("driver: stopped", flush=True)


if __name__ == "__main__":
    main()
