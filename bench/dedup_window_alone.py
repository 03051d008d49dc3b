"""The duplicate window's own CPU per batch (issue 37), in one process, without a broker.

    .venv/bin/python bench/dedup_window_alone.py [--repeats 60] [--max-entries 500000 5000]
    PYTHONPATH=/work/wt/base_pkgs .venv/bin/python bench/dedup_window_alone.py   # older code

Per chunk of 2 000 batches of 32 messages (fresh ``UNIQ_KEY`` each, by default as RocketMQ 4.x's
producers make them, ``--producers`` taking turns: see ``key_source``; the message ids
joined as a put answers them), what the send path calls: ``DuplicateWindow.admit_run`` on a run of
one send, then ``Sent.stored``.  Chunks alternate between a topic with the window on (filled to
``--max-entries`` keys, then evicting the oldest) and a topic with it off
(``dedup.window.seconds = 0``: the same calls, nothing kept); CPU time (``time.process_time``)
per batch, medians of the last two thirds of the chunks.  ``--hot``: each batch made just before
its calls (its messages in the cache, as a broker's just decoded ones; the chunk's messages are
otherwise cold, which the key reads pay), each call timed (wall).  The difference is the window's own
cost per batch; a served broker spends ~100-130 us of CPU on a batch of 32 x 1 KiB with the
window off, so 5 us is ~4-5 %.  Prints JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import time
from collections.abc import Callable
from typing import Any

from tidemq.broker.dedup import UNIQ_KEY, DuplicateWindow
from tidemq.broker.services.put import Send
from tidemq.cli import tune_gc
from tidemq.message_types import MessageInner


class _Result:
    wrote_offset = 0
    wrote_bytes = 35_000


class _Cfg:
    def __init__(self, attributes: dict[str, str]) -> None:
        self.attributes = attributes


def key_source(kind: str, producers: int) -> Callable[[], list[str]]:
    """A function giving the next batch's 32 keys, the producers' batches in turn.

    ``rmq4``: RocketMQ 4.x's ``UNIQ_KEY`` (``MessageClientIDSetter``): a producer's fixed prefix
    (IPv4, pid, class loader hash: 20 hex digits), the milliseconds since the month began (8) and a
    16-bit counter (4), upper case; a producer makes ~3 batches a millisecond.  ``rmq5``: RocketMQ
    5's ``message_id`` (``01``, MAC, pid, seconds since 2021, a 32-bit sequence: 34 hex digits).
    ``served``: ``compare_load.py``'s batches (a 16-digit prefix, a 6-digit batch number, the
    message's index in 2 digits).  ``counter``: one 32-digit counter over all producers (this
    benchmark's keys before session 9).  ``random``: 32 random hex digits."""
    rng = random.Random(37)
    if kind == "counter":
        counter = itertools.count()
        return lambda: [f"{next(counter):032X}" for _ in range(32)]
    if kind == "random":
        return lambda: [f"{rng.getrandbits(128):032X}" for _ in range(32)]
    prefixes = [f"{rng.getrandbits(80):020X}" for _ in range(producers)]
    counts = [rng.getrandbits(16) for _ in range(producers)]
    made = [0] * producers
    turn = itertools.count()

    def next_keys() -> list[str]:
        p = next(turn) % producers
        prefix, count, n = prefixes[p], counts[p], made[p]
        made[p] = n + 1
        counts[p] = count + 32
        if kind == "served":
            return [f"{prefix[:16]}{n & 0xFFFFFF:06X}{i:02X}" for i in range(32)]
        if kind == "rmq5":  # "01", MAC and pid (16 digits), seconds, sequence
            seconds = 0x0F000000 + n // 2000
            return [f"01{prefix[:16]}{seconds:08X}{(count + i) & 0xFFFFFFFF:08X}" for i in range(32)]
        ms = 0x10000000 + n // 3
        return [f"{prefix}{ms:08X}{(count + i) & 0xFFFF:04X}" for i in range(32)]

    return next_keys


