"""Timer messages (RocketMQ 5's TIMER_DELIVER_MS / TIMER_DELAY_SEC / TIMER_DELAY_MS), issue 36.

Real broker processes with a 100 ms ``timer_precision_ms`` so the tests stay fast.  Timing is
judged on the broker's clock: a delivered message's store timestamp against its ``TIMER_OUT_MS``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import runtime_info, wait_for
from test_delay_schedule import MQ, Collector, module_mq
from test_transaction_messages import Listener

from tidemq.broker.timer import TIMER_OUT_MS, TIMER_TOPIC
from tidemq.broker.timer.timer_log import TimerLog
from tidemq.broker.timer.timer_wheel import TimerWheel
from tidemq.client import LocalTransactionState, Message, MessageExt, Producer, TransactionProducer
from tidemq.client.errors import BrokerError, SendFailedError
from tidemq.message import Prop
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

PRECISION_MS = 100
#: Allowed lateness beyond the precision (a loaded CI machine, the consumer's pull).
SLACK_MS = 1000
TIMER = {"timer_precision_ms": PRECISION_MS, "timer_flush_interval_ms": 100, "timer_max_delay_sec": 3600}


@pytest.fixture(scope="module")
def shared_mq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MQ]:
    """One NameServer + broker (TIMER) for the tests that neither restart it nor count what waits in
    rmq_sys_wheel_timer or the timer metrics (broker-wide): each has topics and groups of its own."""
    yield from module_mq(tmp_path_factory.mktemp("timer-shared"), **TIMER)


def run(coro: Any, timeout: float = 60) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def now_ms() -> int:
    return int(time.time() * 1000)


def check_timing(m: MessageExt) -> int:
    """Lateness of a delivered timer message (never early), on the broker's clock."""
    due = int(m.properties[TIMER_OUT_MS])
    late = m.store_timestamp - due
    assert 0 <= late <= PRECISION_MS + SLACK_MS, (m.body, late)
    return late


async def queue_max(mq: MQ, topic: str, queue_id: int = 0) -> int:
    client = get_plugin_manager().create("transport", "tcp").client()
    try:
        resp = await client.invoke(
            mq.broker_addr,
            RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue_id)}),
            3,
        )
    finally:
        await client.close()
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return int(resp.ext_fields["offset"])


# ---------------------------------------------------------------------------- files


def test_log_and_wheel_files_round_trip(tmp_path: Path) -> None:
    log = TimerLog(tmp_path / "log")
    a = log.append(100, -1, 5_000, 5_000, 1234, 0)
    b = log.append(120, a, 5_050, 9_050, 2234, 1)
    wheel = TimerWheel(tmp_path / "wheel", 64)
    assert wheel.fresh and wheel.get(50) is None
    wheel.put(50, a, b, 2)
    wheel.close()
    log.close()
    # Reopened: what was written is there, a torn record tail is cut away.
    with open(tmp_path / "log" / "00000000000000000000", "ab") as fh:
        fh.write(b"\x00" * 7)
    log = TimerLog(tmp_path / "log")
    assert log.end == 96
    rec = log.read(b)
    assert rec is not None
    assert (rec.prev_pos, rec.due_ms, rec.deliver_ms, rec.phy_offset, rec.queue_offset) == (
        a,
        5050,
        9050,
        2234,
        1,
    )
    wheel = TimerWheel(tmp_path / "wheel", 64)
    slot = wheel.get(50 + 64)  # the same slot, a tick one turn later
    assert (
        not wheel.fresh
        and slot is not None
        and (slot.tick, slot.first_pos, slot.last_pos, slot.num) == (50, a, b, 2)
    )
    assert [r.queue_offset for r in log.scan(0)] == [0, 1]
    assert TimerWheel(tmp_path / "wheel", 65).fresh  # another geometry: rebuilt from the log
    log.close()


def test_log_files_roll_over_and_delivered_ones_are_deleted(tmp_path: Path) -> None:
    from tidemq.broker.timer.timer_log import RECORD_SIZE

    log = TimerLog(tmp_path / "log", file_size=2 * RECORD_SIZE)
    positions = [log.append(10, -1, 1000 + i, 1000 + i, i * 100, i) for i in range(5)]
    assert positions == [i * RECORD_SIZE for i in range(5)]
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == [
        f"{i * 2 * RECORD_SIZE:020d}" for i in range(3)
    ]
    assert [r.queue_offset for r in log.scan(RECORD_SIZE)] == [1, 2, 3, 4]
    # Files ending after the settled position, or written too recently, or being appended to stay.
    assert log.delete_before(3 * RECORD_SIZE, older_than_s=time.time() + 60) == 1
    assert log.delete_before(10 * RECORD_SIZE, older_than_s=time.time() - 60) == 0
    assert log.delete_before(10 * RECORD_SIZE, older_than_s=time.time() + 60) == 1
    assert log.start == 4 * RECORD_SIZE and log.read(0) is None and log.read(2 * RECORD_SIZE) is None
    assert [r.queue_offset for r in log.scan(0)] == [4]
    log.close()
    reopened = TimerLog(tmp_path / "log", file_size=2 * RECORD_SIZE)
    assert (reopened.start, reopened.end) == (4 * RECORD_SIZE, 5 * RECORD_SIZE)
    assert reopened.append(10, -1, 2000, 2000, 900, 5) == 5 * RECORD_SIZE
    reopened.close()


