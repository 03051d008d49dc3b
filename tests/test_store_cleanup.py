"""Expiry of commit-log files, ConsumeQueue cleanup, and the key index hooks."""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.index import QueryResult
from tidemq.message import decode_message
from tidemq.store import DispatchRequest, GetStatus
from tidemq.testing.store_contract import build_store, message

OPTS = {
    "commitlog_file_size": 4096,
    "consumequeue_entries": 8,
    "file_reserved_hours": 1.0,
    "delete_when": "04",
    "disk_max_used_space_ratio": 95,
    "disk_clean_forcibly_ratio": 95,
    "delete_files_batch_max": 3,
}


class RecordingIndex:
    """A real KeyIndex implementation that remembers what the store asked of it."""

    def __init__(self) -> None:
        self.loads: list[tuple[bool, int]] = []
        self.requests: list[DispatchRequest] = []
        self.expired_below: list[int] = []
        self.shutdowns = 0

    def load(self, last_exit_ok: bool, checkpoint_timestamp_ms: int) -> None:
        self.loads.append((last_exit_ok, checkpoint_timestamp_ms))

    def dispatch(self, request: DispatchRequest) -> None:
        self.requests.append(request)

    def query(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> QueryResult:
        return QueryResult(tuple(r.commit_log_offset for r in self.requests if key in r.keys.split()))

    def flush(self) -> int:
        return self.requests[-1].store_timestamp if self.requests else 0

    def delete_expired(self, min_phy_offset: int) -> None:
        self.expired_below.append(min_phy_offset)

    def shutdown(self) -> None:
        self.shutdowns += 1


def age(path: Path, hours: float) -> None:
    t = time.time() - hours * 3600
    os.utime(path, (t, t))


def local_time_at_hour(hour: int) -> float:
    """The next time the local clock shows ``hour``:30 (in the future, so aged files count as old)."""
    now = time.localtime()
    t = time.mktime((now.tm_year, now.tm_mon, now.tm_mday, hour, 30, 0, 0, 0, -1))
    return t if t > time.time() else t + 86400


def test_expired_files_are_deleted_and_reads_move_forward(tmp_path: Path) -> None:
    index = RecordingIndex()
    store = build_store("mmap", tmp_path, store_options=OPTS, index=index)
    assert store.load()
    store.start()
    try:
        results = [
            store.put_message(message(body=b"%03d" % i + bytes(300), KEYS=f"k{i}")).result(10)
            for i in range(60)
        ]
        files = [m.path for m in store.commitlog.queue.files]  # the directory may hold one more, made ahead
        assert len(files) >= 6
        for f in files[:5]:
            age(f, 2)
        # Not the hour, not full, not manual: nothing happens.
        assert store.clean_expired(now=local_time_at_hour(12)) == 0
        # At the deleteWhen hour: expired files go, at most delete_files_batch_max per round.
        assert store.clean_expired(now=local_time_at_hour(4)) == 3
        assert store.clean_expired(manual=True) == 2
        assert store.clean_expired(manual=True) == 0  # the rest are young
        remaining = [m.path for m in store.commitlog.queue.files]
        assert remaining == files[5:] and not any(f.exists() for f in files[:5])
        min_phy = int(files[5].name)
        assert store.get_min_phy_offset() == min_phy
        assert index.expired_below[-1] == min_phy

        first_kept = next(i for i, r in enumerate(results) if r.wrote_offset >= min_phy)
        assert store.get_min_offset_in_queue("TopicA", 0) == first_kept
        # A cleaned offset is not an error: the consumer is told where the data starts now.
        got = store.get_message("g", "TopicA", 0, 0, 32)
        assert got.status is GetStatus.OFFSET_TOO_SMALL and got.next_begin_offset == first_kept
        got = store.get_message("g", "TopicA", 0, first_kept, 1)
        assert got.status is GetStatus.FOUND
        assert decode_message(got.buffers[0]).body[:3] == b"%03d" % first_kept
        assert store.get_offset_by_time("TopicA", 0, 0) == first_kept
        assert store.look_message_by_offset(results[0].wrote_offset) is None
        # ConsumeQueue files wholly below the commit-log minimum are gone too.
        cq_files = sorted((tmp_path / "consumequeue" / "TopicA" / "0").iterdir())
        assert int(cq_files[0].name) // 20 <= first_kept < int(cq_files[0].name) // 20 + 8
    finally:
        store.shutdown()

    # The cleaned state survives a restart.
    store = build_store("mmap", tmp_path, store_options=OPTS)
    assert store.load()
    store.start()
    try:
        assert store.get_min_offset_in_queue("TopicA", 0) == first_kept
        assert store.get_max_offset_in_queue("TopicA", 0) == 60
    finally:
        store.shutdown()


def test_the_active_file_is_never_deleted(tmp_path: Path) -> None:
    store = build_store("mmap", tmp_path, store_options=OPTS)
    assert store.load()
    store.start()
    try:
        store.put_message(message(body=b"only")).result(10)
        for f in (tmp_path / "commitlog").iterdir():
            age(f, 100)
        assert store.clean_expired(manual=True) == 0
        assert store.get_message("g", "TopicA", 0, 0, 1).status is GetStatus.FOUND
    finally:
        store.shutdown()


def test_key_index_is_loaded_dispatched_flushed_and_shut_down(tmp_path: Path) -> None:
    index = RecordingIndex()
    store = build_store("mmap", tmp_path, store_options=OPTS, index=index)
    assert store.load()
    store.start()
    results = [store.put_message(message(body=b"x", KEYS=f"key{i}")).result(10) for i in range(5)]
    store.shutdown()
    assert index.loads == [(True, 0)]
    assert [r.commit_log_offset for r in index.requests] == [r.wrote_offset for r in results]
    assert index.shutdowns == 1
    cp_index_ts = struct.unpack_from(">qqq", (tmp_path / "checkpoint").read_bytes())[2]
    assert cp_index_ts == results[-1].store_timestamp

    # After a crash (abort file left behind) the index hears last_exit_ok=False and gets records again.
    (tmp_path / "abort").touch()
    index2 = RecordingIndex()
    store = build_store("mmap", tmp_path, store_options=OPTS, index=index2)
    assert store.load()
    store.start()
    store.shutdown()
    assert index2.loads == [(False, cp_index_ts)]
    assert [r.commit_log_offset for r in index2.requests] == [r.wrote_offset for r in results]
    assert index2.requests[0].keys == "key0"


def test_real_hash_index_finds_keys_after_a_crash(tmp_path: Path) -> None:
    """The mmap store with the ``hash`` index plugin: keys are found, also after abnormal recovery."""
    from tidemq.plugins import get_plugin_manager

    pm = get_plugin_manager()
    index = pm.create("index", "hash", data_dir=tmp_path)
    store = build_store("mmap", tmp_path, store_options=OPTS, index=index)
    assert store.load()
    store.start()
    results = [store.put_message(message(body=b"v%d" % i, KEYS=f"order-{i}")).result(10) for i in range(20)]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not index.query("TopicA", "order-19", 10, 0, 2**62).phy_offsets:
        time.sleep(0.01)
    assert index.query("TopicA", "order-7", 10, 0, 2**62).phy_offsets == (results[7].wrote_offset,)
    store.shutdown()

    (tmp_path / "abort").touch()
    index = pm.create("index", "hash", data_dir=tmp_path)
    store = build_store("mmap", tmp_path, store_options=OPTS, index=index)
    assert store.load()
    store.start()
    try:
        for i in (0, 7, 19):
            offsets = index.query("TopicA", f"order-{i}", 10, 0, 2**62).phy_offsets
            assert results[i].wrote_offset in offsets
            raw = store.look_message_by_offset(results[i].wrote_offset)
            assert raw is not None and decode_message(raw).keys == [f"order-{i}"]
    finally:
        store.shutdown()


def test_abnormal_recovery_starts_at_the_checkpoint_file(tmp_path: Path, caplog) -> None:
    import logging

    store = build_store("mmap", tmp_path, store_options=OPTS)
    assert store.load()
    store.start()
    results = []
    for i in range(24):
        results.append(store.put_message(message(body=b"%02d" % i + bytes(900), KEYS=f"k{i}")).result(10))
        time.sleep(0.005)  # distinct store times per file
    store.shutdown()
    files = sorted((tmp_path / "commitlog").iterdir())
    k = 2
    first_in_k = next(r for r in results if r.wrote_offset >= int(files[k].name))
    ts = first_in_k.store_timestamp + 3000  # the checkpoint keeps a 3 s safety margin
    (tmp_path / "checkpoint").write_bytes(struct.pack(">qqq", ts, ts, ts) + bytes(4072))
    (tmp_path / "abort").touch()

    index = RecordingIndex()
    store = build_store("mmap", tmp_path, store_options=OPTS, index=index)
    with caplog.at_level(logging.INFO, logger="tidemq_store_mmap"):
        assert store.load()
    store.start()
    try:
        assert f"abnormal recovery of the commit log from file {files[k].name}" in caplog.text
        # Records from the checkpoint's file on were re-dispatched to the index, older ones not.
        assert [r.commit_log_offset for r in index.requests] == [
            r.wrote_offset for r in results if r.wrote_offset >= int(files[k].name)
        ]
        assert store.get_max_offset_in_queue("TopicA", 0) == 24
    finally:
        store.shutdown()


# ---------------------------------------------------------------------- a disk of the test's own
#: The size of the file system the disk-ratio tests fill for real: small, so filling it is fast.
SMALL_DISK_BYTES = 2 << 20
#: Store options for it: 64 KiB commit-log files (each 1/32 of the disk, reserved in full when
#: made), one consume-queue file per queue, and no cleanup round but the ones a test calls.
SMALL_DISK_STORE = {
    "commitlog_file_size": 64 << 10,
    "consumequeue_entries": 1024,
    "file_reserved_hours": 1.0,
    "delete_when": "04",
    "clean_interval_ms": 3_600_000,
    "cq_flush_interval_ms": 100,  # the service thread's tick, when it also checks the disk
}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs of the test's own on ``tmp_path / "disk"``, unmounted at teardown (failed test or not).

    Mounting needs root, as CI runs; anyone else skips, saying so.  A roomy disk never skips: the
    test fills this one."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a 2 MiB tmpfs to fill (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK_BYTES},mode=0700", "tidemq-test-disk", str(disk)],
        capture_output=True,
        text=True,
    )
    assert mounted.returncode == 0, f"cannot mount a tmpfs on {disk} as root: {mounted.stderr.strip()}"
    try:
        assert shutil.disk_usage(disk).total == SMALL_DISK_BYTES
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(disk)], check=True)  # a file still open: detach now


