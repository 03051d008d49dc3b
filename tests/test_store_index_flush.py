"""The key index is flushed on its own, slower pace; a crash in between loses no key.

The mmap store flushes its consume queues and checkpoint every ``cq_flush_interval_ms`` but the
hash index only every ``index_flush_interval_ms``: the checkpoint's index time then lags, and an
abnormal restart re-dispatches the commit log from it, rebuilding the keys written since.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tidemq.plugins import get_plugin_manager
from tidemq.testing.store_contract import build_store

OPTS = {"commitlog_file_size": 1 << 20, "cq_flush_interval_ms": 50, "index_flush_interval_ms": 60_000}

WRITER = r"""
import json, sys
from tidemq.plugins import get_plugin_manager
from tidemq.testing.store_contract import build_store, message

data, opts = sys.argv[1], json.loads(sys.argv[2])
index = get_plugin_manager().create("index", "hash", data_dir=data)
store = build_store("mmap", data, flush="sync", store_options=opts, index=index)
assert store.load()
store.start()
i = 0
while True:
    r = store.put_message(message(body=b"v%d" % i, KEYS="order-%d" % i, queue_id=i % 4)).result()
    if r.ok:
        sys.stdout.write("%d %d\n" % (i, r.wrote_offset))
        sys.stdout.flush()
    i += 1
"""


def test_keys_written_after_the_last_index_flush_survive_a_kill(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path), json.dumps(OPTS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    acked: dict[int, int] = {}
    started = time.monotonic()
    try:
        # Long enough for several queue and checkpoint flushes, none of the index.
        while len(acked) < 300 or time.monotonic() - started < 0.5:
            line = proc.stdout.readline()
            assert line, proc.stderr.read().decode() if proc.stderr else "the writer died"
            i, offset = map(int, line.split())
            acked[i] = offset
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert (tmp_path / "abort").exists()  # a crash, not a clean exit

    index = get_plugin_manager().create("index", "hash", data_dir=tmp_path)
    store = build_store("mmap", tmp_path, store_options=OPTS, index=index)
    assert store.load()
    store.start()
    try:
        missing = [
            i
            for i, offset in acked.items()
            if offset not in index.query("TopicA", f"order-{i}", 4, 0, 2**62).phy_offsets
        ]
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged keys lost, e.g. {missing[:5]}"
    finally:
        store.shutdown()
