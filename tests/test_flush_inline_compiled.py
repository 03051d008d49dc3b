"""Inline rounds through the compiled worker (``[flush.sync] inline_max_us``; syncp50, session 12).

An inline round (the loop's kick finds no round in flight or posted, a small batch, fast flushes)
is run by the worker's ``round_here`` on the loop's thread: its ``fdatasync`` in C without the GIL,
then the same bookkeeping as a worker round's (no eventfd, no wake-up of either thread).  What a
producer relies on is unchanged: a put is acknowledged only once an ``fdatasync`` that covered it
returned 0 (the flushed offset covers it at that moment); a failed one hands the batch to the
Python thread, which retries it until its deadline; a round of the workers in the way (in flight,
posted, or not yet drained) keeps the batch off the loop.  Real mmap stores on real files.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from round_support import acknowledged, wait_taken

from tidemq.futures import resolved
from tidemq.store import PutStatus
from tidemq.testing.store_contract import build_store, message
from tidemq_flush import native_rounds

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not native_rounds.available(), reason="the compiled flush worker is not built"),
]


def _store(data: Path, **sync: Any) -> Any:
    store = build_store("mmap", data, flush="sync", flush_options=sync)
    assert store.load()
    store.start()
    return store


def _put(store: Any, body: bytes) -> Any:
    return store.put_message(message(topic="Inline", body=body, queue_id=0))


def test_an_inline_round_is_the_workers_on_the_loop_thread_and_acknowledges_what_it_flushed(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path / "s", inline_max_us=1_000_000)
    policy = store.flush_policy
    native = policy._native
    assert native is not None
    worker = native.worker
    syncs: list[str] = []
    here = worker.round_here

    def round_here(fd: int, end: int) -> Any:
        syncs.append(threading.current_thread().name)
        return here(fd, end)

    async def main() -> list[Any]:
        native.worker = _Spy(worker, round_here)
        results = []
        for i in range(5):  # one put a round, each after the previous one's answer
            results += await acknowledged(store, _put(store, f"m{i}".encode()))
        return results

    try:
        loop_thread = threading.current_thread().name
        results = asyncio.run(main())
        assert worker.here_rounds == 5
        assert syncs == [loop_thread] * 5
        assert policy.inline_rounds == 5
        assert worker.rounds == 5  # counted once each, never drained again by the loop's reader
        assert native.rounds == 5 and not native.posted
        assert policy.flush_rounds == 5
    finally:
        store.shutdown()
    assert [r.queue_offset for r in results] == list(range(5))


class _Spy:
    """The worker with its ``round_here`` replaced (a Cython type's methods cannot be)."""

    def __init__(self, worker: Any, round_here: Any) -> None:
        self._worker = worker
        self.round_here = round_here

    def __getattr__(self, name: str) -> Any:
        return getattr(self._worker, name)


def test_a_round_of_the_workers_in_the_way_keeps_the_batch_off_the_loop(tmp_path: Path) -> None:
    """A round in flight (held in its slot): the next small batch is posted, not flushed inline,
    and both are acknowledged in order once the held round goes."""
    store = _store(tmp_path / "s", inline_max_us=1_000_000)
    policy = store.flush_policy
    native = policy._native
    worker = native.worker

    async def main() -> list[Any]:
        policy._fast_streak = 0  # the first round goes to the worker
        worker.hold(0, True)
        try:
            first = _put(store, b"first")
            await asyncio.sleep(0)
            wait_taken(worker)
            assert worker.round_here(0, 0) is None  # a round in flight: refused
            from tidemq_flush.group_commit import INLINE_AFTER_FAST

            policy._fast_streak = INLINE_AFTER_FAST
            second = _put(store, b"second")
            await asyncio.sleep(0)
            assert len(native.posted) == 2 and worker.here_rounds == 0
        finally:
            worker.hold(0, False)
        return await acknowledged(store, first, second)

    try:
        results = asyncio.run(main())
        assert worker.here_rounds == 0
    finally:
        store.shutdown()
    assert [r.queue_offset for r in results] == [0, 1]


def test_a_failed_inline_fdatasync_acknowledges_nothing_and_the_thread_retries_it(
    tmp_path: Path, pipe: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The inline round's ``fdatasync`` fails (a pipe's EINVAL standing in for EIO): the put is not
    acknowledged by it; the Python thread retries, failing too here, until FLUSH_DISK_TIMEOUT; no
    inline round until flushes are fast again, and the next put is acknowledged once the disk works."""
    store = _store(tmp_path / "s", inline_max_us=1_000_000, timeout_ms=400)
    policy = store.flush_policy
    native = policy._native
    worker = native.worker
    commitlog = store.commitlog
    real_round, real_flush = commitlog.direct_round, commitlog.flush
    failing = threading.Event()
    failing.set()

    def direct_round(end: int) -> Any:
        done = real_round(end)
        return (pipe, *done[1:]) if done is not None and failing.is_set() else done

    def flush(least_pages: int = 0) -> int:
        if failing.is_set():
            raise OSError(5, "Input/output error")
        return int(real_flush(least_pages))

    commitlog.direct_round = direct_round
    commitlog.flush = flush

    try:
        with caplog.at_level(logging.ERROR):
            r = asyncio.run(_put_on_a_loop(store, b"lost?"))
        assert r.status is PutStatus.FLUSH_DISK_TIMEOUT
        assert worker.here_rounds == 1
        assert any("flush failed" in rec.getMessage() for rec in caplog.records)
        assert policy._fast_streak == 0
        failing.clear()  # the disk works again
        ok = asyncio.run(_put_on_a_loop(store, b"next"))
        assert ok.ok
        assert commitlog.flushed_where >= ok.wrote_offset + ok.wrote_bytes
        assert worker.here_rounds == 1  # not inline: flushes must be fast INLINE_AFTER_FAST times first
    finally:
        failing.clear()
        store.shutdown()


async def _put_on_a_loop(store: Any, body: bytes) -> Any:
    return await resolved(_put(store, body))
