"""The key index's GIL release is each compiled call's argument, not a setting of the process.

The compiled hashing and insertion (``hash_batch``, ``hash_chunk``, ``put_batch``) release the GIL
from ``gil_release_keys`` keys on (0: never).  Before, that figure was a global of the compiled
module that an index thread set to 64 for its round and put back after: an index indexing inline
on another thread meanwhile (a second store in the process, brokers side by side in tests) had
its calls release the GIL too.  Now the index passes its figure with each call: inline puts 0,
its own thread ``THREAD_GIL_RELEASE_KEYS``.  The Python versions take the argument and hold the
GIL, as Python does; the files and answers are the same either way (also with
``TIDEMQ_NO_EXTENSIONS=1``).
"""

from __future__ import annotations

import array
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.message import Prop
from tidemq_index_hash import indexfile, native, service
from tidemq_index_hash.indexfile import GIL_RELEASE_KEYS, IndexFile
from tidemq_index_hash.service import THREAD_GIL_RELEASE_KEYS, HashIndex, HashIndexOptions

T0 = 1_767_225_600_000
TOPIC = "GilTopic"


def props(i: int) -> dict[str, str]:
    return {Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"U{i:012d}", Prop.KEYS: f"k{i} order-{i % 7}"}


class Ticker:
    """A thread that notes the time every half millisecond: whether it ran during a call says
    whether that call let go of the GIL (held, nothing Python runs on another thread)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ticker", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.stamps.append(time.perf_counter())
            time.sleep(0.0005)

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def ran_within(self, t0: float, t1: float) -> bool:
        return any(t0 < t < t1 for t in self.stamps[-2000:])


@pytest.fixture
def rare_switches() -> Iterator[None]:
    """No forced switch of the GIL while a test runs (a thread waiting for it takes it only after
    5 s, not 5 ms): another thread runs only where one lets go of it (a sleep, a wait, a compiled
    call that releases it), so a call that keeps it lets nothing else run from start to end.
    (With the default interval a switch pending when a kept call returns ran the ticker before the
    call's end was timed: 2-3 false releases in 10 runs with two busy processes beside.)"""
    before = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def timed(ticker: Ticker, calls: list[tuple[str, str, bool]], name: str, fn: Callable[..., Any]) -> Any:
    def call(*a: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a)
        finally:
            calls.append((threading.current_thread().name, name, ticker.ran_within(t0, time.perf_counter())))

    return call


def test_each_call_releases_the_gil_as_it_says(rare_switches: None) -> None:
    if native.impl is None:
        pytest.skip("the compiled index is not built")
    batches = [(TOPIC, [props(i) for i in range(b * 5000, (b + 1) * 5000)], [0] * 5000, 0) for b in range(20)]
    hashes, counts = native.impl.hash_chunk(batches)  # warm: 200 000 keys, ~10-40 ms
    with Ticker() as ticker:
        ran: dict[int, list[bool]] = {0: [], 64: []}
        for _ in range(3):
            for keys in (0, 64):
                time.sleep(0.005)  # the ticker waiting on its sleep, not on the GIL
                t0 = time.perf_counter()
                assert native.impl.hash_chunk(batches, keys) == (hashes, counts)
                ran[keys].append(ticker.ran_within(t0, time.perf_counter()))
    assert sum(ran[0]) <= 1, ran  # kept: the other thread waited the call out
    assert sum(ran[64]) >= 2, ran  # released: it ran meanwhile


def test_an_index_thread_s_round_leaves_another_index_s_inline_puts_holding_the_gil(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rare_switches: None
) -> None:
    """Two indexes in one process: while index A's thread is in a round (its calls release the
    GIL), index B's puts index inline and keep it.  Before, A's round set the module's figure to
    64 for everyone: B's inline calls released the GIL too."""
    if native.impl is None:
        pytest.skip("the compiled index is not built")
    inline = 4000  # keys enough for a call of a few ms
    a = HashIndex(tmp_path / "a", HashIndexOptions(inline_keys=256))
    b = HashIndex(tmp_path / "b", HashIndexOptions(inline_keys=inline))
    for index in (a, b):
        index.load(True, 0)
    b._start_worker = lambda: None  # type: ignore[method-assign]  # B's puts index inline only
    in_round = threading.Event()
    let_go = threading.Event()
    drain_a = a._drain

    def held_round(*args: Any) -> bool:  # A's thread: its round under way, held there
        if threading.current_thread().name == "hash-index":
            in_round.set()
            let_go.wait(30)
        return drain_a(*args)

    a._drain = held_round  # type: ignore[method-assign]
    calls: list[tuple[str, str, bool]] = []
    try:
        with Ticker() as ticker:
            for name in ("hash_chunk", "hash_batch", "put_batch"):
                monkeypatch.setattr(service, name, timed(ticker, calls, name, getattr(service, name)))
            a.dispatch_batch(TOPIC, 0, [props(0)], [100], [100], [0], T0, 0, [0])  # wakes A's thread
            assert in_round.wait(10), "index A's thread never started a round"
            k = 1
            for _ in range(3):
                for _ in range(inline):  # the last of them indexes B's queue itself, on this thread
                    b.dispatch_batch(TOPIC, 0, [props(k)], [k * 100], [100], [0], T0, k, [0])
                    k += 1
                time.sleep(0.005)
            let_go.set()
        here = threading.current_thread().name
        mine = [ran for thread, _name, ran in calls if thread == here]
        assert len(mine) >= 6, calls  # three inline drains: a hashing and an insertion each
        assert sum(mine) <= 1, calls  # kept the GIL (before: released in nearly all)
        found = b.query(TOPIC, f"U{k - 1:012d}", 10, 0, 2**62)
        assert list(found.phy_offsets) == [(k - 1) * 100]
    finally:
        let_go.set()
        a._drain = drain_a  # type: ignore[method-assign]
        a.shutdown()
        b.shutdown()


def test_the_setting_is_each_index_s_own(tmp_path: Path) -> None:
    assert not hasattr(native.impl, "set_gil_release_keys")  # no process-wide figure left
    inline = HashIndex(tmp_path / "i", HashIndexOptions(inline_keys=256))
    threaded = HashIndex(tmp_path / "t", HashIndexOptions(inline_keys=0))
    assert (inline._gil_keys, threaded._gil_keys) == (0, THREAD_GIL_RELEASE_KEYS)
    assert inline._release_gil() == threaded._release_gil() == THREAD_GIL_RELEASE_KEYS
    assert GIL_RELEASE_KEYS == THREAD_GIL_RELEASE_KEYS == 64


def test_the_answers_and_files_are_the_same_whatever_the_argument(tmp_path: Path) -> None:
    """The compiled calls with the GIL kept or released, and the Python reference (which takes
    the argument too), hash and write byte for byte alike."""
    batches = [(TOPIC, [props(i) for i in range(b * 70, (b + 1) * 70)], [0] * 70, b % 3) for b in range(4)]
    ref = indexfile.py_hash_chunk(batches, 0)
    assert ref == indexfile.py_hash_chunk(batches, 64) == indexfile.hash_chunk(batches, 0)
    assert indexfile.hash_chunk(batches, 64) == ref == indexfile.hash_chunk(batches)
    one = indexfile.py_hash_batch(*batches[1], 0)
    assert indexfile.hash_batch(*batches[1], 64) == one == indexfile.hash_batch(*batches[1], 0)
    hashes, counts = ref
    offsets = [1000 + 100 * i for i in range(len(counts))]
    stamps = [T0 + i for i in range(len(counts))]
    contents = []
    for how in ("py", 0, 64):
        f = IndexFile.create(tmp_path / f"f{how}", 97, 4000, 0, T0)
        try:
            if how == "py":
                got = f.py_put_batch(hashes, counts, offsets, stamps, 0, 0, 0)
            else:
                got = f.put_batch(hashes, counts, offsets, stamps, 0, 0, int(how))
            assert got[0] == len(counts)
            # The in-memory header (written on flush) and the slots and entries as mapped.
            body = Path(f.path).read_bytes()[indexfile.HEADER_SIZE :]
            contents.append((got, f.header.pack(), f._slot_chunks, body))
        finally:
            f.close()
    assert contents[0] == contents[1] == contents[2]


def test_indexes_that_keep_or_release_the_gil_answer_alike(tmp_path: Path) -> None:
    """Inline puts (GIL kept) and the index thread (released from 64 keys): the same answers."""
    answers = []
    for inline in (256, 0):
        index = HashIndex(tmp_path / f"x{inline}", HashIndexOptions(inline_keys=inline))
        index.load(True, 0)
        try:
            for k in range(600):
                index.dispatch_batch(TOPIC, 0, [props(k)], [k * 100 + 7], [100], [0], T0 + k, k, [0])
            deadline = time.monotonic() + 10
            while index.pending()[0] and time.monotonic() < deadline:
                time.sleep(0.01)  # left to the index thread (with 0, all of it)
            answers.append(
                [
                    list(index.query(TOPIC, key, 32, 0, 2**62).phy_offsets)
                    for key in ("U000000000599", "order-3", "k5")
                ]
            )
        finally:
            index.shutdown()
    assert answers[0] == answers[1]
    assert answers[0][0] == [599 * 100 + 7] and len(answers[0][1]) == 32


def test_the_python_versions_take_the_argument() -> None:
    """Called positionally by the index with the figure last: the reference takes it too."""
    h, c = indexfile.py_hash_batch(TOPIC, [props(1)], [0], 0, GIL_RELEASE_KEYS)
    assert isinstance(h, array.array) and list(c) == [3]
