"""Sync-flush rounds flushed on the event loop itself (``[flush.sync] inline_max_us``, issue 38).

When no round is in flight and the last flush was fast, a loop's round is flushed at its kick on
the loop (no flush-thread wake-up, no hop back into the loop), as Redis' ``appendfsync always``
fsyncs before it replies.  What a producer relies on does not change: a send is answered only
after the ``fdatasync`` that covers it, and a flush that fails answers FLUSH_DISK_TIMEOUT.  A real
mmap broker with sync flush on loopback sockets; its commit log's ``flush`` is gated.  The broker
runs on the test's loop, so the producer is a plain blocking socket on a thread of its own: the
loop is the one blocked in the gated flush.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_flush_round_answers import _send, sync_broker

from tidemq.address import split_address
from tidemq.remoting import FrameDecoder, RemotingCommand
from tidemq.remoting.codes import ResponseCode

pytestmark = pytest.mark.timeout(120)


async def _idle(policy: Any) -> None:
    """Until no round is in flight or waiting (the broker's own start-up writes), and the disk's
    flushes are trusted (a loaded test disk may have had a slow one): the next small round is inline."""
    from tidemq_flush.group_commit import INLINE_AFTER_FAST

    while policy._pending or policy._inflight:
        await asyncio.sleep(0.01)
    policy._fast_streak = INLINE_AFTER_FAST


def _answers(sock: socket.socket, count: int, timeout: float = 20) -> list[RemotingCommand]:
    sock.settimeout(timeout)
    decoder = FrameDecoder()
    answers: list[RemotingCommand] = []
    while len(answers) < count:
        data = sock.recv(1 << 16)
        assert data, "connection closed"
        answers += decoder.feed(data)
    return answers


class _Recorder:
    """Wraps the gated flush: which thread ran each flush."""

    def __init__(self, gated: Any, commitlog: Any) -> None:
        self.gated = gated
        self.threads: list[str] = []
        self.took: list[float] = []
        commitlog.flush = self

    def __call__(self, least_pages: int = 0) -> int:
        self.threads.append(threading.current_thread().name)
        started = time.monotonic()
        try:
            return self.gated(least_pages)
        finally:
            self.took.append(time.monotonic() - started)


def test_an_inline_round_answers_only_after_its_fdatasync_returns(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sync_broker(tmp_path, 20000, inline_max_us=1_000_000) as (broker, gated):
            recorder = _Recorder(gated, broker.store.commitlog)
            policy = broker.store.flush_policy
            inline_before = policy.inline_rounds
            loop_thread = threading.current_thread().name
            host, port = split_address(broker.address)
            seen: dict[str, Any] = {}
            await _idle(policy)

            def producer() -> None:
                with socket.create_connection((host, port)) as sock:
                    sock.sendall(b"".join(_send(i, i % 4) for i in range(4)))
                    assert gated.entered.wait(10)
                    sock.settimeout(0.3)
                    try:  # the loop is in the round's flush, held: nothing may be answered yet
                        seen["early"] = sock.recv(1 << 16)
                    except TimeoutError:
                        seen["early"] = b""
                    released = time.monotonic()
                    gated.gate.set()
                    seen["answers"] = _answers(sock, 4)
                    seen["released"] = released

            await asyncio.to_thread(producer)
            assert seen["early"] == b""
            answers = seen["answers"]
            assert sorted(a.opaque for a in answers) == list(range(4))
            assert {a.code for a in answers} == {ResponseCode.SUCCESS}
            # The round was flushed on the loop's thread (inline), once, and then answered.
            assert recorder.threads and recorder.threads[0] == loop_thread
            assert policy.inline_rounds > inline_before
            assert gated.returned and gated.returned[0] >= seen["released"]
            assert (
                broker.store.commitlog.flushed_where >= broker.store.commitlog.queue.get_max_wrote_position()
            )

    asyncio.run(scenario())


def test_a_failing_inline_fdatasync_answers_flush_disk_timeout(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sync_broker(tmp_path, 1000, inline_max_us=1_000_000) as (broker, gated):
            recorder = _Recorder(gated, broker.store.commitlog)
            await _idle(broker.store.flush_policy)
            gated.fail = True
            loop_thread = threading.current_thread().name
            host, port = split_address(broker.address)

            def producer() -> list[RemotingCommand]:
                with socket.create_connection((host, port)) as sock:
                    sock.sendall(b"".join(_send(i, i % 4) for i in range(4)))
                    return _answers(sock, 4)

            answers = await asyncio.to_thread(producer)
            assert sorted(a.opaque for a in answers) == list(range(4))
            assert {a.code for a in answers} == {ResponseCode.FLUSH_DISK_TIMEOUT}
            # Tried inline first, then handed to the flush thread, which retried until the deadline.
            assert recorder.threads[0] == loop_thread
            assert any(name != loop_thread for name in recorder.threads)
            gated.fail = False  # the broker stops with a working flush
            gated.gate.set()

    asyncio.run(scenario())


def test_a_slow_flush_hands_the_next_rounds_to_the_flush_thread(tmp_path: Path) -> None:
    """A flush above ``inline_max_us`` (a slow disk) moves the rounds off the loop, which keeps
    serving meanwhile; they come back once ``INLINE_AFTER_FAST`` flushes in a row were fast."""
    from tidemq_flush.group_commit import INLINE_AFTER_FAST

    async def scenario() -> None:
        async with sync_broker(tmp_path, 20000, inline_max_us=1_000_000) as (broker, gated):
            recorder = _Recorder(gated, broker.store.commitlog)
            loop_thread = threading.current_thread().name
            host, port = split_address(broker.address)

            def slow_then_fast() -> None:
                assert gated.entered.wait(10)
                time.sleep(1.5)  # the first (inline) flush takes 1.5 s: above the bound
                gated.gate.set()

            def producer(count: int, base: int) -> list[RemotingCommand]:
                with socket.create_connection((host, port)) as sock:
                    sock.sendall(b"".join(_send(base + i, i % 4) for i in range(count)))
                    return _answers(sock, count)

            def one_by_one(count: int) -> list[RemotingCommand]:
                answers: list[RemotingCommand] = []
                with socket.create_connection((host, port)) as sock:
                    for i in range(count):  # one send per round, each after the previous answer
                        sock.sendall(_send(1000 + i, i % 4))
                        answers += _answers(sock, 1)
                return answers

            await _idle(broker.store.flush_policy)
            threading.Thread(target=slow_then_fast, daemon=True).start()
            first = await asyncio.to_thread(producer, 4, 0)
            assert {a.code for a in first} == {ResponseCode.SUCCESS}
            rest = await asyncio.to_thread(one_by_one, INLINE_AFTER_FAST + 4)
            assert {a.code for a in rest} == {ResponseCode.SUCCESS}
            threads, took = recorder.threads, recorder.took
            assert threads[0] == loop_thread and took[0] >= 1.4  # the first round: inline, slow
            # After the slow flush: the flush thread's, until INLINE_AFTER_FAST fast ones in a row.
            assert all(name != loop_thread for name in threads[1 : 1 + INLINE_AFTER_FAST]), threads
            assert threads[-1] == loop_thread, (threads, took)

    asyncio.run(scenario())
