"""``python -m gms.console``: ``gms console`` as a server process (how ``gms standalone`` runs it),
logging to stderr like the other servers; credentials come from the GMS_* variables."""

import logging
import sys

from gms.cli.console import console

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
console(prog_name="python -m gms.console")
