"""Epochs on the HA stream (issue 25): real stores, real loopback sockets, no broker.

A master of epoch E serves only slaves of epoch E, a slave of epoch E follows only a master of
epoch E, every frame of such a session carries E, and the master tells its owner which broker
acknowledged what.  Sessions without an epoch are covered, unchanged, by tests/test_ha_stream.py.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.testing.store_contract import build_store, message
from tidemq_ha_replication.ha_master import HAServer
from tidemq_ha_replication.ha_slave import HAClient
from tidemq_ha_replication.master_slave import MasterSlaveOptions
from tidemq_ha_replication.wire import (
    EPOCH,
    EXT_HEAD,
    FRAME_HEAD,
    HELLO_MAGIC,
    REPORT,
    Session,
    StaleEpochError,
    encode_frame,
    encode_hello,
    read_frame,
    read_frame_confirm,
    read_hello_body,
    recv_exact,
)

OPTS = {"commitlog_file_size": 64 * 1024, "consumequeue_entries": 64}
E = 7


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def ha_options(**kw: Any) -> MasterSlaveOptions:
    return MasterSlaveOptions(**{"heartbeat_s": 0.2, "housekeeping_s": 5.0, "compression": "lz4", **kw})


class Recorder:
    """The master owner's callbacks, as the controller replication gives them."""

    def __init__(self) -> None:
        self.acks: list[int] = []
        self.slave_acks: list[tuple[int, int]] = []
        self.newer: list[int] = []

    def on_ack(self, offset: int) -> None:
        self.acks.append(offset)

    def on_slave_ack(self, broker_id: int, offset: int) -> None:
        self.slave_acks.append((broker_id, offset))

    def on_newer_epoch(self, epoch: int) -> None:
        self.newer.append(epoch)


class Rig:
    """Stores, HA servers and clients made by one test, all shut down at its end."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self._closers: list[Callable[[], None]] = []

    def store(self, name: str) -> Any:
        store = build_store("mmap", self.tmp_path / name, store_options=OPTS, flush="async")
        assert store.load()
        store.start()
        self._closers.append(store.shutdown)
        return store

    def secret(self, value: bytes) -> str:
        """A secret file holding ``value`` (for the HA authentication tests)."""
        path = self.tmp_path / f"secret{len(self._closers)}"
        path.write_bytes(value + b"\n")
        path.chmod(0o600)  # a secret file others may read is refused
        return str(path)

    def _options(self, secret: bytes | None) -> MasterSlaveOptions:
        return ha_options(secret_file=self.secret(secret) if secret else "")

    def master(
        self, epoch: int | None, n: int = 0, secret: bytes | None = None
    ) -> tuple[Any, HAServer, Recorder]:
        store = self.store(f"m{len(self._closers)}")
        rec = Recorder()
        server = HAServer(
            store,
            self._options(secret),
            "127.0.0.1",
            0,
            rec.on_ack,
            epoch=epoch,
            on_slave_ack=rec.on_slave_ack,
            on_newer_epoch=rec.on_newer_epoch,
        )
        server.start()
        self._closers.append(server.shutdown)
        put(store, server, n)
        return store, server, rec

    def slave(
        self,
        server_address: Any,
        *,
        epoch: int | None,
        broker_id: int | None = 1,
        secret: bytes | None = None,
    ) -> tuple[Any, HAClient]:
        store = self.store(f"s{len(self._closers)}")
        host, port = server_address[:2]
        client = HAClient(store, self._options(secret), f"{host}:{port}", broker_id=broker_id, epoch=epoch)
        client.start()
        self._closers.append(client.shutdown)
        return store, client

    def close(self) -> None:
        for close in reversed(self._closers):
            close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.close()


def put(store: Any, server: HAServer, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        assert store.put_message(message(body=b"m%05d" % i + bytes(200), queue_id=i % 2)).result(10).ok
    server.notify_data()


def log_bytes(store: Any) -> bytes:
    out, offset = bytearray(), store.get_min_phy_offset()
    while offset < store.get_max_phy_offset():
        data = store.get_commit_log_data(offset)
        assert data is not None
        with data:
            out += data[: store.get_max_phy_offset() - offset]
            offset += len(data)
    return bytes(out)


def raw_hello(address: Any, hello: dict[str, Any]) -> tuple[socket.socket, dict[str, Any]]:
    """A hand-written slave: sends ``hello``, returns the socket and the master's answer."""
    sock = socket.create_connection(tuple(address), timeout=5)
    sock.sendall(encode_hello(hello))
    assert recv_exact(sock, len(HELLO_MAGIC)) == HELLO_MAGIC
    return sock, read_hello_body(sock)


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True


