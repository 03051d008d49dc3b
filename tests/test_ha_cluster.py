"""Master/slave HA with real processes on loopback: a NameServer, a master and a slave broker.

The brokers run ``python -m tidemq broker -c file.toml`` with ``[plugins] replication =
"master_slave"``; the slave learns its master's HA address from the NameServer's answer to its
registration.  Clients are tidemq's own, pulling through the NameServer's route.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import free_port, runtime_info, wait_for

from tidemq.client import (
    BlockingProducer,
    BlockingPullConsumer,
    BlockingPushConsumer,
    ConsumeStatus,
    Message,
    PullStatus,
    SendStatus,
)
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

TOPIC = "HaTopic"


def broker_toml(
    path: Path,
    *,
    name: str,
    role: str,
    broker_id: int,
    namesrv: str,
    ha: dict[str, Any] | None = None,
    broker: dict[str, Any] | None = None,
) -> tuple[Path, str]:
    port = free_port()
    listen = f"127.0.0.1:{port}"
    opts = {
        "listen": f"127.0.0.1:{free_port()}",
        "heartbeat_s": 1.0,
        "metadata_sync_s": 0.5,
        "group_sync_s": 0.5,
    }
    opts.update(ha or {})
    lines = [
        "[broker]",
        f'name = "{name}"',
        f"id = {broker_id}",
        f'listen = "{listen}"',
        f'namesrv = ["{namesrv}"]',
        f'data_dir = "{path}"',
        f'role = "{role}"',
        "register_interval_s = 0.5",
        "consumer_offset_flush_s = 0.5",
        *(f"{k} = {orjson.dumps(v).decode()}" for k, v in (broker or {}).items()),
        "",
        "[plugins]",
        'replication = "master_slave"',
        "",
        "[store.mmap]",
        "commitlog_file_size = 1048576",
        "",
        "[replication.master_slave]",
        *(f"{k} = {orjson.dumps(v).decode()}" for k, v in opts.items()),
    ]
    cfg = path.with_suffix(".toml")
    cfg.write_text("\n".join(lines) + "\n")
    return cfg, listen


class HaCluster:
    def __init__(
        self,
        spawn: Any,
        tmp_path: Path,
        role: str = "SYNC_MASTER",
        ha: dict[str, Any] | None = None,
        broker: dict[str, Any] | None = None,
        before_start: Callable[[Path], None] | None = None,
    ):
        self.spawn = spawn
        self.tmp = tmp_path
        self.ha = ha or {}
        self.broker = broker or {}
        ns_port = free_port()
        self.namesrv = spawn("namesrv", "--listen", f"127.0.0.1:{ns_port}")
        self.ns = self.namesrv.addresses["namesrv"]
        self.master_dir = tmp_path / "master"
        cfg, self.master_addr = broker_toml(
            self.master_dir,
            name="broker-ha",
            role=role,
            broker_id=0,
            namesrv=self.ns,
            ha=self.ha,
            broker=self.broker,
        )
        if before_start is not None:
            before_start(self.master_dir)
        self.master = spawn("broker", "-c", str(cfg))
        self.slave_dir = tmp_path / "slave"
        self.slave: Any = None
        self.slave_addr = ""

    def start_slave(self) -> None:
        cfg, self.slave_addr = broker_toml(
            self.slave_dir,
            name="broker-ha",
            role="SLAVE",
            broker_id=1,
            namesrv=self.ns,
            ha=self.ha,
            broker=self.broker,
        )
        self.slave = self.spawn("broker", "-c", str(cfg))
        assert wait_for(lambda: runtime_info(self.slave_addr)["haMasterConnected"] == "true"), (
            self.slave.log_path.read_text()[-3000:]
        )

    def kill_master(self, lose_disk: bool = True) -> None:
        self.master.stop(signal.SIGKILL)
        if lose_disk:
            shutil.rmtree(self.master_dir)


def topics_of(addr: str) -> set[str]:
    async def ask() -> set[str]:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            resp = await client.invoke(addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), 3.0)
        finally:
            await client.close()
        return set(orjson.loads(resp.body)["topicConfigTable"])

    return asyncio.run(ask())


def shutdown_or_dump(consumer: BlockingPushConsumer, timeout: float = 20.0) -> None:
    """Shut a consumer down; if that hangs, fail with the stacks of its event loop's tasks."""
    fut = asyncio.run_coroutine_threadsafe(consumer.consumer.shutdown(), consumer._loop.loop)
    try:
        fut.result(timeout)
    except concurrent.futures.TimeoutError:

        async def stacks() -> str:
            out = io.StringIO()
            for task in asyncio.all_tasks():
                task.print_stack(file=out)
            return out.getvalue()

        dump = asyncio.run_coroutine_threadsafe(stacks(), consumer._loop.loop).result(5)
        pytest.fail(f"consumer shutdown hung for {timeout} s; tasks:\n{dump}")
    finally:
        consumer._close_loop()


