"""The read lane's put and settlement of a read's single sends, compiled against Python (session 11),
or the store's one-call put of a read's groups against one put per group (session 12, putmany).

    .venv/bin/python bench/singlesend_put_ab.py [--reads 2000] [--per-read 27] [--queues 1 8]
        [--ab compiled|groups|dispatch]

A real broker (default plugins, ``mmap`` store, async flush) in process; per read of
``--per-read`` SEND_MESSAGE_V2 frames round-robin over ``--queues`` queues (compare.py's
single-send load: ~27 sends a read over 8 queues), the frames are taken and prepared by the lane,
then timed: ``put_sends`` + ``settled_many`` (A: the compiled put, the outcome read from the
futures' slots) or ``SendService.put`` + ``settle_sends`` with the Python ``_put_outcome`` (B: the
code before).  With ``--ab groups`` both use the compiled put and settlement; A puts a read's
groups with the store's ``put_message_groups`` (:class:`tidemq.store.GroupPut`, one call), B with
one ``put_messages`` per group (the capability hidden).  With ``--ab dispatch`` both put with
one call; A dispatches the call's puts at once (:class:`tidemq.store.GroupDispatcher`) and looks
arrivals up in the store's one map (:class:`tidemq.store.ArrivalInterest`), B gets the broker's
four arrival filters back as callables, so the store dispatches and notes arrivals group by group
as in session 12 (groupdispatch).  With ``--ab groupc`` A runs the store's call compiled
(``tidemq_store_mmap._group_put``), B its Python reference (``group_put.put_groups_py``).  A and B alternate read by read; the figures are the minimum, the 10th percentile
and the median of µs per read (the minimum is what a loaded machine disturbs least).  Also the
minimum ns per frame of ``take_frames`` and ``prepare_frames`` over ten such reads in cache.

Prints one JSON document on stdout.  Not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tidemq.broker.timer.properties import TIMER_TOPIC
from tidemq.delay import SCHEDULE_TOPIC
from tidemq.remoting.protocol import TopicConfig
from tidemq.testing.pytest_plugin import running_broker

sys.path.insert(0, str(Path(__file__).parent))
from benchutil import run_on_loop
from singlesend_stages import TOPIC, Frames  # noqa: E402


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tidemq import store as store_module
    from tidemq._native import _send_lane
    from tidemq.broker.services import put

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tidemq-put-ab-") as tmp:
        async with running_broker(Path(tmp), {"flush": "async"}, auto_create_topic=True) as broker:
            top = max(args.queues)
            broker.topics.update(TopicConfig(TOPIC, read_queue_nums=top, write_queue_nums=top))
            entry = broker.send_lane
            service = entry._service
            settings = broker.settings

            def python_outcome(b: Any, g: Any) -> Any:  # not the reference object: the Python call
                return put._put_outcome(b, g)

            store_cls = type(broker.store)
            store_module.group_put(broker.store)  # fills the capability cache
            groups_ab = args.ab == "groups"
            dispatch_ab = args.ab == "dispatch"
            groupc_ab = args.ab == "groupc"
            from tidemq_store_mmap import group_put as mmap_group_put

            twin = mmap_group_put.compiled
            if groupc_ab and twin is None:
                raise SystemExit("--ab groupc needs the compiled tidemq_store_mmap._group_put")
            a, b = {
                "groups": ("groups", "per_group"),
                "dispatch": ("call_dispatch", "group_dispatch"),
                "groupc": ("compiled_call", "python_call"),
                "compiled": ("compiled", "python"),
            }[args.ab]
            notifier = broker.store.notifier
            # B of --ab dispatch: the four services' filters asked per arrival, as before
            # groupdispatch (the store's map is then not authoritative: the call's effects are off,
            # each group gets dispatch_batch and ArrivalNotifier.arrived as in session 12).
            filters = [
                broker.hold.is_waited_on,
                broker.pop.waiters.is_waited_on,
                lambda t, q: t == SCHEDULE_TOPIC,
                lambda t, q: t == TIMER_TOPIC,
            ]
            for queues in args.queues:
                frames = Frames(queues, args.body)
                times: dict[str, list[int]] = {a: [], b: []}
                for i in range(args.reads):
                    for mode in (a, b) if i % 2 else (b, a):
                        if groups_ab:
                            store_module._GROUP_PUT[store_cls] = mode == a
                        if dispatch_ab:
                            notifier._interest = [] if mode == a else filters
                        if groupc_ab:
                            mmap_group_put.compiled = twin if mode == a else None
                        taken, _ = entry._take(frames.read(args.per_read), 1 << 24)
                        sends = entry._prepare_frames(
                            taken,
                            entry._writable_queues,
                            settings.cluster,
                            settings.max_batch_messages,
                            ("127.0.0.1", 40000),
                            broker.store_host,
                        )
                        assert sends is not None and entry.windowed(sends)
                        done = [False] * len(sends)
                        t0 = time.perf_counter_ns()
                        if mode != "python":
                            _send_lane.put_sends(service, sends)
                            put.settled_many(service.broker, sends, done)
                        else:
                            service.put(sends)
                            _send_lane.settle_sends(service.broker, sends, done, python_outcome, put._fill)
                        times[mode].append(time.perf_counter_ns() - t0)
                        assert all(done)
                        await asyncio.sleep(0)
                row: dict[str, Any] = {}
                for mode, ts in times.items():
                    ts.sort()
                    row[mode] = {
                        "min_us_per_read": round(ts[0] / 1000, 2),
                        "p10_us_per_read": round(ts[len(ts) // 10] / 1000, 2),
                        "median_us_per_read": round(ts[len(ts) // 2] / 1000, 2),
                        "min_us_per_send": round(ts[0] / 1000 / args.per_read, 3),
                    }
                row["min_saved_us_per_send"] = round(row[b]["min_us_per_send"] - row[a]["min_us_per_send"], 3)
                row["median_saved_us_per_read"] = round(
                    row[b]["median_us_per_read"] - row[a]["median_us_per_read"], 2
                )
                store_module._GROUP_PUT[store_cls] = True
                notifier._interest = []
                mmap_group_put.compiled = twin
                # The lane's other stages on the same kind of reads, in cache (minimum per frame).
                reads = [frames.read(args.per_read) for _ in range(10)]
                taken_all = [entry._take(r, 1 << 24)[0] for r in reads]
                best_take = best_prepare = float("inf")
                for _ in range(200):
                    t0 = time.perf_counter_ns()
                    for r in reads:
                        entry._take(r, 1 << 24)
                    t1 = time.perf_counter_ns()
                    for taken in taken_all:
                        entry._prepare_frames(
                            taken,
                            entry._writable_queues,
                            settings.cluster,
                            settings.max_batch_messages,
                            ("127.0.0.1", 40000),
                            broker.store_host,
                        )
                    t2 = time.perf_counter_ns()
                    best_take = min(best_take, (t1 - t0) / (10 * args.per_read))
                    best_prepare = min(best_prepare, (t2 - t1) / (10 * args.per_read))
                row["take_frames_min_ns_per_frame"] = round(best_take)
                row["prepare_frames_min_ns_per_frame"] = round(best_prepare)
                out[f"queues_{queues}"] = row
                print(f"queues {queues}: {row}", file=sys.stderr, flush=True)
    return {
        "benchmark": "singlesend_put_ab",
        "ab": f"{a} (A) vs {b} (B)",
        "per_read": args.per_read,
        "reads": args.reads,
        "body": args.body,
        "load_average": os.getloadavg(),
        "results": out,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--per-read", type=int, default=27)
    ap.add_argument("--queues", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument(
        "--ab",
        choices=("compiled", "groups", "dispatch", "groupc"),
        default="compiled",
        help="compiled: the compiled put against SendService.put; groups: the store's one-call put "
        "against one put per group; dispatch: a call's puts dispatched at once and its arrivals looked "
        "up in the store's one map (groupdispatch) against dispatch_batch and four filters per group; "
        "groupc: the store's call compiled (tidemq_store_mmap._group_put) against its Python reference",
    )
    args = ap.parse_args()
    result = run_on_loop(run(args))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
