"""The broker's own readers of system queues stop at the confirm offset, as consumers do.

On a SYNC master in controller mode a message is stored before the other members of the in-sync
set hold it; a failover cuts what they do not hold and the new epoch reuses its queue offsets.
The delay levels (SCHEDULE_TOPIC_XXXX), the timer's enqueue (rmq_sys_wheel_timer) and the
transaction check (the half queue) keep progress offsets that slaves copy (delayOffset.json, the
consumer offsets) or that name commit-log offsets (the TimerLog): they must not pass a message a
failover can cut, so they read through :class:`~tidemq.broker.confirmed.ReadBound` (RocketMQ 5
dispatches those consume queues only up to the confirm offset).

Real processes: etcd, a NameServer and two controller brokers on loopback; the slave is
SIGSTOPped so that it acknowledges nothing while the master stores.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from conftest import runtime_info, wait_for

pytest.importorskip("httpx", reason="httpx is not installed (pip install tidemq[controller])")

from controller_support import (  # noqa: E402
    TOPIC,
    ControllerCluster,
    EtcdServer,
    etcd_fixture,  # noqa: F401  (the etcd fixture)
    wait_in_sync,
)
from test_controller_confirm_offset import pull  # noqa: E402
from test_controller_consumers import max_offsets  # noqa: E402

from tidemq.broker.pop.journal import Checkpoint, ack_record  # noqa: E402
from tidemq.broker.pop.revive_log import SNAPSHOT_GROUP, ReviveLog  # noqa: E402
from tidemq.client import BlockingProducer, Message, SendStatus  # noqa: E402
from tidemq.client.admin import AdminClient  # noqa: E402
from tidemq.record import iter_messages  # noqa: E402
from tidemq.remoting.codes import RequestCode, ResponseCode  # noqa: E402
from tidemq.testing.store_contract import build_store, message, put  # noqa: E402


def call(addr: str, code: int, fields: dict[str, Any] | None = None) -> Any:
    async def ask() -> Any:
        client = AdminClient("127.0.0.1:1")
        try:
            return await client.call(addr, code, fields)
        finally:
            await client.close()

    return asyncio.run(ask())


def delay_offset(addr: str, level: int) -> int:
    """The master's delivery progress of one delay level (GET_ALL_DELAY_OFFSET, what slaves copy)."""
    body = orjson.loads(call(addr, RequestCode.GET_ALL_DELAY_OFFSET).body or b"{}")
    return int(body.get("offsetTable", {}).get(str(level), 0))


def half_progress(addr: str) -> int:
    """The transaction check's progress in the half queue (a consumer offset slaves copy)."""
    body = orjson.loads(call(addr, RequestCode.GET_ALL_CONSUMER_OFFSET).body or b"{}")
    table = body.get("offsetTable", {}).get("RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS", {})
    return int(table.get("0", 0))


def delivered(addr: str, qid: int, offset: int, body: bytes) -> Any:
    """The message with ``body`` in TOPIC's queue ``qid`` from ``offset`` on (None: not there)."""
    got = pull(addr, qid, offset)
    if got.code != ResponseCode.SUCCESS:
        return None
    return next((m for m in iter_messages(got.body or b"") if m.body == body), None)


