"""The replication contract (role ``replication``) as a reusable pytest suite.

Subclass :class:`ReplicationContract` and provide a ``make_replication`` fixture returning a
factory ``() -> Replication`` configured for loopback (HA port 0) and a short sync timeout::

    import pytest
    from tidemq.testing.replication_contract import ReplicationContract

    @pytest.fixture
    def make_replication(tidemq_plugins):
        return lambda: tidemq_plugins.create("replication", "raft", options={"sync_timeout_s": 1.0})

    class TestRaftReplication(ReplicationContract):
        replicates = True

Each test starts real stores (``store_name``, default ``mmap``) in its own directory.  A replica is
started as a ``SLAVE`` and told its master's :meth:`~tidemq.replication.Replication.ha_address`
through :meth:`~tidemq.replication.MasterAware.update_master`, as a NameServer's answer does
(override :meth:`ReplicationContract.attach_replica` to wire it otherwise).  What it asks:

* ``wait_for_replicas`` returns a Future resolving to a :class:`~tidemq.replication.ReplicaStatus`;
  an ASYNC_MASTER answers PUT_OK without waiting for anyone;
* under SYNC_MASTER (``replicates = True``) PUT_OK means a replica holds the bytes; with no replica
  or a silent one the wait resolves within ``settle_s`` with another status, never hangs, and
  ``shutdown()`` resolves the waits still pending;
* ``ha_address()`` is ``""`` or ``host:port``; ``runtime_info()`` (a MasterAware) maps str to str;
* ``shutdown()`` may be called before ``start()`` and twice, and stops the plugin's threads.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tidemq.address import split_address
from tidemq.config import BrokerSettings
from tidemq.replication import MasterAware, ReplicaStatus, Replication
from tidemq.store import MessageStore
from tidemq.testing.flush_contract import settle, when_resolved
from tidemq.testing.store_contract import build_store, message, put

MakeReplication = Callable[[], Replication]


def settings(data_dir: Path, role: str, broker_id: int = 0) -> BrokerSettings:
    """A broker's ``[broker]`` table as a replication's ``start`` receives it, on loopback port 0."""
    return BrokerSettings(listen="127.0.0.1:0", namesrv=[], data_dir=str(data_dir), role=role, id=broker_id)


def put_end(store: MessageStore, body: bytes = b"replicate me") -> int:
    """Store one message; the commit-log offset it ends at (what the broker waits replicas for)."""
    res = put(store, message(body=body))
    assert res.ok, res
    return res.wrote_offset + res.wrote_bytes


def status_of(fut: Future[Any], timeout: float, what: str) -> ReplicaStatus:
    """The ReplicaStatus ``fut`` resolves to (a plain string must still be one of its values)."""
    assert isinstance(fut, Future), f"wait_for_replicas returned {type(fut).__name__}, not a Future"
    value = settle(fut, timeout, what)
    try:
        return ReplicaStatus(value)
    except ValueError:
        raise AssertionError(f"{what}: {value!r} is not a ReplicaStatus") from None


class Nodes:
    """The stores and replications one test started; all shut down at its end."""

    def __init__(self, contract: ReplicationContract, make_replication: MakeReplication, root: Path):
        self.contract = contract
        self.make_replication = make_replication
        self.root = root
        self.stores: list[MessageStore] = []
        self.replications: list[Replication] = []

    def store(self, name: str) -> MessageStore:
        store = build_store(
            self.contract.store_name,
            self.root / name,
            flush="async",
            store_options=self.contract.store_options,
        )
        assert store.load()
        store.start()
        self.stores.append(store)
        return store

    def master(self, role: str = "ASYNC_MASTER") -> tuple[Replication, MessageStore]:
        store = self.store("master")
        rep = self.make_replication()
        rep.start(store, settings(self.root / "master", role))
        self.replications.append(rep)
        return rep, store

    def replica(self, master: Replication) -> tuple[Replication, MessageStore]:
        store = self.store(f"replica{len(self.stores)}")
        rep = self.make_replication()
        self.contract.attach_replica(rep, store, master, settings(self.root / "replica", "SLAVE", 1))
        self.replications.append(rep)
        return rep, store

    def close(self) -> None:
        for rep in reversed(self.replications):
            rep.shutdown()
        for store in reversed(self.stores):
            store.shutdown()


class ReplicationContract:
    """What every :class:`tidemq.replication.Replication` must do; needs a ``make_replication`` fixture."""

    #: True when SYNC_MASTER waits for replicas; False for a plugin that never replicates (``none``).
    replicates = True
    #: How long a wait may take to resolve without a replica answering (sync timeout plus slack).
    settle_s = 5.0
    store_name = "mmap"
    store_options: ClassVar[dict[str, Any]] = {"commitlog_file_size": 256 * 1024, "consumequeue_entries": 64}

    def attach_replica(
        self, replication: Replication, store: MessageStore, master: Replication, broker: BrokerSettings
    ) -> None:
        """Start ``replication`` as a replica of ``master`` (see the module docstring)."""
        replication.start(store, broker)
        if isinstance(replication, MasterAware):
            replication.update_master(master.ha_address(), "")

    @contextlib.contextmanager
    def nodes(self, make_replication: MakeReplication, root: Path) -> Iterator[Nodes]:
        made = Nodes(self, make_replication, root)
        try:
            yield made
        finally:
            made.close()

    def need_replicas(self) -> None:
        if not self.replicates:
            pytest.skip("the plugin does not replicate")

    # ------------------------------------------------------------------ any replication
    def test_fits_the_replication_role(self, make_replication: MakeReplication) -> None:
        assert isinstance(make_replication(), Replication)

    def test_async_master_acknowledges_at_once(
        self, make_replication: MakeReplication, tmp_path: Path
    ) -> None:
        with self.nodes(make_replication, tmp_path) as nodes:
            master, store = nodes.master("ASYNC_MASTER")
            for _ in range(3):
                fut = master.wait_for_replicas(put_end(store))
                assert status_of(fut, 2, "ASYNC_MASTER wait") is ReplicaStatus.PUT_OK

    def test_ha_address_and_runtime_info_shape(
        self, make_replication: MakeReplication, tmp_path: Path
    ) -> None:
        with self.nodes(make_replication, tmp_path) as nodes:
            master, store = nodes.master("SYNC_MASTER" if self.replicates else "ASYNC_MASTER")
            address = master.ha_address()
            assert isinstance(address, str)
            if address or self.replicates:
                host, port = split_address(address)
                assert host and 0 < port < 65536, f"ha_address() is {address!r}"
            if isinstance(master, MasterAware):
                master.update_master("", "")  # a master told nothing: no effect, no error
                for _ in range(2):
                    info = master.runtime_info()
                    assert isinstance(info, dict)
                    bad = {k: v for k, v in info.items() if not (isinstance(k, str) and isinstance(v, str))}
                    assert not bad, f"runtime_info() entries must be strings: {bad}"
                    put_end(store)

    def test_shutdown_is_idempotent_and_stops_threads(
        self, make_replication: MakeReplication, tmp_path: Path
    ) -> None:
        make_replication().shutdown()  # never started: nothing to do, nothing raised
        with self.nodes(make_replication, tmp_path) as nodes:
            store = nodes.store("master")
            put_end(store)  # threads a store starts on its first put are not the replication's
            before = set(threading.enumerate())
            rep = make_replication()
            rep.start(
                store, settings(tmp_path / "master", "SYNC_MASTER" if self.replicates else "ASYNC_MASTER")
            )
            rep.wait_for_replicas(put_end(store))
            rep.shutdown()
            rep.shutdown()
            deadline = time.monotonic() + 5
            while (left := [t for t in threading.enumerate() if t not in before and t.is_alive()]) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.02)
            assert not left, f"threads still running after shutdown(): {left}"

    # ------------------------------------------------------------------ SYNC_MASTER with replicas
    def test_sync_master_without_a_replica_never_says_put_ok(
        self, make_replication: MakeReplication, tmp_path: Path
    ) -> None:
        self.need_replicas()
        with self.nodes(make_replication, tmp_path) as nodes:
            master, store = nodes.master("SYNC_MASTER")
            status = status_of(
                master.wait_for_replicas(put_end(store)), self.settle_s, "wait without replica"
            )
            assert status is not ReplicaStatus.PUT_OK, "PUT_OK although no replica holds the bytes"

    def test_sync_put_ok_means_a_replica_holds_the_bytes(
        self, make_replication: MakeReplication, tmp_path: Path
    ) -> None:
        self.need_replicas()
        with self.nodes(make_replication, tmp_path) as nodes:
            master, store = nodes.master("SYNC_MASTER")
            replica, replica_store = nodes.replica(master)
            deadline = time.monotonic() + 15
            while status_of(master.wait_for_replicas(put_end(store)), self.settle_s, "wait") != "PUT_OK":
                assert time.monotonic() < deadline, "the replica never acknowledged"
                time.sleep(0.05)
            checks: list[tuple[int, Future[Any], list[int]]] = []
            for i in range(20):
                end = put_end(store, b"sync-%d" % i)
                fut = master.wait_for_replicas(end)
                checks.append((end, fut, when_resolved(fut, replica_store.get_max_phy_offset)))
            for end, fut, held in checks:
                assert status_of(fut, self.settle_s, "wait with a replica") is ReplicaStatus.PUT_OK
                assert held and held[0] >= end, f"PUT_OK for {end} while the replica held {held}"
            if isinstance(replica, MasterAware):
                info = replica.runtime_info()
                assert all(isinstance(k, str) and isinstance(v, str) for k, v in info.items()), info
            replica.shutdown()  # the replica goes silent: waits end without PUT_OK
            status = status_of(master.wait_for_replicas(put_end(store)), self.settle_s, "wait, replica gone")
            assert status is not ReplicaStatus.PUT_OK

    def test_shutdown_resolves_pending_waits(self, make_replication: MakeReplication, tmp_path: Path) -> None:
        self.need_replicas()
        with self.nodes(make_replication, tmp_path) as nodes:
            master, store = nodes.master("SYNC_MASTER")
            nodes.replica(master)
            deadline = time.monotonic() + 15
            while status_of(master.wait_for_replicas(put_end(store)), self.settle_s, "wait") != "PUT_OK":
                assert time.monotonic() < deadline, "the replica never acknowledged"
                time.sleep(0.05)
            # Bytes no replica can have yet: the wait is pending when the master shuts down.
            fut = master.wait_for_replicas(store.get_max_phy_offset() + 4096)
            master.shutdown()
            assert fut.done(), "shutdown() left a wait for replicas unresolved"
            assert status_of(fut, 0, "pending wait") is not ReplicaStatus.PUT_OK
