"""The read's Python glue before and after perread, read by read in one process (issue 38, session 13).

    .venv/bin/python bench/perread_ab.py [--old-tree /work/wt/base] [--per-read 1 21] [--queues 1]
        [--reads 6000] [--repeats 3]

A real broker on uvloop and reads of single SEND_MESSAGE_V2 frames (``perread_bench.py``'s).  B:
``Connection._serve_read`` and ``SendLaneEntry.serve_read`` as ``--old-tree`` has them (its
``plugins/transport_tcp/connection.py`` and ``core/broker/lanes.py`` loaded as modules of their
own, on top of this tree's everything else); A: this tree's.  A and B alternate read by read on
the same connection, each read timed with the thread's CPU clock (``data_received`` and the loop
turn after it); medians and p25 of ns per read, and A - B.  Only valid while the rest of the
two files' classes is the same (the old functions run on this tree's objects).  Not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from benchutil import run_on_loop
from send_path_bench import CountingTransport  # noqa: E402
from singlesend_stages import TOPIC, Frames, progress  # noqa: E402

from tidemq.testing.pytest_plugin import running_broker  # noqa: E402


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tidemq.remoting.protocol import TopicConfig
    from tidemq_transport_tcp.connection import Connection

    old = Path(args.old_tree)
    old_conn = _load("perread_old_connection", old / "plugins/transport_tcp/connection.py")
    old_lanes = _load("perread_old_lanes", old / "core/broker/lanes.py")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tidemq-perread-ab-") as tmp:
        async with running_broker(Path(tmp), {"flush": "async"}, auto_create_topic=True) as broker:
            server = broker._server
            conn = Connection(server, server._handler, server._options, server_side=True)
            transport = CountingTransport()
            conn.connection_made(transport)
            new_lane = conn._read_lane
            entry = getattr(new_lane, "__self__", None)
            if entry is None or getattr(entry, "_take", None) is None:
                raise SystemExit("the compiled read lane is not active")
            old_lane = old_lanes.SendLaneEntry.serve_read.__get__(entry)
            old_serve = old_conn.Connection._serve_read.__get__(conn)
            broker.topics.update(
                TopicConfig(TOPIC, read_queue_nums=args.queues, write_queue_nums=args.queues)
            )
            await asyncio.sleep(0.3)
            frames = Frames(args.queues, args.body)
            conn.data_received(frames.read(4))
            await asyncio.sleep(0.1)
            clock = time.thread_time_ns
            for per_read in args.per_read:
                res: dict[str, list[int]] = {"a": [], "b": []}
                for r in range(args.repeats):
                    reads = [frames.read(per_read) for _ in range(args.reads)]
                    for i, data in enumerate(reads):
                        a = (i + r) % 2 == 0
                        if a:
                            conn._read_lane = new_lane
                            conn.__dict__.pop("_serve_read", None)
                        else:
                            conn._read_lane = old_lane
                            conn._serve_read = old_serve
                        t0 = clock()
                        conn.data_received(data)
                        await asyncio.sleep(0)
                        res["a" if a else "b"].append(clock() - t0)
                    transport.chunks.clear()
                    progress(
                        f"per read {per_read}, round {r + 1}: a {statistics.median(res['a']):.0f}, "
                        f"b {statistics.median(res['b']):.0f} ns"
                    )
                conn._read_lane = new_lane
                conn.__dict__.pop("_serve_read", None)
                qs = {
                    k: {
                        q: sorted(v)[int(len(v) * f)]
                        for q, f in (("p10", 0.1), ("p25", 0.25), ("median", 0.5))
                    }
                    for k, v in res.items()
                }
                out[str(per_read)] = {
                    "reads_timed": len(res["a"]) + len(res["b"]),
                    "a_ns_per_read": qs["a"],
                    "b_ns_per_read": qs["b"],
                    "a_minus_b_ns_per_read": {q: qs["a"][q] - qs["b"][q] for q in qs["a"]},
                }
            conn.connection_lost(None)
    return {
        "benchmark": "perread_ab",
        "old_tree": str(old),
        "queues": args.queues,
        "body": args.body,
        "reads_per_repeat": args.reads,
        "repeats": args.repeats,
        "by_sends_per_read": out,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-tree", default="/work/wt/base")
    ap.add_argument("--per-read", type=int, nargs="+", default=[1, 21])
    ap.add_argument("--queues", type=int, default=1)
    ap.add_argument("--reads", type=int, default=6000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--body", type=int, default=128)
    args = ap.parse_args()
    result = run_on_loop(run(args))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
