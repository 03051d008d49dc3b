"""The row schema of tidemq's Spark sources and how decoded messages become Arrow record batches.

Timestamps are Spark ``TimestampType`` (UTC instants, millisecond precision from the broker);
``properties`` holds the user properties only: system keys with a column of their own (TAGS,
KEYS, UNIQ_KEY) or meaningful only to the broker (WAIT, MIN_OFFSET, ...) are left out, so a
DataFrame read from one topic can be written to another without carrying stale system fields.
"""

from __future__ import annotations

import array
import struct
from collections.abc import Iterable
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from tidemq.client import decompress
from tidemq.errors import CorruptDataError
from tidemq.extensions import compiled_twin, twins
from tidemq.message import MessageExt, Prop, create_message_id

from .options import TidemqSparkError

#: Spark DDL of the rows both sources produce.
SCHEMA_DDL = (
    "topic string, broker string, queue_id int, queue_offset long, msg_id string, tags string, "
    "keys string, body binary, properties map<string,string>, born_timestamp timestamp, "
    "store_timestamp timestamp, reconsume_times int"
)
#: The column ``includeHeaders=true`` adds (Kafka's shape): the user properties, values as bytes.
HEADERS_DDL = "headers array<struct<key:string,value:binary>>"
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


#: ``tidemq_spark._columns`` when it runs, else None (every record takes the Python reference).
native: ModuleType | None = compiled_twin("tidemq_spark._columns")

#: What :meth:`BatchBuilder.scan` returns when the record at ``pos`` is the reference's to handle.
NEEDS_REFERENCE = 1
#: :meth:`BatchBuilder.scan` modes (``_columns.MODE_*``).
MODE_PULL = 0
MODE_STORE = 1

# The column buffers, one bytearray each, in this order (the compiled builder's B_* constants).
(TOPIC, TOPIC_OFF, QID, QOFF, ID, ID_OFF, TAGS, TAGS_OFF, TAGS_VALID, KEYS, KEYS_OFF, KEYS_VALID) = range(12)
(BODY, BODY_OFF, PROP_OFF, PK, PK_OFF, PV, PV_OFF, BORN, STORE, RECON) = range(12, 22)
_N_BUFS = 22
_OFFSET_BUFS = (TOPIC_OFF, ID_OFF, TAGS_OFF, KEYS_OFF, BODY_OFF, PROP_OFF, PK_OFF, PV_OFF)
_I32 = struct.Struct("=i")
_I64 = struct.Struct("=q")
_ZERO32 = _I32.pack(0)
#: Arrow's binary and string columns have int32 offsets.
_MAX_BYTES = 2**31 - 1
_SYSTEM_KEYS_UTF8 = tuple(sorted(k.encode() for k in SYSTEM_PROPERTIES))


@runtime_checkable
class RecordSource(Protocol):
    """Pulled records that add themselves to a builder (``pull.PulledRecords``): the fast path."""

    def add_into(self, builder: BatchBuilder) -> None: ...


def _new_buffers() -> list[bytearray]:
    bufs = [bytearray() for _ in range(_N_BUFS)]
    for i in _OFFSET_BUFS:
        bufs[i] += _ZERO32
    return bufs