def test_a_slave_of_the_masters_epoch_streams_every_byte_and_frames_carry_it(rig: Rig) -> None:
    mstore, server, rec = rig.master(E, n=120)
    sstore, client = rig.slave(server.address, epoch=E, broker_id=3)
    assert wait_for(lambda: sstore.get_max_phy_offset() == mstore.get_max_phy_offset())
    put(mstore, server, 40, start=120)
    assert wait_for(lambda: sstore.get_max_phy_offset() == mstore.get_max_phy_offset())
    assert log_bytes(sstore) == log_bytes(mstore)
    assert client.session.epoch == E and client.epoch_refusals == 0
    (conn,) = server.connections
    assert (conn.broker_id, conn.epoch, conn.session.epoch) == (3, E, E)

    # On the wire: the answer names the epoch, and each frame has <epoch 8> after the ext head.
    sock, answer = raw_hello(server.address, {"digest": ["blake3"], "brokerId": 9, "epoch": E})
    with sock:
        assert answer["epoch"] == E and "error" not in answer
        sock.sendall(REPORT.pack(0))
        offset, size = FRAME_HEAD.unpack(recv_exact(sock, FRAME_HEAD.size))
        codec, raw_size, _ = EXT_HEAD.unpack(recv_exact(sock, EXT_HEAD.size))
        assert EPOCH.unpack(recv_exact(sock, EPOCH.size)) == (E,)
        assert offset == 0 and codec == 0 and size == raw_size > 0
        assert recv_exact(sock, size) == log_bytes(mstore)[:size]
        # This slave reported offset 0 and stays there: it is identified, but never caught up.
        lagging = next(c for c in server.connections if c.broker_id == 9)
        assert (9, 0) in rec.slave_acks and lagging.caught_up_at == 0.0
        assert conn.caught_up_at > 0.0


def test_a_master_refuses_a_slave_of_an_older_or_newer_epoch(rig: Rig) -> None:
    mstore, server, rec = rig.master(E, n=20)
    old_store, old = rig.slave(server.address, epoch=E - 1)
    new_store, new = rig.slave(server.address, epoch=E + 1, broker_id=2)
    assert wait_for(lambda: old.epoch_refusals >= 1 and new.epoch_refusals >= 1)
    assert rec.newer and set(rec.newer) == {E + 1}  # only the newer slave signals a newer election
    assert old_store.get_max_phy_offset() == 0 and new_store.get_max_phy_offset() == 0
    assert old.bytes_received == new.bytes_received == 0
    assert rec.acks == [] and rec.slave_acks == [] and server.slave_count == 0
    # The refusal names both epochs, for the slave's operator.
    sock, answer = raw_hello(server.address, {"brokerId": 4, "epoch": E - 1})
    with sock:
        assert answer["epoch"] == E
        assert answer["error"] == f"broker 4 follows epoch {E - 1}, this master serves epoch {E}"
        assert closed_by_peer(sock)


def test_a_slave_refuses_a_master_of_another_or_no_epoch(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tidemq_ha_replication.ha_slave")
    mstore, server, rec = rig.master(E - 1, n=20)
    sstore, client = rig.slave(server.address, epoch=E)
    # A master_slave master (no epoch) would stream to anyone: the slave refuses it itself.
    _, plain_master, _ = rig.master(None, n=20)
    pstore, pclient = rig.slave(plain_master.address, epoch=E)
    assert wait_for(lambda: client.epoch_refusals >= 1 and pclient.epoch_refusals >= 1)
    assert sstore.get_max_phy_offset() == 0 and pstore.get_max_phy_offset() == 0
    assert client.bytes_received == pclient.bytes_received == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"serves epoch {E - 1}, this slave follows epoch {E}" in m for m in messages)
    assert any(f"serves no epoch, this slave follows epoch {E}" in m for m in messages)


def test_a_lying_master_that_streams_another_epoch_gets_no_byte_appended(rig: Rig) -> None:
    """A master answering the slave's epoch in the handshake but framing another: refused per frame."""
    source, server, _ = rig.master(None, n=10)
    records = log_bytes(source)
    listener = socket.create_server(("127.0.0.1", 0))
    served = threading.Event()

    def fake_master() -> None:
        conn, _ = listener.accept()
        with conn:
            assert recv_exact(conn, len(HELLO_MAGIC)) == HELLO_MAGIC
            read_hello_body(conn)
            conn.sendall(encode_hello({"compression": "none", "digest": "blake3", "epoch": E}))
            recv_exact(conn, REPORT.size)
            stale = Session(extended=True, codec="none", digest="blake3", epoch=E - 1)
            conn.sendall(b"".join(encode_frame(stale, 0, records)))
            served.set()
            try:
                conn.recv(1)  # until the slave drops us
            except OSError:
                pass

    threading.Thread(target=fake_master, daemon=True).start()
    sstore, client = rig.slave(listener.getsockname(), epoch=E)
    try:
        assert wait_for(lambda: client.epoch_refusals == 1)
        assert served.is_set() and sstore.get_max_phy_offset() == 0
    finally:
        listener.close()


