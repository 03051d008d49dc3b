"""Transactional messages against real broker processes: commit, rollback, check-back, restarts.

The broker checks unresolved half messages every second (``transaction_check_interval_s``) once
they are a second old (``transaction_timeout_s``), so check-backs happen within a few seconds.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_delay_schedule import MQ, Collector, module_mq, run

from tidemq.client import LocalTransactionState, Message, MessageExt, TransactionProducer
from tidemq.message import Prop

FAST_CHECKS = {"transaction_check_interval_s": 1.0, "transaction_timeout_s": 1.0}


class Listener:
    """Answers with fixed states and records what it was asked."""

    def __init__(
        self, execute: LocalTransactionState, check: LocalTransactionState = LocalTransactionState.UNKNOWN
    ):
        self.execute_state = execute
        self.check_state = check
        self.executed: list[tuple[bytes, Any]] = []
        self.checked: list[MessageExt] = []

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        self.executed.append((bytes(msg.body), arg))
        return self.execute_state

    async def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        self.checked.append(msg)
        return self.check_state


@pytest.fixture(scope="module")
def shared_mq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MQ]:
    """One NameServer + broker (FAST_CHECKS) for the tests that neither restart it nor change its
    settings: each has a topic, producer group and consumer group of its own, and every half
    message a test leaves is resolved (commit, rollback or a check answered COMMIT)."""
    yield from module_mq(tmp_path_factory.mktemp("tx-shared"), **FAST_CHECKS)


async def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


def test_commit_delivers_and_rollback_never_does(shared_mq: MQ) -> None:
    mq = shared_mq
    topic = "TxTopic"

    async def main() -> None:
        commit = Listener(LocalTransactionState.COMMIT)
        rollback = Listener(LocalTransactionState.ROLLBACK)
        async with TransactionProducer("tx-pg-c", commit, mq.ns, heartbeat_s=1.0) as p1:
            async with TransactionProducer("tx-pg-r", rollback, mq.ns, heartbeat_s=1.0) as p2:
                r1 = await p2.send_in_transaction(Message(topic, b"rolled-back", keys="k1"), arg="a1")
                r2 = await p1.send_in_transaction(Message(topic, b"committed", keys="k2"), arg="a2")
                assert r1.local_state is LocalTransactionState.ROLLBACK
                assert r2.local_state is LocalTransactionState.COMMIT
                assert r2.send_result.queue.topic == topic
                assert commit.executed == [(b"committed", "a2")] and rollback.executed == [
                    (b"rolled-back", "a1")
                ]
                collector = Collector(mq, "tx-cg", topic)
                await collector.consumer.start()
                try:
                    await collector.wait_for(1, 10)
                    await asyncio.sleep(2.5)  # past the timeout and two check rounds
                finally:
                    await collector.consumer.shutdown()
        assert collector.bodies() == [b"committed"]
        m = collector.got[0][1]
        assert m.properties[Prop.TRANSACTION_PREPARED] == "true" and m.keys == ["k2"]
        assert m.uniq_key == r2.msg_id
        assert commit.checked == [] and rollback.checked == []  # resolved ones are never asked about

    run(main())


def test_unknown_is_checked_back_then_committed(shared_mq: MQ) -> None:
    mq = shared_mq
    topic = "TxUnknown"

    async def main() -> None:
        listener = Listener(LocalTransactionState.UNKNOWN, LocalTransactionState.COMMIT)
        async with TransactionProducer("tx-pg-u", listener, mq.ns, heartbeat_s=1.0) as producer:
            sent = await producer.send_in_transaction(Message(topic, b"later"))
            assert sent.local_state is LocalTransactionState.UNKNOWN
            collector = Collector(mq, "tx-cg-u", topic)
            await collector.consumer.start()
            try:
                await asyncio.sleep(0.5)
                assert collector.got == []  # the half message is invisible while unresolved
                await collector.wait_for(1, 15)
                await asyncio.sleep(2.5)  # committed once: no further checks, no duplicate
            finally:
                await collector.consumer.shutdown()
        assert collector.bodies() == [b"later"]
        assert len(listener.checked) == 1
        checked = listener.checked[0]
        assert checked.topic == topic and checked.body == b"later" and checked.uniq_key == sent.msg_id
        assert checked.properties[Prop.TRANSACTION_CHECK_TIMES] == "1"

    run(main())


def test_unresolved_transactions_are_discarded_after_the_maximum_checks(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path, transaction_check_max=2, **FAST_CHECKS)
    topic = "TxNever"

    async def main() -> None:
        listener = Listener(LocalTransactionState.UNKNOWN, LocalTransactionState.UNKNOWN)
        async with TransactionProducer("tx-pg-n", listener, mq.ns, heartbeat_s=1.0) as producer:
            await producer.send_in_transaction(Message(topic, b"undecided"))
            assert await wait_until(lambda: len(listener.checked) >= 2, 15)
            await asyncio.sleep(3.0)  # more rounds: nobody asks a third time
        assert [m.properties[Prop.TRANSACTION_CHECK_TIMES] for m in listener.checked] == ["1", "2"]

    run(main())


CRASHING_PRODUCER = textwrap.dedent(
    """
    import asyncio, sys
    from tidemq.client import LocalTransactionState, Message, TransactionProducer

    class Undecided:
        def execute_local_transaction(self, msg, arg):
            return LocalTransactionState.UNKNOWN
        def check_local_transaction(self, msg):
            return LocalTransactionState.UNKNOWN

    async def main():
        producer = TransactionProducer("tx-pg-crash", Undecided(), sys.argv[1], instance_name="doomed")
        await producer.start()
        await producer.send_in_transaction(Message(sys.argv[2], b"orphan"))
        print("sent", flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


def test_check_reaches_another_producer_of_the_group_after_a_crash(shared_mq: MQ) -> None:
    mq = shared_mq
    topic = "TxCrash"
    doomed = subprocess.Popen(
        [sys.executable, "-c", CRASHING_PRODUCER, mq.ns, topic], stdout=subprocess.PIPE, text=True
    )
    try:
        assert doomed.stdout is not None and doomed.stdout.readline().strip() == "sent"
    finally:
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)

    async def main() -> None:
        survivor = Listener(LocalTransactionState.UNKNOWN, LocalTransactionState.COMMIT)
        async with TransactionProducer(
            "tx-pg-crash", survivor, mq.ns, heartbeat_s=1.0, instance_name="survivor"
        ):
            collector = Collector(mq, "tx-cg-crash", topic)
            await collector.consumer.start()
            try:
                await collector.wait_for(1, 15)
            finally:
                await collector.consumer.shutdown()
        assert collector.bodies() == [b"orphan"]
        assert [m.body for m in survivor.checked] == [b"orphan"]

    run(main())


