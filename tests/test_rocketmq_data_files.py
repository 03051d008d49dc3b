"""Files and records written by RocketMQ itself, and what RocketMQ reads from ours."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from tidemq.broker.offsets import ConsumerOffsetManager
from tidemq.client.compression import decompress
from tidemq.delay import SCHEDULE_TOPIC
from tidemq.errors import CorruptDataError
from tidemq.jsonfile import read_json
from tidemq.message import MessageInner, RecordEncoder, create_message_id, decode_message
from tidemq.testing.store_contract import build_store, message

# consumerOffset.json as a RocketMQ 4.9 broker writes it (fastjson: Map<Integer, Long> keys bare).
FASTJSON_OFFSETS = b"""{
\t"offsetTable":{
\t\t"TopicTest@please_rename_unique_group_name_4":{0:250,1:249,2:250,3:251},
\t\t"%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4":{0:0}
\t}
}"""


def test_consumer_offsets_written_by_rocketmq_load(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_bytes(FASTJSON_OFFSETS)
    offsets = ConsumerOffsetManager(path)
    offsets.load()
    assert offsets.query_all("please_rename_unique_group_name_4", "TopicTest") == {
        0: 250,
        1: 249,
        2: 250,
        3: 251,
    }


def test_bare_keys_are_quoted_outside_strings_only_and_garbage_still_fails(tmp_path: Path) -> None:
    path = tmp_path / "delayOffset.json"
    path.write_bytes(b'{"offsetTable":{1:5, -2 :7},"note":"{3:4,5:6}"}')
    assert read_json(path) == {"offsetTable": {"1": 5, "-2": 7}, "note": "{3:4,5:6}"}
    path.write_bytes(b'{"offsetTable":{1:5')
    with pytest.raises(CorruptDataError, match="delayOffset.json"):
        read_json(path)


def test_zlib_bodies_marked_as_rocketmq_5_marks_them_decompress() -> None:
    body = zlib.compress(b"hello " * 100)
    assert decompress(body, 0x1) == b"hello " * 100  # 4.x: compressed, type bits 0
    assert decompress(body, 0x1 | 3 << 8) == b"hello " * 100  # 5.x: CompressionType.ZLIB = 3
    with pytest.raises(CorruptDataError, match="unknown compression type"):
        decompress(body, 0x1 | 5 << 8)


def test_an_ipv4_mapped_host_is_stored_as_ipv4_like_java() -> None:
    msg = MessageInner(topic="T", body=b"x", born_host=("::ffff:10.0.0.7", 4000))
    mapped = RecordEncoder(("::ffff:10.0.0.8", 10911))
    plain = RecordEncoder(("10.0.0.8", 10911))
    records = []
    for enc in (mapped, plain):
        batch = enc.prepare([msg])
        buf = bytearray(batch.total)
        enc.write_into(buf, 0, batch, 0, 0, 0)
        records.append(bytes(buf))
    assert records[0] == records[1]
    decoded = decode_message(records[0])
    assert decoded.born_host == ("10.0.0.7", 4000) and decoded.store_host == ("10.0.0.8", 10911)
    assert mapped.message_id(77) == create_message_id(("10.0.0.8", 10911), 77)


def schedule_entries(root: Path, level: int) -> list[tuple[int, int, int]]:
    qdir = root / "consumequeue" / SCHEDULE_TOPIC / str(level - 1)
    data = b"".join(p.read_bytes() for p in sorted(qdir.iterdir()))
    entries = [struct.unpack_from(">qiq", data, i) for i in range(0, len(data), 20)]
    return [e for e in entries if e[1] not in (0, 0x7FFFFFFF)]


def test_delayed_queue_entries_carry_the_delivery_time_as_rocketmq_stores_it(tmp_path: Path) -> None:
    settings = {"delay_levels": "1s 5s 10s"}
    store = build_store("mmap", tmp_path, store_options={"commitlog_file_size": 1 << 16}, settings=settings)
    assert store.load()
    store.start()
    try:
        stored = {}
        for level, delay in ((3, 10_000), (9, 10_000)):  # levels past the last count as the last
            msg = message(topic=SCHEDULE_TOPIC, body=b"later", queue_id=2, TAGS="a", DELAY=str(level))
            res = store.put_message(msg).result(10)
            stored[res.wrote_offset] = res.store_timestamp + delay
        plain = store.put_message(message(topic="TopicA", TAGS="a")).result(10)
    finally:
        store.shutdown()
    assert {off: tags for off, _size, tags in schedule_entries(tmp_path, 3)} == stored
    topic_a = tmp_path / "consumequeue" / "TopicA" / "0"
    (_, _, tags_a) = struct.unpack_from(">qiq", sorted(topic_a.iterdir())[0].read_bytes(), 0)
    assert tags_a == 97 and plain.ok  # "a".hashCode()

    # Rebuilt from the commit log (queues lost, abnormal exit): the same delivery times.
    for p in (tmp_path / "consumequeue").rglob("*"):
        if p.is_file():
            p.unlink()
    (tmp_path / "abort").touch()
    store = build_store("mmap", tmp_path, store_options={"commitlog_file_size": 1 << 16}, settings=settings)
    assert store.load()
    store.shutdown()
    assert {off: tags for off, _size, tags in schedule_entries(tmp_path, 3)} == stored


@pytest.mark.parametrize("text", [b"[]", b'{"offsetTable": []}', b'{"offsetTable": {"T@g": {"0": "x"}}}'])
def test_offsets_of_the_wrong_shape_are_refused_not_overwritten(tmp_path: Path, text: bytes) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_bytes(text)
    with pytest.raises(CorruptDataError, match="consumerOffset.json does not hold consumer offsets"):
        ConsumerOffsetManager(path).load()
    assert path.read_bytes() == text
