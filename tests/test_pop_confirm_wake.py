"""Held POPs, NOTIFICATIONs and pulls at the confirm offset are answered when it moves.

In controller mode a consumer reads only what the in-sync set holds (:mod:`tidemq.broker.confirmed`):
a message stored on the master waits there until the slaves acknowledge it, and the
acknowledgement (an HA reader thread) wakes the requests held at the bound.  A held request
must not miss that wake-up when it comes between the request's read and its registration as a
waiter (the other thread sees no waiter and schedules nothing): the request would then sleep its
whole poll time (a RocketMQ client's POP long poll is 20 s) with a readable message.

In-process broker with a replication that confirms reads up to an offset the test sets; the
acknowledgement is delivered from a thread of its own, as the controller's HA reader does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_broker_processors import call, pull_fields

from tidemq.broker import Broker
from tidemq.client import LoopThread
from tidemq.config import compose, parse_config
from tidemq.message import MessageInner
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.protocol import TopicConfig
from tidemq_ha_replication.none import NoReplication

pytestmark = pytest.mark.timeout(60)

TOPIC = "ConfirmWakeTopic"
GROUP = "GCONFIRM_WAKE"
#: The poll time of the held requests: a missed wake-up shows as an answer this late.
POLL_MS = 8_000
#: Answered well before the poll ends (the wake-up came), even on a loaded machine.
PROMPT_S = POLL_MS / 1000 / 2


class Confirms(NoReplication):
    """The ``none`` replication that confirms reads up to :attr:`offset` (a ``ConfirmsReads``).

    ``on_read``, when set, runs once inside the next read of the confirm offset, after the value
    read is taken: what happens there happens between a request's read and what it does next.
    """

    def __init__(self) -> None:
        self.offset: int | None = None
        self.listener: Callable[[], None] | None = None
        self.on_read: Callable[[], None] | None = None

    def confirm_offset(self) -> int | None:
        value = self.offset
        hook, self.on_read = self.on_read, None
        if hook is not None:
            hook()
        return value

    def bind_confirm_listener(self, listener: Callable[[], None]) -> None:
        self.listener = listener

    def acknowledge(self, offset: int) -> None:
        """The set acknowledged up to ``offset``: the listener called from another thread (as
        the HA reader calls it), joined before returning."""
        self.offset = offset
        assert self.listener is not None
        t = threading.Thread(target=self.listener)
        t.start()
        t.join()


class Env:
    def __init__(self, loop: LoopThread, broker: Broker, confirms: Confirms) -> None:
        self.loop, self.broker, self.confirms = loop, broker, confirms

    def store_unconfirmed(self, body: bytes = b"m") -> int:
        """Put a message to TOPIC queue 0 past the confirm offset; returns the log's end after it."""
        store = self.broker.store
        self.confirms.offset = store.get_max_phy_offset()
        msg = MessageInner(TOPIC, body, 0, born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 2))
        assert store.put_message(msg).result(10).ok
        end = store.get_max_phy_offset()
        assert self.broker.read_bound.max_offset(TOPIC, 0) == store.get_max_offset_in_queue(TOPIC, 0) - 1
        return end


@pytest.fixture(name="env")
def env_fixture(tmp_path: Path) -> Iterator[Env]:
    """A broker bounded by a :class:`Confirms` the test moves (imported as ``env_fixture``)."""
    loop = LoopThread("confirm-wake")
    confirms = Confirms()

    async def start() -> Broker:
        raw = {"broker": {"name": "b", "listen": "127.0.0.1:0", "namesrv": [], "data_dir": str(tmp_path)}}
        components = compose(parse_config(raw))
        components.instances["replication"] = confirms
        broker = Broker(components)
        broker.topics.update(TopicConfig(TOPIC, read_queue_nums=1, write_queue_nums=1))
        await broker.start()
        return broker

    broker = loop.run(start(), 30)
    assert broker.read_bound.active
    try:
        yield Env(loop, broker, confirms)
    finally:
        loop.run(broker.stop(), 30)
        loop.stop()


async def timed(aw: Any) -> tuple[Any, float]:
    t0 = time.monotonic()
    result = await aw
    return result, time.monotonic() - t0


def test_a_held_pop_is_answered_when_the_confirm_offset_passes_its_message(env: Env) -> None:
    end = env.store_unconfirmed(b"held")

    async def scenario() -> tuple[Any, float]:
        task = asyncio.ensure_future(timed(env.broker.pop.pop(GROUP, TOPIC, max_nums=8, poll_ms=POLL_MS)))
        await asyncio.sleep(0.3)
        assert not task.done()  # held: the message is past the confirm offset
        await asyncio.to_thread(env.confirms.acknowledge, end)
        return await task

    result, took = env.loop.run(scenario(), 30)
    assert result.found and [len(b.offsets) for b in result.batches] == [1]
    assert took < PROMPT_S, f"answered after {took:.1f} s: the acknowledgement did not wake the pop"


def test_an_acknowledgement_between_a_pops_read_and_its_wait_wakes_it(env: Env) -> None:
    """The acknowledgement arrives right after the pop read the confirm offset (the message not
    yet readable) and before it waits: the pop must still be answered at once (before: after its
    whole poll time, the wake-up lost because no waiter was registered yet)."""
    end = env.store_unconfirmed(b"raced")
    env.confirms.on_read = lambda: env.confirms.acknowledge(end)
    result, took = env.loop.run(timed(env.broker.pop.pop(GROUP, TOPIC, max_nums=8, poll_ms=POLL_MS)), 30)
    assert env.confirms.on_read is None  # the acknowledgement did come inside the pop's read
    assert result.found and [len(b.offsets) for b in result.batches] == [1]
    assert took < PROMPT_S, f"answered after {took:.1f} s (poll {POLL_MS} ms): the wake-up was lost"


def test_an_acknowledgement_between_a_notifications_check_and_its_wait_wakes_it(env: Env) -> None:
    end = env.store_unconfirmed(b"notified")
    env.confirms.on_read = lambda: env.confirms.acknowledge(end)
    has, took = env.loop.run(timed(env.broker.pop.notification(GROUP, TOPIC, poll_ms=POLL_MS)), 30)
    assert env.confirms.on_read is None
    assert has is True
    assert took < PROMPT_S, f"answered after {took:.1f} s (poll {POLL_MS} ms): the wake-up was lost"


@pytest.mark.parametrize("raced", [False, True], ids=["held", "between-read-and-wait"])
def test_a_held_pull_is_answered_when_the_confirm_offset_passes_its_message(env: Env, raced: bool) -> None:
    end = env.store_unconfirmed(b"pulled")
    offset = env.broker.store.get_max_offset_in_queue(TOPIC, 0) - 1
    if raced:
        env.confirms.on_read = lambda: env.confirms.acknowledge(end)

    async def scenario() -> tuple[Any, float]:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            fields = pull_fields(TOPIC, 0, offset, group=GROUP, suspend_ms=POLL_MS)
            task = asyncio.ensure_future(
                timed(call(client, env.broker, RequestCode.PULL_MESSAGE, fields, timeout=POLL_MS / 1000 + 5))
            )
            if not raced:
                await asyncio.sleep(0.3)
                assert not task.done()
                await asyncio.to_thread(env.confirms.acknowledge, end)
            return await task
        finally:
            await client.close()

    resp, took = env.loop.run(scenario(), 30)
    assert env.confirms.on_read is None
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    assert took < PROMPT_S, f"answered after {took:.1f} s (suspend {POLL_MS} ms)"
