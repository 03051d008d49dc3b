"""The public API of the transport_grpc plugin, for a plugin that serves the same RPCs over another
backend (``grpc_proxy``: ``tidemq proxy``, RocketMQ 5's cluster mode).

Everything in ``__all__`` is supported for import by other plugins; nothing else in
``tidemq_transport_grpc`` is (``tests/test_public_api.py`` checks it).

- :class:`Backend` (what the RPCs need of the brokers: routes, sends, ends of transactions,
  producer registrations, pulls and offsets), its values (:class:`QueueLayout`,
  :class:`Outgoing`, :class:`Stored`, :class:`Pulled`, :data:`OffsetPolicy`) and
  :class:`BackendUnavailable` (gRPC UNAVAILABLE to the client); :func:`fifo_queue`, the queue of a
  message group; :data:`DEFAULT_TOPIC`;
- :class:`MessagingService` and :class:`PullRpcs` (the RPCs over a backend), :func:`handlers`
  (the method table a ``grpc.aio`` server serves) and :func:`aio_server` (the server, bound, with
  the endpoint's caps and TLS) with :func:`tls_credentials` (grpc's server credentials for the
  TLS files, a :class:`~tidemq.errors.ConfigError` naming the one that cannot be read);
- :class:`ConsumeBackend` (what the v5 consumer RPCs need of the brokers: receive, ack, change
  invisibility, forward to the dead-letter queue, assignment, recall, group policy, consumer
  registration), its values (:class:`Delivered`, :class:`Assigned`, :class:`GroupPolicy`,
  :class:`ReceiptHandle`, :class:`Subscribed`), its refusal :class:`ConsumeRefused` with
  :func:`refused` (a broker's response code as the v5 code), :func:`retry_topic` and
  :func:`decode_receipt_handle` (:meth:`ReceiptHandle.decode`, cached);
  :class:`ReceiveLimits`, the receive checks' minimums; :func:`consumer_data` and
  :func:`subscription_data`, a v5 consumer's HEART_BEAT entry (ConsumerData, with its
  ``consumeType`` :data:`CONSUME_ACTIVELY` or :data:`CONSUME_PASSIVELY`) as the brokers are told it;
- :class:`Gate` (the ACL check of every call: a :class:`tidemq.CallValidator` over the clients'
  RocketMQ 5 signatures, refusals answered UNAUTHORIZED/FORBIDDEN as RocketMQ's proxy answers)
  and :class:`Guarded` (a generic handler behind a gate);
- :class:`StreamPeer` (a client's Telemetry stream: ``check_transaction`` hands it a broker's
  transaction check), :data:`PRODUCER_GROUP_PREFIX` (the producer group of a topic's v5
  producers) and :func:`load_protobuf` (the generated protobuf module, or a clear error);
- :class:`ClientAgent` with :func:`agent_of` (a client's RocketMQ language and version from its
  Settings or its calls' metadata) and :func:`language_code`.
"""

from __future__ import annotations

from .agent import ClientAgent, agent_of, language_code
from .auth import Gate, Guarded
from .backend import (
    DEFAULT_TOPIC,
    Backend,
    BackendUnavailable,
    OffsetPolicy,
    Outgoing,
    Pulled,
    QueueLayout,
    Stored,
    fifo_queue,
)
from .consume import ReceiveLimits
from .consume_types import (
    Assigned,
    ConsumeBackend,
    ConsumeRefused,
    Delivered,
    GroupPolicy,
    ReceiptHandle,
    Subscribed,
    decode_receipt_handle,
    refused,
    retry_topic,
)
from .messages import PRODUCER_GROUP_PREFIX
from .options import tls_credentials
from .peer import StreamPeer
from .proto import load as load_protobuf
from .pull import PullRpcs
from .running import CONSUME_ACTIVELY, CONSUME_PASSIVELY, consumer_data, subscription_data
from .server import aio_server, handlers
from .service import MessagingService

__all__ = [
    "CONSUME_ACTIVELY",
    "CONSUME_PASSIVELY",
    "DEFAULT_TOPIC",
    "PRODUCER_GROUP_PREFIX",
    "Assigned",
    "Backend",
    "BackendUnavailable",
    "ClientAgent",
    "ConsumeBackend",
    "ConsumeRefused",
    "Delivered",
    "Gate",
    "GroupPolicy",
    "Guarded",
    "MessagingService",
    "OffsetPolicy",
    "Outgoing",
    "PullRpcs",
    "Pulled",
    "QueueLayout",
    "ReceiptHandle",
    "ReceiveLimits",
    "Stored",
    "StreamPeer",
    "Subscribed",
    "agent_of",
    "aio_server",
    "consumer_data",
    "decode_receipt_handle",
    "fifo_queue",
    "handlers",
    "language_code",
    "load_protobuf",
    "refused",
    "retry_topic",
    "subscription_data",
    "tls_credentials",
]
