"""Types of the compiled column builder (plugins/spark/_columns.pyx)."""

from typing import Any

DONE: int
NEEDS_REFERENCE: int
MODE_PULL: int
MODE_STORE: int

def scan(
    buf: bytes | memoryview,
    pos: int,
    cols: list[bytearray],
    mode: int,
    end_offset: int,
    tags: tuple[bytes, ...] | None,
    topics: tuple[bytes, ...] | None,
    system_keys: tuple[bytes, ...],
    max_rows: int,
    crc: Any,
) -> tuple[int, int, int]: ...
