"""A consumer ahead of the replica it pulls from, across a controller failover.

Under SYNC_MASTER a message is readable on the master as soon as it is stored, before the slaves
hold it (the send waits for them; the pull does not, as in RocketMQ).  A push consumer that read
the newest messages is then *ahead* of a slave, and ahead of the new master when the master dies
before they were replicated (they were never acknowledged: the new epoch cuts them).  During the
failover its pulls go to a slave (the master is down), then to the new master.  Neither may send
it back to the start of the queue: a slave never moves a consumer's offset (RocketMQ's
``offsetCheckInSlave = false``: PULL_RETRY_IMMEDIATELY, the same offset, the master suggested),
and a master moves an offset past its end to that end, not to 0 (RocketMQ 4.9.4+, ISSUE #4215).
Before this, either answer sent the consumer back to offset 0 (the min offset) and it re-read its
whole queue: 2 223 of 17 560 messages in ``test_consumers_across_five_successive_failovers`` once
at load ~18.

Fast: in-process brokers whose role the test flips (``test_broker_roles``' fixture).  Slow: etcd,
a NameServer and three replicas; the slaves SIGSTOPped while the master stores a tail the consumer
reads, then all three SIGKILLed (the slaves lose what their sockets buffered) and the slaves
restarted: the new master and the other slave are behind the consumer on every queue.
"""

from __future__ import annotations

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

from controller_support import (  # noqa: E402,F401
    TOPIC,
    AckedSends,
    ControllerCluster,
    EtcdServer,
    check_acked,
    etcd_fixture,
    wait_in_sync,
)
from test_broker_roles import TOPIC as ROLE_TOPIC  # noqa: E402
from test_broker_roles import Cluster, cluster  # noqa: E402, F401
from test_controller_consumers import Consumed, max_offsets, push_consumer  # noqa: E402

from tidemq.client import BlockingProducer, BlockingPushConsumer, Message, SendResult, SendStatus  # noqa: E402
from tidemq.remoting.codes import RequestCode, ResponseCode  # noqa: E402
from tidemq.remoting.command import RemotingCommand  # noqa: E402


def pull(c: Cluster, offset: int, queue_id: int = 0) -> RemotingCommand:
    """One PULL_MESSAGE to broker-a (no suspend: the answer comes at once)."""
    fields = {
        "consumerGroup": "ahead-cg",
        "topic": ROLE_TOPIC,
        "queueId": str(queue_id),
        "queueOffset": str(offset),
        "maxMsgNums": "32",
        "sysFlag": "4",  # FLAG_SUBSCRIPTION
        "commitOffset": "0",
        "suspendTimeoutMillis": "0",
        "subscription": "*",
        "subVersion": "0",
        "expressionType": "TAG",
    }

    async def ask() -> RemotingCommand:
        return await c.a.client.invoke(
            c.a.address, RemotingCommand.request(RequestCode.PULL_MESSAGE, fields), 5.0
        )

    return c.run(ask())


def test_an_offset_past_the_end_moves_to_the_end_on_a_master_and_stays_on_a_slave(
    cluster: Cluster,  # noqa: F811 (test_broker_roles' fixture)
) -> None:
    c = cluster
    c.flip.switch("SYNC_MASTER", 2)
    c.wait_registered(0, within=5.0)
    for i in range(5):
        assert c.raw_send(b"m%d" % i).code == ResponseCode.SUCCESS
    assert c.a.store.get_max_offset_in_queue(ROLE_TOPIC, 0) == 5
    # The master: a consumer at 9 read messages this log does not hold (a deposed master's
    # unacknowledged tail): it goes on from this log's end, 5, not from 0 (its whole queue again).
    moved = pull(c, 9)
    assert moved.code == ResponseCode.PULL_OFFSET_MOVED, moved.remark
    assert moved.ext_fields["nextBeginOffset"] == "5", moved.ext_fields
    # At the end and within the queue: as before.
    assert pull(c, 5).code == ResponseCode.PULL_NOT_FOUND
    found = pull(c, 3)
    assert found.code == ResponseCode.SUCCESS and found.ext_fields["nextBeginOffset"] == "5"

    # A slave that has not copied what the consumer read yet: the consumer keeps its offset and
    # is sent to the master (brokerId 0); the slave never moves it.
    c.flip.switch("SLAVE", 3)
    c.wait_registered(1)
    for offset in (9, 6):
        kept = pull(c, offset)
        assert kept.code == ResponseCode.PULL_RETRY_IMMEDIATELY, (offset, kept.code, kept.remark)
        assert kept.ext_fields["nextBeginOffset"] == str(offset), kept.ext_fields
        assert kept.ext_fields["suggestWhichBrokerId"] == "0", kept.ext_fields
    empty = pull(c, 4, queue_id=1)  # a queue this slave holds nothing of yet
    assert empty.code == ResponseCode.PULL_RETRY_IMMEDIATELY, (empty.code, empty.remark)
    assert empty.ext_fields["nextBeginOffset"] == "4", empty.ext_fields
    # What the slave holds it serves as before.
    served = pull(c, 2)
    assert served.code == ResponseCode.SUCCESS and served.ext_fields["nextBeginOffset"] == "5"


