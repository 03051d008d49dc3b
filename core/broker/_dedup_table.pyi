"""Types of core/broker/_dedup_table.pyx; the same API as tidemq.broker.dedup_table's reference."""

from array import array
from typing import Any

class SentFields:
    deadline: float
    window: Any
    topic: Any
    hashes: Any
    send: Any
    msg_id: Any
    handle: Any
    live: bool
    nbytes: int
    queue_id: int
    queue_offset: int
    step: int
    end: int
    @property
    def answered(self) -> bool: ...
    @property
    def packed(self) -> int: ...
    @property
    def spacing(self) -> int: ...
    def id_at(self, pos: int) -> str: ...
    def stored(self, send: Any, result: Any) -> None: ...

class HashTable:
    def __init__(self, capacity: int = 64) -> None: ...
    def __len__(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def slots_used(self) -> int: ...
    @property
    def displaced(self) -> int: ...
    @property
    def flagged(self) -> int: ...
    def get(self, h: int) -> Any: ...
    def put(self, h: int, value: Any) -> Any: ...
    def put_many(self, hashes: array[int], value: Any) -> list[Any] | None: ...
    def any_of(self, hashes: array[int]) -> bool: ...
    def remove_many(self, hashes: array[int], value: Any) -> int: ...

STORED_CODES: frozenset[int]
#: A capsule: the C address of ``SentFields.stored``'s body for the compiled send lane.
STORED_C: Any

def key_hash(key: str) -> int: ...
def hashes_of(keys: list[str]) -> array[int]: ...
def secrets_for_tests() -> list[int]: ...
def group_shift() -> int: ...
def batch_keys(msgs: list[Any], name: str, max_length: int) -> tuple[list[str], array[int], int] | None: ...
def admit_run(
    sends: list[Any],
    topic_settings: Any,
    config_of: Any,
    tables: dict[Any, HashTable],
    order: Any,
    sent_type: type,
    window: Any,
    now: float,
    max_entries: int,
    per_key: int,
    per_send: int,
    name: str,
    max_length: int,
    settings_cache: dict[Any, tuple[object, float, bool]] | None = None,
) -> tuple[int, int, int, int] | bool | None: ...
def trim(
    order: Any,
    tables: dict[Any, HashTable],
    now: float,
    max_entries: int,
    max_bytes: int,
    entries: int,
    nbytes: int,
    per_key: int,
    per_send: int,
) -> tuple[int, int, int]: ...
def untrack(o: Any) -> Any: ...
