"""Where :class:`BrokerContext` and :class:`ProcessorRegister` used to live: now :mod:`tidemq.context`.

Kept so code written against this path still imports; new code imports from :mod:`tidemq.context`
(or ``tidemq``), which the hook specifications can name without importing the broker.
"""

from __future__ import annotations

from tidemq.context import BrokerContext, Handler, ProcessorRegister

__all__ = ["BrokerContext", "Handler", "ProcessorRegister"]
