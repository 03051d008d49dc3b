"""The ``hash`` key index: IndexFile layout, collisions, rollover, pruning, crash recovery, options."""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

import tidemq_index_hash.plugin
from tidemq.errors import ConfigError, StoreError
from tidemq.index import KeyIndex, look_message_by_id, matching_messages, query_messages
from tidemq.message import MessageInner, Prop, create_message_id, encode_message, patch_record
from tidemq.plugins import PluginManager
from tidemq.store import DispatchRequest
from tidemq.testing.index_contract import FOREVER, T0, keyed_messages, request
from tidemq_index_hash.indexfile import ENTRY_SIZE, HEADER_SIZE, IndexFile, key_hash
from tidemq_index_hash.service import HashIndex, HashIndexOptions

TOPIC = "TopicTest"


def manager() -> PluginManager:
    pm = PluginManager()
    pm.register(tidemq_index_hash.plugin, name="index_hash", distribution="tidemq")
    return pm


def open_index(data_dir: Path, last_exit_ok: bool = True, checkpoint: int = 0, **options: int) -> HashIndex:
    index = manager().create("index", "hash", options=options, data_dir=data_dir)
    index.load(last_exit_ok, checkpoint)
    return index


def offsets(
    index: KeyIndex, key: str, begin: int = 0, end: int = FOREVER, topic: str = TOPIC
) -> tuple[int, ...]:
    return index.query(topic, key, 64, begin, end).phy_offsets


