"""The transactional producer: half message, local transaction, END_TRANSACTION, state checks.

    class Orders:
        def execute_local_transaction(self, msg, arg):   # runs after the half message is stored
            db.insert(arg)
            return LocalTransactionState.COMMIT            # or ROLLBACK, or UNKNOWN: ask me later
        def check_local_transaction(self, msg):           # the broker asks about an UNKNOWN one
            return LocalTransactionState.COMMIT if db.has(msg.keys) else LocalTransactionState.ROLLBACK

    async with TransactionProducer("pg", Orders(), namesrv="127.0.0.1:9876") as producer:
        result = await producer.send_in_transaction(Message("Orders", b"..."), arg=order)

Both listener methods may be plain functions or coroutines.  The broker sends its check
(CHECK_TRANSACTION_STATE) to any live producer of the group, so every process of a group must
be able to answer for every transaction (TransactionMQProducer's contract).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
from typing import Any, Protocol

import attrs

from tidemq.client.errors import ClientError
from tidemq.client.message import Message, SendResult, SendStatus
from tidemq.client.producer import Producer
from tidemq.client.route import AUTO_CREATE_TOPIC
from tidemq.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    MessageExt,
    Prop,
    decode_message_id,
)
from tidemq.remoting.codes import RequestCode
from tidemq.remoting.command import RemotingCommand

log = logging.getLogger(__name__)


class LocalTransactionState(enum.Enum):
    """What the local transaction decided (LocalTransactionState; UNKNOW in Java)."""

    COMMIT = "COMMIT_MESSAGE"
    ROLLBACK = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"


_END_TYPE = {
    LocalTransactionState.COMMIT: TRANSACTION_COMMIT_TYPE,
    LocalTransactionState.ROLLBACK: TRANSACTION_ROLLBACK_TYPE,
    LocalTransactionState.UNKNOWN: TRANSACTION_NOT_TYPE,
}


class TransactionListener(Protocol):
    def execute_local_transaction(self, msg: Message, arg: Any) -> Any: ...

    def check_local_transaction(self, msg: MessageExt) -> Any: ...


@attrs.frozen
class TransactionSendResult:
    """The half message's send result and what the local transaction decided."""

    send_result: SendResult
    local_state: LocalTransactionState

    @property
    def msg_id(self) -> str:
        return self.send_result.msg_id


async def _call(fn: Any, *args: Any) -> LocalTransactionState:
    """Run a listener method (sync or async); an error or an unexpected value means UNKNOWN."""
    try:
        value = fn(*args)
        if inspect.isawaitable(value):
            value = await value
    except Exception:
        log.exception("transaction listener %s failed; the state is UNKNOWN", getattr(fn, "__name__", fn))
        return LocalTransactionState.UNKNOWN
    if isinstance(value, LocalTransactionState):
        return value
    log.warning("transaction listener returned %r, not a LocalTransactionState; the state is UNKNOWN", value)
    return LocalTransactionState.UNKNOWN


