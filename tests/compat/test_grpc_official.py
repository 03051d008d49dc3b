"""The official RocketMQ 5 Python client (PyPI ``rocketmq-python-client==5.1.2``) against tidemq's
gRPC endpoint, and a ``rocketmq==0.4.4`` consumer reading what it sent.

The v5 client lives in its own virtual environment (tests/compat/v5_venv.py: made once per
machine, reused after); the tests are skipped, saying why, when it cannot be made (no PyPI), and
fail instead under ``TIDEMQ_REQUIRE_SERVERS=1`` (CI).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import v5_venv
from conftest import Server, free_port

pytest.importorskip("grpc", reason="the grpc extra (grpcio) is not installed")
pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.timeout(600)]

V5_WORKER = Path(__file__).with_name("v5_client.py")
V4_WORKER = Path(__file__).with_name("official_client.py")


@pytest.fixture(scope="session")
def v5_python() -> Path:
    try:
        return v5_venv.v5_python()
    except v5_venv.Unavailable as exc:
        # As tests/conftest.py's require_server: CI (TIDEMQ_REQUIRE_SERVERS=1) never skips quietly.
        if os.environ.get("TIDEMQ_REQUIRE_SERVERS", "") not in ("", "0"):
            pytest.fail(f"TIDEMQ_REQUIRE_SERVERS is set but {exc}", pytrace=False)
        pytest.skip(str(exc))


def wait_listening(address: str, timeout: float = 20) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {address}")


#: The endpoint's HTTP/2 servers ([transport.grpc] server) every test here runs against: the
#: default (native) in the default suite, grpcio's under ``-m slow`` (the proxy's official-client
#: tests serve through grpcio's server in the default suite).
SERVERS = (pytest.param("grpcio", marks=pytest.mark.slow), "native")


@pytest.fixture(params=SERVERS, autouse=True)
def grpc_server(request: pytest.FixtureRequest) -> str:
    GrpcCluster.server = request.param
    return str(request.param)


class GrpcCluster:
    """``tidemq namesrv`` and a ``tidemq broker`` with ``[transport.grpc]``, as subprocesses."""

    server = "grpcio"

    def __init__(self, spawn: Any, tmp_path: Path, grpc_toml: str = "", broker_toml: str = "") -> None:
        self.tmp = tmp_path
        self.namesrv = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
        self.grpc = f"127.0.0.1:{free_port()}"
        (tmp_path / "broker.toml").write_text(
            "[broker]\n"
            'name = "broker-grpc"\n'
            f'listen = "127.0.0.1:{free_port()}"\n'
            f'namesrv = ["{self.namesrv}"]\n'
            f'data_dir = "{tmp_path / "data"}"\n' + broker_toml + "[transport.grpc]\n"
            f'listen = "{self.grpc}"\nserver = "{self.server}"\n' + grpc_toml
        )
        self.broker = spawn("broker", "-c", str(tmp_path / "broker.toml")).addresses["broker"]
        wait_listening(self.grpc)
        self.env = {**os.environ, "HOME": str(tmp_path)}

    def admin(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", *args, "-n", self.namesrv],
            capture_output=True,
            text=True,
            timeout=30,
            env=self.env,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    def run(self, python: Path | str, worker: Path, *args: str, timeout: float = 120) -> list[Any]:
        out = subprocess.run(
            [str(python), str(worker), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=self.tmp,
        )
        ok = out.returncode == 0 or (out.returncode == -6 and "boost::thread_interrupted" in out.stderr)
        assert ok, out.stderr[-3000:]
        return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def shared_clusters(
    tmp_path_factory: pytest.TempPathFactory, grpc_toml: str = ""
) -> Iterator[Callable[[str], GrpcCluster]]:
    """For a module fixture: one NameServer + gRPC broker per HTTP/2 server kind, made on first use
    and shared by the module's tests that neither restart it nor read broker-wide figures (each
    keeps topics and groups of its own); all stopped at the end."""
    started: list[Server] = []
    made: dict[str, GrpcCluster] = {}

    def of(kind: str) -> GrpcCluster:
        if kind not in made:
            tmp = tmp_path_factory.mktemp(f"grpc-{kind}")

            def spawn(*args: str) -> Server:
                server = Server(list(args), tmp)
                started.append(server)
                return server

            GrpcCluster.server = kind
            made[kind] = GrpcCluster(spawn, tmp, grpc_toml)
        return made[kind]

    try:
        yield of
    finally:
        for server in reversed(started):
            server.stop()


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], GrpcCluster]]:
    yield from shared_clusters(tmp_path_factory)


@pytest.fixture
def cluster(clusters: Callable[[str], GrpcCluster], grpc_server: str) -> GrpcCluster:
    """The module's shared cluster of this test's HTTP/2 server kind."""
    return clusters(grpc_server)


def test_v5_producer_sync_and_async_then_a_4x_consumer_reads_it(
    v5_python: Path, cluster: GrpcCluster
) -> None:
    cluster.admin("updateTopic", "-t", "V5Topic", "-r", "4", "-w", "4")
    lines = cluster.run(
        v5_python, V5_WORKER, "produce", "--endpoints", cluster.grpc, "--topic", "V5Topic", "--count", "20"
    )
    started, receipts = lines[0], lines[1:]
    assert started["started_s"] < 10  # the client waits 10 s for the broker's settings
    assert [r["i"] for r in receipts] == list(range(20))
    assert {r["mode"] for r in receipts} == {"sync", "async"}
    ids = {r["i"]: r["message_id"] for r in receipts}
    assert len(set(ids.values())) == 20

    got = cluster.run(
        sys.executable,
        V4_WORKER,
        "pull",
        "--namesrv",
        cluster.namesrv,
        "--topic",
        "V5Topic",
        "--group",
        "G_V4_READS_V5",
        "--count",
        "20",
        "--timeout",
        "60",
    )[-1]
    assert got["complete"], got
    by_body = {r["body"]: r for r in got["received"]}
    assert sorted(by_body) == sorted(f"v5-{i}" for i in range(20))
    for i in range(20):
        record = by_body[f"v5-{i}"]
        assert record["topic"] == "V5Topic"
        assert record["tags"] == ("TagA" if i % 2 == 0 else "TagB")
        assert record["keys"] == f"key-{i}"
        assert record["props"] == {"idx": str(i), "color": "blue"}
        assert record["id"] == ids[i]  # the v5 client's message id is the message's id for 4.x too


def test_the_v5_example_sends_sync_and_async(v5_python: Path, cluster: GrpcCluster) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "v5_client.py"
    out = subprocess.run(
        # The receive half: tests/compat/test_grpc_standalone.py.
        [str(v5_python), str(example), "--endpoints", cluster.grpc, "--topic", "orders", "--no-receive"],
        capture_output=True,
        text=True,
        timeout=120,
        env=cluster.env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("sync send: message id ") and lines[1].startswith("async send: message id ")


def test_v5_fifo_messages_of_one_group_reach_a_4x_consumer_in_order(
    v5_python: Path, cluster: GrpcCluster
) -> None:
    cluster.admin("updateTopic", "-t", "V5Fifo", "-r", "4", "-w", "4", "-a", "+message.type=FIFO")
    sent = cluster.run(
        v5_python,
        V5_WORKER,
        "produce",
        "--endpoints",
        cluster.grpc,
        "--topic",
        "V5Fifo",
        "--count",
        "12",
        "--message-group",
        "order-42",
    )[1:]
    assert [s["mode"] for s in sent] == ["fifo"] * 12
    assert [s["offset"] for s in sent] == list(range(12))  # one group, one queue, in send order
    got = cluster.run(
        sys.executable,
        V4_WORKER,
        "pull",
        "--namesrv",
        cluster.namesrv,
        "--topic",
        "V5Fifo",
        "--group",
        "G_V4_FIFO",
        "--count",
        "12",
        "--timeout",
        "60",
    )[-1]
    assert got["complete"], got
    received = got["received"]
    assert len({r["queue_id"] for r in received}) == 1
    assert [r["body"] for r in sorted(received, key=lambda r: r["queue_offset"])] == [
        f"v5-{i}" for i in range(12)
    ]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_v5_producer_over_tls(v5_python: Path, spawn: Any, tmp_path: Path) -> None:
    from test_tls_verification import make_certs

    certs = make_certs(tmp_path)
    tls = f'tls_certfile = "{certs["good"]}"\ntls_keyfile = "{certs["good_key"]}"\n'
    cluster = GrpcCluster(spawn, tmp_path, tls)
    cluster.env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(certs["ca"])  # the client trusts our CA
    lines = cluster.run(
        v5_python,
        V5_WORKER,
        "produce",
        "--endpoints",
        cluster.grpc,
        "--topic",
        "V5Tls",
        "--count",
        "4",
        "--tls",
    )
    assert [line["i"] for line in lines[1:]] == [0, 1, 2, 3]


def test_what_a_4x_producer_sent_is_pulled_over_grpc_with_its_id_tag_keys_and_properties(
    cluster: GrpcCluster,
) -> None:
    # The reverse direction, as far as the v5 clients can go without POP: the v5 pull RPC.
    import asyncio

    import grpc

    from tidemq_transport_grpc.proto import load

    pb = load()
    cluster.admin("updateTopic", "-t", "V4ToV5", "-r", "1", "-w", "1")
    sent = cluster.run(
        sys.executable,
        V4_WORKER,
        "produce",
        "--namesrv",
        cluster.namesrv,
        "--topic",
        "V4ToV5",
        "--count",
        "5",
    )
    assert [s["status"] for s in sent] == [0] * 5

    async def pull() -> list[Any]:
        async with grpc.aio.insecure_channel(cluster.grpc) as channel:
            stream = channel.unary_stream(
                "/apache.rocketmq.v2.MessagingService/PullMessage",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.PullMessageResponse.FromString,
            )
            request = pb.PullMessageRequest(
                group=pb.Resource(name="G_V5_PULL"),
                message_queue=pb.MessageQueue(topic=pb.Resource(name="V4ToV5"), id=0),
                offset=0,
                batch_size=32,
            )
            answers = [a async for a in stream(request, timeout=10)]
            return [a.message for a in answers if a.WhichOneof("content") == "message"]

    messages = asyncio.run(pull())
    assert [m.body for m in messages] == [f"msg-{i}".encode() for i in range(5)]
    for i, (message, receipt) in enumerate(zip(messages, sent, strict=True)):
        system = message.system_properties
        assert system.message_id == receipt["msg_id"]  # the 4.x client's id, as its consumers see it
        assert system.tag == ("TagA" if i % 2 == 0 else "TagB")
        assert list(system.keys) == [f"key-{i}", "shared"]
        # RocketMQ's own properties (UNIQ_KEY, WAIT, CLUSTER, ...) are not user properties.
        assert dict(message.user_properties) == {"idx": str(i), "color": "blue"}
        assert system.queue_offset == i


def test_v5_transactions_commit_roll_back_and_are_checked_then_a_4x_consumer_reads_the_committed(
    v5_python: Path, spawn: Any, tmp_path: Path
) -> None:
    # Checks every second, of half messages older than a second: the unknown one is checked soon.
    cluster = GrpcCluster(
        spawn, tmp_path, broker_toml="transaction_check_interval_s = 1.0\ntransaction_timeout_s = 1.0\n"
    )
    cluster.admin("updateTopic", "-t", "V5Tx", "-r", "1", "-w", "1", "-a", "+message.type=TRANSACTION")
    lines = cluster.run(
        v5_python,
        V5_WORKER,
        "transaction",
        "--endpoints",
        cluster.grpc,
        "--topic",
        "V5Tx",
        "--actions",
        "commit,rollback,unknown,commit",
        "--wait",
        "60",
    )
    sends = [line for line in lines if "action" in line]
    checks = [line for line in lines if "checked" in line]
    assert [s["action"] for s in sends] == ["commit", "rollback", "unknown", "commit"]
    assert all(s["transaction_id"] for s in sends)
    unknown = sends[2]
    # The broker's check reached the producer's Telemetry stream, for the unknown one only.
    assert {c["checked"] for c in checks} == {unknown["message_id"]}, lines
    assert checks[0]["body"] == "v5-unknown-2"

    got = cluster.run(
        sys.executable,
        V4_WORKER,
        "pull",
        "--namesrv",
        cluster.namesrv,
        "--topic",
        "V5Tx",
        "--group",
        "G_V4_READS_V5_TX",
        "--count",
        "3",
        "--timeout",
        "60",
    )[-1]
    assert got["complete"], got
    by_body = {r["body"]: r for r in got["received"]}
    # Committed ones and the one committed on check; the rolled-back one never reaches consumers.
    assert sorted(by_body) == ["v5-commit-0", "v5-commit-3", "v5-unknown-2"]
    ids = {s["i"]: s["message_id"] for s in sends}
    for i, body in ((0, "v5-commit-0"), (2, "v5-unknown-2"), (3, "v5-commit-3")):
        record = by_body[body]
        assert record["id"] == ids[i] and record["tags"] == "TxTag" and record["keys"] == f"key-{i}"
        assert record["props"]["idx"] == str(i)
