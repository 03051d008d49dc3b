"""Store and topic maintenance requests: 305, 316, 306, 329, 323.

* GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305): the broker's system topics as a TopicList body (mqadmin
  ``exportMetadata`` leaves them out).
* CLEAN_UNUSED_TOPIC (316): drop the stored queues of topics the topic table no longer has.
* CLEAN_EXPIRED_CONSUMEQUEUE (306): drop the queues all of whose records were cleaned away.
* DELETE_EXPIRED_COMMITLOG (329): run the commit-log cleanup now, as if it were its hour.
* RESUME_CHECK_HALF_MESSAGE (323): check a transaction's half message again (``msgId``).

A store without files to clean (the ``memory`` store) answers 306 and 329 with SUCCESS, as
RocketMQ does when it finds nothing to delete.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.headers import Header
from tidemq.delay import SCHEDULE_TOPIC
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.protocol import TopicList
from tidemq.store import store_introspection
from tidemq.transport import Connection

if TYPE_CHECKING:
    from tidemq.broker.services import BrokerServices

log = logging.getLogger(__name__)

#: Stored topics that are never in the topic table, yet in use (CLEAN_UNUSED_TOPIC keeps them).
#: RocketMQ keeps the first two; tidemq never adds the half topic to its table, so it is kept too.
KEPT_TOPICS = frozenset({SCHEDULE_TOPIC, "RMQ_SYS_TRANS_OP_HALF_TOPIC", "RMQ_SYS_TRANS_HALF_TOPIC"})


#: RocketMQ's MAX_MANUAL_DELETE_FILE_TIMES.
MANUAL_DELETE_ROUNDS = 20


@runtime_checkable
class ManualCleanup(Protocol):
    """A store that deletes expired commit-log files on request (the ``mmap`` store)."""

    def clean_expired(self, *, manual: bool = False, now: float | None = None) -> int: ...


class MaintenanceProcessor:
    def __init__(self, broker: BrokerContext):
        self.broker = broker

    async def system_topics(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        body = TopicList(self.broker.topics.system_topics()).encode()
        return request.reply(ResponseCode.SUCCESS, body=body)

    async def clean_unused_topic(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        known = set(b.topics.all())
        unused = [t for t in b.store.topics() if t not in known and t not in KEPT_TOPICS]
        log.warning("CLEAN_UNUSED_TOPIC from %s: dropping %s", _remote(conn), unused or "nothing")
        if unused:
            await asyncio.to_thread(b.store.delete_topics, unused)
            for topic in unused:
                b.stats.remove_topic(topic)
        return request.reply(ResponseCode.SUCCESS)

    async def clean_expired_queues(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        store = store_introspection(self.broker.store)
        if store is not None:
            dropped = await asyncio.to_thread(store.clean_expired_queues)
            log.warning("CLEAN_EXPIRED_CONSUMEQUEUE from %s: %d queue(s) dropped", _remote(conn), dropped)
        else:
            log.info("CLEAN_EXPIRED_CONSUMEQUEUE from %s: this store keeps no queue files", _remote(conn))
        return request.reply(ResponseCode.SUCCESS)

    async def delete_expired_commitlog(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        store = self.broker.store
        if isinstance(store, ManualCleanup):
            deleted = await asyncio.to_thread(_manual_rounds, store)
            log.warning(
                "DELETE_EXPIRED_COMMITLOG from %s: %d commit-log file(s) deleted", _remote(conn), deleted
            )
        else:
            log.info("DELETE_EXPIRED_COMMITLOG from %s: this store keeps no commit-log files", _remote(conn))
        return request.reply(ResponseCode.SUCCESS)

    async def resume_check_half(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        msg_id = Header(request.ext_fields, "RESUME_CHECK_HALF_MESSAGE").str("msgId")
        problem = await self.broker.transactions.resume_check(msg_id)
        if problem:
            return request.reply(ResponseCode.SYSTEM_ERROR, problem)
        return request.reply(ResponseCode.SUCCESS)


def _manual_rounds(store: ManualCleanup) -> int:
    """RocketMQ's executeDeleteFilesManually: up to 20 cleanup rounds (each deletes a batch of
    files); stops at the first round that finds nothing more to delete."""
    total = 0
    for _ in range(MANUAL_DELETE_ROUNDS):
        deleted = store.clean_expired(manual=True)
        total += deleted
        if not deleted:
            break
    return total


def _remote(conn: Connection) -> str:
    return str(conn.remote_address)


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    """Add this module's handlers."""
    p = MaintenanceProcessor(register.context)
    register.add(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER, p.system_topics)
    register.add(RequestCode.CLEAN_UNUSED_TOPIC, p.clean_unused_topic)
    register.add(RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, p.clean_expired_queues)
    register.add(RequestCode.DELETE_EXPIRED_COMMITLOG, p.delete_expired_commitlog)
    register.add(RequestCode.RESUME_CHECK_HALF_MESSAGE, p.resume_check_half)
