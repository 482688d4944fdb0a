"""A short flag means one thing in every `gms` command (docs/cli.md, "Short flags"): `-t` is
always `--topic`, never `--tag` in one command and `--topic` in another."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import click

from gms.cli.main import cli

CLI_DOC = Path(__file__).parents[2] / "docs" / "cli.md"


def walk(command: click.Command, path: str, ctx: click.Context) -> Iterator[tuple[str, click.Option]]:
    """Every option of ``command`` and of the commands under it (`gms spark` too, when installed)."""
    for param in command.get_params(ctx):  # with --help
        if isinstance(param, click.Option):
            yield path, param
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None
            yield from walk(sub, f"{path} {name}", click.Context(sub, parent=ctx, info_name=name))


def short_flags() -> dict[str, dict[str, list[str]]]:
    """{short flag: {long name: [commands]}} over the whole tree."""
    found: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    root = click.Context(cli, info_name="gms", **cli.context_settings)
    for path, option in walk(cli, "gms", root):
        names = [*option.opts, *option.secondary_opts]
        longs = "/".join(n for n in names if n.startswith("--"))
        for name in names:
            if re.fullmatch(r"-[^-]", name):
                found[name][longs].append(path)
    return found


def test_each_short_flag_maps_to_one_long_name():
    clashes = {flag: dict(longs) for flag, longs in short_flags().items() if len(longs) > 1}
    assert not clashes, f"short flags with more than one meaning: {clashes}"


def test_the_short_flags_are_the_documented_ones():
    """docs/cli.md's table lists each short flag with its long name, and nothing else."""
    documented = dict(re.findall(r"^\| `(-\w)` \| `(--[\w/-]+)` \|", CLI_DOC.read_text(), re.MULTILINE))
    actual = {flag: next(iter(longs)) for flag, longs in short_flags().items()}
    assert documented == actual
