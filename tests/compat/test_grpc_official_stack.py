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
TOPIC = "StackV5"
GROUP = "G_STACK5"


def test_the_official_push_consumer_gets_the_stack_command_and_does_not_answer(
    v5_python: Path, spawn: Any, tmp_path: Path
) -> None:
    cluster = GrpcCluster(spawn, tmp_path)
    cluster.admin("updateTopic", "-t", TOPIC, "-r", "2", "-w", "2")

    def produce(prefix: str) -> None:
        cluster.run(
            v5_python, WORKER, "produce", "--topic", TOPIC, "--count", "1", "--prefix", prefix,
            "--endpoints", cluster.grpc,
        )  # fmt: skip

    produce("first")
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
        status = subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", "consumerStatus", "-g", GROUP, "-i", client_id, "-s",
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

        # The client is unharmed: the next message is consumed.
        produce("second")
        rest, err = worker.communicate(timeout=120)
        lines += [json.loads(raw) for raw in rest.splitlines() if raw.startswith("{")]
        assert lines[-1] == {"complete": True, "succeeded": 2}, (lines, err[-2000:])
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
