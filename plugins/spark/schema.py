"""The row schema of tidemq's Spark sources and how decoded messages become Arrow record batches.

Timestamps are Spark ``TimestampType`` (UTC instants, millisecond precision from the broker);
``properties`` holds the user properties only: system keys with a column of their own (TAGS,
KEYS, UNIQ_KEY) or meaningful only to the broker (WAIT, MIN_OFFSET, ...) are left out, so a
DataFrame read from one topic can be written to another without carrying stale system fields.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tidemq.client import decompress
from tidemq.message import MessageExt, Prop, create_message_id

#: Spark DDL of the rows both sources produce.
SCHEMA_DDL = (
    "topic string, broker string, queue_id int, queue_offset long, msg_id string, tags string, "
    "keys string, body binary, properties map<string,string>, born_timestamp timestamp, "
    "store_timestamp timestamp, reconsume_times int"
)
COLUMNS = (
    "topic",
    "broker",
    "queue_id",
    "queue_offset",
    "msg_id",
    "tags",
    "keys",
    "body",
    "properties",
    "born_timestamp",
    "store_timestamp",
    "reconsume_times",
)

#: Property keys RocketMQ reserves (MessageConst.STRING_HASH_SET); never in the properties column.
SYSTEM_PROPERTIES = frozenset(
    v for k, v in vars(Prop).items() if k.isupper() and isinstance(v, str)
) | frozenset(
    {
        "BUYER_ID",
        "CORRECTION_FLAG",
        "MQ2_FLAG",
        "INNER_NUM",
        "INNER_MULTI_DISPATCH",
        "INNER_MULTI_QUEUE_OFFSET",
        "TRACE_CONTEXT",
        "TIMER_DELIVER_MS",
        "TIMER_DELAY_SEC",
        "TIMER_DELAY_MS",
        "__STARTDELIVERTIME",
    }
)


def message_id(msg: MessageExt) -> str:
    """The id a RocketMQ client shows: the producer's UNIQ_KEY, else the offset message id."""
    return msg.properties.get(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or create_message_id(
        msg.store_host, msg.commit_log_offset
    )


def user_properties(props: dict[str, str]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in props.items() if k not in SYSTEM_PROPERTIES]


class BatchBuilder:
    """Accumulates messages column by column and emits ``pyarrow.RecordBatch`` es of Spark's schema."""

    def __init__(self, arrow_schema: Any, broker: str | None) -> None:
        self.schema = arrow_schema
        self.broker = broker
        self._reset()

    def _reset(self) -> None:
        self.cols: list[list[Any]] = [[] for _ in COLUMNS]

    def __len__(self) -> int:
        return len(self.cols[0])

    def add(self, msg: MessageExt, *, decompressed: bool = True) -> None:
        # Decompress first: a corrupt body raises before any column grows.
        body = msg.body if decompressed else decompress(msg.body, msg.sys_flag)
        c = self.cols
        props = msg.properties
        c[0].append(msg.topic)
        c[1].append(self.broker)
        c[2].append(msg.queue_id)
        c[3].append(msg.queue_offset)
        c[4].append(message_id(msg))
        c[5].append(props.get(Prop.TAGS))
        c[6].append(props.get(Prop.KEYS))
        c[7].append(body)
        c[8].append(user_properties(props))
        c[9].append(msg.born_timestamp * 1000)  # ms -> Arrow's timestamp[us]
        c[10].append(msg.store_timestamp * 1000)
        c[11].append(msg.reconsume_times)

    def add_all(self, msgs: Iterable[MessageExt]) -> None:
        for m in msgs:
            self.add(m)

    def flush(self) -> Any:
        """The accumulated rows as one RecordBatch (and start a new one)."""
        import pyarrow as pa

        arrays = [pa.array(col, type=f.type) for col, f in zip(self.cols, self.schema, strict=True)]
        self._reset()
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def spark_schema() -> Any:
    """:data:`SCHEMA_DDL` as a ``StructType`` (built in Python: executors have no JVM parser)."""
    from pyspark.sql import types as T

    s, i = T.StringType(), T.IntegerType()
    return T.StructType(
        [
            T.StructField("topic", s),
            T.StructField("broker", s),
            T.StructField("queue_id", i),
            T.StructField("queue_offset", T.LongType()),
            T.StructField("msg_id", s),
            T.StructField("tags", s),
            T.StructField("keys", s),
            T.StructField("body", T.BinaryType()),
            T.StructField("properties", T.MapType(s, s)),
            T.StructField("born_timestamp", T.TimestampType()),
            T.StructField("store_timestamp", T.TimestampType()),
            T.StructField("reconsume_times", i),
        ]
    )


def arrow_schema() -> Any:
    """Spark's Arrow schema of :func:`spark_schema` (what the Python data source runner checks)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema(), timezone="UTC")
