"""The sync policy's compiled rounds (``[flush.sync] compiled_rounds``, ``tidemq_flush._round``).

An event loop's round is flushed by a C thread that never takes the GIL (``fdatasync``, then an
eventfd the loop's reader watches); the Python flush thread stays the reference and the fallback.
What a producer relies on must not change: a put is acknowledged only once the commit log's
flushed offset covers it, the same acknowledgements as the Python thread's, FLUSH_DISK_TIMEOUT
when the flush does not complete in time, and nothing pending lost at shutdown.  Real mmap stores
on real files; the SIGKILL check of acknowledged loop puts is ``test_store_crash.py``'s
``mapped-event-loop-writers`` (compiled rounds are the default there).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tidemq.futures import resolved
from tidemq.store import GetStatus, PutStatus
from tidemq.testing.store_contract import build_store, message
from tidemq_flush import native_rounds

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not native_rounds.available(),
        reason="the compiled flush worker is not built (or TIDEMQ_NO_EXTENSIONS)",
    ),
]

TOPIC = "Rounds"
WRITERS = 4
PUTS = 40


def _body(t: int, i: int) -> bytes:
    return b"%d-%d-" % (t, i) + bytes([65 + t]) * (i * 53 % 900)


def _store(data: Path, compiled: bool, **sync: Any) -> Any:
    store = build_store(
        "mmap",
        data,
        flush="sync",
        store_options={"commitlog_file_size": 128 * 1024, "consumequeue_entries": 200},
        flush_options={"compiled_rounds": compiled, **sync},
    )
    assert store.load()
    store.start()
    return store


def _worker_threads(expect: int | None = None) -> int:
    """The compiled workers' OS threads (named ``tidemq-flush``, by themselves once running) of
    this process; with ``expect``, waits up to 5 s for that many."""
    deadline = time.monotonic() + 5
    while True:
        count = 0
        for task in Path("/proc/self/task").iterdir():
            try:
                if (task / "comm").read_text().strip() == "tidemq-flush":
                    count += 1
            except OSError:
                pass
        if expect is None or count == expect or time.monotonic() > deadline:
            return count
        time.sleep(0.01)


def _loop_puts(store: Any) -> list[tuple[int, int, str, int, int, int]]:
    """``WRITERS`` coroutines on one loop, each awaiting its puts (the broker's way); checks at
    each acknowledgement that the commit log's flushed offset covers the put."""
    acks: list[tuple[int, int, str, int, int, int]] = []

    async def writer(t: int) -> None:
        for i in range(PUTS):
            r = await resolved(store.put_message(message(topic=TOPIC, body=_body(t, i), queue_id=t)))
            if r.ok:  # durable when acknowledged
                assert store.commitlog.flushed_where >= r.wrote_offset + r.wrote_bytes, (t, i, r)
            acks.append((t, i, r.status.name, r.queue_offset, r.wrote_offset, r.wrote_bytes))

    async def main() -> None:
        await asyncio.gather(*(writer(t) for t in range(WRITERS)))

    asyncio.run(main())
    return acks


def test_compiled_and_python_rounds_acknowledge_the_same_puts_at_the_same_flushed_offsets(
    tmp_path: Path,
) -> None:
    results = {}
    for compiled in (True, False):
        store = _store(tmp_path / str(compiled), compiled)
        policy = store.flush_policy
        try:
            acks = _loop_puts(store)
            flushed = store.commitlog.flushed_where
            written = store.commitlog.queue.get_max_wrote_position()
            native = policy._native
            native_rounds = native.rounds if native is not None else 0
        finally:
            store.shutdown()
        results[compiled] = (acks, flushed, written, native_rounds, policy.flush_rounds, policy.requests)
    (c_acks, c_flushed, c_written, c_native, c_rounds, c_requests) = results[True]
    (p_acks, p_flushed, p_written, p_native, p_rounds, p_requests) = results[False]
    assert c_native > 0 and p_native == 0  # the compiled worker really flushed those rounds
    assert c_rounds >= c_native  # file crossings fall back to the Python thread
    # Same acknowledgements: every put PUT_OK, same queue offsets and record sizes per put.
    key = lambda a: (a[0], a[1])  # noqa: E731
    assert [(a[0], a[1], a[2], a[3], a[5]) for a in sorted(c_acks, key=key)] == [
        (a[0], a[1], a[2], a[3], a[5]) for a in sorted(p_acks, key=key)
    ]
    assert {a[2] for a in c_acks} == {PutStatus.PUT_OK.name}
    assert c_requests == p_requests == WRITERS * PUTS
    # Same bytes written and everything flushed, the same offset in both.
    assert c_flushed == c_written == p_flushed == p_written
    # What the compiled rounds acknowledged is on disk: reopened, every put reads back.
    store = _store(tmp_path / "True", True)
    try:
        for t, i, _status, qoff, wrote, _size in c_acks:
            got = store.get_message("g", TOPIC, t, qoff, 1)
            assert got.status is GetStatus.FOUND, (t, i)
            assert store.commitlog.flushed_where >= wrote
    finally:
        store.shutdown()


def test_the_worker_answers_many_rounds_in_one_wake_up_and_counts_each(tmp_path: Path) -> None:
    """Rounds completed while the loop was busy are all answered by its next reader call, and
    each is counted (rounds, seconds, batch sizes) as the Python thread counts its own."""
    store = _store(tmp_path / "s", True)
    policy = store.flush_policy
    native = policy._native
    assert native is not None

    async def main() -> None:
        futures = []
        for i in range(20):  # a kick (a round posted) per loop iteration
            futures.append(store.put_message(message(topic=TOPIC, body=_body(0, i), queue_id=0)))
            # The next iteration: the loop's select sees the last round done, then runs this put's
            # kick (a new round posted) and this task, which keeps the loop busy until that round
            # is done too; the reader, after it in the same iteration, then answers both.
            await asyncio.sleep(0)
            time.sleep(0.03)
        results = [await resolved(f) for f in futures]
        assert all(r.ok for r in results)

    try:
        asyncio.run(main())
        assert native.rounds >= 2
        assert native.wakeups < native.rounds  # some wake-up answered more than one round
        assert policy.flush_rounds == native.rounds
        assert policy.flush_seconds.count == native.rounds
        assert policy.batch_sizes.count >= 1
    finally:
        store.shutdown()


def test_shutdown_with_rounds_pending_settles_every_put_and_stops_the_worker(tmp_path: Path) -> None:
    before = _worker_threads()
    store = _store(tmp_path / "s", True)
    slots = store.flush_policy.options.overlap_rounds  # one worker thread per round in flight
    assert _worker_threads(before + slots) == before + slots
    outcomes: list[Any] = []

    async def main() -> None:
        futures = [
            store.put_message(message(topic=TOPIC, body=_body(t, i), queue_id=t))
            for i in range(20)
            for t in range(WRITERS)
        ]
        for _ in range(2):  # the kick, held one turn (80 messages: kick_polls): a round posted
            await asyncio.sleep(0)
        assert store.flush_policy._native.posted or all(f.done() for f in futures)
        store.shutdown()  # on the loop, rounds still in flight
        outcomes.extend(f.result(5) for f in futures)

    asyncio.run(main())
    assert len(outcomes) == WRITERS * 20
    assert {r.status for r in outcomes} == {PutStatus.PUT_OK}  # the shutdown's flush covered them
    assert _worker_threads(before) == before
    store = _store(tmp_path / "s", True)  # all of it on disk
    try:
        for t in range(WRITERS):
            assert store.get_max_offset_in_queue(TOPIC, t) == 20
    finally:
        store.shutdown()


class _StalledWorker:
    """The compiled worker's interface, its rounds never completing: stands in for a
    ``fdatasync`` stuck in the kernel, which a real file cannot be made to do on demand."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.seq = 0

    def post(self, fd: int, end: int, fds: Any = None, messages: int = 1) -> int:
        self.seq += 1
        return self.seq

    def fileno(self) -> int:
        return int(self.real.fileno())

    def drain(self) -> list[Any]:
        return []

    def end_gather(self) -> bool:
        return False

    def stop(self, timeout: float) -> bool:
        return bool(self.real.stop(timeout))

    def close(self) -> None:
        self.real.close()


def test_a_round_the_worker_never_completes_times_out_as_flush_disk_timeout(tmp_path: Path) -> None:
    store = _store(tmp_path / "s", True, timeout_ms=300)
    native = store.flush_policy._native
    assert native is not None
    native.worker = _StalledWorker(native.worker)

    async def main() -> Any:
        started = time.monotonic()
        r = await resolved(store.put_message(message(topic=TOPIC, body=b"stuck", queue_id=0)))
        return r, time.monotonic() - started

    try:
        r, took = asyncio.run(main())
        assert r.status is PutStatus.FLUSH_DISK_TIMEOUT
        assert 0.25 <= took < 5
    finally:
        store.shutdown()


def test_a_failed_fdatasync_goes_to_the_python_thread_which_retries_until_the_deadline(
    tmp_path: Path, pipe: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's ``fdatasync`` fails (a pipe: EINVAL, standing in for EIO): the round's puts
    are handed to the Python thread, which retries them as it retries its own failed flushes:
    FLUSH_DISK_TIMEOUT at the deadline while the disk keeps failing, acknowledged once it works."""
    store = _store(tmp_path / "s", True, timeout_ms=400)
    commitlog = store.commitlog
    real_round, real_flush = commitlog.direct_round, commitlog.flush
    failing = threading.Event()
    failing.set()

    def bad_round(end: int) -> Any:
        done = real_round(end)
        return None if done is None else (pipe, *done[1:])

    def flush(least_pages: int = 0) -> int:
        if failing.is_set():
            raise OSError(5, "Input/output error")
        return int(real_flush(least_pages))

    commitlog.direct_round = bad_round
    commitlog.flush = flush

    async def put(i: int) -> Any:
        return await resolved(store.put_message(message(topic=TOPIC, body=b"x%d" % i, queue_id=0)))

    try:
        with caplog.at_level(logging.ERROR):
            r = asyncio.run(put(0))
        assert r.status is PutStatus.FLUSH_DISK_TIMEOUT
        assert any("flush failed" in rec.getMessage() for rec in caplog.records)
        failing.clear()  # the disk works again (the compiled rounds still fail: the thread's do not)
        assert asyncio.run(put(1)).ok
        commitlog.direct_round = real_round
        assert asyncio.run(put(2)).ok
        assert commitlog.flushed_where == commitlog.queue.get_max_wrote_position()
    finally:
        store.shutdown()


def test_compiled_rounds_off_keeps_every_round_on_the_python_thread(tmp_path: Path) -> None:
    store = _store(tmp_path / "s", False)
    try:
        assert store.flush_policy._native is None
        assert asyncio.run(_one_put(store)).ok
    finally:
        store.shutdown()


async def _one_put(store: Any) -> Any:
    return await resolved(store.put_message(message(topic=TOPIC, body=b"one", queue_id=0)))


def test_a_second_event_loop_is_flushed_by_the_python_thread_beside_the_worker(tmp_path: Path) -> None:
    """The worker answers on the loop that bound it; another live loop's rounds go to the Python
    thread, and both loops' puts are acknowledged only once flushed."""
    store = _store(tmp_path / "s", True)
    native = store.flush_policy._native
    assert native is not None
    results: dict[int, list[Any]] = {}

    async def writer(t: int) -> None:
        out = results.setdefault(t, [])
        for i in range(PUTS):
            r = await resolved(store.put_message(message(topic=TOPIC, body=_body(t, i), queue_id=t)))
            assert store.commitlog.flushed_where >= r.wrote_offset + r.wrote_bytes
            out.append(r.status)

    bound = threading.Event()

    async def first() -> None:
        await writer(0)
        bound.set()
        await asyncio.sleep(0.2)  # alive while the other loop puts
        await writer(2)

    def second() -> None:
        assert bound.wait(30)
        asyncio.run(writer(1))

    other = threading.Thread(target=second)
    other.start()
    try:
        asyncio.run(first())
        other.join(30)
        rounds_on_thread = store.flush_policy.flush_rounds - native.rounds
    finally:
        store.shutdown()
    assert {t: set(v) for t, v in results.items()} == {t: {PutStatus.PUT_OK} for t in range(3)}
    assert all(len(v) == PUTS for v in results.values())
    assert native.rounds > 0 and rounds_on_thread > 0
