"""CPU of the hash index's own work per message: keys queued as the store queues them, then
indexed in one thread, timed (``time.thread_time``).

    python bench/index_drain_bench.py [--messages 160000] [--per-ms 5] [--runs 7] [--batch 32]

Each run: a fresh index directory, puts of ``--batch`` messages (32: a producer's batch, 1:
single sends) with one fresh ``UNIQ_KEY`` each, ``--per-ms`` puts per store millisecond, queued through ``dispatch_batch``
with the index thread kept from starting; then the queue is drained on this thread and its CPU
per message reported (the hash and the insertion into the index file, compiled, and the
Python around them).  A fresh file pays its first-touch page faults: that is part of it.  For
an A/B run it under two trees (``PYTHONPATH``) alternately.  Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import tidemq_index_hash.service as service
from tidemq_index_hash.service import HashIndex


def one_run(messages: int, per_ms: int, batch: int = 32) -> float:
    service.MAX_QUEUED = 1 << 40  # no back-pressure drain on the put side: all of it below
    with tempfile.TemporaryDirectory(prefix="tidemq-index-drain-") as tmp:
        index = HashIndex(Path(tmp))
        index.load(True, 0)
        index._worker = threading.current_thread()  # keeps the index thread from starting
        salt = f"{time.monotonic_ns() & 0xFFFFFFFF:08X}"
        flags, sizes, tags = [0] * batch, [300] * batch, [0] * batch
        ts = int(time.time() * 1000)
        offset = 0
        for p in range(messages // batch):
            props = [{"UNIQ_KEY": f"{salt}{p:08X}{i:08X}", "CLUSTER": "DefaultCluster"} for i in range(batch)]
            offsets = list(range(offset, offset + batch * 300, 300))
            offset += batch * 300
            index.dispatch_batch("BenchTopic", p % 4, props, offsets, sizes, tags, ts + p // per_ms, p, flags)
        t = time.thread_time()
        with index._lock:
            while index._drain(service.DRAIN_CHUNK):
                pass
        cpu = time.thread_time() - t
        index._worker = None
        index.shutdown()
    return cpu / messages * 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=160_000)
    p.add_argument("--per-ms", type=int, default=5)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--batch", type=int, default=32, help="messages per put (1: single sends)")
    args = p.parse_args()
    runs = [round(one_run(args.messages, args.per_ms, args.batch)) for _ in range(args.runs)]
    print(json.dumps({"args": vars(args), "ns_per_message": runs, "median": statistics.median(runs)}))


if __name__ == "__main__":
    main()
