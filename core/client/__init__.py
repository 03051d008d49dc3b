"""tidemq's own client: producer, push and pull consumers, over the RocketMQ 4.x protocol.

asyncio API (:class:`Producer`, :class:`PushConsumer`, :class:`PullConsumer`) plus a blocking
facade (:mod:`tidemq.client.blocking`) that runs them on a background loop thread.  Queue
selection (``selector=``) and rebalance (``allocate=``) are plugins of the ``select`` and
``allocate`` roles, so third-party strategies plug in by name.

    async with Producer("pg", namesrv="127.0.0.1:9876") as producer:
        result = await producer.send(Message("TopicA", b"hello", tags="TagA", keys="order-1"))

    consumer = PushConsumer("cg", namesrv="127.0.0.1:9876", allocate="consistent_hash")
    consumer.subscribe("TopicA", "TagA || TagB")
    consumer.register_listener(lambda msgs: ConsumeStatus.SUCCESS)  # or orderly=True
    await consumer.start()
"""

from tidemq.client.blocking import BlockingProducer, BlockingPullConsumer, BlockingPushConsumer, LoopThread
from tidemq.client.credentials import SessionCredentials
from tidemq.client.errors import BrokerError, ClientError, NoRouteError, SendFailedError, SendRefusedError
from tidemq.client.instance import ClientInstance
from tidemq.client.message import Message, PullResult, PullStatus, SendResult, SendStatus, new_message_id
from tidemq.client.producer import Producer, select_by_hash
from tidemq.client.pull_consumer import PullConsumer
from tidemq.client.push_consumer import ConsumeFrom, ConsumeStatus, PushConsumer
from tidemq.client.rebalance import BROADCASTING, CLUSTERING
from tidemq.client.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)
from tidemq.message import MessageExt
from tidemq.queues import MessageQueue

__all__ = [
    "BROADCASTING",
    "CLUSTERING",
    "BlockingProducer",
    "BlockingPullConsumer",
    "BlockingPushConsumer",
    "BrokerError",
    "ClientError",
    "ClientInstance",
    "ConsumeFrom",
    "ConsumeStatus",
    "LocalTransactionState",
    "LoopThread",
    "Message",
    "MessageExt",
    "MessageQueue",
    "NoRouteError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "SendFailedError",
    "SendRefusedError",
    "SendResult",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "SendStatus",
    "SessionCredentials",
    "new_message_id",
    "select_by_hash",
]
