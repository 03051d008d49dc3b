"""One IndexFile: a memory-mapped, append-only hash map from message keys to commit-log offsets.

Layout (all integers big-endian, as RocketMQ's IndexFile)::

    header   40 bytes   beginTimestamp 8 | endTimestamp 8 | beginPhyOffset 8 | endPhyOffset 8 |
                        hashSlotCount 4 | indexCount 4
    slots    S x 4      entry number of the newest entry whose hash falls in the slot (0 = empty)
    entries  N x 20     keyHash 4 | phyOffset 8 | timeDiff 4 (seconds since beginTimestamp) |
                        prevIndex 4 (the previous entry of the same slot: the collision chain)

Entry number 0 is never used so that 0 can mean "no entry"; ``indexCount`` is one past the last
entry written (1 for an empty file) and the file is full when it reaches ``N``.

Two departures from RocketMQ, both internal to tidemq's files:

* ``hashSlotCount`` holds the file's slot count ``S`` (RocketMQ counts puts there, which nothing
  reads).  With ``S`` in the header and ``N`` derived from the file size, files keep working after
  the slot or entry options change.
* The key hash is :func:`key_hash` (blake3, not Java's ``String.hashCode``).

Writes come in batches (:meth:`IndexFile.put_batch`, the keys of one put hashed by
:data:`hash_batch`); both run compiled when ``tidemq_index_hash._native`` is built and
``TIDEMQ_NO_EXTENSIONS`` is not set (:mod:`tidemq_index_hash.native`).  The Python versions here
(:func:`py_key_hash`, :func:`py_hash_batch`, :meth:`IndexFile.py_put_batch`, built on
:meth:`IndexFile.reserve` and :meth:`IndexFile.put_key`) are the reference: the compiled ones write
the same bytes (``tests/test_native_index.py``).

The header in the file is written only by :meth:`IndexFile.write_header`, after the entries it
counts are on disk, so after a crash the on-disk header always describes whole, durable entries;
:meth:`IndexFile.repair` drops whatever was written after it.

Full disk.  Files are sparse (a default file is 420 MB, of which a few pages are touched), and a
store through a mapping into a page the filesystem cannot allocate is a SIGBUS that kills the
broker.  So nothing is written through the mapping where the blocks are not known to be
allocated: the slot table is reserved with ``posix_fallocate`` in 64 KiB chunks as keys first land
in them, and the entry area in 256 KiB windows ahead of the next entry.  A reservation that fails
raises ``OSError`` (ENOSPC) before anything is written.  Reads of a slot in a chunk not reserved
by this process go through ``pread``: on tmpfs even a read fault on a hole allocates a page.
"""

from __future__ import annotations

import array
import errno
import logging
import mmap
import os
import struct
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import attrs
import blake3

from tidemq.errors import CorruptDataError
from tidemq.index import IndexFileEntry, IndexFileInfo
from tidemq.message import TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK, Prop
from tidemq.writeback import write_back
from tidemq_index_hash import native as _native

log = logging.getLogger(__name__)

HEADER_SIZE = 40
SLOT_SIZE = 4
ENTRY_SIZE = 20
INVALID_INDEX = 0
_INT_MAX = 0x7FFFFFFF
#: Keys from which the compiled hashing and insertion release the GIL unless the call says
#: otherwise (their ``gil_release_keys`` argument, 0: never; the compiled module's NOGIL_MIN).
#: The Python versions take the argument too and hold the GIL as any Python code does.
GIL_RELEASE_KEYS = 64

#: Slot-table reservation unit: small, so a file stays sparse while keys spread over its slots.
SLOT_CHUNK = 64 * 1024
_SLOT_CHUNK_SHIFT = 16
#: Entry-area reservation window ahead of the next entry (one fallocate per ~13 000 entries).
ENTRY_WINDOW = 256 * 1024

_HEADER = struct.Struct(">qqqqii")
_SLOT = struct.Struct(">i")
_ENTRY = struct.Struct(">iqii")


