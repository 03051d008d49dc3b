"""Store and topic maintenance requests: 305, 316, 306, 329, 323."""

from __future__ import annotations

from tidemq.broker.context import ProcessorRegister


def register(register: ProcessorRegister) -> None:
    """Add this module's handlers."""
