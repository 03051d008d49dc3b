"""``consumerStatus -g G -i CLIENT -s`` (GET_CONSUMER_RUNNING_INFO with jstackEnable) for a v5
consumer behind ``tidemq proxy`` (cluster mode): a broker relays it to the proxy's connection, which
registered the client under its own id; the proxy adds to what it knows of the client the stacks
its Telemetry stream gives back for a ``PrintThreadStackTraceCommand``, as a broker's own endpoint
does (tests/test_grpc_consumer_stack.py).  Real processes (a NameServer, two brokers, the proxy);
the consumer is a raw Telemetry stream answering as RocketMQ 5's Java client."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from conftest import wait_for  # noqa: E402
from grpc_proxy_support import ProxyCluster  # noqa: E402
from test_grpc_consumer_stack import GROUP, STACK, TOPIC, consumer  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_consumer_status_shows_the_stacks_of_a_v5_consumer_behind_the_proxy(
    spawn: Any, tmp_path: Path
) -> None:
    cluster = ProxyCluster(spawn, tmp_path)
    cluster.create_topic(TOPIC)

    async def main() -> None:
        async with grpc.aio.insecure_channel(cluster.proxy) as channel:
            await asyncio.wait_for(channel.channel_ready(), 10)
            async with consumer(channel, "10.0.0.7@v5-proxy") as c:
                listed = lambda: c.client_id in cluster.admin("consumerConnection", "-g", GROUP)  # noqa: E731
                assert await asyncio.to_thread(wait_for, listed, 30)
                args = ("consumerStatus", "-g", GROUP, "-i", c.client_id)
                with_stack = await asyncio.to_thread(cluster.admin, *args, "-s")
                without = await asyncio.to_thread(cluster.admin, *args)
                assert len(c.commands) == 1 and c.commands[0].nonce
            for out in (with_stack, without):
                assert f"{'consumerGroup':<40}: {GROUP}\n" in out, out
                assert "001 Topic: StackT" in out and "SubExpression: TagA || TagB" in out
            assert with_stack.endswith("#Consumer jstack#\n" + STACK), with_stack
            assert "#Consumer jstack#" not in without

    asyncio.run(main())
