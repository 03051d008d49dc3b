"""Allocation strategies: exact shares for known cases, full disjoint coverage, stability."""

from __future__ import annotations

import itertools

import pytest

from tidemq.errors import ConfigError, PluginError
from tidemq.plugins import get_plugin_manager
from tidemq.queues import AllocateStrategy, MessageQueue

SPLITTING = ["averagely", "averagely_by_circle", "consistent_hash"]


def qs(n: int, brokers: tuple[str, ...] = ("broker-a",)) -> list[MessageQueue]:
    return sorted(MessageQueue("T", b, i) for b in brokers for i in range(n))


def cids(n: int) -> list[str]:
    return sorted(f"10.0.0.{i}@{i}" for i in range(n))


def strategy(name: str, **options: object) -> AllocateStrategy:
    return get_plugin_manager().create("allocate", name, options=options)


def shares(name: str, queues: list[MessageQueue], consumers: list[str]) -> dict[str, list[MessageQueue]]:
    s = strategy(name)
    return {c: s.allocate("G", c, queues, consumers) for c in consumers}


def test_every_name_is_registered_and_is_an_allocate_strategy() -> None:
    for name in [*SPLITTING, "config", "machine_room"]:
        assert isinstance(strategy(name), AllocateStrategy)


def test_unknown_name_is_a_one_line_error() -> None:
    with pytest.raises(PluginError, match="averagely"):
        get_plugin_manager().create("allocate", "averagly")


@pytest.mark.parametrize(
    ("n_queues", "n_consumers", "expected"),
    [
        (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
        (8, 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (4, 4, [[0], [1], [2], [3]]),
        (3, 5, [[0], [1], [2], [], []]),
        (5, 2, [[0, 1, 2], [3, 4]]),
    ],
)
def test_averagely_gives_contiguous_blocks(
    n_queues: int, n_consumers: int, expected: list[list[int]]
) -> None:
    got = shares("averagely", qs(n_queues), cids(n_consumers))
    assert [[mq.queue_id for mq in got[c]] for c in cids(n_consumers)] == expected


@pytest.mark.parametrize(
    ("n_queues", "n_consumers", "expected"),
    [
        (8, 3, [[0, 3, 6], [1, 4, 7], [2, 5]]),
        (4, 2, [[0, 2], [1, 3]]),
        (2, 3, [[0], [1], []]),
    ],
)
def test_by_circle_deals_round_robin(n_queues: int, n_consumers: int, expected: list[list[int]]) -> None:
    got = shares("averagely_by_circle", qs(n_queues), cids(n_consumers))
    assert [[mq.queue_id for mq in got[c]] for c in cids(n_consumers)] == expected


@pytest.mark.parametrize("name", SPLITTING)
@pytest.mark.parametrize(("n_queues", "n_consumers"), list(itertools.product([1, 4, 7, 16], [1, 2, 3, 5, 8])))
def test_each_queue_owned_by_exactly_one_consumer(name: str, n_queues: int, n_consumers: int) -> None:
    queues = qs(n_queues, ("broker-a", "broker-b"))
    got = shares(name, queues, cids(n_consumers))
    owned = [mq for share in got.values() for mq in share]
    assert sorted(owned) == queues  # all covered, none twice


@pytest.mark.parametrize("name", SPLITTING)
def test_same_inputs_same_answer(name: str) -> None:
    queues, consumers = qs(8, ("a", "b")), cids(3)
    assert shares(name, queues, consumers) == shares(name, list(queues), list(consumers))


@pytest.mark.parametrize("name", [*SPLITTING, "machine_room"])
def test_unknown_consumer_owns_nothing(name: str) -> None:
    s = strategy(name)
    assert s.allocate("G", "stranger@1", qs(8), cids(2)) == []


def test_averagely_shares_are_balanced() -> None:
    got = shares("averagely", qs(10), cids(4))
    sizes = sorted(len(v) for v in got.values())
    assert sizes == [2, 2, 3, 3]


def test_consistent_hash_moves_few_queues_when_a_consumer_joins() -> None:
    queues = qs(64, ("a", "b"))
    before = shares("consistent_hash", queues, cids(4))
    after = shares("consistent_hash", queues, cids(5))
    owner_before = {mq: c for c, share in before.items() for mq in share}
    owner_after = {mq: c for c, share in after.items() for mq in share}
    moved = [mq for mq in queues if owner_before[mq] != owner_after[mq]]
    (newcomer,) = set(cids(5)) - set(cids(4))
    # Only queues taken by the newcomer move; a modulo scheme would move most of them.
    assert all(owner_after[mq] == newcomer for mq in moved)
    assert 0 < len(moved) < len(queues) // 2


def test_consistent_hash_virtual_nodes_option_is_checked() -> None:
    with pytest.raises(ConfigError, match="virtual_nodes"):
        strategy("consistent_hash", virtual_nodes=0)
    with pytest.raises(ConfigError, match="virtual_node"):
        strategy("consistent_hash", virtual_node=3)


def test_config_strategy_returns_the_configured_queues() -> None:
    s = strategy("config", queues=["broker-b:1", "broker-a:0"])
    got = s.allocate("G", "any", qs(4, ("broker-a", "broker-b")), cids(3))
    assert got == [MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-b", 1)]
    with pytest.raises(ConfigError, match="broker-a:0"):
        strategy("config", queues=["broker-a"])


def test_machine_room_only_serves_its_rooms_and_splits_them() -> None:
    queues = qs(3, ("hz@broker-a", "sh@broker-b", "hz@broker-c"))
    consumers = cids(2)
    s = strategy("machine_room", rooms=["hz"])
    got = {c: s.allocate("G", c, queues, consumers) for c in consumers}
    owned = sorted(mq for share in got.values() for mq in share)
    assert owned == sorted(mq for mq in queues if mq.broker_name.startswith("hz@"))
    assert sorted(len(v) for v in got.values()) == [3, 3]
