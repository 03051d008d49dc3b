"""The duplicate window's own costs (issue 37): its rebuild from the commit log, and its check.

    python bench/dedup_bench.py [--records 1000000] [--batch 32] [--body 100]

1. Fills an mmap store (async flush) with ``--records`` messages, each with its own UNIQ_KEY, in
   puts of ``--batch`` (one topic, 8 queues), then times ``rebuild_window`` over all of them (the
   window as long as the run): the time a start or a promoted slave spends before it answers.
2. Times the window's calls per message as a send makes them: ``check`` (a miss) and ``record``
   + ``Sent.stored``, single sends and batches, against a window of 500 000 keys.

Prints JSON.  The machine is shared: figures are indicative.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tidemq.broker.dedup import DuplicateWindow
from tidemq.broker.dedup_rebuild import rebuild_window
from tidemq.broker.dedup_table import hashes_of
from tidemq.message import MessageInner, Prop
from tidemq.testing.store_contract import build_store

UNIQ = Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX


def fill(data: Path, records: int, batch: int, body: bytes) -> Any:
    store = build_store("mmap", data, flush="async", store_options={"commitlog_file_size": 256 * 1024 * 1024})
    assert store.load()
    store.start()
    prefix = uuid.uuid4().hex[:16].upper()
    n = 0
    while n < records:
        msgs = [
            MessageInner(
                "BenchDedup",
                body,
                (n // batch) % 8,
                properties={UNIQ: f"{prefix}{n + i:016X}", "WAIT": "true"},
                born_host=("127.0.0.1", 1),
                store_host=("127.0.0.1", 10911),
            )
            for i in range(min(batch, records - n))
        ]
        future = store.put_messages(msgs)
        assert future.result(60).ok
        n += len(msgs)
    return store


def time_rebuild(store: Any, records: int) -> dict[str, Any]:
    window = DuplicateWindow(3600, records * 2, 1 << 40)
    started = time.perf_counter()
    rebuild_window(window, store, lambda topic: (3600.0, False))
    took = time.perf_counter() - started
    return {
        "records": window.rebuilt_records,
        "keys": window.entries,
        "seconds": round(took, 3),
        "records_per_s": round(window.rebuilt_records / took) if took else None,
        "window_mib": round(window.nbytes / 2**20, 1),
    }


class _Send:
    """The fields of a settled send :meth:`Sent.stored` reads."""

    __slots__ = ("msg_id", "msgs", "queue_id", "queue_offset", "recall_handle", "status")

    def __init__(self, n: int) -> None:
        self.status = 0
        self.msg_id = ",".join(["7F00000100002A9F0000000000001000"] * n)
        self.queue_id = 1
        self.queue_offset = 5
        self.recall_handle = None
        self.msgs = [MessageInner("T", b"")]


class _Result:
    wrote_offset = 4096
    wrote_bytes = 200


def time_calls(batch: int, sends: int = 50_000) -> dict[str, Any]:
    window = DuplicateWindow(120, 500_000, 1 << 40)
    keys = [uuid.uuid4().hex.upper() for _ in range(sends * batch)]
    send = _Send(batch)
    result = _Result()
    started = time.perf_counter()
    for s in range(sends):
        ks = keys[s * batch : (s + 1) * batch]
        if batch == 1:
            window.check("BenchTopic", ks[0])
        hashes = hashes_of(ks)
        if batch > 1 and window.check_many("BenchTopic", hashes) is not None:
            raise AssertionError("a fresh key found in the window")
        sent = window.record("BenchTopic", hashes, send, 120.0)  # type: ignore[arg-type]
        assert sent is not None
        sent.stored(send, result)  # type: ignore[arg-type]
    took = time.perf_counter() - started
    return {
        "batch": batch,
        "us_per_message": round(took / (sends * batch) * 1e6, 3),
        "entries": window.entries,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--body", type=int, default=100)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidemq-dedup-"))
    try:
        started = time.perf_counter()
        store = fill(work, args.records, args.batch, b"x" * args.body)
        filled = time.perf_counter() - started
        rebuild = time_rebuild(store, args.records)
        store.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from tidemq import _native

    print(
        json.dumps(
            {
                "machine": f"{platform.machine()} {platform.python_version()}",
                "codec": _native.DESCRIPTION,
                "fill": {
                    "records": args.records,
                    "batch": args.batch,
                    "body": args.body,
                    "seconds": round(filled, 1),
                },
                "rebuild": rebuild,
                "window_calls": [time_calls(1), time_calls(32, 5_000)],
                "note": "a machine shared by 7 helpers: indicative",
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
