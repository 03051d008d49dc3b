"""Sync-flush sends answered with their group-commit round (issue 38).

A read's sends that wait for one flush round are *held* by the broker's send lane and answered
in one pass when the round's ``fdatasync`` has returned: no task, coroutine or command object per
send, one hop from the flush thread into the loop per round.  What a producer relies on does not
change: a send is answered only once its bytes are durable, and a flush that fails answers
FLUSH_DISK_TIMEOUT.  A real mmap broker with sync flush on loopback sockets; the commit log's
``flush`` is gated (held, or failing) to pin the order of events.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from round_support import GatedFlush, create_topic, read_answers, v2_send

from tidemq.address import split_address
from tidemq.remoting import RemotingCommand
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.testing.pytest_plugin import running_broker
from tidemq_store_mmap.lane import compiled_send_lane

pytest.importorskip("tidemq._native._frame_lane")
if compiled_send_lane() is None:  # TIDEMQ_NO_EXTENSIONS=1: every send is the Python handler's
    pytest.skip("the compiled send lane is switched off", allow_module_level=True)

pytestmark = pytest.mark.timeout(120)

TOPIC = "RoundTopic"
#: A client's heartbeat (one producer group), as the official clients send it every 30 s.
HEARTBEAT = b'{"clientID":"127.0.0.1@1","producerDataSet":[{"groupName":"PG"}],"consumerDataSet":[]}'


def _send(opaque: int, queue: int) -> bytes:
    return v2_send(TOPIC, opaque, queue)


@contextlib.asynccontextmanager
async def sync_broker(
    tmp_path: Path, timeout_ms: int, inline_max_us: int = 0, tcp: dict[str, Any] | None = None
) -> AsyncIterator[tuple[Any, GatedFlush]]:
    """A broker with sync flush and the request lanes, its topic made, its flush held by a gate.

    ``inline_max_us`` 0 (these tests' default): every round on the flush thread, so a held gate
    holds the flush thread, not the test's loop (the inline rounds: ``test_flush_inline.py``);
    ``tcp``: ``[transport.tcp]`` options."""
    sync = {"timeout_ms": timeout_ms, "inline_max_us": inline_max_us}
    options: dict[str, Any] = {"store": {"mmap": {"request_lanes": True}}, "flush": {"sync": sync}}
    if tcp:
        options["transport"] = {"tcp": tcp}
    async with running_broker(tmp_path / "b", {"store": "mmap", "flush": "sync"}, options=options) as broker:
        await create_topic(broker, TOPIC)
        yield broker, GatedFlush(broker.store.commitlog)


def _counting(loop: asyncio.AbstractEventLoop) -> tuple[list[str], list[int]]:
    """Per-send tasks the transport made (by their coroutine) and the loop's thread-safe wake-ups."""
    tasks: list[str] = []
    wakes = [0]

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        tasks.append(getattr(coro, "__qualname__", "?"))
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)  # type: ignore[arg-type]
    real = loop.call_soon_threadsafe

    def counting(*args: Any, **kwargs: Any) -> Any:
        wakes[0] += 1
        return real(*args, **kwargs)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    return tasks, wakes


