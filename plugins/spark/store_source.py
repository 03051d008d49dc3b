"""``format("tidemq-store")``: a broker's CommitLog files read offline, one Spark partition per file."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from tidemq.errors import CorruptDataError

from .commitlog import CommitLogFile, CorruptRecordError, iter_file, list_files
from .options import TidemqSparkError, _bool
from .schema import BatchBuilder, arrow_schema, spark_schema
from .source import ARROW_BATCH_ROWS

log = logging.getLogger(__name__)


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

    def partitions(self) -> Sequence[InputPartition]:
        return [StoreFilePartition(f.path, f.base_offset, f.size) for f in list_files(self.path)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, StoreFilePartition):
            return
        builder = BatchBuilder(arrow_schema(), self.broker)
        file = CommitLogFile(partition.path, partition.base_offset, partition.size)
        for msg in iter_file(file, check_crc=self.check_crc, skip_corrupt=self.skip_corrupt):
            if self.topics is not None and msg.topic not in self.topics:
                continue
            try:
                builder.add(msg, decompressed=False)
            except CorruptDataError as exc:
                where = f"{partition.path} (commit-log offset {msg.commit_log_offset})"
                if not self.skip_corrupt:
                    raise CorruptRecordError(f"corrupt CommitLog record in {where}: {exc}") from None
                log.warning("corrupt CommitLog record in %s: %s; skipped", where, exc)
            if len(builder) >= ARROW_BATCH_ROWS:
                yield builder.flush()
        if len(builder):
            yield builder.flush()


class TidemqStoreDataSource(DataSource):
    """``format("tidemq-store").load(path)``: a broker's CommitLog files, one partition per file."""

    @classmethod
    def name(cls) -> str:
        return "tidemq-store"

    def schema(self) -> StructType:
        return spark_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        path = self.options.get("path")
        if not path:
            raise TidemqSparkError(
                "tidemq-store needs a path: spark.read.format('tidemq-store').load('/data/broker')"
            )
        list_files(path)  # a bad path fails at planning with a clear message
        return TidemqStoreReader(str(path), self.options)
