"""The compiled codec (the ``tidemq._native`` modules) against the pure-Python reference (``tidemq.record``).

Differential, property-based: for random valid inputs both produce the same bytes (records,
offsets, message ids, consume-queue inputs) and the same decoded objects; for malformed or
unusual inputs both refuse with the same exception type and message.  Skipped when the extension
is not built, unless ``TIDEMQ_REQUIRE_EXTENSIONS=1`` (CI): then missing it fails.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tidemq.record as ref
from tidemq import _native
from tidemq.message import BatchItem, MessageExt, MessageInner, py_create_message_id

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = os.environ.get("TIDEMQ_REQUIRE_EXTENSIONS", "") not in ("", "0")
# Directly, whatever TIDEMQ_NO_EXTENSIONS selects for tidemq.message: every compiled module's names.
_codec: Any = _native.load_all()
_missing = "" if _codec is not None else "a tidemq._native module does not import"

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def C() -> ModuleType:
    if _codec is None:
        if REQUIRED:
            pytest.fail(f"TIDEMQ_REQUIRE_EXTENSIONS is set but the compiled codec is missing: {_missing}")
        pytest.skip(f"the compiled codec is not built ({_missing}): pip install -e . with a C compiler")
    return _codec


@pytest.fixture(autouse=True)
def _no_disagreement() -> Any:
    """After every test: the compiled code never refused what the reference accepted."""
    before = _codec.disagreements() if _codec is not None else 0
    yield
    if _codec is not None:
        assert _codec.disagreements() == before, "the compiled code refused input the reference accepts"


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple:
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - the exception is the outcome compared
        return ("error", type(exc), str(exc))


# ---------------------------------------------------------------------------- strategies

texts = st.text(max_size=12)
ascii_texts = st.text(alphabet="abcXYZ019 _-%", max_size=12)
prop_dicts = st.dictionaries(st.one_of(ascii_texts, texts), st.one_of(ascii_texts, texts), max_size=5)
ipv4 = st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), st.integers(0, 255)).map(
    lambda t: ".".join(map(str, t))
)
ips = st.one_of(ipv4, st.sampled_from(["::1", "fe80::2", "::ffff:10.0.0.8", "2001:db8::ff00:42:8329", "::"]))
hosts = st.tuples(ips, st.integers(-(2**31), 2**31 - 1))
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def batches(draw: Any, valid: bool = True) -> list[MessageInner]:
    """Messages for one put: shared topic/properties/host objects (the encoder caches by identity)."""
    topic = draw(
        st.text(alphabet="abcXYZ%_-0123\u00e9", min_size=1, max_size=40) if valid else st.text(max_size=140)
    )
    shared_props = draw(prop_dicts)
    born = draw(hosts)
    msgs = []
    for _ in range(draw(st.integers(0 if not valid else 1, 8))):
        props = shared_props if draw(st.booleans()) else draw(prop_dicts)
        if not valid and draw(st.integers(0, 9)) == 0:
            props = {**props, "n": draw(st.integers())}  # the reference prints non-str values
        msgs.append(
            MessageInner(
                topic=topic if draw(st.integers(0, 5)) else draw(st.sampled_from([topic, "other"])),
                body=draw(st.binary(max_size=300)),
                queue_id=draw(int32 if valid else st.integers(-(2**33), 2**33)),
                flag=draw(int32 if valid else st.integers(-(2**33), 2**33)),
                properties=props,
                sys_flag=draw(st.integers(0, 2**31 - 1) if valid else st.integers(-(2**40), 2**40)),
                born_timestamp=draw(int64 if valid else st.integers(-(2**64), 2**64)),
                born_host=born if draw(st.booleans()) else draw(hosts),
                reconsume_times=draw(int32 if valid else st.integers(-(2**33), 2**33)),
                prepared_transaction_offset=draw(int64 if valid else st.integers(-(2**64), 2**64)),
            )
        )
    return msgs


def encode_both(C: ModuleType, store_host: tuple, msgs: list, max_size: int, where: tuple) -> tuple:
    out = []
    for cls in (C.RecordEncoder, ref.RecordEncoder):
        try:
            enc = cls(store_host, max_size)
            batch = enc.prepare(msgs)
        except Exception as exc:  # noqa: BLE001
            out.append(("error", type(exc), str(exc)))
            continue
        lead, qoff, phys, ts, step = where
        buf = bytearray(lead + batch.total)
        got = outcome(enc.write_into, buf, lead, batch, qoff, phys, ts, step)
        if got[0] == "ok":
            ids = [enc.message_id(o) for o in got[1]]
            got = (
                "ok",
                bytes(buf),
                got[1],
                batch.sizes,
                batch.tags_codes,
                batch.total,
                ids,
                enc.message_ids(got[1]),
            )
        out.append(got)
    return tuple(out)


# ---------------------------------------------------------------------------- the record encoder


@SETTINGS
@given(
    msgs=batches(),
    store_host=hosts,
    where=st.tuples(
        st.integers(0, 9), st.integers(0, 2**40), st.integers(0, 2**50), int64, st.sampled_from([1, 0])
    ),
)
def test_record_encoder_writes_the_reference_bytes(
    C: ModuleType, msgs: list, store_host: tuple, where: tuple
) -> None:
    compiled, reference = encode_both(C, store_host, msgs, 4 * 1024 * 1024, where)
    assert compiled == reference
    if compiled[0] == "ok":  # valid input takes the compiled path, not the hand-over
        assert type(C.RecordEncoder(store_host).prepare(msgs)) is C.PreparedRecords
        # and the records decode back, by both decoders, to the same messages
        buf = compiled[1][where[0] :]
        assert list(C.iter_messages(buf, check_crc=True)) == list(ref.iter_messages(buf, check_crc=True))


@SETTINGS
@given(
    msgs=batches(valid=False),
    store_host=hosts,
    max_size=st.sampled_from([4 * 1024 * 1024, 100, 0]),
    where=st.tuples(st.integers(0, 9), st.integers(-(2**64), 2**64), int64, int64, st.integers(-3, 3)),
)
def test_record_encoder_refuses_what_the_reference_refuses(
    C: ModuleType, msgs: list, store_host: tuple, max_size: int, where: tuple
) -> None:
    # (Positions are not negative: the store never passes one, and the reference itself differs
    # there between its per-record path, which slices, and its batch path, which packs.)
    compiled, reference = encode_both(C, store_host, msgs, max_size, where)
    assert compiled == reference


def test_record_encoder_hands_unusual_input_to_the_reference(C: ModuleType) -> None:
    enc = C.RecordEncoder(("10.0.0.1", 10911), max_size=10)
    with pytest.raises(ref.MessageTooLargeError, match="body is 11 bytes, over the limit of 10"):
        enc.prepare([MessageInner(topic="t", body=b"x" * 11)])
    with pytest.raises(ValueError):
        enc.prepare([MessageInner(topic="t", body=b"", born_host=("not-an-ip", 1))])
    with pytest.raises(UnicodeEncodeError):
        enc.prepare([MessageInner(topic="t", body=b"", properties={"k": "\ud800"})])
    with pytest.raises(ValueError):
        C.RecordEncoder(("broker-host", 1))
    # an int property value: formatted by the reference, into its own batch type
    batch = enc.prepare([MessageInner(topic="t", body=b"", properties={"k": 1})])  # type: ignore[dict-item]
    assert type(batch) is ref.PreparedBatch
    with pytest.raises(struct.error):  # out of the Java int range: refused when packed, as struct does
        big = C.RecordEncoder(("10.0.0.1", 10911))
        b = big.prepare([MessageInner(topic="t", body=b"", flag=2**31)])
        big.write_into(bytearray(b.total), 0, b, 0, 0, 0)
    # a buffer too small: refused before a byte is written
    enc = C.RecordEncoder(("10.0.0.1", 10911))
    b = enc.prepare([MessageInner(topic="t", body=b"abc")] * 4)
    short = bytearray(b.total - 1)
    with pytest.raises(struct.error, match="pack_into requires a buffer"):
        enc.write_into(short, 0, b, 0, 0, 0)
    assert short == bytearray(b.total - 1)


def test_record_encoder_fast_path_matches_the_seed_layout(C: ModuleType) -> None:
    msg = MessageInner(
        topic="TopicTest",
        body=b"Hello",
        queue_id=2,
        flag=7,
        properties={"TAGS": "TagA"},
        born_timestamp=0x0102030405060708,
        born_host=("192.168.0.1", 40000),
        reconsume_times=3,
        prepared_transaction_offset=9,
    )
    for cls in (C.RecordEncoder, ref.RecordEncoder):
        enc = cls(("10.0.0.2", 10911))
        batch = enc.prepare([msg])
        buf = bytearray(batch.total)
        assert enc.write_into(buf, 0, batch, 5, 1024, 0x1112131415161718) == [1024]
        expected = ref.encode_message(msg, store_host=("10.0.0.2", 10911))
        ref.patch_record(expected, 5, 1024, 0x1112131415161718)
        assert bytes(buf) == bytes(expected)
        assert batch.tags_codes == [2598919]  # Java "TagA".hashCode()


@SETTINGS
@given(offsets=st.lists(st.integers(-(2**70), 2**70), max_size=5), store_host=hosts)
def test_message_ids(C: ModuleType, offsets: list[int], store_host: tuple) -> None:
    compiled, reference = C.RecordEncoder(store_host), ref.RecordEncoder(store_host)
    assert [compiled.message_id(o) for o in offsets] == [reference.message_id(o) for o in offsets]
    assert compiled.message_ids(offsets) == reference.message_ids(offsets)
    for o in offsets:
        assert outcome(C.create_message_id, store_host, o) == outcome(py_create_message_id, store_host, o)


@SETTINGS
@given(
    entries=st.lists(st.tuples(int64, int32, int64), max_size=6),
    odd=st.sampled_from([None, "short", "big", "float", "tuple"]),
)
def test_consume_queue_entries(C: ModuleType, entries: list, odd: str | None) -> None:
    offsets, sizes, tags = (list(c) for c in zip(*entries, strict=True)) if entries else ([], [], [])
    if odd == "short":
        sizes = sizes[:-1]
    elif odd == "big" and entries:
        sizes[0] = 2**31
    elif odd == "float" and entries:
        tags[-1] = 1.5
    elif odd == "tuple":
        offsets = tuple(offsets)  # type: ignore[assignment]
    assert outcome(C.pack_cq_entries, offsets, sizes, tags) == outcome(
        ref.pack_cq_entries, offsets, sizes, tags
    )


# ---------------------------------------------------------------------------- SEND_BATCH_MESSAGE bodies

batch_items = st.lists(
    st.builds(BatchItem, st.binary(max_size=200), int32, prop_dicts), min_size=0, max_size=8
)


@SETTINGS
@given(items=batch_items, max_count=st.one_of(st.none(), st.integers(-1, 10)))
def test_decode_batch_of_valid_bodies(C: ModuleType, items: list, max_count: int | None) -> None:
    body = ref.encode_batch(items)
    compiled = outcome(C.decode_batch, body, max_count)
    assert compiled == outcome(ref.decode_batch, body, max_count)
    assert outcome(C.decode_batch, memoryview(body), max_count) == compiled


@SETTINGS
@given(
    items=batch_items,
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 10_000),
    fields=st.lists(
        st.tuples(
            st.integers(0, 10_000), st.sampled_from([0, 1, 20, 21, 22, 2**31 - 1, 2**32 - 1, 2**32 - 22])
        ),
        max_size=2,
    ),
    max_count=st.one_of(st.none(), st.integers(0, 10)),
)
def test_decode_batch_refuses_what_the_reference_refuses(
    C: ModuleType, items: list, edits: list, cut: int, fields: list, max_count: int | None
) -> None:
    body = bytearray(ref.encode_batch(items))
    assume(body)
    for at, value in edits:
        body[at % len(body)] = value
    for at, value in fields:
        at %= len(body)
        body[at : at + 4] = value.to_bytes(4, "big")
    data = bytes(body[: cut % (len(body) + 1)])
    assert outcome(C.decode_batch, data, max_count) == outcome(ref.decode_batch, data, max_count)


@SETTINGS
@given(
    items=batch_items,
    cut=st.integers(0, 10_000),
    max_count=st.one_of(st.none(), st.integers(-1, 10)),
    header=st.tuples(
        st.sampled_from(["T", "Orders", "%RETRY%g"]),
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**63 - 1),
        hosts,
        hosts,
        st.integers(0, 2**31 - 1),
    ),
)
def test_decode_batch_messages_builds_the_messages_the_reference_builds(
    C: ModuleType, items: list, cut: int, max_count: int | None, header: tuple
) -> None:
    """SEND_BATCH_MESSAGE's fused decode: body -> MessageInner, no BatchItem on the compiled path."""
    body = ref.encode_batch(items)
    body = body[: cut % (len(body) + 1)] if cut % 3 == 0 else body  # truncated bodies too
    compiled = outcome(C.decode_batch_messages, body, max_count, *header)
    assert compiled == outcome(ref.decode_batch_messages, body, max_count, *header)
    if compiled[0] == "ok":
        assert all(type(m) is ref.MessageInner for m in compiled[1])


