"""Contexts passed to the observation hooks (tracing, metrics, ACL)."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define
class SendContext:
    """One send, seen by ``tidemq_before_send`` / ``tidemq_after_send``."""

    producer_group: str
    topic: str
    queue_id: int
    properties: dict[str, str]
    body_size: int
    client_address: str = ""
    broker_address: str = ""
    status: str = ""
    msg_id: str = ""
    queue_offset: int = -1
    elapsed_ms: float = 0.0
    extra: dict[str, Any] = attrs.field(factory=dict)
    #: Who calls the hook: ``"broker"`` (its send processor) or ``"client"`` (tidemq's producer).
    side: str = "broker"


@attrs.define
class ConsumeContext:
    """One pull (broker side) or one delivered batch (client side)."""

    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    client_address: str = ""
    status: str = ""
    message_count: int = 0
    elapsed_ms: float = 0.0
    extra: dict[str, Any] = attrs.field(factory=dict)
    #: Who calls the hook: ``"broker"`` (its pull processor) or ``"client"`` (tidemq's consumers).
    side: str = "broker"
