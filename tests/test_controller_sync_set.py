"""The in-sync set of a SYNC group (issue 25): whom an acknowledgement waits for, and when it changes.

Three ``controller`` replications in one process, each with its own real store and HA port on
loopback, elected through a real etcd (no broker, no NameServer): fast enough for the default
suite.  Process-level failovers and network partitions are in test_controller_failover.py and
test_controller_partition.py.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port

pytest.importorskip("httpx", reason="httpx is not installed (the controller extra)")

from controller_support import EtcdServer, etcd_fixture  # noqa: E402,F401  (the etcd fixture)
from test_controller_election import BlackHoleProxy  # noqa: E402

from tidemq.replication import ReplicaStatus  # noqa: E402
from tidemq.testing.store_contract import build_store, message  # noqa: E402
from tidemq_controller.election import SyncSet  # noqa: E402
from tidemq_controller.etcd import EtcdClient  # noqa: E402
from tidemq_controller.options import ControllerOptions  # noqa: E402
from tidemq_controller.replication import ControllerReplication  # noqa: E402
from tidemq_ha_replication.ha_slave import HAClient  # noqa: E402
from tidemq_ha_replication.wire import HELLO_MAGIC, encode_hello, read_hello_body, recv_exact  # noqa: E402
from tidemq_metrics_prometheus.broker_metrics import controller_families  # noqa: E402

STORE = {"commitlog_file_size": 256 * 1024, "consumequeue_entries": 256}


class Group:
    """Three replicas of one SYNC group (ids 1..3) on one event loop."""

    def __init__(self, tmp: Path, etcd_url: str, name: str, urls: dict[int, str] | None = None) -> None:
        self.name = name
        self.replicas: dict[int, ControllerReplication] = {}
        self.stores: dict[int, Any] = {}
        for i in (1, 2, 3):
            store = build_store("mmap", tmp / f"r{i}", store_options=STORE)
            assert store.load()
            store.start()
            self.stores[i] = store
            opts = ControllerOptions(
                etcd=[(urls or {}).get(i, etcd_url)],
                ttl_s=2,
                keepalive_s=0.4,
                fence_margin_s=0.6,
                request_timeout_s=0.3,
                listen=f"127.0.0.1:{free_port()}",
                heartbeat_s=0.2,
                housekeeping_s=2.0,
                sync_timeout_s=2.5,
                sync_set_timeout_s=1.0,
                report_s=0.5,
            )
            self.replicas[i] = ControllerReplication(opts)
        self.config = {i: self._broker_config(tmp, i) for i in (1, 2, 3)}

    def _broker_config(self, tmp: Path, i: int) -> dict[str, Any]:
        return {
            "role": "SYNC_MASTER",
            "id": i,
            "store_path": tmp / f"r{i}",
            "listen": f"127.0.0.1:{free_port()}",
            "cluster": "sync-set-test",
            "name": self.name,
        }

    def start(self, ids: tuple[int, ...] = (1, 2, 3)) -> None:
        for i in ids:
            self.replicas[i].start(self.stores[i], self.config[i])

    def master(self) -> ControllerReplication | None:
        found = [
            r for r in self.replicas.values() if r.current_role() == "SYNC_MASTER" and r.in_sync is not None
        ]
        return found[0] if len(found) == 1 else None

    def close(self) -> None:
        for rep in self.replicas.values():
            rep.shutdown()
        for store in self.stores.values():
            store.shutdown()


async def until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def send(master: ControllerReplication) -> tuple[ReplicaStatus, float]:
    """Store one message on the master and wait for the replication's answer, timed."""
    result = await asyncio.to_thread(lambda: master.store.put_message(message(body=b"x" * 300)).result(10))
    began = time.monotonic()
    status = await asyncio.wrap_future(master.wait_for_replicas(result.wrote_offset + result.wrote_bytes))
    return status, time.monotonic() - began


