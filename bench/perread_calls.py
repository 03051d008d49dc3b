"""Python calls made on the event loop per read of single sends, by function (issue 38, perread).

    .venv/bin/python bench/perread_calls.py [--per-read 21] [--queues 8] [--reads 300]

A real broker (as ``bench/perread_bench.py``) and ``--reads`` reads of ``--per-read``
SEND_MESSAGE_V2 frames over ``--queues`` queues, each served by ``Connection.data_received`` and a
loop turn, under ``sys.setprofile``: every Python function entered and every call of a builtin or
compiled function (``c_call``) counted, per read.  A count of 1 per read is per-read work, one
near ``--queues`` per read is per group, one near ``--per-read`` is per send.  Counts, not time
(the profiler slows every call alike); JSON on stdout.  Not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from benchutil import run_on_loop
from send_path_bench import CountingTransport  # noqa: E402
from singlesend_stages import TOPIC, Frames  # noqa: E402

from tidemq.testing.pytest_plugin import running_broker  # noqa: E402


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tidemq.remoting.protocol import TopicConfig
    from tidemq_transport_tcp.connection import Connection

    counts: collections.Counter[str] = collections.Counter()

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            counts[f"{code.co_qualname} ({'/'.join(code.co_filename.split('/')[-2:])})"] += 1
        elif event == "c_call":
            counts[f"[c] {getattr(arg, '__qualname__', None) or getattr(arg, '__name__', repr(arg))}"] += 1

    with tempfile.TemporaryDirectory(prefix="tidemq-perread-calls-") as tmp:
        async with running_broker(Path(tmp), {"flush": "async"}, auto_create_topic=True) as broker:
            server = broker._server
            conn = Connection(server, server._handler, server._options, server_side=True)
            conn.connection_made(CountingTransport())
            broker.topics.update(
                TopicConfig(TOPIC, read_queue_nums=args.queues, write_queue_nums=args.queues)
            )
            await asyncio.sleep(0.3)
            frames = Frames(args.queues, args.body)
            for _ in range(50):  # warm: topic written, caches filled
                conn.data_received(frames.read(args.per_read))
                await asyncio.sleep(0)
            reads = [frames.read(args.per_read) for _ in range(args.reads)]
            sys.setprofile(prof)
            try:
                for data in reads:
                    conn.data_received(data)
                    await asyncio.sleep(0)
            finally:
                sys.setprofile(None)
            conn.connection_lost(None)
    per_read = {k: round(v / args.reads, 2) for k, v in counts.most_common() if v / args.reads >= 0.05}
    python = sum(v for k, v in per_read.items() if not k.startswith("[c]"))
    return {
        "benchmark": "perread_calls",
        "per_read": args.per_read,
        "queues": args.queues,
        "reads": args.reads,
        "python_calls_per_read": round(python, 1),
        "c_calls_per_read": round(sum(v for k, v in per_read.items() if k.startswith("[c]")), 1),
        "calls_per_read": per_read,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-read", type=int, default=21)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--reads", type=int, default=300)
    ap.add_argument("--body", type=int, default=128)
    args = ap.parse_args()
    result = run_on_loop(run(args))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
