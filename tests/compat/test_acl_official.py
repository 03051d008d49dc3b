"""The official RocketMQ client (``rocketmq==0.4.4``, rocketmq-client-cpp) with session
credentials against a broker running the plain ACL.

Run as a script, this file is the client worker (one scenario per process, its own HOME, as
official_client.py does):

    python test_acl_official.py produce|push|pull --namesrv A --topic T [--group G] --ak AK --sk SK --count N
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__)
CHANNEL = "ALIYUN"  # rocketmq-client-cpp sends it as OnsChannel; the broker signs over it too

# --------------------------------------------------------------------------- worker side


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value or "")


def produce(args: argparse.Namespace) -> None:
    from rocketmq.client import Message, Producer

    producer = Producer(args.group or "ACL_COMPAT_PG", timeout=5000)
    producer.set_namesrv_addr(args.namesrv)
    producer.set_session_credentials(args.ak, args.sk, CHANNEL)
    producer.start()
    try:
        for i in range(args.count):
            msg = Message(args.topic)
            msg.set_body(f"acl-{i}")
            msg.set_keys(f"key-{i}")
            msg.set_tags("TagA")
            try:
                r = producer.send_sync(msg)
                print(json.dumps({"i": i, "status": int(r.status), "msg_id": r.msg_id}), flush=True)
            except Exception as exc:  # the client raises on a broker refusal
                print(json.dumps({"i": i, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
    finally:
        producer.shutdown()


def push(args: argparse.Namespace) -> None:
    from rocketmq.client import PushConsumer

    consumer = PushConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.set_session_credentials(args.ak, args.sk, CHANNEL)
    consumer.set_thread_count(1)
    received: list[str] = []
    lock = threading.Lock()
    enough = threading.Event()

    def on_message(msg: Any) -> None:
        with lock:
            received.append(_text(msg.body))
            if len(set(received)) >= args.count:
                enough.set()

    consumer.subscribe(args.topic, on_message)
    consumer.start()
    enough.wait(args.timeout)
    with lock:
        result = json.dumps({"received": sorted(set(received)), "complete": enough.is_set()})
    # Report before shutdown: the C++ client can abort inside shutdown() (see test_official_client).
    print(result, flush=True)
    consumer.shutdown()


def pull(args: argparse.Namespace) -> None:
    from rocketmq.client import PullConsumer

    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.set_session_credentials(args.ak, args.sk, CHANNEL)
    consumer.start()
    received: list[str] = []
    deadline = time.monotonic() + args.timeout
    try:
        while time.monotonic() < deadline and len(received) < args.count:
            received.extend(_text(m.body) for m in consumer.pull(args.topic))
            if len(received) < args.count:
                time.sleep(0.2)
        print(
            json.dumps({"received": sorted(set(received)), "complete": len(received) >= args.count}),
            flush=True,
        )
    finally:
        consumer.shutdown()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["produce", "push", "pull"])
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="")
    p.add_argument("--ak", required=True)
    p.add_argument("--sk", required=True)
    p.add_argument("--count", type=int, default=5)
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    {"produce": produce, "push": push, "pull": pull}[args.scenario](args)


# --------------------------------------------------------------------------- tests

ACL = """\
accounts:
  - accessKey: compat-ak
    secretKey: compat-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - AclCompat=PUB|SUB
      - AclDenied=DENY
    groupPerms:
      - ACL_COMPAT_PG=PUB
      - ACL_COMPAT_CG=SUB
      - ACL_COMPAT_PULL=SUB
  - accessKey: compat-admin
    secretKey: compat-admin-secret
    admin: true
