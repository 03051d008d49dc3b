"""The compiled flush worker's completions taken by an awake loop (syncwake, session 13).

A worker round that completes writes the eventfd the loop's reader watches, unless the loop is
inside its *awake window* (``RoundWorker.enter`` at a loop batch's first put and in the reader,
``RoundWorker.leave`` at the end of the batch's kick and of the reader): then the loop's
``leave`` takes the round itself, no write, no wake-up, no ``read``.  ``leave`` clears the window
and looks for completed rounds under the worker's mutex, the worker decides under the same mutex
whether to write: a completion either lands before ``leave`` (taken by it) or after (the eventfd
written).  What a producer relies on: no completion is left unannounced, every put is answered
promptly and only once the ``fdatasync`` that covers it returned.  Real files, real stores; the
worker's ``hold`` keeps a round before its ``fdatasync`` until the test lets it go.
"""

from __future__ import annotations

import asyncio
import os
import random
import select
import time
from pathlib import Path
from typing import Any

import pytest
from round_support import acknowledged, wait_taken

from tidemq.testing.store_contract import build_store, message
from tidemq_flush import native_rounds

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        not native_rounds.available(),
        reason="the compiled flush worker is not built (or TIDEMQ_NO_EXTENSIONS)",
    ),
]


def _readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def _wait_done(worker: Any, rounds: int) -> None:
    deadline = time.monotonic() + 10
    while worker.rounds < rounds:
        assert time.monotonic() < deadline, "the round did not complete"
        time.sleep(0.001)


class _Worker:
    """A started RoundWorker (one slot, no gathering) and the fd of a real file with bytes to sync."""

    def __init__(self, tmp_path: Path) -> None:
        self.w = native_rounds._round.RoundWorker(1, 2.0, 0)  # type: ignore[union-attr]
        self.w.start()
        self.fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
        os.write(self.fd, b"x" * 4096)

    def close(self) -> None:
        self.w.close()
        os.close(self.fd)


@pytest.fixture
def held(tmp_path: Path) -> Any:
    pair = _Worker(tmp_path)
    yield pair
    pair.close()


def test_a_round_completed_while_awake_is_taken_by_leave_without_an_eventfd_write(held: _Worker) -> None:
    w, fd = held.w, held.fd
    w.hold(0, True)
    seq = w.post(fd, 4096)
    wait_taken(w)
    w.enter()
    w.hold(0, False)  # the fdatasync runs and completes while the loop is awake
    _wait_done(w, 1)
    assert not _readable(w.fileno(), 0.05), "the eventfd was written for an awake loop"
    assert (w.wakes, w.wakes_saved) == (0, 1)
    dones = w.leave()
    assert dones is not None and [d[0] for d in dones] == [seq] and dones[0][2] == 0
    assert w.taken_awake == 1
    assert w.leave() is None and w.drain() == []  # reported once
    assert not _readable(w.fileno(), 0)


def test_a_round_completing_right_after_leave_writes_the_eventfd(held: _Worker) -> None:
    """The other side of ``leave``: the window closed with nothing completed, the round completes
    after it: the worker sees the loop asleep and wakes it."""
    w, fd = held.w, held.fd
    w.hold(0, True)
    seq = w.post(fd, 4096)
    wait_taken(w)
    w.enter()
    assert w.leave() is None  # nothing completed yet: the loop is about to sleep
    w.hold(0, False)
    assert _readable(w.fileno(), 5.0), "a completion after leave() did not wake the loop"
    dones = w.drain()
    assert [d[0] for d in dones] == [seq]
    assert (w.wakes, w.wakes_saved) == (1, 0)