# ---------------------------------------------------------------------------- processes


def test_timer_properties_deliver_at_their_time_with_the_producers_message(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path, **TIMER)
    topic = "TimerTopic"

    async def main() -> tuple[dict[bytes, MessageExt], dict[bytes, str], int, float]:
        ids: dict[bytes, str] = {}
        async with Producer("timer-pg", mq.ns) as producer:
            sent_at = time.time()
            cases = {
                b"sec": {"TIMER_DELAY_SEC": "2"},
                b"ms": {"TIMER_DELAY_MS": "1500"},
                b"abs": {"TIMER_DELIVER_MS": str(now_ms() + 1000)},
                b"past": {"TIMER_DELIVER_MS": str(now_ms() - 5000)},
                b"plain": {},
            }
            for body, props in cases.items():
                r = await producer.send(
                    Message(
                        topic, body, tags="TagT", keys=f"k-{body.decode()}", properties={"p": "v", **props}
                    )
                )
                ids[body] = r.msg_id
            parked = await queue_max(mq, TIMER_TOPIC)
            collector = Collector(mq, "timer-cg", topic)
            await collector.consumer.start()
            try:
                await collector.wait_for(2, 10)
                early = time.time() - sent_at
                seen_early = set(collector.bodies())
                await collector.wait_for(5, 15)
                await asyncio.sleep(0.5)
            finally:
                await collector.consumer.shutdown()
        assert len(collector.got) == 5, collector.bodies()  # each once
        if early < 0.9:
            assert seen_early <= {b"past", b"plain"}, seen_early
        return {m.body: m for _, m in collector.got}, ids, parked, early

    got, ids, parked, _ = run(main())
    assert parked == 3  # the three future ones waited in rmq_sys_wheel_timer
    for body in (b"sec", b"ms", b"abs"):
        m = got[body]
        check_timing(m)
        assert m.topic == "TimerTopic" and m.tags == "TagT" and m.keys == [f"k-{body.decode()}"]
        assert m.properties["p"] == "v"
        assert m.uniq_key == ids[body]  # the consumer sees the producer's message id
        assert Prop.REAL_TOPIC not in m.properties
    assert TIMER_OUT_MS not in got[b"past"].properties and TIMER_OUT_MS not in got[b"plain"].properties
    assert int(got[b"sec"].properties[TIMER_OUT_MS]) - got[b"sec"].born_timestamp >= 2000 - 50


BAD = [
    ({"TIMER_DELAY_SEC": "-1"}, ResponseCode.MESSAGE_ILLEGAL, "negative"),
    ({"TIMER_DELAY_MS": "soon"}, ResponseCode.MESSAGE_ILLEGAL, "not a whole number"),
    ({"TIMER_DELAY_SEC": "99999999999999999999"}, ResponseCode.MESSAGE_ILLEGAL, "overflows"),
    ({"TIMER_DELIVER_MS": str(2**63)}, ResponseCode.MESSAGE_ILLEGAL, "overflows"),
    ({"TIMER_DELAY_SEC": str(4 * 86400)}, ResponseCode.MESSAGE_ILLEGAL, "max delay"),
    ({"TIMER_DELAY_SEC": "2", "TIMER_DELAY_MS": "2000"}, ResponseCode.MESSAGE_ILLEGAL, "set together"),
]


def test_bad_timer_properties_are_refused_and_nothing_is_stored(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path, **TIMER)
    topic = "TimerBad"

    async def main() -> None:
        async with Producer("timer-bad-pg", mq.ns, retry_times=0) as producer:
            await producer.send(Message(topic, b"first"))  # the topic exists; its queue 0..3 offsets known
            before = [await queue_max(mq, topic, q) for q in range(4)]
            for props, code, words in BAD:
                with pytest.raises((BrokerError, SendFailedError)) as info:
                    await producer.send(Message(topic, b"bad", properties=props))
                err = info.value
                if isinstance(err, SendFailedError):
                    err = err.errors[-1]
                assert isinstance(err, BrokerError) and err.code == code and words in (err.remark or ""), (
                    props,
                    err,
                )
                assert "\n" not in (err.remark or "")
            assert [await queue_max(mq, topic, q) for q in range(4)] == before
            assert await queue_max(mq, TIMER_TOPIC) == 0
            # A delay level wins over a timer (as RocketMQ: the timer properties are dropped).
            r = await producer.send(
                Message(topic, b"level", delay_level=1, properties={"TIMER_DELAY_SEC": "30"})
            )
            assert r.queue.topic == topic
            assert await queue_max(mq, TIMER_TOPIC) == 0

    run(main())


