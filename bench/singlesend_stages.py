"""Broker CPU per single send by stage of the compiled read lane, in process (issue 38, session 11).

    .venv/bin/python bench/singlesend_stages.py [--per-read 27] [--queues 8] [--reads 3000]
        [--repeats 5] [--body 1024] [--ab | --ab-groups | --ab-dispatch | --ab-groupc]

A real broker (default plugins, ``mmap`` store, async flush, data in a temporary directory) and
reads of ``--per-read`` SEND_MESSAGE_V2 frames, round-robin over ``--queues`` queues, as
``bench/compare.py``'s single-send workload makes them (2 clients x 64 in flight: a read carries
~27 sends spread over the topic's 8 queues).  Each read is served once through the whole path
(``Connection.data_received``, the loop turn that writes the answer) and, in a second pass over
fresh reads, stage by stage as :meth:`SendLaneEntry.serve_read` runs them: ``take_frames``,
``prepare_frames``, the duplicate window, ``SendService.put``, ``settled_many``,
``answer_frames``.  Per stage the median over ``--repeats`` of ns of CPU per send.

Prints one JSON document on stdout, progress on stderr.  Not a timed test; compare figures of
one run (the machine is shared).
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

from tidemq.broker.timer.properties import TIMER_TOPIC
from tidemq.delay import SCHEDULE_TOPIC
from tidemq.remoting import RemotingCommand
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import RequestCode
from tidemq.testing.pytest_plugin import running_broker

sys.path.insert(0, str(Path(__file__).parent))
from benchutil import run_on_loop
from send_path_bench import CountingTransport  # noqa: E402

TOPIC = "StageTopic"


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Frames:
    def __init__(self, queues: int, body: int) -> None:
        self.queues = queues
        self.body = b"x" * body
        self.seq = 0
        self.salt = f"{time.monotonic_ns() & 0xFFFFFFFFFF:010X}"

    def read(self, count: int) -> bytes:
        now = str(int(time.time() * 1000))
        out = []
        for _ in range(count):
            s = self.seq
            self.seq += 1
            fields = {
                "a": "BENCH_P",
                "b": TOPIC,
                "c": "TBW102",
                "d": str(self.queues),
                "e": str(s % self.queues),
                "f": "0",
                "g": now,
                "h": "0",
                "i": f"WAIT\x01true\x02UNIQ_KEY\x01{self.salt}{s:022X}\x02",
                "j": "0",
                "k": "false",
                "m": "false",
            }
            cmd = RemotingCommand(
                RequestCode.SEND_MESSAGE_V2, opaque=s + 1, ext_fields=fields, body=self.body
            )
            out.append(encode_bytes(cmd))
        return b"".join(out)


STAGES = ("take", "prepare", "window", "put", "settle", "answer")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tidemq import store as store_module
    from tidemq.broker import lanes
    from tidemq.broker.services.put import settled_many
    from tidemq.broker.services.send import born_host
    from tidemq_transport_tcp.connection import Connection

    put_sends = None if args.python_put else lanes._put_sends
    whole: list[float] = []
    whole_b: list[float] = []
    paired_a: list[int] = []
    paired_b: list[int] = []
    stages: dict[str, list[float]] = {s: [] for s in STAGES}
    with tempfile.TemporaryDirectory(prefix="tidemq-stages-") as tmp:
        async with running_broker(Path(tmp), {"flush": "async"}, auto_create_topic=True) as broker:
            server = broker._server
            conn = Connection(server, server._handler, server._options, server_side=True)
            transport = CountingTransport()
            conn.connection_made(transport)
            lane = conn._read_lane
            entry = getattr(lane, "__self__", None)
            if entry is None or getattr(entry, "_take", None) is None:
                raise SystemExit("the compiled read lane is not active")
            from tidemq.remoting.protocol import TopicConfig

            broker.topics.update(
                TopicConfig(TOPIC, read_queue_nums=args.queues, write_queue_nums=args.queues)
            )
            await asyncio.sleep(0.3)
            frames = Frames(args.queues, args.body)
            conn.data_received(frames.read(args.per_read))
            await asyncio.sleep(0.1)
            settings = broker.settings
            sends_total = args.reads * args.per_read
            store_cls = type(broker.store)
            store_module.group_put(broker.store)  # fills the capability cache
            paired = args.ab or args.ab_groups or args.ab_dispatch or args.ab_groupc
            from tidemq_store_mmap import group_put as mmap_group_put

            twin = mmap_group_put.compiled
            notifier = broker.store.notifier
            # B of --ab-dispatch: the broker's four arrival filters asked per group as callables
            # (the store's map is then not authoritative: dispatch_batch and arrived per group, as
            # in session 12; groupdispatch).
            filters = [
                broker.hold.is_waited_on,
                broker.pop.waiters.is_waited_on,
                lambda t, q: t == SCHEDULE_TOPIC,
                lambda t, q: t == TIMER_TOPIC,
            ]

            def set_a(on: bool) -> None:
                """A (on) or B of --ab-groups / --ab-dispatch."""
                if args.ab_dispatch:
                    notifier._interest = [] if on else filters
                elif args.ab_groupc:
                    mmap_group_put.compiled = twin if on else None
                else:
                    store_module._GROUP_PUT[store_cls] = on

            for r in range(args.repeats):
                order = [True, False] if r % 2 == 0 else [False, True]
                for compiled in order if paired else [True]:
                    if (
                        args.ab_groups or args.ab_dispatch or args.ab_groupc
                    ):  # B: one put per group / per-group effects
                        set_a(compiled)
                    else:
                        lanes._put_sends = put_sends if compiled else None
                    reads = [frames.read(args.per_read) for _ in range(args.reads)]
                    t0 = time.process_time_ns()
                    for data in reads:
                        conn.data_received(data)
                        await asyncio.sleep(0)
                    (whole if compiled else whole_b).append((time.process_time_ns() - t0) / sends_total)
                lanes._put_sends = put_sends
                if args.ab_groups or args.ab_dispatch or args.ab_groupc:
                    # The loop thread's CPU per read, A and B alternating read by read (a loaded
                    # machine disturbs both alike; the minimum and low percentiles least).
                    reads = [frames.read(args.per_read) for _ in range(args.reads)]
                    for i, data in enumerate(reads):
                        group_put_on = (i + r) % 2 == 0
                        set_a(group_put_on)
                        t0 = time.thread_time_ns()
                        conn.data_received(data)
                        await asyncio.sleep(0)
                        (paired_a if group_put_on else paired_b).append(time.thread_time_ns() - t0)
                set_a(True)
                store_module._GROUP_PUT[store_cls] = True
                reads = [frames.read(args.per_read) for _ in range(args.reads)]
                acc = dict.fromkeys(STAGES, 0)
                clock = time.perf_counter_ns
                for data in reads:
                    t0 = clock()
                    taken, _end = entry._take(data, 1 << 24)
                    t1 = clock()
                    sends = entry._prepare_frames(
                        taken,
                        entry._writable_queues,
                        settings.cluster,
                        settings.max_batch_messages,
                        born_host(conn),
                        broker.store_host,
                    )
                    t2 = clock()
                    assert sends is not None and entry.windowed(sends)
                    t3 = clock()
                    if put_sends is not None:
                        put_sends(entry._service, sends)
                    else:
                        entry._service.put(sends)
                    t4 = clock()
                    done = [False] * len(sends)
                    settled_many(entry._service.broker, sends, done)
                    t5 = clock()
                    out = entry._answer(taken, sends)
                    t6 = clock()
                    assert out is not None and all(done)
                    for name, a, b in zip(
                        STAGES, (t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6), strict=True
                    ):
                        acc[name] += b - a
                    await asyncio.sleep(0)
                for name in STAGES:
                    stages[name].append(acc[name] / sends_total)
                progress(
                    f"round {r + 1}: whole {whole[-1]:.0f} ns/send"
                    + (f" (B: {whole_b[-1]:.0f})" if paired else "")
                    + "; "
                    + ", ".join(f"{n} {stages[n][-1]:.0f}" for n in STAGES)
                )
            conn.connection_lost(None)
    paired: dict[str, Any] = {}
    for name, ts in (("a", paired_a), ("b", paired_b)):
        if ts:
            ts.sort()
            paired[name] = {
                f"{q}_thread_cpu_ns_per_send": round(ts[int(len(ts) * f)] / args.per_read)
                for q, f in (("min", 0), ("p10", 0.1), ("p25", 0.25), ("median", 0.5))
            }
    return {
        "benchmark": "singlesend_stages",
        "paired_reads": paired,
        "per_read": args.per_read,
        "queues": args.queues,
        "body": args.body,
        "reads": args.reads,
        "whole_cpu_ns_per_send": round(statistics.median(whole)),
        "whole_rounds": [round(x) for x in whole],
        "ab": "groups"
        if args.ab_groups
        else "dispatch"
        if args.ab_dispatch
        else "groupc"
        if args.ab_groupc
        else args.ab,
        "whole_b_cpu_ns_per_send": round(statistics.median(whole_b)) if whole_b else None,
        "whole_b_rounds": [round(x) for x in whole_b],
        "stage_wall_ns_per_send": {n: round(statistics.median(v)) for n, v in stages.items()},
        "stage_rounds": {n: [round(x) for x in v] for n, v in stages.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-read", type=int, default=27)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--reads", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--python-put", action="store_true", help="SendService.put in Python only")
    ap.add_argument(
        "--ab",
        action="store_true",
        help="each round's whole pass also with SendService.put in Python (B), alternating",
    )
    ap.add_argument(
        "--ab-groups",
        action="store_true",
        help="each round's whole pass also with one store put per group (B: the store's "
        "put_message_groups hidden), alternating; plus a pass alternating A and B read by read, "
        "the loop thread's CPU per read (paired_reads)",
    )
    ap.add_argument(
        "--ab-dispatch",
        action="store_true",
        help="as --ab-groups, B: the store's call without its call-level effects (dispatch_batch "
        "and the four arrival filters per group, as before groupdispatch)",
    )
    ap.add_argument(
        "--ab-groupc",
        action="store_true",
        help="as --ab-groups, B: the store's call in Python (group_put.put_groups_py), A: its "
        "compiled twin (tidemq_store_mmap._group_put; groupc)",
    )
    args = ap.parse_args()
    result = run_on_loop(run(args))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
