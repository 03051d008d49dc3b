"""The duplicate window's cost on the send path (issue 37): broker CPU per message, window on vs
off, alternating in one process on one broker.

    .venv/bin/python bench/dedup_ab.py [--batch 32 1] [--per-read 16] [--repeats 7]

Like ``bench/send_path_bench.py`` (whose in-process connection it uses): a real broker (default
plugins, mmap store, async flush) is fed send requests as the official client encodes them, each
message with a fresh UNIQ_KEY (no resend: the window's cost on the common path), ``--per-read``
frames per read.  Each repeat runs every configuration twice, window on (the default 120 s) and
off (``dedup_window_s = 0``, set on the running window), in alternating order; the CPU time
(``time.process_time``) per message is compared run by run.  Prints JSON: per configuration the
median µs per message on and off, and the median of the on/off ratios of messages per CPU-second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from send_path_bench import QUEUES, TOPIC, CountingTransport, response_codes  # noqa: E402

from tidemq import _native  # noqa: E402
from tidemq.message import BatchItem, Prop, encode_batch  # noqa: E402
from tidemq.remoting import RemotingCommand  # noqa: E402
from tidemq.remoting.codec import encode_bytes  # noqa: E402
from tidemq.remoting.codes import RequestCode  # noqa: E402
from tidemq.testing.pytest_plugin import running_broker  # noqa: E402


def frames(batch: int, count: int, body_size: int) -> list[bytes]:
    """``count`` send requests, every message with a key never sent before."""
    salt = uuid.uuid4().hex[:12].upper()
    body = b"x" * body_size
    now = str(int(time.time() * 1000))
    out = []
    for s in range(count):
        fields = {"a": "BENCH_P", "b": TOPIC, "c": "TBW102", "d": str(QUEUES), "e": str(s % QUEUES)}
        fields |= {
            "f": "0",
            "g": now,
            "h": "0",
            "j": "0",
            "k": "false",
            "m": "true" if batch > 1 else "false",
        }
        if batch > 1:
            fields["i"] = "WAIT\x01true\x02"
            items = [
                BatchItem(body, 0, {Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"{salt}{s:016X}{i:04X}"})
                for i in range(batch)
            ]
            payload, code = encode_batch(items), RequestCode.SEND_BATCH_MESSAGE
        else:
            fields["i"] = f"WAIT\x01true\x02UNIQ_KEY\x01{salt}{s:020X}\x02"
            payload, code = body, RequestCode.SEND_MESSAGE_V2
        out.append(encode_bytes(RemotingCommand(code, opaque=s + 1, ext_fields=fields, body=payload)))
    return out


async def one_run(
    broker: Any, batch: int, requests: int, per_read: int, body: int, on: bool
) -> dict[str, Any]:
    from tidemq_transport_tcp.connection import Connection

    window = broker.dedup
    window.window_s = 120.0 if on else 0.0
    window._topic_windows.clear()  # the bench's own switch: the topic's cached setting follows
    server = broker._server
    conn = Connection(server, server._handler, server._options, server_side=True)
    transport = CountingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    built = frames(batch, requests, body)
    reads = [b"".join(built[i : i + per_read]) for i in range(0, requests, per_read)]
    cpu0 = time.process_time()
    for data in reads:
        conn.data_received(data)
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    cpu = time.process_time() - cpu0
    for _ in range(100):
        if conn.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    conn.connection_lost(None)
    return {
        "us_per_message": cpu / (requests * batch) * 1e6,
        "responses": dict(response_codes(transport.chunks)),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    configs = [(b, p) for b in args.batch for p in args.per_read]
    runs: dict[tuple[int, int, bool], list[dict[str, Any]]] = {
        (b, p, on): [] for b, p in configs for on in (True, False)
    }
    with tempfile.TemporaryDirectory(prefix="tidemq-dedup-ab-") as tmp:
        async with running_broker(Path(tmp), {"flush": "async"}, auto_create_topic=True) as broker:
            if args.tune_gc:
                from tidemq.cli import tune_gc

                tune_gc()  # as `tidemq broker` does once serving: the collector's cost as served
            for batch, per_read in configs:  # warm-up
                for on in (True, False):
                    await one_run(broker, batch, 200, per_read, args.body, on)
            for r in range(args.repeats):
                for batch, per_read in configs:
                    n = args.requests if batch == 1 else args.batch_requests
                    for on in (True, False) if r % 2 == 0 else (False, True):
                        res = await one_run(broker, batch, n, per_read, args.body, on)
                        runs[(batch, per_read, on)].append(res)
                        print(
                            f"run {r} batch={batch} on={on}: {res['us_per_message']:.2f} us/msg",
                            file=sys.stderr,
                        )
            dropped = dict(broker.dedup.dropped)
    results = []
    for batch, per_read in configs:
        on, off = runs[(batch, per_read, True)], runs[(batch, per_read, False)]
        ratios = [b["us_per_message"] / a["us_per_message"] for a, b in zip(on, off, strict=True)]
        codes: dict[str, int] = {}
        for r in on + off:
            for k, v in r["responses"].items():
                codes[k] = codes.get(k, 0) + v
        results.append(
            {
                "batch": batch,
                "per_read": per_read,
                "us_per_message_on": round(statistics.median(r["us_per_message"] for r in on), 3),
                "us_per_message_off": round(statistics.median(r["us_per_message"] for r in off), 3),
                "on_over_off_msgs_per_cpu_s": [round(x, 3) for x in ratios],
                "median_on_over_off_msgs_per_cpu_s": round(statistics.median(ratios), 3),
                "runs_us_per_message_on": [round(r["us_per_message"], 3) for r in on],
                "runs_us_per_message_off": [round(r["us_per_message"], 3) for r in off],
                # the least disturbed run of each: what a quiet machine would show
                "min_on_over_off_msgs_per_cpu_s": round(
                    min(r["us_per_message"] for r in off) / min(r["us_per_message"] for r in on), 3
                ),
                "responses": codes,
            }
        )
    return {
        "benchmark": "dedup_ab",
        "python": platform.python_version(),
        "codec": _native.DESCRIPTION,
        "body_bytes": args.body,
        "repeats": args.repeats,
        "gc_tuned_as_served": args.tune_gc,
        "dropped": dropped,  # must stay empty: no message was a resend
        "results": results,
        "note": "one process, window switched on and off between runs; a machine shared by 7 helpers: indicative",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 1])
    ap.add_argument("--per-read", type=int, nargs="+", default=[16])
    ap.add_argument("--requests", type=int, default=20_000, help="requests per run (single sends)")
    ap.add_argument("--batch-requests", type=int, default=2_000, help="requests per run (batches)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument(
        "--no-tune-gc",
        dest="tune_gc",
        action="store_false",
        help="keep CPython's collector thresholds (a served broker raises gen-0's: tidemq.cli.tune_gc)",
    )
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
