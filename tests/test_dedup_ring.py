"""The full duplicate window's compact layout (issue 37): the compiled key table's 8-byte slots
into a ring of (hash, record) entries kept in arrival order, and a stored send's answer kept as
numbers (the ids' shared prefix, the first commit-log offset, 32-bit deltas) and re-encoded byte
for byte.  Checked against the Python reference (``_PyHashTable``, ``_PySentFields``: a dict
and the ids as text): the same records, the same eviction order, answers byte-equal.
"""

from __future__ import annotations

import random
from array import array
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.broker import dedup, dedup_table
from tidemq.broker.dedup import UNIQ_KEY, DuplicateWindow, Sent
from tidemq.broker.services.put import Send
from tidemq.message_types import MessageInner

pytestmark = pytest.mark.skipif(not dedup_table.COMPILED, reason="the compiled window is not built")


# ---------------------------------------------------------------------------- the answer as numbers

HOSTS = ["7F00000100002A9F", "0A0000050000277B", "00000000000000000000FFFF7F00000100002A9F"]
_id_offsets = st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6)


@st.composite
def answers(draw: Any) -> str:
    """A put's answer text: mostly offset ids of one host (what a store writes), sometimes not."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.text(max_size=80))
    host = draw(st.sampled_from(HOSTS))
    first = draw(st.integers(0, 2**64 - 1))
    steps = draw(st.lists(st.integers(0, 2**33), max_size=40))
    offsets = [first]
    for s in steps:
        offsets.append((offsets[-1] + s) % 2**64)
    ids = [f"{host}{o:016X}" for o in offsets]
    if kind == 1:  # lower case, another host in the middle, a short id, a missing comma
        i = draw(st.integers(0, len(ids) - 1))
        ids[i] = draw(
            st.sampled_from([ids[i].lower(), HOSTS[0][::-1] + ids[i][16:], ids[i][:-1], ids[i] + "0"])
        )
    if kind == 2 and len(ids) > 1:
        return ";".join(ids)
    return ",".join(ids)


@settings(max_examples=400, deadline=None)
@given(answers())
def test_a_kept_answer_reads_back_byte_equal_to_the_reference(text: str) -> None:
    compiled = dedup_table.SentFields()
    reference = dedup_table._PySentFields()
    compiled.msg_id = text
    reference.msg_id = text
    assert compiled.msg_id == reference.msg_id == text
    assert type(compiled.msg_id) is str
    assert compiled.answered == reference.answered == bool(text)
    n = text.count(",") + 1
    for pos in range(-1, n + 2):
        assert compiled.id_at(pos) == reference.id_at(pos), pos
    compiled.msg_id = ""  # set again: the packed numbers freed, the text kept
    assert compiled.msg_id == "" and not compiled.answered


def test_a_batchs_offset_ids_are_kept_as_numbers_with_one_shared_prefix() -> None:
    ids = [f"7F00000100002A9F{10_000 + 1100 * j:016X}" for j in range(32)]
    a, b = dedup_table.SentFields(), dedup_table.SentFields()
    a.msg_id = ",".join(ids)
    b.msg_id = ids[3]
    assert a.packed == 32 and b.packed == 1
    assert [a.id_at(j) for j in range(32)] == ids and b.id_at(0) == ids[3]
    far = dedup_table.SentFields()  # offsets 4 GiB apart do not fit a 32-bit delta: kept as text
    far.msg_id = f"{ids[0]},7F00000100002A9F{2**40:016X}"
    assert far.packed == 0 and far.id_at(1) == f"7F00000100002A9F{2**40:016X}"


# ---------------------------------------------------------------------------- the ring


def test_the_key_ring_wraps_and_compacts_under_a_steady_turnover() -> None:
    """A window turning over at a steady size: keys in and out oldest first, some taken over by
    a later record, some removed early (holes); the ring wraps many times, is compacted rather
    than grown, and the table agrees with the reference throughout."""
    rng = random.Random(38)
    compiled, reference = dedup_table.HashTable(), dedup_table._PyHashTable()
    values = [object() for _ in range(64)]
    live: dict[int, object] = {}  # hash -> value, in arrival order
    pushed = 0
    for step in range(60_000):
        h = rng.randrange(-(2**63), 2**63)
        if live and rng.random() < 0.05:  # an existing key taken over (a new record)
            h = rng.choice(list(live)[-500:])
        v = rng.choice(values)
        assert compiled.put(h, v) is reference.put(h, v)
        live.pop(h, None)
        live[h] = v
        pushed += 1
        if rng.random() < 0.03 and len(live) > 2:  # removed early (a send not stored): a hole
            k = rng.choice(list(live)[-200:])
            x = live.pop(k)
            assert compiled.remove_many(array("q", [k]), x) == reference.remove_many(array("q", [k]), x) == 1
        while len(live) > 3000:  # the oldest leave
            k = next(iter(live))
            x = live.pop(k)
            batch = array("q", [k])
            assert compiled.remove_many(batch, x) == reference.remove_many(batch, x) == 1
        assert len(compiled) == len(reference) == len(live)
        if step % 5000 == 0:
            assert all(compiled.get(k) is x for k, x in live.items())
    assert all(compiled.get(k) is x is reference.get(k) for k, x in live.items())
    assert compiled.ring_capacity <= 4096 and pushed > 10 * compiled.ring_capacity  # wrapped, not grown
    assert compiled.ring_span <= compiled.ring_capacity


def test_a_resend_after_eviction_is_stored() -> None:
    """Oldest first: a key evicted over the bound is no longer answered (its resend is stored),
    a later one still is."""
    window = DuplicateWindow(120, 64, 1 << 40)
    sends = [_send("T", [f"K{i:03d}"]) for i in range(200)]
    for s in sends:
        assert window.admit_run([s], _CONFIGS.get)
        _stored(s, 5000 + len(s.msgs))
    assert window.entries == 64 and window.evicted == 136
    assert window.check("T", "K000") is None and window.check("T", "K135") is None
    assert window.check("T", "K136") is not None and window.check("T", "K199") is not None
    again = _send("T", ["K000"])
    assert window.admit_run([again], _CONFIGS.get)  # not a resend: recorded, to be stored
    assert isinstance(again.dedup, Sent)


# ---------------------------------------------------------------------------- against the reference


class _Cfg:
    def __init__(self, attributes: dict[str, str]) -> None:
        self.attributes = attributes


_CONFIGS = {"T": _Cfg({}), "U": _Cfg({"dedup.window.seconds": "3"})}


class _PySent(dedup_table._PySentFields):
    """``Sent``'s methods on the Python reference's fields."""

    __slots__ = ()


for _name in ("__init__", "answer", "position", "from_put", "put_future"):
    setattr(_PySent, _name, Sent.__dict__[_name])


class _Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Result:
    wrote_offset = 100
    wrote_bytes = 10


def _send(topic: str, keys: list[str]) -> Send:
    msgs = [MessageInner(topic, b"x", 0, 0, {UNIQ_KEY: k, "TAGS": "t"}) for k in keys]
    return Send("g", msgs, len(msgs) > 1, None, 0, len(msgs))


def _stored(s: Send, offset: int) -> None:
    s.status, s.queue_id, s.queue_offset, s.recall_handle = 0, 1, offset, None
    s.msg_id = ",".join(f"7F00000100002A9F{offset + 777 * j:016X}" for j in range(len(s.msgs)))
    if s.dedup is not None:
        s.dedup.stored(s, _Result())


run_step = st.tuples(
    st.lists(
        st.tuples(st.sampled_from(["T", "T", "U"]), st.lists(st.integers(0, 40), min_size=1, max_size=4))
    ),
    st.floats(0, 2),  # seconds the clock moves first
    st.booleans(),  # the first copies stored (else failed: forgotten)
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(run_step, min_size=1, max_size=15), st.sampled_from([1, 2, 5, 9, 30]))
def test_the_compiled_layout_and_the_python_reference_keep_and_answer_alike(
    steps: list[Any], max_entries: int
) -> None:
    """Under tiny bounds: the same keys kept (eviction order), the same counters, and every kept
    key answered with byte-equal ids, queue and offset."""
    clock = _Clock()
    compiled = DuplicateWindow(10, max_entries, 1 << 40, clock=clock)
    reference = DuplicateWindow(10, max_entries, 1 << 40, clock=clock)
    reference._compiled_run = None
    reference._compiled_trim = None
    offset = 0
    for run, moved, ok in steps:
        clock.now += moved
        verdicts = []
        made: list[list[Send]] = []
        for window, python in ((compiled, False), (reference, True)):
            sends = []
            for topic, ids in run:
                keys = [f"K{i:02d}" for i in dict.fromkeys(ids)]
                sends.append(_send(topic, keys))
            with pytest.MonkeyPatch.context() as mp:
                if python:
                    mp.setattr(dedup, "HashTable", dedup_table._PyHashTable)
                    mp.setattr(dedup, "Sent", _PySent)
                verdicts.append(window.admit_run(sends, _CONFIGS.get))
            made.append(sends)
        assert verdicts[0] == verdicts[1]
        for sends in made:
            at = offset
            for s in sends:
                if ok:
                    _stored(s, at)
                elif s.dedup is not None:
                    s.status = 14
                    s.dedup.stored(s, _Result())
                at += 100_000
        offset = at
        assert (compiled.entries, compiled.nbytes, compiled.evicted) == (
            reference.entries,
            reference.nbytes,
            reference.evicted,
        )
        for topic in _CONFIGS:
            for i in range(41):
                key = f"K{i:02d}"
                c, r = compiled.check(topic, key), reference.check(topic, key)
                assert (c is None) == (r is None), (topic, key)
                if c is not None and r is not None and c.send is None and r.send is None:
                    assert c.answer(c.position(key)) == r.answer(r.position(key))
                    assert c.msg_id == r.msg_id


def test_eviction_at_the_ring_tail_reuses_dead_slots_and_agrees_with_the_reference() -> None:
    """Sends leave oldest first through ``evict`` (the compiled table only advances its ring's
    tail: their slots die by position and are reused by later keys), with keys taken over and
    sends removed early between: both tables keep and answer alike, and the compiled one never
    grows past the size its live keys need (dead slots are reused, not accumulated)."""
    rng = random.Random(39)
    compiled, reference = dedup_table.HashTable(), dedup_table._PyHashTable()
    order: list[tuple[Any, array[int]]] = []  # the records with their hashes, oldest first
    live_keys = 0
    for step in range(40_000):
        rec = dedup_table.SentFields.__new__(dedup_table.SentFields)
        n = rng.choice((1, 1, 2, 4))
        hashes = [rng.randrange(-(2**63), 2**63) for _ in range(n)]
        if order and rng.random() < 0.05:  # a key of a recent send taken over
            hashes[0] = rng.choice(order[-50:])[1][0]
        kept = array("q", hashes)
        # the compiled table keeps the hashes for the record (its key ring), the reference's
        # records their own: removals and evictions below read them there
        a, b = compiled.put_record(kept, rec), reference.put_many(kept, rec)
        assert a == b and rec.nkeys == n
        order.append((rec, kept))
        if rng.random() < 0.02 and len(order) > 2:  # a send not stored: removed early
            gone, its = order[-2]
            assert compiled.remove_record(gone) == reference.remove_many(its, gone)
            assert compiled.remove_record(gone) == 0
        while len(reference) > 2000:
            oldest, its = order.pop(0)
            assert compiled.evict(oldest) == reference.remove_many(its, oldest)
        assert len(compiled) == len(reference)
        if step % 4000 == 0:
            assert all(compiled.get(h) is reference.get(h) for r, its in order[-300:] for h in its)
    live_keys = len(reference)
    assert all(compiled.get(h) is reference.get(h) for r, its in order for h in its)
    assert compiled.capacity <= 4 * 2048 and live_keys <= 2000  # grown for its live keys only
    assert compiled.displaced == 0


def test_a_full_bucket_overflows_flagged_and_displaces_only_past_its_bound() -> None:
    """Keys sharing one home bucket (8 slots, a cache line): the ninth goes to the next bucket
    (the full one flagged, so a check reads on), every key stays found, also after keys of the
    home bucket leave out of order; only when 16 buckets in a row are full does an insert
    displace the oldest key of its home bucket (counted; it loses its protection early)."""
    compiled = dedup_table.HashTable()
    same_home = [j << 53 for j in range(1, 150)]  # fingerprints j << 20: home bucket 0 at any size
    values = [object() for _ in same_home]
    for h, v in zip(same_home[:40], values[:40], strict=True):
        assert compiled.put(h, v) is None
    assert compiled.flagged >= 4 and compiled.displaced == 0
    assert all(compiled.get(h) is v for h, v in zip(same_home[:40], values[:40], strict=True))
    for h, v in zip(same_home[:6], values[:6], strict=True):  # out of order, from the home bucket
        assert compiled.remove_many(array("q", [h]), v) == 1
    assert all(compiled.get(h) is v for h, v in zip(same_home[6:40], values[6:40], strict=True))
    for h, v in zip(same_home[40:], values[40:], strict=True):  # the freed slots reused, then more
        compiled.put(h, v)
    assert compiled.displaced == len(same_home) - 6 - 16 * 8
    assert len(compiled) == 16 * 8
    kept = [h for h in same_home[6:] if compiled.get(h) is not None]
    assert len(kept) == 16 * 8 and compiled.get(same_home[-1]) is values[-1]


def test_a_python_table_has_the_compiled_tables_shape() -> None:
    """The reference answers what the compiled table's bookkeeping does (none displaced)."""
    table = dedup_table._PyHashTable()
    rec = dedup_table._PySentFields()
    rec.hashes = array("q", [5, 6])
    assert table.put_many(rec.hashes, rec) is None and table.evict(rec) == 2 and len(table) == 0
    assert table.displaced == table.flagged == 0
