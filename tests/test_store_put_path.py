"""The mmap store's put of a batch through the compiled encoder (issue 38, putglue).

With the compiled :mod:`tidemq._native._record_encode`, a put takes its columns from the prepare
step (``uniform``, the dispatchers' ``properties`` and ``sys_flags``), packs and writes its records
in one call (``write_file``), its ConsumeQueue entries in another (``cq_entries``) and gets its
``PutResult`` built in C (``put_result``).  The reference encoder's path stays as it was; both must
store the same bytes, answer the same results and hand the dispatchers the same columns.
"""

from __future__ import annotations

import errno
import os
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from store_support import files_of

from tidemq.delay import SCHEDULE_TOPIC
from tidemq.extensions import compiled_twin
from tidemq.message import TRANSACTION_PREPARED_TYPE, MessageInner, pack_cq_entries
from tidemq.message_types import Prop
from tidemq.record import RecordEncoder as ReferenceEncoder
from tidemq.store import PutResult, PutStatus
from tidemq.testing.store_contract import build_store

C = compiled_twin("tidemq._native._record_encode")
pytestmark = pytest.mark.skipif(C is None, reason="the compiled encoder is not built or is switched off")

T0 = 1_764_300_000_123


class Recorder:
    """A :class:`tidemq.store.BatchDispatcher` that keeps what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def dispatch_batch(
        self,
        topic: str,
        queue_id: int,
        properties: Sequence[Mapping[str, str]],
        commit_log_offsets: Sequence[int],
        sizes: Sequence[int],
        tags_codes: Sequence[int],
        store_timestamp: int,
        queue_offset: int,
        sys_flags: Sequence[int],
    ) -> None:
        self.calls.append(
            (
                topic,
                queue_id,
                [dict(p) for p in properties],
                list(commit_log_offsets),
                list(sizes),
                list(tags_codes),
                store_timestamp,
                queue_offset,
                list(sys_flags),
            )
        )


class Counting:
    """The store's encoder, with its calls counted by name."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.encoder, name)

        def counted(*args: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return method(*args)

        return counted


def open_store(path: Path, compiled: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Recorder]:
    import tidemq_store_mmap.store as store_module

    clock = iter(range(T0, T0 + 1_000_000))
    monkeypatch.setattr(store_module, "time", types.SimpleNamespace(time_ns=lambda: next(clock) * 1_000_000))
    store = build_store(
        "mmap",
        path,
        flush="async",
        store_options={
            "store_host": "10.1.2.3:10911",
            "commitlog_file_size": 20000,
            "consumequeue_entries": 8,
        },
    )
    assert store.load()
    store.start()
    if compiled:
        assert type(store._encoder) is C.RecordEncoder
        store._encoder = Counting(store._encoder)
    else:
        store._encoder = ReferenceEncoder(store.store_host, store.max_message_size)
    recorder = Recorder()
    store.add_dispatcher(recorder)
    return store, recorder


def msg(topic: str = "TopicA", queue_id: int = 0, i: int = 0, **extra: Any) -> MessageInner:
    props = {Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"C0A8000100002A9F{i:016X}", "WAIT": "true"}
    if i % 3 == 1:
        props[Prop.TAGS] = f"tag{i % 5}"
    if i % 4 == 2:
        props[Prop.KEYS] = f"k{i} ключ"
    props.update(extra.pop("props", {}))
    return MessageInner(
        topic=topic,
        body=bytes([i % 251]) * (100 + i % 37),
        queue_id=queue_id,
        properties=props,
        born_host=extra.pop("born_host", ("127.0.0.1", 40000 + i % 3)),
        born_timestamp=T0 - i,
        **extra,
    )


def puts() -> list[list[MessageInner]]:
    """Batches and single sends that cover the put's branches (queue entries or none, schedule
    tags, IPv6, files that roll over in the commit log and the queues, refused batches)."""
    batches: list[list[MessageInner]] = []
    for r in range(6):
        batches.append([msg(queue_id=r % 2, i=r * 32 + i) for i in range(32)])
        batches.append([msg(queue_id=2, i=r)])
    batches.append([msg("Topic_B2", 1, i, props={"ключ": "значение"}) for i in range(5)])
    batches.append(
        [msg(SCHEDULE_TOPIC, 2, i, props={Prop.DELAY_TIME_LEVEL: str(1 + i % 3)}) for i in range(4)]
    )
    batches.append([msg(i=i, sys_flag=TRANSACTION_PREPARED_TYPE) for i in range(3)])
    batches.append([msg(queue_id=3, i=i, born_host=("::1", 9876)) for i in range(3)])
    batches.append([msg(i=0), msg("TopicB", i=1)])  # two topics
    batches.append([msg(queue_id=0, i=0), msg(queue_id=1, i=1)])  # two queues
    big = msg(i=7)
    big.body = b"x" * 25000
    long_props = msg(i=1, props={"k": "v" * 40000})
    batches.append([msg(i=0), big])  # larger than a commit-log file
    batches.append([msg(i=0), msg("TopicB", i=1), long_props])  # two topics, and too long
    batches.append([msg(i=0), long_props])  # properties too long
    batches.append([msg(queue_id=1, i=i) for i in range(20)])
    return batches


def result_fields(r: PutResult) -> tuple[Any, ...]:
    return (
        r.status,
        r.wrote_offset,
        r.wrote_bytes,
        r.queue_offset,
        r.msg_ids,
        r.store_timestamp,
        r.message_count,
        r.error,
    )


def test_the_compiled_put_stores_and_answers_what_the_reference_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = {}
    for compiled in (True, False):
        root = tmp_path / ("compiled" if compiled else "reference")
        store, recorder = open_store(root, compiled, monkeypatch)
        results = [result_fields(store.put_messages(b).result(10)) for b in puts()]
        store.shutdown()
        runs[compiled] = (results, recorder.calls, files_of(root))
    (results, calls, files), (ref_results, ref_calls, ref_files) = runs[True], runs[False]
    refused = [(r[0], r[7]) for r in results if r[0] is not PutStatus.PUT_OK]
    mixed = (PutStatus.MESSAGE_ILLEGAL, "a batch must go to one topic and queue")
    assert refused[:3] == [mixed, mixed, (PutStatus.MESSAGE_ILLEGAL, refused[2][1])]
    assert "does not fit" in refused[2][1]
    assert refused[3] == mixed  # the batch's first check wins over its too long properties
    assert refused[4][0] is PutStatus.PROPERTIES_SIZE_EXCEEDED
    assert len(refused) == 5
    assert results == ref_results
    assert calls == ref_calls
    assert files.keys() == ref_files.keys()
    assert len([k for k in files if k.startswith("commitlog")]) >= 3  # the log rolled over
    for name, data in files.items():
        assert data == ref_files[name], name


def test_a_put_hands_the_dispatchers_each_messages_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, recorder = open_store(tmp_path, True, monkeypatch)
    batch = [msg(queue_id=1, i=i) for i in range(8)]
    result = store.put_messages(batch).result(10)
    store.shutdown()
    (call,) = recorder.calls
    assert call[0:2] == ("TopicA", 1)
    assert call[2] == [m.properties for m in batch]
    assert call[3] == [result.wrote_offset + sum(call[4][:i]) for i in range(8)]
    assert call[6:] == (result.store_timestamp, 0, [0] * 8)


def test_write_file_writes_what_write_into_packs(tmp_path: Path) -> None:
    enc = C.RecordEncoder(("10.1.2.3", 10911))
    batch = enc.prepare([msg(i=i) for i in range(9)])
    expected = bytearray(batch.total)
    offsets = enc.write_into(expected, 0, enc.prepare([msg(i=i) for i in range(9)]), 5, 1000, T0, 1)
    fd = os.open(tmp_path / "log", os.O_RDWR | os.O_CREAT)
    try:
        assert enc.write_file(batch, fd, 100, 5, 1000, T0, 1) == offsets
        assert os.pread(fd, batch.total + 200, 0) == bytes(100) + bytes(expected)
    finally:
        os.close(fd)
    assert batch.cq_entries() == pack_cq_entries(offsets, batch.sizes, batch.tags_codes)
    other = [-(1 << 63), 0, 7, (1 << 63) - 1, 3, 4, 5, 6, 8]
    assert batch.cq_entries(other) == pack_cq_entries(offsets, batch.sizes, other)
    with pytest.raises(Exception, match="format requires|too large|out of range"):
        batch.cq_entries([1 << 64] * 9)  # the reference's error (struct refuses it)


def test_write_file_grows_its_buffer_for_larger_batches(tmp_path: Path) -> None:
    enc = C.RecordEncoder(("10.1.2.3", 10911))
    fd = os.open(tmp_path / "log", os.O_RDWR | os.O_CREAT)
    pos = 0
    try:
        for count, size in ((2, 100), (40, 5000), (3, 30), (70, 4000)):
            msgs = [
                MessageInner(topic="T", body=bytes([i]) * size, properties={"i": str(i)})
                for i in range(count)
            ]
            batch, again = enc.prepare(msgs), enc.prepare(msgs)
            expected = bytearray(batch.total)
            enc.write_into(expected, 0, again, 0, pos, T0, 1)
            enc.write_file(batch, fd, pos, 0, pos, T0, 1)
            assert os.pread(fd, batch.total, pos) == bytes(expected)
            pos += batch.total
    finally:
        os.close(fd)


def test_write_file_reports_the_write_error_and_refuses_bad_fields(tmp_path: Path) -> None:
    enc = C.RecordEncoder(("10.1.2.3", 10911))
    batch = enc.prepare([msg(i=i) for i in range(3)])
    fd = os.open(tmp_path / "log", os.O_RDONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError) as info:
            enc.write_file(batch, fd, 0, 0, 0, T0, 1)
        assert info.value.errno == errno.EBADF
        with pytest.raises(Exception, match="int too large"):
            enc.write_file(batch, fd, 0, (1 << 63) - 1, 0, T0, 1)
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="not written"):
        batch.cq_entries()


