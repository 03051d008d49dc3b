"""The mmap store's put of several groups in one call (``put_message_groups``, issue 38 putmany).

Store level: two mmap stores on one fixed clock get the same groups, one through
``put_message_groups``, the other through one ``put_messages`` per group.  The results (every
:class:`PutResult` field), the commit-log and consume-queue files (byte for byte), the key index's
answers and the calls the dispatchers and arrival listeners get must be equal (hypothesis over
topics, queues, group and body sizes, with files small enough that groups cross file ends); a
group refused for one message ends the call; a queue file that cannot be created in the middle of
a call; sync flush acknowledges each group once its bytes are flushed; a restart reads everything.

Broker level: ``SendService.put`` (and the read lane's compiled ``put_sends``) puts a read's groups
with one store call, and gives the same sends' outcomes and commit log as with the capability
hidden, a refused group redone in halves before the next groups, a store that raises answered as
before.

The store's call is the compiled twin (``tidemq_store_mmap._group_put``) when built, the Python
reference under ``TIDEMQ_NO_EXTENSIONS=1``: both are held to one put per group here, and to each
other in ``test_group_put_compiled.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import types
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability.test_disk_full import fill
from reliability.test_disk_full import mount_tmpfs as mount_tmpfs  # a fixture
from store_support import files_of as _files_of

import tidemq_store_mmap.group_put as group_put_module
import tidemq_store_mmap.store as store_module
from tidemq.broker.services import put as put_module
from tidemq.broker.services.put import PutGroup, Send
from tidemq.broker.services.send import SendService
from tidemq.extensions import compiled_twin
from tidemq.message import MessageInner, decode_message
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.protocol import TopicConfig
from tidemq.store import GetStatus, PutResult, PutStatus, group_put
from tidemq.testing.pytest_plugin import running_broker
from tidemq.testing.store_contract import build_store

pytestmark = pytest.mark.timeout(300)

T0 = 1_764_300_000_123
TOPICS = ("GroupTopicA", "GroupTopicB")
#: Store options that change how a put is written (a transient pool, compression): the sides must
#: still agree under each.
STORE_OPTIONS = [
    {"transient_store_pool": True, "transient_store_pool_size": 2},
    {"compression": "zstd", "compression_min_size": 64},
]
STORE_OPTION_IDS = ["transient-pool", "compression"]
HOST = ("10.0.0.7", 52000)
FILE_SIZE = 32 * 1024  # small: calls cross commit-log file ends


def files_of(root: Path) -> dict[str, bytes]:
    """The commit-log and consume-queue files' bytes, without the zeros after the written part
    (the next file is made ahead, by a thread: empty or preallocated zeros)."""
    stripped = {name: data.rstrip(b"\0") for name, data in _files_of(root).items()}
    return {name: data for name, data in stripped.items() if data}


@contextlib.contextmanager
def fixed_clock() -> Iterator[None]:
    """Every store timestamp T0 (both put paths read the same clock: byte-equal records)."""
    clock = types.SimpleNamespace(time_ns=lambda: T0 * 1_000_000)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store_module, "time", clock)
        mp.setattr(group_put_module, "time", clock)
        yield


class Recorder:
    """A batch dispatcher and an arrival listener that note what they are given, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def dispatch_batch(self, topic: str, queue_id: int, properties: Any, *rest: Any) -> None:
        self.calls.append(("dispatch", topic, queue_id, [dict(p) for p in properties], *map(_plain, rest)))

    def interested(self, topic: str, queue_id: int) -> bool:
        """Asked by the writer, in order, for each arrival (the listener itself runs on a thread)."""
        self.calls.append(("arrived", topic, queue_id))
        return False


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, list | tuple) else value


