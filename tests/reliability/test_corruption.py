"""Disk corruption under a real broker process, read back through a real client.

tests/test_store_recovery.py covers the store alone (a corrupt byte in the last files cut at
recovery, a torn tail, a lost queue); here the broker serves the damaged directory: a flipped
byte in an old CommitLog file that recovery does not re-scan must be caught on read, and
truncated ConsumeQueue and index files must be rebuilt so every message is still found.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from tidemq.admin import AdminClient, _query
from tidemq.client import BlockingProducer, Message, SendStatus
from tidemq.message import decode_message
from tidemq_store_mmap.verify import verify_store

from .checker import check, parse_acks, read_topic
from .cluster import LOADGEN, Cluster

TOPIC = "CorruptTopic"
FILE_SIZE = 64 * 1024


def load(cluster: Cluster, count: int) -> list:
    out = subprocess.run(
        [
            sys.executable,
            str(LOADGEN),
            "--namesrv",
            cluster.namesrv.address,
            "--topic",
            TOPIC,
            "--count",
            str(count),
            "--concurrency",
            "4",
        ],
        capture_output=True,
        timeout=120,
    )
    acks = parse_acks(out.stdout)
    assert len(acks) >= count, out.stderr.decode()[-2000:]
    return acks


def records(data_dir: Path) -> list[tuple[Path, int, object]]:
    """(file, position, message) of every record, oldest first."""
    out = []
    for path in sorted((data_dir / "commitlog").iterdir()):
        buf = path.read_bytes()
        pos = 0
        while pos + 8 <= len(buf) and buf[pos + 4 : pos + 8] == bytes.fromhex("DAA320A7"):
            msg = decode_message(buf, pos)
            out.append((path, pos, msg))
            pos += msg.store_size
    return out


def keys_found(cluster: Cluster, keys: list[str]) -> int:
    async def run() -> int:
        client = AdminClient(cluster.namesrv.address)
        try:
            found = 0
            for k in keys:
                msgs = await _query(client, TOPIC, k, unique=False)
                found += any(k in m.keys for m in msgs)
            return found
        finally:
            await client.close()

    return asyncio.run(run())


def test_flipped_byte_in_an_old_commitlog_file_is_reported_and_never_served(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, flush="sync", commitlog_file_size=FILE_SIZE)
    try:
        cluster.start_broker()
        acks = load(cluster, 800)
        cluster.stop_broker()
        recs = records(cluster.data_dir)
        files = sorted({p for p, _, _ in recs})
        assert len(files) >= 5  # the victim's file is older than the three recovery re-scans
        path, pos, victim = next(r for r in recs if r[0] == files[1] and r[1] > FILE_SIZE // 2)
        buf = bytearray(path.read_bytes())
        body_at = buf.index(victim.body, pos)
        buf[body_at + len(victim.body) // 2] ^= 0x5A
        path.write_bytes(bytes(buf))

        offline = verify_store(cluster.data_dir)
        assert not offline.ok and any("CRC" in e for e in offline.errors)

        broker = cluster.start_broker()
        served = read_topic(cluster.namesrv.address, TOPIC)
        result = check(acks, served)
        assert result.corrupt_served == 0
        assert victim.uniq_key not in {s.msg_id for s in served.values()}
        assert result.lost == 1  # only the damaged message is missing
        assert "CRC" in broker.log_text()  # reported
        with BlockingProducer("after-corruption", cluster.namesrv.address) as p:
            assert p.send(Message(TOPIC, b"still up")).status is SendStatus.SEND_OK
        assert broker.alive()
    finally:
        cluster.close()


def test_truncated_consume_queue_and_index_files_are_rebuilt(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, flush="sync", consumequeue_entries=100, index_entries=400)
    try:
        cluster.start_broker()
        acks = load(cluster, 600)
        cluster.stop_broker()
        # Cut the newest file of every queue mid-entry, and the newest index files to a stub.
        cq_root = cluster.data_dir / "consumequeue" / TOPIC
        for qdir in cq_root.iterdir():
            newest = sorted(qdir.iterdir())[-1]
            with open(newest, "r+b") as f:
                f.truncate(37)
        index_files = sorted((cluster.data_dir / "index").iterdir())
        assert len(index_files) >= 2
        for path in index_files[-2:]:
            with open(path, "r+b") as f:
                f.truncate(20)
        assert not verify_store(cluster.data_dir).ok

        cluster.start_broker()
        result = check(acks, read_topic(cluster.namesrv.address, TOPIC))
        assert result.lost == 0 and result.found == len(acks)
        # Keys of the newest messages (indexed in the cut files) are found again.
        newest_keys = [f"k0-{t}-{s}" for t in range(4) for s in range(140, 150)]
        assert keys_found(cluster, newest_keys) == len(newest_keys)
        cluster.stop_broker()
        after = verify_store(cluster.data_dir, strict=True)
        # The stubs stay on disk for inspection (the index skips them); everything else is whole.
        assert after.error_count == 0, after.errors
        assert all("shorter than its header" in r for r in after.repairable), after.repairable
        assert after.cq_missing == 0 and after.index_entries > 0
        assert sorted(
            p.name for p in (cluster.data_dir / "consumequeue" / TOPIC).iterdir() if "damaged" in p.name
        )
    finally:
        cluster.close()


def test_allocation_interrupted_by_a_kill_does_not_stop_the_broker(tmp_path: Path) -> None:
    """SIGKILL while the next commit-log file was being preallocated left it empty (0 bytes) with
    a later preallocated file beside it (found by the crash rounds): the broker must still start."""
    cluster = Cluster(tmp_path, flush="sync", commitlog_file_size=FILE_SIZE)
    try:
        cluster.start_broker()
        acks = load(cluster, 100)
        cluster.kill_broker()
        logs = sorted((cluster.data_dir / "commitlog").iterdir())
        nxt = int(logs[-1].name) + FILE_SIZE
        (cluster.data_dir / "commitlog" / f"{nxt:020d}").write_bytes(b"")
        (cluster.data_dir / "commitlog" / f"{nxt + FILE_SIZE:020d}").write_bytes(bytes(FILE_SIZE))
        cluster.start_broker()
        result = check(acks, read_topic(cluster.namesrv.address, TOPIC))
        assert result.lost == 0 and result.found == len(acks)
        cluster.stop_broker()
        assert verify_store(cluster.data_dir, strict=True).ok
    finally:
        cluster.close()
