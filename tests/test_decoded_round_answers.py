"""Sync-flush sends on the decoded-command path answered with their flush round, without a task each.

Where the compiled read lane does not serve a read (``[transport.tcp] read_lane = false``, access
control on, a send hook registered, ``TIDEMQ_NO_EXTENSIONS=1``), each send is decoded and run
eagerly up to its wait for the group-commit round; all the sends of a round wait on its one
future.  The connection parks them on it and resumes them together when the round is durable (one
callback per connection, their answers in one write), instead of one asyncio task per send.  What a
producer relies on does not change: a send is answered only once its bytes are durable, a flush
that fails answers FLUSH_DISK_TIMEOUT, the send hooks see each send once with its outcome, a
stopping broker answers them before it closes.  A real mmap broker with sync flush on loopback
sockets; the commit log's ``flush`` is gated to pin the order of events.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from round_support import GatedFlush, create_topic, read_answers, v2_send

from tidemq import hookimpl
from tidemq.address import split_address
from tidemq.plugins import PluginManager
from tidemq.remoting.codes import ResponseCode
from tidemq.testing.pytest_plugin import running_broker

pytestmark = pytest.mark.timeout(120)

TOPIC = "DecodedRound"
#: The coroutines of a task made per send (the eager run's rest, or the handler's coroutine).
_PER_SEND = ("resume_eager", "Connection._serve")


def _send(opaque: int, queue: int) -> bytes:
    return v2_send(TOPIC, opaque, queue)


class SendSeen:
    """A send hook: what ``tidemq_after_send`` saw (message id and status per send)."""

    def __init__(self) -> None:
        self.before = 0
        self.after: list[tuple[str, str]] = []

    @hookimpl
    def tidemq_before_send(self, context: Any) -> None:
        self.before += 1

    @hookimpl
    def tidemq_after_send(self, context: Any) -> None:
        self.after.append((context.msg_id, context.status))


@contextlib.asynccontextmanager
async def decoded_broker(
    tmp_path: Path, timeout_ms: int, manager: PluginManager | None = None
) -> AsyncIterator[tuple[Any, GatedFlush]]:
    """A sync-flush mmap broker whose reads are all decoded (no read lane), its topic made."""
    options = {
        "store": {"mmap": {"request_lanes": True}},
        "flush": {"sync": {"timeout_ms": timeout_ms}},
        "transport": {"tcp": {"read_lane": False}},
    }
    async with running_broker(
        tmp_path / "b", {"store": "mmap", "flush": "sync"}, options=options, manager=manager
    ) as broker:
        await create_topic(broker, TOPIC)
        yield broker, GatedFlush(broker.store.commitlog)


def _task_names(loop: asyncio.AbstractEventLoop) -> list[str]:
    """The coroutine names of the tasks made on ``loop`` from now on."""
    names: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        names.append(getattr(coro, "__qualname__", "?"))
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    return names


def _connections(broker: Any) -> list[Any]:
    return list(broker._server._connections)


@pytest.mark.parametrize("hooks", [False, True], ids=["no-hooks", "send-hooks"])
def test_decoded_sync_sends_are_answered_after_their_flush_without_a_task_each(
    tmp_path: Path, hooks: bool
) -> None:
    seen = SendSeen()
    manager = None
    if hooks:
        manager = PluginManager()
        manager.load_entry_points()
        manager.register(seen, name="send-seen")

    async def scenario() -> None:
        async with decoded_broker(tmp_path, 20000, manager) as (broker, gate):
            host, port = split_address(broker.address)
            conns = [await asyncio.open_connection(host, port) for _ in range(2)]
            tasks = _task_names(asyncio.get_running_loop())
            for n, (_reader, writer) in enumerate(conns):
                writer.write(b"".join(_send(100 * n + i, i % 4) for i in range(16)))
            assert await asyncio.to_thread(gate.entered.wait, 10)
            for reader, _writer in conns:  # the round's flush is held: nothing is answered yet
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(reader.read(1 << 16), 0.3)
            assert sum(c.in_flight for c in _connections(broker)) == 32  # counted while they wait
            gate.gate.set()
            results = [await read_answers(reader, 16) for reader, _writer in conns]
            answered_at = time.monotonic()
            assert gate.returned and gate.returned[-1] <= answered_at
            ids: list[str] = []
            for n, answers in enumerate(results):
                assert sorted(a.opaque for a in answers) == [100 * n + i for i in range(16)]
                assert {a.code for a in answers} == {ResponseCode.SUCCESS}
                ids += [a.ext_fields["msgId"] for a in answers]
            assert all(ids) and len(set(ids)) == 32
            assert not [t for t in tasks if t in _PER_SEND], tasks  # parked, not a task each
            assert sum(c.in_flight for c in _connections(broker)) == 0
            if hooks:  # each send seen once, before and after, with the answer's outcome
                assert seen.before == 32
                assert sorted(seen.after) == sorted((i, "SUCCESS") for i in ids)
            for _reader, writer in conns:
                writer.close()

    asyncio.run(scenario())


def test_decoded_sync_sends_get_flush_disk_timeout_when_the_flush_fails(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with decoded_broker(tmp_path, 1000) as (broker, gate):
            gate.fail = True
            host, port = split_address(broker.address)
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"".join(_send(i, i % 4) for i in range(8)))
            answers = await read_answers(reader, 8)
            assert sorted(a.opaque for a in answers) == list(range(8))
            assert {a.code for a in answers} == {ResponseCode.FLUSH_DISK_TIMEOUT}
            gate.fail = False
            gate.gate.set()
            writer.write(_send(99, 0))  # the broker still answers
            (after,) = await read_answers(reader, 1)
            assert (after.opaque, after.code) == (99, ResponseCode.SUCCESS)
            writer.close()

    asyncio.run(scenario())


def test_a_stopping_broker_answers_the_parked_decoded_sends_before_it_closes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with decoded_broker(tmp_path, 20000) as (broker, gate):
            host, port = split_address(broker.address)
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"".join(_send(i, i % 4) for i in range(8)))
            assert await asyncio.to_thread(gate.entered.wait, 10)
            await asyncio.sleep(0.05)  # the read is served and its sends parked
            stopping = asyncio.ensure_future(broker._server.stop(drain_timeout=10))
            await asyncio.sleep(0.2)
            assert not stopping.done()  # the drain waits for the parked sends
            gate.gate.set()
            answers = await read_answers(reader, 8)
            assert {a.code for a in answers} == {ResponseCode.SUCCESS}
            await asyncio.wait_for(stopping, 10)
            writer.close()

    asyncio.run(scenario())
