"""The HA handshake MAC pinned by known answers (plugins/ha_replication/wire.py's docstring is the spec).

``key = blake3.derive_key(KEY_CONTEXT, secret)``; a proof is the blake3 keyed hash of
``label | slave nonce | master nonce | epoch | brokerId`` (epoch and brokerId signed 8-byte
big-endian, -1 when the session has none).  Both sides computing the same wrong thing would still
agree with each other, so only fixed vectors and a hand-written peer show that the epoch and the
broker id are bound: a proof from one epoch or broker must not serve another.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

import blake3
import pytest
from conftest import free_port

from tidemq.broker import Broker
from tidemq.config import compose, parse_config
from tidemq.message import properties_to_string
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq_ha_replication.wire import auth_mac

pytestmark = pytest.mark.timeout(60)

KEY_CONTEXT = "tidemq 2026-11 HA handshake shared-secret key v1"
HELLO_MAGIC = b"TMHA\x00\x01\xff\xfe"
SECRET = b"correct horse battery staple 2026"
SLAVE_NONCE, MASTER_NONCE = bytes(range(32)), bytes(range(32, 64))
# Computed once by hand from the spec above (blake3 1.x), for epoch 7 and broker 2.
MASTER_PROOF_7_2 = "5dfce636a880ce8b1ef0a0019974fd76147517823731647a93cd929ac573f351"
SLAVE_PROOF_7_2 = "c7d74a0874d861f77414bf8e825de820233f817c704e3953d116720269d257c3"


def key_of(secret: bytes) -> bytes:
    return blake3.blake3(secret, derive_key_context=KEY_CONTEXT).digest()


def spec_mac(key: bytes, label: bytes, slave: bytes, master: bytes, epoch: int, broker_id: int) -> bytes:
    return blake3.blake3(label + slave + master + struct.pack(">qq", epoch, broker_id), key=key).digest()


def test_the_mac_matches_the_known_answers_and_binds_epoch_and_broker_id() -> None:
    key = key_of(SECRET)
    assert spec_mac(key, b"master", SLAVE_NONCE, MASTER_NONCE, 7, 2).hex() == MASTER_PROOF_7_2
    assert auth_mac(key, b"master", SLAVE_NONCE, MASTER_NONCE, 7, 2).hex() == MASTER_PROOF_7_2
    assert auth_mac(key, b"slave", SLAVE_NONCE, MASTER_NONCE, 7, 2).hex() == SLAVE_PROOF_7_2
    proofs = {
        auth_mac(key, b"master", SLAVE_NONCE, MASTER_NONCE, epoch, broker_id)
        for epoch, broker_id in ((7, 2), (8, 2), (7, 3), (-1, -1), (2, 7))
    }
    assert len(proofs) == 5  # another epoch or broker id: another proof


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def test_a_broker_proves_and_checks_the_mac_over_the_sessions_epoch_and_broker_id(tmp_path: Path) -> None:
    """A plain master-slave master (no epoch, no broker id: both -1) and a hand-written slave."""
    secret = tmp_path / "ha.secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(0o600)
    ha = f"127.0.0.1:{free_port()}"
    cfg = parse_config(
        {
            "broker": {"listen": "127.0.0.1:0", "namesrv": [], "data_dir": str(tmp_path / "data")},
            "plugins": {"replication": "master_slave"},
            "replication": {"master_slave": {"listen": ha, "secret_file": str(secret)}},
        }
    )
    key = key_of(SECRET)

    def handshake(slave_proof: Any) -> tuple[bytes, bool, bytes]:
        """Hello, then our proof and a report of offset 0: the master's proof, whether it is the
        spec's over epoch -1 and broker id -1, and the first 12 bytes the master streams (empty
        when it hangs up instead)."""
        host, port = ha.split(":")
        nonce = os.urandom(32)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            body = json.dumps({"digest": ["blake3"], "auth": "blake3-keyed", "nonce": nonce.hex()}).encode()
            sock.sendall(HELLO_MAGIC + struct.pack(">I", len(body)) + body)
            assert recv_exact(sock, len(HELLO_MAGIC)) == HELLO_MAGIC
            (n,) = struct.unpack(">I", recv_exact(sock, 4))
            answer = json.loads(recv_exact(sock, n))
            master_nonce = bytes.fromhex(answer["nonce"])
            proof = bytes.fromhex(answer["proof"])
            sock.sendall(slave_proof(key, nonce, master_nonce) + struct.pack(">q", 0))
            try:
                head = recv_exact(sock, 12)
            except (ConnectionError, TimeoutError):
                head = b""
            return proof, proof == spec_mac(key, b"master", nonce, master_nonce, -1, -1), head

    async def main() -> None:
        broker = Broker(compose(cfg))
        await broker.start()
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            fields = {
                "producerGroup": "PG",
                "topic": "Replicated",
                "defaultTopic": "TBW102",
                "defaultTopicQueueNums": 4,
                "queueId": 0,
                "sysFlag": 0,
                "bornTimestamp": int(time.time() * 1000),
                "flag": 0,
                "properties": properties_to_string({}),
            }
            sent = await client.invoke(
                broker.address, RemotingCommand.request(RequestCode.SEND_MESSAGE, fields, b"x"), 5.0
            )
            assert sent.code == ResponseCode.SUCCESS, sent.remark

            def good(key: bytes, nonce: bytes, master_nonce: bytes) -> bytes:
                return spec_mac(key, b"slave", nonce, master_nonce, -1, -1)

            def unbound(key: bytes, nonce: bytes, master_nonce: bytes) -> bytes:
                return blake3.blake3(b"slave" + nonce + master_nonce, key=key).digest()

            # The master's proof is the spec's MAC over epoch -1 and broker id -1; given the spec's
            # slave proof, it streams.
            proof, as_spec, head = await asyncio.to_thread(handshake, good)
            assert as_spec, "the master's proof is not MAC(master | nonces | epoch | brokerId)"
            assert len(head) == 12, "the master hung up on a slave with the spec's proof"
            phy, size = struct.unpack(">qi", head)
            assert phy == 0 and size > 0
            again, _, _ = await asyncio.to_thread(handshake, good)
            assert again != proof  # a fresh master nonce per connection
            # A slave proof that leaves epoch and broker id out is refused: nothing streams.
            _, _, head = await asyncio.to_thread(handshake, unbound)
            assert head == b""
        finally:
            await client.close()
            await broker.stop()

    asyncio.run(main())
