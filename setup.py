"""The C parts of gms (everything else is configured in pyproject.toml)."""

from setuptools import Extension, setup

# _recordcheck and _append include common/record/crc32.h and batch_core.h (BatchCore's layout,
# shared by the two), _recordcheck buffer_arena.h too; the Kafka adapter's _convert, crc32.h.
HEADERS = ["common/record/crc32.h", "common/record/batch_core.h", "common/record/buffer_arena.h"]

setup(ext_modules=[
    Extension("gms.record._recordcheck", ["common/record/_recordcheck.c"], depends=HEADERS,
              extra_compile_args=["-O3"]),
    Extension("gms.client._append", ["client/_append.c"], include_dirs=["common/record"], depends=HEADERS,
              extra_compile_args=["-O3"]),
    Extension("gms.client._rows", ["client/_rows.c"], extra_compile_args=["-O3"]),
    Extension("gms.broker.kafka._convert", ["broker/kafka/_convert.c"], include_dirs=["common/record"],
              depends=["common/record/crc32.h"], extra_compile_args=["-O3"]),
])