def test_timer_wheel_disabled_refuses_timer_messages(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path, timer_wheel_enable=False)

    async def main() -> None:
        async with Producer("timer-off-pg", mq.ns, retry_times=0) as producer:
            with pytest.raises((BrokerError, SendFailedError)) as info:
                await producer.send(Message("TimerOff", b"x", properties={"TIMER_DELAY_SEC": "1"}))
            err = info.value.errors[-1] if isinstance(info.value, SendFailedError) else info.value
            assert isinstance(err, BrokerError) and err.code == ResponseCode.SYSTEM_ERROR
            assert "timerWheelEnable is false" in (err.remark or "")
            await producer.send(Message("TimerOff", b"plain"))  # everything else works

    run(main())


def test_batch_with_timers_waits_whole_each_until_its_time(shared_mq: MQ) -> None:
    mq = shared_mq
    topic = "TimerBatch"

    async def main() -> list[MessageExt]:
        async with Producer("timer-batch-pg", mq.ns) as producer:
            msgs = [
                Message(topic, b"b0", properties={"TIMER_DELAY_MS": "1200"}),
                Message(topic, b"b1"),
                Message(topic, b"b2", properties={"TIMER_DELAY_MS": "600"}),
            ]
            await producer.send_batch(msgs)
            collector = Collector(mq, "timer-batch-cg", topic)
            await collector.consumer.start()
            try:
                await collector.wait_for(3, 15)
                await asyncio.sleep(0.3)
            finally:
                await collector.consumer.shutdown()
        return [m for _, m in collector.got]

    got = {m.body: m for m in run(main())}
    assert sorted(got) == [b"b0", b"b1", b"b2"]
    for m in got.values():
        check_timing(m)
    assert got[b"b0"].store_timestamp >= got[b"b2"].store_timestamp >= got[b"b1"].store_timestamp


def test_pending_timers_survive_a_restart(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path, **TIMER)
    topic = "TimerRestart"

    async def send() -> None:
        async with Producer("timer-rs-pg", mq.ns) as producer:
            await producer.send(Message(topic, b"while-down", properties={"TIMER_DELAY_MS": "1000"}))
            await producer.send(Message(topic, b"after", properties={"TIMER_DELAY_MS": "6000"}))

    run(send())
    mq.stop_broker()
    time.sleep(1.5)
    mq.start_broker()

    async def consume() -> list[MessageExt]:
        collector = Collector(mq, "timer-rs-cg", topic)
        await collector.consumer.start()
        try:
            await collector.wait_for(2, 20)
            await asyncio.sleep(1.0)
        finally:
            await collector.consumer.shutdown()
        return [m for _, m in collector.got]

    got = run(consume())
    assert sorted(m.body for m in got) == [b"after", b"while-down"]  # each exactly once
    late = {m.body: m.store_timestamp - int(m.properties[TIMER_OUT_MS]) for m in got}
    assert late[b"while-down"] >= 0
    check_timing(next(m for m in got if m.body == b"after"))


# ---------------------------------------------------------------------------- SIGKILL


async def _send_until_killed(mq: MQ, topic: str, delays_ms: list[int], kill_after: int) -> dict[str, int]:
    """Send with 8 senders in parallel; SIGKILL the broker once ``kill_after`` sends were acknowledged
    (others in flight).  The acknowledged messages: uniq key -> due time asked for."""
    acked: dict[str, int] = {}
    todo = list(enumerate(delays_ms))
    killed = asyncio.Event()

    async with Producer("timer-kill-pg", mq.ns, retry_times=0, send_timeout=2.0) as producer:
        # The topic's config on disk first: an auto-created topic's config written while the broker
        # is SIGKILLed is lost with it (then no route leads to what the timer delivers).
        await producer.send(Message(topic, b"warm-up"))
        assert wait_for(lambda: topic in (mq.data / "config" / "topics.json").read_text(), 10)

        async def sender() -> None:
            while todo and not killed.is_set():
                i, delay = todo.pop(0)
                due = now_ms() + delay
                try:
                    r = await producer.send(
                        Message(topic, f"m{i}".encode(), properties={"TIMER_DELIVER_MS": str(due)})
                    )
                except Exception:
                    continue
                acked[r.msg_id] = due
                if len(acked) >= kill_after and not killed.is_set():
                    killed.set()
                    mq.broker.stop(signal.SIGKILL)

        await asyncio.gather(*(sender() for _ in range(8)))
    return acked


