"""Spark data sources for tidemq (PySpark >= 4.0 Python Data Source API; extra ``tidemq[spark]``).

    import tidemq_spark
    tidemq_spark.register(spark)
    df = spark.read.format("tidemq").option("namesrv", "127.0.0.1:9876").option("topic", "Orders").load()

``tidemq`` reads topics in batch and streaming queries and writes DataFrames to topics;
``tidemq-store`` reads a broker's CommitLog files offline.  Options: see README.md here.
The CommitLog reader (:mod:`tidemq_spark.commitlog`) and option parsing import without PySpark.
"""

from __future__ import annotations

from typing import Any

from .options import DataLossError, TidemqSparkError
from .schema import COLUMNS, SCHEMA_DDL

__all__ = [
    "COLUMNS",
    "SCHEMA_DDL",
    "DataLossError",
    "LagListener",
    "TidemqSparkError",
    "offsets_behind_latest",
    "query_lag",
    "register",
]

#: Names importing PySpark, loaded on first use so ``import tidemq_spark`` works without it.
_LAZY = {"LagListener": "lag", "offsets_behind_latest": "lag", "query_lag": "lag"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tidemq_spark' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)


def register(spark: Any) -> None:
    """Register the ``tidemq`` and ``tidemq-store`` data sources with ``spark`` (a SparkSession)."""
    from .sources import register as _register

    _register(spark)