def test_put_result_is_the_put_result_the_reference_builds() -> None:
    enc = C.RecordEncoder(("10.1.2.3", 10911))
    batch = enc.prepare([msg(i=i) for i in range(4)])
    offsets = enc.write_into(bytearray(batch.total), 0, batch, 12, 4096, T0, 1)
    built = enc.put_result(PutResult, PutStatus.PUT_OK, batch, 12, T0)
    assert type(built) is PutResult
    assert built == PutResult(
        PutStatus.PUT_OK,
        wrote_offset=4096,
        wrote_bytes=batch.total,
        queue_offset=12,
        msg_ids=enc.message_ids(offsets),
        store_timestamp=T0,
        message_count=4,
    )
    assert hash(built) == hash(PutResult(*result_fields(built)))
    assert built.msg_id == ",".join(enc.message_ids(offsets))


def test_the_prepare_step_reads_the_batchs_queue_and_columns() -> None:
    enc = C.RecordEncoder(("10.1.2.3", 10911))
    same = [msg(i=i) for i in range(3)]
    batch = enc.prepare(same)
    assert batch.uniform
    assert batch.properties == [m.properties for m in same]
    assert all(p is m.properties for p, m in zip(batch.properties, same, strict=True))
    assert batch.sys_flags == [0, 0, 0]
    equal_names = [msg(i=0), msg("".join(["Topic", "A"]), i=1)]
    assert equal_names[0].topic is not equal_names[1].topic
    assert enc.prepare(equal_names).uniform
    assert not enc.prepare([msg(i=0), msg("TopicB", i=1)]).uniform
    assert not enc.prepare([msg(i=0), msg(i=1), msg(queue_id=1, i=2)]).uniform
    flagged = enc.prepare([msg(i=0, sys_flag=TRANSACTION_PREPARED_TYPE)])
    assert flagged.sys_flags == [TRANSACTION_PREPARED_TYPE]


