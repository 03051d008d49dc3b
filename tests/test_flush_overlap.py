"""Overlapping compiled flush rounds (``[flush.sync] overlap_rounds``, docs/flush.md).

A send kicked while a round's ``fdatasync`` runs may start its own round at once on a second
worker.  What a producer relies on must not change: a put is acknowledged only once the flushed
offset covers it, rounds are acted on in the order they started (a later round's success is not
used before every earlier round succeeded), a failed round fails every later one not answered
yet (even one whose own ``fdatasync`` returned 0) through the Python thread's retry and
FLUSH_DISK_TIMEOUT, and each round in flight has its own open file description of the file.
Real mmap stores on real files; the worker's ``hold`` keeps a slot's round from starting its
``fdatasync`` (a real one cannot be made slow on demand).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tidemq.futures import resolved
from tidemq.store import PutStatus
from tidemq.testing.store_contract import build_store, message
from tidemq_flush import native_rounds

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not native_rounds.available(),
        reason="the compiled flush worker is not built (or TIDEMQ_NO_EXTENSIONS)",
    ),
]

TOPIC = "Overlap"


def _store(data: Path, **sync: Any) -> Any:
    store = build_store(
        "mmap",
        data,
        flush="sync",
        store_options={"commitlog_file_size": 128 * 1024, "consumequeue_entries": 200},
        flush_options=sync,
    )
    assert store.load()
    store.start()
    return store


def _until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _put(store: Any, body: bytes) -> Any:
    return store.put_message(message(topic=TOPIC, body=body, queue_id=0))


def test_each_round_in_flight_syncs_its_own_open_file_description_of_the_commit_log(tmp_path: Path) -> None:
    store = _store(tmp_path / "s", overlap_rounds=3)
    native = store.flush_policy._native
    assert native is not None and native.worker.slots == 3

    async def main() -> None:
        assert (await resolved(_put(store, b"one"))).ok

    try:
        asyncio.run(main())
        fds = native._fds
        assert fds is not None and len(set(fds)) == 3
        own = store.commitlog.queue.files[-1].fd
        inode = os.fstat(own)[1:3]
        assert all(os.fstat(fd)[1:3] == inode for fd in fds)  # the same file ...
        # ... through different open file descriptions (a dup would share the offset, and the
        # errseq cursor with it: a writeback error reported to one would be lost to the other).
        for i, fd in enumerate((*fds, own)):
            os.lseek(fd, 100 + i, os.SEEK_SET)
        assert [os.lseek(fd, 0, os.SEEK_CUR) for fd in (*fds, own)] == [100, 101, 102, 103]
    finally:
        store.shutdown()
    for fd in fds:  # closed with the worker
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_later_round_is_acted_on_only_once_every_earlier_round_completed(tmp_path: Path) -> None:
    store = _store(tmp_path / "s", overlap_rounds=2, overlap_max_load=1e9)
    native = store.flush_policy._native
    assert native is not None
    worker = native.worker
    commitlog = store.commitlog

    async def main() -> None:
        worker.hold(0, True)
        first = _put(store, b"first")
        await asyncio.sleep(0)  # its kick: round A, taken into slot 0 and held there
        _until(lambda: worker.inflight == 1)
        flushed = commitlog.flushed_where
        second = _put(store, b"second")
        await asyncio.sleep(0)  # its kick: round B starts beside A, in slot 1, and completes
        _until(lambda: worker.overlapped == 1 and worker.inflight == 1)
        await asyncio.sleep(0.1)  # the loop free to run its reader
        assert not first.done() and not second.done()  # B's success not used before A's
        assert commitlog.flushed_where == flushed
        assert native.rounds == 0
        worker.hold(0, False)
        a, b = await resolved(first), await resolved(second)
        assert a.ok and b.ok
        assert commitlog.flushed_where >= b.wrote_offset + b.wrote_bytes
        assert native.rounds == 2

    try:
        asyncio.run(main())
    finally:
        store.shutdown()


def test_without_sparse_sends_a_request_waits_for_the_running_round(tmp_path: Path) -> None:
    """``overlap_max_load = 0``: never a second round beside a running one; the second send
    merges into the round after it (one round at a time, as before)."""
    store = _store(tmp_path / "s", overlap_rounds=2, overlap_max_load=0)
    native = store.flush_policy._native
    assert native is not None
    worker = native.worker

    async def main() -> None:
        worker.hold(0, True)
        first = _put(store, b"first")
        await asyncio.sleep(0)
        _until(lambda: worker.inflight == 1)
        seconds = [_put(store, b"second"), _put(store, b"third")]
        await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        assert worker.overlapped == 0 and worker.busy
        worker.hold(0, False)
        assert all(r.ok for r in [await resolved(f) for f in (first, *seconds)])
        assert native.rounds == 2 and worker.overlapped == 0

    try:
        asyncio.run(main())
    finally:
        store.shutdown()


def test_a_failed_round_fails_every_later_round_even_one_whose_fdatasync_returned_0(
    tmp_path: Path, pipe: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Slot 0's ``fdatasync`` fails (a pipe's EINVAL standing in for EIO); the round beside it in
    slot 1 syncs the real file and returns 0, but was posted after the failed one: both go to the
    Python thread, which retries them (failing too, here) until FLUSH_DISK_TIMEOUT."""
    store = _store(tmp_path / "s", overlap_rounds=2, overlap_max_load=1e9, timeout_ms=400)
    native = store.flush_policy._native
    assert native is not None
    worker = native.worker
    commitlog = store.commitlog
    real_fds, real_flush = native._fds_for, commitlog.flush
    failing = threading.Event()
    failing.set()

    def fds_for(done: Any) -> Any:
        fds = real_fds(done)
        return (pipe, *fds[1:]) if failing.is_set() else fds

    def flush(least_pages: int = 0) -> int:
        if failing.is_set():
            raise OSError(5, "Input/output error")
        return int(real_flush(least_pages))

    native._fds_for = fds_for
    commitlog.flush = flush

    async def main() -> tuple[Any, Any]:
        worker.hold(0, True)
        first = _put(store, b"first")
        await asyncio.sleep(0)
        _until(lambda: worker.inflight == 1)
        second = _put(store, b"second")
        await asyncio.sleep(0)
        _until(lambda: worker.overlapped == 1 and worker.inflight == 1)  # slot 1's round returned
        worker.hold(0, False)
        return await resolved(first), await resolved(second)

    try:
        with caplog.at_level(logging.ERROR):
            a, b = asyncio.run(main())
        assert any("flush failed" in rec.getMessage() for rec in caplog.records)
        assert a.status is PutStatus.FLUSH_DISK_TIMEOUT
        assert b.status is PutStatus.FLUSH_DISK_TIMEOUT  # its own fdatasync's 0 was not used
        failing.clear()  # the disk works again
        assert asyncio.run(_one(store)).ok
        assert commitlog.flushed_where == commitlog.queue.get_max_wrote_position()
    finally:
        store.shutdown()


