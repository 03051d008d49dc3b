"""The store's background syncs (consume queues, index, checkpoint) beside sync flush's rounds.

Under sync flush every send waits for a commit-log ``fdatasync``; the store-service thread's own
syncs on the same file system each second compete with those rounds (docs/flush.md, "Sync send
latency: where the tail comes from").  What is tested: a metadata flush with nothing new syncs
nothing, and the checkpoint is rewritten in place (no new file, no directory sync, so no journal
commit of its own) and still read back and used by recovery.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidemq.testing.store_contract import build_store, message
from tidemq_store_mmap.checkpoint import FILE_SIZE, StoreCheckpoint


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Every ``fsync``/``fdatasync`` of this test's thread: (call, file), the real call made."""
    calls: list[tuple[str, str]] = []
    me = threading.get_ident()
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def counted(fd: int, _real=real, _name=name) -> None:
            if threading.get_ident() == me:
                try:
                    path = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    path = "?"
                calls.append((_name, path))
            _real(fd)

        monkeypatch.setattr(os, name, counted)
    yield calls


def test_checkpoint_is_rewritten_in_place_and_not_when_unchanged(
    tmp_path: Path, syncs: list[tuple[str, str]]
) -> None:
    path = tmp_path / "checkpoint"
    cp = StoreCheckpoint(path)
    cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp = 1000, 900, 800
    cp.flush()  # created whole: temp file, rename, directory sync
    assert path.stat().st_size == FILE_SIZE
    inode = path.stat().st_ino

    syncs.clear()
    cp.physic_msg_timestamp = 2000
    cp.flush()
    assert path.stat().st_ino == inode, "the checkpoint was replaced, not rewritten in place"
    assert syncs == [("fdatasync", str(path))], "one data sync of the file itself, no directory sync"
    assert not (tmp_path / "checkpoint.tmp").exists()
    assert struct.unpack_from(">qqq", path.read_bytes()) == (2000, 900, 800)
    assert path.read_bytes()[24:] == bytes(FILE_SIZE - 24)

    syncs.clear()
    cp.flush()  # nothing changed
    assert syncs == []

    # A fresh process reads what is on disk, and knows it need not write it again.
    again = StoreCheckpoint(path)
    assert (again.physic_msg_timestamp, again.logics_msg_timestamp, again.index_msg_timestamp) == (
        2000,
        900,
        800,
    )
    again.flush()
    assert syncs == []
    again.index_msg_timestamp = 1500
    again.flush()
    assert syncs == [("fdatasync", str(path))]
    assert StoreCheckpoint(path).index_msg_timestamp == 1500


def test_checkpoint_of_a_short_file_is_written_whole(tmp_path: Path) -> None:
    """A file that is not the 4 KiB layout (an old or damaged one) is replaced, not patched."""
    path = tmp_path / "checkpoint"
    path.write_bytes(struct.pack(">qqq", 5, 6, 7))
    cp = StoreCheckpoint(path)
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (5, 6, 7)
    cp.flush()
    assert path.stat().st_size == FILE_SIZE
    assert struct.unpack_from(">qqq", path.read_bytes()) == (5, 6, 7)


def test_an_idle_store_metadata_flush_syncs_nothing(tmp_path: Path, syncs: list[tuple[str, str]]) -> None:
    """The store-service's flush (consume queues, the hash index, the checkpoint) with nothing
    written since the last one makes no sync at all: no journal commit each second on an idle
    broker, and none beside the commit log's rounds for a queue that did not move."""
    from tidemq.plugins import get_plugin_manager

    index = get_plugin_manager().create("index", "hash", data_dir=tmp_path)
    store = build_store("mmap", tmp_path, store_options={"commitlog_file_size": 1 << 20}, index=index)
    assert store.load()
    store.start()
    try:
        results = [store.put_message(message(body=b"v%d" % i, KEYS=f"k{i}")).result(10) for i in range(8)]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not index.query("TopicA", "k7", 10, 0, 2**62).phy_offsets:
            time.sleep(0.01)
        flusher = store.flusher
        syncs.clear()
        flusher.flush(thorough=True, index=True)
        assert (
            any("checkpoint" in p for _, p in syncs)
            or results[-1].store_timestamp
            <= (struct.unpack_from(">q", (tmp_path / "checkpoint").read_bytes())[0])
        )
        syncs.clear()
        flusher.flush(thorough=True, index=True)
        assert syncs == [], f"an idle metadata flush synced {syncs}"
        cp = struct.unpack_from(">qqq", (tmp_path / "checkpoint").read_bytes())
        assert cp[0] == cp[1] == results[-1].store_timestamp
    finally:
        store.shutdown()
