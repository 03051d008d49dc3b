"""Options of ``df.write`` / ``df.writeStream`` ``.format("tidemq")``."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from .client_options import ClientOptions
from .options import DEFAULT_PRODUCER_GROUP, TidemqSparkError, _int, _require


@attrs.frozen
class SinkOptions:
    """Parsed options of ``df.write`` / ``df.writeStream`` ``.format("tidemq")``."""

    namesrv: str
    topic: str | None = None
    producer_group: str = DEFAULT_PRODUCER_GROUP
    batch_size: int = 128
    max_batch_bytes: int = 1024 * 1024
    max_in_flight: int = 4
    timeout_s: float = 10.0
    client: ClientOptions = ClientOptions()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        where = "df.write.format('tidemq')"
        timeout_ms = _int(options, "timeoutMs", 10_000, 1)
        batch = _int(options, "batchSize", 128, 1)
        max_bytes = _int(options, "maxBatchBytes", 1024 * 1024, 1024)
        in_flight = _int(options, "maxInFlight", 4, 1)
        assert timeout_ms is not None and batch is not None and max_bytes is not None
        assert in_flight is not None
        if max_bytes > 4 * 1024 * 1024:
            raise TidemqSparkError(f"option maxBatchBytes = {max_bytes} is over the broker's 4 MiB limit")
        return cls(
            namesrv=_require(options, "namesrv", where),
            topic=(str(options["topic"]).strip() or None) if options.get("topic") else None,
            producer_group=str(options.get("producerGroup") or DEFAULT_PRODUCER_GROUP),
            batch_size=batch,
            max_batch_bytes=max_bytes,
            max_in_flight=in_flight,
            timeout_s=timeout_ms / 1000.0,
            client=ClientOptions.parse(options),
        )
