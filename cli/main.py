"""Entry point of `gms`."""

import sys


def main() -> None:
    sys.exit("gms: not yet implemented (see the open issues)")
