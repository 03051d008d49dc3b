"""Queue selection: round-robin, and latency fault avoidance driven by an injected clock."""

from __future__ import annotations

import pytest

from tidemq.errors import ConfigError
from tidemq.plugins import get_plugin_manager
from tidemq.queues import MessageQueue, QueueSelector
from tidemq_queue_select import LatencyFaultSelector, RoundRobinSelector

QUEUES = [MessageQueue("T", b, i) for b in ("broker-a", "broker-b") for i in range(2)]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_plugins_are_registered_and_default_is_latency_fault() -> None:
    from tidemq.config import DEFAULT_PLUGINS

    pm = get_plugin_manager()
    assert DEFAULT_PLUGINS["select"] == "latency_fault"
    for name in ("round_robin", "latency_fault"):
        assert isinstance(pm.create("select", name), QueueSelector)


def test_round_robin_visits_every_queue_in_turn() -> None:
    s = RoundRobinSelector(start=0)
    picks = [s.select("T", QUEUES) for _ in range(8)]
    assert picks == QUEUES + QUEUES
    # From wherever it starts, a selector deals every queue once per turn.
    s = RoundRobinSelector()
    picks = [s.select("T", QUEUES) for _ in range(8)]
    assert sorted(picks[:4]) == sorted(QUEUES) and picks[4:] == picks[:4]


@pytest.mark.parametrize("cls", [RoundRobinSelector, LatencyFaultSelector])
def test_fresh_selectors_start_on_different_queues(cls: type[RoundRobinSelector]) -> None:
    """Short-lived producers (a Spark task each) must not all begin on broker-a's queue 0."""
    firsts = {cls().select("T", QUEUES) for _ in range(40)}
    assert len(firsts) > 1
    assert {mq.broker_name for mq in firsts} == {"broker-a", "broker-b"}


def test_round_robin_avoids_the_broker_that_just_failed() -> None:
    s = RoundRobinSelector()
    for _ in range(8):
        assert s.select("T", QUEUES, last_broker="broker-a").broker_name == "broker-b"
    # With a single broker there is nothing else to pick.
    only_a = [mq for mq in QUEUES if mq.broker_name == "broker-a"]
    assert s.select("T", only_a, last_broker="broker-a").broker_name == "broker-a"


def test_empty_route_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no writable queue"):
        LatencyFaultSelector().select("T", [])


@pytest.mark.parametrize(
    ("latency", "penalty"),
    [
        (0, 0),
        (49, 0),
        (50, 0),
        (120, 0),
        (550, 30000),
        (999, 30000),
        (1000, 60000),
        (2500, 120000),
        (3000, 180000),
        (15000, 600000),
        (99999, 600000),
    ],
)
def test_penalty_table_matches_rocketmq(latency: float, penalty: float) -> None:
    assert LatencyFaultSelector().penalty_ms(latency) == penalty


def test_failed_broker_is_avoided_for_its_penalty_then_brought_back() -> None:
    clock = FakeClock()
    s = LatencyFaultSelector(clock=clock)
    s.record("broker-a", 5, failed=True)  # a failure counts as 30 s latency -> 600 s penalty
    for _ in range(20):
        assert s.select("T", QUEUES).broker_name == "broker-b"
    clock.now += 599.9
    assert s.select("T", QUEUES).broker_name == "broker-b"
    assert not s.is_available("broker-a")
    clock.now += 0.2
    assert s.is_available("broker-a")
    picked = {s.select("T", QUEUES).broker_name for _ in range(8)}
    assert picked == {"broker-a", "broker-b"}


def test_slow_broker_penalty_follows_its_latency() -> None:
    clock = FakeClock()
    s = LatencyFaultSelector(clock=clock)
    s.record("broker-b", 1200, failed=False)  # -> 60 s
    assert {s.select("T", QUEUES).broker_name for _ in range(8)} == {"broker-a"}
    clock.now += 60.0
    assert {s.select("T", QUEUES).broker_name for _ in range(8)} == {"broker-a", "broker-b"}


def test_fast_send_clears_a_penalty() -> None:
    clock = FakeClock()
    s = LatencyFaultSelector(clock=clock)
    s.record("broker-a", 700, failed=False)
    assert not s.is_available("broker-a")
    s.record("broker-a", 3, failed=False)
    assert s.is_available("broker-a")


def test_all_brokers_penalised_picks_the_one_back_soonest() -> None:
    clock = FakeClock()
    s = LatencyFaultSelector(clock=clock)
    s.record("broker-a", 0, failed=True)  # 600 s
    s.record("broker-b", 1000, failed=False)  # 60 s
    for _ in range(6):
        assert s.select("T", QUEUES).broker_name == "broker-b"


def test_retry_after_failure_goes_to_the_other_broker() -> None:
    s = LatencyFaultSelector(clock=FakeClock())
    for _ in range(8):
        first = s.select("T", QUEUES)
        retry = s.select("T", QUEUES, last_broker=first.broker_name)
        assert retry.broker_name != first.broker_name


def test_table_is_configurable_and_checked() -> None:
    pm = get_plugin_manager()
    s = pm.create(
        "select", "latency_fault", options={"latency_max_ms": [10, 20], "not_available_ms": [0, 5000]}
    )
    assert s.penalty_ms(25) == 5000
    with pytest.raises(ConfigError, match="same length"):
        pm.create("select", "latency_fault", options={"latency_max_ms": [10], "not_available_ms": [0, 1]})
    with pytest.raises(ConfigError, match="latency_max"):
        pm.create("select", "latency_fault", options={"latency_maximum": [10]})