@SETTINGS
@given(st.binary(max_size=300))
def test_decode_batch_of_random_bytes(C: ModuleType, data: bytes) -> None:
    assert outcome(C.decode_batch, data) == outcome(ref.decode_batch, data)


def test_decode_batch_limits_and_odd_but_accepted_entries(C: ModuleType) -> None:
    items = [BatchItem(b"x", 0, {"a": "b"})] * 3
    body = ref.encode_batch(items)
    with pytest.raises(ref.BatchLimitError, match="more than 2 messages"):
        C.decode_batch(body, 2)
    assert C.decode_batch(body, 3) == items
    # A body running past its entry (into the next one), balanced by a negative PROPERTIESLENGTH
    # (in the next entry's ignored MAGICCODE): the reference takes it, with no properties, so the
    # compiled decoder must too.
    odd = struct.pack(">iiiii", 22, 0, 0, 5, 6) + b"ab" + struct.pack(">iIiiih", 22, 0xFFFA0000, 0, 0, 0, 0)
    assert (
        C.decode_batch(odd)
        == ref.decode_batch(odd)
        == [
            BatchItem(b"ab\x00\x00\x00\x16", 5, {}),
            BatchItem(b"", 0, {}),
        ]
    )
    assert C.decode_batch(b"") == []
    with pytest.raises(ref.CorruptDataError, match="'utf-8' codec can't decode"):
        C.decode_batch(ref.encode_batch([BatchItem(b"", 0, {})])[:-2] + b"\x00\x02\xc3\x01")


