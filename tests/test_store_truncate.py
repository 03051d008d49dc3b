"""Cutting a live mmap store's commit log back (issue 25: a deposed master follows the new one).

Real files: records written across several commit-log files and two queues, a key index, then
``truncate_commit_log`` at a record's end and inside a record; everything a client or a restart
sees must agree with the shorter log.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from tidemq.errors import CorruptDataError
from tidemq.index import query_messages
from tidemq.message import MessageInner, decode_message
from tidemq.plugins import get_plugin_manager
from tidemq.store import GetStatus, PutResult, TruncatableStore

TOPIC = "TruncTopic"
FOREVER = 2**62
# Small files: 60 records of ~250 bytes span several commit-log and queue files.
STORE_OPTIONS = {"commitlog_file_size": 4096, "consumequeue_entries": 16}
INDEX_OPTIONS = {"max_hash_slot_num": 97, "max_index_num": 400}


def compose(data_dir: Path, flush: str = "sync", **store_options: Any) -> tuple[Any, Any]:
    pm = get_plugin_manager()
    if "mmap" not in pm.available("store"):
        pytest.skip("the mmap store plugin is not installed")
    policy = pm.create("flush", flush, data_dir=data_dir)
    index = pm.create("index", "hash", options=INDEX_OPTIONS, data_dir=data_dir)
    store = pm.create(
        "store",
        "mmap",
        options={**STORE_OPTIONS, **store_options},
        data_dir=data_dir,
        components={"flush": policy, "index": index},
    )
    assert store.load()
    store.start()
    return store, index


def message(i: int) -> MessageInner:
    return MessageInner(
        topic=TOPIC,
        body=b"m%03d" % i + bytes(180),
        queue_id=i % 2,
        properties={"KEYS": f"key-{i}"},
    )


def bodies(store: Any, queue_id: int) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        got = store.get_message("g", TOPIC, queue_id, offset, 32)
        if got.status is not GetStatus.FOUND:
            return out
        out.extend(decode_message(b, check_crc=True).body[:4] for b in got.buffers)
        offset = got.next_begin_offset


def keys_found(index: Any, store: Any, n: int) -> set[int]:
    found = set()
    for i in range(n):
        msgs, _ = query_messages(index, store, TOPIC, f"key-{i}", 4, 0, FOREVER)
        if msgs:
            assert [m.body[:4] for m in msgs] == [b"m%03d" % i]
            found.add(i)
    return found


def expected(kept: int, queue_id: int) -> list[bytes]:
    return [b"m%03d" % i for i in range(queue_id, kept, 2)]


def check_state(
    store: Any, index: Any, kept: int, total: int, results: list[PutResult], end: int | None = None
) -> None:
    """The store holds exactly the first ``kept`` of ``total`` records written, and ends at ``end``
    (default: the last kept record's end; a file's blank filler counts when the cut is at a file start)."""
    if end is None:
        end = results[kept - 1].wrote_offset + results[kept - 1].wrote_bytes
    assert store.get_max_phy_offset() == end
    for qid in (0, 1):
        assert store.get_max_offset_in_queue(TOPIC, qid) == len(expected(kept, qid))
        assert bodies(store, qid) == expected(kept, qid)
    assert keys_found(index, store, total) == set(range(kept))


@pytest.mark.parametrize("inside", [False, True], ids=["at-boundary", "inside-record"])
def test_truncate_then_append_and_restart(tmp_path: Path, inside: bool) -> None:
    from tidemq_store_mmap.verify import verify_store

    store, index = compose(tmp_path)
    n, kept = 60, 23
    try:
        assert isinstance(store, TruncatableStore)
        results = [store.put_message(message(i)).result(10) for i in range(n)]
        assert keys_found(index, store, n) == set(range(n))
        files_before = len(list((tmp_path / "commitlog").iterdir()))
        cut = results[kept - 1].wrote_offset + results[kept - 1].wrote_bytes
        # Inside the next record: the cut goes back to the boundary below.
        asked = cut + results[kept].wrote_bytes // 2 if inside else cut
        assert store.truncate_commit_log(asked) == cut
        check_state(store, index, kept, n, results)
        assert len(list((tmp_path / "commitlog").iterdir())) < files_before  # later files are gone
        assert store.get_message("g", TOPIC, 0, 20, 32).status is GetStatus.OFFSET_OVERFLOW_BADLY
        assert store.truncate_commit_log(store.get_max_phy_offset() + 999) == cut  # nothing past the end

        # New records continue from the cut: log offsets, queue offsets and keys.
        more = [store.put_message(message(i)).result(10) for i in range(kept, kept + 10)]
        assert more[0].wrote_offset == cut or more[0].wrote_offset % STORE_OPTIONS["commitlog_file_size"] == 0
        assert more[0].queue_offset == len(expected(kept, kept % 2))
        results = results[:kept] + more
        check_state(store, index, kept + 10, n, results)
        # A crash now (the abort file left behind): abnormal recovery agrees with the cut log.
        crashed = tmp_path.parent / f"{tmp_path.name}-crashed"
        shutil.copytree(tmp_path, crashed, ignore=shutil.ignore_patterns("lock"))
    finally:
        store.shutdown()
    assert (crashed / "abort").exists()
    copy, copy_index = compose(crashed)
    try:
        check_state(copy, copy_index, kept + 10, n, results)
    finally:
        copy.shutdown()
    report = verify_store(tmp_path)
    assert report.ok, report.errors
    assert report.records == kept + 10 and report.cq_beyond_end == 0 and report.index_beyond_end == 0
    # A restart recovers the truncated-then-extended state.
    store, index = compose(tmp_path)
    try:
        check_state(store, index, kept + 10, n, results)
    finally:
        store.shutdown()


def test_truncate_to_file_start_and_below_everything(tmp_path: Path) -> None:
    """A cut at a file's first byte keeps that file empty; a cut to 0 empties the log."""
    from tidemq_store_mmap.verify import verify_store

    store, index = compose(tmp_path)
    try:
        results = [store.put_message(message(i)).result(10) for i in range(40)]
        size = STORE_OPTIONS["commitlog_file_size"]
        first_of_file = next(i for i, r in enumerate(results) if i and r.wrote_offset % size == 0)
        start = results[first_of_file].wrote_offset
        assert store.truncate_commit_log(start + 1) == start  # inside the file's first record
        check_state(store, index, first_of_file, 40, results, end=start)
        # Inside the previous file's BLANK filler: back to its last record; the next append
        # writes a new filler and rolls over again.
        assert store.truncate_commit_log(start - 1) == results[first_of_file - 1].wrote_offset + (
            results[first_of_file - 1].wrote_bytes
        )
        check_state(store, index, first_of_file, 40, results)
        rolled = store.put_message(message(first_of_file)).result(10)
        assert rolled.wrote_offset == start and rolled.queue_offset == results[first_of_file].queue_offset
        check_state(store, index, first_of_file + 1, 40, [*results[:first_of_file], rolled])
        assert store.truncate_commit_log(0) == 0
        assert store.get_max_phy_offset() == 0
        assert [store.get_max_offset_in_queue(TOPIC, q) for q in (0, 1)] == [0, 0]
        assert keys_found(index, store, 40) == set()
        again = [store.put_message(message(i)).result(10) for i in range(5)]
        assert again[0].wrote_offset == 0 and again[0].queue_offset == 0
        check_state(store, index, 5, 40, again)
    finally:
        store.shutdown()
    assert verify_store(tmp_path).ok


