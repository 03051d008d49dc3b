"""RocketMQ 4.x commit-log records and SEND_BATCH_MESSAGE bodies: the pure-Python reference codec.

One stored record (all integers big-endian)::

    TOTALSIZE 4 | MAGICCODE 4 | BODYCRC 4 | QUEUEID 4 | FLAG 4 | QUEUEOFFSET 8 |
    PHYSICALOFFSET 8 | SYSFLAG 4 | BORNTIMESTAMP 8 | BORNHOST 8 (20 if IPv6) |
    STORETIMESTAMP 8 | STOREHOSTADDRESS 8 (20 if IPv6) | RECONSUMETIMES 4 |
    PREPARED TRANSACTION OFFSET 8 | BODYLENGTH 4 + body | TOPICLENGTH 1 + topic |
    PROPERTIESLENGTH 2 + properties

Pull responses carry these records verbatim, so official clients decode what the store wrote.
The store encodes a record once with :func:`encode_message` and patches the three fields only it
knows (queue offset, physical offset, store timestamp) with :func:`patch_record`.

Import these names from :mod:`tidemq.message`: it picks, at import, the compiled twins (the
``tidemq._native`` modules) of :class:`RecordEncoder`, :func:`pack_cq_entries`,
:func:`decode_batch`, :func:`decode_batch_messages`, :func:`decode_message`,
:func:`iter_messages`, :func:`record_crc_ok`, :func:`record_mismatch` and :func:`scan_queue` when
they are built and ``TIDEMQ_NO_EXTENSIONS`` is not set.  This module is always pure Python:
the reference the compiled code is tested against byte for byte (``tests/test_native_codec.py``)
and the fallback where no compiler was available.
"""

from __future__ import annotations

import ipaddress
import itertools
import mmap
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from tidemq.errors import CorruptDataError, MessageTooLargeError
from tidemq.message_types import (
    _I32,
    _I64,
    BORNHOST_V6_FLAG,
    MESSAGE_MAGIC_CODE,
    STOREHOSTADDRESS_V6_FLAG,
    BatchItem,
    BatchLimitError,
    HostPort,
    MessageExt,
    MessageInner,
    Prop,
    _cached_tags_code,
    _crc32,
    _host_bytes,
    body_crc,
    properties_to_string,
    string_to_properties,
)

# Field offsets inside a record (IPv4 hosts; IPv6 shifts everything after BORNHOST).
POS_TOTALSIZE = 0
POS_MAGIC = 4
POS_BODYCRC = 8
POS_QUEUEID = 12
POS_FLAG = 16
POS_QUEUEOFFSET = 20
POS_PHYSICALOFFSET = 28
POS_SYSFLAG = 36
POS_BORNTIMESTAMP = 40
POS_BORNHOST = 48

