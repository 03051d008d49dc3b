"""What a sync flush round writes back (issue 38, flushrange).

Under group commit (``[store] flush = "sync"``) a put is acknowledged after the ``fdatasync`` of
its round, and ``fdatasync`` writes back every dirty folio of the commit-log file.  The commit log
therefore writes single records with ``pwrite`` there instead of through the mapping: a store
through the mapping dirties a whole large folio, 256-512 KiB written back per round for 32 KiB of
records (``CommitLog.use_flush_rounds``; the page cache's folios are not visible to a test, see
docs/flush.md).  What a user relies on stays: every acknowledged byte is in the file, the files
hold the bytes an asynchronous store writes, and the store recovers where its records end.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import pytest
from store_support import T0, files_of, open_fixed_clock_store

from tidemq.message import MessageInner, decode_message
from tidemq.message_types import Prop
from tidemq.store import PutStatus

FILE_SIZE = 1_000_000


def msg(queue_id: int = 0, i: int = 0) -> MessageInner:
    props = {Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"C0A8000100002A9F{i:016X}", "WAIT": "true"}
    if i % 3 == 1:
        props[Prop.TAGS] = f"tag{i % 5}"
    return MessageInner(
        topic="TopicSync",
        body=bytes([i % 251]) * (100 + i % 900),
        queue_id=queue_id,
        properties=props,
        born_host=("127.0.0.1", 40000 + i % 3),
        born_timestamp=T0 - i,
    )


def puts() -> list[list[MessageInner]]:
    """Single records and batches of 32, enough to roll over into a second commit-log file."""
    out: list[list[MessageInner]] = []
    for r in range(60):
        out.append([msg(queue_id=r % 3, i=r * 40 + i) for i in range(32)])
        for k in range(4):
            out.append([msg(queue_id=k % 2, i=r * 40 + 32 + k)])
    return out


def open_store(path: Path, flush: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    return open_fixed_clock_store(path, flush, monkeypatch, FILE_SIZE)


def put(store: Any, batch: list[MessageInner]) -> Any:
    result = (store.put_message(batch[0]) if len(batch) == 1 else store.put_messages(batch)).result(10)
    assert result.status is PutStatus.PUT_OK, result
    return result


def test_acknowledged_sync_puts_read_back_through_a_fresh_fd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "s", "sync", monkeypatch)
    try:
        for batch in puts()[:60]:
            result = put(store, batch)
            offset = result.wrote_offset
            mf = store.commitlog.queue.find_mapped_file_by_offset(offset)
            fd = os.open(mf.path, os.O_RDONLY)  # not the store's descriptor nor its mapping
            try:
                data = os.pread(fd, result.wrote_bytes, offset - mf.file_from_offset)
            finally:
                os.close(fd)
            assert len(data) == result.wrote_bytes
            first = decode_message(data, 0)
            assert first.body == batch[0].body
            assert first.commit_log_offset == offset
            assert store.commitlog.flushed_where >= offset + result.wrote_bytes  # durable when acked
    finally:
        store.shutdown()


def test_a_sync_store_writes_the_bytes_an_async_store_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = {}
    for flush in ("sync", "async"):
        store = open_store(tmp_path / flush, flush, monkeypatch)
        results = [put(store, batch) for batch in puts()]
        store.shutdown()
        runs[flush] = (
            [(r.wrote_offset, r.wrote_bytes, r.queue_offset, r.msg_ids) for r in results],
            files_of(tmp_path / flush),
        )
    (sync_results, sync_files), (async_results, async_files) = runs["sync"], runs["async"]
    assert sync_results == async_results
    assert len([k for k in sync_files if k.startswith("commitlog")]) >= 2  # the log rolled over
    assert sync_files.keys() == async_files.keys()
    for name, data in sync_files.items():
        assert data == async_files[name], name


@pytest.mark.parametrize("crash", [False, True])
def test_a_sync_store_recovers_where_its_records_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash: bool
) -> None:
    store = open_store(tmp_path, "sync", monkeypatch)
    for batch in puts()[:120]:
        put(store, batch)
    end = store.get_max_phy_offset()
    queues = {q: store.get_max_offset_in_queue("TopicSync", q) for q in (0, 1, 2)}
    store.shutdown()
    if crash:  # the abort file of a killed broker: the log is re-checked record by record
        (tmp_path / "abort").touch()
    again = open_store(tmp_path, "sync", monkeypatch)
    try:
        assert again.get_max_phy_offset() == end
        assert {q: again.get_max_offset_in_queue("TopicSync", q) for q in (0, 1, 2)} == queues
        result = put(again, [msg(queue_id=1, i=7)])
        assert (result.wrote_offset, result.queue_offset) == (end, queues[1])
        got = again.get_message("g", "TopicSync", 1, queues[1], 1)
        assert got.message_count == 1
    finally:
        again.shutdown()


class MappingWrites:
    """The store's encoder, noting each record packed straight into a mapping (``write_into`` an
    ``mmap``) and each written with ``pwrite`` (the compiled ``write_file``, or ``write_into`` a
    buffer that is then written)."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder
        self.mapped = 0
        self.written = 0

    def write_into(self, buf: Any, *args: Any) -> Any:
        if isinstance(buf, mmap.mmap):
            self.mapped += 1
        else:
            self.written += 1
        return self.encoder.write_into(buf, *args)

    def write_file(self, *args: Any) -> Any:
        self.written += 1
        return self.encoder.write_file(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoder, name)


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_single_records_go_through_the_mapping_only_under_async_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flush: str
) -> None:
    store = open_store(tmp_path, flush, monkeypatch)
    try:
        enc = store._encoder = MappingWrites(store._encoder)
        for i in range(20):
            put(store, [msg(queue_id=i % 2, i=i)])
        if flush == "sync":  # a store into the mapping would dirty a whole folio for the round
            assert (enc.mapped, enc.written) == (0, 20)
        else:  # no syscall per record where the flush comes later
            assert enc.mapped == 20
    finally:
        store.shutdown()
