"""The HA wire format between a master and its slaves (RocketMQ's HAService protocol, extended).

Plain RocketMQ protocol, spoken when the slave does not open with the handshake:

* slave -> master: ``<maxPhyOffset 8>`` (its commit-log end), every few seconds and after each batch;
* master -> slave: ``<phyOffset 8><bodySize 4><data bodySize>`` (``bodySize`` 0 is a heartbeat).

tidemq extension, negotiated by a handshake the slave sends first (``HELLO_MAGIC`` then a 4-byte
length and a JSON object ``{"compression": [...], "digest": [...]}``; the master answers the same
way with the one codec and digest it picked).  Each master frame then carries, after
``<phyOffset 8><bodySize 4>``, an extension ``<codec 1><rawSize 4><digest 32>`` and ``bodySize``
bytes of (possibly compressed) payload.  The digest is blake3 of the raw bytes, so a batch damaged
on the wire (in the payload or the compressed stream) is detected and never appended.

Epochs (the ``controller`` replication): the slave's hello adds ``"brokerId"`` and ``"epoch"`` (the
election it follows); the master answers with ``"epoch"`` (the one it serves) and, when it refuses
the slave, an ``"error"`` text before closing.  Both sides refuse a peer of another epoch.  On such
a session every master frame (data and heartbeat) adds ``<epoch 8>`` (signed) after the extension
head, and a frame of another epoch is refused (:class:`StaleEpochError`).  Without an epoch, frames
are exactly the ones above.

Confirm offset (the ``controller`` replication's SYNC masters, RocketMQ 5's confirmOffset in its HA
transfer header): a slave of an epoch session may add ``"confirm": true`` to its hello; a master
that tracks one answers ``"confirm": true``, and every master frame then adds ``<confirm 8>``
(signed; -1: no bound) after the epoch: what every member of the in-sync set holds, the offset up
to which the slave lets consumers read.  The master sends a heartbeat when it grows.

Authentication (``secret_file``): both sides derive a 32-byte key from the shared secret (blake3's
``derive_key`` mode, context :data:`KEY_CONTEXT`) and prove it with blake3 keyed hashes (a MAC).
The slave's hello adds ``"auth": "blake3-keyed"`` and ``"nonce"`` (32 random bytes, hex); the
master's answer adds its own ``"nonce"`` and ``"proof"`` = ``MAC("master" | slave nonce | master
nonce | epoch | brokerId)`` (hex); the slave checks it and sends, before its first report, the raw
32 bytes ``MAC("slave" | slave nonce | master nonce | epoch | brokerId)``, which the master checks
before streaming anything.  Epoch and brokerId are signed 8-byte big-endian, -1 when the session
has none.  Fresh nonces on both sides make a recorded proof useless on another connection.  The
stream itself is not encrypted nor MACed per frame: that needs a private network or a TLS tunnel.
"""

from __future__ import annotations

import hmac
import os
import socket
import struct
from typing import Any

import attrs
import blake3
import lz4.block
import orjson
import zstandard

from tidemq.compression import inflate_zstd
from tidemq.errors import ConfigError, CorruptDataError, TidemqError
from tidemq.secretfile import private_mode_problem

#: First bytes of a tidemq handshake; as a big-endian offset it would be absurd, so never ambiguous.
HELLO_MAGIC = b"TMHA\x00\x01\xff\xfe"
REPORT = struct.Struct(">q")
FRAME_HEAD = struct.Struct(">qi")
EXT_HEAD = struct.Struct(">BI32s")
EPOCH = struct.Struct(">q")
MAX_HELLO = 4096
#: Epochs and broker ids travel as signed 8-byte integers: anything larger is refused.
MAX_ID = 2**63 - 1

CODECS = {"none": 0, "lz4": 1, "zstd": 2}
CODEC_NAMES = {v: k for k, v in CODECS.items()}
DIGESTS = ("blake3",)
NO_DIGEST = bytes(32)

AUTH_SCHEME = "blake3-keyed"
KEY_CONTEXT = "tidemq 2026-11 HA handshake shared-secret key v1"
NONCE_SIZE = MAC_SIZE = 32
MIN_SECRET = 16
#: A secret file larger than this is a mistake (a log, a device): refused before it is read whole.
MAX_SECRET = 4096
AUTH_REQUIRED = "this master requires HA authentication"
_IDS = struct.Struct(">qq")


class HAProtocolError(TidemqError):
    """The peer broke the HA protocol (bad handshake, frame, digest): the connection is dropped."""