def test_slave_acks_name_the_broker_and_caught_up_at_advances(rig: Rig) -> None:
    mstore, server, rec = rig.master(E, n=50)
    sstore, client = rig.slave(server.address, epoch=E, broker_id=2)
    assert wait_for(lambda: (2, mstore.get_max_phy_offset()) in rec.slave_acks)
    (conn,) = server.connections
    assert wait_for(lambda: conn.caught_up_at > 0)
    for round_ in range(3):  # a slave keeping up under steady writes stays caught up
        before = conn.caught_up_at
        put(mstore, server, 10, start=50 + 10 * round_)
        assert wait_for(
            lambda before=before: (
                conn.caught_up_at > before and sstore.get_max_phy_offset() == mstore.get_max_phy_offset()
            )
        )
        assert conn.catchup_target <= mstore.get_max_phy_offset()
    assert {b for b, _ in rec.slave_acks} == {2}
    offsets = [o for _, o in rec.slave_acks]
    assert offsets == sorted(offsets) and offsets[-1] == mstore.get_max_phy_offset()
    client.shutdown()
    assert wait_for(lambda: rec.slave_acks[-1] == (2, -1))
    assert rec.slave_acks.count((2, -1)) == 1 and server.slave_count == 0


def test_read_frame_refuses_a_frame_of_another_epoch() -> None:
    ours = Session(extended=True, codec="lz4", digest="blake3", epoch=5)
    raw = b"commit-log bytes " * 20
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"".join(encode_frame(ours, 100, raw)))
        assert read_frame(b, ours, 1 << 20) == (100, raw)
        a.sendall(
            b"".join(encode_frame(Session(extended=True, codec="lz4", digest="blake3", epoch=4), 100, raw))
        )
        with pytest.raises(StaleEpochError, match="carries epoch 4, the session's is 5"):
            read_frame(b, ours, 1 << 20)
    # Without an epoch a frame is what it always was: no epoch field.
    plain = encode_frame(Session(extended=True, codec="none", digest="blake3"), 0, raw)
    assert len(plain[0]) == FRAME_HEAD.size + EXT_HEAD.size
    assert len(encode_frame(ours, 0, raw)[0]) == FRAME_HEAD.size + EXT_HEAD.size + EPOCH.size


@pytest.mark.parametrize(
    "hello",
    [
        {"brokerId": 1},
        {"epoch": E},
        {"brokerId": 1, "epoch": str(E)},
        {"brokerId": 1, "epoch": -1},
        {"brokerId": 1, "epoch": 7.5},
        {"brokerId": True, "epoch": E},
        {"brokerId": 1, "epoch": 2**63},
        {"brokerId": [1], "epoch": E},
    ],
    ids=["no-epoch", "no-broker", "string", "negative", "float", "bool", "absurd", "list"],
)
def test_hostile_hellos_are_refused_in_one_line(
    rig: Rig, caplog: pytest.LogCaptureFixture, hello: dict[str, Any]
) -> None:
    caplog.set_level(logging.INFO, logger="tidemq_ha_replication.ha_master")
    mstore, server, rec = rig.master(E, n=5)
    sock, answer = raw_hello(server.address, {"compression": ["lz4"], **hello})
    with sock:
        assert answer["epoch"] == E and answer["error"]
        assert closed_by_peer(sock)
    assert rec.newer == [] and rec.slave_acks == []
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.WARNING and not refused[0].exc_info
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # The master still serves a proper slave.
    sstore, _ = rig.slave(server.address, epoch=E)
    assert wait_for(lambda: sstore.get_max_phy_offset() == mstore.get_max_phy_offset())


