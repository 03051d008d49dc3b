"""The official RocketMQ 5 Python client (``rocketmq-python-client==5.1.2``) configured with
``Credentials`` against a broker running the plain ACL and the gRPC endpoint: the client's own
signature (``MQv2-HMAC-SHA1`` over ``x-mq-date-time``) lets the right key send, and the broker
refuses a wrong secret and a key without PUB."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_grpc_official import V5_WORKER, GrpcCluster, grpc_server, v5_python  # noqa: F401

pytest.importorskip("grpc", reason="the grpc extra (grpcio) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.timeout(600)]

ACL = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: v5-producer
    secretKey: v5-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - V5Acl=PUB
  - accessKey: v5-reader
    secretKey: reader-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - V5Acl=SUB
  - accessKey: v5-app-ak
    secretKey: v5-app-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - V5Acl=PUB|SUB
    groupPerms:
      - acl-consumers=SUB
  - accessKey: ops-admin
    secretKey: ops-secret
    admin: true
"""


def test_v5_client_credentials_sign_its_calls_and_the_acl_checks_them(
    v5_python: Path,  # noqa: F811
    spawn: Any,
    tmp_path: Path,
) -> None:
    (tmp_path / "plain_acl.yml").write_text(ACL)
    cluster = GrpcCluster(
        spawn,
        tmp_path,
        broker_toml=f'[plugins]\nacl = "plain"\n[acl.plain]\nfile = "{tmp_path / "plain_acl.yml"}"\n',
    )
    ops = ("--access-key", "ops-admin", "--secret-key", "ops-secret")
    cluster.admin("updateTopic", "-t", "V5Acl", "-r", "2", "-w", "2", *ops)

    def produce(ak: str, sk: str) -> list[Any]:
        return cluster.run(
            v5_python,
            V5_WORKER,
            "produce",
            "--endpoints",
            cluster.grpc,
            "--topic",
            "V5Acl",
            "--count",
            "4",
            "--ak",
            ak,
            "--sk",
            sk,
            timeout=180,
        )

    sent = produce("v5-producer", "v5-secret")
    assert "start_error" not in sent[0], sent
    assert sorted(line["i"] for line in sent[1:] if "message_id" in line) == [0, 1, 2, 3], sent

    def refusals() -> str:
        return "".join(p.read_text() for p in tmp_path.glob("broker-*.log"))

    wrong = produce("v5-producer", "not-the-secret")
    assert [line.get("error") for line in wrong[1:]] == ["Exception: failed to fetch topic:V5Acl route."] * 4
    # The client reports only that the route failed; the broker logged why (UNAUTHORIZED).
    assert "refused gRPC QueryRoute" in refusals()
    assert "signature check failed for accessKey v5-producer" in refusals()

    reader = produce("v5-reader", "reader-secret")  # signed right, but SUB only: FORBIDDEN
    assert not [line for line in reader if "message_id" in line], reader
    assert "no permission for topic:V5Acl (accessKey v5-reader has SUB, needs PUB)" in refusals()

    # Exactly the four messages of the right key were stored.
    status = cluster.admin("topicStatus", "-t", "V5Acl", *ops)
    assert sum(int(line.split()[3]) for line in status.splitlines()[1:] if line.strip()) == 4, status

    # Consuming signed too: examples/v5_client.py sends two messages, then its SimpleConsumer of
    # a group the account may consume as receives and acks them.
    example = Path(__file__).resolve().parents[2] / "examples" / "v5_client.py"
    args = ["--endpoints", cluster.grpc, "--topic", "V5Acl", "--group", "acl-consumers", "--timeout", "30"]
    out = subprocess.run(
        [str(v5_python), str(example), *args, "--ak", "v5-app-ak", "--sk", "v5-app-secret"],
        capture_output=True,
        text=True,
        timeout=180,
        env=cluster.env,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert sum(line.startswith("received and acked: ") for line in out.stdout.splitlines()) >= 2
    assert "refused gRPC ReceiveMessage" not in refusals()
