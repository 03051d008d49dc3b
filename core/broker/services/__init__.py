"""The broker's services: typed operations a transport calls with plain values.

A transport (the remoting processors in :mod:`tidemq.broker.processors`, a gRPC service next)
decodes its request, makes one call here and encodes what comes back.  Nothing here takes or
returns a ``RemotingCommand``: arguments are plain values (and the peer's
:class:`~tidemq.transport.Connection`, for its address and per-connection state), results are
typed values with a :class:`Status` (whose values are RocketMQ's response codes, so the remoting
codec passes them on).  RocketMQ 5 draws the same line between its proxy's transports and the
broker (``MessagingProcessor``).

One module per concept:

* :mod:`~tidemq.broker.services.status`: :class:`Status`, :class:`Outcome`;
* :mod:`~tidemq.broker.services.send`: single, batch and reply sends, a consumer's send-back
  (:class:`SendService`), with :mod:`~tidemq.broker.services.put`, the store side of a send
  (one put per destination, the settled :class:`Send`);
* :mod:`~tidemq.broker.services.pull`: pulls with long polling (:class:`PullService`);
* :mod:`~tidemq.broker.services.offsets`: consumer offsets: query, commit, reset
  (:class:`OffsetService`);
* :mod:`~tidemq.broker.services.clients`: heartbeat and unregister (:class:`ClientService`);
* :mod:`~tidemq.broker.services.transactions`: end of a transaction (:class:`TransactionService`);
* :mod:`~tidemq.broker.services.messages`: query by key, view by id (:class:`MessageService`);
* :mod:`~tidemq.broker.services.admin`: the admin reads the remoting processors serve
  (:class:`AdminService`);
* :mod:`~tidemq.broker.services.pop`: POP consumption (pop, ack, change invisibility), beside
  :mod:`.pull` and :mod:`.offsets` (:class:`PopService`, the engine of :mod:`tidemq.broker.pop`);
* :mod:`~tidemq.broker.services.timer`: timer messages' requests (checkpoint, metrics, recall),
  next to the delay levels of :mod:`tidemq.broker.schedule` (:class:`TimerMessageStore`, the
  engine of :mod:`tidemq.broker.timer`); sends park timer messages in :class:`SendService`.

The seams for the compiled request lanes (store capabilities, issue 38) are
:meth:`SendService.prepare`/``put``/``settled`` (one call per request or per read, messages as the
list the store takes) and :meth:`PullService.pull` (the store's wire-ready buffers in
:attr:`PullResult.body`).  The send lane (:mod:`tidemq.broker.lanes`, a store's
:class:`~tidemq.store.SendLane`) replaces ``prepare`` for plain SEND_MESSAGE_V2 and
SEND_BATCH_MESSAGE runs and goes through ``put``/``settled`` as the handler does; PULL_MESSAGE
has no lane yet.

The duplicate window (issue 37, :mod:`tidemq.broker.dedup`) is asked by
:meth:`SendService.prepare`/``prepare_batch`` after the topic checks and before the hooks: a
duplicate is a :class:`Send` that ``put`` skips and ``settled``/``settle`` answer with the first
send's outcome.
"""

from __future__ import annotations

from tidemq.broker.context import BrokerContext
from tidemq.broker.services.admin import AdminService
from tidemq.broker.services.clients import ClientService
from tidemq.broker.services.messages import MessageService
from tidemq.broker.services.offsets import OffsetService
from tidemq.broker.services.pop import PopService, pop_service
from tidemq.broker.services.pull import PullResult, PullService
from tidemq.broker.services.put import Send
from tidemq.broker.services.send import SendService
from tidemq.broker.services.status import DONE, Outcome, Status
from tidemq.broker.services.timer import TimerMessageStore, timer_service
from tidemq.broker.services.transactions import TransactionService

__all__ = [
    "DONE",
    "AdminService",
    "BrokerServices",
    "ClientService",
    "MessageService",
    "OffsetService",
    "Outcome",
    "PopService",
    "PullResult",
    "PullService",
    "Send",
    "SendService",
    "Status",
    "TimerMessageStore",
    "TransactionService",
]


class BrokerServices:
    """Every service of one broker, built once over its :class:`BrokerContext` and shared by the
    transports (the remoting processors get it at registration)."""

    def __init__(self, broker: BrokerContext) -> None:
        self.send = SendService(broker)
        self.pull = PullService(broker)
        self.offsets = OffsetService(broker)
        self.clients = ClientService(broker)
        self.transactions = TransactionService(broker)
        self.messages = MessageService(broker)
        self.admin = AdminService(broker)
        self.pop: PopService = pop_service(broker)
        self.timers: TimerMessageStore = timer_service(broker)
