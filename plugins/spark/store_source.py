"""``format("tidemq-store")``: a broker's CommitLog files read offline, one Spark partition per file."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from .commitlog import CommitLogFile, list_files, read_batches
from .options import TidemqSparkError, _bool
from .schema import BatchBuilder, arrow_schema, spark_schema

log = logging.getLogger(__name__)

#: Rows per Arrow batch: larger than the live source's, as a file is read in one go (fewer
#: per-batch costs on both sides of Spark's Arrow stream; ~7 MB at 256-byte bodies).
STORE_BATCH_ROWS = 16384


@dataclass(frozen=True)
class StoreFilePartition(InputPartition):
    """One Spark partition of the offline reader: one CommitLog file."""

    path: str
    base_offset: int
    size: int


class TidemqStoreReader(DataSourceReader):
    def __init__(self, path: str, options: Any) -> None:
        self.path = path
        self.check_crc = _bool(options, "validateCrc", False)
        self.skip_corrupt = _bool(options, "ignoreCorruptRecords", False)
        topics = options.get("topic")
        self.topics = frozenset(t.strip() for t in str(topics).split(",") if t.strip()) if topics else None
        self.broker = options.get("broker") or None
        self.include_headers = _bool(options, "includeHeaders", False)

    def partitions(self) -> Sequence[InputPartition]:
        return [StoreFilePartition(f.path, f.base_offset, f.size) for f in list_files(self.path)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, StoreFilePartition):
            return
        builder = BatchBuilder(arrow_schema(self.include_headers), self.broker)
        file = CommitLogFile(partition.path, partition.base_offset, partition.size)
        yield from read_batches(
            file,
            builder,
            rows=STORE_BATCH_ROWS,
            check_crc=self.check_crc,
            skip_corrupt=self.skip_corrupt,
            topics=self.topics,
        )


class TidemqStoreDataSource(DataSource):
    """``format("tidemq-store").load(path)``: a broker's CommitLog files, one partition per file."""

    @classmethod
    def name(cls) -> str:
        return "tidemq-store"

    def schema(self) -> StructType:
        return spark_schema(_bool(self.options, "includeHeaders", False))

    def reader(self, schema: StructType) -> DataSourceReader:
        path = self.options.get("path")
        if not path:
            raise TidemqSparkError(
                "tidemq-store needs a path: spark.read.format('tidemq-store').load('/data/broker')"
            )
        list_files(path)  # a bad path fails at planning with a clear message
        return TidemqStoreReader(str(path), self.options)