# ---------------------------------------------------------------------------- record decoding and checks


def records(msgs: list, store_host: tuple = ("10.0.0.1", 10911)) -> bytes:
    enc = ref.RecordEncoder(store_host)
    batch = enc.prepare(msgs)
    buf = bytearray(batch.total)
    enc.write_into(buf, 0, batch, 11, 4096, 1_700_000_000_000)
    return bytes(buf)


@SETTINGS
@given(msgs=batches(), store_host=hosts, check_crc=st.booleans(), with_body=st.booleans())
def test_decode_message_and_iter_messages_of_valid_records(
    C: ModuleType, msgs: list, store_host: tuple, check_crc: bool, with_body: bool
) -> None:
    try:
        buf = records(msgs, store_host)
    except Exception:  # noqa: BLE001 - e.g. a host port out of range: nothing to decode
        assume(False)
    pos = 0
    for m in C.iter_messages(buf, check_crc=check_crc):
        assert isinstance(m, MessageExt)
        assert m == ref.decode_message(buf, pos, check_crc=check_crc)
        assert C.decode_message(buf, pos, check_crc=check_crc, with_body=with_body) == ref.decode_message(
            buf, pos, check_crc=check_crc, with_body=with_body
        )
        rec = buf[pos : pos + m.store_size]
        assert C.record_crc_ok(rec) is ref.record_crc_ok(rec) is True
        topic = m.topic.encode()
        for args in [(m.store_size, topic, m.queue_id, m.queue_offset), (m.store_size + 1, topic, 0, 0)]:
            assert C.record_mismatch(rec, *args) == ref.record_mismatch(rec, *args)
        assert C.record_mismatch(memoryview(rec), m.store_size, b"nope", m.queue_id, m.queue_offset) == (
            ref.record_mismatch(rec, m.store_size, b"nope", m.queue_id, m.queue_offset)
        )
        pos += m.store_size
    assert pos == len(buf)


