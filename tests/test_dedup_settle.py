"""A stored send's answer as the duplicate window keeps it (issue 37), settled without per-send
work: evenly spaced message ids (a batch of records of one size) kept as the first offset and
the spacing, no array; the hex digits read eight at a time; the compiled send lane telling the
window through ``_dedup_table.STORED_C`` (no Python call), a record type that overrides
``stored`` still told through its override.  Checked against the Python reference (the ids as
text) byte for byte, and through a broker: a resend answered with the first send's ids.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dedup import UNIQ, answer, broker_on, key, send, send_batch, stored

from tidemq.broker import dedup_table
from tidemq.broker.dedup_sent import Sent
from tidemq.remoting.codes import ResponseCode

compiled_only = pytest.mark.skipif(not dedup_table.COMPILED, reason="the compiled window is not built")
pytestmark = pytest.mark.timeout(120)

HOST = "7F00000100002A9F"
HEX = "0123456789ABCDEF"


def _check(text: str) -> Any:
    compiled, reference = dedup_table.SentFields(), dedup_table._PySentFields()
    compiled.msg_id = text
    reference.msg_id = text
    assert compiled.msg_id == reference.msg_id == text
    n = text.count(",") + 1
    for pos in range(-1, n + 1):
        assert compiled.id_at(pos) == reference.id_at(pos), pos
    return compiled


@st.composite
def spaced(draw: Any) -> tuple[str, bool]:
    """Offset ids evenly spaced (a batch of one record size), maybe one of them moved."""
    first = draw(st.integers(0, 2**64 - 1))
    stride = draw(st.sampled_from([0, 1, 1100, 65_536, 2**31, 2**32 - 1, 2**32]) | st.integers(0, 2**33))
    count = draw(st.integers(1, 40))
    offsets = [(first + k * stride) % 2**64 for k in range(count)]
    moved = count > 1 and draw(st.booleans())
    if moved:
        at = draw(st.integers(1, count - 1))
        offsets[at] = (offsets[at] + draw(st.integers(1, 2**20))) % 2**64
    return ",".join(f"{HOST}{o:016X}" for o in offsets), moved


@compiled_only
@settings(max_examples=500, deadline=None)
@given(spaced())
def test_evenly_spaced_ids_read_back_byte_equal_and_keep_no_array(case: tuple[str, bool]) -> None:
    text, moved = case
    kept = _check(text)
    offsets = [int(i[16:], 16) for i in text.split(",")]
    fits = all(0 <= o - offsets[0] <= 0xFFFFFFFF for o in offsets)
    assert kept.packed == (len(offsets) if fits else 0)
    even = (
        all(o - offsets[0] == k * (offsets[1] - offsets[0]) for k, o in enumerate(offsets))
        if len(offsets) > 1
        else True
    )
    if fits and even:
        assert kept.spacing == (offsets[1] - offsets[0] if len(offsets) > 1 else 0)
    elif fits:
        assert moved and kept.spacing == -1  # the distances kept one by one


@compiled_only
def test_a_batch_of_one_record_size_is_kept_as_first_offset_and_spacing() -> None:
    ids = [f"{HOST}{10_000 + 1100 * j:016X}" for j in range(32)]
    kept = _check(",".join(ids))
    assert kept.packed == 32 and kept.spacing == 1100
    ids[17] = f"{HOST}{10_000 + 1100 * 17 + 4:016X}"  # one record 4 bytes longer: distances kept
    kept = _check(",".join(ids))
    assert kept.packed == 32 and kept.spacing == -1


@compiled_only
@pytest.mark.parametrize("digit", range(16))
def test_any_byte_but_an_upper_case_hex_digit_keeps_the_answer_as_text(digit: int) -> None:
    """Each of the 16 digits of the first and of a later id, replaced by every other byte of
    Latin-1: only "0-9A-F" re-encode byte-equal ("%016X"), so anything else is kept as text."""
    ids = [f"{HOST}{0x0123456789ABCDEF + 1100 * j:016X}" for j in range(3)]
    for which in (0, 2):
        for code in range(256):
            c = chr(code)
            changed = list(ids)
            i = changed[which]
            changed[which] = i[: 16 + digit] + c + i[17 + digit :]
            kept = _check(",".join(changed))
            if c in HEX:
                continue
            assert kept.packed == 0, (which, code)


@compiled_only
def test_the_compiled_settle_is_exported_for_the_send_lane() -> None:
    compiled = dedup_table._compiled
    assert type(compiled.STORED_C).__name__ == "PyCapsule"
    assert "tidemq.broker._dedup_table.STORED_C" in repr(compiled.STORED_C)


def test_an_overridden_stored_is_called_by_the_compiled_lane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane's C settle steps aside for a record type whose ``stored`` is not the compiled
    one (here: wrapped to count), so an override is never skipped; resends are answered alike."""
    calls: list[int] = []
    original = Sent.stored

    def counting(self: Sent, send_: Any, result: Any) -> None:
        calls.append(len(send_.msgs))
        original(self, send_, result)

    monkeypatch.setattr(Sent, "stored", counting)

    async def main() -> None:
        async with broker_on(tmp_path / "b") as (broker, client):
            k = key()
            first = await send(client, broker, "Counted", b"m", {UNIQ: k})
            again = await send(client, broker, "Counted", b"m", {UNIQ: k}, queue_id=2)
            assert first.code == ResponseCode.SUCCESS and answer(again) == answer(first)
            items = [(b"b%d" % i, {UNIQ: key()}) for i in range(32)]
            batch = await send_batch(client, broker, "Counted", items)
            resent = await send_batch(client, broker, "Counted", items, queue_id=3)
            assert batch.code == ResponseCode.SUCCESS and answer(resent) == answer(batch)
            assert stored(broker, "Counted") == 33

    asyncio.run(main())
    assert calls == [1, 32]


def test_a_batch_resend_is_answered_with_the_first_ids_through_the_compiled_settle(tmp_path: Path) -> None:
    """Batches of one record size (kept as first offset + spacing) and of mixed sizes (kept as
    distances), each resent: the first send's message ids, queue and offset, byte for byte."""

    async def main() -> None:
        async with broker_on(tmp_path / "b") as (broker, client):
            for n, sizes in ((32, [100]), (32, [10, 700, 3]), (1, [5])):
                items = [(b"x" * sizes[i % len(sizes)], {UNIQ: key()}) for i in range(n)]
                first = await send_batch(client, broker, "Spaced", items, queue_id=1)
                again = await send_batch(client, broker, "Spaced", items, queue_id=2)
                assert first.code == ResponseCode.SUCCESS, first.remark
                assert answer(again) == answer(first)
                assert len(answer(first)[1].split(",")) == n
            assert stored(broker, "Spaced") == 65

    asyncio.run(main())
