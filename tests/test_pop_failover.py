"""POP across a controller failover (issue 39): what was in flight on the old master comes back
from the new one; what was acknowledged does not.

The revive log (``rmq_sys_REVIVE_LOG_<cluster>``) is in the commit log, so it reaches the slaves
with the messages; under ``SYNC_MASTER`` a POP or ACK is answered once a slave has its record.
Real processes: etcd, a NameServer and three controller brokers (:mod:`controller_support`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for

pytest.importorskip("httpx", reason="httpx is not installed (pip install tidemq[controller])")

from controller_support import ControllerCluster  # noqa: E402
from test_controller_election import EtcdServer  # noqa: E402

from tidemq.client import LoopThread, Message, Producer, ReceivedMessage, SimpleConsumer  # noqa: E402
from tidemq.client.errors import ClientError  # noqa: E402

TOPIC = "PopFailoverTopic"
GROUP = "GPOP_FAILOVER"
N = 64
INVISIBLE_S = 4.0
ERRORS: list[str] = []


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    server.start()
    yield server
    server.stop()


async def _send(ns: str) -> set[str]:
    async with Producer("PG_POP_FO", namesrv=ns) as p:
        ids = set()
        for i in range(N):
            r = await p.send(Message(TOPIC, f"fo-{i}".encode()))
            ids.add(r.msg_id)
        for _ in range(100):  # the auto-created topic's route
            if await p.instance.get_route(TOPIC, refresh=True) is not None:
                break
            await asyncio.sleep(0.1)
        return ids


async def _receive(c: SimpleConsumer, want: int, invisible: float, timeout: float) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        try:
            got += await c.receive(32, invisible, 0.5)
        except ClientError as exc:  # the old master is gone, the route not refreshed yet, or rebuilding
            ERRORS.append(repr(exc))
            await asyncio.sleep(0.3)
    return got


@pytest.mark.slow
def test_in_flight_messages_come_back_from_the_new_master_and_acknowledged_ones_do_not(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    cluster = ControllerCluster(spawn, tmp_path, etcd)
    master = cluster.wait_master()
    assert wait_for(lambda: master.info().get("haConnectedSlaves") == "2", 20), master.log()
    loop = LoopThread("test-pop-failover")
    consumer = SimpleConsumer(
        GROUP, cluster.ns, subscriptions={TOPIC: "*"}, consume_from="first", route_refresh_s=0.5
    )
    try:
        sent = loop.run(_send(cluster.ns), 60)
        loop.run(consumer.start())
        popped = loop.run(_receive(consumer, N, 60.0, 20), 60)
        assert {m.message_id for m in popped} == sent
        acked = popped[: N // 2]
        for m in acked[:8]:  # one ACK_MESSAGE each, and the rest in one batch
            loop.run(consumer.ack(m))
        assert loop.run(consumer.ack_many(acked[8:])) == len(acked) - 8
        # The unacknowledged half: its invisibility is changed to a short one (a new checkpoint).
        rest = popped[N // 2 :]
        for m in rest:
            loop.run(consumer.change_invisible_duration(m, INVISIBLE_S))
        killed = time.monotonic()
        master.kill()
        new = cluster.wait_master(30)
        assert new is not master
        acked_ids = {m.message_id for m in acked}
        waiting = {m.message_id for m in rest}
        back: dict[str, int] = {}

        async def drain(seconds: float) -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and (waiting - set(back) or seconds < 10):
                for m in await _receive(consumer, 1, 60.0, 1.0):
                    back[m.message_id] = back.get(m.message_id, 0) + 1
                    await consumer.ack(m)

        loop.run(drain(45), 90)
        took = time.monotonic() - killed
        missing = waiting - set(back)
        assert not missing, (
            f"{len(missing)} of {len(waiting)} in-flight messages never came back: {ERRORS[-5:]} {new.log()}"
        )
        assert all(back[i] >= 1 for i in waiting)
        print(f"every in-flight message back from {new.addr} {took:.1f} s after the SIGKILL")
        loop.run(drain(INVISIBLE_S + 2), 30)  # anything acknowledged would have come back by now
        again = acked_ids & set(back)
        assert not again, f"{len(again)} acknowledged messages came back after the failover"
        info = new.info()
        assert int(info["popRevived"]) >= len(waiting)
    finally:
        try:
            loop.run(consumer.shutdown(), 10)
        finally:
            loop.stop()