def test_held_sync_sends_are_answered_after_their_fdatasync_in_one_pass_per_round(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sync_broker(tmp_path, 20000) as (broker, gated):
            lane = broker.send_lane
            assert lane is not None and lane.reads
            host, port = split_address(broker.address)
            conns = [await asyncio.open_connection(host, port) for _ in range(2)]
            loop = asyncio.get_running_loop()
            tasks, wakes = _counting(loop)
            held, rounds = getattr(lane, "held_reads", 0), getattr(lane, "rounds_answered", 0)
            for n, (_reader, writer) in enumerate(conns):
                writer.write(b"".join(_send(100 * n + i, i % 4) for i in range(16)))
            # The flush thread is in the round's flush, held: nothing may be answered yet.
            assert await asyncio.to_thread(gated.entered.wait, 10)
            for reader, _writer in conns:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(reader.read(1 << 16), 0.3)
            wakes_before = wakes[0]
            gated.gate.set()
            results = [await read_answers(reader, 16) for reader, _writer in conns]
            for n, answers in enumerate(results):
                assert sorted(a.opaque for a in answers) == [100 * n + i for i in range(16)]
                assert {a.code for a in answers} == {ResponseCode.SUCCESS}
                assert all(a.ext_fields["msgId"] for a in answers)
            # One pass per round: no task per send, a loop wake-up per round (not per send).
            assert not [t for t in tasks if t in ("resume_eager", "Connection._serve")], tasks
            assert getattr(lane, "held_reads", 0) - held >= 2  # each connection's read waited for its round
            answered = getattr(lane, "rounds_answered", 0) - rounds
            assert 1 <= answered <= 2
            assert wakes[0] - wakes_before <= answered + 1
            for _reader, writer in conns:
                writer.close()

    asyncio.run(scenario())


def test_held_sync_sends_get_flush_disk_timeout_when_the_flush_fails(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sync_broker(tmp_path, 1000) as (broker, gated):
            gated.fail = True
            lane = broker.send_lane
            assert lane is not None
            held = getattr(lane, "held_reads", 0)
            host, port = split_address(broker.address)
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"".join(_send(i, i % 4) for i in range(8)))
            answers = await read_answers(reader, 8)
            assert sorted(a.opaque for a in answers) == list(range(8))
            assert {a.code for a in answers} == {ResponseCode.FLUSH_DISK_TIMEOUT}
            assert getattr(lane, "held_reads", 0) > held
            gated.fail = False  # the broker stops with a working flush
            gated.gate.set()
            writer.close()

    asyncio.run(scenario())


def test_a_stopping_broker_answers_the_sends_held_for_a_round_before_it_closes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sync_broker(tmp_path, 20000) as (broker, gated):
            host, port = split_address(broker.address)
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"".join(_send(i, i % 4) for i in range(8)))
            assert await asyncio.to_thread(gated.entered.wait, 10)
            await asyncio.sleep(0.05)  # the read is served and held
            assert broker.send_lane is not None and getattr(broker.send_lane, "held_reads", 0) >= 1
            stopping = asyncio.ensure_future(broker._server.stop(drain_timeout=10))
            await asyncio.sleep(0.2)
            assert not stopping.done()  # the drain waits for the held answers
            gated.gate.set()
            answers = await read_answers(reader, 8)
            assert {a.code for a in answers} == {ResponseCode.SUCCESS}
            await asyncio.wait_for(stopping, 10)
            writer.close()

    asyncio.run(scenario())


def test_a_round_that_makes_several_loop_batches_durable_wakes_the_loop_once() -> None:
    """Batches of several loop iterations queued behind one fdatasync are made durable by the next
    round together: their groups complete with one hop into the loop (``complete_all``)."""
    from tidemq.futures import StoreFuture, resolved
    from tidemq_flush import GroupCommitFlush, SyncFlushOptions

    class Disk:
        def __init__(self) -> None:
            self.written = 0
            self.flushed_where = 0
            self.gate = threading.Event()
            self.entered = threading.Event()

        def commit(self, least_pages: int = 0) -> int:
            return self.written

        def flush(self, least_pages: int = 0) -> int:
            covered = self.written
            self.entered.set()
            self.gate.wait(10)
            self.flushed_where = max(self.flushed_where, covered)
            return self.flushed_where

    async def main() -> None:
        loop = asyncio.get_running_loop()
        disk = Disk()
        policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=10_000, inline_max_us=0))
        policy.start(disk)
        try:
            _tasks, wakes = _counting(loop)

            def put() -> StoreFuture[str]:
                disk.written += 100
                fut: StoreFuture[str] = StoreFuture()
                policy.submit(disk.written, fut, "durable", lambda: "timeout")
                return fut

            first = put()  # iteration 1: its batch is the round held in the flush
            assert await asyncio.to_thread(disk.entered.wait, 10)
            later = []
            for _ in range(3):  # three more iterations, three batches queued behind it
                later.append(put())
                await asyncio.sleep(0)
            waits = [asyncio.ensure_future(resolved(f)) for f in [first, *later]]
            await asyncio.sleep(0.05)
            before = wakes[0]
            disk.gate.set()
            assert await asyncio.wait_for(asyncio.gather(*waits), 10) == ["durable"] * 4
            assert policy.flush_rounds == 2
            assert 1 <= wakes[0] - before <= 2  # at most one per round (coalesced), not one per batch
        finally:
            disk.gate.set()
            policy.shutdown()

    asyncio.run(main())


