"""The duplicate window's records without a hash array (session 11, issue 37): the compiled
table keeps each recorded send's keys' hashes in its own key ring (``HashTable._keep``), the run
hashes into a buffer reused from run to run, and ``position``, a send forgotten (not stored), an
eviction out of place and ``Sent.hashes`` read them there.  Checked against the keys themselves
and against the reference (the run check in Python, ``_PyHashTable``).
"""

from __future__ import annotations

import random
import sys
from array import array

import pytest
from test_dedup_run import CONFIGS, Result, build, pair, state

from tidemq.broker import dedup_table
from tidemq.broker.dedup import UNIQ_KEY, Sent
from tidemq.broker.dedup_table import hashes_of
from tidemq.broker.services.put import Send
from tidemq.message_types import MessageInner

pytestmark = pytest.mark.skipif(not dedup_table.COMPILED, reason="the compiled window is not built")


def _send(topic: str, keys: list[str]) -> Send:
    msgs = [MessageInner(topic, b"x", 0, 0, {UNIQ_KEY: k, "TAGS": "t"}) for k in keys]
    return Send("g", msgs, len(msgs) > 1, None, 0, len(msgs))


def test_a_recorded_send_allocates_its_record_only() -> None:
    """A run of batch sends allocates one block a send (its record): no hash array (an object
    and its buffer a send before).  The table's arrays and the run's buffer are large blocks,
    allocated once, not per send."""
    _, window, _ = pair(1_000_000)
    warm = [_send("A", [f"W{i:05d}-{j}" for j in range(8)]) for i in range(3000)]
    assert window.admit_run(warm, CONFIGS.get)  # the table and its rings grown past what follows
    sends = [_send("A", [f"S{i:05d}-{j}" for j in range(8)]) for i in range(200)]
    before = sys.getallocatedblocks()
    assert window.admit_run(sends, CONFIGS.get)
    grown = sys.getallocatedblocks() - before
    assert all(isinstance(s.dedup, Sent) for s in sends)
    assert grown <= len(sends) * 1.2, grown  # was ~3 a send (the record, an array, its buffer)
    assert not hasattr(sends[0].dedup, "__dict__") and Sent.__basicsize__ <= 160


def test_positions_and_hashes_read_from_the_key_ring_through_wraps_and_forgets() -> None:
    """Thousands of sends of 1-40 keys through a window of 300 keys (the key ring wraps many
    times and doubles), some not stored (forgotten): every kept send's ``hashes`` are its keys'
    and each key's ``position`` its index; a send evicted reads none."""
    rng = random.Random(11)
    _, window, _ = pair(300)
    kept: list[tuple[Send, list[str]]] = []
    for i in range(3000):
        keys = [f"{i:05d}{rng.randrange(1 << 30):08X}" for _ in range(rng.randint(1, 40))]
        send = _send("A", keys)
        assert window.admit_run([send], CONFIGS.get)
        sent = send.dedup
        assert isinstance(sent, Sent) and sent.nkeys == len(keys)
        if rng.random() < 0.1:  # not stored: its keys leave now
            send.status = 14
            sent.stored(send, Result())
            assert not sent.live
            assert all(window.check("A", k) is None for k in keys)
            continue
        kept.append((send, keys))
        if i % 50 == 0:
            for s, ks in kept[-40:]:
                got = s.dedup
                assert got is not None
                if not got.live:
                    assert len(got.hashes) == 0
                    continue
                assert list(got.hashes) == list(hashes_of(ks))
                for j, k in enumerate(ks):
                    if window.check("A", k) is got:
                        assert got.position(k) == (j if len(ks) > 1 else 0)
    table = window._topics["A"]
    assert window.entries <= 300 and len(table) == window.entries


