"""Sans-IO codec of RocketMQ remoting frames.

A frame is::

    int32 length            # bytes after this field: 4 + header + body
    int32 header_info       # high byte: serialize type (0 JSON, 1 ROCKETMQ); low 24 bits: header length
    header                  # JSON object, or RocketMQ's binary header layout
    body

All integers are big-endian.  :func:`encode` turns a command into byte chunks (the payload
chunks are passed through untouched, so a transport can write them with ``writelines``);
:class:`FrameDecoder` turns a byte stream into commands, raising
:class:`~tidemq.remoting.errors.FrameError` when the stream is broken and
:class:`~tidemq.remoting.errors.HeaderError` for one well-framed but undecodable command.

Every error leaving this module is a :class:`~tidemq.remoting.errors.ProtocolError`: hostile bytes
must never surface as a TypeError or RecursionError in a transport's ``data_received``.
"""

from __future__ import annotations

import struct
from typing import Any

import orjson

from tidemq.remoting.codes import LanguageCode, SerializeType
from tidemq.remoting.command import RemotingCommand, stringify
from tidemq.remoting.errors import FrameError, HeaderError, ProtocolError

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
#: Bodies up to this size are copied next to the header into one chunk: one write beats two.
JOIN_LIMIT = 16 * 1024
_MAX_HEADER = 0xFFFFFF

_PREFIX = struct.Struct(">II")
_U32 = struct.Struct(">I")
_BIN_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")

_LANG_BY_NAME = {lc.name: lc.value for lc in LanguageCode}
_LANG_BY_BYTE = {lc.value: lc.name for lc in LanguageCode}
_JSON = SerializeType.JSON
_ROCKETMQ = SerializeType.ROCKETMQ
_SERIALIZE_TYPES = {0: _JSON, 1: _ROCKETMQ}


# --------------------------------------------------------------------------- encoding


def _ext_for_wire(ext: dict[str, Any]) -> dict[str, str]:
    for v in ext.values():
        if type(v) is not str:
            return {str(k): stringify(v) for k, v in ext.items() if v is not None}
    return ext


def encode_header(cmd: RemotingCommand) -> bytes:
    """The header bytes of ``cmd`` in its serialize type."""
    if cmd.serialize_type == _JSON:
        obj: dict[str, Any] = {
            "code": cmd.code,
            "language": cmd.language,
            "version": cmd.version,
            "opaque": cmd.opaque,
            "flag": cmd.flag,
        }
        if cmd.remark is not None:
            obj["remark"] = cmd.remark
        # Always an object: the C++ client builds a default response header from it.
        obj["extFields"] = _ext_for_wire(cmd.ext_fields) if cmd.ext_fields else {}
        try:
            return orjson.dumps(obj)
        except orjson.JSONEncodeError as exc:  # a TypeError: lone surrogates, ints beyond 64 bits
            raise ProtocolError(f"cannot encode JSON header: {exc}") from None
    if cmd.serialize_type == _ROCKETMQ:
        return _encode_binary_header(cmd)
    raise ProtocolError(f"cannot encode serialize type {cmd.serialize_type!r}")


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    try:
        return _binary_header_bytes(cmd)
    except (struct.error, UnicodeError) as exc:  # an out-of-range field, a key over 32 KiB, a surrogate
        raise ProtocolError(f"command does not fit the ROCKETMQ binary header: {exc}") from None


def _binary_header_bytes(cmd: RemotingCommand) -> bytes:
    fixed = _BIN_FIXED.pack(
        cmd.code, _LANG_BY_NAME.get(cmd.language, LanguageCode.OTHER), cmd.version, cmd.opaque, cmd.flag
    )
    parts = [fixed]
    if cmd.remark:
        remark = cmd.remark.encode()
        parts += [_I32.pack(len(remark)), remark]
    else:
        parts.append(_I32.pack(0))
    if cmd.ext_fields:
        kv: list[bytes] = []
        for key, value in _ext_for_wire(cmd.ext_fields).items():
            kb = key.encode()
            vb = value.encode()
            kv += [_I16.pack(len(kb)), kb, _I32.pack(len(vb)), vb]
        ext = b"".join(kv)
        parts += [_I32.pack(len(ext)), ext]
    else:
        parts.append(_I32.pack(0))
    return b"".join(parts)


