"""Thread CPU per stage of a batched send on the read lane, in process (no socket).

    python bench/batch_stages.py [--batch 32] [--body 128] [--per-read 4] [--requests 3000]

A real broker (``running_broker``: default plugins, mmap store, async flush) is fed
SEND_BATCH_MESSAGE frames as ``bench/send_path_bench.py`` builds them, ``--per-read`` frames per
``data_received``.  The stages of ``SendLaneEntry.serve_read`` and of the store's put are wrapped
with counters of the calling thread's CPU (``time.thread_time_ns``; the hash index's thread is
counted in its own stages), so the figures say where the CPU of one request goes.  The wrappers
cost ~0.3 us a call: compare stages, and runs, of one configuration.  Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import gc
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from send_path_bench import CountingTransport, build_frames  # noqa: E402

from tidemq.cli import tune_gc  # noqa: E402
from tidemq.testing.pytest_plugin import running_broker  # noqa: E402

acc: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()


def timed(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[label] += time.thread_time_ns() - t
            calls[label] += 1

    return wrapper


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process, by name (``/proc/self/task``)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = collections.Counter()
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[names.get(int(task.name), "other")] += (int(fields[11]) + int(fields[12])) / tick
    return out


def wrap(owner: Any, name: str, label: str) -> None:
    setattr(owner, name, timed(getattr(owner, name), label))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import tidemq.broker.lanes as lanes
    import tidemq.broker.services.send as send
    import tidemq_index_hash.service as index_service
    import tidemq_store_mmap.commitlog as commitlog
    import tidemq_store_mmap.consume_queue as consume_queue
    import tidemq_store_mmap.reput as reput
    import tidemq_store_mmap.store as store
    from tidemq_transport_tcp.connection import Connection

    with tempfile.TemporaryDirectory(prefix="tidemq-stages-") as tmp:
        async with running_broker(
            Path(tmp), {"flush": "async"}, auto_create_topic=True, max_message_size=8 * 1024 * 1024
        ) as broker:
            server = broker._server

            async def feed(frames: list[bytes]) -> None:
                conn = Connection(server, server._handler, server._options, server_side=True)
                conn.connection_made(CountingTransport())  # type: ignore[arg-type]
                for i in range(0, len(frames), args.per_read):
                    conn.data_received(b"".join(frames[i : i + args.per_read]))
                    await asyncio.sleep(0)
                await asyncio.sleep(0.05)

            await feed(build_frames(args.batch, 300, args.body, 1))  # warm-up: the topic, every path
            if args.gc == "broker":
                tune_gc()  # as `tidemq standalone` serves: start-up frozen, gen-0 threshold 50 000
            elif args.gc == "off":
                gc.disable()
            frames = build_frames(args.batch, args.requests, args.body, 1000)  # before the clock
            entry = broker.send_lane
            for attr, label in (
                ("_take", "take_frames"),
                ("_prepare_frames", "prepare_frames"),
                ("_answer", "answer_frames"),
            ):
                setattr(entry, attr, timed(getattr(entry, attr), label))
            entry._service.settled = timed(entry._service.settled, "settled")
            wrap(lanes.SendLaneEntry, "windowed", "windowed (the duplicate window)")
            wrap(send.SendService, "put", "SendService.put (all of the store's put)")
            wrap(store.MmapMessageStore, "_append", "  store._append")
            wrap(commitlog.CommitLog, "append_records", "    commitlog.append_records")
            wrap(consume_queue.ConsumeQueue, "put_packed", "    consume queue put_packed")
            wrap(reput.Reput, "dispatch", "    reput.dispatch (to the index's queue)")
            wrap(index_service.HashIndex, "_index_batch", "index thread: _index_batch")
            wrap(index_service, "hash_batch", "  index hash_batch")
            wrap(index_service, "put_batch", "  index put_batch")
            cpu = time.process_time()
            threads = thread_cpu()
            await feed(frames)
            cpu = time.process_time() - cpu
            after = thread_cpu()
    msgs = args.requests * args.batch
    return {
        "benchmark": "batch_stages",
        "args": vars(args),
        "process_cpu_us_per_message": round(cpu / msgs * 1e6, 3),
        "process_cpu_us_per_request": round(cpu / args.requests * 1e6, 1),
        "threads_us_per_request": {
            k: round((after[k] - threads.get(k, 0.0)) / args.requests * 1e6, 1)
            for k in sorted(after, key=lambda k: threads.get(k, 0.0) - after[k])
        },
        "stages_us_per_request": {
            k: {"us": round(v / 1e3 / args.requests, 2), "calls": round(calls[k] / args.requests, 2)}
            for k, v in sorted(acc.items(), key=lambda kv: -kv[1])
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--body", type=int, default=128)
    p.add_argument("--per-read", type=int, default=4)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument(
        "--gc", default="broker", choices=["broker", "default", "off"], help="the collector's setting"
    )
    print(json.dumps(asyncio.run(run(p.parse_args())), indent=2))


if __name__ == "__main__":
    main()
