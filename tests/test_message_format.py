"""The RocketMQ 4.x commit-log record, checked byte by byte against the seed table."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.errors import CorruptDataError, MessageTooLargeError
from tidemq.message import (
    BORNHOST_V6_FLAG,
    STOREHOSTADDRESS_V6_FLAG,
    BatchItem,
    MessageInner,
    RecordEncoder,
    create_message_id,
    decode_batch,
    decode_message,
    decode_message_id,
    encode_batch,
    encode_message,
    iter_messages,
    java_string_hash,
    patch_record,
    properties_to_string,
    string_to_properties,
    tags_hash_code,
)


def test_record_layout_matches_the_seed_table():
    msg = MessageInner(
        topic="TopicTest",
        body=b"Hello",
        queue_id=2,
        flag=7,
        properties={"TAGS": "TagA"},
        sys_flag=0,
        born_timestamp=0x0102030405060708,
        born_host=("192.168.0.1", 40000),
        store_host=("10.0.0.2", 10911),
        reconsume_times=3,
        prepared_transaction_offset=9,
    )
    rec = encode_message(msg)
    patch_record(rec, queue_offset=5, physical_offset=1024, store_timestamp=0x1112131415161718)
    props = b"TAGS\x01TagA\x02"
    expected = b"".join(
        [
            struct.pack(">i", len(rec)),  # TOTALSIZE
            bytes.fromhex("daa320a7"),  # MAGICCODE
            struct.pack(">i", zlib.crc32(b"Hello") & 0x7FFFFFFF),  # BODYCRC
            struct.pack(">i", 2),  # QUEUEID
            struct.pack(">i", 7),  # FLAG
            struct.pack(">q", 5),  # QUEUEOFFSET
            struct.pack(">q", 1024),  # PHYSICALOFFSET
            struct.pack(">i", 0),  # SYSFLAG
            bytes.fromhex("0102030405060708"),  # BORNTIMESTAMP
            bytes([192, 168, 0, 1]) + struct.pack(">i", 40000),  # BORNHOST
            bytes.fromhex("1112131415161718"),  # STORETIMESTAMP
            bytes([10, 0, 0, 2]) + struct.pack(">i", 10911),  # STOREHOSTADDRESS
            struct.pack(">i", 3),  # RECONSUMETIMES
            struct.pack(">q", 9),  # PREPARED TRANSACTION OFFSET
            struct.pack(">i", 5) + b"Hello",  # BODY
            bytes([9]) + b"TopicTest",  # TOPIC
            struct.pack(">h", len(props)) + props,  # PROPERTIES
        ]
    )
    assert bytes(rec) == expected
    assert len(rec) == 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 5 + 1 + 9 + 2 + len(props)

    back = decode_message(rec, check_crc=True)
    assert (back.topic, back.body, back.queue_id, back.flag, back.queue_offset) == (
        "TopicTest",
        b"Hello",
        2,
        7,
        5,
    )
    assert back.commit_log_offset == 1024 and back.store_timestamp == 0x1112131415161718
    assert back.born_host == ("192.168.0.1", 40000) and back.store_host == ("10.0.0.2", 10911)
    assert back.properties == {"TAGS": "TagA"} and back.tags == "TagA"
    assert back.msg_id == "0A00000200002A9F0000000000000400"


def test_ipv6_hosts_set_the_flags_and_take_20_bytes():
    msg = MessageInner(topic="t", body=b"b", born_host=("::1", 1), store_host=("fe80::2", 2))
    rec = encode_message(msg)
    patch_record(rec, 1, 2, 3)
    back = decode_message(rec)
    assert back.sys_flag & BORNHOST_V6_FLAG and back.sys_flag & STOREHOSTADDRESS_V6_FLAG
    assert back.store_timestamp == 3 and back.born_host == ("::1", 1) and back.store_host == ("fe80::2", 2)
    assert len(rec) == len(encode_message(MessageInner(topic="t", body=b"b"))) + 24
    assert decode_message_id(back.msg_id) == (("fe80::2", 2), 2)


def test_java_string_hash_codes():
    # Values of String.hashCode() computed by a JVM.
    assert java_string_hash("") == 0
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2147483648
    assert tags_hash_code(None) == 0 and tags_hash_code("TagA") == 2598919


def test_corrupt_records_raise_typed_errors():
    rec = encode_message(MessageInner(topic="t", body=b"payload"))
    with pytest.raises(CorruptDataError, match="magic"):
        decode_message(b"\x00" * len(rec))
    with pytest.raises(CorruptDataError):
        decode_message(rec[:30])
    flipped = bytearray(rec)
    flipped[-6] ^= 0xFF  # inside the body (then topic 2 bytes, properties length 2 bytes)
    with pytest.raises(CorruptDataError, match="CRC"):
        decode_message(flipped, check_crc=True)


def test_limits_are_enforced_with_clear_errors():
    with pytest.raises(MessageTooLargeError, match="body is 11 bytes, over the limit of 10"):
        encode_message(MessageInner(topic="t", body=b"x" * 11), max_size=10)
    with pytest.raises(MessageTooLargeError, match="topic"):
        encode_message(MessageInner(topic="t" * 128, body=b""))
    with pytest.raises(MessageTooLargeError, match="properties"):
        encode_message(MessageInner(topic="t", body=b"", properties={"k": "v" * 40000}))


def test_batch_round_trip_and_iteration():
    items = [BatchItem(b"a", 0, {"KEYS": "k1"}), BatchItem(b"", 3, {}), BatchItem(b"c" * 100, 1, {"x": "y"})]
    assert decode_batch(encode_batch(items)) == items
    with pytest.raises(CorruptDataError):
        decode_batch(encode_batch(items)[:-3])
    recs = []
    for i in range(3):
        r = encode_message(MessageInner(topic="t", body=bytes([i])))
        patch_record(r, i, 0, 0)
        recs.append(bytes(r))
    assert [m.queue_offset for m in iter_messages(b"".join(recs))] == [0, 1, 2]


text = st.text(
    alphabet=st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)), min_size=1
)


@given(
    st.dictionaries(
        text, st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)))
    )
)
def test_properties_round_trip(props):
    assert string_to_properties(properties_to_string(props)) == props


@given(
    body=st.binary(max_size=300),
    topic=st.text(alphabet="abcXYZ%_-0123", min_size=1, max_size=60),
    qid=st.integers(0, 2**31 - 1),
)
def test_any_message_round_trips(body, topic, qid):
    rec = encode_message(MessageInner(topic=topic, body=body, queue_id=qid, properties={"KEYS": "a b"}))
    back = decode_message(rec, check_crc=True)
    assert (back.topic, back.body, back.queue_id, back.keys) == (topic, body, qid, ["a", "b"])


@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_decoders(data):
    for decode in (decode_message, decode_batch):
        try:
            decode(data)
        except CorruptDataError:
            pass


def test_message_id_round_trip():
    mid = create_message_id(("127.0.0.1", 10911), 123456789)
    assert len(mid) == 32 and mid == mid.upper()
    assert decode_message_id(mid) == (("127.0.0.1", 10911), 123456789)
    with pytest.raises(ValueError):
        decode_message_id("ABCD")


@pytest.mark.parametrize("store_host", [("10.0.0.1", 10911), ("fe80::1", 10911)])
@pytest.mark.parametrize("born_host", [("1.2.3.4", 5), ("::1", 9)])
def test_record_encoder_writes_the_same_bytes_as_encode_and_patch(store_host, born_host):
    """The store's in-place batch encoder is byte-for-byte the reference encoder."""
    shared = {"TAGS": "a", "KEYS": "k1 k2"}
    msgs = [
        MessageInner(
            topic="Topic",
            body=bytes([i]) * (10 + i),
            queue_id=3,
            flag=i,
            properties=shared if i < 2 else {"TAGS": f"t{i}", "UNIQ_KEY": f"u{i}"},
            sys_flag=0,
            born_timestamp=1000 + i,
            born_host=born_host,
            reconsume_times=i,
            prepared_transaction_offset=7 * i,
        )
        for i in range(4)
    ]
    encoder = RecordEncoder(store_host)
    batch = encoder.prepare(msgs)
    buf = bytearray(8 + batch.total)
    offsets = encoder.write_into(buf, 8, batch, queue_offset=40, physical_offset=5000, store_timestamp=123)
    expected = []
    phys = 5000
    for i, m in enumerate(msgs):
        rec = encode_message(m, store_host=store_host)
        patch_record(rec, 40 + i, phys, 123)
        expected.append(bytes(rec))
        phys += len(rec)
    assert bytes(buf[8:]) == b"".join(expected)
    assert offsets == [5000 + sum(len(r) for r in expected[:i]) for i in range(4)]
    assert batch.sizes == [len(r) for r in expected]
    assert batch.tags_codes == [tags_hash_code(m.properties.get("TAGS")) for m in msgs]
    assert [encoder.message_id(o) for o in offsets] == [create_message_id(store_host, o) for o in offsets]
    # One record at a time takes the per-record path: same bytes.
    for i, m in enumerate(msgs):
        one = encoder.prepare([m])
        out = bytearray(one.total)
        assert encoder.write_into(out, 0, one, 40 + i, offsets[i], 123) == [offsets[i]]
        assert bytes(out) == expected[i]
    # Again with the cached batch layout (same shape), other offsets.
    again = bytearray(batch.total)
    encoder.write_into(again, 0, encoder.prepare(msgs), 40, 5000, 123)
    assert bytes(again) == b"".join(expected)


def test_record_encoder_refuses_what_encode_message_refuses():
    encoder = RecordEncoder(("127.0.0.1", 1), max_size=10)
    with pytest.raises(MessageTooLargeError, match="body"):
        encoder.prepare([MessageInner(topic="t", body=b"x" * 11)])
    with pytest.raises(MessageTooLargeError, match="topic"):
        encoder.prepare([MessageInner(topic="t" * 128, body=b"")])
    with pytest.raises(MessageTooLargeError, match="properties"):
        RecordEncoder(("127.0.0.1", 1)).prepare(
            [MessageInner(topic="t", body=b"", properties={"k": "v" * 40000})]
        )
    with pytest.raises(ValueError):
        encoder.prepare([MessageInner(topic="t", body=b"", born_host=("not-an-ip", 1))])
