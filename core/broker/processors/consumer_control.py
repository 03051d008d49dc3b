"""Offset reset and consumer diagnostics, relayed between admin tools and live clients: 222, 223, 314, 308, 307, 309."""

from __future__ import annotations

from tidemq.broker.context import ProcessorRegister


def register(register: ProcessorRegister) -> None:
    """Add this module's handlers."""