def iterate(fn: Any, data: bytes, check_crc: bool) -> tuple:
    got: list = []
    try:
        for m in fn(data, check_crc=check_crc):
            got.append(m)
    except Exception as exc:  # noqa: BLE001
        return ("error", got, type(exc), str(exc))
    return ("ok", got)


@SETTINGS
@given(
    msgs=batches(),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 10_000),
    pos=st.integers(0, 400),
    check_crc=st.booleans(),
    size=st.integers(0, 400),
    topic=st.sampled_from([b"", b"abc", b"other"]),
)
def test_decoders_refuse_damaged_records_as_the_reference(
    C: ModuleType, msgs: list, edits: list, cut: int, pos: int, check_crc: bool, size: int, topic: bytes
) -> None:
    try:
        buf = bytearray(records(msgs))
    except Exception:  # noqa: BLE001
        assume(False)
    for at, value in edits:
        buf[at % len(buf)] = value
    data = bytes(buf[: cut % (len(buf) + 1)]) if cut % 3 == 0 else bytes(buf)
    pos %= len(data) + 1
    for kw in ({"check_crc": check_crc}, {"check_crc": check_crc, "with_body": False}):
        assert outcome(C.decode_message, data, pos, **kw) == outcome(ref.decode_message, data, pos, **kw)
    assert iterate(C.iter_messages, data, check_crc) == iterate(ref.iter_messages, data, check_crc)
    assert C.record_crc_ok(data) == ref.record_crc_ok(data)
    for args in [(size, topic, 0, 0), (len(data), msgs[0].topic.encode(), msgs[0].queue_id, 11)]:
        assert C.record_mismatch(data, *args) == ref.record_mismatch(data, *args)


