"""The loop thread's fixed cost per read of single sends, in process (issue 38, perread, session 13).

    .venv/bin/python bench/perread_bench.py [--per-read 1 4 27] [--queues 1] [--reads 4000]
        [--repeats 5] [--body 128]

A real broker (default plugins, ``mmap`` store, async flush, on uvloop as ``tidemq standalone``)
and reads of ``--per-read`` SEND_MESSAGE_V2 frames over ``--queues`` queues (``singlesend_stages``'
reads).  Per read size, three variants interleaved read by read (each read timed alone with the
thread's CPU clock, so a loaded machine disturbs them alike):

* ``whole``: ``Connection.data_received`` (the transport's read callback, the read lane's Python
  side, the broker's ``serve_read``, the answer's write) and the loop turn after it;
* ``stages``: the same compiled stages called directly on the read (``take_frames``,
  ``prepare_frames``, the duplicate window, ``put_sends``, ``settled_many``, ``answer_frames``)
  and the answer handed to the transport: no transport or entry glue;
* ``turn``: a loop turn alone (``await asyncio.sleep(0)``): the bench's own per-read cost.

``glue = whole - stages - turn`` is the Python per read around the compiled calls. A linear fit of
``whole`` per read against sends per read gives the fixed part per read (intercept) and the part
per send (slope); with ``--queues 1`` every read is one group, so the intercept is per read plus
one group's put.  Medians (and p25) over reads of ns of thread CPU; JSON on stdout.  Not a timed
test.
"""

from __future__ import annotations

import argparse
import asyncio
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


def _q(ts: list[int], f: float) -> int:
    s = sorted(ts)
    return s[int(len(s) * f)]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tidemq.broker import lanes
    from tidemq.broker.services.put import settled_many
    from tidemq.broker.services.send import born_host
    from tidemq.remoting.protocol import TopicConfig
    from tidemq_transport_tcp.connection import Connection

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tidemq-perread-") as tmp:
        async with running_broker(Path(tmp), {"flush": "async"}, auto_create_topic=True) as broker:
            server = broker._server
            conn = Connection(server, server._handler, server._options, server_side=True)
            transport = CountingTransport()
            conn.connection_made(transport)
            entry = getattr(conn._read_lane, "__self__", None)
            if entry is None or getattr(entry, "_take", None) is None:
                raise SystemExit("the compiled read lane is not active")
            broker.topics.update(
                TopicConfig(TOPIC, read_queue_nums=args.queues, write_queue_nums=args.queues)
            )
            await asyncio.sleep(0.3)
            frames = Frames(args.queues, args.body)
            conn.data_received(frames.read(4))
            await asyncio.sleep(0.1)
            settings = broker.settings
            put_sends = lanes._put_sends
            service = entry._service
            clock = time.thread_time_ns

            def stages(data: bytes) -> None:
                taken, _end = entry._take(data, 1 << 24)
                sends = entry._prepare_frames(
                    taken,
                    entry._writable_queues,
                    settings.cluster,
                    settings.max_batch_messages,
                    born_host(conn),
                    broker.store_host,
                )
                assert sends is not None and entry.windowed(sends)
                if put_sends is not None:
                    put_sends(service, sends)
                else:
                    service.put(sends)
                done = [False] * len(sends)
                settled_many(service.broker, sends, done)
                answer = entry._answer(taken, sends)
                assert answer is not None and all(done)
                transport.write(answer)

            for per_read in args.per_read:
                res: dict[str, list[int]] = {"whole": [], "stages": [], "turn": []}
                for r in range(args.repeats):
                    reads = [frames.read(per_read) for _ in range(args.reads)]
                    for i, data in enumerate(reads):
                        kind = ("whole", "stages", "turn")[(i + r) % 3]
                        t0 = clock()
                        if kind == "whole":
                            conn.data_received(data)
                        elif kind == "stages":
                            stages(data)
                        t1 = clock()
                        await asyncio.sleep(0)
                        t2 = clock()
                        res[kind].append(t2 - t0 if kind != "stages" else t1 - t0)
                        if kind == "stages":
                            res["turn"].append(t2 - t1)
                    transport.chunks.clear()
                    progress(
                        f"per read {per_read}, round {r + 1}: "
                        + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in res.items())
                    )
                med = {k: statistics.median(v) for k, v in res.items()}
                out[str(per_read)] = {
                    "reads_timed": {k: len(v) for k, v in res.items()},
                    "median_ns_per_read": {k: round(v) for k, v in med.items()},
                    "p25_ns_per_read": {k: _q(v, 0.25) for k, v in res.items()},
                    "glue_ns_per_read": round(med["whole"] - med["stages"] - med["turn"]),
                    "whole_ns_per_send": round(med["whole"] / per_read),
                }
            conn.connection_lost(None)
    xs = [float(p) for p in args.per_read]
    fit: dict[str, Any] = {}
    if len(xs) >= 2:
        for key in ("median_ns_per_read", "p25_ns_per_read"):
            ys = [float(out[str(p)][key]["whole"]) for p in args.per_read]
            slope, intercept = statistics.linear_regression(xs, ys)
            fit[key] = {"per_send_ns": round(slope), "per_read_ns": round(intercept)}
    return {
        "benchmark": "perread_bench",
        "queues": args.queues,
        "body": args.body,
        "reads_per_repeat": args.reads,
        "repeats": args.repeats,
        "by_sends_per_read": out,
        "fit_whole": fit,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-read", type=int, nargs="+", default=[1, 4, 27])
    ap.add_argument("--queues", type=int, default=1)
    ap.add_argument("--reads", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--body", type=int, default=128)
    args = ap.parse_args()
    result = run_on_loop(run(args))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