class Side:
    """One store (``groups``: put through put_message_groups) with a hash index and a recorder."""

    def __init__(self, root: Path, name: str, flush: str = "async", **options: Any) -> None:
        self.root = root / name
        self.index = get_plugin_manager().create("index", "hash", data_dir=self.root)
        self.store: Any = build_store(
            "mmap",
            self.root,
            flush=flush,
            store_options={
                "store_host": "10.1.2.3:10911",
                "commitlog_file_size": FILE_SIZE,
                "consumequeue_entries": 10_000,
                **options,
            },
            index=self.index,
        )
        self.recorder = Recorder()
        self.store.add_dispatcher(self.recorder)
        self.store.add_arrival_listener(lambda *_: None, self.recorder.interested)
        assert self.store.load()
        self.store.start()

    def put_all(self, groups: Sequence[Sequence[MessageInner]], one_call: bool) -> list[PutResult]:
        """Every group put: in calls of put_message_groups (continued after a short answer), or
        one put_messages each."""
        if not one_call:
            return [self.store.put_messages(g).result(10) for g in groups]
        out: list[PutResult] = []
        while len(out) < len(groups):
            futures = self.store.put_message_groups(groups[len(out) :])
            assert 0 < len(futures) <= len(groups) - len(out)
            out.extend(f.result(10) for f in futures)
        return out

    def close(self) -> None:
        self.store.shutdown()


def message(topic: str, queue_id: int, body: bytes, key: str) -> MessageInner:
    return MessageInner(
        topic=topic,
        body=body,
        queue_id=queue_id,
        properties={"KEYS": key, "UNIQ_KEY": f"U-{key}", "TAGS": f"t{len(body) % 3}"},
        born_timestamp=T0 - 5,
        born_host=HOST,
    )


def blocked_queue_scenario(sides: dict[str, Side], compare: Any) -> list[PutResult]:
    """Four groups, the second to a queue whose file cannot be created (a file in the way of its
    directory): it alone is refused, the others stored; ``compare`` checks the sides agree."""
    for side in sides.values():
        blocker = side.root / "consumequeue" / TOPICS[0] / "7"
        blocker.parent.mkdir(parents=True, exist_ok=True)
        blocker.write_bytes(b"in the way")
    groups = [
        [message(TOPICS[0], 0, b"zero", "b-0")],
        [message(TOPICS[0], 7, b"blocked", "b-7"), message(TOPICS[0], 7, b"blocked", "b-7b")],
        [message(TOPICS[0], 1, b"one", "b-1")],
        [message(TOPICS[0], 0, b"zero again", "b-0b")],
    ]
    results: list[PutResult] = compare(sides, groups)
    assert [r.status for r in results] == [
        PutStatus.PUT_OK,
        PutStatus.CREATE_MAPPED_FILE_FAILED,
        PutStatus.PUT_OK,
        PutStatus.PUT_OK,
    ]
    return results


def twelve_calls_past_file_ends(sides: dict[str, Side], compare: Any) -> None:
    """Twelve calls of 4 groups (500 B to 2 KiB bodies, two topics): past a file end or two with
    32 KiB files; ``compare`` checks the sides agree, and every put is stored."""
    for c in range(12):
        groups = [
            [message(TOPICS[c % 2], q, bytes([65 + q]) * (500 * (q + 1)), f"o{c}-{q}-{i}") for i in range(2)]
            for q in range(4)
        ]
        assert all(r.ok for r in compare(sides, groups))


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Side]]:
    root = tmp_path_factory.mktemp("groups")
    with fixed_clock():
        pair = {"groups": Side(root, "groups"), "single": Side(root, "single")}
        try:
            yield pair
        finally:
            for side in pair.values():
                side.close()


def compare(sides: dict[str, Side], groups: list[list[MessageInner]]) -> list[PutResult]:
    with fixed_clock():
        got = {name: side.put_all(groups, name == "groups") for name, side in sides.items()}
    assert got["groups"] == got["single"]
    a, b = sides["groups"], sides["single"]
    assert a.recorder.calls == b.recorder.calls
    for side in (a, b):
        side.store.commitlog.commit(0)  # a transient pool's buffers into the files
    assert files_of(a.root) == files_of(b.root)
    for group in groups:
        for m in group:
            key = m.properties["KEYS"]
            qa = a.index.query(m.topic, key, 4, 0, T0 + 1)
            qb = b.index.query(m.topic, key, 4, 0, T0 + 1)
            assert qa == qb
    return got["groups"]


