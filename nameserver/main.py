"""Entry point of `gms-nameserver`."""

import sys


def main() -> None:
    sys.exit("gms-nameserver: not yet implemented (see the open issues)")
