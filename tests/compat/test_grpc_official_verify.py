"""CONSUME_MESSAGE_DIRECTLY (``tidemq admin queryMsgByUniqueKey -g -d``, the console's "resend to
consumer") to the official RocketMQ 5 Python client's PushConsumer (PyPI
``rocketmq-python-client==5.1.2``).

The broker sends it the ``VerifyMessageCommand`` on its Telemetry stream, as RocketMQ 5's proxy
does; the 5.1.2 Python client reads only ``settings`` and ``recover_orphaned_transaction_command``
from that stream (``rocketmq/v5/client/connection/rpc_channel.py``) and never answers, so the
admin gets CONSUME_MSG_TIMEOUT after the broker's 10 s wait, as from a 4.x client that does not
answer, and the consumer goes on consuming.  (A client that answers, as RocketMQ 5's Java client
does: tests/test_grpc_verify_message.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_grpc_official import GrpcCluster, grpc_server  # noqa: F401
from test_grpc_official import v5_python as v5_python_fixture

pytest.importorskip("grpc", reason="the grpc extra (grpcio) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.slow, pytest.mark.timeout(300)]

v5_python = v5_python_fixture
WORKER = Path(__file__).with_name("v5_consume_client.py")
TOPIC = "VerifyV5"
GROUP = "G_VERIFY5"


def test_the_official_push_consumer_gets_the_verify_command_and_does_not_answer(
    v5_python: Path, spawn: Any, tmp_path: Path
) -> None:
    cluster = GrpcCluster(spawn, tmp_path)
    cluster.admin("updateTopic", "-t", TOPIC, "-r", "2", "-w", "2")

    def produce(prefix: str) -> str:
        (sent,) = cluster.run(
            v5_python, WORKER, "produce", "--topic", TOPIC, "--count", "1", "--prefix", prefix,
            "--endpoints", cluster.grpc,
        )  # fmt: skip
        return str(sent["message_id"])

    first = produce("first")
    args = ["push", "--topic", TOPIC, "--group", GROUP, "--count", "2", "--wait", "120"]
    worker = subprocess.Popen(
        [str(v5_python), str(WORKER), *args, "--endpoints", cluster.grpc],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cluster.env,
        cwd=cluster.tmp,
    )
    try:
        assert worker.stdout is not None
        lines = []
        for raw in worker.stdout:
            lines.append(json.loads(raw))
            if lines[-1].get("body") == "first-0":
                break
        connection = cluster.admin("consumerConnection", "-g", GROUP)
        (client_id,) = [w for w in connection.split() if "@" in w]

        began = time.monotonic()
        resend = subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", "queryMsgByUniqueKey", "-i", first, "-t", TOPIC,
             "-g", GROUP, "-d", client_id, "-n", cluster.namesrv],
            capture_output=True, text=True, timeout=60, env=cluster.env,
        )  # fmt: skip
        waited = time.monotonic() - began
        assert resend.returncode == 1, resend.stdout
        assert "CONSUME_MSG_TIMEOUT" in resend.stderr and client_id in resend.stderr, resend.stderr
        assert waited >= 9.5  # the broker waited its 10 s for the client

        # The client is unharmed: the next message is consumed.
        produce("second")
        out, err = worker.communicate(timeout=120)
        lines += [json.loads(raw) for raw in out.splitlines() if raw.startswith("{")]
        assert lines[-1] == {"complete": True, "succeeded": 2}, (lines, err[-2000:])
        # The one delivery of first-0 was the consumer's own: the command did not make it consume.
        assert [x["body"] for x in lines if x.get("result") == "success"] == ["first-0", "second-0"]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
