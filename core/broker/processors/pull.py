"""PULL_MESSAGE: the remoting codec over :class:`~tidemq.broker.services.pull.PullService`.

Header in, one service call, response out: the body is the store's record buffers, unchanged.
Where the store offers a pull lane and nobody could see a difference, the lane answers instead
(:mod:`tidemq.broker.pull_lane`); the service stays the reference and serves every other pull.
"""

from __future__ import annotations

import logging

from tidemq.broker.context import ProcessorRegister
from tidemq.broker.headers import Header, kv
from tidemq.broker.processors.answers import answer
from tidemq.broker.pull_lane import PullLaneEntry, pull_lane_entry
from tidemq.broker.services import BrokerServices
from tidemq.broker.services.pull import FLAG_SUBSCRIPTION, PullResult, PullService
from tidemq.broker.services.status import Status
from tidemq.filter import EXPRESSION_TAG
from tidemq.remoting.codes import RequestCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection

log = logging.getLogger(__name__)


class PullProcessor:
    def __init__(self, service: PullService, lane: PullLaneEntry | None = None):
        self.service = service
        #: The store's pull lane when the broker may take it; None: every pull is the service's.
        self.lane = lane

    async def pull(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        h = Header(request.ext_fields, "PULL_MESSAGE")
        group = h.str("consumerGroup")
        topic = h.str("topic")
        queue_id = h.int("queueId")
        offset = h.int("queueOffset")
        max_nums = h.int("maxMsgNums", 32)
        sys_flag = h.int("sysFlag", 0)
        commit_offset = h.int("commitOffset", -1)
        suspend_ms = h.int("suspendTimeoutMillis", 0)
        subscription: tuple[str, str] | None = None
        sub_version = 0
        if sys_flag & FLAG_SUBSCRIPTION:
            subscription = (
                h.str("expressionType", EXPRESSION_TAG) or EXPRESSION_TAG,
                h.str("subscription", "*"),
            )
        else:
            sub_version = h.int("subVersion", 0)
        lane = self.lane
        if lane is not None:
            served = lane.serve(
                request,
                group,
                topic,
                queue_id,
                offset,
                max_nums,
                sys_flag,
                commit_offset,
                sub_version,
                subscription,
            )
            if served is not None:
                return served
        result = await self.service.pull(
            conn,
            group,
            topic,
            queue_id,
            offset,
            max_nums,
            sys_flag,
            commit_offset,
            suspend_ms,
            sub_version,
            subscription,
        )
        if not isinstance(result, PullResult):
            return None if result is None else answer(request, result)
        fields = kv(
            suggestWhichBrokerId=result.suggest_broker_id,
            nextBeginOffset=result.next_begin_offset,
            minOffset=result.min_offset,
            maxOffset=result.max_offset,
        )
        if result.status is Status.SUCCESS:
            return request.reply(result.status, None, fields, body_parts=result.body)
        return request.reply(result.status, result.remark, fields)


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    service = services.pull
    processor = PullProcessor(service, pull_lane_entry(register.context, service))
    register.add(RequestCode.PULL_MESSAGE, processor.pull)