_HEAD = struct.Struct(">iIiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP (48 bytes)


def _read_host(buf: memoryview | bytes, pos: int, v6: bool) -> tuple[HostPort, int]:
    n = 16 if v6 else 4
    ip = str(ipaddress.ip_address(bytes(buf[pos : pos + n])))
    (port,) = _I32.unpack_from(buf, pos + n)
    return (ip, port), pos + n + 4


def encode_message(
    msg: MessageInner, max_size: int = 4 * 1024 * 1024, store_host: HostPort | None = None
) -> bytearray:
    """Encode ``msg`` as a commit-log record with queue/physical offsets and store time zero.

    ``store_host`` overrides ``msg.store_host`` (the store knows its own address; copying the
    message to set it would cost more than encoding it).  Raises :class:`MessageTooLargeError` when
    the body is over ``max_size`` or the properties do not fit RocketMQ's 2-byte length.
    """
    if len(msg.body) > max_size:
        raise MessageTooLargeError(f"message body is {len(msg.body)} bytes, over the limit of {max_size}")
    topic = msg.topic.encode()
    if len(topic) > 127:
        raise MessageTooLargeError(f"topic name is {len(topic)} bytes, over the limit of 127")
    props = properties_to_string(msg.properties).encode()
    if len(props) > 32767:
        raise MessageTooLargeError(f"properties are {len(props)} bytes, over the limit of 32767")
    born, born_v6 = _host_bytes(msg.born_host)
    store, store_v6 = _host_bytes(store_host or msg.store_host)
    sys_flag = msg.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
    sys_flag |= (BORNHOST_V6_FLAG if born_v6 else 0) | (STOREHOSTADDRESS_V6_FLAG if store_v6 else 0)
    body = msg.body
    total = 48 + len(born) + 8 + len(store) + 4 + 8 + 4 + len(body) + 1 + len(topic) + 2 + len(props)
    if total > max_size + 64 * 1024:
        raise MessageTooLargeError(f"encoded message is {total} bytes, over the limit")
    buf = bytearray(total)
    _HEAD.pack_into(
        buf,
        0,
        total,
        MESSAGE_MAGIC_CODE,
        body_crc(body),
        msg.queue_id,
        msg.flag,
        0,
        0,
        sys_flag,
        msg.born_timestamp,
    )
    pos = 48
    buf[pos : pos + len(born)] = born
    pos += len(born) + 8  # STORETIMESTAMP patched at append time
    buf[pos : pos + len(store)] = store
    pos += len(store)
    struct.pack_into(">iqi", buf, pos, msg.reconsume_times, msg.prepared_transaction_offset, len(body))
    pos += 16
    buf[pos : pos + len(body)] = body
    pos += len(body)
    buf[pos] = len(topic)
    buf[pos + 1 : pos + 1 + len(topic)] = topic
    pos += 1 + len(topic)
    struct.pack_into(">h", buf, pos, len(props))
    buf[pos + 2 :] = props
    return buf


def store_timestamp_pos(sys_flag: int) -> int:
    """Offset of STORETIMESTAMP in a record with this sysFlag."""
    return POS_BORNHOST + (20 if sys_flag & BORNHOST_V6_FLAG else 8)


def patch_record(
    buf: bytearray | memoryview, queue_offset: int, physical_offset: int, store_timestamp: int
) -> None:
    """Fill in the fields the commit log assigns when it appends the record."""
    _I64.pack_into(buf, POS_QUEUEOFFSET, queue_offset)
    _I64.pack_into(buf, POS_PHYSICALOFFSET, physical_offset)
    (sys_flag,) = _I32.unpack_from(buf, POS_SYSFLAG)
    _I64.pack_into(buf, store_timestamp_pos(sys_flag), store_timestamp)


#: Everything before the body, by (born host IPv6, store host IPv6): TOTALSIZE .. BODYLENGTH.
_RECORD_HEADS = {
    (bv6, sv6): struct.Struct(f">iIiiiqqiq{20 if bv6 else 8}sq{20 if sv6 else 8}siqi")
    for bv6 in (False, True)
    for sv6 in (False, True)
}
_PROPS_LEN = struct.Struct(">h")
#: Batches at least this long are packed with one Struct for the whole batch.
_BATCH_STRUCT_MIN = 4


@attrs.define(slots=True)
class PreparedBatch:
    """Records validated and sized by :meth:`RecordEncoder.prepare`, waiting for their offsets."""

    sizes: list[int]
    #: ConsumeQueue tag code of each record (Java String.hashCode of TAGS, 0 without).
    tags_codes: list[int]
    #: Per record: (head Struct, crc, queue id, flag, sysFlag, born ts, born host, reconsume,
    #: prepared offset, body, topic+properties tail).
    parts: list[tuple]
    total: int
    #: (head layout, body length, tail length) per record: keys the batch-wide Struct cache.
    shape: tuple[int, ...] = ()


class RecordEncoder:
    """Encodes commit-log records straight into the store's buffer (the write hot path).

    :meth:`prepare` does everything that can fail (size limits, host parsing, body CRC, the
    properties string) outside the store lock; :meth:`write_into` then packs each record once,
    with its queue offset, physical offset and store time, where it is stored, so no record is
    built twice or patched.  Per-batch constants (topic, store host, a shared properties dict)
    are encoded once.  Same bytes as :func:`encode_message` + :func:`patch_record`.
    """

    def __init__(self, store_host: HostPort, max_size: int = 4 * 1024 * 1024):
        self.store_host_bytes, self.store_v6 = _host_bytes(tuple(store_host))
        self.max_size = max_size
        self.id_prefix = self.store_host_bytes.hex().upper()
        self._batch_structs: dict[tuple[int, ...], struct.Struct] = {}

    def message_id(self, commit_log_offset: int) -> str:
        """Same as :func:`create_message_id` for this store host, without re-packing the host."""
        return f"{self.id_prefix}{commit_log_offset & 0xFFFFFFFFFFFFFFFF:016X}"

    def message_ids(self, commit_log_offsets: Sequence[int]) -> tuple[str, ...]:
        """:meth:`message_id` of each offset (a put's ``PutResult.msg_ids``)."""
        prefix = self.id_prefix
        return tuple([f"{prefix}{o & 0xFFFFFFFFFFFFFFFF:016X}" for o in commit_log_offsets])

    def prepare(self, msgs: Sequence[MessageInner]) -> PreparedBatch:
        """Validate and size ``msgs``; :class:`MessageTooLargeError` / ``ValueError`` when invalid."""
        max_size = self.max_size
        store_v6 = self.store_v6
        v6_bits = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
        crc32 = _crc32
        sizes: list[int] = []
        tags_codes: list[int] = []
        parts: list[tuple] = []
        shape: list[int] = []
        last_props: object = None
        last_topic: object = None
        last_born: object = None
        tail = b""
        tags_code = 0
        topic = b""
        born, born_v6 = b"", False
        total = 0
        for m in msgs:
            body = m.body
            blen = len(body)
            if blen > max_size:
                raise MessageTooLargeError(f"message body is {blen} bytes, over the limit of {max_size}")
            if m.topic is not last_topic or m.properties is not last_props:
                if m.topic is not last_topic:
                    topic = m.topic.encode()
                    if len(topic) > 127:
                        raise MessageTooLargeError(f"topic name is {len(topic)} bytes, over the limit of 127")
                    last_topic = m.topic
                props = properties_to_string(m.properties).encode()
                if len(props) > 32767:
                    raise MessageTooLargeError(f"properties are {len(props)} bytes, over the limit of 32767")
                tail = bytes((len(topic),)) + topic + _PROPS_LEN.pack(len(props)) + props
                tags_code = _cached_tags_code(m.properties.get(Prop.TAGS))
                last_props = m.properties
            if m.born_host is not last_born:
                born, born_v6 = _host_bytes(m.born_host)
                last_born = m.born_host
            head = _RECORD_HEADS[(born_v6, store_v6)]
            size = head.size + blen + len(tail)
            if size > max_size + 64 * 1024:
                raise MessageTooLargeError(f"encoded message is {size} bytes, over the limit")
            sys_flag = m.sys_flag & ~v6_bits
            if born_v6:
                sys_flag |= BORNHOST_V6_FLAG
            if store_v6:
                sys_flag |= STOREHOSTADDRESS_V6_FLAG
            sizes.append(size)
            tags_codes.append(tags_code)
            shape += (born_v6, blen, len(tail))
            parts.append(
                (
                    head,
                    crc32(body) & 0x7FFFFFFF,
                    m.queue_id,
                    m.flag,
                    sys_flag,
                    m.born_timestamp,
                    born,
                    m.reconsume_times,
                    m.prepared_transaction_offset,
                    body,
                    tail,
                )
            )
            total += size
        return PreparedBatch(sizes, tags_codes, parts, total, tuple(shape))

    def write_into(
        self,
        target: bytearray | memoryview | mmap.mmap,
        pos: int,
        batch: PreparedBatch,
        queue_offset: int,
        physical_offset: int,
        store_timestamp: int,
        queue_offset_step: int = 1,
    ) -> list[int]:
        """Pack the records at ``target[pos:]``; returns each record's physical offset.

        ``queue_offset_step`` 0 gives every record ``queue_offset`` (records with no queue entry).
        Batches of :data:`_BATCH_STRUCT_MIN` records or more are packed by one ``Struct`` for the
        whole batch (cached by the batch's shape): one C call instead of three per record.
        """
        store = self.store_host_bytes
        if len(batch.sizes) >= _BATCH_STRUCT_MIN:
            packer = self._batch_structs.get(batch.shape)
            if packer is None:
                if len(self._batch_structs) >= 256:
                    self._batch_structs.clear()  # varied shapes: compiling costs about what it saves
                packer = self._batch_structs[batch.shape] = struct.Struct(
                    ">" + "".join(f"{p[0].format[1:]}{len(p[9])}s{len(p[10])}s" for p in batch.parts)
                )
            args: list[Any] = []
            extend = args.extend
            phys = physical_offset
            qoff = queue_offset
            magic = MESSAGE_MAGIC_CODE
            for size, (
                _head,
                crc,
                qid,
                flag,
                sys_flag,
                born_ts,
                born,
                reconsume,
                prepared,
                body,
                tail,
            ) in zip(batch.sizes, batch.parts, strict=True):
                extend(
                    (
                        size,
                        magic,
                        crc,
                        qid,
                        flag,
                        qoff,
                        phys,
                        sys_flag,
                        born_ts,
                        born,
                        store_timestamp,
                        store,
                        reconsume,
                        prepared,
                        len(body),
                        body,
                        tail,
                    )
                )
                phys += size
                qoff += queue_offset_step
            packer.pack_into(target, pos, *args)
            return list(itertools.accumulate(batch.sizes[:-1], initial=physical_offset))
        offsets: list[int] = []
        phys = physical_offset
        qoff = queue_offset
        for size, (head, crc, qid, flag, sys_flag, born_ts, born, reconsume, prepared, body, tail) in zip(
            batch.sizes, batch.parts, strict=True
        ):
            head.pack_into(
                target,
                pos,
                size,
                MESSAGE_MAGIC_CODE,
                crc,
                qid,
                flag,
                qoff,
                phys,
                sys_flag,
                born_ts,
                born,
                store_timestamp,
                store,
                reconsume,
                prepared,
                len(body),
            )
            p = pos + head.size
            q = p + len(body)
            target[p:q] = body
            target[q : pos + size] = tail
            offsets.append(phys)
            pos += size
            phys += size
            qoff += queue_offset_step
        return offsets


def decode_message(
    buf: bytes | memoryview, pos: int = 0, *, check_crc: bool = False, with_body: bool = True
) -> MessageExt:
    """Decode the record at ``pos``; :class:`CorruptDataError` when it is not a valid record."""
    view = memoryview(buf)
    try:
        total, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts = _HEAD.unpack_from(
            view, pos
        )
    except struct.error as exc:
        raise CorruptDataError(f"truncated record header at {pos}") from exc
    if magic != MESSAGE_MAGIC_CODE:
        raise CorruptDataError(f"bad magic code {magic:#x} at {pos}")
    if total < 48 or pos + total > len(view):
        raise CorruptDataError(f"record size {total} at {pos} runs past the data ({len(view)} bytes)")
    rec = view[pos : pos + total]
    try:
        born_host, p = _read_host(rec, POS_BORNHOST, bool(sys_flag & BORNHOST_V6_FLAG))
        (store_ts,) = _I64.unpack_from(rec, p)
        store_host, p = _read_host(rec, p + 8, bool(sys_flag & STOREHOSTADDRESS_V6_FLAG))
        reconsume, prepared, body_len = struct.unpack_from(">iqi", rec, p)
        p += 16
        if body_len < 0 or p + body_len > total:
            raise CorruptDataError(f"body length {body_len} at {pos} runs past the record")
        body = bytes(rec[p : p + body_len]) if with_body else b""
        if check_crc and body_crc(rec[p : p + body_len]) != crc:
            raise CorruptDataError(f"body CRC mismatch in the record at {pos}")
        p += body_len
        topic_len = rec[p]
        topic = bytes(rec[p + 1 : p + 1 + topic_len]).decode()
        p += 1 + topic_len
        (props_len,) = struct.unpack_from(">h", rec, p)
        props = string_to_properties(bytes(rec[p + 2 : p + 2 + props_len]).decode()) if props_len > 0 else {}
        if p + 2 + props_len != total:
            raise CorruptDataError(
                f"record at {pos} declares {total} bytes but its fields take {p + 2 + props_len}"
            )
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise CorruptDataError(f"malformed record at {pos}: {exc}") from exc
    return MessageExt(
        topic=topic,
        body=body,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        commit_log_offset=phys,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=born_host,
        store_timestamp=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        properties=props,
        body_crc=crc,
        store_size=total,
    )


_CRC_AND_SYSFLAG = struct.Struct(">I24xi")  # BODYCRC at 8, SYSFLAG at 36
_IPV4_BODY_POS = 84  # BODYLENGTH's offset when both hosts are IPv4
_V6_FLAGS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG


def record_crc_ok(record: bytes | memoryview) -> bool:
    """Whether a stored record's body still matches its BODYCRC (cheap: no full decode).

    The store checks every record it serves with this, so a byte damaged on disk after recovery
    ran is reported instead of reaching a consumer.
    """
    try:
        crc, sys_flag = _CRC_AND_SYSFLAG.unpack_from(record, POS_BODYCRC)
        if sys_flag & _V6_FLAGS:
            p = store_timestamp_pos(sys_flag) + 8 + (20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8) + 12
        else:
            p = _IPV4_BODY_POS
        (body_len,) = _I32.unpack_from(record, p)
    except struct.error:
        return False
    p += 4
    if body_len < 0 or p + body_len > len(record):
        return False
    return _crc32(record[p : p + body_len]) & 0x7FFFFFFF == crc


_ENTRY_HEAD = struct.Struct(">iI4xi4xq8xi")  # TOTALSIZE, MAGIC, QUEUEID, QUEUEOFFSET, SYSFLAG


def record_mismatch(
    record: bytes | memoryview, size: int, topic: bytes, queue_id: int, queue_offset: int
) -> str | None:
    """Why ``record`` is not the one a ConsumeQueue entry (size, topic, queue, offset) names; None if it is.

    A cheap check the store runs on every record it serves: a damaged queue entry (or zeroed
    commit-log bytes) must not hand a consumer another queue's message, a duplicate or garbage.
    """
    try:
        total, magic, qid, qoff, sys_flag = _ENTRY_HEAD.unpack_from(record, 0)
    except struct.error:
        return f"only {len(record)} bytes"
    if magic != MESSAGE_MAGIC_CODE:
        return f"no record (magic code {magic:#x})"
    if total != size:
        return f"a {total}-byte record where the entry says {size}"
    if qid != queue_id or qoff != queue_offset:
        return f"the record of queue {qid} offset {qoff}"
    p = _IPV4_BODY_POS
    if sys_flag & _V6_FLAGS:
        p = store_timestamp_pos(sys_flag) + 8 + (20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8) + 12
    try:
        (body_len,) = _I32.unpack_from(record, p)
        p += 4 + body_len
        n = record[p]
    except (struct.error, IndexError):
        return "a record with a bad body length"
    if record[p + 1 : p + 1 + n] != topic:
        return f"a record of topic {bytes(record[p + 1 : p + 1 + n]).decode(errors='replace')!r}"
    return None


_CQ_ENTRY = struct.Struct(">qiq")  # a ConsumeQueue entry: commit-log offset, size, tag code

#: :func:`scan_queue` stopped: at ``limit``; full (the entry at the index is not taken); or the
#: entry at the index needs the store's careful path (filler, other file, unreadable, damaged).
SCAN_END, SCAN_FULL, SCAN_CAREFUL = 0, 1, 2


def scan_queue(
    entries: bytes | memoryview,
    start: int,
    limit: int,
    file_view: memoryview,
    file_from: int,
    readable: int,
    topic: bytes,
    queue_id: int,
    first_queue_offset: int,
    max_count: int,
    max_bytes: int,
    check_crc: bool,
    buffers: list[memoryview],
    queue_offsets: list[int],
    total: int,
    runs: list[memoryview] | None = None,
    tags: tuple[tuple[int, ...], tuple[bytes, ...]] | None = None,
) -> tuple[int, int, int, int]:
    """The pull path's walk of ConsumeQueue entries ``[start, limit)`` (bytes) whose records lie
    whole in one mapped commit-log file (``file_view``, starting at log offset ``file_from``,
    ``readable`` bytes servable from it): each record that is the entry's, and passes its CRC
    when ``check_crc``, is appended to ``buffers`` (a view, no copy) and its queue offset to
    ``queue_offsets``.  Anything else stops the walk for the store to handle that entry.

    With ``runs``, the records taken are appended to it too, as maximal back-to-back runs: one
    view per run of records that follow each other in the file (what a pull response writes).

    With ``tags`` (``(tag codes, UTF-8 tags)`` of a TAG subscription), the walk filters in the
    same pass: an entry whose tag code is not one of the codes is skipped unread; a record whose
    TAGS property is not one of the tags (a code collision, or no TAGS) is skipped after its one
    decode.  A record that does not decode stops the walk (the store's careful path logs it).

    Returns ``(index, total bytes, last commit-log offset seen or -1, SCAN_*)``.
    """
    i = start
    last_phy = -1
    unit = _CQ_ENTRY.size
    stop = SCAN_END
    run_start = run_end = -1
    codes, names = tags if tags is not None else ((), ())
    while i < limit:
        phy, size, tags_code = _CQ_ENTRY.unpack_from(entries, i)
        last_phy = phy
        if size == 0x7FFFFFFF:
            stop = SCAN_CAREFUL
            break
        if buffers and (len(buffers) >= max_count or total + size > max_bytes):
            stop = SCAN_FULL
            break
        if tags is not None and tags_code not in codes:
            i += unit  # another tag: skipped on the entry alone, the record unread
            continue
        pos = phy - file_from
        if pos < 0 or size < 0 or pos + size > readable:
            stop = SCAN_CAREFUL
            break
        data = file_view[pos : pos + size]
        qoff = first_queue_offset + i // unit
        if record_mismatch(data, size, topic, queue_id, qoff) is not None:
            stop = SCAN_CAREFUL
            break
        if tags is not None:
            try:
                stored = decode_message(data, with_body=False).properties.get(Prop.TAGS)
            except CorruptDataError:  # the careful path logs it and skips it
                stop = SCAN_CAREFUL
                break
            if stored is None or stored.encode() not in names:
                i += unit  # a colliding tag code: not this subscription's tag
                continue
        if check_crc and not record_crc_ok(data):
            stop = SCAN_CAREFUL
            break
        buffers.append(data)
        queue_offsets.append(qoff)
        total += size
        i += unit
        if runs is not None:
            if pos != run_end:
                if run_start >= 0:
                    runs.append(file_view[run_start:run_end])
                run_start = pos
            run_end = pos + size
    if runs is not None and run_start >= 0:
        runs.append(file_view[run_start:run_end])
    return i, total, last_phy, stop


def pack_cq_entries(offsets: Sequence[int], sizes: Sequence[int], tags_codes: Sequence[int]) -> bytes:
    """The ConsumeQueue entries of appended records (20 bytes each), back to back."""
    return b"".join(map(_CQ_ENTRY.pack, offsets, sizes, tags_codes))


def iter_messages(buf: bytes | memoryview, *, check_crc: bool = False) -> Iterator[MessageExt]:
    """Decode consecutive records (a pull response body) until the buffer ends."""
    pos, end = 0, len(buf)
    while pos < end:
        msg = decode_message(buf, pos, check_crc=check_crc)
        yield msg
        pos += msg.store_size


# ---------------------------------------------------------------------------- batches


def encode_batch(items: list[BatchItem]) -> bytes:
    """Encode messages the way RocketMQ's ``MessageDecoder.encodeMessages`` does."""
    out = bytearray()
    for it in items:
        props = properties_to_string(it.properties).encode()
        size = 4 + 4 + 4 + 4 + 4 + len(it.body) + 2 + len(props)
        out += struct.pack(">iiiii", size, 0, body_crc(it.body), it.flag, len(it.body))
        out += it.body
        out += struct.pack(">h", len(props)) + props
    return bytes(out)


def decode_batch(buf: bytes | memoryview, max_count: int | None = None) -> list[BatchItem]:
    """Decode a SEND_BATCH_MESSAGE body; :class:`CorruptDataError` when malformed.

    With ``max_count``, a batch of more messages is refused (:class:`BatchLimitError`) before
    more than that many are decoded.
    """
    view = memoryview(buf)
    items: list[BatchItem] = []
    pos = 0
    try:
        while pos < len(view):
            if max_count is not None and len(items) >= max_count:
                raise BatchLimitError(f"the batch holds more than {max_count} messages")
            size, _magic, _crc, flag, body_len = struct.unpack_from(">iiiii", view, pos)
            if size < 22 or pos + size > len(view) or body_len < 0:
                raise CorruptDataError(f"bad batch entry size {size} at {pos}")
            p = pos + 20
            body = bytes(view[p : p + body_len])
            p += body_len
            (props_len,) = struct.unpack_from(">h", view, p)
            props = string_to_properties(bytes(view[p + 2 : p + 2 + props_len]).decode())
            if p + 2 + props_len != pos + size:
                raise CorruptDataError(f"batch entry at {pos} has inconsistent lengths")
            items.append(BatchItem(body, flag, props))
            pos += size
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptDataError(f"malformed batch body at {pos}: {exc}") from exc
    return items


def decode_batch_messages(
    buf: bytes | memoryview,
    max_count: int | None,
    topic: str,
    queue_id: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: HostPort,
    store_host: HostPort,
    reconsume_times: int,
) -> list[MessageInner]:
    """:func:`decode_batch` straight to the messages SEND_BATCH_MESSAGE stores: one per entry,
    with the request header's fields on each (the compiled version builds no BatchItem)."""
    return [
        MessageInner(
            topic,
            item.body,
            queue_id,
            item.flag,
            item.properties,
            sys_flag,
            born_timestamp,
            born_host,
            store_host,
            reconsume_times,
        )
        for item in decode_batch(buf, max_count)
    ]
