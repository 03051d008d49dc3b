"""Slave side of HA (RocketMQ's HAClient): pull the master's commit log into the local store.

The slave reports its commit-log end on connect, after each appended batch and every
``heartbeat_s``; the master streams from there.  A batch whose offset is not the local end, or that
fails its digest, is never appended: the connection is dropped and re-opened, and the master
restarts from the offset the slave reports again.

With an ``epoch`` (the ``controller`` replication) the slave names its broker id and the epoch it
follows in the handshake, and refuses a master that answers another epoch (or none), or a frame of
another epoch: it never appends a byte from a master of another election.

With a shared secret (``secret_file``) the slave asks for authentication, refuses a master that
does not prove it holds the secret (``auth_refusals`` counts these), and proves its own before its
first report (see :mod:`.wire`).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from tidemq.address import split_address
from tidemq.errors import ConfigError

from .wire import (
    AUTH_SCHEME,
    HELLO_MAGIC,
    MAC_SIZE,
    MAX_ID,
    NONCE_SIZE,
    REPORT,
    CorruptBatchError,
    HAAuthError,
    HAProtocolError,
    Session,
    StaleEpochError,
    auth_mac,
    encode_hello,
    hello_bytes,
    load_key,
    mac_ok,
    new_nonce,
    read_frame_confirm,
    read_hello_body,
    recv_exact,
)

log = logging.getLogger(__name__)

RECONNECT_DELAY_S = 1.0
#: Frames above this are refused as corrupt (a batch holds at most one oversized record).
MAX_RECORD_BATCH = 64 * 1024 * 1024


class HAClient:
    """Keeps one connection to the master's HA port while running.

    ``epoch`` (None: none; needs ``options.extended``) is the election this slave follows, with
    ``broker_id`` its identity towards the master; a master of another epoch is refused
    (``epoch_refusals`` counts these) and tried again after the reconnect delay.
    """

    def __init__(
        self,
        store: Any,
        options: Any,
        master_address: str = "",
        *,
        broker_id: int | None = None,
        epoch: int | None = None,
        on_confirm: Callable[[], None] | None = None,
    ):
        if epoch is not None:
            if not 0 <= epoch <= MAX_ID:
                raise ValueError(f"HA epoch {epoch} is not in 0..{MAX_ID}")
            if broker_id is None or not 0 <= broker_id <= MAX_ID:
                raise ValueError(
                    f"an HA slave with an epoch needs a broker_id in 0..{MAX_ID}, not {broker_id}"
                )
            if not options.extended:
                # The plain protocol cannot name an epoch: an epoch master will close on this slave.
                log.warning("HA slave epoch %d ignored: extended = false sends no handshake", epoch)
        self.key = load_key(options)  # None: no secret, the master is not authenticated
        if self.key is not None and not options.extended:
            raise ConfigError(
                "secret_file needs extended = true: the plain RocketMQ HA protocol cannot authenticate"
            )
        self.store = store
        self.options = options
        self.master_address = master_address
        self.broker_id = broker_id
        self.epoch = epoch
        self.master_offset = 0  # the master's stream position as last seen (for lag)
        self.corrupt_batches = 0
        self.epoch_refusals = 0
        #: The master's confirm offset as last received (-1: none yet, or the master sets no
        #: bound); asked for in the hello when ``on_confirm`` is given (epoch sessions only),
        #: which is called (on the receiving thread) each time it grows.
        self.confirm_offset = -1
        self._on_confirm = on_confirm
        self.auth_refusals = 0  # masters refused for a missing or wrong proof
        self.bytes_received = 0
        self.connected = False
        self.session = Session()
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tidemq-ha-client", daemon=True)
        self._reporter = threading.Thread(target=self._report_loop, name="tidemq-ha-report", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._reporter.start()

    def set_master(self, address: str) -> None:
        """Follow a (new) master HA address; the current connection is dropped if it changed."""
        if address and address != self.master_address:
            log.info("HA master address is now %s", address)
            self.master_address = address
            self._drop()

    @property
    def fall_behind(self) -> int:
        return max(0, self.master_offset - self.store.get_max_phy_offset())

    def _drop(self) -> None:
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _report(self) -> None:
        sock = self._sock
        if sock is None:
            return
        with self._send_lock:
            sock.sendall(REPORT.pack(self.store.get_max_phy_offset()))

    def _report_loop(self) -> None:
        while not self._stop.wait(self.options.heartbeat_s):
            try:
                self._report()
            except OSError:
                self._drop()

    def _connect(self, address: str) -> socket.socket:
        sock = socket.create_connection(split_address(address), timeout=3.0)
        try:
            return self._handshake(sock, address)
        except BaseException:
            sock.close()  # a refused master is retried every second: don't leak one socket each time
            raise

    def _handshake(self, sock: socket.socket, address: str) -> socket.socket:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        opts = self.options
        if opts.extended:
            offered = [opts.compression] if opts.compression != "none" else []
            hello: dict[str, Any] = {"compression": offered, "digest": ["blake3"] if opts.digest else []}
            if self.epoch is not None:
                hello.update(brokerId=self.broker_id, epoch=self.epoch)
                if self._on_confirm is not None:
                    hello["confirm"] = True
            slave_nonce = new_nonce()
            if self.key is not None:
                hello.update(auth=AUTH_SCHEME, nonce=slave_nonce.hex())
            sock.sendall(encode_hello(hello))
            if recv_exact(sock, len(HELLO_MAGIC)) != HELLO_MAGIC:
                raise HAProtocolError(f"master {address} did not answer the tidemq HA handshake")
            reply = read_hello_body(sock)
            error = str(reply.get("error") or "")
            if self.epoch is not None:
                served = reply.get("epoch")
                if type(served) is not int or served != self.epoch:
                    said = "no epoch" if served is None else f"epoch {str(served)[:40]}"
                    raise StaleEpochError(
                        f"master {address} serves {said}, this slave follows epoch {self.epoch}"
                        + (f" (master said: {error[:200]})" if error else "")
                    )
            if error:
                raise HAProtocolError(f"master {address} refused this slave: {error[:200]}")
            if self.key is not None:
                self._authenticate(self.key, sock, address, reply, slave_nonce)
            self.session = Session(
                extended=True,
                codec=str(reply.get("compression") or "none"),
                digest=str(reply.get("digest") or ""),
                epoch=-1 if self.epoch is None else self.epoch,
                confirm=self.epoch is not None
                and self._on_confirm is not None
                and reply.get("confirm") is True,
            )
        else:
            self.session = Session()
        sock.settimeout(opts.housekeeping_s)
        return sock

    def _authenticate(
        self, key: bytes, sock: socket.socket, address: str, reply: dict[str, Any], slave_nonce: bytes
    ) -> None:
        """Check the master's proof (:class:`HAAuthError` if absent or wrong), then send this slave's."""
        epoch = -1 if self.epoch is None else self.epoch
        broker_id = -1 if self.epoch is None or self.broker_id is None else self.broker_id
        try:
            master_nonce = hello_bytes(reply, "nonce", NONCE_SIZE)
            proof = hello_bytes(reply, "proof", MAC_SIZE)
        except HAAuthError as exc:
            raise HAAuthError(f"master {address} did not prove the shared secret: {exc}") from None
        expected = auth_mac(key, b"master", slave_nonce, master_nonce, epoch, broker_id)
        if not mac_ok(expected, proof):
            raise HAAuthError(f"master {address} failed HA authentication (no or another shared secret)")
        sock.sendall(auth_mac(key, b"slave", slave_nonce, master_nonce, epoch, broker_id))

    def _run(self) -> None:
        while not self._stop.is_set():
            address = self.master_address
            if not address:
                self._stop.wait(RECONNECT_DELAY_S)
                continue
            delay = RECONNECT_DELAY_S
            try:
                self._sock = self._connect(address)
                self.connected = True
                log.info(
                    "HA slave connected to master %s at offset %d", address, self.store.get_max_phy_offset()
                )
                self._report()
                self._receive(self._sock)
            except StaleEpochError as exc:
                # Never fatal: the owner learns the new master from etcd and replaces this client.
                self.epoch_refusals += 1
                log.warning("HA slave refuses its master: %s", exc)
            except HAAuthError as exc:
                self.auth_refusals += 1
                log.warning("HA slave refuses its master: %s", exc)
            except CorruptBatchError as exc:
                self.corrupt_batches += 1
                log.warning(
                    "HA batch refused, re-requesting from %d: %s", self.store.get_max_phy_offset(), exc
                )
                delay = 0.0
            except (OSError, ConnectionError, HAProtocolError, ValueError) as exc:
                if not self._stop.is_set():
                    log.info("HA connection to master %s lost: %s", address, exc)
            except Exception:
                log.exception("HA client failed")
            finally:
                self.connected = False
                sock, self._sock = self._sock, None
                if sock is not None:
                    sock.close()
            self._stop.wait(delay)

    def _receive(self, sock: socket.socket) -> None:
        store = self.store
        # A batch is whole records, so one record (up to the largest message) may exceed the batch size.
        max_body = max(self.options.transfer_batch * 2, MAX_RECORD_BATCH)
        while not self._stop.is_set():
            offset, raw, confirm = read_frame_confirm(sock, self.session, max_body)
            if confirm != self.confirm_offset and self.session.confirm:
                self.confirm_offset = confirm
                if self._on_confirm is not None:
                    self._on_confirm()
            local = store.get_max_phy_offset()
            if not raw:  # heartbeat: the master's position
                self.master_offset = max(self.master_offset, offset)
                continue
            if offset != local and not (local == 0 and self.bytes_received == 0 and _empty(store)):
                raise HAProtocolError(f"master sent offset {offset} but the local commit log ends at {local}")
            if not store.append_to_commit_log(offset, raw):
                raise HAProtocolError(f"the store refused {len(raw)} bytes at offset {offset}")
            self.bytes_received += len(raw)
            self.master_offset = max(self.master_offset, offset + len(raw))
            self._report()

    def shutdown(self) -> None:
        self._stop.set()
        self._drop()
        self._thread.join(3)
        self._reporter.join(1)


def _empty(store: Any) -> bool:
    """An empty slave accepts the master's first offset (the start of the master's last file)."""
    return store.get_max_phy_offset() == 0