def fill_until(store: Any, percent: float, body: bytes = bytes(2000)) -> list[Any]:
    """Put messages until the disk is more than ``percent`` full (as the store measures it)."""
    results = []
    while store.check_disk() <= percent:
        results.append(store.put_message(message(body=body)).result(10))
        assert results[-1].ok, results[-1]
    return results


def test_disk_pressure_deletes_before_expiry(small_disk: Path) -> None:
    """How a filling disk is cleaned (RocketMQ's CleanCommitLogService), on a real 2 MiB disk.

    Below ``disk_max_used_space_ratio`` an expired commit-log file waits for a ``delete_when``
    hour.  Past it, expired files go at any hour and young ones stay.  Past
    ``disk_clean_forcibly_ratio`` every file but the one being written goes, expired or not (up
    to ``delete_files_batch_max`` a round): those messages are lost to consumers, who are moved
    on to the oldest kept offset.  Writes go on throughout (``disk_space_warning_ratio`` is not
    reached).  The test calls the cleanup rounds (``delete_when`` is twelve hours away); the
    broker runs them every ``clean_interval_ms``."""
    opts = dict(
        SMALL_DISK_STORE,
        delete_when=f"{(time.localtime().tm_hour + 12) % 24:02d}",
        disk_max_used_space_ratio=40,
        disk_clean_forcibly_ratio=70,
        disk_space_warning_ratio=95,
        delete_files_batch_max=100,
    )
    store = build_store("mmap", small_disk, store_options=opts)
    assert store.load()
    store.start()
    try:
        results = fill_until(store, 25)
        files = [m.path for m in store.commitlog.queue.files]
        age(files[0], 2)  # past file_reserved_hours
        assert store.clean_expired() == 0  # not the hour, not full enough: kept
        assert files[0].exists()

        results += fill_until(store, 40)
        assert store.check_disk() <= 70
        assert store.clean_expired() == 1  # past disk_max_used_space_ratio: the expired file
        assert not files[0].exists() and all(f.exists() for f in files[1:])

        results += fill_until(store, 70)
        files = [m.path for m in store.commitlog.queue.files]
        assert store.clean_expired() == len(files) - 1  # past disk_clean_forcibly_ratio
        assert [m.path for m in store.commitlog.queue.files] == files[-1:]
        assert store.check_disk() < 40

        first_kept = next(i for i, r in enumerate(results) if r.wrote_offset >= int(files[-1].name))
        got = store.get_message("g", "TopicA", 0, 0, 32)
        assert got.status is GetStatus.OFFSET_TOO_SMALL and got.next_begin_offset == first_kept
        got = store.get_message("g", "TopicA", 0, first_kept, 1000)
        assert got.status is GetStatus.FOUND and len(got.buffers) == len(results) - first_kept
        assert store.put_message(message(body=b"still writable")).result(10).queue_offset == len(results)
    finally:
        store.shutdown()


