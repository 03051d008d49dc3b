"""``tidemq proxy --acl-file``: the proxy checks RocketMQ 5 clients' signatures and permissions
itself, as RocketMQ 5's proxy does (unsigned or badly signed: UNAUTHORIZED; no permission:
FORBIDDEN), in front of brokers it reaches with its own account.  Real processes, raw calls; the
official client's proof is in tests/compat/test_grpc_proxy_official_acl.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from grpc_proxy_support import ProxyCluster, drain  # noqa: E402
from test_grpc_acl import ACL, ADMIN, CONSUMER, PRODUCER, UNSIGNED, signed  # noqa: E402
from test_grpc_proxy import call, message  # noqa: E402

from tidemq_transport_grpc.proto import load  # noqa: E402

pb = load()
pytestmark = pytest.mark.timeout(300)


def test_the_proxy_checks_v5_signatures_and_permissions_with_its_acl_file(spawn: Any, tmp_path: Path) -> None:
    (tmp_path / "plain_acl.yml").write_text(ACL)
    cluster = ProxyCluster(spawn, tmp_path, proxy_toml=f'acl_file = "{tmp_path / "plain_acl.yml"}"\n')
    cluster.create_topic("Orders")
    cluster.create_topic("Secret")

    async def main() -> None:
        async with grpc.aio.insecure_channel(cluster.proxy) as channel:
            route = call(channel, "QueryRoute", "QueryRouteResponse")
            send = call(channel, "SendMessage", "SendMessageResponse")

            async def route_of(topic: str, metadata: Any) -> int:
                answer = await route(pb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=metadata)
                return int(answer.status.code)

            async def send_one(body: bytes, metadata: Any, topic: str = "Orders") -> int:
                answer = await send(pb.SendMessageRequest(messages=[message(topic, body)]), metadata=metadata)
                return int(answer.status.code)

            # Signed with a known key, and allowed: served.
            assert await route_of("Orders", PRODUCER) == pb.OK
            assert await send_one(b"signed", PRODUCER) == pb.OK
            assert await route_of("Secret", ADMIN) == pb.OK
            # Unsigned, a wrong secret, an unknown key: UNAUTHORIZED.
            assert await route_of("Orders", UNSIGNED) == pb.UNAUTHORIZED
            assert await send_one(b"unsigned", UNSIGNED) == pb.UNAUTHORIZED
            assert await send_one(b"wrong", signed("producer-ak", "not-the-secret")) == pb.UNAUTHORIZED
            assert await send_one(b"nobody", signed("nobody-ak", "x")) == pb.UNAUTHORIZED
            # Signed right without the permission: FORBIDDEN (SUB only; a DENY topic).
            assert await send_one(b"reader", CONSUMER) == pb.FORBIDDEN
            assert await route_of("Secret", PRODUCER) == pb.FORBIDDEN

    asyncio.run(main())
    # Only the allowed send reached the brokers.
    assert sorted(drain(cluster.namesrv, "Orders", "G_ACL_PEEK")) == [b"signed"]
    log = cluster.proxy_server.log_path.read_text()
    assert "signature check failed for accessKey producer-ak" in log  # the proxy says why
    assert "no permission for topic:Secret (accessKey producer-ak has DENY, needs PUB or SUB)" in log
    assert "not-the-secret" not in log and "producer-secret" not in log  # never a secret


def test_a_proxy_acl_file_that_cannot_be_read_stops_the_start_with_its_reason(tmp_path: Path) -> None:
    (tmp_path / "broken.yml").write_text("accounts: [\n")
    for path in (tmp_path / "missing.yml", tmp_path / "broken.yml"):
        out = subprocess.run(
            [sys.executable, "-m", "tidemq", "proxy", "-n", "127.0.0.1:9876", "--listen", "127.0.0.1:0"]
            + ["--acl-file", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0
        assert str(path.name) in out.stderr, out.stderr[-2000:]
        assert "Traceback" not in out.stderr, out.stderr[-2000:]
