"""The commit log's zeros ahead, written by a background thread (issue 38, bgzero).

The commit log keeps zeros written ahead of its write position (large page-cache folios); they
used to be written inline by whoever appended (the event loop), a 256 KiB ``pwrite`` each time a
write crossed the zeroed mark.  A background thread (``ZerosAhead``) now writes them.  What a user
relies on: the files hold exactly the records (the thread never zeroes a written byte, whatever
the interleaving), the log recovers where its records end (after a clean stop, and after a crash
with the thread half-way through a chunk), and the appender does not write the zeros itself.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from store_support import T0, files_of, open_fixed_clock_store

from tidemq.message import MessageInner
from tidemq.message_types import Prop
from tidemq.store import PutStatus

FILE_SIZE = 400_000  # several roll-overs


def msg(i: int, size: int, queue_id: int | None = None) -> MessageInner:
    return MessageInner(
        topic="TopicZ",
        body=bytes([i % 251]) * size,
        queue_id=i % 3 if queue_id is None else queue_id,
        properties={Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"C0A8000100002A9F{i:016X}", "WAIT": "true"},
        born_host=("127.0.0.1", 40000),
        born_timestamp=T0 - i,
    )


def puts(n: int) -> list[list[MessageInner]]:
    """Mostly small single records, some batches (2-20 records), a few large records."""
    out: list[list[MessageInner]] = []
    for r in range(n):
        if r % 7 == 3:
            out.append([msg(r * 40 + k, 50 + (r * 13 + k) % 700, r % 3) for k in range(2 + r % 19)])
        elif r % 97 == 50:
            out.append([msg(r * 40, 9000)])  # larger than half a tiny chunk: no zeros for it
        else:
            out.append([msg(r * 40, 20 + (r * 31) % 900)])
    return out


def open_store(path: Path, flush: str, monkeypatch: pytest.MonkeyPatch, mode: str) -> Any:
    """``mode``: "thread" (tiny chunks, the thread racing), "inline" (main's way), "none"."""
    store = open_fixed_clock_store(path, flush, monkeypatch, FILE_SIZE)
    log_ = store.commitlog
    if mode == "none":
        log_.zero_ahead = 0
    elif mode == "inline":
        log_.zeros.background = False
    elif mode == "thread":
        log_.zeros.background = True  # also under async flush (where it is off by default)
        log_.zero_ahead = 4096  # a claim every few records: the thread and the appender interleave
        log_.zeros.window = 3 * 4096
    return store


def put(store: Any, batch: list[MessageInner]) -> tuple[int, int, int]:
    result = (store.put_message(batch[0]) if len(batch) == 1 else store.put_messages(batch)).result(10)
    assert result.status is PutStatus.PUT_OK, result
    return result.wrote_offset, result.wrote_bytes, result.queue_offset


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_the_thread_never_zeroes_a_written_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flush: str
) -> None:
    batches = puts(1500)
    runs = {}
    for mode in ("thread", "inline", "none"):
        store = open_store(tmp_path / mode, flush, monkeypatch, mode)
        results = []
        for i, batch in enumerate(batches):
            results.append(put(store, batch))
            if i % 8 == 7:
                time.sleep(0)  # let the thread in: on the pure-Python path the appender rarely lets go
        zeros = store.commitlog.zeros
        if mode == "thread":
            assert zeros.background_writes > 100  # it did race the appender
        store.shutdown()
        runs[mode] = (results, files_of(tmp_path / mode))
    results, files = runs["thread"]
    assert len([k for k in files if k.startswith("commitlog")]) >= 3  # the log rolled over
    for mode in ("inline", "none"):
        assert runs[mode][0] == results
        assert runs[mode][1].keys() == files.keys()
        for name, data in files.items():
            assert data == runs[mode][1][name], (mode, name)