async def _collect_all(mq: MQ, group: str, topic: str, want: set[str], timeout: float) -> list[MessageExt]:
    collector = Collector(mq, group, topic)
    await collector.consumer.start()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not want <= {m.uniq_key for _, m in collector.got}:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # late duplicates too
    finally:
        await collector.consumer.shutdown()
    return [m for _, m in collector.got]


def test_sigkill_while_scheduling_loses_no_acknowledged_timer(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path, **TIMER)
    topic = "TimerKillSched"
    acked = run(_send_until_killed(mq, topic, [2500 + 5 * i for i in range(600)], kill_after=200))
    assert 200 <= len(acked) < 600
    mq.start_broker()
    got = run(_collect_all(mq, "timer-ks-cg", topic, set(acked), 30))
    keys = [m.uniq_key for m in got]
    assert set(acked) <= set(keys), f"lost {len(set(acked) - set(keys))} of {len(acked)}"
    for m in got:
        if m.body != b"warm-up":
            assert m.store_timestamp >= int(m.properties[TIMER_OUT_MS]), m.body  # never early
    # Killed before any was due: nothing had been delivered, so nothing is delivered twice.
    assert len(keys) == len(set(keys))


def test_sigkill_while_delivering_loses_none_and_repeats_only_the_last_interval(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path, **TIMER)
    topic = "TimerKillDeliver"

    async def main() -> tuple[dict[str, int], int]:
        async with Producer("timer-kd-pg", mq.ns) as producer:
            await producer.send(Message(topic, b"warm-up"))  # the topic's config on disk first
            assert wait_for(lambda: topic in (mq.data / "config" / "topics.json").read_text(), 10)
            acked: dict[str, int] = {}
            base = now_ms() + 1500
            for i in range(400):  # due over 2 s, 200 a second
                due = base + 5 * i
                r = await producer.send(
                    Message(topic, f"d{i}".encode(), properties={"TIMER_DELIVER_MS": str(due)})
                )
                acked[r.msg_id] = due
        # Kill once about half went out.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            delivered = sum([await queue_max(mq, topic, q) for q in range(4)])
            if delivered >= 150:
                break
            await asyncio.sleep(0.02)
        killed_at = now_ms()
        mq.broker.stop(signal.SIGKILL)
        assert 150 <= delivered < 400, delivered
        return acked, killed_at

    acked, killed_at = run(main())
    mq.start_broker()
    got = run(_collect_all(mq, "timer-kd-cg", topic, set(acked), 30))
    keys = [m.uniq_key for m in got]
    assert set(acked) <= set(keys), f"lost {len(set(acked) - set(keys))} of {len(acked)}"
    dups = {k for k in keys if keys.count(k) > 1}
    # The bound: only messages due within the last checkpoint interval + one tick (+ a loaded
    # machine's slack) before the kill can be delivered twice.
    window_ms = TIMER["timer_flush_interval_ms"] + PRECISION_MS + 700
    assert all(acked[k] >= killed_at - window_ms for k in dups), sorted(killed_at - acked[k] for k in dups)
    assert all(keys.count(k) <= 2 for k in dups)
    # Counted: the restarted broker reports the re-deliveries of its recovery (every duplicate is one).
    info = runtime_info(mq.broker_addr)
    assert int(info["timerRecoveredRedeliveries"]) >= len(dups), (info, len(dups))


# ---------------------------------------------------------------------------- transactions


def test_transactional_timer_starts_at_the_commit_and_a_bad_one_is_refused_at_the_half(shared_mq: MQ) -> None:
    mq = shared_mq
    topic = "TimerTx"

    async def main() -> tuple[MessageExt, str]:
        listener = Listener(LocalTransactionState.COMMIT)
        async with TransactionProducer("timer-tx-pg", listener, mq.ns, retry_times=0) as producer:
            with pytest.raises((BrokerError, SendFailedError)) as info:
                await producer.send_in_transaction(
                    Message(topic, b"bad", properties={"TIMER_DELAY_MS": "-5"})
                )
            err = info.value.errors[-1] if isinstance(info.value, SendFailedError) else info.value
            assert isinstance(err, BrokerError) and err.code == ResponseCode.MESSAGE_ILLEGAL
            assert listener.executed == []  # refused before any local transaction ran
            r = await producer.send_in_transaction(
                Message(topic, b"tx", properties={"TIMER_DELAY_MS": "1500"})
            )
            committed_at = now_ms()
            assert r.local_state is LocalTransactionState.COMMIT
            collector = Collector(mq, "timer-tx-cg", topic)
            await collector.consumer.start()
            try:
                await collector.wait_for(1, 15)
                await asyncio.sleep(0.5)
            finally:
                await collector.consumer.shutdown()
        assert collector.bodies() == [b"tx"]
        m = collector.got[0][1]
        assert m.store_timestamp >= committed_at + 1500 - 50  # counted from the commit
        return m, r.send_result.msg_id

    m, msg_id = run(main())
    check_timing(m)
    assert m.uniq_key == msg_id and m.properties[Prop.TRANSACTION_PREPARED] == "true"


