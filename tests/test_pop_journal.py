"""The POP journal and ack handles, without a broker: replay, torn tails, compaction, formats."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from tidemq.broker.pop.handle import AckHandle, HandleError, info_items, parse_info, real_topic, retry_mark
from tidemq.broker.pop.journal import (
    Checkpoint,
    Journal,
    ack_record,
    done_record,
    live_records,
    offset_record,
)
from tidemq.broker.processors.pop import bitset_offsets, encode_bitset


def ck(i: int, offsets: tuple[int, ...], nxt: int, topic: str = "T", attempt: int = 0) -> Checkpoint:
    return Checkpoint(i, "G", topic, 1, 1_000 + i, 30_000, 0, nxt, attempt, offsets)


def test_replay_applies_acks_retires_done_and_keeps_the_last_offset(tmp_path: Path) -> None:
    j = Journal(tmp_path / "pop" / "journal.log")
    assert j.replay().checkpoints == {}
    j.append(ck(1, (0, 1, 2), 3).record())
    j.append(ck(2, (3, 5), 6).record())
    j.append(ack_record(1, 0b101))
    j.append(ack_record(2, 0b11))  # all of 2: retired at replay
    j.append(ck(3, (6,), 7, topic="%RETRY%G_T").record())
    j.append(done_record(3))
    j.append(ck(4, (9,), -1).record())  # a change of invisibility: moves no offset
    j.append(offset_record("G", "T", 2, 40))
    j.close()
    # a torn last record (the crash hit mid-write) is ignored and cut
    with open(j.path, "ab") as f:
        f.write(b"A 1 ff")
    j2 = Journal(j.path)
    state = j2.replay()
    assert sorted(state.checkpoints) == [1, 4]
    assert state.checkpoints[1].unacked() == [1]
    assert state.offsets == {("G", "T", 1): 6, ("G", "%RETRY%G_T", 1): 7, ("G", "T", 2): 40}
    assert state.last_id == 4
    assert j.path.read_bytes().endswith(b"\n")
    # compaction keeps exactly the live state
    j2.rewrite(live_records(state.offsets, state.checkpoints.values()))
    j2.close()
    again = Journal(j.path).replay()
    assert {i: c.acked for i, c in again.checkpoints.items()} == {1: 0b101, 4: 0}
    assert again.offsets == state.offsets


def test_garbage_lines_are_skipped_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "journal.log"
    path.write_bytes(b"C x y\nZ 1\n\xff\xfe\n" + ck(7, (1,), 2).record())
    state = Journal(path).replay()
    assert list(state.checkpoints) == [7] and state.skipped == 3


def test_ack_handles_are_rocketmqs_extra_info() -> None:
    # ExtraInfoUtil.buildExtraInfo(ckQueueOffset, popTime, invisibleTime, reviveQid, topic, brokerName,
    # queueId, msgQueueOffset), space separated; retry mark 1 for %RETRY%<group>_<topic>
    h = AckHandle.parse("17 1700000000000 30000 0 1 broker-a 0 19")
    assert (h.ck_offset, h.pop_time, h.invisible_time, h.retry, h.broker_name, h.queue_id, h.offset) == (
        17,
        1700000000000,
        30000,
        "1",
        "broker-a",
        0,
        19,
    )
    assert h.format() == "17 1700000000000 30000 0 1 broker-a 0 19"
    assert AckHandle.parse("5 1 2 0 0 b 3").offset == 5  # 7 items: the offset is the ck offset
    for bad in ("", "1 2 3", "a b c d 0 x 0 0", "1 2 3 4 7 x 0 0"):
        with pytest.raises(HandleError):
            AckHandle.parse(bad)
    assert retry_mark("T") == "0" and retry_mark("%RETRY%G_T") == "1" and retry_mark("%RETRY%G+T") == "2"
    assert real_topic("T", "G", "1") == "%RETRY%G_T" and real_topic("T", "G", "2") == "%RETRY%G+T"
    assert info_items([("0", 1, "5"), ("1", 0, "7,8")]) == "0 1 5;1 0 7,8"
    assert parse_info("0 1 5;1 0 7,8") == {"0@1": "5", "1@0": "7,8"}


def test_a_malformed_info_item_is_refused_by_the_broker_and_passed_over_by_a_client() -> None:
    # The broker refuses an info header it cannot read; a POP client (tidemq.client.SimpleConsumer,
    # the gRPC proxy) reading a broker's answer keeps the items it can read.
    with pytest.raises(HandleError):
        parse_info("0 1 5;bad")
    assert parse_info("0 1 5;bad;1 0 7", skip_malformed=True) == {"0@1": "5", "1@0": "7"}
    assert parse_info(None, skip_malformed=True) == {} and parse_info("", skip_malformed=True) == {}


def test_batch_ack_bit_sets_are_javas_bitset_bytes() -> None:
    # BitSet.valueOf(bytes) / toByteArray(): little-endian, bit i is startOffset + i
    assert bitset_offsets(base64.b64encode(bytes([0b101, 0b1])).decode(), 100) == [100, 102, 108]
    assert bitset_offsets(encode_bitset([3, 4, 40], 3), 3) == [3, 4, 40]
    with pytest.raises(ValueError):
        bitset_offsets(base64.b64encode(b"\x01" * 9000).decode(), 0)
    with pytest.raises(ValueError):
        bitset_offsets(12, 0)


def test_acl_resources_of_pop_requests() -> None:
    import orjson

    from tidemq.remoting.codes import RequestCode
    from tidemq.remoting.command import RemotingCommand
    from tidemq_acl.permission import ADMIN_CODES, SUB
    from tidemq_acl.resources import needed_resources

    pop = RemotingCommand.request(RequestCode.POP_MESSAGE, {"consumerGroup": "G", "topic": "T"})
    assert needed_resources(pop) == {"%RETRY%G": SUB, "T": SUB}
    ack = RemotingCommand.request(RequestCode.ACK_MESSAGE, {"consumerGroup": "G", "topic": "%RETRY%G_T"})
    assert needed_resources(ack) == {"%RETRY%G": SUB, "T": SUB}
    body = orjson.dumps({"acks": [{"c": "G", "t": "T"}, {"c": "H", "t": "U"}]})
    batch = RemotingCommand.request(RequestCode.BATCH_ACK_MESSAGE, {}, body)
    assert needed_resources(batch) == {"%RETRY%G": SUB, "T": SUB, "%RETRY%H": SUB, "U": SUB}
    assign = RemotingCommand.request(
        RequestCode.QUERY_ASSIGNMENT, {}, orjson.dumps({"topic": "T", "consumerGroup": "G"})
    )
    assert needed_resources(assign) == {"%RETRY%G": SUB, "T": SUB}
    assert RequestCode.SET_MESSAGE_REQUEST_MODE in ADMIN_CODES


def test_revive_log_replay_takes_complete_snapshots_and_ignores_interrupted_ones() -> None:
    from tidemq.broker.pop.revive_log import _Reader

    r = _Reader()
    r.feed(ck(1, (0, 1), 2).record() + ck(2, (2,), 3).record())
    r.feed(ack_record(1, 0b1))
    # A complete snapshot (two chunks) replaces what came before it: checkpoint 2 is gone.
    r.feed(b"S s1 0 2 7\n" + ck(1, (0, 1), 2).record() + ack_record(1, 0b1))
    r.feed(b"S s1 1 2 7\n" + offset_record("G", "T", 1, 9))
    r.feed(ack_record(1, 0b10))  # after it: applied
    r.feed(ck(3, (9,), 10).record())
    # An interrupted snapshot (chunk 0 of 2, then ordinary records): not taken.
    r.feed(b"S s2 0 2 9\n")
    r.feed(ck(4, (10,), 11).record())
    state = r.finish()
    state.prune()
    assert sorted(state.checkpoints) == [3, 4]  # 1 fully acknowledged, 2 dropped by the snapshot
    assert state.offsets[("G", "T", 1)] == 11
    assert state.last_id == 7  # the snapshot's highest id handed out, not the highest seen
