"""The broker's threads carry their names in the kernel (``top -H``, ``ps -L``, perf,
``bench/thread_cpu.py`` read them from /proc/<pid>/task/<tid>/comm)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from tidemq.jsonfile import CoalescedJsonWriter
from tidemq.store import PutStatus
from tidemq.testing.store_contract import message
from tidemq.threads import name_this_thread, os_name
from tidemq_flush import PeriodicFlush
from tidemq_store_mmap.options import MmapStoreOptions
from tidemq_store_mmap.store import MmapMessageStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names in /proc: Linux")


def comm(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().strip()


def comms() -> set[str]:
    return {comm(int(t)) for t in os.listdir("/proc/self/task")}


def test_a_thread_gets_its_python_name_cut_to_fifteen_bytes() -> None:
    seen: dict[str, str] = {}

    def run(key: str, name: str | None) -> None:
        assert name_this_thread(name)
        seen[key] = comm(threading.get_native_id())

    threads = [
        threading.Thread(target=run, args=("plain", None), name="hash-index"),
        threading.Thread(target=run, args=("long", None), name="tidemq-persist-topics.json"),
        threading.Thread(target=run, args=("given", "commitlog-zeros"), name="Thread-9"),
        threading.Thread(target=run, args=("utf8", None), name="prüfung-xéééééé"),
    ]
    for t in threads:
        t.start()
        t.join()
    assert seen["plain"] == "hash-index"
    assert seen["long"] == "tidemq-persist-"
    assert seen["given"] == "commitlog-zeros"
    # 15 bytes would cut an é in two: the name stops before it.
    assert seen["utf8"] == os_name("prüfung-xéééééé").decode() == "prüfung-xéé"  # 14 bytes
    assert comm(threading.main_thread().native_id or 0) != "hash-index"  # only the caller is named


def test_a_started_store_names_its_threads(tmp_path: Path) -> None:
    store = MmapMessageStore(tmp_path, MmapStoreOptions(), PeriodicFlush())
    assert store.load()
    store.start()
    try:
        assert store.put_message(message(body=b"x")).result(10).status is PutStatus.PUT_OK
        deadline = time.monotonic() + 5
        want = {"flush-async", "store-service", "store-dispatch"}
        while not want <= comms() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert want <= comms()
    finally:
        store.shutdown()


def test_each_table_writer_names_its_thread_by_its_file(tmp_path: Path) -> None:
    writers = [
        CoalescedJsonWriter(tmp_path / f"{n}.json", lambda: {"a": 1}) for n in ("topics", "consumerOffset")
    ]
    try:
        for w in writers:
            w.when_written(w.request()).result(10)
        assert {"persist-topics", "persist-consume"} <= comms()  # 15 bytes of "persist-consumerOffset"
    finally:
        for w in writers:
            w.close()