@SETTINGS
@given(st.binary(max_size=300), st.integers(-5, 300), st.booleans())
def test_record_decoders_on_random_bytes(C: ModuleType, data: bytes, pos: int, check_crc: bool) -> None:
    assert outcome(C.decode_message, data, pos, check_crc=check_crc) == outcome(
        ref.decode_message, data, pos, check_crc=check_crc
    )
    assert iterate(C.iter_messages, data, check_crc) == iterate(ref.iter_messages, data, check_crc)
    assert outcome(C.record_crc_ok, data) == outcome(ref.record_crc_ok, data)
    assert outcome(C.record_mismatch, data, len(data), b"t", 0, 0) == outcome(
        ref.record_mismatch, data, len(data), b"t", 0, 0
    )


def test_record_mismatch_follows_python_indexing_on_a_negative_body_length(C: ModuleType) -> None:
    rec = bytearray(records([MessageInner(topic="abc", body=b"0123456789")]))
    for body_len in (-1, -5, -84, -89, -len(rec) - 10, 2**31 - 1):
        rec[84:88] = struct.pack(">i", body_len)
        for topic in (b"", b"abc", bytes(rec[-3:])):
            assert C.record_mismatch(bytes(rec), len(rec), topic, 0, 11) == ref.record_mismatch(
                bytes(rec), len(rec), topic, 0, 11
            )


