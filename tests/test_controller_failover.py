"""Automatic failover with real processes (issue 25): etcd, a NameServer and three controller brokers.

The brokers of one group run ``python -m tidemq broker`` with ``[plugins] replication =
"controller"`` and ``role = "SYNC_MASTER"``; etcd elects the master.  A producer sends
continuously; the master is SIGKILLed under load; a slave must be elected within the bound, be
brokerId 0 at the NameServer, keep every acknowledged message, and the killed broker must come
back as a slave and catch up.  Timing: lease TTL 2 s, renewal 0.4 s, fencing margin 0.6 s.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import free_port, runtime_info, wait_for

pytest.importorskip("httpx", reason="httpx is not installed (pip install tidemq[controller])")

from test_controller_election import BlackHoleProxy, EtcdServer  # noqa: E402

from tidemq.client import BlockingProducer, BlockingPullConsumer, Message, PullStatus, SendStatus  # noqa: E402
from tidemq.client.admin import AdminClient  # noqa: E402

TOPIC = "FailoverTopic"
NAME = "broker-fo"
#: The configured bound on the time from the master's death to the first acknowledged send on
#: the new master (the issue's default); with TTL 2 s the measured time is about 2.5-4 s.
NEW_MASTER_BOUND_S = 10.0


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    server.start()
    yield server
    server.stop()


class Replica:
    """One broker of the group: its config file, addresses and (when running) its process."""

    def __init__(self, cluster: ControllerCluster, broker_id: int, etcd_url: str = "") -> None:
        self.cluster = cluster
        self.broker_id = broker_id
        self.dir = cluster.tmp / f"replica-{broker_id}"
        self.addr = f"127.0.0.1:{free_port()}"
        self.ha = f"127.0.0.1:{free_port()}"
        self.server: Any = None
        opts = {
            "etcd": [etcd_url or cluster.etcd_url],
            "ttl_s": 2,
            "keepalive_s": 0.4,
            "fence_margin_s": 0.6,
            "request_timeout_s": 0.5,
            "report_s": 0.5,
            "listen": self.ha,
            "heartbeat_s": 1.0,
            "housekeeping_s": 5.0,
            "metadata_sync_s": 0.5,
            "group_sync_s": 1.0,
            "sync_timeout_s": 2.0,
        }
        lines = [
            "[broker]",
            f'cluster = "{cluster.name}"',
            f'name = "{NAME}"',
            f"id = {broker_id}",
            f'listen = "{self.addr}"',
            f'namesrv = ["{cluster.ns}"]',
            f'data_dir = "{self.dir}"',
            'role = "SYNC_MASTER"',
            "register_interval_s = 0.5",
            "consumer_offset_flush_s = 0.5",
            "",
            "[plugins]",
            'replication = "controller"',
            "",
            "[store.mmap]",
            "commitlog_file_size = 1048576",
            "",
            "[replication.controller]",
            *(f"{k} = {orjson.dumps(v).decode()}" for k, v in opts.items()),
        ]
        self.config = self.dir.with_suffix(".toml")
        self.config.write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        self.server = self.cluster.spawn("broker", "-c", str(self.config))

    def kill(self) -> None:
        self.server.stop(signal.SIGKILL)
        self.server = None

    def info(self) -> dict[str, str]:
        return runtime_info(self.addr)

    def role(self) -> str:
        try:
            return self.info().get("controllerRole", "")
        except Exception:
            return ""

    def log(self) -> str:
        return self.server.log_path.read_text()[-4000:] if self.server is not None else ""


class ControllerCluster:
    def __init__(
        self,
        spawn: Any,
        tmp: Path,
        etcd: EtcdServer,
        replicas: int = 3,
        etcd_urls: dict[int, str] | None = None,
    ) -> None:
        self.spawn, self.tmp, self.etcd_url = spawn, tmp, etcd.url
        self.name = f"fo{uuid.uuid4().hex[:8]}"  # etcd is shared by the module's tests
        self.namesrv = spawn("namesrv", "--listen", f"127.0.0.1:{free_port()}")
        self.ns = self.namesrv.addresses["namesrv"]
        self.replicas = [Replica(self, i, (etcd_urls or {}).get(i, "")) for i in range(1, replicas + 1)]
        threads = [threading.Thread(target=r.start) for r in self.replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def running(self) -> list[Replica]:
        return [r for r in self.replicas if r.server is not None]

    def master(self) -> Replica | None:
        masters = [r for r in self.running() if r.role() == "SYNC_MASTER"]
        return masters[0] if len(masters) == 1 else None

    def wait_master(self, timeout: float = 20.0) -> Replica:
        assert wait_for(lambda: self.master() is not None, timeout), "\n".join(
            r.log() for r in self.running()
        )
        master = self.master()
        assert master is not None
        return master

    def route_master(self) -> str:
        async def ask() -> str:
            client = AdminClient(self.ns)
            try:
                route = await client.route(TOPIC)
            finally:
                await client.close()
            (data,) = [b for b in route.broker_datas if b.broker_name == NAME]
            return data.broker_addrs.get(0, "")

        return asyncio.run(ask())


class LoadProducer:
    """Sends continuously from a thread; keeps what was acknowledged and by which broker port."""

    def __init__(self, ns: str) -> None:
        self.acked: dict[str, bytes] = {}  # UNIQ_KEY -> body
        self.ack_times: list[tuple[float, int]] = []  # (monotonic, store port)
        self.errors = 0
        self.statuses: dict[str, int] = {}
        self._stop = threading.Event()
        self.producer = BlockingProducer("fo-pg", ns, retry_times=0, send_timeout=3.0, route_refresh_s=0.5)
        self.producer.start()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            body = b"fo-%07d-" % i + uuid.uuid4().bytes
            i += 1
            try:
                r = self.producer.send(Message(TOPIC, body))
            except Exception:
                self.errors += 1
                time.sleep(0.02)
                continue
            self.statuses[r.status.value] = self.statuses.get(r.status.value, 0) + 1
            if r.status is SendStatus.SEND_OK:
                self.acked[r.msg_id] = body
                self.ack_times.append((time.monotonic(), int(r.offset_msg_id[8:16], 16)))

    def acked_by(self, port: int, after: float) -> float | None:
        """When the first send acknowledged by the broker on ``port`` after ``after`` came back."""
        return next((t for t, p in list(self.ack_times) if t > after and p == port), None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.producer.shutdown()


def read_all(ns: str) -> dict[str, list[bytes]]:
    """Every message of the topic through the route (the master), by UNIQ_KEY."""
    got: dict[str, list[bytes]] = {}
    consumer = BlockingPullConsumer(f"fo-check-{uuid.uuid4().hex[:6]}", ns)
    consumer.start()
    try:
        for mq in consumer.fetch_subscribe_queues(TOPIC):
            offset = 0
            while True:
                res = consumer.pull(mq, "*", offset, 64)
                if res.status is not PullStatus.FOUND:
                    break
                for m in res.messages:
                    got.setdefault(m.uniq_key or "", []).append(m.body)
                offset = res.next_begin_offset
    finally:
        consumer.shutdown()
    return got


def check_no_loss(load: LoadProducer, ns: str) -> None:
    got = read_all(ns)
    missing = [k for k in load.acked if k not in got]
    assert not missing, f"{len(missing)} of {len(load.acked)} acknowledged messages lost, e.g. {missing[:3]}"
    wrong = [k for k, body in load.acked.items() if any(b != body for b in got[k])]
    assert not wrong, f"{len(wrong)} acknowledged ids read back with another body, e.g. {wrong[:3]}"
    mixed = [k for k, bodies in got.items() if len(set(bodies)) > 1]
    assert not mixed, f"{len(mixed)} ids read twice with different bodies, e.g. {mixed[:3]}"


def fail_over(cluster: ControllerCluster, load: LoadProducer) -> tuple[Replica, Replica, float]:
    """SIGKILL the master under load; returns (old, new, seconds to the first ack on the new one)."""
    old = cluster.wait_master()
    before = len(load.acked)
    assert wait_for(lambda: len(load.acked) >= before + 50, 20), (load.statuses, load.errors)
    killed = time.monotonic()
    old.kill()
    new = cluster.wait_master(NEW_MASTER_BOUND_S + 5)
    assert new is not old
    port = int(new.addr.rsplit(":", 1)[1])
    assert wait_for(lambda: load.acked_by(port, killed) is not None, NEW_MASTER_BOUND_S + 5), (
        load.statuses,
        load.errors,
        new.log(),
    )
    first = load.acked_by(port, killed)
    assert first is not None
    return old, new, first - killed


def test_master_sigkilled_under_load_fails_over_without_losing_acknowledged_messages(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    cluster = ControllerCluster(spawn, tmp_path, etcd)
    master = cluster.wait_master()
    assert wait_for(lambda: master.info().get("haConnectedSlaves") == "2", 20), master.log()
    load = LoadProducer(cluster.ns)
    try:
        old, new, took = fail_over(cluster, load)
        print(f"new master acknowledging {took:.2f} s after the SIGKILL")
        assert took <= NEW_MASTER_BOUND_S
        info = new.info()
        assert int(info["controllerEpoch"]) >= 2
        # The NameServer routes to the new master as brokerId 0 (the producer's acks prove it too).
        assert wait_for(lambda: cluster.route_master() == new.addr, 10)
        # The killed broker comes back as a slave of the new master and catches up.
        old.start()
        assert wait_for(
            lambda: old.role() == "SLAVE" and old.info().get("haMasterConnected") == "true", 20
        ), old.log()
        after = len(load.acked)
        assert wait_for(lambda: len(load.acked) >= after + 50, 20), (load.statuses, load.errors)
    finally:
        load.stop()
    end = new.info()["commitLogMaxOffset"]
    assert wait_for(lambda: old.info()["commitLogMaxOffset"] == end, 20), (end, old.info())
    assert old.info()["controllerEpoch"] == new.info()["controllerEpoch"]
    check_no_loss(load, cluster.ns)
    # `tidemq admin controllerStatus` shows the group's master, epoch and sync set.
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", "controllerStatus", "--etcd", etcd.url, "-c", cluster.name],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    row = next(line.split() for line in out.stdout.splitlines() if line.startswith(NAME))
    assert row[1] == str(new.broker_id) and row[2] == info["controllerEpoch"], out.stdout


@pytest.mark.slow
def test_a_deposed_master_truncates_its_unacknowledged_tail(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    cluster = ControllerCluster(spawn, tmp_path, etcd)
    master = cluster.wait_master()
    assert wait_for(lambda: master.info().get("haConnectedSlaves") == "2", 20), master.log()
    with BlockingProducer("fo-acked", cluster.ns, retry_times=0) as producer:
        for i in range(20):
            assert producer.send(Message(TOPIC, b"acknowledged-%d" % i)).status is SendStatus.SEND_OK
    deposed_master_truncates_its_unacknowledged_tail(cluster)


def commit_log(replica: Replica, end: int) -> bytes:
    data = (replica.dir / "commitlog" / "00000000000000000000").read_bytes()
    assert len(data) >= end
    return data[:end]


def deposed_master_truncates_its_unacknowledged_tail(cluster: ControllerCluster) -> None:
    """A master writes with both slaves gone (never acknowledged), dies; back, it truncates to the new master."""
    master = cluster.wait_master()
    slaves = [r for r in cluster.running() if r is not master]
    for s in slaves:
        s.kill()
    before = int(master.info()["commitLogMaxOffset"])
    with BlockingProducer("fo-tail", cluster.ns, retry_times=0, send_timeout=3.0) as producer:
        for i in range(5):
            status = producer.send(Message(TOPIC, b"unacknowledged-%d" % i)).status
            assert status is not SendStatus.SEND_OK  # stored on the master alone: not acknowledged
    tail_end = int(master.info()["commitLogMaxOffset"])
    assert tail_end > before
    master.kill()
    threads = [threading.Thread(target=s.start) for s in slaves]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    new = cluster.wait_master()
    assert new in slaves
    master.start()
    assert wait_for(lambda: master.role() == "SLAVE" and master.info().get("haMasterConnected") == "true", 20)
    assert wait_for(lambda: f"truncated its commit log from {tail_end} to {before}" in master.log(), 10), (
        master.log()
    )
    end = int(new.info()["commitLogMaxOffset"])
    for r in cluster.replicas:
        assert wait_for(lambda r=r: int(r.info()["commitLogMaxOffset"]) == end, 20), (r.broker_id, r.info())
    # Every replica holds the same bytes: the unacknowledged tail is gone from the old master.
    assert commit_log(master, end) == commit_log(new, end)
    assert b"unacknowledged-" not in commit_log(master, end)


@pytest.mark.slow
def test_twenty_successive_failovers_lose_nothing_and_leave_every_replica_verifiable(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    cluster = ControllerCluster(spawn, tmp_path, etcd)
    master = cluster.wait_master()
    assert wait_for(lambda: master.info().get("haConnectedSlaves") == "2", 20), master.log()
    load = LoadProducer(cluster.ns)
    times = []
    try:
        for _ in range(20):
            old, new, took = fail_over(cluster, load)
            times.append(took)
            old.start()
            assert wait_for(
                lambda o=old: o.role() == "SLAVE" and o.info().get("haMasterConnected") == "true", 30
            ), old.log()
            assert wait_for(lambda n=new: n.info().get("haConnectedSlaves") == "2", 30), new.log()
    finally:
        load.stop()
    print(f"time to a new master acknowledging: min {min(times):.2f} s, max {max(times):.2f} s")
    assert max(times) <= NEW_MASTER_BOUND_S
    master = cluster.wait_master()
    end = master.info()["commitLogMaxOffset"]
    for r in cluster.replicas:
        assert wait_for(lambda r=r: r.info()["commitLogMaxOffset"] == end, 20), (r.broker_id, r.info())
    check_no_loss(load, cluster.ns)
    for r in cluster.replicas:
        r.server.stop()
        r.server = None
        out = subprocess.run(
            [sys.executable, "-m", "tidemq", "store", "verify", str(r.dir)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, (r.broker_id, out.stdout[-3000:], out.stderr[-3000:])


@pytest.mark.slow
def test_without_etcd_the_master_stops_acknowledging_nobody_is_elected_and_it_resumes_on_its_epoch(
    spawn: Any, tmp_path: Path
) -> None:
    own = EtcdServer(tmp_path / "etcd-own")
    own.directory.mkdir()
    own.start()
    try:
        cluster = ControllerCluster(spawn, tmp_path, own, replicas=2)
        master = cluster.wait_master()
        slave = next(r for r in cluster.replicas if r is not master)
        epoch = master.info()["controllerEpoch"]
        assert wait_for(lambda: master.info().get("haConnectedSlaves") == "1", 20), master.log()
        load = LoadProducer(cluster.ns)
        try:
            assert wait_for(lambda: len(load.acked) >= 50, 20), (load.statuses, load.errors)
            own.stop()
            stopped = time.monotonic()
            # keep_serving_without_etcd = "never": fenced before its lease could end (ttl 2 - margin 0.6).
            assert wait_for(lambda: master.role() == "SLAVE", 5), master.log()
            fenced = time.monotonic() - stopped
            count = len(load.acked)
            time.sleep(1.0)
            # Nobody acknowledges and nobody is elected without etcd; the slave keeps its role.
            assert len(load.acked) <= count + 1
            assert slave.role() == "SLAVE" and master.role() == "SLAVE"
            own.start()
            assert wait_for(lambda: master.role() == "SYNC_MASTER", 15), master.log()
            assert master.info()["controllerEpoch"] == epoch  # the same epoch: nobody else was elected
            count = len(load.acked)
            assert wait_for(lambda: len(load.acked) >= count + 50, 20), (load.statuses, load.errors)
        finally:
            load.stop()
        print(f"fenced {fenced:.2f} s after etcd stopped")
        assert fenced < 2.0  # before etcd could have expired the lease
        check_no_loss(load, cluster.ns)
    finally:
        own.stop()


class Proxies:
    """Black-hole TCP proxies to etcd (one per replica), run on an event loop thread of their own."""

    def __init__(self, etcd_port: int, ids: list[int]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.by_id: dict[int, BlackHoleProxy] = {}
        for i in ids:
            proxy = BlackHoleProxy(etcd_port)
            asyncio.run_coroutine_threadsafe(proxy.start(), self.loop).result(5)
            self.by_id[i] = proxy

    def cut(self, broker_id: int) -> None:
        proxy = self.by_id[broker_id]
        self.loop.call_soon_threadsafe(setattr, proxy, "cut", True)

    def heal(self, broker_id: int) -> None:
        self.loop.call_soon_threadsafe(self.by_id[broker_id].heal)

    def close(self) -> None:
        for proxy in self.by_id.values():
            asyncio.run_coroutine_threadsafe(proxy.close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def log_time(replica: Replica, needle: str) -> float:
    """The wall-clock time of the first log line of ``replica`` containing ``needle``."""
    import datetime

    for line in replica.server.log_path.read_text().splitlines():
        if needle in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    raise AssertionError(f"{needle!r} not in the log of broker {replica.broker_id}")


@pytest.mark.slow
def test_a_master_cut_off_from_etcd_stops_before_another_is_elected_and_rejoins_as_slave(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    proxies = Proxies(etcd.client_port, [1, 2, 3])
    try:
        urls = {i: p.url for i, p in proxies.by_id.items()}
        cluster = ControllerCluster(spawn, tmp_path, etcd, etcd_urls=urls)
        master = cluster.wait_master()
        assert wait_for(lambda: master.info().get("haConnectedSlaves") == "2", 20), master.log()
        load = LoadProducer(cluster.ns)
        try:
            assert wait_for(lambda: len(load.acked) >= 50, 20), (load.statuses, load.errors)
            proxies.cut(master.broker_id)
            assert wait_for(lambda: cluster.master() not in (None, master), 15), master.log()
            new = cluster.wait_master()
            port = int(new.addr.rsplit(":", 1)[1])
            count = len(load.acked)
            assert wait_for(lambda: len(load.acked) >= count + 50, 20), (load.statuses, load.errors)
            # No split brain: the cut-off master stopped acknowledging before the other was elected.
            fenced = log_time(master, "stops acknowledging as master")
            elected = log_time(new, f"broker {new.broker_id} elected master of epoch")
            assert fenced < elected, (fenced, elected)
            assert load.acked_by(port, 0) is not None
            proxies.heal(master.broker_id)
            # Healed: the old master re-registers, follows the new one (truncating if it must).
            assert wait_for(
                lambda: master.role() == "SLAVE" and master.info().get("haMasterConnected") == "true", 20
            ), master.log()
            assert master.info()["controllerEpoch"] == new.info()["controllerEpoch"]
        finally:
            load.stop()
        end = new.info()["commitLogMaxOffset"]
        assert wait_for(lambda: master.info()["commitLogMaxOffset"] == end, 20), (end, master.info())
        check_no_loss(load, cluster.ns)
    finally:
        proxies.close()
