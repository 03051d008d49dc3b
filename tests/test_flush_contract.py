"""The flush policy contract (tidemq.testing.flush_contract) against the built-in policies, and
against broken stand-ins it must catch."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from tidemq.flush import FlushPolicy
from tidemq.plugins import PluginManager
from tidemq.store import MessageStore
from tidemq.testing.flush_contract import FileTarget, FlushPolicyContract
from tidemq.testing.store_contract import message
from tidemq_flush import GroupCommitFlush, PeriodicFlush, SyncFlushOptions

pytestmark = pytest.mark.timeout(60)


class TestSyncFlushContract(FlushPolicyContract):
    durable = True

    @pytest.fixture
    def make_flush_policy(self, tidemq_plugins: PluginManager) -> Callable[[int], FlushPolicy]:
        return lambda timeout_ms: tidemq_plugins.create("flush", "sync", options={"timeout_ms": timeout_ms})


class TestAsyncFlushContract(FlushPolicyContract):
    durable = False

    @pytest.fixture
    def make_flush_policy(self, tidemq_plugins: PluginManager) -> Callable[[int], FlushPolicy]:
        return lambda _timeout_ms: tidemq_plugins.create("flush", "async", options={"interval_ms": 20})


# ---------------------------------------------------------------------- the suite catches broken policies
class EarlyAck(GroupCommitFlush):
    """Claims to be durable but acknowledges before flushing."""

    def request(self, end_offset: int) -> Future[bool]:
        fut: Future[bool] = Future()
        fut.set_result(True)
        return fut

    def submit(self, end_offset: int, fut: Future[Any], value: Any, on_timeout: Callable[[], Any]) -> None:
        fut.set_result(value)


class ForgetfulShutdown(PeriodicFlush):
    """Stops its thread but drops the final flush."""

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


class NeverGivesUp(GroupCommitFlush):
    """Group commit without the reaper: a stuck disk keeps its writers waiting past the timeout."""

    def _reap(self) -> None:
        return None


def test_contract_catches_a_policy_that_acks_before_flushing(tmp_path: Path) -> None:
    suite = TestSyncFlushContract()
    make = lambda timeout_ms: EarlyAck(SyncFlushOptions(timeout_ms=timeout_ms))  # noqa: E731
    for n, check in enumerate(
        (suite.test_durable_ack_waits_for_the_flush, suite.test_concurrent_writers_are_each_acknowledged)
    ):
        target = FileTarget(tmp_path / f"t{n}")
        with pytest.raises(AssertionError, match="acknowledged"):
            check(make, target)
        target.close()


def test_contract_catches_a_shutdown_that_does_not_flush(tmp_path: Path) -> None:
    target = FileTarget(tmp_path / "t")
    with pytest.raises(AssertionError, match="flush everything"):
        TestAsyncFlushContract().test_shutdown_flushes_everything_and_stops_its_threads(
            lambda _ms: ForgetfulShutdown(), target
        )
    target.close()


def test_contract_catches_a_policy_that_never_times_out(tmp_path: Path) -> None:
    target = FileTarget(tmp_path / "t")
    with pytest.raises(AssertionError, match="not resolved within"):
        TestSyncFlushContract().test_stalled_disk_times_out(
            lambda ms: NeverGivesUp(SyncFlushOptions(timeout_ms=ms)), target
        )
    target.close()


# ---------------------------------------------------------------------- the pytest plugin's store factory
def test_make_store_gives_started_stores_in_their_own_directories(
    tidemq_make_store: Callable[..., MessageStore],
) -> None:
    small = {"commitlog_file_size": 64 * 1024}
    first = tidemq_make_store("mmap", flush="sync", options=small)
    second = tidemq_make_store("mmap", flush="sync", options=small)
    res = first.put_message(message(body=b"durable")).result(10)
    assert res.ok
    # The sync flush policy: acknowledged means flushed.
    assert first.commitlog.flushed_where >= res.wrote_offset + res.wrote_bytes  # type: ignore[attr-defined]
    assert second.get_max_phy_offset() == 0
    memory = tidemq_make_store("memory")
    assert memory.put_message(message()).result(10).ok
