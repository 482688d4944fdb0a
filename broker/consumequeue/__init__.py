"""Per-queue 20-byte index files pointing into the commitlog."""
