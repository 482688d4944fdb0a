"""The gms web console (``gms console``): cluster health, topics with live rates, consumer groups
with lag, message lookup by id, and admin actions behind ``--admin``. An aiohttp application
that reads everything through the public SDK's Admin client; see docs/console.md."""
