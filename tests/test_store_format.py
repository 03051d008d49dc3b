"""The mmap store writes RocketMQ 4.x's on-disk layout byte for byte."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import lz4.frame
import pytest
import zstandard

from tidemq.errors import ConfigError
from tidemq.message import (
    COMPRESSED_FLAG,
    COMPRESSION_LZ4,
    COMPRESSION_TYPE_MASK,
    COMPRESSION_ZSTD,
    MessageInner,
    decode_message,
)
from tidemq.store import GetStatus, PutStatus
from tidemq.testing.store_contract import build_store, message


def hand_message(body: bytes = b"ABC", reconsume: int = 3) -> MessageInner:
    return MessageInner(
        topic="T",
        body=body,
        queue_id=1,
        flag=2,
        properties={"TAGS": "x"},
        born_timestamp=0x0102030405060708,
        born_host=("1.2.3.4", 5),
        reconsume_times=reconsume,
    )


def open_store(path: Path, **options: object):
    store = build_store("mmap", path, store_options={"store_host": "9.8.7.6:10911", **options})
    assert store.load()
    store.start()
    return store


def test_record_layout_matches_the_hand_checked_table(tmp_path: Path) -> None:
    store = open_store(tmp_path, commitlog_file_size=250, consumequeue_entries=8)
    r1 = store.put_message(hand_message()).result(10)
    r2 = store.put_message(hand_message()).result(10)
    r3 = store.put_message(hand_message()).result(10)
    store.shutdown()
    assert (r1.wrote_offset, r1.wrote_bytes, r2.wrote_offset, r3.wrote_offset) == (0, 102, 102, 250)

    log0 = (tmp_path / "commitlog" / "00000000000000000000").read_bytes()
    assert len(log0) == 250
    rec = log0[:102]
    # TOTALSIZE 4 | MAGICCODE 4 | BODYCRC 4 | QUEUEID 4 | FLAG 4
    assert rec[0:4] == bytes.fromhex("00000066")
    assert rec[4:8] == bytes.fromhex("DAA320A7")
    assert rec[8:12] == struct.pack(">i", zlib.crc32(b"ABC") & 0x7FFFFFFF)
    assert rec[12:16] == bytes.fromhex("00000001")
    assert rec[16:20] == bytes.fromhex("00000002")
    # QUEUEOFFSET 8 | PHYSICALOFFSET 8 | SYSFLAG 4 | BORNTIMESTAMP 8
    assert rec[20:28] == bytes(8)
    assert rec[28:36] == bytes(8)
    assert rec[36:40] == bytes(4)
    assert rec[40:48] == bytes.fromhex("0102030405060708")
    # BORNHOST 8 (IPv4 + port) | STORETIMESTAMP 8 | STOREHOSTADDRESS 8
    assert rec[48:56] == bytes.fromhex("0102030400000005")
    assert rec[56:64] == struct.pack(">q", r1.store_timestamp)
    assert rec[64:72] == bytes.fromhex("0908070600002A9F")
    # RECONSUMETIMES 4 | PREPARED TRANSACTION OFFSET 8 | BODYLENGTH 4 + body
    assert rec[72:76] == bytes.fromhex("00000003")
    assert rec[76:84] == bytes(8)
    assert rec[84:91] == bytes.fromhex("00000003") + b"ABC"
    # TOPICLENGTH 1 + topic | PROPERTIESLENGTH 2 + properties
    assert rec[91:93] == b"\x01T"
    assert rec[93:102] == b"\x00\x07TAGS\x01x\x02"

    # The second record carries its own queue and physical offsets.
    rec2 = log0[102:204]
    assert rec2[20:28] == struct.pack(">q", 1)
    assert rec2[28:36] == struct.pack(">q", 102)
    # The third did not fit in the 46 bytes left: a BLANK record fills them.
    assert log0[204:212] == struct.pack(">i", 46) + bytes.fromhex("CBD43194")
    log1 = (tmp_path / "commitlog" / "00000000000000000250").read_bytes()
    assert log1[28:36] == struct.pack(">q", 250) and log1[20:28] == struct.pack(">q", 2)

    # ConsumeQueue entries: commit-log offset 8 | size 4 | tags hash code 8 ("x".hashCode() == 120).
    cq = (tmp_path / "consumequeue" / "T" / "1" / "00000000000000000000").read_bytes()
    assert len(cq) == 8 * 20
    assert cq[:60] == b"".join(struct.pack(">qiq", off, 102, 120) for off in (0, 102, 250))
    assert cq[60:80] == bytes(20)

    # Checkpoint: physic / logics timestamps of the last message; the abort file is gone.
    cp = (tmp_path / "checkpoint").read_bytes()
    assert len(cp) == 4096
    physic, logics, _index = struct.unpack_from(">qqq", cp)
    assert physic == logics == r3.store_timestamp
    assert not (tmp_path / "abort").exists()


def test_abort_file_marks_a_running_store(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        assert (tmp_path / "abort").exists()
    finally:
        store.shutdown()
    assert not (tmp_path / "abort").exists()


def test_record_larger_than_a_file_is_refused_clearly(tmp_path: Path) -> None:
    store = open_store(tmp_path, commitlog_file_size=4096)
    try:
        res = store.put_message(hand_message(body=bytes(5000))).result(10)
        assert res.status is PutStatus.MESSAGE_ILLEGAL
        assert "does not fit" in res.error
        big = build_store("mmap", tmp_path / "b", settings={"max_message_size": 1000})
        assert big.load()
        big.start()
        res = big.put_message(hand_message(body=bytes(1001))).result(10)
        big.shutdown()
        assert res.status is PutStatus.MESSAGE_ILLEGAL and "over the limit of 1000" in res.error
        assert store.put_message(hand_message()).result(10).ok
    finally:
        store.shutdown()


@pytest.mark.parametrize(
    ("algorithm", "bits", "decompress"),
    [
        ("lz4", COMPRESSION_LZ4, lz4.frame.decompress),
        ("zstd", COMPRESSION_ZSTD, zstandard.ZstdDecompressor().decompress),
    ],
)
def test_compression_is_marked_in_sys_flag(tmp_path: Path, algorithm: str, bits: int, decompress) -> None:
    store = open_store(tmp_path, compression=algorithm, compression_min_size=100)
    try:
        body = b"tidemq " * 1000
        store.put_message(hand_message(body=body)).result(10)
        store.put_message(hand_message(body=b"small")).result(10)
        got = store.get_message("g", "T", 1, 0, 32)
        assert got.status is GetStatus.FOUND
        big, small = (decode_message(b, check_crc=True) for b in got.buffers)
        assert big.sys_flag & COMPRESSED_FLAG and big.sys_flag & COMPRESSION_TYPE_MASK == bits
        assert len(big.body) < len(body) and decompress(big.body) == body
        assert small.sys_flag == 0 and small.body == b"small"
    finally:
        store.shutdown()


def test_bad_options_fail_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"\[store.mmap\]: unknown key 'comitlog_file_size'.*did you mean 'commitlog_file_size'",
    ):
        build_store("mmap", tmp_path, store_options={"comitlog_file_size": 1})
    with pytest.raises(ConfigError, match="compression = 'gzip' is not valid"):
        build_store("mmap", tmp_path, store_options={"compression": "gzip"})
    with pytest.raises(ConfigError, match="delete_when"):
        build_store("mmap", tmp_path, store_options={"delete_when": "25"})
    with pytest.raises(ConfigError, match=r"\[flush.sync\]: unknown key"):
        build_store("mmap", tmp_path, flush_options={"timeout": 1})


def test_ipv6_hosts_set_the_sys_flag_bits_and_shift_the_layout(tmp_path: Path) -> None:
    from tidemq.message import BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG

    store = build_store("mmap", tmp_path, store_options={"store_host": "[::1]:10911"})
    assert store.load()
    store.start()
    try:
        msg = hand_message()
        msg.born_host = ("fe80::2", 6)
        res = store.put_message(msg).result(10)
        raw = store.look_message_by_offset(res.wrote_offset)
        assert raw is not None and len(raw) == 102 + 12 + 12
        (sys_flag,) = struct.unpack_from(">i", raw, 36)
        assert sys_flag == BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
        # BORNHOST is 16 + 4 bytes, so STORETIMESTAMP moves to 68 and STOREHOSTADDRESS to 76.
        assert raw[48:64] == bytes.fromhex("fe800000000000000000000000000002")
        assert struct.unpack_from(">q", raw, 68)[0] == res.store_timestamp
        assert raw[76:96] == bytes(15) + b"\x01" + struct.pack(">i", 10911)
        m = decode_message(raw, check_crc=True)
        assert (m.born_host, m.store_host, m.body) == (("fe80::2", 6), ("::1", 10911), b"ABC")
        assert len(res.msg_id) == 56  # 16-byte IP + port + offset, hex
    finally:
        store.shutdown()


def test_warm_up_touches_every_page_of_a_new_file(tmp_path: Path) -> None:
    store = build_store("mmap", tmp_path, store_options={"warm_up": True, "commitlog_file_size": 1 << 20})
    assert store.load()
    store.start()
    try:
        store.put_message(hand_message()).result(10)
        first = tmp_path / "commitlog" / f"{0:020d}"
        # A sparse file would own almost no blocks; a warmed one owns all of them.
        assert first.stat().st_blocks * 512 >= 1 << 20
    finally:
        store.shutdown()


@pytest.mark.parametrize("allocation", ["sparse", "fallocate"])
def test_file_allocation_decides_when_files_take_their_space(tmp_path: Path, allocation: str) -> None:
    """Sparse files (default) take space as records arrive (a few MiB reserved ahead at a time);
    fallocate reserves a whole file at once."""
    store = open_store(
        tmp_path, commitlog_file_size=64 << 20, consumequeue_entries=1_000_000, file_allocation=allocation
    )
    try:
        assert store.put_message(hand_message()).result(10).ok
        commitlog = tmp_path / "commitlog" / "00000000000000000000"
        queue_file = tmp_path / "consumequeue" / "T" / "1" / "00000000000000000000"
        for path in (commitlog, queue_file):
            st = path.stat()
            reserved = st.st_blocks * 512 >= st.st_size
            assert reserved is (allocation == "fallocate"), (path.name, st.st_blocks, st.st_size)
    finally:
        store.shutdown()


def test_out_of_range_field_is_refused_and_never_resurfaces_after_a_crash(tmp_path: Path) -> None:
    store = open_store(tmp_path, commitlog_file_size=1 << 20)
    good = hand_message(b"good")
    bad = hand_message(b"bad")
    bad.flag = 1 << 40  # not a Java int: packing fails half-way through the batch
    assert store.put_message(good).result(10).ok
    res = store.put_messages([hand_message(b"first"), bad]).result(10)
    assert res.status is PutStatus.MESSAGE_ILLEGAL and "format requires" in res.error
    # Crash right now: no clean shutdown, then recover from what is on disk.
    store.commitlog.flush(0)
    store._running = False
    store._stop.set()
    store.flush_policy.shutdown()
    store.commitlog.queue.shutdown()
    reopened = open_store(tmp_path, commitlog_file_size=1 << 20)
    try:
        got = reopened.get_message("g", "T", 1, 0, 10)
        assert [decode_message(b).body for b in got.buffers] == [b"good"]
    finally:
        reopened.shutdown()


def test_records_stored_back_to_back_are_pulled_as_one_chunk(tmp_path: Path) -> None:
    # A pull writes GetResult.wire_parts: a producer's batch lies back to back in the log, so its
    # records go out as one view of the mapping, byte for byte what the per-record buffers hold.
    store = build_store("mmap", tmp_path)
    assert store.load()
    store.start()
    try:
        batch = [message(body=b"b%02d" % i + bytes(100), queue_id=1) for i in range(32)]
        store.put_messages(batch).result(10)
        for i in range(3):  # interleaved with another queue: no longer back to back
            store.put_message(message(body=b"q1-%d" % i, queue_id=1)).result(10)
            store.put_message(message(body=b"q2-%d" % i, queue_id=2)).result(10)
        got = store.get_message("g", "TopicA", 1, 0, 32)
        assert got.status is GetStatus.FOUND and len(got.buffers) == 32
        assert len(got.wire) == 1 and bytes(got.wire[0]) == b"".join(got.buffers)
        # Offsets 30-32 follow each other in the log (32 was the next put); 33 and 34 do not.
        mixed = store.get_message("g", "TopicA", 1, 30, 32)
        assert len(mixed.buffers) == 5 and len(mixed.wire) == 3
        assert b"".join(mixed.wire) == b"".join(mixed.buffers)
    finally:
        store.shutdown()
