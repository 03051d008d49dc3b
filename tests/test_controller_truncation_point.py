"""Where a deposed master or a lagging slave cuts its log back to (found by mutation testing,
tests/mutation/REPORT.md): two logs agree only from an epoch both hold with the same start offset."""

from __future__ import annotations

import pytest

pytest.importorskip("httpx", reason="httpx is not installed (pip install tidemq[controller])")

from tidemq_controller.epochs import EpochEntry, consistent_point  # noqa: E402


def entries(*pairs: tuple[str, str]) -> list[EpochEntry]:
    # Offsets parsed at run time, as read from an epoch file: equal values, distinct objects.
    return [EpochEntry(int(epoch), int(start)) for epoch, start in pairs]


def test_the_same_epoch_started_elsewhere_is_another_history() -> None:
    # Epoch 2 began at 800 here and at 700 there: they agree only to 700, inside epoch 1.
    mine = entries(("1", "0"), ("2", "800"))
    theirs = entries(("1", "0"), ("2", "700"))
    assert consistent_point(mine, 900, theirs, 900) == 700
    assert consistent_point(theirs, 900, mine, 900) == 700


def test_large_offsets_compare_by_value() -> None:
    mine = entries(("1", "0"), ("2", "80000000"))
    theirs = entries(("1", "0"), ("2", "80000000"))
    assert consistent_point(mine, 90000000, theirs, 85000000) == 85000000
