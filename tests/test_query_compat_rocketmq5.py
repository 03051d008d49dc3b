"""Operators' and clients' queries answered as RocketMQ 5's broker answers them.

Four answers that differed from RocketMQ 5 (apache/rocketmq 5.x, read in its source):

* ``dispatchBehindBytes`` (GET_BROKER_RUNTIME_INFO, ``brokerStatus``) is the confirm offset minus
  the reput offset (``ReputMessageService.behind()``), not the log's end minus it;
* QUERY_CONSUMER_OFFSET's first start answers 0 only when entry 0 is there and in memory
  (``checkInMemByConsumeOffset(topic, queueId, 0, 1)``), else QUERY_NOT_FOUND, on which the
  client takes its ConsumeFromWhere (by default the queue's end);
* SEARCH_OFFSET_BY_TIMESTAMP reads ``boundaryType`` (LOWER, the default: the first offset at or
  after the time; UPPER: the last one at or before it);
* GET_TOPIC_STATS_INFO (``topicStatus``) lists max(read, write) queues.

An in-process NameServer and broker (real mmap store, remoting on loopback), the confirm offset
held by the test as in ``test_query_confirm_bound``; the requests go through the remoting client
and ``tidemq admin`` commands.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import test_query_confirm_bound as bound
from test_query_confirm_bound import Cluster

from tidemq.client.admin import AdminError
from tidemq.message import MessageInner
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.protocol import TopicConfig

pytestmark = pytest.mark.timeout(120)

# The broker and its held confirm offset: test_query_confirm_bound's fixtures (one broker per module).
module_cluster = bound.module_cluster
cluster = bound.cluster


def _topic(cluster: Cluster, name: str, queues: int = 2) -> str:
    cluster.broker.topics.update(TopicConfig(name, read_queue_nums=queues, write_queue_nums=queues))
    return name


def _call(cluster: Cluster, code: int, fields: dict[str, Any]) -> RemotingCommand:
    strs = {k: str(v) for k, v in fields.items()}
    return cluster.ask(lambda c: c.call(cluster.addr, code, strs, ok=(0, ResponseCode.QUERY_NOT_FOUND)))


# ---------------------------------------------------------------------- dispatchBehindBytes
def _dispatch_behind(cluster: Cluster) -> int:
    code, out = cluster.admin("brokerStatus", "-b", cluster.addr)
    assert code == 0, out
    line = next(ln for ln in out.splitlines() if ln.startswith("dispatchBehindBytes"))
    return int(line.split(":", 1)[1])


def test_dispatch_behind_is_confirm_offset_minus_reput_offset(tmp_path: Path) -> None:
    """A replica that received the first half of a record cannot dispatch it yet.  Without a
    confirm bound RocketMQ counts those bytes as behind (its confirm offset is the log's end);
    with the confirm offset at the last whole record it does not (``behind()`` = confirm - reput:
    0), where tidemq said the half record's size (the log's end minus the reput offset)."""
    c = Cluster(tmp_path)
    try:
        store = c.broker.store
        whole = c.put("QcLag", 0, b"a record")
        record = store.look_message_by_offset(whole.wrote_offset, whole.wrote_bytes)
        assert record is not None and _dispatch_behind(c) == 0
        end = store.get_max_phy_offset()
        half = record[: len(record) // 2]
        assert store.append_to_commit_log(end, half)  # the replication path, mid-record
        assert store.get_max_phy_offset() == end + len(half)
        assert _dispatch_behind(c) == len(half)  # no bound: the log's end is the confirm offset
        c.confirms.offset = end  # the in-sync set holds the whole records only
        assert _dispatch_behind(c) == 0  # before: len(half)
    finally:
        c.stop()


# ---------------------------------------------------------------------- QUERY_CONSUMER_OFFSET
def _first_start(cluster: Cluster, group: str, topic: str, queue_id: int) -> int | None:
    """QUERY_CONSUMER_OFFSET of a group that never committed: the offset, None for QUERY_NOT_FOUND."""
    resp = _call(
        cluster,
        RequestCode.QUERY_CONSUMER_OFFSET,
        {"consumerGroup": group, "topic": topic, "queueId": queue_id},
    )
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    return int(resp.ext_fields["offset"])


def test_first_start_of_an_empty_queue_reads_from_0(cluster: Cluster) -> None:
    """An empty queue answers 0 (RocketMQ 4.9; 5.1+ answers QUERY_NOT_FOUND): a new group then
    reads the first message stored after it asked, which the client's next request (the end, for
    CONSUME_FROM_LAST_OFFSET) would skip.  After the first message, still 0."""
    topic = _topic(cluster, "QcoEmpty")
    assert _first_start(cluster, "g-empty", topic, 0) == 0
    cluster.put(topic, 0, b"first")
    assert _first_start(cluster, "g-empty", topic, 0) == 0


def test_first_start_with_entry_0_unconfirmed_reads_from_0(cluster: Cluster) -> None:
    """Entry 0 past the confirm offset is not readable yet: the queue answers as an empty one (0),
    and the group reads the message once it is confirmed."""
    topic = _topic(cluster, "QcoHeld")
    cluster.hold()
    time.sleep(0.05)
    cluster.put(topic, 0, b"held")
    assert _first_start(cluster, "g-held", topic, 0) == 0
    cluster.confirm()
    assert _first_start(cluster, "g-held", topic, 0) == 0


def _memory_ratio(cluster: Cluster, percent: int) -> None:
    """``[broker] access_message_in_memory_max_ratio``, changed over the wire (updateBrokerConfig)."""

    async def update(c: Any) -> RemotingCommand:
        return await c.call(
            cluster.addr,
            RequestCode.UPDATE_BROKER_CONFIG,
            {},
            body=f"accessMessageInMemoryMaxRatio={percent}\n".encode(),
        )

    resp = cluster.ask(update)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert cluster.broker.settings.access_message_in_memory_max_ratio == percent


def test_an_out_of_range_memory_ratio_over_the_wire_is_refused_and_the_old_one_kept(cluster: Cluster) -> None:
    before = cluster.broker.settings.access_message_in_memory_max_ratio
    for bad, reason in (
        ("150", "must be >= 0 and <= 100"),
        ("-1", "must be >= 0 and <= 100"),
        ("abc", "integer"),
    ):

        async def update(c: Any, bad: str = bad) -> str:
            try:
                await c.call(
                    cluster.addr,
                    RequestCode.UPDATE_BROKER_CONFIG,
                    {},
                    body=f"accessMessageInMemoryMaxRatio={bad}\n".encode(),
                )
            except AdminError as exc:
                return str(exc)
            return "accepted"

        refused = cluster.ask(update)
        assert "SYSTEM_ERROR" in refused and reason in refused, (bad, refused)
        assert cluster.broker.settings.access_message_in_memory_max_ratio == before


def test_first_start_on_a_backlog_out_of_memory_is_not_found(cluster: Cluster) -> None:
    """A queue whose entry 0 lies further behind the log's end than the memory RocketMQ keeps
    messages in (accessMessageInMemoryMaxRatio of RAM; here 0 %): QUERY_NOT_FOUND, so a new group
    with CONSUME_FROM_LAST_OFFSET starts at the end instead of replaying the backlog (before: 0);
    a committed offset is answered as is.  With the ratio back at its default (40 %) entry 0 is
    in memory again: 0.  The store's pull rule reads the same option: its pulls behind the window
    are told to go to a slave."""
    old, new = _topic(cluster, "QcoBacklog"), _topic(cluster, "QcoFresh")
    cluster.put(old, 0, b"old message")
    for i in range(4):
        cluster.put(old, 1, b"filler %d" % i)
    cluster.put(new, 0, b"new message")
    store = cluster.broker.store
    assert _first_start(cluster, "g-fresh", old, 0) == 0  # the default: a few hundred bytes are in memory
    _memory_ratio(cluster, 0)
    try:
        assert _first_start(cluster, "g-backlog", old, 0) is None
        assert store.get_message("g-backlog", old, 0, 0, 1).suggest_pulling_from_slave
        _call(
            cluster,
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "g-backlog", "topic": old, "queueId": 0, "commitOffset": 1},
        )
        assert _first_start(cluster, "g-backlog", old, 0) == 1
    finally:
        _memory_ratio(cluster, 40)
    assert _first_start(cluster, "g-other", old, 0) == 0
    assert _first_start(cluster, "g-other", new, 0) == 0
    assert not store.get_message("g-other", old, 0, 0, 1).suggest_pulling_from_slave


# ---------------------------------------------------------------------- SEARCH_OFFSET_BY_TIMESTAMP
def _search(cluster: Cluster, topic: str, ts: int, boundary: str | None = None) -> int:
    fields: dict[str, Any] = {"topic": topic, "queueId": 0, "timestamp": ts}
    if boundary is not None:
        fields["boundaryType"] = boundary
    return int(_call(cluster, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, fields).ext_fields["offset"])


def test_search_offset_boundary_type(cluster: Cluster) -> None:
    """Offsets 1-4 share one store time (one batch): LOWER (the default, and what older clients
    get by not sending the field) answers 1, UPPER 4 (before: 1 for both).  For a time between
    two entries LOWER is the next, UPPER the previous; past the end LOWER is the end, UPPER the
    last entry; under a confirm offset UPPER stops at the last confirmed entry."""
    topic = _topic(cluster, "QcoTime")
    cluster.put(topic, 0, b"before")
    time.sleep(0.05)
    batch = [MessageInner(topic, b"same %d" % i, 0, store_host=("127.0.0.1", 10911)) for i in range(4)]
    assert cluster.broker.store.put_messages(batch).result(10).ok
    time.sleep(0.05)
    cluster.put(topic, 0, b"after")
    store = cluster.broker.store
    times = [store.get_store_time(topic, 0, i) for i in range(6)]
    assert times[1] == times[2] == times[3] == times[4]
    assert times[0] < times[1] < times[5]
    same = times[1]

    assert _search(cluster, topic, same) == 1
    assert _search(cluster, topic, same, "LOWER") == 1
    assert _search(cluster, topic, same, "UPPER") == 4
    assert _search(cluster, topic, same, "upper") == 4  # BoundaryType.getType ignores case
    assert _search(cluster, topic, same, "neither") == 1
    assert _search(cluster, topic, same + 1, "LOWER") == 5
    assert _search(cluster, topic, same + 1, "UPPER") == 4
    assert _search(cluster, topic, times[0] - 1, "UPPER") == 0
    assert _search(cluster, topic, times[5] + 1, "LOWER") == 6
    assert _search(cluster, topic, times[5] + 1, "UPPER") == 5

    cluster.hold()
    time.sleep(0.05)
    cluster.put(topic, 0, b"held")
    held_time = store.get_store_time(topic, 0, 6)
    assert _search(cluster, topic, held_time, "UPPER") == 5
    assert _search(cluster, topic, held_time, "LOWER") == 6
    cluster.confirm()
    assert _search(cluster, topic, held_time, "UPPER") == 6


# ---------------------------------------------------------------------- GET_TOPIC_STATS_INFO
def test_topic_status_lists_read_queues_beyond_the_write_queues(cluster: Cluster) -> None:
    """``updateTopic -r 8 -w 4`` after messages went to queue 6: ``topicStatus`` still shows the
    8 queues (RocketMQ 5 walks max(read, write)), queue 6 with its message (before: 4 rows)."""
    topic = "QcoShrink"
    code, out = cluster.admin("updateTopic", "-b", cluster.addr, "-t", topic, "-r", "8", "-w", "8")
    assert code == 0, out
    cluster.put(topic, 6, b"in queue 6")
    code, out = cluster.admin("updateTopic", "-b", cluster.addr, "-t", topic, "-r", "8", "-w", "4")
    assert code == 0, out
    cfg = cluster.broker.topics.get(topic)
    assert cfg is not None and (cfg.read_queue_nums, cfg.write_queue_nums) == (8, 4)

    code, out = cluster.admin("topicStatus", "-t", topic)
    assert code == 0, out
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("broker-q")]
    assert sorted(int(r[1]) for r in rows) == list(range(8)), out
    q6 = next(r for r in rows if r[1] == "6")
    assert (q6[2], q6[3]) == ("0", "1"), out