def test_a_connection_waiting_for_its_round_is_read_again_only_once_answered(tmp_path: Path) -> None:
    """``hold_reading_for_round``: sends that arrive while the connection's read waits for its
    ``fdatasync`` stay in the socket until that round answers, then are served in one read (they
    wait for the next round either way; read as they arrived they made a read, a put and a wake-up
    each)."""

    async def scenario() -> None:
        # The hold's bound (hold_reading_max_us) past the test's writes: the hold itself.
        async with sync_broker(tmp_path, 20000, tcp={"hold_reading_max_us": 10_000_000}) as (broker, gated):
            lane = broker.send_lane
            assert lane is not None and lane.reads
            held = getattr(lane, "held_reads", 0)
            host, port = split_address(broker.address)
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"".join(_send(i, i % 4) for i in range(8)))
            assert await asyncio.to_thread(gated.entered.wait, 10)  # its round's flush, held
            for k in range(4):  # four more writes while the round is in its fdatasync
                writer.write(b"".join(_send(100 + 2 * k + i, i % 4) for i in range(2)))
                await writer.drain()
                await asyncio.sleep(0.1)
            assert getattr(lane, "held_reads", 0) - held == 1  # none of them read yet
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(1 << 16), 0.2)
            gated.gate.set()
            answers = await read_answers(reader, 16)
            assert sorted(a.opaque for a in answers) == [*range(8), *range(100, 108)]
            assert {a.code for a in answers} == {ResponseCode.SUCCESS}
            assert getattr(lane, "held_reads", 0) - held == 2  # the four writes: one read
            writer.close()

    asyncio.run(scenario())


def test_a_lone_senders_connection_is_not_paused_for_its_round(tmp_path: Path) -> None:
    """A read of one send (a sender with one in flight) leaves the connection read as before."""

    async def scenario() -> None:
        async with sync_broker(tmp_path, 20000) as (broker, gated):
            lane = broker.send_lane
            assert lane is not None and lane.reads
            held = getattr(lane, "held_reads", 0)
            host, port = split_address(broker.address)
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(_send(1, 0))
            assert await asyncio.to_thread(gated.entered.wait, 10)  # its round's flush, held
            writer.write(_send(2, 1))
            await writer.drain()
            for _ in range(50):  # read at once: held for the next round
                if getattr(lane, "held_reads", 0) - held == 2:
                    break
                await asyncio.sleep(0.02)
            assert getattr(lane, "held_reads", 0) - held == 2
            gated.gate.set()
            answers = await read_answers(reader, 2)
            assert sorted(a.opaque for a in answers) == [1, 2]
            writer.close()

    asyncio.run(scenario())


