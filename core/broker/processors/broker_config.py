"""Broker configuration at run time: GET_BROKER_CONFIG (26) and UPDATE_BROKER_CONFIG (25)."""

from __future__ import annotations

from tidemq.broker.context import ProcessorRegister


def register(register: ProcessorRegister) -> None:
    """Add this module's handlers."""
