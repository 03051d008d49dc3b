"""The duplicate window after a promotion (issue 37): rebuilt in a thread, the broker answering
meanwhile, sends waiting for it so that a resend right after the promotion is still one.

The epoch is the controller's (``RoleAware.current_epoch``); here the test turns it, as a
promotion does, on an in-process broker whose commit log holds a long tail.  The controller
failover with real processes is tests/test_dedup_crash.py's.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from test_dedup import UNIQ, answer, broker_on, key, runtime, send, send_batch, stored

from tidemq.broker.dedup import REBUILD_WAIT_S
from tidemq.remoting.codes import ResponseCode

pytestmark = pytest.mark.timeout(180)


def hold_rebuild(window: Any) -> asyncio.Event:
    """Start a new epoch on ``window`` (so it is rebuilt before it judges sends) with a rebuild that
    runs until the returned event is set; call from the broker's loop."""
    fill = window.fill
    assert fill is not None
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow_fill(target: object) -> None:
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(60)
        fill(target)

    window.fill = slow_fill
    epoch = [1]
    window.epoch_source = lambda: epoch[0]
    window.built_for_epoch()
    epoch[0] = 2  # a new epoch: the window is rebuilt before it judges sends
    return release


def test_a_promotion_rebuilds_the_window_in_a_thread_while_the_broker_answers(tmp_path: Path) -> None:
    async def main() -> None:
        async with broker_on(tmp_path / "b") as (broker, client):
            k = key()
            first = await send(client, broker, "Promoted", b"once", {UNIQ: k}, queue_id=1)
            assert first.code == ResponseCode.SUCCESS, first.remark
            # A tail long enough that reading it back takes a while (~5 us a record).
            for _ in range(200):
                batch = await send_batch(client, broker, "Bulk", [(b"x", {UNIQ: key()}) for _ in range(512)])
                assert batch.code == ResponseCode.SUCCESS, batch.remark
            window = broker.dedup
            epoch = [1]
            window.epoch_source = lambda: epoch[0]
            window.built_for_epoch()
            epoch[0] = 2  # the controller's new epoch: this broker was promoted
            answered = 0  # other requests answered before the resend's answer
            slowest = 0.0
            # The pure-Python rebuild (TIDEMQ_NO_EXTENSIONS=1, a loaded machine) may outlast
            # REBUILD_WAIT_S: the send is then refused SERVICE_NOT_AVAILABLE after waiting that
            # long, and sent again, as a producer does, until the rebuild is done.
            deadline = time.monotonic() + 60
            while True:
                sent_at = time.monotonic()
                resend = asyncio.ensure_future(
                    send(client, broker, "Promoted", b"once", {UNIQ: k}, queue_id=0)
                )
                while not resend.done():
                    started = time.perf_counter()
                    info = await runtime(client, broker)
                    slowest = max(slowest, time.perf_counter() - started)
                    if not resend.done():
                        answered += 1
                again = await resend
                if again.code != ResponseCode.SERVICE_NOT_AVAILABLE:
                    break
                # Refused only after waiting for the rebuild the whole bound, while it still ran.
                assert time.monotonic() - sent_at >= REBUILD_WAIT_S * 0.9, again.remark
                assert "rebuilt" in (again.remark or "") and time.monotonic() < deadline, again.remark
            # Answered as the first send (it waited for the rebuild), stored once.
            assert answer(again)[1:] == answer(first)[1:] and again.code == ResponseCode.SUCCESS, again.remark
            assert stored(broker, "Promoted") == 1
            info = await runtime(client, broker)
            assert int(info["dedupRebuildRecords"]) >= 100_000 and info["dedupDropped"] == "1", info
            rebuild_s = float(info["dedupRebuildSeconds"])
            # The loop served other requests while the rebuild ran (before: none, it was blocked).
            assert answered >= 3, (answered, rebuild_s, slowest)
            assert slowest < rebuild_s, (slowest, rebuild_s)
            assert not window.rebuilding and window.entries >= 100_000
            # A fresh send after it is stored as usual.
            fresh = await send(client, broker, "Promoted", b"next", {UNIQ: key()})
            assert fresh.code == ResponseCode.SUCCESS and stored(broker, "Promoted") == 2

    asyncio.run(main())


def test_a_send_that_outwaits_the_rebuild_is_answered_service_not_available(tmp_path: Path) -> None:
    """A rebuild slower than REBUILD_WAIT_S: the send is refused with a code producers retry."""

    async def main() -> None:
        async with broker_on(tmp_path / "b") as (broker, client):
            window = broker.dedup
            release = hold_rebuild(window)
            started = time.monotonic()
            refused = await send(client, broker, "Waiting", b"x", {UNIQ: key()})
            assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE, refused.remark
            assert "rebuilt" in (refused.remark or "")
            assert time.monotonic() - started >= REBUILD_WAIT_S * 0.9
            assert stored(broker, "Waiting") == 0
            release.set()
            assert await window.wait_rebuilt(30)
            ok = await send(client, broker, "Waiting", b"x", {UNIQ: key()})
            assert ok.code == ResponseCode.SUCCESS and stored(broker, "Waiting") == 1

    asyncio.run(main())
