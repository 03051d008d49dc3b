"""The store's own I/O beside sync flush's rounds (docs/flush.md, "Our own I/O behind the round").

On this project's disk (ext4 without a journal on a virtio disk with a write cache) every
``fdatasync`` ends in a device cache flush, and a cache flush makes durable everything written
before it, whoever wrote it: a commit-log round issued just after ~20 MB of our index pages waited
for them.  What is tested, on real files:

* the hash index's flush writes its dirty pages back a bounded window at a time before its
  ``fdatasync`` (the kernel's own ``cachestat`` counts the file's dirty pages left for it);
* the consume queues are flushed as RocketMQ's FlushConsumeQueueService does: a queue only once 2
  pages of it are dirty, every queue every ``cq_flush_thorough_interval_ms``, and the checkpoint's
  logics time advances only with a thorough flush; after a SIGKILL every acknowledged message is
  found again through its consume queue.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidemq import writeback
from tidemq.message import decode_message
from tidemq.store import GetStatus
from tidemq.testing.store_contract import build_store, message
from tidemq_index_hash.indexfile import HEADER_SIZE, SLOT_SIZE, IndexFile

_NR_CACHESTAT = 451  # x86_64 and the generic table alike (Linux 6.5+)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


def dirty_pages(fd: int) -> int | None:
    """The kernel's count of dirty pages of ``fd`` (``cachestat``), None where it has none."""
    libc = ctypes.CDLL(None, use_errno=True)
    rng, st = _Range(0, 0), _Stat()  # len 0: to the end of the file
    if libc.syscall(_NR_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(st), 0) != 0:
        return None
    return int(st.dirty)


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """Every window :mod:`writeback` hands the kernel: (offset, bytes); the real call made."""
    real = writeback._sync_file_range
    if real is None:
        pytest.skip("no sync_file_range here")
    calls: list[tuple[int, int]] = []

    def counted(fd: int, off: int, n: int, flags: int) -> int:
        calls.append((off, n))
        return int(real(fd, off, n, flags))

    monkeypatch.setattr(writeback, "_sync_file_range", counted)
    yield calls


