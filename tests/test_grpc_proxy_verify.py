"""CONSUME_MESSAGE_DIRECTLY to a v5 consumer behind ``tidemq proxy`` (cluster mode): the broker that
stored the message relays it to the proxy's connection, which registered the client under its own
id; the proxy hands it to that client's Telemetry stream as a ``VerifyMessageCommand`` and answers
with its ``VerifyMessageResult``, as in a broker's own endpoint (tests/test_grpc_verify_message.py).
Real processes (a NameServer, two brokers, the proxy); the consumer is a raw Telemetry stream."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from conftest import wait_for  # noqa: E402
from grpc_proxy_support import ProxyCluster  # noqa: E402
from test_grpc_verify_message import GROUP, TOPIC, consumer, send_one  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_consume_directly_reaches_a_v5_consumer_behind_the_proxy(spawn: Any, tmp_path: Path) -> None:
    cluster = ProxyCluster(spawn, tmp_path)
    cluster.create_topic(TOPIC)

    def resend(message_id: str, client_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", "queryMsgByUniqueKey", "-i", message_id, "-t", TOPIC,
             "-g", GROUP, "-d", client_id, "-n", cluster.namesrv],
            capture_output=True, text=True, timeout=60, env=cluster.env,
        )  # fmt: skip

    async def main() -> None:
        async with grpc.aio.insecure_channel(cluster.proxy) as channel:
            await asyncio.wait_for(channel.channel_ready(), 10)
            await send_one(channel, "01VERIFY00000000000000000000000003", b"via the proxy")
            for client_id, answer, expected in (
                ("10.0.0.5@v5-proxy", "OK", "consumeResult=CR_SUCCESS, remark=from gRPC client"),
                ("10.0.0.6@v5-proxy", "FAILED_TO_CONSUME_MESSAGE", "consumeResult=CR_LATER"),
            ):
                async with consumer(channel, client_id, answer) as c:
                    listed = lambda cid=client_id: cid in cluster.admin("consumerConnection", "-g", GROUP)  # noqa: E731
                    assert await asyncio.to_thread(wait_for, listed, 30)
                    out = await asyncio.to_thread(resend, "01VERIFY00000000000000000000000003", client_id)
                    assert out.returncode == 0, out.stderr
                    assert expected in out.stdout, out.stdout
                    assert [m.message.body for m in c.commands] == [b"via the proxy"]
            gone = await asyncio.to_thread(resend, "01VERIFY00000000000000000000000003", "10.0.0.9@nobody")
            assert gone.returncode == 1 and "not online" in gone.stderr, gone.stderr

    asyncio.run(main())