def drain(consumer: BlockingPullConsumer, topic: str) -> list[bytes]:
    """Every message of every queue of ``topic``, pulled from offset 0 through the route."""
    got: list[bytes] = []
    for mq in consumer.fetch_subscribe_queues(topic):
        offset = 0
        while True:
            res = consumer.pull(mq, "*", offset, 64)
            if res.status is not PullStatus.FOUND:
                break
            got.extend(m.body for m in res.messages)
            offset = res.next_begin_offset
    return got


def test_sync_master_killed_with_its_disk_loses_no_acknowledged_message(spawn: Any, tmp_path: Path) -> None:
    cluster = HaCluster(spawn, tmp_path, "SYNC_MASTER")
    cluster.start_slave()
    acked: list[bytes] = []
    statuses: dict[str, int] = {}
    stop = threading.Event()
    producer = BlockingProducer("ha-pg", cluster.ns, retry_times=0, send_timeout=3.0)
    producer.start()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            body = b"sync-%06d" % i
            i += 1
            try:
                r = producer.send(Message(TOPIC, body))
            except Exception:
                statuses["error"] = statuses.get("error", 0) + 1
                time.sleep(0.05)
                continue
            statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
            if r.status is SendStatus.SEND_OK:
                acked.append(body)

    sender = threading.Thread(target=produce, daemon=True)
    sender.start()
    try:
        assert wait_for(lambda: len(acked) >= 300, 30), statuses
        # Kill the master while sends are in flight, and lose its disk.
        cluster.kill_master(lose_disk=True)
        time.sleep(0.5)
    finally:
        stop.set()
        sender.join(10)
        producer.shutdown()
    consumer = BlockingPullConsumer("ha-check", cluster.ns)
    consumer.start()
    try:
        got = set(drain(consumer, TOPIC))
    finally:
        consumer.shutdown()
    missing = [b for b in acked if b not in got]
    assert not missing, f"{len(missing)} acknowledged messages missing on the slave, e.g. {missing[:3]}"
    assert len(acked) >= 200


def test_async_master_reports_slave_lag_and_an_empty_slave_catches_up(spawn: Any, tmp_path: Path) -> None:
    cluster = HaCluster(spawn, tmp_path, "ASYNC_MASTER")
    info = runtime_info(cluster.master_addr)
    assert info["haRole"] == "ASYNC_MASTER" and info["haConnectedSlaves"] == "0"
    with BlockingProducer("ha-pg2", cluster.ns) as producer:
        # No slave: ASYNC_MASTER still acknowledges.
        for i in range(300):
            assert producer.send(Message(TOPIC, b"async-%05d" % i + bytes(500))).status is SendStatus.SEND_OK
    end = int(runtime_info(cluster.master_addr)["commitLogMaxOffset"])
    # A slave started from an empty disk catches up with everything (the log fits one file).
    cluster.start_slave()
    assert wait_for(lambda: runtime_info(cluster.slave_addr)["commitLogMaxOffset"] == str(end))
    info = runtime_info(cluster.master_addr)
    assert wait_for(lambda: runtime_info(cluster.master_addr)["haSlaveFallBehind"] == "0")
    assert info["haConnectedSlaves"] == "1"
    slave_info = runtime_info(cluster.slave_addr)
    assert slave_info["haRole"] == "SLAVE" and slave_info["haSlaveFallBehind"] == "0"
    # Stop the slave: the master reports it gone; restart it on an empty disk: it catches up again.
    cluster.slave.stop()
    shutil.rmtree(cluster.slave_dir)
    assert wait_for(lambda: runtime_info(cluster.master_addr)["haConnectedSlaves"] == "0")
    with BlockingProducer("ha-pg3", cluster.ns) as producer:
        for i in range(300, 400):
            assert producer.send(Message(TOPIC, b"async-%05d" % i)).status is SendStatus.SEND_OK
    end = int(runtime_info(cluster.master_addr)["commitLogMaxOffset"])
    cluster.start_slave()
    assert wait_for(lambda: runtime_info(cluster.slave_addr)["commitLogMaxOffset"] == str(end))
    # The slave serves reads of everything once the master is gone.
    cluster.kill_master(lose_disk=False)
    consumer = BlockingPullConsumer("ha-check2", cluster.ns)
    consumer.start()
    try:
        got = sorted(b[:11] for b in drain(consumer, TOPIC))
    finally:
        consumer.shutdown()
    assert got == [b"async-%05d" % i for i in range(400)]


