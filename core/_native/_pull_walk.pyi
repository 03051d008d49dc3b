"""Types of core/_native/_pull_walk.pyx; same signature as tidemq.record.scan_queue."""

CRC32_SOURCE: str

def disagreements() -> int: ...
def uses_slots() -> dict[str, bool]: ...
def _crc32_ns(data: bytes, n: int, direct: bool) -> float | None: ...
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
) -> tuple[int, int, int, int]: ...
