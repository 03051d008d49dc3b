"""The official RocketMQ 5 Python PushConsumer (``v5_consume_client.py push``) consuming one topic of
a :class:`GrpcCluster`, for tests that send its client an operator's request meanwhile."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("v5_consume_client.py")


class PushConsumerRun:
    """A topic made, ``first`` produced, a PushConsumer of ``group`` started and seen consuming it,
    and its client id (from ``consumerConnection``); :meth:`goes_on_consuming` checks it is
    unharmed afterwards; :meth:`close` kills it if it still runs."""

    def __init__(self, cluster: Any, v5_python: Path, topic: str, group: str) -> None:
        self.cluster, self.v5_python, self.topic = cluster, v5_python, topic
        cluster.admin("updateTopic", "-t", topic, "-r", "2", "-w", "2")
        self.first = self.produce("first")
        args = ["push", "--topic", topic, "--group", group, "--count", "2", "--wait", "120"]
        self.worker = subprocess.Popen(
            [str(v5_python), str(WORKER), *args, "--endpoints", cluster.grpc],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cluster.env,
            cwd=cluster.tmp,
        )
        try:
            assert self.worker.stdout is not None
            self.lines: list[dict[str, Any]] = []
            for raw in self.worker.stdout:
                self.lines.append(json.loads(raw))
                if self.lines[-1].get("body") == "first-0":
                    break
            connection = cluster.admin("consumerConnection", "-g", group)
            (self.client_id,) = [w for w in connection.split() if "@" in w]
        except BaseException:
            self.close()
            raise

    def produce(self, prefix: str) -> str:
        """One message ``<prefix>-0`` sent by the official producer: its message id."""
        (sent,) = self.cluster.run(
            self.v5_python, WORKER, "produce", "--topic", self.topic, "--count", "1", "--prefix", prefix,
            "--endpoints", self.cluster.grpc,
        )  # fmt: skip
        return str(sent["message_id"])

    def goes_on_consuming(self) -> None:
        """The client is unharmed: the next message is consumed, and each message once (an
        operator's request did not make it consume ``first`` again)."""
        self.produce("second")
        out, err = self.worker.communicate(timeout=120)
        self.lines += [json.loads(raw) for raw in out.splitlines() if raw.startswith("{")]
        assert self.lines[-1] == {"complete": True, "succeeded": 2}, (self.lines, err[-2000:])
        assert [x["body"] for x in self.lines if x.get("result") == "success"] == ["first-0", "second-0"]

    def close(self) -> None:
        if self.worker.poll() is None:
            self.worker.kill()
            self.worker.wait()
