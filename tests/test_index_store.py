"""The ``hash`` index composed with the ``mmap`` store: keys survive a killed broker process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tidemq.index import look_message_by_id, look_message_by_unique_key, query_messages
from tidemq.message import MessageInner
from tidemq.plugins import get_plugin_manager

FOREVER = 2**63 - 1
TOPIC = "OrderTopic"
INDEX_OPTIONS = {"max_hash_slot_num": 97, "max_index_num": 400}  # several files per run
# Checkpoints every 50 ms, so the kill lands with index files on both sides of one.
STORE_OPTIONS = {"commitlog_file_size": 256 * 1024, "cq_flush_interval_ms": 50}


def compose(data_dir: Path) -> tuple[Any, Any]:
    pm = get_plugin_manager()
    if "mmap" not in pm.available("store"):
        pytest.skip("the mmap store plugin is not installed")
    flush = pm.create("flush", "async", data_dir=data_dir)
    index = pm.create("index", "hash", options=INDEX_OPTIONS, data_dir=data_dir)
    store = pm.create(
        "store", "mmap", options=STORE_OPTIONS, data_dir=data_dir, components={"flush": flush, "index": index}
    )
    return store, index


def message(i: int) -> MessageInner:
    props = {"KEYS": f"order-{i} customer-{i % 7}", "UNIQ_KEY": f"C0A80001{i:024X}"}
    return MessageInner(topic=TOPIC, body=b"payload-%d" % i, properties=props)


_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from test_index_store import compose, message

    store, index = compose(Path(sys.argv[1]))
    assert store.load()
    store.start()
    n = int(sys.argv[3])
    results = [store.put_message(message(i)).result(30) for i in range(n // 2)]
    time.sleep(0.3)
    results += [store.put_message(message(i)).result(30) for i in range(n // 2, n)]
    deadline = time.monotonic() + 30
    while index.query("OrderTopic", f"order-{len(results) - 1}", 1, 0, 2**62).phy_offsets == ():
        assert time.monotonic() < deadline, "the store never dispatched the last message"
        time.sleep(0.01)
    print(json.dumps([r.msg_id for r in results]), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_every_key_found_after_the_broker_process_is_killed(tmp_path: Path) -> None:
    compose(tmp_path)  # skips when the store is not installed
    n = 600
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path), str(Path(__file__).parent), str(n)],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-3000:]
    msg_ids = json.loads(proc.stdout)
    assert (tmp_path / "abort").exists()

    store, index = compose(tmp_path)
    assert store.load()  # abnormal recovery: the abort file is there
    store.start()
    try:
        for i in range(n):
            found, _ = query_messages(index, store, TOPIC, f"order-{i}", 4, 0, FOREVER)
            assert [m.body for m in found] == [b"payload-%d" % i], i
            by_uniq = look_message_by_unique_key(index, store, TOPIC, f"C0A80001{i:024X}")
            assert by_uniq is not None and by_uniq.body == b"payload-%d" % i, i
        by_id = look_message_by_id(store, msg_ids[123])
        assert by_id is not None and by_id.body == b"payload-123"
        newest, _ = query_messages(index, store, TOPIC, "customer-3", 5, 0, FOREVER)
        assert [m.body for m in newest] == [b"payload-%d" % i for i in (598, 591, 584, 577, 570)]

        more = [store.put_message(message(i)).result(30) for i in range(n, n + 50)]
        assert all(r.ok for r in more)
        deadline = time.monotonic() + 30
        while index.query(TOPIC, f"order-{n + 49}", 1, 0, FOREVER).phy_offsets == ():
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        store.shutdown()

    store, index = compose(tmp_path)  # a clean restart reloads the same files
    assert store.load()
    store.start()
    try:
        for i in (0, 299, n - 1, n + 49):
            found, _ = query_messages(index, store, TOPIC, f"order-{i}", 4, 0, FOREVER)
            assert [m.body for m in found] == [b"payload-%d" % i], i
    finally:
        store.shutdown()
