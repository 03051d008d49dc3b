"""traceTopicEnable / msgTraceTopicName: the broker creates the trace topic with its system topics."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.broker.topics import TopicConfigManager
from tidemq.config import BrokerSettings


def _manager(tmp_path: Path) -> TopicConfigManager:
    m = TopicConfigManager(
        tmp_path / "topics.json", auto_create_topic=True, default_queue_nums=4, default_perm=6
    )
    m.load()
    return m


@pytest.mark.parametrize("name", ["RMQ_SYS_TRACE_TOPIC", "OrdersTrace"])
def test_trace_topic_is_made_with_one_queue_and_listed_as_a_system_topic(tmp_path: Path, name: str) -> None:
    m = _manager(tmp_path)
    m.add_system_topics("C", "b", cluster_topic_enable=True, broker_topic_enable=True, trace_topic=name)
    cfg = m.get(name)
    assert cfg is not None
    assert (cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm) == (1, 1, 6)
    assert {name, "C_REPLY_TOPIC"} <= m.system_topics()


def test_no_trace_topic_unless_enabled(tmp_path: Path) -> None:
    m = _manager(tmp_path)
    m.add_system_topics("C", "b", cluster_topic_enable=True, broker_topic_enable=True)
    assert m.get("RMQ_SYS_TRACE_TOPIC") is None
    assert m.get("C_REPLY_TOPIC") is not None


def test_a_trace_topic_name_no_topic_may_have_is_refused_in_the_config() -> None:
    with pytest.raises(ValueError, match="msg_trace_topic_name"):
        BrokerSettings(msg_trace_topic_name="../etc")
