"""The store verifier catches each kind of inconsistency it claims to (in-process store, fast)."""

from __future__ import annotations

import struct
from pathlib import Path

from tidemq.testing.store_contract import build_store, message
from tidemq_index_hash.service import HashIndex, HashIndexOptions
from tidemq_store_mmap.verify import verify_store

OPTS = {"commitlog_file_size": 8 * 1024, "consumequeue_entries": 50}


def fill(root: Path, n: int = 120) -> list:
    index = HashIndex(root / "index", HashIndexOptions(max_hash_slot_num=31, max_index_num=500))
    store = build_store("mmap", root, store_options=OPTS, index=index)
    assert store.load()
    store.start()
    results = [
        store.put_message(
            message(body=b"m-%03d" % i + b"." * (i % 90), queue_id=i % 2, TAGS=f"t{i % 3}", KEYS=f"key-{i}")
        ).result(10)
        for i in range(n)
    ]
    store.shutdown()
    return results


def cq_entry_path(root: Path, queue_id: int, index: int) -> tuple[Path, int]:
    base = index * 20 - (index * 20) % (50 * 20)
    return root / "consumequeue" / "TopicA" / str(queue_id) / f"{base:020d}", index * 20 - base


def test_a_clean_store_verifies_strictly(tmp_path: Path) -> None:
    fill(tmp_path)
    r = verify_store(tmp_path)
    assert r.ok and r.strict and r.error_count == 0 and r.repairable_count == 0
    assert r.records == 120 and r.cq_entries == 120 and r.index_entries == 120
    assert r.commitlog_files >= 3 and r.queues == 2  # records straddle file ends


def test_queue_entry_pointing_at_another_record_is_an_error(tmp_path: Path) -> None:
    results = fill(tmp_path)
    path, pos = cq_entry_path(tmp_path, 0, 7)
    data = bytearray(path.read_bytes())
    other = results[2]  # queue 0, queue offset 1
    struct.pack_into(">qi", data, pos, other.wrote_offset, other.wrote_bytes)
    path.write_bytes(bytes(data))
    r = verify_store(tmp_path)
    assert not r.ok
    assert any("entry 7" in e and "queue offset 1" in e for e in r.errors), r.errors


def test_wrong_tag_hash_and_missing_entry_are_found(tmp_path: Path) -> None:
    fill(tmp_path)
    path, pos = cq_entry_path(tmp_path, 1, 3)
    data = bytearray(path.read_bytes())
    struct.pack_into(">q", data, pos + 12, 12345)  # tag hash
    path.write_bytes(bytes(data))
    assert any("tag hash 12345" in e for e in verify_store(tmp_path).errors)
    # Zero the last entries of queue 1: records without entries are repairable, an error when strict.
    path, pos = cq_entry_path(tmp_path, 1, 59)
    data = bytearray(path.read_bytes())
    data[pos:] = bytes(len(data) - pos)
    path.write_bytes(bytes(data))
    lax = verify_store(tmp_path, strict=False)
    assert lax.cq_missing >= 1 and lax.repairable_count >= 1
    assert not verify_store(tmp_path, strict=True).ok


def test_index_entry_pointing_elsewhere_is_an_error(tmp_path: Path) -> None:
    results = fill(tmp_path)
    path = sorted((tmp_path / "index").iterdir())[0]
    data = bytearray(path.read_bytes())
    slots = struct.unpack_from(">i", data, 32)[0]
    entry = 40 + slots * 4 + 5 * 20  # entry 5
    struct.pack_into(">q", data, entry + 4, results[50].wrote_offset)
    path.write_bytes(bytes(data))
    r = verify_store(tmp_path)
    assert any("entry 5" in e and "hash otherwise" in e for e in r.errors), r.errors


def test_crc_damage_is_an_error_and_the_walk_goes_on(tmp_path: Path) -> None:
    results = fill(tmp_path)
    victim = results[30]
    name = victim.wrote_offset - victim.wrote_offset % OPTS["commitlog_file_size"]
    path = tmp_path / "commitlog" / f"{name:020d}"
    data = bytearray(path.read_bytes())
    data[victim.wrote_offset - name + victim.wrote_bytes - 40] ^= 0xFF
    path.write_bytes(bytes(data))
    r = verify_store(tmp_path)
    assert any("CRC" in e for e in r.errors)
    assert r.records == 120  # the sizes held, so every later record was still checked


def test_a_duplicated_queue_offset_is_an_error(tmp_path: Path) -> None:
    results = fill(tmp_path)
    victim = results[41]  # queue 1, queue offset 20: make it claim offset 19 as well
    name = victim.wrote_offset - victim.wrote_offset % OPTS["commitlog_file_size"]
    path = tmp_path / "commitlog" / f"{name:020d}"
    data = bytearray(path.read_bytes())
    struct.pack_into(">q", data, victim.wrote_offset - name + 20, 19)
    path.write_bytes(bytes(data))
    r = verify_store(tmp_path)
    assert any("duplicated queue offset in TopicA-1" in e for e in r.errors), r.errors


def test_index_truncated_to_a_lost_tail_indexes_the_records_that_reuse_it(tmp_path: Path) -> None:
    """After a crash that lost the log's tail, keys of lost records are dropped and the new
    records written at the same offsets get indexed (they were skipped before the fix)."""
    from tidemq.store import DispatchRequest

    def req(offset: int, key: str) -> DispatchRequest:
        return DispatchRequest("T", 0, offset, 100, 0, 1_700_000_000_000 + offset, offset // 100, keys=key)

    index = HashIndex(tmp_path / "index", HashIndexOptions(max_hash_slot_num=7, max_index_num=4))
    index.load(True, 0)
    for i in range(10):  # rolls over several 4-entry files
        index.dispatch(req(i * 100, f"old-{i}"))
    index.flush()
    index.truncate(450)  # the log now ends at 450: records 500..900 are gone
    assert index.query("T", "old-4", 8, 0, 2**62).phy_offsets == (400,)
    assert index.query("T", "old-7", 8, 0, 2**62).phy_offsets == ()
    index.dispatch(req(500, "new-5"))  # a new record at a lost record's offset
    assert index.query("T", "new-5", 8, 0, 2**62).phy_offsets == (500,)
    index.shutdown()
