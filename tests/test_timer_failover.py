"""Timer messages across a master/slave failover (issue 36), and the duplicate bound.

A slave builds its own timer log and wheel from the replicated ``rmq_sys_wheel_timer`` and follows
the clock ``SLAVE_BEHIND_MS`` (30 s) behind without delivering.  Promoted, it delivers every
message still pending, and again what was due in those 30 s before (the dead master may not have):
the duplicates of a failover are at most the messages the old master delivered in the 30 s before
the promotion, each once more; nothing older is repeated and nothing is lost.

Here the promotion is RocketMQ 4.x's manual one: the master is SIGKILLed, and the slave restarted
on its data directory as the master (broker id 0).  Controller mode (an elected slave) is
``test_timer_messages.py::test_scheduled_timers_are_delivered_after_a_failover``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest
from conftest import runtime_info, wait_for
from test_ha_cluster import HaCluster, broker_toml
from test_timer_messages import TIMER, now_ms, run

from tidemq.broker.timer import TIMER_OUT_MS
from tidemq.broker.timer.delivery import SLAVE_BEHIND_MS
from tidemq.client import Message, MessageExt, Producer, PullConsumer, PullStatus

TOPIC = "TimerHaFailover"


async def read_all(ns: str, topic: str, want: set[str], timeout: float) -> list[MessageExt]:
    """Every message of ``topic`` through the route, from offset 0, until ``want`` are all seen."""
    out: list[MessageExt] = []
    async with PullConsumer("timer-ha-reader", ns) as consumer:
        deadline = time.monotonic() + timeout
        offsets: dict[Any, int] = {}
        while time.monotonic() < deadline:
            try:
                queues = await consumer.fetch_subscribe_queues(topic)
                for mq in queues:
                    result = await consumer.pull(mq, "*", offsets.get(mq, 0), 32)
                    if result.status is PullStatus.FOUND:
                        out.extend(result.messages)
                    offsets[mq] = result.next_begin_offset
            except Exception:  # the route still names the dead master: ask again
                await asyncio.sleep(0.5)
                continue
            if want <= {m.uniq_key for m in out}:
                await asyncio.sleep(1.0)  # late duplicates too
                for mq in queues:
                    result = await consumer.pull(mq, "*", offsets[mq], 32)
                    if result.status is PullStatus.FOUND:
                        out.extend(result.messages)
                break
            await asyncio.sleep(0.2)
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_promoted_slave_delivers_the_pending_timers_and_repeats_only_its_window(spawn, tmp_path) -> None:
    cluster = HaCluster(spawn, tmp_path, "SYNC_MASTER", broker=TIMER)
    cluster.start_slave()
    t0 = now_ms()
    # old: due at once, delivered by the master more than SLAVE_BEHIND_MS before the kill;
    # recent: delivered by the master within that window; pending: due after the kill.
    kill_at = t0 + SLAVE_BEHIND_MS + 8_000
    plan = {
        **{f"old{i}": t0 + 1_000 + 10 * i for i in range(4)},
        **{f"recent{i}": kill_at - 2_000 + 10 * i for i in range(4)},
        **{f"pending{i}": kill_at + 8_000 + 100 * i for i in range(12)},
    }

    async def send() -> dict[str, str]:
        keys: dict[str, str] = {}
        async with Producer("timer-ha-pg", cluster.ns) as producer:
            for name, due in plan.items():
                r = await producer.send(
                    Message(TOPIC, name.encode(), properties={"TIMER_DELIVER_MS": str(due)})
                )
                keys[name] = r.msg_id
        return keys

    keys = run(send())
    assert wait_for(lambda: runtime_info(cluster.slave_addr).get("timerOffsetBehind") == "0", 10)
    assert wait_for(lambda: int(runtime_info(cluster.slave_addr)["timerCongestNum"]) >= 16, 10)
    time.sleep(max(0.0, (kill_at - now_ms()) / 1000))
    cluster.master.stop(signal.SIGKILL)
    killed_at = now_ms()
    # The operator's promotion: the slave restarted on its data as the master of the group.
    assert cluster.slave.stop() == 0, cluster.slave.log_path.read_text()[-3000:]
    promoted_at = now_ms()
    cfg, new_addr = broker_toml(
        cluster.slave_dir,
        name="broker-ha",
        role="ASYNC_MASTER",
        broker_id=0,
        namesrv=cluster.ns,
        broker=TIMER,
    )
    new_master = spawn("broker", "-c", str(cfg))
    assert wait_for(lambda: runtime_info(new_addr).get("timerCongestNum") is not None, 10), (
        new_master.log_path
    )

    got = run(read_all(cluster.ns, TOPIC, set(keys.values()), 60), timeout=90)
    names = [m.body.decode() for m in got]
    lost = sorted(set(plan) - set(names))
    assert not lost, f"lost after the failover: {lost}"
    for m in got:
        assert m.store_timestamp >= int(m.properties[TIMER_OUT_MS]), m.body  # never early
    dups = sorted({n for n in names if names.count(n) > 1})
    # The bound: only messages due within SLAVE_BEHIND_MS before the promotion (and before the
    # kill: delivered by the old master) are delivered again, once.
    window = (promoted_at - SLAVE_BEHIND_MS - TIMER["timer_precision_ms"], killed_at)
    assert all(window[0] <= plan[n] <= window[1] for n in dups), (dups, window)
    assert all(names.count(n) <= 2 for n in plan)
    assert all(names.count(f"old{i}") == 1 for i in range(4))  # older than the window: once
    assert all(names.count(f"pending{i}") == 1 for i in range(12))
    assert len(dups) <= 4  # at most the recent ones the old master delivered
