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

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_grpc_official import GrpcCluster, grpc_server  # noqa: F401
from test_grpc_official import v5_python as v5_python_fixture
from v5_push_run import PushConsumerRun

pytest.importorskip("grpc", reason="the grpc extra (grpcio) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.slow, pytest.mark.timeout(300)]

v5_python = v5_python_fixture
TOPIC = "VerifyV5"
GROUP = "G_VERIFY5"


def test_the_official_push_consumer_gets_the_verify_command_and_does_not_answer(
    v5_python: Path, spawn: Any, tmp_path: Path
) -> None:
    cluster = GrpcCluster(spawn, tmp_path)
    run = PushConsumerRun(cluster, v5_python, TOPIC, GROUP)
    try:
        began = time.monotonic()
        resend = subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", "queryMsgByUniqueKey", "-i", run.first, "-t", TOPIC,
             "-g", GROUP, "-d", run.client_id, "-n", cluster.namesrv],
            capture_output=True, text=True, timeout=60, env=cluster.env,
        )  # fmt: skip
        waited = time.monotonic() - began
        assert resend.returncode == 1, resend.stdout
        assert "CONSUME_MSG_TIMEOUT" in resend.stderr and run.client_id in resend.stderr, resend.stderr
        assert waited >= 9.5  # the broker waited its 10 s for the client
        run.goes_on_consuming()
    finally:
        run.close()