def _nbytes(part: bytes | memoryview) -> int:
    return part.nbytes if type(part) is memoryview else len(part)


def encode(cmd: RemotingCommand) -> list[bytes | memoryview]:
    """Encode ``cmd`` as frame chunks: ``[prefix+header(+small body), body?, *body_parts]``."""
    header = encode_header(cmd)
    hlen = len(header)
    if hlen > _MAX_HEADER:
        raise ProtocolError(f"header of {hlen} bytes is over the 16 MiB header limit")
    body = cmd.body
    parts = cmd.body_parts
    blen = len(body) if body else 0
    for part in parts:
        blen += _nbytes(part)
    head = _PREFIX.pack(4 + hlen + blen, (int(cmd.serialize_type) << 24) | hlen) + header
    if body:
        if len(body) <= JOIN_LIMIT:
            head += body
            return [head, *parts] if parts else [head]
        return [head, body, *parts]
    return [head, *parts] if parts else [head]


def encode_bytes(cmd: RemotingCommand) -> bytes:
    """The whole frame as one bytes object."""
    return b"".join(encode(cmd))


# --------------------------------------------------------------------------- decoding


_JAVA_INT_MIN = -(2**31)
_JAVA_INT_MAX = 2**31 - 1


def _int_field(obj: dict[str, Any], key: str, default: int | None) -> int | None:
    value = obj.get(key)
    if value is None:  # absent or null: the default (fastjson reads null into an int field as 0)
        return default
    if type(value) is int:
        return value  # orjson reads at most 64-bit integers, and writes back all it reads
    if type(value) is str:  # fastjson accepts numeric strings for int fields; so do we
        try:
            number = int(value)
        except ValueError:
            pass
        else:
            # A string holds an integer of any size; fastjson refuses one beyond a Java int, and so do
            # we: an echoed opaque that large could not be written back in the response.
            if _JAVA_INT_MIN <= number <= _JAVA_INT_MAX:
                return number
            raise ValueError(f"header field {key!r} = {value[:40]!r} is out of the Java int range")
    raise ValueError(f"header field {key!r} should be an integer, got {_short(value)}")


def _short(value: Any) -> str:
    text = repr(value) if type(value) is not list and type(value) is not dict else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _ext_value(value: Any) -> str:
    if type(value) is str:
        return value
    if isinstance(value, dict | list):
        try:
            return orjson.dumps(value).decode()
        except orjson.JSONEncodeError:
            # orjson.loads accepts 1024 levels of nesting, orjson.dumps only 254: a deeper value was
            # read but cannot be carried on as the JSON string RocketMQ would make of it.
            raise ValueError("header value is nested too deeply to re-encode") from None
    return stringify(value)


def decode_json_header(header: bytes | memoryview) -> RemotingCommand:
    try:
        obj = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise HeaderError(f"header is not valid JSON: {exc}") from None
    if type(obj) is not dict:
        raise HeaderError(f"header is a JSON {type(obj).__name__}, not an object")
    code = obj.get("code")
    opaque = obj.get("opaque", 0)
    flag = obj.get("flag", 0)
    version = obj.get("version", 0)
    language = obj.get("language", "JAVA")
    remark = obj.get("remark")
    ext = obj.get("extFields")
    if (
        type(code) is int
        and type(opaque) is int
        and type(flag) is int
        and type(version) is int
        and type(language) is str
        and (remark is None or type(remark) is str)
        and type(ext) is dict
    ):  # the fast path every well-behaved peer takes
        for v in ext.values():
            if type(v) is not str:
                break
        else:
            return RemotingCommand(code, language, version, opaque, flag, remark, ext, None, (), _JSON)
    opaque = code = flag = None
    try:
        opaque = _int_field(obj, "opaque", 0)
        flag = _int_field(obj, "flag", 0)
        code = _int_field(obj, "code", None)
        if code is None:
            raise ValueError("header has no 'code'")
        version = _int_field(obj, "version", 0)
        language = obj.get("language", "JAVA")
        if type(language) is not str:
            language = _LANG_BY_BYTE.get(language, "OTHER") if type(language) is int else "OTHER"
        remark = obj.get("remark")
        if remark is not None and type(remark) is not str:
            remark = _ext_value(remark)
        ext = obj.get("extFields")
        if ext is None:
            ext_fields: dict[str, str] = {}
        elif type(ext) is dict:
            ext_fields = ext
            for v in ext.values():
                if type(v) is not str:
                    ext_fields = {k: _ext_value(v) for k, v in ext.items() if v is not None}
                    break
        else:
            raise ValueError(f"header field 'extFields' should be an object, got {type(ext).__name__}")
    except ValueError as exc:
        raise HeaderError(str(exc), opaque=opaque, code=code, flag=flag, serialize_type=0) from None
    return RemotingCommand(
        code=code,
        language=language,
        version=version,  # type: ignore[arg-type]
        opaque=opaque,  # type: ignore[arg-type]
        flag=flag,  # type: ignore[arg-type]
        remark=remark,
        ext_fields=ext_fields,
        serialize_type=_JSON,
    )


