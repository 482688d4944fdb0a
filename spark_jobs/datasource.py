"""The ``gms`` PySpark data source: batch reads and Structured Streaming over a store or a live
cluster.

    from gms.spark_jobs import register
    corrupt = register(spark)          # returns the corrupt-record accumulator (None on Connect)
    df = spark.read.format("gms").option("topics", "orders").load("/var/lib/gms/broker0")

Spark plans on the driver (``partitions``: one per queue, long queues cut into offset ranges)
and each task reads its range (``read``) as Arrow batches. Only the columns of the schema Spark
hands the reader are built: give ``.option("columns", "topic,tag,size")`` or ``.schema(...)``
with a subset of the gms columns to keep bodies out of a count or a histogram.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from gms.spark_jobs.options import EARLIEST, LATEST, ReadOptions, parse_options
from gms.spark_jobs.partitions import QueueRange, QueueSpan, bad_record_sink, split_spans
from gms.spark_jobs.schema import arrow_schema, check_requested, ddl

SOURCE_NAME = "gms"
# Offsets JSON of the streaming reader: {"topic": {"queue id": next offset}}.
StreamOffsets = dict[str, dict[str, int]]


def _spans(options: ReadOptions) -> list[QueueSpan]:
    if options.live:
        from gms.spark_jobs.live_scan import live_spans  # the SDK is only needed on this path
        return live_spans(options)
    from gms.spark_jobs.store_scan import store_spans
    return store_spans(options)


def _read(rng: InputPartition, options: ReadOptions, columns: tuple[str, ...],
          counter: Any) -> Iterator[pa.RecordBatch]:
    if not isinstance(rng, QueueRange):  # Spark reads one InputPartition(None) when we plan none
        return iter(())
    sink = bad_record_sink(options.on_corrupt, counter)
    schema = arrow_schema(columns)
    if rng.broker is not None:
        from gms.spark_jobs.live_scan import read_live_range
        return read_live_range(rng, options, schema, sink)
    from gms.spark_jobs.store_scan import read_store_range
    return read_store_range(rng, options, schema, sink)


class GmsBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions, columns: tuple[str, ...], counter: Any) -> None:
        self.options = options
        self.columns = columns
        self.counter = counter

    def partitions(self) -> Sequence[InputPartition]:
        return split_spans(_spans(self.options), self.options.records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.options, self.columns, self.counter)


class GmsStreamReader(DataSourceStreamReader):
    """Per-queue next offsets are the checkpointed offsets: a restarted query resumes exactly
    where its last committed micro-batch ended. Queues that appear later start at their first
    offset. The store is never written, so ``commit`` has nothing to do."""

    def __init__(self, options: ReadOptions, columns: tuple[str, ...], counter: Any) -> None:
        self.options = options
        self.columns = columns
        self.counter = counter

    @staticmethod
    def _as_offsets(spans: list[QueueSpan], use_end: bool) -> StreamOffsets:
        offsets: StreamOffsets = {}
        for span in spans:
            offsets.setdefault(span.topic, {})[str(span.queue_id)] = span.end if use_end else span.start
        return offsets

    def initialOffset(self) -> StreamOffsets:
        return self._as_offsets(_spans(dataclasses.replace(self.options, ending_offsets=LATEST, end_time_ms=None)),
                                use_end=False)

    def latestOffset(self, start: StreamOffsets | None = None, limit: Any = None) -> StreamOffsets:
        # PySpark 4.0/4.1 call latestOffset(); 4.2+ pass the start offsets and a read limit.
        latest = dataclasses.replace(self.options, starting_offsets=EARLIEST, ending_offsets=LATEST,
                                     start_time_ms=None, end_time_ms=None)
        return self._as_offsets(_spans(latest), use_end=True)

    def _brokers(self) -> dict[tuple[str, int], str | None]:
        if not self.options.live:
            return {}
        return {(s.topic, s.queue_id): s.broker for s in _spans(dataclasses.replace(
            self.options, starting_offsets=LATEST, ending_offsets=LATEST, start_time_ms=None, end_time_ms=None))}

    def partitions(self, start: StreamOffsets, end: StreamOffsets) -> Sequence[InputPartition]:
        brokers = self._brokers()
        spans = [QueueSpan(topic, int(q), start.get(topic, {}).get(q, 0), int(stop), brokers.get((topic, int(q))))
                 for topic, queues in end.items() for q, stop in queues.items()]
        return split_spans([s for s in spans if s.start < s.end], self.options.records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.options, self.columns, self.counter)

    def commit(self, end: StreamOffsets) -> None:
        """Nothing to release: reads hold no broker-side state."""


class GmsDataSource(DataSource):
    """``spark.read.format("gms")`` / ``spark.readStream.format("gms")``; see docs/spark.md."""

    corrupt_records: ClassVar[Any] = None  # an Accumulator[int] when registered with register()

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _parsed(self, schema: StructType) -> tuple[ReadOptions, tuple[str, ...]]:
        options = parse_options(self.options)
        return options, check_requested(schema.fieldNames())

    def schema(self) -> str:
        return ddl(parse_options(self.options).columns)

    def reader(self, schema: StructType) -> DataSourceReader:
        return GmsBatchReader(*self._parsed(schema), self.corrupt_records)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return GmsStreamReader(*self._parsed(schema), self.corrupt_records)


_COUNTER_ATTRIBUTE = "_gms_corrupt_records"


def register(spark: Any) -> Any:
    """Register the ``gms`` format on ``spark`` (again: harmless); returns the session's
    accumulator of corrupt records skipped by its reads (None where there is no SparkContext,
    e.g. Spark Connect)."""
    counter = getattr(spark, _COUNTER_ATTRIBUTE, None)
    if counter is None:
        try:
            counter = spark.sparkContext.accumulator(0)
        except (AttributeError, PySparkException):  # Spark Connect sessions have no SparkContext
            counter = None
        setattr(spark, _COUNTER_ATTRIBUTE, counter)
    source = type(GmsDataSource.__name__, (GmsDataSource,), {"corrupt_records": counter,
                                                            "__module__": __name__})
    spark.dataSource.register(source)
    return counter