def test_decoders_take_every_buffer_type(C: ModuleType) -> None:
    import mmap

    buf = records([MessageInner(topic="t", body=b"abc", properties={"KEYS": "k"})] * 3)
    mm = mmap.mmap(-1, len(buf))
    mm.write(buf)
    for shown in (buf, bytearray(buf), memoryview(buf), mm):
        assert list(C.iter_messages(shown, check_crc=True)) == list(ref.iter_messages(buf, check_crc=True))
    mm.close()
    with pytest.raises(TypeError):  # not a buffer: the reference's error
        C.decode_message("not bytes")  # type: ignore[arg-type]
    wide = memoryview(buf[: len(buf) // 4 * 4]).cast("I")  # counted by item: the reference's business
    for fn in ("decode_batch", "decode_message", "record_crc_ok"):
        assert outcome(getattr(C, fn), wide) == outcome(getattr(ref, fn), wide)
    assert iterate(C.iter_messages, wide, False) == iterate(ref.iter_messages, wide, False)


def test_objects_are_built_slot_by_slot_and_behave(C: ModuleType) -> None:
    assert C.uses_slots() == {"MessageExt": True, "MessageInner": True, "BatchItem": True}
    m = next(C.iter_messages(records([MessageInner(topic="t", body=b"b", properties={"TAGS": "x"})])))
    assert m.tags == "x" and m.msg_id == py_create_message_id(m.store_host, m.commit_log_offset)
    m.body = b"changed"  # an ordinary mutable attrs instance
    assert m.body == b"changed" and "changed" in repr(m)


# ---------------------------------------------------------------------------- selection and fuzz


def _selection(env: dict[str, str]) -> str:
    code = (
        "import tidemq._native as n, tidemq.message as m, tidemq.record as r\n"
        "names = ['RecordEncoder', 'decode_batch', 'decode_batch_messages', 'decode_message', 'iter_messages',\n"
        "         'pack_cq_entries', 'record_crc_ok', 'record_mismatch', 'scan_queue']\n"
        "pure = all(getattr(m, x) is getattr(r, x) for x in names) and m.create_message_id is m.py_create_message_id\n"
        "c = n.load_all()\n"
        "native = c is not None and all(getattr(m, x) is getattr(c, x) for x in names + ['create_message_id'])\n"
        "print(n.ACTIVE, pure, native, n.DESCRIPTION, sep='|')\n"
    )
    base = {k: v for k, v in os.environ.items() if k != "TIDEMQ_NO_EXTENSIONS"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_no_extensions_variable_selects_pure_python() -> None:
    assert (
        _selection({"TIDEMQ_NO_EXTENSIONS": "1"}) == "False|True|False|pure Python (TIDEMQ_NO_EXTENSIONS=1)"
    )


def test_the_compiled_codec_is_selected_by_default(C: ModuleType) -> None:
    active, pure, native, description = _selection({}).split("|")
    assert (active, pure, native) == ("True", "False", "True")
    modules = ", ".join(_native.MODULES)
    assert description == f"compiled (tidemq._native: {modules}; crc32: {C.CRC32_SOURCE})"


def test_short_fuzz_of_every_decoder(C: ModuleType) -> None:
    """A few seconds of tests/fuzz/fuzz_native_codec.py (the long run is a script: 1 M inputs)."""
    spec = importlib.util.spec_from_file_location(
        "fuzz_native_codec", ROOT / "tests/fuzz/fuzz_native_codec.py"
    )
    assert spec is not None and spec.loader is not None
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    summary = fuzz.run(C, inputs=4000, seed=int.from_bytes(os.urandom(4), "big"))
    assert summary["outcome"] == "no difference, no crash"


# ---------------------------------------------------------------------------- the pull path's walk


@SETTINGS
@given(
    bodies=st.lists(st.binary(max_size=200), min_size=1, max_size=12),
    other_topic=st.integers(0, 20),
    first_qoff=st.integers(0, 2**40),
    file_from=st.sampled_from([0, 1 << 30, 5 << 30]),
    lead=st.integers(0, 64),
    readable_cut=st.integers(0, 4000),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    entry_edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=2),
    start_entry=st.integers(0, 3),
    max_count=st.integers(1, 16),
    max_bytes=st.integers(1, 5000),
    check_crc=st.booleans(),
)
def test_scan_queue_serves_what_the_reference_serves(
    C: ModuleType,
    bodies: list,
    other_topic: int,
    first_qoff: int,
    file_from: int,
    lead: int,
    readable_cut: int,
    edits: list,
    entry_edits: list,
    start_entry: int,
    max_count: int,
    max_bytes: int,
    check_crc: bool,
) -> None:
    """Entries naming their records, damaged records and entries, a cut-off readable end, full
    stops: the compiled walk takes the same records (same views' bytes) and stops where the
    reference stops."""
    topic = "Orders" if other_topic else "Other"  # sometimes the records are another topic's
    msgs = [MessageInner(topic=topic, body=b, queue_id=3, properties={"TAGS": "t"}) for b in bodies]
    enc = ref.RecordEncoder(("10.0.0.1", 10911))
    batch = enc.prepare(msgs)
    buf = bytearray(lead + batch.total)
    offsets = enc.write_into(buf, lead, batch, first_qoff, file_from + lead, 1_700_000_000_000)
    entries = bytearray(ref.pack_cq_entries(offsets, batch.sizes, batch.tags_codes))
    for at, value in edits:
        buf[at % len(buf)] = value
    for at, value in entry_edits:
        entries[at % len(entries)] = value
    readable = len(buf) - readable_cut % (len(buf) + 1) if readable_cut % 2 else len(buf)
    start = (start_entry % len(bodies)) * 20
    out = []
    for impl in (C, ref):
        buffers: list = []
        qoffsets: list = []
        runs: list = []
        got = impl.scan_queue(
            bytes(entries),
            start,
            len(entries),
            memoryview(bytes(buf)),
            file_from,
            readable,
            b"Orders",
            3,
            first_qoff,
            max_count,
            max_bytes,
            check_crc,
            buffers,
            qoffsets,
            0,
            runs,
        )
        assert b"".join(runs) == b"".join(buffers)
        out.append((got, [bytes(b) for b in buffers], qoffsets, [bytes(r) for r in runs]))
    assert out[0] == out[1]


@SETTINGS
@given(
    bodies=st.lists(st.binary(max_size=64), min_size=1, max_size=12),
    gaps=st.lists(st.sampled_from([0, 0, 0, 1, 20]), min_size=12, max_size=12),
    max_count=st.integers(1, 16),
)
def test_scan_queue_runs_join_back_to_back_records(
    C: ModuleType, bodies: list, gaps: list, max_count: int
) -> None:
    """A pull writes the runs: records that follow each other in the file make one run, a gap
    (another queue's record) starts the next; the runs hold exactly the records taken."""
    enc = ref.RecordEncoder(("10.0.0.1", 10911))
    buf = bytearray()
    offsets, sizes, tags = [], [], []
    for qoff, (body, gap) in enumerate(zip(bodies, gaps, strict=False)):
        buf += bytes(gap)
        batch = enc.prepare([MessageInner(topic="Orders", body=body, queue_id=3)])
        record = bytearray(batch.total)
        offsets += enc.write_into(record, 0, batch, qoff, len(buf), 1_700_000_000_000)
        sizes += batch.sizes
        tags += batch.tags_codes
        buf += record
    entries = ref.pack_cq_entries(offsets, sizes, tags)
    expected = 1 + sum(1 for g in gaps[1 : min(len(bodies), max_count)] if g)
    for impl in (C, ref):
        buffers: list = []
        runs: list = []
        args = (entries, 0, len(entries), memoryview(bytes(buf)), 0, len(buf), b"Orders", 3, 0)
        impl.scan_queue(*args, max_count, 1 << 20, True, buffers, [], 0, runs)
        assert len(buffers) == min(len(bodies), max_count)
        assert b"".join(runs) == b"".join(buffers) and len(runs) == expected
        # Without a runs list the walk is what it always was.
        assert impl.scan_queue(*args, max_count, 1 << 20, True, [], [], 0)[3] in (ref.SCAN_END, ref.SCAN_FULL)


def test_scan_queue_takes_every_whole_record_of_an_intact_queue(C: ModuleType) -> None:
    msgs = [MessageInner(topic="Orders", body=b"x" * n, queue_id=3) for n in (1, 100, 1000)]
    enc = ref.RecordEncoder(("10.0.0.1", 10911))
    batch = enc.prepare(msgs)
    buf = bytearray(batch.total)
    offsets = enc.write_into(buf, 0, batch, 7, 1 << 30, 1_700_000_000_000)
    entries = ref.pack_cq_entries(offsets, batch.sizes, batch.tags_codes)
    for impl in (C, ref):
        buffers: list = []
        qoffsets: list = []
        args = (entries, 0, len(entries), memoryview(bytes(buf)), 1 << 30, len(buf), b"Orders", 3, 7)
        got = impl.scan_queue(*args, 32, 1 << 20, True, buffers, qoffsets, 0)
        assert got == (60, batch.total, offsets[-1], ref.SCAN_END)
        assert qoffsets == [7, 8, 9] and b"".join(buffers) == bytes(buf)
        # Full after two: the third entry is left for the next pull.
        buffers, qoffsets = [], []
        assert impl.scan_queue(*args, 2, 1 << 20, True, buffers, qoffsets, 0)[3] == ref.SCAN_FULL
        assert qoffsets == [7, 8]


TAG_CHOICES = ["Aa", "BB", "t", "é", "x\x01y", "", None]  # "Aa" / "BB" share a Java hash; None: no TAGS


@SETTINGS
@given(
    tags=st.lists(st.sampled_from(TAG_CHOICES), min_size=1, max_size=12),
    extra=st.lists(prop_dicts, min_size=1, max_size=3),
    subscribed=st.sets(st.sampled_from(["Aa", "t", "é", "x\x01y", "nothing"]), min_size=1),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    max_count=st.integers(1, 16),
    check_crc=st.booleans(),
)
def test_scan_queue_filters_tags_as_the_reference(
    C: ModuleType, tags: list, extra: list, subscribed: set, edits: list, max_count: int, check_crc: bool
) -> None:
    """A TAG subscription's walk: entries of other codes skipped unread, colliding and missing
    TAGS skipped, unreadable records stopping the walk: the compiled walk and the reference take
    the same records and stop at the same entry."""
    from tidemq.filter import tag_selection
    from tidemq_filter_server.tag import TagFilterFactory

    msgs = []
    for i, tag in enumerate(tags):
        props = dict(extra[i % len(extra)])
        props.pop("TAGS", None)
        if tag is not None:
            props["TAGS"] = tag
        msgs.append(MessageInner(topic="Orders", body=b"b%d" % i, queue_id=3, properties=props))
    enc = ref.RecordEncoder(("10.0.0.1", 10911))
    batch = enc.prepare(msgs)
    buf = bytearray(batch.total)
    offsets = enc.write_into(buf, 0, batch, 0, 0, 1_700_000_000_000)
    entries = ref.pack_cq_entries(offsets, batch.sizes, batch.tags_codes)
    for at, value in edits:
        buf[at % len(buf)] = value
    selection = tag_selection(TagFilterFactory().compile("||".join(sorted(subscribed))))
    out = []
    for impl in (C, ref):
        buffers: list = []
        qoffsets: list = []
        runs: list = []
        got = impl.scan_queue(
            entries, 0, len(entries), memoryview(bytes(buf)), 0, len(buf), b"Orders", 3, 0, max_count,
            1 << 20, check_crc, buffers, qoffsets, 0, runs, selection,
        )  # fmt: skip
        out.append((got, [bytes(b) for b in buffers], qoffsets, [bytes(r) for r in runs]))
    assert out[0] == out[1]


def _twin_in_subprocess(env: dict[str, str], module: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')\n"
        "from tidemq.extensions import compiled_twin, twins\n"
        f"first = compiled_twin({module!r}); again = compiled_twin({module!r})\n"
        "print('compiled' if first is not None else 'python', [t.reason for t in twins()][-1], sep='|')\n"
    )
    base = {
        k: v for k, v in os.environ.items() if k not in ("TIDEMQ_NO_EXTENSIONS", "TIDEMQ_REQUIRE_EXTENSIONS")
    }
    return subprocess.run(
        [sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=60
    )


def test_a_missing_twin_runs_python_and_says_why_once() -> None:
    proc = _twin_in_subprocess({}, "tidemq._native._no_such_module")
    assert proc.returncode == 0, proc.stderr
    logged, result = proc.stdout.strip().splitlines()
    assert logged == (
        "tidemq._native._no_such_module: running the pure-Python reference "
        "(not built: no C compiler at install, or installed without it)"
    )
    assert result.startswith("python|not built")


def test_require_extensions_refuses_a_missing_twin_unless_python_is_asked_for() -> None:
    proc = _twin_in_subprocess({"TIDEMQ_REQUIRE_EXTENSIONS": "1"}, "tidemq._native._no_such_module")
    assert proc.returncode != 0
    assert (
        "ImportError: TIDEMQ_REQUIRE_EXTENSIONS is set but the compiled tidemq._native._no_such_module"
        in proc.stderr
    )
    both = {"TIDEMQ_REQUIRE_EXTENSIONS": "1", "TIDEMQ_NO_EXTENSIONS": "1"}
    proc = _twin_in_subprocess(both, "tidemq._native._record_decode")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "python|TIDEMQ_NO_EXTENSIONS=1"
