"""Supervised background tasks (issue 20, item 5): a loop that fails is logged and runs again."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tidemq.config import NamesrvSettings
from tidemq_transport_tcp import TcpTransport, run

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fast_restart(monkeypatch):
    import tidemq.tasks

    monkeypatch.setattr(tidemq.tasks, "RESTART_MIN_S", 0.01)
    monkeypatch.setattr(tidemq.tasks, "RESTART_MAX_S", 0.05)


def test_a_failing_task_is_logged_and_runs_again(fast_restart, caplog):
    from tidemq.tasks import supervise

    runs: list[int] = []

    async def body() -> None:
        runs.append(1)
        if len(runs) <= 2:
            raise RuntimeError(f"boom {len(runs)}")
        await asyncio.sleep(3600)

    async def main() -> None:
        task = supervise(body, "tidemq-test-loop")
        for _ in range(200):
            await asyncio.sleep(0.01)
            if len(runs) >= 3:
                break
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.ERROR, logger="tidemq.tasks"):
        run(main())
    assert len(runs) == 3
    failures = [r for r in caplog.records if "tidemq-test-loop" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info and r.exc_info[0] is RuntimeError for r in failures)


def test_a_task_that_returns_is_restarted(fast_restart, caplog):
    from tidemq.tasks import supervise

    runs: list[int] = []

    async def body() -> None:
        runs.append(1)

    async def main() -> None:
        task = supervise(body, "tidemq-test-return")
        while len(runs) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level(logging.ERROR, logger="tidemq.tasks"):
        run(main())
    assert any(
        "tidemq-test-return" in r.getMessage() and "returned" in r.getMessage() for r in caplog.records
    )


def test_namesrv_expiry_survives_a_bad_interval_and_runs_again(monkeypatch, caplog):
    """A scan interval that slipped past validation must not end the expiry task silently."""
    import tidemq.tasks

    monkeypatch.setattr(tidemq.tasks, "RESTART_MIN_S", 0.05, raising=False)
    monkeypatch.setattr(tidemq.tasks, "RESTART_MAX_S", 0.1, raising=False)
    from tidemq.namesrv import NameServer

    async def main() -> None:
        ns = NameServer(NamesrvSettings(listen="127.0.0.1:0", scan_interval_s=0.05), TcpTransport())
        scans: list[int] = []
        real = ns.scan_not_active_brokers
        monkeypatch.setattr(ns, "scan_not_active_brokers", lambda: scans.append(1) or real())
        await ns.start()
        try:
            object.__setattr__(ns.settings, "scan_interval_s", float("nan"))  # bypass the validators
            await asyncio.sleep(0.5)
            assert ns._scan_task is not None and not ns._scan_task.done(), "the expiry task died"
            object.__setattr__(ns.settings, "scan_interval_s", 0.05)
            before = len(scans)
            await asyncio.sleep(0.5)
            assert len(scans) > before, "expiry does not run again"
        finally:
            await ns.stop()

    with caplog.at_level(logging.ERROR):
        run(main())
    assert any(r.exc_info for r in caplog.records), "the failure was not logged"


def test_wait_event_never_swallows_a_cancel_that_meets_the_event() -> None:
    # CPython 3.11's wait_for returned the event's result instead of raising here, so a demoted
    # broker's delay service outlived its cancel() and never stopped (issue 25's role test).
    from tidemq.tasks import wait_event

    async def main() -> None:
        for _ in range(50):
            event = asyncio.Event()
            task = asyncio.get_running_loop().create_task(wait_event(event, 10.0))
            await asyncio.sleep(0)  # waiting now
            event.set()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        quiet = asyncio.Event()
        assert await wait_event(quiet, 0.01) is False
        quiet.set()
        assert await wait_event(quiet, 0.01) is True

    asyncio.run(main())