def test_full_disk_refuses_writes_until_space_returns(small_disk: Path) -> None:
    """A broker whose disk fills up, through real sends and pulls on loopback.

    When another process fills the disk past ``disk_space_warning_ratio`` (90 % here; room is
    left on it), the broker notices within one tick of its store's service thread and answers
    every send with SERVICE_NOT_AVAILABLE, remark "service not available now: the disk is full:
    ..." (RocketMQ's clients retry that on another broker).  Refusing deletes nothing: every message accepted
    before is still pulled, bodies intact (freeing space by deleting old commit-log files is the
    cleanup rounds' work, the test above; none runs here).  Once space returns, sends succeed
    again within a tick, queue offsets going on from where they stopped (no gap)."""
    from tidemq.client.api import PULL_FLAG_SUBSCRIPTION, ClientAPI
    from tidemq.plugins import get_plugin_manager
    from tidemq.queues import MessageQueue
    from tidemq.remoting.codes import ResponseCode
    from tidemq.testing.pytest_plugin import running_broker

    store_opts = dict(SMALL_DISK_STORE, disk_space_warning_ratio=90)

    async def main() -> None:
        async with running_broker(
            small_disk,
            {"store": "mmap", "index": "none"},
            options={"store": {"mmap": store_opts}},
            # The default timer wheel (3 days of 1 s slots) reserves 16 MiB: more than this disk.
            timer_max_delay_sec=600,
        ) as broker:
            addr = broker.address
            remoting = get_plugin_manager().create("transport", "tcp").client()
            api = ClientAPI(remoting, [addr])
            try:

                async def send(body: bytes) -> Any:
                    header = {"producerGroup": "pg", "topic": "Full", "queueId": 0, "bornTimestamp": 1}
                    return await api.send(addr, header, body, timeout=5)

                async def pull_bodies() -> list[bytes]:
                    got = await api.pull(
                        addr,
                        group="cg",
                        mq=MessageQueue("Full", "", 0),
                        offset=0,
                        max_nums=100,
                        sys_flag=PULL_FLAG_SUBSCRIPTION,  # the subscription travels with the pull
                        commit_offset=0,
                        suspend_ms=0,
                        subscription="*",
                        sub_version=0,
                        expression_type="TAG",
                        timeout=5,
                    )
                    return [m.body for m in got.messages]

                async def send_until(body: bytes, code: int) -> Any:
                    deadline = time.monotonic() + 5  # many ticks of the disk check
                    while (resp := await send(body)).code != code and time.monotonic() < deadline:
                        if resp.code == ResponseCode.SUCCESS:
                            accepted.append(body)
                        await asyncio.sleep(0.02)
                    return resp

                accepted = [b"before-%d" % i for i in range(3)]
                for body in accepted:
                    assert (await send(body)).code == ResponseCode.SUCCESS

                # Another process's file takes the disk past 90 %, leaving room: the refusal is
                # the ratio's (full-disk ENOSPC is tests/reliability/test_disk_full.py's).
                ballast = small_disk / "ballast"
                try:
                    with ballast.open("wb") as f:
                        while shutil.disk_usage(small_disk).used <= 0.93 * SMALL_DISK_BYTES:
                            f.write(bytes(16 << 10))
                            f.flush()
                    assert shutil.disk_usage(small_disk).free > 64 << 10

                    refused = await send_until(b"while full", ResponseCode.SERVICE_NOT_AVAILABLE)
                    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE, refused
                    assert refused.remark.startswith("service not available now: the disk is full: ")
                    assert (await send(b"still full")).code == ResponseCode.SERVICE_NOT_AVAILABLE
                    assert await pull_bodies() == accepted
                finally:
                    ballast.unlink()  # space returns
                resumed = await send_until(b"after", ResponseCode.SUCCESS)
                assert resumed.code == ResponseCode.SUCCESS, resumed
                assert int(resumed.ext_fields["queueOffset"]) == len(accepted)
                assert await pull_bodies() == [*accepted, b"after"]
            finally:
                await remoting.close()

    asyncio.run(main())