def test_truncate_with_transient_pool_and_held_views(tmp_path: Path) -> None:
    """Bytes still in the off-heap write buffer (async flush: not committed yet) are kept below the
    cut; a reader's views into the files that go stay readable."""
    store, index = compose(tmp_path, "async", transient_store_pool=True, transient_store_pool_size=4)
    try:
        results = [store.put_message(message(i)).result(10) for i in range(30)]
        held = store.get_message("g", TOPIC, 1, 8, 32)  # views into the files about to go
        assert held.status is GetStatus.FOUND and held.queue_offsets[0] == 8
        cut = results[11].wrote_offset + results[11].wrote_bytes
        assert store.truncate_commit_log(cut) == cut
        check_state(store, index, 12, 30, results)
        assert sum(len(bytes(b)) for b in held.buffers) == sum(len(b) for b in held.buffers)  # readable
        held = None
        more = [store.put_message(message(i)).result(10) for i in range(12, 20)]
        check_state(store, index, 20, 30, results[:12] + more)
    finally:
        store.shutdown()
    store, index = compose(tmp_path, "async", transient_store_pool=True, transient_store_pool_size=4)
    try:
        check_state(store, index, 20, 30, results[:12] + more)
    finally:
        store.shutdown()


def test_readers_during_truncation_never_get_a_wrong_record(tmp_path: Path) -> None:
    """Pulls and key queries racing with cuts and appends: no exception, only whole, right records."""
    store, index = compose(tmp_path)
    failures: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                for qid in (0, 1):
                    got = store.get_message("g", TOPIC, qid, 0, 64)
                    for qoff, buf in zip(got.queue_offsets, got.buffers, strict=True):
                        try:
                            msg = decode_message(buf, check_crc=True)
                        except CorruptDataError:
                            continue  # cut after it was served: the view reads zeros, never garbage
                        assert msg.queue_id == qid and msg.queue_offset == qoff
                query_messages(index, store, TOPIC, "key-3", 4, 0, FOREVER)
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    t = threading.Thread(target=reader)
    try:
        results = [store.put_message(message(i)).result(10) for i in range(40)]
        t.start()
        for round_ in range(4):
            kept = 30 - 5 * round_
            cut = results[kept - 1].wrote_offset + results[kept - 1].wrote_bytes
            assert store.truncate_commit_log(cut + 7) == cut
            results = results[:kept] + [store.put_message(message(i)).result(10) for i in range(kept, 40)]
        stop.set()
        t.join(10)
        assert not failures, failures
        check_state(store, index, 40, 40, results)
    finally:
        stop.set()
        store.shutdown()


def test_only_a_truncatable_store_runs_an_elected_replica(tmp_path: Path) -> None:
    """The controller replication checks the store's capability (``TruncatableStore``), not a
    member name: the memory store, with no raw commit log, is refused with a clear error."""
    from tidemq.errors import ConfigError
    from tidemq.store import RawCommitLogStore

    pm = get_plugin_manager()
    if "controller" not in pm.available("replication"):
        pytest.skip("the controller plugin is not installed")
    policy = pm.create("flush", "async", data_dir=tmp_path)
    index = pm.create("index", "none", data_dir=tmp_path)
    memory = pm.create("store", "memory", data_dir=tmp_path, components={"flush": policy, "index": index})
    assert not isinstance(memory, RawCommitLogStore) and not isinstance(memory, TruncatableStore)
    replica = pm.create("replication", "controller")
    with pytest.raises(ConfigError, match="raw commit-log access and truncation; MemoryMessageStore"):
        replica.start(memory, {"role": "SYNC_MASTER", "id": 1, "store_path": tmp_path})
    replica.shutdown()
