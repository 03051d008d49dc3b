"""Request processors, one module per group of request codes (as RocketMQ's broker has them)."""

from __future__ import annotations

from typing import Any


def register_all(broker: Any) -> None:
    """Install every processor's handlers on ``broker``."""
    from tidemq.broker.processors import (
        admin,
        client_manage,
        consumer_manage,
        filter_server,
        pull,
        query,
        send,
    )

    for module in (send, pull, client_manage, consumer_manage, query, admin, filter_server):
        module.register(broker)
