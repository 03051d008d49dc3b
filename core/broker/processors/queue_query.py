"""Consume-queue inspection: QUERY_CONSUME_QUEUE (321) and QUERY_CONSUME_TIME_SPAN (303)."""

from __future__ import annotations

from tidemq.broker.context import ProcessorRegister


def register(register: ProcessorRegister) -> None:
    """Add this module's handlers."""
