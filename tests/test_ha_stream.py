"""master_slave replication between two real mmap stores over loopback sockets (no broker)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.errors import ConfigError
from tidemq.message import decode_message
from tidemq.plugins import get_plugin_manager
from tidemq.store import GetStatus
from tidemq.testing.store_contract import build_store, message

OPTS = {"commitlog_file_size": 64 * 1024, "consumequeue_entries": 64}


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def replication(**options: Any) -> Any:
    return get_plugin_manager().create("replication", "master_slave", options=options)


class Pair:
    """A master store + replication and a slave store + replication."""

    def __init__(
        self,
        tmp_path: Path,
        role: str = "ASYNC_MASTER",
        slave_opts: dict[str, Any] | None = None,
        **opts: Any,
    ):
        self.tmp_path = tmp_path
        self.master_store = build_store("mmap", tmp_path / "m", store_options=OPTS, flush="async")
        assert self.master_store.load()
        self.master_store.start()
        self.master = replication(listen="127.0.0.1:0", **opts)
        self.master.start(self.master_store, {"role": role, "listen": "127.0.0.1:0"})
        self.slaves: list[tuple[Any, Any]] = []
        self.slave_opts = {**opts, **(slave_opts or {})}

    def add_slave(self, name: str = "s", master_address: str | None = None) -> tuple[Any, Any]:
        store = build_store("mmap", self.tmp_path / name, store_options=OPTS, flush="async")
        assert store.load()
        store.start()
        rep = replication(master_address=master_address or self.master.ha_address(), **self.slave_opts)
        rep.start(store, {"role": "SLAVE", "id": 1})
        self.slaves.append((store, rep))
        return store, rep

    def put(self, n: int, start: int = 0, size: int = 300) -> list[Any]:
        out = []
        for i in range(start, start + n):
            r = self.master_store.put_message(
                message(body=b"m%05d" % i + bytes(size), queue_id=i % 2)
            ).result(10)
            assert r.ok
            out.append(r)
            self.master.wait_for_replicas(r.wrote_offset + r.wrote_bytes)
        return out

    def close(self) -> None:
        for store, rep in self.slaves:
            rep.shutdown()
            store.shutdown()
        self.master.shutdown()
        self.master_store.shutdown()


@pytest.fixture
def pair_factory(tmp_path: Path) -> Iterator[Callable[..., Pair]]:
    made: list[Pair] = []

    def make(**kw: Any) -> Pair:
        p = Pair(tmp_path, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def caught_up(slave: Any, master: Any) -> bool:
    """The slave holds the master's whole log *and* has indexed it: the log's end moves before the
    queue entries of the bytes just appended are written, so the end alone races with the reads."""
    if slave.get_max_phy_offset() != master.get_max_phy_offset():
        return False
    return all(
        slave.get_max_offset_in_queue(topic, qid) == master.get_max_offset_in_queue(topic, qid)
        for topic, qids in master.topics().items()
        for qid in qids
    )


def bodies(store: Any, qid: int) -> list[bytes]:
    out, offset = [], 0
    while True:
        got = store.get_message("g", "TopicA", qid, offset, 64)
        if got.status is not GetStatus.FOUND:
            return out
        out.extend(decode_message(b, check_crc=True).body[:6] for b in got.buffers)
        offset = got.next_begin_offset


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_slave_copies_the_commit_log_and_builds_queues(
    pair_factory: Callable[..., Pair], compression: str
) -> None:
    pair = pair_factory(compression=compression)
    pair.put(150)  # crosses commit-log files (64 KiB each)
    store, rep = pair.add_slave()
    # A new slave starts at the master's last file, then follows new writes.
    assert wait_for(lambda: caught_up(store, pair.master_store))
    pair.put(150, start=150)
    assert wait_for(lambda: caught_up(store, pair.master_store))
    assert rep.client.session.codec == compression
    assert rep.client.session.digest == "blake3"
    last = bodies(store, 1)
    assert last[-1] == b"m00299"
    assert last == [b"m%05d" % i for i in range(299 - 2 * (len(last) - 1), 300, 2)]
    info = pair.master.runtime_info()
    assert wait_for(lambda: pair.master.runtime_info()["haSlaveFallBehind"] == "0")
    assert info["haConnectedSlaves"] == "1"


def test_slave_from_an_empty_master_gets_every_message(pair_factory: Callable[..., Pair]) -> None:
    pair = pair_factory(compression="lz4")
    store, _ = pair.add_slave()
    pair.put(100)
    assert wait_for(lambda: caught_up(store, pair.master_store))
    assert bodies(store, 0) == [b"m%05d" % i for i in range(0, 100, 2)]


def test_sync_master_acknowledges_only_what_a_slave_has(pair_factory: Callable[..., Pair]) -> None:
    pair = pair_factory(role="SYNC_MASTER", sync_timeout_s=0.5)
    r = pair.master_store.put_message(message()).result(10)
    # No slave connected: RocketMQ's SLAVE_NOT_AVAILABLE, at once.
    assert pair.master.wait_for_replicas(r.wrote_offset + r.wrote_bytes).result(1) == "SLAVE_NOT_AVAILABLE"
    store, _ = pair.add_slave()
    assert wait_for(lambda: pair.master.server.slave_count == 1)
    futures = []
    for i in range(50):
        r = pair.master_store.put_message(message(body=b"s%03d" % i)).result(10)
        futures.append((r, pair.master.wait_for_replicas(r.wrote_offset + r.wrote_bytes)))
    for r, f in futures:
        assert f.result(5) == "PUT_OK"
        # Acknowledged means the slave holds the bytes.
        assert store.get_max_phy_offset() >= r.wrote_offset + r.wrote_bytes
    # A slave that stops answering: the send waits sync_timeout_s and reports FLUSH_SLAVE_TIMEOUT.
    _, rep = pair.slaves[0]
    rep.shutdown()
    r = pair.master_store.put_message(message()).result(10)
    status = pair.master.wait_for_replicas(r.wrote_offset + r.wrote_bytes).result(5)
    assert status in ("FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE")


def test_sync_master_times_out_when_the_slave_cannot_keep_up(tmp_path: Path) -> None:
    """A slave connected but never acknowledging (a stalled peer speaking the plain protocol)."""
    store = build_store("mmap", tmp_path / "m", store_options=OPTS, flush="async")
    assert store.load()
    store.start()
    master = replication(listen="127.0.0.1:0", sync_timeout_s=0.3)
    master.start(store, {"role": "SYNC_MASTER"})
    try:
        stalled = socket.create_connection(tuple(master.server.address))
        stalled.sendall((0).to_bytes(8, "big"))
        assert wait_for(lambda: master.server.slave_count == 1)
        r = store.put_message(message()).result(10)
        begin = time.monotonic()
        assert master.wait_for_replicas(r.wrote_offset + r.wrote_bytes).result(5) == "FLUSH_SLAVE_TIMEOUT"
        assert time.monotonic() - begin >= 0.25
        # The plain RocketMQ protocol: <phyOffset 8><bodySize 4><data> from offset 0.
        stalled.settimeout(5)
        while True:  # heartbeats (bodySize 0) may come first
            head = stalled.recv(12, socket.MSG_WAITALL)
            if int.from_bytes(head[8:], "big"):
                break
        assert int.from_bytes(head[:8], "big") == 0 and int.from_bytes(head[8:], "big") == r.wrote_bytes
        assert (
            decode_message(stalled.recv(r.wrote_bytes, socket.MSG_WAITALL), check_crc=True).body == b"hello"
        )
        stalled.close()
    finally:
        master.shutdown()
        store.shutdown()


class CorruptingProxy:
    """Forwards slave <-> master, flipping one byte of the master's stream once (after the handshake)."""

    def __init__(self, target: tuple[str, int], flip_at: int):
        self.target = target
        self.flip_at = flip_at
        self.flipped = False
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, corrupt: bool) -> None:
        seen = 0
        try:
            while data := src.recv(65536):
                if corrupt and not self.flipped and seen + len(data) > self.flip_at:
                    buf = bytearray(data)
                    buf[self.flip_at - seen] ^= 0x40
                    data = bytes(buf)
                    self.flipped = True
                seen += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_batch_corrupted_on_the_wire_is_refused_and_fetched_again(
    pair_factory: Callable[..., Pair], compression: str
) -> None:
    pair = pair_factory(compression=compression)
    pair.put(40)
    host, port = pair.master.server.address
    # Past the handshake reply and the first frame's 49-byte header: inside the first payload.
    proxy = CorruptingProxy((host, port), flip_at=200)
    try:
        store, rep = pair.add_slave(master_address=proxy.address)
        assert wait_for(lambda: caught_up(store, pair.master_store))
        assert proxy.flipped
        assert rep.client.corrupt_batches == 1
        # Every record the slave holds passes its CRC: the damaged batch never reached the log.
        assert bodies(store, 0) == [b"m%05d" % i for i in range(0, 40, 2)]
        for qid in (0, 1):
            got = store.get_message("g", "TopicA", qid, 0, 64)
            for b in got.buffers:
                decode_message(b, check_crc=True)
    finally:
        proxy.close()


