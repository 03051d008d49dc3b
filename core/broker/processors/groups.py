"""Subscription-group administration (RocketMQ's SubscriptionGroupManager requests): 200, 207, 201.

The body of UPDATE_AND_CREATE_SUBSCRIPTIONGROUP is a SubscriptionGroupConfig in JSON, the answer
to GET_ALL_SUBSCRIPTIONGROUP_CONFIG a SubscriptionGroupWrapper (``subscriptionGroupTable`` and
``dataVersion``).  Changes are written to ``config/subscriptionGroup.json`` before the answer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import Header
from tidemq.broker.subscriptions import SubscriptionGroupConfig
from tidemq.names import check_group_name
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.errors import BodyError
from tidemq.remoting.protocol import dumps, loads
from tidemq.transport import Connection

if TYPE_CHECKING:
    from tidemq.broker.services import BrokerServices

log = logging.getLogger(__name__)

#: RocketMQ's answer to a change sent to a slave (AdminBrokerProcessor.validateSlave).
SLAVE_REMARK = (
    "Can't modify topic or subscription group from slave broker, please execute it from master broker."
)
#: Retry queues a group may ask for (a retry topic's queue count, like a topic's).
MAX_RETRY_QUEUES = 1024
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def parse_group_config(body: bytes | None) -> SubscriptionGroupConfig:
    """A SubscriptionGroupConfig body, every field checked; BodyError says what is wrong."""
    data = loads(body)
    if not isinstance(data, dict):
        raise BodyError(f"SubscriptionGroupConfig should be a JSON object, got {type(data).__name__}")
    name = data.get("groupName")
    if not isinstance(name, str) or not name:
        raise BodyError("SubscriptionGroupConfig.groupName is missing")
    problem = check_group_name(name)
    if problem:
        raise BodyError(problem)
    cfg = SubscriptionGroupConfig(name)
    values: dict[str, Any] = {}
    for attr, key in SubscriptionGroupConfig._JSON.items():
        if key == "groupName" or data.get(key) is None:
            continue
        default = getattr(cfg, attr)
        value = data[key]
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise BodyError(f"SubscriptionGroupConfig.{key} should be true or false, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int):
            raise BodyError(f"SubscriptionGroupConfig.{key} should be an integer, got {value!r}")
        values[attr] = value
    cfg = SubscriptionGroupConfig(name, **values)
    limits = {
        "retryQueueNums": (cfg.retry_queue_nums, 0, MAX_RETRY_QUEUES),
        "retryMaxTimes": (cfg.retry_max_times, -1, INT32_MAX),
        "brokerId": (cfg.broker_id, 0, INT64_MAX),
        "whichBrokerWhenConsumeSlowly": (cfg.which_broker_when_consume_slowly, 0, INT64_MAX),
    }
    for key, (value, low, high) in limits.items():
        if not low <= value <= high:
            raise BodyError(f"SubscriptionGroupConfig.{key} = {value} is out of range {low}..{high}")
    return cfg


class GroupsProcessor:
    def __init__(self, broker: BrokerContext):
        self.broker = broker

    async def update_group(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        if not b.is_master:
            return request.reply(ResponseCode.SYSTEM_ERROR, SLAVE_REMARK)
        try:
            cfg = parse_group_config(request.body)
        except BodyError as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: {exc}")
        log.info("subscription group updated by %s: %s", conn.remote_address, cfg)
        b.groups.update(cfg)
        await asyncio.to_thread(b.groups.persist)  # on disk when answered
        return request.reply(ResponseCode.SUCCESS)

    async def delete_group(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        if not b.is_master:
            return request.reply(ResponseCode.SYSTEM_ERROR, SLAVE_REMARK)
        h = Header(request.ext_fields, "DELETE_SUBSCRIPTIONGROUP")
        group = h.str("groupName")
        problem = check_group_name(group)
        if problem:
            return request.reply(ResponseCode.SYSTEM_ERROR, problem)
        # RocketMQ answers SUCCESS for a group it does not have: deleting is idempotent.
        existed = b.groups.delete(group)
        log.info(
            "subscription group %s deleted by %s (existed: %s)",
            group,
            conn.remote_address,
            existed,
        )
        if h.bool("removeOffset"):
            b.offsets.remove_group(group)
            await asyncio.to_thread(b.offsets.persist)
        await asyncio.to_thread(b.groups.persist)
        return request.reply(ResponseCode.SUCCESS)

    async def all_groups(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        return request.reply(ResponseCode.SUCCESS, body=dumps(self.broker.groups.serialize()))


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    """Add this module's handlers."""
    p = GroupsProcessor(register.context)
    register.add(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, p.update_group)
    register.add(RequestCode.DELETE_SUBSCRIPTIONGROUP, p.delete_group)
    register.add(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, p.all_groups)
