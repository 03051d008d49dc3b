"""Types of core/_native/_record_encode.pyx; same signatures as tidemq.record's."""

import mmap
from collections.abc import Sequence
from typing import TypeVar

from tidemq.message_types import HostPort, MessageInner
from tidemq.record import PreparedBatch

T = TypeVar("T")

CRC32_SOURCE: str

def disagreements() -> int: ...
def uses_slots() -> dict[str, bool]: ...
def _crc32_ns(data: bytes, n: int, direct: bool) -> float | None: ...
def pack_cq_entries(offsets: Sequence[int], sizes: Sequence[int], tags_codes: Sequence[int]) -> bytes: ...

class PreparedRecords:
    sizes: list[int]
    tags_codes: list[int]
    total: int
    properties: list[dict[str, str]]
    sys_flags: list[int]
    uniform: bool
    def __len__(self) -> int: ...
    def cq_entries(self, tags: list[int] | None = None) -> bytes: ...

def set_gil_write_max(n: int) -> None: ...

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
    def write_file(
        self,
        batch: PreparedRecords,
        fd: int,
        file_pos: int,
        queue_offset: int,
        physical_offset: int,
        store_timestamp: int,
        queue_offset_step: int = 1,
    ) -> list[int]: ...
    def put_result(
        self, cls: type[T], status: object, batch: PreparedRecords, queue_offset: int, store_timestamp: int
    ) -> T: ...
