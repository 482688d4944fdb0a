"""The ``gms`` PySpark data source: batch reads and Structured Streaming over a store or a live
cluster.

    from gms.spark_jobs import register
    corrupt = register(spark)          # returns the corrupt-record accumulator (None on Connect)
    df = spark.read.format("gms").option("topics", "orders").load("/var/lib/gms/broker0")
    df.select("topic", "body").write.format("gms").option("nameserver", "ns:9876").mode("append").save()

Spark plans on the driver (``partitions``: one per queue, long queues cut into offset ranges)
and each task reads its range (``read``) as Arrow batches. Only the columns of the schema Spark
hands the reader are built: give ``.option("columns", "topic,tag,size")`` or ``.schema(...)``
with a subset of the gms columns to keep bodies out of a count or a histogram.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from gms.spark_jobs.options import EARLIEST, LATEST, ReadOptions, parse_options
from gms.spark_jobs.partitions import (
    BadRecordSink,
    QueueRange,
    QueueRanges,
    QueueSpan,
    bad_record_sink,
    split_spans,
)
from gms.spark_jobs.schema import arrow_schema, check_requested, ddl
from gms.spark_jobs.sink import WriteOptions, arrow_chunks, parse_write_options, row_chunks, send_chunks

SOURCE_NAME = "gms"
# Offsets JSON of the streaming reader: {"topic": {"queue id": next offset}}.
StreamOffsets = dict[str, dict[str, int]]


def _spans(options: ReadOptions) -> list[QueueSpan]:
    if options.live:
        from gms.spark_jobs.live_scan import live_spans  # the SDK is only needed on this path
        return live_spans(options)
    from gms.spark_jobs.store_scan import store_spans
    return store_spans(options)


@functools.cache
def _freeze_worker_heap() -> None:
    """Move what this Python worker holds so far (pyspark, pyarrow, numpy and gms, ~70k objects)
    out of the cyclic GC's reach, once per process: PySpark's daemon runs a full ``gc.collect()``
    after every task of a reused worker, which over them took ~45 ms a task, more than reading a
    queue of 30k records (64 queues: 3 s of CPU a read). Later tasks' objects are collected as
    before; what is frozen stays as long as the process, as its modules do anyway."""
    gc.freeze()


def _read(partition: InputPartition, options: ReadOptions, columns: tuple[str, ...],
          counter: Any) -> Iterator[pa.RecordBatch]:
    _freeze_worker_heap()
    if not isinstance(partition, QueueRanges):  # Spark reads one InputPartition(None) when we plan none
        return iter(())
    sink = bad_record_sink(options.on_corrupt, counter)
    schema = arrow_schema(columns)
    return itertools.chain.from_iterable(_read_range(rng, options, schema, sink) for rng in partition.ranges)


def _read_range(rng: QueueRange, options: ReadOptions, schema: pa.Schema,
                sink: BadRecordSink) -> Iterator[pa.RecordBatch]:
    if rng.broker is not None:
        from gms.spark_jobs.live_scan import read_live_range
        return read_live_range(rng, options, schema, sink)
    from gms.spark_jobs.store_scan import read_store_range
    return read_store_range(rng, options, schema, sink)


def _partitions(spans: list[QueueSpan], options: ReadOptions, parallelism: int | None) -> list[QueueRanges]:
    return split_spans(spans, options.records_per_partition, options.min_records_per_partition, parallelism)


class GmsBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions, columns: tuple[str, ...], counter: Any,
                 parallelism: int | None) -> None:
        self.options = options
        self.columns = columns
        self.counter = counter
        self.parallelism = parallelism

    def partitions(self) -> Sequence[InputPartition]:
        return _partitions(_spans(self.options), self.options, self.parallelism)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.options, self.columns, self.counter)


class GmsStreamReader(DataSourceStreamReader):
    """Per-queue next offsets are the checkpointed offsets: a restarted query resumes exactly
    where its last committed micro-batch ended. Queues that appear later start at their first
    offset.

    With a ``group``, each finished micro-batch's end offsets are committed as the group's. Spark
    calls ``commit`` for a batch only once it plans the next one, so a query with no new data
    would leave the group a batch behind; this reader (one long-lived object on the driver)
    also commits the batch it planned last when Spark next asks for the latest offsets, which
    it does only once that batch has finished."""

    def __init__(self, options: ReadOptions, columns: tuple[str, ...], counter: Any,
                 parallelism: int | None) -> None:
        self.options = options
        self.columns = columns
        self.counter = counter
        self.parallelism = parallelism
        self._planned: StreamOffsets | None = None  # the end of the micro-batch planned last
        self._committed: StreamOffsets | None = None  # what the group holds from this reader

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
        if self._planned is not None:  # its batch is done: Spark runs one at a time
            self._commit_group(self._planned)
            self._planned = None
        latest = dataclasses.replace(self.options, starting_offsets=EARLIEST, ending_offsets=LATEST,
                                     start_time_ms=None, end_time_ms=None)
        return self._as_offsets(_spans(latest), use_end=True)

    def _brokers(self) -> dict[tuple[str, int], str | None]:
        if not self.options.live:
            return {}
        return {(s.topic, s.queue_id): s.broker for s in _spans(dataclasses.replace(
            self.options, starting_offsets=LATEST, ending_offsets=LATEST, start_time_ms=None, end_time_ms=None))}

    def partitions(self, start: StreamOffsets, end: StreamOffsets) -> Sequence[InputPartition]:
        self._planned = end
        brokers = self._brokers()
        spans = [QueueSpan(topic, int(q), start.get(topic, {}).get(q, 0), int(stop), brokers.get((topic, int(q))))
                 for topic, queues in end.items() for q, stop in queues.items()]
        return _partitions([s for s in spans if s.start < s.end], self.options, self.parallelism)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.options, self.columns, self.counter)

    def commit(self, end: StreamOffsets) -> None:
        """Commit ``end`` as the ``group``'s offsets (when the option is set), so the group's lag
        shows the query's progress; reads hold no broker-side state to release."""
        self._commit_group(end)

    def _commit_group(self, end: StreamOffsets) -> None:
        if self.options.group is not None and end != self._committed:
            from gms.spark_jobs.live_scan import commit_group
            commit_group(self.options, self.options.group, end)
            self._committed = end


