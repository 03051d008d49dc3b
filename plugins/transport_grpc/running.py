"""A RocketMQ 5 consumer's ConsumerRunningInfo (GET_CONSUMER_RUNNING_INFO, 307: ``consumerStatus -g G
-i CLIENT [-s]``), built from what the endpoint knows of the client: its group, client type,
subscriptions, language and version (its Settings), and when it came.  A v5 consumer POPs: it holds
no queues of its own, so ``mqTable`` and ``statusTable`` are empty.  The thread stacks (``-s``) are
the client's own, asked for on its Telemetry stream (:meth:`.peer.StreamPeer.print_stack`).

RocketMQ 5's proxy answers 307 for a v5 client only with ``-s``, with a ConsumerRunningInfo that
holds nothing but the client's ``jstack``; tidemq answers either way with what it knows (as the
``tidemq proxy`` path did before), and adds the stacks when asked and given.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import attrs

from tidemq.client import version_desc

from .consume_types import Subscribed

#: The ConsumeType a v5 consumer is registered with, as RocketMQ 5's proxy registers it: a
#: SimpleConsumer fetches when it wants (CONSUME_ACTIVELY: mqadmin's consumerProgress shows "PULL"),
#: a PushConsumer is fed (CONSUME_PASSIVELY: "PUSH").
CONSUME_ACTIVELY = "CONSUME_ACTIVELY"
CONSUME_PASSIVELY = "CONSUME_PASSIVELY"


def subscription_data(subscriptions: Iterable[Subscribed], version: int) -> list[dict[str, Any]]:
    """SubscriptionData entries (a HEART_BEAT's ``subscriptionDataSet``) of a v5 consumer, each
    with ``version`` as its ``subVersion``: what a broker shows of the consumer's subscriptions
    (``consumerConnection``, its running info), the same in a broker's process and in the proxy."""
    return [
        {
            "classFilterMode": False,
            "topic": s.topic,
            "subString": s.expression or "*",
            "tagsSet": tags_of(s),
            "codeSet": [],
            "subVersion": version,
            "expressionType": s.expression_type,
        }
        for s in subscriptions
    ]


def tags_of(s: Subscribed) -> list[str]:
    """The tags a TAG subscription names (``a || b``); empty for ``*``, an empty one or SQL92."""
    if s.expression_type != "TAG" or s.expression.strip() in ("", "*"):
        return []
    return [t.strip() for t in s.expression.split("||") if t.strip()]


def consumer_data(
    group: str,
    subscriptions: Iterable[Subscribed],
    consume_type: str = CONSUME_PASSIVELY,
    version: int | None = None,
) -> dict[str, Any]:
    """A v5 consumer group's entry of a HEART_BEAT (ConsumerData), as RocketMQ 5's proxy sends it:
    ``consume_type`` CONSUME_ACTIVELY for a SimpleConsumer; ``version`` (the subscriptions'
    ``subVersion``) now in milliseconds when None."""
    return {
        "groupName": group,
        "consumeType": consume_type,
        "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
        "subscriptionDataSet": subscription_data(
            subscriptions, int(time.time() * 1000) if version is None else version
        ),
        "unitMode": False,
    }


@attrs.define
class ConsumerFacts:
    """What the endpoint knows of one v5 consumer of one group."""

    group: str
    consume_type: str
    subscriptions: list[Subscribed]


def running_info(
    client_id: str,
    *,
    group: str,
    language: str,
    version: int,
    started_ms: int,
    consume_type: str,
    subscriptions: list[dict[str, Any]],
    namesrv: Iterable[str] = (),
    jstack: str | None = None,
) -> dict[str, Any]:
    """The ConsumerRunningInfo body (``mqdumps`` it), ``jstack`` included when not None."""
    properties: dict[str, Any] = {
        "consumerGroup": group,
        "messageModel": "CLUSTERING",
        "clientIP": client_id.split("@", 1)[0],
        "language": language,
        "PROP_CONSUMER_START_TIMESTAMP": started_ms,
        "PROP_CONSUME_TYPE": consume_type,
        "PROP_CLIENT_VERSION": version_desc(version),
    }
    addresses = list(namesrv)
    if addresses:
        properties["PROP_NAMESERVER_ADDR"] = "".join(f"{a};" for a in addresses)
    body: dict[str, Any] = {
        "mqTable": {},
        "properties": {k: str(v) for k, v in sorted(properties.items())},
        "statusTable": {},
        "subscriptionSet": sorted(subscriptions, key=lambda s: str(s.get("topic"))),
    }
    if jstack is not None:
        body["jstack"] = jstack
    return body
