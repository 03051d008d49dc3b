"""Options of ``df.write`` / ``df.writeStream`` ``.format("tidemq")``."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import attrs

from .client_options import ClientOptions
from .options import DEFAULT_PRODUCER_GROUP, TidemqSparkError, _int, _require

log = logging.getLogger(__name__)

#: Kafka producer settings (``kafka.<name>``) a Kafka job may still carry, and what stands for
#: them here.  They are accepted and ignored with one info line, so a job ported from Kafka runs.
KAFKA_PRODUCER_OPTIONS: dict[str, str] = {
    "kafka.bootstrap.servers": "the namesrv option (NameServer addresses, not brokers)",
    "kafka.acks": "none: the broker answers each batch once stored (its flush and replication settings decide durability)",
    "kafka.compression.type": "none: batches are sent uncompressed, as RocketMQ's Java client sends them",
    "kafka.batch.size": "batchSize / maxBatchBytes",
    "kafka.linger.ms": "none: a task sends a batch as soon as it is full or the task ends",
    "kafka.max.in.flight.requests.per.connection": "maxInFlight",
    "kafka.request.timeout.ms": "timeoutMs",
    "kafka.delivery.timeout.ms": "timeoutMs",
    "kafka.retries": "none: the producer retries a failed batch twice",
    "kafka.enable.idempotence": "none: the sink is at least once",
    "kafka.security.protocol": "tls and accessKey/secretKey",
}


def _kafka_options(options: Mapping[str, str]) -> None:
    for name in options:
        key = str(name).lower()
        if not key.startswith("kafka."):
            continue
        instead = KAFKA_PRODUCER_OPTIONS.get(key)
        if instead is None and (key.startswith("kafka.ssl.") or key.startswith("kafka.sasl.")):
            instead = "the tls.* options (PEM files) and accessKey/secretKey"
        log.info(
            "tidemq sink: option %s is a Kafka producer setting and is ignored; here: %s",
            name,
            instead or "none",
        )


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
        _kafka_options(options)
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
