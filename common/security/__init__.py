"""Transport security, identities and permissions."""
