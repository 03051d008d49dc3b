"""Client settings every ``tidemq`` source and sink passes through to tidemq's client.

Kafka's connector passes ``kafka.*`` options to its consumer and producer; tidemq's passes the
ACL credentials and the tcp transport's TLS keys, so a query can reach a secured cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class ClientOptions:
    """ACL credentials and transport options for :class:`~tidemq_spark.client.TidemqSession` and the sink's producer."""

    access_key: str | None = None
    secret_key: str | None = attrs.field(default=None, repr=False)  # never in reprs or logs
    transport_options: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ClientOptions:
        """The client settings named in ``options`` (none yet: the passthrough is being built)."""
        return cls()
