"""Flush policies: group commit batching and timeouts, periodic flushing, the transient pool."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path

from tidemq.flush import Flushable, FlushPolicy
from tidemq.message import decode_message
from tidemq.store import GetStatus, PutResult, PutStatus
from tidemq.testing.store_contract import build_store, message
from tidemq_flush import AsyncFlushOptions, GroupCommitFlush, PeriodicFlush, SyncFlushOptions
from tidemq_store_mmap.options import MmapStoreOptions
from tidemq_store_mmap.store import MmapMessageStore


def wait_until(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def test_group_commit_batches_concurrent_writers_behind_few_fsyncs(tmp_path: Path) -> None:
    store = build_store("mmap", tmp_path, flush="sync", store_options={"commitlog_file_size": 1 << 22})
    assert store.load()
    store.start()
    policy = store.flush_policy
    writers, per_writer = 32, 25
    results: list[tuple[PutResult, int]] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        for i in range(per_writer):
            fut = store.put_message(message(body=b"%d-%d" % (w, i), queue_id=w % 4))
            res = fut.result(30)
            # When the future resolves, the bytes are already on disk.
            flushed = store.commitlog.flushed_where
            with lock:
                results.append((res, flushed))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fsyncs = store.commitlog.queue.flush_calls()
    store.shutdown()
    writes = writers * per_writer
    assert len(results) == writes and all(r.ok for r, _ in results)
    assert all(flushed >= r.wrote_offset + r.wrote_bytes for r, flushed in results)
    assert policy.requests == writes
    # Batching: far fewer fsyncs than acknowledged writes.
    assert fsyncs <= writes / 4, (fsyncs, writes)
    assert policy.flush_rounds <= writes / 4


class StuckDisk:
    """A Flushable over a real target whose flush hangs until released (a stalled disk)."""

    def __init__(self, target: Flushable, release: threading.Event):
        self.target = target
        self.release = release

    def flush(self, least_pages: int = 0) -> int:
        self.release.wait()
        return self.target.flush(least_pages)

    def commit(self, least_pages: int = 0) -> int:
        return self.target.commit(least_pages)

    @property
    def flushed_where(self) -> int:
        return self.target.flushed_where


class StallingPolicy:
    """Runs a real group-commit policy against a stalled disk."""

    def __init__(self, inner: GroupCommitFlush, release: threading.Event):
        self.inner = inner
        self.release = release

    def start(self, target: Flushable) -> None:
        self.inner.start(StuckDisk(target, self.release))

    def request(self, end_offset: int) -> Future[bool]:
        return self.inner.request(end_offset)

    def shutdown(self) -> None:
        self.release.set()
        self.inner.shutdown()


def test_flush_timeout_is_reported_as_flush_disk_timeout(tmp_path: Path) -> None:
    release = threading.Event()
    policy = StallingPolicy(GroupCommitFlush(SyncFlushOptions(timeout_ms=200)), release)
    assert isinstance(policy, FlushPolicy)
    store = MmapMessageStore(tmp_path, MmapStoreOptions(), policy)
    assert store.load()
    store.start()
    try:
        t0 = time.monotonic()
        res = store.put_message(message(body=b"slow")).result(10)
        waited = time.monotonic() - t0
        assert res.status is PutStatus.FLUSH_DISK_TIMEOUT
        assert 0.15 <= waited < 5
        # Stored, just not confirmed durable: RocketMQ's semantics for FLUSH_DISK_TIMEOUT.
        assert store.get_message("g", "TopicA", 0, 0, 1).status is GetStatus.FOUND
        release.set()
        assert store.put_message(message(body=b"fast")).result(10).status is PutStatus.PUT_OK
    finally:
        store.shutdown()


def test_async_flush_acknowledges_at_once_and_flushes_in_the_background(tmp_path: Path) -> None:
    store = build_store(
        "mmap",
        tmp_path,
        flush="async",
        flush_options={"interval_ms": 20, "least_pages": 2, "thorough_interval_ms": 3_600_000},
    )
    assert store.load()
    store.start()
    try:
        cl = store.commitlog
        small = store.put_message(message(body=b"tiny")).result(10)
        assert small.ok and cl.flushed_where < small.wrote_offset + small.wrote_bytes
        time.sleep(0.2)
        # Less than least_pages dirty and no thorough flush due: it stays in the page cache.
        assert cl.flushed_where < small.wrote_offset + small.wrote_bytes
        big = [store.put_message(message(body=bytes(3000))).result(10) for _ in range(4)]
        end = big[-1].wrote_offset + big[-1].wrote_bytes
        # Two pages dirty now: the periodic flush takes them (the partial last page may wait).
        assert wait_until(lambda: cl.flushed_where >= end - 4096, 10)
        assert store.flush_policy.flush_rounds >= 1
    finally:
        store.shutdown()


def test_async_thorough_flush_writes_even_a_few_bytes(tmp_path: Path) -> None:
    store = build_store(
        "mmap",
        tmp_path,
        flush="async",
        flush_options={"interval_ms": 20, "least_pages": 1000, "thorough_interval_ms": 200},
    )
    assert store.load()
    store.start()
    try:
        small = store.put_message(message(body=b"tiny")).result(10)
        assert wait_until(lambda: store.commitlog.flushed_where >= small.wrote_offset + small.wrote_bytes, 10)
    finally:
        store.shutdown()


def test_transient_pool_serves_reads_before_commit_and_commits_on_schedule(tmp_path: Path) -> None:
    def open_transient(commit_ms: int):
        store = build_store(
            "mmap",
            tmp_path / str(commit_ms),
            flush="async",
            store_options={"transient_store_pool": True, "commitlog_file_size": 1 << 16},
            flush_options={
                "commit_interval_ms": commit_ms,
                "commit_least_pages": 0,
                "commit_thorough_interval_ms": commit_ms,
            },
        )
        assert store.load()
        store.start()
        return store

    store = open_transient(3_600_000)
    log_file = tmp_path / "3600000" / "commitlog" / f"{0:020d}"
    try:
        res = store.put_message(message(body=b"buffered")).result(10)
        # Readable at once, from the off-map buffer...
        got = store.get_message("g", "TopicA", 0, 0, 1)
        assert got.status is GetStatus.FOUND and decode_message(got.buffers[0]).body == b"buffered"
        # ...while the mapped file does not have it yet.
        assert log_file.read_bytes()[: res.wrote_bytes] == bytes(res.wrote_bytes)
        assert store.commitlog.queue.committed_where == 0
    finally:
        store.shutdown()
    # Shutdown commits and flushes what the buffer held.
    assert decode_message(log_file.read_bytes(), check_crc=True).body == b"buffered"

    store = open_transient(50)
    try:
        res = store.put_message(message(body=b"committed")).result(10)
        assert wait_until(lambda: store.commitlog.queue.committed_where >= res.wrote_bytes, 10)
        on_disk = (tmp_path / "50" / "commitlog" / f"{0:020d}").read_bytes()
        assert decode_message(on_disk, check_crc=True).body == b"committed"
    finally:
        store.shutdown()


def test_policies_flush_everything_on_shutdown(tmp_path: Path) -> None:
    for name, policy in (
        ("sync", GroupCommitFlush()),
        ("async", PeriodicFlush(AsyncFlushOptions(interval_ms=60_000))),
    ):
        store = MmapMessageStore(tmp_path / name, MmapStoreOptions(), policy)
        assert store.load()
        store.start()
        res = store.put_message(message(body=b"last words")).result(10)
        store.shutdown()
        assert store.commitlog.flushed_where == res.wrote_offset + res.wrote_bytes


def test_group_commit_submit_resolves_the_callers_future_with_its_values(tmp_path: Path) -> None:
    """The store's fast path: the policy resolves the caller's future itself, or times it out."""
    store = build_store("mmap", tmp_path / "a", flush="sync")
    assert store.load()
    store.start()
    try:
        policy = store.flush_policy
        res = store.put_message(message(body=b"x")).result(10)
        assert res.ok and store.commitlog.flushed_where >= res.wrote_offset + res.wrote_bytes
        fut: Future[str] = Future()
        policy.submit(0, fut, "durable", lambda: "late")  # already flushed: resolved at once
        assert fut.done() and fut.result() == "durable"
    finally:
        store.shutdown()
    release = threading.Event()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=200))
    stuck = StuckDisk(build_store("mmap", tmp_path / "b", flush="async").commitlog, release)
    policy.start(stuck)
    try:
        fut = Future()
        policy.submit(1 << 40, fut, "durable", lambda: "late")
        assert fut.result(5) == "late"
    finally:
        release.set()
        policy.shutdown()
