"""Subscription-group administration (RocketMQ's SubscriptionGroupManager requests): 200, 207, 201."""

from __future__ import annotations

from tidemq.broker.context import ProcessorRegister


def register(register: ProcessorRegister) -> None:
    """Add this module's handlers."""
