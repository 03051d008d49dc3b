"""A broker whose role the replication decides at run time (issue 25, controller mode).

A real NameServer and two brokers on loopback, in-process: ``broker-a`` runs a small
:class:`~tidemq.replication.RoleAware` replication the test flips (from another thread, as the
controller plugin's election may), ``broker-b`` is a plain master for the producer to fail over to.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import wait_for

from tidemq.broker import Broker
from tidemq.broker.processors.broker_config import parse_properties
from tidemq.client import LoopThread, Message, Producer
from tidemq.client.admin import AdminClient
from tidemq.config import NamesrvSettings, compose, parse_config
from tidemq.futures import StoreFuture
from tidemq.namesrv import NameServer
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.protocol import TopicConfig
from tidemq.replication import ReplicaStatus, RoleAware
from tidemq_ha_replication.none import NoReplication

TOPIC = "RoleTopic"


class FlipReplication(NoReplication):
    """The ``none`` replication with a role, an epoch and an acknowledgement the test sets."""

    def __init__(self, own_id: int) -> None:
        self.role = "SLAVE"
        self.epoch = 0
        self.own_id = own_id
        self.answer = ReplicaStatus.PUT_OK
        self.asked = 0
        self.listener: Any = None

    def current_role(self) -> str:
        return self.role

    def current_broker_id(self) -> int:
        return self.own_id if self.role == "SLAVE" else 0

    def current_epoch(self) -> int:
        return self.epoch

    def bind_role_listener(self, listener: Any) -> None:
        self.listener = listener

    def wait_for_replicas(self, end_offset: int) -> Future[ReplicaStatus]:
        self.asked += 1
        return StoreFuture.completed(self.answer)

    def switch(self, role: str, epoch: int) -> None:
        """Change the role and tell the broker from a thread of our own (not the broker's loop)."""
        self.role, self.epoch = role, epoch
        t = threading.Thread(target=self.listener)
        t.start()
        t.join()


class Cluster:
    def __init__(self, loop: LoopThread, ns: NameServer, a: Broker, b: Broker, flip: FlipReplication) -> None:
        self.loop, self.ns, self.a, self.b, self.flip = loop, ns, a, b, flip
        self.admin = AdminClient(str(ns.address))

    def run(self, coro: Any, timeout: float = 20) -> Any:
        return self.loop.run(coro, timeout)

    def addrs(self, name: str) -> dict[int, str]:
        info = self.run(self.admin.cluster_info())
        table = (info.get("brokerAddrTable") or {}).get(name) or {}
        return {int(k): v for k, v in (table.get("brokerAddrs") or {}).items()}

    def wait_registered(self, broker_id: int, within: float = 1.0) -> float:
        """Seconds until the NameServer lists broker-a under ``broker_id`` alone."""
        start = time.monotonic()
        while True:
            if self.addrs("broker-a") == {broker_id: self.a.address}:
                return time.monotonic() - start
            assert time.monotonic() - start < within, f"broker-a is {self.addrs('broker-a')}"
            time.sleep(0.02)

    def raw_send(self, body: bytes = b"raw", delay_level: int = 0) -> RemotingCommand:
        props = "WAIT\x01true\x02" + (f"DELAY\x01{delay_level}\x02" if delay_level else "")
        header = {
            "producerGroup": "role-pg",
            "topic": TOPIC,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4,
            "queueId": 0,
            "sysFlag": 0,
            "bornTimestamp": int(time.time() * 1000),
            "flag": 0,
            "properties": props,
            "reconsumeTimes": 0,
            "unitMode": False,
        }

        async def send() -> RemotingCommand:
            req = RemotingCommand.request(RequestCode.SEND_MESSAGE, header, body)
            return await self.a.client.invoke(self.a.address, req, 5.0)

        return self.run(send())

    def runtime(self) -> dict[str, str]:
        async def ask() -> RemotingCommand:
            return await self.a.client.invoke(
                self.a.address, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), 5.0
            )

        return dict(orjson.loads(self.run(ask()).body)["table"])

    def broker_config(self) -> dict[str, str]:
        async def ask() -> RemotingCommand:
            return await self.a.client.invoke(
                self.a.address, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG, {}), 5.0
            )

        return parse_properties((self.run(ask()).body or b"").decode())

    def master_services(self) -> tuple[bool, bool]:
        return bool(self.a.schedule._tasks), bool(self.a.transactions._tasks)

    def wait_services(self, running: bool, timeout: float = 5.0) -> None:
        """The broker re-registers first and then starts or stops its master-only services:
        wait until both follow the role (a registration seen says nothing about them yet)."""
        assert wait_for(lambda: self.master_services() == (running, running), timeout), (
            f"master-only services {self.master_services()}, wanted both {running}"
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    loop = LoopThread("role-test")
    flip = FlipReplication(own_id=1)

    async def start() -> tuple[NameServer, Broker, Broker]:
        ns = NameServer(
            NamesrvSettings(listen="127.0.0.1:0", data_dir=str(tmp_path / "namesrv")),
            get_plugin_manager().create("transport", "tcp"),
        )
        await ns.start()
        brokers = []
        for name, extra in (("broker-a", {"id": 1, "role": "SLAVE"}), ("broker-b", {})):
            raw = {
                "broker": {
                    "name": name,
                    "listen": "127.0.0.1:0",
                    "namesrv": [str(ns.address)],
                    "data_dir": str(tmp_path / name),
                    "delay_levels": "200ms 1s",
                    "transaction_check_interval_s": 1.0,
                    "register_interval_s": 30.0,  # a role change must not wait for the periodic round
                    **extra,
                }
            }
            components = compose(parse_config(raw))
            if name == "broker-a":
                components.instances["replication"] = flip
            broker = Broker(components)
            broker.topics.update(TopicConfig(TOPIC, read_queue_nums=2, write_queue_nums=2))
            await broker.start()
            brokers.append(broker)
        return ns, brokers[0], brokers[1]

    ns, a, b = loop.run(start(), 30)
    c = Cluster(loop, ns, a, b, flip)
    try:
        yield c
    finally:
        loop.run(c.admin.close() if hasattr(c.admin, "close") else asyncio.sleep(0))
        for broker in (a, b):
            loop.run(broker.stop(), 30)
        loop.run(ns.stop())
        loop.stop()


def test_role_flips_reach_nameserver_send_path_and_services(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    c, a = cluster, cluster.a
    assert isinstance(c.flip, RoleAware) and a.role_aware is c.flip
    # Starts as a slave: registered as id 1, takes no sends, runs no master-only service.
    c.wait_registered(1, within=5.0)
    refused = c.raw_send()
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE and "slave" in (refused.remark or "")
    c.wait_services(False)
    assert c.runtime()["brokerRole"] == "SLAVE" and c.runtime()["controllerEpoch"] == "0"

    # Progress copied from the old master past this replica's (cut back) schedule queue: the
    # promoted broker must start from its own queue's end, not skip what is written next.
    a.schedule.offsets[1] = 50
    caplog.set_level(logging.INFO, logger="tidemq.broker.roles")
    c.flip.switch("SYNC_MASTER", 3)
    took = c.wait_registered(0)  # at once, not at the next 30 s round
    assert any(r.getMessage() == "broker-a is now SYNC_MASTER, epoch 3" for r in caplog.records)
    ok = c.raw_send(b"as-master")
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    assert ok.ext_fields["epoch"] == "3"
    info = c.runtime()
    assert info["brokerRole"] == "SYNC_MASTER" and info["controllerEpoch"] == "3"
    props = c.broker_config()  # what mqadmin getBrokerConfig shows: the role in force
    assert props["brokerRole"] == "SYNC_MASTER" and props["brokerId"] == "0"
    c.wait_services(True)
    # The schedule service works on the promoted slave: a 200 ms delayed message is delivered.
    delayed = c.raw_send(b"later", delay_level=1)
    assert delayed.code == ResponseCode.SUCCESS
    deadline = time.monotonic() + 5
    while a.store.get_max_offset_in_queue(TOPIC, 0) < 2:
        assert time.monotonic() < deadline, "the schedule service never delivered on the new master"
        time.sleep(0.05)

    # A delayed message due after the demotion: a slave never delivers it (its log follows the
    # master's); the broker delivers it once promoted again.
    assert c.raw_send(b"due-after", delay_level=1).code == ResponseCode.SUCCESS
    before = a.store.get_max_offset_in_queue(TOPIC, 0)
    c.flip.switch("SLAVE", 4)
    c.wait_registered(1)
    refused = c.raw_send()
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE and refused.ext_fields["epoch"] == "4"
    c.wait_services(False)
    assert c.runtime()["brokerRole"] == "SLAVE" and c.runtime()["controllerEpoch"] == "4"
    assert c.broker_config()["brokerId"] == "1"
    time.sleep(0.5)  # past the 200 ms level
    assert a.store.get_max_offset_in_queue(TOPIC, 0) == before
    c.flip.switch("ASYNC_MASTER", 5)
    c.wait_registered(0)
    deadline = time.monotonic() + 5
    while a.store.get_max_offset_in_queue(TOPIC, 0) == before:
        assert time.monotonic() < deadline, "the delayed message was never delivered after re-promotion"
        time.sleep(0.05)
    assert took < 1.0


def test_not_master_answer_makes_the_producer_retry_another_broker(cluster: Cluster) -> None:
    c = cluster
    c.flip.switch("ASYNC_MASTER", 7)
    c.wait_registered(0)
    c.flip.answer = ReplicaStatus.NOT_MASTER  # fenced: the election says we may not acknowledge
    fenced = c.raw_send()
    assert fenced.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "broker-a" in (fenced.remark or "") and "not master (fenced)" in (fenced.remark or "")
    assert fenced.ext_fields["epoch"] == "7"

    async def produce() -> list[Any]:
        producer = Producer("role-pg", str(c.ns.address), retry_times=2)
        await producer.start()
        try:
            return [await producer.send(Message(TOPIC, b"m%d" % i)) for i in range(8)]
        finally:
            await producer.shutdown()

    asked_before = c.flip.asked
    results = c.run(produce())
    assert {r.queue.broker_name for r in results} == {"broker-b"}  # every acknowledgement from b
    assert c.flip.asked > asked_before  # broker-a was tried and refused to acknowledge
