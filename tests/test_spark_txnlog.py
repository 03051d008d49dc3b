"""The exactly-once sink's commit log and check-back rule, on real files (no Spark needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidemq_spark.options import TidemqSparkError
from tidemq_spark.txnlog import (
    RETAIN,
    BatchRecord,
    Decision,
    SinkTransactionLog,
    TxnTag,
    decide,
    local_path,
    query_key,
)

Q = query_key("/ckpt/orders")


def tag(batch: int, token: str, query: str = Q) -> TxnTag:
    return TxnTag(query, batch, token)


def test_tag_round_trips_and_garbage_is_no_tag() -> None:
    t = tag(7, "abc")
    assert TxnTag.parse(t.render()) == t
    for bad in (None, "", "x", "q/notanumber/t", "q/1/", "/1/t", "a/b/c/d"):
        assert TxnTag.parse(bad) is None


def test_query_key_is_stable_and_distinct() -> None:
    assert query_key("/ckpt/orders") == query_key("/ckpt/orders/")
    assert query_key("/ckpt/orders") != query_key("/ckpt/payments")


def test_the_first_record_of_a_batch_stands(tmp_path: Path) -> None:
    txlog = SinkTransactionLog(tmp_path / "log")
    assert txlog.get(3) is None and txlog.latest() is None
    first = txlog.record(BatchRecord(3, frozenset({"a", "b"}), 10))
    assert first.tokens == {"a", "b"}
    # A re-run of batch 3 (driver restarted after the record) cannot replace it.
    again = txlog.record(BatchRecord(3, frozenset({"c"}), 10))
    assert again.tokens == {"a", "b"}
    assert SinkTransactionLog(tmp_path / "log").get(3) == first  # durable, re-read from disk
    assert not [n for n in os.listdir(tmp_path / "log") if n.endswith(".tmp")]


def test_old_records_are_trimmed(tmp_path: Path) -> None:
    txlog = SinkTransactionLog(tmp_path)
    for b in range(RETAIN + 5):
        txlog.record(BatchRecord(b, frozenset({f"t{b}"}), 1))
    kept = txlog.batches()
    assert kept[0] == 4 and kept[-1] == RETAIN + 4


def test_check_back_rule(tmp_path: Path) -> None:
    txlog = SinkTransactionLog(tmp_path)
    txlog.record(BatchRecord(1, frozenset({"ok"}), 5))
    # The recorded attempt is delivered; a failed attempt or a dead driver's attempt is not.
    assert decide(tag(1, "ok"), Q, txlog) is Decision.COMMIT
    assert decide(tag(1, "dead-driver"), Q, txlog) is Decision.ROLLBACK
    # Batch 2 not recorded yet: being written, or to be re-run after a restart.
    assert decide(tag(2, "x"), Q, txlog) is Decision.UNKNOWN
    # Batch 0 never recorded while batch 1 is: the query went past it, it can never commit.
    assert decide(tag(0, "x"), Q, txlog) is Decision.ROLLBACK
    # Another query's message, or no tag at all: not ours to answer.
    assert decide(tag(1, "ok", query="other"), Q, txlog) is Decision.UNKNOWN
    assert decide(None, Q, txlog) is Decision.UNKNOWN


def test_unreadable_record_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "4.json").write_text("{not json")
    with pytest.raises(TidemqSparkError, match="unreadable commit record"):
        SinkTransactionLog(tmp_path).get(4)


def test_log_locations() -> None:
    assert local_path("file:///ckpt/q") == Path("/ckpt/q")
    assert local_path("/ckpt/q") == Path("/ckpt/q")
    with pytest.raises(TidemqSparkError, match="transactionLog"):
        local_path("hdfs://nn/ckpt/q")
