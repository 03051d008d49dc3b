"""Delayed messages and consumer retries through the delay levels, against real broker processes.

The broker runs with short levels (``1s 2s 3s``) so the tests stay fast; timing is judged from
the broker's own store timestamps (delivery) against the producer's born timestamp, on one clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import Server, free_port

from tidemq.client import ConsumeFrom, ConsumeStatus, Message, MessageExt, Producer, PushConsumer
from tidemq.delay import parse_delay_levels
from tidemq.errors import ConfigError
from tidemq.message import Prop
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

#: How late a delivery may be and still pass (the service itself aims at a few ms; CI is slow).
LATE_BOUND_MS = 1500
#: Clock granularity between the client's born timestamp and the broker's store timestamp.
EARLY_SLACK_MS = 5


class MQ:
    """A NameServer and one broker subprocess (restartable on the same port and data)."""

    def __init__(self, spawn: Any, tmp_path: Path, **broker: Any) -> None:
        self.spawn = spawn
        self.ns = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
        self.port = free_port()
        self.data = tmp_path / "broker-data"
        self.cfg = tmp_path / "broker.toml"
        settings = {"name": "broker-d", "register_interval_s": 1.0, "delay_levels": "1s 2s 3s", **broker}
        lines = ["[broker]"]
        for key, value in settings.items():
            lines.append(f"{key} = {orjson.dumps(value).decode()}")
        lines += ["", "[store.mmap]", "commitlog_file_size = 8388608", "consumequeue_entries = 10000", ""]
        self.cfg.write_text("\n".join(lines))
        self.broker: Any = None
        self.start_broker()

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_broker(self) -> None:
        self.broker = self.spawn(
            "broker",
            "-c",
            str(self.cfg),
            "--listen",
            self.broker_addr,
            "--namesrv",
            self.ns,
            "--data-dir",
            str(self.data),
        )

    def stop_broker(self) -> None:
        assert self.broker.stop() == 0, self.broker.log_path.read_text()[-2000:]


def module_mq(tmp: Path, **broker: Any) -> Iterator[MQ]:
    """For a module fixture: an MQ whose NameServer and broker live as long as the fixture (shared by
    the tests that neither restart the broker nor read broker-wide figures), stopped at its end."""
    started: list[Server] = []

    def spawn(*args: str) -> Server:
        server = Server(list(args), tmp)
        started.append(server)
        return server

    try:
        yield MQ(spawn, tmp, **broker)
    finally:
        for server in reversed(started):
            server.stop()


class Collector:
    """A push consumer that records (arrival time, message) for every delivery."""

    def __init__(
        self, mq: MQ, group: str, topic: str, listener: Callable[[MessageExt], ConsumeStatus] | None = None
    ):
        self.got: list[tuple[float, MessageExt]] = []
        self._listener = listener
        self.consumer = PushConsumer(
            group, mq.ns, consume_from=ConsumeFrom.FIRST_OFFSET, rebalance_interval_s=1.0, heartbeat_s=1.0
        )
        self.consumer.subscribe(topic, "*")
        self.consumer.register_listener(self._on)

    def _on(self, msgs: list[MessageExt]) -> ConsumeStatus:
        status = ConsumeStatus.SUCCESS
        for m in msgs:
            self.got.append((time.time(), m))
            if self._listener is not None:
                status = self._listener(m)
        return status

    def bodies(self) -> list[bytes]:
        return [m.body for _, m in self.got]

    async def wait_for(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.got) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(self.got) >= count, (
            f"got {len(self.got)} of {count} messages in {timeout}s: {self.bodies()}"
        )


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))  # type: ignore[arg-type]


def lateness_ms(m: MessageExt, delay_ms: int) -> int:
    """How long after its due time the message reached its real topic."""
    return m.store_timestamp - (m.born_timestamp + delay_ms)


# ---------------------------------------------------------------------------- units


def test_delay_levels_parse_units_and_reject_bad_items() -> None:
    assert parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")[-1] == 7_200_000
    assert parse_delay_levels("500ms 2s 1m 1h 1d") == [500, 2000, 60_000, 3_600_000, 86_400_000]
    with pytest.raises(ConfigError, match="'5x'"):
        parse_delay_levels("1s 5x")
    with pytest.raises(ConfigError):
        parse_delay_levels("  ")


# ---------------------------------------------------------------------------- processes


def test_delayed_messages_arrive_at_their_level_not_before(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path)
    topic, levels = "DelayTopic", {b"now": 0, b"l1": 1, b"l2": 2, b"l9": 9}

    async def main() -> None:
        async with Producer("delay-pg", mq.ns) as producer:
            for body, level in levels.items():
                result = await producer.send(Message(topic, body, tags="T", delay_level=level))
                assert result.queue.topic == topic
            collector = Collector(mq, "delay-cg", topic)
            await collector.consumer.start()
            try:
                await collector.wait_for(1, 10)
                await asyncio.sleep(0.3)
                # Only the undelayed message is visible before a second has passed.
                assert collector.bodies() == [b"now"]
                await collector.wait_for(4, 15)
            finally:
                await collector.consumer.shutdown()
        by_body = {m.body: m for _, m in collector.got}
        assert sorted(by_body) == sorted(levels)
        for body, delay_ms in ((b"l1", 1000), (b"l2", 2000), (b"l9", 3000)):  # 9 > 3 levels: the last
            m = by_body[body]
            late = lateness_ms(m, delay_ms)
            assert -EARLY_SLACK_MS <= late <= LATE_BOUND_MS, (body, late)
            assert m.topic == topic and m.tags == "T"
            assert Prop.DELAY_TIME_LEVEL not in m.properties
            assert m.properties[Prop.REAL_TOPIC] == topic
        assert [b for _, m in sorted(collector.got, key=lambda x: x[0]) for b in [m.body]] == [
            b"now",
            b"l1",
            b"l2",
            b"l9",
        ]

    run(main())
    # The levels' progress is on disk (RocketMQ's delayOffset.json format).
    mq.stop_broker()
    table = orjson.loads((mq.data / "config" / "delayOffset.json").read_bytes())["offsetTable"]
    assert table == {"1": 1, "2": 1, "3": 1}


def test_delay_offsets_are_served_for_slaves(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path)

    async def main() -> dict[str, Any]:
        async with Producer("delay-pg2", mq.ns) as producer:
            await producer.send(Message("DelayTopic2", b"x", delay_level=1))
        await asyncio.sleep(1.5)
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            resp = await client.invoke(
                mq.broker_addr, RemotingCommand.request(RequestCode.GET_ALL_DELAY_OFFSET), 3
            )
        finally:
            await client.close()
        assert resp.code == ResponseCode.SUCCESS
        return orjson.loads(resp.body)

    assert run(main())["offsetTable"]["1"] == 1


def test_pending_delays_are_delivered_after_a_broker_restart(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path)
    topic = "DelayRestart"

    async def send() -> None:
        async with Producer("delay-pg3", mq.ns) as producer:
            await producer.send(Message(topic, b"l1", delay_level=1))  # due while the broker is down
            await producer.send(Message(topic, b"l3", delay_level=3))  # due after it is back

    run(send())
    mq.stop_broker()
    time.sleep(1.2)
    mq.start_broker()

    async def consume() -> list[MessageExt]:
        collector = Collector(mq, "delay-cg3", topic)
        await collector.consumer.start()
        try:
            await collector.wait_for(2, 20)
            await asyncio.sleep(0.5)
        finally:
            await collector.consumer.shutdown()
        return [m for _, m in collector.got]

    got = {m.body: m for m in run(consume())}
    assert sorted(got) == [b"l1", b"l3"]  # each exactly once: progress survived the restart
    assert lateness_ms(got[b"l1"], 1000) >= -EARLY_SLACK_MS
    late3 = lateness_ms(got[b"l3"], 3000)
    assert -EARLY_SLACK_MS <= late3 <= LATE_BOUND_MS, late3


def test_consumer_retries_wait_in_the_delay_levels(spawn, tmp_path) -> None:
    mq = MQ(spawn, tmp_path)
    topic = "DelayRetry"
    attempts: list[float] = []

    def fail_once(m: MessageExt) -> ConsumeStatus:
        attempts.append(time.time())
        return ConsumeStatus.RECONSUME_LATER if len(attempts) == 1 else ConsumeStatus.SUCCESS

    async def main() -> list[tuple[float, MessageExt]]:
        async with Producer("delay-pg4", mq.ns) as producer:
            await producer.send(Message(topic, b"retry-me"))
            collector = Collector(mq, "delay-cg4", topic, fail_once)
            await collector.consumer.start()
            try:
                await collector.wait_for(2, 20)
            finally:
                await collector.consumer.shutdown()
        return collector.got

    got = run(main())
    first, second = got[0][1], got[1][1]
    assert first.body == second.body == b"retry-me"
    assert second.reconsume_times == 1
    # The first retry uses level 3 + 0 = 3, the last of "1s 2s 3s": it waited 3 s in the schedule.
    gap_ms = (attempts[1] - attempts[0]) * 1000
    assert 3000 - 100 <= gap_ms <= 3000 + LATE_BOUND_MS + 1000, gap_ms


OFFICIAL_DELAYED_SEND = """
import sys, time
from rocketmq.client import Message, Producer
producer = Producer("delay-official-pg")
producer.set_namesrv_addr(sys.argv[1])
producer.start()
msg = Message(sys.argv[2])
msg.set_body(b"from-cpp")
msg.set_delay_time_level(2)
result = producer.send_sync(msg)
print(int(result.status), flush=True)
producer.shutdown()
"""


def test_official_client_delay_level_is_honoured(spawn, tmp_path) -> None:
    pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")
    import subprocess
    import sys

    mq = MQ(spawn, tmp_path)
    topic = "DelayOfficial"
    out = subprocess.run(
        [sys.executable, "-c", OFFICIAL_DELAYED_SEND, mq.ns, topic],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.split() == ["0"], out.stdout + out.stderr[-2000:]

    async def consume() -> MessageExt:
        collector = Collector(mq, "delay-official-cg", topic)
        await collector.consumer.start()
        try:
            await collector.wait_for(1, 15)
        finally:
            await collector.consumer.shutdown()
        return collector.got[0][1]

    m = run(consume())
    assert m.body == b"from-cpp" and Prop.DELAY_TIME_LEVEL not in m.properties
    late = lateness_ms(m, 2000)
    assert -EARLY_SLACK_MS <= late <= LATE_BOUND_MS, late