class BatchBuilder:
    """Accumulates messages straight into Arrow column buffers; emits ``pyarrow.RecordBatch`` es.

    :meth:`add` is the pure-Python reference (one decoded message); :meth:`scan` appends raw
    records with the compiled builder when it runs.  Both write the same bytes.  The schema says
    whether the ``headers`` column is built (:func:`arrow_schema` with ``include_headers``).
    """

    def __init__(self, arrow_schema: Any, broker: str | None) -> None:
        self.schema = arrow_schema
        self.broker = broker
        self.include_headers = "headers" in arrow_schema.names
        self._reset()

    def _reset(self) -> None:
        self.bufs = _new_buffers()
        self.rows = 0

    def __len__(self) -> int:
        return self.rows

    def add(self, msg: MessageExt, *, decompressed: bool = True) -> None:
        """Append one decoded message (the reference of :meth:`scan`)."""
        # Everything that can fail comes first: a corrupt body or field adds no partial row.
        body = msg.body if decompressed else decompress(msg.body, msg.sys_flag)
        props = msg.properties
        tags, keys = props.get(Prop.TAGS), props.get(Prop.KEYS)
        pairs = [(k.encode(), v.encode()) for k, v in user_properties(props)]
        topic, mid = msg.topic.encode(), message_id(msg).encode()
        try:
            born, stored = _I64.pack(msg.born_timestamp * 1000), _I64.pack(msg.store_timestamp * 1000)
        except struct.error:
            raise CorruptDataError("timestamp out of range") from None
        b = self.bufs
        tags_b, keys_b = (tags or "").encode(), (keys or "").encode()
        for i, extra in (
            (TOPIC, len(topic)),
            (ID, len(mid)),
            (TAGS, len(tags_b)),
            (KEYS, len(keys_b)),
            (BODY, len(body)),
            (PK, sum(len(k) for k, _ in pairs)),
            (PV, sum(len(v) for _, v in pairs)),
        ):
            if len(b[i]) + extra > _MAX_BYTES:
                raise TidemqSparkError(
                    "one Arrow batch would hold over 2 GiB of one column; lower pullBatchSize"
                )
        _put_str(b, TOPIC, topic)
        b[QID] += _I32.pack(msg.queue_id)
        b[QOFF] += _I64.pack(msg.queue_offset)
        _put_str(b, ID, mid)
        _put_str(b, TAGS, tags_b)
        b[TAGS_VALID].append(tags is not None)
        _put_str(b, KEYS, keys_b)
        b[KEYS_VALID].append(keys is not None)
        _put_str(b, BODY, body)
        for k, v in pairs:
            _put_str(b, PK, k)
            _put_str(b, PV, v)
        b[PROP_OFF] += _I32.pack(_last_i32(b[PROP_OFF]) + len(pairs))
        b[BORN] += born
        b[STORE] += stored
        b[RECON] += _I32.pack(msg.reconsume_times)
        self.rows += 1

    def add_all(self, msgs: Iterable[MessageExt] | RecordSource) -> None:
        if isinstance(msgs, RecordSource):
            msgs.add_into(self)
            return
        for m in msgs:
            self.add(m)

    def scan(
        self,
        buf: bytes | memoryview,
        pos: int,
        *,
        mode: int,
        end_offset: int = 2**63 - 1,
        tags: tuple[bytes, ...] | None = None,
        topics: tuple[bytes, ...] | None = None,
        max_rows: int = 2**62,
        crc: Any = None,
    ) -> tuple[int, int]:
        """Append the plain records of ``buf`` from ``pos`` with the compiled builder.

        Returns ``(pos, code)``: where it stopped and :data:`NEEDS_REFERENCE` when the record
        there is the reference's to handle (always, without the compiled builder).
        """
        if native is None:
            return pos, NEEDS_REFERENCE
        pos, rows, code = native.scan(
            buf, pos, self.bufs, mode, end_offset, tags, topics, _SYSTEM_KEYS_UTF8, max_rows, crc
        )
        self.rows += rows
        return pos, code

    def flush(self) -> Any:
        """The accumulated rows as one RecordBatch (and start a new one)."""
        import pyarrow as pa

        n, b, schema = self.rows, self.bufs, self.schema
        self._reset()  # new buffers: Arrow keeps the old ones (a bytearray in use cannot grow)

        def strings(kind: Any, i: int, count: int, valid: Any = None) -> Any:
            return pa.Array.from_buffers(kind, count, [valid, pa.py_buffer(b[i + 1]), pa.py_buffer(b[i])])

        def fixed(kind: Any, i: int) -> Any:
            return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(b[i])])

        nprops = _last_i32(b[PROP_OFF])
        keys, values = strings(pa.string(), PK, nprops), strings(pa.string(), PV, nprops)
        offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(b[PROP_OFF])])
        cols = {
            "topic": strings(pa.string(), TOPIC, n),
            "broker": _constant(self.broker, n),
            "queue_id": fixed(pa.int32(), QID),
            "queue_offset": fixed(pa.int64(), QOFF),
            "msg_id": strings(pa.string(), ID, n),
            "tags": strings(pa.string(), TAGS, n, _validity(b[TAGS_VALID], n)),
            "keys": strings(pa.string(), KEYS, n, _validity(b[KEYS_VALID], n)),
            "body": strings(pa.binary(), BODY, n),
            "properties": pa.MapArray.from_arrays(
                offsets, keys, values, type=schema.field("properties").type
            ),
            "born_timestamp": fixed(schema.field("born_timestamp").type, BORN),
            "store_timestamp": fixed(schema.field("store_timestamp").type, STORE),
            "reconsume_times": fixed(pa.int32(), RECON),
        }
        if self.include_headers:
            kind = schema.field("headers").type
            entry = kind.value_type
            raw = strings(pa.binary(), PV, nprops)  # the values' bytes, typed binary
            fields = [entry.field(i) for i in range(entry.num_fields)]
            cols["headers"] = pa.ListArray.from_arrays(
                offsets, pa.StructArray.from_arrays([keys, raw], fields=fields), type=kind
            )
        arrays = [cols[f.name] for f in schema]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _put_str(b: list[bytearray], i: int, value: bytes) -> None:
    """Append one value to column ``i`` (data) and ``i + 1`` (its int32 end offset)."""
    data = b[i]
    data += value
    b[i + 1] += _I32.pack(len(data))


def _last_i32(buf: bytearray) -> int:
    return int(_I32.unpack_from(buf, len(buf) - 4)[0])


def _validity(flags: bytearray, n: int) -> Any:
    """An Arrow validity bitmap from one 0/1 byte per row (None when every row is valid)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if flags.count(0) == 0:
        return None
    mask = pc.not_equal(pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(flags)]), 0)
    return mask.buffers()[1]


def _constant(value: str | None, n: int) -> Any:
    """``n`` copies of one string (the broker column), built without a Python object per row."""
    import pyarrow as pa

    if value is None:
        return pa.nulls(n, pa.string())
    data = value.encode()
    offsets = array.array("i", range(0, (n + 1) * len(data), len(data)) if data else [0] * (n + 1))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)])


def spark_schema(include_headers: bool = False) -> Any:
    """:data:`SCHEMA_DDL` (plus :data:`HEADERS_DDL` with ``include_headers``) as a ``StructType``.

    Built in Python: executors have no JVM parser.
    """
    from pyspark.sql import types as T

    s, i = T.StringType(), T.IntegerType()
    fields = [
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
    if include_headers:
        header = T.StructType([T.StructField("key", s), T.StructField("value", T.BinaryType())])
        fields.append(T.StructField("headers", T.ArrayType(header)))
    return T.StructType(fields)


def arrow_schema(include_headers: bool = False) -> Any:
    """Spark's Arrow schema of :func:`spark_schema` (what the Python data source runner checks)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema(include_headers), timezone="UTC")


def native_description() -> str:
    """Which column builder runs, for logs and the bench."""
    if native is not None:
        return f"compiled ({native.__name__})"
    reason = next((t.reason for t in twins() if t.module == "tidemq_spark._columns"), "")
    return f"pure Python ({reason})"