def test_an_eventfd_written_before_the_window_is_consumed_by_leave(held: _Worker) -> None:
    """A round completed before ``enter`` (the eventfd written, the loop busy elsewhere) and taken
    by ``leave``: the eventfd is read there, so the loop does not wake for nothing after."""
    w, fd = held.w, held.fd
    seq = w.post(fd, 4096)
    _wait_done(w, 1)
    assert _readable(w.fileno(), 5.0)
    w.enter()
    dones = w.leave()
    assert dones is not None and [d[0] for d in dones] == [seq]
    assert not _readable(w.fileno(), 0)


def test_completions_racing_the_end_of_the_window_are_never_lost(held: _Worker) -> None:
    """Rounds completing at any moment around ``leave`` (a real ``fdatasync``, the window closed
    after a random spin of 0-400 µs): each is returned by ``leave`` or announced by the eventfd
    within seconds, never neither."""
    w, fd = held.w, held.fd
    rng = random.Random(38)
    by_leave = by_eventfd = 0
    for i in range(300):
        seq = w.post(fd, 4096 + i)
        w.enter()
        until = time.perf_counter() + rng.random() * 400e-6
        while time.perf_counter() < until:
            pass
        dones = w.leave()
        if dones:
            by_leave += 1
        else:
            assert _readable(w.fileno(), 5.0), f"round {seq} completed unannounced"
            dones = w.drain()
            by_eventfd += 1
        assert dones and dones[-1][0] == seq and all(d[2] == 0 for d in dones)
    assert by_leave + by_eventfd == 300
    assert w.wakes + w.wakes_saved == w.rounds == 300


def _store(data: Path) -> Any:
    store = build_store("mmap", data, flush="sync")
    assert store.load()
    store.start()
    return store


def _put(store: Any, i: int) -> Any:
    return store.put_message(message(topic="Wake", body=b"wake-%04d" % i + b"w" * 100, queue_id=0))


def test_a_loop_put_whose_round_completes_during_the_next_read_is_answered_at_its_kick(tmp_path: Path) -> None:
    """Round 1 completes while the loop puts the next read's send (its window open): the send's
    kick answers round 1 (no eventfd write), covered by the flushed offset."""
    store = _store(tmp_path / "s")
    native = store.flush_policy._native
    assert native is not None

    async def main() -> None:
        await acknowledged(store, _put(store, 0))  # binds the worker to this loop
        worker = native.worker
        wakes, saved = worker.wakes, worker.wakes_saved
        worker.hold(0, True)
        try:
            first = _put(store, 1)
            await asyncio.sleep(0)  # its kick: round 1 posted and held
            wait_taken(worker)
            assert not first.done()
            rounds = worker.rounds
            second = _put(store, 2)  # the next "read": the window opens
        finally:
            worker.hold(0, False)
        _wait_done(worker, rounds + 1)  # round 1 completes while the loop is in the window
        assert not first.done()
        await asyncio.sleep(0)  # second's kick: posts round 2, then takes round 1
        assert first.done(), "the kick's leave() did not answer the round completed meanwhile"
        assert worker.wakes == wakes and worker.wakes_saved == saved + 1
        await acknowledged(store, first, second)

    try:
        asyncio.run(main())
    finally:
        store.shutdown()


def test_a_loop_put_whose_round_completes_after_the_kick_is_answered_by_the_reader(tmp_path: Path) -> None:
    """The kick's window closed before round 1 completed: the eventfd wakes the sleeping loop and
    the reader answers it promptly."""
    store = _store(tmp_path / "s")
    native = store.flush_policy._native
    assert native is not None

    async def main() -> None:
        await acknowledged(store, _put(store, 0))
        worker = native.worker
        wakes = worker.wakes
        worker.hold(0, True)
        try:
            first = _put(store, 1)
            await asyncio.sleep(0)  # its kick: round 1 posted, the window closed
            wait_taken(worker)
        finally:
            worker.hold(0, False)
        started = time.monotonic()
        await asyncio.wait_for(acknowledged(store, first), 5)
        assert time.monotonic() - started < 2
        assert worker.wakes == wakes + 1

    try:
        asyncio.run(main())
    finally:
        store.shutdown()
