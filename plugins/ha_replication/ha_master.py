"""Master side of HA: the HA port, one connection per slave, and SYNC_MASTER's group transfer.

Threads, not asyncio: the store API is synchronous and thread-safe, and replication must keep
going while the broker's event loop is busy.  Each slave connection has a reader (handshake, then
the slave's 8-byte offset reports) and a writer (streams commit-log bytes from the offset the slave
asked).  :class:`GroupTransfer` holds the sends waiting for a slave and resolves all of them with
one acknowledgement, as group commit does for flushes.

With an ``epoch`` (the ``controller`` replication) the master only serves slaves of its own epoch,
knows which broker each connection is, and tells its owner of every slave's acknowledgement.

With a shared secret (``secret_file``) the master serves only slaves that prove they hold it (see
:mod:`.wire`): a slave without the proof never gets a byte and never counts as acknowledging.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tidemq.replication import ReplicaStatus

from .wire import (
    AUTH_REQUIRED,
    AUTH_SCHEME,
    CODECS,
    DIGESTS,
    HELLO_MAGIC,
    MAC_SIZE,
    MAX_ID,
    NONCE_SIZE,
    REPORT,
    HAAuthError,
    HAProtocolError,
    Session,
    auth_mac,
    choose,
    encode_frame,
    encode_hello,
    hello_bytes,
    hello_int,
    load_key,
    mac_ok,
    new_nonce,
    read_hello_body,
    recv_exact,
)

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
#: The least time between two frames that only carry a grown confirm offset to a slave (s): its
#: readers see a confirmed message at most this late when no data frame carries it sooner.
CONFIRM_BEAT_S = 0.02


class GroupTransfer:
    """Sends waiting until a slave acknowledged their end offset (GroupTransferService)."""

    def __init__(self) -> None:
        self.acked = 0  # the highest offset any slave confirmed (push2SlaveMaxOffset)
        self._heap: list[tuple[int, int, float, Future[ReplicaStatus]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(
            target=self._expire_loop, name="tidemq-ha-group-transfer", daemon=True
        )
        self._thread.start()

    @property
    def waiting(self) -> int:
        return len(self._heap)

    def wait(self, end_offset: int, timeout_s: float) -> Future[ReplicaStatus]:
        fut: Future[ReplicaStatus] = Future()
        with self._cond:
            if self.acked >= end_offset:
                fut.set_result(ReplicaStatus.PUT_OK)
                return fut
            heapq.heappush(self._heap, (end_offset, next(self._seq), time.monotonic() + timeout_s, fut))
            self._cond.notify()
        return fut

    def ack(self, offset: int) -> None:
        done: list[Future[ReplicaStatus]] = []
        with self._cond:
            if offset <= self.acked:
                return
            self.acked = offset
            while self._heap and self._heap[0][0] <= offset:
                done.append(heapq.heappop(self._heap)[3])
        for fut in done:
            if not fut.done():
                fut.set_result(ReplicaStatus.PUT_OK)

    def _expire_loop(self) -> None:
        while True:
            expired: list[Future[ReplicaStatus]] = []
            with self._cond:
                if self._stop:
                    pending = [e[3] for e in self._heap]
                    self._heap.clear()
                    break
                now = time.monotonic()
                soonest = min((e[2] for e in self._heap), default=now + 1.0)
                if soonest > now:
                    self._cond.wait(soonest - now)
                    continue
                keep = [e for e in self._heap if e[2] > now]
                expired = [e[3] for e in self._heap if e[2] <= now]
                heapq.heapify(keep)
                self._heap = keep
            for fut in expired:
                if not fut.done():
                    fut.set_result(ReplicaStatus.FLUSH_SLAVE_TIMEOUT)
        for fut in pending:
            if not fut.done():
                fut.set_result(ReplicaStatus.SLAVE_NOT_AVAILABLE)

    def shutdown(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(2)


class SlaveRefused(HAProtocolError):
    """The master refuses this slave (epoch, identity): logged as such, not as a lost connection."""


class HAConnection:
    """One connected slave."""

    def __init__(self, server: HAServer, sock: socket.socket, address: str):
        self.server = server
        self.sock = sock
        self.address = address
        self.session = Session()
        self.broker_id: int | None = None  # from the hello (epoch sessions only)
        self.epoch = -1  # the epoch this connection serves, -1 without
        self.ack_offset = -1  # the slave's last reported commit-log end
        self.request_offset = -1  # where the slave asked the stream to start
        self.sent_offset = -1
        self.bytes_sent = 0
        # RocketMQ 5's lastCaughtUpTime: when a report last reached the master's end as of the
        # previous catch-up, so a slave that keeps up under steady writes still counts as caught up.
        self.caught_up_at = 0.0
        self.catchup_target = server.store.get_max_phy_offset()
        # Set once the slave is through the handshake (authenticated, when a secret is set) and has
        # sent its first report: only then does it count as a slave (HAServer.slave_count).
        self.established = False
        #: The writer waits for data with nothing to send (a grown confirm offset must wake it).
        self.parked = False
        self.closed = threading.Event()
        self._close_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_loop, name=f"tidemq-ha-read-{address}", daemon=True)
        self._writer = threading.Thread(
            target=self._write_loop, name=f"tidemq-ha-write-{address}", daemon=True
        )

    def start(self) -> None:
        self._reader.start()

    def close(self) -> None:
        with self._close_lock:  # reader and writer may both close
            if self.closed.is_set():
                return
            self.closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.server.connection_closed(self)

    # -------------------------------------------------------------- slave -> master
    def _read_loop(self) -> None:
        opts = self.server.options
        try:
            self.sock.settimeout(opts.housekeeping_s)
            first = recv_exact(self.sock, 8)
            if first == HELLO_MAGIC:
                self._handshake(read_hello_body(self.sock))
                first = recv_exact(self.sock, 8)
            elif self.server.key is not None:
                # The plain protocol cannot carry a proof (nor an answer a plain slave would read).
                self.server.auth_failed()
                raise SlaveRefused(f"plain RocketMQ slave refused: {AUTH_REQUIRED}")
            elif self.server.epoch is not None:
                # The plain protocol has no way to say which election the slave follows.
                raise SlaveRefused(
                    f"plain RocketMQ slave refused: master of epoch {self.server.epoch} serves"
                    " only slaves that name their epoch in the tidemq handshake"
                )
            log.info(
                "HA slave %s connected (%s, compression %s, digest %s%s)",
                self.address,
                "tidemq" if self.session.extended else "plain",
                self.session.codec,
                self.session.digest or "none",
                f", broker {self.broker_id}, epoch {self.epoch}" if self.epoch >= 0 else "",
            )
            self._on_report(REPORT.unpack(first)[0])
            self.established = True
            self._writer.start()
            while not self.closed.is_set():
                self._on_report(REPORT.unpack(recv_exact(self.sock, 8))[0])
        except SlaveRefused as exc:
            log.warning("HA slave %s refused: %s", self.address, exc)
        except (OSError, ConnectionError, HAProtocolError) as exc:
            if not self.closed.is_set():
                log.info("HA slave %s disconnected: %s", self.address, exc)
        except Exception:
            log.exception("HA slave %s: reader failed", self.address)
        finally:
            self.close()
            # After the last report, from this thread: the owner never sees an ack after the -1.
            if self.broker_id is not None:
                self.server.on_slave_ack(self.broker_id, -1, self)

    def _handshake(self, hello: dict[str, Any]) -> None:
        """Answer the slave's hello; with an epoch, refuse (answer, then raise) another epoch's slave.

        With a secret, refuse a slave that does not ask for authentication, and check its proof
        before the session (and the broker id its acknowledgements are counted for) is set.
        """
        server = self.server
        opts = server.options
        codec = choose(hello.get("compression"), opts.compression, CODECS) or "none"
        digest = choose(hello.get("digest"), "blake3", DIGESTS) if opts.digest else ""
        answer: dict[str, Any] = {"compression": codec, "digest": digest}
        slave_nonce = b""
        if server.key is not None:
            try:
                if hello.get("auth") != AUTH_SCHEME:
                    raise HAAuthError(AUTH_REQUIRED)
                slave_nonce = hello_bytes(hello, "nonce", NONCE_SIZE)
            except HAAuthError as exc:
                server.auth_failed()
                answer["error"] = str(exc)
                self.sock.sendall(encode_hello(answer))
                raise SlaveRefused(str(exc)) from None
        if server.epoch is None:
            self._authenticate(answer, slave_nonce, -1, -1)
            self.session = Session(extended=True, codec=codec, digest=digest)
            return
        answer["epoch"] = server.epoch
        newer: int | None = None
        try:
            slave_epoch = hello_int(hello, "epoch")
            broker_id = hello_int(hello, "brokerId")
            if slave_epoch is None or broker_id is None:
                raise HAProtocolError(
                    f"master of epoch {server.epoch} needs the slave's epoch and brokerId in the handshake"
                )
            if slave_epoch != server.epoch:
                newer = slave_epoch if slave_epoch > server.epoch else None
                raise HAProtocolError(
                    f"broker {broker_id} follows epoch {slave_epoch}, this master serves epoch {server.epoch}"
                )
        except HAProtocolError as exc:
            if newer is not None:  # a newer election exists: the owner fences this master
                server.newer_epoch(newer)
            answer["error"] = str(exc)
            self.sock.sendall(encode_hello(answer))
            raise SlaveRefused(str(exc)) from None
        confirm = hello.get("confirm") is True and server.confirm_offset is not None
        if confirm:
            answer["confirm"] = True
        self._authenticate(answer, slave_nonce, server.epoch, broker_id)
        self.broker_id = broker_id
        self.epoch = server.epoch
        server.claim(broker_id, self)
        self.session = Session(extended=True, codec=codec, digest=digest, epoch=server.epoch, confirm=confirm)

    def _authenticate(self, answer: dict[str, Any], slave_nonce: bytes, epoch: int, broker_id: int) -> None:
        """Send the answer (with the master's nonce and proof when a secret is set), then check the slave's MAC."""
        key = self.server.key
        if key is None:
            self.sock.sendall(encode_hello(answer))
            return
        master_nonce = new_nonce()
        answer["nonce"] = master_nonce.hex()
        answer["proof"] = auth_mac(key, b"master", slave_nonce, master_nonce, epoch, broker_id).hex()
        self.sock.sendall(encode_hello(answer))
        try:
            given = recv_exact(self.sock, MAC_SIZE)
        except ConnectionError:
            # What a slave with another secret does: it refuses this master's proof and hangs up.
            self.server.auth_failed()
            raise SlaveRefused(
                "it closed the connection during HA authentication (another secret?)"
            ) from None
        if not mac_ok(auth_mac(key, b"slave", slave_nonce, master_nonce, epoch, broker_id), given):
            self.server.auth_failed()
            raise SlaveRefused("it failed HA authentication (no or another shared secret)")

    def _on_report(self, offset: int) -> None:
        if offset < 0:
            raise HAProtocolError(f"slave reported negative offset {offset}")
        if self.request_offset < 0:
            self.request_offset = offset
        self.ack_offset = offset
        if offset >= self.catchup_target:
            self.caught_up_at = time.monotonic()
            self.catchup_target = self.server.store.get_max_phy_offset()
        self.server.on_ack(offset)
        if self.broker_id is not None:
            self.server.on_slave_ack(self.broker_id, offset, self)

    # -------------------------------------------------------------- master -> slave
    def _start_offset(self) -> int:
        store = self.server.store
        if self.request_offset > 0:
            return self.request_offset
        # A new slave starts at the beginning of the master's last file, not the whole history.
        end = store.get_max_phy_offset()
        file_size = self.server.file_size
        start = end - end % file_size if file_size else 0
        return max(start, store.get_min_phy_offset())

    def _confirm(self) -> int:
        """The master's confirm offset for this slave's frames (-1: none carried, or no bound)."""
        source = self.server.confirm_offset
        if not self.session.confirm or source is None:
            return -1
        value = source()
        return -1 if value is None else value

    def _write_loop(self) -> None:
        server = self.server
        opts = server.options
        store = server.store
        try:
            offset = self._start_offset()
            self.sent_offset = offset
            last_write = 0.0
            sent_confirm = -1
            while not self.closed.is_set():
                seen = server.data_version
                confirm = self._confirm()
                data = store.get_commit_log_data(offset)
                if data is not None and len(data) > 0:
                    with data:
                        raw = bytes(data[: whole_records(data, opts.transfer_batch)])
                    self.sock.sendall(b"".join(encode_frame(self.session, offset, raw, confirm)))
                    offset += len(raw)
                    self.sent_offset = offset
                    self.bytes_sent += len(raw)
                    last_write = time.monotonic()
                    sent_confirm = confirm
                    continue
                if data is not None:
                    data.release()
                # A heartbeat when due, or soon after the confirm offset grew (the slave's readers
                # wait for it: RocketMQ 5's slaves read up to the master's confirmOffset); data
                # frames carry it too, so under load it rarely needs a frame of its own.
                since = time.monotonic() - last_write
                if since >= opts.heartbeat_s or (confirm != sent_confirm and since >= CONFIRM_BEAT_S):
                    self.sock.sendall(b"".join(encode_frame(self.session, offset, b"", confirm)))
                    last_write = time.monotonic()
                    sent_confirm = confirm
                    since = 0.0
                if self.session.confirm and since < CONFIRM_BEAT_S:
                    # A frame went out lately: look at the confirm offset again when the beat is
                    # due (its acknowledgement moves it) rather than be woken by every ack.
                    server.wait_for_data(seen, CONFIRM_BEAT_S - since)
                    continue
                if self.session.confirm:
                    self.parked = True  # idle: a grown confirm offset wakes us (notify_confirm)
                    if self._confirm() != sent_confirm:
                        self.parked = False
                        continue
                server.wait_for_data(seen, opts.heartbeat_s)
                self.parked = False
        except (OSError, ConnectionError) as exc:
            if not self.closed.is_set():
                log.info("HA stream to %s ended: %s", self.address, exc)
        except Exception:
            log.exception("HA stream to %s failed", self.address)
        finally:
            self.close()


def whole_records(view: memoryview, limit: int) -> int:
    """How many bytes of ``view`` to send: whole records up to ``limit`` (at least one record).

    Commit-log records (and the BLANK filler ending a file) start with their 4-byte total size;
    batches cut at record boundaries let the slave index each batch at once instead of holding a
    split record until its tail arrives.  Unparseable bytes fall back to a plain ``limit`` cut.
    """
    pos, n = 0, len(view)
    while pos + 4 <= n:
        (size,) = _SIZE.unpack_from(view, pos)
        if size <= 0 or pos + size > n or (pos and pos + size > limit):
            break
        pos += size
    return pos or min(n, limit)


class HAServer:
    """Accepts slaves on the HA port and tracks what they acknowledged.

    ``epoch`` (None: none) makes it serve only slaves of that epoch; ``on_slave_ack(broker_id,
    offset)`` hears each identified slave's reports (and ``-1`` when it leaves); ``on_newer_epoch``
    hears of a slave following a newer epoch than this master's.  Both run on reader threads.
    ``confirm_offset`` (epoch sessions only): the master's confirm offset (None: no bound), sent
    in every frame to slaves that ask for it; call :meth:`notify_data` when it grows.
    """

    def __init__(
        self,
        store: Any,
        options: Any,
        host: str,
        port: int,
        on_ack: Any,
        *,
        epoch: int | None = None,
        on_slave_ack: Callable[[int, int], None] | None = None,
        on_newer_epoch: Callable[[int], None] | None = None,
        confirm_offset: Callable[[], int | None] | None = None,
    ):
        if epoch is not None and not 0 <= epoch <= MAX_ID:
            raise ValueError(f"HA epoch {epoch} is not in 0..{MAX_ID}")
        self.store = store
        self.options = options
        self.epoch = epoch
        self.file_size = store.commit_log_file_size  # a batch never crosses a file boundary
        self.key = load_key(options)  # None: no secret, slaves are not authenticated
        self.auth_failures = 0  # slaves refused for a wrong or missing proof
        self._on_ack = on_ack
        self._on_slave_ack = on_slave_ack
        self._on_newer_epoch = on_newer_epoch
        self.confirm_offset = confirm_offset
        self.connections: list[HAConnection] = []
        #: Each broker id's newest connection (past the handshake): only its reports count.
        self._newest: dict[int, HAConnection] = {}
        self._lock = threading.Lock()
        self._data = threading.Condition()
        self.data_version = 0
        self._sock = socket.create_server((host, port), reuse_port=False)
        self.address = self._sock.getsockname()[:2]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="tidemq-ha-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, peer = self._sock.accept()
            except OSError:
                if self._stop.is_set():
                    return
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = HAConnection(self, sock, f"{peer[0]}:{peer[1]}")
            with self._lock:
                self.connections.append(conn)
            conn.start()

    def connection_closed(self, conn: HAConnection) -> None:
        with self._lock:
            if conn in self.connections:
                self.connections.remove(conn)
            if conn.broker_id is not None and self._newest.get(conn.broker_id) is conn:
                del self._newest[conn.broker_id]

    def on_ack(self, offset: int) -> None:
        self._on_ack(offset)

    def auth_failed(self) -> None:
        with self._lock:  # reader threads of several connections count at once
            self.auth_failures += 1

    def claim(self, broker_id: int, conn: HAConnection) -> None:
        """``conn`` is broker ``broker_id``'s newest connection (its handshake just passed)."""
        with self._lock:
            self._newest[broker_id] = conn

    def on_slave_ack(self, broker_id: int, offset: int, conn: HAConnection | None = None) -> None:
        """A slave's report (``-1``: its connection closed).  A report of a connection that the
        same broker has replaced since is dropped: the owner counts each slave's newest report,
        also when it is lower (a slave back with a shorter log), so a late one of the old
        connection must not bring back the offset it no longer holds.  So is the close of a
        replaced connection: the slave is connected (its newest connection's reports count)."""
        if self._on_slave_ack is None:
            return
        if conn is not None:
            newest = self._newest.get(broker_id)
            if offset >= 0 and newest is not conn:
                return
            if offset < 0 and newest is not None and newest is not conn:
                return
        try:
            self._on_slave_ack(broker_id, offset)
        except Exception:  # the owner's bug must not drop the slave's connection
            log.exception("on_slave_ack(%d, %d) failed", broker_id, offset)

    def newer_epoch(self, epoch: int) -> None:
        if self._on_newer_epoch is None:
            return
        try:
            self._on_newer_epoch(epoch)
        except Exception:
            log.exception("on_newer_epoch(%d) failed", epoch)

    def notify_data(self) -> None:
        """New commit-log bytes exist: wake the writers."""
        with self._data:
            self.data_version += 1
            self._data.notify_all()

    def notify_confirm(self) -> None:
        """The confirm offset grew: wake the writers that wait with nothing to send (any thread);
        the others send it in their next frame, or within ``CONFIRM_BEAT_S``."""
        if any(c.parked for c in self.connections):
            self.notify_data()

    def wait_for_data(self, seen: int, timeout: float) -> None:
        with self._data:
            if self.data_version == seen:
                self._data.wait(timeout)

    @property
    def slave_count(self) -> int:
        """Connected slaves past the handshake: a peer still authenticating (or refused) is none."""
        with self._lock:
            return sum(1 for conn in self.connections if conn.established and not conn.closed.is_set())

    def shutdown(self) -> None:
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in the other thread
        except OSError:
            pass
        self._sock.close()
        self._thread.join(2)
        for conn in list(self.connections):
            conn.close()
        self.notify_data()
