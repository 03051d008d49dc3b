"""The replication contract (tidemq.testing.replication_contract) against the built-in replications
(master_slave with a real master and a real replica store on loopback), and against broken
stand-ins it must catch."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from tidemq.plugins import PluginManager
from tidemq.replication import ReplicaStatus, Replication
from tidemq.testing.replication_contract import ReplicationContract
from tidemq_ha_replication.master_slave import MasterSlaveOptions, MasterSlaveReplication

pytestmark = pytest.mark.timeout(60)

FAST = {"sync_timeout_s": 1.0, "heartbeat_s": 0.5, "lag_log_s": 60.0}


class TestMasterSlaveContract(ReplicationContract):
    replicates = True
    settle_s = 5.0

    @pytest.fixture
    def make_replication(self, tidemq_plugins: PluginManager) -> Callable[[], Replication]:
        return lambda: tidemq_plugins.create("replication", "master_slave", options=FAST)


class TestNoReplicationContract(ReplicationContract):
    replicates = False

    @pytest.fixture
    def make_replication(self, tidemq_plugins: PluginManager) -> Callable[[], Replication]:
        return lambda: tidemq_plugins.create("replication", "none")


# ---------------------------------------------------------------------- the suite catches broken replications
class EagerAck(MasterSlaveReplication):
    """Answers PUT_OK without waiting for any replica."""

    def wait_for_replicas(self, end_offset: int) -> Future[ReplicaStatus]:
        super().wait_for_replicas(end_offset)
        fut: Future[ReplicaStatus] = Future()
        fut.set_result(ReplicaStatus.PUT_OK)
        return fut


class NumericInfo(MasterSlaveReplication):
    """Reports numbers where GET_BROKER_RUNTIME_INFO carries strings."""

    def runtime_info(self) -> dict[str, str]:
        info: dict[str, Any] = dict(super().runtime_info())
        info["haConnectedSlaves"] = 0
        return info


class ForgetsWaiters(MasterSlaveReplication):
    """Hands out its own futures and forgets them at shutdown."""

    def __init__(self, options: MasterSlaveOptions):
        super().__init__(options)
        self.stopping = False

    def wait_for_replicas(self, end_offset: int) -> Future[ReplicaStatus]:
        mine: Future[ReplicaStatus] = Future()

        def relay(inner: Future[ReplicaStatus]) -> None:
            if not self.stopping:
                mine.set_result(inner.result())

        super().wait_for_replicas(end_offset).add_done_callback(relay)
        return mine

    def shutdown(self) -> None:
        self.stopping = True
        super().shutdown()


def stand_in(cls: type[MasterSlaveReplication]) -> Callable[[], Replication]:
    return lambda: cls(MasterSlaveOptions(**FAST))  # type: ignore[arg-type]


def test_contract_catches_put_ok_without_a_replica(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="PUT_OK although no replica"):
        TestMasterSlaveContract().test_sync_master_without_a_replica_never_says_put_ok(
            stand_in(EagerAck), tmp_path
        )


def test_contract_catches_runtime_info_that_is_not_strings(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="must be strings"):
        TestMasterSlaveContract().test_ha_address_and_runtime_info_shape(stand_in(NumericInfo), tmp_path)


def test_contract_catches_waits_left_pending_by_shutdown(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="unresolved"):
        TestMasterSlaveContract().test_shutdown_resolves_pending_waits(stand_in(ForgetsWaiters), tmp_path)
