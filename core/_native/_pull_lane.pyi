"""Types of core/_native/_pull_lane.pyx (the pull lane's walk)."""

CRC32_SOURCE: str

def disagreements() -> int: ...
def uses_slots() -> dict[str, bool]: ...
def _crc32_ns(data: bytes, n: int, direct: bool) -> float | None: ...
def walk(
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
    tags: tuple[tuple[int, ...], tuple[bytes, ...]] | None = None,
) -> tuple[int, int, int, int, int, list[memoryview]]: ...
