"""The C part of gms (everything else is configured in pyproject.toml)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("gms.record._recordcheck", ["common/record/_recordcheck.c"], extra_compile_args=["-O3"]),
                   Extension("gms.client._rows", ["client/_rows.c"], extra_compile_args=["-O3"])])