async def _one(store: Any) -> Any:
    return await resolved(_put(store, b"again"))


WRITERS = 8
PUTS = 30


def _staggered_puts(store: Any) -> list[tuple[int, int, str, int, int]]:
    """``WRITERS`` coroutines on one loop, each pausing a little before each put (so kicks fall
    while other rounds run) and checking at each acknowledgement that the flushed offset covers it."""
    acks: list[tuple[int, int, str, int, int]] = []

    async def writer(t: int) -> None:
        rnd = random.Random(t)
        for i in range(PUTS):
            await asyncio.sleep(rnd.random() * 0.0015)
            body = b"%d-%d-" % (t, i) + bytes([65 + t]) * (i * 61 % 700)
            r = await resolved(store.put_message(message(topic=TOPIC, body=body, queue_id=t)))
            if r.ok:
                assert store.commitlog.flushed_where >= r.wrote_offset + r.wrote_bytes, (t, i, r)
            acks.append((t, i, r.status.name, r.queue_offset, r.wrote_bytes))

    async def main() -> None:
        await asyncio.gather(*(writer(t) for t in range(WRITERS)))

    asyncio.run(main())
    return sorted(acks)


def test_overlapping_rounds_acknowledge_what_the_python_thread_does(tmp_path: Path) -> None:
    results = {}
    overlapped = 0
    for compiled in (True, False):
        store = _store(
            tmp_path / str(compiled), compiled_rounds=compiled, overlap_rounds=3, overlap_max_load=1e9
        )
        try:
            acks = _staggered_puts(store)
            native = store.flush_policy._native
            if native is not None:
                overlapped = native.worker.overlapped
            flushed = store.commitlog.flushed_where
            written = store.commitlog.queue.get_max_wrote_position()
        finally:
            store.shutdown()
        results[compiled] = (acks, flushed, written)
    assert overlapped > 0  # rounds really ran side by side
    assert results[True][0] == results[False][0]
    assert {a[2] for a in results[True][0]} == {PutStatus.PUT_OK.name}
    assert results[True][1] == results[True][2] and results[False][1] == results[False][2]
