"""The timer's scheduled count per topic (GET_TIMER_METRICS ``timingCount``, the metric
``rocketmq_timing_messages``) across a failover.

A slave builds its own wheel from the replicated ``rmq_sys_wheel_timer``; promoted, it delivers
what is pending there.  Its per-topic counts must hold those messages too, as its global count
(``timerCongestNum``) does: else after a failover every topic shows fewer scheduled messages than
it has (none at all for those only the old master took), until each is delivered.

Fast and in process, with the real timer engine: the messages are put into the slave's store as the
replication would (the replication itself is covered by ``test_timer_failover.py``), and the
promotion is RocketMQ 4.x's manual one (the slave restarted on its data as the master).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest
from conftest import wait_for

from tidemq.broker import Broker
from tidemq.broker.timer import TIMER_OUT_MS, TIMER_TOPIC
from tidemq.config import compose, parse_config
from tidemq.message import MessageInner, Prop
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(90)

TIMER = {"timer_precision_ms": 100, "timer_flush_interval_ms": 100, "timer_max_delay_sec": 3600}


def now_ms() -> int:
    return int(time.time() * 1000)


def broker_of(data: Path, role: str) -> Broker:
    settings = {"listen": "127.0.0.1:0", "namesrv": [], "data_dir": str(data), "role": role, **TIMER}
    if role == "SLAVE":
        settings["id"] = 1
    return Broker(compose(parse_config({"broker": settings})))


def parked(broker: Broker, topic: str, due_ms: int, body: bytes) -> MessageInner:
    """A timer message as the master parks it in rmq_sys_wheel_timer (its real topic in REAL_TOPIC)."""
    props = {Prop.REAL_TOPIC: topic, Prop.REAL_QUEUE_ID: "0", TIMER_OUT_MS: str(due_ms)}
    return MessageInner(TIMER_TOPIC, body, 0, 0, props, 0, now_ms(), ("127.0.0.1", 1), broker.store_host)


async def timing_count(broker: Broker) -> dict[str, int]:
    """GET_TIMER_METRICS's ``timingCount``, over the wire."""
    client = get_plugin_manager().create("transport", "tcp").client()
    try:
        resp = await client.invoke(
            broker.address, RemotingCommand.request(RequestCode.GET_TIMER_METRICS, {}), 5.0
        )
    finally:
        await client.close()
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return {t: v["count"] for t, v in orjson.loads(resp.body or b"{}")["timingCount"].items()}


def test_a_promoted_slave_counts_per_topic_the_timers_it_enqueued_as_a_slave(tmp_path: Path) -> None:
    data = tmp_path / "broker"

    async def as_slave() -> tuple[dict[str, int], dict[str, str]]:
        slave = broker_of(data, "SLAVE")
        await slave.start()
        try:
            later = now_ms() + 600_000
            soon = now_ms() + 2_000
            msgs = [parked(slave, "Orders", later + i, b"o") for i in range(3)]
            msgs += [parked(slave, "Bills", later, b"b"), parked(slave, "Gone", soon, b"g")]
            for m in msgs:
                assert (await asyncio.wrap_future(slave.store.put_message(m))).ok
            s = slave.timers.schedule
            assert await asyncio.to_thread(wait_for, lambda: s.queue_offset == 5, 15), s.queue_offset
            assert await timing_count(slave) == {"Orders": 3, "Bills": 1, "Gone": 1}
            # The slave's clock (SLAVE_BEHIND_MS behind) passes "Gone" by, the old master having
            # delivered it: moved on here at once rather than in 30 s.
            slave.timers.delivery.pass_by(soon // s.precision_ms + 1)
            assert s.pending == 4
            return await timing_count(slave), slave.timers.runtime_info()
        finally:
            await slave.stop()

    async def as_master() -> tuple[dict[str, int], dict[str, str]]:
        master = broker_of(data, "ASYNC_MASTER")
        await master.start()
        try:
            return await timing_count(master), master.timers.runtime_info()
        finally:
            await master.stop()

    on_slave, slave_info = asyncio.run(as_slave())
    assert slave_info["timerCongestNum"] == "4"
    assert on_slave == {"Orders": 3, "Bills": 1}, on_slave
    promoted, info = asyncio.run(as_master())
    assert info["timerCongestNum"] == "4"
    assert promoted == {"Orders": 3, "Bills": 1}, promoted
