"""RocketMQ 4.x messages: flags, properties, tag codes, the message types and message ids.

The record layer (the commit-log record layout, :class:`RecordEncoder`, :func:`decode_message`,
:func:`iter_messages`, :func:`record_crc_ok`, :func:`record_mismatch`, the SEND_BATCH_MESSAGE
body codec :func:`encode_batch` / :func:`decode_batch`...) is importable from here too.  Its
pure-Python reference lives in :mod:`tidemq.record`; this module hands out the compiled version
of the hot functions instead when ``tidemq._native._codec`` is built and ``TIDEMQ_NO_EXTENSIONS``
is not set (:data:`tidemq._native.DESCRIPTION` says which runs).  The Python versions stay
reachable as ``tidemq.record.<name>`` and :func:`py_create_message_id` (the differential tests
compare the two).
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import struct
import zlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from tidemq import _native
from tidemq.errors import CorruptDataError

if TYPE_CHECKING:  # served by __getattr__ at run time: tidemq.record imports this module
    from tidemq.record import POS_BODYCRC as POS_BODYCRC
    from tidemq.record import POS_BORNHOST as POS_BORNHOST
    from tidemq.record import POS_BORNTIMESTAMP as POS_BORNTIMESTAMP
    from tidemq.record import POS_FLAG as POS_FLAG
    from tidemq.record import POS_MAGIC as POS_MAGIC
    from tidemq.record import POS_PHYSICALOFFSET as POS_PHYSICALOFFSET
    from tidemq.record import POS_QUEUEID as POS_QUEUEID
    from tidemq.record import POS_QUEUEOFFSET as POS_QUEUEOFFSET
    from tidemq.record import POS_SYSFLAG as POS_SYSFLAG
    from tidemq.record import POS_TOTALSIZE as POS_TOTALSIZE
    from tidemq.record import SCAN_CAREFUL as SCAN_CAREFUL
    from tidemq.record import SCAN_END as SCAN_END
    from tidemq.record import SCAN_FULL as SCAN_FULL
    from tidemq.record import PreparedBatch as PreparedBatch
    from tidemq.record import RecordEncoder as RecordEncoder
    from tidemq.record import decode_batch as decode_batch
    from tidemq.record import decode_batch_messages as decode_batch_messages
    from tidemq.record import decode_message as decode_message
    from tidemq.record import encode_batch as encode_batch
    from tidemq.record import encode_message as encode_message
    from tidemq.record import iter_messages as iter_messages
    from tidemq.record import pack_cq_entries as pack_cq_entries
    from tidemq.record import patch_record as patch_record
    from tidemq.record import record_crc_ok as record_crc_ok
    from tidemq.record import record_mismatch as record_mismatch
    from tidemq.record import scan_queue as scan_queue
    from tidemq.record import store_timestamp_pos as store_timestamp_pos

try:  # zlib-ng's SIMD CRC32: same values as zlib's, about 6x faster on the store's hot path
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # pragma: no cover - the dependency is declared; stay correct without it
    _crc32 = zlib.crc32

MESSAGE_MAGIC_CODE = 0xDAA320A7  # -626843481 as a Java int
BLANK_MAGIC_CODE = 0xCBD43194  # -875286124: end-of-file filler when a record does not fit

# sysFlag bits (MessageSysFlag)
COMPRESSED_FLAG = 1 << 0
MULTI_TAGS_FLAG = 1 << 1
TRANSACTION_NOT_TYPE = 0
TRANSACTION_PREPARED_TYPE = 1 << 2
TRANSACTION_COMMIT_TYPE = 2 << 2
TRANSACTION_ROLLBACK_TYPE = 3 << 2
TRANSACTION_TYPE_MASK = 3 << 2
BORNHOST_V6_FLAG = 1 << 4
STOREHOSTADDRESS_V6_FLAG = 1 << 5
# RocketMQ 5 marks the compression algorithm in bits 8-10 next to COMPRESSED_FLAG.
COMPRESSION_TYPE_MASK = 7 << 8
COMPRESSION_ZLIB = 0  # 4.x clients know only zlib (type bits 0)
#: RocketMQ 5 producers mark zlib explicitly (CompressionType.ZLIB = 3); 0 and 3 both read as zlib.
COMPRESSION_ZLIB_V5 = 3 << 8
COMPRESSION_LZ4 = 1 << 8
COMPRESSION_ZSTD = 2 << 8

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


class Prop:
    """Well-known property keys (MessageConst)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT_STORE_MSG_OK = "WAIT"
    DELAY_TIME_LEVEL = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QUEUE_ID = "REAL_QID"
    TRANSACTION_PREPARED = "TRAN_MSG"
    PRODUCER_GROUP = "PGROUP"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME = "RECONSUME_TIME"
    MSG_REGION = "MSG_REGION"
    TRACE_SWITCH = "TRACE_ON"
    UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIMESTAMP = "CONSUME_START_TIME"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    SHARDING_KEY = "__SHARDINGKEY"
    CLUSTER = "CLUSTER"
    # Request-reply (RocketMQ 4.6+).
    CORRELATION_ID = "CORRELATION_ID"
    REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
    MESSAGE_TTL = "TTL"
    MESSAGE_TYPE = "MSG_TYPE"
    REPLY_MESSAGE_ARRIVE_TIME = "ARRIVE_TIME"
    PUSH_REPLY_TIME = "PUSH_REPLY_TIME"


