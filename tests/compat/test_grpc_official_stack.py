"""``consumerStatus -g G -i CLIENT -s`` (GET_CONSUMER_RUNNING_INFO with jstackEnable) for the official
RocketMQ 5 Python client's PushConsumer (PyPI ``rocketmq-python-client==5.1.2``).

The broker writes a ``PrintThreadStackTraceCommand`` on the client's Telemetry stream, as RocketMQ
5's proxy does; the 5.1.2 Python client reads only ``settings`` and
``recover_orphaned_transaction_command`` from that stream
(``rocketmq/v5/client/connection/rpc_channel.py``) and never answers.  So the admin gets the
consumer's running info without the stacks after the stack wait (5 s, under the broker's 10 s for a
client), and the consumer goes on consuming.  (A client that answers, as RocketMQ 5's Java client
does: tests/test_grpc_consumer_stack.py.)
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
TOPIC = "StackV5"
GROUP = "G_STACK5"


def test_the_official_push_consumer_gets_the_stack_command_and_does_not_answer(
    v5_python: Path, spawn: Any, tmp_path: Path
) -> None:
    cluster = GrpcCluster(spawn, tmp_path)
    run = PushConsumerRun(cluster, v5_python, TOPIC, GROUP)
    try:
        began = time.monotonic()
        status = subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", "consumerStatus", "-g", GROUP, "-i", run.client_id, "-s",
             "-n", cluster.namesrv],
            capture_output=True, text=True, timeout=60, env=cluster.env,
        )  # fmt: skip
        waited = time.monotonic() - began
        assert status.returncode == 0, status.stderr
        out = status.stdout
        assert f"{'consumerGroup':<40}: {GROUP}\n" in out and f"{'language':<40}: PYTHON\n" in out, out
        assert f"001 Topic: {TOPIC}" in out, out
        assert "#Consumer jstack#" not in out  # no stacks given: none shown
        assert 4.5 <= waited < 10  # the stack wait, not the broker's 10 s for a client
        run.goes_on_consuming()
    finally:
        run.close()
