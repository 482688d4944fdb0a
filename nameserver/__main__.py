"""``python -m gms.nameserver`` runs ``gms-nameserver``."""

from gms.nameserver.main import main

main()
