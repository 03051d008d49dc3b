"""Raw commit-log transfer between two mmap stores (what master/slave replication builds on)."""

from __future__ import annotations

import threading
from pathlib import Path

from tidemq.message import decode_message
from tidemq.store import GetStatus
from tidemq.testing.store_contract import build_store, message

OPTS = {"commitlog_file_size": 4096, "consumequeue_entries": 16}


def test_slave_rebuilds_queues_from_raw_commit_log_bytes(tmp_path: Path) -> None:
    master = build_store("mmap", tmp_path / "m", store_options=OPTS)
    slave = build_store("mmap", tmp_path / "s", store_options=OPTS, flush="async")
    arrivals: list[tuple[str, int, int]] = []
    arrived = threading.Event()

    def on_arrival(topic: str, qid: int, max_offset: int) -> None:
        arrivals.append((topic, qid, max_offset))
        if (topic, qid, max_offset) == ("TopicA", 1, 30):
            arrived.set()

    slave.add_arrival_listener(on_arrival)
    for s in (master, slave):
        assert s.load()
        s.start()
    try:
        sent = [
            master.put_message(message(body=b"r%02d" % i + bytes(200), queue_id=i % 2)).result(10)
            for i in range(60)
        ]
        # Ship the log in odd-sized chunks so records (and BLANK fillers) are split across calls.
        while slave.get_max_phy_offset() < master.get_max_phy_offset():
            offset = slave.get_max_phy_offset()
            data = master.get_commit_log_data(offset)
            assert data is not None
            assert slave.append_to_commit_log(offset, bytes(data[:333]))
        assert not slave.append_to_commit_log(12345, b"xx")  # not the end of the log: refused
        assert slave.get_max_phy_offset() == master.get_max_phy_offset()
        for qid in (0, 1):
            assert slave.get_max_offset_in_queue("TopicA", qid) == 30
            offset = 0
            got_bodies = []
            while True:
                got = slave.get_message("g", "TopicA", qid, offset, 32)
                if got.status is not GetStatus.FOUND:
                    break
                got_bodies.extend(decode_message(b, check_crc=True).body[:3] for b in got.buffers)
                offset = got.next_begin_offset
            assert got_bodies == [b"r%02d" % i for i in range(qid, 60, 2)]
        assert slave.look_message_by_offset(sent[-1].wrote_offset) == master.look_message_by_offset(
            sent[-1].wrote_offset
        )
        assert arrived.wait(10)
    finally:
        master.shutdown()
        slave.shutdown()
