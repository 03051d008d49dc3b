"""What a revive writes: an expired checkpoint's unacknowledged messages, back for redelivery.

Each goes to the group's retry topic ``%RETRY%<group>_<topic>`` with its reconsume count + 1 (past
the group's ``retryMaxTimes``: to ``%DLQ%<group>``), properties kept, ``ORIGIN_MESSAGE_ID`` and
``1ST_POP_TIME`` added.  The service puts them and retires the checkpoint once all are stored.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tidemq.broker.pop.handle import RETRY_PREFIX, dlq_topic, retry_topic_v1
from tidemq.broker.pop.journal import Checkpoint
from tidemq.errors import CorruptDataError
from tidemq.message import MessageExt, MessageInner, decode_message
from tidemq.perm import PERM_READ, PERM_WRITE

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext

log = logging.getLogger(__name__)

#: The group name the revive reads the store with (store statistics only).
REVIVE_GROUP = "CID_RMQ_SYS_REVIVE"
FIRST_POP_TIME = "1ST_POP_TIME"


def read_message(broker: BrokerContext, topic: str, qid: int, offset: int) -> MessageExt | None:
    """The stored message at ``offset``; None when it is gone (expired files) or unreadable."""
    res = broker.store.get_message(REVIVE_GROUP, topic, qid, offset, 1)
    if not res.buffers or res.queue_offsets[0] != offset:
        return None
    try:
        return decode_message(res.buffers[0])
    except CorruptDataError as exc:
        log.error("pop: unreadable record %s:%d@%d skipped: %s", topic, qid, offset, exc)
        return None


def revived_messages(broker: BrokerContext, ck: Checkpoint) -> list[MessageInner]:
    """The messages to put for the unacknowledged positions of ``ck``."""
    group_cfg = broker.groups.get(ck.group)
    max_times = group_cfg.retry_max_times if group_cfg is not None else broker.settings.max_reconsume_times
    target = ck.topic if ck.topic.startswith(RETRY_PREFIX) else retry_topic_v1(ck.topic, ck.group)
    out = []
    for off in ck.unacked():
        ext = read_message(broker, ck.topic, ck.queue_id, off)
        if ext is None:
            continue  # nothing left to deliver
        times = ext.reconsume_times + 1
        props = dict(ext.properties)
        props.setdefault("ORIGIN_MESSAGE_ID", ext.msg_id)
        props.setdefault(FIRST_POP_TIME, str(ck.pop_time))
        if times > max_times:
            topic = dlq_topic(ck.group)
            broker.topics.create_in_send_back(topic, 1, PERM_WRITE)
        else:
            topic = target
            broker.topics.create_in_send_back(topic, 1, PERM_READ | PERM_WRITE)
        out.append(
            MessageInner(
                topic=topic,
                body=ext.body,
                queue_id=0,
                flag=ext.flag,
                properties=props,
                sys_flag=ext.sys_flag,
                born_timestamp=ext.born_timestamp,
                born_host=ext.born_host,
                store_host=broker.store_host,
                reconsume_times=times,
            )
        )
    return out


def dead_letters(
    broker: BrokerContext, group: str, topic: str, qid: int, offsets: list[int]
) -> list[MessageInner]:
    """FIFO messages past ``retryMaxTimes``, as copies for ``%DLQ%<group>``."""
    dlq = dlq_topic(group)
    broker.topics.create_in_send_back(dlq, 1, PERM_WRITE)
    out = []
    for off in offsets:
        ext = read_message(broker, topic, qid, off)
        if ext is None:
            continue
        out.append(
            MessageInner(
                topic=dlq,
                body=ext.body,
                flag=ext.flag,
                properties={**ext.properties, "ORIGIN_MESSAGE_ID": ext.msg_id},
                born_timestamp=ext.born_timestamp,
                born_host=ext.born_host,
                store_host=broker.store_host,
                reconsume_times=ext.reconsume_times,
            )
        )
    return out
