"""``python -m gms.cli``: the same as the ``gms`` command."""

from gms.cli.main import main

main()
