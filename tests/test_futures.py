"""Awaiting store futures from the event loop: results, errors, cancellation, one wake-up per burst."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from tidemq.futures import resolved


def test_a_burst_of_results_from_another_thread_reaches_every_task_in_few_wake_ups() -> None:
    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        wakes = 0
        real = loop.call_soon_threadsafe

        def counting(*args, **kwargs):
            nonlocal wakes
            wakes += 1
            return real(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        futures: list[Future[int]] = [Future() for _ in range(32)]
        tasks = [asyncio.ensure_future(resolved(f)) for f in futures]
        await asyncio.sleep(0)  # every task is now waiting

        def flusher() -> None:  # the group-commit thread acknowledging one flush round
            for i, f in enumerate(futures):
                f.set_result(i)

        t = threading.Thread(target=flusher)
        t.start()
        # The loop is busy (blocked here) while the round is acknowledged, as a loaded broker's loop
        # is: the burst must then cost one wake-up. Not blocking made the count depend on how the
        # OS scheduled the two threads (25 wake-ups at load 8 on 2 cores).
        t.join()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return results, wakes

    results, wakes = asyncio.run(main())
    assert results == list(range(32))
    assert wakes == 1  # wrap_future would wake the loop 32 times


def test_errors_and_done_futures_and_cancelled_waiters() -> None:
    async def main() -> None:
        done: Future[str] = Future()
        done.set_result("at once")
        assert await resolved(done) == "at once"

        failing: Future[str] = Future()
        abandoned: Future[str] = Future()
        fine: Future[str] = Future()
        t_fail = asyncio.ensure_future(resolved(failing))
        t_abandoned = asyncio.ensure_future(resolved(abandoned))
        t_fine = asyncio.ensure_future(resolved(fine))
        await asyncio.sleep(0)
        t_abandoned.cancel()  # a client went away while its put was being flushed

        def resolve() -> None:
            failing.set_exception(OSError("disk gone"))
            abandoned.set_result("nobody listens")
            fine.set_result("ok")

        threading.Thread(target=resolve).start()
        with pytest.raises(OSError, match="disk gone"):
            await asyncio.wait_for(t_fail, 10)
        assert await asyncio.wait_for(t_fine, 10) == "ok"
        assert t_abandoned.cancelled()

    asyncio.run(main())


# --------------------------------------------------------------------------- StoreFuture


def test_store_future_blocks_until_another_thread_resolves_it() -> None:
    import threading
    from concurrent.futures import TimeoutError as FutureTimeout

    from tidemq.futures import StoreFuture

    fut: StoreFuture[int] = StoreFuture()
    with pytest.raises(FutureTimeout):
        fut.result(timeout=0.05)
    threading.Timer(0.05, fut.set_result, (7,)).start()
    assert fut.result(timeout=5) == 7
    assert fut.done() and not fut.cancelled() and fut.exception() is None


def test_store_future_callbacks_run_once_whether_added_before_or_after() -> None:
    from concurrent.futures import InvalidStateError

    from tidemq.futures import StoreFuture

    seen: list[str] = []
    fut: StoreFuture[str] = StoreFuture()
    fut.add_done_callback(lambda f: seen.append("before:" + f.result()))
    fut.set_result("x")
    fut.add_done_callback(lambda f: seen.append("after:" + f.result()))
    assert seen == ["before:x", "after:x"]
    with pytest.raises(InvalidStateError):
        fut.set_result("y")
    assert fut.result() == "x"


def test_store_future_carries_exceptions_and_cancellation() -> None:
    from concurrent.futures import CancelledError

    from tidemq.futures import StoreFuture

    failed: StoreFuture[int] = StoreFuture()
    failed.set_exception(OSError("disk"))
    assert isinstance(failed.exception(), OSError)
    with pytest.raises(OSError, match="disk"):
        failed.result()
    gone: StoreFuture[int] = StoreFuture()
    assert gone.cancel() and gone.cancelled()
    with pytest.raises(CancelledError):
        gone.result()
    assert not gone.cancel()


def test_store_future_is_awaitable_like_a_concurrent_future() -> None:
    import threading

    from tidemq.futures import StoreFuture, resolved

    async def main() -> list[int]:
        a: StoreFuture[int] = StoreFuture()
        threading.Timer(0.02, a.set_result, (1,)).start()
        b: StoreFuture[int] = StoreFuture()
        threading.Timer(0.02, b.set_result, (2,)).start()
        return [await resolved(a), await asyncio.wrap_future(b), await resolved(StoreFuture.completed(3))]

    assert asyncio.run(main()) == [1, 2, 3]


def test_every_thread_blocked_on_a_store_future_is_released_by_each_way_of_resolving_it() -> None:
    """Several threads in ``result()`` on one future all wake, whether it is resolved alone, in bulk
    by the group commit (``resolve_all``), failed or cancelled; a timed-out wait leaves the future
    usable."""
    from concurrent.futures import CancelledError
    from concurrent.futures import TimeoutError as FutureTimeout

    from tidemq.futures import StoreFuture, resolve_all

    def waiters(fut: StoreFuture[int], n: int) -> tuple[list[threading.Thread], list[object]]:
        got: list[object] = []

        def wait() -> None:
            try:
                got.append(fut.result(timeout=10))
            except BaseException as exc:  # noqa: BLE001 - the outcome is what is checked
                got.append(type(exc))

        threads = [threading.Thread(target=wait) for _ in range(n)]
        for t in threads:
            t.start()
        return threads, got

    for resolve, expected in (
        (lambda f: f.set_result(1), 1),
        (lambda f: resolve_all([f], [2]), 2),
        (lambda f: f.set_exception(OSError("disk")), OSError),
        (lambda f: f.cancel(), CancelledError),
    ):
        fut: StoreFuture[int] = StoreFuture()
        with pytest.raises(FutureTimeout):
            fut.result(timeout=0)  # not blocking
        with pytest.raises(FutureTimeout):
            fut.result(timeout=-1)
        threads, got = waiters(fut, 6)
        with pytest.raises(FutureTimeout):
            fut.result(timeout=0.02)  # a waiter that gave up does not stand in the others' way
        resolve(fut)
        for t in threads:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in threads)
        assert got == [expected] * 6
        late, got_late = waiters(fut, 2)  # after the fact: at once
        for t in late:
            t.join(timeout=10)
        assert got_late == [expected] * 2


def test_shared_completions_run_their_callbacks_on_the_loop_with_one_wake_up_per_burst() -> None:
    """A group-commit round completes several groups at once: their callbacks (the send lane
    answering the round's reads) run on the loop, in order, with one hop for the whole burst."""
    from tidemq.futures import SharedCompletion

    async def main() -> None:
        loop = asyncio.get_running_loop()
        wakes = 0
        real = loop.call_soon_threadsafe

        def counting(*args, **kwargs):
            nonlocal wakes
            wakes += 1
            return real(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        groups = [SharedCompletion(loop) for _ in range(4)]
        ran: list[tuple[int, bool]] = []
        everything = loop.create_future()

        def answer(i: int) -> None:
            ran.append((i, threading.current_thread() is threading.main_thread()))
            if len(ran) == 5:
                everything.set_result(None)

        for i, group in enumerate(groups):
            group.call_when_done(answer, i)
        groups[0].call_when_done(answer, 10)
        waiter = asyncio.ensure_future(groups[3].wait())  # a task waits on one of them too
        await asyncio.sleep(0)
        assert ran == []

        def flusher() -> None:
            for group in groups:
                group.complete()

        t = threading.Thread(target=flusher)
        t.start()
        t.join()
        await asyncio.wait_for(everything, 10)
        await asyncio.wait_for(waiter, 10)
        assert ran == [(0, True), (10, True), (1, True), (2, True), (3, True)]
        assert wakes == 1
        # A callback registered once the group is complete runs soon, on the loop, not at once.
        late = loop.create_future()
        groups[0].call_when_done(late.set_result, "late")
        assert not late.done()
        assert await asyncio.wait_for(late, 10) == "late"
        assert wakes == 1

    asyncio.run(main())
