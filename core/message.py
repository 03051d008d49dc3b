"""RocketMQ 4.x messages: flags, properties, tag codes, the message types, message ids and records.

The messages themselves are defined in :mod:`tidemq.message_types`; the record layer (the
commit-log record layout, :class:`RecordEncoder`, :func:`decode_message`, :func:`iter_messages`,
:func:`record_crc_ok`, :func:`record_mismatch`, :func:`scan_queue`, the SEND_BATCH_MESSAGE body
codec :func:`encode_batch` / :func:`decode_batch`...) in :mod:`tidemq.record`, the pure-Python
reference.  This module serves both.  For each family of the record layer with a compiled twin it
picks, once at import, the compiled module when it is built (:func:`tidemq.extensions.compiled_twin`
says why not, and ``TIDEMQ_NO_EXTENSIONS=1`` asks for Python), aiokafka's way:

================================  ========================================================
``tidemq._native._record_decode``  decode_message, iter_messages, record_crc_ok, record_mismatch
``tidemq._native._batch_decode``   decode_batch, decode_batch_messages
``tidemq._native._pull_walk``      scan_queue
``tidemq._native._record_encode``  RecordEncoder, pack_cq_entries
``tidemq._native._message_id``     create_message_id (picked in :mod:`tidemq.message_types`)
================================  ========================================================

The Python versions stay reachable as ``tidemq.record.<name>`` and :func:`py_create_message_id`
(the differential tests compare the two).
"""

from __future__ import annotations

import ipaddress
import socket
from typing import TYPE_CHECKING

from tidemq import record as _reference
from tidemq.extensions import compiled_twin
from tidemq.message_types import BLANK_MAGIC_CODE as BLANK_MAGIC_CODE
from tidemq.message_types import BORNHOST_V6_FLAG as BORNHOST_V6_FLAG
from tidemq.message_types import COMPRESSED_FLAG as COMPRESSED_FLAG
from tidemq.message_types import COMPRESSION_LZ4 as COMPRESSION_LZ4
from tidemq.message_types import COMPRESSION_TYPE_MASK as COMPRESSION_TYPE_MASK
from tidemq.message_types import COMPRESSION_ZLIB as COMPRESSION_ZLIB
from tidemq.message_types import COMPRESSION_ZLIB_V5 as COMPRESSION_ZLIB_V5
from tidemq.message_types import COMPRESSION_ZSTD as COMPRESSION_ZSTD
from tidemq.message_types import MESSAGE_MAGIC_CODE as MESSAGE_MAGIC_CODE
from tidemq.message_types import MULTI_TAGS_FLAG as MULTI_TAGS_FLAG
from tidemq.message_types import NAME_VALUE_SEPARATOR as NAME_VALUE_SEPARATOR
from tidemq.message_types import PROPERTY_SEPARATOR as PROPERTY_SEPARATOR
from tidemq.message_types import STOREHOSTADDRESS_V6_FLAG as STOREHOSTADDRESS_V6_FLAG
from tidemq.message_types import TRANSACTION_COMMIT_TYPE as TRANSACTION_COMMIT_TYPE
from tidemq.message_types import TRANSACTION_NOT_TYPE as TRANSACTION_NOT_TYPE
from tidemq.message_types import TRANSACTION_PREPARED_TYPE as TRANSACTION_PREPARED_TYPE
from tidemq.message_types import TRANSACTION_ROLLBACK_TYPE as TRANSACTION_ROLLBACK_TYPE
from tidemq.message_types import TRANSACTION_TYPE_MASK as TRANSACTION_TYPE_MASK
from tidemq.message_types import BatchItem as BatchItem
from tidemq.message_types import BatchLimitError as BatchLimitError
from tidemq.message_types import HostPort as HostPort
from tidemq.message_types import MessageExt as MessageExt
from tidemq.message_types import MessageInner as MessageInner
from tidemq.message_types import Prop as Prop
from tidemq.message_types import body_crc as body_crc
from tidemq.message_types import create_message_id as create_message_id
from tidemq.message_types import decode_message_id as decode_message_id
from tidemq.message_types import java_string_hash as java_string_hash
from tidemq.message_types import properties_to_string as properties_to_string
from tidemq.message_types import py_create_message_id as py_create_message_id
from tidemq.message_types import string_to_properties as string_to_properties
from tidemq.message_types import tags_hash_code as tags_hash_code
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
from tidemq.record import encode_batch as encode_batch
from tidemq.record import encode_message as encode_message
from tidemq.record import patch_record as patch_record
from tidemq.record import store_timestamp_pos as store_timestamp_pos

# ---------------------------------------------------------------------------- compiled twins

_record_decode = compiled_twin("tidemq._native._record_decode")
_batch_decode = compiled_twin("tidemq._native._batch_decode")
_pull_walk = compiled_twin("tidemq._native._pull_walk")
_record_encode = compiled_twin("tidemq._native._record_encode")

if TYPE_CHECKING:  # the compiled twins have the reference's signatures (core/_native/*.pyi)
    from tidemq.record import RecordEncoder as RecordEncoder
    from tidemq.record import decode_batch as decode_batch
    from tidemq.record import decode_batch_messages as decode_batch_messages
    from tidemq.record import decode_message as decode_message
    from tidemq.record import iter_messages as iter_messages
    from tidemq.record import pack_cq_entries as pack_cq_entries
    from tidemq.record import record_crc_ok as record_crc_ok
    from tidemq.record import record_mismatch as record_mismatch
    from tidemq.record import scan_queue as scan_queue
else:
    _m = _record_decode or _reference
    decode_message, iter_messages = _m.decode_message, _m.iter_messages
    record_crc_ok, record_mismatch = _m.record_crc_ok, _m.record_mismatch
    _m = _batch_decode or _reference
    decode_batch, decode_batch_messages = _m.decode_batch, _m.decode_batch_messages
    scan_queue = (_pull_walk or _reference).scan_queue
    _m = _record_encode or _reference
    RecordEncoder, pack_cq_entries = _m.RecordEncoder, _m.pack_cq_entries
    del _m


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
