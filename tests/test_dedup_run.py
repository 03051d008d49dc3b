"""The duplicate window's run check (issue 37): ``DuplicateWindow.admit_run``, compiled
(``_dedup_table.WindowFields.admit_run``: check, record, counters and eviction in one call) and its
Python reference (``admit_run_py``), give the same verdicts
and records: random runs of sends over a few topics and keys (resends, keys repeated in a batch
or across a run, missing, empty and over-long keys, a topic without a window, one keyed on
content, a bound the runs overflow), the clock moving (expired keys taken over), first copies
stored or forgotten between runs, sends evicted past their deadline or over the bound (the
compiled eviction against the Python ``_trim``).
"""

from __future__ import annotations

import gc
import random
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.broker import dedup_table
from tidemq.broker.dedup import UNIQ_KEY, DuplicateWindow, Sent
from tidemq.broker.dedup_table import key_hash
from tidemq.broker.services.put import Send
from tidemq.message_types import MessageInner

pytestmark = pytest.mark.skipif(not dedup_table.COMPILED, reason="the compiled window is not built")


class Cfg:
    def __init__(self, attributes: dict[str, str]) -> None:
        self.attributes = attributes


CONFIGS = {
    "A": Cfg({}),
    "B": Cfg({"dedup.window.seconds": "5"}),
    "Off": Cfg({"dedup.window.seconds": "0"}),
    "Body": Cfg({"dedup.key": "content"}),
}
KEYS = [f"K{i:02d}" for i in range(24)] + ["", "X" * 129, "Y" * 128, None]

message = st.tuples(st.sampled_from(KEYS), st.sampled_from([b"a", b"b"]))
send = st.tuples(
    st.sampled_from(["A", "A", "A", "B", "Off", "Body", "%RETRY%g"]),
    st.lists(message, min_size=1, max_size=5),
)
step = st.tuples(
    st.lists(send, min_size=1, max_size=6),  # the run
    st.floats(min_value=0, max_value=4),  # seconds the clock moves before it
    st.lists(st.integers(0, 3), max_size=8),  # what happens to pending sends after it
)


def build(run: list[tuple[str, list[tuple[str | None, bytes]]]]) -> list[Send]:
    sends = []
    for topic, msgs in run:
        inner = []
        for key, body in msgs:
            props = {"TAGS": "t"}
            if key is not None:
                props[UNIQ_KEY] = key
            inner.append(MessageInner(topic, body, 0, 0, props))
        sends.append(Send("g", inner, len(inner) > 1, None, 0, len(inner)))
    return sends


def state(
    window: DuplicateWindow,
    sends: list[list[Send]],
    topics: Iterable[str] = (*CONFIGS, "%RETRY%g"),
    keys: Iterable[str] = KEYS,
) -> Any:
    """What the window holds, with Sents named by (run, send) so two windows compare: every
    record, and which record answers each of ``keys`` in each of ``topics``."""
    names: dict[int, tuple[int, int]] = {}
    records: list[Any] = []
    for r, run in enumerate(sends):
        for i, s in enumerate(run):
            sent = s.dedup
            if isinstance(sent, Sent):
                names[id(sent)] = (r, i)
                records.append(
                    ((r, i), sent.topic, sent.nkeys, list(sent.hashes), sent.deadline, sent.nbytes, sent.live)
                )
            else:
                records.append(((r, i), sent))
    table = {}
    for topic in topics:
        for key in keys:
            if key:
                found = window.check(topic, key)
                table[(topic, key)] = None if found is None else names.get(id(found), "?")
    return records, table, window.entries, window.nbytes, window.evicted


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pair(max_entries: int) -> tuple[Clock, DuplicateWindow, DuplicateWindow]:
    clock = Clock()
    compiled = DuplicateWindow(10, max_entries, 1 << 30, clock=clock)
    reference = DuplicateWindow(10, max_entries, 1 << 30, clock=clock)
    reference._compiled_run = None  # the Python reference: its run check and its eviction
    reference._compiled_trim = None
    assert compiled._compiled_run is not None and compiled._compiled_trim is not None
    return clock, compiled, reference


