"""The epoch file beside the commit log (issue 25): durable, strict, and the truncation point."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq_controller.epochs import EpochEntry, EpochFile, EpochFileError, consistent_point


def E(*pairs: tuple[int, int]) -> list[EpochEntry]:
    return [EpochEntry(epoch, start) for epoch, start in pairs]


def test_recorded_epochs_survive_a_reopen_and_stay_ordered(tmp_path: Path) -> None:
    path = tmp_path / "epoch"
    epochs = EpochFile(path)
    assert epochs.entries == () and epochs.last is None  # a new replica: no file yet
    epochs.record(1, 0)
    epochs.record(2, 4096)
    epochs.record(2, 4096)  # re-announcing the current epoch after a restart: no-op
    epochs.record(5, 4096)  # an epoch whose master wrote nothing before being deposed
    again = EpochFile(path)
    assert again.entries == tuple(E((1, 0), (2, 4096), (5, 4096)))
    assert again.end_of(1, 9000) == 4096 and again.end_of(5, 9000) == 9000 and again.end_of(3, 9000) is None
    with pytest.raises(ValueError, match="must follow epoch 5"):
        again.record(4, 9000)  # an older epoch: a deposed master's view
    with pytest.raises(ValueError, match="must follow epoch 5"):
        again.record(6, 100)  # an offset going back
    assert not list(tmp_path.glob("*.tmp"))
    again.truncate(4096)  # the log was cut at 4096: epochs starting there are gone
    assert EpochFile(path).entries == tuple(E((1, 0)))


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b.replace(b"2 4096", b"2 4097"),  # a changed offset: checksum mismatch
        lambda b: b[:-5],  # a torn write
        lambda b: b"",  # emptied
        lambda b: b"\xff\xfe" + b,  # not text
        lambda b: b.replace(b"tidemq-epochs 1", b"tidemq-epochs 9"),
    ],
    ids=["edited", "torn", "empty", "binary", "version"],
)
def test_a_damaged_file_is_a_clear_error_never_a_silent_reset(tmp_path: Path, damage) -> None:
    path = tmp_path / "epoch"
    EpochFile(path).record(1, 0)
    EpochFile(path).record(2, 4096)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(EpochFileError, match=str(path)):
        EpochFile(path)


def test_entries_out_of_order_with_a_valid_checksum_are_refused(tmp_path: Path) -> None:
    import zlib

    body = b"tidemq-epochs 1\n3 0\n2 10\n"
    path = tmp_path / "epoch"
    path.write_bytes(body + b"crc32 %08x\n" % zlib.crc32(body))
    with pytest.raises(EpochFileError, match="epoch 2 at offset 10 does not follow epoch 3"):
        EpochFile(path)


def test_consistent_point_of_a_deposed_master_and_the_new_one() -> None:
    # Master of epoch 1 wrote to 1000; the slave had 800 of it when it won epoch 2 and wrote on.
    old, new = E((1, 0)), E((1, 0), (2, 800))
    assert consistent_point(old, 1000, new, 1500) == 800  # the old master cuts its unreplicated 200
    # Symmetric: seen from the new master, the logs also agree up to 800 only.
    assert consistent_point(new, 1500, old, 1000) == 800
    # A slave that followed the deposed master through epoch 3 while epoch 4 started elsewhere.
    slave = E((1, 0), (2, 800), (3, 2000))
    master = E((1, 0), (2, 800), (4, 1900))
    assert consistent_point(slave, 2600, master, 3000) == 1900
    # Same epoch number but a different start: not the same history; fall back to an older one.
    assert consistent_point(E((1, 0), (2, 700)), 900, E((1, 0), (2, 800)), 900) == 700
    # Nothing in common: copy the whole log again.
    assert consistent_point(E((7, 0)), 100, E((1, 0)), 100) is None
    assert consistent_point([], 0, E((1, 0)), 100) is None
