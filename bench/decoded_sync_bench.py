"""Broker CPU per send on the decoded-command path under sync flush, in process, answers included.

    .venv/bin/python bench/decoded_sync_bench.py [--conns 4] [--per-read 46] [--rounds 300]
        [--repeats 5] [--body 1024] [--data-dir /dev/shm] [--read-lane]

A real broker (default plugins, ``mmap`` store, ``[flush] sync``, ``[transport.tcp] read_lane =
false`` unless ``--read-lane``) with ``--conns`` server-side connections whose transports only
count what is written (``send_path_bench.py``'s).  Each round feeds one read of ``--per-read``
SEND_MESSAGE_V2 frames to every connection in one loop turn (one group-commit batch), then waits
until every send is answered: a closed loop, as producers with that many sends in flight.  Unlike
``send_path_bench.py --flush sync`` (which times the feeding only), the timed section ends once
the last answer is written, so the CPU of settling and answering a round is in the figure: process
CPU (every thread: the loop, the group-commit and index threads) per message, median of
``--repeats`` runs.  The data directory defaults to tmpfs: ``fdatasync`` costs ~nothing there, so
the figure is the CPU path, not the disk.  Runs on any tree (``TIDEMQ_NO_EXTENSIONS=1`` too); A/B
two trees by running it with each tree's Python (``bench/inproc_ab.py`` style).  Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from send_path_bench import CountingTransport, build_frames, response_codes  # noqa: E402

from tidemq import _native  # noqa: E402
from tidemq.testing.pytest_plugin import running_broker  # noqa: E402


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def one_run(broker: Any, args: argparse.Namespace, rounds: int) -> dict[str, Any]:
    from tidemq_transport_tcp.connection import Connection

    server = broker._server
    conns = []
    for _ in range(args.conns):
        conn = Connection(server, server._handler, server._options, server_side=True)
        transport = CountingTransport()
        conn.connection_made(transport)
        conns.append((conn, transport))
    per_round = args.conns * args.per_read
    frames = build_frames(1, rounds * per_round, args.body, 1)
    reads = [b"".join(frames[i : i + args.per_read]) for i in range(0, len(frames), args.per_read)]
    tasks0 = len(asyncio.all_tasks())
    cpu0, wall0 = time.process_time(), time.perf_counter()
    i = 0
    polls = 0
    for _ in range(rounds):
        for conn, _t in conns:
            conn.data_received(reads[i])
            i += 1
        while any(conn.in_flight for conn, _t in conns):
            polls += 1
            await asyncio.sleep(0.0002)  # the loop idles in epoll meanwhile (no busy CPU)
        await asyncio.sleep(0)  # the turn that flushes the coalesced writes
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    codes: Counter[str] = Counter()
    writes = 0
    for conn, transport in conns:
        conn.connection_lost(None)
        codes.update(response_codes(transport.chunks))
        writes += transport.writes
    n = rounds * per_round
    return {
        "cpu_us_per_message": cpu / n * 1e6,
        "wall_us_per_message": wall / n * 1e6,
        "writes_per_round": writes / rounds,
        "polls_per_round": polls / rounds,
        "tasks_alive_after": len(asyncio.all_tasks()) - tasks0,
        "responses": dict(codes),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"flush": {"sync": {"timeout_ms": 10_000}}}
    if not args.read_lane:
        options["transport"] = {"tcp": {"read_lane": False}}
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tidemq-decoded-sync-", dir=args.data_dir) as tmp:
        async with running_broker(
            Path(tmp), {"flush": "sync", "store": "mmap"}, options=options, auto_create_topic=True
        ) as broker:
            await one_run(broker, args, 20)  # warm-up: creates the topic, every path once
            for r in range(args.repeats):
                res = await one_run(broker, args, args.rounds)
                runs.append(res)
                progress(
                    f"run {r + 1}/{args.repeats}: {res['cpu_us_per_message']:.2f} us CPU/message, "
                    f"{res['writes_per_round']:.1f} writes/round, responses={res['responses']}"
                )
    cpu = [r["cpu_us_per_message"] for r in runs]
    return {
        "benchmark": "decoded_sync",
        "python": platform.python_version(),
        "codec": _native.DESCRIPTION,
        "read_lane": args.read_lane,
        "conns": args.conns,
        "per_read": args.per_read,
        "rounds": args.rounds,
        "body_bytes": args.body,
        "data_dir": args.data_dir,
        "cpu_us_per_message": round(statistics.median(cpu), 3),
        "runs_cpu_us_per_message": [round(x, 3) for x in cpu],
        "runs": runs,
        "loadavg": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--per-read", type=int, default=46)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--data-dir", default="/dev/shm")
    ap.add_argument("--read-lane", action="store_true", help="leave the compiled read lane on")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=1))


if __name__ == "__main__":
    main()
