"""tidemq's client and the official client (``rocketmq==0.4.4``) on the same topic, both ways.

The cluster runs in-process (see test_client_e2e); the official client runs in its own process
through tests/compat/official_client.py, which prints what it sent or received as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_client_e2e import Cluster, create_topic, push_consumer, unique, wait_for

from tidemq.client import Message, MessageExt, Producer

pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")
pytestmark = [pytest.mark.compat, pytest.mark.timeout(180)]

WORKER = Path(__file__).parent / "compat" / "official_client.py"


def fields(i: int, prefix: str = "msg") -> dict[str, Any]:
    """What official_client.py sends as message i (and what we send for it to check)."""
    return {
        "body": f"{prefix}-{i}",
        "keys": f"key-{i} shared",
        "tags": "TagA" if i % 2 == 0 else "TagB",
        "props": {"idx": str(i), "color": "blue"},
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = Cluster(tmp_path_factory.mktemp("compat"))
    try:
        c.run(c.start_namesrv())
        c.run(c.start_broker("broker-a"))
        yield c
    finally:
        c.run(c.stop())
        c.loop.stop()


def official(cluster: Cluster, *args: str, timeout: float = 90) -> list[Any]:
    env = {**os.environ, "HOME": str(cluster.tmp)}  # the C++ client writes ~/logs/rocketmq-cpp
    out = subprocess.run(
        [sys.executable, str(WORKER), *args, "--namesrv", cluster.ns],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cluster.tmp,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_official_producer_to_tidemq_push_consumer(cluster: Cluster) -> None:
    topic = unique("CompatIn")
    cluster.run(create_topic(cluster.ns, cluster.brokers["broker-a"].address, topic))
    sent = official(cluster, "produce", "--topic", topic, "--count", "10")
    assert [s["status"] for s in sent] == [0] * 10
    (batch,) = official(
        cluster, "produce", "--topic", topic, "--count", "4", "--start", "10", "--mode", "batch"
    )
    assert batch["status"] == 0, batch

    async def consume() -> list[MessageExt]:
        got: list[MessageExt] = []
        c = push_consumer(cluster.ns, unique("CG"), topic)
        c.register_listener(lambda msgs: got.extend(msgs))
        await c.start()
        try:
            await wait_for(lambda: len(got) >= 14, what="14 messages from the official producer")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}; got {sorted((m.queue_id, m.queue_offset, m.body) for m in got)}"
            ) from None
        finally:
            await c.shutdown()
        return got

    got = cluster.run(consume())
    by_body = {m.body.decode(): m for m in got}
    assert sorted(by_body) == sorted(fields(i)["body"] for i in range(14))
    for i in range(14):
        m, want = by_body[fields(i)["body"]], fields(i)
        assert (m.topic, " ".join(m.keys), m.tags) == (topic, want["keys"], want["tags"])
        assert {k: m.properties[k] for k in want["props"]} == want["props"]
    uniq = {s["msg_id"] for s in sent}
    assert uniq <= {m.uniq_key for m in got}  # the official client's UNIQ_KEY ids survive


def test_tidemq_producer_to_official_push_consumer(cluster: Cluster) -> None:
    topic = unique("CompatOut")

    async def produce() -> None:
        async with Producer(unique("PG"), cluster.ns) as p:
            for i in range(8):
                f = fields(i)
                await p.send(
                    Message(topic, f["body"].encode(), tags=f["tags"], keys=f["keys"], properties=f["props"])
                )
            f8, f9 = fields(8), fields(9)
            await p.send_batch(
                [
                    Message(topic, f["body"].encode(), tags=f["tags"], keys=f["keys"], properties=f["props"])
                    for f in (f8, f9)
                ]
            )
            # A compressed (zlib) body must be readable by a 4.x consumer too.
            f10 = fields(10)
            big = Message(
                topic, f10["body"].encode(), tags=f10["tags"], keys=f10["keys"], properties=f10["props"]
            )
            p.compress_over = 1  # force compression of this small body
            r = await p.send(big)
            assert r.status.value == "SEND_OK"

    cluster.run(produce())
    got = official(
        cluster, "push", "--topic", topic, "--group", unique("OG"), "--count", "11", "--timeout", "60"
    )[-1]
    assert got["complete"]
    by_body = {r["body"]: r for r in got["received"]}
    assert sorted(by_body) == sorted(fields(i)["body"] for i in range(11))
    for i in range(11):
        want, rec = fields(i), by_body[fields(i)["body"]]
        assert (rec["topic"], rec["keys"], rec["tags"], rec["props"]) == (
            topic,
            want["keys"],
            want["tags"],
            want["props"],
        )
