"""A gRPC client as the broker's services see a connection (:class:`tidemq.Connection`).

A unary call or a pull gets a :class:`CallPeer` for its duration; a client's Telemetry stream is
a :class:`StreamPeer` for its life: the producer groups of the client are registered on it (so
the broker's transaction check finds it) and it takes the checks as values
(:class:`~tidemq.broker.services.transactions.TransactionCheckTarget`), written to the stream as
``RecoverOrphanedTransactionCommand``.  A consumer's stream also takes the broker's
CONSUME_MESSAGE_DIRECTLY (an admin's "resend to consumer") through :meth:`StreamPeer.invoke`, the
remoting connection's method the broker's ``callConsumer`` calls: written to the stream as a
``VerifyMessageCommand``, answered with the client's ``VerifyMessageResult`` as RocketMQ 5's proxy
answers it (a ConsumeMessageDirectlyResult).  GET_CONSUMER_RUNNING_INFO (an admin's
``consumerStatus``) is answered with what the stream knows of its consumer (:mod:`.running`); with
``jstackEnable`` its thread stacks are asked for as ``PrintThreadStackTraceCommand`` and given back
by the client's ``ThreadStackTrace``.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import itertools
import logging
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tidemq import ConnectionState
from tidemq.broker.services.transactions import TransactionCheck
from tidemq.message import decode_message
from tidemq.mqjson import dumps as mq_dumps
from tidemq.remoting import RemotingCommand
from tidemq.remoting.codes import RequestCode

from .agent import ClientAgent
from .messages import to_v5, transaction_id
from .running import ConsumerFacts, running_info, subscription_data

log = logging.getLogger(__name__)

#: Commands a Telemetry stream holds for a client that is not reading them (more are refused).
OUTBOX_LIMIT = 64
#: The nonces of the broker's commands that wait for an answer (VerifyMessageCommand,
#: PrintThreadStackTraceCommand).
_NONCES = itertools.count(1)
#: How long GET_CONSUMER_RUNNING_INFO waits for the client's ThreadStackTrace before it answers
#: without it, seconds (RocketMQ 5's proxy: grpcProxyRelayRequestTimeoutInSeconds, 5), under the
#: broker's 10 s wait for a client; at most half the caller's wait.
STACK_TIMEOUT_S = 5.0


@functools.lru_cache(maxsize=1024)  # every call parses its peer's address (ipaddress is slow)
def born_address(address: str) -> tuple[str, int]:
    """The born host of a message: the client's report (an IP, no port) or gRPC's peer
    (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``); what is not an IP address becomes 127.0.0.1."""
    if address.startswith(("ipv4:", "ipv6:")):
        address = address[5:]
    candidates: list[tuple[str, int]] = [(address.strip("[]"), 0)]
    host, _, port = address.rpartition(":")
    if host and port.isdigit():
        candidates.append((host.strip("[]"), int(port)))
    for ip, number in candidates:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            continue
        return ip, number
    return "127.0.0.1", 0


def _joined(host: tuple[str, int]) -> str:
    return f"[{host[0]}]:{host[1]}" if ":" in host[0] else f"{host[0]}:{host[1]}"


class CallPeer:
    """The client of one call (or stream): its address and born host; closed with the call."""

    def __init__(self, peer: str, born: str = "") -> None:
        address = born_address(peer)
        self.remote_address = _joined(address)
        self.context = ConnectionState(born_host=born_address(born) if born else address)
        self._closed = False
        self._callbacks: list[Callable[[Any], Any]] = []

    @property
    def closed(self) -> bool:
        return self._closed

    def add_close_callback(self, fn: Callable[[Any], Any]) -> None:
        if self._closed:
            asyncio.get_running_loop().call_soon(fn, self)
        else:
            self._callbacks.append(fn)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("a close callback of gRPC client %s failed", self.remote_address)

    async def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        if request.code == RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT:
            # A v5 consumer POPs: it holds no offset table of its own (the broker keeps the group's,
            # which consumerProgress shows), so it reports an empty one, as RocketMQ's client does
            # for such a consumer and as `tidemq proxy` answers for its v5 clients.
            return request.reply(body=mq_dumps({"consumerTable": {}, "messageQueueTable": {}}))
        raise ConnectionError(f"gRPC client {self.remote_address} takes no remoting request {request.code}")

    async def invoke_oneway(self, request: RemotingCommand) -> None:
        # Notifications meant for 4.x clients (consumer ids changed...): a v5 client has no use for them.
        log.debug("remoting request %d not sent to gRPC client %s", request.code, self.remote_address)

    def send_response(self, response: RemotingCommand) -> None:
        raise ConnectionError(f"gRPC client {self.remote_address} takes no remoting response")


#: A VerifyMessageResult's status as ConsumeMessageDirectlyResult's consumeResult (RocketMQ 5's
#: proxy: OK, FAILED_TO_CONSUME_MESSAGE and MESSAGE_CORRUPTED; another code leaves it null).
_CONSUME_RESULTS = {
    "OK": "CR_SUCCESS",
    "FAILED_TO_CONSUME_MESSAGE": "CR_LATER",
    "MESSAGE_CORRUPTED": "CR_RETURN_NULL",
}


class StreamPeer(CallPeer):
    """A client's Telemetry stream: what the broker sends the client goes to :attr:`outbox`."""

    def __init__(self, peer: str, client_id: str, pb: ModuleType) -> None:
        super().__init__(peer)
        self.client_id = client_id
        self.pb = pb
        #: TelemetryCommands for the client, in order; the stream's writer drains it.
        self.outbox: asyncio.Queue[Any] = asyncio.Queue()
        #: The producer groups registered on this stream (one per topic the client publishes).
        self.producer_groups: list[str] = []
        #: The client's language and version (its Settings' user agent, else its metadata's).
        self.agent = ClientAgent()
        #: VerifyMessageCommands sent and not answered yet: nonce -> the answer's future.
        self.verifying: dict[str, asyncio.Future[tuple[int, str]]] = {}
        #: PrintThreadStackTraceCommands sent and not answered yet: nonce -> the answer's future
        #: (status code, status message, the stack text).
        self.stacking: dict[str, asyncio.Future[tuple[int, str, str]]] = {}
        #: The consumer on this stream (set with its Settings), for its running info.
        self.consumer: ConsumerFacts | None = None
        #: When the stream came (the running info's PROP_CONSUMER_START_TIMESTAMP).
        self.started_ms = int(time.time() * 1000)
        self.add_close_callback(StreamPeer._fail_waiting)

    async def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        if request.code == RequestCode.CONSUME_MESSAGE_DIRECTLY:
            return await self.verify_message(request, timeout)
        if request.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            return await self.running_info(request, timeout)
        return await super().invoke(request, timeout)

    async def running_info(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """GET_CONSUMER_RUNNING_INFO: the consumer as this stream knows it (:mod:`.running`), with
        its thread stacks when ``jstackEnable`` (:meth:`print_stack`)."""
        fields = request.ext_fields or {}
        group = str(fields.get("consumerGroup", ""))
        facts = self.consumer
        if facts is None or facts.group != group:
            raise ConnectionError(f"gRPC client {self.client_id} is no consumer of group {group}")
        jstack = None
        if str(fields.get("jstackEnable", "")).lower() == "true":
            jstack = await self.print_stack(min(STACK_TIMEOUT_S, timeout / 2))
        body = running_info(
            self.client_id,
            group=group,
            language=self.agent.language,
            version=self.agent.version,
            started_ms=self.started_ms,
            consume_type=facts.consume_type,
            subscriptions=subscription_data(facts.subscriptions, self.started_ms),
            jstack=jstack,
        )
        return request.reply(body=mq_dumps(body))

    async def print_stack(self, timeout: float) -> str | None:
        """The client's thread stacks: a ``PrintThreadStackTraceCommand`` on the stream, answered
        by its ``ThreadStackTrace`` with the nonce.  None when it does not answer within ``timeout``
        or answers with an error status (the running info goes without); :class:`ConnectionError`
        at once when the stream is closed, ends meanwhile or is not read."""
        if self.closed:
            raise ConnectionError(f"the Telemetry stream of gRPC client {self.client_id} is closed")
        if self.outbox.qsize() >= OUTBOX_LIMIT:
            raise ConnectionError(f"gRPC client {self.client_id} reads none of its Telemetry stream")
        pb = self.pb
        nonce = f"{next(_NONCES):x}-{time.time_ns():x}"
        answer: asyncio.Future[tuple[int, str, str]] = asyncio.get_running_loop().create_future()
        self.stacking[nonce] = answer
        try:
            self.outbox.put_nowait(
                pb.TelemetryCommand(
                    print_thread_stack_trace_command=pb.PrintThreadStackTraceCommand(nonce=nonce)
                )
            )
            code, text, stack = await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            log.info("gRPC client %s gave no thread stack within %.1f s", self.client_id, timeout)
            return None
        finally:
            self.stacking.pop(nonce, None)
        if code != pb.OK:
            log.info(
                "gRPC client %s answered the thread stack command with %s %s", self.client_id, code, text
            )
            return None
        return stack

    def stack_traced(self, nonce: str, code: int, text: str, stack: str) -> bool:
        """The client's ``ThreadStackTrace`` of ``nonce`` (False: no command waits for it)."""
        answer = self.stacking.pop(nonce, None)
        if answer is None or answer.done():
            return False
        answer.set_result((code, text, stack))
        return True

    async def verify_message(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """CONSUME_MESSAGE_DIRECTLY (the stored message in the body) to the client as a
        ``VerifyMessageCommand``; its ``VerifyMessageResult`` as a ConsumeMessageDirectlyResult.
        No answer within ``timeout``: :class:`TimeoutError` (the broker answers the admin
        CONSUME_MSG_TIMEOUT, as for a 4.x client that does not answer)."""
        if self.closed:
            raise ConnectionError(f"the Telemetry stream of gRPC client {self.client_id} is closed")
        if self.outbox.qsize() >= OUTBOX_LIMIT:
            raise ConnectionError(f"gRPC client {self.client_id} reads none of its Telemetry stream")
        pb = self.pb
        msg = decode_message(request.body or b"")
        nonce = f"{next(_NONCES):x}-{time.time_ns():x}"
        answer: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        self.verifying[nonce] = answer
        begin = time.monotonic()
        try:
            self.outbox.put_nowait(
                pb.TelemetryCommand(
                    verify_message_command=pb.VerifyMessageCommand(nonce=nonce, message=to_v5(pb, msg))
                )
            )
            code, text = await asyncio.wait_for(answer, timeout)
        finally:
            self.verifying.pop(nonce, None)
        result = {
            "autoCommit": True,
            "consumeResult": _CONSUME_RESULTS.get(pb.Code.Name(code) if code in pb.Code.values() else ""),
            "order": False,
            "remark": "from gRPC client" if code == pb.OK else f"from gRPC client: {text or code}",
            "spentTimeMills": int((time.monotonic() - begin) * 1000),
        }
        return request.reply(body=mq_dumps(result))

    def verified(self, nonce: str, code: int, text: str) -> bool:
        """The client's ``VerifyMessageResult`` of ``nonce`` (False: no command waits for it)."""
        answer = self.verifying.pop(nonce, None)
        if answer is None or answer.done():
            return False
        answer.set_result((code, text))
        return True

    def _fail_waiting(self) -> None:
        waiting: list[asyncio.Future[Any]] = [*self.verifying.values(), *self.stacking.values()]
        self.verifying, self.stacking = {}, {}
        for answer in waiting:
            if not answer.done():
                answer.set_exception(ConnectionError(f"gRPC client {self.client_id} went away"))

    async def check_transaction(self, check: TransactionCheck) -> None:
        """The broker's check of a pending transaction, as RocketMQ 5's proxy sends it."""
        pb = self.pb
        msg = check.message
        command = pb.TelemetryCommand(
            recover_orphaned_transaction_command=pb.RecoverOrphanedTransactionCommand(
                message=to_v5(pb, msg),
                transaction_id=transaction_id(check.offset_msg_id, check.tran_state_offset),
            )
        )
        if self.outbox.qsize() >= OUTBOX_LIMIT:  # the client does not read: the check comes again later
            log.warning("transaction check not sent: client %s reads none of its stream", self.client_id)
            return
        self.outbox.put_nowait(command)