def test_a_timer_beyond_the_roll_window_is_rolled_and_delivered_once(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path, **TIMER, timer_roll_window_slots=8)  # 0.8 s
    topic = "TimerRoll"

    async def main() -> tuple[list[MessageExt], int]:
        async with Producer("timer-roll-pg", mq.ns) as producer:
            r = await producer.send(Message(topic, b"far", properties={"TIMER_DELAY_MS": "2500"}))
            collector = Collector(mq, "timer-roll-cg", topic)
            await collector.consumer.start()
            try:
                await collector.wait_for(1, 15)
                await asyncio.sleep(0.5)
            finally:
                await collector.consumer.shutdown()
        assert collector.got[0][1].uniq_key == r.msg_id
        return [m for _, m in collector.got], await queue_max(mq, TIMER_TOPIC)

    got, parked = run(main())
    assert [m.body for m in got] == [b"far"]
    check_timing(got[0])
    assert parked >= 3  # the send and at least two rolls (at 0.8 s and 1.6 s)


# ---------------------------------------------------------------------------- operators


async def _ask(mq: MQ, code: int) -> RemotingCommand:
    client = get_plugin_manager().create("transport", "tcp").client()
    try:
        resp = await client.invoke(mq.broker_addr, RemotingCommand.request(code), 3)
    finally:
        await client.close()
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return resp


def test_checkpoint_metrics_and_runtime_info_show_the_schedule(spawn, tmp_path) -> None:
    import struct

    import orjson

    mq = MQ(spawn, tmp_path, **TIMER)

    async def main() -> None:
        async with Producer("timer-ops-pg", mq.ns) as producer:
            for i in range(3):
                await producer.send(
                    Message("TimerOps", f"o{i}".encode(), properties={"TIMER_DELAY_SEC": "30"})
                )
            await producer.send(Message("TimerOps2", b"p", properties={"TIMER_DELAY_SEC": "30"}))
        await asyncio.sleep(0.6)  # enqueued, and a checkpoint written
        metrics = orjson.loads((await _ask(mq, RequestCode.GET_TIMER_METRICS)).body)
        assert {t: v["count"] for t, v in metrics["timingCount"].items()} == {"TimerOps": 3, "TimerOps2": 1}
        body = (await _ask(mq, RequestCode.GET_TIMER_CHECK_POINT)).body
        assert len(body) == 56
        read_ms, _flush_pos, queue_offset, master_offset, *_version = struct.unpack(">7q", body)
        assert queue_offset == master_offset == 4 and abs(read_ms - now_ms()) < 2000
        table = orjson.loads((await _ask(mq, RequestCode.GET_BROKER_RUNTIME_INFO)).body)["table"]
        assert table["timerCongestNum"] == "4" and table["timerOffsetBehind"] == "0"
        assert table["timerReadBehind"] == "0" and float(table["timerEnqueueTps"]) >= 0

    run(main())
    mq.stop_broker()  # the counts survive a restart (kept with the checkpoint)
    mq.start_broker()

    async def after() -> None:
        metrics = orjson.loads((await _ask(mq, RequestCode.GET_TIMER_METRICS)).body)
        assert {t: v["count"] for t, v in metrics["timingCount"].items()} == {"TimerOps": 3, "TimerOps2": 1}

    run(after())


def test_a_stored_reply_with_a_timer_waits_and_a_bad_one_is_refused(spawn, tmp_path) -> None:
    from tidemq.message import properties_to_string

    mq = MQ(spawn, tmp_path, **TIMER)
    reply_topic = "DefaultCluster_REPLY_TOPIC"

    def reply(props: dict[str, str]) -> RemotingCommand:
        header = {
            "producerGroup": "timer-reply-pg",
            "topic": reply_topic,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4",
            "queueId": "0",
            "sysFlag": "0",
            "bornTimestamp": str(now_ms()),
            "flag": "0",
            "properties": properties_to_string(props),
            "reconsumeTimes": "0",
        }
        return RemotingCommand.request(RequestCode.SEND_REPLY_MESSAGE, header, b"the answer")

    async def main() -> None:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            bad = await client.invoke(mq.broker_addr, reply({"TIMER_DELAY_MS": "x"}), 3)
            assert bad.code == ResponseCode.MESSAGE_ILLEGAL and "TIMER_DELAY_MS" in (bad.remark or "")
            # No requester to push to (SYSTEM_ERROR, as RocketMQ), but the reply is stored: in the wheel.
            resp = await client.invoke(mq.broker_addr, reply({"TIMER_DELAY_MS": "1500"}), 3)
            assert resp.code == ResponseCode.SYSTEM_ERROR
        finally:
            await client.close()
        assert await queue_max(mq, TIMER_TOPIC) == 1
        assert await queue_max(mq, reply_topic) == 0
        await asyncio.sleep(2.5)
        assert await queue_max(mq, reply_topic) == 1

    run(main())


