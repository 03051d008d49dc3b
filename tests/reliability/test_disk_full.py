"""A full disk must not crash the store or the broker (issue 3).

The data directory lives on a small tmpfs mounted for the test (root is needed: this runs as root
here and in CI).  A filler file takes the remaining space; the store must answer puts with a
clear status instead of dying with SIGBUS on a write into a sparse mapping, keep every message it
had acknowledged, survive a shutdown while the disk is full, and accept writes again once the
filler is gone, with sparse files (the default) and with fallocated ones.  The second test does
the same against a real broker subprocess and a TCP client.
"""

from __future__ import annotations

import asyncio
import errno
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.message import MessageInner, decode_message, iter_messages
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.store import GetStatus, PutStatus
from tidemq.testing.store_contract import build_store

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """``mount_tmpfs(size_mib)``: a fresh tmpfs under tmp_path, unmounted at teardown."""
    mounted: list[Path] = []

    def mount(size_mib: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        out = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            pytest.fail(
                "the disk-full tests need to mount a small tmpfs (run as root or with CAP_SYS_ADMIN); "
                f"mount said: {out.stderr.strip() or out.returncode}"
            )
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(directory: Path) -> Path:
    """Write a filler file until the filesystem says ENOSPC; returns it."""
    filler = directory / "filler"
    chunk = b"\xff" * (64 * 1024)
    with open(filler, "wb", buffering=0) as fh:
        while True:
            try:
                fh.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
    # Whatever is left (less than a chunk) goes too, byte-sized pieces at a time.
    with open(filler, "ab", buffering=0) as fh:
        for size in (4096, 512, 1):
            while True:
                try:
                    fh.write(b"\xff" * size)
                except OSError:
                    break
    return filler


def message(i: int, size: int = 32 * 1024) -> MessageInner:
    body = f"m{i:05d}".encode() * (size // 6)
    return MessageInner(topic="Full", body=body, queue_id=0, properties={"KEYS": f"k{i}"})


def stored_bodies(store: Any, count: int) -> list[bytes]:
    bodies: list[bytes] = []
    offset = 0
    while offset < count:
        got = store.get_message("g", "Full", 0, offset, 32, None, 1 << 30)
        assert got.status is GetStatus.FOUND, (offset, got.status)
        bodies += [decode_message(b).body for b in got.buffers]
        offset = got.next_begin_offset
    return bodies


def open_store(data: Path, allocation: str) -> Any:
    store = build_store(
        "mmap",
        data,
        flush="sync",
        store_options={
            "commitlog_file_size": MiB,
            "consumequeue_entries": 1000,
            "disk_space_warning_ratio": 95,
            # No forced cleanup: this test is about refusing writes, not deleting old files.
            "clean_interval_ms": 3_600_000,
            "cq_flush_interval_ms": 100,
            "file_allocation": allocation,
        },
    )
    assert store.load()
    store.start()
    return store


@pytest.mark.parametrize("allocation", ["sparse", "fallocate"])
def test_store_refuses_writes_on_a_full_disk_keeps_data_and_recovers(
    mount_tmpfs: Callable[[int], Path], allocation: str
) -> None:
    disk = mount_tmpfs(12)
    data = disk / "store"
    store = open_store(data, allocation)
    acked: list[bytes] = []
    try:
        for i in range(40):  # ~1.3 MiB: the log has rolled into its second file
            m = message(i)
            assert store.put_message(m).result(10).ok
            acked.append(m.body)
        filler = fill(disk)
        # Keep writing until refused: a write into the sparse file (or the creation of the next
        # fallocated file) fails with ENOSPC.  Never a SIGBUS (that would kill this process).
        failure = None
        for i in range(40, 200):
            m = message(i)
            res = store.put_message(m).result(10)
            if not res.ok:
                failure = res
                break
            acked.append(m.body)
        assert failure is not None, "a full 12 MiB disk took 6 MiB more of messages"
        assert failure.status in (PutStatus.CREATE_MAPPED_FILE_FAILED, PutStatus.DISK_FULL), failure
        assert failure.error, "a refused put says why"
        if failure.status is PutStatus.CREATE_MAPPED_FILE_FAILED:
            assert "No space left" in failure.error
        # Refused again, cheaply, while the disk stays full; reads still work.
        again = store.put_message(message(999)).result(10)
        assert again.status is PutStatus.DISK_FULL and "full" in again.error
        assert stored_bodies(store, len(acked)) == acked
        # Let the service loop hit ENOSPC on the checkpoint a few times: logged, not fatal.
        time.sleep(0.5)

        filler.unlink()
        deadline = time.monotonic() + 10
        while True:
            res = store.put_message(message(len(acked))).result(10)
            if res.ok or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert res.ok, f"writes still refused after space came back: {res}"
        acked.append(message(len(acked)).body)
        assert stored_bodies(store, len(acked)) == acked

        # Full again, then a shutdown while full: it must finish (the checkpoint write fails).
        filler = fill(disk)
    finally:
        store.shutdown()
    filler.unlink()
    store = open_store(data, allocation)
    try:
        assert store.get_max_offset_in_queue("Full", 0) == len(acked)
        assert stored_bodies(store, len(acked)) == acked
        assert store.put_message(message(len(acked))).result(10).ok
    finally:
        store.shutdown()


# ---------------------------------------------------------------------------- broker subprocess


async def _call(client: Any, addr: str, code: int, fields: dict[str, Any], body: bytes | None = None) -> Any:
    return await client.invoke(addr, RemotingCommand.request(code, fields, body), 10.0)


def _send_fields(topic: str, i: int) -> dict[str, Any]:
    return {
        "producerGroup": "PG",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 1,
        "queueId": 0,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": f"KEYS\x01k{i}\x02",
        "reconsumeTimes": 0,
        "unitMode": False,
    }


def test_broker_answers_a_clear_error_on_a_full_disk_and_sends_again_after(
    mount_tmpfs: Callable[[int], Path], spawn: Any, tmp_path: Path
) -> None:
    disk = mount_tmpfs(24)
    config = tmp_path / "broker.toml"
    config.write_text(
        "[broker]\n"
        'name = "broker-full"\n'
        'listen = "127.0.0.1:0"\n'
        "namesrv = []\n"
        f'data_dir = "{disk / "data"}"\n'
        "default_topic_queues = 1\n"
        "[store.mmap]\n"
        f"commitlog_file_size = {MiB}\n"
        "consumequeue_entries = 1000\n"
        "disk_space_warning_ratio = 95\n"
        "clean_interval_ms = 3600000\n"
        "cq_flush_interval_ms = 200\n"
        # The default hash index is on: its sparse files take blocks only as keys arrive, reserved
        # before any write through the mapping (a full disk stalls indexing, never SIGBUS).
    )
    broker = spawn("broker", "-c", str(config))
    addr = broker.addresses["broker"]
    body = b"x" * (32 * 1024)
    pull_fields = {
        "consumerGroup": "CG",
        "topic": "Full",
        "queueId": 0,
        "queueOffset": 0,
        "maxMsgNums": 4,
        "sysFlag": 4,
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": "*",
        "subVersion": 0,
    }

    async def main() -> None:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            sent = 0
            for _ in range(40):
                r = await _call(client, addr, RequestCode.SEND_MESSAGE, _send_fields("Full", sent), body)
                assert r.code == ResponseCode.SUCCESS, r.remark
                sent += 1
            # The consumer group exists before the disk fills (creating one writes its config file).
            pull = await _call(client, addr, RequestCode.PULL_MESSAGE, pull_fields)
            assert pull.code == ResponseCode.SUCCESS, pull.remark
            filler = fill(disk)
            refused = None
            for _ in range(200):
                r = await _call(client, addr, RequestCode.SEND_MESSAGE, _send_fields("Full", sent), body)
                if r.code != ResponseCode.SUCCESS:
                    refused = r
                    break
                sent += 1
            assert refused is not None, "the broker kept accepting messages on a full disk"
            assert refused.code in (ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SYSTEM_ERROR)
            remark = refused.remark or ""
            assert "disk" in remark.lower() and "full" in remark.lower(), remark
            assert broker.proc.poll() is None, "the broker died on a full disk"

            # Other requests are still answered, and every acknowledged message is there.
            mx = await _call(client, addr, RequestCode.GET_MAX_OFFSET, {"topic": "Full", "queueId": 0})
            assert mx.code == ResponseCode.SUCCESS and int(mx.ext_fields["offset"]) == sent
            pull = await _call(client, addr, RequestCode.PULL_MESSAGE, pull_fields)
            assert pull.code == ResponseCode.SUCCESS, pull.remark
            assert [m.body for m in iter_messages(pull.payload(), check_crc=True)] == [body] * 4
            # A new topic needs new files: refused with a clear error too, and the broker stays up.
            r = await _call(client, addr, RequestCode.SEND_MESSAGE, _send_fields("Other", 0), b"y")
            assert r.code != ResponseCode.SUCCESS
            assert broker.proc.poll() is None

            filler.unlink()
            deadline = time.monotonic() + 15
            while True:
                r = await _call(client, addr, RequestCode.SEND_MESSAGE, _send_fields("Full", sent), body)
                if r.code == ResponseCode.SUCCESS or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert r.code == ResponseCode.SUCCESS, f"sends still refused after space came back: {r.remark}"
            sent += 1
            mx = await _call(client, addr, RequestCode.GET_MAX_OFFSET, {"topic": "Full", "queueId": 0})
            assert int(mx.ext_fields["offset"]) == sent
        finally:
            await client.close()

    asyncio.run(main())
    assert broker.stop() == 0, broker.log_path.read_text()[-3000:]


def test_broker_stops_cleanly_on_a_full_disk_and_restarts_with_everything(
    mount_tmpfs: Callable[[int], Path], spawn: Any, tmp_path: Path
) -> None:
    """Stopping a broker while its disk is full: every table it cannot write (delay offsets,
    consumer offsets, topics, groups) is logged and skipped, and the stop goes on to shut the
    store down and release the data directory, exiting 0.  After space returns, a restart serves
    every acknowledged message and the offsets committed before the disk filled."""
    disk = mount_tmpfs(24)
    config = tmp_path / "broker.toml"
    config.write_text(
        "[broker]\n"
        'name = "broker-full-stop"\n'
        'listen = "127.0.0.1:0"\n'
        "namesrv = []\n"
        f'data_dir = "{disk / "data"}"\n'
        "default_topic_queues = 1\n"
        "consumer_offset_flush_s = 0.2\n"
        "[store.mmap]\n"
        f"commitlog_file_size = {MiB}\n"
        "consumequeue_entries = 1000\n"
        "clean_interval_ms = 3600000\n"
    )
    body = b"z" * 1024
    sent = 8

    async def send_all(addr: str) -> None:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            for i in range(sent):
                r = await _call(client, addr, RequestCode.SEND_MESSAGE, _send_fields("Full", i), body)
                assert r.code == ResponseCode.SUCCESS, r.remark
            fields = {"consumerGroup": "CG", "topic": "Full", "queueId": 0, "commitOffset": 5}
            r = await _call(client, addr, RequestCode.UPDATE_CONSUMER_OFFSET, fields)
            assert r.code == ResponseCode.SUCCESS, r.remark
            await asyncio.sleep(0.6)  # a persist round writes it before the disk fills
        finally:
            await client.close()

    broker = spawn("broker", "-c", str(config))
    asyncio.run(send_all(broker.addresses["broker"]))
    filler = fill(disk)
    assert broker.stop() == 0, broker.log_path.read_text()[-3000:]
    log = broker.log_path.read_text()
    assert "cannot write" in log and "stopped" in log, log[-3000:]
    filler.unlink()

    again = spawn("broker", "-c", str(config))

    async def check(addr: str) -> None:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            mx = await _call(client, addr, RequestCode.GET_MAX_OFFSET, {"topic": "Full", "queueId": 0})
            assert int(mx.ext_fields["offset"]) == sent
            fields = {"consumerGroup": "CG", "topic": "Full", "queueId": 0}
            r = await _call(client, addr, RequestCode.QUERY_CONSUMER_OFFSET, fields)
            assert r.code == ResponseCode.SUCCESS and int(r.ext_fields["offset"]) == 5, r
        finally:
            await client.close()

    asyncio.run(check(again.addresses["broker"]))
    assert again.stop() == 0


def test_a_disk_without_room_for_the_timer_wheel_is_a_clear_refusal(
    mount_tmpfs: Callable[[int], Path], spawn: Any, tmp_path: Path
) -> None:
    """The timer wheel (2 x timer_max_delay_sec / timer_precision_ms slots of 32 bytes: 16 MiB at
    the defaults) is reserved before it is mapped: on a disk without room the broker refuses to
    start with one line naming the options, instead of dying of SIGBUS on a write into the map."""
    disk = mount_tmpfs(2)
    config = tmp_path / "broker.toml"
    config.write_text(
        "[broker]\n"
        'name = "broker-no-wheel"\n'
        'listen = "127.0.0.1:0"\n'
        "namesrv = []\n"
        f'data_dir = "{disk / "data"}"\n'
        "[plugins]\n"
        'index = "none"\n'
        "[store.mmap]\n"
        f"commitlog_file_size = {MiB // 4}\n"
        "consumequeue_entries = 1000\n"
    )
    with pytest.raises(RuntimeError, match="cannot reserve the timer wheel") as refused:
        spawn("broker", "-c", str(config))
    assert "timer_max_delay_sec" in str(refused.value)
    assert "Bus error" not in str(refused.value)


# ---------------------------------------------------------------------------- the hash index


def open_hash_index(data: Path) -> Any:
    # A 4 MB slot table (62 chunks of 64 KiB) and a 20 MB entry area, sparse, on a 24 MiB disk:
    # every key that lands in a slot chunk not yet reserved needs a block a full disk cannot give.
    options = {"max_hash_slot_num": 1_000_000, "max_index_num": 1_000_000}
    index = get_plugin_manager().create("index", "hash", options=options, data_dir=data)
    index.load(True, 0)
    return index


def test_hash_index_waits_for_space_without_sigbus_and_catches_up(
    mount_tmpfs: Callable[[int], Path], caplog: pytest.LogCaptureFixture
) -> None:
    from tidemq.testing.index_contract import T0, request

    disk = mount_tmpfs(24)
    index = open_hash_index(disk / "data")
    try:
        for i in range(20):
            index.dispatch(request(i * 100, T0 + i, keys=f"before-{i}"))
        index.flush()
        filler = fill(disk)
        with caplog.at_level("ERROR"):
            # Keys spread over the slot table: each new 64 KiB chunk needs a block.  This
            # process would die of SIGBUS if any of them were written through the mapping.
            for i in range(20, 3200):
                index.dispatch(request(i * 100, T0 + i, keys=f"during-{i}"))
            covered = index.flush()
        assert "disk is full" in caplog.text
        assert caplog.text.count("disk is full") == 1, "one stall is logged once, not per message"
        # The checkpoint time stays before the first message not indexed, so a crash now
        # re-dispatches it; what was indexed before the disk filled is still found.
        assert covered < T0 + 3199
        assert index.query("TopicTest", "before-7", 4, 0, 2**62).phy_offsets == (700,)

        filler.unlink()
        time.sleep(0.6)  # past the retry interval
        index.flush()  # a stalled index retries on flush too, with no new message arriving
        index.dispatch(request(3200 * 100, T0 + 3200, keys="after"))
        for i in (0, 19, 20, 1777, 3199):
            key = f"before-{i}" if i < 20 else f"during-{i}"
            assert index.query("TopicTest", key, 4, 0, 2**62).phy_offsets == (i * 100,), key
        assert index.query("TopicTest", "after", 4, 0, 2**62).phy_offsets == (320000,)
        assert index.flush() >= T0 + 3200
    finally:
        index.shutdown()


def test_hash_index_backlog_overflow_is_rebuilt_by_the_next_start(
    mount_tmpfs: Callable[[int], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tidemq_index_hash.service as service
    from tidemq.index import query_messages

    monkeypatch.setattr(service, "MAX_BACKLOG", 50)
    disk = mount_tmpfs(16)
    data = disk / "store"

    def compose() -> tuple[Any, Any]:
        index = open_index_unloaded(data)
        store = build_store(
            "mmap",
            data,
            flush="sync",
            index=index,
            # Fallocated commit-log files: the log has its space while the index has none.
            store_options={"commitlog_file_size": 4 * MiB, "file_allocation": "fallocate"},
        )
        assert store.load()
        store.start()
        return store, index

    def keyed(i: int) -> MessageInner:
        return MessageInner(topic="Keys", body=b"k%d" % i, queue_id=0, properties={"KEYS": f"key-{i}"})

    store, index = compose()
    try:
        for i in range(20):
            assert store.put_message(keyed(i)).result(10).ok
        filler = fill(disk)
        for i in range(20, 400):  # the index backlog (50) overflows; the log still has room
            assert store.put_message(keyed(i)).result(10).ok, i
        deadline = time.monotonic() + 10
        while index._stopped_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index._stopped_at is not None, "the index never stopped on a full disk"
        filler.unlink()
        deadline = time.monotonic() + 10
        while not (data / "index" / service.REBUILD_MARKER).exists() and time.monotonic() < deadline:
            store.put_message(keyed(400)).result(10)  # dispatch retries the marker write
            time.sleep(0.2)
        assert (data / "index" / service.REBUILD_MARKER).exists()
    finally:
        store.shutdown()

    store, index = compose()  # the marker makes this start re-dispatch the missing range
    try:
        for i in (0, 19, 20, 200, 399):
            found, _ = query_messages(index, store, "Keys", f"key-{i}", 4, 0, 2**62)
            assert [m.body for m in found] == [b"k%d" % i], i
        index.flush()
        assert not (data / "index" / service.REBUILD_MARKER).exists(), "rebuilt: the marker goes"
    finally:
        store.shutdown()


def open_index_unloaded(data: Path) -> Any:
    return get_plugin_manager().create("index", "hash", data_dir=data)