def test_the_appender_does_not_write_the_zeros_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tidemq_store_mmap.commitlog as commitlog

    callers: list[str] = []
    zero_ahead = commitlog.zero_ahead

    def noted(*args: Any) -> int:
        callers.append(threading.current_thread().name)
        return zero_ahead(*args)

    monkeypatch.setattr(commitlog, "zero_ahead", noted)
    store = open_store(tmp_path, "sync", monkeypatch, "default")  # sync flush: the thread's
    assert store.commitlog.zeros.background
    store.commitlog.zero_ahead = commitlog.ZERO_AHEAD  # 256 KiB chunks, 1 MiB ahead
    store.commitlog.zeros.window = 1024 * 1024
    try:
        zeros = store.commitlog.zeros

        def thread_ahead() -> bool:
            mf = store.commitlog.queue.files[-1]
            return zeros.mf is mf and zeros.zeroed_to >= min(mf.file_size, mf.wrote_position + 512 * 1024)

        for i in range(2400):  # ~2.5 MB: several chunks and a roll-over
            put(store, [msg(i, 1000)])
            # The appender keeps to a pace the thread can hold: on a loaded machine (a CI run
            # beside other builds) the thread was once late after a roll-over (a new file's
            # second put comes before the thread's first chunk), and the appender's fallback then
            # rightly wrote a chunk itself. A thread > 5 s behind still fails the test.
            deadline = time.monotonic() + 5
            while not thread_ahead() and time.monotonic() < deadline:
                time.sleep(0.002)
        assert zeros.wait_idle()
        counters = (zeros.inline_writes, zeros.waits, zeros.background_writes, zeros.syncs)
        assert zeros.inline_writes == 0, counters
        assert zeros.background_writes >= 8
        assert zeros.syncs >= 1  # the zeros made durable off the rounds
        assert callers and set(callers) == {"commitlog-zeros"}
        mf = store.commitlog.queue.files[-1]
        assert zeros.mf is mf and zeros.zeroed_to >= min(mf.file_size, mf.wrote_position + 512 * 1024)
    finally:
        store.shutdown()


def test_the_inline_fallback_when_the_thread_is_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path, "async", monkeypatch, "inline")
    try:
        for i in range(300):
            put(store, [msg(i, 1000)])
        zeros = store.commitlog.zeros
        assert zeros.inline_writes >= 1 and zeros.background_writes == 0  # main's way, kept
        mf = store.commitlog.queue.files[-1]
        assert zeros.zeroed_to > mf.wrote_position
    finally:
        store.shutdown()


@pytest.mark.parametrize("clean", [True, False])
def test_recovery_with_the_thread_half_way_through_a_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean: bool
) -> None:
    """The files copied while the thread has written half a chunk and waits (what a kill leaves
    in the page cache), then the copy recovered; or the store stopped cleanly meanwhile."""
    import tidemq_store_mmap.commitlog as commitlog

    zero_ahead = commitlog.zero_ahead
    half_way = threading.Event()
    go_on = threading.Event()

    armed = threading.Event()

    def slow(fd: int, zeroed: int, end: int, chunk: int, limit: int) -> int:
        if threading.current_thread().name == "commitlog-zeros" and armed.is_set() and not half_way.is_set():
            mid = zeroed + (limit - zeroed) // 2
            zero_ahead(fd, zeroed, zeroed, mid - zeroed, mid)
            half_way.set()
            go_on.wait(30)
        return zero_ahead(fd, zeroed, end, chunk, limit)

    monkeypatch.setattr(commitlog, "zero_ahead", slow)
    store = open_store(tmp_path / "s", "sync", monkeypatch, "thread")
    store.commitlog.zeros.window = 16 * 4096  # its claims far enough ahead of the puts below
    results = [put(store, b) for b in puts(200)]
    armed.set()
    i = 0
    while not half_way.is_set():  # small puts until the thread is half-way through a chunk
        results.append(put(store, [msg(10_000 + i, 200)]))
        i += 1
        assert i < 10_000
    zeros = store.commitlog.zeros
    assert zeros._claim_hi and zeros._claim_lo >= zeros.mf.wrote_position  # claimed ahead
    end = store.get_max_phy_offset()
    last_offset, last_bytes, _ = results[-1]
    assert end == last_offset + last_bytes
    queues = {q: store.get_max_offset_in_queue("TopicZ", q) for q in (0, 1, 2)}
    if clean:
        threading.Timer(0.2, go_on.set).start()
        store.shutdown()  # joins the thread once the chunk is done
        root = tmp_path / "s"
    else:
        root = tmp_path / "copy"
        shutil.copytree(tmp_path / "s", root, ignore=shutil.ignore_patterns("lock"))
        (root / "abort").touch()  # a killed broker: the log re-checked record by record
        go_on.set()
        store.shutdown()
    again = open_store(root, "sync", monkeypatch, "thread")
    try:
        assert again.get_max_phy_offset() == end
        assert {q: again.get_max_offset_in_queue("TopicZ", q) for q in (0, 1, 2)} == queues
        more = [put(again, b) for b in puts(30)]
        assert more[0][0] == end
        got = again.get_message("g", "TopicZ", 1, queues[1], 1)
        assert got.message_count == 1
    finally:
        again.shutdown()
