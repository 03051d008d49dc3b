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
    ProtocolError,
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


# --------------------------------------------------------------------------- hostile input (issue 20.8)


def nested(depth: int) -> bytes:
    """A JSON value nested ``depth`` arrays/objects deep."""
    return (
        b'{"a":' * (depth // 2)
        + b"[" * (depth - depth // 2)
        + b"]" * (depth - depth // 2)
        + b"}" * (depth // 2)
    )


@pytest.mark.parametrize("depth", [255, 256, 300, 511, 1000, 1022])
@pytest.mark.parametrize("where", ["extFields", "remark"])
def test_deeply_nested_header_values_raise_header_error(depth: int, where: str) -> None:
    # orjson.loads accepts 1024 levels but orjson.dumps only 254: the re-encoding of a nested value
    # raised orjson's TypeError out of feed.
    value = nested(depth)
    if where == "extFields":
        header = b'{"code":10,"opaque":31,"flag":0,"extFields":{"k":' + value + b"}}"
    else:
        header = b'{"code":10,"opaque":31,"flag":0,"remark":' + value + b"}"
    good = RemotingCommand.request(10)
    dec = FrameDecoder()
    with pytest.raises(HeaderError, match="nested") as info:
        dec.feed(frame(header))
    assert (info.value.opaque, info.value.code) == (31, 10)  # answerable
    assert dec.feed(encode_bytes(good)) == [good]


def test_nesting_orjson_can_re_encode_is_kept_as_a_json_string() -> None:
    header = b'{"code":10,"opaque":3,"extFields":{"k":' + nested(250) + b"}}"
    cmd = decode_frame(frame(header))
    assert orjson.loads(cmd.ext_fields["k"]) == orjson.loads(nested(250))


def test_nesting_orjson_cannot_parse_is_an_unanswerable_header_error() -> None:
    with pytest.raises(HeaderError, match="not valid JSON") as info:
        FrameDecoder().feed(frame(b'{"code":10,"opaque":3,"extFields":{"k":' + nested(1100) + b"}}"))
    assert info.value.opaque is None


@pytest.mark.parametrize(
    "bad",
    [
        struct.pack(">I", 2**31),  # over max_frame_size
        struct.pack(">I", 2) + b"\x00\x00",  # too small
        struct.pack(">II", 8, 7 << 24) + b"abcd",  # unknown serialize type
        struct.pack(">II", 8, 100) + b"abcd",  # header longer than the frame
    ],
)
def test_frame_error_after_good_frames_hands_the_good_ones_over_first(bad: bytes) -> None:
    a, b = RemotingCommand.request(10, {"i": 1}), RemotingCommand.request(11, body=b"x" * 100)
    dec = FrameDecoder()
    assert dec.feed(encode_bytes(a) + encode_bytes(b) + bad) == [a, b]
    assert dec.error_pending and dec.buffered == 0
    with pytest.raises(FrameError):
        dec.feed(b"")
    with pytest.raises(FrameError):  # still broken
        dec.feed(encode_bytes(a))


def test_frame_error_after_a_buffered_partial_frame_hands_it_over_first() -> None:
    a = encode_bytes(RemotingCommand.request(10, body=b"y" * 500))
    dec = FrameDecoder()
    assert dec.feed(a[:100]) == []
    got = dec.feed(a[100:] + b"\xff" * 8)
    assert [c.body for c in got] == [b"y" * 500] and dec.error_pending
    with pytest.raises(FrameError, match="over max_frame_size"):
        dec.feed(b"")


def test_decode_frame_refuses_trailing_garbage() -> None:
    with pytest.raises(FrameError):
        decode_frame(encode_bytes(RemotingCommand.request(10)) + b"\xff" * 8)


@pytest.mark.parametrize("field", ["opaque", "code", "flag", "version"])
@pytest.mark.parametrize("value", [b'"99999999999999999999999"', b'"2147483648"', b'"-2147483649"'])
def test_header_ints_outside_the_java_int_range_are_refused(field: str, value: bytes) -> None:
    # RocketMQ's header fields are Java ints; a numeric string beyond them decoded to a Python int
    # that the response (echoing the opaque) could not re-encode.
    fields = {"code": b"10", "opaque": b"5", "flag": b"0", "version": b"1"}
    fields[field] = value
    header = b"{" + b",".join(b'"%s":%s' % (k.encode(), v) for k, v in fields.items()) + b"}"
    with pytest.raises(HeaderError, match=field) as info:
        FrameDecoder().feed(frame(header))
    assert info.value.opaque == (None if field == "opaque" else 5)


def test_encoding_errors_are_protocol_errors() -> None:
    surrogate = RemotingCommand(code=0, flag=1, ext_fields={"k": "\ud800"})
    with pytest.raises(ProtocolError):
        encode(surrogate)
    surrogate.serialize_type = SerializeType.ROCKETMQ
    with pytest.raises(ProtocolError):
        encode(surrogate)
    long_key = RemotingCommand(code=0, ext_fields={"k" * 40000: "v"}, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(ProtocolError):
        encode(long_key)
    with pytest.raises(ProtocolError):
        encode(RemotingCommand(code=0, opaque=2**70))


def test_held_counts_the_allocation_of_a_partial_frame_and_drops_to_zero() -> None:
    whole = encode_bytes(RemotingCommand.request(10, body=b"z" * 100_000))
    dec = FrameDecoder()
    assert dec.held == 0
    dec.feed(whole[:10])
    for i in range(10, len(whole) - 7000, 7000):
        dec.feed(whole[i : i + 7000])
        assert dec.held >= dec.buffered > 0
    assert dec.feed(whole[dec.buffered :])[0].body == b"z" * 100_000
    assert dec.held == 0 and dec.buffered == 0
    dec.feed(whole[:50_000])
    dec.close()  # a closed connection's decoder gives its memory back and refuses more
    assert dec.held == 0
    with pytest.raises(FrameError):
        dec.feed(whole)


_SEEDS = [
    encode_bytes(
        RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "g", "b": "T", "e": 1}, b"b" * 40)
    ),
    encode_bytes(RemotingCommand.request(10, {"k": "v"}, serialize_type=SerializeType.ROCKETMQ)),
    frame(b'{"code":11,"opaque":9,"flag":0,"extFields":{"n":1,"o":{"p":[1,2]}},"remark":[1]}'),
]
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


@st.composite
def hostile_frames(draw: st.DrawFn) -> bytes:
    """Valid frames mutated: flipped bytes, cut or spliced frames, nested or odd header values."""
    kind = draw(st.sampled_from(["flip", "cut", "splice", "nest", "fields"]))
    data = bytearray(draw(st.sampled_from(_SEEDS)))
    if kind == "flip":
        for pos in draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=4)):
            data[pos] = draw(st.integers(0, 255))
    elif kind == "cut":
        data = data[: draw(st.integers(0, len(data)))] + draw(st.sampled_from(_SEEDS))
    elif kind == "splice":
        data += draw(st.binary(max_size=40))
    elif kind == "nest":
        depth = draw(st.integers(200, 1100))
        where = draw(st.sampled_from([b'"remark":', b'"extFields":{"k":', b'"code":']))
        close = b"}" if where.endswith(b':{"k":') else b""
        data = bytearray(frame(b'{"opaque":4,' + where + nested(depth) + close + b',"code":10}'))
    else:
        obj = {
            k: draw(_json_values)
            for k in draw(st.lists(st.sampled_from(["code", "opaque", "flag", "version", "language"])))
        }
        obj["extFields"] = draw(st.dictionaries(st.text(max_size=3), _json_values, max_size=3))
        obj["remark"] = draw(_json_values | st.integers(-(2**80), 2**80).map(str))
        try:
            data = bytearray(frame(orjson.dumps(obj)))
        except orjson.JSONEncodeError:
            data = bytearray(frame(str(obj).encode()))
    return bytes(data)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=hostile_frames(), cuts=st.lists(st.integers(0, 3000), max_size=4))