# ---------------------------------------------------------------------------- recall


def test_recall_cancels_a_pending_timer_and_answers_rocketmqs_codes(shared_mq: MQ) -> None:
    from tidemq.broker.timer.recall import RecallHandle, decode_handle

    mq = shared_mq
    topic = "TimerRecall"

    async def send_raw(client: Any, body: bytes, props: dict[str, str]) -> RemotingCommand:
        from tidemq.message import properties_to_string

        header = {
            "producerGroup": "timer-recall-pg",
            "topic": topic,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4",
            "queueId": "0",
            "sysFlag": "0",
            "bornTimestamp": str(now_ms()),
            "flag": "0",
            "properties": properties_to_string({"UNIQ_KEY": f"U-{body.decode()}", **props}),
            "reconsumeTimes": "0",
        }
        return await client.invoke(
            mq.broker_addr, RemotingCommand.request(RequestCode.SEND_MESSAGE, header, body), 3
        )

    async def recall(client: Any, handle: str, on_topic: str = topic) -> RemotingCommand:
        header = {"producerGroup": "timer-recall-pg", "topic": on_topic, "recallHandle": handle}
        return await client.invoke(
            mq.broker_addr, RemotingCommand.request(RequestCode.RECALL_MESSAGE, header), 3
        )

    async def main() -> list[MessageExt]:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            kept = await send_raw(client, b"kept", {"TIMER_DELAY_MS": "1500"})
            gone = await send_raw(client, b"gone", {"TIMER_DELAY_MS": "1500"})
            handle = gone.ext_fields["recallHandle"]
            h = decode_handle(handle)
            assert (h.topic, h.broker_name, h.message_id) == (topic, "broker-d", "U-gone")
            assert "recallHandle" in kept.ext_fields
            ok = await recall(client, handle)
            assert ok.code == ResponseCode.SUCCESS and ok.ext_fields["msgId"] == "U-gone"
            again = await recall(client, handle)  # already recalled: RocketMQ answers success too
            assert again.code == ResponseCode.SUCCESS
            for bad, code, words in (
                ("not-a-handle!", ResponseCode.ILLEGAL_OPERATION, "recall handle is invalid"),
                (
                    RecallHandle("Other", "broker-d", h.timestamp, "x").encode(),
                    ResponseCode.ILLEGAL_OPERATION,
                    "topic not match",
                ),
                (
                    RecallHandle(topic, "broker-z", h.timestamp, "x").encode(),
                    ResponseCode.ILLEGAL_OPERATION,
                    "not available",
                ),
                (
                    RecallHandle(topic, "broker-d", str(now_ms() - 1), "x").encode(),
                    ResponseCode.ILLEGAL_OPERATION,
                    "timestamp invalid",
                ),
            ):
                r = await recall(client, bad)
                assert r.code == code and words in (r.remark or ""), (bad, r.code, r.remark)
            r = await recall(client, handle, on_topic="NoSuchTopic")
            assert r.code == ResponseCode.TOPIC_NOT_EXIST
            collector = Collector(mq, "timer-recall-cg", topic)
            await collector.consumer.start()
            try:
                await collector.wait_for(1, 15)
                await asyncio.sleep(1.5)
            finally:
                await collector.consumer.shutdown()
            # Delivered: a recall comes too late (RocketMQ's answer).
            late = await recall(client, kept.ext_fields["recallHandle"])
            assert late.code == ResponseCode.ILLEGAL_OPERATION and "timestamp invalid" in (late.remark or "")
        finally:
            await client.close()
        return [m for _, m in collector.got]

    got = run(main())
    assert [m.body for m in got] == [b"kept"]


