"""The confirm offset across a promotion and across a slave's restart with a shorter log.

1. A slave holds a tail its master never confirmed (another member of the in-sync set was
   stopped); a consumer's long-polling pull waits on that slave at the tail.  The master dies and
   this slave is elected: it confirms what it holds (its log is the new epoch's start), so the
   held pull must be answered at once, not after its whole suspend time (before: the promotion
   changed the confirm offset without calling the confirm listener, and nothing woke the pull).
2. A member of the set comes back (restarted after a crash with async flush, or truncated) with a
   shorter log than it had acknowledged.  The master must count what it reports now, not the
   higher offset of its previous connection: before, it kept the old one, so the other member's
   acknowledgement confirmed a tail the restarted one does not hold, and a member that had lost
   acknowledged messages stayed in the in-sync set (electable) until the set's timeout.

Real processes: etcd, a NameServer and three controller brokers on loopback.  In (2) the restarted
member is the test speaking the HA protocol on a loopback socket (hello with its broker id and
epoch, then 8-byte offset reports): a real slave catches up in milliseconds on loopback, so only a
slave that reports and then stalls shows which offset the master counts.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for

pytest.importorskip("httpx", reason="httpx is not installed (pip install tidemq[controller])")

from controller_support import (  # noqa: E402
    TOPIC,
    ControllerCluster,
    EtcdServer,
    Replica,
    commit_log,
    etcd_fixture,  # noqa: F401  (the etcd fixture)
    sync_set,
    wait_in_sync,
)
from test_controller_confirm_offset import pull  # noqa: E402

from tidemq.client import BlockingProducer, Message, SendStatus  # noqa: E402
from tidemq.remoting.codes import ResponseCode  # noqa: E402
from tidemq.remoting.command import RemotingCommand  # noqa: E402
from tidemq_ha_replication.wire import (  # noqa: E402
    HELLO_MAGIC,
    REPORT,
    encode_hello,
    read_hello_body,
    recv_exact,
)

#: Stopped or killed members stay in the in-sync set for the whole test.
OPTIONS = {"sync_timeout_s": 1.0, "sync_set_timeout_s": 60.0}


def end_of(replica: Replica) -> int:
    return int(replica.info()["commitLogMaxOffset"])


def three_in_sync(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> tuple[ControllerCluster, Replica, tuple[Replica, Replica], BlockingProducer]:
    """Three replicas, all in the master's in-sync set, and a started producer: the group, the
    master, its two slaves and the producer (the caller shuts it down)."""
    group = ControllerCluster(spawn, tmp_path, etcd, replicas=3, options=OPTIONS)
    master = group.wait_master()
    wait_in_sync(master, 3)
    first, second = [r for r in group.running() if r is not master]
    producer = BlockingProducer("promote-pg", group.ns, retry_times=0, send_timeout=3.0)
    producer.start()
    return group, master, (first, second), producer


def test_a_pull_held_on_a_slave_is_answered_when_that_slave_is_promoted(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    group, master, (reader, stopped_one), producer = three_in_sync(spawn, tmp_path, etcd)
    stopped = False
    try:
        first = producer.send(Message(TOPIC, b"replicated"))
        assert first.status is SendStatus.SEND_OK, first.status
        stopped_one.server.proc.send_signal(signal.SIGSTOP)
        stopped = True
        tail = producer.send(Message(TOPIC, b"on the reader, not confirmed"), timeout=5.0)
        assert tail.status is not SendStatus.SEND_OK, tail.status
        tq, toff = tail.queue.queue_id, tail.queue_offset
        end = end_of(master)
        assert wait_for(lambda: end_of(reader) == end, 10)  # the reader holds the tail
        answer: Future[RemotingCommand] = Future()
        waiter = threading.Thread(
            target=lambda: answer.set_result(pull(reader.addr, tq, toff, suspend_ms=25000)), daemon=True
        )
        waiter.start()
        time.sleep(1.0)
        assert not answer.done(), answer.result().ext_fields  # held: its master confirmed less
        master.kill()
        # The stopped member cannot campaign: the reader wins, with the tail as its epoch's start.
        assert wait_for(lambda: reader.role() == "SYNC_MASTER", 20), reader.log()
        promoted = time.monotonic()
        found = answer.result(30)
        waited = time.monotonic() - promoted
        assert found.code == ResponseCode.SUCCESS, (found.code, found.remark, found.ext_fields)
        assert found.ext_fields["nextBeginOffset"] == str(toff + 1), found.ext_fields
        # Woken by the promotion (before: the whole 25 s suspend, about 20 s after promotion).
        assert waited < 5.0, waited
    finally:
        if stopped:
            stopped_one.server.proc.send_signal(signal.SIGCONT)
        producer.shutdown()


class RawSlave:
    """A member of the group speaking the HA protocol from the test: it reports ``offset`` (its
    commit-log end) every 0.5 s and never reads the stream, like a slave that stalls after its
    handshake."""

    def __init__(self, ha_addr: str, broker_id: int, epoch: int, offset: int) -> None:
        host, port = ha_addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5.0)
        hello = {"compression": [], "digest": [], "brokerId": broker_id, "epoch": epoch, "confirm": True}
        self.sock.sendall(encode_hello(hello))
        assert recv_exact(self.sock, len(HELLO_MAGIC)) == HELLO_MAGIC
        reply = read_hello_body(self.sock)
        assert not reply.get("error") and reply.get("epoch") == epoch, reply
        self.offset = offset
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.report(offset)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def report(self, offset: int) -> None:
        with self._lock:
            self.offset = offset
            self.sock.sendall(REPORT.pack(offset))

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.report(self.offset)
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def hold_a_tail(
    producer: BlockingProducer, master: Replica, stopped_one: Replica
) -> tuple[int, int, int, int]:
    """A message the whole set acknowledged, then ``stopped_one`` stopped (SIGSTOP) and a tail the
    master and the other member hold, that member's report of it recorded by the master (the
    send itself not acknowledged): the acknowledged end, the tail's queue and offset, the end."""
    first = producer.send(Message(TOPIC, b"held by the whole set"))
    assert first.status is SendStatus.SEND_OK, first.status
    acked_end = end_of(master)
    stopped_one.server.proc.send_signal(signal.SIGSTOP)
    tail = producer.send(Message(TOPIC, b"not acknowledged"), timeout=5.0)
    assert tail.status is not SendStatus.SEND_OK, tail.status
    end = end_of(master)
    assert wait_for(lambda: master.info()["haSlaveAckOffset"] == str(end), 10), master.info()
    return acked_end, tail.queue.queue_id, tail.queue_offset, end