class RecordLog:
    """Encoded commit-log records in memory: real records for the key re-check helpers."""

    def __init__(self) -> None:
        self.data = bytearray()

    def append(self, topic: str, keys: str = "", uniq: str | None = None, ts: int = T0) -> DispatchRequest:
        props = {Prop.KEYS: keys} if keys else {}
        if uniq:
            props[Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
        rec = encode_message(
            MessageInner(topic=topic, body=b"x", properties=props, store_host=("127.0.0.1", 10911))
        )
        offset = len(self.data)
        patch_record(rec, 0, offset, ts)
        self.data += rec
        return DispatchRequest(topic, 0, offset, len(rec), 0, ts, 0, keys=keys, uniq_key=uniq)

    def look_message_by_offset(self, commit_log_offset: int, size: int = -1) -> bytes | None:
        if not 0 <= commit_log_offset < len(self.data):
            return None
        (total,) = struct.unpack_from(">i", self.data, commit_log_offset)
        return bytes(self.data[commit_log_offset : commit_log_offset + total])


# ---------------------------------------------------------------------------- layout


def test_index_file_layout_on_disk(tmp_path: Path) -> None:
    index = open_index(tmp_path, max_hash_slot_num=16, max_index_num=8)
    index.dispatch(request(4096, T0 + 2500, keys="k1"))
    index.dispatch(request(8192, T0 + 7900, keys="k1"))
    index.flush()
    (name,) = index.file_names()
    assert len(name) == 17 and name.isdigit()
    raw = (tmp_path / "index" / name).read_bytes()
    assert len(raw) == HEADER_SIZE + 16 * 4 + 8 * ENTRY_SIZE
    assert struct.unpack_from(">qqqqii", raw, 0) == (T0 + 2500, T0 + 7900, 4096, 8192, 16, 3)
    h = key_hash(f"{TOPIC}#k1")
    assert 0 <= h < 2**31
    (slot,) = struct.unpack_from(">i", raw, HEADER_SIZE + (h % 16) * 4)
    assert slot == 2  # the newest entry heads the chain
    base = HEADER_SIZE + 16 * 4
    assert struct.unpack_from(">iqii", raw, base + 1 * ENTRY_SIZE) == (h, 4096, 0, 0)
    # 5.4 s after the first entry (whole seconds), chained to entry 1.
    assert struct.unpack_from(">iqii", raw, base + 2 * ENTRY_SIZE) == (h, 8192, 5, 1)


def test_header_reloads_intact_after_shutdown(tmp_path: Path) -> None:
    index = open_index(tmp_path, max_hash_slot_num=64, max_index_num=128)
    for req in keyed_messages(20):
        index.dispatch(req)
    index.shutdown()
    (path,) = (tmp_path / "index").iterdir()
    f = IndexFile.open(path)
    try:
        h = f.header
        assert (h.begin_phy_offset, h.end_phy_offset, h.index_count, h.hash_slot_count) == (0, 1900, 41, 64)
        assert (h.begin_timestamp, h.end_timestamp) == (T0, T0 + 190)
    finally:
        f.close()


# ---------------------------------------------------------------------------- collisions


def test_many_keys_in_one_slot(tmp_path: Path) -> None:
    index = open_index(tmp_path, max_hash_slot_num=1, max_index_num=2048)
    for i in range(600):
        index.dispatch(request(i * 100, T0 + i, keys=f"order-{i} shared"))
    for i in (0, 1, 299, 599):
        assert offsets(index, f"order-{i}") == (i * 100,)
    assert offsets(index, "order-600") == ()
    assert index.query(TOPIC, "shared", 1000, 0, FOREVER).phy_offsets == tuple(range(59900, -1, -100))


def _colliding_keys() -> tuple[str, str]:
    """Two keys whose 31-bit hashes are equal (a birthday search over ~2^16 keys)."""
    seen: dict[int, str] = {}
    i = 0
    while True:
        key = f"c{i}"
        h = key_hash(f"{TOPIC}#{key}")
        if h in seen:
            return seen[h], key
        seen[h] = key
        i += 1


def test_full_hash_collision_never_leaks_a_wrong_message(tmp_path: Path) -> None:
    a, b = _colliding_keys()
    log_ = RecordLog()
    index = open_index(tmp_path, max_hash_slot_num=1024, max_index_num=64)
    req_a = log_.append(TOPIC, keys=a, ts=T0)
    req_b = log_.append(TOPIC, keys=b, ts=T0 + 1)
    index.dispatch(req_a)
    index.dispatch(req_b)
    # The index cannot tell them apart: both are candidates...
    assert set(offsets(index, a)) == {req_a.commit_log_offset, req_b.commit_log_offset}
    # ...and the broker's re-check keeps only the message that carries the key.
    found, _ = query_messages(index, log_, TOPIC, a, 1, 0, FOREVER)
    assert [m.commit_log_offset for m in found] == [req_a.commit_log_offset]
    assert matching_messages(log_, TOPIC, b, offsets(index, b))[0].keys == [b]


def test_unique_key_and_offset_message_id_lookups(tmp_path: Path) -> None:
    log_ = RecordLog()
    index = open_index(tmp_path, max_hash_slot_num=64, max_index_num=64)
    reqs = [
        log_.append(TOPIC, keys=f"k{i}", uniq=f"AC11000100002A9F0000000000{i:06d}", ts=T0 + i)
        for i in range(5)
    ]
    for req in reqs:
        index.dispatch(req)
    found, result = query_messages(index, log_, TOPIC, "AC11000100002A9F0000000000000003", 32, 0, FOREVER)
    assert [m.commit_log_offset for m in found] == [reqs[3].commit_log_offset]
    assert result.last_update_phy_offset == reqs[-1].commit_log_offset
    msg = look_message_by_id(log_, create_message_id(("127.0.0.1", 10911), reqs[2].commit_log_offset))
    assert msg is not None and msg.keys == ["k2"]
    assert (
        look_message_by_id(log_, create_message_id(("127.0.0.1", 10911), reqs[2].commit_log_offset + 1))
        is None
    )
    assert look_message_by_id(log_, "not-hex") is None


# ---------------------------------------------------------------------------- rollover and time


def test_rollover_to_new_files(tmp_path: Path) -> None:
    index = open_index(tmp_path, max_hash_slot_num=3, max_index_num=5)  # 4 entries per file
    for i in range(10):
        index.dispatch(request(i * 100, T0 + i * 1000, keys=f"k{i}"))
    names = index.file_names()
    assert len(names) == 3 and names == sorted(names) and len(set(names)) == 3
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == names
    for i in range(10):
        assert offsets(index, f"k{i}") == (i * 100,)
    # A message whose keys straddle two files is found by each key.
    index.dispatch(request(1000, T0 + 10_000, keys="x1 x2 x3"))
    for key in ("x1", "x2", "x3"):
        assert offsets(index, key) == (1000,)
    index.shutdown()
    again = open_index(tmp_path, max_hash_slot_num=3, max_index_num=5)
    assert again.file_names() == sorted(p.name for p in (tmp_path / "index").iterdir())
    assert all(offsets(again, f"k{i}") == (i * 100,) for i in range(10))


def test_time_range_prunes_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = open_index(tmp_path, max_hash_slot_num=8, max_index_num=11)  # 10 entries per file
    for i in range(30):  # three files: minutes 0, 1 and 2 after T0
        index.dispatch(request(i * 100, T0 + (i // 10) * 60_000 + i, keys="k"))
    assert len(index.file_names()) == 3
    visited: list[str] = []
    original = IndexFile.select_phy_offsets

    def spy(self: IndexFile, *args: object) -> None:
        visited.append(self.name)
        original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(IndexFile, "select_phy_offsets", spy)
    middle = index.query(TOPIC, "k", 64, T0 + 60_000, T0 + 60_100).phy_offsets
    assert middle == tuple(range(1900, 999, -100))
    assert visited == [index.file_names()[1]]
    visited.clear()
    assert index.query(TOPIC, "k", 5, 0, FOREVER).phy_offsets == (2900, 2800, 2700, 2600, 2500)
    assert visited == [index.file_names()[2]]  # max_num reached in the newest file


# ---------------------------------------------------------------------------- crash recovery

_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path
    from tidemq.testing.index_contract import keyed_messages
    from tidemq_index_hash.service import HashIndex, HashIndexOptions

    data, slots, entries, flushed, total = sys.argv[1], *map(int, sys.argv[2:])
    index = HashIndex(Path(data), HashIndexOptions(max_hash_slot_num=slots, max_index_num=entries))
    index.load(True, 0)
    reqs = keyed_messages(total, step_ms=20)
    for req in reqs[:flushed]:
        index.dispatch(req)
    checkpoint = index.flush()
    for req in reqs[flushed:]:
        index.dispatch(req)
    print(json.dumps({"checkpoint": checkpoint, "files": index.file_names()}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize(
    ("slots", "entries", "kept_files"),
    [(101, 4096, 1), (13, 64, 8)],
    ids=["straddling-file-repaired", "newer-files-deleted"],
)
def test_rebuild_after_sigkill(tmp_path: Path, slots: int, entries: int, kept_files: int) -> None:
    data = tmp_path / "index"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(data), str(slots), str(entries), "250", "400"],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr.decode()
    child = json.loads(proc.stdout)
    checkpoint = child["checkpoint"]
    reqs = keyed_messages(400, step_ms=20)
    assert checkpoint == reqs[249].store_timestamp

    index = open_index(tmp_path, False, checkpoint, max_hash_slot_num=slots, max_index_num=entries)
    assert index.file_names() == child["files"][:kept_files]
    # What the checkpoint covers survived; what came after it is gone until re-dispatched.
    for i in range(0, 250, 11):
        assert offsets(index, f"K{i}") == (i * 100,), i
    assert all(offsets(index, f"K{i}") == () for i in range(250, 400, 13))
    # The store re-dispatches from a little before the checkpoint (RocketMQ backs off 3 s).
    for req in reqs:
        if req.store_timestamp >= checkpoint - 3000:
            index.dispatch(req)
    for i in range(400):
        assert offsets(index, f"K{i}") == (i * 100,), i
        assert offsets(index, f"UK{i:08d}") == (i * 100,), i
    assert index.stats()["entries"] == 800  # what the kept files counted was not indexed twice
    assert index.flush() == reqs[-1].store_timestamp


def test_abnormal_load_deletes_files_begun_after_checkpoint(tmp_path: Path) -> None:
    index = open_index(tmp_path, max_hash_slot_num=5, max_index_num=5)
    for i in range(12):  # 3 files, 4 messages each, one second apart
        index.dispatch(request(i * 100, T0 + i * 1000, keys=f"k{i}"))
    index.shutdown()
    names = sorted(p.name for p in (tmp_path / "index").iterdir())
    again = open_index(tmp_path, False, T0 + 4500, max_hash_slot_num=5, max_index_num=5)
    assert again.file_names() == names[:2]
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == names[:2]
    assert offsets(again, "k7") == (700,) and offsets(again, "k8") == ()


# ---------------------------------------------------------------------------- housekeeping


def test_delete_expired_removes_old_files_but_the_newest(tmp_path: Path) -> None:
    index = open_index(tmp_path, max_hash_slot_num=5, max_index_num=5)
    for i in range(12):
        index.dispatch(request(i * 100, T0 + i, keys=f"k{i}"))
    names = index.file_names()
    index.delete_expired(400)  # the first file ends at offset 300
    assert index.file_names() == names[1:]
    assert not (tmp_path / "index" / names[0]).exists()
    assert offsets(index, "k0") == () and offsets(index, "k4") == (400,)
    index.delete_expired(10**9)
    assert index.file_names() == names[2:]
    index.dispatch(request(1200, T0 + 12, keys="k12"))
    assert offsets(index, "k12") == (1200,) and offsets(index, "k11") == (1100,)


def test_files_keep_their_layout_when_options_change(tmp_path: Path) -> None:
    index = open_index(tmp_path, max_hash_slot_num=7, max_index_num=9)
    for i in range(6):
        index.dispatch(request(i * 100, T0 + i, keys=f"k{i}"))
    index.shutdown()
    again = open_index(tmp_path, max_hash_slot_num=1000, max_index_num=3000)
    assert all(offsets(again, f"k{i}") == (i * 100,) for i in range(6))
    for i in range(6, 12):  # two more fill the old file, then a new one with the new layout
        again.dispatch(request(i * 100, T0 + i, keys=f"k{i}"))
    assert all(offsets(again, f"k{i}") == (i * 100,) for i in range(12))
    newest = tmp_path / "index" / again.file_names()[-1]
    assert newest.stat().st_size == HEADER_SIZE + 1000 * 4 + 3000 * ENTRY_SIZE


def test_unreadable_file_is_moved_aside_and_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "index").mkdir()
    junk = tmp_path / "index" / "20260101000000000"
    junk.write_bytes(b"not an index file")
    (tmp_path / "index" / "README").write_text("ignored: not an index file name")
    with caplog.at_level(logging.ERROR):
        index = open_index(tmp_path, max_hash_slot_num=8, max_index_num=8)
    assert "20260101000000000" in caplog.text
    index.dispatch(request(0, T0, keys="a"))
    assert offsets(index, "a") == (0,)
    # Kept for inspection under a name load() never reads again.
    assert junk.with_name(junk.name + ".damaged").read_bytes() == b"not an index file"
    assert index.rebuild_from() is not None


def test_misuse_is_a_clear_error(tmp_path: Path) -> None:
    index = HashIndex(tmp_path / "index", HashIndexOptions(max_hash_slot_num=8, max_index_num=8))
    with pytest.raises(StoreError, match="before load"):
        index.dispatch(request(0, T0, keys="a"))
    index.load(True, 0)
    with pytest.raises(StoreError, match="already loaded"):
        index.load(True, 0)
    index.shutdown()
    with pytest.raises(StoreError, match="shut down"):
        index.query(TOPIC, "a", 1, 0, FOREVER)


# ---------------------------------------------------------------------------- plugin wiring


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("hash", {"max_slots": 5}, "[index.hash]: unknown key 'max_slots'"),
        ("hash", {"max_index_num": 1}, "max_index_num = 1 must be between 2"),
        ("hash", {"max_hash_slot_num": "many"}, "max_hash_slot_num = 'many' should be of type int"),
        ("none", {"max_index_num": 5}, "[index.none]: unknown key 'max_index_num'"),
    ],
)
def test_bad_options_are_one_line_errors(tmp_path: Path, name: str, options: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        manager().create("index", name, options=options, data_dir=tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_registered_through_the_entry_point(tmp_path: Path) -> None:
    (ep,) = [e for e in metadata.entry_points(group="tidemq") if e.name == "index_hash"]
    pm = PluginManager()
    pm.register(ep.load(), name=ep.name)
    assert {"hash", "none"} <= set(pm.available("index"))
    index = pm.create("index", "hash", data_dir=tmp_path)
    assert isinstance(index, HashIndex) and index.options == HashIndexOptions()
    assert index.store_path == tmp_path / "index"


def test_default_sized_file_is_sparse(tmp_path: Path) -> None:
    index = open_index(tmp_path)
    index.dispatch(request(0, T0, keys="a", uniq_key="u"))
    index.flush()
    path = tmp_path / "index" / index.file_names()[0]
    st = os.stat(path)
    assert st.st_size == 40 + 5_000_000 * 4 + 20_000_000 * 20
    assert st.st_blocks * 512 < 1024 * 1024  # only the touched pages take disk space
    assert offsets(index, "u") == (0,)


def test_unwritable_directory_logs_and_holds_the_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index = open_index(tmp_path, max_hash_slot_num=4, max_index_num=3)  # 2 entries per file
    index.dispatch(request(0, T0, keys="a b"))
    assert index.flush() == T0
    (tmp_path / "index").rename(tmp_path / "moved")
    (tmp_path / "index").write_text("a file where the directory was")
    with caplog.at_level(logging.ERROR):
        index.dispatch(request(100, T0 + 1000, keys="c"))  # needs a new file: cannot create it
    assert "cannot create an index file" in caplog.text
    assert index.flush() == T0  # the failed message is not claimed, so a restart re-dispatches it
    assert offsets(index, "a") == (0,) and offsets(index, "c") == ()


def test_recovery_when_many_messages_share_the_checkpoint_millisecond(tmp_path: Path) -> None:
    # 40 messages stored in one millisecond: the checkpoint cannot tell them apart by time.
    reqs = [request(i * 100, T0, keys=f"k{i}") for i in range(40)]
    index = open_index(tmp_path, max_hash_slot_num=3, max_index_num=9)  # 8 entries per file
    for req in reqs[:13]:
        index.dispatch(req)
    checkpoint = index.flush()
    for req in reqs[13:]:  # fills the second file in memory only, then rolls on
        index.dispatch(req)
    assert checkpoint == T0 and len(index.file_names()) == 5
    again = open_index(tmp_path, False, checkpoint, max_hash_slot_num=3, max_index_num=9)
    assert again.file_names() == index.file_names()[:2]
    for req in reqs:  # the store re-dispatches from 3 s before the checkpoint
        again.dispatch(req)
    assert all(offsets(again, f"k{i}") == (i * 100,) for i in range(40))
    assert again.stats()["entries"] == 40