def test_prometheus_shows_timer_figures_under_rocketmqs_names(spawn, tmp_path) -> None:
    pytest.importorskip("prometheus_client")
    from conftest import free_port
    from test_metrics_prometheus import _sample, _scrape, _standalone

    from tidemq.client import BlockingProducer

    server, url = _standalone(spawn, tmp_path, free_port())
    with BlockingProducer("timer-prom-pg", server.addresses["namesrv"]) as producer:
        for i in range(2):
            producer.send(Message("TimerProm", b"p%d" % i, properties={"TIMER_DELAY_SEC": "60"}))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        samples = _scrape(url)
        if _sample(samples, "rocketmq_timing_messages", topic="TimerProm") == 2:
            break
        time.sleep(0.2)
    assert _sample(samples, "rocketmq_timing_messages", topic="TimerProm") == 2
    assert _sample(samples, "rocketmq_timer_enqueue_total") == 2
    assert _sample(samples, "rocketmq_timer_dequeue_total") == 0
    assert _sample(samples, "rocketmq_timer_enqueue_lag") == 0


# ---------------------------------------------------------------------------- failover


def test_scheduled_timers_are_delivered_after_a_failover(spawn, tmp_path) -> None:
    """Controller mode: the master is SIGKILLed with timer messages pending; the slave elected in
    its place had built its own wheel from the replicated rmq_sys_wheel_timer and delivers them."""
    pytest.importorskip("httpx", reason="httpx is not installed (pip install tidemq[controller])")
    from controller_support import NEW_MASTER_BOUND_S, ControllerCluster
    from test_controller_election import EtcdServer

    from tidemq.client import PushConsumer

    (tmp_path / "etcd").mkdir()
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    try:
        cluster = ControllerCluster(spawn, tmp_path, etcd)
        master = cluster.wait_master()
        assert wait_for(lambda: master.info().get("haConnectedSlaves") == "2", 20), master.log()
        topic = "TimerFailover"

        async def send() -> dict[str, int]:
            acked: dict[str, int] = {}
            async with Producer("timer-fo-pg", cluster.ns) as producer:
                for i in range(20):
                    delay = 1000 if i < 4 else 6000 + 100 * i  # 4 due before the kill
                    r = await producer.send(
                        Message(topic, f"f{i}".encode(), properties={"TIMER_DELAY_MS": str(delay)})
                    )
                    acked[r.msg_id] = delay
            return acked

        acked = run(send())
        time.sleep(2.5)  # the first 4 went out from the old master; the slaves have all 20 enqueued
        master.kill()
        new = cluster.wait_master(NEW_MASTER_BOUND_S + 5)
        assert new is not master

        async def consume() -> list[MessageExt]:
            got: list[MessageExt] = []
            consumer = PushConsumer("timer-fo-cg", cluster.ns, rebalance_interval_s=1.0, heartbeat_s=1.0)
            consumer.subscribe(topic, "*")
            consumer.register_listener(lambda msgs: got.extend(msgs))
            await consumer.start()
            try:
                deadline = time.monotonic() + 40
                while time.monotonic() < deadline and not set(acked) <= {m.uniq_key for m in got}:
                    await asyncio.sleep(0.2)
                await asyncio.sleep(1.0)
            finally:
                await consumer.shutdown()
            return got

        got = run(consume(), timeout=90)
    finally:
        etcd.stop()
    keys = [m.uniq_key for m in got]
    assert set(acked) <= set(keys), f"lost {len(set(acked) - set(keys))} of {len(acked)}"
    for m in got:
        assert m.store_timestamp >= int(m.properties[TIMER_OUT_MS]), m.body  # never early
    # Those due after the kill once; those the old master delivered (due within the new master's
    # SLAVE_BEHIND_MS window) at most once more.
    assert all(keys.count(k) <= 2 for k in keys)
    assert all(keys.count(k) == 1 for k, delay in acked.items() if delay > 1000)
    # The bound: at most the 4 the old master delivered (due within SLAVE_BEHIND_MS before the
    # election), each once more.
    assert len({k for k in keys if keys.count(k) > 1}) <= 4