def test_a_member_back_with_a_shorter_log_is_counted_at_what_it_holds_now(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    group, master, (restarted, stopped_one), producer = three_in_sync(spawn, tmp_path, etcd)
    stopped = False
    raw: RawSlave | None = None
    try:
        stopped = True  # (set first: the finally resumes it whatever fails in between)
        acked_end, tq, toff, end = hold_a_tail(producer, master, stopped_one)
        restarted.kill()
        assert wait_for(lambda: master.info()["haConnectedSlaves"] == "1", 10), master.info()
        # Its connection closed: out of the in-sync set, etcd first, before it is back (RocketMQ
        # 5's removeConnection; before session 13 it stayed listed, electable, until its first
        # report on a new connection, though it may come back without acknowledged messages).
        others = {master.broker_id, stopped_one.broker_id}
        assert wait_for(lambda: sync_set(master) == others, 5), master.info()
        # Back with its log cut to what the set acknowledged (the unacknowledged tail lost).
        epoch = int(master.info()["controllerEpoch"])
        raw = RawSlave(master.ha, restarted.broker_id, epoch, acked_end)
        assert wait_for(lambda: master.info()["haConnectedSlaves"] == "2", 10), master.info()
        # It holds everything acknowledged (the confirm offset): back in the set (RocketMQ 5's
        # maybeExpandInSyncStateSet).  The other member acknowledges the tail, the restarted one
        # holds less: not confirmed.  (Before: the restarted member's old offset counted, and
        # the tail became readable.)
        assert wait_for(lambda: sync_set(master) == {1, 2, 3}, 5), master.info()
        stopped_one.server.proc.send_signal(signal.SIGCONT)
        stopped = False
        assert wait_for(lambda: 0 in lags(master), 10), master.info()
        time.sleep(0.5)
        held = pull(master.addr, tq, toff)
        assert held.code == ResponseCode.PULL_NOT_FOUND, (held.code, held.ext_fields)
        assert held.ext_fields["maxOffset"] == str(toff), held.ext_fields
        assert sync_set(master) == {1, 2, 3}
        # Once it really holds the tail, the tail is confirmed.
        raw.report(end)
        assert wait_for(lambda: pull(master.addr, tq, toff).code == ResponseCode.SUCCESS, 5)

        # Back again, now without a message the set acknowledged (everything up to `end` is):
        # out of the in-sync set (not electable) until it holds it again, and the confirm offset
        # stays where it was (nothing readable goes away).
        raw.close()
        assert wait_for(lambda: master.info()["haConnectedSlaves"] == "1", 10), master.info()
        raw = RawSlave(master.ha, restarted.broker_id, epoch, acked_end)
        assert wait_for(lambda: sync_set(master) == others, 5), master.info()
        assert pull(master.addr, tq, toff).code == ResponseCode.SUCCESS
        raw.report(end)
        assert wait_for(lambda: sync_set(master) == {1, 2, 3}, 5), master.info()
    finally:
        if stopped:
            stopped_one.server.proc.send_signal(signal.SIGCONT)
        if raw is not None:
            raw.close()
        producer.shutdown()


def lags(master: Replica) -> list[int]:
    """How far behind the master's end each connected slave's last report is (``haSlaves``)."""
    return [int(part.rsplit("=", 1)[1]) for part in master.info()["haSlaves"].split(";") if part]


def cut_commit_log(replica: Replica, end: int) -> None:
    """Cut the stopped replica's commit log to ``end`` (its store and index as the broker composes
    them): what a crash with async flush, or an operator, leaves."""
    from tidemq.plugins import get_plugin_manager

    pm = get_plugin_manager()
    policy = pm.create("flush", "async", data_dir=replica.dir)
    index = pm.create("index", "hash", data_dir=replica.dir)
    store = pm.create(
        "store",
        "mmap",
        options={"commitlog_file_size": 1048576},
        data_dir=replica.dir,
        components={"flush": policy, "index": index},
    )
    assert store.load()
    store.start()
    try:
        assert store.truncate_commit_log(end) == end
    finally:
        store.shutdown()


@pytest.mark.slow
def test_a_real_slave_restarted_with_a_shorter_log_catches_up_and_rejoins(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    """The same restart with a real slave process (it catches up within milliseconds, so what the
    master counted in between does not show): the master forgets its report as it disconnects,
    the slave catches up, the tail is confirmed once every member holds it, and the logs agree."""
    group, master, (restarted, stopped_one), producer = three_in_sync(spawn, tmp_path, etcd)
    stopped = False
    try:
        stopped = True  # (set first: the finally resumes it whatever fails in between)
        acked_end, tq, toff, end = hold_a_tail(producer, master, stopped_one)
        restarted.server.stop()
        restarted.server = None
        cut_commit_log(restarted, acked_end)
        restarted.start()
        assert wait_for(lambda: end_of(restarted) == end, 20), restarted.log()
        stopped_one.server.proc.send_signal(signal.SIGCONT)
        stopped = False
        assert wait_for(lambda: pull(master.addr, tq, toff).code == ResponseCode.SUCCESS, 10)
        assert wait_for(lambda: sync_set(master) == {1, 2, 3}, 10), master.info()
        # Its old report went with its connection (before session 13: the master counted its
        # lower report on the new connection, "reports 196, less than the 387 it reported").
        assert f"in-sync set: broker {restarted.broker_id} disconnected" in master.full_log()
        again = producer.send(Message(TOPIC, b"after the restart"))
        assert again.status is SendStatus.SEND_OK, again.status
        final = end_of(master)
        assert wait_for(lambda: all(end_of(r) == final for r in group.running()), 10)
        logs = {commit_log(r, final) for r in group.running()}
        assert len(logs) == 1
    finally:
        if stopped:
            stopped_one.server.proc.send_signal(signal.SIGCONT)
        producer.shutdown()
