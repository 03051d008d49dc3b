"""Types of core/_native/_batch_decode.pyx; same signatures as tidemq.record's."""

from tidemq.message_types import BatchItem, MessageInner

CRC32_SOURCE: str

def disagreements() -> int: ...
def uses_slots() -> dict[str, bool]: ...
def _crc32_ns(data: bytes, n: int, direct: bool) -> float | None: ...
def decode_batch(buf: bytes | memoryview, max_count: int | None = None) -> list[BatchItem]: ...
def decode_batch_messages(
    buf: bytes | memoryview,
    max_count: int | None,
    topic: str,
    queue_id: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: tuple[str, int],
    store_host: tuple[str, int],
    reconsume_times: int,
) -> list[MessageInner]: ...
