"""The memory a full duplicate window holds (issue 37): RSS and traced bytes, in one process.

    .venv/bin/python bench/dedup_window_rss.py [--keys 500000] [--batch 32 1]
    PYTHONPATH=/work/wt/base_pkgs .venv/bin/python bench/dedup_window_rss.py   # older code

Fills a fresh window with ``--keys`` fresh 32-hex-digit keys, ``--batch`` a send, through the
send path's calls (``DuplicateWindow.record``, then the answer's message ids set as
``Sent.stored`` sets them: a put's offset ids joined by commas), then reports the process's RSS
growth (``/proc/self/statm``: the key table's huge-page mapping included), the bytes
``tracemalloc`` saw (Python's allocators only: not the table's mapping), and the window's own
estimate (``nbytes``, what ``dedup_max_bytes`` bounds).  Prints JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tracemalloc
from typing import Any

from tidemq.broker.dedup import DuplicateWindow
from tidemq.broker.dedup_table import hashes_of


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(keys: int, batch: int, traced: bool) -> dict[str, Any]:
    window = DuplicateWindow(120, keys, 1 << 40)
    gc.collect()
    if traced:
        tracemalloc.start()
    rss0 = _rss()
    t0 = tracemalloc.get_traced_memory()[0] if traced else 0
    offset = 0
    for i in range(keys // batch):
        names = [f"{i:016X}{j:016X}" for j in range(batch)]
        sent = window.record("T", hashes_of(names), None, 120)
        assert sent is not None
        sent.msg_id = ",".join(f"7F00000100002A9F{offset + j * 1100:016X}" for j in range(batch))
        offset += batch * 1100
    gc.collect()
    rss = _rss() - rss0
    used = tracemalloc.get_traced_memory()[0] - t0 if traced else 0
    if traced:
        tracemalloc.stop()
    return {
        "keys": window.entries,
        "batch": batch,
        "rss_bytes": rss,
        "rss_bytes_per_key": round(rss / window.entries, 1),
        "traced_bytes_per_key": round(used / window.entries, 1) if traced else None,
        "estimate_bytes_per_key": round(window.nbytes / window.entries, 1),
        "table_capacity": sum(t.capacity for t in window._topics.values()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=500_000)
    p.add_argument("--batch", type=int, nargs="+", default=[32, 1])
    p.add_argument("--traced", action="store_true", help="also count tracemalloc's bytes (slower)")
    args = p.parse_args()
    results = [measure(args.keys, b, args.traced) for b in args.batch]
    print(
        json.dumps(
            {
                "benchmark": "dedup_window_rss",
                "pythonpath": os.environ.get("PYTHONPATH", ""),
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
