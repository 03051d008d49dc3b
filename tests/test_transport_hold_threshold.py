"""``[transport.tcp] hold_reading_min_sends``: which connections are held for their sync round.

``hold_reading_for_round`` pauses a connection whose read of two sends or more waits for its
flush round, until that round answers: a pipelining sender's sends that arrive during the round
then come in one read.  A sender with few sends waiting (a moderate rate: a few sends a tick) is
not held: what it sends during the round's ``fdatasync`` is read and put at once and waits in the
next round, which starts the moment the running one ends instead of after its answer, a read and
a put.  A real mmap broker with sync flush on loopback; the commit log's ``flush`` is gated, so
"during the round" is a state the test holds, not a timing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from round_support import GatedFlush, create_topic, read_answers, v2_send

from tidemq.address import split_address
from tidemq.remoting.codes import ResponseCode
from tidemq.testing.pytest_plugin import running_broker
from tidemq_store_mmap.lane import compiled_send_lane
from tidemq_transport_tcp.options import TcpOptions

pytest.importorskip("tidemq._native._frame_lane")
if compiled_send_lane() is None:  # TIDEMQ_NO_EXTENSIONS=1: every send is the Python handler's
    pytest.skip("the compiled send lane is switched off", allow_module_level=True)

pytestmark = pytest.mark.timeout(120)

TOPIC = "HoldTopic"


@contextlib.asynccontextmanager
async def gated_broker(
    tmp_path: Path, tcp: dict[str, Any] | None = None
) -> AsyncIterator[tuple[Any, GatedFlush]]:
    """A broker with sync flush and the request lanes, every flush round held by a gate."""
    options: dict[str, Any] = {
        "store": {"mmap": {"request_lanes": True}},
        "flush": {"sync": {"timeout_ms": 20000, "inline_max_us": 0}},
        # The hold's bound far past the test: a hold ends only with its round.
        "transport": {"tcp": {"hold_reading_max_us": 10_000_000, **(tcp or {})}},
    }
    async with running_broker(tmp_path / "b", {"store": "mmap", "flush": "sync"}, options=options) as broker:
        await create_topic(broker, TOPIC)
        yield broker, GatedFlush(broker.store.commitlog)


async def _reads_during_round(tmp_path: Path, first: int, tcp: dict[str, Any] | None = None) -> int:
    """Reads the lane held for rounds, counted while the first read's round (``first`` sends) is
    in its flush and two more sends have been written on the same connection; then the round
    ends and all sends are answered."""
    async with gated_broker(tmp_path, tcp) as (broker, gated):
        lane = broker.send_lane
        assert lane is not None and lane.reads
        before = lane.held_reads
        host, port = split_address(broker.address)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"".join(v2_send(TOPIC, i, i % 4) for i in range(first)))
        assert await asyncio.to_thread(gated.entered.wait, 10)  # its round's flush, held
        assert lane.held_reads - before == 1
        writer.write(b"".join(v2_send(TOPIC, 100 + i, i % 4) for i in range(2)))
        await writer.drain()
        for _ in range(25):  # read at once, or not until the round answers
            if lane.held_reads - before == 2:
                break
            await asyncio.sleep(0.02)
        during = lane.held_reads - before
        gated.gate.set()
        answers = await read_answers(reader, first + 2)
        assert sorted(a.opaque for a in answers) == [*range(first), 100, 101]
        assert {a.code for a in answers} == {ResponseCode.SUCCESS}
        writer.close()
        return during


def test_a_few_sends_waiting_do_not_hold_the_connection_through_the_round(tmp_path: Path) -> None:
    """A read of two sends, the connection's only ones waiting: the next sends, written while
    that round's flush runs, are read (and put) during it, not after its answer."""
    assert TcpOptions().hold_reading_min_sends > 2
    assert asyncio.run(_reads_during_round(tmp_path, 2)) == 2


def test_a_pipelining_sender_is_still_held_for_its_round(tmp_path: Path) -> None:
    """A read that leaves ``hold_reading_min_sends`` sends waiting holds the connection: what it
    writes during the round is read once the round has answered."""
    first = TcpOptions().hold_reading_min_sends
    assert asyncio.run(_reads_during_round(tmp_path, first)) == 1


def test_hold_reading_min_sends_2_holds_every_read_of_two(tmp_path: Path) -> None:
    """The behaviour before the threshold, kept as an option: any read of two sends holds."""
    assert asyncio.run(_reads_during_round(tmp_path, 2, {"hold_reading_min_sends": 2})) == 1