_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")


def java_string_hash(s: str) -> int:
    """``String.hashCode()`` of Java, as a signed 32-bit int (UTF-16 code units)."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_hash_code(tags: str | None) -> int:
    """The tag code stored in a ConsumeQueue entry (0 when the message has no tag)."""
    return java_string_hash(tags) if tags else 0


#: Tags repeat across messages; Java's String.hashCode in Python costs microseconds per call.
_cached_tags_code = functools.lru_cache(maxsize=65536)(tags_hash_code)


def body_crc(body: bytes | memoryview) -> int:
    """CRC32 of the body masked to a non-negative Java int, as RocketMQ's ``UtilAll.crc32``."""
    return _crc32(body) & 0x7FFFFFFF


def properties_to_string(props: Mapping[str, str]) -> str:
    """Encode properties as ``k\\x01v\\x02`` pairs (RocketMQ's messageProperties2String)."""
    if not props:
        return ""
    # map over C-level str.join: about 3x faster than a generator of f-strings (store hot path).
    try:
        return PROPERTY_SEPARATOR.join(map(NAME_VALUE_SEPARATOR.join, props.items())) + PROPERTY_SEPARATOR
    except TypeError:  # a non-str value: format it as the Java side would print it
        return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items())


def string_to_properties(s: str) -> dict[str, str]:
    """Decode a properties string; pairs without a separator are ignored as RocketMQ does."""
    out: dict[str, str] = {}
    for item in s.split(PROPERTY_SEPARATOR):
        k, sep, v = item.partition(NAME_VALUE_SEPARATOR)
        if sep and k:
            out[k] = v
    return out


HostPort = tuple[str, int]


@functools.lru_cache(maxsize=4096)
def _host_bytes(host: HostPort) -> tuple[bytes, bool]:
    # Cached: parsing the address dominated the store's encode path; hosts repeat.
    ip = ipaddress.ip_address(host[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # Java's InetAddress turns ::ffff:a.b.c.d into an Inet4Address
    return ip.packed + _I32.pack(host[1]), ip.version == 6


@attrs.define
class MessageInner:
    """A message the broker is about to store (MessageExtBrokerInner)."""

    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    properties: dict[str, str] = attrs.field(factory=dict)
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: HostPort = ("127.0.0.1", 0)
    store_host: HostPort = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(Prop.KEYS, "").split(" ") if k]


@attrs.define
class MessageExt:
    """A message decoded from a stored record."""

    topic: str
    body: bytes
    queue_id: int
    flag: int
    queue_offset: int
    commit_log_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: HostPort
    store_timestamp: int
    store_host: HostPort
    reconsume_times: int
    prepared_transaction_offset: int
    properties: dict[str, str]
    body_crc: int
    store_size: int

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(Prop.KEYS, "").split(" ") if k]

    @property
    def msg_id(self) -> str:
        """The offset message id (store host + commit-log offset)."""
        return create_message_id(self.store_host, self.commit_log_offset)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)


@attrs.define
class BatchItem:
    """One message inside a SEND_BATCH_MESSAGE body."""

    body: bytes
    flag: int
    properties: dict[str, str]


class BatchLimitError(CorruptDataError):
    """A batch holds more messages than the broker takes in one request."""


# ---------------------------------------------------------------------------- message ids


def py_create_message_id(store_host: HostPort, commit_log_offset: int) -> str:
    """RocketMQ's offset message id: store IP, port and commit-log offset as upper-case hex."""
    return (_host_bytes(tuple(store_host))[0] + _I64.pack(commit_log_offset)).hex().upper()


def decode_message_id(msg_id: str) -> tuple[HostPort, int]:
    """Inverse of :func:`create_message_id`; ``ValueError`` when it is not an offset message id."""
    raw = bytes.fromhex(msg_id)
    if len(raw) == 16:
        ip_len = 4
    elif len(raw) == 28:
        ip_len = 16
    else:
        raise ValueError(f"{msg_id!r} is not an offset message id")
    ip = str(ipaddress.ip_address(raw[:ip_len]))
    (port,) = _I32.unpack_from(raw, ip_len)
    (offset,) = _I64.unpack_from(raw, ip_len + 4)
    return (ip, port), offset


