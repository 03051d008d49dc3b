"""What operators see of timer messages (issue 36): scheduled counts per topic in ``tidemq admin``
(``getTimerMetrics``, ``topicStatus``) and the console (``/api/scheduled``, the topic page), and
the trace of both steps (the producer's send, the wheel's delivery to the real topic).

A real NameServer and broker subprocess (100 ms precision), the admin CLI as an operator runs it,
the console app in this process over real sockets.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from conftest import run_admin, wait_for
from starlette.testclient import TestClient
from test_delay_schedule import MQ
from test_timer_messages import TIMER, now_ms, queue_max, run

from tidemq.broker.timer import TIMER_OUT_MS, TIMER_TOPIC
from tidemq.client import Message, MessageExt, Producer, PullConsumer, PullStatus
from tidemq.client.admin import AdminClient
from tidemq.trace.view import query_trace
from tidemq_console.app import ConsoleConfig, create_app

pytestmark = pytest.mark.timeout(180)


async def pull_all(ns: str, topic: str, want: int, timeout: float = 20) -> list[MessageExt]:
    out: list[MessageExt] = []
    async with PullConsumer("timer-ops-reader", ns) as consumer:
        queues = await consumer.fetch_subscribe_queues(topic)
        offsets = dict.fromkeys(queues, 0)
        deadline = time.monotonic() + timeout
        while len(out) < want and time.monotonic() < deadline:
            for mq in queues:
                result = await consumer.pull(mq, "*", offsets[mq], 32)
                if result.status is PullStatus.FOUND:
                    out.extend(result.messages)
                offsets[mq] = result.next_begin_offset
            await asyncio.sleep(0.1)
    return out


def table_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()[1:] if line.strip()]


def test_admin_and_console_show_scheduled_counts_per_topic(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path, **TIMER)
    # Far enough that every count below is read before it is due (the admin runs are processes:
    # seconds each on a loaded machine); never waited for.
    due = now_ms() + 60_000

    async def send(*messages: Message) -> None:
        async with Producer("timer-ops-pg", mq.ns) as producer:
            for message in messages:
                await producer.send(message)

    run(
        send(
            Message("Plain", b"now"),
            *(
                Message("Orders", f"o{i}".encode(), properties={"TIMER_DELIVER_MS": str(due)})
                for i in range(3)
            ),
            Message("Mail", b"m", properties={"TIMER_DELAY_MS": "60000"}),
        )
    )
    assert wait_for(lambda: run(queue_max(mq, TIMER_TOPIC)) == 4, timeout=10)

    def counts() -> dict[str, int]:
        out = run_admin(mq.ns, "getTimerMetrics", cwd=tmp_path).stdout
        return {row[1]: int(row[2]) for row in table_rows(out)}

    assert wait_for(lambda: counts() == {"Orders": 3, "Mail": 1}, timeout=10), counts()
    out = run_admin(mq.ns, "getTimerMetrics", "-t", "Orders", cwd=tmp_path).stdout
    assert out.splitlines()[0].split() == ["#Broker", "Name", "#Topic", "#Scheduled"]
    assert table_rows(out) == [["broker-d", "Orders", "3"]]
    out = run_admin(mq.ns, "getTimerMetrics", "-b", mq.broker_addr, cwd=tmp_path).stdout
    assert sorted(r[1] for r in table_rows(out)) == ["Mail", "Orders"]
    status = run_admin(mq.ns, "topicStatus", "-t", "Orders", cwd=tmp_path).stdout
    assert "#Scheduled (timer messages waiting): 3" in status
    # A topic with nothing waiting keeps mqadmin's output as it was: the table alone.
    plain = run_admin(mq.ns, "topicStatus", "-t", "Plain", cwd=tmp_path).stdout
    assert "Scheduled" not in plain and plain.splitlines()[0].startswith("#Broker Name")

    with TestClient(create_app(ConsoleConfig(namesrv=mq.ns))) as web:
        api = web.get("/api/scheduled")
        assert api.status_code == 200
        topics = api.json()["topics"]
        assert topics["Orders"] == {"total": 3, "brokers": {"broker-d": 3}}
        page = web.get("/topics/Orders")
        assert page.status_code == 200 and '<span id="topic-scheduled">3</span>' in page.text
        # A timer due in 3 s (sent now, after the slow admin runs): counted by the API while it
        # waits, then delivered: its count leaves the admin, the API and the page.
        run(send(Message("Soon", b"s", properties={"TIMER_DELAY_MS": "3000"})))
        assert wait_for(lambda: "Soon" in web.get("/api/scheduled").json()["topics"], timeout=3, every=0.05)
        assert wait_for(lambda: "Soon" not in web.get("/api/scheduled").json()["topics"], timeout=15)
        assert '<span id="topic-scheduled">0</span>' in web.get("/topics/Soon").text
    assert counts() == {"Orders": 3, "Mail": 1}
    # A bad address is one error line and exit 1, no traceback.
    bad = run_admin(mq.ns, "getTimerMetrics", "-b", "127.0.0.1:1", cwd=tmp_path, ok=False)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr and "GET_TIMER_METRICS" in bad.stderr


def test_the_trace_records_the_send_and_the_delivery(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path, trace_topic_enable=True, **TIMER)

    async def main() -> tuple[Any, Any, list[MessageExt]]:
        async with Producer("timer-trace-pg", mq.ns, enable_msg_trace=True) as producer:
            traced = await producer.send(
                Message(
                    "Orders", b"later", tags="TagT", keys=["order-7"], properties={"TIMER_DELAY_MS": "800"}
                )
            )
            quiet = await producer.send(
                Message("Orders", b"untraced", properties={"TIMER_DELAY_MS": "800", "TRACE_ON": "false"})
            )
        got = await pull_all(mq.ns, "Orders", 2)
        return traced, quiet, got

    traced, quiet, got = run(main())
    delivered = {m.uniq_key: m for m in got}
    m = delivered[traced.msg_id]

    async def trace_of(msg_id: str) -> Any:
        client = AdminClient(mq.ns)
        try:
            return await query_trace(client, msg_id)
        finally:
            await client.close()

    assert wait_for(lambda: len(run(trace_of(traced.msg_id)).pubs) == 2, timeout=15), run(
        trace_of(traced.msg_id)
    )
    pubs = sorted(run(trace_of(traced.msg_id)).pubs, key=lambda v: v.time_stamp)
    send, delivery = pubs
    # Step 1, the producer's send: its group, the topic it named, the offset id of the parked copy.
    assert send.group_name == "timer-trace-pg" and send.topic == "Orders" and send.status == "success"
    assert send.offset_msg_id == traced.offset_msg_id
    # Step 2, the wheel's put to the real topic: at (never before) the due time, the delivered
    # message's offset id, its tags and keys, the lateness as its cost.
    assert delivery.group_name == "rmq_sys_wheel_timer" and delivery.topic == "Orders"
    assert delivery.offset_msg_id == m.msg_id != traced.offset_msg_id
    assert delivery.tags == "TagT" and delivery.keys == "order-7"
    assert delivery.time_stamp == m.store_timestamp >= int(m.properties[TIMER_OUT_MS])
    assert delivery.cost_time == m.store_timestamp - int(m.properties[TIMER_OUT_MS])
    # The admin CLI prints both.
    out = run_admin(mq.ns, "queryMsgTraceById", "-i", traced.msg_id, cwd=tmp_path).stdout
    assert "timer-trace-pg" in out and "rmq_sys_wheel_timer" in out
    # A message sent with TRACE_ON=false: delivered, and the wheel writes no record of it (the
    # producer's own Pub is written all the same, as RocketMQ's send hook does).
    assert quiet.msg_id in delivered
    assert [p.group_name for p in run(trace_of(quiet.msg_id)).pubs] == ["timer-trace-pg"]
