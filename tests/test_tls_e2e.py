"""TLS end to end: a NameServer and a broker configured with ``[transport.tcp] tls = true``
(mutual TLS: certificates from one CA, made here with the ``openssl`` command), tidemq's client
producing and consuming through both, and clients without the right keys refused cleanly."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Server, free_port

from tidemq.client import ClientError, Message, Producer, PullConsumer, PullStatus
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.errors import RemotingError, RemotingTimeoutError

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command"),
]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
             "-days", "2", "-subj", f"/CN={name}")  # fmt: skip
    return crt, key


def make_cert(d: Path, name: str, ca: tuple[Path, Path]) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1/localhost signed by ``ca``."""
    crt, key, csr, ext = d / f"{name}.crt", d / f"{name}.key", d / f"{name}.csr", d / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}"
    )
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-out", str(crt), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return crt, key


class TlsCluster:
    """A TLS NameServer and broker (separate processes), all certificates from one CA."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ca = make_ca(tmp, "ca")
        self.server_cert = make_cert(tmp, "server", self.ca)
        self.client_cert = make_cert(tmp, "client", self.ca)
        self.wrong_ca = make_ca(tmp, "wrong-ca")
        self.stranger_cert = make_cert(tmp, "stranger", self.wrong_ca)
        tls = (
            "[transport.tcp]\n"
            "tls = true\n"
            f'tls_certfile = "{self.server_cert[0]}"\n'
            f'tls_keyfile = "{self.server_cert[1]}"\n'
            f'tls_cafile = "{self.ca[0]}"\n'  # servers ask clients for a certificate from this CA
            "tls_check_hostname = true\n"
        )
        (tmp / "namesrv.toml").write_text(tls)
        self.servers: list[Server] = []
        ns = Server(["namesrv", "-c", str(tmp / "namesrv.toml"), "--listen", "127.0.0.1:0"], tmp)
        self.servers.append(ns)
        self.namesrv = ns.addresses["namesrv"]
        (tmp / "broker.toml").write_text(
            "[broker]\n"
            'name = "broker-tls"\n'
            f'listen = "127.0.0.1:{free_port()}"\n'
            f'namesrv = ["{self.namesrv}"]\n'
            f'data_dir = "{tmp / "data"}"\n' + tls
        )
        broker = Server(["broker", "-c", str(tmp / "broker.toml")], tmp)
        self.servers.append(broker)
        self.broker = broker.addresses["broker"]
        self.broker_server = broker
        self.namesrv_server = ns

    def client_tls(self, **override: Any) -> dict[str, Any]:
        opts = {
            "tls": True,
            "tls_cafile": str(self.ca[0]),
            "tls_certfile": str(self.client_cert[0]),
            "tls_keyfile": str(self.client_cert[1]),
            "tls_check_hostname": True,
        }
        opts.update(override)
        return opts

    def stop(self) -> None:
        for s in reversed(self.servers):
            s.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    c = TlsCluster(tmp_path_factory.mktemp("tls"))
    yield c
    c.stop()


async def _route(addr: str, **transport_options: Any) -> RemotingCommand:
    client = get_plugin_manager().create("transport", "tcp", options=transport_options).client()
    try:
        req = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
        return await client.invoke(addr, req, 3.0)
    finally:
        await client.close()


def route(addr: str, **transport_options: Any) -> RemotingCommand:
    return asyncio.run(_route(addr, **transport_options))


async def _round_trip(c: TlsCluster, topic: str, n: int) -> list[bytes]:
    tls = c.client_tls()
    bodies = [f"tls-{i}".encode() for i in range(n)]
    async with Producer("tls-pg", namesrv=c.namesrv, transport_options=tls) as producer:
        for b in bodies:
            assert (await producer.send(Message(topic, b))).status.name == "SEND_OK"
    got: list[bytes] = []
    async with PullConsumer("tls-cg", namesrv=c.namesrv, transport_options=tls) as consumer:
        queues = await consumer.fetch_subscribe_queues(topic)
        offsets = dict.fromkeys(queues, 0)
        deadline = time.monotonic() + 15
        while len(got) < n and time.monotonic() < deadline:
            for mq in queues:
                result = await consumer.pull(mq, "*", offsets[mq], 32)
                if result.status is PullStatus.FOUND:
                    got.extend(m.body for m in result.messages)
                offsets[mq] = result.next_begin_offset
    return got


def test_client_produces_and_consumes_over_tls_through_namesrv_and_broker(cluster: TlsCluster) -> None:
    got = asyncio.run(_round_trip(cluster, "TlsTopic", 20))
    assert sorted(got) == sorted(f"tls-{i}".encode() for i in range(20))


def test_plaintext_client_is_refused_and_the_servers_keep_serving(cluster: TlsCluster) -> None:
    for addr in (cluster.namesrv, cluster.broker):
        with pytest.raises(RemotingError) as err:
            route(addr)
        # The server closes the connection when the handshake fails: no hang until the timeout.
        assert not isinstance(err.value, RemotingTimeoutError), err.value
    assert route(cluster.namesrv, **cluster.client_tls()).code in (
        ResponseCode.SUCCESS,
        ResponseCode.TOPIC_NOT_EXIST,
    )
    assert cluster.namesrv_server.proc.poll() is None and cluster.broker_server.proc.poll() is None
    assert "Traceback" not in cluster.broker_server.log_path.read_text()


def test_a_server_from_another_ca_is_not_trusted(cluster: TlsCluster) -> None:
    with pytest.raises(RemotingError) as err:
        route(cluster.namesrv, **cluster.client_tls(tls_cafile=str(cluster.wrong_ca[0])))
    assert "CERTIFICATE_VERIFY_FAILED" in str(err.value) or "certificate" in str(err.value).lower()


def test_a_client_certificate_from_another_ca_is_refused(cluster: TlsCluster) -> None:
    stranger = cluster.client_tls(
        tls_certfile=str(cluster.stranger_cert[0]), tls_keyfile=str(cluster.stranger_cert[1])
    )
    with pytest.raises(RemotingError):
        route(cluster.broker, **stranger)
    no_cert = cluster.client_tls(tls_certfile="", tls_keyfile="")
    with pytest.raises(RemotingError):
        route(cluster.broker, **no_cert)
    assert route(cluster.broker, **cluster.client_tls()).code != ResponseCode.SYSTEM_ERROR


def test_a_producer_with_the_wrong_ca_fails_with_a_clear_error(cluster: TlsCluster) -> None:
    async def main() -> None:
        tls = cluster.client_tls(tls_cafile=str(cluster.wrong_ca[0]))
        async with Producer("tls-bad", namesrv=cluster.namesrv, transport_options=tls) as producer:
            await producer.send(Message("TlsTopic", b"never"), timeout=3)

    with pytest.raises(ClientError) as err:
        asyncio.run(main())
    assert "certificate" in str(err.value).lower() or "CERTIFICATE" in str(err.value)


def test_admin_works_over_tls_with_the_tls_flags(cluster: TlsCluster) -> None:
    tls = [
        "--tls-cafile",
        str(cluster.ca[0]),
        "--tls-certfile",
        str(cluster.client_cert[0]),
        "--tls-keyfile",
        str(cluster.client_cert[1]),
    ]
    base = [sys.executable, "-m", "tidemq", "admin"]
    ok = subprocess.run(
        [*base, "updateTopic", "-t", "TlsAdmin", "-b", cluster.broker, "-n", cluster.namesrv, *tls],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    listed = subprocess.run(
        [*base, "topicList", "-n", cluster.namesrv, *tls], capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0 and "TlsAdmin" in listed.stdout
    plain = subprocess.run(
        [*base, "topicList", "-n", cluster.namesrv], capture_output=True, text=True, timeout=60
    )
    assert plain.returncode == 1 and len(plain.stderr.strip().splitlines()) == 1
