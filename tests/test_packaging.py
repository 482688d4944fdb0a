"""The repository's folders install under the ``gms`` namespace only."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "module",
    ["gms.broker.commitlog", "gms.broker.consumequeue", "gms.broker.ha", "gms.client",
     "gms.cli", "gms.nameserver", "gms.spark_jobs", "gms.protocol", "gms.cluster"],
)
def test_subpackages_import_under_gms(module):
    assert importlib.import_module(module).__name__ == module


@pytest.mark.parametrize("bare", ["client", "cli", "broker", "nameserver", "spark_jobs"])
def test_no_bare_top_level_modules(bare, tmp_path):
    # A fresh interpreter outside the repository sees only what is installed.
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({bare!r}) is not None)"
    assert subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, check=False).returncode == 0


ROOT = Path(__file__).resolve().parent.parent


def test_no_checkout_folder_shadows_the_package():
    # With the checkout as working directory, a folder named `gms` would be imported instead of
    # the installed package (python -m gms.broker, python -c "import gms.client").
    assert not (ROOT / "gms").exists()


@pytest.mark.parametrize("argv", [["-m", "gms.broker", "--help"], ["-m", "gms.nameserver", "--help"],
                                  ["-c", "import gms.client, gms.cluster"]])
def test_runs_from_the_checkout_root(argv):
    result = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_py_typed_ships():
    assert (Path(importlib.import_module("gms").__file__).parent / "py.typed").exists()


def test_every_package_folder_is_listed_in_pyproject():
    """A folder with an ``__init__.py`` missing from ``packages`` imports in an editable install
    and is absent from the wheel (a broker that cannot start once pip-installed)."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for package, folder in {"gms": "common", **setuptools["package-dir"]}.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *relative)))
    assert found - listed == set()


def test_the_distribution_is_gms_mq_not_pypis_gms(tmp_path):
    """PyPI's `gms` is an unrelated project, so this one is the gms-mq distribution (the package and
    the commands stay `gms`): what the build backend writes into the installed metadata."""
    code = ("import importlib.metadata as m; print(m.metadata('gms-mq')['Name'], sorted(set(m.packages_distributions()"
            "['gms'])))")
    result = subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            check=False)
    assert result.stdout == "gms-mq ['gms-mq']\n", result.stderr