def measure(
    max_entries: int,
    repeats: int,
    chunk: int = 2000,
    hot: bool = False,
    only: str | None = None,
    keys: str = "rmq4",
    producers: int = 4,
    batch_size: int = 32,
) -> dict[str, Any]:
    window = DuplicateWindow(120, max_entries, 1 << 40)
    configs = {"On": _Cfg({}), "Off": _Cfg({"dedup.window.seconds": "0"})}
    offset = 0
    next_32 = key_source(keys, producers)
    pending: list[str] = []

    def next_keys() -> list[str]:  # batch_size keys: a producer's 32 split in order
        if len(pending) < batch_size:
            pending.extend(next_32())
        out = pending[:batch_size]
        del pending[:batch_size]
        return out

    def batch(topic: str) -> Send:
        nonlocal offset
        msgs = [MessageInner(topic, b"x", 0, 0, {UNIQ_KEY: k, "TAGS": "t"}) for k in next_keys()]
        n = len(msgs)
        send = Send("g", msgs, n > 1, None, 0, n)
        send.status, send.queue_id, send.queue_offset, send.recall_handle = 0, 0, 0, None
        send.msg_id = ",".join(f"7F00000100002A9F{offset + j * 1100:016X}" for j in range(n))
        offset += n * 1100
        return send

    runs: dict[str, list[float]] = {"On": [], "Off": []}
    for rep in range(repeats):
        for topic in (only,) if only else ("On", "Off") if rep % 2 else ("Off", "On"):
            if hot:  # each batch made just before its calls (as a broker decodes it): wall time
                spent = 0
                for _ in range(chunk):
                    send = batch(topic)
                    started_ns = time.perf_counter_ns()
                    window.admit_run([send], configs.get)
                    sent = send.dedup
                    if sent is not None:
                        sent.stored(send, _Result())
                    spent += time.perf_counter_ns() - started_ns
                runs[topic].append(spent / chunk)
                continue
            sends = [batch(topic) for _ in range(chunk)]
            started = time.process_time()
            for send in sends:
                window.admit_run([send], configs.get)
                sent = send.dedup
                if sent is not None:
                    sent.stored(send, _Result())
            runs[topic].append((time.process_time() - started) / chunk * 1e9)
            del sends

    def median(values: list[float]) -> float:
        kept = sorted(values[len(values) // 3 :])
        return kept[len(kept) // 2]

    if only:  # one side alone (under perf record: the on and off profiles differenced)
        runs["Off" if only == "On" else "On"] = runs[only]
    on, off = median(runs["On"]), median(runs["Off"])
    return {
        "max_entries": max_entries,
        "hot": hot,
        "keys": keys,
        "producers": producers,
        "batch_size": batch_size,
        "entries_at_end": window.entries,
        "evicted": window.evicted,
        "ns_per_batch_on": round(on),
        "ns_per_batch_off": round(off),
        "window_ns_per_batch": round(on - off),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=60)
    p.add_argument("--max-entries", type=int, nargs="+", default=[500_000, 5_000])
    p.add_argument(
        "--hot",
        action="store_true",
        help="make each batch just before its calls (its messages in the cache, as a broker's "
        "freshly decoded ones) and time each call (perf_counter_ns, wall) instead of a chunk's CPU",
    )
    p.add_argument(
        "--only",
        choices=["On", "Off"],
        help="run one side alone (for `perf record`: profile On and Off apart and difference them)",
    )
    p.add_argument(
        "--keys",
        choices=["rmq4", "rmq5", "served", "counter", "random"],
        default="rmq4",
        help="the keys' shape (see key_source; before session 9: counter)",
    )
    p.add_argument("--producers", type=int, default=4, help="producers whose batches take turns")
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="messages a send (1: single sends, a producer's keys in order)",
    )
    p.add_argument("--chunk", type=int, default=2000, help="sends a chunk")
    args = p.parse_args()
    tune_gc()
    load = os.getloadavg()
    results = [
        measure(
            m,
            args.repeats,
            chunk=args.chunk,
            hot=args.hot,
            only=args.only,
            keys=args.keys,
            producers=args.producers,
            batch_size=args.batch_size,
        )
        for m in args.max_entries
    ]
    print(
        json.dumps(
            {
                "benchmark": "dedup_window_alone",
                "pythonpath": os.environ.get("PYTHONPATH", ""),
                "load_average_at_start": [round(x, 2) for x in load],
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
