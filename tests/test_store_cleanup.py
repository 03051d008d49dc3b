"""Expiry of commit-log files, ConsumeQueue cleanup, and the key index hooks."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

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


def disk_used_percent(path: Path) -> tuple[float, str]:
    """The store's disk ratio for ``path`` (used / size, as the mmap store's cleanup computes it),
    and a sentence with the figures beside df's ``Use%`` (used / (used + available)): the two differ
    by the blocks reserved for root, often 5 % of the disk."""
    import shutil

    usage = shutil.disk_usage(path)
    ratio = usage.used / usage.total * 100
    df = usage.used / ((usage.used + usage.free) or 1) * 100
    gib = 1 << 30
    text = (
        f"the disk holding {path} is {ratio:.1f} % used as the store measures it (used / size = "
        f"{usage.used / gib:.1f} / {usage.total / gib:.1f} GiB; df shows Use% {df:.0f} %)"
    )
    return ratio, text


def skip_unless_disk_used_over(path: Path, percent: float) -> None:
    """Skip, saying what was measured, when the disk is too empty for a ratio test.

    The store's ratios go down to 10 %: a test that lowers one under the disk's real usage needs
    the disk more than that full."""
    import pytest

    ratio, text = disk_used_percent(path)
    if ratio <= percent:
        pytest.skip(
            f"{text}: this test needs more than {percent:g} % (the lowest ratio an option takes is 10 %)"
        )


def test_skip_reason_says_what_the_disk_ratio_measured(tmp_path: Path) -> None:
    import pytest

    with pytest.raises(pytest.skip.Exception) as skipped:
        skip_unless_disk_used_over(tmp_path, 100)
    reason = str(skipped.value)
    assert str(tmp_path) in reason and "used / size" in reason and "df shows Use%" in reason
    assert "needs more than 100 %" in reason


def test_disk_pressure_deletes_before_expiry(tmp_path: Path) -> None:
    skip_unless_disk_used_over(tmp_path, 11)
    opts = dict(OPTS, disk_max_used_space_ratio=10, disk_clean_forcibly_ratio=95, delete_files_batch_max=100)
    store = build_store("mmap", tmp_path, store_options=opts)
    assert store.load()
    store.start()
    try:
        for _ in range(40):
            store.put_message(message(body=bytes(300))).result(10)
        # The files in use (the directory may also hold the next file, created ahead).
        files = [m.path for m in store.commitlog.queue.files]
        assert len(files) >= 4
        age(files[0], 2)
        # Past disk_max_used_space_ratio: expired files go at any hour.
        assert store.clean_expired() == 1
        store.options.disk_clean_forcibly_ratio = 10
        # Past disk_clean_forcibly_ratio: young files go too, but never the active one.
        assert store.clean_expired() == len(files) - 2
        assert [m.path for m in store.commitlog.queue.files] == files[-1:]
        assert all(not f.exists() for f in files[:-1])
        assert store.put_message(message(body=b"still writable")).result(10).ok
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


def test_full_disk_refuses_writes_until_space_returns(tmp_path: Path) -> None:
    from tidemq.store import PutStatus

    skip_unless_disk_used_over(tmp_path, 11)
    store = build_store("mmap", tmp_path, store_options=dict(OPTS, disk_space_warning_ratio=95))
    assert store.load()
    store.start()
    try:
        assert store.put_message(message(body=b"before")).result(10).ok
        store.options.disk_space_warning_ratio = 10
        store.check_disk()
        res = store.put_message(message(body=b"refused")).result(10)
        assert res.status is PutStatus.DISK_FULL and "full" in res.error
        store.options.disk_space_warning_ratio = 95
        store.check_disk()
        assert store.put_message(message(body=b"after")).result(10).queue_offset == 1
    finally:
        store.shutdown()