def positions(consumer: BlockingPushConsumer | None) -> dict[int, int]:
    """The push consumer's next offset per queue of the topic (its in-memory offset table)."""
    assert consumer is not None
    table = dict(consumer.consumer.offset_store.table)  # type: ignore[attr-defined]
    return {mq.queue_id: off for mq, off in table.items() if mq.topic == TOPIC}


@pytest.mark.slow
def test_a_live_consumer_ahead_of_the_new_master_re_reads_nothing(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    """The slaves stop (SIGSTOP) while the master stores a tail the live consumer reads; all
    three are SIGKILLed, the slaves restart without the tail and one is elected.  The consumer
    pulls from a slave, then from the new master, both behind it: it re-reads nothing, and
    consumes every message acknowledged after the failover."""
    # read_uncommitted: the master serves what the slaves do not hold yet (RocketMQ 4.x, and 5 with
    # readUnCommitted); by default it does not (test_controller_confirm_offset.py), and no
    # consumer gets ahead of the new master through the master.
    group = ControllerCluster(
        spawn, tmp_path, etcd, options={"metadata_sync_s": None, "read_uncommitted": True}
    )
    master = group.wait_master()
    wait_in_sync(master, 3)
    producer = BlockingProducer("ahead-pg", group.ns, retry_times=0, send_timeout=3.0, route_refresh_s=0.5)
    producer.start()
    live = Consumed()
    consumer: BlockingPushConsumer | None = None
    send = AckedSends(producer, pause=0.2)
    acked = send.acked

    try:
        send(40)
        consumer = push_consumer(f"ahead-{uuid.uuid4().hex[:6]}", group.ns, live)
        assert wait_for(lambda: set(acked) <= live.keys(), 30), len(set(acked) - live.keys())
        slaves = [r for r in group.running() if r is not master]
        for s in slaves:
            s.server.proc.send_signal(signal.SIGSTOP)
        # One message per queue the sends wait for the slaves to acknowledge: stored and readable
        # on the master at once, and read by the consumer.
        tail: list[Future[SendResult]] = [
            producer.send_async(Message(TOPIC, b"tail-%d" % i)) for i in range(4)
        ]
        assert wait_for(lambda: len(live.keys()) >= len(acked) + 4, 10), len(live.keys()) - len(acked)
        read = max_offsets(master.addr, 4)
        # The master dies, and the slaves with what their sockets buffered of the tail: no replica
        # holds it.  They restart from their logs; one is elected.
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
        held = max_offsets(new.addr, 4)
        # The consumer is ahead of the new master (and of the slaves) on every queue.
        assert all(held[q] < read[q] for q in read), (held, read)
        # Its pulls (a slave's "retry", then the new master's "moved to my end") bring it back to
        # the new master's ends.  Sends before that would land in slots it has passed (see the
        # controller README, "A consumer ahead of the new master"): not what this test is about.
        assert wait_for(lambda: positions(consumer) == held, 20), (positions(consumer), held)
        send(40)
        assert wait_for(lambda: set(acked) <= live.keys(), 30), len(set(acked) - live.keys())
        time.sleep(1.0)  # a re-read of a whole queue would arrive within this
        print(
            f"queues held by the new master {held}, read by the consumer {read}; live consumer: "
            f"{len(live.keys())} consumed, "
            f"{live.redelivered()} re-read"
        )
        assert live.redelivered() == 0, live.redelivered()
    finally:
        if consumer is not None:
            consumer.shutdown()
        producer.shutdown()
    check_acked(acked, group.ns)