def decode_binary_header(header: bytes | memoryview) -> RemotingCommand:
    n = len(header)
    if n < _BIN_FIXED.size + 8:
        raise HeaderError(
            f"ROCKETMQ header of {n} bytes is shorter than its 21-byte minimum", serialize_type=1
        )
    code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(header, 0)
    pos = _BIN_FIXED.size

    def fail(msg: str) -> HeaderError:
        return HeaderError(msg, opaque=opaque, code=code, flag=flag, serialize_type=1)

    try:
        (rlen,) = _I32.unpack_from(header, pos)
        pos += 4
        if rlen < 0 or pos + rlen + 4 > n:
            raise fail(f"ROCKETMQ header remark length {rlen} exceeds the header")
        remark = bytes(header[pos : pos + rlen]).decode() if rlen else None
        pos += rlen
        (elen,) = _I32.unpack_from(header, pos)
        pos += 4
        if elen < 0 or pos + elen > n:
            raise fail(f"ROCKETMQ header extFields length {elen} exceeds the header")
        ext_fields: dict[str, str] = {}
        end = pos + elen
        while pos < end:
            if pos + 2 > end:
                raise fail("ROCKETMQ header extFields truncated in a key length")
            (klen,) = _I16.unpack_from(header, pos)
            pos += 2
            if klen < 0 or pos + klen + 4 > end:
                raise fail(f"ROCKETMQ header extFields key length {klen} exceeds the map")
            key = bytes(header[pos : pos + klen]).decode()
            pos += klen
            (vlen,) = _I32.unpack_from(header, pos)
            pos += 4
            if vlen < 0 or pos + vlen > end:
                raise fail(f"ROCKETMQ header extFields value length {vlen} exceeds the map")
            ext_fields[key] = bytes(header[pos : pos + vlen]).decode()
            pos += vlen
    except UnicodeDecodeError as exc:
        raise fail(f"ROCKETMQ header holds invalid UTF-8: {exc.reason}") from None
    return RemotingCommand(
        code=code,
        language=_LANG_BY_BYTE.get(lang, "OTHER"),
        version=version,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext_fields,
        serialize_type=_ROCKETMQ,
    )


#: What a header decoder could still raise on input its checks missed; ``feed`` turns any of it into a
#: HeaderError so that only ProtocolErrors leave the codec (MemoryError is left alone).
_UNEXPECTED = (ValueError, TypeError, ArithmeticError, LookupError, RecursionError, struct.error)
_HEADER_FAILURES = (HeaderError, *_UNEXPECTED)


