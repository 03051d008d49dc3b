"""RocketMQ 4.x messages themselves: flags, properties, tag codes, the message types and message ids.

Import these from :mod:`tidemq.message`, which adds the record layer (compiled or Python).  This
module sits under both :mod:`tidemq.message` and the record reference :mod:`tidemq.record`, so
neither imports the other's importer.  It picks the compiled message id
(``tidemq._native._message_id``) at import, through :func:`tidemq.extensions.compiled_twin`.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
import zlib
from collections.abc import Callable, Mapping

import attrs

from tidemq.errors import CorruptDataError
from tidemq.extensions import compiled_twin

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


_ids = compiled_twin("tidemq._native._message_id")
#: RocketMQ's offset message id (the compiled one when built; same string as
#: :func:`py_create_message_id`).
create_message_id: Callable[[HostPort, int], str] = (
    py_create_message_id if _ids is None else _ids.create_message_id
)

# The public types keep their public home in their name (repr, pickling, documentation).
for _cls in (Prop, MessageInner, MessageExt, BatchItem, BatchLimitError):
    _cls.__module__ = "tidemq.message"
del _cls