def test_a_sync_master_waits_for_its_whole_set_and_changes_it_only_through_etcd(
    tmp_path: Path,
    etcd: EtcdServer,  # noqa: F811
) -> None:
    name = f"g{time.monotonic_ns()}"
    group = Group(tmp_path, etcd.url, name)

    async def syncset() -> SyncSet | None:
        client = EtcdClient([etcd.url], 1.0)
        try:
            kvs, _ = await client.get(f"/tidemq/sync-set-test/{name}/syncset".encode())
        finally:
            await client.close()
        return SyncSet.from_kv(kvs[0] if kvs else None)

    async def main() -> None:
        group.start()
        await until(lambda: group.master() is not None)
        master = group.master()
        assert master is not None and master.in_sync is not None
        slaves = [r for r in group.replicas.values() if r is not master]
        tracker = master.in_sync
        # Both slaves follow, catch up, and join the set (locally and in etcd).
        await until(lambda: len(tracker.written) == 3)
        assert (await syncset()).brokers == (1, 2, 3)  # type: ignore[union-attr]
        status, _ = await send(master)
        assert status is ReplicaStatus.PUT_OK

        # One slave stops following: it leaves the set as its HA connection closes (RocketMQ 5's
        # removeConnection; before, after sync_set_timeout_s); sends wait until its removal
        # reached etcd, then go on.
        gone, kept = slaves
        assert gone.client is not None
        await asyncio.to_thread(gone.client.shutdown)
        status, waited = await send(master)
        assert status is ReplicaStatus.PUT_OK, waited
        assert gone.broker_id not in tracker.written
        assert (await syncset()).brokers == tuple(sorted((master.broker_id, kept.broker_id)))  # type: ignore[union-attr]

        # The last slave stops too: the set cannot shrink below two, nothing is acknowledged.
        assert kept.client is not None
        await asyncio.to_thread(kept.client.shutdown)
        status, _ = await send(master)
        assert status is ReplicaStatus.FLUSH_SLAVE_TIMEOUT
        status, waited = await send(master)
        assert status is ReplicaStatus.SLAVE_NOT_AVAILABLE and waited < 0.1
        assert len(tracker.written) == 2 and kept.broker_id in tracker.written

        # The first one comes back (same epoch) and catches up: it is added again.
        gone.client = HAClient(
            gone.store,
            gone.options,
            master.ha_address(),
            broker_id=gone.broker_id,
            epoch=master.current_epoch(),
        )
        gone.client.start()
        await until(lambda: gone.broker_id in tracker.written)
        assert gone.broker_id in (await syncset()).brokers  # type: ignore[union-attr]

        # The metrics plugin exports the set, the epoch and the role from the same runtime info.
        await until(lambda: "controllerLag" in master.runtime_info())
        samples = {
            (m.name, tuple(s.labels.items())): s.value
            for m in controller_families(master.runtime_info())
            for s in m.samples
        }
        assert samples[("tidemq_controller_epoch", ())] == master.current_epoch()
        assert samples[("tidemq_controller_master", ())] == 1
        assert samples[("tidemq_controller_in_sync_replicas", ())] == len(tracker.written)
        assert samples[("tidemq_controller_etcd_reachable", ())] == 1
        assert ("tidemq_controller_replica_lag_bytes", (("broker_id", str(kept.broker_id)),)) in samples

        # A claim of a newer epoch on the (unauthenticated) HA port is checked in etcd: no effect.
        host, port = master.ha_address().rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=3) as sock:
            sock.sendall(encode_hello({"compression": [], "digest": [], "brokerId": 9, "epoch": 10**6}))
            assert recv_exact(sock, len(HELLO_MAGIC)) == HELLO_MAGIC
            assert "error" in read_hello_body(sock)
        await asyncio.sleep(1.0)
        assert master.current_role() == "SYNC_MASTER" and group.master() is master

    try:
        asyncio.run(main())
    finally:
        group.close()


def test_a_master_without_etcd_steps_down_once_its_set_is_gone_before_another_is_elected(
    tmp_path: Path,
    etcd: EtcdServer,  # noqa: F811
) -> None:
    """Cut off from etcd *and* its slaves, a master serving on under its in-sync set could
    acknowledge nothing and would stay registered as master: it steps down instead."""
    name = f"g{time.monotonic_ns()}"

    async def main() -> None:
        proxy = BlackHoleProxy(etcd.client_port)
        await proxy.start()
        group = Group(tmp_path, etcd.url, name, urls={1: proxy.url})
        try:
            group.start((1,))  # alone: replica 1 (behind the proxy) wins the first election
            await until(lambda: group.master() is group.replicas[1])
            group.start((2, 3))
            master = group.replicas[1]
            await until(lambda: master.in_sync is not None and len(master.in_sync.written) == 3)
            # Its slaves stop following it (as if partitioned), and etcd goes out of its reach.
            for i in (2, 3):
                client = group.replicas[i].client
                assert client is not None
                await asyncio.to_thread(client.shutdown)
            proxy.cut = True
            await until(lambda: master.current_role() == "SLAVE", timeout=8)
            stepped_down = time.monotonic()
            assert all(r.current_role() == "SLAVE" for r in group.replicas.values())
            # The others elect one of them once its lease is gone: never two masters at once.
            await until(lambda: group.master() is not None, timeout=15)
            elected = group.master()
            assert elected is not None and elected is not master and time.monotonic() > stepped_down
            proxy.heal()
            # Back in touch with etcd: deposed for certain, it follows the new master.
            await until(lambda: master._following is not None and master._following[1] == elected.broker_id)
            assert master.current_epoch() == elected.current_epoch() >= 2
        finally:
            group.close()
            await proxy.close()

    asyncio.run(main())
