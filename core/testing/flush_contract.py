"""The flush policy contract (role ``flush``) as a reusable pytest suite.

Subclass :class:`FlushPolicyContract`, say whether the policy is ``durable`` and provide a
``make_flush_policy`` fixture returning a factory ``(timeout_ms) -> FlushPolicy`` (a policy
without a timeout ignores the argument)::

    import pytest
    from tidemq.testing.flush_contract import FlushPolicyContract

    @pytest.fixture
    def make_flush_policy(tidemq_plugins):
        return lambda timeout_ms: tidemq_plugins.create("flush", "mine", options={"timeout_ms": timeout_ms})

    class TestMyPolicy(FlushPolicyContract):
        durable = True

The policy is driven against :class:`FileTarget`, a real file the suite appends to and fsyncs, whose
flushes it can stall to play a slow disk.  What the contract asks (see :mod:`tidemq.flush`):

* ``durable = True``: ``request(end)`` resolves ``True`` only once ``flushed_where >= end``, and
  ``False`` once its timeout passed while the disk is stuck (the store answers FLUSH_DISK_TIMEOUT);
* ``durable = False``: ``request(end)`` resolves ``True`` at once, before the bytes are flushed;
* ``submit`` (a :class:`~tidemq.flush.SubmittingFlushPolicy`) resolves the caller's future with
  ``value`` when ``request`` would say ``True`` and with ``on_timeout()`` when it would say ``False``;
* ``shutdown()`` flushes everything, stops the policy's threads and leaves no request unresolved;
  a request made after it resolves too (a put racing the store's shutdown must not hang).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from tidemq.flush import FlushPolicy, SubmittingFlushPolicy

PAGE = 4096
#: How long a stalled flush waits for release at most, so a failing test cannot hang the run.
STALL_LIMIT_S = 30.0

MakeFlushPolicy = Callable[[int], FlushPolicy]


class FileTarget:
    """A :class:`tidemq.flush.Flushable` over a real file: ``append`` writes, ``flush`` fsyncs.

    ``stall()`` makes flushes block until ``release()`` (a disk that stopped answering).
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        self._written = 0
        self._flushed = 0
        self._open = threading.Event()
        self._open.set()
        self.flush_calls = 0

    def append(self, data: bytes) -> int:
        """Write ``data``; returns the offset it ends at (what a writer asks durability for)."""
        with self._lock:
            os.write(self._fd, data)
            self._written += len(data)
            return self._written

    @property
    def written(self) -> int:
        return self._written

    @property
    def flushed_where(self) -> int:
        return self._flushed

    def commit(self, least_pages: int = 0) -> int:
        return self._written

    def flush(self, least_pages: int = 0) -> int:
        end = self._written
        if least_pages > 0 and end // PAGE - self._flushed // PAGE < least_pages:
            return self._flushed
        self._open.wait(STALL_LIMIT_S)
        os.fsync(self._fd)
        with self._lock:
            self.flush_calls += 1
            self._flushed = max(self._flushed, end)
            return self._flushed

    def stall(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def close(self) -> None:
        self.release()
        os.close(self._fd)


def settle(fut: Future[Any], timeout: float, what: str) -> Any:
    """``fut.result(timeout)``, failing the test with ``what`` when it does not resolve in time."""
    try:
        return fut.result(timeout)
    except TimeoutError:
        raise AssertionError(f"{what}: not resolved within {timeout}s") from None


def when_resolved(fut: Future[Any], probe: Callable[[], int]) -> list[int]:
    """``probe()`` at the moment ``fut`` resolves (filled in by a done callback)."""
    seen: list[int] = []
    fut.add_done_callback(lambda _f: seen.append(probe()))
    return seen


def flushed_when_resolved(fut: Future[Any], target: FileTarget) -> list[int]:
    """The target's flushed offset at the moment ``fut`` resolves."""
    return when_resolved(fut, lambda: target.flushed_where)


class FlushPolicyContract:
    """What every :class:`tidemq.flush.FlushPolicy` must do; needs a ``make_flush_policy`` fixture."""

    #: True: acknowledges only flushed bytes (RocketMQ's SYNC_FLUSH); False: acknowledges at once.
    durable = True
    #: The timeout the suite configures for most tests (ms); long enough never to fire by accident.
    timeout_ms = 5000

    @pytest.fixture
    def target(self, tmp_path: Path) -> Iterator[FileTarget]:
        t = FileTarget(tmp_path / "flush-target")
        yield t
        t.close()

    def started(self, make_flush_policy: MakeFlushPolicy, target: FileTarget, timeout_ms: int = 0) -> Any:
        policy = make_flush_policy(timeout_ms or self.timeout_ms)
        policy.start(target)
        return policy

    def stop(self, policy: FlushPolicy, target: FileTarget) -> None:
        target.release()
        policy.shutdown()

    # ------------------------------------------------------------------ lifecycle
    def test_fits_the_flush_role(self, make_flush_policy: MakeFlushPolicy) -> None:
        assert isinstance(make_flush_policy(self.timeout_ms), FlushPolicy)

    def test_shutdown_flushes_everything_and_stops_its_threads(
        self, make_flush_policy: MakeFlushPolicy, target: FileTarget
    ) -> None:
        before = set(threading.enumerate())
        policy = self.started(make_flush_policy, target)
        fut = policy.request(target.append(b"a" * 100))
        end = target.append(b"b" * 3 * PAGE)  # some bytes nobody waits for
        policy.shutdown()
        assert target.flushed_where == end, "shutdown() must flush everything written"
        assert settle(fut, 1, "a request made before shutdown()") in (True, False)
        deadline = time.monotonic() + 5
        while (left := [t for t in threading.enumerate() if t not in before and t.is_alive()]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.01)
        assert not left, f"threads still running after shutdown(): {left}"

    # ------------------------------------------------------------------ acknowledgement
    def test_durable_ack_waits_for_the_flush(
        self, make_flush_policy: MakeFlushPolicy, target: FileTarget
    ) -> None:
        if not self.durable:
            pytest.skip("the policy acknowledges before flushing")
        policy = self.started(make_flush_policy, target)
        try:
            target.stall()
            end = target.append(b"x" * 500)
            fut = policy.request(end)
            seen = flushed_when_resolved(fut, target)
            time.sleep(0.2)
            assert not fut.done(), "acknowledged while the disk had not flushed the bytes"
            target.release()
            assert settle(fut, 5, "a request once the disk flushed") is True
            assert seen and seen[0] >= end, f"resolved with flushed_where {seen} < {end}"
        finally:
            self.stop(policy, target)

    def test_ack_does_not_wait_for_the_flush(
        self, make_flush_policy: MakeFlushPolicy, target: FileTarget
    ) -> None:
        if self.durable:
            pytest.skip("the policy acknowledges only flushed bytes")
        policy = self.started(make_flush_policy, target)
        try:
            target.stall()
            end = target.append(b"x" * 500)
            assert settle(policy.request(end), 1, "a request while the disk is stuck") is True
            assert target.flushed_where < end
        finally:
            self.stop(policy, target)
        assert target.flushed_where == end, "shutdown() must flush what was acknowledged"

    def test_concurrent_writers_are_each_acknowledged(
        self, make_flush_policy: MakeFlushPolicy, target: FileTarget
    ) -> None:
        policy = self.started(make_flush_policy, target)
        results: list[tuple[int, Any, list[int]]] = []
        lock = threading.Lock()

        def writer(w: int) -> None:
            for i in range(20):
                end = target.append(b"%d-%d;" % (w, i))
                fut = policy.request(end)
                seen = flushed_when_resolved(fut, target)
                value = settle(fut, 10, f"writer {w} request {i}")
                with lock:
                    results.append((end, value, seen))

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
        finally:
            self.stop(policy, target)
        assert len(results) == 120 and all(value is True for _, value, _ in results)
        if self.durable:
            early = [(end, seen) for end, _, seen in results if not seen or seen[0] < end]
            assert not early, f"acknowledged before flushed (end, flushed): {early[:5]}"

    def test_stalled_disk_times_out(self, make_flush_policy: MakeFlushPolicy, target: FileTarget) -> None:
        if not self.durable:
            pytest.skip("the policy never waits, so it never times out")
        policy = self.started(make_flush_policy, target, timeout_ms=300)
        try:
            target.stall()
            begin = time.monotonic()
            fut = policy.request(target.append(b"slow"))
            assert settle(fut, 3, "a request on a stuck disk (timeout 300 ms)") is False
            assert time.monotonic() - begin >= 0.25, "timed out before the configured timeout"
            target.release()
            assert settle(policy.request(target.append(b"fast")), 5, "a request after the disk recovered")
        finally:
            self.stop(policy, target)

    # ------------------------------------------------------------------ submit (the store's fast path)
    def test_submit_resolves_the_callers_future_with_its_value(
        self, make_flush_policy: MakeFlushPolicy, target: FileTarget
    ) -> None:
        policy = self.started(make_flush_policy, target)
        try:
            if not isinstance(policy, SubmittingFlushPolicy):
                pytest.skip("the policy has no submit()")
            target.stall()
            end = target.append(b"s" * 200)
            fut: Future[str] = Future()
            policy.submit(end, fut, "durable", lambda: "late")
            seen = flushed_when_resolved(fut, target)
            if self.durable:
                time.sleep(0.2)
                assert not fut.done(), "submit() resolved before the bytes were flushed"
                target.release()
                assert settle(fut, 5, "submit() once flushed") == "durable"
                assert seen and seen[0] >= end
                again: Future[str] = Future()
                policy.submit(end, again, "durable", lambda: "late")  # already flushed
                assert settle(again, 1, "submit() of flushed bytes") == "durable"
            else:
                assert settle(fut, 1, "submit() while the disk is stuck") == "durable"
        finally:
            self.stop(policy, target)

    def test_submit_timeout_resolves_with_on_timeout(
        self, make_flush_policy: MakeFlushPolicy, target: FileTarget
    ) -> None:
        if not self.durable:
            pytest.skip("the policy never waits, so it never times out")
        policy = self.started(make_flush_policy, target, timeout_ms=300)
        try:
            if not isinstance(policy, SubmittingFlushPolicy):
                pytest.skip("the policy has no submit()")
            target.stall()
            fut: Future[str] = Future()
            policy.submit(target.append(b"slow"), fut, "durable", lambda: "late")
            assert settle(fut, 3, "submit() on a stuck disk (timeout 300 ms)") == "late"
        finally:
            self.stop(policy, target)

    # ------------------------------------------------------------------ shutdown with writers waiting
    def test_shutdown_settles_pending_requests(
        self, make_flush_policy: MakeFlushPolicy, target: FileTarget
    ) -> None:
        policy = self.started(make_flush_policy, target)
        target.stall()
        pending = [(end, policy.request(end)) for end in (target.append(b"p" * n) for n in (10, 20, 30))]
        stopper = threading.Thread(target=policy.shutdown)
        stopper.start()
        time.sleep(0.1)
        target.release()  # the disk comes back while shutdown() is under way
        stopper.join(self.timeout_ms / 1000 + 10)
        assert not stopper.is_alive(), "shutdown() did not return"
        for end, fut in pending:
            assert fut.done(), f"request for {end} left unresolved by shutdown()"
            if fut.result() is True:
                assert target.flushed_where >= end
        assert target.flushed_where == target.written
        late = policy.request(target.append(b"late"))
        assert settle(late, 2, "a request after shutdown()") in (True, False)
