"""``python -m gms.broker`` runs ``gms-broker``."""

from gms.broker.main import main

main()
