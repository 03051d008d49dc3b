"""Body compression, and decompression with a size limit for every byte a peer sent.

A peer's compressed bytes are a promise about their size that nothing checks: 1 MiB of zlib can
inflate to 1 GiB (a REGISTER_BROKER body once held the NameServer for 3.8 s that way).  Every
decompression of untrusted input goes through :func:`inflate` with a limit (the frame limit by
default) and fails with :class:`DecompressionLimitError` past it, having produced at most the
limit.  zlib (type bits 0) is what RocketMQ 4.x understands; lz4 and zstd set the RocketMQ 5
compression-type bits in sysFlag (see :mod:`tidemq.message`).
"""

from __future__ import annotations

import zlib

import lz4.frame
import zstandard

from tidemq.errors import CorruptDataError
from tidemq.message import (
    COMPRESSED_FLAG,
    COMPRESSION_LZ4,
    COMPRESSION_TYPE_MASK,
    COMPRESSION_ZLIB,
    COMPRESSION_ZLIB_V5,
    COMPRESSION_ZSTD,
)

#: The remoting frame limit: nothing a peer sends may inflate past what it could have sent plain.
DEFAULT_INFLATE_LIMIT = 16 * 1024 * 1024

CODECS: dict[str, int] = {"zlib": COMPRESSION_ZLIB, "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD}


class DecompressionLimitError(CorruptDataError):
    """Compressed bytes inflate past the allowed size (a decompression bomb, or a wrong limit)."""


def compress(body: bytes, codec: str, level: int = 5) -> tuple[bytes, int]:
    """Compressed body and the sysFlag bits to set."""
    if codec == "zlib":
        data = zlib.compress(body, level)
    elif codec == "lz4":
        data = lz4.frame.compress(body)
    elif codec == "zstd":
        data = zstandard.ZstdCompressor(level=level).compress(body)
    else:
        raise ValueError(f"compression {codec!r} is not supported; choices: {', '.join(CODECS)}")
    return data, COMPRESSED_FLAG | CODECS[codec]


def _too_large(codec: str, limit: int) -> DecompressionLimitError:
    return DecompressionLimitError(f"{codec} data inflates to more than {limit} bytes; refused")


def inflate_zlib(data: bytes | memoryview, limit: int = DEFAULT_INFLATE_LIMIT) -> bytes:
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, limit)
    except zlib.error as exc:
        raise CorruptDataError(f"zlib data does not inflate: {exc}") from None
    if d.unconsumed_tail:
        raise _too_large("zlib", limit)
    if not d.eof:
        raise CorruptDataError("zlib data does not inflate: incomplete or truncated stream")
    return out


def inflate_lz4_frame(data: bytes | memoryview, limit: int = DEFAULT_INFLATE_LIMIT) -> bytes:
    d = lz4.frame.LZ4FrameDecompressor()
    try:
        out = d.decompress(data, max_length=limit)
    except RuntimeError as exc:  # python-lz4 reports bad frames as RuntimeError
        raise CorruptDataError(f"lz4 data does not inflate: {exc}") from None
    if not d.eof:
        if d.needs_input:
            raise CorruptDataError("lz4 data does not inflate: truncated frame")
        raise _too_large("lz4", limit)
    return out


def inflate_zstd(data: bytes | memoryview, limit: int = DEFAULT_INFLATE_LIMIT) -> bytes:
    try:
        declared = zstandard.frame_content_size(data)
        if declared > limit:  # checked before: decompress() would allocate the declared size
            raise _too_large("zstd", limit)
        if declared >= 0:
            return zstandard.ZstdDecompressor().decompress(data, max_output_size=limit)
        # No size in the frame header: read at most one byte past the limit to tell.
        with zstandard.ZstdDecompressor().stream_reader(bytes(data)) as reader:
            out = reader.read(limit + 1)
    except zstandard.ZstdError as exc:
        raise CorruptDataError(f"zstd data does not inflate: {exc}") from None
    if len(out) > limit:
        raise _too_large("zstd", limit)
    return out


def decompress(body: bytes, sys_flag: int, limit: int = DEFAULT_INFLATE_LIMIT) -> bytes:
    """The original body of a message stored with ``sys_flag``, at most ``limit`` bytes."""
    if not sys_flag & COMPRESSED_FLAG:
        return body
    kind = sys_flag & COMPRESSION_TYPE_MASK
    if kind == COMPRESSION_ZLIB or kind == COMPRESSION_ZLIB_V5:
        return inflate_zlib(body, limit)
    if kind == COMPRESSION_LZ4:
        return inflate_lz4_frame(body, limit)
    if kind == COMPRESSION_ZSTD:
        return inflate_zstd(body, limit)
    raise CorruptDataError(f"unknown compression type bits {kind:#x} in sysFlag {sys_flag:#x}")


__all__ = [
    "CODECS",
    "DEFAULT_INFLATE_LIMIT",
    "DecompressionLimitError",
    "compress",
    "decompress",
    "inflate_lz4_frame",
    "inflate_zlib",
    "inflate_zstd",
]
