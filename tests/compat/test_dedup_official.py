"""Lost SEND answers, resent by the official ``rocketmq==0.4.4`` client and by tidemq's client
(issue 37): with the duplicate window, 0 duplicates stored and 0 acknowledged messages lost.

A forwarding proxy (tests/dedup_proxy.py) sits between the clients and a ``tidemq broker``
subprocess, which advertises the proxy's address, and loses the answers to chosen sends (the
broker stored them).  rocketmq-client-cpp (inside 0.4.4) gives every attempt a new UNIQ_KEY, so
its resends are caught with ``dedup_key = "content"``; the same run keyed on UNIQ_KEY stores one
duplicate per lost answer (the control: the test can tell).  tidemq's client, like the Java one,
resends with the same UNIQ_KEY, caught by the default.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dedup_proxy import DroppingProxy
from reliability.cluster import Cluster

from tidemq.client import Message, Producer

pytestmark = [pytest.mark.compat, pytest.mark.timeout(300)]

WORKER = Path(__file__).with_name("dedup_client.py")


class ProxiedBroker:
    """A NameServer, a broker process and the proxy in front of it (the address clients get)."""

    def __init__(self, root: Path, drop: Any, mode: str = "close", **broker: Any) -> None:
        self.proxy = DroppingProxy("", drop, mode=mode)
        self.proxy.start()
        self.cluster = Cluster(
            root,
            flush="async",
            broker={"advertise": self.proxy.address, "register_interval_s": 1.0, **broker},
        )
        self.proxy.set_upstream(self.cluster.broker_address)
        self.cluster.start_broker()
        self.root = root

    @property
    def namesrv(self) -> str:
        return self.cluster.namesrv.address

    def bodies(self, topic: str) -> Counter[str]:
        """How many times each body is stored in ``topic`` (read straight from the broker)."""
        return Counter(read_topic_bodies(self.namesrv, topic))

    def close(self) -> None:
        self.cluster.close()
        self.proxy.stop()


def read_topic_bodies(namesrv: str, topic: str) -> list[str]:
    from tidemq.client import BlockingPullConsumer, PullStatus

    out: list[str] = []
    with BlockingPullConsumer("dedup-checker", namesrv) as consumer:
        for mq in consumer.fetch_subscribe_queues(topic):
            offset = 0
            while True:
                res = consumer.pull(mq, "*", offset, 256)
                if res.status is not PullStatus.FOUND:
                    break
                out += [m.body.decode() for m in res.messages]
                offset = res.next_begin_offset
    return out


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[Any]:
    made: list[ProxiedBroker] = []

    def make(name: str, drop: Any, mode: str = "close", **broker: Any) -> ProxiedBroker:
        root = tmp_path / name
        root.mkdir()
        made.append(ProxiedBroker(root, drop, mode, **broker))
        return made[-1]

    yield make
    for p in made:
        p.close()


def official_produce(
    p: ProxiedBroker, topic: str, count: int, timeout_ms: int = 1500
) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, str(WORKER), "--namesrv", p.namesrv, "--topic", topic, "--count", str(count)]
        + ["--timeout", str(timeout_ms)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "HOME": str(p.root)},
        cwd=p.root,
    )
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1] == {"done": True}, out.stderr[-3000:]
    return lines


def every(n: int) -> Any:
    """Lose the answer to every ``n``-th send, once per message (a resend is answered)."""
    lost: set[str] = set()

    def drop(i: int, key: str) -> bool:
        if i % n == 1 and key not in lost:
            lost.add(key)
            return True
        return False

    return drop


def acked(lines: list[dict[str, Any]]) -> set[int]:
    return {line["i"] for line in lines if line.get("status") == 0}


@pytest.mark.slow
def test_official_client_resends_after_lost_answers_store_no_duplicates(proxied: Any) -> None:
    pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")
    count = 30
    # Control: keyed on UNIQ_KEY, the C++ client's resends (each with a new key) are stored again.
    control = proxied("control", every(4))
    lines = official_produce(control, "DedupCpp", count)
    assert acked(lines) == set(range(count))
    stored = control.bodies("DedupCpp")
    assert len(control.proxy.dropped) >= 5
    assert sum(n - 1 for n in stored.values()) == len(control.proxy.dropped)  # one copy per lost answer
    # Keyed on content: every resend is answered from the window.
    window = proxied("content", every(4), dedup_key="content")
    lines = official_produce(window, "DedupCpp", count)
    assert acked(lines) == set(range(count))  # 0 acknowledged lost
    stored = window.bodies("DedupCpp")
    assert len(window.proxy.dropped) >= 5
    assert stored == Counter({f"dd-{i}": 1 for i in range(count)})  # 0 duplicates
    # Each acknowledged answer names where the message is (the queue offset of its only copy).
    offsets = {line["i"]: line["offset"] for line in lines if line.get("status") == 0}
    assert len(offsets) == count


def test_official_client_resends_after_silent_losses_store_no_duplicates(proxied: Any) -> None:
    """The answer is swallowed and the connection stays up: the client resends after its timeout."""
    pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")
    count = 12
    window = proxied("silent", every(5), mode="silent", dedup_key="content")
    lines = official_produce(window, "DedupSilent", count, timeout_ms=800)
    assert acked(lines) == set(range(count))
    assert len(window.proxy.dropped) >= 2
    assert window.bodies("DedupSilent") == Counter({f"dd-{i}": 1 for i in range(count)})


def test_tidemq_client_resends_after_lost_answers_store_no_duplicates(proxied: Any) -> None:
    window = proxied("tidemq", every(3))

    async def produce() -> tuple[dict[str, Any], list[Any]]:
        answers: dict[str, Any] = {}
        async with Producer("dedup-pg", window.namesrv, send_timeout=5.0, retry_times=3) as producer:
            for i in range(30):
                result = await producer.send(Message("DedupPy", f"py-{i}".encode()))
                answers[f"py-{i}"] = result
            batch = [Message("DedupPy", f"pyb-{i}".encode()) for i in range(5)]
            batches = [await producer.send_batch(batch[:3]), await producer.send_batch(batch[3:])]
        return answers, batches

    answers, batches = asyncio.run(produce())
    assert len(window.proxy.dropped) >= 10
    stored = window.bodies("DedupPy")
    want = Counter({f"py-{i}": 1 for i in range(30)} | {f"pyb-{i}": 1 for i in range(5)})
    assert stored == want  # 0 duplicates, 0 acknowledged lost
    # A resend's answer is the first send's: its queue offset holds this very message.
    assert len({(r.queue.queue_id, r.queue_offset) for r in answers.values()}) == 30
    assert all(b.status.name == "SEND_OK" for b in batches)


def test_the_window_is_cheap_to_leave_on_when_nothing_is_lost(proxied: Any) -> None:
    """Nothing dropped: every message stored once, and the window holds one key per message."""
    window = proxied("clean", lambda i, k: False)

    async def produce() -> None:
        async with Producer("dedup-pg2", window.namesrv) as producer:
            for i in range(20):
                await producer.send(Message("DedupClean", f"c-{i}".encode()))

    asyncio.run(produce())
    time.sleep(0.1)
    assert window.bodies("DedupClean") == Counter({f"c-{i}": 1 for i in range(20)})
    assert not window.proxy.dropped