def test_consumers_fail_over_to_the_slave_and_resume_without_loss(spawn: Any, tmp_path: Path) -> None:
    cluster = HaCluster(spawn, tmp_path, "SYNC_MASTER")
    cluster.start_slave()
    received: list[bytes] = []
    lock = threading.Lock()

    def listener(msgs: list[Any]) -> ConsumeStatus:
        with lock:
            received.extend(m.body for m in msgs)
        return ConsumeStatus.SUCCESS

    def consumer() -> BlockingPushConsumer:
        c = BlockingPushConsumer(
            "ha-cg",
            cluster.ns,
            consume_from="first",
            pull_error_delay_s=0.5,
            suspend_s=2.0,
            persist_interval_s=0.5,
            rebalance_interval_s=1.0,
        )
        c.subscribe(TOPIC, "*")
        c.register_listener(listener)
        c.start()
        return c

    sent: list[bytes] = []

    def send(start: int, n: int) -> None:
        with BlockingProducer("ha-pg4", cluster.ns) as producer:
            for i in range(start, start + n):
                body = b"fo-%05d" % i
                assert producer.send(Message(TOPIC, body)).status is SendStatus.SEND_OK
                sent.append(body)

    # A consumer consumes (and commits to the master) a first part, live, then goes away.
    first = consumer()
    try:
        send(0, 100)
        assert wait_for(lambda: set(sent) <= set(received), 30)
        live = consumer()  # a second member live across the master's death (rebalances with it)
        send(100, 100)
    finally:
        first.shutdown()
    try:
        cluster.kill_master(lose_disk=True)
        send_blocked = False
        try:
            send(200, 1)
        except Exception:
            send_blocked = True  # no master: nothing can be written
        assert send_blocked
        del sent[200:]
        # The live member and a newcomer finish the backlog from the slave.
        newcomer = consumer()
        try:
            assert wait_for(lambda: set(sent) <= set(received), 40), (
                f"{len(set(sent) - set(received))} of {len(sent)} not consumed after the master died"
            )
        finally:
            newcomer.shutdown()
    finally:
        shutdown_or_dump(live)
    duplicates = len(received) - len(set(received))
    print(f"failover: {len(sent)} sent, {len(received)} consumed, {duplicates} duplicates")
    assert set(received) == set(sent)


def test_slave_syncs_metadata_and_refuses_sends(spawn: Any, tmp_path: Path) -> None:
    cluster = HaCluster(spawn, tmp_path, "ASYNC_MASTER")
    cluster.start_slave()

    async def call(addr: str, code: int, fields: dict[str, str] | None = None) -> RemotingCommand:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            return await client.invoke(addr, RemotingCommand.request(code, fields), 3.0)
        finally:
            await client.close()

    topic_fields = {"topic": "SyncedTopic", "readQueueNums": "3", "writeQueueNums": "3", "perm": "6"}
    resp = asyncio.run(call(cluster.master_addr, RequestCode.UPDATE_AND_CREATE_TOPIC, topic_fields))
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    offset_fields = {"consumerGroup": "cg-sync", "topic": "SyncedTopic", "queueId": "2", "commitOffset": "42"}
    resp = asyncio.run(call(cluster.master_addr, RequestCode.UPDATE_CONSUMER_OFFSET, offset_fields))
    assert resp.code == ResponseCode.SUCCESS, resp.remark

    def synced() -> bool:
        topics = orjson.loads(asyncio.run(call(cluster.slave_addr, RequestCode.GET_ALL_TOPIC_CONFIG)).body)
        offsets = orjson.loads(
            asyncio.run(call(cluster.slave_addr, RequestCode.GET_ALL_CONSUMER_OFFSET)).body
        )
        cfg = topics["topicConfigTable"].get("SyncedTopic")
        return (
            cfg is not None
            and cfg["readQueueNums"] == 3
            and offsets["offsetTable"].get("SyncedTopic@cg-sync", {}).get("2") == 42
        )

    assert wait_for(synced, 15)
    # Delay offsets: a level-1 (1 s) message is delivered by the master; the slave copies its progress.
    with BlockingProducer("ha-pg-delay", cluster.ns) as producer:
        msg = Message(TOPIC, b"later")
        msg.delay_level = 1
        assert producer.send(msg).status is SendStatus.SEND_OK

    def delay_synced() -> bool:
        body = asyncio.run(call(cluster.slave_addr, RequestCode.GET_ALL_DELAY_OFFSET)).body
        return orjson.loads(body)["offsetTable"].get("1") == 1

    assert wait_for(delay_synced, 15)
    # A slave is read-only: sends are refused, and a producer never routes to it.
    send_fields = {
        "producerGroup": "pg",
        "topic": "SyncedTopic",
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "0",
        "sysFlag": "0",
        "bornTimestamp": "0",
        "flag": "0",
        "reconsumeTimes": "0",
        "unitMode": "false",
    }
    resp = asyncio.run(call(cluster.slave_addr, RequestCode.SEND_MESSAGE, send_fields))
    assert resp.code in (ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.NO_PERMISSION)


