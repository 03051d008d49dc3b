"""The official RocketMQ 5 Python client (``rocketmq-python-client==5.1.2``) with ``Credentials``
through ``tidemq proxy --acl-file``: the proxy checks the client's own signature and permissions
(as RocketMQ 5's proxy does), the brokers behind it run without an ACL of their own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from grpc_proxy_support import ProxyCluster, drain
from test_grpc_official_acl import ACL
from test_grpc_proxy_official import V5_WORKER, run, v5_python  # noqa: F401

pytest.importorskip("grpc", reason="the grpc extra (grpcio) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.timeout(600)]


def test_the_proxy_lets_a_signed_v5_producer_send_and_refuses_a_wrong_secret_and_a_reader(
    v5_python: Path,  # noqa: F811
    spawn: Any,
    tmp_path: Path,
) -> None:
    (tmp_path / "plain_acl.yml").write_text(ACL)
    cluster = ProxyCluster(spawn, tmp_path, proxy_toml=f'acl_file = "{tmp_path / "plain_acl.yml"}"\n')
    cluster.create_topic("V5Acl", queues=2)

    def produce(ak: str, sk: str, prefix: str) -> list[Any]:
        args = ["produce", "--endpoints", cluster.proxy, "--topic", "V5Acl", "--count", "4"]
        return run(cluster, v5_python, *args, "--prefix", prefix, "--ak", ak, "--sk", sk)

    sent = produce("v5-producer", "v5-secret", "signed")
    assert "start_error" not in sent[0], sent
    assert sorted(line["i"] for line in sent[1:] if "message_id" in line) == [0, 1, 2, 3], sent

    wrong = produce("v5-producer", "not-the-secret", "wrong")
    assert [line.get("error") for line in wrong[1:]] == ["Exception: failed to fetch topic:V5Acl route."] * 4
    reader = produce("v5-reader", "reader-secret", "reader")  # signed right, SUB only: FORBIDDEN
    assert not [line for line in reader if "message_id" in line], reader

    log = cluster.proxy_server.log_path.read_text()
    assert "signature check failed for accessKey v5-producer" in log  # UNAUTHORIZED, and why
    assert "no permission for topic:V5Acl (accessKey v5-reader has SUB, needs PUB)" in log  # FORBIDDEN
    # Exactly the four messages of the right key reached the brokers.
    assert sorted(drain(cluster.namesrv, "V5Acl", "G_V5_ACL_PEEK")) == [
        f"signed-{i}".encode() for i in range(4)
    ]
