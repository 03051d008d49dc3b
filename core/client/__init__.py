"""tidemq's own client: producer, push and pull consumers, over the RocketMQ 4.x protocol.

asyncio API (:class:`Producer`, :class:`PushConsumer`, :class:`PullConsumer`, and RocketMQ 5's
:class:`SimpleConsumer` over remoting POP with its :class:`ReceivedMessage`) plus a blocking
facade (:mod:`tidemq.client.blocking`) that runs them on a background loop thread.  Queue
selection (``selector=``) and rebalance (``allocate=``) are plugins of the ``select`` and
``allocate`` roles, so third-party strategies plug in by name.

    async with Producer("pg", namesrv="127.0.0.1:9876") as producer:
        result = await producer.send(Message("TopicA", b"hello", tags="TagA", keys="order-1"))

    consumer = PushConsumer("cg", namesrv="127.0.0.1:9876", allocate="consistent_hash")
    consumer.subscribe("TopicA", "TagA || TagB")
    consumer.register_listener(lambda msgs: ConsumeStatus.SUCCESS)  # or orderly=True
    await consumer.start()

Also public, for tools that talk to brokers below the producer/consumer level (the Spark sources,
``tidemq admin``): :class:`ClientAPI` (one typed call per request code) with the ``PULL_FLAG_*``
bits, :class:`AdminClient`, :class:`TopicRoute`, :class:`Subscription` with :func:`prepare` (tag
check, body inflation and retry-topic restore of pulled messages), :func:`split_namesrv` and
:func:`decompress`.
"""

from tidemq.client.admin import AdminClient, AdminError, topic_fields
from tidemq.client.api import (
    PULL_FLAG_CLASS_FILTER,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    ClientAPI,
)
from tidemq.client.blocking import BlockingProducer, BlockingPullConsumer, BlockingPushConsumer, LoopThread
from tidemq.client.compression import decompress
from tidemq.client.consumer_types import HoldsOffsets, ReportsRunningInfo, SpeaksForClients
from tidemq.client.credentials import SessionCredentials
from tidemq.client.diagnostics import version_desc
from tidemq.client.errors import BrokerError, ClientError, NoRouteError, SendFailedError, SendRefusedError
from tidemq.client.instance import ClientInstance, split_namesrv
from tidemq.client.message import Message, PullResult, PullStatus, SendResult, SendStatus, new_message_id
from tidemq.client.producer import Producer, select_by_hash
from tidemq.client.pull_consumer import PullConsumer
from tidemq.client.push_consumer import ConsumeFrom, ConsumeStatus, PushConsumer
from tidemq.client.rebalance import BROADCASTING, CLUSTERING
from tidemq.client.request_reply import RequestTimeoutError, create_reply
from tidemq.client.route import TopicRoute
from tidemq.client.simple_consumer import ReceivedMessage, SimpleConsumer
from tidemq.client.subscription import Subscription, prepare
from tidemq.client.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)
from tidemq.message import MessageExt
from tidemq.queues import BoundaryType, MessageQueue

__all__ = [
    "BROADCASTING",
    "CLUSTERING",
    "PULL_FLAG_CLASS_FILTER",
    "PULL_FLAG_COMMIT_OFFSET",
    "PULL_FLAG_SUBSCRIPTION",
    "PULL_FLAG_SUSPEND",
    "AdminClient",
    "topic_fields",
    "version_desc",
    "AdminError",
    "BlockingProducer",
    "BlockingPullConsumer",
    "BlockingPushConsumer",
    "BrokerError",
    "ClientAPI",
    "ClientError",
    "ClientInstance",
    "ConsumeFrom",
    "ConsumeStatus",
    "HoldsOffsets",
    "ReportsRunningInfo",
    "SpeaksForClients",
    "LocalTransactionState",
    "LoopThread",
    "Message",
    "MessageExt",
    "BoundaryType",
    "MessageQueue",
    "NoRouteError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "ReceivedMessage",
    "RequestTimeoutError",
    "SendFailedError",
    "SendRefusedError",
    "SendResult",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "SendStatus",
    "SessionCredentials",
    "SimpleConsumer",
    "Subscription",
    "TopicRoute",
    "create_reply",
    "decompress",
    "new_message_id",
    "prepare",
    "select_by_hash",
    "split_namesrv",
]