"""

# rocketmq-client-cpp can abort in shutdown() with this after the scenario printed its result.
KNOWN_CLIENT_SHUTDOWN_ABORT = "boost::thread_interrupted"


def finished_ok(returncode: int, stderr: str) -> bool:
    return returncode == 0 or (returncode == -6 and KNOWN_CLIENT_SHUTDOWN_ABORT in stderr)


class AclCompatCluster:
    def __init__(self, tmp: Path) -> None:
        from conftest import Server, free_port

        self.tmp = tmp
        (tmp / "plain_acl.yml").write_text(ACL)
        self.servers = [Server(["namesrv", "--listen", "127.0.0.1:0"], tmp)]
        self.namesrv = self.servers[0].addresses["namesrv"]
        (tmp / "broker.toml").write_text(
            "[broker]\n"
            'name = "broker-acl-compat"\n'
            f'listen = "127.0.0.1:{free_port()}"\n'
            f'namesrv = ["{self.namesrv}"]\n'
            f'data_dir = "{tmp / "data"}"\n'
            '[plugins]\nacl = "plain"\n'
            f'[acl.plain]\nfile = "{tmp / "plain_acl.yml"}"\n'
        )
        self.servers.append(Server(["broker", "-c", str(tmp / "broker.toml")], tmp))
        self.broker = self.servers[1].addresses["broker"]
        self.env = {**os.environ, "HOME": str(tmp)}  # the C++ client writes ~/logs/rocketmq-cpp
        for topic in ("AclCompat", "AclDenied"):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tidemq",
                    "admin",
                    "updateTopic",
                    "-t",
                    topic,
                    "-r",
                    "2",
                    "-w",
                    "2",
                    "-b",
                    self.broker,
                    "-n",
                    self.namesrv,
                    "--access-key",
                    "compat-admin",
                    "--secret-key",
                    "compat-admin-secret",
                ],  # fmt: skip
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, out.stderr

    def run(self, *args: str, timeout: float = 90) -> list[dict[str, Any]]:
        out = subprocess.run(
            [sys.executable, str(WORKER), *args, "--namesrv", self.namesrv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=self.tmp,
        )
        assert finished_ok(out.returncode, out.stderr), out.stderr[-3000:]
        return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]

    def broker_log(self) -> str:
        return self.servers[1].log_path.read_text()

    def stop(self) -> None:
        for s in reversed(self.servers):
            s.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclCompatCluster]:
    pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")
    c = AclCompatCluster(tmp_path_factory.mktemp("aclcompat"))
    yield c
    c.stop()


pytestmark = [pytest.mark.compat, pytest.mark.timeout(240)]


def test_valid_credentials_produce_then_push_and_pull_consume(cluster: AclCompatCluster) -> None:
    sent = cluster.run(
        "produce", "--topic", "AclCompat", "--ak", "compat-ak", "--sk", "compat-secret", "--count", "5"
    )
    assert [r.get("status") for r in sent] == [0] * 5, sent  # SendStatus.OK
    want = [f"acl-{i}" for i in range(5)]
    got = cluster.run(
        "push",
        "--topic",
        "AclCompat",
        "--group",
        "ACL_COMPAT_CG",
        "--ak",
        "compat-ak",
        "--sk",
        "compat-secret",
    )
    assert got[-1]["complete"] and got[-1]["received"] == want
    pulled = cluster.run(
        "pull",
        "--topic",
        "AclCompat",
        "--group",
        "ACL_COMPAT_PULL",
        "--ak",
        "compat-ak",
        "--sk",
        "compat-secret",
    )
    assert pulled[-1]["received"] == want
    assert "refused" not in cluster.broker_log()


def _lane_figures(cluster: AclCompatCluster) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", "brokerStatus", "-b", cluster.broker, "-n", cluster.namesrv]
        + ["--access-key", "compat-admin", "--secret-key", "compat-admin-secret"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    figures = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition(":")
        if key.strip().startswith("lane") and value.strip().isdigit():
            figures[key.strip()] = int(value.strip())
    return figures


def test_signed_sends_are_checked_by_the_lane_check_and_served_by_the_lane(cluster: AclCompatCluster) -> None:
    """The client's signed SEND_MESSAGE requests (AccessKey, OnsChannel, Signature) are admitted
    by the access validator's lane check and served by the compiled read lane (issue 38), from
    the bytes it wrote: its JSON headers carry numbers among the ext fields (``"queueId":0``),
    which the read lane makes strings as the decoder does."""
    before = _lane_figures(cluster)
    if before.get("laneSendRunsServed") is None:
        pytest.skip("the broker runs without the compiled lanes")
    sent = cluster.run(
        "produce", "--topic", "AclCompat", "--ak", "compat-ak", "--sk", "compat-secret", "--count", "5"
    )
    assert [r.get("status") for r in sent] == [0] * 5, sent
    after = _lane_figures(cluster)
    assert after["laneReadFramesTaken"] - before["laneReadFramesTaken"] >= 5
    assert after["laneAclAdmitted"] - before["laneAclAdmitted"] >= 5
    assert after["laneSendRunsServed"] - before["laneSendRunsServed"] >= 5
    assert after["laneSendRunsToPython"] == before["laneSendRunsToPython"]


def test_wrong_secret_is_refused(cluster: AclCompatCluster) -> None:
    sent = cluster.run(
        "produce", "--topic", "AclCompat", "--ak", "compat-ak", "--sk", "not-the-secret", "--count", "1"
    )
    assert "error" in sent[0] and "status" not in sent[0]
    assert "signature check failed for accessKey compat-ak" in cluster.broker_log()


def test_deny_topic_is_refused(cluster: AclCompatCluster) -> None:
    sent = cluster.run(
        "produce", "--topic", "AclDenied", "--ak", "compat-ak", "--sk", "compat-secret", "--count", "1"
    )
    assert "error" in sent[0] and "status" not in sent[0]
    assert "topic:AclDenied" in cluster.broker_log()


if __name__ == "__main__":
    main()
