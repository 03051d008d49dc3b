"""Broker statistics for monitoring tools: 315, 317, 300, 204, 328."""

from __future__ import annotations

from tidemq.broker.context import ProcessorRegister


def register(register: ProcessorRegister) -> None:
    """Add this module's handlers."""
