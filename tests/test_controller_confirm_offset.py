"""Consumers read only what the in-sync set holds (the confirm offset, RocketMQ 5's confirmOffset).

On a SYNC master in controller mode a message is stored before the other members of the in-sync
set hold it; a failover cuts what they do not hold and the new epoch reuses its queue offsets.
Pulls, POP, gRPC receive and GET_MAX_OFFSET therefore stop at the offset the whole set has
acknowledged; a pull at that bound is held and answered once the set acknowledges.

Real processes: etcd, a NameServer and two (fast test) or three (slow test) controller brokers on
loopback; a slave is SIGSTOPped so that it acknowledges nothing while the master stores.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for

pytest.importorskip("httpx", reason="httpx is not installed (pip install tidemq[controller])")

from controller_support import (  # noqa: E402
    TOPIC,
    AckedSends,
    ControllerCluster,
    EtcdServer,
    check_acked,
    etcd_fixture,  # noqa: F401  (the etcd fixture)
    wait_in_sync,
)
from test_controller_consumers import Consumed, max_offsets, push_consumer  # noqa: E402

from tidemq.broker.confirmed import ReadBound  # noqa: E402
from tidemq.client import (  # noqa: E402
    BlockingProducer,
    BlockingPushConsumer,
    LoopThread,
    Message,
    SendResult,
    SendStatus,
    SimpleConsumer,
)
from tidemq.client.admin import AdminClient  # noqa: E402
from tidemq.remoting.codes import RequestCode, ResponseCode  # noqa: E402
from tidemq.remoting.command import RemotingCommand  # noqa: E402
from tidemq.store import GetStatus  # noqa: E402
from tidemq.testing.store_contract import TagFilter, build_store, message, put  # noqa: E402


def pull(addr: str, queue_id: int, offset: int, suspend_ms: int = 0) -> RemotingCommand:
    """One PULL_MESSAGE of TOPIC straight to ``addr`` (suspend_ms > 0: a long-polling pull)."""
    fields = {
        "consumerGroup": "confirm-cg",
        "topic": TOPIC,
        "queueId": queue_id,
        "queueOffset": offset,
        "maxMsgNums": 32,
        "sysFlag": 4 | (2 if suspend_ms else 0),  # FLAG_SUBSCRIPTION | FLAG_SUSPEND
        "commitOffset": 0,
        "suspendTimeoutMillis": suspend_ms,
        "subscription": "*",
        "subVersion": 0,
        "expressionType": "TAG",
    }

    async def ask() -> RemotingCommand:
        client = AdminClient("127.0.0.1:1", timeout=suspend_ms / 1000 + 5.0)
        try:
            return await client.call(addr, RequestCode.PULL_MESSAGE, fields, ok=tuple(range(-1, 100)))
        finally:
            await client.close()

    return asyncio.run(ask())


class Confirms:
    """A replication that confirms reads up to ``offset`` (None: no bound), as ConfirmsReads."""

    def __init__(self) -> None:
        self.offset: int | None = None
        self.listener: Any = None

    def confirm_offset(self) -> int | None:
        return self.offset

    def bind_confirm_listener(self, listener: Any) -> None:
        self.listener = listener


def test_reads_stop_at_the_first_record_past_the_confirm_offset_even_through_a_tag_filter(
    tmp_path: Path,
) -> None:
    store = build_store("mmap", tmp_path / "s", store_options={"commitlog_file_size": 1 << 20})
    assert store.load()
    store.start()
    try:
        starts = []
        for i in range(10):
            starts.append(
                put(store, message("T", b"m%d" % i, 0, TAGS="odd" if i % 2 else "even")).wrote_offset
            )
        repl = Confirms()
        bound = ReadBound(store, repl)
        assert bound.active and repl.listener is not None
        assert bound.limit("T", 0) is None and bound.max_offset("T", 0) == 10  # no bound: all
        repl.offset = starts[6]  # records 0..5 confirmed (record 6 starts there)
        assert bound.limit("T", 0) == 6 and bound.max_offset("T", 0) == 6
        got = bound.get_message("g", "T", 0, 4, 32)
        assert got.status is GetStatus.FOUND and got.queue_offsets == (4, 5)
        assert got.next_begin_offset == 6 and got.max_offset == 6
        at = bound.get_message("g", "T", 0, 6, 32)  # at the bound: nothing, same offset (held)
        assert at.status is GetStatus.OFFSET_OVERFLOW_ONE and at.next_begin_offset == 6
        assert bound.get_message("g", "T", 0, 8, 32).status is GetStatus.OFFSET_OVERFLOW_ONE
        # A tag filter scans past the bound: what lies beyond is dropped, the next pull starts there.
        odd = bound.get_message("g", "T", 0, 2, 32, TagFilter("odd"))
        assert odd.queue_offsets == (3, 5) and odd.next_begin_offset == 6
        assert b"".join(odd.wire_parts) == b"".join(odd.buffers)
        repl.offset = 0  # nothing confirmed: the queue reads empty from its start
        assert bound.limit("T", 0) == 0
        repl.offset = store.get_max_phy_offset()
        assert bound.limit("T", 0) is None and len(bound.get_message("g", "T", 0, 0, 32).buffers) == 10
        assert ReadBound(store, object()).active is False  # a replication without confirm_offset
    finally:
        store.shutdown()


def test_a_pull_never_returns_what_the_stopped_slave_does_not_hold_and_returns_it_once_resumed(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    group = ControllerCluster(spawn, tmp_path, etcd, replicas=2, options={"sync_timeout_s": 1.0})
    master = group.wait_master()
    wait_in_sync(master, 2)
    (slave,) = [r for r in group.running() if r is not master]
    producer = BlockingProducer("confirm-pg", group.ns, retry_times=0, send_timeout=3.0)
    producer.start()
    loop = LoopThread("confirm-pop")
    popper = SimpleConsumer("confirm-pop", group.ns, subscriptions={TOPIC: "*"}, consume_from="first")
    stopped = False
    try:
        loop.run(popper.start(), 30)
        first = producer.send(Message(TOPIC, b"replicated"))
        assert first.status is SendStatus.SEND_OK, first.status
        qid, offset = first.queue.queue_id, first.queue_offset
        got = pull(master.addr, qid, offset)
        assert got.code == ResponseCode.SUCCESS, (got.code, got.remark)

        slave.server.proc.send_signal(signal.SIGSTOP)
        stopped = True
        # Stored on the master; the slave acknowledges nothing, so the send is not acknowledged.
        tail = producer.send(Message(TOPIC, b"not on the slave"), timeout=5.0)
        assert tail.status is not SendStatus.SEND_OK, tail.status
        tq, toff = tail.queue.queue_id, tail.queue_offset
        # A pull at the tail's offset finds nothing (before: the tail, SUCCESS), and the queue's
        # max offset (the pull answer's and GET_MAX_OFFSET's) stops before it.
        held = pull(master.addr, tq, toff)
        assert held.code == ResponseCode.PULL_NOT_FOUND, (held.code, held.remark, held.ext_fields)
        assert held.ext_fields["nextBeginOffset"] == str(toff), held.ext_fields
        assert held.ext_fields["maxOffset"] == str(toff), held.ext_fields
        assert max_offsets(master.addr, 4)[tq] == toff
        # POP (what gRPC receive calls) does not return it either.
        popped = loop.run(popper.receive(32, 30.0, 1.0), 30)
        assert b"not on the slave" not in {m.body for m in popped}, [m.body for m in popped]
        # A long-polling pull waits there and is answered once the slave acknowledges.
        answer: Future[RemotingCommand] = Future()
        waiter = threading.Thread(
            target=lambda: answer.set_result(pull(master.addr, tq, toff, suspend_ms=15000)), daemon=True
        )
        waiter.start()
        time.sleep(1.0)
        assert not answer.done(), answer.result().code
        resumed = time.monotonic()
        slave.server.proc.send_signal(signal.SIGCONT)
        stopped = False
        found = answer.result(15)
        waited = time.monotonic() - resumed
        assert found.code == ResponseCode.SUCCESS, (found.code, found.remark)
        assert found.ext_fields["nextBeginOffset"] == str(toff + 1), found.ext_fields
        assert waited < 5.0, waited  # woken by the acknowledgement, not by the 15 s timeout
        assert max_offsets(master.addr, 4)[tq] == toff + 1
        popped = loop.run(popper.receive(32, 30.0, 3.0), 30)
        assert b"not on the slave" in {m.body for m in popped}, [m.body for m in popped]
    finally:
        if stopped:
            slave.server.proc.send_signal(signal.SIGCONT)
        producer.shutdown()
        loop.run(popper.shutdown(), 10)
        loop.stop()


def test_a_slave_serves_only_what_its_master_confirmed(spawn: Any, tmp_path: Path, etcd: EtcdServer) -> None:
    """Three replicas, one slave stopped: the other slave holds the new message but its master
    has not confirmed it (the stopped one lacks it), so that slave does not serve it either; the
    master's confirm offset reaches it on the HA stream once the stopped slave acknowledges."""
    options = {"sync_timeout_s": 1.0, "sync_set_timeout_s": 60.0}  # the stopped slave stays in the set
    group = ControllerCluster(spawn, tmp_path, etcd, replicas=3, options=options)
    master = group.wait_master()
    wait_in_sync(master, 3)
    reader, stopped_one = [r for r in group.running() if r is not master]
    producer = BlockingProducer("confirm-pg", group.ns, retry_times=0, send_timeout=3.0)
    producer.start()
    stopped = False
    try:
        first = producer.send(Message(TOPIC, b"replicated"))
        assert first.status is SendStatus.SEND_OK, first.status
        assert wait_for(
            lambda: pull(reader.addr, first.queue.queue_id, first.queue_offset).code == ResponseCode.SUCCESS,
            10,
        )
        stopped_one.server.proc.send_signal(signal.SIGSTOP)
        stopped = True
        tail = producer.send(Message(TOPIC, b"on one slave of two"), timeout=5.0)
        assert tail.status is not SendStatus.SEND_OK, tail.status
        tq, toff = tail.queue.queue_id, tail.queue_offset
        end = int(master.info()["commitLogMaxOffset"])
        assert wait_for(lambda: int(reader.info()["commitLogMaxOffset"]) == end, 10)  # it holds the tail
        held = pull(reader.addr, tq, toff)
        assert held.code == ResponseCode.PULL_NOT_FOUND, (held.code, held.remark, held.ext_fields)
        assert held.ext_fields["maxOffset"] == str(toff), held.ext_fields
        assert max_offsets(reader.addr, 4)[tq] == toff
        answer: Future[RemotingCommand] = Future()
        waiter = threading.Thread(
            target=lambda: answer.set_result(pull(reader.addr, tq, toff, suspend_ms=15000)), daemon=True
        )
        waiter.start()
        time.sleep(1.0)
        assert not answer.done(), answer.result().code
        resumed = time.monotonic()
        stopped_one.server.proc.send_signal(signal.SIGCONT)
        stopped = False
        found = answer.result(15)
        assert found.code == ResponseCode.SUCCESS, (found.code, found.remark)
        assert found.ext_fields["nextBeginOffset"] == str(toff + 1), found.ext_fields
        assert time.monotonic() - resumed < 5.0
    finally:
        if stopped:
            stopped_one.server.proc.send_signal(signal.SIGCONT)
        producer.shutdown()


