"""Types of the compiled codec (core/_native/_codec.pyx); same signatures as tidemq.record's."""

import mmap
from collections.abc import Iterator, Sequence

from tidemq.message import BatchItem, HostPort, MessageExt, MessageInner
from tidemq.record import PreparedBatch

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
def decode_message(
    buf: bytes | memoryview, pos: int = 0, *, check_crc: bool = False, with_body: bool = True
) -> MessageExt: ...

class MessageIterator(Iterator[MessageExt]):
    def __next__(self) -> MessageExt: ...

def iter_messages(buf: bytes | memoryview, *, check_crc: bool = False) -> MessageIterator: ...
def record_crc_ok(record: bytes | memoryview) -> bool: ...
def record_mismatch(
    record: bytes | memoryview, size: int, topic: bytes, queue_id: int, queue_offset: int
) -> str | None: ...
def pack_cq_entries(offsets: Sequence[int], sizes: Sequence[int], tags_codes: Sequence[int]) -> bytes: ...
def create_message_id(store_host: HostPort, commit_log_offset: int) -> str: ...

class PreparedRecords:
    sizes: list[int]
    tags_codes: list[int]
    total: int
    def __len__(self) -> int: ...

class RecordEncoder:
    store_host_bytes: bytes
    store_v6: bool
    id_prefix: str
    reference: object
    max_size: int
    def __init__(self, store_host: HostPort, max_size: int = ...) -> None: ...
    def message_id(self, commit_log_offset: int) -> str: ...
    def message_ids(self, commit_log_offsets: Sequence[int]) -> tuple[str, ...]: ...
    def prepare(self, msgs: Sequence[MessageInner]) -> PreparedRecords | PreparedBatch: ...
    def _prepare_compiled(self, msgs: Sequence[MessageInner]) -> PreparedRecords: ...
    def write_into(
        self,
        target: bytearray | memoryview | mmap.mmap,
        pos: int,
        batch: PreparedRecords | PreparedBatch,
        queue_offset: int,
        physical_offset: int,
        store_timestamp: int,
        queue_offset_step: int = 1,
    ) -> list[int]: ...

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
) -> tuple[int, int, int, int]: ...
