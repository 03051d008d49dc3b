"""The parts of tidemq_spark that run without Spark: the offline CommitLog reader and option parsing.

CommitLog files are written here record by record in RocketMQ's layout (encode_message +
patch_record), with the BLANK end-of-file marker and a zero preallocated tail as a broker leaves them.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from tidemq.message import (
    BLANK_MAGIC_CODE,
    COMPRESSED_FLAG,
    TRANSACTION_PREPARED_TYPE,
    MessageInner,
    encode_message,
    patch_record,
)
from tidemq_spark.commitlog import CorruptRecordError, iter_file, list_files
from tidemq_spark.options import QueueKey, TidemqSparkError, offsets_from_json, offsets_to_json
from tidemq_spark.sink_options import SinkOptions
from tidemq_spark.source_options import SourceOptions

FILE_SIZE = 4096


def write_commitlog(root: Path, messages: list[MessageInner]) -> list[Path]:
    """Append ``messages`` to 4 KiB CommitLog files as the broker does; returns the files."""
    d = root / "commitlog"
    d.mkdir(parents=True)
    files: list[Path] = []
    buf = bytearray(FILE_SIZE)
    base = pos = 0
    queue_offsets: dict[tuple[str, int], int] = {}

    def close_file() -> None:
        path = d / f"{base:020d}"
        path.write_bytes(bytes(buf))
        files.append(path)

    for msg in messages:
        rec = encode_message(msg)
        if pos + len(rec) + 8 > FILE_SIZE:
            struct.pack_into(">iI", buf, pos, FILE_SIZE - pos, BLANK_MAGIC_CODE)
            close_file()
            base += FILE_SIZE
            buf, pos = bytearray(FILE_SIZE), 0
        key = (msg.topic, msg.queue_id)
        qo = queue_offsets.get(key, 0)
        queue_offsets[key] = qo + 1
        patch_record(rec, qo, base + pos, 1_700_000_000_000 + qo)
        buf[pos : pos + len(rec)] = rec
        pos += len(rec)
    close_file()
    return files


def msgs(n: int, topic: str = "T") -> list[MessageInner]:
    return [
        MessageInner(
            topic, b"body-%d" % i + b"." * 300, queue_id=i % 2, properties={"TAGS": "A", "i": str(i)}
        )
        for i in range(n)
    ]


def read_all(root: Path, **kw: bool) -> list:
    return [m for f in list_files(root) for m in iter_file(f, **kw)]


def test_reads_every_record_across_files_in_order(tmp_path: Path) -> None:
    files = write_commitlog(tmp_path, msgs(40))
    assert len(files) > 2
    got = read_all(tmp_path)
    assert [m.body[: m.body.index(b".")] for m in got] == [b"body-%d" % i for i in range(40)]
    assert [m.queue_offset for m in got if m.queue_id == 1] == list(range(20))
    assert [f.base_offset for f in list_files(tmp_path)] == [i * FILE_SIZE for i in range(len(files))]
    # the commitlog dir itself is accepted too
    assert len(read_all(tmp_path / "commitlog")) == 40


def test_transactional_halves_are_left_out_and_bodies_stay_raw(tmp_path: Path) -> None:
    body = zlib.compress(b"z" * 1000)
    m = [
        MessageInner("T", b"plain"),
        MessageInner("T", b"half", sys_flag=TRANSACTION_PREPARED_TYPE),
        MessageInner("T", body, sys_flag=COMPRESSED_FLAG),
    ]
    write_commitlog(tmp_path, m)
    got = read_all(tmp_path)
    assert [g.body for g in got] == [b"plain", body]  # decompression is the schema builder's job


def test_corrupt_record_is_named_or_skipped(tmp_path: Path) -> None:
    files = write_commitlog(tmp_path, msgs(40))
    data = bytearray(files[1].read_bytes())
    data[100] ^= 0xFF  # inside the body of the file's first record
    files[1].write_bytes(bytes(data))
    assert len(read_all(tmp_path)) == 40  # no CRC check: the damage goes unnoticed
    with pytest.raises(
        CorruptRecordError, match=rf"{files[1].name} at file position 0 \(commit-log offset {FILE_SIZE}\)"
    ):
        read_all(tmp_path, check_crc=True)
    assert len(read_all(tmp_path, check_crc=True, skip_corrupt=True)) == 39

    # a broken header: no later record boundary in that file can be trusted, the rest is skipped
    in_first = len(list(iter_file(list_files(tmp_path)[0])))
    data = bytearray(files[0].read_bytes())
    data[4:8] = b"\x00\x00\x00\x01"
    files[0].write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="bad record header"):
        read_all(tmp_path)
    assert len(read_all(tmp_path, skip_corrupt=True)) == 40 - in_first


def test_bad_store_path_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TidemqSparkError, match="no commitlog/ directory"):
        list_files(tmp_path)
    with pytest.raises(TidemqSparkError, match="is not a directory"):
        list_files(tmp_path / "missing")


def test_offsets_json_round_trip_and_errors() -> None:
    spec = {"A": {"broker-a:0": 5, "broker-b:3": -2}}
    parsed = offsets_from_json(spec, "x")
    assert parsed == {QueueKey("A", "broker-a", 0): 5, QueueKey("A", "broker-b", 3): -2}
    assert offsets_to_json(parsed) == spec
    with pytest.raises(TidemqSparkError, match="'<broker name>:<queue id>'"):
        offsets_from_json('{"A": {"broker-a": 1}}', "startingOffsets")
    with pytest.raises(TidemqSparkError, match="neither earliest/latest nor JSON"):
        offsets_from_json("{oops", "startingOffsets")
    with pytest.raises(TidemqSparkError, match="integer >= 0"):
        offsets_from_json('{"A": {"b:1": -7}}', "startingOffsets")


def test_source_and_sink_options() -> None:
    o = SourceOptions.parse({"namesrv": "h:1", "topic": "A, B,A"}, streaming=False)
    assert (o.topics, o.starting, o.ending, o.commit_offsets) == (("A", "B"), "earliest", "latest", False)
    s = SourceOptions.parse({"namesrv": "h:1", "topicPattern": "Ord.*", "consumerGroup": "g"}, streaming=True)
    assert (s.starting, s.commit_offsets, s.consumer_group) == ("latest", True, "g")
    for bad, message in [
        ({"topic": "A"}, "needs option 'namesrv'"),
        ({"namesrv": "h:1"}, "exactly one of the options"),
        ({"namesrv": "h:1", "topic": "A", "topicPattern": "B"}, "exactly one of the options"),
        ({"namesrv": "h:1", "topic": "A", "filterType": "XPATH"}, "choices: TAG, SQL92"),
        ({"namesrv": "h:1", "topic": "A", "pullBatchSize": "5000"}, "must be <= 1024"),
        ({"namesrv": "h:1", "topic": "A", "failOnDataLoss": "maybe"}, "not true or false"),
        ({"namesrv": "h:1", "topic": "A", "endingOffsets": "earliest"}, "not allowed"),
        ({"namesrv": "h:1", "topic": "A", "startingOffsets": "committed"}, "needs option 'consumerGroup'"),
    ]:
        with pytest.raises(TidemqSparkError, match=message):
            SourceOptions.parse(bad, streaming=False)
    with pytest.raises(TidemqSparkError, match="batch reads only"):
        SourceOptions.parse({"namesrv": "h:1", "topic": "A", "endingOffsets": "latest"}, streaming=True)
    assert SinkOptions.parse({"namesrv": "h:1"}).topic is None
    with pytest.raises(TidemqSparkError, match="4 MiB"):
        SinkOptions.parse({"namesrv": "h:1", "maxBatchBytes": str(8 << 20)})


def test_rate_limit_caps_a_micro_batch_and_shares_it_by_backlog() -> None:
    from tidemq_spark.options import rate_limit

    a, b, c = (QueueKey("T", "b", i) for i in range(3))
    begin = {a: 0, b: 10, c: 5}
    end = {a: 100, b: 40, c: 5}
    capped = rate_limit(begin, end, 26)
    taken = {k: capped[k] - begin[k] for k in end}
    assert sum(taken.values()) == 26 and taken[c] == 0  # the whole budget, nothing lost to rounding
    assert taken[a] > taken[b] > 0  # 100 behind vs 30 behind
    assert all(begin[k] <= capped[k] <= end[k] for k in end)
    assert rate_limit(begin, end, 1000) == end
    # ReadMaxRows(7) over two equal backlogs: 7 rows, not 3 + 3.
    two = rate_limit({a: 0, b: 0}, {a: 10, b: 10}, 7)
    assert sum(two.values()) == 7 and sorted(two.values()) == [3, 4]
    new_queue = QueueKey("T", "b", 9)
    assert rate_limit(begin, {**end, new_queue: 3}, 1000)[new_queue] == 3  # unknown start counts from 0
