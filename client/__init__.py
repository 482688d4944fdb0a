"""The producer and consumer SDK."""
