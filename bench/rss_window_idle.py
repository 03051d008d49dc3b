"""What the duplicate window (issue 37) holds per single send, and what it keeps once idle.

    .venv/bin/python bench/rss_window_idle.py [--keys 300000] [--batch 1 32]

In one process, with the window's clock in the script's hands: records ``--keys`` fresh keys
(``--batch`` a send, answered as a stored send is: a message id set), then reports the anonymous
RSS it took (/proc/self/status RssAnon, so pymalloc's arenas and the key table's mapping), the
window's own estimate (``dedupBytes``, what ``dedup_max_bytes`` bounds); then lets the clock pass
the window (nothing sent) and reports what it still holds (the window drops expired sends only
when a send records a key, so an idle broker keeps its last window); then records one more send
and reports the RSS after that trim.  Prints JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
from typing import Any

from tidemq.broker.dedup import DuplicateWindow
from tidemq.broker.dedup_table import hashes_of


def _anon_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def measure(keys: int, batch: int, window_s: float = 120.0) -> dict[str, Any]:
    now = [0.0]
    window = DuplicateWindow(window_s, 1 << 30, 1 << 40, clock=lambda: now[0])
    gc.collect()
    base = _anon_kib()
    step = 1.0 / keys  # the sends spread over the first second of the window
    offset = 0
    for i in range(keys // batch):
        names = [f"{i:016X}{j:016X}" for j in range(batch)]
        sent = window.record("T", hashes_of(names), None, window_s)
        assert sent is not None
        sent.msg_id = ",".join(f"7F00000100002A9F{offset + j * 1100:016X}" for j in range(batch))
        offset += batch * 1100
        now[0] += step * batch
    gc.collect()
    filled = _anon_kib() - base
    entries, estimate = window.entries, window.nbytes
    now[0] += window_s + 1  # past every deadline; nothing sent
    gc.collect()
    idle = _anon_kib() - base
    idle_entries = window.entries
    window.record("T", hashes_of(["next send"]), None, window_s)  # a send trims what expired
    gc.collect()
    after = _anon_kib() - base
    return {
        "keys": entries,
        "batch": batch,
        "anon_kib": filled,
        "anon_bytes_per_key": round(filled * 1024 / entries, 1),
        "estimate_bytes": estimate,
        "estimate_bytes_per_key": round(estimate / entries, 1),
        "idle_past_window": {"entries": idle_entries, "anon_kib": idle},
        "after_next_send": {"entries": window.entries, "anon_kib": after},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=300_000)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    args = p.parse_args()
    print(
        json.dumps(
            {"benchmark": "rss_window_idle", "results": [measure(args.keys, b) for b in args.batch]}, indent=2
        )
    )


if __name__ == "__main__":
    main()
