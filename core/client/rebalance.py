"""Rebalance: which queues of each subscribed topic this consumer owns (RocketMQ's RebalanceImpl).

Clustering: the topic's readable queues and the group's consumer ids (from a broker), both
sorted, go through the ``allocate`` strategy; every consumer computes the same split.
Broadcasting: every consumer owns every queue.
"""

from __future__ import annotations

import logging

from tidemq.client.errors import ClientError
from tidemq.client.instance import ClientInstance
from tidemq.queues import AllocateStrategy, MessageQueue

log = logging.getLogger(__name__)

CLUSTERING = "CLUSTERING"
BROADCASTING = "BROADCASTING"


def check_consumer(group: str, message_model: str) -> None:
    """A consumer's group and message model, checked before it is built: :class:`ClientError`."""
    if not group:
        raise ClientError("consumer group must not be empty")
    if message_model not in (CLUSTERING, BROADCASTING):
        raise ClientError(f"message_model = {message_model!r}; choices: CLUSTERING, BROADCASTING")


class Rebalancer:
    """Computes the wanted queue set for a consumer group."""

    def __init__(self, instance: ClientInstance, group: str, model: str, strategy: AllocateStrategy) -> None:
        self.instance = instance
        self.group = group
        self.model = model
        self.strategy = strategy
        #: Topics whose route or consumer list was missing in the last round (retried sooner).
        self.incomplete: set[str] = set()

    async def topic_queues(self, topic: str) -> list[MessageQueue]:
        route = await self.instance.get_route(topic)
        return route.subscribe_queues() if route is not None else []

    async def consumer_ids(self, topic: str) -> list[str]:
        route = await self.instance.get_route(topic)
        if route is None:
            return []
        api = self.instance.require_api()
        # HA (issue 7): a broker without a live master answers from a slave.
        addrs: dict[str, str] = {}
        for bd in route.broker_datas:
            fallback = bd.address()
            if fallback:
                addrs[bd.broker_name] = self.instance.read_address(bd.broker_name) or fallback
        for name, addr in sorted(addrs.items()):
            try:
                return sorted(await api.get_consumer_ids(addr, self.group))
            except Exception as exc:
                log.info("consumer list of %s from %s (%s) failed: %s", self.group, name, addr, exc)
        return []

    async def wanted(self, topics: list[str]) -> dict[str, set[MessageQueue]]:
        """topic -> the queues this consumer should own; a topic that failed is left out (keep current)."""
        out: dict[str, set[MessageQueue]] = {}
        self.incomplete = set(topics)
        for topic in topics:
            try:
                queues = await self.topic_queues(topic)
            except Exception as exc:
                log.warning("rebalance of %s/%s: route lookup failed: %s", self.group, topic, exc)
                continue
            if not queues:
                log.debug("rebalance of %s: topic %s has no route yet", self.group, topic)
                continue
            if self.model == BROADCASTING:
                out[topic] = set(queues)
                self.incomplete.discard(topic)
                continue
            cids = await self.consumer_ids(topic)
            if not cids:
                log.info("rebalance of %s/%s: no consumer ids yet", self.group, topic)
                continue
            try:
                mine = self.strategy.allocate(self.group, self.instance.client_id, queues, cids)
            except Exception as exc:
                log.error(
                    "allocate strategy %s failed: %s", getattr(self.strategy, "name", self.strategy), exc
                )
                continue
            out[topic] = set(mine)
            self.incomplete.discard(topic)
        return out
