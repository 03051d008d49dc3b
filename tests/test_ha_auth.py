"""HA handshake authentication with a shared secret (issue 25): real stores, loopback sockets, no broker.

Without the secret nobody who merely reaches the HA port can pose as a slave (and report offsets it
does not hold, so that a SYNC master acknowledges sends no replica has) or as a master (and feed a
slave bytes).  Sessions without a secret are covered, unchanged, by test_ha_stream.py and
test_ha_epoch_wire.py.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_ha_epoch_wire import Rig as AuthRig
from test_ha_epoch_wire import closed_by_peer, log_bytes, put, raw_hello, wait_for

from tidemq.config import check_broker, load_config
from tidemq.errors import ConfigError
from tidemq_ha_replication.wire import (
    AUTH_REQUIRED,
    AUTH_SCHEME,
    HELLO_MAGIC,
    KEY_CONTEXT,
    REPORT,
    auth_mac,
    encode_hello,
    read_hello_body,
    recv_exact,
)

OPTS = {"commitlog_file_size": 64 * 1024, "consumequeue_entries": 64}
E = 7
SECRET = b"correct horse battery staple 2026"


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[AuthRig]:
    r = AuthRig(tmp_path)
    yield r
    r.close()


def key_of(secret: bytes) -> bytes:
    import blake3

    return blake3.blake3(secret, derive_key_context=KEY_CONTEXT).digest()


@pytest.mark.parametrize("epoch", [None, E], ids=["master_slave", "epoch"])
def test_master_and_slave_with_the_same_secret_stream_and_ack(rig: AuthRig, epoch: int | None) -> None:
    mstore, server, rec = rig.master(epoch, n=60, secret=SECRET)
    sstore, client = rig.slave(server.address, epoch=epoch, broker_id=2, secret=SECRET)
    assert wait_for(lambda: sstore.get_max_phy_offset() == mstore.get_max_phy_offset() > 0)
    put(mstore, server, 20, start=60)
    end = mstore.get_max_phy_offset()
    assert wait_for(lambda: sstore.get_max_phy_offset() == end)
    assert log_bytes(sstore) == log_bytes(mstore)
    assert wait_for(lambda: end in rec.acks)
    if epoch is not None:
        assert wait_for(lambda: (2, end) in rec.slave_acks)
    assert client.auth_refusals == 0 and server.auth_failures == 0


def test_a_slave_with_another_secret_is_refused_and_never_acks(
    rig: AuthRig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tidemq_ha_replication")
    mstore, server, rec = rig.master(E, n=30, secret=SECRET)
    sstore, client = rig.slave(server.address, epoch=E, broker_id=2, secret=b"another secret, 16+ bytes long")
    # The slave sees a master proof it cannot verify and hangs up; the master counts the refusal.
    assert wait_for(lambda: client.auth_refusals >= 1 and server.auth_failures >= 1)
    assert sstore.get_max_phy_offset() == 0 and client.bytes_received == 0
    assert rec.acks == [] and rec.slave_acks == [] and server.slave_count == 0
    # The slave counts the refusal just before it logs it (its own thread): wait for the line.
    assert wait_for(lambda: any("failed HA authentication" in r.getMessage() for r in caplog.records))
    assert not any(SECRET.decode() in r.getMessage() for r in caplog.records)


def test_a_forger_without_the_secret_cannot_report_offsets(rig: AuthRig) -> None:
    """The attack: a peer that knows the protocol poses as in-sync broker 2 of epoch E."""
    mstore, server, rec = rig.master(E, n=30, secret=SECRET)
    end = mstore.get_max_phy_offset()
    hello = {
        "digest": ["blake3"],
        "brokerId": 2,
        "epoch": E,
        "auth": AUTH_SCHEME,
        "nonce": os.urandom(32).hex(),
    }
    sock, answer = raw_hello(server.address, hello)
    with sock:
        assert "error" not in answer and len(bytes.fromhex(answer["proof"])) == 32
        sock.sendall(os.urandom(32) + REPORT.pack(end + 10**9))  # a guessed proof, then a lying report
        assert closed_by_peer(sock)  # nothing streamed: the first byte read is the close
    # Replay: a proof that was valid on one connection is useless on the next (fresh master nonce).
    key = key_of(SECRET)
    nonce = os.urandom(32)
    sock, answer = raw_hello(server.address, {**hello, "nonce": nonce.hex()})
    with sock:
        old = auth_mac(key, b"slave", nonce, bytes.fromhex(answer["nonce"]), E, 2)
    sock, answer = raw_hello(server.address, {**hello, "nonce": nonce.hex()})
    with sock:
        sock.sendall(old + REPORT.pack(end))
        assert closed_by_peer(sock)
    assert wait_for(lambda: server.auth_failures == 3 and server.slave_count == 0)
    assert rec.acks == [] and rec.slave_acks == []
    # A plain RocketMQ slave (no handshake at all) gets nothing either.
    with socket.create_connection(server.address, timeout=5) as plain:
        plain.sendall(REPORT.pack(0))
        assert closed_by_peer(plain)
    assert rec.acks == []


def test_a_slave_without_the_secret_is_told_why(rig: AuthRig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tidemq_ha_replication.ha_slave")
    mstore, server, rec = rig.master(None, n=10, secret=SECRET)
    sstore, client = rig.slave(server.address, epoch=None)
    assert wait_for(lambda: any(AUTH_REQUIRED in r.getMessage() for r in caplog.records))
    assert sstore.get_max_phy_offset() == 0 and rec.acks == []
    sock, answer = raw_hello(server.address, {"digest": ["blake3"]})
    with sock:
        assert answer["error"] == AUTH_REQUIRED and "proof" not in answer
        assert closed_by_peer(sock)


@pytest.mark.parametrize(
    "hello",
    [
        {"auth": "hmac-md5", "nonce": "00" * 32},
        {"auth": AUTH_SCHEME},
        {"auth": AUTH_SCHEME, "nonce": "zz" * 32},
        {"auth": AUTH_SCHEME, "nonce": "00" * 31},
        {"auth": AUTH_SCHEME, "nonce": " 0" * 32},
        {"auth": AUTH_SCHEME, "nonce": 12},
        {"auth": AUTH_SCHEME, "nonce": None, "epoch": E, "brokerId": 1},
    ],
)
def test_hostile_auth_fields_are_refused_cleanly(
    rig: AuthRig, caplog: pytest.LogCaptureFixture, hello: dict[str, Any]
) -> None:
    caplog.set_level(logging.INFO, logger="tidemq_ha_replication")
    _, server, rec = rig.master(E, n=2, secret=SECRET)
    sock, answer = raw_hello(server.address, hello)
    with sock:
        assert answer["error"] and "proof" not in answer
        assert closed_by_peer(sock)
    # A well-formed hello whose proof is cut short: dropped without streaming, no crash either.
    ok = {"auth": AUTH_SCHEME, "nonce": "11" * 32, "epoch": E, "brokerId": 1}
    sock, answer = raw_hello(server.address, ok)
    sock.sendall(b"\x00" * 5)
    sock.close()
    assert wait_for(lambda: server.auth_failures == 2 and server.slave_count == 0)
    assert rec.slave_acks == [] and not [r for r in caplog.records if r.levelno >= logging.ERROR]


def fake_master(answer: Callable[[dict[str, Any]], dict[str, Any]]) -> tuple[socket.socket, list[bytes]]:
    """A raw-socket master: answers each hello with ``answer(hello)``, then sends a frame; records what it got after."""
    listener = socket.create_server(("127.0.0.1", 0))
    after: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    assert recv_exact(conn, len(HELLO_MAGIC)) == HELLO_MAGIC
                    conn.sendall(encode_hello(answer(read_hello_body(conn))))
                    conn.settimeout(2)
                    after.append(conn.recv(64))
                except OSError:
                    after.append(b"")

    threading.Thread(target=serve, daemon=True).start()
    return listener, after


@pytest.mark.parametrize(
    "answer",
    [
        lambda h: {
            "compression": "none",
            "digest": "",
            "nonce": os.urandom(32).hex(),
            "proof": os.urandom(32).hex(),
        },
        lambda h: {"compression": "none", "digest": "", "nonce": "xyz", "proof": None},
        lambda h: {"compression": "none", "digest": ""},  # a master without a secret
    ],
    ids=["random_proof", "garbage", "no_proof"],
)
def test_a_slave_with_the_secret_refuses_a_master_without_a_valid_proof(
    rig: AuthRig, answer: Callable[[dict[str, Any]], dict[str, Any]]
) -> None:
    listener, after = fake_master(answer)
    try:
        sstore, client = rig.slave(listener.getsockname(), epoch=None, secret=SECRET)
        assert wait_for(lambda: client.auth_refusals >= 1 and after)
        # The slave hung up without proving itself or reporting: the fake master got no byte.
        assert after[0] == b"" and sstore.get_max_phy_offset() == 0 and client.bytes_received == 0
        assert client._thread.is_alive()  # refused, retried: never an exception out of the thread
    finally:
        listener.close()


def test_a_slave_with_the_secret_refuses_a_real_master_without_one(rig: AuthRig) -> None:
    _, server, rec = rig.master(None, n=10)
    sstore, client = rig.slave(server.address, epoch=None, secret=SECRET)
    assert wait_for(lambda: client.auth_refusals >= 1)
    assert sstore.get_max_phy_offset() == 0 and rec.acks == []


# ---------------------------------------------------------------------------- configuration
def broker_toml(tmp_path: Path, table: str, secret_file: Path) -> Path:
    cfg = tmp_path / "broker.toml"
    lines = [
        f'[plugins]\nreplication = "{table}"',
        f"[replication.{table}]",
        f'secret_file = "{secret_file}"',
    ]
    if table == "controller":
        lines[0:0] = ["[broker]\nid = 1"]
        lines.append('etcd = ["http://127.0.0.1:1"]')
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def test_check_config_refuses_a_missing_empty_or_short_secret_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.secret"
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "check-config", str(broker_toml(tmp_path, "master_slave", missing))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("tidemq: error:") and "[replication.master_slave]" in line
    assert f"secret_file = '{missing}': cannot read the HA secret" in line
    empty, short, good = tmp_path / "empty", tmp_path / "short", tmp_path / "good"
    empty.write_bytes(b"\n")
    short.write_bytes(b"fifteen bytes!!\n")
    good.write_bytes(b"sixteen bytes!!!\n")
    for path in (empty, short, good):
        path.chmod(0o600)  # a secret file others may read is refused
    for table in ("master_slave", "controller"):
        for path, why in ((empty, "is empty"), (short, "is 15 bytes, it needs at least 16")):
            with pytest.raises(
                ConfigError, match=rf"^.*\[replication\.{table}\].*secret_file = '{path}': .*{why}$"
            ):
                check_broker(load_config(str(broker_toml(tmp_path, table, path))))
        check_broker(load_config(str(broker_toml(tmp_path, table, good))))


def test_a_peer_still_in_the_handshake_is_not_counted_as_a_slave(rig: AuthRig) -> None:
    """A connection that has not proven the secret is no replica: a SYNC master must not wait on it.

    ``slave_count`` decides whether a SYNC_MASTER put waits for a replica or answers
    SLAVE_NOT_AVAILABLE at once; before, it counted every accepted socket, so a refused or silent
    peer made sends wait for an acknowledgement that could never come (and the refusal test above
    failed when it looked while a reconnecting slave's socket was open).
    """
    mstore, server, rec = rig.master(E, n=10, secret=SECRET)
    with socket.create_connection(server.address) as silent:
        silent.sendall(HELLO_MAGIC)  # the hello's magic, then nothing: stuck before the proof
        assert wait_for(lambda: len(server.connections) == 1)
        assert server.slave_count == 0
    sstore, client = rig.slave(server.address, epoch=E, broker_id=2, secret=SECRET)
    assert wait_for(lambda: server.slave_count == 1)
    assert wait_for(lambda: sstore.get_max_phy_offset() == mstore.get_max_phy_offset() > 0)
