"""The sans-IO codec: round trips, exact bytes, malformed input and fuzzing."""

from __future__ import annotations

import struct

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.remoting import (
    FrameDecoder,
    FrameError,
    HeaderError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
    encode,
)
from tidemq.remoting.codec import decode_frame, encode_bytes


def frame(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


@pytest.mark.parametrize("stype", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_round_trip_request_and_reply(stype: SerializeType) -> None:
    req = RemotingCommand.request(
        RequestCode.SEND_MESSAGE_V2,
        {"a": "TopicTest", "e": 3, "k": "值"},
        b"\x00body\xff",
        serialize_type=stype,
    )
    req.remark = "héllo"
    got = decode_frame(encode_bytes(req))
    assert got == req
    assert got.ext_fields == {"a": "TopicTest", "e": "3", "k": "值"}
    resp = got.reply(ResponseCode.TOPIC_NOT_EXIST, remark="no route", ext_fields={"queueOffset": 12})
    back = decode_frame(encode_bytes(resp))
    assert back.is_response and not back.is_oneway
    assert (back.opaque, back.code, back.serialize_type) == (req.opaque, 17, stype)
    assert back.ext_fields == {"queueOffset": "12"} and back.remark == "no route" and back.body is None


def test_opaques_are_fresh_and_positive() -> None:
    a, b = RemotingCommand.request(10), RemotingCommand.request(10)
    assert 0 < a.opaque < b.opaque < 2**31


def test_oneway_flag_round_trips() -> None:
    cmd = RemotingCommand.request(RequestCode.HEART_BEAT).mark_oneway()
    got = decode_frame(encode_bytes(cmd))
    assert got.is_oneway and not got.is_response and got.flag == 2


def test_exact_rocketmq_binary_layout() -> None:
    cmd = RemotingCommand(
        code=105,
        language="JAVA",
        version=1,
        opaque=7,
        flag=2,
        ext_fields={"k": "v"},
        body=b"hi",
        serialize_type=SerializeType.ROCKETMQ,
    )
    expected = bytes.fromhex(
        "00000023"
        "0100001d"  # total length 35, serialize type 1 + header length 29
        "0069"
        "00"
        "0001"
        "00000007"
        "00000002"  # code, JAVA, version, opaque, flag
        "00000000"  # no remark
        "00000008"
        "0001"
        "6b"
        "00000001"
        "76"  # extFields {"k": "v"}
        "6869"  # body
    )
    assert encode_bytes(cmd) == expected
    assert decode_frame(expected) == cmd


def test_exact_json_layout() -> None:
    cmd = RemotingCommand(code=105, language="JAVA", version=0, opaque=7, flag=0, ext_fields={"topic": "T"})
    header = b'{"code":105,"language":"JAVA","version":0,"opaque":7,"flag":0,"extFields":{"topic":"T"}}'
    assert encode_bytes(cmd) == struct.pack(">II", 4 + len(header), len(header)) + header


def test_cpp_client_header_with_numeric_ext_values_is_normalised() -> None:
    # rocketmq-client-cpp writes some header fields as JSON numbers and remark as "".
    header = orjson.dumps(
        {
            "code": 11,
            "language": "CPP",
            "version": 0,
            "opaque": 3,
            "flag": 0,
            "remark": "",
            "extFields": {"queueId": 2, "maxMsgNums": 32, "topic": "T", "AccessKey": "", "x": None},
        }
    )
    cmd = decode_frame(frame(header))
    assert cmd.ext_fields == {"queueId": "2", "maxMsgNums": "32", "topic": "T", "AccessKey": ""}
    assert cmd.language == "CPP" and cmd.serialize_type == SerializeType.JSON


def test_zero_copy_body_parts_are_passed_through() -> None:
    store_buffer = bytearray(b"x" * 100_000)
    part = memoryview(store_buffer)[10:50_010]
    cmd = RemotingCommand(code=0, flag=1, body=b"head", body_parts=(part,))
    chunks = encode(cmd)
    assert chunks[-1] is part  # written as is, never copied
    got = decode_frame(b"".join(chunks))
    assert got.body == b"head" + b"x" * 50_000
    assert cmd.body_size == 50_004


def test_many_frames_in_one_feed_and_split_feeds() -> None:
    cmds = [RemotingCommand.request(10, {"i": i}, bytes([i]) * i or None) for i in range(50)]
    stream = b"".join(encode_bytes(c) for c in cmds)
    assert FrameDecoder().feed(stream) == cmds
    dec = FrameDecoder()
    out = []
    for i in range(0, len(stream), 7):
        out += dec.feed(stream[i : i + 7])
    assert out == cmds and dec.buffered == 0


@pytest.mark.parametrize(
    "data, match",
    [
        (struct.pack(">I", 2) + b"\x00\x00", "too small"),
        (struct.pack(">I", 2**31), "over max_frame_size"),
        (struct.pack(">II", 8, 5 << 24) + b"abcd", "unknown serialize type 5"),
        (struct.pack(">II", 8, 100) + b"abcd", "header length 100 exceeds"),
    ],
)
def test_broken_frames_raise_frame_error(data: bytes, match: str) -> None:
    dec = FrameDecoder()
    with pytest.raises(FrameError, match=match):
        dec.feed(data)
    with pytest.raises(FrameError):  # the stream cannot be resynchronised
        dec.feed(encode_bytes(RemotingCommand.request(10)))


def test_oversize_frame_is_refused_before_it_is_buffered() -> None:
    dec = FrameDecoder(max_frame_size=1024)
    big = encode_bytes(RemotingCommand.request(10, body=b"x" * 2000))
    with pytest.raises(FrameError, match="over max_frame_size 1024"):
        dec.feed(big[:8])


@pytest.mark.parametrize(
    "header, opaque",
    [
        (b"{not json", None),
        (b"[1,2]", None),
        (b'{"opaque":9,"flag":0}', 9),  # no code
        (b'{"code":10,"opaque":4,"extFields":[1]}', 4),
        (b'{"code":"ten","opaque":5}', 5),
    ],
)
def test_bad_json_header_raises_header_error_and_keeps_stream(header: bytes, opaque: int | None) -> None:
    good = RemotingCommand.request(10, {"a": 1})
    dec = FrameDecoder()
    with pytest.raises(HeaderError) as info:
        dec.feed(frame(header))
    assert info.value.opaque == opaque
    assert dec.feed(encode_bytes(good)) == [good]


def test_bad_binary_header_raises_header_error() -> None:
    fixed = struct.pack(">hBhii", 10, 0, 1, 42, 0)
    bad = fixed + struct.pack(">i", 1000) + struct.pack(">i", 0)
    with pytest.raises(HeaderError, match="remark length 1000") as info:
        FrameDecoder().feed(frame(bad, stype=1))
    assert info.value.opaque == 42


def test_header_error_between_good_frames_loses_nothing() -> None:
    a, b = RemotingCommand.request(10), RemotingCommand.request(11)
    stream = encode_bytes(a) + frame(b'{"opaque":5}') + encode_bytes(b)
    dec = FrameDecoder()
    assert dec.feed(stream) == [a]
    assert dec.error_pending
    with pytest.raises(HeaderError):
        dec.feed(b"")
    assert dec.feed(b"") == [b]


_commands = st.builds(
    RemotingCommand,
    code=st.integers(-32768, 32767),
    language=st.sampled_from(["JAVA", "CPP", "PYTHON", "GO"]),
    version=st.integers(-32768, 32767),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(0, 3),
    remark=st.none() | st.text(min_size=1, max_size=20),
    ext_fields=st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=5),
    body=st.none() | st.binary(min_size=1, max_size=200),
    serialize_type=st.sampled_from(list(SerializeType)),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cmds=st.lists(_commands, min_size=1, max_size=5), cuts=st.lists(st.integers(0, 5000), max_size=10))
def test_valid_frames_split_anywhere_decode_identically(cmds: list[RemotingCommand], cuts: list[int]) -> None:
    stream = b"".join(encode_bytes(c) for c in cmds)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    dec = FrameDecoder()
    out = []
    prev = 0
    for p in [*points, len(stream)]:
        out += dec.feed(stream[prev:p])
        prev = p
    assert out == cmds and dec.buffered == 0


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=6))
def test_random_bytes_raise_only_typed_errors(data: bytes, cuts: list[int]) -> None:
    dec = FrameDecoder(max_frame_size=4096)
    prev = 0
    for p in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        try:
            dec.feed(data[prev:p])
        except HeaderError:
            pass
        except FrameError:
            break
        prev = p


@settings(max_examples=300, deadline=None)
@given(header=st.binary(max_size=120), body=st.binary(max_size=20), stype=st.integers(0, 1))
def test_random_headers_in_valid_frames_raise_only_header_error(
    header: bytes, body: bytes, stype: int
) -> None:
    try:
        cmds = FrameDecoder().feed(frame(header, body, stype))
    except HeaderError:
        return
    assert len(cmds) == 1 and cmds[0].payload() == body
