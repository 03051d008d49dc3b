"""The send lane's compiled wire ends (issue 38) against the codec, their reference.

``take_frames`` must read a send frame exactly as :class:`~tidemq.remoting.FrameDecoder` does
(``command_of`` of what it took equals the decoder's command) and take only plain send requests,
stopping at the first frame it does not take; ``answer_frames`` must write, byte for byte, what
``encode(send_response(request, send))`` writes, or answer None.  Both serialize types, odd
headers (strings for numbers, nulls, non-ASCII, escapes), truncated and corrupted bytes.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.broker.processors.send import send_response
from tidemq.broker.services.put import STORED, Send
from tidemq.broker.services.status import Status
from tidemq.message import MessageInner
from tidemq.remoting import FrameDecoder, RemotingCommand
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import RequestCode, SerializeType

frame_lane = pytest.importorskip("tidemq._native._frame_lane")

SEND_CODES = {
    int(RequestCode.SEND_MESSAGE),
    int(RequestCode.SEND_MESSAGE_V2),
    int(RequestCode.SEND_BATCH_MESSAGE),
}
MAX_FRAME = 1 << 20
TEXT = st.text(st.characters(codec="utf-8"), max_size=6) | st.sampled_from(
    ["", "a", "TagA", "é", '"\\', "\x01\x02"]
)
CODES = st.sampled_from([310, 310, 320, 10, 11, 34, 0, -1, 32767])


@st.composite
def commands(draw: st.DrawFn) -> RemotingCommand:
    return RemotingCommand(
        draw(CODES),
        draw(st.sampled_from(["JAVA", "CPP", "PYTHON", "GO"])),
        draw(st.sampled_from([0, 63, 399, 32767, -5])),
        draw(st.sampled_from([0, 1, 7, 2**31 - 1, -(2**31), 123456])),
        draw(st.sampled_from([0, 0, 0, 1, 2, 3])),
        draw(st.none() | TEXT),
        draw(st.dictionaries(TEXT, TEXT, max_size=4)),
        draw(st.none() | st.binary(max_size=20)),
        (),
        draw(st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ])),
    )


def _json_frame(header: bytes, body: bytes = b"") -> bytes:
    return (4 + len(header) + len(body)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header + body


#: JSON headers the decoder's slow path reads, or refuses: the lane must leave them to it.
ODD_HEADERS = [
    b'{"code":"310","opaque":1,"flag":0,"extFields":{}}',
    b'{"code":310,"opaque":"1","flag":0,"extFields":{}}',
    b'{"code":310,"opaque":1,"flag":0,"extFields":null}',
    b'{"code":310,"opaque":1,"flag":0,"extFields":{"b":"T","x":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}',
    b'{"code":310,"opaque":1,"flag":0}',
    b'{"code":310,"opaque":1,"flag":0,"language":3,"extFields":{}}',
    b'{"code":310,"opaque":1,"flag":0,"remark":5,"extFields":{}}',
    b'{"code":310,"opaque":4294967296,"flag":0,"extFields":{}}',
    b'{"code":310,"opaque":1,"flag":true,"extFields":{}}',
    b"[310]",
    b"{not json",
    b'{"code":310,"opaque":1,"flag":0,"extFields":{"b":"\\u00e9\\ud800"}}',
]


def _check(data: bytes) -> None:
    frames, end = frame_lane.take_frames(data, MAX_FRAME)
    assert 0 <= end <= len(data)
    assert (end == 0) == (not frames)
    if not frames:
        return
    decoded = FrameDecoder(MAX_FRAME).feed(data[:end])
    assert [frame_lane.command_of(f) for f in frames] == decoded
    for cmd in decoded:
        assert cmd.code in SEND_CODES and cmd.flag == 0 and -(2**31) <= cmd.opaque < 2**31


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(commands(), min_size=1, max_size=5), st.sampled_from([None, None, 0, 3, 9, -1, -7]), st.data()
)
def test_take_frames_reads_what_the_decoder_reads(cmds: list[RemotingCommand], cut: int | None, data) -> None:
    raw = bytearray(b"".join(encode_bytes(c) for c in cmds))
    if data.draw(st.booleans()) and raw:  # one byte changed somewhere
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    blob = bytes(raw if cut is None else raw[:cut])
    _check(blob)
    frames, end = frame_lane.take_frames(blob, MAX_FRAME)
    if cut is None and not any(
        b != a for a, b in zip(raw, b"".join(encode_bytes(c) for c in cmds), strict=True)
    ):
        # Unchanged bytes: it takes exactly the leading plain send requests.
        plain = 0
        for c in cmds:
            if c.code not in SEND_CODES or c.flag != 0:
                break
            plain += 1
        assert len(frames) == plain


#: Unusual but on the decoder's fast path: taken, read alike (the later of two keys wins; defaults).
TAKEN_HEADERS = [
    b'{"code":310,"opaque":1,"flag":0,"extFields":{"b":"T"},"extFields":{"b":"U"}}',
    b'{"code":310,"extFields":{"b":"T"}}',
    b'{"extFields":{"b":"T"},"code":320,"language":"","remark":"\\u00e9","version":-1}',
    # values other than strings (rocketmq-client-cpp writes numbers when it signs a request):
    # made strings as the decoder makes them
    b'{"code":310,"opaque":1,"flag":0,"extFields":{"a":1}}',
    b'{"code":10,"extFields":{"queueId":0,"flag":-3,"sysFlag":0,"topic":"T"},"flag":0,"opaque":1}\n',
    b'{"code":310,"extFields":{"k":true,"m":false,"n":null,"f":1.5,"e":1e300,"o":{"x":[1,"y"]}}}',
]


@pytest.mark.parametrize("header", TAKEN_HEADERS)
def test_unusual_fast_path_headers_are_taken_alike(header: bytes) -> None:
    data = _json_frame(header, b"body")
    frames, end = frame_lane.take_frames(data, MAX_FRAME)
    assert end == len(data) and len(frames) == 1
    _check(data)


@pytest.mark.parametrize("header", ODD_HEADERS)
def test_odd_json_headers_are_the_decoders(header: bytes) -> None:
    good = encode_bytes(RemotingCommand(310, opaque=9, ext_fields={"b": "T"}, body=b"x"))
    data = good + _json_frame(header, b"body") + good
    frames, end = frame_lane.take_frames(data, MAX_FRAME)
    _check(data)
    assert end == len(good) and len(frames) == 1  # stops at the odd frame: the decoder answers it


def test_frames_over_the_limit_or_partial_are_left_to_the_decoder() -> None:
    good = encode_bytes(RemotingCommand(310, opaque=9, ext_fields={"b": "T"}, body=b"x" * 100))
    assert frame_lane.take_frames(good, 50) == ([], 0)
    assert frame_lane.take_frames(good[:-1], MAX_FRAME) == ([], 0)
    frames, end = frame_lane.take_frames(good + good[:10], MAX_FRAME)
    assert len(frames) == 1 and end == len(good)
    assert frame_lane.take_frames(b"\x00\x00\x00\x02\x00\x00", MAX_FRAME) == ([], 0)
    assert frame_lane.take_frames(b"", MAX_FRAME) == ([], 0)


# --------------------------------------------------------------------------- answers
def _send(
    status: Status, remark: str | None, epoch: int | None, region: str | None, trace: str | None
) -> Send:
    props = {"UNIQ_KEY": "K"}
    if region is not None:
        props["MSG_REGION"] = region
    if trace is not None:
        props["TRACE_ON"] = trace
    msg = MessageInner("T", b"x", 1, 0, props, 0, 0, ("127.0.0.1", 1), ("127.0.0.1", 2), 0)
    send = Send("PG", [msg], False, None, 3, 1)
    send.status, send.remark, send.epoch = status, remark, epoch
    send.msg_id, send.queue_offset = "7F00000100002A9F0000000000001234", 41
    send.recall_handle = None
    return send


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(
            commands(),
            st.sampled_from(list(Status)),
            st.none() | TEXT,
            st.none() | st.sampled_from([0, 7, 2**40]),
            st.none() | TEXT,
            st.none() | TEXT,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_answer_frames_write_what_send_response_encodes(items) -> None:
    frames, sends, expected = [], [], []
    for cmd, status, remark, epoch, region, trace in items:
        cmd.code, cmd.flag = 310, 0
        (frame,), _ = frame_lane.take_frames(encode_bytes(cmd), MAX_FRAME)
        send = _send(status, remark, epoch, region, trace)
        frames.append(frame)
        sends.append(send)
        response = send_response(frame_lane.command_of(frame), send)
        try:
            expected.append(encode_bytes(response))
        except Exception:  # the codec refuses it (a lone surrogate): the lane must not write it
            expected.append(None)
    got = frame_lane.answer_frames(frames, sends)
    if got is None:  # allowed only for what the lane leaves to send_response
        assert any(e is None or s.status not in STORED for e, s in zip(expected, sends, strict=True))
        return
    assert None not in expected
    assert got == b"".join(expected)


def test_answers_of_both_serialize_types_and_odd_strings() -> None:
    for stype in (SerializeType.JSON, SerializeType.ROCKETMQ):
        for region, remark in (("DefaultRegion", None), ('re"g\\ion\n', "é"), ("\x7f", ""), ("区域", "x")):
            cmd = RemotingCommand(310, opaque=-5, ext_fields={"b": "T"}, serialize_type=stype)
            (frame,), _ = frame_lane.take_frames(encode_bytes(cmd), MAX_FRAME)
            send = _send(Status.FLUSH_DISK_TIMEOUT, remark, 3, region, None)
            assert frame_lane.answer_frames([frame], [send]) == encode_bytes(send_response(cmd, send))
    send = _send(Status.SUCCESS, None, None, None, None)
    send.recall_handle = "h"
    (frame,), _ = frame_lane.take_frames(encode_bytes(RemotingCommand(310, opaque=1)), MAX_FRAME)
    assert frame_lane.answer_frames([frame], [send]) is None  # a parked timer's answer: send_response's
    assert orjson.loads(encode_bytes(send_response(frame_lane.command_of(frame), send))[8:])["code"] == 0


class _OtherSend(Send):
    """Not ``Send`` itself: the answer reads its fields by attribute, not by slot offset."""

    __slots__ = ()


def test_answers_read_a_sends_slots_as_its_attributes() -> None:
    cmd = RemotingCommand(310, opaque=9, ext_fields={"b": "T"})
    (frame,), _ = frame_lane.take_frames(encode_bytes(cmd), MAX_FRAME)
    for status, remark, epoch in ((Status.SUCCESS, None, None), (Status.FLUSH_SLAVE_TIMEOUT, "late", 4)):
        direct = _send(status, remark, epoch, "R", "false")
        other = _send(status, remark, epoch, "R", "false")
        other.__class__ = _OtherSend
        expected = encode_bytes(send_response(cmd, direct))
        assert frame_lane.answer_frames([frame], [direct]) == expected
        assert frame_lane.answer_frames([frame], [other]) == expected
    for cls in (Send, _OtherSend):
        send = _send(Status.SUCCESS, None, None, None, None)
        send.__class__ = cls
        send.msg_id = 7  # type: ignore[assignment]  # not text: send_response's to answer
        assert frame_lane.answer_frames([frame], [send]) is None
    unset = _send(Status.SUCCESS, None, None, None, None)
    del unset.queue_offset  # not settled: the attribute's error, as before
    with pytest.raises(AttributeError):
        frame_lane.answer_frames([frame], [unset])


# ------------------------------------------------------------------ the header's own JSON reader
#: Headers the compiled reader must leave to orjson (None) or read as orjson does.
HEADER_CASES = [
    b'{"code":310,"language":"JAVA","version":399,"opaque":5,"flag":0,"extFields":{"a":"PG","i":"WAIT\\u0001true\\u0002"}}',
    b'{"code":310,"extFields":{}}',
    b'{"extFields":{"b":"T"},"code":320,"opaque":-7,"remark":"r\\"\\\\\\/\\b\\f\\n\\r\\t"}',
    b'{"code":310,"extFields":{"a":"\xc3\xa9","\xc3\xa9":"\\u00e9"}}',  # \u00e9: orjson's
    b'{"code":310,"extFields":{"a":"\\ud83d\\ude00"}}',
    b'{"code":310,"extFields":{"a":"x","a":"y"}}',  # a repeated ext name: the last value
    b'{"code":310,"code":310,"extFields":{}}',
    b'{"code":310, "extFields":{}}',
    b'{"code":310,"extFields":{}} ',
    b'{"code":0310,"extFields":{}}',
    b'{"code":310.0,"extFields":{}}',
    b'{"code":3e2,"extFields":{}}',
    b'{"code":-0,"flag":-0,"extFields":{}}',
    b'{"code":310,"opaque":2147483648,"extFields":{}}',
    b'{"code":310,"opaque":99999999999999999999,"extFields":{}}',
    b'{"code":310,"remark":null,"extFields":{}}',
    b'{"code":310,"extFields":{"a":"\xed\xa0\x80"}}',  # a UTF-8 surrogate
    b'{"code":310,"extFields":{"a":"\x01"}}',  # a raw control byte
    b'{"code":310,"extFields":{"a":"\\x"}}',
    b'{"code":310,"extFields":{"a":"\\u00"}}',
    b'{"code":310,"extFields":{"a":"b"',
    b'{"code":310,"other":1,"extFields":{}}',
    b'{"code":"310","extFields":{}}',
    b'{"code":11,"extFields":{}}',
    b'{"code":310,"flag":1,"extFields":{}}',
    b"{}",
    b"",
]


def _same(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return list(a.items()) == list(b.items()) and all(
            type(x) is type(y) for x, y in zip(a.items(), b.items(), strict=True)
        )
    if isinstance(a, tuple):
        assert isinstance(b, tuple)
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("header", HEADER_CASES)
def test_header_reader_reads_as_orjson_or_leaves_it(header: bytes) -> None:
    fast = frame_lane.fast_header(header)
    if fast is not None:
        assert _same(fast, frame_lane.orjson_header(header))


def test_header_reader_reads_the_official_clients_header() -> None:
    """The common header is read without orjson (else the reader would save nothing)."""
    header = HEADER_CASES[0]
    assert frame_lane.fast_header(header) is not None
    assert frame_lane.fast_header(HEADER_CASES[2]) is not None  # every escape JSON has
    assert frame_lane.fast_header(HEADER_CASES[3]) is None  # \u00e9: left to orjson


@given(commands())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_header_reader_on_the_codecs_headers(cmd: RemotingCommand) -> None:
    """orjson's own headers (any text: raw UTF-8, escaped control characters) are read here, as
    orjson reads them; those the lane does not take, by neither."""
    header = orjson.dumps(
        {
            "code": cmd.code,
            "language": cmd.language,
            "version": cmd.version,
            "opaque": cmd.opaque,
            "flag": cmd.flag,
            **({"remark": cmd.remark} if cmd.remark is not None else {}),
            "extFields": cmd.ext_fields,
        }
    )
    fast = frame_lane.fast_header(header)
    ref = frame_lane.orjson_header(header)
    assert (fast is None) == (ref is None)
    if fast is not None:
        assert _same(fast, ref)


def test_header_reader_repeats_only_equal_values() -> None:
    """A one-character name's value equal to the last one read is that string again; a value of the
    same length but other bytes, or with escapes, is read anew."""
    values = ["TopicA", "TopicB", "TopicA", "Topi\\u0063A", "T\xc3\xa9picA", "TopicA", "x" * 70, "x" * 70]
    for value in values:
        header = b'{"code":310,"extFields":{"b":"' + value.encode("latin-1") + b'"}}'
        fast = frame_lane.fast_header(header)
        ref = frame_lane.orjson_header(header)
        assert ref is not None and fast is not None, header
        assert _same(fast, ref)