class Result:
    """A put's outcome as ``Sent.stored`` reads it."""

    wrote_offset = 100
    wrote_bytes = 10


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=12), st.sampled_from([1, 3, 8, 40, 10_000]))
def test_compiled_and_python_runs_agree(steps: list[Any], max_entries: int) -> None:
    clock, compiled, reference = pair(max_entries)
    runs: dict[str, list[list[Send]]] = {"c": [], "r": []}
    for run, moved, outcomes in steps:
        clock.now += moved
        verdicts = []
        for name, window in (("c", compiled), ("r", reference)):
            sends = build(run)
            runs[name].append(sends)
            verdicts.append(window.admit_run(sends, CONFIGS.get))
        assert verdicts[0] == verdicts[1]
        assert state(compiled, runs["c"]) == state(reference, runs["r"])
        # Some first copies are stored (answered), some fail (their keys forgotten).
        for k, outcome in enumerate(outcomes):
            for name in ("c", "r"):
                pending = [
                    s for run_ in runs[name] for s in run_ if isinstance(s.dedup, Sent) and s.dedup.send
                ]
                if not pending:
                    continue
                s = pending[(k * 7) % len(pending)]
                s.status = 0 if outcome else 14  # SUCCESS, else a refusal: forgotten
                s.msg_id, s.queue_id, s.queue_offset, s.recall_handle = "M", 0, k, None
                s.dedup.stored(s, Result())  # type: ignore[union-attr]
        assert state(compiled, runs["c"]) == state(reference, runs["r"])


def test_a_declined_run_records_nothing_and_restores_what_it_took_over() -> None:
    """A run whose last send is a resend is declined whole: the keys recorded before it in the
    run are removed again, an expired key it took over is back (the compiled undo)."""
    clock, compiled, _ = pair(1000)
    first = build([("A", [("K00", b"a")]), ("A", [("K01", b"a")])])
    assert compiled.admit_run(first, CONFIGS.get)
    old = first[0].dedup
    clock.now += 11  # K00's entry is expired (still in the table until trimmed)
    second = build([("A", [("K02", b"a"), ("K00", b"a")]), ("A", [("K03", b"a"), ("K02", b"b")])])
    entries = compiled.entries
    assert not compiled.admit_run(second, CONFIGS.get)  # K02 twice in the run
    assert all(s.dedup is None for s in second) and compiled.entries == entries
    assert compiled._topics["A"].get(key_hash("K00")) is old  # the expired key it took over, restored
    assert (
        compiled._topics["A"].get(key_hash("K02")) is None
        and compiled._topics["A"].get(key_hash("K03")) is None
    )
    fresh = build([("A", [("K00", b"a")])])
    assert compiled.admit_run(fresh, CONFIGS.get) and fresh[0].dedup is not None  # expired: stored again


def test_the_compiled_run_refuses_a_wrong_hash_array() -> None:
    table = dedup_table.HashTable()
    from array import array

    with pytest.raises(TypeError):
        table.any_of(array("i", [1, 2]))  # its items are read raw: only array("q")
    with pytest.raises(TypeError):
        table.put_many(b"12345678", 1)  # type: ignore[arg-type]


def test_the_windows_records_are_not_walked_by_the_cycle_collector() -> None:
    """A full window of single sends is 500 000 records: none is tracked by the collector (every
    full collection walked them all), nor its hash array (``array.array`` is a tracked type),
    whether the compiled run made it or ``record`` did."""
    _, compiled, _ = pair(1000)
    sends = build([("A", [("K00", b"a")]), ("A", [("K01", b"a"), ("K02", b"a")])])
    assert compiled.admit_run(sends, CONFIGS.get)
    from array import array

    recorded = compiled.record("A", array("q", [key_hash("K03")]), None, 10)
    for sent in (sends[0].dedup, sends[1].dedup, recorded):
        assert isinstance(sent, Sent) and not gc.is_tracked(sent) and not gc.is_tracked(sent.hashes)
    assert compiled.check("A", "K01") is sends[1].dedup and compiled.check("A", "K03") is recorded