def positions(consumer: BlockingPushConsumer | None) -> dict[int, int]:
    """The push consumer's next offset per queue of the topic (its in-memory offset table)."""
    assert consumer is not None
    table = dict(consumer.consumer.offset_store.table)  # type: ignore[attr-defined]
    return {mq.queue_id: off for mq, off in table.items() if mq.topic == TOPIC}


@pytest.mark.slow
def test_a_live_consumer_skips_no_acknowledged_message_after_a_failover_cuts_a_tail(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    """Forces the skip: the slaves stop (SIGSTOP) while the master stores one message per queue
    (the tail a failover cuts); all three are SIGKILLed (the slaves lose what their sockets
    buffered) and the slaves restart without the tail; one is elected, and 40 messages are sent
    to it at once, before the consumer's first pull there.  Before the confirm offset the consumer
    had read the tail, so it was ahead of the new master and skipped the new messages that took
    the tail's slots (4 of 40 acknowledged messages never received).  Now it never reads the tail
    and receives every acknowledged message."""
    group = ControllerCluster(spawn, tmp_path, etcd, options={"metadata_sync_s": None})
    master = group.wait_master()
    wait_in_sync(master, 3)
    producer = BlockingProducer("confirm-pg", group.ns, retry_times=0, send_timeout=3.0, route_refresh_s=0.5)
    producer.start()
    live = Consumed()
    consumer: BlockingPushConsumer | None = None
    send = AckedSends(producer)
    acked = send.acked

    try:
        send(40)
        consumer = push_consumer(f"confirm-{uuid.uuid4().hex[:6]}", group.ns, live)
        assert wait_for(lambda: set(acked) <= live.keys(), 30), len(set(acked) - live.keys())
        before = max_offsets(master.addr, 4)
        slaves = [r for r in group.running() if r is not master]
        for s in slaves:
            s.server.proc.send_signal(signal.SIGSTOP)
        tail: list[Future[SendResult]] = [
            producer.send_async(Message(TOPIC, b"tail-%d" % i)) for i in range(4)
        ]
        time.sleep(2.0)  # the push consumer's pulls would have read the tail well within this
        read = positions(consumer)
        tail_read = len(live.keys()) - len(acked)  # checked at the end, with what it costs
        master.kill()
        for s in slaves:
            s.kill()
        for f in tail:
            assert f.exception(10) is not None or f.result().status is not SendStatus.SEND_OK
        restarts = [threading.Thread(target=s.start) for s in slaves]
        for t in restarts:
            t.start()
        for t in restarts:
            t.join()
        new = group.wait_master(20)
        assert new is not master
        # At once: these land in the slots of the cut tail (when the new master holds none of it).
        send(40)
        held = max_offsets(new.addr, 4)
        wait_for(lambda: set(acked) <= live.keys(), 20)
        time.sleep(1.0)
        skipped = len(set(acked) - live.keys())
        print(
            f"queues before the tail {before}, read by the consumer {read}, the new master's after "
            f"40 sends {held}; live consumer: tail read {tail_read}, {skipped} of {len(acked)} "
            f"acknowledged never received, {live.redelivered()} re-read"
        )
        assert tail_read == 0, f"the consumer read {tail_read} messages no slave holds ({read} vs {before})"
        assert skipped == 0, f"{skipped} acknowledged messages never received"
    finally:
        if consumer is not None:
            consumer.shutdown()
        producer.shutdown()
    check_acked(acked, group.ns)