def test_bad_options_are_one_line_config_errors() -> None:
    with pytest.raises(ConfigError, match="compression"):
        get_plugin_manager().create("replication", "master_slave", options={"compression": "snappy"})
    with pytest.raises(ConfigError, match="unknown key"):
        get_plugin_manager().create("replication", "master_slave", options={"sync_timeout": 1})


def test_a_taken_ha_port_is_a_one_line_config_error(tmp_path: Path) -> None:
    store = build_store("mmap", tmp_path / "m", store_options=OPTS, flush="async")
    assert store.load()
    store.start()
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        rep = replication(listen=f"127.0.0.1:{port}")
        with pytest.raises(ConfigError, match="cannot listen on HA port"):
            rep.start(store, {"role": "ASYNC_MASTER"})
        # The broker's port + 1 is the default HA port.
        rep = replication()
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}"):
            rep.start(store, {"role": "SYNC_MASTER", "listen": f"127.0.0.1:{port - 1}"})
    finally:
        taken.close()
        store.shutdown()


def test_broker_with_a_taken_ha_port_exits_with_one_line_and_a_clean_store(tmp_path: Path) -> None:
    import subprocess
    import sys

    taken = socket.create_server(("127.0.0.1", 0))
    ha_port = taken.getsockname()[1]
    data = tmp_path / "data"
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        f'[broker]\nlisten = "127.0.0.1:0"\nnamesrv = []\ndata_dir = "{data}"\n'
        f'[plugins]\nreplication = "master_slave"\n[replication.master_slave]\nlisten = "127.0.0.1:{ha_port}"\n'
    )
    try:
        out = subprocess.run(
            [sys.executable, "-m", "tidemq", "broker", "-c", str(cfg)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        taken.close()
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("tidemq: error:") and str(ha_port) in out.stderr
    # The store was shut down properly: no abort marker forcing crash recovery on the next start.
    assert not (data / "abort").exists()
