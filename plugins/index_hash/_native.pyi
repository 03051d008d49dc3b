"""Types of the compiled index module (``_native.pyx``); the reference is in ``indexfile``."""

import array
from collections.abc import Iterable, Mapping, Sequence

from tidemq_index_hash.indexfile import IndexFile

HASH_SOURCE: str
LAYOUT: dict[str, int]

def bytes_hash(data: bytes | bytearray | memoryview) -> int: ...
def key_hash(key: str) -> int: ...
def package_key_hash(key: str) -> int: ...
def hash_lanes_check(keys: Sequence[bytes]) -> tuple[list[int], list[int]]: ...
def hash_batch(
    topic: str,
    properties: Sequence[Mapping[str, str]],
    sys_flags: Sequence[int],
    skip_before: int,
    gil_release_keys: int = ...,
) -> tuple[array.array[int], array.array[int]]: ...
def hash_chunk(
    batches: Iterable[tuple[str, Sequence[Mapping[str, str]], Sequence[int], int]],
    gil_release_keys: int = ...,
) -> tuple[array.array[int], array.array[int]]: ...
def put_batch(
    f: IndexFile,
    hashes: array.array[int],
    counts: array.array[int],
    offsets: Sequence[int],
    store_timestamp: int | Sequence[int],
    msg: int,
    hpos: int,
    gil_release_keys: int = ...,
) -> tuple[int, int, int]: ...
