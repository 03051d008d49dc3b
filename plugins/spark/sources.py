"""PySpark Python data sources: ``tidemq`` (live topics: batch/stream read and write) and
``tidemq-store`` (offline CommitLog files).

One module per part: :mod:`.source` (readers), :mod:`.sink` (writers), :mod:`.store_source`
(offline CommitLog reader); this module names the data sources and registers them.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from .options import TidemqSparkError, _bool
from .schema import spark_schema
from .sink import TidemqStreamWriter, TidemqWriter
from .sink_exactly_once import EXACTLY_ONCE, ExactlyOnceStreamWriter, delivery_guarantee
from .sink_options import SinkOptions
from .source import TidemqBatchReader, TidemqStreamReader
from .source_options import SourceOptions
from .store_source import TidemqStoreDataSource


def register(spark: Any) -> None:
    """Register the ``tidemq`` and ``tidemq-store`` data sources with a SparkSession."""
    spark.dataSource.register(TidemqDataSource)
    spark.dataSource.register(TidemqStoreDataSource)


class TidemqDataSource(DataSource):
    """``format("tidemq")``: read topics (batch and streaming) and write to them."""

    @classmethod
    def name(cls) -> str:
        return "tidemq"

    def schema(self) -> StructType:
        return spark_schema(_bool(self.options, "includeHeaders", False))

    def reader(self, schema: StructType) -> DataSourceReader:
        return TidemqBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TidemqStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> TidemqWriter:
        if delivery_guarantee(self.options) == EXACTLY_ONCE:
            raise TidemqSparkError(
                "deliveryGuarantee = exactly-once is for streaming writes (writeStream); batch writes are "
                "at-least-once, as Kafka's"
            )
        return TidemqWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        opts = SinkOptions.parse(self.options)
        if delivery_guarantee(self.options) == EXACTLY_ONCE:
            return ExactlyOnceStreamWriter(opts, schema, self.options)
        return TidemqStreamWriter(opts, schema)
