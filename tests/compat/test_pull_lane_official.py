"""The official RocketMQ client (PyPI ``rocketmq==0.4.4``) pulling through the compiled pull lane.

A ``tidemq namesrv`` subprocess and an mmap broker in this process (so the lane's counters can be
read), registered with it.  The client's push consumer (TAG subscription, long polling, offset
commits in its pulls) and pull consumer read a backlog the client produced; every PULL_MESSAGE they
send is recorded with its answer by a handler wrapper.  The messages must arrive intact, the lane
must have answered pulls, and each recorded pull the lane answered, sent again while a consume-hook
plugin sends every pull the Python handler's way, must get the byte-equal answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from tidemq import hookimpl
from tidemq.address import split_address
from tidemq.broker.context import ProcessorRegister
from tidemq.broker.pull_lane import counters
from tidemq.extensions import compiled_twin
from tidemq.observe import ConsumeContext
from tidemq.plugins import PluginManager
from tidemq.remoting import FrameDecoder, RemotingCommand
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import stringify_fields
from tidemq.testing.pytest_plugin import running_broker
from tidemq.transport import Connection

pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")
pytest.importorskip("tidemq._native._pull_lane")
if compiled_twin("tidemq._native._pull_lane") is None:  # TIDEMQ_NO_EXTENSIONS=1: every pull is the handler's
    pytest.skip("the compiled pull lane is switched off", allow_module_level=True)

pytestmark = [pytest.mark.compat, pytest.mark.timeout(240)]

WORKER = Path(__file__).with_name("official_client.py")
TOPIC = "LanePull"
Handler = Callable[[Connection, RemotingCommand], Awaitable[RemotingCommand | None]]


class Recorder:
    """Wraps the PULL_MESSAGE handler: every pull and its answer, as the client saw them."""

    def __init__(self) -> None:
        self.pulls: list[tuple[RemotingCommand, bytes, bool]] = []

    @hookimpl
    def tidemq_register_processors(self, register: ProcessorRegister) -> None:
        register.wrap(RequestCode.PULL_MESSAGE, self._wrap)

    def _wrap(self, handler: Handler) -> Handler:
        async def recorded(conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
            served = counters["served"]
            response = await handler(conn, request)
            if response is not None:
                self.pulls.append((request, encode_bytes(response), counters["served"] > served))
            return response

        return recorded


class Listener:
    @hookimpl
    def tidemq_before_consume(self, context: ConsumeContext) -> None:
        pass


class LaneBroker:
    def __init__(self, root: Path, namesrv: str, recorder: Recorder) -> None:
        manager = PluginManager()
        manager.load_entry_points()
        manager.register(recorder, name="pull-recorder")
        self.manager = manager
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._cm = running_broker(
            root, {"store": "mmap"}, manager=manager, namesrv=[namesrv], name="broker-lane"
        )
        self.broker = self.run(self._cm.__aenter__())

    def run(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(60)

    def close(self) -> None:
        self.run(self._cm.__aexit__(None, None, None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def _exchange(address: str, requests: list[RemotingCommand]) -> list[bytes]:
    host, port = split_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    decoder = FrameDecoder()
    out = []
    try:
        for request in requests:
            writer.write(encode_bytes(request))
            await writer.drain()
            got: list[RemotingCommand] = []
            while not got:
                data = await asyncio.wait_for(reader.read(1 << 20), 20)
                assert data, "connection closed"
                got = decoder.feed(data)
            out.append(encode_bytes(got[0]))
    finally:
        writer.close()
    return out


@pytest.fixture
def lane(spawn: Any, tmp_path: Path) -> Iterator[tuple[LaneBroker, Recorder, str]]:
    namesrv = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
    recorder = Recorder()
    broker = LaneBroker(tmp_path / "data", namesrv, recorder)
    try:
        yield broker, recorder, namesrv
    finally:
        broker.close()


def client(namesrv: str, home: Path, *args: str) -> list[Any]:
    out = subprocess.run(
        [sys.executable, str(WORKER), *args, "--namesrv", namesrv],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "HOME": str(home)},
        cwd=home,
    )
    ok = out.returncode == 0 or (out.returncode == -6 and "boost::thread_interrupted" in out.stderr)
    assert ok, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_the_official_consumers_pull_through_the_lane_and_get_the_handlers_answers(
    lane: tuple[LaneBroker, Recorder, str], tmp_path: Path
) -> None:
    broker, recorder, namesrv = lane
    fields = {"topic": TOPIC, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
    create = RemotingCommand(
        RequestCode.UPDATE_AND_CREATE_TOPIC, opaque=1, ext_fields=stringify_fields(fields)
    )
    (created,) = FrameDecoder().feed(b"".join(broker.run(_exchange(broker.broker.address, [create]))))
    assert created.code == ResponseCode.SUCCESS
    sent = client(namesrv, tmp_path, "produce", "--topic", TOPIC, "--count", "40")
    assert [s["status"] for s in sent] == [0] * 40
    before = counters["served"]

    push = client(
        namesrv,
        tmp_path,
        "push",
        "--topic",
        TOPIC,
        "--group",
        "G_LANE_PUSH",
        "--count",
        "40",
        "--timeout",
        "60",
    )
    assert push[-1]["complete"] and sorted(r["body"] for r in push[-1]["received"]) == sorted(
        f"msg-{i}" for i in range(40)
    )
    tagged = client(
        namesrv,
        tmp_path,
        "pull",
        "--topic",
        TOPIC,
        "--group",
        "G_LANE_PULL",
        "--count",
        "20",
        "--expression",
        "TagA",
    )
    assert tagged[-1]["complete"]
    assert sorted(r["body"] for r in tagged[-1]["received"]) == sorted(f"msg-{i}" for i in range(0, 40, 2))
    assert counters["served"] > before  # the lane answered the official client's pulls

    taken = [(request, answer) for request, answer, by_lane in recorder.pulls if by_lane]
    assert taken
    assert {r.ext_fields.get("subscription") for r, _ in taken} >= {"TagA"}
    broker.manager.register(Listener(), name="consume-listener")  # from now on, the Python handler
    again = broker.run(_exchange(broker.broker.address, [r for r, _ in taken]))
    assert again == [answer for _, answer in taken]