def test_an_epoch_master_refuses_a_plain_rocketmq_slave(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tidemq_ha_replication.ha_master")
    _, server, rec = rig.master(E, n=5)
    with socket.create_connection(tuple(server.address), timeout=5) as sock:
        sock.sendall(struct.pack(">q", 0))  # RocketMQ's HAClient: its offset, no handshake
        assert closed_by_peer(sock)  # not one frame
    assert rec.acks == []
    assert any("plain RocketMQ slave refused" in r.getMessage() for r in caplog.records)


def test_epoch_needs_a_broker_id() -> None:
    with pytest.raises(ValueError, match="broker_id"):
        HAClient(None, ha_options(), "127.0.0.1:1", epoch=E)
    with pytest.raises(ValueError, match="epoch -1"):
        HAClient(None, ha_options(), "127.0.0.1:1", broker_id=1, epoch=-1)


def test_hello_json_is_what_the_slave_sends(rig: Rig) -> None:
    """The handshake fields the README documents, as a hand-written master receives them."""
    listener = socket.create_server(("127.0.0.1", 0))
    got: list[dict[str, Any]] = []

    def capture() -> None:
        conn, _ = listener.accept()
        with conn:
            assert recv_exact(conn, len(HELLO_MAGIC)) == HELLO_MAGIC
            got.append(read_hello_body(conn))

    threading.Thread(target=capture, daemon=True).start()
    try:
        rig.slave(listener.getsockname(), epoch=E, broker_id=5)
        assert wait_for(lambda: bool(got))
    finally:
        listener.close()
    assert got[0] == {"compression": ["lz4"], "digest": ["blake3"], "brokerId": 5, "epoch": E}


def test_the_confirm_offset_travels_to_slaves_that_ask_for_it(rig: Rig) -> None:
    """The controller's SYNC master sends its confirm offset in every frame to a slave whose hello
    asks for it (RocketMQ 5's confirmOffset in the HA transfer header), and a heartbeat as soon as
    it grows; a slave that does not ask gets the frames of before."""
    mstore = rig.store("mc")
    confirm: list[int | None] = [None]
    server = HAServer(
        mstore,
        ha_options(),
        "127.0.0.1",
        0,
        lambda _o: None,
        epoch=E,
        on_slave_ack=lambda _b, _o: None,
        confirm_offset=lambda: confirm[0],
    )
    server.start()
    rig._closers.append(server.shutdown)
    put(mstore, server, 20)
    heard: list[int] = []
    sstore = rig.store("sc")
    host, port = server.address[:2]
    client = HAClient(
        sstore, ha_options(), f"{host}:{port}", broker_id=2, epoch=E, on_confirm=lambda: heard.append(1)
    )
    client.start()
    rig._closers.append(client.shutdown)
    assert wait_for(lambda: sstore.get_max_phy_offset() == mstore.get_max_phy_offset())
    assert client.session.confirm and client.confirm_offset == -1  # None: no bound yet
    confirm[0] = 1234
    server.notify_confirm()  # what the controller does when its confirm offset grows
    assert wait_for(lambda: client.confirm_offset == 1234, 2.0) and heard
    confirm[0] = mstore.get_max_phy_offset()
    put(mstore, server, 5, start=20)  # a data frame carries it too
    assert wait_for(lambda: client.confirm_offset == confirm[0], 2.0)

    # On the wire: asked for, answered, and <confirm 8> after <epoch 8>.
    sock, answer = raw_hello(
        server.address, {"digest": ["blake3"], "brokerId": 9, "epoch": E, "confirm": True}
    )
    with sock:
        assert answer["confirm"] is True
        sock.sendall(REPORT.pack(0))
        FRAME_HEAD.unpack(recv_exact(sock, FRAME_HEAD.size))
        EXT_HEAD.unpack(recv_exact(sock, EXT_HEAD.size))
        assert EPOCH.unpack(recv_exact(sock, EPOCH.size)) == (E,)
        assert EPOCH.unpack(recv_exact(sock, EPOCH.size)) == (confirm[0],)
    # A slave that does not ask: no answer field, frames without it (what an older slave reads).
    sock, answer = raw_hello(server.address, {"digest": ["blake3"], "brokerId": 8, "epoch": E})
    with sock:
        assert "confirm" not in answer
        sock.sendall(REPORT.pack(mstore.get_max_phy_offset()))
        offset, size = FRAME_HEAD.unpack(recv_exact(sock, FRAME_HEAD.size))
        assert size == 0  # a heartbeat at the end
        EXT_HEAD.unpack(recv_exact(sock, EXT_HEAD.size))
        assert EPOCH.unpack(recv_exact(sock, EPOCH.size)) == (E,)
        assert offset == mstore.get_max_phy_offset()
    # Frames of a session with the confirm offset round-trip; -1 is "no bound".
    session = Session(extended=True, codec="none", digest="blake3", epoch=E, confirm=True)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"".join(encode_frame(session, 100, b"x" * 50, 77)))
        a.sendall(b"".join(encode_frame(session, 150, b"", -1)))
        assert read_frame_confirm(b, session, 1 << 20) == (100, b"x" * 50, 77)
        assert read_frame_confirm(b, session, 1 << 20) == (150, b"", -1)