class TransactionProducer(Producer):
    """A :class:`Producer` that also sends transactional messages and answers state checks."""

    def __init__(self, group: str, listener: TransactionListener, *args: Any, **kwargs: Any) -> None:
        for name in ("execute_local_transaction", "check_local_transaction"):
            if not callable(getattr(listener, name, None)):
                raise ClientError(f"the transaction listener has no {name}() method")
        super().__init__(group, *args, **kwargs)
        self.listener = listener
        self._checks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        if self._started:
            return
        await super().start()
        # As Java's producer (which tracks TBW102): learn every broker from the default topic's
        # route and heartbeat now, so any broker holding this group's half messages can ask this
        # process about them, even before it sends anything itself.
        try:
            await self.instance.get_route(AUTO_CREATE_TOPIC)
        except Exception as exc:
            log.info("route of %s unavailable: %s", AUTO_CREATE_TOPIC, exc)
        await self.instance.send_heartbeats()

    async def shutdown(self) -> None:
        for task in list(self._checks):
            task.cancel()
        await super().shutdown()

    async def send_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:  # type: ignore[override]
        """Store ``msg`` as a half message, run the local transaction, tell the broker the outcome."""
        if msg.delay_level:
            # As RocketMQ: a transactional message is delivered when committed, never delayed.
            msg = attrs.evolve(msg, delay_level=0)
        body, sys_flag, props = self._prepare(msg)
        props.pop(Prop.DELAY_TIME_LEVEL, None)
        props[Prop.TRANSACTION_PREPARED] = "true"
        props[Prop.PRODUCER_GROUP] = self.group
        result = await self._send_with_retries(
            msg.topic,
            body,
            sys_flag | TRANSACTION_PREPARED_TYPE,
            props,
            props[Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX],
            msg.flag,
            batch=False,
            timeout=None,
            attempts=1 + self.retry_times,
        )
        assert result is not None
        if result.status is SendStatus.SEND_OK:
            state = await _call(self.listener.execute_local_transaction, msg, arg)
        else:
            state = LocalTransactionState.ROLLBACK
        try:
            await self._end(result, state)
        except Exception as exc:
            # The broker will ask through CHECK_TRANSACTION_STATE; nothing is lost.
            log.warning("END_TRANSACTION for %s failed: %s", result.msg_id, exc)
        if self.tracer is not None:
            self.tracer.end_transaction(
                msg, result.msg_id, result.broker_address, state.value, result.msg_id, False
            )
        return TransactionSendResult(result, state)

    async def _end(self, result: SendResult, state: LocalTransactionState) -> None:
        commit_log_offset = decode_message_id(result.offset_msg_id)[1]
        fields = {
            "producerGroup": self.group,
            "tranStateTableOffset": str(result.queue_offset),
            "commitLogOffset": str(commit_log_offset),
            "commitOrRollback": str(_END_TYPE[state]),
            "fromTransactionCheck": "false",
            "msgId": result.msg_id,
            "transactionId": result.msg_id,
        }
        await self._end_oneway(result.broker_address, fields, f"executeLocalTransactionBranch: {state.value}")

    async def _end_oneway(self, addr: str, fields: dict[str, str], remark: str) -> None:
        request = RemotingCommand.request(RequestCode.END_TRANSACTION, fields)
        request.remark = remark
        request.mark_oneway()
        await self.instance.require_api().remoting.invoke_oneway(addr, request)

    # ------------------------------------------------------------------ broker -> producer
    def check_transaction_state(self, broker_addr: str, fields: dict[str, str], msg: MessageExt) -> None:
        """CHECK_TRANSACTION_STATE arrived: ask the listener in a task, answer with END_TRANSACTION."""
        task = asyncio.ensure_future(self._answer_check(broker_addr, fields, msg))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _answer_check(self, broker_addr: str, fields: dict[str, str], msg: MessageExt) -> None:
        state = await _call(self.listener.check_local_transaction, msg)
        answer = {
            "producerGroup": self.group,
            "tranStateTableOffset": fields.get("tranStateTableOffset", str(msg.queue_offset)),
            "commitLogOffset": fields.get("commitLogOffset", str(msg.commit_log_offset)),
            "commitOrRollback": str(_END_TYPE[state]),
            "fromTransactionCheck": "true",
            "msgId": msg.uniq_key or msg.msg_id,
            "transactionId": fields.get("transactionId", msg.uniq_key or ""),
        }
        if self.tracer is not None:
            self.tracer.end_transaction(
                msg, answer["msgId"], broker_addr, state.value, answer["transactionId"], True
            )
        try:
            await self._end_oneway(broker_addr, answer, f"checkLocalTransactionState: {state.value}")
        except Exception as exc:
            log.warning("cannot answer a transaction check of %s: %s", broker_addr, exc)