def local_ip() -> str:
    """This machine's routable IPv4 address for ids and broker registration; loopback when it has none.

    The address of the interface a packet to a private address would leave by (a UDP ``connect``
    sends nothing), else a non-loopback address the host name resolves to: on many systems the
    host name alone resolves to 127.0.0.1 or 127.0.1.1, which no other machine can reach.
    """
    for probe in ("10.255.255.255", "192.0.2.255"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                ip = s.getsockname()[0]
        except OSError:  # no route at all
            continue
        if not ipaddress.ip_address(ip).is_loopback and not ipaddress.ip_address(ip).is_unspecified:
            return str(ip)
    try:
        names = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        names = []
    for *_, sockaddr in names:
        if not ipaddress.ip_address(sockaddr[0]).is_loopback:
            return str(sockaddr[0])
    return "127.0.0.1"


# ---------------------------------------------------------------------------- implementation selection

#: RocketMQ's offset message id (the compiled one when active; same string as
#: :func:`py_create_message_id`).
create_message_id: Callable[[HostPort, int], str] = (
    _native.codec.create_message_id if _native.codec is not None else py_create_message_id
)

#: Names of the record layer served from :mod:`tidemq.record` (compiled where :mod:`tidemq._native`
#: has a version).
_RECORD_NAMES = frozenset(
    {
        "POS_TOTALSIZE",
        "POS_MAGIC",
        "POS_BODYCRC",
        "POS_QUEUEID",
        "POS_FLAG",
        "POS_QUEUEOFFSET",
        "POS_PHYSICALOFFSET",
        "POS_SYSFLAG",
        "POS_BORNTIMESTAMP",
        "POS_BORNHOST",
        "PreparedBatch",
        "RecordEncoder",
        "decode_batch",
        "decode_batch_messages",
        "decode_message",
        "encode_batch",
        "encode_message",
        "iter_messages",
        "pack_cq_entries",
        "patch_record",
        "record_crc_ok",
        "record_mismatch",
        "SCAN_CAREFUL",
        "SCAN_END",
        "SCAN_FULL",
        "scan_queue",
        "store_timestamp_pos",
        # private, but importable from here before the split
        "_BATCH_STRUCT_MIN",
        "_CRC_AND_SYSFLAG",
        "_ENTRY_HEAD",
        "_HEAD",
        "_IPV4_BODY_POS",
        "_PROPS_LEN",
        "_RECORD_HEADS",
        "_V6_FLAGS",
        "_read_host",
    }
)
_NATIVE_NAMES = frozenset(
    {
        "RecordEncoder",
        "decode_batch",
        "decode_batch_messages",
        "decode_message",
        "iter_messages",
        "pack_cq_entries",
        "record_crc_ok",
        "record_mismatch",
        "scan_queue",
    }
)


#: The message and record format: what store plugins write and readers of stored bytes decode.
__all__ = [
    "SCAN_CAREFUL",
    "SCAN_END",
    "SCAN_FULL",
    "BLANK_MAGIC_CODE",
    "BatchItem",
    "BatchLimitError",
    "COMPRESSED_FLAG",
    "COMPRESSION_TYPE_MASK",
    "COMPRESSION_ZLIB",
    "COMPRESSION_ZSTD",
    "MESSAGE_MAGIC_CODE",
    "MULTI_TAGS_FLAG",
    "MessageExt",
    "MessageInner",
    "NAME_VALUE_SEPARATOR",
    "PROPERTY_SEPARATOR",
    "PreparedBatch",
    "Prop",
    "RecordEncoder",
    "TRANSACTION_COMMIT_TYPE",
    "TRANSACTION_NOT_TYPE",
    "TRANSACTION_PREPARED_TYPE",
    "TRANSACTION_ROLLBACK_TYPE",
    "TRANSACTION_TYPE_MASK",
    "body_crc",
    "create_message_id",
    "decode_batch",
    "decode_batch_messages",
    "decode_message",
    "decode_message_id",
    "encode_batch",
    "encode_message",
    "iter_messages",
    "java_string_hash",
    "local_ip",
    "pack_cq_entries",
    "patch_record",
    "properties_to_string",
    "record_crc_ok",
    "record_mismatch",
    "scan_queue",
    "store_timestamp_pos",
    "string_to_properties",
    "tags_hash_code",
]


def __getattr__(name: str) -> Any:
    """The record layer, imported on first use (PEP 562): ``tidemq.record`` imports this module."""
    if name not in _RECORD_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from tidemq import record

    codec = _native.codec
    value = getattr(codec if codec is not None and name in _NATIVE_NAMES else record, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | {n for n in _RECORD_NAMES if not n.startswith("_")})
