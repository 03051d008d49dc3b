"""Body compression for large messages, marked in sysFlag as core/message.py describes.

zlib (type bits 0) is what RocketMQ 4.x brokers and consumers understand; lz4 and zstd set the
RocketMQ 5 compression-type bits and need a 5.x-aware (or tidemq) consumer.
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

CODECS: dict[str, int] = {"zlib": COMPRESSION_ZLIB, "lz4": COMPRESSION_LZ4, "zstd": COMPRESSION_ZSTD}


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


def decompress(body: bytes, sys_flag: int) -> bytes:
    """The original body of a message stored with ``sys_flag``."""
    if not sys_flag & COMPRESSED_FLAG:
        return body
    kind = sys_flag & COMPRESSION_TYPE_MASK
    try:
        if kind == COMPRESSION_ZLIB or kind == COMPRESSION_ZLIB_V5:
            return zlib.decompress(body)
        if kind == COMPRESSION_LZ4:
            return lz4.frame.decompress(body)
        if kind == COMPRESSION_ZSTD:
            return zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 30)
    except (zlib.error, RuntimeError, zstandard.ZstdError) as exc:
        raise CorruptDataError(f"cannot decompress message body: {exc}") from exc
    raise CorruptDataError(f"unknown compression type bits {kind:#x} in sysFlag {sys_flag:#x}")
