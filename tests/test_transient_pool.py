"""The transient store pool: buffers lent to commit-log files, reused, bounded, never lost."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tidemq.errors import StoreError
from tidemq.message import BLANK_MAGIC_CODE, decode_message
from tidemq.store import GetStatus
from tidemq.testing.store_contract import build_store, message

FILE = 1 << 16  # 64 KiB commit-log files: a 3 KiB body fills one in 21 records
BODY = 3000


def open_store(root: Path, pool_size: int):
    store = build_store(
        "mmap",
        root,
        flush="async",
        store_options={
            "transient_store_pool": True,
            "transient_store_pool_size": pool_size,
            "commitlog_file_size": FILE,
            # Files are made at roll-over, in order, so which file gets which buffer is known.
            "preallocate": False,
        },
        # Commits only when the test asks (or at shutdown).
        flush_options={"commit_interval_ms": 3_600_000, "commit_thorough_interval_ms": 3_600_000},
    )
    assert store.load()
    store.start()
    return store


def body(i: int, size: int = BODY) -> bytes:
    return (b"%06d" % i) * (size // 6)


def fill_file(store, bodies: list[bytes], size: int = BODY) -> int:
    """Put records until the commit log rolls into a new file; returns how many were put in all."""
    target = max(len(store.commitlog.queue.files), 1) + 1
    while len(store.commitlog.queue.files) < target:
        bodies.append(body(len(bodies), size))
        assert store.put_message(message(body=bodies[-1])).result(10).ok
    return len(bodies)


def read_all(store, count: int) -> list[bytes]:
    bodies: list[bytes] = []
    offset = 0
    while offset < count:
        got = store.get_message("g", "TopicA", 0, offset, 32)
        assert got.status is GetStatus.FOUND
        bodies += [decode_message(b, check_crc=True).body for b in got.buffers]
        offset = got.next_begin_offset
    return bodies


def test_buffers_are_reused_across_files_and_nothing_leaks_between_them(tmp_path: Path) -> None:
    store = open_store(tmp_path, pool_size=2)
    pool = store.transient_pool
    try:
        assert pool.available == 2
        bodies: list[bytes] = []
        n = fill_file(store, bodies)  # file 0 (buffer A) is full, file 1 (buffer B) took the last record
        files = store.commitlog.queue.files
        assert [f.transient for f in files] == [True, True] and pool.available == 0
        buffer_a = files[0].write_buffer()
        # A reader holds the first record, served from buffer A before any commit.
        early = store.get_message("g", "TopicA", 0, 0, 1).buffers[0]
        store.commitlog.commit(0)  # file 0 fully committed: buffer A goes back
        assert not files[0].transient and pool.available == 1
        n = fill_file(store, bodies)  # file 2 is made now and takes buffer A again
        assert files[2].transient and files[2].write_buffer() is buffer_a
        store.commitlog.commit(0)  # file 1 committed: buffer B back, for file 3
        # File 2 is full, written in buffer A over file 0's bytes; larger records (3 a file), so
        # its end marker sits where file 0 still had a record.
        n = fill_file(store, bodies, size=BODY * 7)
        # Buffer A now holds file 2's records; the reader's record did not change under it.
        assert decode_message(early, check_crc=True).body == body(0)
        assert read_all(store, n) == bodies
        assert pool.deficits == 0
    finally:
        store.shutdown()
    # On disk: every record, and past each file's end marker zeros, not the buffer's older bytes.
    store = open_store(tmp_path, pool_size=2)
    try:
        assert read_all(store, n) == bodies
    finally:
        store.shutdown()
    full = sorted((tmp_path / "commitlog").iterdir())[:-1]
    assert len(full) == 3
    for f in full:
        data = f.read_bytes()
        pos = 0
        while True:
            size = int.from_bytes(data[pos : pos + 4], "big", signed=True)
            if int.from_bytes(data[pos + 4 : pos + 8], "big") == BLANK_MAGIC_CODE:
                assert data[pos + 8 :] == bytes(len(data) - pos - 8)
                break
            pos += size


def test_an_exhausted_pool_writes_the_next_file_directly(tmp_path: Path, caplog) -> None:
    store = open_store(tmp_path, pool_size=1)
    try:
        bodies: list[bytes] = []
        with caplog.at_level(logging.WARNING):
            fill_file(store, bodies)
            n = fill_file(store, bodies)
        files = store.commitlog.queue.files
        # No commit asked: file 1 found no buffer and went direct, which first committed file 0
        # (its buffer back to the pool), so file 2 has it again.
        assert [f.transient for f in files] == [False, False, True]
        assert store.transient_pool.deficits == 1
        assert sum("transient store pool" in r.message for r in caplog.records) == 1  # said once
        assert read_all(store, n) == bodies
    finally:
        store.shutdown()
    store = open_store(tmp_path, pool_size=1)
    try:
        assert read_all(store, n) == bodies
    finally:
        store.shutdown()


def test_a_file_written_directly_follows_committed_files_only(tmp_path: Path) -> None:
    """A kill keeps what is in the files: the file written directly (the pool lent its buffers)
    must not hold records while an earlier file's are still only in a buffer (a hole of zeros
    before later records, which recovery cannot cross)."""
    store = open_store(tmp_path, pool_size=1)
    try:
        bodies: list[bytes] = []
        fill_file(store, bodies)  # file 0 in the pool's buffer, no commit asked; file 1 direct
        files = store.commitlog.queue.files
        assert len(files) == 2 and store.transient_pool.deficits == 1
        on_disk = Path(files[0].path).read_bytes()  # what a SIGKILL leaves: the page cache
        assert bodies[0] in on_disk and bodies[-2] in on_disk
    finally:
        store.shutdown()


def test_a_pool_larger_than_half_the_memory_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="transient_store_pool_size 100000 x commitlog_file_size"):
        build_store(
            "mmap",
            tmp_path,
            flush="async",
            store_options={
                "transient_store_pool": True,
                "transient_store_pool_size": 100_000,
                "commitlog_file_size": 1 << 30,
            },
        )