def test_cq_entries_into_packs_what_cq_entries_packs() -> None:
    enc = C.RecordEncoder(("10.1.2.3", 10911))
    batch = enc.prepare([msg(i=i) for i in range(5)])
    enc.write_into(bytearray(batch.total), 0, batch, 3, 777, T0, 1)
    target = bytearray(b"\xee" * 140)
    assert batch.cq_entries_into(target, 20) == 100
    assert bytes(target) == b"\xee" * 20 + batch.cq_entries() + b"\xee" * 20
    other = [5, -1, 1 << 40, 0, 9]
    assert batch.cq_entries_into(target, 0, other) == 100
    assert bytes(target[:100]) == batch.cq_entries(other)
    before = bytes(target)
    assert batch.cq_entries_into(target, 0, [1 << 64] * 5) == -1  # nothing written: the caller
    assert batch.cq_entries_into(target, 0, other[:4]) == -1  # takes cq_entries' way
    assert bytes(target) == before
    with pytest.raises(ValueError, match="do not fit"):
        batch.cq_entries_into(target, 41)
    with pytest.raises(ValueError, match="do not fit"):
        batch.cq_entries_into(target, -1)
    with pytest.raises(BufferError):
        batch.cq_entries_into(b"read-only" * 20, 0)
    unplaced = enc.prepare([msg(i=0)])
    with pytest.raises(ValueError, match="not written"):
        unplaced.cq_entries_into(target, 0)


def open_big_store(path: Path, compiled: bool, monkeypatch: pytest.MonkeyPatch, zeros: bool) -> Any:
    """A store whose files take many puts (the zeros ahead and the queue's packed path at work)."""
    import tidemq_store_mmap.consume_queue as cq_module

    monkeypatch.setattr(cq_module, "ZERO_AHEAD", cq_module.ZERO_AHEAD if zeros else 0)
    store = build_store(
        "mmap",
        path,
        flush="async",
        store_options={
            "store_host": "10.1.2.3:10911",
            "commitlog_file_size": 1_000_000,
            "consumequeue_entries": 10_000,
        },
    )
    assert store.load()
    store.start()
    if not zeros:
        store.commitlog.zero_ahead = 0
    if not compiled:
        store._encoder = ReferenceEncoder(store.store_host, store.max_message_size)
    return store