def wait_delivered(addr: str, qid: int, offset: int, body: bytes, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while (msg := delivered(addr, qid, offset, body)) is None:
        assert time.monotonic() < deadline, f"{body!r} not delivered to queue {qid}"
        time.sleep(0.1)
    return msg


def test_delay_levels_timers_and_transaction_checks_wait_for_the_confirm_offset(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    """A delay-level message (level 1: 1 s), a timer message (0.5 s) and a half message (checked
    after 1 s) stored while the slave is stopped: their time passes, yet nothing acts on them (the
    level's progress, the timer's enqueue and the half queue's progress stay before them; before:
    all three moved on and the delayed and timed messages were delivered during the stop); once the
    slave resumes they are delivered, stored after the resume, and the progress passes them."""
    group = ControllerCluster(spawn, tmp_path, etcd, replicas=2, options={"sync_timeout_s": 1.0}, start=False)
    for r in group.replicas:  # the transaction check every second, on half messages 1 s old
        r.config.write_text(
            r.config.read_text().replace(
                "[broker]\n", "[broker]\ntransaction_check_interval_s = 1.0\ntransaction_timeout_s = 1.0\n", 1
            )
        )
        r.start()
    master = group.wait_master()
    wait_in_sync(master, 2)
    (slave,) = [r for r in group.running() if r is not master]
    producer = BlockingProducer("confirm-readers-pg", group.ns, retry_times=0, send_timeout=5.0)
    producer.start()
    stopped = False
    try:
        first = producer.send(Message(TOPIC, b"replicated"))
        assert first.status is SendStatus.SEND_OK, first.status
        before = max_offsets(master.addr, 4)
        level_before = delay_offset(master.addr, 1)
        half_before = half_progress(master.addr)
        assert runtime_info(master.addr)["timerOffsetBehind"] == "0"

        slave.server.proc.send_signal(signal.SIGSTOP)
        stopped = True
        sends = [
            producer.send_async(Message(TOPIC, b"delayed", delay_level=1)),
            producer.send_async(Message(TOPIC, b"timed", properties={"TIMER_DELAY_MS": "500"})),
            # A half message as a transactional send stores it (no producer answers its check).
            producer.send_async(
                Message(TOPIC, b"half", properties={"TRAN_MSG": "true", "PGROUP": "confirm-readers-pg"})
            ),
        ]
        results = [f.result(15) for f in sends]
        assert all(r.status is not SendStatus.SEND_OK for r in results), [r.status for r in results]
        queues = {b"delayed": results[0].queue.queue_id, b"timed": results[1].queue.queue_id}
        time.sleep(3.0)  # the delay, the timer and the half message's check time have all passed
        # Nothing acted on them: no progress past them (before: level 1 at +1, the timer's
        # enqueue caught up, the half queue's progress past the half message).
        assert delay_offset(master.addr, 1) == level_before
        # The timed message is not in the wheel, and not behind either: the enqueue cannot read
        # it yet (RocketMQ 5 counts timerOffsetBehind up to the confirm offset; before: "1").
        info = runtime_info(master.addr)
        assert info["timerOffsetBehind"] == "0" and info["timerCongestNum"] == "0", info
        assert half_progress(master.addr) == half_before

        resumed = time.time()
        slave.server.proc.send_signal(signal.SIGCONT)
        stopped = False
        assert wait_for(lambda: delay_offset(master.addr, 1) == level_before + 1, 10)
        assert wait_for(lambda: runtime_info(master.addr)["timerOffsetBehind"] == "0", 10)
        assert wait_for(lambda: half_progress(master.addr) > half_before, 10)
        for body, qid in queues.items():
            msg = wait_delivered(master.addr, qid, before[qid], body)
            # Stored in its real topic after the resume: not delivered while unconfirmed.
            assert msg.store_timestamp >= int(resumed * 1000) - 5, (body, msg.store_timestamp, resumed)
    finally:
        if stopped:
            slave.server.proc.send_signal(signal.SIGCONT)
        producer.shutdown()


def test_revive_log_replay_falls_back_to_the_oldest_record_when_its_snapshot_was_cut(tmp_path: Path) -> None:
    """The snapshot offset slaves copy may name a snapshot a failover cut (written past the
    confirm offset): replay then starts at the oldest record kept instead of replaying nothing."""
    store = build_store("mmap", tmp_path / "s", store_options={"commitlog_file_size": 1 << 20})
    assert store.load()
    store.start()
    try:
        offsets: dict[tuple[str, str, int], int] = {}
        broker = SimpleNamespace(
            store=store,
            settings=SimpleNamespace(cluster="C"),
            offsets=SimpleNamespace(query=lambda g, t, q: offsets.get((g, t, q), -1)),
        )
        rlog = ReviveLog(broker)  # type: ignore[arg-type]

        def ck(i: int) -> bytes:
            return Checkpoint(i, "G", "T", 0, 1_000, 30_000, 0, i + 1, 0, (i,)).record()

        snapshot = SNAPSHOT_GROUP, rlog.topic, 0
        put(store, message(rlog.topic, ck(1), 0))
        put(store, message(rlog.topic, ack_record(2, 0b1), 0))  # an ack of another (ignored)
        assert sorted(rlog.replay().checkpoints) == [1]
        # The offset names queue offset 2: its snapshot was cut, a new-epoch record took the slot.
        offsets[snapshot] = 2
        put(store, message(rlog.topic, ck(2), 0))
        assert sorted(rlog.replay().checkpoints) == [1, 2]  # from the oldest record (before: [2])
        offsets[snapshot] = 9  # past the end: the same (before: nothing replayed)
        assert sorted(rlog.replay().checkpoints) == [1, 2]
        # A complete snapshot where the offset points: replay starts there.
        offsets[snapshot] = 3
        put(store, message(rlog.topic, b"S s1 0 1 5\n" + ck(1), 0))
        assert sorted(rlog.replay().checkpoints) == [1]
        # A snapshot of two chunks whose second one was cut, a new-epoch record in its slot.
        offsets[snapshot] = 4
        put(store, message(rlog.topic, b"S s2 0 2 5\n" + ck(2), 0))
        put(store, message(rlog.topic, ck(3), 0))
        assert sorted(rlog.replay().checkpoints) == [1, 3]  # the snapshot at 3, then 3 (before: [3])
    finally:
        store.shutdown()