def test_a_pull_and_a_heartbeat_behind_a_held_round_are_answered_within_the_bound(tmp_path: Path) -> None:
    """``hold_reading_max_us``: a connection whose read waits for a round that does not end (its
    ``fdatasync`` held here) is read again after the bound, so the heartbeat and the pull its client
    sends on it meanwhile (the official clients share one connection between producer and
    consumer) are answered while the sends still wait for their round.  Before the bound, they
    waited in the socket until the round answered: unbounded with a hung flush."""

    async def scenario() -> None:
        async with sync_broker(tmp_path, 20000, tcp={"hold_reading_max_us": 2000}) as (broker, gated):
            lane = broker.send_lane
            assert lane is not None and lane.reads
            held = getattr(lane, "held_reads", 0)
            host, port = split_address(broker.address)
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"".join(_send(i, i % 4) for i in range(8)))
            assert await asyncio.to_thread(gated.entered.wait, 10)  # its round's flush, held
            await asyncio.sleep(0.05)
            assert getattr(lane, "held_reads", 0) - held == 1  # the read waits for its round
            (conn,) = [c for c in broker._server.connections if c.in_flight]
            assert conn.in_flight == 8
            pull = {
                "consumerGroup": "CG",
                "topic": TOPIC,
                "queueId": "0",
                "queueOffset": "0",
                "maxMsgNums": "32",
                "sysFlag": "4",
                "commitOffset": "0",
                "suspendTimeoutMillis": "0",
                "subscription": "*",
                "subVersion": "0",
                "expressionType": "TAG",
            }
            started = time.monotonic()
            writer.write(
                encode_bytes(RemotingCommand(RequestCode.HEART_BEAT, opaque=900, body=HEARTBEAT))
                + encode_bytes(RemotingCommand(RequestCode.PULL_MESSAGE, opaque=901, ext_fields=pull))
            )
            answers = await read_answers(reader, 2, timeout=10)
            waited = time.monotonic() - started
            # The two requests, not the sends: those wait for their round (still in its flush).
            codes = {a.opaque: a.code for a in answers}
            assert codes.keys() == {900, 901} and codes[900] == ResponseCode.SUCCESS, codes
            assert codes[901] in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND), codes
            assert not gated.returned and conn.in_flight == 8
            assert conn.holds_expired >= 1
            # 2 ms, plus a loaded host's scheduling: far below the held round (unbounded here).
            assert waited < 2.0, waited
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(1 << 16), 0.2)
            gated.gate.set()
            answers = await read_answers(reader, 8)
            assert sorted(a.opaque for a in answers) == list(range(8))
            assert {a.code for a in answers} == {ResponseCode.SUCCESS}
            writer.close()

    asyncio.run(scenario())


def test_a_hold_after_an_answered_one_waits_its_whole_bound_then_reads_again(tmp_path: Path) -> None:
    """The bound's timer is left armed when a round answers (one timer per bound, not per round):
    a later hold on the same connection must still get its own whole ``hold_reading_max_us`` from
    its start, not what is left of the timer an earlier, answered hold armed, and still end at it.
    Here hold 1 is answered at once; hold 2 starts ~150 ms later behind a flush that does not return;
    a heartbeat behind hold 2 is answered ~400 ms after hold 2 began (not at hold 1's ~250 ms
    mark) while hold 2's sends still wait."""

    async def scenario() -> None:
        async with sync_broker(tmp_path, 20000, tcp={"hold_reading_max_us": 400_000}) as (broker, gated):
            host, port = split_address(broker.address)
            reader, writer = await asyncio.open_connection(host, port)
            gated.gate.set()
            started1 = time.monotonic()
            writer.write(b"".join(_send(i, i % 4) for i in range(8)))  # hold 1, answered at once
            answers = await read_answers(reader, 8)
            assert sorted(a.opaque for a in answers) == list(range(8))
            (conn,) = [c for c in broker._server.connections if c.holds_expired == 0 and c.server_side]
            gated.gate.clear()
            await asyncio.sleep(max(0.0, 0.15 - (time.monotonic() - started1)))
            started2 = time.monotonic()
            writer.write(b"".join(_send(10 + i, i % 4) for i in range(8)))  # hold 2: its flush waits
            await asyncio.sleep(0.02)
            writer.write(encode_bytes(RemotingCommand(RequestCode.HEART_BEAT, opaque=900, body=HEARTBEAT)))
            (answer,) = await read_answers(reader, 1, timeout=10)
            waited = time.monotonic() - started2
            assert answer.opaque == 900 and answer.code == ResponseCode.SUCCESS
            assert conn.holds_expired == 1 and conn.in_flight == 8
            assert waited >= 0.35, waited  # hold 2's own bound, not hold 1's timer (~0.25 s in)
            assert waited < 5.0, waited
            gated.gate.set()
            answers = await read_answers(reader, 8)
            assert sorted(a.opaque for a in answers) == [10 + i for i in range(8)]
            writer.close()

    asyncio.run(scenario())