class FrameDecoder:
    """Incremental decoder: feed it bytes as they arrive, get whole commands back.

    ``feed`` returns the commands completed so far and raises nothing but
    :class:`~tidemq.remoting.errors.ProtocolError` subclasses.  A :class:`FrameError` leaves the
    decoder broken (every later ``feed`` raises again).  A :class:`HeaderError` is raised for exactly
    one bad frame.  Either error comes after the commands that preceded it were returned: when
    ``feed`` stops at a bad frame it returns the good ones first and ``error_pending`` becomes true;
    call ``feed(b"")`` to get the error, and (after a HeaderError) again to continue with the frames
    behind it.
    """

    __slots__ = ("max_frame_size", "_buf", "_broken", "error_pending")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 8:
            raise ValueError(f"max_frame_size = {max_frame_size} is too small (minimum 8)")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._broken: FrameError | None = None
        self.error_pending = False

    @property
    def buffered(self) -> int:
        """Bytes received but not yet decoded."""
        return len(self._buf)

    @property
    def held(self) -> int:
        """Bytes of memory the undecoded bytes occupy: a bytearray over-allocates as it grows."""
        buf = self._buf
        return buf.__alloc__() if buf else 0

    def take_buffered(self) -> bytearray:
        """The bytes received but not decoded (a partial frame), handed over (not copied) and
        forgotten: a transport that reads whole frames itself first (a request lane) goes on from
        them, and feeds back what it leaves.  Empty while an error is pending or the decoder is
        broken (the decoder keeps what it holds then)."""
        buf = self._buf
        if not buf or self.error_pending or self._broken is not None:
            return bytearray()
        self._buf = bytearray()
        return buf

    def close(self, reason: str = "decoder closed") -> None:
        """Drop what is buffered (a connection is going away); every later ``feed`` raises FrameError."""
        self._buf = bytearray()
        if self._broken is None:
            self._broken = FrameError(reason)

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        if self._broken is not None:
            raise FrameError(str(self._broken))
        buf = self._buf
        if buf:
            buf += data
            src: bytes | bytearray | memoryview = buf
        else:
            src = data
        n = len(src)
        pos = 0
        out: list[RemotingCommand] = []
        self.error_pending = False
        limit = self.max_frame_size
        header_error: HeaderError | None = None
        # Bytes (what a socket read gives) are sliced as they are: a slice of bytes is the copy we
        # keep anyway, without a view object per slice.  Anything else is read through a view,
        # released before the buffer is resized below.
        view: bytes | memoryview = src if type(src) is bytes else memoryview(src)
        try:
            while n - pos >= 4:
                (total,) = _U32.unpack_from(view, pos)
                if total > limit:
                    self._broken = FrameError(f"frame of {total} bytes is over max_frame_size {limit}")
                    break
                if total < 4:
                    self._broken = FrameError(f"frame length {total} is too small to hold a header length")
                    break
                end = pos + 4 + total
                if end > n:
                    break
                (info,) = _U32.unpack_from(view, pos + 4)
                stype = info >> 24
                hlen = info & _MAX_HEADER
                if stype > 1:
                    self._broken = FrameError(f"unknown serialize type {stype} in frame header")
                    break
                if hlen > total - 4:
                    self._broken = FrameError(f"header length {hlen} exceeds frame length {total}")
                    break
                hstart = pos + 8
                hend = hstart + hlen
                # A bytes copy (headers are small): no view may outlive the buffer's resize below.
                header = bytes(view[hstart:hend])
                try:
                    if stype == 0:
                        cmd = decode_json_header(header)
                    else:
                        cmd = decode_binary_header(header)
                except _HEADER_FAILURES as exc:
                    if out:  # hand over the good commands first; the bad frame stays queued
                        self.error_pending = True
                        break
                    header_error = (
                        exc
                        if isinstance(exc, HeaderError)
                        else HeaderError(
                            f"undecodable header: {type(exc).__name__}: {exc}", serialize_type=stype
                        )
                    )
                    pos = end
                    break
                if hend < end:
                    cmd.body = bytes(view[hend:end])
                out.append(cmd)
                pos = end
        finally:
            if isinstance(view, memoryview):
                view.release()
        if self._broken is not None:
            self._buf = bytearray()
            if out:  # hand over the good commands before it; the next feed raises the error
                self.error_pending = True
                return out
            raise FrameError(str(self._broken))
        if src is buf:
            if pos:
                del buf[:pos]
        elif pos < n:
            self._buf = bytearray(src[pos:])
        if header_error is not None:
            # Frames behind the bad one may already be complete: let the caller come back for them.
            self.error_pending = len(self._buf) >= 4
            raise header_error
        return out


def decode_frame(frame: bytes, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> RemotingCommand:
    """Decode exactly one whole frame (with its length prefix)."""
    decoder = FrameDecoder(max_frame_size)
    cmds = decoder.feed(frame)
    if decoder.error_pending:
        decoder.feed(b"")  # raises the error behind the first frame
    if len(cmds) != 1 or decoder.buffered:
        raise FrameError(
            f"expected exactly one whole frame, got {len(cmds)} and {decoder.buffered} spare bytes"
        )
    return cmds[0]


__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "FrameDecoder",
    "decode_binary_header",
    "decode_frame",
    "decode_json_header",
    "encode",
    "encode_bytes",
    "encode_header",
]