def test_a_run_past_the_reused_buffer_records_and_declines_as_the_reference() -> None:
    """Runs of 1 280 keys (past the run buffer's first size: it grows, contents kept), one
    declined at its very last key (a resend: everything before undone), agree with the
    reference window's records and answers."""
    _, compiled, reference = pair(100_000)
    runs: dict[str, list[list[Send]]] = {"c": [], "r": []}
    Run = list[tuple[str, list[tuple[str | None, bytes]]]]
    big: Run = [("A", [(f"K{s:02d}{j:02d}", b"a") for j in range(32)]) for s in range(40)]
    again: Run = [("A", [(f"N{s:02d}{j:02d}", b"a") for j in range(32)]) for s in range(39)]
    last: list[tuple[str | None, bytes]] = [(f"N99{j:02d}", b"a") for j in range(31)]
    again.append(("A", [*last, ("K0000", b"a")]))
    for run in (big, again, again[:-1]):
        verdicts = []
        for name, window in (("c", compiled), ("r", reference)):
            sends = build(run)
            runs[name].append(sends)
            verdicts.append(window.admit_run(sends, CONFIGS.get))
        assert verdicts[0] == verdicts[1]
        keys = [k for _, msgs in big + again for k, _ in msgs if k is not None]
        assert state(compiled, runs["c"], ("A",), keys) == state(reference, runs["r"], ("A",), keys)
    assert runs["c"][1][0].dedup is None and runs["c"][2][0].dedup is not None  # declined, then not
    assert compiled.entries == reference.entries == 40 * 32 + 39 * 32


def test_a_run_entered_while_another_runs_uses_its_own_buffer() -> None:
    """A run's ``config_of`` (Python) runs another window's run: that one hashes into a buffer
    of its own (the shared one is in use), and both record their keys and positions."""
    _, outer, _ = pair(1000)
    _, inner, _ = pair(1000)
    inner_sends = [_send("A", [f"I{j}" for j in range(300)])]

    def config_of(topic: str) -> object:
        if inner_sends[0].dedup is None:
            assert inner.admit_run(inner_sends, CONFIGS.get)
        return CONFIGS[topic]

    outer_sends = [_send("A", [f"O{j}" for j in range(5)]), _send("A", [f"P{j}" for j in range(7)])]
    assert outer.admit_run(outer_sends, config_of)
    for window, sends in ((inner, inner_sends), (outer, outer_sends)):
        for s in sends:
            sent = s.dedup
            assert isinstance(sent, Sent)
            keys = [m.properties[UNIQ_KEY] for m in s.msgs]
            assert list(sent.hashes) == list(hashes_of(keys))
            assert [sent.position(k) for k in keys] == list(range(len(keys)))
            assert all(window.check("A", k) is sent for k in keys)


def test_evicting_a_send_not_at_the_ring_tail_removes_its_keys_by_the_kept_hashes() -> None:
    """``evict`` of a send whose entries are not the ring's tail (a newer one than the oldest)
    finds its keys by the hashes its table keeps; the older one then leaves from the tail."""
    table = dedup_table.HashTable()
    old, new = (dedup_table.SentFields.__new__(dedup_table.SentFields) for _ in range(2))
    a, b = array("q", [11, 12, 13]), array("q", [21, 22])
    assert table.put_record(a, old) is None and table.put_record(b, new) is None
    assert table.evict(new) == 2 and len(table) == 3
    assert all(table.get(h) is None for h in b) and all(table.get(h) is old for h in a)
    assert table.evict(old) == 3 and len(table) == 0
    assert table.remove_record(old) == table.remove_record(new) == 0  # nothing kept for them now


def test_the_window_answers_resends_of_batches_from_the_key_ring() -> None:
    """A resend of a stored batch, in another order and cut short, is answered per message
    from the first send (``position`` read from the key ring), with and without the compiled
    run (the reference window)."""
    _, compiled, reference = pair(1000)
    keys = [f"C0FFEE{j:04X}" for j in range(32)] + [f"rand-{j}" for j in range(5)]
    for window in (compiled, reference):
        first = _send("A", keys)
        assert window.admit_run([first], CONFIGS.get)
        first.status, first.queue_id, first.queue_offset, first.recall_handle = 0, 3, 500, None
        first.msg_id = ",".join(f"7F00000100002A9F{1000 + 64 * j:016X}" for j in range(len(keys)))
        assert first.dedup is not None
        first.dedup.stored(first, Result())
        sent = window.check("A", keys[7])
        assert sent is first.dedup
        for k in reversed(keys[3:]):
            pos = keys.index(k)
            assert sent.position(k) == pos
            assert sent.answer(pos) == (f"7F00000100002A9F{1000 + 64 * pos:016X}", 3, 500 + pos)