def test_hostile_frames_raise_only_protocol_errors_and_decode_to_answerable_commands(
    data: bytes, cuts: list[int]
) -> None:
    dec = FrameDecoder(max_frame_size=4096)
    prev = 0
    for p in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        chunk, prev = data[prev:p], p
        while True:
            try:
                cmds = dec.feed(chunk)
            except HeaderError:
                cmds = []
            except FrameError:
                return
            for cmd in cmds:
                # whatever decodes can be answered: the reply echoes the opaque and serialize type
                encode(cmd.reply(ResponseCode.SYSTEM_ERROR, remark="x"))
            if not dec.error_pending:
                break
            chunk = b""


@pytest.mark.parametrize(
    "error", [TypeError("t"), RecursionError("r"), struct.error("s"), OverflowError("o")]
)
def test_any_failure_of_a_header_decoder_leaves_feed_as_a_header_error(
    error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The guard behind the checks: whatever a header decoder still raises on input it did not foresee
    # leaves feed as a HeaderError (no opaque: the connection is closed), and the stream stays usable.
    import tidemq.remoting.codec as codec

    def broken(header: bytes) -> RemotingCommand:
        raise error

    good = RemotingCommand.request(10)
    monkeypatch.setattr(codec, "decode_json_header", broken)
    dec = FrameDecoder()
    assert dec.feed(encode_bytes(RemotingCommand.request(11, serialize_type=SerializeType.ROCKETMQ)))
    with pytest.raises(HeaderError, match=type(error).__name__) as info:
        dec.feed(encode_bytes(good))
    assert info.value.opaque is None
    monkeypatch.undo()
    assert dec.feed(encode_bytes(good)) == [good]


def test_null_header_ints_take_their_defaults() -> None:
    """``"flag": null`` must not decode to a command whose flag is None (the transport tests its bits)."""
    from tidemq.remoting.codec import decode_json_header

    cmd = decode_json_header(b'{"code":10,"flag":null,"opaque":null,"version":null,"extFields":{"a":1}}')
    assert (cmd.code, cmd.flag, cmd.opaque, cmd.version) == (10, 0, 0, 0)
    with pytest.raises(HeaderError, match="code"):
        decode_json_header(b'{"code":null,"opaque":5}')