def test_index_flush_writes_back_in_bounded_windows_before_its_fdatasync(
    tmp_path: Path, windows: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    slots, entries = 1 << 20, 1 << 16  # a 4 MiB slot table: keys dirty pages all over it
    f = IndexFile.create(tmp_path / "idx", slots, entries)
    try:
        rnd = random.Random(7)
        for i in range(20_000):
            h = rnd.randrange(1 << 31)
            f.reserve([h])
            assert f.put_key(h, i * 100, 1_000 + i)
        left_for_fdatasync: list[int | None] = []
        real_fdatasync = os.fdatasync

        def fdatasync(fd: int) -> None:
            left_for_fdatasync.append(dirty_pages(fd))
            real_fdatasync(fd)

        monkeypatch.setattr(os, "fdatasync", fdatasync)
        before = dirty_pages(f._fd)
        f.sync_data()
        monkeypatch.setattr(os, "fdatasync", real_fdatasync)

        assert windows, "the index's pages went to the fdatasync in one burst"
        assert max(n for _, n in windows) <= writeback.WINDOW
        covered = sorted(windows)
        slot_end = HEADER_SIZE + slots * SLOT_SIZE
        assert covered[0][0] == 0 and sum(n for off, n in covered if off < slot_end) >= slot_end - 64 * 1024
        if before is not None and before > 0:
            # The windows wrote the data back: the fdatasync found (almost) nothing dirty left.
            assert left_for_fdatasync and left_for_fdatasync[0] is not None
            assert left_for_fdatasync[0] <= 4, (before, left_for_fdatasync)

        # The next flush with nothing new writes no window that holds anything but the slots.
        windows.clear()
        f.sync_data()
        assert all(off < slot_end for off, _ in windows)
        # And what was written reads back after a reopen (the flush lost nothing).
        count = f.header.index_count
        f.write_header(f.header.pack())
    finally:
        f.close()
    again = IndexFile.open(tmp_path / "idx")
    try:
        assert again.header.index_count == count == 20_001
    finally:
        again.close()


def _checkpoint(root: Path) -> tuple[int, int, int]:
    return struct.unpack_from(">qqq", (root / "checkpoint").read_bytes())


def test_consume_queues_flush_by_least_pages_and_thoroughly_on_their_interval(tmp_path: Path) -> None:
    store = build_store(
        "mmap",
        tmp_path,
        store_options={
            "commitlog_file_size": 1 << 20,
            "cq_flush_interval_ms": 20,
            "cq_flush_least_pages": 2,
            "cq_flush_thorough_interval_ms": 3_600_000,
        },
    )
    assert store.load()
    store.start()
    try:
        first = store.put_message(message(body=b"first", queue_id=0)).result(10)
        store.flusher.flush(thorough=True)  # a thorough flush: the logics time covers "first"
        assert _checkpoint(tmp_path)[1] == first.store_timestamp
        cq0 = store.cqs.find("TopicA", 0)
        calls0 = cq0.queue.flush_calls()
        time.sleep(0.02)  # store times are ms: later puts are later
        # A few entries in each of 4 queues: less than 2 pages dirty anywhere.
        last = None
        for i in range(40):
            last = store.put_message(message(body=b"m%d" % i, queue_id=i % 4)).result(10)
        assert last is not None
        time.sleep(0.5)  # ~25 ticks of the service
        assert cq0.queue.flush_calls() == calls0, "a queue with one dirty page was synced"
        phys, logics, _ = _checkpoint(tmp_path)
        # Nothing the recovery would start from moved: the checkpoint is not rewritten each tick.
        assert phys == first.store_timestamp, "the checkpoint was synced without a thorough flush"
        assert logics == first.store_timestamp, "the logics time moved without a thorough flush"

        # 2 pages of one queue dirty (20-byte entries): that queue is flushed by the next tick.
        for i in range(420):
            last = store.put_message(message(body=b"n%d" % i, queue_id=0)).result(10)
        deadline = time.monotonic() + 5
        while cq0.queue.flush_calls() == calls0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cq0.queue.flush_calls() > calls0
        assert _checkpoint(tmp_path)[1] == first.store_timestamp

        store.flusher.flush(thorough=True)
        assert _checkpoint(tmp_path)[:2] == (last.store_timestamp, last.store_timestamp)
    finally:
        store.shutdown()


WRITER = r"""
import sys
from tidemq.testing.store_contract import build_store, message

store = build_store("mmap", sys.argv[1], flush="sync", store_options={
    "commitlog_file_size": 1 << 20, "consumequeue_entries": 1000,
    "cq_flush_interval_ms": 20, "cq_flush_thorough_interval_ms": 3600000})
assert store.load()
store.start()
store.put_message(message(topic="Kill", body=b"before", queue_id=3)).result()
store.flusher.flush(thorough=True)  # the logics time covers "before" only
i = 0
while True:
    r = store.put_message(message(topic="Kill", body=b"k-%d" % i, queue_id=i % 3)).result()
    if r.ok:
        sys.stdout.write("%d %d %d\n" % (i, i % 3, r.queue_offset))
        sys.stdout.flush()
    i += 1
"""


def test_acknowledged_messages_survive_a_sigkill_between_thorough_flushes(tmp_path: Path) -> None:
    """The queues were last flushed thoroughly at the start: recovery re-dispatches from the
    checkpoint's logics time, so every acknowledged message is in its queue again."""
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(data)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acked: list[tuple[int, int, int]] = []
    try:
        deadline = time.monotonic() + 60
        while len(acked) < 1500 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            acked.append(tuple(int(x) for x in line.split()))  # type: ignore[arg-type]
        time.sleep(0.2)  # a few ticks of the service: least-pages flushes, no thorough one
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    # Lines written before the kill may still be in the pipe: they were acknowledged too.
    rest = proc.stdout.read() if proc.stdout else ""
    acked += [tuple(int(x) for x in line.split()) for line in rest.splitlines() if line.strip()]  # type: ignore[misc]
    assert len(acked) >= 1500
    assert (data / "abort").exists(), "the writer was not killed mid-run"
    logics_before = _checkpoint(data)[1]
    store = build_store(
        "mmap", data, store_options={"commitlog_file_size": 1 << 20, "consumequeue_entries": 1000}
    )
    assert store.load()
    store.start()
    try:
        for i, qid, qoff in acked:
            got = store.get_message("g", "Kill", qid, qoff, 1)
            assert got.status == GetStatus.FOUND, (i, qid, qoff, got.status)
            assert decode_message(got.buffers[0], check_crc=True).body == b"k-%d" % i
        assert logics_before > 0
    finally:
        store.shutdown()


def test_writeback_without_the_call_leaves_the_data_to_fdatasync(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where sync_file_range is missing, no window is issued and the fdatasync writes everything."""
    monkeypatch.setattr(writeback, "_sync_file_range", None)
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"x" * 100_000)
        assert writeback.write_back(fd, [(0, 100_000)]) == 0
        os.fdatasync(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 100_000


def test_checkpoint_is_written_at_once_when_a_time_is_lowered(tmp_path: Path) -> None:
    """A truncation lowers the times: the file must not keep claiming the cut records."""
    from tidemq_store_mmap.checkpoint import StoreCheckpoint

    cp = StoreCheckpoint(tmp_path / "checkpoint")
    cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp = 3000, 2000, 1000
    cp.flush()
    assert not cp.lowered()
    cp.physic_msg_timestamp = 4000
    assert not cp.lowered()
    cp.logics_msg_timestamp = 1500
    assert cp.lowered()
    cp.flush()
    assert not cp.lowered()
    assert _checkpoint(tmp_path) == (4000, 1500, 1000)


def test_zeros_ahead_write_back_each_chunk_before_the_next_under_flush_rounds(tmp_path: Path) -> None:
    """A round's fdatasync waits for every page of the log under writeback: the zeros thread
    writes each chunk back before zeroing the next, so no more than one chunk is ever pending."""
    from tidemq_store_mmap import zeros_ahead
    from tidemq_store_mmap.commitlog import zero_ahead
    from tidemq_store_mmap.mapped_file import MappedFile

    if not writeback.available():
        pytest.skip("no sync_file_range here")
    chunk = 64 * 1024
    mf = MappedFile(tmp_path / f"{0:020d}", 4 << 20, allocate="fallocate")
    pending: list[int | None] = []
    prev: list[tuple[int, int]] = []

    def write(fd: int, zeroed: int, end: int, size: int, limit: int) -> int:
        if prev:
            lo, hi = prev[-1]
            pending.append(_dirty_or_writeback(fd, lo, hi - lo))
        done = zero_ahead(fd, zeroed, end, size, limit)
        prev.append((zeroed, done))
        return done

    z = zeros_ahead.ZerosAhead(write, chunk, 1 << 20, background=True, sync=True, sync_interval_s=60)
    try:
        z.before_write(mf, 0, 100, True)
        assert z.wait_idle(10)
        assert len(prev) >= 8, prev
        if any(p is None for p in pending):
            pytest.skip("no cachestat here")
        assert pending and max(p or 0 for p in pending) == 0, pending
        assert z.written_back >= len(prev) - 1
        assert os.pread(mf.fd, 1 << 20, 0) == bytes(1 << 20)
    finally:
        z.stop()
        mf.close()


def _dirty_or_writeback(fd: int, off: int, length: int) -> int | None:
    libc = ctypes.CDLL(None, use_errno=True)
    rng, st = _Range(off, length), _Stat()
    if libc.syscall(_NR_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(st), 0) != 0:
        return None
    return int(st.dirty + st.writeback)


def test_zeros_ahead_leave_the_writeback_to_the_rounds_when_the_log_grows_fast(tmp_path: Path) -> None:
    """At batched rates the rounds write MBs back anyway: the thread does not wait for each chunk."""
    from tidemq_store_mmap import zeros_ahead
    from tidemq_store_mmap.commitlog import zero_ahead
    from tidemq_store_mmap.mapped_file import MappedFile

    if not writeback.available():
        pytest.skip("no sync_file_range here")
    mf = MappedFile(tmp_path / f"{0:020d}", 64 << 20, allocate="fallocate")
    z = zeros_ahead.ZerosAhead(
        zero_ahead, 256 * 1024, 1 << 20, background=True, sync=True, sync_interval_s=60
    )
    try:
        z.before_write(mf, 0, 100, True)
        assert z.wait_idle(10)
        slow = z.written_back
        assert slow >= 3  # a slow appender: each chunk written back
        time.sleep(0.06)
        end = 24 << 20  # 24 MiB in well under a second: > 16 MiB/s
        mf.wrote_position = end
        z.before_write(mf, end, end + 100, False)
        assert z.wait_idle(10)
        assert z.zeroed_to >= end + (1 << 19)
        assert z.written_back == slow, "a fast appender's zeros were written back chunk by chunk"
    finally:
        z.stop()
        mf.close()
