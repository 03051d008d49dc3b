"""The POP revive log's snapshot offset names a snapshot only once the in-sync set holds it.

Replay starts at the consumer offset of ``CID_RMQ_SYS_REVIVE_LOG`` (a snapshot of the live state);
slaves copy it with the other offsets.  In controller mode a snapshot written past the confirm
offset can be cut by a failover, the new epoch's records taking its queue offsets: an offset
committed at the write would then name a snapshot the new master does not hold (replay copes by
starting at the oldest record, only longer).  So the offset is committed once every chunk is
confirmed, as RocketMQ 5's revive service checkpoints only what its bounded dispatch made readable.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from conftest import wait_for
from test_pop_confirm_wake import Confirms, Env, env_fixture  # noqa: F401  (the env fixture)

from tidemq.broker.confirmed import ReadBound
from tidemq.broker.pop.journal import Checkpoint
from tidemq.broker.pop.revive_log import SNAPSHOT_GROUP, ReviveLog
from tidemq.testing.store_contract import build_store, message, put


def ck(i: int) -> bytes:
    return Checkpoint(i, "G", "T", 0, 1_000, 30_000, 0, i + 1, 0, (i,)).record()


def test_the_snapshot_offset_is_committed_once_the_whole_snapshot_is_confirmed(tmp_path: Path) -> None:
    store = build_store("mmap", tmp_path / "s", store_options={"commitlog_file_size": 1 << 20})
    assert store.load()
    store.start()
    try:
        offsets: dict[tuple[str, str, int], int] = {}
        confirms = Confirms()
        broker = SimpleNamespace(
            store=store,
            settings=SimpleNamespace(cluster="C"),
            store_host=("127.0.0.1", 1),
            offsets=SimpleNamespace(
                query=lambda g, t, q: offsets.get((g, t, q), -1),
                commit=lambda g, t, q, o: offsets.__setitem__((g, t, q), o),
            ),
            read_bound=ReadBound(store, confirms),
        )
        rlog = ReviveLog(broker)  # type: ignore[arg-type]
        key = SNAPSHOT_GROUP, rlog.topic, 0
        put(store, message(rlog.topic, ck(1), 0))  # queue offset 0

        def snapshot(records: list[bytes], last_id: int) -> bool:
            """Write a snapshot, wait for its put (the flush), then try to name it."""
            rlog.snapshot(records, last_id)
            assert rlog.pending is not None and rlog.pending.result(10).ok
            return rlog.confirm_snapshot()

        # No bound (everything stored is confirmed): named once written, as before.
        assert snapshot([ck(1)], 1) is True  # queue offset 1
        assert offsets[key] == 1

        # Two chunks written past the confirm offset: not named until both are confirmed.
        confirms.offset = store.get_max_phy_offset()
        first = store.get_max_offset_in_queue(rlog.topic, 0)
        assert snapshot([ck(2) * 30_000, ck(3) * 30_000], 3) is False  # > CHUNK_BYTES: two messages
        assert store.get_max_offset_in_queue(rlog.topic, 0) == first + 2
        assert offsets[key] == 1  # before: first, a snapshot a failover could still cut
        # The first chunk confirmed, not the second: still the older one.
        confirms.offset = store.get_commit_log_offset(rlog.topic, 0, first + 1)
        assert rlog.confirm_snapshot() is False and offsets[key] == 1
        confirms.offset = store.get_max_phy_offset()
        assert rlog.confirm_snapshot() is True and offsets[key] == first
        assert rlog.confirm_snapshot() is False  # once
        assert sorted(rlog.replay().checkpoints) == [2, 3]

        # Written, then this broker became a slave before the set held it: never named here.
        confirms.offset = store.get_max_phy_offset()
        assert snapshot([ck(4)], 4) is False
        rlog.forget_snapshot()
        confirms.offset = store.get_max_phy_offset()
        assert rlog.confirm_snapshot() is False and offsets[key] == first
    finally:
        store.shutdown()


def test_a_brokers_snapshot_is_named_at_the_revive_round_after_the_acknowledgement(env: Env) -> None:
    """In a broker: the revive task commits the offset at its next round once the set acknowledged
    the snapshot (within about a second), not at the write."""
    pop, store = env.broker.pop, env.broker.store
    topic = pop.log.topic
    env.confirms.offset = store.get_max_phy_offset()
    start = store.get_max_offset_in_queue(topic, 0)
    assert env.loop.run(_call(pop.reviver.snapshot), 10) is True
    assert store.get_max_offset_in_queue(topic, 0) == start + 1
    named = lambda: env.broker.offsets.query(SNAPSHOT_GROUP, topic, 0)  # noqa: E731
    time.sleep(1.5)  # a revive round or more: the set holds nothing of it yet
    assert named() != start
    env.confirms.acknowledge(store.get_max_phy_offset())
    assert wait_for(lambda: named() == start, 5), named()


async def _call(fn: object) -> object:
    assert callable(fn)
    return fn()