def py_key_hash(key: str) -> int:
    """The index hash of ``topic#key``: the first 4 bytes of its blake3 digest, as a 31-bit int.

    31 bits keep the value a non-negative Java int, so the layout stays RocketMQ's; blake3 spreads
    similar keys (``ORDER-1``, ``ORDER-2``...) evenly over the slots, which ``String.hashCode``
    does not.  The reference; :data:`key_hash` is the compiled one when it is built.
    """
    return int.from_bytes(blake3.blake3(key.encode()).digest(4), "big") & _INT_MAX


def py_hash_batch(
    topic: str,
    properties: Sequence[Mapping[str, str]],
    sys_flags: Sequence[int],
    skip_before: int,
    gil_release_keys: int = GIL_RELEASE_KEYS,
) -> tuple[array.array[int], array.array[int]]:
    """The key hashes of a dispatched batch (the reference; :data:`hash_batch` is the compiled one).

    For each message, in order, the hashes of ``topic#UNIQ_KEY`` (when set) and of each non-empty
    ``KEYS`` entry (space-separated), as RocketMQ indexes them, all in one flat array; and per
    message the number of its hashes, or -1 for a message the index skips: one before
    ``skip_before`` (already indexed) or a rolled-back transaction half (its prepared record is).
    ``gil_release_keys`` is the compiled one's (taken and not used: Python code holds the GIL).
    """
    prefix = f"{topic}#"
    hashes = array.array("i")
    counts = array.array("i")
    for i, props in enumerate(properties):
        if i < skip_before or (sys_flags[i] & TRANSACTION_TYPE_MASK) == TRANSACTION_ROLLBACK_TYPE:
            counts.append(-1)
            continue
        n = len(hashes)
        uniq = props.get(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if uniq:
            hashes.append(py_key_hash(prefix + uniq))
        keys = props.get(Prop.KEYS)
        if keys:
            hashes.extend([py_key_hash(prefix + k) for k in keys.split(" ") if k])
        counts.append(len(hashes) - n)
    return hashes, counts


def py_hash_chunk(
    batches: Iterable[tuple[str, Sequence[Mapping[str, str]], Sequence[int], int]],
    gil_release_keys: int = GIL_RELEASE_KEYS,
) -> tuple[array.array[int], array.array[int]]:
    """:func:`py_hash_batch` of several puts ``(topic, properties, sys_flags, skip_before)``,
    concatenated (the reference; :data:`hash_chunk` is the compiled one)."""
    hashes = array.array("i")
    counts = array.array("i")
    for topic, properties, sys_flags, skip_before in batches:
        h, c = py_hash_batch(topic, properties, sys_flags, skip_before)
        hashes.extend(h)
        counts.extend(c)
    return hashes, counts


class _HashBatch(Protocol):
    def __call__(
        self,
        topic: str,
        properties: Sequence[Mapping[str, str]],
        sys_flags: Sequence[int],
        skip_before: int,
        gil_release_keys: int = ...,
    ) -> tuple[array.array[int], array.array[int]]: ...


class _HashChunk(Protocol):
    def __call__(
        self,
        batches: Iterable[tuple[str, Sequence[Mapping[str, str]], Sequence[int], int]],
        gil_release_keys: int = ...,
    ) -> tuple[array.array[int], array.array[int]]: ...


class _PutBatch(Protocol):
    def __call__(
        self,
        f: IndexFile,
        hashes: array.array[int],
        counts: array.array[int],
        offsets: Sequence[int],
        store_timestamp: int | Sequence[int],
        msg: int = ...,
        hpos: int = ...,
        gil_release_keys: int = ...,
        /,
    ) -> tuple[int, int, int]: ...


#: The index hash of a key (compiled when built, else :func:`py_key_hash`).
key_hash: Callable[[str], int] = _native.impl.key_hash if _native.impl is not None else py_key_hash
#: Key hashes of a dispatched batch (compiled when built, else :func:`py_hash_batch`).
hash_batch: _HashBatch = _native.impl.hash_batch if _native.impl is not None else py_hash_batch
#: Key hashes of several puts, concatenated (compiled when built, else :func:`py_hash_chunk`).
hash_chunk: _HashChunk = _native.impl.hash_chunk if _native.impl is not None else py_hash_chunk


def file_size(slot_num: int, index_num: int) -> int:
    """Bytes taken by an IndexFile with ``slot_num`` slots and ``index_num`` entries."""
    return HEADER_SIZE + slot_num * SLOT_SIZE + index_num * ENTRY_SIZE


@attrs.define
class IndexHeader:
    """The in-memory header; the file's copy lags until :meth:`IndexFile.write_header`."""

    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1

    def pack(self) -> bytes:
        return _HEADER.pack(
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )

    @classmethod
    def unpack(cls, buf: bytes | mmap.mmap) -> IndexHeader:
        return cls(*_HEADER.unpack_from(buf, 0))


class IndexFile:
    """One memory-mapped index file; callers serialise access (the service holds a lock)."""

    def __init__(self, path: Path, mm: mmap.mmap, fd: int, header: IndexHeader, index_num: int) -> None:
        self.path = path
        self._mm = mm
        self._fd = fd
        self.header = header
        self.slot_num = header.hash_slot_count
        self.index_num = index_num
        self._entry_base = HEADER_SIZE + self.slot_num * SLOT_SIZE
        self._size = self._entry_base + index_num * ENTRY_SIZE
        # Chunks of [0, entry_base) known to be allocated (chunk 0 holds the header), and the end
        # of the entry area known to be allocated; both start unknown, even for an existing file
        # (re-reserving allocated blocks costs a syscall, not space).
        self._slot_chunks = bytearray((self._entry_base + SLOT_CHUNK - 1) // SLOT_CHUNK)
        self._reserved_end = self._entry_base
        #: Entries below this count were durable at the last sync (the rest may be dirty).
        self._synced_count = header.index_count
        self.closed = False

    # ------------------------------------------------------------------ open / create
    @classmethod
    def create(
        cls, path: Path, slot_num: int, index_num: int, prev_end_phy: int = 0, prev_end_ts: int = 0
    ) -> IndexFile:
        """A new empty file; begin and end start at the previous file's end (as RocketMQ)."""
        size = file_size(slot_num, index_num)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)  # sparse: pages are reserved as keys and entries arrive
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        header = IndexHeader(prev_end_ts, prev_end_ts, prev_end_phy, prev_end_phy, slot_num, 1)
        f = cls(path, mm, fd, header, index_num)
        try:
            # A durable header from the start: load() can then size every file it finds.
            f.write_header(header.pack())
        except BaseException:
            f.destroy()  # no space even for the header: leave no file a restart would trip on
            raise
        return f

    @classmethod
    def open(cls, path: Path) -> IndexFile:
        """Map an existing file; :class:`CorruptDataError` when its size and header disagree."""
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise CorruptDataError(f"index file {path.name} is {size} bytes, shorter than its header")
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        try:
            header = IndexHeader.unpack(mm)
            slots = header.hash_slot_count
            room = size - HEADER_SIZE - slots * SLOT_SIZE
            if slots <= 0 or room <= 0 or room % ENTRY_SIZE:
                raise CorruptDataError(f"index file {path.name}: {slots} slots do not fit its {size} bytes")
            index_num = room // ENTRY_SIZE
            if not 1 <= header.index_count <= index_num:
                raise CorruptDataError(
                    f"index file {path.name}: index count {header.index_count} outside 1..{index_num}"
                )
        except BaseException:
            mm.close()
            os.close(fd)
            raise
        return cls(path, mm, fd, header, index_num)

    # ------------------------------------------------------------------ properties
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def is_full(self) -> bool:
        return self.header.index_count >= self.index_num

    @property
    def is_empty(self) -> bool:
        return self.header.index_count <= 1

    def time_matched(self, begin: int, end: int) -> bool:
        """Whether ``[begin, end]`` overlaps the file's store-time span."""
        return self.header.begin_timestamp <= end and self.header.end_timestamp >= begin

    # ------------------------------------------------------------------ reservation
    def _reserve_chunk(self, chunk: int) -> None:
        start = chunk * SLOT_CHUNK
        os.posix_fallocate(self._fd, start, min(start + SLOT_CHUNK, self._entry_base) - start)
        self._slot_chunks[chunk] = 1

    def _reserve_at(self, pos: int) -> None:
        """Make sure the chunk holding byte ``pos`` of the header/slot area is allocated."""
        chunk = pos >> _SLOT_CHUNK_SHIFT
        if not self._slot_chunks[chunk]:
            self._reserve_chunk(chunk)

    def _reserve_entries(self, end: int) -> None:
        """Make the entry area allocated up to byte ``end`` (and a window beyond)."""
        new_end = min(self._size, max(end, self._reserved_end) + ENTRY_WINDOW)
        os.posix_fallocate(self._fd, self._reserved_end, new_end - self._reserved_end)
        self._reserved_end = new_end

    def reserve(self, key_hashes: Iterable[int]) -> None:
        """Allocate the slots and entries the next puts of ``key_hashes`` write.

        Raises ``OSError`` (ENOSPC on a full disk) with nothing written, so a message is either
        indexed whole or not at all (within this file).
        """
        n = 0
        for h in key_hashes:
            n += 1
            self._reserve_at(HEADER_SIZE + (h % self.slot_num) * SLOT_SIZE)
        end = self._entry_base + min(self.header.index_count + n, self.index_num) * ENTRY_SIZE
        if end > self._reserved_end:
            self._reserve_entries(end)

    def _read_slot(self, slot_pos: int) -> int:
        if self._slot_chunks[slot_pos >> _SLOT_CHUNK_SHIFT]:
            return _SLOT.unpack_from(self._mm, slot_pos)[0]
        return _SLOT.unpack(os.pread(self._fd, SLOT_SIZE, slot_pos))[0]

    def _read_entry(self, idx: int) -> tuple[int, int, int, int]:
        """Entry ``idx`` via ``pread``: safe on a hole (repair walks entries past the header)."""
        return _ENTRY.unpack(os.pread(self._fd, ENTRY_SIZE, self._entry_base + idx * ENTRY_SIZE))

    # ------------------------------------------------------------------ write
    def put_key(self, key_hash_value: int, phy_offset: int, store_timestamp: int) -> bool:
        """Append one entry; ``False`` when the file is full.

        Raises ``OSError`` when its blocks cannot be reserved (disk full), with nothing written.
        """
        h = self.header
        count = h.index_count
        if count >= self.index_num:
            return False
        mm = self._mm
        slot_pos = HEADER_SIZE + (key_hash_value % self.slot_num) * SLOT_SIZE
        self._reserve_at(slot_pos)
        entry_pos = self._entry_base + count * ENTRY_SIZE
        if entry_pos + ENTRY_SIZE > self._reserved_end:
            self._reserve_entries(entry_pos + ENTRY_SIZE)
        (prev,) = _SLOT.unpack_from(mm, slot_pos)
        if prev <= INVALID_INDEX or prev >= count:
            prev = INVALID_INDEX
        if count == 1:
            h.begin_timestamp = store_timestamp
            h.begin_phy_offset = phy_offset
        # Seconds keep the entry at 20 bytes; clamp as RocketMQ does for clocks that step back.
        diff = (store_timestamp - h.begin_timestamp) // 1000
        diff = 0 if diff < 0 else min(diff, _INT_MAX)
        _ENTRY.pack_into(mm, entry_pos, key_hash_value, phy_offset, diff, prev)
        _SLOT.pack_into(mm, slot_pos, count)
        h.index_count = count + 1
        h.end_timestamp = store_timestamp
        h.end_phy_offset = phy_offset
        return True

    def put_batch(
        self,
        hashes: array.array[int],
        counts: array.array[int],
        offsets: Sequence[int],
        store_timestamp: int | Sequence[int],
        msg: int = 0,
        hpos: int = 0,
        gil_release_keys: int = GIL_RELEASE_KEYS,
    ) -> tuple[int, int, int]:
        """Append the entries of a batch from message ``msg`` (hash ``hpos`` of the flat array).

        ``hashes`` and ``counts`` are :data:`hash_batch`'s; ``offsets[i]`` is message i's
        commit-log offset, and every message has ``store_timestamp`` (or ``store_timestamp[i]``
        when it is a sequence: a chunk of several puts).  Each message's blocks are
        reserved before any of its entries is written (:meth:`reserve`), then its keys put in
        order (:meth:`put_key`).  Returns where it stopped, ``(msg, hpos, errno)``: ``msg ==
        len(counts)`` when all is written; else ``errno`` 0 when the file is full (the caller rolls
        to a new file and calls again from there) or the error of a reservation that failed
        (nothing of message ``msg`` from ``hpos`` on written).  Compiled when built: it writes
        without the GIL when ``gil_release_keys`` or more hashes are left (0: never).
        """
        return put_batch(self, hashes, counts, offsets, store_timestamp, msg, hpos, gil_release_keys)

    def py_put_batch(
        self,
        hashes: array.array[int],
        counts: array.array[int],
        offsets: Sequence[int],
        store_timestamp: int | Sequence[int],
        msg: int = 0,
        hpos: int = 0,
        gil_release_keys: int = GIL_RELEASE_KEYS,
    ) -> tuple[int, int, int]:
        """:meth:`put_batch` in Python: the reference the compiled one is tested against
        (``gil_release_keys`` taken and not used: Python code holds the GIL)."""
        n = len(counts)
        p = sum(c for c in counts[:msg] if c > 0)  # where message msg's hashes start
        while msg < n:
            c = counts[msg]
            if c <= 0:
                msg += 1
                continue
            start, end = max(p, hpos), p + c
            if self.is_full:
                return msg, start, 0
            try:
                self.reserve(hashes[start:end])
            except OSError as exc:
                return msg, start, exc.errno or errno.EIO
            offset = offsets[msg]
            ts = store_timestamp if isinstance(store_timestamp, int) else store_timestamp[msg]
            for k in range(start, end):
                try:
                    if not self.put_key(hashes[k], offset, ts):
                        return msg, k, 0
                except OSError as exc:
                    return msg, k, exc.errno or errno.EIO
            p = hpos = end
            msg += 1
        return msg, p, 0

    # ------------------------------------------------------------------ read
    def select_phy_offsets(
        self, key_hash_value: int, begin: int, end: int, limit: int, out: list[int], seen: set[int]
    ) -> None:
        """Append to ``out`` (newest first, no repeats) offsets of entries with this hash in range.

        Entry times are whole seconds after ``beginTimestamp``, so an entry stands for the window
        ``[t, t + 999]`` and matches when that window meets ``[begin, end]``; the broker re-checks
        the exact store time and key of every candidate.
        """
        count = self.header.index_count
        if count <= 1:
            return
        mm = self._mm
        idx = self._read_slot(HEADER_SIZE + (key_hash_value % self.slot_num) * SLOT_SIZE)
        base_ts = self.header.begin_timestamp
        entry_base = self._entry_base
        steps = 0
        while INVALID_INDEX < idx < count and len(out) < limit:
            stored_hash, phy, diff, prev = _ENTRY.unpack_from(mm, entry_base + idx * ENTRY_SIZE)
            if diff < 0:
                break
            t = base_ts + diff * 1000
            if stored_hash == key_hash_value and t <= end and t + 999 >= begin and phy not in seen:
                seen.add(phy)
                out.append(phy)
            if t + 999 < begin or prev >= idx:  # older entries only get older; prev < idx always
                break
            idx = prev
            steps += 1
            if steps > count:  # a damaged chain must not loop forever
                log.error("index file %s: collision chain longer than the file, stopped", self.name)
                break

    # ------------------------------------------------------------------ durability
    def sync_data(self) -> None:
        """Make slots and entries durable (the kernel writes only dirty pages).

        ``fdatasync`` of the file, not ``mmap.flush``: a shared mapping's pages are the file's page
        cache, so it writes them too, and unlike ``mmap.flush`` (msync under the GIL) it lets the
        broker's event loop run meanwhile.
        """
        if self.closed:
            return
        # The dirty pages first, a window at a time (tidemq.writeback): a sync-flush round of the
        # commit log then never waits behind thousands of ours; the fdatasync writes the rest.
        count = self.header.index_count
        write_back(self._fd, self._dirty_ranges(count))
        os.fdatasync(self._fd)
        self._synced_count = count

    def _dirty_ranges(self, count: int) -> list[tuple[int, int]]:
        """Where dirty pages may be: the reserved slot chunks and the entries since the last sync."""
        ranges: list[tuple[int, int]] = []
        chunks = self._slot_chunks
        i = 0
        while i < len(chunks):
            if not chunks[i]:
                i += 1
                continue
            j = i
            while j < len(chunks) and chunks[j]:
                j += 1
            ranges.append((i * SLOT_CHUNK, min(j * SLOT_CHUNK, self._entry_base)))
            i = j
        lo = self._entry_base + min(self._synced_count, count) * ENTRY_SIZE
        hi = self._entry_base + count * ENTRY_SIZE
        if hi > lo:
            ranges.append((lo - lo % mmap.PAGESIZE, hi))
        return ranges

    def write_header(self, packed: bytes) -> None:
        """Store a header snapshot in the file and make it durable."""
        if self.closed:
            return
        self._reserve_at(0)
        self._mm[0:HEADER_SIZE] = packed
        os.fdatasync(self._fd)  # after sync_data only the header page is dirty

    def repair(self) -> int:
        """Forget what was written after the on-disk header (after an abnormal stop).

        Slots pointing at entries past ``indexCount`` are walked back along their chains to the
        newest entry the header counts; a chain that cannot be followed (torn pages after a power
        loss) is rebuilt by scanning the counted entries.  Returns the number of slots fixed.
        """
        count = self.header.index_count
        slots = array.array("i")
        # pread, not the mapping: the slot table is mostly holes (see the module docstring).
        slots.frombytes(os.pread(self._fd, self._entry_base - HEADER_SIZE, HEADER_SIZE))
        if sys.byteorder == "little":
            slots.byteswap()
        bad = [i for i, v in enumerate(slots) if v < INVALID_INDEX or v >= count]
        if not bad:
            return 0
        unresolved: set[int] = set()
        for slot in bad:
            idx = slots[slot]
            fixed = None
            for _ in range(self.index_num):
                if INVALID_INDEX <= idx < count:
                    fixed = idx
                    break
                if not INVALID_INDEX < idx < self.index_num:
                    break
                stored_hash, _phy, _diff, prev = self._read_entry(idx)
                if stored_hash % self.slot_num != slot or not INVALID_INDEX <= prev < idx:
                    break
                idx = prev
            if fixed is None:
                unresolved.add(slot)
            else:
                self._write_slot(slot, fixed)
        if unresolved:
            heads = self._scan_heads(unresolved, count)
            for slot in unresolved:
                self._write_slot(slot, heads.get(slot, INVALID_INDEX))
        os.fdatasync(self._fd)
        log.warning("index file %s: repaired %d slots past entry %d", self.name, len(bad), count)
        return len(bad)

    def _write_slot(self, slot: int, value: int) -> None:
        pos = HEADER_SIZE + slot * SLOT_SIZE
        self._reserve_at(pos)
        _SLOT.pack_into(self._mm, pos, value)

    def _scan_heads(self, slots: Iterable[int], count: int) -> dict[int, int]:
        wanted = set(slots)
        heads: dict[int, int] = {}
        for idx in range(count - 1, INVALID_INDEX, -1):
            stored_hash = _SLOT.unpack_from(self._mm, self._entry_base + idx * ENTRY_SIZE)[0]
            slot = stored_hash % self.slot_num
            if slot in wanted and slot not in heads:
                heads[slot] = idx
                if len(heads) == len(wanted):
                    break
        return heads

    def truncate_to(self, phy_end: int) -> int:
        """Drop the entries pointing at or past ``phy_end``; returns how many were dropped.

        Entries are appended in commit-log order, so the dropped ones are the newest; slots that
        pointed at them are walked back by :meth:`repair` and the shorter header made durable.
        """
        h = self.header
        count = h.index_count
        keep = count
        while keep > 1:
            _hash, phy, _diff, _prev = _ENTRY.unpack_from(
                self._mm, self._entry_base + (keep - 1) * ENTRY_SIZE
            )
            if phy < phy_end:
                break
            keep -= 1
        if keep == count:
            return 0
        h.index_count = keep
        if keep > 1:
            _hash, phy, diff, _prev = _ENTRY.unpack_from(self._mm, self._entry_base + (keep - 1) * ENTRY_SIZE)
            h.end_phy_offset = phy
            h.end_timestamp = h.begin_timestamp + diff * 1000
        else:
            h.end_phy_offset = h.begin_phy_offset = min(h.begin_phy_offset, phy_end)
            h.end_timestamp = h.begin_timestamp
        self.write_header(h.pack())
        self.repair()
        return count - keep

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._mm.close()
        os.close(self._fd)

    def destroy(self) -> None:
        """Close and delete the file."""
        self.close()
        self.path.unlink(missing_ok=True)


#: :meth:`IndexFile.put_batch` as a function of the file (compiled when built, else
#: :meth:`IndexFile.py_put_batch`): what the index calls per batch, without a method hop.
put_batch: _PutBatch = _native.impl.put_batch if _native.impl is not None else IndexFile.py_put_batch


# ---------------------------------------------------------------------------- offline walk
def walk_file(path: Path) -> Iterator[IndexFileInfo | IndexFileEntry]:
    """Read one index file read-only, for ``tidemq store verify`` (a live broker may write it).

    Yields the file's :class:`IndexFileInfo` (a file whose header does not fit its size is
    reported there and not walked: load sets it aside and rebuilds it), then every entry the
    header counts.  Nothing is written, and no :class:`IndexFile` is opened.
    """
    name = path.name
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < HEADER_SIZE:
            yield IndexFileInfo(
                name, problems=(f"index file {name} is {size} bytes, shorter than its header",)
            )
            return
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    try:
        header = IndexHeader.unpack(mm)
        slots = header.hash_slot_count
        room = size - HEADER_SIZE - slots * SLOT_SIZE
        if slots <= 0 or room <= 0 or room % ENTRY_SIZE:
            yield IndexFileInfo(
                name, problems=(f"index file {name}: {slots} slots do not fit its {size} bytes",)
            )
            return
        count = header.index_count
        if not 1 <= count <= room // ENTRY_SIZE:
            yield IndexFileInfo(name, problems=(f"index file {name}: index count {count} out of range",))
            return
        # Slots pointing past the header's count: entries written after the last durable header
        # (a crash); load walks them back (IndexFile.repair).
        ahead = sum(
            1 for s in range(slots) if not 0 <= _SLOT.unpack_from(mm, HEADER_SIZE + s * SLOT_SIZE)[0] < count
        )
        problems = (f"index file {name}: {ahead} slots point at entries past its header",) if ahead else ()
        yield IndexFileInfo(name, count, problems)
        base = HEADER_SIZE + slots * SLOT_SIZE
        for idx in range(1, count):
            h, phy, _diff, prev = _ENTRY.unpack_from(mm, base + idx * ENTRY_SIZE)
            # A collision chain only goes back to older entries.
            problem = "" if 0 <= prev < idx else f"index file {name}: entry {idx} chains to entry {prev}"
            yield IndexFileEntry(name, idx, h, phy, problem)
    finally:
        mm.close()