class GmsBatchWriter(DataSourceArrowWriter):
    """Each task sends its rows (Arrow batches) and returns once all are acknowledged."""

    def __init__(self, options: WriteOptions, counter: Any) -> None:
        self.options = options
        self.counter = counter

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        _freeze_worker_heap()
        return send_chunks(self.options, arrow_chunks(iterator), self.counter)


class GmsStreamWriter(DataSourceStreamWriter):
    """A micro-batch commits only after each of its tasks' rows was acknowledged (``write``
    returns then), so ``commit`` has nothing left to flush. Rows, not Arrow: PySpark 4.0 has
    no Arrow stream writer."""

    def __init__(self, options: WriteOptions, counter: Any) -> None:
        self.options = options
        self.counter = counter

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        _freeze_worker_heap()
        return send_chunks(self.options, row_chunks(iterator, self.options.columns), self.counter)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every row is acknowledged by now."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Rows acknowledged before a task failed stay stored (messages cannot be taken back)."""


class GmsDataSource(DataSource):
    """``spark.read.format("gms")`` / ``spark.readStream.format("gms")``; see docs/spark.md."""

    corrupt_records: ClassVar[Any] = None  # an Accumulator[int] when registered with register()
    rows_written: ClassVar[Any] = None  # an Accumulator[int] of the rows the session's writes sent
    parallelism: ClassVar[int | None] = None  # the session's default parallelism, when registered with register()

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _parsed(self, schema: StructType) -> tuple[ReadOptions, tuple[str, ...]]:
        options = parse_options(self.options)
        return options, check_requested(schema.fieldNames())

    def schema(self) -> str:
        return ddl(parse_options(self.options).columns)

    def reader(self, schema: StructType) -> DataSourceReader:
        return GmsBatchReader(*self._parsed(schema), self.corrupt_records, self.parallelism)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return GmsStreamReader(*self._parsed(schema), self.corrupt_records, self.parallelism)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return GmsBatchWriter(parse_write_options(self.options, schema), self.rows_written)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return GmsStreamWriter(parse_write_options(self.options, schema), self.rows_written)


_CORRUPT_ATTRIBUTE = "_gms_corrupt_records"
_WRITTEN_ATTRIBUTE = "_gms_rows_written"


def _accumulator(spark: Any, attribute: str) -> Any:
    """The session's Accumulator[int] kept as ``attribute`` (made once); None where there is no
    SparkContext, e.g. Spark Connect."""
    counter = getattr(spark, attribute, None)
    if counter is None:
        try:
            counter = spark.sparkContext.accumulator(0)
        except (AttributeError, PySparkException):
            counter = None
        setattr(spark, attribute, counter)
    return counter


def _parallelism(spark: Any) -> int | None:
    """How many tasks the session runs at once (None without a SparkContext, e.g. Spark Connect):
    a read's partitions are made a multiple of it."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except (AttributeError, PySparkException):
        return None


def register(spark: Any) -> Any:
    """Register the ``gms`` format on ``spark`` (again: harmless); returns the session's
    accumulator of corrupt records skipped by its reads (None where there is no SparkContext,
    e.g. Spark Connect)."""
    counter = _accumulator(spark, _CORRUPT_ATTRIBUTE)
    source = type(GmsDataSource.__name__, (GmsDataSource,), {
        "corrupt_records": counter, "rows_written": _accumulator(spark, _WRITTEN_ATTRIBUTE),
        "parallelism": _parallelism(spark), "__module__": __name__})
    spark.dataSource.register(source)
    return counter


def rows_written(spark: Any) -> int | None:
    """How many rows the session's gms writes have sent and seen acknowledged (successful tasks
    only); None without a SparkContext."""
    counter = getattr(spark, _WRITTEN_ATTRIBUTE, None)
    return None if counter is None else int(counter.value)
