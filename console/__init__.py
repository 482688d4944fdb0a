"""The gms web console (``gms console``): cluster health, topics with live rates, consumer groups
with lag, message lookup by id, and admin actions behind ``--admin``. An aiohttp application
that reads everything through the public SDK's Admin client; see docs/console.md."""

# How admin actions are turned on, named by a read-only console; `gms standalone` gives its own.
# Here, not in gms.console.api, so that `gms` commands can name it without importing aiohttp.
ADMIN_HOW = "gms console --admin"