def test_pending_transaction_is_checked_after_a_broker_restart(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path, transaction_check_interval_s=1.0, transaction_timeout_s=3.0)
    topic = "TxRestart"

    async def send() -> str:
        listener = Listener(LocalTransactionState.UNKNOWN)
        async with TransactionProducer("tx-pg-rs", listener, mq.ns) as producer:
            sent = await producer.send_in_transaction(Message(topic, b"survives"))
        assert listener.checked == []  # stopped before the timeout: never asked yet
        return sent.msg_id

    msg_id = run(send())
    mq.stop_broker()
    mq.start_broker()

    async def resolve() -> None:
        listener = Listener(LocalTransactionState.UNKNOWN, LocalTransactionState.COMMIT)
        async with TransactionProducer("tx-pg-rs", listener, mq.ns, heartbeat_s=1.0):
            collector = Collector(mq, "tx-cg-rs", topic)
            await collector.consumer.start()
            try:
                await collector.wait_for(1, 15)
            finally:
                await collector.consumer.shutdown()
        assert collector.bodies() == [b"survives"]
        assert collector.got[0][1].uniq_key == msg_id
        assert [m.uniq_key for m in listener.checked] == [msg_id]

    run(resolve())


def test_delayed_transactional_message_is_not_delayed(shared_mq: MQ) -> None:
    """As RocketMQ's TransactionMQProducer: the DELAY level of a transactional message is dropped."""
    mq = shared_mq

    async def main() -> None:
        listener = Listener(LocalTransactionState.COMMIT)
        async with TransactionProducer("tx-pg-d", listener, mq.ns) as producer:
            begin = time.time()
            await producer.send_in_transaction(Message("TxDelay", b"now", delay_level=3))
            collector = Collector(mq, "tx-cg-d", "TxDelay")
            await collector.consumer.start()
            try:
                await collector.wait_for(1, 10)
            finally:
                await collector.consumer.shutdown()
        assert collector.got[0][1].store_timestamp - begin * 1000 < 2500

    run(main())


def test_end_transaction_is_checked_and_idempotent(shared_mq: MQ) -> None:
    from tidemq.message import TRANSACTION_COMMIT_TYPE, decode_message_id
    from tidemq.plugins import get_plugin_manager
    from tidemq.remoting.codes import RequestCode, ResponseCode
    from tidemq.remoting.command import RemotingCommand

    mq = shared_mq
    topic = "TxTwice"

    async def main() -> None:
        listener = Listener(LocalTransactionState.COMMIT)
        async with TransactionProducer("tx-pg-2", listener, mq.ns) as producer:
            sent = (await producer.send_in_transaction(Message(topic, b"once"))).send_result
        fields = {
            "producerGroup": "tx-pg-2",
            "tranStateTableOffset": str(sent.queue_offset),
            "commitLogOffset": str(decode_message_id(sent.offset_msg_id)[1]),
            "commitOrRollback": str(TRANSACTION_COMMIT_TYPE),
            "fromTransactionCheck": "false",
            "msgId": sent.msg_id,
            "transactionId": sent.msg_id,
        }
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            again = await client.invoke(
                mq.broker_addr, RemotingCommand.request(RequestCode.END_TRANSACTION, fields), 3
            )
            assert again.code == ResponseCode.SUCCESS  # a repeated commit is accepted...
            wrong = dict(fields, producerGroup="someone-else")
            refused = await client.invoke(
                mq.broker_addr, RemotingCommand.request(RequestCode.END_TRANSACTION, wrong), 3
            )
            assert refused.code == ResponseCode.SYSTEM_ERROR and "producer group" in (refused.remark or "")
            bogus = dict(fields, commitLogOffset="12345678")
            missing = await client.invoke(
                mq.broker_addr, RemotingCommand.request(RequestCode.END_TRANSACTION, bogus), 3
            )
            assert missing.code == ResponseCode.SYSTEM_ERROR
        finally:
            await client.close()
        collector = Collector(mq, "tx-cg-2", topic)
        await collector.consumer.start()
        try:
            await collector.wait_for(1, 10)
            await asyncio.sleep(1.0)
        finally:
            await collector.consumer.shutdown()
        assert collector.bodies() == [b"once"]  # ...but delivers nothing twice

    run(main())
