"""A ``pwrite`` that writes zero bytes is an error, never a loop (the Python path of the mmap store).

Linux never answers a ``pwrite`` of a non-empty buffer to a local file with 0 (a full disk is
ENOSPC, see ``tests/reliability/test_disk_full.py``'s tmpfs; a size limit is EFBIG), but POSIX
allows it and a FUSE or network file system may.  It cannot be provoked with a real file system
here, so the seam is the narrowest one: ``os.pwrite`` answers 0 for the one store file under test
(every other descriptor, and that file's other calls, go to the real ``os.pwrite``).  Everything
else is real: the files, the mapping, the store, its transient pool and group commit.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.message import decode_message
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.store import GetStatus, PutStatus
from tidemq.testing.pytest_plugin import running_broker
from tidemq.testing.store_contract import build_store, message
from tidemq_store_mmap.mapped_file import MappedFile

pytestmark = pytest.mark.timeout(60)

_real_pwrite = os.pwrite


class ZeroWrites:
    """``os.pwrite`` answering 0 for the descriptors in ``fds``; counts those calls."""

    def __init__(self) -> None:
        self.fds: set[int] = set()
        self.calls = 0
        self.first_only = False

    def __call__(self, fd: int, data: Any, pos: int) -> int:
        if fd not in self.fds:
            return _real_pwrite(fd, data, pos)
        self.calls += 1
        if self.calls > 100_000:  # the loop this test is about: stop it, do not hang the suite
            raise OSError(errno.ELOOP, "pwrite called 100 000 times for no progress")
        if self.first_only and self.calls == 1:  # one short write first, then nothing
            return _real_pwrite(fd, bytes(memoryview(data)[: len(data) // 2]), pos)
        return 0


@pytest.fixture
def zero_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[ZeroWrites]:
    seam = ZeroWrites()
    monkeypatch.setattr(os, "pwrite", seam)
    yield seam


@pytest.mark.parametrize("short_first", [False, True], ids=["nothing", "short-then-nothing"])
def test_pwrite_of_zero_bytes_raises_eio_naming_the_file(
    tmp_path: Path, zero_writes: ZeroWrites, short_first: bool
) -> None:
    path = tmp_path / "00000000000000000000"
    mf = MappedFile(path, 64 * 1024)
    try:
        zero_writes.fds.add(mf.fd)
        zero_writes.first_only = short_first
        with pytest.raises(OSError) as caught:
            mf.pwrite(4096, b"x" * 1000)
        assert caught.value.errno == errno.EIO
        assert caught.value.filename == str(path)
        assert "no progress" in str(caught.value)
        assert zero_writes.calls == (2 if short_first else 1)  # gave up at the first write of 0
        zero_writes.fds.clear()
        mf.pwrite(4096, b"y" * 1000)  # the file is still usable
        assert bytes(mf.mm[4096:5096]) == b"y" * 1000
        mf.pwrite(0, b"")  # an empty write is not an error
    finally:
        mf.destroy()


def test_store_commit_writing_zero_bytes_times_out_the_put_keeps_data_and_recovers(
    tmp_path: Path, zero_writes: ZeroWrites
) -> None:
    """The transient pool's commit writes the commit log with ``MappedFile.pwrite`` (compiled or
    not).  A commit that writes nothing fails like a commit on a full disk: the group commit logs
    it and retries, the put waiting for it gets FLUSH_DISK_TIMEOUT, nothing already stored is lost,
    and once writes make progress again everything (that put too) is committed and flushed."""
    store = build_store(
        "mmap",
        tmp_path / "store",
        flush="sync",
        flush_options={"timeout_ms": 300},
        store_options={
            "commitlog_file_size": 1 << 20,
            "consumequeue_entries": 1000,
            "transient_store_pool": True,
            "transient_store_pool_size": 2,
        },
    )
    assert store.load()
    store.start()
    try:
        bodies = [f"m{i}".encode() * 100 for i in range(5)]
        for body in bodies[:4]:
            assert store.put_message(message("Z", body)).result(10).ok
        log_fd = store.commitlog.queue.get_last_mapped_file(0).fd
        zero_writes.fds.add(log_fd)
        started = time.monotonic()
        res = store.put_message(message("Z", bodies[4])).result(10)
        assert res.status is PutStatus.FLUSH_DISK_TIMEOUT, res
        assert time.monotonic() - started < 5
        time.sleep(0.2)
        # Retried once a millisecond or so: not spinning in one write (that is millions of calls).
        assert 0 < zero_writes.calls < 5_000, zero_writes.calls
        # Reads of what was stored still work meanwhile.
        got = store.get_message("g", "Z", 0, 0, 32, None, 1 << 30)
        assert got.status is GetStatus.FOUND
        zero_writes.fds.clear()
        # The next put's round commits and flushes everything, the timed-out put's record too.
        assert store.put_message(message("Z", b"after")).result(10).ok
        assert store.commitlog.flushed_where >= store.commitlog.get_max_offset()
    finally:
        store.shutdown()
    store = build_store(
        "mmap",
        tmp_path / "store",
        store_options={"commitlog_file_size": 1 << 20, "consumequeue_entries": 1000},
    )
    assert store.load()
    store.start()
    try:
        got = store.get_message("g", "Z", 0, 0, 32, None, 1 << 30)
        assert got.status is GetStatus.FOUND
        assert [decode_message(b).body for b in got.buffers] == [*bodies, b"after"]
    finally:
        store.shutdown()


def test_broker_answers_a_send_whose_commit_writes_nothing_with_an_error_and_stays_up(
    tmp_path: Path, zero_writes: ZeroWrites
) -> None:
    """Through a real broker and a TCP client: the send whose bytes cannot be committed is
    answered (FLUSH_DISK_TIMEOUT, as on a full disk) and not left hanging; the broker keeps
    serving, and once writes make progress the next send succeeds and every message is there."""

    def send_request(i: int) -> RemotingCommand:
        fields = {
            "producerGroup": "PG",
            "topic": "Z",
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 1,
            "queueId": 0,
            "sysFlag": 0,
            "bornTimestamp": int(time.time() * 1000),
            "flag": 0,
            "properties": "",
            "reconsumeTimes": 0,
            "unitMode": False,
        }
        return RemotingCommand.request(RequestCode.SEND_MESSAGE, fields, f"m{i}".encode() * 50)

    options = {
        "store": {"mmap": {"commitlog_file_size": 1 << 20, "transient_store_pool": True}},
        "flush": {"sync": {"timeout_ms": 300}},
    }

    async def main() -> None:
        async with running_broker(
            tmp_path / "b", {"store": "mmap", "flush": "sync"}, options=options
        ) as broker:
            client = get_plugin_manager().create("transport", "tcp").client()
            try:
                for i in range(3):
                    r = await client.invoke(broker.address, send_request(i), 10.0)
                    assert r.code == ResponseCode.SUCCESS, r.remark
                zero_writes.fds.add(broker.store.commitlog.queue.get_last_mapped_file(0).fd)
                r = await client.invoke(broker.address, send_request(3), 10.0)
                assert r.code == ResponseCode.FLUSH_DISK_TIMEOUT, (r.code, r.remark)
                assert 0 < zero_writes.calls < 5_000, zero_writes.calls  # no spin in one write
                mx = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "Z", "queueId": 0})
                assert (await client.invoke(broker.address, mx, 10.0)).code == ResponseCode.SUCCESS
                zero_writes.fds.clear()
                r = await client.invoke(broker.address, send_request(4), 10.0)
                assert r.code == ResponseCode.SUCCESS, r.remark
                got = broker.store.get_message("g", "Z", 0, 0, 32, None, 1 << 30)
                assert [decode_message(b).body for b in got.buffers] == [
                    f"m{i}".encode() * 50 for i in range(5)
                ]
            finally:
                await client.close()

    asyncio.run(main())