def test_a_table_past_2_mib_keeps_every_key_through_growth_and_deletes() -> None:
    """The table moves to its own (huge-page) mapping past 2 MiB and grows there: every key kept,
    deletes shift back within it, and it frees cleanly."""
    rng = random.Random(37)
    keys = list({rng.getrandbits(63) - (1 << 62) for _ in range(200_000)})
    table = dedup_table.HashTable()
    values = [object() for _ in range(8)]
    for i, h in enumerate(keys):
        assert table.put(h, values[i % 8]) is None
    assert len(table) == len(keys) and table.capacity * 16 > 2 << 20
    assert all(table.get(h) is values[i % 8] for i, h in enumerate(keys))
    from array import array

    gone = array("q", keys[::2])
    assert table.remove_many(gone, values[0]) == len(keys[::8])  # the even ones still values[0]'s
    for i, h in enumerate(keys):
        assert table.get(h) is (None if i % 8 == 0 else values[i % 8])
    assert len(table) == len(keys) - len(keys[::8])
    del table


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80) | st.text(alphabet="0123456789ABCDEF", min_size=30, max_size=36))
def test_the_compiled_key_hash_is_its_python_twin(key: str) -> None:
    """The window's keys are hashed in C with per-process secrets (no str hash, no SipHash per
    message); the Python twin gives the same value for any str (ASCII, Latin-1, 2- and 4-byte
    characters, every length around the 16-byte blocks)."""
    compiled = dedup_table._compiled
    secrets = compiled.secrets_for_tests()
    assert compiled.key_hash(key) == dedup_table.py_key_hash(key, secrets)
    assert list(dedup_table.hashes_of([key, key + "0"])) == [key_hash(key), key_hash(key + "0")]


def test_the_key_hash_is_keyed_per_process() -> None:
    """A sender cannot choose keys that collide in the table: the hash of one key differs from
    process to process (as ``hash()``'s), and differs between keys one character apart."""
    import subprocess
    import sys

    code = (
        "from tidemq.broker.dedup_table import key_hash; print(key_hash('0A0B0C0D0E0F00112233445566778899'))"
    )
    seen = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(3)
    }
    assert len(seen) == 3
    assert len({key_hash(f"{i:032X}") for i in range(10_000)}) == 10_000


def test_the_windows_keys_are_read_from_a_messages_slot_or_its_attribute() -> None:
    """``properties`` read in place from attrs' slotted ``MessageInner``; any other message type
    (a plain class, a subclass with a property) through the attribute, with the same records."""

    class Plain:
        def __init__(self, topic: str, properties: dict[str, str]) -> None:
            self.topic, self.properties, self.body, self.flag, self.sys_flag = topic, properties, b"x", 0, 0

    class Derived(MessageInner):
        __slots__ = ()

    window = DuplicateWindow(10, 1000, 1 << 30, clock=lambda: 100.0)
    for i, make in enumerate(
        (
            lambda k: MessageInner("A", b"x", 0, 0, {UNIQ_KEY: k}),
            lambda k: Plain("A", {UNIQ_KEY: k}),
            lambda k: Derived("A", b"x", 0, 0, {UNIQ_KEY: k}),
        )
    ):
        send = Send("g", [make(f"S{i}-{j}") for j in range(3)], True, None, 0, 3)
        assert window.admit_run([send], CONFIGS.get)
        assert send.dedup is not None and list(send.dedup.hashes) == [key_hash(f"S{i}-{j}") for j in range(3)]
        again = Send("g", [make(f"S{i}-1")], True, None, 0, 1)
        assert not window.admit_run([again], CONFIGS.get)  # held: a resend


def test_a_run_is_checked_counted_and_trimmed_in_one_compiled_call() -> None:
    """The send lane's ``admit_run`` is the compiled ``WindowFields.admit_run``: the window's
    counters and its eviction over the bound happen in that call, with no Python frame of the
    window's (its Python ``_recorded``/``_trim`` are never called), and the bound holds."""

    def not_called(*args: Any) -> None:
        raise AssertionError("the run went through the window's Python code")

    clock, compiled, reference = pair(8)
    assert type(compiled).admit_run is dedup_table.WindowFields.admit_run
    compiled._recorded = not_called
    compiled._trim = not_called
    runs = []
    for r in range(6):
        clock.now += 1
        run: list[tuple[str, list[tuple[str | None, bytes]]]] = [
            ("A", [(f"K{(3 * r + i) % 24:02d}", b"a") for i in range(3)])
        ]
        for window in (compiled, reference):
            sends = build(run)
            assert window.admit_run(sends, CONFIGS.get)
            if window is compiled:
                runs.append(sends)
        assert compiled.entries <= 8 and (compiled.entries, compiled.nbytes, compiled.evicted) == (
            reference.entries,
            reference.nbytes,
            reference.evicted,
        )
    assert compiled.evicted > 0
    assert compiled.check("A", "K15") is runs[5][0].dedup and compiled.check("A", "K00") is None