def test_zeros_ahead_and_the_packed_queue_entries_store_the_reference_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tidemq_store_mmap.consume_queue as cq_module
    import tidemq_store_mmap.store as store_module

    fast: list[bool] = []
    put_packed = cq_module.ConsumeQueue.put_packed

    def counted_packed(self: Any, *args: Any) -> None:
        fast.append(False)
        put_packed(self, *args)

    monkeypatch.setattr(cq_module.ConsumeQueue, "put_packed", counted_packed)
    clock = iter(range(T0, T0 + 1_000_000))
    monkeypatch.setattr(store_module, "time", types.SimpleNamespace(time_ns=lambda: next(clock) * 1_000_000))
    batches = [[msg(queue_id=r % 3, i=r * 32 + i) for i in range(32)] for r in range(400)]
    batches.insert(7, [msg(queue_id=1, i=5, born_host=("::1", 1))])  # a single record in place
    runs = {}
    for compiled, zeros in ((True, True), (False, False)):
        clock = iter(range(T0, T0 + 1_000_000))
        root = tmp_path / f"{compiled}"
        store = open_big_store(root, compiled, monkeypatch, zeros)
        fast.clear()
        results = [result_fields(store.put_messages(b).result(10)) for b in batches]
        if zeros:
            log_file = store.commitlog.queue.files[-1]
            assert store.commitlog.zeros.wait_idle()  # the zeros are written by a thread
            assert store.commitlog._zeroed_mf is log_file
            assert store.commitlog._zeroed_to > log_file.wrote_position  # zeros wait ahead
            cq = store.cqs.find("TopicA", 1)
            assert cq._zeroed_to > cq.queue.files[-1].wrote_position
            assert fast.count(False) < len(batches) // 4  # most entries packed into the mapping
        store.shutdown()
        runs[compiled] = (results, files_of(root))
    (results, files), (ref_results, ref_files) = runs[True], runs[False]
    assert results == ref_results
    assert all(r[0] is PutStatus.PUT_OK for r in results)
    assert files.keys() == ref_files.keys()
    assert len([k for k in files if k.startswith("commitlog")]) >= 3  # the log rolled over
    for name, data in files.items():
        assert data == ref_files[name], name


@pytest.mark.parametrize("crash", [False, True])
def test_a_store_with_zeros_ahead_recovers_where_its_records_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash: bool
) -> None:
    store = open_big_store(tmp_path, True, monkeypatch, True)
    for r in range(60):
        store.put_messages([msg(queue_id=r % 2, i=r * 32 + i) for i in range(32)]).result(10)
        if r % 10 == 9:  # single records, packed through the mapping over the zeros
            store.put_message(msg(queue_id=r % 2, i=5000 + r)).result(10)
    end = store.get_max_phy_offset()
    queues = {q: store.get_max_offset_in_queue("TopicA", q) for q in (0, 1)}
    assert store.commitlog.zeros.wait_idle()  # the zeros are written by a thread
    assert store.commitlog._zeroed_to > end - store.commitlog.queue.files[-1].file_from_offset
    store.shutdown()
    if crash:  # the abort file of a killed broker: the log is re-checked record by record
        (tmp_path / "abort").touch()
    again = open_big_store(tmp_path, True, monkeypatch, True)
    assert again.get_max_phy_offset() == end
    assert {q: again.get_max_offset_in_queue("TopicA", q) for q in (0, 1)} == queues
    result = again.put_messages([msg(queue_id=1, i=i) for i in range(32)]).result(10)
    assert (result.status, result.wrote_offset, result.queue_offset) == (PutStatus.PUT_OK, end, queues[1])
    got = again.get_message("g", "TopicA", 1, queues[1], 32)
    assert got.message_count == 32
    again.shutdown()


class Failing(Recorder):
    def dispatch_batch(self, *args: Any) -> None:
        raise RuntimeError("index broken")


class PerRequest:
    """A dispatcher without dispatch_batch: one DispatchRequest per message."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def dispatch(self, request: Any) -> None:
        self.requests.append(request)


def test_a_failing_batch_dispatcher_is_logged_and_the_others_still_get_the_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store, recorder = open_store(tmp_path, True, monkeypatch)
    store.add_dispatcher(Failing())
    last = Recorder()
    store.add_dispatcher(last)
    result = store.put_messages([msg(i=i) for i in range(4)]).result(10)
    assert result.status is PutStatus.PUT_OK
    assert len(recorder.calls) == len(last.calls) == 1
    assert "failed" in caplog.text and "index broken" in caplog.text
    per_request = PerRequest()
    store.add_dispatcher(per_request)  # not a batch dispatcher: dispatch_messages' way again
    store.put_messages([msg(i=i) for i in range(3)]).result(10)
    store.shutdown()
    assert len(recorder.calls) == len(last.calls) == 2
    assert [r.queue_offset for r in per_request.requests] == [4, 5, 6]