def test_a_recall_answered_success_holds_across_a_sigkill(spawn, tmp_path) -> None:
    """Recalls answered SUCCESS, then the broker SIGKILLed before the messages are due and started
    after: the recalled ones are never delivered, the others are (a SUCCESS is kept on disk)."""
    from tidemq.message import properties_to_string

    mq = MQ(spawn, tmp_path, **TIMER)
    topic = "TimerRecallKill"
    n = 12

    async def main() -> tuple[int, set[str]]:
        async with Producer("timer-rk-pg", mq.ns) as producer:
            await producer.send(Message(topic, b"warm-up"))  # the topic's config on disk first
        assert wait_for(lambda: topic in (mq.data / "config" / "topics.json").read_text(), 10)
        client = get_plugin_manager().create("transport", "tcp").client()
        due = now_ms() + 2500
        recalled: set[str] = set()
        try:
            handles = {}
            for i in range(n):
                header = {
                    "producerGroup": "timer-rk-pg",
                    "topic": topic,
                    "defaultTopic": "TBW102",
                    "defaultTopicQueueNums": "4",
                    "queueId": "0",
                    "sysFlag": "0",
                    "bornTimestamp": str(now_ms()),
                    "flag": "0",
                    "properties": properties_to_string(
                        {"UNIQ_KEY": f"K{i}", "TIMER_DELIVER_MS": str(due + i)}
                    ),
                    "reconsumeTimes": "0",
                }
                r = await client.invoke(
                    mq.broker_addr,
                    RemotingCommand.request(RequestCode.SEND_MESSAGE, header, f"k{i}".encode()),
                    3,
                )
                assert r.code == ResponseCode.SUCCESS, r.remark
                handles[f"K{i}"] = r.ext_fields["recallHandle"]
            for i in range(0, n, 2):
                header = {"producerGroup": "timer-rk-pg", "topic": topic, "recallHandle": handles[f"K{i}"]}
                r = await client.invoke(
                    mq.broker_addr, RemotingCommand.request(RequestCode.RECALL_MESSAGE, header), 3
                )
                assert r.code == ResponseCode.SUCCESS, r.remark
                recalled.add(f"K{i}")
        finally:
            await client.close()
        mq.broker.stop(signal.SIGKILL)  # at once: no checkpoint written after the recalls
        return due, recalled

    due, recalled = run(main())
    time.sleep(max(0.0, (due - now_ms()) / 1000) + 0.5)  # down while they come due
    mq.start_broker()
    kept = {f"K{i}" for i in range(n)} - recalled
    got = run(_collect_all(mq, "timer-rk-cg", topic, kept, 30))
    keys = [m.uniq_key for m in got if m.body != b"warm-up"]
    assert sorted(keys) == sorted(kept), sorted(keys)  # each kept one once, no recalled one


def test_recalls_racing_the_due_moment_either_cancel_or_say_too_late(shared_mq: MQ) -> None:
    """Recalls sent around the moment their messages are due: a recall answered SUCCESS means the
    message is never delivered, one answered ILLEGAL_OPERATION means it is (never both, never
    neither)."""
    from tidemq.message import properties_to_string

    mq = shared_mq
    topic = "TimerRecallRace"
    n = 24

    async def main() -> tuple[dict[str, int], list[MessageExt]]:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            due = now_ms() + 2000
            handles: dict[str, str] = {}
            for i in range(n):
                header = {
                    "producerGroup": "timer-race-pg",
                    "topic": topic,
                    "defaultTopic": "TBW102",
                    "defaultTopicQueueNums": "4",
                    "queueId": "0",
                    "sysFlag": "0",
                    "bornTimestamp": str(now_ms()),
                    "flag": "0",
                    "properties": properties_to_string(
                        {"UNIQ_KEY": f"R{i}", "TIMER_DELIVER_MS": str(due + 10 * i)}
                    ),
                    "reconsumeTimes": "0",
                }
                r = await client.invoke(
                    mq.broker_addr,
                    RemotingCommand.request(RequestCode.SEND_MESSAGE, header, f"r{i}".encode()),
                    3,
                )
                assert r.code == ResponseCode.SUCCESS, r.remark
                handles[f"R{i}"] = r.ext_fields["recallHandle"]
            # Recall R<i> from 150 ms before its time to 80 ms after, 10 ms later each: the first ones
            # before its tick, then within it, the last ones after it was delivered.
            answers: dict[str, int] = {}
            for i in range(n):
                await asyncio.sleep(max(0.0, (due + 10 * i - 150 + 10 * i - now_ms()) / 1000))
                header = {"producerGroup": "timer-race-pg", "topic": topic, "recallHandle": handles[f"R{i}"]}
                r = await client.invoke(
                    mq.broker_addr, RemotingCommand.request(RequestCode.RECALL_MESSAGE, header), 3
                )
                answers[f"R{i}"] = r.code
        finally:
            await client.close()
        collector = Collector(mq, "timer-race-cg", topic)
        await collector.consumer.start()
        try:
            await asyncio.sleep(3.0)
        finally:
            await collector.consumer.shutdown()
        return answers, [m for _, m in collector.got]

    answers, got = run(main())
    delivered = {m.uniq_key for m in got}
    assert set(answers.values()) <= {ResponseCode.SUCCESS, ResponseCode.ILLEGAL_OPERATION}
    for key, code in answers.items():
        assert (code == ResponseCode.SUCCESS) == (key not in delivered), (key, code, sorted(delivered))
    assert answers["R0"] == ResponseCode.SUCCESS  # 150 ms ahead: in time
    assert answers[f"R{n - 1}"] == ResponseCode.ILLEGAL_OPERATION  # 80 ms after: too late
