"""Types of core/_native/_record_encode.pyx; same signatures as tidemq.record's."""

import mmap
from collections.abc import Sequence

from tidemq.message_types import HostPort, MessageInner
from tidemq.record import PreparedBatch

CRC32_SOURCE: str

def disagreements() -> int: ...
def uses_slots() -> dict[str, bool]: ...
def _crc32_ns(data: bytes, n: int, direct: bool) -> float | None: ...
def pack_cq_entries(offsets: Sequence[int], sizes: Sequence[int], tags_codes: Sequence[int]) -> bytes: ...

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
