"""Client registrations: heartbeat and unregister (HEART_BEAT, UNREGISTER_CLIENT), the queue locks of
orderly consumers (LOCK/UNLOCK_BATCH_MQ) and the check of a consumer's subscription
(CHECK_CLIENT_CONFIG)."""

from __future__ import annotations

import logging

import attrs

from tidemq.broker.clients import ClientChannel, SubscriptionData
from tidemq.broker.context import BrokerContext
from tidemq.broker.headers import retry_topic
from tidemq.broker.services.status import DONE, Outcome, Status
from tidemq.perm import PERM_READ, PERM_WRITE
from tidemq.queues import MessageQueue
from tidemq.transport import Connection

log = logging.getLogger(__name__)


@attrs.frozen(slots=True)
class ConsumerRegistration:
    """One consumer group a heartbeat names, with how it consumes and what it subscribes to."""

    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptions: list[SubscriptionData] = attrs.field(factory=list)


class ClientService:
    """Which producers and consumers are online, on which connection."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker

    def heartbeat(
        self,
        peer: Connection,
        client_id: str,
        language: str,
        version: int,
        consumers: list[ConsumerRegistration],
        producer_groups: list[str],
    ) -> Outcome:
        """Register (or refresh) the client's consumer and producer groups on ``peer``; a consumer
        group whose members changed is told to rebalance.  The names were checked by the caller."""
        b = self.broker
        b.watch_connection(peer)
        for consumer in consumers:
            group = consumer.group
            group_cfg = b.groups.find_or_create(group)
            if group_cfg is not None:
                # Consumers subscribe to their retry topic: it must exist in the route they look up.
                b.topics.create_in_send_back(
                    retry_topic(group), group_cfg.retry_queue_nums, PERM_READ | PERM_WRITE
                )
            changed = b.consumers.register(
                group,
                ClientChannel(peer, client_id, language, version),
                consumer.consume_type,
                consumer.message_model,
                consumer.consume_from_where,
                consumer.subscriptions,
            )
            if changed:
                log.info(
                    "consumer group %s changed: %s joined from %s", group, client_id, peer.remote_address
                )
                b.notify_consumer_ids_changed(group)
        for group in producer_groups:
            b.producers.register(group, ClientChannel(peer, client_id, language, version))
        return DONE

    def unregister(
        self, peer: Connection, client_id: str, producer_group: str, consumer_group: str
    ) -> Outcome:
        """Take ``client_id`` of ``peer`` (every client of ``peer`` without one) out of the groups
        named (an empty name: none)."""
        b = self.broker
        if producer_group:
            b.producers.unregister(producer_group, peer, client_id)
        if consumer_group and b.consumers.unregister(consumer_group, peer, client_id):
            log.info("consumer %s left group %s", client_id or peer.remote_address, consumer_group)
            b.notify_consumer_ids_changed(consumer_group)
        return DONE

    def lock_queues(self, group: str, client_id: str, queues: list[MessageQueue]) -> list[MessageQueue]:
        """Lock (or renew) for an orderly consumer each queue still free or already its own; the
        queues it holds (LOCK_BATCH_MQ)."""
        return self.broker.locks.try_lock_batch(group, queues, client_id)

    def unlock_queues(self, group: str, client_id: str, queues: list[MessageQueue]) -> Outcome:
        """Release the client's locks on ``queues`` (UNLOCK_BATCH_MQ)."""
        self.broker.locks.unlock_batch(group, queues, client_id)
        return DONE

    def check_subscription(self, expression_type: str, expression: str) -> Outcome:
        """Whether this broker can filter by ``expression`` (CHECK_CLIENT_CONFIG)."""
        if expression_type == "TAG":
            return DONE
        b = self.broker
        if not b.settings.enable_property_filter:
            return Outcome(
                Status.SYSTEM_ERROR,
                f"The broker does not support consumer to filter message by {expression_type}",
            )
        factory = b.filters.get(expression_type)
        if factory is None:
            return Outcome(
                Status.SYSTEM_ERROR, f"expression type {expression_type} is not supported by this broker"
            )
        try:
            factory.compile(expression)
        except ValueError as exc:
            return Outcome(Status.SUBSCRIPTION_PARSE_FAILED, str(exc))
        return DONE
