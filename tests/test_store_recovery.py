"""Recovery of the mmap store: restarts, corrupt bytes, torn tails, lost ConsumeQueues."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from tidemq.message import decode_message
from tidemq.store import GetStatus, MessageStore
from tidemq.testing.store_contract import build_store, message

OPTS = {"commitlog_file_size": 8192, "consumequeue_entries": 32}


def open_store(path: Path, **extra: object) -> MessageStore:
    store = build_store("mmap", path, store_options={**OPTS, **extra})
    assert store.load()
    store.start()
    return store


def fill(store: MessageStore, n: int, queue_id: int = 0) -> list:
    return [
        store.put_message(message(body=b"msg-%03d" % i + bytes(150), queue_id=queue_id)).result(10)
        for i in range(n)
    ]


def bodies(store: MessageStore, queue_id: int = 0) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        got = store.get_message("g", "TopicA", queue_id, offset, 32)
        if got.status is not GetStatus.FOUND:
            return out
        # The pull response writes wire_parts: the same bytes, whatever was skipped on the way.
        assert b"".join(got.wire_parts) == b"".join(got.buffers)
        out.extend(decode_message(b, check_crc=True).body[:7] for b in got.buffers)
        offset = got.next_begin_offset


def commitlog_file(path: Path, offset: int) -> tuple[Path, int]:
    base = offset - offset % OPTS["commitlog_file_size"]
    return path / "commitlog" / f"{base:020d}", offset - base


def test_clean_restart_keeps_everything_and_continues(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    first = fill(store, 120)
    store.shutdown()
    assert len(list((tmp_path / "commitlog").iterdir())) > 3  # spans several files
    store = open_store(tmp_path)
    try:
        assert bodies(store) == [b"msg-%03d" % i for i in range(120)]
        nxt = store.put_message(message(body=b"msg-new")).result(10)
        assert nxt.queue_offset == 120 and nxt.wrote_offset >= first[-1].wrote_offset + first[-1].wrote_bytes
    finally:
        store.shutdown()


def flip_body_byte(path: Path, result: object) -> None:
    file, pos = commitlog_file(path, result.wrote_offset)  # type: ignore[attr-defined]
    data = bytearray(file.read_bytes())
    data[pos + result.wrote_bytes - 60] ^= 0xFF  # type: ignore[attr-defined]  # inside the body
    file.write_bytes(bytes(data))


def test_a_damaged_record_inside_the_log_is_skipped_and_everything_after_it_kept(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    results = fill(store, 120)
    store.shutdown()
    files = sorted((tmp_path / "commitlog").iterdir())
    victim = results[70]  # two files before the last
    assert commitlog_file(tmp_path, victim.wrote_offset)[0] != files[-1]
    flip_body_byte(tmp_path, victim)

    store = open_store(tmp_path)
    try:
        assert sorted((tmp_path / "commitlog").iterdir()) == files  # no later file cut
        assert bodies(store) == [b"msg-%03d" % i for i in range(120) if i != 70]
        assert store.get_max_offset_in_queue("TopicA", 0) == 120
        assert store.look_message_by_offset(results[119].wrote_offset) is not None
        res = store.put_message(message(body=b"next")).result(10)
        assert (
            res.queue_offset == 120 and res.wrote_offset == results[-1].wrote_offset + results[-1].wrote_bytes
        )
    finally:
        store.shutdown()


def test_a_damaged_last_record_is_cut_like_a_torn_tail(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    results = fill(store, 120)
    store.shutdown()
    victim = results[-1]
    flip_body_byte(tmp_path, victim)

    store = open_store(tmp_path)
    try:
        assert bodies(store) == [b"msg-%03d" % i for i in range(119)]
        assert store.get_max_offset_in_queue("TopicA", 0) == 119
        assert store.get_max_phy_offset() == victim.wrote_offset
        assert store.get_message("g", "TopicA", 0, 119, 32).status is GetStatus.OFFSET_OVERFLOW_ONE
        res = store.put_message(message(body=b"replaces")).result(10)
        assert (res.queue_offset, res.wrote_offset) == (119, victim.wrote_offset)
    finally:
        store.shutdown()


def test_torn_tail_after_a_crash_is_never_served(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    results = fill(store, 50)
    store.shutdown()
    last = results[-1]
    # A crash that tore the last record: only its first 40 bytes reached the disk...
    path, pos = commitlog_file(tmp_path, last.wrote_offset)
    data = bytearray(path.read_bytes())
    data[pos + 40 : pos + last.wrote_bytes] = bytes(last.wrote_bytes - 40)
    path.write_bytes(bytes(data))
    # ...while its ConsumeQueue entry did, and the broker had not removed its abort file.
    (tmp_path / "abort").touch()

    store = open_store(tmp_path)
    try:
        assert bodies(store) == [b"msg-%03d" % i for i in range(49)]
        assert store.get_max_offset_in_queue("TopicA", 0) == 49
        assert store.look_message_by_offset(last.wrote_offset) is None
    finally:
        store.shutdown()


def test_abnormal_recovery_rebuilds_lost_consume_queues(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    fill(store, 60, queue_id=0)
    fill(store, 30, queue_id=5)
    store.shutdown()
    shutil.rmtree(tmp_path / "consumequeue")
    (tmp_path / "checkpoint").write_bytes(struct.pack(">qqq", 0, 0, 0) + bytes(4072))
    (tmp_path / "abort").touch()

    store = open_store(tmp_path)
    try:
        assert bodies(store, 0) == [b"msg-%03d" % i for i in range(60)]
        assert bodies(store, 5) == [b"msg-%03d" % i for i in range(30)]
        assert store.topics() == {"TopicA": [0, 5]}
    finally:
        store.shutdown()


def test_consume_queue_behind_the_commit_log_is_caught_up_on_load(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    fill(store, 40)
    store.shutdown()
    # Lose the last ten queue entries (a queue flush that never happened).
    cq = tmp_path / "consumequeue" / "TopicA" / "0" / f"{32 * 20:020d}"
    cq.write_bytes(bytes(cq.stat().st_size))
    store = open_store(tmp_path)
    try:
        assert bodies(store) == [b"msg-%03d" % i for i in range(40)]
    finally:
        store.shutdown()


def test_queue_file_failure_takes_the_record_back_and_the_store_stays_up(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        ok = store.put_message(message(body=b"fine", queue_id=0)).result(10)
        # Something that is not a directory where queue 7's files must go.
        blocker = tmp_path / "consumequeue" / "TopicA" / "7"
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_bytes(b"in the way")
        end = store.get_max_phy_offset()
        res = store.put_message(message(body=b"blocked", queue_id=7)).result(10)
        assert res.status.value == "CREATE_MAPPED_FILE_FAILED" and "cannot create" in res.error
        assert store.get_max_phy_offset() == end  # nothing left behind in the commit log
        nxt = store.put_message(message(body=b"next", queue_id=0)).result(10)
        assert (nxt.queue_offset, nxt.wrote_offset) == (1, ok.wrote_offset + ok.wrote_bytes)
        blocker.unlink()
        res = store.put_message(message(body=b"unblocked", queue_id=7)).result(10)
        assert res.ok and res.queue_offset == 0 and res.wrote_offset == nxt.wrote_offset + nxt.wrote_bytes
    finally:
        store.shutdown()
    store = open_store(tmp_path)
    try:
        assert bodies(store, 0) == [b"fine", b"next"]
        assert bodies(store, 7) == [b"unblock"]
    finally:
        store.shutdown()


def fill_two_queues(store: MessageStore, n: int) -> None:
    for i in range(n):
        for qid in (0, 1):
            store.put_message(message(body=b"msg-%03d" % i + bytes(150), queue_id=qid)).result(10)


def test_a_queue_that_lost_its_files_is_rebuilt_on_a_clean_restart(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    fill_two_queues(store, 50)
    store.shutdown()
    shutil.rmtree(tmp_path / "consumequeue" / "TopicA" / "0")  # queue 1 is whole

    store = open_store(tmp_path)
    try:
        assert bodies(store, 0) == [b"msg-%03d" % i for i in range(50)]
        assert bodies(store, 1) == [b"msg-%03d" % i for i in range(50)]
        assert store.put_message(message(body=b"next", queue_id=0)).result(10).queue_offset == 50
    finally:
        store.shutdown()


def test_a_queue_that_lost_its_last_entries_is_caught_up_although_another_is_ahead(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    fill(store, 40, queue_id=0)
    fill(store, 40, queue_id=1)  # queue 1 ends further in the log
    store.shutdown()
    last = sorted((tmp_path / "consumequeue" / "TopicA" / "0").iterdir())[-1]
    last.write_bytes(bytes(last.stat().st_size))  # its entries never reached the disk

    store = open_store(tmp_path)
    try:
        assert bodies(store, 0) == [b"msg-%03d" % i for i in range(40)]
        assert store.put_message(message(body=b"next", queue_id=0)).result(10).queue_offset == 40
    finally:
        store.shutdown()


def cq_entry_pos(path: Path, queue_id: int, index: int) -> tuple[Path, int]:
    per_file = OPTS["consumequeue_entries"]
    name = f"{index // per_file * per_file * 20:020d}"
    return path / "consumequeue" / "TopicA" / str(queue_id) / name, index % per_file * 20


def test_a_queue_entry_naming_another_record_is_never_served(tmp_path: Path, caplog) -> None:
    store = open_store(tmp_path)
    fill_two_queues(store, 20)
    other = store.get_commit_log_offset("TopicA", 1, 5)
    store.shutdown()
    file, pos = cq_entry_pos(tmp_path, 0, 5)
    data = bytearray(file.read_bytes())
    struct.pack_into(">q", data, pos, other)  # entry 5 of queue 0 now names queue 1's record 5
    file.write_bytes(bytes(data))

    store = open_store(tmp_path)
    try:
        got = store.get_message("g", "TopicA", 0, 0, 32)
        msgs = [decode_message(b) for b in got.buffers]
        assert [(m.queue_id, m.queue_offset) for m in msgs] == [(0, i) for i in range(20) if i != 5]
        assert "entry 5 points at commit-log offset" in caplog.text and "queue 1 offset 5" in caplog.text
    finally:
        store.shutdown()


def test_zeroed_log_bytes_in_an_old_file_are_never_served(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    results = fill(store, 200)  # many files: recovery checks only the last three
    store.shutdown()
    victim = results[3]
    file, pos = commitlog_file(tmp_path, victim.wrote_offset)
    data = bytearray(file.read_bytes())
    data[pos : pos + victim.wrote_bytes] = bytes(victim.wrote_bytes)
    file.write_bytes(bytes(data))

    store = open_store(tmp_path)
    try:
        assert bodies(store) == [b"msg-%03d" % i for i in range(200) if i != 3]
    finally:
        store.shutdown()


def test_a_gap_or_a_stray_name_in_the_commit_log_refuses_to_load_and_deletes_nothing(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    fill(store, 150)
    store.shutdown()
    files = sorted((tmp_path / "commitlog").iterdir())
    size = OPTS["commitlog_file_size"]

    middle = files[2]
    aside = tmp_path / "aside"
    middle.rename(aside)
    store = build_store("mmap", tmp_path, store_options=OPTS)
    assert store.load() is False
    store.shutdown()
    assert sorted((tmp_path / "commitlog").iterdir()) == [f for f in files if f != middle]
    aside.rename(middle)

    stray = tmp_path / "commitlog" / f"{int(files[-1].name) + size + 100:020d}"
    stray.write_bytes(bytes(size))
    store = build_store("mmap", tmp_path, store_options=OPTS)
    assert store.load() is False
    store.shutdown()
    assert stray.exists()
    stray.unlink()

    store = open_store(tmp_path)
    try:
        assert bodies(store) == [b"msg-%03d" % i for i in range(150)]
    finally:
        store.shutdown()
