"""Thread CPU per stage of a batched send on the read lane, in process (no socket).

    python bench/batch_stages.py [--batch 32] [--body 128] [--per-read 4] [--requests 3000]
    python bench/batch_stages.py --b-tree /tmp/base_pkgs --rounds 8    # A = this tree, B = the old code
    python bench/batch_stages.py --b-args "--gil-write-max 0" --rounds 8  # A/B of one setting

A real broker (``running_broker``: default plugins, mmap store, async flush) is fed
SEND_BATCH_MESSAGE frames as ``bench/send_path_bench.py`` builds them, ``--per-read`` frames per
``data_received``.  The stages of ``SendLaneEntry.serve_read`` and of the store's put are wrapped
with counters of the calling thread's CPU (``time.thread_time_ns``; the hash index's thread is
counted in its own stages), so the figures say where the CPU of one request goes.  The wrappers
cost ~0.3 us a call: compare stages, and runs, of one configuration.  Prints JSON.

With ``--b-tree`` or ``--b-args`` it runs itself ``--rounds`` times for A and for B, alternating
which goes first, each in a fresh process (B with ``PYTHONPATH=--b-tree``: the old code, as
``bench/compare_ab.py`` takes it), and prints every round, the medians and the median of the
per-round ratios B / A of the process CPU per request (> 1: A costs less).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import gc
import json
import os
import shlex
import statistics
import subprocess
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
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(task.name), "other")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
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
                conn.connection_made(CountingTransport())
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
            if hasattr(lanes, "settled_many"):  # the lane settles a read's sends per put (settle)
                wrap(lanes, "settled_many", "settled")
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


#: The stages an A/B run reports per round (us per request), besides the process and thread CPU.
AB_STAGES = (
    "SendService.put (all of the store's put)",
    "  store._append",
    "    commitlog.append_records",
    "    consume queue put_packed",
    "    reput.dispatch (to the index's queue)",
    "index thread: _index_batch",
)


def run_once(argv: list[str], tree: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *argv], env=env, check=True, capture_output=True
    )
    return json.loads(out.stdout)


def summary(doc: dict[str, Any]) -> dict[str, float]:
    row = {
        "process_cpu_us_per_request": doc["process_cpu_us_per_request"],
        "main_thread_us_per_request": doc["threads_us_per_request"].get("MainThread", 0.0),
        "index_thread_us_per_request": doc["threads_us_per_request"].get("hash-index", 0.0),
    }
    for k in AB_STAGES:
        row[k.strip()] = doc["stages_us_per_request"].get(k, {}).get("us", 0.0)
    return row


def ab(args: argparse.Namespace, single: list[str]) -> dict[str, Any]:
    a_argv = single
    b_argv = single + shlex.split(args.b_args)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = ("A", "B") if r % 2 == 0 else ("B", "A")
        got: dict[str, Any] = {}
        for side in order:
            doc = run_once(a_argv if side == "A" else b_argv, args.b_tree if side == "B" else None)
            got[side] = summary(doc)
        got["load_average"] = os.getloadavg()[0]
        rounds.append(got)
        print(
            f"round {r + 1}: A {got['A']['process_cpu_us_per_request']} B {got['B']['process_cpu_us_per_request']}"
            f" us/request, load {got['load_average']:.1f}",
            file=sys.stderr,
        )
    keys = list(rounds[0]["A"])
    med = {side: {k: round(statistics.median(r[side][k] for r in rounds), 2) for k in keys} for side in "AB"}
    ratios = [r["B"]["process_cpu_us_per_request"] / r["A"]["process_cpu_us_per_request"] for r in rounds]
    return {
        "benchmark": "batch_stages_ab",
        "args": vars(args),
        "a": "this tree",
        "b": {"tree": args.b_tree, "extra_args": args.b_args},
        "median": med,
        "ratio_b_over_a_process_cpu": {
            "median": round(statistics.median(ratios), 3),
            "rounds": [round(x, 3) for x in ratios],
        },
        "load_average": [round(r["load_average"], 1) for r in rounds],
        "rounds": rounds,
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
    p.add_argument(
        "--gil-write-max",
        type=int,
        default=None,
        help="the store's batch writes up to this many bytes keep the GIL (RecordEncoder.write_file)",
    )
    p.add_argument("--b-tree", default=None, help="A/B: PYTHONPATH of B (the old code)")
    p.add_argument("--b-args", default="", help="A/B: extra arguments of B's runs")
    p.add_argument("--rounds", type=int, default=6, help="A/B: rounds (each runs A and B once)")
    args = p.parse_args()
    if args.b_tree or args.b_args:
        single = [
            f"--batch={args.batch}",
            f"--body={args.body}",
            f"--per-read={args.per_read}",
            f"--requests={args.requests}",
            f"--gc={args.gc}",
        ]
        if args.gil_write_max is not None:
            single.append(f"--gil-write-max={args.gil_write_max}")
        print(json.dumps(ab(args, single), indent=2))
        return
    if args.gil_write_max is not None:
        from tidemq._native import _record_encode

        _record_encode.set_gil_write_max(args.gil_write_max)
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