@pytest.mark.parametrize("compression", ["zstd"])
def test_compressed_stream_between_processes(spawn: Any, tmp_path: Path, compression: str) -> None:
    cluster = HaCluster(spawn, tmp_path, "SYNC_MASTER", ha={"compression": compression})
    cluster.start_slave()
    assert runtime_info(cluster.slave_addr)["haCompression"] == compression
    with BlockingProducer("ha-pg6", cluster.ns) as producer:
        for _ in range(50):
            assert producer.send(Message(TOPIC, b"z" * 2000)).status is SendStatus.SEND_OK
    end = runtime_info(cluster.master_addr)["commitLogMaxOffset"]
    assert runtime_info(cluster.slave_addr)["commitLogMaxOffset"] == end


def test_slave_read_enable_sends_a_group_to_the_slave(spawn: Any, tmp_path: Path) -> None:
    """slaveReadEnable: the master answers suggestWhichBrokerId = the group's brokerId (here 1)
    and tidemq's push consumer pulls from that slave next (RocketMQ's pullFromWhichNodeTable)."""

    def group_reads_from_slave(master_dir: Path) -> None:
        (master_dir / "config").mkdir(parents=True)
        table = {"ha-read": {"groupName": "ha-read", "brokerId": 1, "whichBrokerWhenConsumeSlowly": 1}}
        (master_dir / "config" / "subscriptionGroup.json").write_bytes(
            orjson.dumps({"subscriptionGroupTable": table, "dataVersion": {"timestamp": 1, "counter": 1}})
        )

    cluster = HaCluster(
        spawn,
        tmp_path,
        "SYNC_MASTER",
        broker={"slave_read_enable": True},
        before_start=group_reads_from_slave,
    )
    cluster.start_slave()
    sent = [b"sr-%04d" % i for i in range(120)]
    producer = BlockingProducer("ha-pg7", cluster.ns)
    producer.start()
    received: list[bytes] = []
    consumer = BlockingPushConsumer("ha-read", cluster.ns, consume_from="first", suspend_s=1.0)
    try:
        for body in sent[:60]:
            assert producer.send(Message(TOPIC, body)).status is SendStatus.SEND_OK
        # The slave serves a topic once its metadata sync copied the topic's config.
        assert wait_for(lambda: TOPIC in topics_of(cluster.slave_addr), 15)
        consumer.subscribe(TOPIC, "*")
        consumer.register_listener(
            lambda msgs: received.extend(m.body for m in msgs) or ConsumeStatus.SUCCESS
        )
        consumer.start()
        assert wait_for(lambda: set(sent[:60]) <= set(received), 30)
        for body in sent[60:]:
            assert producer.send(Message(TOPIC, body)).status is SendStatus.SEND_OK
        assert wait_for(lambda: set(sent) <= set(received), 30)
    finally:
        shutdown_or_dump(consumer)
        producer.shutdown()
    served_by_slave = int(runtime_info(cluster.slave_addr)["msgGetTotalTodayNow"])
    assert served_by_slave > 0