def test_the_mmap_store_offers_the_group_put(sides: dict[str, Side]) -> None:
    store = sides["groups"].store
    assert group_put(store) is not None
    memory = build_store("memory", sides["groups"].root / "mem")
    assert group_put(memory) is None


def test_groups_of_a_read_are_stored_as_one_put_each(sides: dict[str, Side]) -> None:
    groups = [[message(TOPICS[0], q, b"%d" % q * 100, f"read-{q}-{i}") for i in range(3)] for q in range(8)]
    results = compare(sides, groups)
    assert all(r.ok for r in results)
    # back to back in the log, one queue offset run each
    for before, after in zip(results, results[1:], strict=False):
        assert after.wrote_offset == before.wrote_offset + before.wrote_bytes
    assert sides["groups"].store.get_max_phy_offset() == results[-1].wrote_offset + results[-1].wrote_bytes


def test_a_group_that_does_not_fit_the_file_starts_the_next_one(sides: dict[str, Side]) -> None:
    store = sides["groups"].store
    start = store.get_max_phy_offset()
    room = FILE_SIZE - start % FILE_SIZE
    # the first groups fill most of the file, the third does not fit: a blank, then the next file
    groups = [
        [message(TOPICS[1], 0, bytes(room // 3), "fit-0")],
        [message(TOPICS[1], 1, bytes(room // 3), "fit-1")],
        [message(TOPICS[1], 2, bytes(room // 2), "next-file"), message(TOPICS[1], 2, b"x", "next-file-2")],
        [message(TOPICS[1], 3, b"after", "after")],
    ]
    results = compare(sides, groups)
    assert all(r.ok for r in results)
    assert results[2].wrote_offset % FILE_SIZE == 0 and results[2].wrote_offset > start
    assert results[3].wrote_offset == results[2].wrote_offset + results[2].wrote_bytes


def test_a_group_refused_for_one_message_ends_the_call(sides: dict[str, Side]) -> None:
    store = sides["groups"].store
    too_big = store.max_message_size + 1
    groups = [
        [message(TOPICS[0], 0, b"before", "refused-0")],
        [message(TOPICS[0], 1, b"ok", "refused-1"), message(TOPICS[0], 1, bytes(too_big), "refused-big")],
        [message(TOPICS[0], 2, b"after", "refused-2")],
    ]
    end = store.get_max_phy_offset()
    with fixed_clock():
        futures = store.put_message_groups(groups)
    assert len(futures) == 2
    first, refused = (f.result(10) for f in futures)
    assert first.ok and refused.status is PutStatus.MESSAGE_ILLEGAL
    assert store.get_max_phy_offset() == end + first.wrote_bytes  # nothing of the third group
    with fixed_clock():
        rest = store.put_message_groups(groups[2:])
    assert [f.result(10).ok for f in rest] == [True]
    # the same puts one by one, on the other store
    single = sides["single"]
    with fixed_clock():
        assert [single.store.put_messages(g).result(10) for g in groups] == [
            first,
            refused,
            rest[0].result(10),
        ]
    assert files_of(sides["groups"].root) == files_of(single.root)
    # mixed queues and an empty topic are refused as one put refuses them: the call ends there too
    mixed = [message(TOPICS[0], 0, b"m", "mixed-0"), message(TOPICS[0], 1, b"m", "mixed-1")]
    compare(sides, [[message(TOPICS[0], 5, b"a", "mixed-a")], mixed, [message("", 0, b"e", "no-topic")]])


group_runs = st.lists(
    st.lists(
        st.tuples(
            st.sampled_from(TOPICS),
            st.integers(0, 3),
            st.integers(1, 5),
            st.sampled_from((0, 1, 100, 1024, 4000, 9000)),
        ),
        min_size=1,
        max_size=10,
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=group_runs)
def test_random_calls_match_one_put_per_group(sides: dict[str, Side], calls: list[Any]) -> None:
    seq = len(sides["groups"].recorder.calls)
    for c, call in enumerate(calls):
        groups = [
            [message(topic, queue, bytes([65 + i]) * size, f"h{seq}-{c}-{g}-{i}") for i in range(count)]
            for g, (topic, queue, count, size) in enumerate(call)
        ]
        compare(sides, groups)  # a group over a whole file (4 x 9000 bytes) is refused alike


@pytest.mark.parametrize("options", STORE_OPTIONS, ids=STORE_OPTION_IDS)
def test_the_store_options_give_the_same_puts(tmp_path: Path, options: dict[str, Any]) -> None:
    with fixed_clock():
        pair = {"groups": Side(tmp_path, "groups", **options), "single": Side(tmp_path, "single", **options)}
    try:
        twelve_calls_past_file_ends(pair, compare)
    finally:
        for side in pair.values():
            side.close()


def test_a_queue_file_that_cannot_be_created_mid_call(tmp_path: Path) -> None:
    with fixed_clock():
        pair = {"groups": Side(tmp_path, "groups"), "single": Side(tmp_path, "single")}
    try:
        results = blocked_queue_scenario(pair, compare)
        assert results[2].wrote_offset == results[0].wrote_offset + results[0].wrote_bytes
    finally:
        for side in pair.values():
            side.close()


def test_a_full_disk_refuses_the_groups_keeps_what_was_acknowledged_and_recovers(
    mount_tmpfs: Any,
) -> None:
    disk = mount_tmpfs(12)
    store: Any = build_store(
        "mmap",
        disk / "store",
        flush="sync",
        store_options={
            "commitlog_file_size": 1 << 20,
            "consumequeue_entries": 1000,
            "disk_space_warning_ratio": 95,
            "clean_interval_ms": 3_600_000,
            "file_allocation": "sparse",
        },
    )
    assert store.load()
    store.start()

    def groups(c: int) -> list[list[MessageInner]]:
        return [[message("Full", q, b"%05d" % c * 2000, f"f{c}-{q}-{i}") for i in range(2)] for q in range(4)]

    acked: dict[int, list[bytes]] = {q: [] for q in range(4)}
    try:
        for c in range(10):  # ~0.8 MiB
            assert all(f.result(10).ok for f in store.put_message_groups(groups(c)))
            for q in range(4):
                acked[q] += [b"%05d" % c * 2000] * 2
        filler = fill(disk)
        refused = None
        for c in range(10, 200):
            end = store.get_max_phy_offset()
            results = [f.result(10) for f in store.put_message_groups(groups(c))]
            if not all(r.ok for r in results):
                refused = results
                break
            for q in range(4):
                acked[q] += [b"%05d" % c * 2000] * 2
        assert refused is not None, "a full 12 MiB disk took 4 MiB more"
        bad = [r for r in refused if not r.ok]
        assert {r.status for r in bad} <= {PutStatus.DISK_FULL, PutStatus.CREATE_MAPPED_FILE_FAILED}
        assert all(r.error for r in bad)
        # the groups that went through before the refusal are acknowledged; nothing else is left
        # but the blank end marker of a file the next group did not fit
        ok = [r for r in refused if r.ok]
        written = end + sum(r.wrote_bytes for r in ok)
        assert store.get_max_phy_offset() in (written, written + (1 << 20) - written % (1 << 20))
        for q, r in enumerate(refused):
            if r.ok:
                acked[q] += [b"%05d" % c * 2000] * 2
        filler.unlink()
        deadline = time.monotonic() + 10
        while not all(f.result(10).ok for f in store.put_message_groups(groups(500))):
            assert time.monotonic() < deadline, "writes still refused after space came back"
            time.sleep(0.1)
        for q in range(4):
            acked[q] += [b"%05d" % 500 * 2000] * 2
    finally:
        store.shutdown()
    store = build_store(
        "mmap",
        disk / "store",
        flush="sync",
        store_options={"commitlog_file_size": 1 << 20, "consumequeue_entries": 1000},
    )
    assert store.load()
    store.start()
    try:
        for q in range(4):
            bodies = []
            offset = 0
            while True:
                got = store.get_message("g", "Full", q, offset, 64, max_bytes=1 << 30)
                if got.status is not GetStatus.FOUND:
                    break
                bodies += [decode_message(b).body for b in got.buffers]
                offset = got.next_begin_offset
            assert bodies == acked[q]
    finally:
        store.shutdown()


def test_sync_flush_acknowledges_each_group_once_its_bytes_are_flushed(tmp_path: Path) -> None:
    side = Side(tmp_path, "sync", flush="sync")
    try:
        commitlog = side.store.commitlog
        seen: list[tuple[int, int]] = []

        def note(f: Future[PutResult]) -> None:
            r = f.result()
            seen.append((r.wrote_offset + r.wrote_bytes, commitlog.flushed_where))

        for round_ in range(5):
            groups = [
                [message(TOPICS[0], q, bytes(300), f"s{round_}-{q}-{i}") for i in range(2)] for q in range(4)
            ]
            futures = side.store.put_message_groups(groups)
            assert len(futures) == 4 and len({id(f) for f in futures}) == 4
            for f in futures:
                f.add_done_callback(note)
            assert [f.result(10).status for f in futures] == [PutStatus.PUT_OK] * 4
        assert len(seen) == 20
        assert all(flushed >= end for end, flushed in seen)
    finally:
        side.close()


def test_a_restart_reads_every_group(tmp_path: Path) -> None:
    side = Side(tmp_path, "restart")
    expected: dict[int, list[bytes]] = {q: [] for q in range(4)}
    for c in range(6):
        groups = [
            [message(TOPICS[0], q, b"%d-%d-%d" % (c, q, i) + bytes(2000), f"r{c}{q}{i}") for i in range(3)]
            for q in range(4)
        ]
        for q in range(4):
            expected[q].extend(m.body for m in groups[q])
        assert all(f.result(10).ok for f in side.store.put_message_groups(groups))
    side.close()
    for crashed in (False, True):
        if crashed:
            (side.root / "abort").touch()  # as after a kill: the abnormal recovery re-reads the log
        store = build_store(
            "mmap",
            side.root,
            flush="async",
            store_options={"store_host": "10.1.2.3:10911", "commitlog_file_size": FILE_SIZE},
        )
        assert store.load()
        store.start()
        try:
            for q in range(4):
                got = store.get_message("g", TOPICS[0], q, 0, 64, max_bytes=1 << 20)
                assert got.status is GetStatus.FOUND
                assert [decode_message(b).body for b in got.buffers] == expected[q]
        finally:
            store.shutdown()


# --------------------------------------------------------------------------- the broker's side
class _Hidden:
    """The real store with the capability hidden (its class has no put_message_groups)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class _RaisingGroups(_Hidden):
    """A store whose every put raises, put_message_groups included."""

    def put_messages(self, msgs: Any) -> Any:
        raise OSError(5, "injected")

    put_message = put_messages

    def put_message_groups(self, groups: Any) -> Any:
        raise OSError(5, "injected")


_lane = compiled_twin("tidemq._native._send_lane")
PATHS = ["python"] + (["compiled"] if _lane is not None and hasattr(_lane, "put_sends") else [])


def _sends(spec: Sequence[tuple[int, int]], seq: int) -> list[Send]:
    """Single sends (queue, body size) of one read to TOPICS[0]."""
    out = []
    for i, (queue, size) in enumerate(spec):
        m = message(TOPICS[0], queue, bytes([97 + i % 26]) * size, f"k{seq}-{i}")
        out.append(Send("PG", [m], False, None, queue, size))
    return out


def _store(path: str, service: Any, sends: list[Send]) -> list[tuple[Any, ...]]:
    if path == "compiled":
        _lane.put_sends(service, sends)  # type: ignore[union-attr]
    else:
        service.put(sends)
    done = [False] * len(sends)
    put_module.settled_many_py(service.broker, sends, done)
    assert all(done)
    return [(s.status, s.remark, s.msg_id, s.queue_offset, s.index, s.group.nsends) for s in sends]


@pytest.fixture(scope="module")
def brokers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[asyncio.AbstractEventLoop, dict[str, Any]]]:
    loop = asyncio.new_event_loop()
    root = tmp_path_factory.mktemp("group-brokers")
    cms = {}
    out = {}
    for name in ("groups", "hidden"):
        cms[name] = running_broker(
            root / name,
            {"store": "mmap", "flush": "async"},
            options={"store": {"mmap": {"store_host": "10.1.2.3:10911", "commitlog_file_size": 64 * 1024}}},
        )
        out[name] = loop.run_until_complete(cms[name].__aenter__())
        out[name].topics.update(TopicConfig(TOPICS[0], read_queue_nums=8, write_queue_nums=8))
        out[name].store.store_host = ("10.1.2.3", 10911)  # not each broker's port: equal records
    try:
        yield loop, out
    finally:
        for cm in cms.values():
            loop.run_until_complete(cm.__aexit__(None, None, None))
        loop.close()


def _both(
    brokers: Any, path: str, spec: Sequence[tuple[int, int]], seq: int, store_cls: type = _Hidden
) -> dict[str, Any]:
    loop, pair = brokers
    got = {}
    with fixed_clock():
        for name, broker in pair.items():
            real = broker.store
            if name == "hidden":
                broker.store = store_cls(real)
            try:
                got[name] = _store(path, SendService(broker), _sends(spec, seq))
            finally:
                broker.store = real
    roots = {name: Path(b.store.root) for name, b in pair.items()}
    assert files_of(roots["groups"]) == files_of(roots["hidden"])
    return got


@pytest.mark.parametrize("path", PATHS)
def test_send_service_puts_a_read_in_one_store_call(
    brokers: Any, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop, pair = brokers
    store = pair["groups"].store
    calls: list[int] = []
    real = type(store).put_message_groups

    def counting(self: Any, groups: Any) -> Any:
        calls.append(len(groups))
        return real(self, groups)

    monkeypatch.setattr(type(store), "put_message_groups", counting)
    spec = [(q % 8, 200 + q) for q in range(27)]
    got = _both(brokers, path, spec, 1)
    assert calls == [8]
    assert got["groups"] == got["hidden"]
    assert {row[0].name for row in got["groups"]} == {"SUCCESS"}


@pytest.mark.parametrize("path", PATHS)
def test_a_refused_group_is_redone_in_halves_before_the_next_groups(brokers: Any, path: str) -> None:
    big = 4 * 1024 * 1024 + 1  # over max_message_size: that put is refused
    spec = [(0, 10), (1, 10), (1, big), (1, 20), (1, 30), (2, 10), (0, 40)]
    got = _both(brokers, path, spec, 2)
    assert got["groups"] == got["hidden"]
    assert [row[0].name for row in got["groups"]].count("MESSAGE_ILLEGAL") == 1


@pytest.mark.parametrize("path", PATHS)
def test_a_store_whose_group_put_raises_is_answered_as_before(
    brokers: Any, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    loop, pair = brokers
    broker = pair["groups"]
    real = broker.store
    broker.store = _RaisingGroups(real)
    try:
        with caplog.at_level(logging.ERROR, logger=put_module.log.name):
            got = _store(path, SendService(broker), _sends([(0, 10), (1, 10), (0, 10), (2, 5)], 3))
    finally:
        broker.store = real
    assert {row[0].name for row in got} == {"SYSTEM_ERROR"}
    assert [r.getMessage() for r in caplog.records] == [f"store refused a message for {TOPICS[0]}"] * 3


def test_group_put_results_are_attrs_equal_values() -> None:
    # the differential comparisons above compare every field of PutResult
    assert [f.name for f in attrs.fields(PutResult)] == [
        "status",
        "wrote_offset",
        "wrote_bytes",
        "queue_offset",
        "msg_ids",
        "store_timestamp",
        "message_count",
        "error",
    ]
    assert PutGroup.__slots__  # the broker fills groups slot by slot
