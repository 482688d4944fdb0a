"""Entry point of `gms-broker`."""

import sys


def main() -> None:
    sys.exit("gms-broker: not yet implemented (see the open issues)")