class CorruptBatchError(HAProtocolError):
    """A transferred batch does not match its digest or cannot be decompressed."""


class StaleEpochError(HAProtocolError):
    """The peer serves (or a frame carries) another epoch than this side's: nothing is replicated."""


class HAAuthError(HAProtocolError):
    """The peer did not prove it holds the shared secret: nothing is replicated."""


@attrs.frozen
class Session:
    """What the handshake agreed: ``extended`` False means the plain RocketMQ protocol.

    ``epoch`` -1: no epoch on this connection (frames carry none); else the epoch every frame carries.
    """

    extended: bool = False
    codec: str = "none"
    digest: str = ""
    epoch: int = -1
    #: Frames carry the master's confirm offset (``<confirm 8>`` after the epoch).
    confirm: bool = False


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes, or :class:`ConnectionError` when the peer closes first."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("HA peer closed the connection")
        buf += chunk
    return bytes(buf)


def encode_hello(payload: dict[str, Any]) -> bytes:
    body = orjson.dumps(payload)
    return HELLO_MAGIC + struct.pack(">I", len(body)) + body


def read_hello_body(sock: socket.socket) -> dict[str, Any]:
    (n,) = struct.unpack(">I", recv_exact(sock, 4))
    if n > MAX_HELLO:
        raise HAProtocolError(f"HA handshake of {n} bytes is too large")
    try:
        data = orjson.loads(recv_exact(sock, n))
    except orjson.JSONDecodeError as exc:
        raise HAProtocolError(f"HA handshake is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise HAProtocolError("HA handshake is not a JSON object")
    return data


def hello_int(hello: dict[str, Any], key: str) -> int | None:
    """``hello[key]`` as an id/epoch: None when absent, :class:`HAProtocolError` when not one."""
    value = hello.get(key)
    if value is None:
        return None
    # bool is an int subclass in Python, and JSON true is no epoch.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise HAProtocolError(f"HA handshake {key} {str(value)[:40]!r} is not an integer in 0..{MAX_ID}")
    return value


def choose(offered: Any, preferred: str, table: Any) -> str:
    """The master's pick: its preferred choice when the slave offers it, else none."""
    offered = offered if isinstance(offered, list) else []
    return preferred if preferred in offered and preferred in table else ""


def compress(codec: str, raw: bytes) -> bytes:
    if codec == "lz4":
        return lz4.block.compress(raw, store_size=False)
    if codec == "zstd":
        return zstandard.ZstdCompressor(level=1).compress(raw)
    return raw


def decompress(codec: str, payload: bytes, raw_size: int) -> bytes:
    try:
        if codec == "lz4":
            return lz4.block.decompress(payload, uncompressed_size=raw_size)
        if codec == "zstd":
            # Bounded by the size the header announced (itself checked against the frame limit):
            # a frame claiming a larger content size is refused before anything is allocated.
            return inflate_zstd(payload, raw_size)
    except (lz4.block.LZ4BlockError, CorruptDataError) as exc:
        raise CorruptBatchError(f"{codec} batch cannot be decompressed: {exc}") from exc
    return payload


def encode_frame(session: Session, offset: int, raw: bytes, confirm: int = -1) -> list[bytes]:
    """One master -> slave frame for ``raw`` commit-log bytes starting at ``offset`` (and, on a
    session that carries it, the master's ``confirm`` offset; -1: no bound)."""
    if not session.extended:
        return [FRAME_HEAD.pack(offset, len(raw)), raw]
    payload = compress(session.codec, raw) if raw else raw
    if len(payload) >= len(raw):
        codec = "none"  # incompressible: send as is rather than grow it
        payload = raw
    else:
        codec = session.codec
    digest = blake3.blake3(raw).digest() if session.digest else NO_DIGEST
    head = FRAME_HEAD.pack(offset, len(payload)) + EXT_HEAD.pack(CODECS[codec], len(raw), digest)
    if session.epoch >= 0:
        head += EPOCH.pack(session.epoch)
        if session.confirm:
            head += EPOCH.pack(confirm)
    return [head, payload]


def read_frame(sock: socket.socket, session: Session, max_body: int) -> tuple[int, bytes]:
    """The next frame from the master: ``(phyOffset, raw bytes)``, verified."""
    offset, raw, _confirm = read_frame_confirm(sock, session, max_body)
    return offset, raw


def read_frame_confirm(sock: socket.socket, session: Session, max_body: int) -> tuple[int, bytes, int]:
    """The next frame from the master: ``(phyOffset, raw bytes, confirm offset)``, verified; the
    confirm offset is -1 when the session carries none (or the master sets no bound)."""
    confirm = -1
    offset, size = FRAME_HEAD.unpack(recv_exact(sock, FRAME_HEAD.size))
    if size < 0 or size > max_body:
        raise HAProtocolError(f"HA frame of {size} bytes at offset {offset} is out of bounds")
    if not session.extended:
        return offset, recv_exact(sock, size), confirm
    codec_id, raw_size, digest = EXT_HEAD.unpack(recv_exact(sock, EXT_HEAD.size))
    codec = CODEC_NAMES.get(codec_id)
    if codec is None or raw_size > max_body:
        raise CorruptBatchError(
            f"HA frame at offset {offset} has a bad header (codec {codec_id}, {raw_size} bytes)"
        )
    if session.epoch >= 0:
        # Checked before the payload is read: a stale master's bytes are never even buffered.
        (epoch,) = EPOCH.unpack(recv_exact(sock, EPOCH.size))
        if epoch != session.epoch:
            raise StaleEpochError(
                f"HA frame at offset {offset} carries epoch {epoch}, the session's is {session.epoch}"
            )
        if session.confirm:
            (confirm,) = EPOCH.unpack(recv_exact(sock, EPOCH.size))
            if confirm < -1:
                raise HAProtocolError(f"HA frame at offset {offset} carries confirm offset {confirm}")
    payload = recv_exact(sock, size)
    raw = decompress(codec, payload, raw_size)
    if len(raw) != raw_size:
        raise CorruptBatchError(f"HA batch at offset {offset} is {len(raw)} bytes, header says {raw_size}")
    if session.digest and blake3.blake3(raw).digest() != digest:
        raise CorruptBatchError(f"HA batch at offset {offset} ({raw_size} bytes) fails its blake3 digest")
    return offset, raw, confirm


# ------------------------------------------------------------------ authentication
def read_secret(path: str, option: str = "secret_file") -> bytes:
    """The shared secret in the file ``path`` (one trailing newline stripped), or a one-line ConfigError."""
    problem = private_mode_problem(os.path.expanduser(path), "HA secret file")  # refused as ssh would
    if problem:
        raise ConfigError(f"{option}: {problem}")
    try:
        with open(os.path.expanduser(path), "rb") as f:
            data = f.read(MAX_SECRET + 1)
    except OSError as exc:
        raise ConfigError(f"{option} = {path!r}: cannot read the HA secret: {exc.strerror or exc}") from None
    if len(data) > MAX_SECRET:
        raise ConfigError(f"{option} = {path!r}: an HA secret file holds at most {MAX_SECRET} bytes")
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    if not data:
        raise ConfigError(f"{option} = {path!r}: the HA secret file is empty")
    if len(data) < MIN_SECRET:
        raise ConfigError(
            f"{option} = {path!r}: the HA secret is {len(data)} bytes, it needs at least {MIN_SECRET}"
        )
    return data


def load_key(options: Any) -> bytes | None:
    """The MAC key from ``options.secret_file`` (None without one): read once, by HAServer/HAClient."""
    path = str(getattr(options, "secret_file", "") or "")
    if not path:
        return None
    return blake3.blake3(read_secret(path), derive_key_context=KEY_CONTEXT).digest()


def new_nonce() -> bytes:
    return os.urandom(NONCE_SIZE)


def auth_mac(
    key: bytes, label: bytes, slave_nonce: bytes, master_nonce: bytes, epoch: int, broker_id: int
) -> bytes:
    """``MAC(key, label | slave_nonce | master_nonce | epoch | brokerId)``; label is b"master" or b"slave".

    The nonces are fixed-size and the labels differ in length, so no two inputs collide.
    """
    data = label + slave_nonce + master_nonce + _IDS.pack(epoch, broker_id)
    return blake3.blake3(data, key=key).digest()


def mac_ok(expected: bytes, given: bytes) -> bool:
    return hmac.compare_digest(expected, given)


def hello_bytes(hello: dict[str, Any], key: str, size: int) -> bytes:
    """``hello[key]``: hex of exactly ``size`` bytes, else :class:`HAAuthError` (never another error)."""
    value = hello.get(key)
    if not isinstance(value, str) or len(value) != 2 * size:
        raise HAAuthError(f"HA handshake {key} is missing or not {size} bytes of hex")
    try:
        data = bytes.fromhex(value)
    except ValueError:
        raise HAAuthError(f"HA handshake {key} is not hex") from None
    if len(data) != size:  # fromhex skips whitespace
        raise HAAuthError(f"HA handshake {key} is not {size} bytes of hex")
    return data
